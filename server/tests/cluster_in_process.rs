//! Three engines in one process, each under raft, over an in-memory
//! network that can cut a node off: a leader is elected, writes are
//! answered only once a quorum stored them, a cut-off leader's rounds are
//! discarded when it rejoins, and every node ends with the same state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_engine::*;
use inbox_server::cluster::{default_config, Cluster, InboxRaft, Peer, TypeConfig};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RaftNetwork, RaftNetworkFactory};

/// Delivers raft's calls between the nodes of one process; a node that is
/// cut off neither sends nor receives.
#[derive(Default)]
struct Router {
    nodes: Mutex<HashMap<u64, InboxRaft>>,
    cut: Mutex<HashSet<u64>>,
}

impl Router {
    #[allow(clippy::result_large_err, reason = "openraft's error type")]
    fn reach<E: std::error::Error>(
        &self,
        from: u64,
        to: u64,
    ) -> Result<InboxRaft, RPCError<u64, Peer, E>> {
        let cut = self.cut.lock().unwrap();
        let unreachable = |why: &str| {
            RPCError::Unreachable(Unreachable::new(&std::io::Error::other(why.to_string())))
        };
        if cut.contains(&from) || cut.contains(&to) {
            return Err(unreachable("cut off"));
        }
        drop(cut);
        self.nodes
            .lock()
            .unwrap()
            .get(&to)
            .cloned()
            .ok_or_else(|| unreachable("not running"))
    }
}

struct Net {
    from: u64,
    router: Arc<Router>,
}

struct Conn {
    from: u64,
    to: u64,
    router: Arc<Router>,
}

impl RaftNetworkFactory<TypeConfig> for Net {
    type Network = Conn;
    async fn new_client(&mut self, target: u64, _node: &Peer) -> Conn {
        Conn {
            from: self.from,
            to: target,
            router: Arc::clone(&self.router),
        }
    }
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, Peer, RaftError<u64>>> {
        let raft = self.router.reach(self.from, self.to)?;
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
        let raft = self.router.reach(self.from, self.to)?;
        raft.install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, Peer, RaftError<u64>>> {
        let raft = self.router.reach(self.from, self.to)?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }
}

const DEADLINE: Duration = Duration::from_secs(30);

struct Group {
    router: Arc<Router>,
    nodes: BTreeMap<u64, Cluster>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Group {
    async fn start() -> Group {
        let router = Arc::new(Router::default());
        let mut nodes = BTreeMap::new();
        let mut dirs = Vec::new();
        for id in 1..=3u64 {
            let dir = tempfile::tempdir().unwrap();
            let mut c = InboxConfig::new(dir.path());
            c.segment_bytes = 1 << 20;
            c.token_key = [42; 32];
            c.compaction_interval = None;
            let inbox = Arc::new(Inbox::open(c).unwrap());
            let net = Net {
                from: id,
                router: Arc::clone(&router),
            };
            let node = Cluster::start(id, inbox, dir.path(), default_config(), net)
                .await
                .unwrap();
            router.nodes.lock().unwrap().insert(id, node.raft().clone());
            nodes.insert(id, node);
            dirs.push(dir);
        }
        let members = (1..=3u64)
            .map(|id| {
                let peer = Peer {
                    raft_addr: format!("raft-{id}"),
                    client_addr: format!("client-{id}"),
                };
                (id, peer)
            })
            .collect();
        nodes[&1].initialize(members).await.unwrap();
        Group {
            router,
            nodes,
            _dirs: dirs,
        }
    }

    fn ib(&self, id: u64) -> Arc<Inbox> {
        self.nodes[&id].inbox()
    }

    /// The node whose engine leads, among those not cut off; fails the
    /// test if none does within the deadline.
    async fn leader(&self) -> u64 {
        let start = Instant::now();
        loop {
            let cut = self.router.cut.lock().unwrap().clone();
            let leading: Vec<u64> = self
                .nodes
                .iter()
                .filter(|(id, n)| !cut.contains(id) && n.is_leading())
                .map(|(id, _)| *id)
                .collect();
            if let [one] = leading[..] {
                return one;
            }
            assert!(start.elapsed() < DEADLINE, "no leader within {DEADLINE:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every node has the same replicated state and serves
    /// the same history.
    async fn converged(&self) -> [u8; 32] {
        let start = Instant::now();
        loop {
            let digests: HashSet<[u8; 32]> = self
                .nodes
                .values()
                .map(|n| n.inbox().replica_digest())
                .collect();
            let indexes: HashSet<u64> = self
                .nodes
                .values()
                .map(|n| n.inbox().replica_index())
                .collect();
            // A round's messages are readable once durable, a moment
            // after the round is applied.
            let histories: HashSet<Vec<u64>> =
                self.nodes.values().map(|n| seqs(&n.inbox())).collect();
            if digests.len() == 1 && indexes.len() == 1 && histories.len() == 1 {
                return digests.into_iter().next().unwrap();
            }
            assert!(
                start.elapsed() < DEADLINE,
                "nodes did not converge within {DEADLINE:?}: indexes {indexes:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn shutdown(mut self) {
        for (_, n) in std::mem::take(&mut self.nodes) {
            n.shutdown().await;
        }
    }
}

impl Drop for Group {
    /// A failing test reconnects every node, so that no round waits for a
    /// quorum forever and the test ends with its failure instead.
    fn drop(&mut self) {
        self.router.cut.lock().unwrap().clear();
    }
}

fn send_req(sender: u64, cmid: u128) -> SendRequest {
    SendRequest {
        conv: ConvId(10),
        sender: Uid(sender),
        client_msg_id: cmid,
        msg_type: 1,
        payload: Bytes::from(format!("message {cmid}")),
    }
}

async fn send(ib: Arc<Inbox>, sender: u64, cmid: u128) -> Result<SendReply> {
    tokio::task::spawn_blocking(move || ib.send(send_req(sender, cmid)).wait())
        .await
        .unwrap()
}

async fn join(ib: Arc<Inbox>, uid: u64) {
    tokio::task::spawn_blocking(move || ib.join(Uid(uid), ConvId(10)).wait().unwrap())
        .await
        .unwrap();
}

/// The message sequence numbers of conversation 10, oldest first.
fn seqs(ib: &Inbox) -> Vec<u64> {
    let page = ib.history(Uid(1), ConvId(10), None, 500).unwrap();
    let mut s: Vec<u64> = page.messages.iter().map(|m| m.msg_seq.0).collect();
    s.reverse();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_commit_through_raft_and_every_node_converges() {
    let g = Group::start().await;
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
    let g = Group::start().await;
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
