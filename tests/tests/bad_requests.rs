//! Well-framed requests the engine must refuse, and proof that no bad
//! input, framed or not, changes any state.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use inbox_server::client::Client;
use inbox_tests::{all_history, hello, register, send_text, Daemon, RawConn};
use inbox_wire::*;

async fn setup(client: &Client) -> u64 {
    let generation = register(client, 2, 1).await;
    client.join(ConvMember { conv: 9, uid: 1 }).await.unwrap();
    client.join(ConvMember { conv: 9, uid: 2 }).await.unwrap();
    for i in 0..3 {
        send_text(client, 9, 1, &format!("m{i}")).await;
    }
    generation
}

async fn first_page(client: &Client, generation: u64) -> SyncPage {
    client
        .sync(SyncReq {
            uid: 2,
            device: 1,
            generation: Some(generation),
            local_applied_seq: 0,
            limit: 100,
            batch_token: None,
            ..SyncReq::default()
        })
        .await
        .unwrap()
}

async fn acked(client: &Client) -> u64 {
    client.devices(UserReq { uid: 2 }).await.unwrap().devices[0].acked_sync_seq
}

#[tokio::test]
async fn forged_batch_token_is_refused_and_the_ack_does_not_move() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let generation = setup(&client).await;
    let page = first_page(&client, generation).await;
    let mut forged = page.batch_token.to_vec();
    let last = forged.len() - 1;
    forged[last] ^= 0x01;
    let err = client
        .ack(AckReq {
            uid: 2,
            device: 1,
            generation: page.generation,
            seq: page.next_cursor,
            batch_token: Bytes::from(forged),
        })
        .await
        .expect_err("forged token");
    assert_eq!(err.code(), Some(ErrorCode::BadToken), "{err}");
    assert_eq!(acked(&client).await, 0);
}

#[tokio::test]
async fn expired_batch_token_is_refused_and_the_ack_does_not_move() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start_with(dir.path(), &["--batch-token-ttl-s", "1"]);
    let client = daemon.client().await;
    let generation = setup(&client).await;
    let page = first_page(&client, generation).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let err = client
        .ack(AckReq {
            uid: 2,
            device: 1,
            generation: page.generation,
            seq: page.next_cursor,
            batch_token: page.batch_token,
        })
        .await
        .expect_err("expired token");
    assert_eq!(err.code(), Some(ErrorCode::BadToken), "{err}");
    assert_eq!(acked(&client).await, 0);
}

#[tokio::test]
async fn pull_outside_the_membership_period_is_forbidden() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    setup(&client).await;
    let outsider = 3;
    let err = client
        .pull(PullReq {
            uid: outsider,
            per_conv_limit: 50,
            cursors: vec![PullCursor {
                conv: 9,
                after_seq: 0,
            }],
        })
        .await
        .expect_err("never a member");
    assert_eq!(err.code(), Some(ErrorCode::Forbidden), "{err}");
    let err = client
        .history(HistoryReq {
            uid: outsider,
            conv: 9,
            before_seq: None,
            limit: 10,
        })
        .await
        .expect_err("never a member");
    assert_eq!(err.code(), Some(ErrorCode::Forbidden), "{err}");
}

async fn state(client: &Client) -> (Vec<Message>, DeviceList, u64) {
    (
        all_history(client, 1, 9).await,
        client.devices(UserReq { uid: 2 }).await.unwrap(),
        client.stats(Empty {}).await.unwrap().messages,
    )
}

/// Every kind of bad input in turn, then the same answers as before.
#[tokio::test]
async fn no_bad_input_changes_any_state() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    setup(&client).await;
    let before = state(&client).await;

    let send = Request::Send(SendReq {
        conv: 9,
        sender: 1,
        client_msg_id: 77,
        msg_type: 1,
        payload: Bytes::from_static(b"must not land"),
    });
    // Garbage.
    let mut conn = RawConn::connect(daemon.addr).await;
    conn.write_raw(b"\x00\x01garbage garbage garbage").await;
    conn.closed().await;
    // A frame declaring 4 GiB, after a good handshake.
    let mut conn = RawConn::authenticated(daemon.addr).await;
    let mut huge = BytesMut::new();
    huge.put_u32_le(u32::MAX);
    huge.put_u8(Op::Send as u8);
    conn.write_raw(&huge).await;
    conn.closed().await;
    // A truncated SEND.
    let mut conn = RawConn::authenticated(daemon.addr).await;
    let mut bytes = BytesMut::new();
    encode(&send.to_frame(5), &mut bytes).unwrap();
    conn.write_raw(&bytes[..bytes.len() - 4]).await;
    conn.shutdown_write().await;
    conn.closed().await;
    // A SEND with a corrupt body, and an unknown opcode.
    let mut conn = RawConn::authenticated(daemon.addr).await;
    let mut frame = send.to_frame(6);
    frame.body = frame.body.slice(..frame.body.len() - 1);
    conn.send(&frame).await;
    conn.send(&Frame {
        opcode: 0x70,
        request_id: 7,
        body: Bytes::new(),
    })
    .await;
    assert!(matches!(conn.recv().await, Some((6, Response::Error(_)))));
    assert!(matches!(conn.recv().await, Some((7, Response::Error(_)))));
    // A SEND with a wrong token, and one before any handshake.
    let mut conn = RawConn::connect(daemon.addr).await;
    conn.send(&hello("wrong").to_frame(1)).await;
    conn.send(&send.to_frame(2)).await;
    conn.closed().await;
    let mut conn = RawConn::connect(daemon.addr).await;
    conn.send(&send.to_frame(1)).await;
    conn.closed().await;

    assert_eq!(state(&client).await, before, "nothing changed");
}
