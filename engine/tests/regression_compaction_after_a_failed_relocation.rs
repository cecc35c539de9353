//! Found by the `engine_model` fuzz target: a rewrite's relocation record
//! failed its fsync, which poisons the engine, yet the state had already
//! applied it. The next compaction pass then found the old segment
//! without references and deleted it. A power cut kept the log without
//! the relocation, so recovery pointed events into the deleted file and
//! a sync failed with "no durable record". After a failed write a pass
//! must delete nothing: the durable log may still point into any file.

mod inbox_common;

use std::sync::Arc;
use std::time::Duration;

use inbox_common::*;
use inbox_engine::inbox::CompactionStep;
use inbox_engine::log::{FaultyIo, SyncPolicy};
use inbox_engine::*;

const PHONE: DeviceId = DeviceId(1);
const DESKTOP: DeviceId = DeviceId(2);
const HOUR: Duration = Duration::from_secs(3600);

fn tune(c: &mut InboxConfig) {
    c.sync = SyncPolicy::Always;
    c.segment_bytes = 64 << 10;
    c.safety_window = HOUR;
    c.rewrite_live_fraction = 0.9;
    c.compaction_interval = None;
}

fn desktop_events(ib: &Inbox, uid: Uid, generation: Generation) -> Result<Vec<SyncEvent>> {
    let page = ib
        .sync(SyncRequest {
            uid,
            device: DESKTOP,
            generation: Some(generation),
            local_applied_seq: SyncSeq(0),
            limit: 500,
            batch_token: None,
        })
        .wait()?;
    assert!(!page.has_more);
    Ok(page.events)
}

#[test]
fn a_pass_after_a_failed_relocation_deletes_no_segment_the_durable_log_points_into() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(inbox_engine::inbox::ManualClock::new(T0));
    let io = Arc::new(FaultyIo::new());
    let mut c = config(dir.path(), &clock);
    tune(&mut c);
    let h = Harness {
        inbox: Some(Inbox::open_with_io(c, io.clone()).unwrap()),
        dir,
        clock,
    };
    // conv 10: users 1..=5, whose phones ACK everything (their events die);
    // conv 20: users 1 and 6, and 6's desktop never ACKs (its events live
    // on in sparse segments, which a pass rewrites).
    for uid in 1..=5 {
        h.join(Uid(uid), ConvId(10));
    }
    h.join(Uid(1), ConvId(20));
    h.join(Uid(6), ConvId(20));
    let gens: Vec<Generation> = (2..=5)
        .map(|uid| h.register(Uid(uid), PHONE).device.generation)
        .collect();
    let g6 = h.register(Uid(6), DESKTOP).device.generation;
    for round in 0..6u128 {
        h.send_many(ConvId(10), Uid(1), 10_000 + round * 1000, 120);
        h.send_many(ConvId(20), Uid(1), 20_000 + round * 1000, 40);
    }
    for (i, uid) in (2..=5).enumerate() {
        h.catch_up(Uid(uid), PHONE, gens[i], SyncSeq(0));
    }
    h.advance(2 * HOUR);
    let reference = desktop_events(h.ib(), Uid(6), g6).unwrap();
    assert_eq!(reference.len(), 1 + 240);

    // The copies are durable; the relocation's fsync fails.
    {
        let io = Arc::clone(&io);
        h.ib().set_compaction_hook(Some(Arc::new(move |step| {
            if step == CompactionStep::Copied {
                io.fail_nth_sync(1);
            }
        })));
    }
    let failed = h.ib().compact();
    h.ib().set_compaction_hook(None);
    assert!(
        matches!(failed, Err(Error::Log(log::LogError::Poisoned(_)))),
        "{failed:?}"
    );
    assert_eq!(io.failures_fired(), 1);
    let again = h.ib().compact();

    // A power cut now: only what was synced survives, so not the
    // relocation. Checkpoints are fsynced with their directory before a
    // pass goes on, so the renamed ones are on disk.
    let image = tempfile::tempdir().unwrap();
    io.crash_image_tree(h.dir.path(), image.path(), None)
        .unwrap();
    let checkpoints = h.dir.path().join("checkpoint");
    std::fs::create_dir_all(image.path().join("checkpoint")).unwrap();
    for entry in std::fs::read_dir(&checkpoints).unwrap().flatten() {
        if entry.file_name().to_string_lossy().ends_with(".bin") {
            std::fs::copy(
                entry.path(),
                image.path().join("checkpoint").join(entry.file_name()),
            )
            .unwrap();
        }
    }
    let mut c = config(image.path(), &h.clock);
    tune(&mut c);
    let ib = Inbox::open(c).unwrap();
    assert_eq!(desktop_events(&ib, Uid(6), g6).unwrap(), reference);
    assert!(
        matches!(again, Err(Error::Log(log::LogError::Poisoned(_)))),
        "a pass on a poisoned engine: {again:?}"
    );
}
