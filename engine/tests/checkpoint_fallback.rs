//! The two-checkpoint rule (R22): compaction deletes a segment only once
//! the two newest checkpoints both cover it, so when the newest checkpoint
//! is corrupt, recovery falls back to the older one and replays the log
//! after it: nothing it needs was deleted. These tests corrupt the newest
//! checkpoint of a kill image taken after compaction deleted segments, and
//! check which checkpoint recovery used, that it replayed, and that the
//! state it rebuilt is the one the engine had.

mod inbox_common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use inbox_common::*;
use inbox_engine::*;

const PHONE: DeviceId = DeviceId(1);

fn tune(c: &mut InboxConfig) {
    c.segment_bytes = inbox_engine::log::SEGMENT_BYTES_MIN;
    c.safety_window = Duration::ZERO;
    c.rewrite_live_fraction = 0.9;
}

/// `(lsn, path)` of every checkpoint file in `dir`, newest first.
fn checkpoints(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(dir.join("checkpoint"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stem = name.strip_prefix("ckpt-")?.strip_suffix(".bin")?;
            let lsn = stem.trim_end_matches("-2").parse().ok()?;
            Some((lsn, e.path()))
        })
        .collect();
    out.sort_by(|a, b| b.cmp(a));
    out
}

fn evt_segments(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("evt"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".seg"))
        .collect();
    names.sort();
    names
}

fn flip_a_body_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

/// An engine whose compaction has deleted `evt` segments and which has
/// logged more after its last checkpoint; returns it with its state digest.
fn compacted_then_written() -> (Harness, [u8; 32]) {
    let h = Harness::with(tune);
    for uid in 1..=3 {
        h.join(Uid(uid), ConvId(10));
        h.register(Uid(uid), PHONE);
    }
    h.send_many(ConvId(10), Uid(1), 1_000, 150);
    for uid in 1..=3 {
        let generation = h.ib().devices(Uid(uid)).unwrap()[0].generation;
        h.catch_up(Uid(uid), PHONE, generation, SyncSeq(0));
    }
    let report = h.ib().compact().unwrap();
    assert!(
        report.segments_dropped > 0,
        "compaction deleted no segment: {report:?}"
    );
    assert!(
        !evt_segments(h.dir.path()).contains(&"0000000001.seg".to_string()),
        "the first evt segment is gone"
    );
    // Records after the newest checkpoint, for recovery to replay.
    h.send_many(ConvId(10), Uid(2), 5_000, 20);
    let digest = h.ib().state_digest();
    (h, digest)
}

#[test]
fn a_corrupt_newest_checkpoint_after_compaction_falls_back_to_the_older_one_and_replays() {
    let (h, digest) = compacted_then_written();
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    let ckpts = checkpoints(image.path());
    assert_eq!(ckpts.len(), 2, "two checkpoints are kept: {ckpts:?}");
    let (newest, older) = (ckpts[0].clone(), ckpts[1].clone());
    flip_a_body_byte(&newest.1);

    let mut c = config(image.path(), &h.clock);
    tune(&mut c);
    let ib = Inbox::open(c).expect("recovery falls back to the older checkpoint");
    let report = ib.recovery_report();
    assert_eq!(
        report.checkpoint_lsn, older.0,
        "recovery used the older checkpoint (the newest, at {}, is corrupt)",
        newest.0
    );
    assert!(
        report.records_replayed > 0,
        "it replayed the log after it: {report:?}"
    );
    assert_eq!(
        ib.state_digest(),
        digest,
        "the fallback rebuilt the same state"
    );
}

#[test]
fn with_both_checkpoints_corrupt_after_compaction_recovery_refuses_instead_of_serving_less() {
    let (h, _) = compacted_then_written();
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    for (_, path) in checkpoints(image.path()) {
        flip_a_body_byte(&path);
    }
    let mut c = config(image.path(), &h.clock);
    tune(&mut c);
    let err = Inbox::open(c)
        .err()
        .expect("a full replay of a log missing its start must fail");
    assert!(
        err.to_string().contains("log data is missing"),
        "the error says why: {err}"
    );
}
