//! Crash safety of compaction (R19, R20): the process is killed between
//! every two steps of a pass (trim, checkpoint, copy, relocate, delete).
//! Each kill is modelled by an image of the data directory taken while the
//! pass is stopped at that step (everything written so far, as after a
//! process kill), which is then opened as a fresh engine. That engine
//! compacts again and is itself killed (its directory imaged while it
//! runs, so no shutdown checkpoint), and the second image must answer the
//! same: recovery after a kill during recovery's own compaction.

mod inbox_common;

use std::sync::Arc;
use std::time::Duration;

use inbox_common::*;
use inbox_engine::inbox::CompactionStep;
use inbox_engine::*;
use parking_lot::Mutex;

const PHONE: DeviceId = DeviceId(1);
const DESKTOP: DeviceId = DeviceId(2);
const HOUR: Duration = Duration::from_secs(3600);

fn tune(c: &mut InboxConfig) {
    c.segment_bytes = 64 << 10;
    c.safety_window = HOUR;
    c.rewrite_live_fraction = 0.9;
    c.compaction_interval = None;
}

/// Every event of `uid` from `from`, as its desktop sees them (no ACK).
fn events_from(ib: &Inbox, uid: Uid, gen: Generation, from: SyncSeq) -> Vec<SyncEvent> {
    let req = |local, token| SyncRequest {
        uid,
        device: DESKTOP,
        generation: Some(gen),
        local_applied_seq: local,
        limit: 500,
        batch_token: token,
    };
    let first = ib.sync(req(from, None)).wait().unwrap();
    let mut out = first.events.clone();
    let (mut cursor, mut more) = (first.next_cursor, first.has_more);
    while more {
        let p = ib
            .sync(req(cursor, Some(first.batch_token.clone())))
            .wait()
            .unwrap();
        out.extend(p.events);
        cursor = p.next_cursor;
        more = p.has_more;
    }
    out
}

#[test]
fn kill_between_each_step_of_a_rewrite_loses_nothing_and_resurrects_nothing() {
    let h = Harness::with(tune);
    // conv 10: users 1..=5, whose phones ACK everything (their events die);
    // conv 20: users 1 and 6, and 6's desktop never ACKs (its events live).
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
    let mut acked = Vec::new();
    for (i, uid) in (2..=5).enumerate() {
        let (_, _, a) = h.catch_up(Uid(uid), PHONE, gens[i], SyncSeq(0));
        acked.push(a);
    }
    h.advance(2 * HOUR);
    let reference = events_from(h.ib(), Uid(6), g6, SyncSeq(0));
    assert_eq!(
        reference.len(),
        1 + 240,
        "its join and the messages of conv 20"
    );

    let images: Arc<Mutex<Vec<(CompactionStep, tempfile::TempDir)>>> = Arc::default();
    {
        let images = Arc::clone(&images);
        let dir = h.dir.path().to_path_buf();
        h.ib().set_compaction_hook(Some(Arc::new(move |step| {
            let img = tempfile::tempdir().unwrap();
            copy_running_dir(&dir, img.path());
            images.lock().push((step, img));
        })));
    }
    let report = h.ib().compact().unwrap();
    h.ib().set_compaction_hook(None);
    assert!(report.segments_rewritten > 0, "{report:?}");
    assert!(report.segments_dropped > 0, "{report:?}");
    let steps: Vec<CompactionStep> = images.lock().iter().map(|(s, _)| *s).collect();
    for want in [
        CompactionStep::Trimmed,
        CompactionStep::Checkpointed,
        CompactionStep::Copied,
        CompactionStep::Relocated,
        CompactionStep::SegmentDeleted,
    ] {
        assert!(steps.contains(&want), "{want:?} in {steps:?}");
    }
    let bases: Vec<SyncSeq> = (2..=5)
        .map(|uid| h.ib().explain(Uid(uid)).unwrap().oldest_retained)
        .collect();
    for (i, b) in bases.iter().enumerate() {
        assert_eq!(*b, acked[i].next(), "acked events reclaimed");
    }
    println!("compaction steps imaged: {steps:?}; {report:?}");

    let images = std::mem::take(&mut *images.lock());
    let mut replays_after_checkpoint = 0;
    for (step, img) in images {
        let mut next_image = img;
        for pass in 0..2 {
            let img = next_image;
            let mut c = config(img.path(), &h.clock);
            tune(&mut c);
            let ib = Inbox::open(c).unwrap();
            let recovery = ib.recovery_report();
            if recovery.checkpoint_lsn > 0 && recovery.records_replayed > 0 {
                replays_after_checkpoint += 1;
            }
            // Nothing live is lost, byte for byte.
            assert_eq!(
                events_from(&ib, Uid(6), g6, SyncSeq(0)),
                reference,
                "user 6's events after a kill at {step:?} (pass {pass})"
            );
            // Nothing reclaimed comes back.
            for (i, uid) in (2..=5).enumerate() {
                let x = ib.explain(Uid(uid)).unwrap();
                assert_eq!(
                    x.oldest_retained, bases[i],
                    "uid {uid} after a kill at {step:?}"
                );
                let err = ib
                    .sync(SyncRequest {
                        uid: Uid(uid),
                        device: PHONE,
                        generation: Some(gens[i]),
                        local_applied_seq: SyncSeq(0),
                        limit: 100,
                        batch_token: None,
                    })
                    .wait()
                    .unwrap_err();
                assert!(matches!(err, Error::ResetRequired { .. }), "{err:?}");
            }
            // A later pass finishes the job and changes no answer.
            ib.compact().unwrap();
            assert_eq!(events_from(&ib, Uid(6), g6, SyncSeq(0)), reference);
            // Killed now: the next pass opens what this one left, without
            // the checkpoint a clean shutdown would add.
            next_image = tempfile::tempdir().unwrap();
            copy_running_dir(img.path(), next_image.path());
            drop(ib);
        }
    }
    // Kills after the pass's checkpoint leave trim and relocation records
    // after it, which recovery must replay.
    println!("kill images recovered by replay after a checkpoint: {replays_after_checkpoint}");
    assert!(
        replays_after_checkpoint > 0,
        "no kill image was recovered by replaying records after a checkpoint"
    );
}
