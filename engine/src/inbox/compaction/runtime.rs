//! What the compactor keeps between passes: the pass lock, counters,
//! the crash-test hook and the sets that spare a pass from looking at
//! everything.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::api::*;
use crate::log::SegmentId;

/// A point between two steps of a pass, for crash tests: the hook set
/// with [`crate::Inbox::set_compaction_hook`] is called at each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactionStep {
    /// Trim records are durable.
    Trimmed,
    /// Checkpoints covering dead segments are written.
    Checkpointed,
    /// A dead segment file was deleted.
    SegmentDeleted,
    /// Live records of a sparse segment are copied forward, durably.
    Copied,
    /// The events point at the copies, durably.
    Relocated,
    /// Message bodies held in an `evt` segment are copied into the `msg`
    /// log, durably.
    BodiesCopied,
    /// The messages point at the `msg` copies, durably.
    BodiesMoved,
}

pub(crate) type Hook = Arc<dyn Fn(CompactionStep) + Send + Sync>;

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) events_reclaimed: AtomicU64,
    pub(crate) messages_reclaimed: AtomicU64,
    pub(crate) bytes_reclaimed: AtomicU64,
    pub(crate) bytes_rewritten: AtomicU64,
    pub(crate) segments_dropped: AtomicU64,
    pub(crate) segments_rewritten: AtomicU64,
}

/// What the compactor keeps between passes.
#[derive(Default)]
pub(crate) struct Runtime {
    pub(crate) pass_lock: Mutex<()>,
    pub(crate) counters: Counters,
    pub(crate) hook: Mutex<Option<Hook>>,
    pub(crate) stop: Mutex<bool>,
    pub(crate) stop_cv: Condvar,
    /// `evt` segments that lost events and have not been judged since
    /// (taken from `SegRefs`, kept while undecided).
    pub(crate) suspects: Mutex<HashSet<SegmentId>>,
    /// Per user: `(events_base, at_ms)` of the oldest retained event, so a
    /// pass tells from memory that a user has nothing old enough to trim.
    pub(crate) oldest: Mutex<HashMap<Uid, (SyncSeq, TimestampMs)>>,
    pub(crate) trim_plan: Mutex<TrimPlan>,
    /// No snapshot row expires before this (0: look at once).
    pub(crate) snapshots_due: Mutex<TimestampMs>,
}

/// Which users the trim step looks at (see `trim_users`).
#[derive(Default)]
pub(crate) struct TrimPlan {
    /// Every user is looked at once the clock reaches this (0: at once).
    pub(crate) next_full: TimestampMs,
    /// Users with an event past the safety window at the last look.
    pub(crate) watch: HashSet<Uid>,
}

impl Runtime {
    pub fn report(&self) -> CompactionReport {
        let c = &self.counters;
        CompactionReport {
            events_reclaimed: c.events_reclaimed.load(Ordering::Relaxed),
            messages_reclaimed: c.messages_reclaimed.load(Ordering::Relaxed),
            bytes_reclaimed: c.bytes_reclaimed.load(Ordering::Relaxed),
            bytes_rewritten: c.bytes_rewritten.load(Ordering::Relaxed),
            segments_dropped: c.segments_dropped.load(Ordering::Relaxed),
            segments_rewritten: c.segments_rewritten.load(Ordering::Relaxed),
        }
    }

    pub fn set_hook(&self, hook: Option<Hook>) {
        *self.hook.lock() = hook;
    }

    pub(crate) fn step(&self, s: CompactionStep) {
        let hook = self.hook.lock().clone();
        if let Some(h) = hook {
            h(s);
        }
    }

    /// Asks the background thread to stop (it wakes at once).
    pub fn stop(&self) {
        *self.stop.lock() = true;
        self.stop_cv.notify_all();
    }

    pub(crate) fn add(&self, r: &CompactionReport) {
        let c = &self.counters;
        c.events_reclaimed
            .fetch_add(r.events_reclaimed, Ordering::Relaxed);
        c.messages_reclaimed
            .fetch_add(r.messages_reclaimed, Ordering::Relaxed);
        c.bytes_reclaimed
            .fetch_add(r.bytes_reclaimed, Ordering::Relaxed);
        c.bytes_rewritten
            .fetch_add(r.bytes_rewritten, Ordering::Relaxed);
        c.segments_dropped
            .fetch_add(r.segments_dropped, Ordering::Relaxed);
        c.segments_rewritten
            .fetch_add(r.segments_rewritten, Ordering::Relaxed);
    }
}
