//! Append-only segment logs (R20, R21, R22).
//!
//! A log is a directory of segment files (`0000000001.seg`, ...), each
//! `segment_bytes` long and filled with CRC-framed batches of records
//! (layout: [`format::BatchEncoder`], `docs/FORMAT.md`).
//!
//! - Segments are prepared ahead of need by a background thread
//!   ([`prepare`]): written in full (zeros, a *prepared* header, fdatasync,
//!   renamed to the next id, directory fsynced), so a commit's fdatasync
//!   overwrites written blocks and flushes data only. A prepared segment is
//!   the next id's file with a valid header flagged prepared and no
//!   records; recovery and [`verify()`] accept it (an empty trailing
//!   segment is not damage). Deleted segments' files are recycled as
//!   spares; their stale bytes never verify (CRCs are bound to the segment
//!   id, ids never repeat).
//! - [`Log::submit`] assigns the batch its LSN and record locations at once,
//!   under one mutex, and queues its encoded bytes; a single writer thread
//!   ([`writer`]) writes everything queued with one write and one fdatasync
//!   (group commit) and then wakes the waiters ([`AppendTicket::wait`]).
//! - Reads ([`Log::read`], [`Log::replay`]) never see bytes that are not
//!   durable: sealed segments through one `Arc<Mmap>` each, the active
//!   segment with pread below its durable length ([`segment`]).
//! - [`Log::open`] recovers ([`recovery`]): it plans from reads alone, and
//!   only once it serves does it write: a torn tail of the last begun
//!   segment is cut (its bytes kept in a side file), any other damage,
//!   a segment shorter than its recorded size ([`sizes`]) included,
//!   refuses to open and changes nothing. [`verify()`] checks a directory
//!   offline with the same scan.
//!
//! Invariants: LSNs are contiguous from 1 (per log); batches become durable
//! in LSN order; a write or fsync error poisons the log for good (R21) and
//! nothing after it is reported durable; running out of disk space is only
//! ever met when preparing a segment, before a batch is accepted, and
//! then changes nothing.

mod append;
mod batch;
mod cache;
mod faulty;
pub mod format;
mod io;
mod lock;
mod prepare;
mod read;
mod recovery;
mod segment;
mod shared;
pub mod sizes;
mod truncate;
mod uring;
mod verify;
mod writer;

use std::path::PathBuf;
use std::time::Duration;

pub use append::{default_io, Log};
pub use batch::{AppendTicket, Appended, Batch, Record};
pub use cache::{reclaims_so_far, LOOK_VALID_FOR};
pub use faulty::FaultyIo;
pub use io::{write_file_durably, LogIo, PwriteIo};
pub use lock::lock_dir;
pub(crate) use recovery::cut_files;
pub use recovery::{cut_file_name, plan, plan_locked, LogPlan, RecoveryReport, TruncatedTail};
/// For the salvage scan, which walks segment files itself, and the
/// replica image, which packs them.
pub(crate) use segment::{
    classify, list_dir, parse_segment_file_name, segment_file_name, short_file, FileKind,
};
pub use shared::DurableHook;
pub use uring::UringIo;
pub use verify::{
    replay_dir, verify, verify_with_progress, Problem, ProblemKind, SegmentReport, VerifyReport,
};

/// The callback of [`Log::replay`]: LSN of the batch, location, kind and
/// payload of each record.
pub type ReplayFn<'a> = dyn FnMut(Lsn, RecordLoc, u8, &[u8]) -> Result<(), LogError> + 'a;

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

/// Which [`LogIo`] backend writes the segments. The default is pwrite:
/// the benchmark (`docs/BENCHMARKS.md`, "Segment log") finds no reliable
/// gain from io_uring, whose cost is dominated by the fdatasync, and pwrite
/// works where io_uring is disabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoBackend {
    /// pwrite(2) + fdatasync(2). Portable.
    #[default]
    Pwrite,
    /// io_uring, write linked to fdatasync. [`Log::open`] fails with a
    /// clear error if the kernel refuses io_uring.
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
    /// Prepared segments the background preparer keeps ready (default 1;
    /// 0 prepares each segment inline when a roll needs it).
    pub spare_segments: usize,
    /// How a segment is prepared before its first commit.
    pub prepare: SegmentPrep,
}

/// How a new segment's space is made ready before commits go into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SegmentPrep {
    /// fallocate, then write zeros over the whole file and fdatasync: a
    /// commit's fdatasync then overwrites written blocks and flushes data
    /// only (the default).
    #[default]
    Write,
    /// fallocate only: the first write to each block also commits the
    /// file system's extent metadata. For comparison in benchmarks.
    Fallocate,
}

impl LogOptions {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            segment_bytes: 128 << 20,
            sync: SyncPolicy::Always,
            io: IoBackend::default(),
            recovery: RecoveryMode::default(),
            spare_segments: 1,
            prepare: SegmentPrep::default(),
        }
    }
}

/// Smallest accepted `segment_bytes`.
pub const SEGMENT_BYTES_MIN: u64 = 4096;
/// Largest accepted `segment_bytes`: offsets are u32.
pub const SEGMENT_BYTES_MAX: u64 = u32::MAX as u64;

#[derive(Debug, thiserror::Error)]
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
    /// A bad option or argument (segment size, deleting a segment that is
    /// unknown or still active); nothing was changed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// One segment as [`Log::segments`] lists it. `bytes` is the durable
/// length including the segment header; an empty segment has
/// `last_lsn == first_lsn - 1`.
#[derive(Debug, Clone)]
pub struct SegmentInfo {
    pub id: SegmentId,
    pub bytes: u64,
    pub sealed: bool,
    pub first_lsn: Lsn,
    pub last_lsn: Lsn,
}

/// Writer counters, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Group commits (one write, and under `Always` one fdatasync, each).
    pub commits: u64,
    pub bytes_written: u64,
    /// Total time spent in those writes and syncs.
    pub commit_time: Duration,
    pub durable_lsn: Lsn,
    /// Prepared segments ready now.
    pub spares_ready: usize,
    /// Segments the background preparer failed to prepare (refused;
    /// nothing poisoned).
    pub spare_failures: u64,
    /// WARNs logged for those failures: at most one per
    /// a minute, each with the count since
    /// the last, so a full disk that refuses every write does not flood
    /// the log.
    pub spare_failure_warnings: u64,
    /// Deleted segments whose files were reused as spares.
    pub segments_recycled: u64,
}
