//! A replicated group: openraft (0.10, storage v2) over the engine's
//! replication API (`inbox_engine::inbox::{Entry, Leader}`); see
//! `docs/CLUSTER.md`.
//!
//! - [`TypeConfig`]: node ids are `u64`, a node is its [`Peer`] addresses,
//!   a log entry's payload is one engine round ([`Round`]);
//! - `store`: raft's log storage and state machine over the engine: the
//!   engine's `evt` log *is* the raft log (one write and one fdatasync per
//!   round on every node);
//! - `meta`: the vote, the term of each range of indexes and the
//!   membership entries, in one small durable file;
//! - [`Cluster`]: starts raft on an engine, hands the engine's rounds to
//!   raft while this node leads, and steps the engine down when it stops
//!   leading.
//!
//! Without a cluster configured none of this exists: a single node runs
//! exactly as before.

mod cache;
mod commit_path;
mod gap;
mod membership;
mod meta;
pub mod network;
mod reads;
mod snapshot;
mod status;
mod store;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use inbox_engine::inbox::{Entry, Leader};
use inbox_engine::Inbox;
use openraft::async_runtime::WatchReceiver as _;
use openraft::{Raft, RaftNetworkFactory, ServerState};
use serde::{Deserialize, Serialize};

pub use commit_path::CommitPathFigures;
pub use membership::{not_in_a_group, CHANGE_WITHIN};
pub use snapshot::{ChunkAnswer, LogBounds, SnapshotCounts, SnapshotReceiver};
pub use store::{LogStore, StateMachine};

/// A raft log entry of this group.
pub(crate) type RaftEntry = openraft::Entry<LeaderId, EntryPayload>;
/// A raft entry's payload: a round, a membership, or a leader's blank.
pub(crate) type EntryPayload = openraft::EntryPayload<Round, u64, Peer>;
/// A leader: its term and node. Totally ordered (openraft's "advanced"
/// leader id, the one 0.9 used): its JSON form, `{"term":T,"node_id":N}`,
/// is what `raft-meta.json` holds.
pub type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, u64>;
/// A raft log id: the leader that wrote the entry, and its index.
pub type LogId = openraft::LogId<LeaderId>;
/// A vote: the leader voted for, and whether a quorum granted it.
pub type Vote = openraft::Vote<LeaderId>;
/// A membership configuration of the group.
pub type Membership = openraft::Membership<u64, Peer>;
/// A membership with the log id of the entry that holds it.
pub type StoredMembership = openraft::StoredMembership<LeaderId, u64, Peer>;
/// What raft knows of a snapshot: its last log id and membership.
pub type SnapshotMeta = openraft::SnapshotMeta<LeaderId, u64, Peer>;
/// A snapshot as raft hands it over: its metadata and its image file.
pub type Snapshot = openraft::Snapshot<LeaderId, u64, Peer, tokio::fs::File>;

/// One engine round as a raft entry's payload: `Entry::encode`'s bytes,
/// sent as one byte string (see `network`'s module documentation).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Round(#[serde(with = "serde_bytes")] pub Vec<u8>);

impl fmt::Debug for Round {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Round({} bytes)", self.0.len())
    }
}

impl fmt::Display for Round {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A member's addresses: where its raft port listens, and where clients
/// reach it (what `NOT_LEADER` names).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    pub raft_addr: String,
    pub client_addr: String,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.raft_addr, self.client_addr)
    }
}

openraft::declare_raft_types!(
    /// openraft's types for inboxd.
    pub TypeConfig:
        D = Round,
        R = (),
        NodeId = u64,
        Node = Peer,
        Entry = RaftEntry,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The raft handle of this crate's type config.
pub type InboxRaft = Raft<TypeConfig, StateMachine>;

/// Rounds between two snapshots, by default.
pub const SNAPSHOT_EVERY: u64 = 50_000;

/// Rounds raft keeps in its log before its last snapshot (at most the
/// rounds between two snapshots): a follower behind by fewer gets entries,
/// one further behind the snapshot.
pub const KEEP_BEHIND_SNAPSHOT: u64 = 1000;

/// raft's timing for a group: heartbeats every 250 ms (also the deadline
/// of one append call, which includes the follower's fdatasync), elections
/// after 0.75–1.25 s of silence. openraft 0.9 makes a follower wait its
/// leader lease (the longest election timeout) plus a random election
/// timeout before it stands, so a dead leader is replaced after about
/// 1.5–2.5 s: inside the 3 s a client is promised. A follower misses an
/// election only after three heartbeats in a row failed to reach it. A snapshot every [`SNAPSHOT_EVERY`] rounds;
/// raft then forgets its log up to [`KEEP_BEHIND_SNAPSHOT`] rounds before
/// the snapshot (a follower further behind is sent the snapshot).
pub fn default_config() -> openraft::Config {
    openraft::Config {
        cluster_name: "inboxd".into(),
        heartbeat_interval: 250,
        election_timeout_min: 750,
        election_timeout_max: 1250,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY),
        max_in_snapshot_log_to_keep: KEEP_BEHIND_SNAPSHOT,
        max_payload_entries: 256,
        install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
        // A wiped node restarted under its old id rejoins (see
        // CLUSTER.md, known limits).
        allow_log_reversion: Some(true),
        enable_pre_vote: Some(true),
        ..Default::default()
    }
}

/// How long sending one snapshot chunk may take, the last one including
/// the follower's install (unpack, fsync, open and check the image, swap
/// the directories, reopen the engine). openraft's 200 ms default never
/// let a follower under load finish an install of a few MB: it was sent
/// again and again while the group could not commit without it.
pub const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 60_000;

/// This node's leadership as the engine knows it.
struct Leading {
    leader_id: LeaderId,
    handle: Arc<Leader>,
}

/// What raft's storage, the state machine, the hand-off thread and the
/// role watcher share.
pub(crate) struct Glue {
    id: u64,
    /// The engine; replaced whole when a snapshot is installed.
    inbox: RwLock<Arc<Inbox>>,
    dir: std::path::PathBuf,
    role: Mutex<Role>,
    /// The last log id raft applied.
    applied: Mutex<Option<LogId>>,
    /// Bumped whenever rounds are discarded or the engine is replaced: a
    /// snapshot build that saw it change takes a new copy.
    epoch: AtomicU64,
    /// Rounds this node applied and then discarded (a deposed leader's
    /// tail, a follower's conflicting one), since start.
    discarded: AtomicU64,
    snapshots: Mutex<snapshot::Snapshots>,
    /// Rounds below this index were found deleted by the engine's own
    /// compaction (0: none found); raft was asked to purge past them.
    gone_below: AtomicU64,
    /// Held by the membership change in progress: one at a time.
    changing: Arc<tokio::sync::Mutex<()>>,
    /// Held by a snapshot build for its whole run, which raft's shutdown
    /// does not wait for: shutdown takes it, so that no build still
    /// writes beside or into the data directory once the node is down.
    building: Mutex<()>,
    /// The leader's reads share their read-index rounds.
    reads: Arc<reads::ReadBarrier>,
    /// How long appends and commits take (`commit_path.rs`).
    commit_path: Arc<commit_path::CommitPath>,
}

/// Guarded by one lock: every change of the engine's role and every
/// decision that depends on it (append, hand-off, commit).
pub(crate) struct Role {
    leading: Option<Leading>,
    /// The last index in raft's log (entries raft appended, or the
    /// engine's rounds found at start); `None` for an empty log.
    raft_last: Option<u64>,
    meta: meta::Meta,
    /// Recent entries as raft stored them, so that replication to a
    /// follower that is a little behind does not read the log.
    cache: cache::EntryCache,
    /// A raft handle for the hand-off thread, set once raft runs.
    raft: Option<InboxRaft>,
    /// Set while a proposal of the hand-off is queued and raft's core has
    /// not yet taken or refused it: [`Role::proposed`] is not settled.
    proposing: bool,
    /// The last index raft took from the hand-off in this leadership (at
    /// first, the index the leadership began after).
    proposed: u64,
    /// Set while raft writes membership entries on this leader: the
    /// hand-off proposes nothing, and the engine follows (see
    /// `membership.rs`).
    paused: bool,
}

impl Glue {
    fn role(&self) -> MutexGuard<'_, Role> {
        self.role.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine (the one a snapshot installed, after an install).
    pub(crate) fn inbox(&self) -> Arc<Inbox> {
        Arc::clone(&self.inbox.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Discards the engine's rounds from `from` on.
    fn discard_from(&self, from: u64) -> inbox_engine::Result<()> {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let inbox = self.inbox();
        let rounds = (inbox.replica_index() + 1).saturating_sub(from);
        inbox.discard_from(from)?;
        self.discarded
            .fetch_add(rounds, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Ends this node's leadership in the engine, if it leads: replies of
    /// rounds not committed fail with `NotLeader`, and rounds the engine
    /// made that never reached raft's log are discarded (no quorum can
    /// have them).
    fn step_down(&self, role: &mut Role) -> inbox_engine::Result<()> {
        role.paused = false;
        let Some(leading) = role.leading.take() else {
            return Ok(());
        };
        // The rounds this leadership did not commit never will: they fail
        // now, not when the sequencer reaches the step down. It may be
        // waiting for them first (a snapshot's copy drains the rounds in
        // hand), and every append waits for this lock meanwhile.
        leading.handle.end("another node leads");
        let inbox = self.inbox();
        inbox.follow()?;
        let keep = role.raft_last.unwrap_or(0);
        if inbox.replica_index() > keep {
            self.discard_from(keep + 1)?;
        }
        Ok(())
    }

    /// raft appended this node's blank entry of a new term (or the
    /// membership entries of a change, see `membership.rs`), the last at
    /// index `after`: the engine leads from the next round on, and a
    /// thread hands its rounds to raft.
    fn become_leader(self: &Arc<Self>, role: &mut Role, leader_id: LeaderId, after: u64) {
        // The engine's log may end in rounds this node appended as a
        // follower that raft has not committed yet (raft commits them with
        // this term's first entry): only what raft applied counts as
        // committed, so that no answer rests on the rest before then.
        let committed = self.applied().map_or(0, |id| id.index);
        let handle = match self.inbox().lead_after(committed) {
            Ok(l) => Arc::new(l),
            Err(e) => {
                tracing::error!(error = %e, "the engine cannot lead");
                role.leading = None;
                return;
            }
        };
        role.leading = Some(Leading {
            leader_id,
            handle: Arc::clone(&handle),
        });
        role.proposed = after;
        role.proposing = false;
        role.paused = false;
        self.commit_path.forget_proposals();
        tracing::info!(node = self.id, term = leader_id.term, "leading");
        tokio::spawn(Arc::clone(self).hand_off(handle));
    }

    /// The leader's hand-off, a task of raft's runtime: takes the engine's
    /// rounds in index order and proposes them to raft, while this
    /// leadership lasts. raft gives each the next index of its log, which
    /// is the index the engine gave it: nothing else is proposed on a
    /// leader while the hand-off runs (a membership change pauses it
    /// first, see `membership.rs`), and the lock keeps a proposal from
    /// crossing a change of role. Entries taken once the pause began are
    /// dropped: the pause discards them.
    ///
    /// The rounds in hand go as one proposal, and the next one waits until
    /// raft's core has taken or refused it ([`Glue::propose`]): openraft
    /// 0.10 refuses a leader's write while its lease is not valid (no
    /// quorum answered it within the longest election timeout, which is
    /// also the case of a leader just elected). A refused proposal is
    /// proposed again once the lease holds, unchanged, so that no later
    /// round ever takes its index.
    async fn hand_off(self: Arc<Self>, leader: Arc<Leader>) {
        let mut batch = Vec::new();
        // Whether the batch's proposal time is recorded (on its first try).
        let mut recorded = false;
        while !leader.is_ended() {
            if batch.is_empty() {
                batch = leader.next_entries().await;
                recorded = false;
                continue;
            }
            let outcome = self.propose(&leader, &batch, !recorded).await;
            recorded = true;
            match outcome {
                Proposal::Taken => batch.clear(),
                Proposal::Again => tokio::time::sleep(PROPOSE_AGAIN_AFTER).await,
                Proposal::Over => return,
            }
        }
    }

    /// Proposes `batch`, this leadership's next rounds, to raft as one
    /// write, and waits until raft's core has handled it: a request queued
    /// behind it is answered. raft takes or refuses a write whole (its
    /// leader checks the lease once per write), so the batch is in raft's
    /// log, at the indexes the engine gave it, or none of it is.
    ///
    /// The write is queued while the lock is held, with no await in
    /// between; a write whose queueing is not ready at once (raft's
    /// channel full) is not sent, and is tried again.
    /// `record`: the proposal time of the batch's rounds is recorded
    /// (`commit_path.rs`), once per batch.
    async fn propose(&self, leader: &Arc<Leader>, batch: &[Entry], record: bool) -> Proposal {
        let (first, last) = match (batch.first(), batch.last()) {
            (Some(f), Some(l)) => (f.index(), l.index()),
            _ => return Proposal::Taken,
        };
        if record {
            for index in first..=last {
                self.commit_path.proposed(index);
            }
        }
        let (raft, mut answers) = {
            let mut role = self.role();
            let current = role
                .leading
                .as_ref()
                .is_some_and(|l| Arc::ptr_eq(&l.handle, leader));
            let Some(raft) = role.raft.clone().filter(|_| current && !role.paused) else {
                return Proposal::Over;
            };
            let Some(answers) = propose_now(&raft, batch) else {
                return Proposal::Again;
            };
            role.proposing = true;
            (raft, answers)
        };
        // raft's core handles its requests in order: once this one is
        // answered, the write was taken or refused.
        let fenced = raft.with_raft_state(|_| ()).await.is_ok();
        // A refused write is answered at once; a taken one only when it
        // is applied.
        let refused = matches!(
            futures_util::FutureExt::now_or_never(futures_util::StreamExt::next(&mut answers)),
            Some(Some(Ok(Err(_))) | Some(Err(_)))
        );
        let mut role = self.role();
        role.proposing = false;
        let current = role
            .leading
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(&l.handle, leader));
        if !fenced || !current {
            return Proposal::Over;
        }
        if refused {
            tracing::debug!(
                node = self.id,
                first,
                last,
                "raft refused the rounds (its leader lease is not valid yet); proposing them again"
            );
            // A pause that began meanwhile discards them.
            return if role.paused {
                Proposal::Over
            } else {
                Proposal::Again
            };
        }
        role.proposed = last;
        Proposal::Taken
    }
}

/// How long the hand-off waits before it proposes again rounds raft
/// refused or could not queue.
const PROPOSE_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(2);

/// What became of one proposal of the hand-off.
enum Proposal {
    /// In raft's log.
    Taken,
    /// Refused or not queued: to be proposed again.
    Again,
    /// This leadership ended, or raft stopped, or a pause began: the
    /// hand-off ends.
    Over,
}

/// Reads the entries raft's start reads (the log after its applied
/// point, newest first, for the last membership) into the cache, in one
/// pass over the engine's log from its checkpoint, instead of one pass
/// per 64 entries. At most the cache's bound, the newest.
fn warm(inbox: &Inbox, meta: &meta::Meta, cache: &mut cache::EntryCache, from: u64, last: u64) {
    let from = from
        .max(last.saturating_sub(cache::ENTRIES_MAX as u64 - 1))
        .max(1);
    if from > last {
        return;
    }
    let started = std::time::Instant::now();
    let rounds = match inbox.read_entries(from, last) {
        Ok(rounds) => rounds,
        Err(e) => {
            tracing::warn!(error = %e, "reading the log's tail for raft's start");
            return;
        }
    };
    // Every index the log holds comes back (an empty round as an empty
    // entry); one that does not was compacted away and is left to a
    // read that reports it.
    for round in rounds {
        if let Some(e) = store::raft_entry_of(meta, round.index(), Some(&round)) {
            cache.push(round.index(), e);
        }
    }
    tracing::info!(
        from,
        last,
        ms = started.elapsed().as_millis() as u64,
        "raft log after the applied point read for start"
    );
}

/// Queues `batch` as one raft write, polled once: `None` if that was not
/// ready at once (raft's channel full, or raft stopped), and then nothing
/// was queued. The answers are the writes' outcomes (see
/// [`Glue::propose`]).
fn propose_now(raft: &InboxRaft, batch: &[Entry]) -> Option<WriteAnswers> {
    use std::future::Future;
    // tokio's cooperative budget could make a send pending with room in
    // the channel: the proposal is polled outside the budget.
    let proposal = std::pin::pin!(tokio::task::unconstrained(
        raft.client_write_many(batch.iter().map(|e| Round(e.encode())))
    ));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match proposal.poll(&mut cx) {
        std::task::Poll::Ready(Ok(answers)) => Some(answers),
        _ => None,
    }
}

/// The outcomes of one raft write of several entries, in order.
type WriteAnswers = futures_util::stream::BoxStream<
    'static,
    Result<openraft::raft::WriteResult<TypeConfig>, openraft::error::Fatal<TypeConfig>>,
>;

/// raft running on an engine.
pub struct Cluster {
    raft: InboxRaft,
    glue: Arc<Glue>,
    watcher: tokio::task::JoinHandle<()>,
    /// The raft port's accept loop, when this node serves one.
    port: Option<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    /// Starts raft for node `id` on `inbox` (opened on `dir`), which is
    /// made a follower first. Must run inside a multi-threaded tokio
    /// runtime.
    pub async fn start<N>(
        id: u64,
        inbox: Arc<Inbox>,
        dir: &Path,
        config: openraft::Config,
        network: N,
    ) -> Result<Cluster, ClusterError>
    where
        N: RaftNetworkFactory<TypeConfig>,
        N::Network:
            openraft::network::v2::RaftNetworkV2<TypeConfig, SnapshotData = tokio::fs::File>,
    {
        inbox.follow().map_err(|e| ClusterError(e.to_string()))?;
        // The exchange of directories an install does names the data
        // directory's parent: the path must have one.
        let dir = &dir
            .canonicalize()
            .map_err(|e| ClusterError(format!("{}: {e}", dir.display())))?;
        snapshot::remove_leftovers(dir).map_err(|e| ClusterError(e.to_string()))?;
        let meta = meta::Meta::load(dir).map_err(|e| ClusterError(e.to_string()))?;
        let index = inbox.replica_index();
        let raft_last = if index > 0 {
            Some(index)
        } else {
            meta.memberships.contains_key(&0).then_some(0)
        };
        // raft's applied point at start: the kept snapshot's, when it is
        // past the purge (a build or an install is durable before raft
        // purges its log up to it, and a node can stop in between). A
        // snapshot is built only from rounds raft applied, or installed
        // committed, so its index is committed. raft refuses to start with
        // a snapshot past its applied point.
        let snapshots = snapshot::Snapshots::load(dir);
        // Or the applied point last saved, which is committed: raft's
        // start then reads the log only after it. It is never past the
        // engine's log, whose rounds were durable before raft applied
        // them.
        let saved = meta
            .applied
            .filter(|id| raft_last.is_some_and(|last| id.index <= last));
        let applied = meta.purged.max(snapshots.last_log_id()).max(saved);
        let mut cache = cache::EntryCache::default();
        if let (Some(from), Some(last)) = (applied.map(|id| id.index + 1), raft_last) {
            warm(&inbox, &meta, &mut cache, from, last);
        }
        let glue = Arc::new(Glue {
            id,
            inbox: RwLock::new(inbox),
            dir: dir.to_path_buf(),
            role: Mutex::new(Role {
                leading: None,
                raft_last,
                meta,
                cache,
                raft: None,
                proposing: false,
                proposed: 0,
                paused: false,
            }),
            applied: Mutex::new(applied),
            epoch: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            snapshots: Mutex::new(snapshots),
            gone_below: AtomicU64::new(0),
            changing: Arc::new(tokio::sync::Mutex::new(())),
            building: Mutex::new(()),
            reads: Arc::default(),
            commit_path: Arc::default(),
        });
        let config = Arc::new(config.validate().map_err(|e| ClusterError(e.to_string()))?);
        let log = LogStore::new(Arc::clone(&glue));
        let sm = StateMachine::new(Arc::clone(&glue));
        let network = gap::Factory {
            inner: network,
            glue: Arc::clone(&glue),
        };
        let raft = Raft::new(id, config, network, log, sm)
            .await
            .map_err(|e| ClusterError(e.to_string()))?;
        glue.role().raft = Some(raft.clone());
        let watcher = tokio::spawn(watch_role(raft.clone(), Arc::clone(&glue)));
        Ok(Cluster {
            raft,
            glue,
            watcher,
            port: None,
        })
    }

    /// `inboxd serve`'s group: binds the raft port, starts raft over TCP
    /// with the group's shared token (connecting from the raft port's IP,
    /// see `network::source_ip`), and writes the first membership if this
    /// node bootstraps and its log is empty.
    pub async fn serve(
        config: &crate::config::ClusterConfig,
        inbox: Arc<Inbox>,
        dir: &Path,
        token: Arc<[u8]>,
    ) -> Result<Cluster, ClusterError> {
        let listener = tokio::net::TcpListener::bind(config.raft_listen)
            .await
            .map_err(|e| ClusterError(format!("cannot listen on {}: {e}", config.raft_listen)))?;
        let mut net = network::TcpNetwork::new(Arc::clone(&token));
        if let Some(ip) = network::source_ip(config.raft_listen) {
            net = net.with_source(ip);
        }
        let raft_config = openraft::Config {
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: KEEP_BEHIND_SNAPSHOT.min(config.snapshot_every),
            ..default_config()
        };
        let mut node = Cluster::start(config.node_id, inbox, dir, raft_config, net).await?;
        node.port = Some(tokio::spawn(network::serve(
            listener,
            node.raft.clone(),
            node.snapshot_receiver(),
            token,
        )));
        let initialized = node
            .raft
            .is_initialized()
            .await
            .map_err(|e| ClusterError(e.to_string()))?;
        if config.bootstrap && !initialized {
            node.initialize(config.peers.clone()).await?;
            tracing::info!(
                node = config.node_id,
                members = config.peers.len(),
                "group membership written"
            );
        }
        tracing::info!(node = config.node_id, raft_listen = %config.raft_listen, "raft serving");
        Ok(node)
    }

    /// The raft handle (metrics, membership, linearizable reads).
    pub fn raft(&self) -> &InboxRaft {
        &self.raft
    }

    /// The engine: the one a snapshot installed, after an install (the
    /// engine given to [`Cluster::start`] is shut down then).
    pub fn inbox(&self) -> Arc<Inbox> {
        self.glue.inbox()
    }

    /// Where this node's raft port hands incoming snapshot chunks.
    pub fn snapshot_receiver(&self) -> SnapshotReceiver {
        SnapshotReceiver {
            glue: Arc::clone(&self.glue),
            raft: self.raft.clone(),
        }
    }

    /// Writes the first membership: only on an empty log, on one node.
    pub async fn initialize(&self, members: BTreeMap<u64, Peer>) -> Result<(), ClusterError> {
        self.raft
            .initialize(members)
            .await
            .map_err(|e| ClusterError(e.to_string()))
    }

    /// Forgets the recent entries kept in memory, so that replication
    /// reads the engine's log, as after a restart (tests).
    #[doc(hidden)]
    pub fn forget_recent_entries(&self) {
        self.glue.role().cache.clear();
    }

    /// Whether the engine currently leads (its writes go through raft).
    pub fn is_leading(&self) -> bool {
        self.glue.role().leading.is_some()
    }

    /// What the client port asks about this node's role.
    pub fn handle(&self) -> GroupHandle {
        GroupHandle {
            glue: Arc::clone(&self.glue),
            raft: self.raft.clone(),
        }
    }

    /// Stops raft; the engine stays a follower and can be shut down.
    pub async fn shutdown(self) {
        self.watcher.abort();
        if let Some(port) = &self.port {
            port.abort();
        }
        let _ = self.raft.shutdown().await;
        {
            let mut role = self.glue.role();
            role.raft = None;
            if let Err(e) = self.glue.step_down(&mut role) {
                tracing::warn!(error = %e, "stepping down at shutdown");
            }
        }
        // A build in flight sees raft gone and ends soon; wait for it.
        let glue = Arc::clone(&self.glue);
        let _ = tokio::task::spawn_blocking(move || {
            drop(glue.building.lock().unwrap_or_else(|p| p.into_inner()));
        })
        .await;
    }
}

/// The client port's view of the group: whether this node leads, and who
/// does.
#[derive(Clone)]
pub struct GroupHandle {
    glue: Arc<Glue>,
    raft: InboxRaft,
}

impl GroupHandle {
    /// The engine (replaced whole when a snapshot is installed).
    pub fn inbox(&self) -> Arc<Inbox> {
        self.glue.inbox()
    }

    /// Snapshots this node built and installed since it started.
    pub fn snapshot_counts(&self) -> SnapshotCounts {
        self.glue.snapshots().counts
    }

    /// Where this node's raft log starts: the index of its last snapshot
    /// and the last index it purged (0 for none), from raft's metrics.
    pub fn log_bounds(&self) -> LogBounds {
        let m = self.raft.metrics().borrow_watched().clone();
        LogBounds {
            snapshot_index: m.snapshot.map_or(0, |id| id.index),
            purged_index: m.purged.map_or(0, |id| id.index),
        }
    }

    /// Whether the engine currently leads and takes writes (not while
    /// a membership change pauses them).
    pub fn is_leading(&self) -> bool {
        let role = self.glue.role();
        role.leading.is_some() && !role.paused
    }

    /// The leader raft knows of, with its addresses.
    pub fn leader(&self) -> Option<(u64, Peer)> {
        let m = self.raft.metrics().borrow_watched().clone();
        let id = m.current_leader?;
        let peer = m.membership_config.membership().get_node(&id)?.clone();
        Some((id, peer))
    }

    /// The engine's current leadership, if this node leads: a read takes
    /// it before it reads, and [`GroupHandle::settle_read`] after.
    pub fn leadership(&self) -> Option<Arc<Leader>> {
        let role = self.glue.role();
        role.leading
            .as_ref()
            .filter(|_| !role.paused)
            .map(|l| Arc::clone(&l.handle))
    }

    /// Waits until every round the engine had applied when a read ended is
    /// committed, under the leadership the read began in: a leader applies
    /// its rounds before they commit, so without this wait a read could
    /// answer with a round the group then discards. `NOT_LEADER` if that
    /// leadership ends first.
    pub async fn settle_read(&self, leadership: &Leader) -> Result<(), inbox_wire::ErrorReply> {
        leadership
            .settled()
            .await
            .map_err(|e| self.not_leader(&e.to_string()))
    }

    /// Read-index: confirms with a heartbeat round to a quorum that this
    /// node still leads and waits until it has applied what was committed
    /// when the read arrived, so the read that follows is linearizable. A
    /// leader that cannot confirm (cut off, deposed) within a few election
    /// timeouts answers `NOT_LEADER`.
    ///
    /// Reads that arrive together share one round (`reads.rs`).
    pub async fn read_index(&self) -> Result<(), inbox_wire::ErrorReply> {
        self.glue
            .reads
            .confirm(&self.raft)
            .await
            .map_err(|why| self.not_leader(&why))
    }

    /// The recent raft entries kept in memory for replication: how many,
    /// and the bytes of their rounds.
    pub fn entry_cache(&self) -> (usize, usize) {
        self.glue.role().cache.held()
    }

    /// How long this member's appends took to be durable and, on the
    /// leader, its rounds from proposal to commit, since start.
    pub fn commit_path(&self) -> CommitPathFigures {
        self.glue.commit_path.figures()
    }

    /// Rounds this node applied and then discarded since start.
    pub fn rounds_discarded(&self) -> u64 {
        self.glue
            .discarded
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Read-index rounds run since start (each served every read that
    /// waited for it).
    pub fn read_rounds(&self) -> u64 {
        self.glue.reads.rounds()
    }

    /// The `NOT_LEADER` reply: the leader's client address, when it is
    /// known, in `leader_addr` (version 3), and for older clients at the
    /// end of the message too (`; leader_addr=HOST:PORT`, their only way to
    /// learn it).
    pub fn not_leader(&self, message: &str) -> inbox_wire::ErrorReply {
        let paused = self.glue.role().paused;
        let (message, leader_addr) = match self.leader() {
            _ if paused => (
                format!(
                    "{message}; this leader pauses its writes while the group's membership changes; retry shortly"
                ),
                None,
            ),
            Some((id, peer)) if id != self.glue.id => (
                format!("{message}; leader node {id}; leader_addr={}", peer.client_addr),
                Some(peer.client_addr.clone()),
            ),
            _ => (format!("{message}; no leader known yet"), None),
        };
        inbox_wire::ErrorReply {
            code: inbox_wire::ErrorCode::NotLeader,
            detail: 0,
            message,
            leader_addr,
        }
    }
}

/// Steps the engine down as soon as raft reports a term past the one this
/// node leads in (a leader only loses its leadership to a higher term), or
/// stops. Earlier states of the same term (the candidacy that preceded the
/// leadership) may be reported late and are not a loss.
async fn watch_role(raft: InboxRaft, glue: Arc<Glue>) {
    let mut rx = raft.metrics();
    loop {
        let (term, state) = {
            let m = rx.borrow_and_update();
            (m.current_term, m.state)
        };
        let lost = move |role: &Role| {
            role.leading
                .as_ref()
                .is_some_and(|l| term > l.leader_id.term || state == ServerState::Shutdown)
        };
        if lost(&glue.role()) {
            // The step down waits for the engine's sequencer: off the
            // tokio workers, which serve every connection.
            let g = Arc::clone(&glue);
            let stepped = tokio::task::spawn_blocking(move || {
                let mut role = g.role();
                if lost(&role) {
                    if let Err(e) = g.step_down(&mut role) {
                        tracing::error!(error = %e, "stepping down");
                    }
                }
            })
            .await;
            if stepped.is_err() {
                return;
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// A cluster that could not start or act.
#[derive(Debug, thiserror::Error)]
#[error("cluster: {0}")]
pub struct ClusterError(pub String);

#[cfg(test)]
mod tests {
    use crate::config::{parse_peers, Config, ServeArgs};

    #[test]
    fn a_peer_list_parses_and_a_bad_one_is_refused() {
        let p = parse_peers("1=10.0.0.1:7080/10.0.0.1:7070, 2=h2:7080/h2:7070").unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[&1].raft_addr, "10.0.0.1:7080");
        assert_eq!(p[&2].client_addr, "h2:7070");
        for bad in [
            "1=a:1",
            "x=a:1/b:2",
            "1=a:1/b:2,1=c:1/d:2",
            "1=/b:2",
            "1a:1/b:2",
        ] {
            assert!(parse_peers(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn without_cluster_settings_serve_is_a_single_node() {
        let c = Config::resolve(&ServeArgs::default()).unwrap();
        assert_eq!(c.cluster, None);
    }

    #[test]
    fn cluster_settings_go_together_and_the_lowest_id_bootstraps() {
        let peers = "1=a:1/a:2,2=b:1/b:2,3=c:1/c:2".to_string();
        let args = |id: u64| ServeArgs {
            node_id: Some(id),
            raft_listen: Some("127.0.0.1:7080".parse().unwrap()),
            peers: Some(peers.clone()),
            ..ServeArgs::default()
        };
        let one = Config::resolve(&args(1)).unwrap().cluster.unwrap();
        assert!(one.bootstrap);
        assert_eq!(one.peers.len(), 3);
        let two = Config::resolve(&args(2)).unwrap().cluster.unwrap();
        assert!(!two.bootstrap);
        let forced = ServeArgs {
            bootstrap: Some(true),
            ..args(2)
        };
        assert!(Config::resolve(&forced).unwrap().cluster.unwrap().bootstrap);
        // Not a member of its own list.
        assert!(Config::resolve(&args(4)).is_err());
        // A part alone is refused.
        let partial = ServeArgs {
            peers: None,
            ..args(1)
        };
        assert!(Config::resolve(&partial).is_err());
        let only_bootstrap = ServeArgs {
            bootstrap: Some(true),
            ..ServeArgs::default()
        };
        assert!(Config::resolve(&only_bootstrap).is_err());
    }

    #[test]
    fn snapshots_come_every_50000_rounds_unless_set_by_flag_or_toml() {
        let peers = "1=a:1/a:2,2=b:1/b:2,3=c:1/c:2".to_string();
        let args = ServeArgs {
            node_id: Some(1),
            raft_listen: Some("127.0.0.1:7080".parse().unwrap()),
            peers: Some(peers.clone()),
            ..ServeArgs::default()
        };
        let every = |a: &ServeArgs| Config::resolve(a).unwrap().cluster.unwrap().snapshot_every;
        assert_eq!(every(&args), super::SNAPSHOT_EVERY);
        let set = ServeArgs {
            snapshot_every: Some(500),
            ..args.clone()
        };
        assert_eq!(every(&set), 500);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inboxd.toml");
        std::fs::write(&path, "snapshot_every = 7\n").unwrap();
        let from_file = ServeArgs {
            config: Some(path),
            ..args
        };
        assert_eq!(every(&from_file), 7);
    }
}
