//! Helpers shared by the segment log tests.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};

use inbox_engine::log::{Batch, Log, LogOptions, Lsn, RecordLoc, SyncPolicy};

/// Small segments, so a few hundred appends cross several of them.
pub const SMALL_SEGMENT: u64 = 64 << 10;

pub fn opts(dir: &Path) -> LogOptions {
    let mut o = LogOptions::new(dir);
    o.segment_bytes = SMALL_SEGMENT;
    o.sync = SyncPolicy::Always;
    o
}

/// A deterministic payload for (batch tag, record index).
pub fn payload(tag: u64, i: usize) -> Vec<u8> {
    let len = 20 + (tag as usize * 37 + i * 11) % 300;
    (0..len)
        .map(|j| (tag as usize).wrapping_mul(31).wrapping_add(j * 7 + i) as u8)
        .collect()
}

pub fn batch(tag: u64, records: usize) -> Batch {
    let mut b = Batch::new();
    for i in 0..records {
        b.push((i % 5) as u8 + 1, &payload(tag, i));
    }
    b
}

/// Every record the log replays: (lsn, loc, kind, payload).
pub fn replay_all(log: &Log) -> Vec<(Lsn, RecordLoc, u8, Vec<u8>)> {
    let mut out = Vec::new();
    log.replay(0, &mut |lsn, loc, kind, p| {
        out.push((lsn, loc, kind, p.to_vec()));
        Ok(())
    })
    .expect("replay");
    out
}

/// LSNs of the batches the log replays, in order, deduplicated.
pub fn replayed_lsns(log: &Log) -> Vec<Lsn> {
    let mut lsns: Vec<Lsn> = replay_all(log).into_iter().map(|r| r.0).collect();
    lsns.dedup();
    lsns
}

/// Begun segment files in `dir` (the ones that hold or will hold
/// records), sorted; prepared spares are left out.
pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    all_segment_files(dir)
        .into_iter()
        .filter(|p| !is_prepared(p))
        .collect()
}

/// Prepared (never begun) segment files in `dir`, sorted.
pub fn prepared_segment_files(dir: &Path) -> Vec<PathBuf> {
    all_segment_files(dir)
        .into_iter()
        .filter(|p| is_prepared(p))
        .collect()
}

/// Every `*.seg` file in `dir`, sorted.
pub fn all_segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// Whether the segment header carries the prepared flag.
pub fn is_prepared(path: &Path) -> bool {
    let bytes = std::fs::read(path).unwrap();
    let id = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap();
    inbox_engine::log::format::decode_segment_header(id, &bytes).is_ok_and(|h| h.is_prepared())
}

/// Copies the segment files of `from` into a fresh directory `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in segment_files(from) {
        std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
    }
}

/// Waits until the log's preparer has a spare segment ready (and so is
/// idle), for tests that count syncs or inject a failure into the next
/// one. Panics after a bound far beyond any scheduling delay.
pub fn wait_for_spare(log: &Log) {
    let start = std::time::Instant::now();
    while log.stats().spares_ready == 0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "no spare segment was prepared"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}
