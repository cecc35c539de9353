//! Suffix truncation of the segment log (`Log::truncate_after`): the log
//! ends at the given LSN, goes on from there, and a power cut at any step
//! of the truncation recovers the log either whole or truncated.

mod log_common;

use std::sync::Arc;

use inbox_engine::log::{verify, FaultyIo, Log, LogError, Lsn};
use log_common::*;

/// Every record replayed, as (LSN, payload).
fn tags(log: &Log) -> Vec<(Lsn, Vec<u8>)> {
    replay_all(log).into_iter().map(|r| (r.0, r.3)).collect()
}

#[test]
fn truncation_drops_the_batches_after_the_lsn_and_the_log_goes_on_from_there() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(opts(dir.path())).unwrap();
    for tag in 1..=6 {
        assert_eq!(log.append(batch(tag, 2)).unwrap().lsn, tag);
    }
    let before = tags(&log);
    log.truncate_after(4).unwrap();
    assert_eq!(log.durable_lsn(), 4);
    assert_eq!(replayed_lsns(&log), vec![1, 2, 3, 4]);
    let kept: Vec<_> = before.iter().filter(|r| r.0 <= 4).cloned().collect();
    assert_eq!(tags(&log), kept);
    // The next batch takes LSN 5, in the place of the dropped one.
    let a = log.append(batch(50, 1)).unwrap();
    assert_eq!(a.lsn, 5);
    drop(log);
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(replayed_lsns(&log), vec![1, 2, 3, 4, 5]);
    assert_eq!(replay_all(&log).last().unwrap().3, payload(50, 0));
    assert!(verify(dir.path()).unwrap().opens());
}

#[test]
fn truncation_at_or_past_the_end_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(opts(dir.path())).unwrap();
    for tag in 1..=3 {
        log.append(batch(tag, 1)).unwrap();
    }
    log.truncate_after(3).unwrap();
    log.truncate_after(10).unwrap();
    assert_eq!(replayed_lsns(&log), vec![1, 2, 3]);
    // Down to nothing: the active segment keeps only its header.
    log.truncate_after(0).unwrap();
    assert_eq!(replayed_lsns(&log), Vec::<Lsn>::new());
    assert_eq!(log.append(batch(7, 1)).unwrap().lsn, 1);
}

#[test]
fn truncation_that_reaches_a_sealed_segment_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(opts(dir.path())).unwrap();
    let mut tag = 0;
    while log.segments().len() < 2 {
        tag += 1;
        log.append(batch(tag, 4)).unwrap();
    }
    let first_active = log.segments().last().unwrap().first_lsn;
    let err = log.truncate_after(first_active - 2).unwrap_err();
    assert!(matches!(err, LogError::InvalidArgument(_)), "{err}");
    assert_eq!(log.durable_lsn(), tag);
    assert_eq!(log.append(batch(999, 1)).unwrap().lsn, tag + 1);
}

/// Appends, then truncates under a crash image at every step; every image
/// opens to the log as it was before the truncation or as it is after it.
fn power_cut_at_every_step_of_a_truncation(torn: bool) {
    let root = tempfile::tempdir().unwrap();
    let images = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let io = Arc::new(FaultyIo::new());
    let log = Log::open_with_io(opts(&dir), io.clone()).unwrap();
    let mut tag = 0;
    // Several segments, and a few batches into the active one.
    while log.segments().len() < 3
        || log.durable_lsn() < log.segments().last().unwrap().first_lsn + 5
    {
        tag += 1;
        log.append(batch(tag, 3)).unwrap();
    }
    let whole = tags(&log);
    let end = log.durable_lsn();
    let keep = end - 3;
    io.crash_image_at_every_step(root.path(), images.path(), torn);
    log.truncate_after(keep).unwrap();
    let taken = io.crash_images_taken();
    io.stop_crash_images();
    drop(log);
    assert!(taken >= 4, "{taken} images");
    let cut: Vec<_> = whole.iter().filter(|r| r.0 <= keep).cloned().collect();
    let (mut saw_before, mut saw_after) = (false, false);
    for n in 1..=taken {
        let img = images.path().join(format!("{n:06}")).join("log");
        std::fs::create_dir_all(&img).unwrap();
        let log = Log::open(opts(&img)).unwrap_or_else(|e| panic!("image {n}: {e}"));
        let got = tags(&log);
        if got == whole {
            saw_before = true;
        } else {
            assert_eq!(
                got, cut,
                "image {n}: neither before nor after the truncation"
            );
            saw_after = true;
        }
        assert!(!img.join("truncate.intent").exists(), "image {n}");
        assert!(verify(&img).unwrap().opens(), "image {n}");
        let last = got.last().unwrap().0;
        assert_eq!(
            log.append(batch(999_999, 1)).unwrap().lsn,
            last + 1,
            "image {n}"
        );
    }
    // The first image is taken before the intent is durable, the last after
    // the intent is gone.
    assert!(saw_before && saw_after);
}

#[test]
fn a_power_cut_at_any_step_of_a_truncation_recovers_before_or_after_it() {
    power_cut_at_every_step_of_a_truncation(false);
}

#[test]
fn a_power_cut_with_torn_writes_at_any_step_of_a_truncation_recovers_before_or_after_it() {
    power_cut_at_every_step_of_a_truncation(true);
}
