//! Writes queued on the engine by all connections together are bounded by
//! `engine_queue_bytes_max`: while the disk is stalled (one round's fsync
//! held), connections that keep sending fill the budget and then wait,
//! instead of queuing without limit; once the disk moves again, every one
//! of those sends is answered and stored, and the budget is all given back.
//!
//! Run with `cargo test -p inbox-tests --features failpoints --test
//! engine_queue_bound` (the `fsync_hold_marker` failpoint).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_tests::{all_history, Daemon};
use inbox_wire::*;

const CONV: u64 = 100;
const SENDER: u64 = 1;
const CONNECTIONS: usize = 4;
const SENDS_PER_CONNECTION: usize = 16;
/// Each body is a little over 2 KiB, so each send costs 3 units of 1 KiB.
const PAYLOAD_BYTES: usize = 2_100;
const QUEUE_BYTES_MAX: u64 = 16 * 1024;
const DEADLINE: Duration = Duration::from_secs(30);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_inboxd-failpoints"))
}

async fn queue_bytes(daemon: &Daemon) -> u64 {
    daemon
        .metric("inboxd_engine_queue_bytes")
        .await
        .expect("the inboxd_engine_queue_bytes gauge")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_disk_fills_the_engine_queue_to_its_bound_and_no_further() {
    let dir = inbox_tests::data_dir();
    let marker = dir.path().join("HOLD");
    let daemon = Daemon::start_binary(
        &binary(),
        dir.path(),
        &[
            "--segment-bytes",
            "1048576",
            "--frame-bytes-max",
            "8192",
            "--engine-queue-bytes-max",
            &QUEUE_BYTES_MAX.to_string(),
        ],
        &[("INBOXD_FAILPOINTS", "fsync_hold_marker=HOLD")],
    );
    let admin = daemon.client().await;
    admin
        .join(ConvMember {
            conv: CONV,
            uid: SENDER,
        })
        .await
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(std::sync::Arc::new(daemon.user_client().await));
    }
    assert_eq!(
        queue_bytes(&daemon).await,
        0,
        "nothing queued before the hold"
    );

    std::fs::write(&marker, b"").unwrap();
    let mut sends = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for n in 0..SENDS_PER_CONNECTION {
            let client = std::sync::Arc::clone(client);
            sends.push(tokio::spawn(async move {
                let mut payload = format!("c{c} n{n} ").into_bytes();
                payload.resize(PAYLOAD_BYTES, b'x');
                client
                    .send(SendReq {
                        conv: CONV,
                        sender: SENDER,
                        client_msg_id: rand::random(),
                        msg_type: 1,
                        payload: Bytes::from(payload),
                    })
                    .await
            }));
        }
    }

    // The budget fills (within one send's cost of the cap) and stays under
    // the cap however long the disk stalls.
    let deadline = Instant::now() + DEADLINE;
    let mut peak = 0;
    loop {
        let held = queue_bytes(&daemon).await;
        assert!(
            held <= QUEUE_BYTES_MAX,
            "{held} bytes queued on the engine, over the {QUEUE_BYTES_MAX}-byte bound"
        );
        peak = peak.max(held);
        if peak > QUEUE_BYTES_MAX - 3 * 1024 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the queue never filled: peak {peak} bytes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = queue_bytes(&daemon).await;
    assert!(held <= QUEUE_BYTES_MAX, "{held} bytes queued after a wait");
    let answered = sends.iter().filter(|s| s.is_finished()).count();
    assert_eq!(answered, 0, "no send is answered while its fsync is held");

    std::fs::remove_file(&marker).unwrap();
    for send in sends {
        tokio::time::timeout(DEADLINE, send)
            .await
            .expect("every send is answered once the disk moves")
            .unwrap()
            .expect("every send succeeds");
    }
    assert_eq!(
        queue_bytes(&daemon).await,
        0,
        "the whole budget is given back"
    );
    let history = all_history(&admin, SENDER, CONV).await;
    let stored = history
        .iter()
        .filter(|m| m.payload.len() == PAYLOAD_BYTES)
        .count();
    assert_eq!(stored, CONNECTIONS * SENDS_PER_CONNECTION);
}
