//! `Inbox::send_here`: a send decided and committed on the caller's
//! thread while the sequencer is idle. It is released and on disk when the
//! call returns, it never overtakes a command queued before it, and the
//! sequencer's periodic checkpoints go on although no round runs on its
//! thread.

mod inbox_common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::log::SyncPolicy;
use inbox_engine::*;

fn request(conv: ConvId, sender: Uid, cmid: u128) -> SendRequest {
    SendRequest {
        conv,
        sender,
        client_msg_id: cmid,
        msg_type: 1,
        payload: Bytes::from(format!("message {cmid}")),
    }
}

#[test]
fn a_send_run_here_on_an_idle_engine_is_released_and_on_disk_when_the_call_returns() {
    let mut h = Harness::with(|c| c.sync = SyncPolicy::Always);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    for cmid in 1..=20u128 {
        let pending = h.ib().send_here(request(ConvId(10), Uid(1), cmid));
        assert!(
            pending.is_released(),
            "send {cmid}: the reply of a send run here waits for another thread"
        );
        // A kill now: the image holds what the engine wrote so far.
        let image = tempfile::tempdir().unwrap();
        copy_running_dir(h.dir.path(), image.path());
        let reply = pending.wait().unwrap();
        let reopened = Inbox::open(config(image.path(), &h.clock)).unwrap();
        let page = reopened.history(Uid(2), ConvId(10), None, 1).unwrap();
        assert_eq!(
            page.messages
                .first()
                .map(|m| (m.msg_seq, m.payload.clone())),
            Some((reply.msg_seq, Bytes::from(format!("message {cmid}")))),
            "send {cmid} is not in a copy taken as its call returned"
        );
        drop(reopened);
    }
    h.restart(true, |_| {});
    assert_eq!(sent(&h), 20);
}

/// The messages of conversation 10 these tests sent (the joins add
/// messages of their own).
fn sent(h: &Harness) -> usize {
    h.whole_history(Uid(2), ConvId(10))
        .iter()
        .filter(|m| m.payload.starts_with(b"message "))
        .count()
}

#[test]
fn a_send_run_here_never_overtakes_commands_queued_before_it() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    let mut cmid = 0u128;
    for attempt in 0..20 {
        let queued: Vec<_> = (0..50)
            .map(|_| {
                cmid += 1;
                h.ib().send(request(ConvId(10), Uid(1), cmid))
            })
            .collect();
        cmid += 1;
        let here = h.ib().send_here(request(ConvId(10), Uid(1), cmid));
        let seqs: Vec<u64> = queued
            .into_iter()
            .chain([here])
            .map(|p| p.wait().unwrap().msg_seq.0)
            .collect();
        let first = seqs[0];
        let expected: Vec<u64> = (first..first + seqs.len() as u64).collect();
        assert_eq!(
            seqs, expected,
            "attempt {attempt}: sends took their seqs out of submission order"
        );
    }
}

#[test]
fn periodic_checkpoints_go_on_when_every_send_runs_here() {
    let mut h = Harness::with(|c| {
        c.checkpoint_every_bytes = 16 << 10;
        c.checkpoint_every_state_percent = 0;
    });
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let checkpoints = |h: &Harness| {
        std::fs::read_dir(h.dir.path().join("checkpoint"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".bin"))
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(checkpoints(&h), 0, "a fresh store has no checkpoint");
    let mut ran_here = 0;
    for cmid in 1..=200u128 {
        let reply = h.ib().send_here(request(ConvId(10), Uid(1), cmid));
        // Queued instead while the sequencer's thread has a checkpoint
        // request of an earlier send in hand.
        ran_here += usize::from(reply.is_released());
        reply.wait().unwrap();
    }
    assert!(ran_here >= 150, "only {ran_here} of 200 sends ran here");
    // The sequencer's thread writes the checkpoint the sends made due.
    let deadline = Instant::now() + Duration::from_secs(30);
    while checkpoints(&h) == 0 {
        assert!(
            Instant::now() < deadline,
            "no periodic checkpoint 30 s after 200 sends of about 30 KiB"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    h.kill_restart(|_| {});
    let report = h.ib().recovery_report();
    assert!(
        report.checkpoint_lsn > 0,
        "recovery found no checkpoint: {report:?}"
    );
    assert_eq!(sent(&h), 200);
}

#[test]
fn a_send_run_here_after_shutdown_is_refused() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.ib().shutdown().unwrap();
    let reply = h.ib().send_here(request(ConvId(10), Uid(1), 1)).wait();
    assert!(
        matches!(reply, Err(Error::ShuttingDown)),
        "a send after shutdown: {reply:?}"
    );
}
