//! `CLUSTER_STATUS` (`inboxctl cluster status`): every member of a group of
//! three answers for itself, followers included; they agree on the term and
//! the leader; the leader reports each member's matched index, and once the
//! group is idle every member has caught up (lag 0); the metrics endpoint
//! carries the same figures (`inboxd_raft_*`), and the commit path's
//! counters show the leader timed its rounds and each follower its
//! appends. A single daemon answers role "single" and exports no raft
//! metrics. Admin only. Every member answers `STATS` for its own store,
//! and once idle the members' counts are equal.

use std::process::Command;
use std::time::{Duration, Instant};

use inbox_server::client::Client;
use inbox_tests::group::Group;
use inbox_tests::*;
use inbox_wire::{ClusterStatus, ConvMember, Empty, ErrorCode};

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_reports_the_same_leader_and_term_and_the_leader_reports_each_members_lag() {
    let group = Group::start(3);
    let leader = group.leader().await;
    let addrs = group.client_addrs.clone();
    let statuses = || async {
        group
            .statuses()
            .await
            .into_iter()
            .map(|(_, s)| s)
            .collect::<Vec<ClusterStatus>>()
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
        let all = statuses().await;
        // Every member applied the leader's head, and the leader has heard
        // so (it learns a follower's match from the next append's answer).
        let lead = &all[(leader - 1) as usize];
        let head = lead.last_log_index;
        if all.iter().all(|s| s.last_applied_index == head)
            && lead.members.iter().all(|m| m.matched_index == Some(head))
        {
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
            let i = (member.node_id - 1) as usize;
            assert_eq!(member.client_addr, group.client_addrs[i].to_string());
            assert_eq!(member.raft_addr, group.raft_addrs[i].to_string());
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
    let leader_metrics = group.daemon(leader).scrape().await;
    assert!(
        leader_metrics.contains("inboxd_raft_is_leader 1"),
        "{leader_metrics}"
    );
    assert!(
        leader_metrics.contains(&format!("inboxd_raft_term {}", lead.term)),
        "{leader_metrics}"
    );
    // The leader keeps the five joins' entries (and raft's own) in memory
    // for replication, with the bytes of their rounds.
    let cached = metric(&leader_metrics, "inboxd_raft_entry_cache_entries");
    let cached_bytes = metric(&leader_metrics, "inboxd_raft_entry_cache_bytes");
    assert!(cached >= Some(5), "{leader_metrics}");
    assert!(
        cached_bytes.is_some_and(|b| b > 0 && b <= 32 << 20),
        "{leader_metrics}"
    );
    // The commit path: the leader timed each of the five joins from its
    // proposal to its commit.
    let committed = metric(&leader_metrics, "inboxd_raft_rounds_committed_total");
    assert!(committed >= Some(5), "{leader_metrics}");
    assert!(
        metric_f64(&leader_metrics, "inboxd_raft_round_commit_seconds_total")
            .is_some_and(|s| s > 0.0),
        "{leader_metrics}"
    );
    for follower in (1..=3u64).filter(|n| *n != leader) {
        assert!(
            leader_metrics.contains(&format!(
                "inboxd_raft_follower_lag_entries{{node=\"{follower}\"}} 0"
            )),
            "{leader_metrics}"
        );
        let metrics = group.daemon(follower).scrape().await;
        assert!(metrics.contains("inboxd_raft_is_leader 0"), "{metrics}");
        assert!(
            metrics.contains(&format!("inboxd_raft_leader_id {leader}")),
            "{metrics}"
        );
        assert!(
            !metrics.contains("inboxd_raft_follower_lag_entries"),
            "{metrics}"
        );
        // Each follower appended the joins' entries (and raft's own) and
        // timed every append until it was durable; it proposed nothing.
        let appends = metric(&metrics, "inboxd_raft_appends_total").unwrap_or(0);
        let entries = metric(&metrics, "inboxd_raft_appended_entries_total").unwrap_or(0);
        assert!(
            appends >= 1 && entries >= 5 && entries >= appends,
            "{metrics}"
        );
        assert!(
            metric_f64(&metrics, "inboxd_raft_append_durable_seconds_total")
                .is_some_and(|s| s > 0.0),
            "{metrics}"
        );
        assert_eq!(
            metric(&metrics, "inboxd_raft_rounds_committed_total"),
            Some(0),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_answers_stats_and_idle_members_count_the_same() {
    let group = Group::start(3);
    let leader = group.leader().await;
    let client = group.daemon(leader).client().await;
    for uid in 1..=4 {
        client
            .join(ConvMember { conv: 5, uid })
            .await
            .expect("join");
    }
    let start = Instant::now();
    loop {
        let mut counts = Vec::new();
        for n in 1..=3 {
            let s = group
                .daemon(n)
                .client()
                .await
                .stats(Empty {})
                .await
                .unwrap_or_else(|e| panic!("STATS on member {n}: {e}"));
            counts.push((s.users, s.conversations, s.devices, s.messages));
        }
        if counts.iter().all(|c| *c == counts[0]) && counts[0].0 == 4 {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "members' STATS did not agree within {DEADLINE:?}: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
