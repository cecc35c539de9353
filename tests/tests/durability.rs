//! Stopping the daemon in the middle of load: every request that got a
//! reply is durable after a SIGTERM, and every acknowledged send is present
//! exactly once after a kill -9.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use inbox_server::client::Client;
use inbox_tests::{all_history, Daemon};
use inbox_wire::*;

const WORKERS: u64 = 8;
const CONV_BASE: u64 = 100;

/// One send per worker at a time, each worker in its own conversation,
/// until the daemon goes away. Returns every send (its key, its payload)
/// with the reply it got, if any.
async fn load_until_stopped(client: Arc<Client>) -> Vec<(u64, u128, Result<SendReply, ()>)> {
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..WORKERS {
        let client = Arc::clone(&client);
        tasks.spawn(async move {
            let conv = CONV_BASE + worker;
            let mut sends = Vec::new();
            for i in 0u128.. {
                let key = (u128::from(worker) << 64) | i;
                let reply = client
                    .send(SendReq {
                        conv,
                        sender: 1,
                        client_msg_id: key,
                        msg_type: 1,
                        payload: Bytes::from(format!("{key:x}").into_bytes()),
                    })
                    .await;
                let failed = reply.is_err();
                sends.push((conv, key, reply.map_err(|_| ())));
                if failed {
                    break;
                }
            }
            sends
        });
    }
    tasks.join_all().await.into_iter().flatten().collect()
}

async fn start_load(
    daemon: &Daemon,
) -> (
    Arc<Client>,
    tokio::task::JoinHandle<Vec<(u64, u128, Result<SendReply, ()>)>>,
) {
    let client = Arc::new(daemon.client().await);
    for worker in 0..WORKERS {
        client
            .join(ConvMember {
                conv: CONV_BASE + worker,
                uid: 1,
            })
            .await
            .unwrap();
    }
    let load = tokio::spawn(load_until_stopped(Arc::clone(&client)));
    // Let the load run long enough to have many sends in flight.
    tokio::time::sleep(Duration::from_millis(400)).await;
    (client, load)
}

/// payload → how many times it is stored, per conversation.
async fn stored(client: &Client) -> HashMap<(u64, Bytes), usize> {
    let mut counts = HashMap::new();
    for worker in 0..WORKERS {
        let conv = CONV_BASE + worker;
        for message in all_history(client, 1, conv).await {
            if message.kind == MessageKind::Normal {
                *counts.entry((conv, message.payload)).or_insert(0) += 1;
            }
        }
    }
    counts
}

#[tokio::test]
async fn sigterm_mid_load_every_replied_request_is_durable_after_restart() {
    let dir = inbox_tests::data_dir();
    let mut daemon = Daemon::start(dir.path());
    let (client, load) = start_load(&daemon).await;
    daemon.signal(libc::SIGTERM);
    let status = daemon.wait(Duration::from_secs(30));
    assert!(status.success(), "SIGTERM exits 0: {status:?}");
    let sends = load.await.unwrap();
    drop(client);
    let replied: Vec<_> = sends.iter().filter(|(_, _, r)| r.is_ok()).collect();
    assert!(
        replied.len() > WORKERS as usize,
        "the load ran: {} replies",
        replied.len()
    );

    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let counts = stored(&client).await;
    for (conv, key, _) in replied {
        let payload = Bytes::from(format!("{key:x}").into_bytes());
        assert_eq!(
            counts.get(&(*conv, payload)),
            Some(&1),
            "replied send {key:x} is durable"
        );
    }
}

#[tokio::test]
async fn kill_9_mid_load_every_acknowledged_send_is_present_exactly_once() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let (client, load) = start_load(&daemon).await;
    daemon.crash();
    let sends = load.await.unwrap();
    drop(client);

    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    let counts = stored(&client).await;
    let mut acknowledged = 0;
    for (conv, key, reply) in &sends {
        let payload = Bytes::from(format!("{key:x}").into_bytes());
        let count = counts.get(&(*conv, payload.clone())).copied().unwrap_or(0);
        if reply.is_ok() {
            acknowledged += 1;
            assert_eq!(
                count, 1,
                "acknowledged send {key:x} is present exactly once"
            );
        } else {
            assert!(count <= 1, "an unacknowledged send is present at most once");
            // Retrying it with the same key never makes a second copy.
            client
                .send(SendReq {
                    conv: *conv,
                    sender: 1,
                    client_msg_id: *key,
                    msg_type: 1,
                    payload,
                })
                .await
                .unwrap();
        }
    }
    assert!(
        acknowledged > WORKERS as usize,
        "the load ran: {acknowledged} acknowledged"
    );
    for count in stored(&client).await.values() {
        assert_eq!(*count, 1, "after retries every send is stored exactly once");
    }
}
