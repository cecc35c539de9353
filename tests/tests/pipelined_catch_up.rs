//! The Rust client's pipelined catch-up (PROTOCOL.md, "Pipelined
//! catch-up"): each page's ACK is in flight while the next page is asked
//! for, and still every event arrives exactly once, in order, and the
//! device ends ACKed at the batch's high-water mark.

use inbox_server::client::{CatchUpOptions, Client};
use inbox_tests::{msg_refs, register, send_text, Daemon};
use inbox_wire::*;

const CONV: u64 = 9;
const SENDER: u64 = 1;
const READER: u64 = 2;
const MESSAGES: u64 = 120;

async fn setup(client: &Client) -> Vec<(u64, u64)> {
    for uid in [SENDER, READER] {
        client.join(ConvMember { conv: CONV, uid }).await.unwrap();
    }
    let mut sent = Vec::new();
    for n in 0..MESSAGES {
        let reply = send_text(client, CONV, SENDER, &format!("message {n}")).await;
        sent.push((CONV, reply.msg_seq));
    }
    sent
}

fn small_pages() -> CatchUpOptions {
    CatchUpOptions {
        limit: 7,
        ..CatchUpOptions::default()
    }
}

fn assert_contiguous(events: &[Event], from: u64, to: u64) {
    let seqs: Vec<u64> = events.iter().map(Event::sync_seq).collect();
    let expected: Vec<u64> = (from + 1..=to).collect();
    assert_eq!(seqs, expected, "every event once, in order, no gap");
}

#[tokio::test]
async fn a_pipelined_catch_up_delivers_every_event_once_in_order_and_acks_the_end() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let sent = setup(&client).await;
    let generation = register(&client, READER, 1).await;

    let run = client
        .catch_up(READER, 1, Some(generation), 0, true, small_pages())
        .await
        .unwrap();
    assert!(run.pages > 10, "many pages: {}", run.pages);
    assert_contiguous(&run.events, 0, run.batch_hwm);
    let msgs = msg_refs(&run.events);
    assert_eq!(msgs, sent, "the messages in the order they were sent");
    assert_eq!(run.acked_sync_seq, run.batch_hwm);
    let device = client.devices(UserReq { uid: READER }).await.unwrap();
    assert_eq!(device.devices[0].acked_sync_seq, run.batch_hwm);

    // Caught up: the next catch-up brings nothing again.
    let again = client
        .catch_up(
            READER,
            1,
            Some(generation),
            run.batch_hwm,
            true,
            small_pages(),
        )
        .await
        .unwrap();
    assert!(again.events.is_empty());

    // The same stream as the one-page-at-a-time loop of another device.
    let other = register(&client, READER, 2).await;
    let plain = client
        .sync_to_end(READER, 2, Some(other), 0, true)
        .await
        .unwrap();
    assert_eq!(plain.events, run.events);
}

#[tokio::test]
async fn a_pipelined_catch_up_of_a_recovery_lease_resumes_once_and_finishes_it() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    setup(&client).await;
    let generation = register(&client, READER, 1).await;
    let first = client
        .catch_up(READER, 1, Some(generation), 0, true, small_pages())
        .await
        .unwrap();
    // The device lost its last 50 events: it resumes from 50 under a lease.
    let local = first.batch_hwm - 50;
    let recovered = client
        .catch_up(READER, 1, Some(generation), local, true, small_pages())
        .await
        .unwrap();
    assert!(recovered.lease.is_some(), "a recovery lease");
    assert_contiguous(&recovered.events, local, first.batch_hwm);
    let device = &client
        .devices(UserReq { uid: READER })
        .await
        .unwrap()
        .devices[0];
    assert_eq!(device.state, DeviceState::Active, "the lease is finished");
    assert_eq!(device.acked_sync_seq, first.batch_hwm);
}
