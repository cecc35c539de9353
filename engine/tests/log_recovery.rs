//! Segment log recovery: torn tails are cut, everything else refuses to
//! open with the place named.

mod log_common;

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use inbox_engine::log::format::{decode_batch, BatchEncoder, SEGMENT_HEADER_LEN};
use inbox_engine::log::{verify, Log, LogError, ProblemKind};
use log_common::*;

/// Writes `n` one-record batches and returns the offsets (in the last
/// segment file) where its last batch starts and ends.
fn log_with_batches(dir: &Path, n: u64) -> (std::path::PathBuf, u64, u64) {
    let log = Log::open(opts(dir)).unwrap();
    let mut last = None;
    for tag in 0..n {
        last = Some(log.append(batch(tag, 2)).unwrap());
    }
    drop(log);
    let last = last.unwrap();
    let file = segment_files(dir).pop().unwrap();
    let data = std::fs::read(&file).unwrap();
    // The last batch's frame starts one record header + batch header before
    // its first record.
    let start = last.locs[0].offset as usize - 24;
    let frame = decode_batch(last.locs[0].segment, &data, start, 0).unwrap();
    assert_eq!(frame.lsn, n);
    (file, start as u64, (start + frame.frame_len) as u64)
}

#[test]
fn torn_tail_is_truncated_to_the_batches_acknowledged_before_the_cut() {
    let src = tempfile::tempdir().unwrap();
    let n = 60;
    let (file, start, end) = log_with_batches(src.path(), n);
    let name = file.file_name().unwrap().to_owned();
    let orig = std::fs::read(&file).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    for cut in start..=end {
        for mode in ["shorten", "zero", "garbage"] {
            let dir = scratch.path().join(format!("{cut}-{mode}"));
            copy_dir(src.path(), &dir);
            let f = dir.join(&name);
            match mode {
                "shorten" => OpenOptions::new()
                    .write(true)
                    .open(&f)
                    .unwrap()
                    .set_len(cut)
                    .unwrap(),
                _ => {
                    let mut fh = OpenOptions::new().write(true).open(&f).unwrap();
                    fh.seek(SeekFrom::Start(cut)).unwrap();
                    let fill: Vec<u8> = (cut..end)
                        .map(|i| if mode == "zero" { 0 } else { (i as u8) | 0x80 })
                        .collect();
                    fh.write_all(&fill).unwrap();
                }
            }
            let expect = if cut == end { n } else { n - 1 };
            let log = Log::open(opts(&dir)).unwrap_or_else(|e| panic!("cut {cut} {mode}: {e}"));
            assert_eq!(
                replayed_lsns(&log),
                (1..=expect).collect::<Vec<_>>(),
                "cut {cut} {mode}"
            );
            let report = log.recovery_report().clone();
            // Recovery zeroes every non-zero byte past the valid data; zeros
            // at the end of the torn part are already what it would write.
            let torn_bytes = match mode {
                "shorten" | "zero" => orig[start as usize..cut as usize]
                    .iter()
                    .rposition(|&b| b != 0)
                    .map_or(0, |p| p as u64 + 1),
                _ => end - start,
            };
            if cut == end || torn_bytes == 0 {
                assert_eq!(report.truncated, None, "cut {cut} {mode}");
            } else {
                let t = report.truncated.expect("a torn tail was cut");
                assert_eq!((t.offset, t.bytes), (start, torn_bytes), "cut {cut} {mode}");
            }
            // The log goes on from the cut, and the new batch survives.
            let a = log.append(batch(1000, 1)).unwrap();
            assert_eq!(a.lsn, expect + 1);
            drop(log);
            let log = Log::open(opts(&dir)).unwrap();
            assert_eq!(log.durable_lsn(), expect + 1);
            assert_eq!(log.read(a.locs[0]).unwrap().payload, payload(1000, 0));
            drop(log);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}

fn flip_bit(path: &Path, offset: u64, bit: u8) {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut b = [0u8];
    f.read_exact(&mut b).unwrap();
    b[0] ^= 1 << bit;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
}

#[test]
fn a_flipped_bit_in_a_sealed_segment_refuses_open_naming_segment_and_offset() {
    let src = tempfile::tempdir().unwrap();
    let mut locs = Vec::new();
    {
        let log = Log::open(opts(src.path())).unwrap();
        for tag in 0..400 {
            locs.push(log.append(batch(tag, 2)).unwrap().locs);
        }
        assert!(log.segments()[0].sealed);
    }
    let first = segment_files(src.path()).remove(0);
    let name = first.file_name().unwrap().to_owned();
    // Batch 10 (LSN 10) of segment 1: flip a bit in its header, its first
    // record's header, and its last payload byte.
    let batch_start = u64::from(locs[9][0].offset) - 24;
    let batch_end = u64::from(locs[10][0].offset) - 24;
    let scratch = tempfile::tempdir().unwrap();
    for (i, at) in [
        batch_start + 8,
        u64::from(locs[9][0].offset) + 1,
        batch_end - 1,
    ]
    .into_iter()
    .enumerate()
    {
        let dir = scratch.path().join(i.to_string());
        copy_dir(src.path(), &dir);
        flip_bit(&dir.join(&name), at, 3);
        match Log::open(opts(&dir)) {
            Err(LogError::Corruption {
                segment,
                offset,
                reason,
            }) => {
                assert_eq!((segment, offset), (1, batch_start), "{reason}");
            }
            other => panic!("flip at {at} opened: {other:?}"),
        }
        let report = verify(&dir).unwrap();
        assert!(!report.opens());
        assert_eq!(report.problems[0].kind, ProblemKind::Corruption);
        assert_eq!(
            (report.problems[0].segment, report.problems[0].offset),
            (1, batch_start)
        );
    }
    // And in the segment header itself: offset 0.
    let dir = scratch.path().join("header");
    copy_dir(src.path(), &dir);
    flip_bit(&dir.join(&name), 13, 0);
    assert!(matches!(
        Log::open(opts(&dir)),
        Err(LogError::Corruption {
            segment: 1,
            offset: 0,
            ..
        })
    ));
}

#[test]
fn a_flipped_bit_in_an_active_segment_batch_followed_by_valid_batches_refuses_open() {
    let src = tempfile::tempdir().unwrap();
    let mut locs = Vec::new();
    {
        let log = Log::open(opts(src.path())).unwrap();
        for tag in 0..20 {
            locs.push(log.append(batch(tag, 1)).unwrap().locs);
        }
        assert_eq!(log.segments().len(), 1);
    }
    let file = segment_files(src.path()).remove(0);
    let at = u64::from(locs[4][0].offset) + 20;
    flip_bit(&file, at, 1);
    match Log::open(opts(src.path())) {
        Err(LogError::Corruption {
            segment,
            offset,
            reason,
        }) => {
            assert_eq!((segment, offset), (1, u64::from(locs[4][0].offset) - 24));
            assert!(reason.contains("followed by a valid batch"), "{reason}");
        }
        other => panic!("opened: {other:?}"),
    }
}

#[test]
fn stale_bytes_past_the_end_of_a_reused_or_preallocated_file_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(opts(dir.path())).unwrap();
        for tag in 0..10 {
            log.append(batch(tag, 2)).unwrap();
        }
    }
    let file = segment_files(dir.path()).remove(0);
    let data_end = {
        let log = Log::open(opts(dir.path())).unwrap();
        log.segments()[0].bytes
    };
    // Stale frames as another segment (id 7) would have left them, with
    // LSNs that would even continue this log, then random garbage.
    let mut stale = Vec::new();
    for lsn in 11..15u64 {
        let at = data_end as u32 + stale.len() as u32;
        BatchEncoder::encode(7, at, lsn, &[(1, payload(lsn, 0))], &mut stale);
    }
    stale.extend((0..500u32).map(|i| (i * 97 % 251) as u8));
    {
        let mut f = OpenOptions::new().write(true).open(&file).unwrap();
        f.seek(SeekFrom::Start(data_end)).unwrap();
        f.write_all(&stale).unwrap();
    }
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(replayed_lsns(&log), (1..=10).collect::<Vec<_>>());
    let t = log
        .recovery_report()
        .truncated
        .clone()
        .expect("stale bytes cut");
    assert_eq!(
        (t.segment, t.offset, t.bytes),
        (1, data_end, stale.len() as u64)
    );
    // The stale bytes are gone for good: new appends and a reopen see only
    // this log's batches.
    log.append(batch(10, 1)).unwrap();
    drop(log);
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(replayed_lsns(&log), (1..=11).collect::<Vec<_>>());
    assert!(log.recovery_report().truncated.is_none());
}

#[test]
fn a_zeroed_preallocated_remainder_is_the_normal_end_of_the_log() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(opts(dir.path())).unwrap();
        log.append(batch(0, 1)).unwrap();
    }
    let file = segment_files(dir.path()).remove(0);
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        SMALL_SEGMENT,
        "preallocated"
    );
    let log = Log::open(opts(dir.path())).unwrap();
    assert!(log.recovery_report().truncated.is_none());
    assert_eq!(log.durable_lsn(), 1);
    assert!(verify(dir.path()).unwrap().is_clean());
}

#[test]
fn a_gap_in_lsns_between_consecutive_segments_refuses_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(opts(dir.path())).unwrap();
        for tag in 0..400 {
            log.append(batch(tag, 2)).unwrap();
        }
    }
    let files = segment_files(dir.path());
    assert!(files.len() >= 3);
    // Zero the last batch of segment 1: the segment still parses, but its
    // LSNs no longer meet segment 2's.
    let data = std::fs::read(&files[0]).unwrap();
    let mut pos = SEGMENT_HEADER_LEN;
    let mut last = pos;
    while let Ok(b) = decode_batch(1, &data, pos, 0) {
        last = pos;
        pos += b.frame_len;
    }
    let mut f = OpenOptions::new().write(true).open(&files[0]).unwrap();
    f.seek(SeekFrom::Start(last as u64)).unwrap();
    f.write_all(&vec![0u8; pos - last]).unwrap();
    drop(f);
    assert!(matches!(
        Log::open(opts(dir.path())),
        Err(LogError::Corruption {
            segment: 2,
            offset: 0,
            ..
        })
    ));
}
