//! Membership changes with engines in one process, over an in-memory
//! network, while senders write to the leader's engine directly (so that
//! rounds keep arriving at the engine while a change pauses the leader's
//! writes, and rounds made but never handed to raft must be discarded):
//! a fourth node is added and a member removed, every send acknowledged is
//! stored once, and the nodes of the final membership converge on the same
//! replicated state.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_engine::*;
use inbox_server::cluster::{default_config, Cluster, InboxRaft, Peer, TypeConfig};
use inbox_wire::{AddNodeReq, RemoveNodeReq};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RaftNetwork, RaftNetworkFactory};

const DEADLINE: Duration = Duration::from_secs(30);

/// Delivers raft's calls between the nodes of one process.
#[derive(Default)]
struct Router {
    nodes: Mutex<HashMap<u64, InboxRaft>>,
}

impl Router {
    #[allow(clippy::result_large_err, reason = "openraft's error type")]
    fn reach<E: std::error::Error>(&self, to: u64) -> Result<InboxRaft, RPCError<u64, Peer, E>> {
        self.nodes.lock().unwrap().get(&to).cloned().ok_or_else(|| {
            RPCError::Unreachable(Unreachable::new(&std::io::Error::other("not running")))
        })
    }
}

struct Net(Arc<Router>);

struct Conn {
    to: u64,
    router: Arc<Router>,
}

impl RaftNetworkFactory<TypeConfig> for Net {
    type Network = Conn;
    async fn new_client(&mut self, target: u64, _node: &Peer) -> Conn {
        Conn {
            to: target,
            router: Arc::clone(&self.0),
        }
    }
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, Peer, RaftError<u64>>> {
        let raft = self.router.reach(self.to)?;
        raft.append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, Peer, RaftError<u64, InstallSnapshotError>>,
    > {
        let raft = self.router.reach(self.to)?;
        raft.install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, Peer, RaftError<u64>>> {
        let raft = self.router.reach(self.to)?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }
}

fn peer(id: u64) -> Peer {
    Peer {
        raft_addr: format!("raft-{id}:7080"),
        client_addr: format!("client-{id}:7070"),
    }
}

struct Group {
    router: Arc<Router>,
    nodes: BTreeMap<u64, Cluster>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Group {
    /// Starts nodes `ids`, not yet in any membership.
    async fn start_nodes(&mut self, ids: impl IntoIterator<Item = u64>) {
        for id in ids {
            let dir = tempfile::tempdir().unwrap();
            let mut c = InboxConfig::new(dir.path());
            c.segment_bytes = 1 << 20;
            c.token_key = [42; 32];
            c.compaction_interval = None;
            let inbox = Arc::new(Inbox::open(c).unwrap());
            let net = Net(Arc::clone(&self.router));
            let node = Cluster::start(id, inbox, dir.path(), default_config(), net)
                .await
                .unwrap();
            self.router
                .nodes
                .lock()
                .unwrap()
                .insert(id, node.raft().clone());
            self.nodes.insert(id, node);
            self._dirs.push(dir);
        }
    }

    async fn three() -> Group {
        let mut g = Group {
            router: Arc::new(Router::default()),
            nodes: BTreeMap::new(),
            _dirs: Vec::new(),
        };
        g.start_nodes(1..=3).await;
        let members = (1..=3u64).map(|id| (id, peer(id))).collect();
        g.nodes[&1].initialize(members).await.unwrap();
        g
    }

    /// The node whose engine leads; fails the test if none does within
    /// the deadline.
    async fn leader(&self) -> u64 {
        let start = Instant::now();
        loop {
            let leading: Vec<u64> = (self.nodes.iter())
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

    /// Waits until the nodes `ids` hold the same replicated state at the
    /// same index; returns that index.
    async fn converged(&self, ids: &[u64]) -> u64 {
        let start = Instant::now();
        loop {
            let states: BTreeSet<(u64, [u8; 32])> = ids
                .iter()
                .map(|id| {
                    let ib = self.nodes[id].inbox();
                    (ib.replica_index(), ib.replica_digest())
                })
                .collect();
            if states.len() == 1 {
                return states.into_iter().next().unwrap().0;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "nodes {ids:?} did not converge within {DEADLINE:?}: {states:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Sends `cmid` from user 1 to conversation 10 at whichever node leads,
/// until acknowledged (a retry of a kept round answers as a duplicate);
/// returns its `msg_seq` and how many attempts were refused.
async fn send_until_acked(g: &Group, cmid: u128) -> (u64, u32) {
    let start = Instant::now();
    let mut refused = 0;
    loop {
        let ib = g.nodes[&g.leader().await].inbox();
        let req = SendRequest {
            conv: ConvId(10),
            sender: Uid(1),
            client_msg_id: cmid,
            msg_type: 1,
            payload: Bytes::from(format!("message {cmid}")),
        };
        match tokio::task::spawn_blocking(move || ib.send(req).wait())
            .await
            .unwrap()
        {
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
    let ib = g.nodes[&first].inbox();
    tokio::task::spawn_blocking(move || ib.join(Uid(1), ConvId(10)).wait().unwrap())
        .await
        .unwrap();
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
    let index = g.converged(&left).await;
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
    for (_, n) in g.nodes {
        n.shutdown().await;
    }
}
