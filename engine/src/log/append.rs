//! The [`Log`] handle: open, the append side (submit, wait, flush),
//! segment deletion, counters and shutdown. Reads are in [`super::read`].

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

use super::batch::{AppendTicket, Appended, Batch, Waiter};
use super::format::{self, BatchEncoder, SEGMENT_HEADER_LEN};
use super::io::{LogIo, PwriteIo};
use super::lock::lock_dir;
use super::recovery::{self, RecoveryReport};
use super::shared::{ActiveTail, Shared, SubmitState};
use super::uring::UringIo;
use super::writer::{self, Item};
use super::{
    IoBackend, LogError, LogOptions, LogStats, SegmentId, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN,
};

/// An append-only segment log. Cheap to share by reference across threads.
pub struct Log {
    pub(super) shared: Arc<Shared>,
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
