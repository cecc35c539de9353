//! Segments prepared ahead of need and recycled segment files: stale bytes
//! of a recycled file are never replayed, a power cut at any step of
//! preparing or recycling keeps every synced batch, and failures of the
//! background preparer poison nothing.

mod log_common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inbox_engine::log::{verify, FaultyIo, Log, LogError, Lsn, SegmentId};
use log_common::*;

/// Polls `cond` until it holds; panics after a generous bound (a hang,
/// not a timing assertion).
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "gave up waiting: {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The active segment's id (0 before the first segment is begun).
fn active_id(log: &Log) -> SegmentId {
    log.segments().last().map_or(0, |s| s.id)
}

/// Appends tagged batches until the active segment is `id` or later.
fn append_until_active(log: &Log, id: SegmentId, tag: &mut u64, acked: &mut BTreeMap<Lsn, u64>) {
    while active_id(log) < id {
        let a = log.append(batch(*tag, 3)).unwrap();
        acked.insert(a.lsn, *tag);
        *tag += 1;
    }
}

/// (lsn, tag) of every batch replayed, checking each record's payload.
fn replayed_tags(log: &Log, acked: &BTreeMap<Lsn, u64>) -> BTreeMap<Lsn, u64> {
    let mut out = BTreeMap::new();
    for (lsn, _, _, p) in replay_all(log) {
        let tag = *acked
            .get(&lsn)
            .unwrap_or_else(|| panic!("replayed LSN {lsn} was never acknowledged"));
        assert!(
            (0..3).any(|i| payload(tag, i) == p),
            "LSN {lsn}: a record that is not one of batch {tag}'s"
        );
        out.insert(lsn, tag);
    }
    out
}

#[test]
fn a_recycled_segments_stale_records_are_never_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(opts(dir.path())).unwrap();
    let mut acked = BTreeMap::new();
    let mut tag = 0;
    append_until_active(&log, 4, &mut tag, &mut acked);
    let first = log.segments()[0].clone();
    wait_until("a spare is ready", || log.stats().spares_ready >= 1);
    let files_before = all_segment_files(dir.path()).len();
    log.delete_segment(first.id).unwrap();
    wait_until("the deleted segment is recycled", || {
        log.stats().segments_recycled == 1
    });
    assert_eq!(
        all_segment_files(dir.path()).len(),
        files_before,
        "the deleted file became a spare instead of being unlinked"
    );
    let recycled = prepared_segment_files(dir.path()).pop().unwrap();
    let recycled_id: SegmentId = recycled
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // Begin the recycled file and put a little in it: most of its old
    // frames stay behind the new data.
    append_until_active(&log, recycled_id, &mut tag, &mut acked);
    for _ in 0..2 {
        let a = log.append(batch(tag, 1)).unwrap();
        acked.insert(a.lsn, tag);
        tag += 1;
    }
    let mut begun: Vec<SegmentId> = log.segments().iter().map(|s| s.id).collect();
    begun.push(first.id);
    let durable = log.segments().last().unwrap().bytes as usize;
    drop(log);
    let bytes = std::fs::read(dir.path().join(format!("{recycled_id:010}.seg"))).unwrap();
    assert!(
        bytes[durable + 64..].iter().any(|&b| b != 0),
        "the test needs stale bytes past the new data"
    );

    let report = verify(dir.path()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let log = Log::open(opts(dir.path())).unwrap();
    assert!(log.recovery_report().truncated.is_none());
    let expected: BTreeMap<Lsn, u64> = acked
        .iter()
        .filter(|(lsn, _)| **lsn > first.last_lsn)
        .map(|(l, t)| (*l, *t))
        .collect();
    assert_eq!(replayed_tags(&log, &acked), expected);
    // Ids are never begun twice, across the restart too.
    let mut acked2 = acked.clone();
    for _ in 0..3 {
        let next = active_id(&log) + 1;
        append_until_active(&log, next, &mut tag, &mut acked2);
        let id = active_id(&log);
        assert!(!begun.contains(&id), "segment id {id} begun twice");
        begun.push(id);
    }
}

/// Appends, deletes and recycles under a crash image at every step, then
/// opens every image: each recovers a contiguous run of LSNs that holds
/// every batch acknowledged before the image (bar a deleted segment's,
/// which may be gone), and `verify` accepts it.
fn power_cut_at_every_step(torn: bool) {
    let root = tempfile::tempdir().unwrap();
    let images = tempfile::tempdir().unwrap();
    let dir = root.path().join("log");
    let io = Arc::new(FaultyIo::new());
    let log = Log::open_with_io(opts(&dir), io.clone()).unwrap();
    wait_until("a spare is ready", || log.stats().spares_ready >= 1);
    io.crash_image_at_every_step(root.path(), images.path(), torn);
    let mut acked = BTreeMap::new();
    // (image number from which it must be there, LSN)
    let mut must_have: Vec<(u64, Lsn)> = Vec::new();
    let mut tag = 0;
    let mut deleted: Vec<(u64, Lsn)> = Vec::new();
    for round in 0..2 {
        let target = active_id(&log) + 2;
        while active_id(&log) < target {
            let a = log.append(batch(tag, 3)).unwrap();
            must_have.push((io.crash_images_taken(), a.lsn));
            acked.insert(a.lsn, tag);
            tag += 1;
        }
        // From the step the delete starts at, the segment may be gone.
        let old = log.segments()[0].clone();
        deleted.push((io.crash_images_taken() + 1, old.last_lsn));
        log.delete_segment(old.id).unwrap();
        if round < 1 {
            wait_until("the deleted segment is recycled", || {
                log.stats().segments_recycled == round + 1
            });
        }
    }
    // Begin a recycled spare and write into it.
    let target = active_id(&log) + 2;
    while active_id(&log) < target {
        let a = log.append(batch(tag, 3)).unwrap();
        must_have.push((io.crash_images_taken(), a.lsn));
        acked.insert(a.lsn, tag);
        tag += 1;
    }
    assert!(log.stats().segments_recycled >= 1);
    let taken = io.crash_images_taken();
    io.stop_crash_images();
    drop(log);
    assert!(taken > 50, "{taken} images");
    for n in 1..=taken {
        let img = images.path().join(format!("{n:06}")).join("log");
        std::fs::create_dir_all(&img).unwrap();
        let report = verify(&img).unwrap();
        assert!(report.opens(), "image {n}: {:?}", report.problems);
        let log = Log::open(opts(&img)).unwrap_or_else(|e| panic!("image {n}: {e}"));
        let got = replayed_tags(&log, &acked);
        let lsns: Vec<Lsn> = got.keys().copied().collect();
        if let (Some(a), Some(b)) = (lsns.first(), lsns.last()) {
            assert_eq!(lsns, (*a..=*b).collect::<Vec<_>>(), "image {n}: a gap");
        }
        // Everything deleted for good by this image may be gone; the rest
        // acknowledged by then must be there.
        let gone_below = deleted
            .iter()
            .filter(|(from, _)| *from <= n)
            .map(|(_, last)| *last)
            .max()
            .unwrap_or(0);
        for (from, lsn) in &must_have {
            if *from <= n && *lsn > gone_below {
                assert!(
                    got.contains_key(lsn),
                    "image {n}: acknowledged LSN {lsn} lost"
                );
            }
        }
        // The log goes on from there.
        let a = log.append(batch(999_999, 1)).unwrap();
        match lsns.last() {
            Some(last) => assert_eq!(a.lsn, last + 1, "image {n}"),
            None => assert!(a.lsn > gone_below, "image {n}"),
        }
    }
}

#[test]
fn a_power_cut_at_any_step_of_prepare_and_recycle_keeps_every_synced_batch() {
    power_cut_at_every_step(false);
}

#[test]
fn a_power_cut_with_torn_writes_at_any_step_of_prepare_and_recycle_keeps_every_synced_batch() {
    power_cut_at_every_step(true);
}

#[test]
fn no_space_in_the_background_preparer_does_not_poison_and_is_reported_only_when_a_batch_needs_the_segment(
) {
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let log = Log::open_with_io(opts(dir.path()), io.clone()).unwrap();
    let mut acked = BTreeMap::new();
    let mut tag = 0;
    append_until_active(&log, 1, &mut tag, &mut acked);
    wait_until("a spare is ready", || log.stats().spares_ready >= 1);
    io.set_no_space(true);
    // The roll into the ready spare needs no space; the preparer's next
    // attempt fails in the background.
    let spare = active_id(&log) + 1;
    append_until_active(&log, spare, &mut tag, &mut acked);
    wait_until("the background attempt failed", || {
        log.stats().spare_failures >= 1
    });
    assert!(
        log.poisoned().is_none(),
        "ENOSPC in the background poisons nothing"
    );
    // Batches that fit the active segment go on.
    let a = log.append(batch(tag, 1)).unwrap();
    acked.insert(a.lsn, tag);
    tag += 1;
    // Only the batch that needs the next segment is refused.
    let refused = loop {
        match log.append(batch(tag, 3)) {
            Ok(a) => {
                acked.insert(a.lsn, tag);
                tag += 1;
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(refused, LogError::NoSpace(_)), "{refused}");
    assert!(log.poisoned().is_none());
    assert_eq!(log.durable_lsn(), *acked.keys().last().unwrap());
    io.set_no_space(false);
    let a = log.append(batch(tag, 3)).unwrap();
    assert_eq!(a.lsn, log.durable_lsn());
    acked.insert(a.lsn, tag);
    drop(log);
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(replayed_tags(&log, &acked), acked);
}

#[test]
fn an_fsync_error_in_the_preparer_poisons_nothing_acknowledged_and_that_spare_is_never_used() {
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let log = Log::open_with_io(opts(dir.path()), io.clone()).unwrap();
    let mut acked = BTreeMap::new();
    let mut tag = 0;
    append_until_active(&log, 1, &mut tag, &mut acked);
    wait_until("a spare is ready", || log.stats().spares_ready >= 1);
    // The next preparation (of the spare after the ready one) fails.
    io.fail_next_sync_of_file_named(".tmp");
    let ready = active_id(&log) + 1;
    append_until_active(&log, ready, &mut tag, &mut acked);
    wait_until("the background attempt failed", || {
        log.stats().spare_failures >= 1
    });
    let refused = ready + 1;
    assert!(log.poisoned().is_none());
    assert!(!dir.path().join(format!("{refused:010}.seg")).exists());
    // The next roll prepares inline, under a new id.
    append_until_active(&log, refused + 1, &mut tag, &mut acked);
    assert!(log.segments().iter().all(|s| s.id != refused));
    assert!(log.poisoned().is_none());
    drop(log);
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(replayed_tags(&log, &acked), acked);
    assert!(verify(dir.path()).unwrap().is_clean());
}

#[test]
fn a_prepared_spare_left_at_shutdown_is_reused_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut acked = BTreeMap::new();
    let mut tag = 0;
    {
        let log = Log::open(opts(dir.path())).unwrap();
        append_until_active(&log, 1, &mut tag, &mut acked);
        wait_until("a spare is ready", || log.stats().spares_ready >= 1);
    }
    let spares = prepared_segment_files(dir.path());
    assert_eq!(spares.len(), 1);
    let report = verify(dir.path()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let listed: Vec<_> = report.segments.iter().filter(|s| s.prepared).collect();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].batches, listed[0].first_lsn), (0, None));
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(log.stats().spares_ready, 1);
    let spare_id: SegmentId = spares[0]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    append_until_active(&log, spare_id, &mut tag, &mut acked);
    assert_eq!(
        active_id(&log),
        spare_id,
        "the roll began the spare left on disk"
    );
    assert_eq!(replayed_tags(&log, &acked), acked);
}

#[test]
fn segment_numbers_do_not_skip_and_one_warn_is_logged_after_preparations_refused_for_lack_of_space()
{
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let log = Log::open_with_io(opts(dir.path()), io.clone()).unwrap();
    let mut acked = BTreeMap::new();
    let mut tag = 0;
    append_until_active(&log, 1, &mut tag, &mut acked);
    wait_until("a spare is ready", || log.stats().spares_ready >= 1);
    io.set_no_space(true);
    let spare = active_id(&log) + 1;
    append_until_active(&log, spare, &mut tag, &mut acked);
    // Writes that need the next segment are refused, again and again,
    // each after an inline attempt to prepare it, and each wakes the
    // background preparer, which fails again.
    let mut refusals = 0;
    while refusals < 5 {
        let failures = log.stats().spare_failures;
        match log.append(batch(tag, 3)) {
            Ok(a) => {
                acked.insert(a.lsn, tag);
                tag += 1;
            }
            Err(LogError::NoSpace(_)) => {
                refusals += 1;
                wait_until("the background preparer tried again", || {
                    log.stats().spare_failures > failures
                });
            }
            Err(e) => panic!("{e}"),
        }
    }
    let stats = log.stats();
    assert!(stats.spare_failures >= 5);
    assert_eq!(
        stats.spare_failure_warnings, 1,
        "one WARN for {} failed attempts",
        stats.spare_failures
    );
    io.set_no_space(false);
    append_until_active(&log, spare + 2, &mut tag, &mut acked);
    let ids: Vec<SegmentId> = log.segments().iter().map(|s| s.id).collect();
    let want: Vec<SegmentId> = (1..=spare + 2).collect();
    assert_eq!(ids, want, "segment numbers follow each other");
}
