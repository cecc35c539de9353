//! Regression: a snapshot page could be too large ever to send. Pages held
//! 64 conversations with up to 20 messages each, whatever their bytes, and
//! `SNAPSHOT_PAGE` has no item count: a page over `reply_frame_bytes_max`
//! answered `TOO_LARGE` forever, so the device stayed RESETTING. Pages are
//! now cut by bytes when the snapshot is built, and a message too large for
//! any reply on its own is carried as its summary and named in `elided`.

use bytes::Bytes;
use inbox_server::client::Client;
use inbox_tests::{register, Daemon};
use inbox_wire::{
    AckSnapshotReq, ConvMember, DeviceState, Message, SendReq, SnapshotPageReq, SnapshotState,
    UserDevice,
};

/// Sends `count` messages of `bytes` bytes each from `sender` to `conv`.
async fn send_big(client: &Client, conv: u64, sender: u64, count: u64, bytes: usize) {
    for i in 0..count {
        let key = (u128::from(conv) << 64) | (u128::from(i) << 32) | bytes as u128;
        client
            .send(SendReq {
                conv,
                sender,
                client_msg_id: key,
                msg_type: 1,
                payload: Bytes::from(vec![b'a' + (i % 26) as u8; bytes]),
            })
            .await
            .expect("send");
    }
}

/// Begins a snapshot for `uid`'s device 1, fetches every page and installs
/// it; returns the messages and the elided references of every page.
async fn install(client: &Client, uid: u64) -> (Vec<Message>, Vec<(u64, u64)>) {
    let info = client
        .begin_snapshot(UserDevice { uid, device: 1 })
        .await
        .expect("begin snapshot");
    assert_eq!(info.state, SnapshotState::Ready);
    let mut messages = Vec::new();
    let mut elided = Vec::new();
    for page in 0..info.pages {
        let p = client
            .snapshot_page(SnapshotPageReq {
                uid,
                snapshot_id: info.snapshot_id,
                page,
            })
            .await
            .unwrap_or_else(|e| panic!("page {page} of {}: {e}", info.pages));
        messages.extend(p.messages);
        elided.extend(p.elided.iter().map(|r| (r.conv, r.msg_seq)));
    }
    let device = client
        .ack_snapshot(AckSnapshotReq {
            uid,
            device: 1,
            snapshot_id: info.snapshot_id,
            generation: info.generation,
        })
        .await
        .expect("the snapshot installs");
    assert_eq!(device.state, DeviceState::Active);
    (messages, elided)
}

#[tokio::test]
async fn a_snapshot_whose_messages_pass_the_reply_limit_is_cut_into_pages_that_fit() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), &["--reply-frame-bytes-max", "200000"]);
    let client = daemon.client().await;
    client.join(ConvMember { conv: 7, uid: 1 }).await.unwrap();
    client.join(ConvMember { conv: 8, uid: 1 }).await.unwrap();
    // 5 × 60 kB in each conversation: 600 kB of messages, one page before.
    send_big(&client, 7, 1, 5, 60_000).await;
    send_big(&client, 8, 1, 5, 60_000).await;
    register(&client, 1, 1).await;

    let (messages, elided) = install(&client, 1).await;
    let mut sent: Vec<(u64, u64)> = messages
        .iter()
        .filter(|m| m.payload.len() == 60_000)
        .map(|m| (m.conv, m.msg_seq))
        .collect();
    sent.sort_unstable();
    let expected: Vec<(u64, u64)> = [7, 8]
        .into_iter()
        .flat_map(|conv| (2..=6).map(move |seq| (conv, seq)))
        .collect();
    assert_eq!(sent, expected, "every message with its whole body");
    assert!(elided.is_empty(), "{elided:?}");
}

#[tokio::test]
async fn a_message_larger_than_any_reply_is_carried_as_its_summary_and_named() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), &["--reply-frame-bytes-max", "40000"]);
    let client = daemon.client().await;
    client.join(ConvMember { conv: 9, uid: 1 }).await.unwrap();
    send_big(&client, 9, 1, 1, 60_000).await;
    send_big(&client, 9, 1, 1, 100).await;
    register(&client, 1, 1).await;

    let (messages, elided) = install(&client, 1).await;
    assert_eq!(elided, vec![(9, 2)], "the 60 kB message is elided");
    let big = messages.iter().find(|m| m.msg_seq == 2).expect("message 2");
    assert_eq!(big.payload.len(), 64, "its summary, 64 bytes");
    assert!(!big.tombstone);
    let small = messages.iter().find(|m| m.msg_seq == 3).expect("message 3");
    assert_eq!(small.payload.len(), 100, "the others whole");
}
