//! Membership changes of a group of `inboxd serve` processes on loopback
//! (`CLUSTER_ADD_NODE`, `CLUSTER_REMOVE_NODE`, `inboxctl cluster
//! add-node|remove-node`):
//! - a fourth node added while clients send catches up, becomes a voter,
//!   and ends with the same state as the others (`inboxd digest`);
//! - a dead member is removed and replaced by a new node, after which the
//!   group survives losing one more original member, with every
//!   acknowledged send present once at its `msg_seq`;
//! - a removed member that still runs becomes a learner and stops
//!   standing for election;
//! - a change that arrives while another runs is refused, and the first
//!   completes;
//! - bad requests (unknown id, an id already a member elsewhere, id 0, a
//!   bad address, the leader itself, the last voter, a follower, the
//!   client token, a daemon without a group) are refused with a clear
//!   error and change nothing.
//!
//! Every wait has a deadline that fails with what was seen.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_server::client::{self, Client, ClientError, GroupClient};
use inbox_tests::group::{changing_hands, send, Group};
use inbox_tests::*;
use inbox_wire::{
    AddNodeReq, ClusterStatus, ConvMember, ErrorCode, RemoveNodeReq, Request, Response,
};

/// How long a test waits for anything the group should do by itself.
const DEADLINE: Duration = Duration::from_secs(40);

/// Two cores: one group of processes at a time.
static ONE_GROUP_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Retries `request` through `group` until a leader answers it (a
/// membership change or an election answers `NOT_LEADER` a while).
async fn until_served(group: &GroupClient, request: Request) -> Response {
    inbox_tests::group::until_served(group, request, DEADLINE, changing_hands).await
}

/// Sends `range` in order, each until acknowledged; returns each one's
/// `msg_seq` by its number.
async fn send_all(group: &GroupClient, range: std::ops::Range<u64>) -> BTreeMap<u64, u64> {
    let mut acked = BTreeMap::new();
    inbox_tests::group::send_all(group, range, DEADLINE, &mut acked).await;
    acked
}

/// A group client that knows every address given.
async fn group_client(addrs: &[SocketAddr]) -> GroupClient {
    GroupClient::connect_members(addrs, ADMIN_TOKEN, None)
        .await
        .expect("a member accepts")
}

/// Users 1 and 2 join conversation 7 (msg_seq 1 and 2).
async fn join_two(group: &GroupClient) {
    for uid in 1..=2 {
        until_served(group, Request::Join(ConvMember { uid, conv: 7 })).await;
    }
}

async fn admin(addr: SocketAddr) -> Client {
    Client::connect(addr, ADMIN_TOKEN)
        .await
        .expect("connect with the admin token")
}

/// The client addresses of the running members.
fn running(group: &Group) -> Vec<SocketAddr> {
    group
        .running()
        .into_iter()
        .map(|n| group.client_addrs[(n - 1) as usize])
        .collect()
}

/// Waits until `done` holds for the running members' statuses.
async fn wait_statuses(
    group: &Group,
    what: &str,
    done: impl Fn(&[(u64, ClusterStatus)]) -> bool,
) -> Vec<(u64, ClusterStatus)> {
    let start = Instant::now();
    loop {
        let all = group.statuses().await;
        if done(&all) {
            return all;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{what}: not within {DEADLINE:?}: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn status_of(all: &[(u64, ClusterStatus)], node: u64) -> &ClusterStatus {
    &all.iter()
        .find(|(n, _)| *n == node)
        .unwrap_or_else(|| panic!("node {node} answers: {all:?}"))
        .1
}

/// The member ids a status lists.
fn member_ids(status: &ClusterStatus) -> Vec<u64> {
    status.members.iter().map(|m| m.node_id).collect()
}

/// `CLUSTER_ADD_NODE` for `node` of `group`, sent to `via`.
async fn add_node(group: &Group, via: SocketAddr, node: u64) -> Result<ClusterStatus, ClientError> {
    let (raft_addr, client_addr) = group.addrs(node);
    admin(via)
        .await
        .cluster_add_node(AddNodeReq {
            node_id: node,
            raft_addr,
            client_addr,
        })
        .await
}

/// `inboxctl cluster ARGS --addr ADDR --json`: its exit success and the
/// JSON it printed.
fn inboxctl(addr: SocketAddr, args: &[&str]) -> (bool, serde_json::Value) {
    let out = Command::new(inboxd_binary().with_file_name("inboxctl"))
        .args([
            "--addr",
            &addr.to_string(),
            "--token",
            ADMIN_TOKEN,
            "--json",
        ])
        .arg("cluster")
        .args(args)
        .output()
        .expect("run inboxctl");
    let text = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("inboxctl printed {text:?} ({e}); stderr {out:?}"));
    (out.status.success(), json)
}

/// Every acknowledged send is in the conversation exactly once, at the
/// `msg_seq` it was acknowledged with; the history has no gap.
async fn assert_history(group: &GroupClient, acked: &BTreeMap<u64, u64>, sends: usize) {
    let leader = group.client().await;
    let history = all_history(&leader, 1, 7).await;
    let seqs: Vec<u64> = history.iter().map(|m| m.msg_seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "a gap");
    assert_eq!(history.len(), 2 + sends, "two joins and {sends} sends");
    for (i, seq) in acked {
        let m = &history[(*seq - 1) as usize];
        assert_eq!(m.payload, Bytes::from(format!("message {i}")), "seq {seq}");
    }
    // The joins are the first two; every send is there once.
    let mut payloads: Vec<&Bytes> = history[2..].iter().map(|m| &m.payload).collect();
    payloads.sort();
    payloads.dedup();
    assert_eq!(payloads.len(), sends, "a send stored twice");
}

/// Once every running member has applied the leader's last index, stops
/// them and compares their `inboxd digest`s.
async fn assert_same_state(group: &mut Group) {
    let digests = group.stop_and_digest().await;
    assert!(
        digests.windows(2).all(|w| w[0].1 == w[1].1),
        "the members' states differ: {digests:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_node_added_under_load_catches_up_and_votes() {
    let _one = ONE_GROUP_AT_A_TIME.lock().await;
    let mut group = Group::start(3);
    let leader = group.leader().await;
    let clients = group_client(&group.client_addrs).await;
    join_two(&clients).await;
    let mut acked = send_all(&clients, 0..50).await;

    // Four writers go on sending through the change, each send retried
    // until acknowledged (writer w sends 100 + w * 100000 on).
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let (stop, addrs) = (Arc::clone(&stop), group.client_addrs.clone());
            tokio::spawn(async move {
                let clients = group_client(&addrs).await;
                let mut acked = BTreeMap::new();
                let mut i = 100 + w * 100_000;
                while !stop.load(Ordering::Relaxed) {
                    acked.extend(send_all(&clients, i..i + 1).await);
                    i += 1;
                }
                acked
            })
        })
        .collect();

    // The new node waits, outside any membership, until it is added.
    let node = group.start_new_member();
    let before = group
        .daemon(node)
        .client()
        .await
        .cluster_status(inbox_wire::Empty {})
        .await
        .expect("CLUSTER_STATUS");
    assert_eq!(
        (before.role.as_str(), before.leader, before.members.len()),
        ("learner", None, 0),
        "a node started without --bootstrap waits to be added: {before:?}"
    );

    let leader_addr = group.client_addrs[(leader - 1) as usize];
    let status = add_node(&group, leader_addr, node)
        .await
        .expect("the leader adds node 4");
    assert_eq!(member_ids(&status), vec![1, 2, 3, node], "{status:?}");

    // A voter reports itself a follower (a learner says "learner"), and
    // every member lists it.
    wait_statuses(&group, "node 4 votes and every member lists it", |all| {
        status_of(all, node).role == "follower"
            && all
                .iter()
                .all(|(_, s)| member_ids(s) == vec![1, 2, 3, node])
    })
    .await;
    // More sends, committed by the group of four, then the load stops.
    acked.extend(send_all(&clients, 50..60).await);
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        let during = writer.await.expect("the writer ran");
        assert!(!during.is_empty(), "a writer got no send acknowledged");
        acked.extend(during);
    }
    println!("sends acknowledged: {}", acked.len());
    assert_history(&clients, &acked, acked.len()).await;

    // A member killed and restarted after the change reads the new
    // membership back from its own log.
    let follower = (1..=3).find(|n| *n != leader).expect("a follower");
    group.kill(follower);
    group.restart(follower);
    wait_statuses(&group, "the restarted member knows node 4", |all| {
        let s = status_of(all, follower);
        s.role == "follower" && member_ids(s) == vec![1, 2, 3, node]
    })
    .await;
    drop(clients);
    assert_same_state(&mut group).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_replaced_and_the_group_survives_losing_another() {
    let _one = ONE_GROUP_AT_A_TIME.lock().await;
    // A snapshot every 10 rounds, the log kept 10 rounds behind it: the
    // new node catches up by snapshot.
    let mut group = Group::start_with(3, &["--snapshot-every", "10"]);
    group.leader().await;
    let clients = group_client(&group.client_addrs).await;
    join_two(&clients).await;
    let mut acked = send_all(&clients, 0..20).await;

    // Node 3's machine dies.
    group.kill(3);
    let leader = group.leader().await;
    let follower = if leader == 1 { 2 } else { 1 };
    let follower_addr = group.client_addrs[(follower - 1) as usize];

    // The operator removes it and adds a new node on an empty directory,
    // both through inboxctl asking a follower (it follows NOT_LEADER).
    let (ok, removed) = inboxctl(follower_addr, &["remove-node", "3"]);
    assert!(ok, "{removed}");
    assert_eq!(
        removed["members"].as_array().map(Vec::len),
        Some(2),
        "{removed}"
    );
    // Two voters of two commit alone. Their logs move past a snapshot and
    // are purged: the new node can only catch up by snapshot.
    acked.extend(send_all(&clients, 20..40).await);
    group
        .daemon(leader)
        .wait_metric_above("inboxd_raft_purged_index", 0, DEADLINE)
        .await;
    let node = group.start_new_member();
    let (raft_addr, client_addr) = group.addrs(node);
    let (ok, added) = inboxctl(
        follower_addr,
        &["add-node", &node.to_string(), &raft_addr, &client_addr],
    );
    assert!(ok, "{added}");
    let ids: Vec<u64> = added["members"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["node_id"].as_u64()).collect())
        .unwrap_or_default();
    assert_eq!(ids, vec![1, 2, node], "{added}");
    wait_statuses(&group, "node 4 votes", |all| {
        status_of(all, node).role == "follower"
    })
    .await;
    assert!(
        group.daemon(node).snapshots_installed().await >= 1,
        "node {node} caught up without an install"
    );
    acked.extend(send_all(&clients, 40..60).await);

    // The leader, an original member, dies too: the original member left
    // and node 4 are two of the three voters, and elect a leader.
    group.kill(leader);
    let survivors = running(&group);
    let clients = group_client(&survivors).await;
    acked.extend(send_all(&clients, 60..80).await);
    let new_leader = group.leader().await;
    assert_ne!(new_leader, leader);
    assert_history(&clients, &acked, 80).await;
    let all = group.statuses().await;
    assert_eq!(
        member_ids(status_of(&all, new_leader)),
        vec![1, 2, node],
        "{all:?}"
    );
    drop(clients);
    assert_same_state(&mut group).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_member_that_still_runs_stops_standing_for_election() {
    let _one = ONE_GROUP_AT_A_TIME.lock().await;
    let group = Group::start(3);
    let leader = group.leader().await;
    let removed = if leader == 3 { 2 } else { 3 };
    let other = 6 - leader - removed;
    let leader_addr = group.client_addrs[(leader - 1) as usize];
    let status = admin(leader_addr)
        .await
        .cluster_remove_node(RemoveNodeReq { node_id: removed })
        .await
        .expect("the leader removes a live follower");
    let mut left = vec![leader, other];
    left.sort_unstable();
    assert_eq!(member_ids(&status), left, "{status:?}");

    // It heard that it is a learner now: it never stands for election,
    // so its term stays where it is while elections would have run.
    let all = wait_statuses(&group, "the removed member is a learner", |all| {
        status_of(all, removed).role == "learner"
    })
    .await;
    let term = status_of(&all, removed).term;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let all = group.statuses().await;
    let seen = status_of(&all, removed);
    assert_eq!(
        (seen.role.as_str(), seen.term),
        ("learner", term),
        "the removed member stood for election: {all:?}"
    );
    assert_eq!(status_of(&all, leader).role, "leader", "{all:?}");

    // It answers NOT_LEADER naming the leader; the two left commit alone.
    let err = admin(group.client_addrs[(removed - 1) as usize])
        .await
        .call(send(0))
        .await
        .expect_err("a removed member serves no write");
    assert_eq!(err.code(), Some(ErrorCode::NotLeader), "{err}");
    assert_eq!(client::leader_addr(&err), Some(leader_addr), "{err}");
    let clients = group_client(&[leader_addr]).await;
    join_two(&clients).await;
    send_all(&clients, 0..5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_arriving_during_another_is_refused_and_the_first_completes() {
    let _one = ONE_GROUP_AT_A_TIME.lock().await;
    let mut group = Group::start(3);
    let leader = group.leader().await;
    let leader_addr = group.client_addrs[(leader - 1) as usize];

    // Node 4 is added before it runs: it cannot catch up yet, so the
    // change waits with node 4 a learner.
    let node = group.new_member();
    let first = {
        let (raft_addr, client_addr) = group.addrs(node);
        let client = admin(leader_addr).await;
        tokio::spawn(async move {
            client
                .cluster_add_node(AddNodeReq {
                    node_id: node,
                    raft_addr,
                    client_addr,
                })
                .await
        })
    };
    wait_statuses(&group, "node 4 is a learner", |all| {
        member_ids(status_of(all, leader)).contains(&node)
    })
    .await;
    let err = admin(leader_addr)
        .await
        .cluster_remove_node(RemoveNodeReq { node_id: 3 })
        .await
        .expect_err("one change at a time");
    assert_eq!(err.code(), Some(ErrorCode::Conflict), "{err}");
    assert!(err.to_string().contains("in progress"), "{err}");
    assert!(!first.is_finished(), "the first change waits for node 4");

    // Node 4 starts: it catches up, and the first change completes.
    group.restart(node);
    let status = tokio::time::timeout(DEADLINE, first)
        .await
        .expect("the first change completes once node 4 runs")
        .expect("the task ran")
        .expect("node 4 added");
    assert_eq!(member_ids(&status), vec![1, 2, 3, node], "{status:?}");
    wait_statuses(&group, "node 4 votes", |all| {
        status_of(all, node).role == "follower"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_membership_requests_are_refused_and_change_nothing() {
    let _one = ONE_GROUP_AT_A_TIME.lock().await;
    let group = Group::start(3);
    let leader = group.leader().await;
    let leader_addr = group.client_addrs[(leader - 1) as usize];
    let before = group.statuses().await;
    let client = admin(leader_addr).await;
    let (raft2, client2) = group.addrs(2);
    let add = |node_id: u64, raft_addr: &str, client_addr: &str| AddNodeReq {
        node_id,
        raft_addr: raft_addr.into(),
        client_addr: client_addr.into(),
    };
    let refusals = [
        (
            client
                .cluster_remove_node(RemoveNodeReq { node_id: 9 })
                .await,
            "not a member",
        ),
        (
            client
                .cluster_add_node(add(2, "127.0.0.1:9", "127.0.0.1:10"))
                .await,
            "already a member",
        ),
        (
            client
                .cluster_add_node(add(0, "127.0.0.1:9", "127.0.0.1:10"))
                .await,
            "node id 0",
        ),
        (
            client.cluster_add_node(add(4, "", "127.0.0.1:10")).await,
            "not HOST:PORT",
        ),
        (
            client
                .cluster_add_node(add(4, &raft2, "127.0.0.1:10"))
                .await,
            "shares",
        ),
        (
            client
                .cluster_remove_node(RemoveNodeReq { node_id: leader })
                .await,
            "cannot remove itself",
        ),
    ];
    for (answer, why) in refusals {
        let err = answer.expect_err(why);
        assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{why}: {err}");
        assert!(err.to_string().contains(why), "{why}: {err}");
    }
    // A voter added again at its own addresses: nothing to do.
    let same = client
        .cluster_add_node(add(2, &raft2, &client2))
        .await
        .expect("already a voter there");
    assert_eq!(member_ids(&same), vec![1, 2, 3]);

    // A follower names the leader; the client token may not ask.
    let follower = if leader == 1 { 2 } else { 1 };
    let follower_addr = group.client_addrs[(follower - 1) as usize];
    let err = admin(follower_addr)
        .await
        .cluster_remove_node(RemoveNodeReq { node_id: 3 })
        .await
        .expect_err("a follower does not change the membership");
    assert_eq!(err.code(), Some(ErrorCode::NotLeader), "{err}");
    assert_eq!(client::leader_addr(&err), Some(leader_addr), "{err}");
    let err = group
        .daemon(leader)
        .user_client()
        .await
        .cluster_remove_node(RemoveNodeReq { node_id: 3 })
        .await
        .expect_err("an admin request");
    assert_eq!(err.code(), Some(ErrorCode::Forbidden), "{err}");

    // Nothing changed: the same members at the same addresses, the same
    // leader and term everywhere, and the group still commits.
    let after = group.statuses().await;
    for ((node, a), (_, b)) in before.iter().zip(&after) {
        let view = |s: &ClusterStatus| {
            let members: Vec<_> = s
                .members
                .iter()
                .map(|m| (m.node_id, m.raft_addr.clone(), m.client_addr.clone()))
                .collect();
            (s.term, s.leader, members)
        };
        assert_eq!(view(a), view(b), "node {node}");
    }
    let clients = group_client(&[leader_addr]).await;
    join_two(&clients).await;
    send_all(&clients, 0..3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_voter_is_not_removed_and_a_single_daemon_has_no_group() {
    let _one = ONE_GROUP_AT_A_TIME.lock().await;
    let group = Group::start(1);
    assert_eq!(group.leader().await, 1);
    let err = admin(group.client_addrs[0])
        .await
        .cluster_remove_node(RemoveNodeReq { node_id: 1 })
        .await
        .expect_err("the last voter stays");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{err}");
    assert!(err.to_string().contains("last voter"), "{err}");
    let all = group.statuses().await;
    assert_eq!(member_ids(&all[0].1), vec![1]);
    assert_eq!(all[0].1.role, "leader");

    let dir = data_dir();
    let single = Daemon::start(dir.path());
    let client = single.client().await;
    let err = client
        .cluster_remove_node(RemoveNodeReq { node_id: 1 })
        .await
        .expect_err("no group");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{err}");
    assert!(
        err.to_string().contains("not in a replicated group"),
        "{err}"
    );
    let err = client
        .cluster_add_node(AddNodeReq {
            node_id: 2,
            raft_addr: "127.0.0.1:9".into(),
            client_addr: "127.0.0.1:10".into(),
        })
        .await
        .expect_err("no group");
    assert!(
        err.to_string().contains("not in a replicated group"),
        "{err}"
    );
    let (ok, json) = inboxctl(single.addr, &["remove-node", "1"]);
    assert!(!ok, "{json}");
    assert_eq!(json["error"], "BAD_REQUEST", "{json}");
    single.stop();
}
