//! A `GroupClient` rides out the death of the member it is connected to:
//! four writers send through one client each, the leader (found by
//! `CLUSTER_STATUS`, so it is the leader that dies) is killed with SIGKILL
//! twice, restarted on its data in between, and no writer ever builds a new
//! client. Every send is acknowledged within the client's patience, and
//! every acknowledged send is stored exactly once at its `msg_seq`, with no
//! gap, on the last leader; nothing else was stored (a retried send whose
//! first reply was lost is answered as a duplicate).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use inbox_server::client::GroupClient;
use inbox_tests::group::{Group, ELECTION_DEADLINE};
use inbox_tests::*;
use inbox_wire::{ConvMember, Request, Response, SendReq};

const WRITERS: u64 = 4;
const CONV: u64 = 5;
const KILLS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_client_keeps_every_send_across_leader_kills_without_a_new_client() {
    let mut group = Group::start(3);
    group.leader().await;
    let members = group.client_addrs.clone();
    let setup = GroupClient::connect_members(&members, ADMIN_TOKEN, None)
        .await
        .expect("a member accepts");
    for uid in 1..=WRITERS {
        setup
            .call(Request::Join(ConvMember { conv: CONV, uid }))
            .await
            .expect("join");
    }

    // (msg_seq, client_msg_id, sender) of every acknowledged send.
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 1..=WRITERS {
        // Every writer starts on a different member: followers redirect.
        let start = members[(w as usize) % members.len()];
        let mut order = vec![start];
        order.extend(members.iter().filter(|m| **m != start));
        let client = GroupClient::connect_members(&order, TOKEN, None)
            .await
            .expect("a member accepts")
            .with_patience(Duration::from_secs(60));
        let (acked, stop) = (Arc::clone(&acked), Arc::clone(&stop));
        writers.push(tokio::spawn(async move {
            let mut n = 0u128;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let client_msg_id = (u128::from(w) << 64) | n;
                let reply = client
                    .call(Request::Send(SendReq {
                        conv: CONV,
                        sender: w,
                        client_msg_id,
                        msg_type: 1,
                        payload: Bytes::from(format!("{w}/{n}")),
                    }))
                    .await
                    .unwrap_or_else(|e| panic!("writer {w}, send {n}: {e}"));
                match reply {
                    Response::Send(r) => acked.lock().unwrap().push((r.msg_seq, client_msg_id, w)),
                    other => panic!("writer {w}: {other:?}"),
                }
                n += 1;
            }
        }));
    }

    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = acked.lock().unwrap().len();
        let leader = group.leader().await;
        group.kill(leader);
        // The writers get on with a new leader, with the same clients.
        let new_leader = group.leader().await;
        assert_ne!(new_leader, leader);
        let deadline = std::time::Instant::now() + ELECTION_DEADLINE;
        while acked.lock().unwrap().len() < before + 20 {
            assert!(
                std::time::Instant::now() < deadline,
                "the writers made no progress after member {leader} was killed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        group.restart(leader);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("a writer panicked");
    }

    let history = group.history_from_leader(1, CONV).await;
    let seqs: Vec<u64> = history.iter().map(|m| m.msg_seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "a gap or a duplicate"
    );
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 40, "only {} sends acknowledged", acked.len());
    for (seq, client_msg_id, sender) in &acked {
        let m = &history[(*seq - 1) as usize];
        let (w, n) = (client_msg_id >> 64, client_msg_id & u128::from(u64::MAX));
        assert_eq!(
            (m.sender, m.payload.clone()),
            (*sender, Bytes::from(format!("{w}/{n}"))),
            "msg_seq {seq}"
        );
    }
    // A retry of a send whose reply was lost is answered as a duplicate,
    // never stored twice: every stored message but the joins was
    // acknowledged once.
    let sends = history
        .iter()
        .filter(|m| m.kind == inbox_wire::MessageKind::Normal)
        .count();
    assert_eq!(sends, acked.len(), "messages stored but never acknowledged");
    println!(
        "{} sends acknowledged across {KILLS} leader kills, {} stored",
        acked.len(),
        history.len()
    );
}
