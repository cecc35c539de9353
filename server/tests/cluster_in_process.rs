//! Three engines in one process, each under raft, over an in-memory
//! network that can cut a node off: a leader is elected, writes are
//! answered only once a quorum stored them, a cut-off leader's rounds are
//! discarded when it rejoins, and every node ends with the same state.

mod common;

use std::sync::Arc;

use common::{join, send, seqs, Group};
use inbox_engine::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_commit_through_raft_and_every_node_converges() {
    let g = Group::three().await;
    let l = g.leader().await;
    for uid in 1..=3 {
        join(g.ib(l), uid).await;
    }
    // Three concurrent senders.
    let mut tasks = Vec::new();
    for sender in 1..=3u64 {
        let ib = g.ib(l);
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..15u128 {
                let r = send(Arc::clone(&ib), sender, sender as u128 * 1000 + i)
                    .await
                    .unwrap();
                seqs.push(r.msg_seq.0);
            }
            seqs
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    acked.sort_unstable();
    // The joins took the first sequence numbers; the sends the next ones,
    // each once, with no gap.
    let first = acked[0];
    assert_eq!(acked, (first..first + 45).collect::<Vec<u64>>());

    // Followers refuse client writes.
    for id in (1..=3).filter(|&id| id != l) {
        let e = send(g.ib(id), 1, 99).await.unwrap_err();
        assert!(matches!(e, Error::NotLeader(_)), "{e:?}");
    }
    g.converged().await;
    for id in 1..=3 {
        assert_eq!(
            seqs(&g.ib(id)),
            (1..first + 45).collect::<Vec<u64>>(),
            "node {id}"
        );
    }
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_off_leaders_round_is_never_acknowledged_and_is_discarded_when_it_rejoins() {
    let g = Group::three().await;
    let old = g.leader().await;
    for uid in 1..=3 {
        join(g.ib(old), uid).await;
    }
    let mut last = 0;
    for i in 0..5u128 {
        last = send(g.ib(old), 1, i).await.unwrap().msg_seq.0;
    }
    g.converged().await;

    // Cut the leader off; a send to it cannot reach a quorum.
    g.router.cut.lock().unwrap().insert(old);
    let lost = tokio::spawn(send(g.ib(old), 2, 500));
    let new = g.leader().await;
    assert_ne!(new, old);
    assert!(!lost.is_finished(), "a round was answered without a quorum");
    // The majority side goes on at the next sequence numbers.
    for i in 0..5u128 {
        let r = send(g.ib(new), 3, 600 + i).await.unwrap();
        assert_eq!(r.msg_seq.0, last + 1 + i as u64);
    }

    // The old leader rejoins: it follows, its round fails NOT_LEADER and
    // is gone from its log, and all nodes converge on the new leader's
    // history.
    g.router.cut.lock().unwrap().clear();
    let e = lost.await.unwrap().unwrap_err();
    assert!(matches!(e, Error::NotLeader(_)), "{e:?}");
    g.converged().await;
    for id in 1..=3 {
        assert_eq!(
            seqs(&g.ib(id)),
            (1..=last + 5).collect::<Vec<u64>>(),
            "node {id}"
        );
    }
    assert_eq!(g.leader().await, new);
    // The retry of the lost send at the new leader is a new message.
    let r = send(g.ib(new), 2, 500).await.unwrap();
    assert_eq!((r.msg_seq.0, r.duplicate), (last + 6, false));
    g.converged().await;
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_that_arrive_together_share_a_read_index_round_and_a_cut_off_leader_refuses_them() {
    let g = Group::three().await;
    let leader = g.leader().await;
    let handle = g.nodes[&leader].handle();
    // Each heartbeat round takes at least 50 ms on the way, so reads that
    // arrive within one round wait for the next together. (Without a
    // delay a round may finish before the next read arrives, and each
    // read then has its own, which is just as correct.)
    *g.router.append_delay.lock().unwrap() = std::time::Duration::from_millis(50);
    let before = handle.read_rounds();
    let reads: Vec<_> = (0..64)
        .map(|_| {
            let h = g.nodes[&leader].handle();
            tokio::spawn(async move { h.read_index().await })
        })
        .collect();
    for r in reads {
        r.await.unwrap().expect("the leader confirms");
    }
    let rounds = handle.read_rounds() - before;
    println!("64 reads confirmed in {rounds} read-index rounds");
    assert!(
        (1..=4).contains(&rounds),
        "64 reads arriving together took {rounds} rounds"
    );
    *g.router.append_delay.lock().unwrap() = std::time::Duration::ZERO;

    // Cut off, it cannot confirm: its reads are refused, never served.
    g.router.cut.lock().unwrap().insert(leader);
    let refused = handle.read_index().await.unwrap_err();
    assert_eq!(
        refused.code,
        inbox_wire::ErrorCode::NotLeader,
        "{refused:?}"
    );
    g.router.cut.lock().unwrap().clear();
    drop(handle);
    g.shutdown().await;
}
