//! The Rust client's pipelined catch-up (PROTOCOL.md, "Pipelined
//! catch-up"): each ACK is in flight while the next page is asked for, an
//! ACK goes with every `ack_every`-th page and the last, and still every
//! event arrives exactly once, in order, and the device ends ACKed at the
//! batch's high-water mark.

use inbox_server::client::{CatchUpOptions, Client, CATCH_UP_ACK_EVERY};
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
        ack_every: 1,
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

#[tokio::test]
async fn a_catch_up_acks_every_nth_page_and_the_last_and_ends_acked_at_the_batch_end() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    setup(&client).await;
    let mut runs = Vec::new();
    // Devices 1, 2 and 3: an ACK every page, every fourth, and the default.
    for (device, ack_every) in [(1, 1), (2, 4), (3, 0)] {
        let generation = register(&client, READER, device).await;
        let options = CatchUpOptions {
            ack_every,
            ..small_pages()
        };
        let run = client
            .catch_up(READER, device, Some(generation), 0, true, options)
            .await
            .unwrap();
        assert!(run.pages > 16, "many pages: {}", run.pages);
        assert_contiguous(&run.events, 0, run.batch_hwm);
        let every = if ack_every == 0 {
            CATCH_UP_ACK_EVERY
        } else {
            ack_every
        };
        // Pages every, 2 x every, ... and the last, once.
        let expected = run.pages / every + u32::from(run.pages % every != 0);
        assert_eq!(
            run.acks, expected,
            "ACKs of {} pages, one every {every}",
            run.pages
        );
        assert_eq!(run.acked_sync_seq, run.batch_hwm);
        runs.push(run);
    }
    assert_eq!(runs[0].acks, runs[0].pages, "1: every page");
    assert!(runs[1].acks < runs[0].acks);
    assert_eq!(runs[1].events, runs[0].events, "the same stream");
    assert_eq!(runs[2].events, runs[0].events, "the same stream");
    let devices = client.devices(UserReq { uid: READER }).await.unwrap();
    for device in &devices.devices {
        assert_eq!(device.acked_sync_seq, runs[0].batch_hwm, "{device:?}");
    }
}

#[tokio::test]
async fn inboxctl_sync_acks_at_the_cadence_it_is_given_and_refuses_a_cadence_of_zero() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    setup(&client).await;
    // 120 messages and the three joins make the reader's backlog; pages
    // of the server's default size (100): two pages, the last ACKed.
    register(&client, READER, 1).await;
    let inboxctl = inbox_tests::inboxd_binary().with_file_name("inboxctl");
    let run = |every: &str| {
        std::process::Command::new(&inboxctl)
            .args(["--addr", &daemon.addr.to_string()])
            .args(["--token", inbox_tests::TOKEN, "--json"])
            .args(["sync", "--uid", &READER.to_string(), "--device", "1"])
            .args(["--ack", "--ack-every", every])
            .output()
            .expect("run inboxctl")
    };
    let refused = run("0");
    assert!(!refused.status.success(), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--ack-every"), "{stderr}");
    let device = client.devices(UserReq { uid: READER }).await.unwrap();
    assert_eq!(
        device.devices[0].acked_sync_seq, 0,
        "the refused run ACKed nothing"
    );

    let out = run("1");
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let pages = json["pages"].as_u64().expect("pages");
    assert!(pages >= 2, "pages: {pages}");
    assert_eq!(json["acks"].as_u64(), Some(pages), "one ACK a page");
    assert_eq!(json["acked_sync_seq"], json["batch_hwm"]);
    let device = client.devices(UserReq { uid: READER }).await.unwrap();
    assert_eq!(
        Some(device.devices[0].acked_sync_seq),
        json["batch_hwm"].as_u64()
    );
}

#[tokio::test]
async fn a_catch_up_with_its_acks_in_sync_acks_every_page_in_one_request_and_ends_at_the_batch_end()
{
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let sent = setup(&client).await;
    let generation = register(&client, READER, 1).await;
    // The default cadence: with the ACKs in SYNC, every page.
    let options = CatchUpOptions {
        ack_in_sync: true,
        ack_every: 0,
        ..small_pages()
    };
    let run = client
        .catch_up(READER, 1, Some(generation), 0, true, options)
        .await
        .unwrap();
    assert!(run.pages > 10, "many pages: {}", run.pages);
    assert_contiguous(&run.events, 0, run.batch_hwm);
    assert_eq!(msg_refs(&run.events), sent);
    assert_eq!(run.acks, run.pages, "every page ACKed, the last on its own");
    assert_eq!(run.acked_sync_seq, run.batch_hwm);

    // Before any ACK of its own, a device holds the ACK its second SYNC
    // carried: a registration, a write queued behind that ACK, has been
    // answered before the devices are read.
    let generation = register(&client, READER, 3).await;
    let page = |local_applied_seq, batch_token, ack_through| SyncReq {
        uid: READER,
        device: 3,
        generation: Some(generation),
        local_applied_seq,
        limit: 7,
        batch_token,
        ack_through,
        ..SyncReq::default()
    };
    let first = client.sync(page(0, None, None)).await.unwrap();
    let carried = page(
        first.next_cursor,
        Some(first.batch_token.clone()),
        Some(first.next_cursor),
    );
    let second = client.sync(carried).await.unwrap();
    assert_eq!(second.events[0].sync_seq(), first.next_cursor + 1);
    register(&client, READER, 4).await;
    let devices = client.devices(UserReq { uid: READER }).await.unwrap();
    let device_3 = devices.devices.iter().find(|d| d.device == 3).unwrap();
    assert_eq!(
        device_3.acked_sync_seq, first.next_cursor,
        "the ACK the second SYNC carried"
    );
}
