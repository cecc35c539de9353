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

/// Segment files in `dir`, sorted.
pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// Copies the segment files of `from` into a fresh directory `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in segment_files(from) {
        std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
    }
}
