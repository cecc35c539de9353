//! Behaviours PROTOCOL.md states that a client could otherwise only guess:
//! the retry rule of each write, the limits `HELLO_OK` announces, the
//! stream names of `EXPLAIN_SEGMENT`, the safety window's fence against
//! the floor, large groups' reads and events, and the edge cases of
//! `MARK_READ`, `CONV_MODE` and `PULL`. One test per rule, against the
//! real daemon.

use inbox_server::client::{Client, ClientError};
use inbox_tests::{register, send_text, Daemon, ADMIN_TOKEN};
use inbox_wire::*;

fn code(result: Result<impl std::fmt::Debug, ClientError>) -> ErrorCode {
    match result {
        Err(e) => e
            .code()
            .unwrap_or_else(|| panic!("not a server error: {e}")),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn member(conv: u64, uid: u64) -> ConvMember {
    ConvMember { conv, uid }
}

/// The events of `uid`'s device 1 after `from`, ACKed; returns them and
/// where the device now is.
async fn sync_from(client: &Client, uid: u64, generation: u64, from: u64) -> (Vec<Event>, u64) {
    let run = client
        .sync_to_end(uid, 1, Some(generation), from, true)
        .await
        .expect("sync");
    assert_eq!(run.generation, generation);
    (run.events, run.acked_sync_seq)
}

fn kinds(events: &[Event]) -> Vec<EventKind> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Known { kind, .. } => Some(*kind),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn retried_writes_answer_as_the_doc_says_and_change_nothing_more() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    let first = client.join(member(7, 1)).await.unwrap();
    // JOIN of a current member returns its join and writes nothing.
    let again = client.join(member(7, 1)).await.unwrap();
    assert_eq!(again, first);
    client.join(member(7, 2)).await.unwrap();
    let sent = send_text(&client, 7, 1, "hi").await;
    assert_eq!(sent.msg_seq, 3, "the retried JOIN took no msg_seq");

    // MARK_READ with the same position answers the same and moves nothing.
    let read = MarkReadReq {
        uid: 2,
        conv: 7,
        read_to_seq: 3,
    };
    let r1 = client.mark_read(read.clone()).await.unwrap();
    let r2 = client.mark_read(read).await.unwrap();
    assert_eq!(r1, r2);
    assert_eq!((r2.read_seq, r2.unread), (3, 0));

    // REGISTER_DEVICE of a live device keeps its generation and cursor.
    let d1 = client
        .register_device(UserDevice { uid: 2, device: 1 })
        .await
        .unwrap();
    let d2 = client
        .register_device(UserDevice { uid: 2, device: 1 })
        .await
        .unwrap();
    assert_eq!(d2.device.generation, d1.device.generation);
    assert_eq!(d2.device.acked_sync_seq, d1.device.acked_sync_seq);
    assert_eq!(d2.evicted, None);

    // SET_CONV_FLAGS with the flags already set sends no second event.
    let generation = d2.device.generation;
    let (_, at) = sync_from(&client, 2, generation, 0).await;
    let flags = ConvFlagsReq {
        uid: 2,
        conv: 7,
        muted: true,
        pinned: false,
    };
    client.set_conv_flags(flags.clone()).await.unwrap();
    client.set_conv_flags(flags).await.unwrap();
    let (events, _) = sync_from(&client, 2, generation, at).await;
    assert_eq!(kinds(&events), vec![EventKind::Conv]);

    // REVOKE_DEVICE of a revoked device answers its row, unchanged.
    let revoke = UserDevice { uid: 2, device: 2 };
    client.register_device(revoke.clone()).await.unwrap();
    let r1 = client.revoke_device(revoke.clone()).await.unwrap();
    let r2 = client.revoke_device(revoke).await.unwrap();
    assert_eq!(r2, r1);
    assert_eq!(r2.state, DeviceState::Revoked);

    // LEAVE of a member that already left is NOT_FOUND, and writes nothing.
    client.leave(member(7, 2)).await.unwrap();
    assert_eq!(code(client.leave(member(7, 2)).await), ErrorCode::NotFound);
    let next = send_text(&client, 7, 1, "after").await;
    assert_eq!(next.msg_seq, 5, "the refused LEAVE took no msg_seq");
}

#[tokio::test]
async fn hello_ok_announces_the_connection_and_group_limits_the_daemon_runs_with() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(
        data.path(),
        &[
            "--max-connections",
            "50",
            "--subscribe-uids-max",
            "123",
            "--subscriptions-max",
            "4567",
            "--large-group-members",
            "9",
            "--idempotency-ttl-s",
            "600",
            "--reply-frame-bytes-max",
            "300000",
        ],
    );
    let client = Client::connect(daemon.addr, ADMIN_TOKEN).await.unwrap();
    let ok = client.server();
    assert_eq!(ok.version, PROTOCOL_VERSION);
    assert_eq!(ok.max_connections, 50);
    assert_eq!(ok.subscribe_uids_max, 123);
    assert_eq!(ok.subscriptions_max, 4567);
    assert_eq!(ok.large_group_members, 9);
    assert_eq!(ok.idempotency_ttl_ms, 600_000);
    assert_eq!(ok.reply_frame_bytes_max, 300_000);
    // The announced cap is the one enforced, with the count as detail.
    let err = client
        .subscribe(UidList {
            uids: (0..124).collect(),
        })
        .await
        .expect_err("over subscribe_uids_max");
    assert_eq!(err.code(), Some(ErrorCode::TooLarge));
    let ClientError::Server { detail, .. } = err else {
        unreachable!()
    };
    assert_eq!(
        detail, 123,
        "TOO_LARGE of SUBSCRIBE: detail is a count of uids"
    );
}

#[tokio::test]
async fn explain_segment_knows_the_msg_and_evt_streams_only() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    client.join(member(7, 1)).await.unwrap();
    let seg = |stream: &str, segment| SegmentReq {
        stream: stream.into(),
        segment,
    };
    // Segment ids count from 1; the event stream always has its first.
    let first = client.explain_segment(seg("evt", 1)).await.unwrap();
    assert_eq!((first.stream.as_str(), first.segment), ("evt", 1));
    for stream in ["msg", "evt"] {
        assert_eq!(
            code(client.explain_segment(seg(stream, 0)).await),
            ErrorCode::NotFound,
            "{stream} segment 0 never exists"
        );
    }
    assert_eq!(
        code(client.explain_segment(seg("events", 1)).await),
        ErrorCode::BadRequest
    );
}

#[tokio::test]
async fn the_safety_window_holds_the_floor_just_below_its_oldest_kept_event() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    client.join(member(7, 1)).await.unwrap();
    client.join(member(7, 2)).await.unwrap();
    send_text(&client, 7, 1, "hi").await;
    let explain = client.explain(UserReq { uid: 2 }).await.unwrap();
    let oldest_kept = explain
        .fences
        .iter()
        .find_map(|f| match f {
            Fence::SafetyWindow { oldest_kept } => Some(*oldest_kept),
            _ => None,
        })
        .expect("a safety window fence");
    assert_eq!(oldest_kept, explain.oldest_retained);
    assert_eq!(explain.floor, oldest_kept - 1, "{explain:?}");
}

/// A large group of three (the threshold is two members) in conv 7.
async fn large_group(daemon: &Daemon) -> Client {
    let client = daemon.client().await;
    for uid in 1..=3 {
        client.join(member(7, uid)).await.unwrap();
    }
    let mode = client
        .conv_mode(ConvModeReq { conv: 7, uid: None })
        .await
        .unwrap();
    assert!(mode.large);
    client
}

const LARGE: &[&str] = &["--large-group-members", "2"];

#[tokio::test]
async fn clearing_a_clean_marker_with_an_older_version_is_marker_moved_with_the_current_one() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), LARGE);
    let client = large_group(&daemon).await;
    let a = send_text(&client, 7, 1, "a").await;
    let b = send_text(&client, 7, 1, "b").await;
    let clear = |version| ClearDirtyReq {
        uid: 2,
        conv: 7,
        version,
    };
    client.clear_dirty(clear(b.msg_seq)).await.unwrap();
    assert!(client
        .dirty(UserReq { uid: 2 })
        .await
        .unwrap()
        .markers
        .is_empty());
    let err = client
        .clear_dirty(clear(a.msg_seq))
        .await
        .expect_err("an older version");
    assert_eq!(err.code(), Some(ErrorCode::MarkerMoved));
    let ClientError::Server { detail, .. } = err else {
        unreachable!()
    };
    assert_eq!(detail, b.msg_seq);
    // At the current version: answers its position, changes nothing.
    let again = client.clear_dirty(clear(b.msg_seq)).await.unwrap();
    assert_eq!(again.cleared_seq, b.msg_seq);
}

#[tokio::test]
async fn large_group_unread_counts_every_entry_but_the_members_own_joins() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), LARGE);
    let client = large_group(&daemon).await;
    let list = |uid| ConvListReq {
        uid,
        limit: 0,
        cursor: None,
    };
    let unread_of = |page: ConvListPage| page.convs.iter().find(|c| c.conv == 7).unwrap().unread;
    let head = send_text(&client, 7, 1, "x").await.msg_seq;
    client
        .mark_read(MarkReadReq {
            uid: 3,
            conv: 7,
            read_to_seq: head,
        })
        .await
        .unwrap();
    assert_eq!(unread_of(client.conv_list(list(3)).await.unwrap()), 0);
    // Its own leave is an entry inside its period: it counts...
    client.leave(member(7, 3)).await.unwrap();
    assert_eq!(unread_of(client.conv_list(list(3)).await.unwrap()), 1);
    // ...and so do another member's leave and the member's own messages.
    client
        .mark_read(MarkReadReq {
            uid: 2,
            conv: 7,
            read_to_seq: head,
        })
        .await
        .unwrap();
    send_text(&client, 7, 2, "mine").await;
    assert_eq!(
        unread_of(client.conv_list(list(2)).await.unwrap()),
        2,
        "3's leave and 2's own message"
    );
    // Its own join does not count.
    client.join(member(7, 3)).await.unwrap();
    let rejoined = client.conv_list(list(3)).await.unwrap();
    assert_eq!(unread_of(rejoined), 1, "still only its leave");
}

#[tokio::test]
async fn mark_read_and_conv_flags_in_a_large_group_still_send_read_and_conv_events() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), LARGE);
    let client = large_group(&daemon).await;
    let generation = register(&client, 2, 1).await;
    let (_, at) = sync_from(&client, 2, generation, 0).await;
    let head = send_text(&client, 7, 1, "x").await.msg_seq;
    client
        .mark_read(MarkReadReq {
            uid: 2,
            conv: 7,
            read_to_seq: head,
        })
        .await
        .unwrap();
    client
        .set_conv_flags(ConvFlagsReq {
            uid: 2,
            conv: 7,
            muted: true,
            pinned: false,
        })
        .await
        .unwrap();
    let (events, _) = sync_from(&client, 2, generation, at).await;
    assert_eq!(kinds(&events), vec![EventKind::Read, EventKind::Conv]);
}

#[tokio::test]
async fn mark_read_past_the_head_and_conv_mode_of_an_unknown_conversation_are_refused() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    client.join(member(7, 1)).await.unwrap();
    let head = send_text(&client, 7, 1, "x").await.msg_seq;
    let past = client
        .mark_read(MarkReadReq {
            uid: 1,
            conv: 7,
            read_to_seq: head + 1,
        })
        .await;
    assert_eq!(code(past), ErrorCode::BadRequest);
    let mode = client
        .conv_mode(ConvModeReq {
            conv: 99,
            uid: None,
        })
        .await;
    assert_eq!(code(mode), ErrorCode::NotFound);
}

#[tokio::test]
async fn pull_serves_a_conversation_named_twice_and_skips_the_gap_between_periods() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    client.join(member(7, 1)).await.unwrap(); // 1
    client.join(member(7, 2)).await.unwrap(); // 2
    send_text(&client, 7, 1, "in").await; // 3
    client.leave(member(7, 2)).await.unwrap(); // 4
    send_text(&client, 7, 1, "away 1").await; // 5
    send_text(&client, 7, 1, "away 2").await; // 6
    client.join(member(7, 2)).await.unwrap(); // 7
    send_text(&client, 7, 1, "back").await; // 8
    let cursor = |after_seq| PullCursor { conv: 7, after_seq };
    let reply = client
        .pull(PullReq {
            uid: 2,
            per_conv_limit: 0,
            cursors: vec![cursor(5), cursor(2)],
        })
        .await
        .unwrap();
    let seqs: Vec<Vec<u64>> = reply
        .convs
        .iter()
        .map(|c| c.messages.iter().map(|m| m.msg_seq).collect())
        .collect();
    assert_eq!(
        seqs,
        vec![vec![7, 8], vec![3, 4, 7, 8]],
        "each cursor served in order; 5 and 6 fall between the periods"
    );
}
