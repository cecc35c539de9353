//! What the sequencer, the completion stage, the background threads and
//! the readers share: the state behind its lock, the two logs, round
//! progress and the poison flag.

use std::sync::atomic::AtomicU64;

use parking_lot::{Condvar, Mutex, RwLock};

use super::compaction::runtime::Runtime as CompactionRuntime;
use super::config::InboxConfig;
use super::recover::RecoveryReport;
use super::snapshots::store::Store as SnapshotStore;
use super::state::State;
use crate::api::*;
use crate::error::{Error, Result};
use crate::log::{Log, LogError};

/// Why one attempt at a read gave no answer.
#[derive(Debug)]
pub(crate) enum Miss {
    /// The answer is this error.
    Err(Error),
    /// A row it would return was changed in this round, which has not
    /// settled yet: wait for it and read again.
    Unsettled(u64),
    /// An attempt made where IO is not allowed would read log records the
    /// page cache may not hold: attempt again where it is.
    NeedsIo,
}

impl From<Error> for Miss {
    fn from(e: Error) -> Self {
        Miss::Err(e)
    }
}

/// Runs `attempt` until it answers, blocking the thread on unsettled
/// rounds: for plain threads (tests, the blocking API).
pub(crate) fn blocking<T>(
    shared: &Shared,
    mut attempt: impl FnMut() -> std::result::Result<T, Miss>,
) -> Result<T> {
    loop {
        match attempt() {
            Ok(v) => return Ok(v),
            Err(Miss::Err(e)) => return Err(e),
            Err(Miss::Unsettled(round)) => shared.wait_settled(round),
            // A plain thread may do IO: an attempt made here never asks.
            Err(Miss::NeedsIo) => {
                return Err(Error::Internal("a read allowed IO asked for IO".into()))
            }
        }
    }
}

/// Called on the checkpoint writer's thread with the LSN of each
/// checkpoint before its file is written (tests hold the writer there).
pub(crate) type CheckpointHook = std::sync::Arc<dyn Fn(u64) + Send + Sync>;

/// A committed-high-watermark hint for push subscribers (R16): the user's
/// events up to `committed_sync_seq` are durable and can be synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hint {
    pub uid: Uid,
    pub committed_sync_seq: SyncSeq,
}

/// A large group's durable head moved (R7, R16): its members' markers may
/// be dirty now. Large groups write no event per member, so this is the
/// only push that tells their online devices; see
/// [`crate::inbox::Inbox::dirty_markers_among`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LargeGroupHint {
    pub conv: ConvId,
    pub head: MsgSeq,
}

#[derive(Default)]
pub(crate) struct Progress {
    /// Every round up to this one is finished (durable or failed).
    pub(crate) settled: u64,
    /// Set on the first write/fsync failure: the first round that may not
    /// be durable, and why.
    pub(crate) poisoned: Option<(u64, String)>,
}

/// What the sequencer, the completion stage and readers share.
pub(crate) struct Shared {
    pub(crate) config: InboxConfig,
    pub(crate) state: RwLock<State>,
    pub(crate) msg_log: Log,
    pub(crate) evt_log: Log,
    pub(crate) progress: Mutex<Progress>,
    /// Rounds waiting to be finished, in order (`sequencer/completion.rs`).
    pub(crate) completions: super::sequencer::completion_queue::Completions,
    pub(crate) progress_cv: Condvar,
    /// The settled round and whether the engine is poisoned, for readers
    /// that must not block a thread while they wait (async servers): the
    /// same news as `progress_cv`, as a value they can await.
    pub(crate) settled_watch: tokio::sync::watch::Sender<(u64, bool)>,
    pub(crate) hints: tokio::sync::broadcast::Sender<Vec<Hint>>,
    pub(crate) large_group_hints: tokio::sync::broadcast::Sender<Vec<LargeGroupHint>>,
    pub(crate) rounds_written: AtomicU64,
    /// Whether the sequencer holds the write pipeline on one CPU now
    /// (`crate::placement`).
    pub(crate) pipeline_on_one_cpu: std::sync::atomic::AtomicBool,
    /// Rounds decided without applying because the disk had no room.
    pub(crate) rounds_refused_for_space: AtomicU64,
    /// State reloads after a submit refused for space (the fallback).
    pub(crate) state_reloads_for_space: AtomicU64,
    pub(crate) recovery: RecoveryReport,
    pub(crate) snapshots: SnapshotStore,
    pub(crate) compaction: CompactionRuntime,
    pub(crate) checkpoint_hook: Mutex<Option<CheckpointHook>>,
    /// LSNs of the retained checkpoints known to be durable (renamed and
    /// the directory fsynced), newest first: compaction counts coverage by
    /// these, never by a file that a crash could still take back.
    pub(crate) checkpoints: Mutex<Vec<u64>>,
    /// Where replicated rounds start in the `evt` log: `index -> lsn`
    /// means every round after replication index `index` is in a batch
    /// after LSN `lsn` (a consistent state's pair: a checkpoint's, taken
    /// at open and at each checkpoint). Reading rounds back starts at the
    /// nearest pair below, not at the log's start.
    pub(crate) round_bases: Mutex<std::collections::BTreeMap<u64, u64>>,
    /// Bytes of the newest durable checkpoint (0: none yet): what the next
    /// periodic checkpoint waits for a share of
    /// (`checkpoint_every_state_percent`).
    pub(crate) newest_checkpoint_bytes: AtomicU64,
    /// The durable ACK of each device whose newest changes, not yet
    /// durable, moved only its ACK: later pages of its batch need not wait
    /// for them ([`super::devices::ack_view`]).
    pub(crate) ack_views: super::devices::ack_view::AckViews,
    /// `last_seen` refreshes queued by syncs and not yet decided: a device
    /// list waits for them ([`super::devices::touches`]).
    pub(crate) touches: std::sync::Arc<super::devices::touches::PendingTouches>,
}

impl Shared {
    /// Notes that every round after replication index `index` is in a
    /// batch after `evt` LSN `lsn` (see `round_bases`). Keeps the newest
    /// few: an older range is read from the log's start.
    pub(crate) fn note_round_base(&self, index: u64, lsn: u64) {
        const KEPT: usize = 16;
        let mut bases = self.round_bases.lock();
        bases.insert(index, lsn);
        while bases.len() > KEPT {
            bases.pop_first();
        }
    }

    /// The `evt` LSN to read round `index` back from: every round from
    /// `index` on is in a batch after it.
    pub(crate) fn round_base_below(&self, index: u64) -> u64 {
        let bases = self.round_bases.lock();
        bases.range(..index).next_back().map_or(0, |(_, lsn)| *lsn)
    }

    /// Forgets the bases past `lsn`, after the log was cut there.
    pub(crate) fn forget_round_bases_after(&self, lsn: u64) {
        self.round_bases.lock().retain(|_, l| *l <= lsn);
    }

    /// Takes `files`, the checkpoints on disk as `checkpoint::list` gives
    /// them, all durable, as what is known of them: their LSNs (for
    /// compaction) and the newest one's size (for the next periodic one).
    pub(crate) fn know_checkpoints(&self, files: &[(u64, std::path::PathBuf)]) {
        *self.checkpoints.lock() = files.iter().map(|(lsn, _)| *lsn).collect();
        // A checkpoint past where the evt log ended at open was written by
        // this process and covers any torn tail open cut: its kept bytes
        // can go.
        if files
            .first()
            .is_some_and(|(lsn, _)| *lsn > self.evt_log.recovery_report().last_lsn)
        {
            self.evt_log.release_cut_bytes();
            self.msg_log.release_cut_bytes();
        }
        self.newest_checkpoint_bytes.store(
            super::checkpoint::newest_bytes(files),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub(crate) fn settle(&self, round: u64) {
        let mut p = self.progress.lock();
        p.settled = p.settled.max(round);
        self.progress_cv.notify_all();
        let news = (p.settled, p.poisoned.is_some());
        self.settled_watch.send_replace(news);
    }

    /// Waits until `round` has settled or the engine is poisoned, without
    /// blocking the thread: the caller reads again and learns which.
    pub(crate) async fn settled_async(&self, round: u64) {
        let mut rx = self.settled_watch.subscribe();
        // `Err` only if the sender is gone, and it lives as long as `self`.
        let _ = rx
            .wait_for(|&(settled, poisoned)| settled >= round || poisoned)
            .await;
    }

    /// `Ok` if a change made in `round` may be revealed; the round to wait
    /// for if not yet; an error if it never will be (poisoned).
    pub(crate) fn check_settled(&self, round: u64) -> std::result::Result<(), Miss> {
        if self.is_settled(round)? {
            Ok(())
        } else {
            Err(Miss::Unsettled(round))
        }
    }

    /// The round after the newest settled one: what a reader waits for
    /// when it waits for "the next round".
    pub(crate) fn next_round(&self) -> u64 {
        self.progress.lock().settled + 1
    }

    pub(crate) fn wait_settled(&self, round: u64) {
        let mut p = self.progress.lock();
        while p.settled < round {
            self.progress_cv.wait(&mut p);
        }
    }

    /// Whether a change made in `round` may be revealed; an error if it
    /// never will be because the engine is poisoned.
    pub(crate) fn is_settled(&self, round: u64) -> Result<bool> {
        let p = self.progress.lock();
        if let Some((first_bad, why)) = &p.poisoned {
            if round >= *first_bad {
                return Err(Error::Log(LogError::Poisoned(why.clone())));
            }
        }
        Ok(p.settled >= round)
    }

    pub(crate) fn poison(&self, why: String) {
        let mut p = self.progress.lock();
        if p.poisoned.is_none() {
            tracing::error!(reason = %why, "inbox engine poisoned: refusing every mutation until restart");
            let first_bad = p.settled + 1;
            p.poisoned = Some((first_bad, why));
        }
        self.progress_cv.notify_all();
        let news = (p.settled, true);
        self.settled_watch.send_replace(news);
    }

    /// Poisons the engine if the `msg` log is poisoned. Sends no longer
    /// write to it (only compaction does, and its preparer thread), but a
    /// failed write or fsync of either log stops every mutation (R21), so
    /// every round checks it before it is written and before it is
    /// answered.
    pub(crate) fn check_msg_log(&self) -> Option<String> {
        let why = format!("msg log: {}", self.msg_log.poisoned()?);
        self.poison(why.clone());
        Some(why)
    }

    pub(crate) fn poisoned(&self) -> Option<String> {
        self.progress
            .lock()
            .poisoned
            .as_ref()
            .map(|(_, why)| why.clone())
    }
}
