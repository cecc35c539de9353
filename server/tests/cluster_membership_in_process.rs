//! Membership changes with engines in one process, over an in-memory
//! network, while senders write to the leader's engine directly (so that
//! rounds keep arriving at the engine while a change pauses the leader's
//! writes, and rounds made but never handed to raft must be discarded):
//! a fourth node is added and a member removed, every send acknowledged is
//! stored once, and the nodes of the final membership converge on the same
//! replicated state.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{join, peer, send, Group, DEADLINE};
use inbox_engine::*;
use inbox_wire::{AddNodeReq, RemoveNodeReq};

/// Sends `cmid` from user 1 to conversation 10 at whichever node leads,
/// until acknowledged (a retry of a kept round answers as a duplicate);
/// returns its `msg_seq` and how many attempts were refused.
async fn send_until_acked(g: &Group, cmid: u128) -> (u64, u32) {
    let start = Instant::now();
    let mut refused = 0;
    loop {
        let ib = g.nodes[&g.leader().await].inbox();
        match send(ib, 1, cmid).await {
            Ok(r) => return (r.msg_seq.0, refused),
            Err(Error::NotLeader(_)) => {
                refused += 1;
                assert!(start.elapsed() < DEADLINE, "send {cmid} never acknowledged");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Err(e) => panic!("send {cmid}: {e}"),
        }
    }
}

/// Conversation 10 as user 1 sees it: `(msg_seq, payload)`, newest
/// first, read in pages.
fn history(ib: &Inbox) -> Vec<(u64, Bytes)> {
    let mut out = Vec::new();
    let mut before = None;
    loop {
        let page = ib.history(Uid(1), ConvId(10), before, 500).unwrap();
        out.extend(
            page.messages
                .iter()
                .map(|m| (m.msg_seq.0, m.payload.clone())),
        );
        match page.messages.last() {
            Some(m) if page.has_more => before = Some(m.msg_seq),
            _ => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_change_while_the_leaders_engine_takes_writes() {
    let mut g = Group::three().await;
    let first = g.leader().await;
    join(g.nodes[&first].inbox(), 1).await;
    g.start_nodes([4]).await;
    let g = Arc::new(g);

    // Four senders write straight to the engine, pipelining nothing but
    // running side by side, through both changes.
    let stop = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..4u128)
        .map(|s| {
            let (g, stop) = (Arc::clone(&g), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut acked = Vec::new();
                let mut refused = 0;
                let mut cmid = s * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    let (seq, r) = send_until_acked(&g, cmid).await;
                    acked.push((seq, cmid));
                    refused += r;
                    cmid += 1;
                }
                (acked, refused)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let leader = g.leader().await;
    let status = g.nodes[&leader]
        .handle()
        .add_node(AddNodeReq {
            node_id: 4,
            raft_addr: peer(4).raft_addr,
            client_addr: peer(4).client_addr,
        })
        .await
        .expect("node 4 added");
    let ids: Vec<u64> = status.members.iter().map(|m| m.node_id).collect();
    assert_eq!(ids, vec![1, 2, 3, 4]);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let leader = g.leader().await;
    let removed = (1..=3).find(|id| *id != leader).unwrap();
    let status = g.nodes[&leader]
        .handle()
        .remove_node(RemoveNodeReq { node_id: removed })
        .await
        .expect("a follower removed");
    assert!(status.members.iter().all(|m| m.node_id != removed));
    tokio::time::sleep(Duration::from_millis(300)).await;

    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    let mut refused = 0;
    for s in senders {
        let (a, r) = s.await.unwrap();
        assert!(!a.is_empty(), "a sender got nothing acknowledged");
        acked.extend(a);
        refused += r;
    }

    // Every acknowledged send is stored once, at its msg_seq, with no gap
    // (the join is msg_seq 1).
    let left: Vec<u64> = (1..=4).filter(|id| *id != removed).collect();
    let (index, _) = g.converged_among(&left).await;
    let leader = g.leader().await;
    let mut stored = history(&g.nodes[&leader].inbox());
    stored.sort();
    assert_eq!(
        stored.len(),
        acked.len() + 1,
        "a send stored twice, or one lost"
    );
    for (i, (seq, _)) in stored.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1, "a gap");
    }
    for (seq, cmid) in &acked {
        assert_eq!(
            stored[(*seq - 1) as usize].1,
            Bytes::from(format!("message {cmid}")),
            "msg_seq {seq}"
        );
    }
    println!(
        "sends acknowledged {}, refused attempts {refused}, replication index {index}",
        acked.len()
    );
    let Ok(g) = Arc::try_unwrap(g) else {
        panic!("the senders hold the group");
    };
    g.shutdown().await;
}
