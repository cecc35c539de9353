//! The devices subsystem's rows in the state: a device row as logged
//! ([`DeviceRow`]) and as kept in a user ([`Device`], with the round of
//! its last change).
//!
//! `state/` holds them inside each user and re-exports them; only the
//! device record changes them (`devices/record.rs`).

use crate::api::*;

/// A device row (R10, R11, R17). Its record carries the row after the
/// change, so replay is an upsert.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceRow {
    pub device: DeviceId,
    pub generation: Generation,
    pub acked_sync_seq: SyncSeq,
    pub state: DeviceState,
    pub last_seen_ms: TimestampMs,
    /// Boxed: only a device catching up under a recovery lease has one,
    /// and inline it was 40 of the 88 bytes of every device.
    pub lease: Option<Box<LeaseInfo>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Device {
    pub row: DeviceRow,
    pub stamp: u64,
}
