//! Storage faults seen through the inbox: an fsync failure stops every
//! mutation (fail-stop, R21) while durable reads go on; a full disk fails
//! the send with `NoSpace`, changes nothing, and writes resume once space
//! is back.

mod inbox_common;

use std::sync::Arc;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::inbox::ManualClock;
use inbox_engine::log::{FaultyIo, SyncPolicy};
use inbox_engine::*;

fn open(dir: &std::path::Path, io: &Arc<FaultyIo>) -> Inbox {
    let clock = Arc::new(ManualClock::new(T0));
    let mut c = config(dir, &clock);
    c.sync = SyncPolicy::Always;
    c.segment_bytes = 256 << 10;
    Inbox::open_with_io(c, io.clone()).unwrap()
}

fn send(ib: &Inbox, conv: ConvId, sender: Uid, cmid: u128, payload: Bytes) -> Result<SendReply> {
    ib.send(SendRequest {
        conv,
        sender,
        client_msg_id: cmid,
        msg_type: 1,
        payload,
    })
    .wait()
}

/// Bytes that zstd cannot shrink, so each message really takes its size.
fn noise(n: usize, seed: u64) -> Bytes {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<_>>()
        .into()
}

#[test]
fn fsync_failure_stops_every_mutation_while_durable_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let ib = open(dir.path(), &io);
    ib.join(Uid(1), ConvId(10)).wait().unwrap();
    ib.join(Uid(2), ConvId(10)).wait().unwrap();
    ib.join(Uid(3), ConvId(20)).wait().unwrap();
    let kept = send(&ib, ConvId(10), Uid(1), 1, Bytes::from_static(b"durable")).unwrap();
    io.fail_nth_sync(1);
    let lost = send(
        &ib,
        ConvId(10),
        Uid(1),
        2,
        Bytes::from_static(b"never acknowledged"),
    );
    assert!(matches!(lost, Err(Error::Log(_))), "{lost:?}");
    // Fail-stop: nothing is accepted any more, not even after the fault.
    assert!(send(&ib, ConvId(10), Uid(1), 3, Bytes::from_static(b"x")).is_err());
    assert!(ib.join(Uid(4), ConvId(10)).wait().is_err());
    assert!(ib.register_device(Uid(1), DeviceId(1)).wait().is_err());
    // Durable state is still served.
    let pulled = &ib.pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 50).unwrap()[0];
    assert_eq!(pulled.max_seq, kept.msg_seq);
    assert_eq!(
        pulled.messages.last().unwrap().payload,
        Bytes::from_static(b"durable")
    );
    assert_eq!(ib.conv_list(Uid(3), 10, None).unwrap().convs.len(), 1);
    let _ = ib.shutdown();
    drop(ib);
    // After a restart everything acknowledged is there. The failed send
    // was written before its fsync failed, so it may have reached the
    // disk: whole (its body readable) or not at all, and its retry under
    // the same key settles which (R4: stored once).
    let ib = Inbox::open(config(dir.path(), &Arc::new(ManualClock::new(T0)))).unwrap();
    let pulled = &ib.pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 50).unwrap()[0];
    assert!(pulled.messages.iter().any(|m| m.msg_id == kept.msg_id));
    let landed: Vec<&Message> = pulled
        .messages
        .iter()
        .filter(|m| m.msg_seq > kept.msg_seq)
        .collect();
    assert!(landed.len() <= 1, "{landed:?}");
    assert!(landed
        .iter()
        .all(|m| m.payload == Bytes::from_static(b"never acknowledged")));
    let retry = send(
        &ib,
        ConvId(10),
        Uid(1),
        2,
        Bytes::from_static(b"never acknowledged"),
    )
    .unwrap();
    assert_eq!(retry.duplicate, !landed.is_empty());
    assert_eq!(retry.msg_seq, kept.msg_seq.next());
    let next = send(
        &ib,
        ConvId(10),
        Uid(1),
        4,
        Bytes::from_static(b"after restart"),
    )
    .unwrap();
    assert_eq!(next.msg_seq, retry.msg_seq.next());
}

#[test]
fn full_disk_fails_the_send_with_no_space_changes_nothing_and_writes_resume_when_freed() {
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let ib = open(dir.path(), &io);
    ib.join(Uid(1), ConvId(10)).wait().unwrap();
    ib.join(Uid(2), ConvId(10)).wait().unwrap();
    let first = send(&ib, ConvId(10), Uid(1), 1, noise(1000, 1)).unwrap();
    io.set_no_space(true);
    // Keep sending 60 KB messages until a new segment is needed.
    let mut cmid = 100;
    let (digest, err) = loop {
        cmid += 1;
        let digest = ib.state_digest();
        match send(&ib, ConvId(10), Uid(1), cmid, noise(60_000, cmid as u64)) {
            Ok(_) => assert!(cmid < 120, "never ran out of space"),
            Err(e) => break (digest, e),
        }
    };
    assert!(matches!(err, Error::NoSpace(_)), "{err:?}");
    assert_eq!(ib.state_digest(), digest, "the failed send left no trace");
    let head = ib.pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 500).unwrap()[0].max_seq;
    // Reads go on while the disk is full.
    assert!(ib.pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 500).unwrap()[0]
        .messages
        .iter()
        .any(|m| m.msg_id == first.msg_id));
    io.set_no_space(false);
    let resumed = send(&ib, ConvId(10), Uid(1), cmid, noise(60_000, cmid as u64)).unwrap();
    assert!(!resumed.duplicate);
    assert_eq!(
        resumed.msg_seq,
        head.next(),
        "no seq was burnt by the failed send"
    );
    let _ = ib.shutdown();
    drop(ib);
    let ib = Inbox::open(config(dir.path(), &Arc::new(ManualClock::new(T0)))).unwrap();
    assert_eq!(
        ib.pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 500).unwrap()[0].max_seq,
        resumed.msg_seq
    );
}

#[test]
fn a_checkpoint_on_a_full_disk_fails_cleanly_and_the_next_one_succeeds() {
    // Checkpoints are written through the same IO layer as the logs, so an
    // injected ENOSPC reaches them too.
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let ib = open(dir.path(), &io);
    ib.join(Uid(1), ConvId(10)).wait().unwrap();
    send(&ib, ConvId(10), Uid(1), 1, Bytes::from_static(b"before")).unwrap();
    io.set_no_space(true);
    let full = ib.checkpoint();
    assert!(full.is_err(), "{full:?}");
    io.set_no_space(false);
    ib.checkpoint().unwrap();
    let digest = ib.state_digest();
    ib.shutdown().unwrap();
    drop(ib);
    let ib = open(dir.path(), &Arc::new(FaultyIo::new()));
    assert_eq!(ib.state_digest(), digest);
    assert_eq!(
        ib.recovery_report().records_replayed,
        0,
        "the checkpoint covers the log"
    );
}

#[test]
fn shutting_down_answers_later_calls_with_shutting_down() {
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let ib = open(dir.path(), &io);
    ib.join(Uid(1), ConvId(10)).wait().unwrap();
    ib.shutdown().unwrap();
    let late = ib.join(Uid(2), ConvId(10)).wait();
    assert!(matches!(late, Err(Error::ShuttingDown)), "{late:?}");
}

#[test]
fn a_power_cut_image_of_the_data_dir_keeps_its_checkpoint_and_every_acknowledged_send() {
    // The checkpoint goes through the same IO layer as the logs, so the
    // power-cut model has it: the image recovers from it, not by a replay
    // of the whole log.
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let ib = open(dir.path(), &io);
    ib.join(Uid(1), ConvId(10)).wait().unwrap();
    ib.join(Uid(2), ConvId(10)).wait().unwrap();
    let mut acked = Vec::new();
    for i in 0..20u128 {
        acked.push(
            send(
                &ib,
                ConvId(10),
                Uid(1),
                i + 1,
                Bytes::from(format!("before {i}")),
            )
            .unwrap(),
        );
    }
    ib.checkpoint().unwrap();
    for i in 20..30u128 {
        acked.push(
            send(
                &ib,
                ConvId(10),
                Uid(1),
                i + 1,
                Bytes::from(format!("after {i}")),
            )
            .unwrap(),
        );
    }
    let img = tempfile::tempdir().unwrap();
    io.crash_image_tree(dir.path(), img.path(), None).unwrap();
    drop(ib);

    let ib = open(img.path(), &Arc::new(FaultyIo::new()));
    assert!(
        ib.recovery_report().checkpoint_lsn > 0,
        "the checkpoint survived the power cut"
    );
    let page = ib.history(Uid(2), ConvId(10), None, 100).unwrap();
    let kept: Vec<MsgId> = page
        .messages
        .iter()
        .filter(|m| m.kind == MessageKind::Normal)
        .map(|m| m.msg_id)
        .collect();
    let mut want: Vec<MsgId> = acked.iter().map(|r| r.msg_id).collect();
    want.reverse();
    assert_eq!(kept, want, "every acknowledged send, newest first");
}

#[test]
fn a_full_disk_refuses_sends_before_applying_them_and_never_reloads_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let ib = open(dir.path(), &io);
    ib.join(Uid(1), ConvId(10)).wait().unwrap();
    ib.join(Uid(2), ConvId(10)).wait().unwrap();
    io.set_no_space(true);
    // 60 KB messages until the active segment has no room for the next.
    let mut cmid = 100;
    loop {
        cmid += 1;
        match send(&ib, ConvId(10), Uid(1), cmid, noise(60_000, cmid as u64)) {
            Ok(_) => assert!(cmid < 120, "never ran out of space"),
            Err(Error::NoSpace(_)) => break,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    let head = ib.pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 500).unwrap()[0].max_seq;
    let digest = ib.state_digest();
    // Many more writes of every size, each refused with nothing changed.
    for i in 0..50u128 {
        let size = [10, 1_000, 60_000][i as usize % 3];
        let refused = send(&ib, ConvId(10), Uid(1), 1_000 + i, noise(size, i as u64));
        assert!(matches!(refused, Err(Error::NoSpace(_))), "{refused:?}");
        let joined = ib.join(Uid(3 + i as u64), ConvId(10)).wait();
        assert!(matches!(joined, Err(Error::NoSpace(_))), "{joined:?}");
    }
    assert_eq!(ib.state_digest(), digest, "a refused write left a trace");
    let stats = ib.stats();
    assert!(
        stats.rounds_refused_for_space >= 100,
        "{} rounds refused for space",
        stats.rounds_refused_for_space
    );
    assert_eq!(
        stats.state_reloads_for_space, 0,
        "a refusal reloaded the state from disk"
    );
    // A join that changes nothing needs no room and is answered.
    ib.join(Uid(2), ConvId(10)).wait().unwrap();

    io.set_no_space(false);
    let resumed = send(&ib, ConvId(10), Uid(1), 1_000, noise(10, 0)).unwrap();
    assert!(!resumed.duplicate, "the refused send was never made");
    assert_eq!(
        resumed.msg_seq,
        head.next(),
        "no seq was burnt by a refusal"
    );
    assert_eq!(ib.stats().state_reloads_for_space, 0);
}
