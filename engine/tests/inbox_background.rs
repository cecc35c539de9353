//! Work taken off the foreground: checkpoint files are written by the
//! checkpoint-writer thread (the sequencer only drains and encodes), and
//! snapshot content is built by the snapshot-builder thread (not by the
//! caller waiting for the reply).
//!
//! The writer is held still with the test-only checkpoint hook, so every
//! assertion is about order and completion, never about timing.

mod inbox_common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use inbox_common::*;
use inbox_engine::*;

/// Checkpoint files in `data`, newest first, as (LSN, path).
fn checkpoints(data: &Path) -> Vec<(u64, PathBuf)> {
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(data.join("checkpoint"))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().path())
                .filter_map(|p| {
                    let name = p.file_name()?.to_str()?;
                    let lsn = name.strip_prefix("ckpt-")?.strip_suffix(".bin")?;
                    Some((lsn.parse().ok()?, p))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|(lsn, _)| std::cmp::Reverse(*lsn));
    out
}

/// The writer held at its first checkpoint after this is set up (by the
/// hook): `entered` gets that checkpoint's LSN, and the writer waits until
/// `release` is used or dropped. Later checkpoints pass straight through;
/// `started` counts every checkpoint the writer began, the held one
/// included.
struct Held {
    entered: mpsc::Receiver<u64>,
    release: mpsc::Sender<()>,
    started: Arc<AtomicU64>,
}

fn hold_first_checkpoint(ib: &Inbox) -> Held {
    // The writer is idle once a checkpoint command is answered (one FIFO
    // writer), so no earlier periodic checkpoint reaches the hook.
    ib.checkpoint().unwrap();
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let started = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&started);
    let entered_tx = Mutex::new(Some(entered_tx));
    let release_rx = Mutex::new(release_rx);
    ib.set_checkpoint_hook(Some(Arc::new(move |lsn| {
        count.fetch_add(1, Ordering::SeqCst);
        if let Some(tx) = entered_tx.lock().unwrap().take() {
            tx.send(lsn).unwrap();
            // Released by a message, or by the test dropping the sender.
            let _ = release_rx.lock().unwrap().recv();
        }
    })));
    Held {
        entered,
        release,
        started,
    }
}

#[test]
fn checkpoint_command_replies_after_its_file_is_durable() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(1));
    h.join(Uid(2), ConvId(1));
    h.send_many(ConvId(1), Uid(1), 0, 50);
    let digest = h.ib().state_digest();
    h.ib().checkpoint().unwrap();
    let newest = checkpoints(h.dir.path());
    let (lsn, _) = newest
        .first()
        .expect("the reply comes with the file in place");
    // Whatever is on disk at the reply, the engine still running: a copy of
    // it recovers from that checkpoint, replays nothing and has the state.
    let copy = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), copy.path());
    let mut c = config(copy.path(), &h.clock);
    c.checkpoint_every_bytes = u64::MAX;
    let reopened = Inbox::open(c).unwrap();
    let report = reopened.recovery_report();
    assert_eq!(report.checkpoint_lsn, *lsn);
    assert_eq!(
        report.records_replayed, 0,
        "the checkpoint covers every send"
    );
    assert_eq!(reopened.state_digest(), digest);
}

#[test]
fn sends_are_served_while_a_checkpoint_file_is_written() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(1));
    h.join(Uid(2), ConvId(1));
    let generation = h.register(Uid(2), DeviceId(1)).device.generation;
    let ib = h.ib();
    let held = hold_first_checkpoint(ib);
    // Past the setup checkpoint, so the held one has a new LSN.
    h.send_many(ConvId(1), Uid(1), 0, 20);
    std::thread::scope(|s| {
        // Owned here, so a failed assertion drops `release` and frees the
        // writer before the scope joins the checkpoint thread.
        let held = held;
        let checkpoint = s.spawn(|| ib.checkpoint());
        let held_lsn = held.entered.recv().unwrap();
        // The writer is stopped inside this checkpoint: sends, syncs and
        // reads still complete.
        let sent: Vec<SendReply> = (0..30u128)
            .map(|i| h.send(ConvId(1), Uid(1), 100 + i, "meanwhile"))
            .collect();
        assert_eq!(
            sent.last().unwrap().msg_seq,
            MsgSeq(2 + 50),
            "two joins, 50 sends"
        );
        let page = h
            .sync(Uid(2), DeviceId(1), Some(generation), SyncSeq(0), 500, None)
            .unwrap();
        assert!(page.events.iter().any(|e| e.msg_seq == MsgSeq(52)));
        let history = ib.history(Uid(2), ConvId(1), None, 100).unwrap();
        assert_eq!(history.messages.len(), 51, "from uid 2's join at seq 2");
        assert!(
            !checkpoint.is_finished(),
            "the checkpoint caller waits for its file"
        );
        assert!(
            checkpoints(h.dir.path())
                .iter()
                .all(|(l, _)| *l != held_lsn),
            "the held checkpoint is not on disk yet"
        );
        held.release.send(()).unwrap();
        checkpoint.join().unwrap().unwrap();
        let newest = checkpoints(h.dir.path());
        assert_eq!(newest.first().map(|(l, _)| *l), Some(held_lsn));
    });
}

#[test]
fn shutdown_leaves_a_checkpoint_covering_everything() {
    let mut h = Harness::new();
    h.join(Uid(1), ConvId(1));
    h.join(Uid(2), ConvId(1));
    h.register(Uid(2), DeviceId(1));
    h.send_many(ConvId(1), Uid(1), 0, 40);
    let digest = h.ib().state_digest();
    h.restart(true, |_| {});
    let report = h.ib().recovery_report();
    assert!(report.checkpoint_lsn > 0);
    assert_eq!(
        report.records_replayed, 0,
        "shutdown's checkpoint covers all"
    );
    assert_eq!(h.ib().state_digest(), digest);
}

#[test]
fn periodic_checkpoints_do_not_pile_up_while_one_is_being_written() {
    // Every round crosses the threshold.
    let h = Harness::with(|c| {
        c.checkpoint_every_bytes = 1;
        c.checkpoint_every_state_percent = 0;
    });
    h.join(Uid(1), ConvId(1));
    h.join(Uid(2), ConvId(1));
    let held = hold_first_checkpoint(h.ib());
    // One send, one round: a periodic checkpoint is handed off and held.
    h.send(ConvId(1), Uid(1), 0, "first");
    held.entered.recv().unwrap();
    // Twenty more rounds past the threshold while it is held.
    for i in 1..=20u128 {
        h.send(ConvId(1), Uid(1), i, "more");
    }
    held.release.send(()).unwrap();
    // A checkpoint command queues behind whatever the writer still has:
    // once it is answered, every job handed off before it is written.
    h.ib().checkpoint().unwrap();
    assert_eq!(
        held.started.load(Ordering::SeqCst),
        2,
        "the held periodic checkpoint and the command's; none queued meanwhile"
    );
}

/// Counts the checkpoints the writer starts, from now on.
fn count_checkpoints(ib: &Inbox) -> Arc<AtomicU64> {
    let started = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&started);
    ib.set_checkpoint_hook(Some(Arc::new(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
    })));
    started
}

#[test]
fn a_periodic_checkpoint_waits_for_its_share_of_the_newest_checkpoint_in_log() {
    // Every round would cross the byte threshold alone; the share decides.
    let h = Harness::with(|c| {
        c.checkpoint_every_bytes = 1;
        c.checkpoint_every_state_percent = 100;
    });
    // A state whose checkpoint is larger than a few sends' log.
    for uid in 1..=200u64 {
        h.join(Uid(uid), ConvId(1 + uid % 20));
    }
    h.ib().checkpoint().unwrap();
    let (_, newest) = &checkpoints(h.dir.path())[0];
    let state_bytes = std::fs::metadata(newest).unwrap().len();
    assert!(state_bytes > 8 << 10, "a checkpoint of {state_bytes} bytes");
    let started = count_checkpoints(h.ib());

    // Three short sends: far less log than the checkpoint's size. The
    // command's checkpoint queues behind any periodic one handed off
    // before it, so once it is answered the count is complete.
    for i in 0..3u128 {
        h.send(ConvId(2), Uid(1), i, "short");
    }
    h.ib().checkpoint().unwrap();
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "only the command's checkpoint: no periodic one before the share"
    );

    // More payload than the newest checkpoint's size: at least that much
    // log (letters from a generator, so that compression does not shrink
    // it much).
    let (_, newest) = &checkpoints(h.dir.path())[0];
    let state_bytes = std::fs::metadata(newest).unwrap().len();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..u128::from(state_bytes / 1000 + 1) {
        let payload: String = (0..2000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect();
        h.send(ConvId(2), Uid(1), 100 + i, &payload);
    }
    h.ib().checkpoint().unwrap();
    assert!(
        started.load(Ordering::SeqCst) >= 3,
        "a periodic checkpoint once the share of log was written ({} started)",
        started.load(Ordering::SeqCst)
    );
}

#[test]
fn a_failed_checkpoint_write_is_reported_and_does_not_stop_writes() {
    let mut h = Harness::new();
    h.join(Uid(1), ConvId(1));
    h.join(Uid(2), ConvId(1));
    h.send_many(ConvId(1), Uid(1), 0, 10);
    h.ib().checkpoint().unwrap();
    let good = checkpoints(h.dir.path());
    h.send_many(ConvId(1), Uid(1), 100, 10);
    // A directory where the writer wants its tmp file: creating it fails.
    let ckpt_dir = h.dir.path().join("checkpoint");
    let blocker = ckpt_dir.clone();
    h.ib().set_checkpoint_hook(Some(Arc::new(move |lsn| {
        std::fs::create_dir_all(blocker.join(format!("ckpt-{lsn:020}.bin.tmp"))).unwrap();
    })));
    assert!(h.ib().checkpoint().is_err(), "the write error is reported");
    h.ib().set_checkpoint_hook(None);
    assert_eq!(
        checkpoints(h.dir.path()),
        good,
        "older checkpoints untouched"
    );
    // Not fatal: the logs take writes as before.
    let after = h.send(ConvId(1), Uid(1), 500, "after the failed checkpoint");
    assert_eq!(after.msg_seq, MsgSeq(2 + 21));
    let digest = h.ib().state_digest();
    h.restart(true, |_| {});
    assert_eq!(h.ib().state_digest(), digest);
}

#[test]
fn snapshot_is_built_even_when_the_caller_drops_the_reply() {
    const PHONE: DeviceId = DeviceId(1);
    const DESKTOP: DeviceId = DeviceId(2);
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.register(Uid(2), PHONE);
    h.register(Uid(2), DESKTOP);
    h.send_many(ConvId(10), Uid(1), 0, 30);
    drop(h.ib().begin_snapshot(Uid(2), DESKTOP));
    // The begin step is durable once a later command's reply is out.
    h.send(ConvId(10), Uid(1), 999, "after the begin step");
    let snapshot_id = h
        .ib()
        .explain(Uid(2))
        .unwrap()
        .fences
        .iter()
        .find_map(|f| match f {
            Fence::Snapshot { snapshot_id, .. } => Some(*snapshot_id),
            _ => None,
        })
        .expect("the begin step logged a snapshot row");
    let mut info = h.ib().snapshot_info(Uid(2), snapshot_id).unwrap();
    // Bounded wait for the builder thread; no timing is asserted.
    for _ in 0..3_000 {
        if info.state == SnapshotState::Ready {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        info = h.ib().snapshot_info(Uid(2), snapshot_id).unwrap();
    }
    assert_eq!(info.state, SnapshotState::Ready);
    let mut messages = Vec::new();
    for p in 0..info.pages {
        messages.extend(
            h.ib()
                .snapshot_page(Uid(2), snapshot_id, p)
                .unwrap()
                .messages,
        );
    }
    let seqs: Vec<MsgSeq> = messages.iter().map(|m| m.msg_seq).collect();
    let want: Vec<MsgSeq> = MsgSeq(13).through(MsgSeq(32)).collect();
    assert_eq!(seqs, want, "the last 20 messages as of the begin step");
    let device = h
        .ib()
        .ack_snapshot(Uid(2), DESKTOP, snapshot_id, info.generation)
        .wait()
        .unwrap();
    assert_eq!(device.state, DeviceState::Active);
    assert_eq!(device.acked_sync_seq, info.base_sync_seq);
}

#[test]
fn shutdown_waits_for_queued_checkpoints_and_writes_the_final_one_last() {
    let mut h = Harness::new();
    h.join(Uid(1), ConvId(1));
    h.join(Uid(2), ConvId(1));
    let generation = h.register(Uid(2), DeviceId(1)).device.generation;
    let held = hold_first_checkpoint(h.ib());
    h.send_many(ConvId(1), Uid(1), 0, 10);
    let (final_lsn, digest) = std::thread::scope(|s| {
        let held = held;
        let ib = h.ib();
        let first = s.spawn(|| ib.checkpoint());
        let held_lsn = held.entered.recv().unwrap();
        // Written after the held checkpoint's LSN: only the final one
        // covers these.
        h.send_many(ConvId(1), Uid(1), 100, 10);
        let digest = ib.state_digest();
        let shutdown = s.spawn(|| ib.shutdown());
        // Shutdown has stopped taking commands once a sync (which changes
        // nothing here) is refused.
        while h
            .sync(Uid(2), DeviceId(1), Some(generation), SyncSeq(0), 1, None)
            .is_ok()
        {
            std::thread::yield_now();
        }
        assert!(
            !shutdown.is_finished(),
            "shutdown waits for the held checkpoint and then the final one"
        );
        held.release.send(()).unwrap();
        first.join().unwrap().unwrap();
        shutdown.join().unwrap().unwrap();
        let on_disk: Vec<u64> = checkpoints(h.dir.path()).iter().map(|(l, _)| *l).collect();
        assert_eq!(on_disk.len(), 2);
        assert_eq!(on_disk[1], held_lsn, "the held one, then the final one");
        assert!(on_disk[0] > held_lsn);
        (on_disk[0], digest)
    });
    h.restart(true, |_| {});
    let report = h.ib().recovery_report();
    assert_eq!(report.checkpoint_lsn, final_lsn);
    assert_eq!(
        report.records_replayed, 0,
        "the final checkpoint covers all"
    );
    assert_eq!(h.ib().state_digest(), digest);
}

#[test]
fn shutdown_with_a_snapshot_build_pending_returns_and_the_device_resets_after_restart() {
    const PHONE: DeviceId = DeviceId(1);
    const DESKTOP: DeviceId = DeviceId(2);
    let mut h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.register(Uid(2), PHONE);
    h.register(Uid(2), DESKTOP);
    h.send_many(ConvId(10), Uid(1), 0, 30);
    drop(h.ib().begin_snapshot(Uid(2), DESKTOP));
    // Shutdown finishes the build in hand or abandons it; it returns.
    h.restart(true, |_| {});
    let first = h
        .ib()
        .explain(Uid(2))
        .unwrap()
        .fences
        .iter()
        .find_map(|f| match f {
            Fence::Snapshot { snapshot_id, .. } => Some(*snapshot_id),
            _ => None,
        })
        .expect("the begin step is durable");
    let info = h.ib().snapshot_info(Uid(2), first).unwrap();
    match info.state {
        // Built before shutdown: whole, every page served.
        SnapshotState::Ready => {
            assert!(info.pages > 0);
            for p in 0..info.pages {
                h.ib().snapshot_page(Uid(2), first, p).unwrap();
            }
        }
        // Abandoned: never half-built, it only fences until it expires.
        SnapshotState::Building => assert_eq!(info.pages, 0),
        other => panic!("snapshot {first} is {other:?} after restart"),
    }
    // Either way the device resets with a new snapshot.
    let again = h.ib().begin_snapshot(Uid(2), DESKTOP).wait().unwrap();
    assert_eq!(again.state, SnapshotState::Ready);
    assert!(again.snapshot_id > first);
    let device = h
        .ib()
        .ack_snapshot(Uid(2), DESKTOP, again.snapshot_id, again.generation)
        .wait()
        .unwrap();
    assert_eq!(device.state, DeviceState::Active);
}

#[test]
fn a_tmp_file_left_by_a_crash_is_never_a_checkpoint_and_is_removed_by_the_next_write() {
    let mut h = Harness::new();
    h.join(Uid(1), ConvId(1));
    h.join(Uid(2), ConvId(1));
    h.send_many(ConvId(1), Uid(1), 0, 10);
    let digest = h.ib().state_digest();
    drop(h.inbox.take());
    // A write cut short: a tmp file for a later LSN, half a header.
    let ckpt_dir = h.dir.path().join("checkpoint");
    let tmp = ckpt_dir.join(format!("ckpt-{:020}.bin.tmp", u64::MAX / 2));
    std::fs::write(&tmp, b"INBXCKP1").unwrap();
    let before = checkpoints(h.dir.path());
    h.restart(true, |_| {});
    assert_eq!(
        h.ib().recovery_report().checkpoint_lsn,
        before[0].0,
        "recovery starts from the newest real checkpoint"
    );
    assert_eq!(h.ib().state_digest(), digest);
    assert!(tmp.exists());
    h.send(ConvId(1), Uid(1), 100, "new");
    h.ib().checkpoint().unwrap();
    assert!(!tmp.exists(), "the next write removes the leftover");
}
