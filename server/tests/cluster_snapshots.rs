//! raft snapshots over the engine, three nodes in one process over an
//! in-memory network: a follower cut off while the leader's log is purged
//! catches up by snapshot; a node whose data directory was wiped rejoins
//! and catches up by snapshot; a damaged snapshot is refused and leaves the
//! follower as it was, and the one sent again is installed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_engine::*;
use inbox_server::cluster::{
    default_config, Cluster, InboxRaft, Peer, SnapshotReceiver, TypeConfig,
};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RaftNetwork, RaftNetworkFactory};

/// A running node as the router reaches it: its raft, where its snapshot
/// chunks go, and the engine it runs now.
type Target = (InboxRaft, SnapshotReceiver, Arc<Mutex<Option<Arc<Inbox>>>>);

/// What a node refused, and its engine's index and digest right after.
type Refusal = (u64, u64, [u8; 32]);

/// Delivers raft's calls between the nodes; a node that is cut off
/// neither sends nor receives. Can damage the next snapshot sent to a
/// node, and counts the snapshots each node took in whole.
#[derive(Default)]
struct Router {
    nodes: Mutex<HashMap<u64, Target>>,
    cut: Mutex<HashSet<u64>>,
    damage_next_snapshot_to: Mutex<HashSet<u64>>,
    refused: Mutex<Vec<Refusal>>,
    installed: Mutex<HashMap<u64, usize>>,
}

impl Router {
    #[allow(clippy::result_large_err, reason = "openraft's error type")]
    fn reach<E: std::error::Error>(
        &self,
        from: u64,
        to: u64,
    ) -> Result<Target, RPCError<u64, Peer, E>> {
        let unreachable = |why: &str| {
            RPCError::Unreachable(Unreachable::new(&std::io::Error::other(why.to_string())))
        };
        let cut = self.cut.lock().unwrap();
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
        let (raft, _, _) = self.router.reach(self.from, self.to)?;
        raft.append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }

    async fn install_snapshot(
        &mut self,
        mut rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, Peer, RaftError<u64, InstallSnapshotError>>,
    > {
        let (_, receiver, engine) = self.router.reach(self.from, self.to)?;
        if !rpc.data.is_empty()
            && self
                .router
                .damage_next_snapshot_to
                .lock()
                .unwrap()
                .remove(&self.to)
        {
            let mid = rpc.data.len() / 2;
            rpc.data[mid] ^= 0x20;
        }
        let done = rpc.done;
        let answer = receiver.install_snapshot(rpc).await;
        if done {
            let ib = engine.lock().unwrap().clone();
            match (&answer, ib) {
                (Err(_), Some(ib)) => self.router.refused.lock().unwrap().push((
                    self.to,
                    ib.replica_index(),
                    ib.replica_digest(),
                )),
                (Ok(_), _) => {
                    *self
                        .router
                        .installed
                        .lock()
                        .unwrap()
                        .entry(self.to)
                        .or_default() += 1
                }
                _ => {}
            }
        }
        answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, Peer, RaftError<u64>>> {
        let (raft, _, _) = self.router.reach(self.from, self.to)?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }
}

const DEADLINE: Duration = Duration::from_secs(30);

/// A snapshot every 20 rounds, the log purged up to it at once.
fn config() -> openraft::Config {
    openraft::Config {
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(20),
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..default_config()
    }
}

fn engine_config(
    dir: &std::path::Path,
    clock: &Arc<inbox_engine::inbox::ManualClock>,
) -> InboxConfig {
    let mut c = InboxConfig::new(dir);
    c.clock = clock.clone();
    c.segment_bytes = 64 << 10;
    // Only the compaction test moves the clock past it.
    c.history_retention = Some(Duration::from_secs(24 * 3600));
    c.token_key = [42; 32];
    c.compaction_interval = None;
    c
}

struct Group {
    router: Arc<Router>,
    nodes: BTreeMap<u64, Cluster>,
    dirs: BTreeMap<u64, tempfile::TempDir>,
    watchers: BTreeMap<u64, tokio::task::JoinHandle<()>>,
    raft_config: openraft::Config,
    clock: Arc<inbox_engine::inbox::ManualClock>,
}

impl Group {
    async fn start() -> Group {
        Self::start_with(config()).await
    }

    async fn start_with(raft_config: openraft::Config) -> Group {
        let mut g = Group {
            router: Arc::new(Router::default()),
            nodes: BTreeMap::new(),
            dirs: BTreeMap::new(),
            watchers: BTreeMap::new(),
            raft_config,
            clock: Arc::new(inbox_engine::inbox::ManualClock::new(1_700_000_000_000)),
        };
        for id in 1..=3u64 {
            g.dirs.insert(id, tempfile::tempdir().unwrap());
            g.run(id).await;
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
        g.nodes[&1].initialize(members).await.unwrap();
        g
    }

    /// Starts node `id` on its data directory.
    async fn run(&mut self, id: u64) {
        let dir = self.dirs[&id].path();
        let inbox = Arc::new(Inbox::open(engine_config(dir, &self.clock)).unwrap());
        let net = Net {
            from: id,
            router: Arc::clone(&self.router),
        };
        let node = Cluster::start(id, inbox, dir, self.raft_config.clone(), net)
            .await
            .unwrap();
        let engine = Arc::new(Mutex::new(Some(node.inbox())));
        self.router.nodes.lock().unwrap().insert(
            id,
            (
                node.raft().clone(),
                node.snapshot_receiver(),
                Arc::clone(&engine),
            ),
        );
        // The router reads the engine a node runs now (an install
        // replaces it).
        let handle = node.handle();
        let watcher = tokio::spawn(async move {
            loop {
                *engine.lock().unwrap() = Some(handle.inbox());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        self.watchers.insert(id, watcher);
        self.nodes.insert(id, node);
    }

    /// Stops node `id` and shuts its engine down.
    async fn stop(&mut self, id: u64) {
        let watcher = self.watchers.remove(&id).unwrap();
        watcher.abort();
        let _ = watcher.await;
        self.router.nodes.lock().unwrap().remove(&id);
        let node = self.nodes.remove(&id).unwrap();
        let ib = node.inbox();
        node.shutdown().await;
        tokio::task::spawn_blocking(move || ib.shutdown().unwrap())
            .await
            .unwrap();
    }

    fn ib(&self, id: u64) -> Arc<Inbox> {
        self.nodes[&id].inbox()
    }

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

    /// Waits until the leader's raft has purged its log past `index`.
    async fn purged_past(&self, leader: u64, index: u64) {
        let start = Instant::now();
        let mut m = self.nodes[&leader].raft().metrics();
        loop {
            let purged = m.borrow_and_update().purged.map_or(0, |p| p.index);
            if purged > index {
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the leader's log was not purged past {index} (purged up to {purged})"
            );
            let _ = tokio::time::timeout(Duration::from_millis(50), m.changed()).await;
        }
    }

    fn installed(&self, id: u64) -> usize {
        self.router
            .installed
            .lock()
            .unwrap()
            .get(&id)
            .copied()
            .unwrap_or(0)
    }

    async fn shutdown(mut self) {
        self.router.cut.lock().unwrap().clear();
        for id in self.nodes.keys().copied().collect::<Vec<_>>() {
            self.stop(id).await;
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.router.cut.lock().unwrap().clear();
    }
}

async fn send(ib: Arc<Inbox>, sender: u64, cmid: u128) -> Result<SendReply> {
    tokio::task::spawn_blocking(move || {
        ib.send(SendRequest {
            conv: ConvId(10),
            sender: Uid(sender),
            client_msg_id: cmid,
            msg_type: 1,
            payload: Bytes::from(format!("message {cmid} {}", "x".repeat(600))),
        })
        .wait()
    })
    .await
    .unwrap()
}

async fn join(ib: Arc<Inbox>, uid: u64) {
    tokio::task::spawn_blocking(move || ib.join(Uid(uid), ConvId(10)).wait().unwrap())
        .await
        .unwrap();
}

/// Conversation 10's sequence numbers, oldest first (none on a node that
/// has not got there yet).
fn seqs(ib: &Inbox) -> Vec<u64> {
    let Ok(page) = ib.history(Uid(1), ConvId(10), None, 500) else {
        return Vec::new();
    };
    let mut s: Vec<u64> = page.messages.iter().map(|m| m.msg_seq.0).collect();
    s.reverse();
    s
}

/// Some rounds on the leader: joins, then `n` sends.
async fn writes(g: &Group, leader: u64, from: u128, n: u128) -> u64 {
    let mut last = 0;
    for i in from..from + n {
        last = send(g.ib(leader), 1 + (i % 3) as u64, i)
            .await
            .unwrap()
            .msg_seq
            .0;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_cut_off_while_the_leaders_log_is_purged_catches_up_by_snapshot() {
    let g = Group::start().await;
    let l = g.leader().await;
    for uid in 1..=3 {
        join(g.ib(l), uid).await;
    }
    writes(&g, l, 0, 5).await;
    g.converged().await;
    let f = (1..=3).find(|&id| id != l).unwrap();
    g.router.cut.lock().unwrap().insert(f);
    let behind = g.ib(f).replica_index();
    let last = writes(&g, l, 100, 60).await;
    g.purged_past(l, behind).await;
    assert_eq!(
        g.ib(f).replica_index(),
        behind,
        "a cut-off node received rounds"
    );
    assert_eq!(g.installed(f), 0);

    g.router.cut.lock().unwrap().clear();
    g.converged().await;
    assert!(g.installed(f) >= 1, "node {f} caught up without a snapshot");
    assert_eq!(seqs(&g.ib(f)), (1..=last).collect::<Vec<u64>>());
    // It goes on from the snapshot with entries, and serves as leader
    // material: its engine is the installed one.
    let last = writes(&g, l, 200, 5).await;
    g.converged().await;
    assert_eq!(seqs(&g.ib(f)), (1..=last).collect::<Vec<u64>>());
    g.ib(f).check_invariants().unwrap();
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_data_directory_was_wiped_rejoins_and_catches_up_by_snapshot() {
    let mut g = Group::start().await;
    let l = g.leader().await;
    for uid in 1..=3 {
        join(g.ib(l), uid).await;
    }
    writes(&g, l, 0, 30).await;
    g.converged().await;
    let w = (1..=3).find(|&id| id != l).unwrap();
    g.stop(w).await;
    // Its data directory is emptied: no log, no checkpoint, no vote.
    for e in std::fs::read_dir(g.dirs[&w].path()).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
    let last = writes(&g, l, 100, 30).await;
    g.purged_past(l, 1).await;
    g.run(w).await;
    g.converged().await;
    assert!(g.installed(w) >= 1, "node {w} caught up without a snapshot");
    assert_eq!(seqs(&g.ib(w)), (1..=last).collect::<Vec<u64>>());
    // Restarted again, it opens on the installed directory and its raft
    // state (the snapshot's log id, the purge) and keeps up. What a crash
    // in the middle of an install or a build leaves beside the data
    // directory (a staged directory never swapped in, or the old one
    // swapped out; a scratch image) is removed at start, unread.
    g.stop(w).await;
    let dir = g.dirs[&w].path().canonicalize().unwrap();
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let leftovers = [
        dir.with_file_name(format!(".{name}.install")),
        dir.with_file_name(format!(".{name}.image")),
    ];
    for d in &leftovers {
        std::fs::create_dir_all(d.join("evt")).unwrap();
        std::fs::write(d.join("evt").join("0000000001.seg"), b"not a segment").unwrap();
    }
    g.run(w).await;
    for d in &leftovers {
        assert!(!d.exists(), "{} left in place", d.display());
    }
    let last = writes(&g, l, 200, 5).await;
    g.converged().await;
    assert_eq!(seqs(&g.ib(w)), (1..=last).collect::<Vec<u64>>());
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_damaged_snapshot_is_refused_and_leaves_the_follower_as_it_was() {
    let g = Group::start().await;
    let l = g.leader().await;
    for uid in 1..=3 {
        join(g.ib(l), uid).await;
    }
    writes(&g, l, 0, 5).await;
    g.converged().await;
    let f = (1..=3).find(|&id| id != l).unwrap();
    g.router.cut.lock().unwrap().insert(f);
    let (index, digest) = (g.ib(f).replica_index(), g.ib(f).replica_digest());
    writes(&g, l, 100, 60).await;
    g.purged_past(l, index).await;

    g.router.damage_next_snapshot_to.lock().unwrap().insert(f);
    g.router.cut.lock().unwrap().clear();
    g.converged().await;
    let refused = g.router.refused.lock().unwrap().clone();
    // The damaged one was refused with the follower unchanged; the one
    // sent again was installed.
    assert_eq!(refused, vec![(f, index, digest)]);
    assert!(g.installed(f) >= 1);
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rounds_the_leaders_compaction_deleted_reach_a_follower_as_a_snapshot() {
    // No snapshot by the policy: only the compaction makes raft purge.
    let g = Group::start_with(openraft::Config {
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1_000_000),
        ..config()
    })
    .await;
    let l = g.leader().await;
    for uid in 1..=3 {
        join(g.ib(l), uid).await;
    }
    g.converged().await;
    let f = (1..=3).find(|&id| id != l).unwrap();
    g.router.cut.lock().unwrap().insert(f);
    let behind = g.ib(f).replica_index();
    let last = writes(&g, l, 100, 400).await;
    // Past the safety window every event is trimmed (nothing fences it),
    // past the retention every message, and the leader's segments that
    // held the early rounds are deleted.
    g.clock.advance(Duration::from_secs(8 * 24 * 3600));
    let ib = g.ib(l);
    let report = tokio::task::spawn_blocking(move || {
        let first = ib.compact().unwrap();
        ib.checkpoint().unwrap();
        ib.checkpoint().unwrap();
        (first, ib.compact().unwrap())
    })
    .await
    .unwrap();
    assert!(report.0.events_reclaimed > 0, "{report:?}");
    assert!(
        g.ib(l)
            .read_entries(behind + 1, behind + 1)
            .unwrap()
            .is_empty(),
        "the leader still holds round {}: {:?} {:?}",
        behind + 1,
        g.ib(l).explain_segment("evt", 1),
        std::fs::read_dir(g.dirs[&l].path().join("evt"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.metadata().unwrap().len())
            })
            .collect::<Vec<_>>()
    );

    // Replication reads the log, as a leader restarted since would.
    g.nodes[&l].forget_recent_entries();
    g.router.cut.lock().unwrap().clear();
    g.converged().await;
    assert!(g.installed(f) >= 1, "node {f} caught up without a snapshot");
    assert_eq!(seqs(&g.ib(f)), seqs(&g.ib(l)));
    // The sends go on, on every node.
    let more = writes(&g, l, 1000, 3).await;
    assert!(more > last);
    g.converged().await;
    assert_eq!(seqs(&g.ib(f)), seqs(&g.ib(l)));
    g.shutdown().await;
}
