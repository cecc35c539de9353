//! What the cluster tests share: an in-memory raft network between the
//! nodes of one process (a node can be cut off; a snapshot can be damaged
//! on its way, and what each node did with the snapshots it was sent is
//! recorded), a group of nodes on it, and the waits and engine calls the
//! tests make.

// Each test uses its own part of this.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_engine::*;
use inbox_server::cluster::network::{SnapshotChunk, SNAPSHOT_CHUNK};
use inbox_server::cluster::{
    default_config, Cluster, GroupHandle, InboxRaft, Peer, Snapshot, SnapshotReceiver, TypeConfig,
    Vote,
};
use openraft::error::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::RaftNetworkFactory;

/// How long a test waits for anything the group should do by itself.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A running node as the router reaches it: its raft, where its snapshot
/// chunks go, and its handle (for the engine it runs now).
#[derive(Clone)]
pub struct Target {
    raft: InboxRaft,
    snapshots: SnapshotReceiver,
    handle: GroupHandle,
}

/// What a node refused, and its engine's index and digest right after.
pub type Refusal = (u64, u64, [u8; 32]);

/// Delivers raft's calls between the nodes of one process, appends after
/// an optional delay; a node that is cut off neither sends nor receives. Can damage the next snapshot sent
/// to a node, and counts the snapshots each node took in whole.
#[derive(Default)]
pub struct Router {
    nodes: Mutex<HashMap<u64, Target>>,
    pub cut: Mutex<HashSet<u64>>,
    pub damage_next_snapshot_to: Mutex<HashSet<u64>>,
    pub refused: Mutex<Vec<Refusal>>,
    pub installed: Mutex<HashMap<u64, usize>>,
    /// Calls to each node refused because it was cut off.
    pub refused_while_cut: Mutex<HashMap<u64, u64>>,
    /// How long each append (and heartbeat) takes on its way, beside the
    /// call itself (none by default).
    pub append_delay: Mutex<std::time::Duration>,
}

impl Router {
    /// Node `id` is reached through `node` from now on.
    pub fn add(&self, id: u64, node: &Cluster) {
        let target = Target {
            raft: node.raft().clone(),
            snapshots: node.snapshot_receiver(),
            handle: node.handle(),
        };
        self.nodes.lock().unwrap().insert(id, target);
    }

    /// Node `id` is not running.
    pub fn remove(&self, id: u64) {
        self.nodes.lock().unwrap().remove(&id);
    }

    /// The network node `from` sends through.
    pub fn net(self: &Arc<Self>, from: u64) -> Net {
        Net {
            from,
            router: Arc::clone(self),
        }
    }

    fn reach(&self, from: u64, to: u64) -> Result<Target, RPCError<TypeConfig>> {
        let unreachable = |why: &str| {
            RPCError::Unreachable(Unreachable::new(&std::io::Error::other(why.to_string())))
        };
        let cut = self.cut.lock().unwrap();
        if cut.contains(&from) || cut.contains(&to) {
            *self
                .refused_while_cut
                .lock()
                .unwrap()
                .entry(to)
                .or_default() += 1;
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

pub struct Net {
    from: u64,
    router: Arc<Router>,
}

pub struct Conn {
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

/// A remote raft that stopped, as the network reports it.
fn stopped(to: u64, e: RaftError<TypeConfig>) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(format!(
        "node {to}: {e}"
    ))))
}

impl Conn {
    /// One chunk through the node's snapshot receiver, as its raft port
    /// would take it; the damage a test asked for is done on the way.
    async fn send_chunk(
        &self,
        mut chunk: SnapshotChunk,
    ) -> Result<Option<SnapshotResponse<TypeConfig>>, StreamingError<TypeConfig>> {
        let target = self.router.reach(self.from, self.to)?;
        if !chunk.data.is_empty()
            && self
                .router
                .damage_next_snapshot_to
                .lock()
                .unwrap()
                .remove(&self.to)
        {
            let mid = chunk.data.len() / 2;
            chunk.data[mid] ^= 0x20;
        }
        let done = chunk.done;
        let answer = target.snapshots.receive(chunk).await;
        match &answer {
            Err(_) => {
                let ib = target.handle.inbox();
                self.router.refused.lock().unwrap().push((
                    self.to,
                    ib.replica_index(),
                    ib.replica_digest(),
                ))
            }
            Ok(_) if done => {
                *self
                    .router
                    .installed
                    .lock()
                    .unwrap()
                    .entry(self.to)
                    .or_default() += 1
            }
            Ok(_) => {}
        }
        answer.map_err(|why| StreamingError::Network(NetworkError::from_string(why)))
    }
}

impl RaftNetworkV2<TypeConfig> for Conn {
    type SnapshotData = tokio::fs::File;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let target = self.router.reach(self.from, self.to)?;
        let delay = *self.router.append_delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        target
            .raft
            .append_entries(rpc)
            .await
            .map_err(|e| stopped(self.to, e))
    }

    /// In chunks through the node's snapshot receiver, as the raft port
    /// sends them.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        use tokio::io::AsyncReadExt as _;
        let Snapshot { meta, snapshot } = snapshot;
        let mut file = snapshot;
        let io = |e: std::io::Error| StreamingError::Network(NetworkError::new(&e));
        let len = file.metadata().await.map_err(io)?.len();
        let id = format!("{}-{len}", meta.last_log_id.map_or(0, |l| l.index));
        let mut offset = 0;
        loop {
            let want = ((len - offset) as usize).min(SNAPSHOT_CHUNK);
            let mut data = vec![0; want];
            file.read_exact(&mut data).await.map_err(io)?;
            let done = offset + want as u64 == len;
            let chunk = SnapshotChunk {
                vote,
                meta: meta.clone(),
                id: id.clone(),
                offset,
                data,
                done,
            };
            match self.send_chunk(chunk).await? {
                Some(reply) if done => return Ok(reply),
                _ if done => {
                    return Err(StreamingError::Network(NetworkError::from_string(
                        "no answer to the last chunk",
                    )))
                }
                _ => offset += want as u64,
            }
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let target = self.router.reach(self.from, self.to)?;
        target.raft.vote(rpc).await.map_err(|e| stopped(self.to, e))
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let target = self.router.reach(self.from, self.to)?;
        target
            .raft
            .pre_vote(rpc)
            .await
            .map_err(|e| stopped(self.to, e))
    }
}

/// Node `id`'s addresses in the membership (nothing listens there).
pub fn peer(id: u64) -> Peer {
    Peer {
        raft_addr: format!("raft-{id}:7080"),
        client_addr: format!("client-{id}:7070"),
    }
}

/// The engine the tests run on `dir`: 1 MiB segments, no compaction
/// unless a test runs one.
pub fn engine_config(dir: &Path) -> InboxConfig {
    let mut c = InboxConfig::new(dir);
    c.segment_bytes = 1 << 20;
    c.token_key = [42; 32];
    c.compaction_interval = None;
    c
}

/// The one node of `nodes` whose engine leads, those in `cut()` aside;
/// fails the test if there is none within [`DEADLINE`].
pub async fn leader(nodes: &BTreeMap<u64, Cluster>, cut: impl Fn() -> HashSet<u64>) -> u64 {
    let start = Instant::now();
    loop {
        let cut = cut();
        let leading: Vec<u64> = nodes
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

/// Nodes under raft on the in-memory network, each on its own data
/// directory.
pub struct Group {
    pub router: Arc<Router>,
    pub nodes: BTreeMap<u64, Cluster>,
    pub dirs: BTreeMap<u64, tempfile::TempDir>,
    raft_config: openraft::Config,
    engine_config: Box<dyn Fn(&Path) -> InboxConfig + Send + Sync>,
}

impl Group {
    /// No node yet; each one started runs `raft_config` on an engine
    /// opened with `engine_config(its directory)`.
    pub fn new(
        raft_config: openraft::Config,
        engine_config: impl Fn(&Path) -> InboxConfig + Send + Sync + 'static,
    ) -> Group {
        Group {
            router: Arc::new(Router::default()),
            nodes: BTreeMap::new(),
            dirs: BTreeMap::new(),
            raft_config,
            engine_config: Box::new(engine_config),
        }
    }

    /// Nodes 1 to 3 with raft's default timing, in one membership.
    pub async fn three() -> Group {
        Self::three_with(default_config(), engine_config).await
    }

    /// Nodes 1 to 3, in one membership.
    pub async fn three_with(
        raft_config: openraft::Config,
        engine_config: impl Fn(&Path) -> InboxConfig + Send + Sync + 'static,
    ) -> Group {
        let mut g = Group::new(raft_config, engine_config);
        g.start_nodes(1..=3).await;
        let members = (1..=3u64).map(|id| (id, peer(id))).collect();
        g.nodes[&1].initialize(members).await.unwrap();
        g
    }

    /// Starts nodes `ids` on fresh directories, not yet in any
    /// membership.
    pub async fn start_nodes(&mut self, ids: impl IntoIterator<Item = u64>) {
        for id in ids {
            self.dirs.insert(id, tempfile::tempdir().unwrap());
            self.run(id).await;
        }
    }

    /// Starts node `id` on its data directory.
    pub async fn run(&mut self, id: u64) {
        let dir = self.dirs[&id].path();
        let inbox = Arc::new(Inbox::open((self.engine_config)(dir)).unwrap());
        let net = self.router.net(id);
        let node = Cluster::start(id, inbox, dir, self.raft_config.clone(), net)
            .await
            .unwrap();
        self.router.add(id, &node);
        self.nodes.insert(id, node);
    }

    /// Stops node `id` and shuts its engine down, then waits until nothing
    /// else holds the engine: a snapshot build or send still running holds
    /// it a moment longer, and with it the logs' directory locks, which a
    /// restart on the same directory needs.
    pub async fn stop(&mut self, id: u64) {
        self.router.remove(id);
        let node = self.nodes.remove(&id).unwrap();
        let ib = node.inbox();
        node.shutdown().await;
        let start = Instant::now();
        while Arc::strong_count(&ib) > 1 {
            assert!(
                start.elapsed() < DEADLINE,
                "node {id}'s engine is still held {DEADLINE:?} after its shutdown"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::task::spawn_blocking(move || ib.shutdown().unwrap())
            .await
            .unwrap();
    }

    pub fn ib(&self, id: u64) -> Arc<Inbox> {
        self.nodes[&id].inbox()
    }

    /// The node whose engine leads, among those not cut off; fails the
    /// test if none does within the deadline.
    pub async fn leader(&self) -> u64 {
        leader(&self.nodes, || self.router.cut.lock().unwrap().clone()).await
    }

    /// Waits until every node has the same replicated state and serves
    /// the same history.
    pub async fn converged(&self) -> [u8; 32] {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        self.converged_among(&ids).await.1
    }

    /// Waits until the nodes `ids` hold the same replicated state at the
    /// same index and serve the same history; returns that index and the
    /// state's digest.
    pub async fn converged_among(&self, ids: &[u64]) -> (u64, [u8; 32]) {
        let start = Instant::now();
        loop {
            let states: HashSet<(u64, [u8; 32])> = ids
                .iter()
                .map(|id| {
                    let ib = self.ib(*id);
                    (ib.replica_index(), ib.replica_digest())
                })
                .collect();
            // A round's messages are readable once durable, a moment
            // after the round is applied.
            let histories: HashSet<Vec<u64>> = ids.iter().map(|id| seqs(&self.ib(*id))).collect();
            if states.len() == 1 && histories.len() == 1 {
                return states.into_iter().next().unwrap();
            }
            assert!(
                start.elapsed() < DEADLINE,
                "nodes {ids:?} did not converge within {DEADLINE:?}: {states:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Reconnects and stops every node.
    pub async fn shutdown(mut self) {
        self.router.cut.lock().unwrap().clear();
        for id in self.nodes.keys().copied().collect::<Vec<_>>() {
            self.stop(id).await;
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

/// Send `cmid` from `sender` to conversation 10, payload "message cmid".
pub fn send_req(sender: u64, cmid: u128) -> SendRequest {
    SendRequest {
        conv: ConvId(10),
        sender: Uid(sender),
        client_msg_id: cmid,
        msg_type: 1,
        payload: Bytes::from(format!("message {cmid}")),
    }
}

/// `req` sent at `ib`, with its answer.
pub async fn submit(ib: Arc<Inbox>, req: SendRequest) -> Result<SendReply> {
    tokio::task::spawn_blocking(move || ib.send(req).wait())
        .await
        .unwrap()
}

/// [`send_req`] at `ib`.
pub async fn send(ib: Arc<Inbox>, sender: u64, cmid: u128) -> Result<SendReply> {
    submit(ib, send_req(sender, cmid)).await
}

/// User `uid` joins conversation 10 at `ib`.
pub async fn join(ib: Arc<Inbox>, uid: u64) {
    tokio::task::spawn_blocking(move || ib.join(Uid(uid), ConvId(10)).wait().unwrap())
        .await
        .unwrap();
}

/// Conversation 10's newest 500 sequence numbers as user 1 sees them,
/// oldest first (none on a node that has not got there yet).
pub fn seqs(ib: &Inbox) -> Vec<u64> {
    let Ok(page) = ib.history(Uid(1), ConvId(10), None, 500) else {
        return Vec::new();
    };
    let mut s: Vec<u64> = page.messages.iter().map(|m| m.msg_seq.0).collect();
    s.reverse();
    s
}
