//! Three engines under raft in one process, talking over raft's TCP port
//! on loopback: a leader is elected, writes commit and every node
//! converges; a peer with the wrong token is refused; connections leave
//! from the node's own raft IP.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{engine_config, DEADLINE};
use inbox_engine::*;
use inbox_server::cluster::network::{serve, source_ip, TcpNetwork};
use inbox_server::cluster::Vote;
use inbox_server::cluster::{default_config, Cluster, Peer};
use openraft::async_runtime::WatchReceiver as _;
use openraft::error::RPCError;
use openraft::network::v2::RaftNetworkV2 as _;
use openraft::network::RPCOption;
use openraft::raft::VoteRequest;
use openraft::RaftNetworkFactory;

const TOKEN: &str = "group-secret";

async fn start() -> (
    BTreeMap<u64, Cluster>,
    BTreeMap<u64, Peer>,
    Vec<tempfile::TempDir>,
) {
    let (nodes, peers, _late) = start_with(default_config(), &[]).await;
    let mut out = BTreeMap::new();
    let mut keep = Vec::new();
    for (id, (node, dir)) in nodes {
        out.insert(id, node);
        keep.push(dir);
    }
    (out, peers, keep)
}

/// A node not started yet: its raft port's listener and its directory.
type Late = (tokio::net::TcpListener, tempfile::TempDir);

/// Three members on loopback; those in `late` are not started (their
/// ports are bound, so their addresses are known).
async fn start_with(
    config: openraft::Config,
    late: &[u64],
) -> (
    BTreeMap<u64, (Cluster, tempfile::TempDir)>,
    BTreeMap<u64, Peer>,
    BTreeMap<u64, Late>,
) {
    let mut listeners = BTreeMap::new();
    let mut peers = BTreeMap::new();
    for id in 1..=3u64 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = Peer {
            raft_addr: l.local_addr().unwrap().to_string(),
            client_addr: format!("client-{id}"),
        };
        peers.insert(id, peer);
        listeners.insert(id, l);
    }
    let mut nodes = BTreeMap::new();
    let mut later = BTreeMap::new();
    for (id, l) in listeners {
        let dir = tempfile::tempdir().unwrap();
        if late.contains(&id) {
            later.insert(id, (l, dir));
            continue;
        }
        let node = run(id, l, dir.path(), config.clone()).await;
        nodes.insert(id, (node, dir));
    }
    let first = nodes.keys().next().copied().unwrap();
    nodes[&first].0.initialize(peers.clone()).await.unwrap();
    (nodes, peers, later)
}

/// Starts node `id` on `dir`, serving its raft port on `l`.
async fn run(
    id: u64,
    l: tokio::net::TcpListener,
    dir: &std::path::Path,
    config: openraft::Config,
) -> Cluster {
    let inbox = Arc::new(Inbox::open(engine_config(dir)).unwrap());
    let net = TcpNetwork::new(Arc::from(TOKEN.as_bytes()));
    let node = Cluster::start(id, inbox, dir, config, net).await.unwrap();
    tokio::spawn(serve(
        l,
        node.raft().clone(),
        node.snapshot_receiver(),
        Arc::from(TOKEN.as_bytes()),
    ));
    node
}

/// The node that leads.
async fn leader(nodes: &BTreeMap<u64, Cluster>) -> u64 {
    common::leader(nodes, HashSet::new).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_over_tcp_elect_commit_and_converge() {
    let (nodes, _peers, _dirs) = start().await;
    let l = leader(&nodes).await;
    let ib = nodes[&l].inbox();
    let acked = tokio::task::spawn_blocking(move || {
        ib.join(Uid(1), ConvId(10)).wait().unwrap();
        (0..20u128)
            .map(|i| {
                ib.send(SendRequest {
                    conv: ConvId(10),
                    sender: Uid(1),
                    client_msg_id: i,
                    msg_type: 1,
                    payload: Bytes::from(format!("message {i}")),
                })
                .wait()
                .unwrap()
                .msg_seq
                .0
            })
            .collect::<Vec<u64>>()
    })
    .await
    .unwrap();
    let first = acked[0];
    assert_eq!(acked, (first..first + 20).collect::<Vec<u64>>());
    let start = Instant::now();
    loop {
        let digests: HashSet<([u8; 32], u64)> = nodes
            .values()
            .map(|n| (n.inbox().replica_digest(), n.inbox().replica_index()))
            .collect();
        if digests.len() == 1 {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "no convergence: {digests:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (_, n) in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_with_the_wrong_token_is_refused() {
    let (nodes, peers, _dirs) = start().await;
    let mut net = TcpNetwork::new(Arc::from(&b"not-the-secret"[..]));
    let mut conn = net.new_client(1, &peers[&1]).await;
    let rpc = VoteRequest::new(Vote::new(99, 7), None);
    let e = conn
        .vote(rpc, RPCOption::new(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(matches!(e, RPCError::Unreachable(_)), "{e:?}");
    assert!(e.to_string().contains("wrong token"), "{e}");
    // The refused vote changed nothing: no node moved to term 99.
    for n in nodes.values() {
        assert!(n.raft().metrics().borrow_watched().current_term < 99);
    }
    for (_, n) in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_leave_from_the_raft_ip_when_it_names_one() {
    assert_eq!(source_ip("0.0.0.0:7080".parse().unwrap()), None);
    assert_eq!(source_ip("[::]:7080".parse().unwrap()), None);
    assert_eq!(
        source_ip("10.0.0.4:7080".parse().unwrap()),
        Some("10.0.0.4".parse().unwrap())
    );

    // All of 127.0.0.0/8 is loopback on Linux: a member on 127.0.0.3
    // calls one on 127.0.0.1 from 127.0.0.3.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = Peer {
        raft_addr: l.local_addr().unwrap().to_string(),
        client_addr: "client-1".into(),
    };
    let mut net = TcpNetwork::new(Arc::from(TOKEN.as_bytes()))
        .with_source(source_ip("127.0.0.3:7080".parse().unwrap()).unwrap());
    let mut conn = net.new_client(1, &peer).await;
    let call = tokio::spawn(async move {
        let rpc = VoteRequest::new(Vote::new(1, 2), None);
        conn.vote(rpc, RPCOption::new(Duration::from_secs(5))).await
    });
    let (stream, from) = l.accept().await.unwrap();
    assert_eq!(from.ip().to_string(), "127.0.0.3");
    drop(stream);
    assert!(
        call.await.unwrap().is_err(),
        "the listener answered nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_started_after_the_log_was_purged_catches_up_by_snapshot_over_tcp() {
    let config = openraft::Config {
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(20),
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..default_config()
    };
    let (nodes, _peers, mut late) = start_with(config.clone(), &[3]).await;
    let mut dirs = Vec::new();
    let mut running = BTreeMap::new();
    for (id, (node, dir)) in nodes {
        running.insert(id, node);
        dirs.push(dir);
    }
    let l = leader(&running).await;
    let ib = running[&l].inbox();
    tokio::task::spawn_blocking(move || {
        ib.join(Uid(1), ConvId(10)).wait().unwrap();
        for i in 0..60u128 {
            let req = SendRequest {
                conv: ConvId(10),
                sender: Uid(1),
                client_msg_id: i,
                msg_type: 1,
                payload: Bytes::from(format!("message {i}")),
            };
            ib.send(req).wait().unwrap();
        }
    })
    .await
    .unwrap();
    let start = Instant::now();
    while running[&l]
        .raft()
        .metrics()
        .borrow_watched()
        .purged
        .is_none()
    {
        assert!(
            start.elapsed() < DEADLINE,
            "the leader never purged its log"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Node 3 starts with an empty directory: the entries it needs are
    // purged, so only the snapshot brings it level.
    let (listener, dir) = late.remove(&3).unwrap();
    let third = run(3, listener, dir.path(), config).await;
    let start = Instant::now();
    loop {
        let ours = (
            third.inbox().replica_digest(),
            third.inbox().replica_index(),
        );
        let theirs = (
            running[&l].inbox().replica_digest(),
            running[&l].inbox().replica_index(),
        );
        if ours == theirs {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "node 3 did not catch up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // raft publishes the installed snapshot in its metrics a moment after
    // the engine was swapped.
    let start = Instant::now();
    while third.raft().metrics().borrow_watched().snapshot.is_none() {
        assert!(
            start.elapsed() < DEADLINE,
            "node 3 caught up, but raft reports no snapshot"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    third.shutdown().await;
    for (_, n) in running {
        n.shutdown().await;
    }
}
