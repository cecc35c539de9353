//! Pipelining on one connection, and push hints (R16).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use inbox_tests::{all_history, register, send_text, Daemon};
use inbox_wire::*;

#[tokio::test]
async fn thousand_pipelined_sends_on_one_connection_each_get_their_own_reply() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = Arc::new(daemon.client().await);
    client.join(ConvMember { conv: 7, uid: 1 }).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000u32 {
        let client = Arc::clone(&client);
        tasks.spawn(async move {
            let reply = client
                .send(SendReq {
                    conv: 7,
                    sender: 1,
                    client_msg_id: u128::from(i) + 1,
                    msg_type: 1,
                    payload: Bytes::from(format!("m{i}").into_bytes()),
                })
                .await
                .expect("send");
            (i, reply)
        });
    }
    let replies = tasks.join_all().await;
    assert_eq!(replies.len(), 1000);
    let by_seq: std::collections::HashMap<u64, u64> = all_history(&client, 1, 7)
        .await
        .into_iter()
        .filter(|m| m.kind == MessageKind::Normal)
        .map(|m| {
            let text = String::from_utf8(m.payload.to_vec()).unwrap();
            (m.msg_seq, text[1..].parse().unwrap())
        })
        .collect();
    assert_eq!(by_seq.len(), 1000, "1000 distinct messages");
    for (i, reply) in replies {
        assert!(!reply.duplicate);
        assert_eq!(
            by_seq.get(&reply.msg_seq),
            Some(&u64::from(i)),
            "reply to request {i} names its own message"
        );
    }
}

#[tokio::test]
async fn hint_arrives_after_a_send_to_a_subscribed_user() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let writer = daemon.client().await;
    let watcher = daemon.client().await;
    let mut hints = watcher.hints().expect("hint stream");
    watcher.subscribe(UidList { uids: vec![2] }).await.unwrap();
    writer.join(ConvMember { conv: 5, uid: 1 }).await.unwrap();
    writer.join(ConvMember { conv: 5, uid: 2 }).await.unwrap();
    send_text(&writer, 5, 1, "ping").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let round = tokio::time::timeout_at(deadline, hints.recv())
            .await
            .expect("a hint within 5 s")
            .expect("hint stream open");
        assert!(
            round.hints.iter().all(|h| h.uid == 2),
            "only subscribed uids: {round:?}"
        );
        if round.hints.iter().any(|h| h.committed_sync_seq >= 2) {
            break; // the join and the message are both committed
        }
    }
}

/// Reads `hints` until one carries `uid` at `at_least` or above, and
/// returns every entry seen on the way.
async fn hints_until(
    hints: &mut tokio::sync::mpsc::Receiver<Hints>,
    uid: u64,
    at_least: u64,
    who: &str,
) -> Vec<Hint> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        let round = tokio::time::timeout_at(deadline, hints.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("{who}: no hint for uid {uid} at {at_least} within 10 s; saw {seen:?}")
            })
            .expect("hint stream open");
        let done = round
            .hints
            .iter()
            .any(|h| h.uid == uid && h.committed_sync_seq >= at_least);
        seen.extend(round.hints);
        if done {
            return seen;
        }
    }
}

#[tokio::test]
async fn hints_reach_every_connection_subscribed_to_the_uid_and_none_after_it_unsubscribes() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let writer = daemon.client().await;
    // Two devices of user 2, and a device of user 3.
    let (a, b, c) = (
        daemon.client().await,
        daemon.client().await,
        daemon.client().await,
    );
    let (mut ha, mut hb, mut hc) = (
        a.hints().expect("hints"),
        b.hints().expect("hints"),
        c.hints().expect("hints"),
    );
    a.subscribe(UidList { uids: vec![2] }).await.unwrap();
    b.subscribe(UidList { uids: vec![2] }).await.unwrap();
    c.subscribe(UidList { uids: vec![3] }).await.unwrap();
    for (conv, uid) in [(5, 1), (5, 2), (6, 1), (6, 3)] {
        writer.join(ConvMember { conv, uid }).await.unwrap();
    }
    // User 2's events: its join (1) and the message (2).
    send_text(&writer, 5, 1, "to 2").await;
    hints_until(&mut ha, 2, 2, "device a of user 2").await;
    hints_until(&mut hb, 2, 2, "device b of user 2").await;
    // Then user 3's: its join and a message. The connection subscribed to
    // 3 alone sees only 3, though user 2's round committed first.
    send_text(&writer, 6, 1, "to 3").await;
    let seen = hints_until(&mut hc, 3, 2, "device c of user 3").await;
    assert!(
        seen.iter().all(|h| h.uid == 3),
        "uid 3's connection got {seen:?}"
    );
    // Device a trades uid 2 for uid 3: user 2's next event (3) reaches b
    // only; a hears of 3's next round and nothing more of 2.
    a.unsubscribe(UidList { uids: vec![2] }).await.unwrap();
    a.subscribe(UidList { uids: vec![3] }).await.unwrap();
    send_text(&writer, 5, 1, "to 2 again").await;
    send_text(&writer, 6, 1, "to 3 again").await;
    hints_until(&mut hb, 2, 3, "device b of user 2").await;
    let seen = hints_until(&mut ha, 3, 3, "device a, now of user 3").await;
    assert!(
        seen.iter().all(|h| h.uid != 2 || h.committed_sync_seq < 3),
        "device a heard of user 2's event after it unsubscribed: {seen:?}"
    );
}

#[tokio::test]
async fn sync_gets_everything_when_every_hint_was_dropped() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let generation = register(&client, 2, 1).await;
    // Subscribed, but nobody reads the hints: all of them are lost.
    drop(client.hints());
    client.subscribe(UidList { uids: vec![2] }).await.unwrap();
    client.join(ConvMember { conv: 5, uid: 1 }).await.unwrap();
    client.join(ConvMember { conv: 5, uid: 2 }).await.unwrap();
    let mut sent = Vec::new();
    for i in 0..20 {
        sent.push((5, send_text(&client, 5, 1, &format!("m{i}")).await.msg_seq));
    }
    let run = client
        .sync_to_end(2, 1, Some(generation), 0, true)
        .await
        .unwrap();
    assert_eq!(inbox_tests::msg_refs(&run.events), sent);
}
