//! The inbox scenarios of docs/SEMANTICS.md, end to end over TCP against the real
//! daemon: every answer here crossed the wire codec, the server and the
//! engine.

use std::sync::Arc;

use bytes::Bytes;
use inbox_server::client::Client;
use inbox_tests::{all_history, msg_refs, register, send_text, Daemon};
use inbox_wire::*;

const A: u64 = 1;
const B: u64 = 2;

async fn two_member_conv(client: &Client, conv: u64) {
    client
        .join(ConvMember { conv, uid: A })
        .await
        .expect("join A");
    client
        .join(ConvMember { conv, uid: B })
        .await
        .expect("join B");
}

async fn acked(client: &Client, uid: u64, device: u64) -> u64 {
    let devices = client.devices(UserReq { uid }).await.expect("devices");
    devices
        .devices
        .iter()
        .find(|d| d.device == device)
        .expect("device is registered")
        .acked_sync_seq
}

#[tokio::test]
async fn phone_offline_while_12_messages_arrive_gets_all_12_in_order_none_twice() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let phone = 1;
    let generation = register(&client, B, phone).await;
    two_member_conv(&client, 10).await;
    let first = client
        .sync_to_end(B, phone, Some(generation), 0, true)
        .await
        .unwrap();

    let mut sent = Vec::new();
    for i in 0..12 {
        sent.push((
            10,
            send_text(&client, 10, A, &format!("m{i}")).await.msg_seq,
        ));
    }
    let back = client
        .sync_to_end(B, phone, Some(first.generation), first.acked_sync_seq, true)
        .await
        .unwrap();
    assert_eq!(msg_refs(&back.events), sent, "all 12, in order, once");
    let again = client
        .sync_to_end(B, phone, Some(back.generation), back.acked_sync_seq, true)
        .await
        .unwrap();
    assert!(
        msg_refs(&again.events).is_empty(),
        "nothing is served twice"
    );
}

#[tokio::test]
async fn phone_desktop_and_web_catch_up_independently() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let (phone, desktop, web) = (1, 2, 3);
    let generations = [
        register(&client, B, phone).await,
        register(&client, B, desktop).await,
        register(&client, B, web).await,
    ];
    two_member_conv(&client, 10).await;
    let mut sent = Vec::new();
    for i in 0..5 {
        sent.push((
            10,
            send_text(&client, 10, A, &format!("m{i}")).await.msg_seq,
        ));
    }

    let phone_run = client
        .sync_to_end(B, phone, Some(generations[0]), 0, true)
        .await
        .unwrap();
    assert_eq!(msg_refs(&phone_run.events), sent);
    assert!(phone_run.acked_sync_seq > 0);
    assert_eq!(
        acked(&client, B, desktop).await,
        0,
        "phone's ACK never moves desktop"
    );
    assert_eq!(
        acked(&client, B, web).await,
        0,
        "phone's ACK never moves web"
    );

    let desktop_run = client
        .sync_to_end(B, desktop, Some(generations[1]), 0, true)
        .await
        .unwrap();
    assert_eq!(
        msg_refs(&desktop_run.events),
        sent,
        "desktop gets everything too"
    );
    let web_run = client
        .sync_to_end(B, web, Some(generations[2]), 0, false)
        .await
        .unwrap();
    assert_eq!(msg_refs(&web_run.events), sent);
    assert_eq!(acked(&client, B, web).await, 0, "web did not ACK");
    assert_eq!(acked(&client, B, phone).await, phone_run.acked_sync_seq);
}

#[tokio::test]
async fn acks_arriving_out_of_order_never_move_the_cursor_back() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let generation = register(&client, B, 1).await;
    two_member_conv(&client, 10).await;
    for i in 0..10 {
        send_text(&client, 10, A, &format!("m{i}")).await;
    }
    let page = client
        .sync(SyncReq {
            uid: B,
            device: 1,
            generation: Some(generation),
            local_applied_seq: 0,
            limit: 500,
            batch_token: None,
            ..SyncReq::default()
        })
        .await
        .unwrap();
    let high = page.next_cursor;
    let low = high - 5;
    let ack = |seq| AckReq {
        uid: B,
        device: 1,
        generation: page.generation,
        seq,
        batch_token: page.batch_token.clone(),
    };
    assert_eq!(client.ack(ack(high)).await.unwrap().acked_sync_seq, high);
    assert_eq!(
        client.ack(ack(low)).await.unwrap().acked_sync_seq,
        high,
        "an older ACK is a no-op returning the current value"
    );
    assert_eq!(acked(&client, B, 1).await, high);
}

#[tokio::test]
async fn pulling_is_not_acking_a_crash_mid_page_reserves_the_same_page() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let generation = register(&client, B, 1).await;
    two_member_conv(&client, 10).await;
    for i in 0..10 {
        send_text(&client, 10, A, &format!("m{i}")).await;
    }
    let request = SyncReq {
        uid: B,
        device: 1,
        generation: Some(generation),
        local_applied_seq: 0,
        limit: 4,
        batch_token: None,
        ..SyncReq::default()
    };
    let before = client.sync(request.clone()).await.unwrap();
    assert_eq!(before.events.len(), 4);
    drop(client);
    daemon.crash();

    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let after = client.sync(request).await.unwrap();
    assert_eq!(
        after.events, before.events,
        "the unacknowledged page is served again"
    );
    assert_eq!(after.acked_sync_seq, 0);
}

#[tokio::test]
async fn late_ack_from_an_old_generation_is_refused_after_a_reset() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let generation = register(&client, B, 1).await;
    two_member_conv(&client, 10).await;
    for i in 0..3 {
        send_text(&client, 10, A, &format!("m{i}")).await;
    }
    let old = client
        .sync(SyncReq {
            uid: B,
            device: 1,
            generation: Some(generation),
            local_applied_seq: 0,
            limit: 100,
            batch_token: None,
            ..SyncReq::default()
        })
        .await
        .unwrap();
    // A reinstall: the device no longer knows its generation.
    let reinstall = client
        .sync(SyncReq {
            uid: B,
            device: 1,
            generation: None,
            local_applied_seq: 0,
            limit: 100,
            batch_token: None,
            ..SyncReq::default()
        })
        .await;
    let new_generation = match reinstall {
        Ok(page) => page.generation,
        Err(err) => {
            assert_eq!(err.code(), Some(ErrorCode::ResetRequired), "{err}");
            let inbox_server::client::ClientError::Server { detail, .. } = err else {
                unreachable!()
            };
            detail
        }
    };
    assert!(new_generation > old.generation, "the generation was bumped");
    let late = client
        .ack(AckReq {
            uid: B,
            device: 1,
            generation: old.generation,
            seq: old.next_cursor,
            batch_token: old.batch_token.clone(),
        })
        .await
        .expect_err("late ACK from the old generation");
    assert_eq!(late.code(), Some(ErrorCode::StaleGeneration), "{late}");
    assert_eq!(
        acked(&client, B, 1).await,
        0,
        "the late ACK changed nothing"
    );
}

#[tokio::test]
async fn same_client_msg_id_retried_concurrently_yields_exactly_one_message() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let first = Arc::new(daemon.client().await);
    let second = Arc::new(daemon.client().await);
    two_member_conv(&first, 10).await;
    let request = SendReq {
        conv: 10,
        sender: A,
        client_msg_id: 0xfeed,
        msg_type: 1,
        payload: Bytes::from_static(b"once"),
    };
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16 {
        let client = Arc::clone(if i % 2 == 0 { &first } else { &second });
        let request = request.clone();
        tasks.spawn(async move { client.send(request).await.expect("send") });
    }
    let replies: Vec<SendReply> = tasks.join_all().await;
    let originals = replies.iter().filter(|r| !r.duplicate).count();
    assert_eq!(originals, 1, "exactly one send was new: {replies:?}");
    assert!(replies
        .iter()
        .all(|r| r.msg_id == replies[0].msg_id && r.msg_seq == replies[0].msg_seq));
    let history = all_history(&first, A, 10).await;
    let copies = history.iter().filter(|m| m.payload == "once").count();
    assert_eq!(copies, 1);
}

#[tokio::test]
async fn recalled_message_is_never_shown_again() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let generation = register(&client, B, 1).await;
    two_member_conv(&client, 10).await;
    let original = send_text(&client, 10, A, "secret").await;
    let recall = client
        .recall(RecallReq {
            conv: 10,
            sender: A,
            client_msg_id: rand::random(),
            target: original.msg_id,
        })
        .await
        .unwrap();
    assert!(
        recall.msg_seq > original.msg_seq,
        "the recall has its own msg_seq"
    );

    // A device that only now syncs sees the recall event in its batch.
    let run = client
        .sync_to_end(B, 1, Some(generation), 0, true)
        .await
        .unwrap();
    assert!(run.events.iter().any(|e| matches!(e,
        Event::Known { kind: EventKind::Recall, body, .. } if body.conv == 10)));
    let pulled = client
        .pull(PullReq {
            uid: B,
            per_conv_limit: 50,
            cursors: vec![PullCursor {
                conv: 10,
                after_seq: 0,
            }],
        })
        .await
        .unwrap();
    let shown = pulled.convs[0]
        .messages
        .iter()
        .find(|m| m.msg_id == original.msg_id)
        .expect("the tombstone is still listed");
    assert!(shown.tombstone && shown.payload.is_empty(), "{shown:?}");
    for message in all_history(&client, B, 10).await {
        assert_ne!(message.payload, "secret", "history never serves the body");
    }
}

#[tokio::test]
async fn mark_read_racing_a_new_message_leaves_the_new_message_unread() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = Arc::new(daemon.client().await);
    two_member_conv(&client, 10).await;
    let first = send_text(&client, 10, A, "first").await;
    let reader = Arc::clone(&client);
    let read = tokio::spawn(async move {
        reader
            .mark_read(MarkReadReq {
                uid: B,
                conv: 10,
                read_to_seq: first.msg_seq,
            })
            .await
            .unwrap()
    });
    let second = send_text(&client, 10, A, "second").await;
    let read = read.await.unwrap();
    assert_eq!(read.read_seq, first.msg_seq);
    let list = client
        .conv_list(ConvListReq {
            uid: B,
            limit: 10,
            cursor: None,
        })
        .await
        .unwrap();
    let conv = list.convs.iter().find(|c| c.conv == 10).unwrap();
    assert_eq!(conv.read_seq, first.msg_seq);
    assert_eq!(conv.unread, 1, "the message after read_to_seq stays unread");
    assert_eq!(conv.last_msg_seq, second.msg_seq);
}

#[tokio::test]
async fn leave_then_rejoin_delivers_only_messages_inside_membership_periods() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let generation = register(&client, B, 1).await;
    two_member_conv(&client, 10).await;
    let before = send_text(&client, 10, A, "before leave").await;
    client.leave(ConvMember { conv: 10, uid: B }).await.unwrap();
    let gap = send_text(&client, 10, A, "in the gap").await;
    client.join(ConvMember { conv: 10, uid: B }).await.unwrap();
    let after = send_text(&client, 10, A, "after rejoin").await;

    let run = client
        .sync_to_end(B, 1, Some(generation), 0, true)
        .await
        .unwrap();
    assert_eq!(
        msg_refs(&run.events),
        vec![(10, before.msg_seq), (10, after.msg_seq)],
        "fan-out follows the periods"
    );
    let seen: Vec<u64> = all_history(&client, B, 10)
        .await
        .iter()
        .filter(|m| m.kind == MessageKind::Normal)
        .map(|m| m.msg_seq)
        .collect();
    assert!(
        seen.contains(&before.msg_seq) && seen.contains(&after.msg_seq),
        "{seen:?}"
    );
    assert!(
        !seen.contains(&gap.msg_seq),
        "the gap is never served: {seen:?}"
    );
}

#[tokio::test]
async fn back_after_5_days_first_page_per_conversation_and_one_to_one_chats_complete() {
    let dir = inbox_tests::data_dir();
    // Durability is not what this test measures; skip the fsyncs.
    let daemon = Daemon::start_with(dir.path(), &["--sync", "none"]);
    let client = Arc::new(daemon.client().await);
    let generation = register(&client, B, 1).await;
    let group = 1000;
    two_member_conv(&client, group).await;
    let chats: Vec<u64> = (2000..2016).collect();
    for conv in &chats {
        two_member_conv(&client, *conv).await;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..32u64 {
        let client = Arc::clone(&client);
        let chats = chats.clone();
        tasks.spawn(async move {
            for i in 0..1000u64 {
                send_text(&client, group, A, &format!("g{worker}-{i}")).await;
            }
            // 16 one-to-one chats of 50 messages each: 800 in all.
            if let Some(conv) = chats.get(worker as usize) {
                for i in 0..50u64 {
                    send_text(&client, *conv, A, &format!("c{worker}-{i}")).await;
                }
            }
        });
    }
    tasks.join_all().await;

    let mut cursors = vec![PullCursor {
        conv: group,
        after_seq: 0,
    }];
    cursors.extend(chats.iter().map(|conv| PullCursor {
        conv: *conv,
        after_seq: 0,
    }));
    let pulled = client
        .pull(PullReq {
            uid: B,
            // Room for a whole one-to-one chat (50 messages + 2 joins).
            per_conv_limit: 100,
            cursors,
        })
        .await
        .unwrap();
    let group_page = pulled.convs.iter().find(|c| c.conv == group).unwrap();
    assert_eq!(group_page.messages.len(), 100);
    assert!(group_page.has_more, "the group has a first page and more");
    assert!(group_page.max_seq >= 32_000);
    for conv in &chats {
        let page = pulled.convs.iter().find(|c| c.conv == *conv).unwrap();
        let normal = page
            .messages
            .iter()
            .filter(|m| m.kind == MessageKind::Normal)
            .count();
        assert_eq!(normal, 50, "conv {conv}: the one-to-one chat is complete");
        assert!(!page.has_more, "conv {conv}");
    }
    let first_page = client
        .sync(SyncReq {
            uid: B,
            device: 1,
            generation: Some(generation),
            local_applied_seq: 0,
            limit: 100,
            batch_token: None,
            ..SyncReq::default()
        })
        .await
        .unwrap();
    assert_eq!(first_page.events.len(), 100);
    assert!(first_page.has_more);
}

/// Everything a user can read, for comparing before and after a restart.
async fn fingerprint(client: &Client, uids: &[u64], convs: &[u64]) -> String {
    let mut out = String::new();
    for uid in uids {
        let list = client
            .conv_list(ConvListReq {
                uid: *uid,
                limit: 100,
                cursor: None,
            })
            .await
            .unwrap();
        out.push_str(&format!("{uid} convs {:?}\n", list));
        out.push_str(&format!(
            "{uid} devices {:?}\n",
            client.devices(UserReq { uid: *uid }).await.unwrap()
        ));
        for conv in convs {
            out.push_str(&format!(
                "{uid} {conv} history {:?}\n",
                all_history(client, *uid, *conv).await
            ));
        }
    }
    out
}

#[tokio::test]
async fn restart_with_and_without_a_checkpoint_gives_identical_answers() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    register(&client, B, 1).await;
    two_member_conv(&client, 10).await;
    two_member_conv(&client, 11).await;
    let mut last = None;
    for i in 0..20 {
        last = Some(
            send_text(
                &client,
                10 + i % 2,
                if i % 3 == 0 { B } else { A },
                &format!("m{i}"),
            )
            .await,
        );
    }
    client
        .recall(RecallReq {
            conv: 11,
            sender: A,
            client_msg_id: 1,
            target: last.unwrap().msg_id,
        })
        .await
        .unwrap();
    client
        .mark_read(MarkReadReq {
            uid: B,
            conv: 10,
            read_to_seq: 5,
        })
        .await
        .unwrap();
    let expected = fingerprint(&client, &[A, B], &[10, 11]).await;
    drop(client);

    // No checkpoint: the whole log is replayed.
    daemon.crash();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    assert_eq!(
        fingerprint(&client, &[A, B], &[10, 11]).await,
        expected,
        "after replay"
    );

    // With a checkpoint, then a crash.
    client.checkpoint(Empty {}).await.unwrap();
    drop(client);
    daemon.crash();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    assert_eq!(
        fingerprint(&client, &[A, B], &[10, 11]).await,
        expected,
        "after checkpoint"
    );

    // A clean SIGTERM shutdown.
    drop(client);
    assert!(daemon.stop().success());
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    assert_eq!(
        fingerprint(&client, &[A, B], &[10, 11]).await,
        expected,
        "after SIGTERM"
    );
}
