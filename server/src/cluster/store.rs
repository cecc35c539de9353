//! raft's log storage and state machine over the engine.
//!
//! The engine's `evt` log is the raft log: entry `i` is the engine's round
//! with replication index `i` (raft's own entries, a new leader's blank
//! entry and membership changes, are empty rounds), and its term is in the
//! raft metadata file (`meta.rs`). Entry 0, raft's initial membership, is
//! in that file only.
//!
//! **Append applies.** A follower applies each entry to its engine when
//! raft appends it, not when raft commits it: the round's batch in the
//! `evt` log is both the stored raft entry and its effect, so one write
//! and one fdatasync make it durable. This is safe because a follower
//! serves no reads (every request is answered `NOT_LEADER`), so effects of
//! an uncommitted entry are never observed; and when raft truncates a
//! conflicting tail, `Inbox::discard_from` cuts the log before it and
//! rebuilds the state from checkpoint and log, as after a restart. On the
//! leader the engine made the round itself and it is already in the log:
//! append only waits for it to be durable. The state machine's `apply`
//! then has nothing left to change: on the leader it tells the engine the
//! round is committed, which releases the round's replies.

use std::ops::{Bound, RangeBounds};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use futures_util::StreamExt as _;
use inbox_engine::inbox::{Entry, Leader, Pending};
use openraft::storage::{EntryResponder, IOFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{LogState, RaftLogReader};

use super::commit_path::CommitPath;
use super::{EntryPayload, LogId, RaftEntry, Snapshot, SnapshotMeta, StoredMembership, Vote};
use super::{Glue, Role, Round, TypeConfig};

/// openraft 0.10's storage traits report plain IO errors; raft tells
/// which operation failed.
type StorageResult<T> = Result<T, std::io::Error>;

fn write_err(e: impl ToString) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

fn read_err(e: impl ToString) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// One append's wait for durability, done off raft's task, in order.
struct Flush {
    /// When raft called the append, and how many entries it carried.
    started: Instant,
    entries: u64,
    applied: Vec<Pending<()>>,
    own: Option<Arc<Leader>>,
    callback: IOFlushed<TypeConfig>,
}

/// Waits for each append to be durable, in order, and tells raft. A task
/// of raft's runtime, not a thread of its own: a follower's append is
/// released by its sequencer's reply, which wakes this task where raft's
/// task will take the callback, so no other thread is woken in between.
/// The leader's own rounds are already in its log; their wait
/// ([`Leader::flush`]) blocks, so it runs on the blocking pool.
async fn run_flusher(mut rx: mpsc::UnboundedReceiver<Flush>, path: Arc<CommitPath>) {
    while let Some(job) = rx.recv().await {
        let mut result = Ok(());
        for p in job.applied {
            if let Err(e) = p.await {
                result = Err(std::io::Error::other(e.to_string()));
            }
        }
        if let (Ok(()), Some(leader)) = (&result, job.own) {
            let flushed = tokio::task::spawn_blocking(move || leader.flush()).await;
            match flushed {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(std::io::Error::other(e.to_string())),
                Err(e) => result = Err(std::io::Error::other(e.to_string())),
            }
        }
        if result.is_ok() {
            path.appended(job.entries, job.started);
        }
        job.callback.io_completed(result);
    }
}

/// raft's log storage (and its log reader) over the engine.
#[derive(Clone)]
pub struct LogStore {
    glue: Arc<Glue>,
    flusher: mpsc::UnboundedSender<Flush>,
}

impl LogStore {
    /// Must run inside the tokio runtime raft runs on: the flusher is a
    /// task of it.
    pub(crate) fn new(glue: Arc<Glue>) -> LogStore {
        let (flusher, rx) = mpsc::unbounded_channel();
        let path = Arc::clone(&glue.commit_path);
        tokio::spawn(run_flusher(rx, path));
        LogStore { glue, flusher }
    }
}

/// Rebuilds raft's entry `index` from the engine's round (none for
/// index 0) and the metadata.
fn raft_entry(role: &Role, index: u64, round: Option<&Entry>) -> StorageResult<RaftEntry> {
    raft_entry_of(&role.meta, index, round).ok_or_else(|| read_err("raft entry 0 is not stored"))
}

/// [`raft_entry`] from the metadata alone; `None` for index 0.
pub(crate) fn raft_entry_of(
    meta: &super::meta::Meta,
    index: u64,
    round: Option<&Entry>,
) -> Option<RaftEntry> {
    let log_id = LogId::new(meta.leader_at(index), index);
    let payload = match round {
        Some(r) if !r.is_empty() => EntryPayload::Normal(Round(r.encode())),
        _ => match meta.memberships.get(&index) {
            Some(m) => EntryPayload::Membership(m.clone()),
            None if index == 0 => return None,
            None => EntryPayload::Blank,
        },
    };
    Some(RaftEntry { log_id, payload })
}

impl LogStore {
    /// The entries of `start..end` (`end` clamped to the last). A round the
    /// engine's own compaction deleted is an error, or with `partial` the
    /// end of the answer: the entries before it are returned, and when the
    /// first one is gone raft is asked to purge its log past it (see
    /// [`Glue::compacted_away`]), after which it sends that follower a
    /// snapshot.
    fn read_range(&self, start: u64, end: u64, partial: bool) -> StorageResult<Vec<RaftEntry>> {
        let role = self.glue.role();
        let Some(last) = role.raft_last else {
            return Ok(Vec::new());
        };
        let end = end.min(last + 1);
        if start >= end {
            return Ok(Vec::new());
        }
        let gone_below = self.glue.gone_below.load(Ordering::Acquire);
        if partial && start < gone_below && !role.cache.contains(start) {
            // Known to be compacted away: not read again while raft purges.
            return Ok(Vec::new());
        }
        // What the cache lacks is read back from the log in one pass.
        let missing: Vec<u64> = (start.max(1)..end)
            .filter(|&i| !role.cache.contains(i))
            .collect();
        let mut rounds = std::collections::BTreeMap::new();
        if let (Some(&lo), Some(&hi)) = (missing.first(), missing.last()) {
            for r in self.glue.inbox().read_entries(lo, hi).map_err(read_err)? {
                rounds.insert(r.index(), r);
            }
        }
        let mut out = Vec::with_capacity((end - start) as usize);
        for i in start..end {
            if let Some(e) = role.cache.get(i) {
                out.push(e.clone());
                continue;
            }
            let round = rounds.get(&i);
            if i > 0 && round.is_none() {
                if partial {
                    if out.is_empty() {
                        // Every round up to the first one still held is gone.
                        let held = rounds.keys().next().copied().unwrap_or(end);
                        drop(role);
                        self.glue.compacted_away(held);
                    }
                    return Ok(out);
                }
                return Err(read_err(format!(
                    "raft entry {i} is no longer in this node's log (compacted); the follower needs a snapshot"
                )));
            }
            out.push(raft_entry(&role, i, round)?);
        }
        Ok(out)
    }
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&i) => i,
        Bound::Excluded(&i) => i + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&i) => i.saturating_add(1),
        Bound::Excluded(&i) => i,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<RaftEntry>> {
        let (start, end) = bounds(&range);
        self.read_range(start, end, false)
    }

    /// Replication's read: stops before a round compaction deleted.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> StorageResult<Vec<RaftEntry>> {
        self.read_range(start, end, true)
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote>> {
        Ok(self.glue.role().meta.vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let role = self.glue.role();
        let last = role
            .raft_last
            .map(|i| LogId::new(role.meta.leader_at(i), i));
        Ok(LogState {
            last_purged_log_id: role.meta.purged,
            last_log_id: last.or(role.meta.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> StorageResult<()> {
        let mut role = self.glue.role();
        role.meta.vote = Some(*vote);
        role.meta.store(&self.glue.dir)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = RaftEntry> + Send,
        I::IntoIter: Send,
    {
        let started = Instant::now();
        let entries: Vec<RaftEntry> = entries.into_iter().collect();
        let count = entries.len() as u64;
        let glue = &self.glue;
        let mut role = glue.role();
        // The terms and memberships first, durably: a round is never in
        // the log without them.
        let before = role.meta.clone();
        for e in &entries {
            role.meta.note(e.log_id.index, e.log_id.leader_id);
            if let EntryPayload::Membership(m) = &e.payload {
                role.meta.memberships.insert(e.log_id.index, m.clone());
            }
        }
        if role.meta != before {
            role.meta.store(&glue.dir).map_err(write_err)?;
        }
        let mut applied = Vec::new();
        let mut own = None;
        for e in entries {
            let index = e.log_id.index;
            let leading = role
                .leading
                .as_ref()
                .filter(|l| l.leader_id == e.log_id.leader_id)
                .map(|l| Arc::clone(&l.handle));
            match (&e.payload, leading) {
                _ if index == 0 => {}
                (EntryPayload::Normal(round), Some(leader)) => {
                    // This leader's own round: the engine wrote it before
                    // handing it over; only its durability is awaited.
                    let entry = Entry::decode(&round.0).map_err(write_err)?;
                    if entry.index() != index || glue.inbox().replica_index() < index {
                        return Err(write_err(format!(
                            "raft entry {index} holds round {} the engine does not have there",
                            entry.index()
                        )));
                    }
                    own = Some(leader);
                }
                (_, Some(_)) if role.paused => {
                    // raft's own entry (a membership change) written by
                    // this leader while its rounds are paused: the engine
                    // follows, with nothing past the rounds proposed, so
                    // the entry takes the engine's next index as an empty
                    // round (see `membership.rs`).
                    applied.push(glue.inbox().apply_entry(Entry::empty(index)));
                }
                (payload, _) => {
                    // Another leader's entry, or raft's own: this node
                    // follows, and a tail of its log that raft does not
                    // hold is dropped before the entry is applied.
                    glue.step_down(&mut role).map_err(write_err)?;
                    if glue.inbox().replica_index() >= index {
                        glue.discard_from(index).map_err(write_err)?;
                    }
                    let entry = match payload {
                        EntryPayload::Normal(round) => {
                            Entry::decode(&round.0).map_err(write_err)?
                        }
                        _ => Entry::empty(index),
                    };
                    if entry.index() != index {
                        return Err(write_err(format!(
                            "raft entry {index} holds round {}",
                            entry.index()
                        )));
                    }
                    applied.push(glue.inbox().apply_entry(entry));
                    if matches!(payload, EntryPayload::Blank) && is_my_new_term(&role, glue.id, &e)
                    {
                        glue.become_leader(&mut role, e.log_id.leader_id, index);
                    }
                }
            }
            role.raft_last = Some(index);
            role.cache.push(index, e);
        }
        drop(role);
        self.flusher
            .send(Flush {
                started,
                entries: count,
                applied,
                own,
                callback,
            })
            .map_err(|_| write_err("the raft log flusher stopped"))
    }

    /// Drops the entries after `last` (all of them for `None`).
    async fn truncate_after(&mut self, last: Option<LogId>) -> StorageResult<()> {
        let index = last.map_or(0, |l| l.index + 1);
        let glue = &self.glue;
        let mut role = glue.role();
        glue.step_down(&mut role).map_err(write_err)?;
        if index > 0 && glue.inbox().replica_index() >= index {
            glue.discard_from(index).map_err(write_err)?;
        }
        role.meta.cut_from(index);
        role.meta.store(&glue.dir).map_err(write_err)?;
        role.cache.cut_from(index);
        role.raft_last = index.checked_sub(1);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> StorageResult<()> {
        // The engine compacts its own files; raft only forgets the ids.
        let mut role = self.glue.role();
        role.meta.purged = Some(log_id);
        role.meta.store(&self.glue.dir).map_err(write_err)?;
        role.cache.drop_through(log_id.index);
        Ok(())
    }
}

/// A blank entry this node wrote as the leader of the term it voted for
/// itself in: raft made this node leader.
fn is_my_new_term(role: &Role, id: u64, e: &RaftEntry) -> bool {
    e.log_id.leader_id.node_id == id
        && role.meta.vote.is_some_and(|v| {
            v.leader_id.node_id == id && v.leader_id.term == e.log_id.leader_id.term
        })
}

/// raft's state machine: the engine already applied every entry when it
/// was appended (see the module documentation), so applying records the
/// applied log id and the membership, and on the leader commits the
/// engine's rounds. Snapshots: `snapshot.rs`.
pub struct StateMachine {
    glue: Arc<Glue>,
    applied: Option<LogId>,
    membership: StoredMembership,
}

impl StateMachine {
    /// After a restart raft's applied point is the last snapshot's (what
    /// its log no longer holds); what the log holds after it raft applies
    /// again, which changes nothing in the engine.
    pub(crate) fn new(glue: Arc<Glue>) -> StateMachine {
        let applied = glue.applied();
        let membership = applied
            .and_then(|a| {
                let role = glue.role();
                let (&i, m) = role.meta.memberships.range(..=a.index).next_back()?;
                Some(StoredMembership::new(
                    Some(LogId::new(role.meta.leader_at(i), i)),
                    m.clone(),
                ))
            })
            .unwrap_or_default();
        StateMachine {
            glue,
            applied,
            membership,
        }
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = tokio::fs::File;
    type SnapshotBuilder = super::snapshot::Builder;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId>, StoredMembership)> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> StorageResult<()>
    where
        S: futures_util::Stream<Item = Result<EntryResponder<TypeConfig>, std::io::Error>>
            + Unpin
            + Send,
    {
        while let Some(next) = entries.next().await {
            let (e, responder) = next?;
            if let EntryPayload::Membership(m) = &e.payload {
                self.membership = StoredMembership::new(Some(e.log_id), m.clone());
            }
            self.applied = Some(e.log_id);
            // The engine answers the round's clients itself (on commit,
            // below); raft's own callers (a membership change) get `()`.
            if let Some(r) = responder {
                r.send(());
            }
        }
        self.glue.set_applied(self.applied);
        if let Some(applied) = self.applied {
            let mut role = self.glue.role();
            if let Some(l) = &role.leading {
                l.handle.commit(applied.index);
                self.glue.commit_path.committed(applied.index);
            }
            let saved = role.meta.applied.map_or(0, |id| id.index);
            if applied.index >= saved + super::meta::APPLIED_SAVE_EVERY {
                role.meta.applied = Some(applied);
                // Only a hint for the next start: a failed write leaves
                // the older one, which is still applied.
                if let Err(e) = role.meta.store(&self.glue.dir) {
                    tracing::warn!(error = %e, "saving raft's applied point");
                }
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        super::snapshot::Builder {
            glue: Arc::clone(&self.glue),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: tokio::fs::File,
    ) -> StorageResult<()> {
        let glue = Arc::clone(&self.glue);
        let m = meta.clone();
        // A write of raft's still in flight finishes here, and its error
        // is reported (which `into_std` alone would drop).
        let mut snapshot = snapshot;
        tokio::io::AsyncWriteExt::flush(&mut snapshot)
            .await
            .map_err(|e| snapshot_err(meta, e))?;
        let file = snapshot.into_std().await;
        tokio::task::spawn_blocking(move || glue.install_snapshot(&m, file))
            .await
            .map_err(|e| snapshot_err(meta, e))?
            .map_err(|e| snapshot_err(meta, e))?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot>> {
        Ok(self.glue.current_snapshot())
    }
}

fn snapshot_err(meta: &SnapshotMeta, e: impl ToString) -> std::io::Error {
    std::io::Error::other(format!(
        "installing the snapshot up to {:?}: {}",
        meta.last_log_id.map(|l| l.index),
        e.to_string()
    ))
}
