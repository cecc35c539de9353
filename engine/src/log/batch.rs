//! What callers hand the log and get back: a [`Batch`] of records, the
//! [`AppendTicket`] of a submitted batch, and the records read back.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::format::BatchEncoder;
use super::shared::Shared;
use super::{LogError, Lsn, RecordLoc};

/// Records to append as one atomic, CRC-framed batch.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub(super) records: Vec<(u8, Vec<u8>)>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn push(&mut self, kind: u8, payload: &[u8]) {
        self.records.push((kind, payload.to_vec()));
    }
    /// [`Batch::push`] for a payload the caller already owns: no copy.
    pub fn push_owned(&mut self, kind: u8, payload: Vec<u8>) {
        self.records.push((kind, payload));
    }
    pub fn len(&self) -> usize {
        self.records.len()
    }
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
    /// Bytes the batch takes in a segment, frame header included.
    pub fn encoded_len(&self) -> u64 {
        BatchEncoder::frame_len(&self.records).unwrap_or(u64::MAX)
    }
}

/// A submitted batch: its LSN and record locations are known at once; it
/// is durable once [`AppendTicket::wait`] returns `Ok`.
#[derive(Debug)]
pub struct AppendTicket {
    pub lsn: Lsn,
    pub locs: Vec<RecordLoc>,
    pub(super) log: Waiter,
}

/// The log a ticket waits on.
pub(super) struct Waiter(pub(super) Arc<Shared>);

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Log")
    }
}

impl AppendTicket {
    /// Blocks until the batch is durable under the sync policy, or fails
    /// with [`LogError::Poisoned`] if the log was poisoned first.
    pub fn wait(self) -> Result<Appended, LogError> {
        self.log.0.wait_durable(self.lsn)?;
        Ok(Appended {
            lsn: self.lsn,
            locs: self.locs,
        })
    }

    /// Whether the batch is already durable (never blocks).
    pub fn is_durable(&self) -> bool {
        self.log.0.durable_lsn.load(Ordering::Acquire) >= self.lsn
    }

    /// Blocks like [`AppendTicket::wait`], keeping the ticket.
    pub fn wait_durable(&self) -> Result<(), LogError> {
        self.log.0.wait_durable(self.lsn)
    }

    /// What [`AppendTicket::wait`] would return, if it would return now:
    /// `None` while the batch is neither durable nor failed (never
    /// blocks).
    pub fn poll(&self) -> Option<Result<(), LogError>> {
        if self.is_durable() {
            Some(Ok(()))
        } else if self.log.0.is_poisoned() {
            // A batch made durable just before the poison still counts.
            Some(self.log.0.wait_durable(self.lsn))
        } else {
            None
        }
    }
}

#[derive(Debug, Clone)]
pub struct Appended {
    pub lsn: Lsn,
    pub locs: Vec<RecordLoc>,
}

/// One record read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub kind: u8,
    pub payload: Vec<u8>,
}
