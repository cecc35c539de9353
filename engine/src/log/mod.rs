//! Append-only segment logs (R20, R21, R22).
//!
//! A log is a directory of segment files (`0000000001.seg`, ...), each
//! preallocated to `segment_bytes` with fallocate and filled with CRC-framed
//! batches of records (layout: [`format::BatchEncoder`], `docs/FORMAT.md`).
//!
//! - [`Log::submit`] assigns the batch its LSN and record locations at once,
//!   under one mutex, and queues its encoded bytes; a single writer thread
//!   ([`writer`]) writes everything queued with one write and one fdatasync
//!   (group commit) and then wakes the waiters ([`AppendTicket::wait`]).
//! - Reads ([`Log::read`], [`Log::replay`]) never see bytes that are not
//!   durable: sealed segments through one `Arc<Mmap>` each, the active
//!   segment with pread below its durable length ([`segment`]).
//! - [`Log::open`] recovers ([`recovery`]): a torn tail of the last segment
//!   is cut, any other damage refuses to open. [`verify()`] checks a
//!   directory offline.
//!
//! Invariants: LSNs are contiguous from 1 (per log); batches become durable
//! in LSN order; a write or fsync error poisons the log for good (R21) and
//! nothing after it is reported durable; running out of disk space is only
//! ever met when preallocating a segment, before a batch is accepted, and
//! then changes nothing.

mod faulty;
pub mod format;
mod io;
mod recovery;
mod segment;
mod uring;
mod verify;
mod writer;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

pub use faulty::FaultyIo;
pub use io::{write_file_durably, LogIo, PwriteIo};
pub use recovery::{RecoveryReport, TruncatedTail};
pub use uring::UringIo;
pub use verify::{
    replay_dir, verify, verify_with_progress, Problem, ProblemKind, SegmentReport, VerifyReport,
};

use format::{BatchEncoder, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use segment::Segment;
use writer::Item;

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

/// Smallest accepted `segment_bytes`.
pub const SEGMENT_BYTES_MIN: u64 = 4096;
/// Largest accepted `segment_bytes`: offsets are u32.
pub const SEGMENT_BYTES_MAX: u64 = u32::MAX as u64;

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
    /// A bad option or argument (segment size, deleting a segment that is
    /// unknown or still active); nothing was changed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
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
    log: Waiter,
}

/// The log a ticket waits on.
struct Waiter(Arc<Shared>);

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
}

/// The submit side, under one mutex: LSN and space assignment, the queue.
struct SubmitState {
    next_lsn: Lsn,
    next_segment_id: SegmentId,
    active: Option<ActiveTail>,
    /// A preallocated file ready to become the next segment.
    spare: Option<Spare>,
    queue: Vec<Item>,
    spare_wanted: bool,
    shutdown: bool,
}

struct ActiveTail {
    seg: Arc<Segment>,
    /// Where the next batch goes (reserved, not necessarily written).
    write_offset: u64,
    capacity: u64,
}

struct Spare {
    file: File,
    path: PathBuf,
}

/// State shared by the log handle, tickets and the writer thread.
struct Shared {
    dir: PathBuf,
    segment_bytes: u64,
    sync: SyncPolicy,
    io: Arc<dyn LogIo>,
    state: Mutex<SubmitState>,
    /// Wakes the writer.
    work: Condvar,
    /// Durable LSN and poison reason, for waiters.
    durable: Mutex<Option<String>>,
    durable_cv: Condvar,
    durable_lsn: AtomicU64,
    poisoned: AtomicBool,
    segments: RwLock<BTreeMap<SegmentId, Arc<Segment>>>,
    prealloc_seq: AtomicU64,
    stats: writer::Stats,
}

impl Shared {
    fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    fn poison_error(&self) -> LogError {
        let reason = self.durable.lock().clone().unwrap_or_default();
        LogError::Poisoned(reason)
    }

    /// Stops the log for good (R21) and fails every waiter not yet durable.
    fn poison(&self, reason: String) {
        let mut p = self.durable.lock();
        if p.is_none() {
            tracing::error!(dir = %self.dir.display(), %reason, "segment log poisoned; appends fail until restart");
            *p = Some(reason);
        }
        self.poisoned.store(true, Ordering::Release);
        self.durable_cv.notify_all();
    }

    fn publish_durable(&self, lsn: Lsn) {
        let _g = self.durable.lock();
        debug_assert!(lsn >= self.durable_lsn.load(Ordering::Relaxed));
        self.durable_lsn.store(lsn, Ordering::Release);
        self.durable_cv.notify_all();
    }

    fn wait_durable(&self, lsn: Lsn) -> Result<(), LogError> {
        let mut p = self.durable.lock();
        loop {
            if self.durable_lsn.load(Ordering::Acquire) >= lsn {
                return Ok(());
            }
            if let Some(reason) = p.as_ref() {
                return Err(LogError::Poisoned(reason.clone()));
            }
            self.durable_cv.wait(&mut p);
        }
    }

    /// Creates a preallocated file for the next segment.
    fn preallocate(&self) -> Result<Spare, LogError> {
        let n = self.prealloc_seq.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("prealloc-{n}.tmp"));
        match self.io.create_preallocated(&path, self.segment_bytes) {
            Ok(file) => Ok(Spare { file, path }),
            Err(e) if io::is_no_space(&e) => Err(LogError::NoSpace(format!(
                "preallocating {} bytes in {}: {e}",
                self.segment_bytes,
                self.dir.display()
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes the next segment's file ahead of need (writer thread, not
    /// holding the submit mutex). A failure only means `submit` tries again
    /// when it needs the file.
    fn preallocate_spare_in_background(&self) {
        if self.state.lock().spare.is_some() {
            return;
        }
        match self.preallocate() {
            Ok(spare) => {
                let mut st = self.state.lock();
                if st.spare.is_none() {
                    st.spare = Some(spare);
                } else {
                    drop(st);
                    let _ = self.io.remove(&spare.path);
                }
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not preallocate the next segment ahead of need")
            }
        }
    }

    /// Starts the next segment for a batch that does not fit. On error
    /// nothing has changed.
    fn roll(&self, st: &mut SubmitState) -> Result<(), LogError> {
        let id = st.next_segment_id;
        let next_id = id
            .checked_add(1)
            .ok_or_else(|| LogError::InvalidArgument("segment ids exhausted".into()))?;
        let spare = match st.spare.take() {
            Some(s) => s,
            None => self.preallocate()?,
        };
        let first_lsn = st.next_lsn;
        let path = self.dir.join(segment::segment_file_name(id));
        let seg = Arc::new(Segment::new(
            id,
            path,
            spare.file,
            first_lsn,
            first_lsn - 1,
            SEGMENT_HEADER_LEN as u64,
            false,
        ));
        let old = st.active.take().map(|a| a.seg);
        st.queue.push(Item::Roll {
            old,
            new: Arc::clone(&seg),
            tmp: spare.path,
            header: format::encode_segment_header(id, first_lsn),
        });
        st.active = Some(ActiveTail {
            seg,
            write_offset: SEGMENT_HEADER_LEN as u64,
            capacity: self.segment_bytes,
        });
        st.next_segment_id = next_id;
        st.spare_wanted = true;
        Ok(())
    }
}

/// An append-only segment log. Cheap to share by reference across threads.
pub struct Log {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    report: RecoveryReport,
    /// Held for the life of the log: one process per directory.
    _lock: File,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("dir", &self.shared.dir)
            .field("durable_lsn", &self.durable_lsn())
            .finish()
    }
}

/// Takes the exclusive lock on a log directory (`DIR/LOCK`, created if
/// missing), without waiting. A running daemon holds it for as long as
/// the log is open; offline tools take it too, so that they never read
/// files a daemon is writing. Released when the returned file closes.
pub fn lock_dir(dir: &Path) -> Result<File, LogError> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))?;
    // SAFETY: flock only reads its integer arguments; the fd is owned by
    // `f`, which outlives the call.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(LogError::Io(std::io::Error::new(
            e.kind(),
            format!(
                "log directory {} is in use by another process: {e}",
                dir.display()
            ),
        )));
    }
    Ok(f)
}

impl Log {
    /// Bytes a record costs in a batch besides its payload (its header).
    /// Callers that size batches count with this instead of the layout.
    pub const RECORD_OVERHEAD_BYTES: u64 = format::RECORD_HEADER_LEN as u64;

    /// The most record bytes (payloads plus [`Log::RECORD_OVERHEAD_BYTES`]
    /// each) one batch may hold: a batch is one frame, and a frame must
    /// fit a segment after the segment's header. [`Log::submit`] refuses a
    /// larger batch with [`LogError::TooLarge`].
    pub fn batch_records_bytes_max(&self) -> u64 {
        Self::batch_records_bytes_max_for(self.shared.segment_bytes)
    }

    /// [`Log::batch_records_bytes_max`] for a log of `segment_bytes`
    /// segments, before one is open.
    pub fn batch_records_bytes_max_for(segment_bytes: u64) -> u64 {
        segment_bytes.saturating_sub((SEGMENT_HEADER_LEN + format::BATCH_HEADER_LEN) as u64)
    }

    /// Opens the log in `opts.dir`, recovering it (see [`RecoveryMode`]).
    pub fn open(opts: LogOptions) -> Result<Log, LogError> {
        let io: Arc<dyn LogIo> = match opts.io {
            IoBackend::Pwrite => Arc::new(PwriteIo),
            IoBackend::IoUring => Arc::new(UringIo::new().map_err(|e| {
                LogError::Io(std::io::Error::new(
                    e.kind(),
                    format!(
                        "io_uring setup failed ({e}); the kernel may lack io_uring or have it \
                         disabled: use the pwrite backend"
                    ),
                ))
            })?),
        };
        Self::open_with_io(opts, io)
    }

    /// [`Log::open`] with a given IO backend (e.g. [`FaultyIo`] in tests);
    /// `opts.io` is ignored.
    pub fn open_with_io(opts: LogOptions, io: Arc<dyn LogIo>) -> Result<Log, LogError> {
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&opts.segment_bytes) {
            return Err(LogError::InvalidArgument(format!(
                "segment_bytes {} is outside {SEGMENT_BYTES_MIN}..={SEGMENT_BYTES_MAX}",
                opts.segment_bytes
            )));
        }
        std::fs::create_dir_all(&opts.dir)?;
        let lock = lock_dir(&opts.dir)?;
        let rec = recovery::recover(&opts.dir, io.as_ref(), opts.segment_bytes, opts.recovery)?;
        tracing::info!(
            dir = %opts.dir.display(),
            segments = rec.report.segments,
            batches = rec.report.batches,
            last_lsn = rec.report.last_lsn,
            io = io.name(),
            "segment log recovered"
        );
        let segments = rec.segments.iter().map(|s| (s.id, Arc::clone(s))).collect();
        let active = rec.active.map(|a| ActiveTail {
            seg: a.seg,
            write_offset: a.write_offset,
            capacity: a.capacity,
        });
        let shared = Arc::new(Shared {
            dir: opts.dir.clone(),
            segment_bytes: opts.segment_bytes,
            sync: opts.sync,
            io,
            state: Mutex::new(SubmitState {
                next_lsn: rec.next_lsn,
                next_segment_id: rec.next_segment_id,
                active,
                spare: None,
                queue: Vec::new(),
                spare_wanted: true,
                shutdown: false,
            }),
            work: Condvar::new(),
            durable: Mutex::new(None),
            durable_cv: Condvar::new(),
            durable_lsn: AtomicU64::new(rec.next_lsn - 1),
            poisoned: AtomicBool::new(false),
            segments: RwLock::new(segments),
            prealloc_seq: AtomicU64::new(0),
            stats: writer::Stats::default(),
        });
        let w = Arc::clone(&shared);
        let writer = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || writer::run(w))?;
        Ok(Log {
            shared,
            writer: Some(writer),
            report: rec.report,
            _lock: lock,
        })
    }

    /// Assigns the batch its LSN and locations and queues it for the group
    /// commit writer. Fails at once, changing nothing, if the log is
    /// poisoned or no space can be reserved.
    pub fn submit(&self, batch: Batch) -> Result<AppendTicket, LogError> {
        let frame_len = batch.encoded_len();
        let room = self.shared.segment_bytes - SEGMENT_HEADER_LEN as u64;
        if frame_len > room {
            return Err(LogError::TooLarge(frame_len));
        }
        let mut st = self.shared.state.lock();
        if self.shared.is_poisoned() {
            return Err(self.shared.poison_error());
        }
        let fits = st
            .active
            .as_ref()
            .is_some_and(|a| a.write_offset + frame_len <= a.capacity);
        if !fits {
            self.shared.roll(&mut st)?;
        }
        let lsn = st.next_lsn;
        let active = st.active.as_mut().expect("rolled above");
        let offset = active.write_offset;
        assert!(offset + frame_len <= active.capacity);
        let seg = Arc::clone(&active.seg);
        let mut bytes = Vec::with_capacity(frame_len as usize);
        let offset32 = u32::try_from(offset).expect("segment_bytes is at most u32::MAX");
        let locs = BatchEncoder::encode(seg.id, offset32, lsn, &batch.records, &mut bytes);
        active.write_offset += frame_len;
        st.next_lsn += 1;
        st.queue.push(Item::Batch {
            seg,
            offset,
            lsn,
            bytes,
        });
        drop(st);
        self.shared.work.notify_one();
        Ok(AppendTicket {
            lsn,
            locs,
            log: Waiter(Arc::clone(&self.shared)),
        })
    }

    /// `submit` then `wait`.
    pub fn append(&self, batch: Batch) -> Result<Appended, LogError> {
        self.submit(batch)?.wait()
    }

    /// Reads one durable record, checking its CRC.
    pub fn read(&self, loc: RecordLoc) -> Result<Record, LogError> {
        let bad = || LogError::BadLocation {
            segment: loc.segment,
            offset: loc.offset,
        };
        let seg = self
            .shared
            .segments
            .read()
            .get(&loc.segment)
            .cloned()
            .ok_or_else(bad)?;
        let r = seg.reader()?;
        let off = u64::from(loc.offset);
        let hdr_end = off + RECORD_HEADER_LEN as u64;
        if off < (SEGMENT_HEADER_LEN + format::BATCH_HEADER_LEN) as u64 || hdr_end > r.limit() {
            return Err(bad());
        }
        let header = r.get(off, hdr_end)?;
        let h = format::decode_record_header(&header);
        let end = hdr_end + u64::from(h.len);
        if end <= r.limit() {
            let payload = r.get(hdr_end, end)?;
            if format::record_crc_ok(seg.id, loc.offset, &header, &payload) {
                return Ok(Record {
                    kind: h.kind,
                    payload: payload.into_owned(),
                });
            }
        }
        // Not a valid record here: a damaged record, or not a record start
        // at all. Walk the batch the header points back to to tell which.
        if is_record_start(&r, off, h.back)? {
            Err(LogError::Corruption {
                segment: seg.id,
                offset: off,
                reason: "record checksum mismatch".into(),
            })
        } else {
            Err(bad())
        }
    }

    /// Calls `f` for every durable record of every batch with LSN > `after`,
    /// in log order.
    pub fn replay(&self, after: Lsn, f: &mut ReplayFn<'_>) -> Result<(), LogError> {
        let segs: Vec<Arc<Segment>> = self.shared.segments.read().values().cloned().collect();
        for seg in segs {
            if seg.last_lsn() <= after {
                continue;
            }
            replay_segment(&seg, after, f)?;
        }
        Ok(())
    }

    /// [`Log::replay`] restricted to one segment (for compaction, which
    /// looks at one segment at a time). Unknown segment: `InvalidArgument`.
    pub fn replay_segment(&self, id: SegmentId, f: &mut ReplayFn<'_>) -> Result<(), LogError> {
        let seg = self
            .shared
            .segments
            .read()
            .get(&id)
            .cloned()
            .ok_or_else(|| LogError::InvalidArgument(format!("no segment {id}")))?;
        replay_segment(&seg, 0, f)
    }

    /// The highest LSN known durable.
    pub fn durable_lsn(&self) -> Lsn {
        self.shared.durable_lsn.load(Ordering::Acquire)
    }

    /// The segments, oldest first. The newest one, if any, is the active
    /// (unsealed) one.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.shared
            .segments
            .read()
            .values()
            .map(|s| SegmentInfo {
                id: s.id,
                bytes: s.durable_len(),
                sealed: s.is_sealed(),
                first_lsn: s.first_lsn,
                last_lsn: s.last_lsn(),
            })
            .collect()
    }

    /// Deletes a sealed segment and fsyncs the directory. O(1): the file
    /// is unlinked whole. Reads already holding the segment finish
    /// normally; later reads of its locations get `BadLocation`.
    ///
    /// A poisoned log deletes nothing: the caller decided the segment was
    /// unneeded from writes that may not be on disk (a relocation whose
    /// fsync failed), and recovery reads only what is, so the file stays
    /// for whatever the durable log still points into it.
    pub fn delete_segment(&self, id: SegmentId) -> Result<(), LogError> {
        if self.shared.is_poisoned() {
            return Err(self.shared.poison_error());
        }
        let seg = self
            .shared
            .segments
            .read()
            .get(&id)
            .cloned()
            .ok_or_else(|| LogError::InvalidArgument(format!("no segment {id}")))?;
        if !seg.is_sealed() {
            return Err(LogError::InvalidArgument(format!(
                "segment {id} is the active segment; only sealed segments can be deleted"
            )));
        }
        // Unlink first: if that fails, nothing has changed. Readers holding
        // the segment keep their descriptor and mapping.
        self.shared.io.remove(&seg.path)?;
        self.shared.segments.write().remove(&id);
        self.shared.io.sync_dir(&self.shared.dir)?;
        tracing::info!(
            segment = id,
            first_lsn = seg.first_lsn,
            last_lsn = seg.last_lsn(),
            "segment deleted"
        );
        Ok(())
    }

    /// Writes and fsyncs everything queued; used at shutdown.
    pub fn flush(&self) -> Result<(), LogError> {
        let (tx, rx) = mpsc::channel();
        {
            let mut st = self.shared.state.lock();
            if self.shared.is_poisoned() {
                return Err(self.shared.poison_error());
            }
            st.queue.push(Item::Flush(tx));
        }
        self.shared.work.notify_one();
        rx.recv()
            .unwrap_or_else(|_| Err(LogError::Poisoned("the log writer thread is gone".into())))
    }

    /// Why the log is poisoned, if it is.
    pub fn poisoned(&self) -> Option<String> {
        self.shared.durable.lock().clone()
    }

    /// What recovery found at open (torn tail cut, counts).
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Writer counters.
    pub fn stats(&self) -> LogStats {
        let s = &self.shared.stats;
        LogStats {
            commits: s.commits.load(Ordering::Relaxed),
            bytes_written: s.bytes.load(Ordering::Relaxed),
            commit_time: Duration::from_nanos(s.commit_ns.load(Ordering::Relaxed)),
            durable_lsn: self.durable_lsn(),
        }
    }

    /// The directory of the log.
    /// The IO backend this log writes through, for files kept beside it
    /// (see [`write_file_durably`]).
    pub fn io(&self) -> &Arc<dyn LogIo> {
        &self.shared.io
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }
}

impl Drop for Log {
    /// Writes and syncs what is queued, then stops the writer.
    fn drop(&mut self) {
        self.shared.state.lock().shutdown = true;
        self.shared.work.notify_all();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        let spare = self.shared.state.lock().spare.take();
        if let Some(spare) = spare {
            // A spare left behind would be removed at the next open anyway.
            let _ = self.shared.io.remove(&spare.path);
        }
    }
}

fn replay_segment(seg: &Segment, after: Lsn, f: &mut ReplayFn<'_>) -> Result<(), LogError> {
    let data = seg.durable_view()?;
    let mut pos = SEGMENT_HEADER_LEN;
    while pos < data.len() {
        let b = format::decode_batch(seg.id, &data, pos, 0).map_err(|e| LogError::Corruption {
            segment: seg.id,
            offset: pos as u64,
            reason: format!("durable batch does not verify: {e:?}"),
        })?;
        if b.lsn > after {
            for (loc, kind, payload) in b.records() {
                f(b.lsn, loc, kind, payload)?;
            }
        }
        pos += b.frame_len;
    }
    Ok(())
}

/// Whether `off` is the start of a record of the batch `back` bytes before
/// it, judged by walking that batch's record headers.
fn is_record_start(r: &segment::Reader<'_>, off: u64, back: u32) -> Result<bool, LogError> {
    let Some(batch_off) = off.checked_sub(u64::from(back)) else {
        return Ok(false);
    };
    let bh_end = batch_off + format::BATCH_HEADER_LEN as u64;
    if batch_off < SEGMENT_HEADER_LEN as u64 || bh_end > r.limit() {
        return Ok(false);
    }
    let bh = r.get(batch_off, bh_end)?;
    let Some((len, kind, count)) = format::peek_batch_header(&bh) else {
        return Ok(false);
    };
    let frame_end = batch_off + u64::from(len);
    if kind != format::FRAME_TYPE_BATCH || frame_end > r.limit() || off >= frame_end {
        return Ok(false);
    }
    let mut pos = bh_end;
    for _ in 0..count {
        if pos == off {
            return Ok(true);
        }
        if pos > off || pos + RECORD_HEADER_LEN as u64 > frame_end {
            return Ok(false);
        }
        let h = r.get(pos, pos + RECORD_HEADER_LEN as u64)?;
        pos += RECORD_HEADER_LEN as u64 + u64::from(format::decode_record_header(&h).len);
    }
    Ok(false)
}
