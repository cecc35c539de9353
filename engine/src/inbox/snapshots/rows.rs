//! The snapshots subsystem's rows in the state: a snapshot row as logged
//! ([`SnapshotRow`]) and as kept in a user ([`SnapshotSlot`]).
//!
//! `state/` holds them in each user's out-of-line recovery part and
//! re-exports them; only the snapshot record changes them
//! (`snapshots/record.rs`).

use std::collections::BTreeMap;

use crate::api::*;
use crate::inbox::containers::rare;

/// Where a snapshot is in its life, as logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SnapshotPhase {
    /// Building or ready (ready once its content file is written).
    Live,
    /// Acknowledged by its device: no longer fences.
    Installed,
    /// Superseded or expired and forgotten.
    Dropped,
}

/// A snapshot row (R18). Its record carries the row after the change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotRow {
    pub snapshot_id: u64,
    pub device: DeviceId,
    pub generation: Generation,
    pub base_sync_seq: SyncSeq,
    pub created_at_ms: TimestampMs,
    pub expires_at_ms: TimestampMs,
    pub phase: SnapshotPhase,
}

impl SnapshotRow {
    /// Fences while live and not expired.
    pub fn fences_at(&self, now: TimestampMs) -> bool {
        self.phase == SnapshotPhase::Live && now <= self.expires_at_ms
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotSlot {
    pub row: SnapshotRow,
    /// Round of the last change (not state, see the module doc).
    pub stamp: u64,
}

impl rare::Empty for BTreeMap<u64, SnapshotSlot> {
    fn empty() -> &'static Self {
        static NONE: BTreeMap<u64, SnapshotSlot> = BTreeMap::new();
        &NONE
    }
}
