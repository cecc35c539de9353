//! Segment log: appends, reads, replay, rollover, deletion, both IO
//! backends, concurrency.

mod log_common;

use std::sync::Arc;
use std::time::Duration;

use inbox_engine::log::{
    verify, Batch, IoBackend, Log, LogError, LogOptions, RecordLoc, SyncPolicy,
};
use log_common::*;

fn append_and_check_everything(io: IoBackend) {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(dir.path());
    o.io = io;
    let mut acked = Vec::new();
    {
        let log = Log::open(o.clone()).unwrap();
        for tag in 0..400u64 {
            let a = log.append(batch(tag, 1 + tag as usize % 4)).unwrap();
            assert_eq!(a.lsn, tag + 1, "LSNs are contiguous from 1");
            acked.push((a.lsn, a.locs));
        }
        assert_eq!(log.durable_lsn(), 400);
        let segs = log.segments();
        assert!(segs.len() >= 3, "64 KiB segments must roll: {segs:?}");
        assert!(segs[..segs.len() - 1].iter().all(|s| s.sealed));
        assert!(!segs.last().unwrap().sealed);
        for w in segs.windows(2) {
            assert_eq!(w[1].first_lsn, w[0].last_lsn + 1);
        }
        check_contents(&log, &acked);
    }
    let log = Log::open(o).unwrap();
    assert_eq!(log.durable_lsn(), 400);
    check_contents(&log, &acked);
    let a = log.append(batch(400, 2)).unwrap();
    assert_eq!(a.lsn, 401, "LSNs continue after reopen");
}

fn check_contents(log: &Log, acked: &[(u64, Vec<RecordLoc>)]) {
    let replayed = replay_all(log);
    let mut it = replayed.iter();
    for (lsn, locs) in acked {
        let tag = lsn - 1;
        for (i, loc) in locs.iter().enumerate() {
            let want = payload(tag, i);
            let r = log.read(*loc).unwrap();
            assert_eq!(r.payload, want);
            assert_eq!(r.kind, (i % 5) as u8 + 1);
            let (rl, rloc, rkind, rp) = it.next().expect("replay has every record");
            assert_eq!((*rl, rloc, *rkind, rp), (*lsn, loc, r.kind, &want));
        }
    }
    assert!(it.next().is_none(), "replay has nothing extra");
}

#[test]
fn appends_read_back_and_replay_in_order_across_segments_with_pwrite() {
    append_and_check_everything(IoBackend::Pwrite);
}

#[test]
fn appends_read_back_and_replay_in_order_across_segments_with_io_uring() {
    append_and_check_everything(IoBackend::IoUring);
}

#[test]
fn replay_after_an_lsn_skips_the_older_batches() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(opts(dir.path())).unwrap();
    for tag in 0..50 {
        log.append(batch(tag, 2)).unwrap();
    }
    let mut lsns = Vec::new();
    log.replay(30, &mut |lsn, _, _, _| {
        lsns.push(lsn);
        Ok(())
    })
    .unwrap();
    lsns.dedup();
    assert_eq!(lsns, (31..=50).collect::<Vec<_>>());
}

fn concurrent_appenders(io: IoBackend) {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(dir.path());
    o.io = io;
    let log = Arc::new(Log::open(o.clone()).unwrap());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                (0..60u64)
                    .map(|i| {
                        let tag = t * 1000 + i;
                        let a = log.append(batch(tag, 1)).unwrap();
                        (a.lsn, tag, a.locs[0])
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut acked: Vec<_> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    acked.sort();
    let lsns: Vec<u64> = acked.iter().map(|a| a.0).collect();
    assert_eq!(
        lsns,
        (1..=480).collect::<Vec<_>>(),
        "every LSN once, no gaps"
    );
    let stats = log.stats();
    assert!(stats.commits <= 480);
    drop(log);
    let log = Log::open(o).unwrap();
    for (lsn, tag, loc) in &acked {
        assert_eq!(
            log.read(*loc).unwrap().payload,
            payload(*tag, 0),
            "lsn {lsn}"
        );
    }
    assert_eq!(replayed_lsns(&log), lsns);
}

#[test]
fn concurrent_appenders_are_all_acknowledged_and_all_present_with_pwrite() {
    concurrent_appenders(IoBackend::Pwrite);
}

#[test]
fn concurrent_appenders_are_all_acknowledged_and_all_present_with_io_uring() {
    concurrent_appenders(IoBackend::IoUring);
}

#[test]
fn submitted_tickets_complete_in_lsn_order_when_waited_out_of_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(opts(dir.path())).unwrap();
    let tickets: Vec<_> = (0..20).map(|t| log.submit(batch(t, 1)).unwrap()).collect();
    let lsns: Vec<_> = tickets.iter().map(|t| t.lsn).collect();
    assert_eq!(lsns, (1..=20).collect::<Vec<_>>());
    for t in tickets.into_iter().rev() {
        let lsn = t.lsn;
        assert_eq!(t.wait().unwrap().lsn, lsn);
    }
    assert_eq!(log.durable_lsn(), 20);
}

#[test]
fn a_location_that_is_not_a_record_start_is_a_bad_location() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(opts(dir.path())).unwrap();
    let a = log.append(batch(1, 3)).unwrap();
    let loc = a.locs[1];
    for bad in [
        RecordLoc {
            segment: loc.segment,
            offset: loc.offset + 1,
        },
        RecordLoc {
            segment: loc.segment,
            offset: loc.offset + 20,
        },
        RecordLoc {
            segment: loc.segment,
            offset: 0,
        },
        RecordLoc {
            segment: loc.segment,
            offset: 40_000,
        },
        RecordLoc {
            segment: loc.segment + 7,
            offset: loc.offset,
        },
    ] {
        assert!(
            matches!(log.read(bad), Err(LogError::BadLocation { .. })),
            "{bad:?}"
        );
    }
    assert_eq!(log.read(loc).unwrap().payload, payload(1, 1));
}

#[test]
fn reading_many_locations_answers_as_reading_each_across_segments_and_stops_at_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(opts(dir.path())).unwrap();
    let mut locs = Vec::new();
    for tag in 0..300u64 {
        locs.extend(log.append(batch(tag, 4)).unwrap().locs);
    }
    assert!(log.segments().len() >= 3, "the locations span segments");
    // Out of order, with a segment revisited: runs of one segment are
    // looked up once, but every location is read.
    let mut order: Vec<RecordLoc> = locs.iter().rev().step_by(3).copied().collect();
    order.extend(locs.iter().step_by(7).copied());
    let mut each = Vec::new();
    log.read_each(order.iter().copied(), |kind, payload| {
        each.push((kind, payload.to_vec()))
    })
    .unwrap();
    let one_by_one: Vec<_> = order
        .iter()
        .map(|l| {
            let r = log.read(*l).unwrap();
            (r.kind, r.payload)
        })
        .collect();
    assert_eq!(each, one_by_one);
    // A bad location anywhere fails the whole read, as reading it alone does.
    let mut with_bad = order[..10].to_vec();
    with_bad.insert(
        5,
        RecordLoc {
            segment: with_bad[4].segment,
            offset: with_bad[4].offset + 1,
        },
    );
    let mut read = 0;
    assert!(matches!(
        log.read_each(with_bad, |_, _| read += 1),
        Err(LogError::BadLocation { .. })
    ));
    assert_eq!(read, 5, "the records before the bad location were read");
}

#[test]
fn a_batch_larger_than_a_segment_is_too_large_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(opts(dir.path())).unwrap();
    log.append(batch(0, 1)).unwrap();
    let mut big = Batch::new();
    big.push(1, &vec![7u8; SMALL_SEGMENT as usize]);
    assert!(matches!(log.submit(big), Err(LogError::TooLarge(_))));
    assert_eq!(log.append(batch(1, 1)).unwrap().lsn, 2);
    assert!(log.poisoned().is_none());
}

#[test]
fn deleted_segment_reads_as_bad_location_and_the_log_reopens_with_lsns_continuing() {
    let dir = tempfile::tempdir().unwrap();
    let mut locs = Vec::new();
    {
        let log = Log::open(opts(dir.path())).unwrap();
        for tag in 0..300 {
            locs.push(log.append(batch(tag, 4)).unwrap().locs[0]);
        }
        let segs = log.segments();
        assert!(segs.len() >= 3);
        let active = segs.last().unwrap().id;
        assert!(matches!(
            log.delete_segment(active),
            Err(LogError::InvalidArgument(_))
        ));
        // Drop the oldest two whole, as compaction would.
        for s in &segs[..2] {
            log.delete_segment(s.id).unwrap();
        }
        let first_deleted = locs[0];
        assert!(matches!(
            log.read(first_deleted),
            Err(LogError::BadLocation { .. })
        ));
        assert_eq!(log.segments().len(), segs.len() - 2);
    }
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(log.durable_lsn(), 300);
    let lsns = replayed_lsns(&log);
    assert_eq!(*lsns.last().unwrap(), 300);
    assert!(lsns.windows(2).all(|w| w[1] == w[0] + 1));
    assert_eq!(log.read(locs[299]).unwrap().payload, payload(299, 0));
    assert_eq!(log.append(batch(300, 1)).unwrap().lsn, 301);
}

#[test]
fn deleting_a_middle_segment_still_recovers() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(opts(dir.path())).unwrap();
        for tag in 0..400 {
            log.append(batch(tag, 4)).unwrap();
        }
        let segs = log.segments();
        assert!(segs.len() >= 4);
        log.delete_segment(segs[1].id).unwrap();
    }
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(log.durable_lsn(), 400);
    assert_eq!(log.append(batch(400, 1)).unwrap().lsn, 401);
}

#[test]
fn reads_of_a_deleted_segment_held_by_a_reader_stay_valid() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(opts(dir.path())).unwrap());
    let mut locs = Vec::new();
    for tag in 0..300 {
        locs.push((tag, log.append(batch(tag, 4)).unwrap().locs[0]));
    }
    let first = log.segments()[0].id;
    let reader = {
        let log = Arc::clone(&log);
        let locs = locs.clone();
        std::thread::spawn(move || {
            let mut ok = 0;
            for _ in 0..50 {
                for (tag, loc) in &locs {
                    match log.read(*loc) {
                        Ok(r) => {
                            assert_eq!(r.payload, payload(*tag, 0));
                            ok += 1;
                        }
                        Err(LogError::BadLocation { segment, .. }) => assert_eq!(segment, first),
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            ok
        })
    };
    log.delete_segment(first).unwrap();
    assert!(reader.join().unwrap() > 0);
}

#[test]
fn interval_and_none_policies_acknowledge_and_persist_after_flush() {
    for sync in [
        SyncPolicy::Interval(Duration::from_millis(5)),
        SyncPolicy::None,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(dir.path());
        o.sync = sync;
        {
            let log = Log::open(o.clone()).unwrap();
            for tag in 0..200 {
                log.append(batch(tag, 1)).unwrap();
            }
            log.flush().unwrap();
        }
        let log = Log::open(o).unwrap();
        assert_eq!(log.durable_lsn(), 200, "{sync:?}");
    }
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _log = Log::open(opts(dir.path())).unwrap();
    let e = Log::open(opts(dir.path())).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
}

#[test]
fn segment_size_out_of_range_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = LogOptions::new(dir.path());
    o.segment_bytes = 100;
    assert!(matches!(Log::open(o), Err(LogError::InvalidArgument(_))));
}

#[test]
fn verify_counts_every_batch_and_record() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = Log::open(opts(dir.path())).unwrap();
        for tag in 0..250 {
            log.append(batch(tag, 2)).unwrap();
        }
    }
    let mut seen = Vec::new();
    let r = inbox_engine::log::verify_with_progress(dir.path(), &mut |s| seen.push(s.id)).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
    assert_eq!(r.batches, 250);
    assert_eq!(r.records, 500);
    assert_eq!((r.first_lsn, r.last_lsn), (Some(1), Some(250)));
    assert_eq!(seen, r.segments.iter().map(|s| s.id).collect::<Vec<_>>());
    assert!(seen.len() >= 2);
    assert_eq!(verify(dir.path()).unwrap(), r);
}

#[test]
fn a_deferred_batch_is_written_by_the_caller_that_commits_it_inline_and_the_durable_hook_runs_there(
) {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(opts(dir.path())).unwrap();
    let hook_threads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&hook_threads);
    log.set_durable_hook(Some(Box::new(move || {
        seen.lock().unwrap().push(std::thread::current().id());
    })));
    // The writer thread has started and gone idle.
    log.append(batch(0, 1)).unwrap();
    std::thread::sleep(Duration::from_millis(20));

    // A deferred submit does not wake the writer thread.
    let first = log.submit_deferred(batch(1, 2)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !first.is_durable(),
        "a deferred batch was written without a commit"
    );
    assert!(log.commit_inline(), "the idle writer thread was in a pass");
    assert!(
        first.is_durable(),
        "not durable once its inline commit returned"
    );
    assert!(
        hook_threads
            .lock()
            .unwrap()
            .contains(&std::thread::current().id()),
        "the durable hook did not run on the committing thread"
    );

    // Many, rolling segments on the way: each is durable when the commit
    // returns (unless the thread was in a pass, which nothing here starts).
    let mut inline = 0;
    let mut last = first.lsn;
    for tag in 2..300u64 {
        let ticket = log.submit_deferred(batch(tag, 4)).unwrap();
        if log.commit_inline() && ticket.is_durable() {
            inline += 1;
        }
        ticket.wait_durable().unwrap();
        last = ticket.lsn;
    }
    assert_eq!(inline, 298, "batches the caller did not commit itself");
    assert!(!log.commit_inline(), "nothing was left to write");
    assert!(log.segments().len() >= 2, "64 KiB segments must roll");
    log.set_durable_hook(None);
    drop(log);
    let log = Log::open(opts(dir.path())).unwrap();
    assert_eq!(
        log.durable_lsn(),
        last,
        "every batch is there after a reopen"
    );
}
