//! Restart (R22): with and without a checkpoint the engine rebuilds exactly
//! the same state and gives identical answers; a checkpoint bounds what is
//! replayed; a corrupt checkpoint falls back without loss.

mod inbox_common;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::*;

/// Everything a client can observe for a small population.
fn answers(h: &Harness) -> Vec<String> {
    let ib = h.ib();
    let mut out = Vec::new();
    for uid in 1..=4u64 {
        out.push(format!("{:?}", ib.devices(Uid(uid)).unwrap()));
        out.push(format!("{:?}", ib.conv_list(Uid(uid), 50, None).unwrap()));
        for conv in [10u64, 11] {
            out.push(format!(
                "{:?}",
                ib.pull(Uid(uid), &[(ConvId(conv), MsgSeq(0))], 500)
                    .map_err(|e| e.to_string())
            ));
            out.push(format!(
                "{:?}",
                ib.history(Uid(uid), ConvId(conv), None, 7)
                    .map_err(|e| e.to_string())
            ));
        }
    }
    out
}

fn workload(h: &Harness, round: u64) {
    let base = u128::from(round) * 1000;
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.join(Uid(3), ConvId(10));
    h.join(Uid(1), ConvId(11));
    h.join(Uid(4), ConvId(11));
    h.register(Uid(2), DeviceId(1));
    h.register(Uid(2), DeviceId(2));
    for i in 0..40u128 {
        h.send(
            ConvId(10),
            Uid(1 + (i as u64 % 3)),
            base + i,
            &format!("group {round} {i}"),
        );
        h.send(ConvId(11), Uid(4), base + 500 + i, &"x".repeat(300));
    }
    let victim = h.send(ConvId(10), Uid(2), base + 900, "to recall");
    h.ib()
        .recall(RecallRequest {
            conv: ConvId(10),
            sender: Uid(2),
            client_msg_id: base + 901,
            target: victim.msg_id,
        })
        .wait()
        .unwrap();
    h.ib()
        .mark_read(Uid(3), ConvId(10), MsgSeq(20))
        .wait()
        .unwrap();
    h.ib()
        .set_conv_flags(
            Uid(1),
            ConvId(11),
            ConvFlags {
                muted: true,
                pinned: false,
            },
        )
        .wait()
        .unwrap();
    h.ib().leave(Uid(3), ConvId(10)).wait().unwrap();
}

#[test]
fn restart_with_and_without_a_checkpoint_gives_identical_answers() {
    let mut h = Harness::new();
    workload(&h, 1);
    let gen = h.ib().devices(Uid(2)).unwrap()[0].generation;
    let page = h
        .sync(Uid(2), DeviceId(1), Some(gen), SyncSeq(0), 30, None)
        .unwrap();
    h.ack(Uid(2), DeviceId(1), gen, SyncSeq(20), &page.batch_token)
        .unwrap();
    let before = answers(&h);
    let digest = h.ib().state_digest();

    // Full replay: no checkpoint at all.
    h.restart(false, |_| {});
    assert_eq!(h.ib().recovery_report().checkpoint_lsn, 0);
    assert_eq!(h.ib().state_digest(), digest);
    assert_eq!(answers(&h), before);

    // From the shutdown checkpoint: nothing left to replay.
    h.restart(true, |_| {});
    let report = h.ib().recovery_report();
    assert!(report.checkpoint_lsn > 0);
    assert_eq!(report.records_replayed, 0);
    assert_eq!(h.ib().state_digest(), digest);
    assert_eq!(answers(&h), before);

    // The same batch token still pages and ACKs after a restart, and the
    // page it serves is the same one (pulling is not ACKing).
    let again = h
        .sync(
            Uid(2),
            DeviceId(1),
            Some(gen),
            SyncSeq(20),
            30,
            Some(page.batch_token.clone()),
        )
        .unwrap();
    assert_eq!(again.events.first().map(|e| e.sync_seq), Some(SyncSeq(21)));
    let fresh = h
        .sync(Uid(2), DeviceId(1), Some(gen), SyncSeq(20), 30, None)
        .unwrap();
    assert_eq!(fresh.events, again.events);
    assert_eq!(
        h.ack(Uid(2), DeviceId(1), gen, SyncSeq(10), &page.batch_token)
            .unwrap()
            .acked_sync_seq,
        SyncSeq(20)
    );
}

#[test]
fn a_checkpoint_bounds_replay_to_the_log_written_after_it() {
    let mut h = Harness::new();
    workload(&h, 1);
    h.ib().checkpoint().unwrap();
    // Ten more sends after the checkpoint: ten effect records.
    for i in 0..10u128 {
        h.send(ConvId(11), Uid(1), 50_000 + i, "after the checkpoint");
    }
    let digest = h.ib().state_digest();
    let before = answers(&h);
    // Crash after the checkpoint: whatever shutdown writes is discarded,
    // only the explicit checkpoint stays.
    let ckpt_dir = h.dir.path().join("checkpoint");
    let explicit: Vec<_> = std::fs::read_dir(&ckpt_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(explicit.len(), 1);
    let saved = std::fs::read(&explicit[0]).unwrap();
    drop(h.inbox.take());
    std::fs::remove_dir_all(&ckpt_dir).unwrap();
    std::fs::create_dir_all(&ckpt_dir).unwrap();
    std::fs::write(&explicit[0], &saved).unwrap();
    h.restart(true, |_| {});
    let h2 = h;
    let report = h2.ib().recovery_report();
    assert!(report.checkpoint_lsn > 0);
    assert_eq!(
        report.records_replayed, 10,
        "only the log after the checkpoint is replayed"
    );
    assert_eq!(h2.ib().state_digest(), digest);
    assert_eq!(answers(&h2), before);
}

#[test]
fn a_corrupt_checkpoint_falls_back_to_an_older_one_or_a_full_replay_without_loss() {
    let every_4_kib = |c: &mut InboxConfig| {
        c.checkpoint_every_bytes = 4096;
        c.checkpoint_every_state_percent = 0;
    };
    let mut h = Harness::with(every_4_kib);
    workload(&h, 1);
    workload(&h, 2);
    let digest = h.ib().state_digest();
    let before = answers(&h);
    h.restart(true, every_4_kib);
    let ckpt_dir = h.dir.path().join("checkpoint");
    let mut files: Vec<_> = std::fs::read_dir(&ckpt_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "periodic checkpoints keep the newest two");
    drop(h.inbox.take());
    // Flip one byte in the newest: recovery uses the older one.
    let newest = files.last().unwrap();
    let mut bytes = std::fs::read(newest).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(newest, &bytes).unwrap();
    h.restart(true, |_| {});
    assert_eq!(h.ib().state_digest(), digest);
    assert_eq!(answers(&h), before);
    // Every checkpoint corrupt: a full replay, still no loss.
    drop(h.inbox.take());
    for f in std::fs::read_dir(&ckpt_dir).unwrap() {
        let p = f.unwrap().path();
        std::fs::write(&p, b"garbage").unwrap();
    }
    h.restart(true, |_| {});
    assert_eq!(h.ib().recovery_report().checkpoint_lsn, 0);
    assert_eq!(h.ib().state_digest(), digest);
    assert_eq!(answers(&h), before);
}

#[test]
fn sends_after_a_restart_continue_every_sequence_without_reuse() {
    let mut h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let a = h.send(ConvId(10), Uid(1), 1, "before");
    h.restart(false, |_| {});
    let dup = h.send(ConvId(10), Uid(1), 1, "before");
    assert!(
        dup.duplicate && dup.msg_id == a.msg_id,
        "idempotency survives a restart"
    );
    let b = h.send(ConvId(10), Uid(1), 2, "after");
    assert_eq!(b.msg_seq, a.msg_seq.next());
    assert!(b.msg_id > a.msg_id);
    let body = &h
        .ib()
        .pull(Uid(2), &[(ConvId(10), a.msg_seq.prev())], 10)
        .unwrap()[0]
        .messages;
    assert_eq!(
        body.iter().map(|m| m.payload.clone()).collect::<Vec<_>>(),
        vec![Bytes::from_static(b"before"), Bytes::from_static(b"after")]
    );
}

#[test]
fn a_halted_engine_writes_no_final_checkpoint_and_reopening_replays_its_log() {
    let mut h = Harness::new();
    workload(&h, 1);
    h.ib().checkpoint().unwrap();
    for i in 0..7u128 {
        h.send(ConvId(11), Uid(1), 60_000 + i, "after the checkpoint");
    }
    let digest = h.ib().state_digest();
    let before = answers(&h);
    let ckpt_dir = h.dir.path().join("checkpoint");
    let files = |dir: &std::path::Path| -> Vec<_> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let checkpoints = files(&ckpt_dir);
    let inbox = h.inbox.take().unwrap();
    inbox.halt();
    assert!(
        matches!(
            inbox
                .send(SendRequest {
                    conv: ConvId(11),
                    sender: Uid(1),
                    client_msg_id: 70_000,
                    msg_type: 1,
                    payload: Bytes::from_static(b"after the halt"),
                })
                .wait(),
            Err(Error::ShuttingDown)
        ),
        "a halted engine takes no command"
    );
    drop(inbox);
    assert_eq!(
        files(&ckpt_dir),
        checkpoints,
        "halting (and dropping the halted engine) wrote a checkpoint"
    );
    h.restart(true, |_| {});
    let report = h.ib().recovery_report();
    assert_eq!(
        report.records_replayed, 7,
        "recovery replays the sends after the explicit checkpoint"
    );
    assert_eq!(h.ib().state_digest(), digest);
    assert_eq!(answers(&h), before);
}

#[test]
fn a_data_directory_removed_under_the_engine_is_not_made_again_by_its_final_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let clock = std::sync::Arc::new(inbox_engine::inbox::ManualClock::new(T0));
    let inbox = Inbox::open(config(&data, &clock)).unwrap();
    inbox.join(Uid(1), ConvId(11)).wait().unwrap();
    inbox
        .send(SendRequest {
            conv: ConvId(11),
            sender: Uid(1),
            client_msg_id: 1,
            msg_type: 1,
            payload: Bytes::from_static(b"before the removal"),
        })
        .wait()
        .unwrap();
    // The log's preparer may put the next segment in place while the
    // directory goes: remove again until it is gone.
    let mut tries = 0;
    while let Err(e) = std::fs::remove_dir_all(&data) {
        tries += 1;
        assert!(
            tries < 100 && e.kind() == std::io::ErrorKind::DirectoryNotEmpty,
            "removing the data directory: {e}"
        );
    }
    let shut = inbox.shutdown();
    assert!(
        shut.is_err(),
        "the final checkpoint cannot be written without its data directory"
    );
    drop(inbox);
    assert!(
        !data.exists(),
        "the data directory was made again: {:?}",
        std::fs::read_dir(&data).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
    );
}
