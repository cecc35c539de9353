//! Three engines under raft in one process, talking over raft's TCP port
//! on loopback: a leader is elected, writes commit and every node
//! converges; a peer with the wrong token is refused.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_engine::*;
use inbox_server::cluster::network::{serve, TcpNetwork};
use inbox_server::cluster::{default_config, Cluster, Peer};
use openraft::error::RPCError;
use openraft::network::RPCOption;
use openraft::raft::VoteRequest;
use openraft::{RaftNetwork, RaftNetworkFactory, Vote};

const DEADLINE: Duration = Duration::from_secs(30);
const TOKEN: &str = "group-secret";

async fn start() -> (
    BTreeMap<u64, Cluster>,
    BTreeMap<u64, Peer>,
    Vec<tempfile::TempDir>,
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
    let mut dirs = Vec::new();
    for (id, l) in listeners {
        let dir = tempfile::tempdir().unwrap();
        let mut c = InboxConfig::new(dir.path());
        c.segment_bytes = 1 << 20;
        c.token_key = [42; 32];
        c.compaction_interval = None;
        let inbox = Arc::new(Inbox::open(c).unwrap());
        let net = TcpNetwork::new(Arc::from(TOKEN.as_bytes()));
        let node = Cluster::start(id, inbox, dir.path(), default_config(), net)
            .await
            .unwrap();
        tokio::spawn(serve(
            l,
            node.raft().clone(),
            node.snapshot_receiver(),
            Arc::from(TOKEN.as_bytes()),
        ));
        nodes.insert(id, node);
        dirs.push(dir);
    }
    nodes[&1].initialize(peers.clone()).await.unwrap();
    (nodes, peers, dirs)
}

async fn leader(nodes: &BTreeMap<u64, Cluster>) -> u64 {
    let start = Instant::now();
    loop {
        let leading: Vec<u64> = nodes
            .iter()
            .filter(|(_, n)| n.is_leading())
            .map(|(id, _)| *id)
            .collect();
        if let [one] = leading[..] {
            return one;
        }
        assert!(start.elapsed() < DEADLINE, "no leader within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
        assert!(n.raft().metrics().borrow().current_term < 99);
    }
    for (_, n) in nodes {
        n.shutdown().await;
    }
}
