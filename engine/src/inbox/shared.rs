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
    pub(crate) progress_cv: Condvar,
    pub(crate) hints: tokio::sync::broadcast::Sender<Vec<Hint>>,
    pub(crate) rounds_written: AtomicU64,
    pub(crate) recovery: RecoveryReport,
    pub(crate) snapshots: SnapshotStore,
    pub(crate) compaction: CompactionRuntime,
    pub(crate) checkpoint_hook: Mutex<Option<CheckpointHook>>,
    /// LSNs of the retained checkpoints known to be durable (renamed and
    /// the directory fsynced), newest first: compaction counts coverage by
    /// these, never by a file that a crash could still take back.
    pub(crate) checkpoints: Mutex<Vec<u64>>,
}

impl Shared {
    pub(crate) fn settle(&self, round: u64) {
        let mut p = self.progress.lock();
        p.settled = p.settled.max(round);
        self.progress_cv.notify_all();
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
