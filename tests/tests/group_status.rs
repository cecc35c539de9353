//! `CLUSTER_STATUS` (`inboxctl cluster status`): every member of a group of
//! three answers for itself, followers included; they agree on the term and
//! the leader; the leader reports each member's matched index, and once the
//! group is idle every member has caught up (lag 0); the metrics endpoint
//! carries the same figures (`inboxd_raft_*`). A single daemon answers
//! role "single" and exports no raft metrics. Admin only.

use std::process::Command;
use std::time::{Duration, Instant};

use inbox_server::client::Client;
use inbox_tests::*;
use inbox_wire::{ClusterStatus, ConvMember, Empty, ErrorCode};

const DEADLINE: Duration = Duration::from_secs(30);

fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

async fn statuses(addrs: &[std::net::SocketAddr]) -> Vec<ClusterStatus> {
    let mut all = Vec::new();
    for addr in addrs {
        let client = Client::connect(*addr, ADMIN_TOKEN).await.expect("connect");
        all.push(
            client
                .cluster_status(Empty {})
                .await
                .expect("CLUSTER_STATUS"),
        );
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_reports_the_same_leader_and_term_and_the_leader_reports_each_members_lag() {
    let ports = free_ports(6);
    let client_addr = |i: usize| format!("127.0.0.1:{}", ports[i - 1]);
    let raft_addr = |i: usize| format!("127.0.0.1:{}", ports[i + 2]);
    let peers = (1..=3)
        .map(|i| format!("{i}={}/{}", raft_addr(i), client_addr(i)))
        .collect::<Vec<_>>()
        .join(",");
    let dirs: Vec<_> = (0..3).map(|_| data_dir()).collect();
    let daemons: Vec<Daemon> = (1..=3)
        .map(|i| {
            let (id, raft, listen) = (i.to_string(), raft_addr(i), client_addr(i));
            Daemon::start_with(
                dirs[i - 1].path(),
                &[
                    "--node-id",
                    &id,
                    "--raft-listen",
                    &raft,
                    "--peers",
                    &peers,
                    "--listen",
                    &listen,
                ],
            )
        })
        .collect();
    let addrs: Vec<std::net::SocketAddr> =
        (1..=3).map(|i| client_addr(i).parse().unwrap()).collect();

    // Wait for a leader every member knows.
    let start = Instant::now();
    let leader = loop {
        let all = statuses(&addrs).await;
        let leaders: Vec<&ClusterStatus> = all.iter().filter(|s| s.role == "leader").collect();
        if let [leader] = leaders.as_slice() {
            if all.iter().all(|s| s.leader == Some(leader.node_id)) {
                break leader.node_id;
            }
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no leader known to all within {DEADLINE:?}: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let leader_addr = addrs[(leader - 1) as usize];

    // Some writes, then wait until every member has applied them.
    let client = Client::connect(leader_addr, ADMIN_TOKEN).await.unwrap();
    for uid in 1..=5 {
        client
            .join(ConvMember { conv: 9, uid })
            .await
            .expect("join");
    }
    let start = Instant::now();
    let all = loop {
        let all = statuses(&addrs).await;
        let head = all[(leader - 1) as usize].last_log_index;
        if all.iter().all(|s| s.last_applied_index == head) {
            break all;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "members did not catch up within {DEADLINE:?}: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let lead = &all[(leader - 1) as usize];
    assert!(lead.last_log_index >= 5, "{lead:?}");
    assert!(lead.millis_since_quorum_ack.is_some(), "{lead:?}");
    for status in &all {
        assert_eq!(status.term, lead.term, "{all:?}");
        assert_eq!(status.leader, Some(leader), "{all:?}");
        let ids: Vec<u64> = status.members.iter().map(|m| m.node_id).collect();
        assert_eq!(ids, vec![1, 2, 3], "{status:?}");
        for member in &status.members {
            assert_eq!(member.client_addr, client_addr(member.node_id as usize));
            assert_eq!(member.raft_addr, raft_addr(member.node_id as usize));
            if status.node_id == leader {
                // Idle and caught up: nothing left to replicate.
                assert_eq!(
                    member.matched_index,
                    Some(lead.last_log_index),
                    "{status:?}"
                );
            } else {
                assert_eq!(member.matched_index, None, "{status:?}");
                assert_eq!(status.role, "follower", "{status:?}");
            }
        }
    }

    // The same figures on each member's metrics endpoint.
    let leader_metrics = daemons[(leader - 1) as usize].scrape().await;
    assert!(
        leader_metrics.contains("inboxd_raft_is_leader 1"),
        "{leader_metrics}"
    );
    assert!(
        leader_metrics.contains(&format!("inboxd_raft_term {}", lead.term)),
        "{leader_metrics}"
    );
    for follower in (1..=3u64).filter(|n| *n != leader) {
        assert!(
            leader_metrics.contains(&format!(
                "inboxd_raft_follower_lag_entries{{node=\"{follower}\"}} 0"
            )),
            "{leader_metrics}"
        );
        let metrics = daemons[(follower - 1) as usize].scrape().await;
        assert!(metrics.contains("inboxd_raft_is_leader 0"), "{metrics}");
        assert!(
            metrics.contains(&format!("inboxd_raft_leader_id {leader}")),
            "{metrics}"
        );
        assert!(
            !metrics.contains("inboxd_raft_follower_lag_entries"),
            "{metrics}"
        );
    }

    // inboxctl against a follower: the same view, with each lag on the leader.
    let follower_addr = addrs[(leader % 3) as usize];
    let inboxctl = inboxd_binary().with_file_name("inboxctl");
    let run = |addr: std::net::SocketAddr, token: &str| {
        Command::new(&inboxctl)
            .args(["--addr", &addr.to_string(), "--token", token, "--json"])
            .args(["cluster", "status"])
            .output()
            .expect("run inboxctl")
    };
    let out = run(follower_addr, ADMIN_TOKEN);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"follower\""), "{text}");
    let out = run(leader_addr, ADMIN_TOKEN);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("\"lag\":0"), "{text}");
    let forbidden = run(leader_addr, TOKEN);
    assert!(!forbidden.status.success());
    assert!(String::from_utf8_lossy(&forbidden.stdout).contains("FORBIDDEN"));
}

#[tokio::test]
async fn a_single_daemon_answers_role_single_and_only_to_the_admin_token() {
    let dir = data_dir();
    let daemon = Daemon::start(dir.path());
    let status = daemon
        .client()
        .await
        .cluster_status(Empty {})
        .await
        .expect("CLUSTER_STATUS");
    assert_eq!(
        status,
        ClusterStatus {
            role: "single".into(),
            ..ClusterStatus::default()
        }
    );
    let refused = daemon.user_client().await.cluster_status(Empty {}).await;
    assert_eq!(
        refused.err().and_then(|e| e.code()),
        Some(ErrorCode::Forbidden)
    );
    let metrics = daemon.scrape().await;
    assert!(!metrics.contains("inboxd_raft_"), "{metrics}");
}
