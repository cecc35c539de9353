//! Three `inboxd serve` processes on loopback form a group: clients are
//! redirected to the leader, the leader is killed with SIGKILL, a new
//! leader serves within a deadline, and every acknowledged send is there
//! exactly once at its `msg_seq`, with no gap. A member whose data
//! directory was wiped rejoins by the leader's snapshot, and one restarted
//! after its own snapshots rejoins.

use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_server::client::GroupClient;
use inbox_tests::group::{not_leader, send, Group};
use inbox_tests::*;
use inbox_wire::{ConvMember, Empty, Request, Response};

const DEADLINE: Duration = Duration::from_secs(30);

/// Retries `request` through `group` until a leader answers it.
async fn until_served(group: &GroupClient, request: Request) -> Response {
    inbox_tests::group::until_served(group, request, DEADLINE, not_leader).await
}

/// A group client through the first member that accepts a connection.
async fn connect(addrs: &[std::net::SocketAddr]) -> GroupClient {
    for a in addrs {
        if let Ok(g) = GroupClient::connect(*a, ADMIN_TOKEN, None).await {
            return g;
        }
    }
    panic!("no member accepts connections");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_no_acknowledged_send_is_lost() {
    let mut members = Group::start(3);
    let addrs = members.client_addrs.clone();

    // Through the last member: followers redirect to the leader.
    let group = connect(&addrs[2..]).await;
    for uid in 1..=2 {
        until_served(&group, Request::Join(ConvMember { uid, conv: 7 })).await;
    }
    let mut acked = Vec::new();
    for i in 0..20u64 {
        match until_served(&group, send(i)).await {
            Response::Send(r) => acked.push((r.msg_seq, i)),
            other => panic!("{other:?}"),
        }
    }

    // Kill the leader.
    let leader = leading(&addrs).await;
    members.kill(leader as u64 + 1);

    let alive: Vec<_> = (0..3).filter(|n| *n != leader).map(|n| addrs[n]).collect();
    let group = connect(&alive).await;
    // Retried sends are answered as duplicates with their original seqs.
    for i in 15..25u64 {
        match until_served(&group, send(i)).await {
            Response::Send(r) if i < 20 => {
                assert!(r.duplicate, "send {i} was acknowledged before");
                assert_eq!((r.msg_seq, i), acked[i as usize], "send {i}");
            }
            Response::Send(r) => acked.push((r.msg_seq, i)),
            other => panic!("{other:?}"),
        }
    }
    let leader_client = group.client().await;
    let history = all_history(&leader_client, 1, 7).await;
    let seqs: Vec<u64> = history.iter().map(|m| m.msg_seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "a gap");
    for (seq, i) in &acked {
        let m = &history[(*seq - 1) as usize];
        assert_eq!(m.payload, Bytes::from(format!("message {i}")), "seq {seq}");
    }
    assert_eq!(history.len(), 2 + 25, "two joins and 25 distinct sends");
    for d in members.daemons.iter_mut().filter_map(Option::take) {
        d.stop();
    }
}

/// Which member says it leads (`CLUSTER_STATUS`), among `addrs`. (Every
/// member answers a `PING` itself, followers too, so a ping says nothing.)
async fn leading(addrs: &[std::net::SocketAddr]) -> usize {
    let start = Instant::now();
    loop {
        for (n, a) in addrs.iter().enumerate() {
            if let Ok(c) = inbox_server::client::Client::connect(*a, ADMIN_TOKEN).await {
                if c.cluster_status(Empty {})
                    .await
                    .is_ok_and(|s| s.role == "leader")
                {
                    return n;
                }
            }
        }
        assert!(start.elapsed() < DEADLINE, "no leader within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A group of three with a snapshot every 10 rounds, the log kept 10
/// rounds behind each; users 1 and 2 in conversation 7 and `sends` sends
/// acknowledged. Returns the group, its client, and the node ids of the
/// leader and of the two followers.
async fn snapshotting_group(sends: u64) -> (Group, GroupClient, [u64; 3]) {
    let members = Group::start_with(3, &["--snapshot-every", "10"]);
    let group = connect(&members.client_addrs).await;
    for uid in 1..=2 {
        until_served(&group, Request::Join(ConvMember { uid, conv: 7 })).await;
    }
    for i in 0..sends {
        until_served(&group, send(i)).await;
    }
    let leader = leading(&members.client_addrs).await as u64 + 1;
    let mut followers = (1..=3).filter(|n| *n != leader);
    let (a, b) = (followers.next().unwrap(), followers.next().unwrap());
    (members, group, [leader, a, b])
}

/// Send `i` of a [`snapshotting_group`] (after its two joins and `i`
/// sends), made while one follower is stopped: it is acknowledged only
/// once the other one stores it.
async fn acknowledged_by_the_last_follower(group: &GroupClient, i: u64) {
    let reply = tokio::time::timeout(DEADLINE, until_served(group, send(i)))
        .await
        .expect("the follower left never acknowledged a round");
    let Response::Send(reply) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(reply.msg_seq, 2 + i + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_rejoins_by_snapshot_and_ends_with_the_groups_state() {
    let (mut members, group, [leader, wiped, other]) = snapshotting_group(20).await;

    // The member is killed and loses its log, checkpoints, raft state and
    // snapshot; the others go on.
    members.kill(wiped);
    for name in ["evt", "msg", "checkpoint", "snap"] {
        let _ = std::fs::remove_dir_all(members.dir(wiped).join(name));
    }
    for name in ["raft-meta.json", "raft-snapshot.img"] {
        let _ = std::fs::remove_file(members.dir(wiped).join(name));
    }
    for i in 20..40u64 {
        until_served(&group, send(i)).await;
    }
    // The leader purges behind its snapshots (a snapshot every 10 rounds,
    // the log kept 10 behind): once it has, the entries the wiped member
    // lacks are gone from its log.
    members
        .daemon(leader)
        .wait_metric_above("inboxd_raft_purged_index", 0, DEADLINE)
        .await;
    members.restart(wiped);
    // With the other follower stopped, a send commits only once the
    // wiped member stores it: once it has caught up, which it can only
    // do by installing the leader's snapshot.
    members.kill(other);
    acknowledged_by_the_last_follower(&group, 40).await;
    assert!(
        members.daemon(wiped).snapshots_installed().await >= 1,
        "the wiped member caught up without an install"
    );
    // A round is acknowledged once stored, and applied after: compare the
    // stores only once the rejoined member has applied all the leader has.
    let applied = "inboxd_raft_last_applied_index";
    let leader_applied = members.daemon(leader).metric(applied).await.unwrap_or(0);
    members
        .daemon(wiped)
        .wait_metric_above(applied, leader_applied.saturating_sub(1), DEADLINE)
        .await;
    drop(group);
    for d in members.daemons.iter_mut().filter_map(Option::take) {
        d.crash();
    }
    // Offline, the leader's and the rejoined member's stores hold the
    // same state (every round of both was acknowledged, so durable).
    let digest = |node: u64| {
        let mut c = inbox_engine::InboxConfig::new(members.dir(node));
        c.segment_bytes = 1 << 20;
        c.compaction_interval = None;
        let ib = inbox_engine::Inbox::open(c).unwrap();
        let d = (ib.replica_index(), ib.replica_digest());
        ib.shutdown().unwrap();
        d
    };
    assert_eq!(digest(wiped), digest(leader));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_after_its_own_snapshots_rejoins() {
    // The log kept 10 rounds behind each snapshot: a member's snapshot
    // file is always past its purge point.
    let (mut members, group, [_, restarted, other]) = snapshotting_group(30).await;
    let kept = members.dir(restarted).join("raft-snapshot.img");
    let start = Instant::now();
    while !kept.exists() {
        assert!(start.elapsed() < DEADLINE, "the member took no snapshot");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    members.kill(restarted);
    members.restart(restarted);
    // With the other follower stopped, a send commits only once the
    // restarted member stores it: its raft must run again.
    members.kill(other);
    acknowledged_by_the_last_follower(&group, 30).await;
}
