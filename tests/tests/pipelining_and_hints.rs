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
