//! A large group through the real daemon (R7): markers over `DIRTY`, the
//! clear's compare-and-set over `CLEAR_DIRTY` with `MARKER_MOVED`, and the
//! mode over `CONV_MODE`, across a restart.

use bytes::Bytes;
use inbox_server::client::ClientError;
use inbox_tests::Daemon;
use inbox_wire::*;

const CONV: u64 = 7;
/// Three members make a large group.
const LARGE: &[&str] = &["--large-group-members", "2"];

#[tokio::test]
async fn a_large_group_is_caught_up_by_marker_pull_and_clear() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start_with(dir.path(), LARGE);
    let client = daemon.client().await;
    for uid in 1..=3 {
        client.join(ConvMember { conv: CONV, uid }).await.unwrap();
    }
    let mode = client
        .conv_mode(ConvModeReq {
            conv: CONV,
            uid: Some(2),
        })
        .await
        .unwrap();
    assert!(mode.large);
    assert_eq!(mode.switch_seq, Some(3));
    let send = |key: u128| SendReq {
        conv: CONV,
        sender: 1,
        client_msg_id: key,
        msg_type: 1,
        payload: Bytes::from_static(b"hello"),
    };
    let first = client.send(send(1)).await.unwrap();

    let dirty = client.dirty(UserReq { uid: 2 }).await.unwrap();
    assert_eq!(
        dirty.markers,
        vec![DirtyMarker {
            conv: CONV,
            target_msg_seq: first.msg_seq,
            version: first.msg_seq,
        }]
    );
    let observed = dirty.markers[0].version;
    // A message lands between the read of the marker and the clear.
    let second = client.send(send(2)).await.unwrap();
    let clear = ClearDirtyReq {
        uid: 2,
        conv: CONV,
        version: observed,
    };
    match client.clear_dirty(clear.clone()).await {
        Err(ClientError::Server { code, detail, .. }) => {
            assert_eq!(code, ErrorCode::MarkerMoved);
            assert_eq!(detail, second.msg_seq);
        }
        other => panic!("expected MARKER_MOVED, got {other:?}"),
    }
    let dirty = client.dirty(UserReq { uid: 2 }).await.unwrap();
    assert_eq!(
        dirty.markers[0].target_msg_seq, second.msg_seq,
        "still dirty"
    );

    // Pull up to the target, then clear the version seen.
    let pulled = client
        .pull(PullReq {
            uid: 2,
            per_conv_limit: 50,
            cursors: vec![PullCursor {
                conv: CONV,
                after_seq: 3,
            }],
        })
        .await
        .unwrap();
    assert_eq!(pulled.convs[0].max_seq, second.msg_seq);
    assert_eq!(pulled.convs[0].messages.len(), 2);
    let cleared = client
        .clear_dirty(ClearDirtyReq {
            version: second.msg_seq,
            ..clear
        })
        .await
        .unwrap();
    assert_eq!(cleared.cleared_seq, second.msg_seq);
    assert!(client
        .dirty(UserReq { uid: 2 })
        .await
        .unwrap()
        .markers
        .is_empty());
    assert_eq!(
        client
            .dirty(UserReq { uid: 3 })
            .await
            .unwrap()
            .markers
            .len(),
        1
    );

    drop(client);
    daemon.stop();
    let daemon = Daemon::start_with(dir.path(), LARGE);
    let client = daemon.client().await;
    assert!(client
        .dirty(UserReq { uid: 2 })
        .await
        .unwrap()
        .markers
        .is_empty());
    let mode = client
        .conv_mode(ConvModeReq {
            conv: CONV,
            uid: Some(3),
        })
        .await
        .unwrap();
    assert_eq!(mode.switch_seq, Some(3));
    assert!(mode.marker.is_some_and(|m| m.dirty));
}

/// A daemon in which `CONV` is a large group of users 1, 2 and 3, and the
/// client that joined them.
async fn large_group_of_three(dir: &std::path::Path) -> (Daemon, inbox_server::client::Client) {
    let daemon = Daemon::start_with(dir, LARGE);
    let writer = daemon.client().await;
    for uid in 1..=3 {
        writer.join(ConvMember { conv: CONV, uid }).await.unwrap();
    }
    (daemon, writer)
}

/// `SUBSCRIBE_DIRTY`: a message in a large group pushes `DIRTY_HINT` with
/// the marker `DIRTY` lists, for subscribed members only; a connection
/// that only sent `SUBSCRIBE` never gets the new push.
#[tokio::test]
async fn a_message_in_a_large_group_pushes_the_member_s_marker_to_dirty_subscribers() {
    let dir = inbox_tests::data_dir();
    let (daemon, writer) = large_group_of_three(dir.path()).await;
    let watcher = daemon.client().await;
    let mut dirty_hints = watcher.dirty_hints().expect("taken once");
    // uid 2 is a member, uid 9 is not.
    watcher
        .subscribe_dirty(UidList { uids: vec![2, 9] })
        .await
        .unwrap();
    let plain = daemon.client().await;
    let mut plain_dirty = plain.dirty_hints().expect("taken once");
    plain.subscribe(UidList { uids: vec![2] }).await.unwrap();

    let sent = writer
        .send(SendReq {
            conv: CONV,
            sender: 1,
            client_msg_id: 1,
            msg_type: 1,
            payload: Bytes::from_static(b"hello"),
        })
        .await
        .unwrap();
    let push = tokio::time::timeout(std::time::Duration::from_secs(10), dirty_hints.recv())
        .await
        .expect("a DIRTY_HINT within 10 s")
        .expect("the connection is open");
    assert_eq!(
        push.hints,
        vec![DirtyHint {
            uid: 2,
            conv: CONV,
            target_msg_seq: sent.msg_seq,
            version: sent.msg_seq,
        }]
    );
    let listed = watcher.dirty(UserReq { uid: 2 }).await.unwrap();
    assert_eq!(listed.markers[0].version, push.hints[0].version);
    // The plain subscriber's connection answered a request after the push
    // went out to the other one, and holds no DIRTY_HINT.
    plain.ping(Empty {}).await.unwrap();
    assert!(
        plain_dirty.try_recv().is_err(),
        "SUBSCRIBE alone never gets DIRTY_HINT"
    );
}

/// Reads `DIRTY_HINT` pushes until each of `wanted` has an entry at
/// version `at` or above; returns every entry seen.
async fn dirty_hints_until(
    pushes: &mut tokio::sync::mpsc::Receiver<DirtyHints>,
    wanted: &[u64],
    at: u64,
) -> Vec<DirtyHint> {
    let mut seen: Vec<DirtyHint> = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !wanted
        .iter()
        .all(|uid| seen.iter().any(|h| h.uid == *uid && h.version >= at))
    {
        let push = tokio::time::timeout_at(deadline, pushes.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("no DIRTY_HINT for {wanted:?} at {at} within 10 s; saw {seen:?}")
            })
            .expect("the connection is open");
        seen.extend(push.hints);
    }
    seen
}

/// Once a connection sent `SUBSCRIBE_DIRTY`, every uid it holds gets
/// `DIRTY_HINT`, whether subscribed before, with it or after, by either
/// request; a uid it unsubscribes gets none.
#[tokio::test]
async fn dirty_hints_cover_every_uid_the_connection_holds_once_it_asked_for_them() {
    let dir = inbox_tests::data_dir();
    let (daemon, writer) = large_group_of_three(dir.path()).await;
    let watcher = daemon.client().await;
    let mut pushes = watcher.dirty_hints().expect("taken once");
    watcher.subscribe(UidList { uids: vec![2] }).await.unwrap();
    watcher
        .subscribe_dirty(UidList { uids: vec![9] })
        .await
        .unwrap();
    watcher.subscribe(UidList { uids: vec![3] }).await.unwrap();
    let send = |key: u128| {
        writer.send(SendReq {
            conv: CONV,
            sender: 1,
            client_msg_id: key,
            msg_type: 1,
            payload: Bytes::from_static(b"hello"),
        })
    };
    let first = send(1).await.unwrap();
    let seen = dirty_hints_until(&mut pushes, &[2, 3], first.msg_seq).await;
    assert!(
        seen.iter().all(|h| h.conv == CONV && h.uid != 9),
        "{seen:?}"
    );
    watcher
        .unsubscribe(UidList { uids: vec![2] })
        .await
        .unwrap();
    let second = send(2).await.unwrap();
    let seen = dirty_hints_until(&mut pushes, &[3], second.msg_seq).await;
    assert!(
        seen.iter()
            .all(|h| h.uid != 2 || h.version < second.msg_seq),
        "uid 2 was hinted after it was unsubscribed: {seen:?}"
    );
}
