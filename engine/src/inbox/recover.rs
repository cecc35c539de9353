//! Recovery (R22): the newest valid checkpoint, then the `evt` log after
//! its LSN, applied with the same `Effect::apply` the sequencer uses.
//!
//! A checkpoint that fails its checks is skipped with a warning and an
//! older one (or a full replay) is used instead: the log still holds every
//! record after the older checkpoint, so nothing is lost. A checkpoint that
//! claims more than the log holds means acknowledged log data is missing:
//! startup fails rather than silently serving less.

use super::checkpoint;
use super::config::InboxConfig;
use super::effect::Effect;
use super::state::record::Touched;
use super::state::{pack, Scratch, State};
use crate::error::{Error, Result};
use crate::log::{Log, LogError, Lsn, ReplayFn};

/// Where recovery reads the `evt` log from: the open log (serve), or its
/// directory read-only (`inboxd verify`), so both judge the same way.
pub(crate) trait EvtSource {
    /// The last durable LSN (0 = empty).
    fn durable_lsn(&self) -> Lsn;
    /// The first LSN of the oldest segment, if any.
    fn first_lsn(&self) -> Option<Lsn>;
    fn replay(&self, after: Lsn, f: &mut ReplayFn<'_>) -> std::result::Result<(), LogError>;
}

impl EvtSource for Log {
    fn durable_lsn(&self) -> Lsn {
        Log::durable_lsn(self)
    }
    fn first_lsn(&self) -> Option<Lsn> {
        self.segments().first().map(|s| s.first_lsn)
    }
    fn replay(&self, after: Lsn, f: &mut ReplayFn<'_>) -> std::result::Result<(), LogError> {
        Log::replay(self, after, f)
    }
}

/// Where recovery started and how much it replayed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The evt LSN of the checkpoint used (0 = none: full replay).
    pub checkpoint_lsn: u64,
    /// The replication index of the checkpoint used (0 = none).
    pub checkpoint_replica_index: u64,
    /// Effect records replayed after it.
    pub records_replayed: u64,
}

pub(crate) fn load_state(cfg: &InboxConfig, evt: &Log) -> Result<State> {
    load_state_reporting(cfg, evt).map(|(st, _)| st)
}

pub(crate) fn load_state_reporting(
    cfg: &InboxConfig,
    evt: &dyn EvtSource,
) -> Result<(State, RecoveryReport)> {
    let ttl_ms = u64::try_from(cfg.idempotency_ttl.as_millis()).unwrap_or(u64::MAX);
    let durable = evt.durable_lsn();
    let scratch = if cfg.index_in_file {
        Scratch::open(&cfg.data_dir)
    } else {
        Scratch::default()
    };
    let started = std::time::Instant::now();
    let mut state = None;
    for (lsn, path) in checkpoint::list(&cfg.data_dir)? {
        if lsn > durable {
            return Err(Error::Corruption {
                what: "data directory",
                reason: format!(
                    "checkpoint {} covers evt LSN {lsn} but the log ends at {durable}: log data is missing",
                    path.display()
                ),
            });
        }
        match checkpoint::read_in(&path, scratch.clone()) {
            Ok((_, st)) => {
                state = Some(st);
                break;
            }
            Err(reason) => {
                tracing::warn!(path = %path.display(), %reason, "checkpoint is invalid; falling back to an older one or a full replay");
            }
        }
    }
    let mut state = state.unwrap_or_else(|| State::new(ttl_ms));
    state.use_scratch(scratch);
    state.idem_ttl_ms = ttl_ms;
    state.totals = state.recount_totals();
    let after = state.evt_lsn;
    let base_index = state.replica_index;
    let loaded = started.elapsed();
    // Compaction deletes whole segments once checkpoints cover them; a log
    // that starts after the state's LSN has lost records this replay needs.
    if let Some(first) = evt.first_lsn() {
        if first > after + 1 && durable > after {
            return Err(Error::Corruption {
                what: "data directory",
                reason: format!(
                    "evt log starts at LSN {first} but the newest usable checkpoint covers only LSN \
                     {after}: log data is missing"
                ),
            });
        }
    }
    let mut replayed = 0u64;
    evt.replay(after, &mut |lsn, loc, kind, payload| {
        let corrupt = |reason: String| LogError::Corruption {
            segment: loc.segment,
            offset: u64::from(loc.offset),
            reason,
        };
        let effect =
            Effect::decode(kind, payload).map_err(|e| corrupt(format!("evt record: {}", e.0)))?;
        effect
            .apply(&mut state, pack(loc), 0, &mut Touched::default())
            .map_err(|e| corrupt(format!("evt record does not apply: {}", e.0)))?;
        state.evt_lsn = lsn;
        replayed += 1;
        Ok(())
    })?;
    tracing::info!(
        from_lsn = after,
        records = replayed,
        checkpoint_ms = loaded.as_millis() as u64,
        replay_ms = (started.elapsed() - loaded).as_millis() as u64,
        "inbox state recovered"
    );
    state.commit_all();
    if cfg!(debug_assertions) {
        state
            .check_invariants()
            .map_err(|e| Error::Invariant(format!("after recovery: {e}")))?;
    }
    // The compactor has not looked at any segment yet in this process.
    state.evt_refs.mark_all_dirty();
    state.body_refs.mark_all_dirty();
    state.msg_refs.mark_all_dirty();
    Ok((
        state,
        RecoveryReport {
            checkpoint_lsn: after,
            checkpoint_replica_index: base_index,
            records_replayed: replayed,
        },
    ))
}
