//! Append-only segment logs (R20, R21, R22).
//!
//! PLACEHOLDER: this module currently holds the fixed public API of the log
//! with a naive in-memory body, so the layers above can be built against it.
//! The real file-backed implementation replaces the bodies, not the API.

use std::path::PathBuf;
use std::time::Duration;

use parking_lot::Mutex;

/// Log sequence number: the number of a batch in one log, from 1.
pub type Lsn = u64;
pub type SegmentId = u32;

/// Where a record lives: its segment and the byte offset of its frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RecordLoc {
    pub segment: SegmentId,
    pub offset: u32,
}

/// When an append counts as durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// fdatasync before acknowledging (the default).
    #[default]
    Always,
    /// Acknowledge after the write; fdatasync at most this often.
    Interval(Duration),
    /// Never fdatasync. Tests and benches only.
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoBackend {
    #[default]
    Pwrite,
    IoUring,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RecoveryMode {
    /// Truncate a torn tail of the last segment; any other damage fails
    /// startup.
    #[default]
    TruncateTornTail,
}

#[derive(Clone, Debug)]
pub struct LogOptions {
    pub dir: PathBuf,
    pub segment_bytes: u64,
    pub sync: SyncPolicy,
    pub io: IoBackend,
    pub recovery: RecoveryMode,
}

impl LogOptions {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            segment_bytes: 128 << 20,
            sync: SyncPolicy::Always,
            io: IoBackend::default(),
            recovery: RecoveryMode::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
    #[error("corruption in segment {segment} at offset {offset}: {reason}")]
    Corruption {
        segment: SegmentId,
        offset: u64,
        reason: String,
    },
    #[error("log is poisoned by an earlier write or fsync failure ({0}); restart to recover")]
    Poisoned(String),
    #[error("no space for a new segment: {0}")]
    NoSpace(String),
    #[error("record too large: {0} bytes")]
    TooLarge(u64),
    #[error("no durable record at segment {segment} offset {offset}")]
    BadLocation { segment: SegmentId, offset: u32 },
}

/// Records to append as one atomic, CRC-framed batch.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    records: Vec<(u8, Vec<u8>)>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn push(&mut self, kind: u8, payload: &[u8]) {
        self.records.push((kind, payload.to_vec()));
    }
    pub fn len(&self) -> usize {
        self.records.len()
    }
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// A submitted batch: its LSN and record locations are known at once; it
/// is durable once [`AppendTicket::wait`] returns `Ok`.
#[derive(Debug)]
pub struct AppendTicket {
    pub lsn: Lsn,
    pub locs: Vec<RecordLoc>,
}

impl AppendTicket {
    pub fn wait(self) -> Result<Appended, LogError> {
        Ok(Appended {
            lsn: self.lsn,
            locs: self.locs,
        })
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

#[derive(Debug, Clone)]
pub struct SegmentInfo {
    pub id: SegmentId,
    pub bytes: u64,
    pub sealed: bool,
    pub first_lsn: Lsn,
    pub last_lsn: Lsn,
}

pub struct Log {
    inner: Mutex<Vec<(Lsn, Vec<(u8, Vec<u8>)>)>>,
}

impl Log {
    /// Opens the log in `opts.dir`, recovering it (see [`RecoveryMode`]).
    pub fn open(_opts: LogOptions) -> Result<Log, LogError> {
        Ok(Log {
            inner: Mutex::new(Vec::new()),
        })
    }

    /// Assigns the batch its LSN and locations and queues it for the group
    /// commit writer. Fails at once, changing nothing, if the log is
    /// poisoned or no space can be reserved.
    pub fn submit(&self, batch: Batch) -> Result<AppendTicket, LogError> {
        let mut inner = self.inner.lock();
        let lsn = inner.len() as Lsn + 1;
        let segment = u32::try_from(lsn).unwrap_or(u32::MAX);
        let locs = (0..batch.records.len())
            .map(|i| RecordLoc {
                segment,
                offset: u32::try_from(i).unwrap_or(u32::MAX),
            })
            .collect();
        inner.push((lsn, batch.records));
        Ok(AppendTicket { lsn, locs })
    }

    /// `submit` then `wait`.
    pub fn append(&self, batch: Batch) -> Result<Appended, LogError> {
        self.submit(batch)?.wait()
    }

    /// Reads one durable record, checking its CRC.
    pub fn read(&self, loc: RecordLoc) -> Result<Record, LogError> {
        let inner = self.inner.lock();
        let bad = || LogError::BadLocation {
            segment: loc.segment,
            offset: loc.offset,
        };
        let (_, records) = inner.get(loc.segment as usize - 1).ok_or_else(bad)?;
        let (kind, payload) = records.get(loc.offset as usize).ok_or_else(bad)?;
        Ok(Record {
            kind: *kind,
            payload: payload.clone(),
        })
    }

    /// Calls `f` for every durable record of every batch with LSN > `after`,
    /// in log order.
    pub fn replay(
        &self,
        after: Lsn,
        f: &mut dyn FnMut(Lsn, RecordLoc, u8, &[u8]) -> Result<(), LogError>,
    ) -> Result<(), LogError> {
        let inner = self.inner.lock();
        for (lsn, records) in inner.iter().filter(|(lsn, _)| *lsn > after) {
            for (i, (kind, payload)) in records.iter().enumerate() {
                let loc = RecordLoc {
                    segment: u32::try_from(*lsn).unwrap_or(u32::MAX),
                    offset: u32::try_from(i).unwrap_or(u32::MAX),
                };
                f(*lsn, loc, *kind, payload)?;
            }
        }
        Ok(())
    }

    /// The highest LSN known durable.
    pub fn durable_lsn(&self) -> Lsn {
        self.inner.lock().len() as Lsn
    }

    pub fn segments(&self) -> Vec<SegmentInfo> {
        Vec::new()
    }

    /// Deletes a sealed segment and fsyncs the directory.
    pub fn delete_segment(&self, _id: SegmentId) -> Result<(), LogError> {
        Ok(())
    }

    /// Writes and fsyncs everything queued; used at shutdown.
    pub fn flush(&self) -> Result<(), LogError> {
        Ok(())
    }

    /// Why the log is poisoned, if it is.
    pub fn poisoned(&self) -> Option<String> {
        None
    }
}
