//! Segment log under injected faults: fsync and write errors poison it,
//! ENOSPC at preallocation refuses cleanly and recovers, and a modelled
//! power cut keeps every acknowledged append.

mod log_common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use inbox_engine::log::{FaultyIo, Log, LogError};
use log_common::*;
use parking_lot::Mutex;

fn open_faulty(dir: &std::path::Path) -> (Log, Arc<FaultyIo>) {
    let io = Arc::new(FaultyIo::new());
    let log = Log::open_with_io(opts(dir), io.clone()).unwrap();
    (log, io)
}

fn poison_then_check(inject: impl Fn(&FaultyIo)) {
    let dir = tempfile::tempdir().unwrap();
    {
        let (log, io) = open_faulty(dir.path());
        for tag in 0..5 {
            log.append(batch(tag, 2)).unwrap();
        }
        wait_for_spare(&log);
        inject(&io);
        // The first submit is accepted and fails when written; later ones
        // fail either at submit (already poisoned) or at wait.
        let tickets: Vec<_> = (5..10).map(|t| log.submit(batch(t, 1))).collect();
        assert!(tickets[0].is_ok());
        for t in tickets {
            match t {
                Ok(t) => assert!(matches!(t.wait(), Err(LogError::Poisoned(_)))),
                Err(e) => assert!(matches!(e, LogError::Poisoned(_)), "{e}"),
            }
        }
        assert_eq!(log.durable_lsn(), 5, "nothing after the failure is durable");
        let reason = log.poisoned().expect("poisoned");
        assert!(reason.contains("failed"), "{reason}");
        assert!(matches!(
            log.submit(batch(99, 1)),
            Err(LogError::Poisoned(_))
        ));
        assert!(matches!(log.flush(), Err(LogError::Poisoned(_))));
        // Reads of what was durable keep working.
        assert_eq!(replayed_lsns(&log), (1..=5).collect::<Vec<_>>());
    }
    // After a restart the log recovers every acknowledged batch.
    let log = Log::open(opts(dir.path())).unwrap();
    let lsns = replayed_lsns(&log);
    assert!(lsns.len() >= 5 && lsns[..5] == [1, 2, 3, 4, 5], "{lsns:?}");
    assert!(log.poisoned().is_none());
    log.append(batch(100, 1)).unwrap();
}

#[test]
fn an_fsync_error_poisons_the_log_and_nothing_after_it_is_reported_durable() {
    poison_then_check(|io| io.fail_nth_sync(1));
}

#[test]
fn a_write_error_poisons_the_log_and_nothing_after_it_is_reported_durable() {
    poison_then_check(|io| io.fail_nth_write(1));
}

#[test]
fn no_space_at_preallocation_refuses_without_poisoning_and_writes_resume_after() {
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    io.set_no_space(true);
    let log = Log::open_with_io(opts(dir.path()), io.clone()).unwrap();
    // No segment can be created at all.
    assert!(matches!(log.submit(batch(0, 1)), Err(LogError::NoSpace(_))));
    assert!(log.poisoned().is_none());
    io.set_no_space(false);
    assert_eq!(
        log.append(batch(0, 1)).unwrap().lsn,
        1,
        "the refusal used no LSN"
    );

    // Fill segments until a roll finds no space.
    let mut acked = vec![(1u64, 0u64, log.segments()[0].id)];
    log.flush().unwrap();
    io.set_no_space(true);
    let mut refused = None;
    for tag in 1..3000u64 {
        match log.append(batch(tag, 3)) {
            Ok(a) => acked.push((a.lsn, tag, a.locs[0].segment)),
            Err(LogError::NoSpace(m)) => {
                assert!(m.contains("preallocating"), "{m}");
                refused = Some(tag);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let refused = refused.expect("a roll must eventually need a new segment");
    let last = acked.last().unwrap().0;
    assert_eq!(log.durable_lsn(), last);
    assert!(log.poisoned().is_none(), "ENOSPC does not poison");
    // The same batch is refused again while the disk stays full (whether
    // a spare was ready when the disk filled decides which roll was
    // refused, so only that batch is sure not to fit); reads keep working.
    assert!(matches!(
        log.submit(batch(refused, 3)),
        Err(LogError::NoSpace(_))
    ));
    assert_eq!(replayed_lsns(&log), (1..=last).collect::<Vec<_>>());

    // Space comes back: the next submit preallocates and goes on.
    io.set_no_space(false);
    let a = log.append(batch(6000, 1)).unwrap();
    assert_eq!(a.lsn, last + 1);
    drop(log);
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(replayed_lsns(&log), (1..=last + 1).collect::<Vec<_>>());
}

#[test]
fn no_space_when_reopening_a_short_last_segment_of_a_store_without_recorded_sizes_still_opens_and_rolls_later(
) {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(opts(dir.path())).unwrap();
        log.append(batch(0, 1)).unwrap();
    }
    let f = segment_files(dir.path()).pop().unwrap();
    // Without a prepared spare, the roll has to make a new segment.
    for spare in prepared_segment_files(dir.path()) {
        std::fs::remove_file(spare).unwrap();
    }
    // A store written before segment sizes were recorded: a short file
    // there is taken as it is (with a recorded size it is refused as cut,
    // see `damage_refusals.rs`).
    std::fs::remove_file(dir.path().join(inbox_engine::log::sizes::FILE_NAME)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let io = Arc::new(FaultyIo::new());
    io.set_no_space(true);
    let log = Log::open_with_io(opts(dir.path()), io.clone()).unwrap();
    assert_eq!(log.durable_lsn(), 1);
    assert!(matches!(log.submit(batch(1, 1)), Err(LogError::NoSpace(_))));
    io.set_no_space(false);
    assert_eq!(log.append(batch(1, 1)).unwrap().lsn, 2);
}

/// Runs appenders against a crash-modelling backend, takes crash images
/// while they run, and checks each recovers every append acknowledged
/// before its image was taken.
fn crash_images(torn: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (log, io) = open_faulty(dir.path());
    let log = Arc::new(log);
    // LSN -> (tag, records) of every acknowledged append.
    let acked: Arc<Mutex<BTreeMap<u64, (u64, usize)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (log, acked, stop) = (Arc::clone(&log), Arc::clone(&acked), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let tag = t * 100_000 + i;
                    let records = 1 + (i % 3) as usize;
                    let a = log.append(batch(tag, records)).unwrap();
                    acked.lock().insert(a.lsn, (tag, records));
                    i += 1;
                }
            })
        })
        .collect();
    let images = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    for k in 0..6u64 {
        std::thread::sleep(Duration::from_millis(40));
        let before = acked.lock().clone();
        let img = images.path().join(k.to_string());
        std::fs::create_dir(&img).unwrap();
        io.crash_image(&img, torn.then_some(k * 7919 + 1)).unwrap();
        checked.push((img, before));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let mut total = 0;
    for (img, before) in checked {
        let log = Log::open(opts(&img)).unwrap_or_else(|e| panic!("{}: {e}", img.display()));
        let mut got: BTreeMap<u64, Vec<(u8, Vec<u8>)>> = BTreeMap::new();
        for (lsn, _, kind, p) in replay_all(&log) {
            got.entry(lsn).or_default().push((kind, p));
        }
        let lsns: Vec<u64> = got.keys().copied().collect();
        assert_eq!(
            lsns,
            (1..=lsns.len() as u64).collect::<Vec<_>>(),
            "a prefix of the log"
        );
        for (lsn, &(tag, records)) in &before {
            let recs = got
                .get(lsn)
                .unwrap_or_else(|| panic!("acked LSN {lsn} lost"));
            let want: Vec<(u8, Vec<u8>)> = (0..records)
                .map(|i| ((i % 5) as u8 + 1, payload(tag, i)))
                .collect();
            assert_eq!(recs, &want, "every record of the batch at LSN {lsn}");
        }
        total += before.len();
    }
    assert!(total > 0, "appenders made progress");
}

#[test]
fn a_crash_image_keeps_only_synced_bytes_and_every_acknowledged_append() {
    crash_images(false);
}

#[test]
fn a_crash_image_with_torn_unsynced_writes_recovers_every_acknowledged_append() {
    crash_images(true);
}

#[test]
fn interval_policy_acknowledges_before_the_sync() {
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let mut o = opts(dir.path());
    // An interval no test outlives: any sync during the appends would be
    // one an acknowledgement waited for.
    o.sync = inbox_engine::log::SyncPolicy::Interval(Duration::from_secs(3600));
    let log = Log::open_with_io(o, io.clone()).unwrap();
    log.append(batch(0, 1)).unwrap(); // creates the segment (synced)
    wait_for_spare(&log); // the next segment is prepared (synced) too
    let before = io.syncs();
    for tag in 1..50 {
        log.append(batch(tag, 1)).unwrap();
    }
    assert_eq!(io.syncs(), before, "acks did not wait for a sync");
}

#[test]
fn interval_policy_makes_every_acknowledged_append_durable_within_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let mut o = opts(dir.path());
    o.sync = inbox_engine::log::SyncPolicy::Interval(Duration::from_millis(20));
    let log = Log::open_with_io(o, io.clone()).unwrap();
    for tag in 0..50 {
        log.append(batch(tag, 1)).unwrap();
    }
    // The timer runs when the machine lets it: wait for the condition
    // (every ack in a crash image) and fail only at a deadline far beyond
    // any scheduling delay.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let img = tempfile::tempdir().unwrap();
        io.crash_image(img.path(), None).unwrap();
        let durable = Log::open(opts(img.path())).unwrap().durable_lsn();
        if durable == 50 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the interval timer never made the 50 acknowledged appends durable (at LSN {durable})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A poisoned log's owner decided its last steps on writes that may not
/// have reached the disk (compaction relocated events with a record whose
/// fsync failed, then judged the old segment empty): the segment those
/// events still point at in the durable log must stay on disk.
#[test]
fn a_poisoned_log_refuses_to_delete_a_segment_and_keeps_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (log, io) = open_faulty(dir.path());
    let mut tag = 0;
    while log.segments().len() < 3 {
        log.append(batch(tag, 4)).unwrap();
        tag += 1;
    }
    let sealed = log.segments()[0].clone();
    assert!(sealed.sealed);
    io.fail_nth_sync(1);
    assert!(matches!(
        log.append(batch(tag, 1)),
        Err(LogError::Poisoned(_))
    ));
    let files_before = segment_names(dir.path());
    assert!(matches!(
        log.delete_segment(sealed.id),
        Err(LogError::Poisoned(_))
    ));
    // Every file is still there. The next segment, prepared ahead of need
    // by a thread of its own, may have appeared since the first listing.
    let files_after = segment_names(dir.path());
    for name in &files_before {
        assert!(
            files_after.contains(name),
            "{name} is gone: {files_before:?} before, {files_after:?} after"
        );
    }
    drop(log);
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(log.segments()[0].id, sealed.id);
}

fn segment_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".seg"))
        .collect();
    names.sort();
    names
}
