//! What callers hand the log and get back: a [`Batch`] of records, the
//! [`AppendTicket`] of a submitted batch, and the records read back.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::format::BatchEncoder;
use super::shared::Shared;
use super::{LogError, Lsn, RecordLoc, SegmentId};

/// Records to append as one atomic, CRC-framed batch, held as the frame
/// they will be written as: each record is encoded once, straight into
/// place, and the log fills in only what the write position decides (the
/// batch header and each record's CRC) when the batch is submitted
/// ([`BatchEncoder::seal`]). Submitting moves the frame to the writer
/// without a copy.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Room for the batch header, then each record's header and payload.
    frame: Vec<u8>,
    count: usize,
}

impl Default for Batch {
    fn default() -> Self {
        let mut frame = Vec::new();
        BatchEncoder::begin(&mut frame);
        Self { frame, count: 0 }
    }
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn push(&mut self, kind: u8, payload: &[u8]) {
        self.push_with(kind, |out| out.extend_from_slice(payload));
    }
    /// Appends a record whose payload `write` appends to the buffer it is
    /// given (and nothing else): an encoder writes it in place, with no
    /// buffer of its own to copy from.
    pub fn push_with(&mut self, kind: u8, write: impl FnOnce(&mut Vec<u8>)) {
        BatchEncoder::push_record(&mut self.frame, 0, kind, write);
        self.count += 1;
    }
    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// Bytes the batch takes in a segment, frame header included
    /// (`u64::MAX` past what a frame can count).
    pub fn encoded_len(&self) -> u64 {
        if self.count > u32::MAX as usize {
            return u64::MAX;
        }
        self.frame.len() as u64
    }
    /// The records, in order: (kind, payload).
    pub fn records(&self) -> impl Iterator<Item = (u8, &[u8])> + '_ {
        BatchEncoder::records(&self.frame, self.count)
    }
    /// Fills in the frame for writing at `offset` of `segment` as `lsn`,
    /// and returns the records' locations. The caller has checked that the
    /// frame fits there.
    pub(super) fn seal(&mut self, segment: SegmentId, offset: u32, lsn: Lsn) -> Vec<RecordLoc> {
        let count = u32::try_from(self.count).expect("caller checked the frame length");
        BatchEncoder::seal(segment, offset, lsn, &mut self.frame, count)
    }
    /// The sealed frame, as it is written.
    pub(super) fn into_frame(self) -> Vec<u8> {
        self.frame
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
