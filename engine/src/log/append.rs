//! The [`Log`] handle: open, the append side (submit, wait, flush),
//! segment deletion, counters and shutdown. Reads are in [`super::read`].

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

use super::batch::{AppendTicket, Appended, Batch, Waiter};
use super::format::{self, SEGMENT_HEADER_LEN};
use super::io::{LogIo, PwriteIo};
use super::prepare::{self, Freed, Preparer};
use super::recovery::{self, LogPlan, RecoveryReport};
use super::shared::{ActiveTail, Shared, SubmitState};
use super::uring::UringIo;
use super::writer::{self, Item};
use super::{IoBackend, LogError, LogOptions, LogStats, SegmentId};

/// The IO backend `backend` names, or why the kernel refuses it.
pub fn default_io(backend: IoBackend) -> Result<Arc<dyn LogIo>, LogError> {
    Ok(match backend {
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
    })
}

/// An append-only segment log. Cheap to share by reference across threads.
pub struct Log {
    pub(super) shared: Arc<Shared>,
    writer: Option<crate::threads::Handle>,
    preparer: Option<crate::threads::Handle>,
    report: RecoveryReport,
    /// Side files keeping the bytes of torn-tail cuts, until released.
    cut_files: Mutex<Vec<std::path::PathBuf>>,
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
        let io = default_io(opts.io)?;
        Self::open_with_io(opts, io)
    }

    /// [`Log::open`] with a given IO backend (e.g. [`FaultyIo`] in tests);
    /// `opts.io` is ignored.
    pub fn open_with_io(opts: LogOptions, io: Arc<dyn LogIo>) -> Result<Log, LogError> {
        let plan = recovery::plan_locked(&opts.dir, opts.segment_bytes)?;
        Self::open_planned(opts, io, plan)
    }

    /// Opens the log as `plan` (from [`super::plan_locked`] on
    /// `opts.dir`) decided: the caller has looked at the plan and chose to
    /// serve. Only now is anything written.
    pub fn open_planned(
        opts: LogOptions,
        io: Arc<dyn LogIo>,
        plan: LogPlan,
    ) -> Result<Log, LogError> {
        recovery::check_segment_bytes(opts.segment_bytes)?;
        if plan.dir() != opts.dir || plan.segment_bytes() != opts.segment_bytes || !plan.is_locked()
        {
            return Err(LogError::InvalidArgument(format!(
                "a plan for {} ({} byte segments) cannot open {} ({} byte segments); plan \
                 under the directory's lock",
                plan.dir().display(),
                plan.segment_bytes(),
                opts.dir.display(),
                opts.segment_bytes
            )));
        }
        let mut rec = plan.apply(io.as_ref())?;
        let lock = rec.lock.take().expect("checked: the plan holds the lock");
        tracing::info!(
            dir = %opts.dir.display(),
            segments = rec.report.segments,
            batches = rec.report.batches,
            last_lsn = rec.report.last_lsn,
            io = io.name(),
            "segment log recovered"
        );
        // What was on disk ends in the active segment at its write offset,
        // or with the newest sealed segment; what this process appends lies
        // beyond, in the same active segment or in newer ones.
        let found_end = match &rec.active {
            Some(a) => Some((a.seg.id, a.write_offset)),
            None => rec.segments.iter().map(|s| (s.id, u64::MAX)).max(),
        };
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
                active,
                queue: Vec::new(),
                shutdown: false,
            }),
            work: Condvar::new(),
            durable: Mutex::new(None),
            durable_cv: Condvar::new(),
            durable_lsn: AtomicU64::new(rec.next_lsn - 1),
            poisoned: AtomicBool::new(false),
            durable_hook: Mutex::new(None),
            writer: Mutex::new(writer::WriterState::new()),
            segments: RwLock::new(segments),
            found_end,
            cache: super::cache::CacheWatch::new(),
            prep: Preparer::new(
                rec.next_segment_id,
                opts.spare_segments,
                opts.prepare,
                rec.spares,
            ),
            stats: writer::Stats::default(),
        });
        let w = Arc::clone(&shared);
        let writer = crate::threads::spawn("log-writer", move || writer::run(w))?;
        let p = Arc::clone(&shared);
        let preparer = match crate::threads::spawn("log-preparer", move || prepare::run(p)) {
            Ok(h) => h,
            Err(e) => {
                shared.state.lock().shutdown = true;
                shared.work.notify_all();
                let _ = writer.join();
                return Err(e.into());
            }
        };
        Ok(Log {
            shared,
            writer: Some(writer),
            preparer: Some(preparer),
            report: rec.report,
            cut_files: Mutex::new(rec.cut_files),
            _lock: lock,
        })
    }

    /// Assigns the batch its LSN and locations and queues it for the group
    /// commit writer. Fails at once, changing nothing, if the log is
    /// poisoned or no space can be reserved.
    pub fn submit(&self, batch: Batch) -> Result<AppendTicket, LogError> {
        let ticket = self.queue_batch(batch)?;
        self.shared.work.notify_one();
        Ok(ticket)
    }

    /// Like [`Log::submit`], without waking the writer thread: the caller
    /// commits the batch itself with [`Log::commit_inline`] before it
    /// waits for anything this log writes.
    pub fn submit_deferred(&self, batch: Batch) -> Result<AppendTicket, LogError> {
        self.queue_batch(batch)
    }

    fn queue_batch(&self, mut batch: Batch) -> Result<AppendTicket, LogError> {
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
        let offset32 = u32::try_from(offset).expect("segment_bytes is at most u32::MAX");
        let locs = batch.seal(seg.id, offset32, lsn);
        active.write_offset += frame_len;
        st.next_lsn += 1;
        st.queue.push(Item::Batch {
            seg,
            offset,
            lsn,
            bytes: batch.into_frame(),
        });
        drop(st);
        Ok(AppendTicket {
            lsn,
            locs,
            log: Waiter(Arc::clone(&self.shared)),
        })
    }

    /// Frame bytes the next batch is sure to find without preparing a
    /// segment on the submit path: the active segment's free bytes when
    /// they reach `wanted`, else a whole segment's once a prepared spare
    /// waits (one is prepared here if none does). When the disk has no
    /// room for a spare, the active segment's free bytes are all there is.
    ///
    /// A writer that keeps its next batch within the answer gets no
    /// `NoSpace` from [`Log::submit`], so it can decide on a full disk
    /// *before* it changes anything, instead of undoing a change after the
    /// submit refused it. Another writer of the same log may take the
    /// spare first; `submit` still refuses safely then.
    pub fn room(&self, wanted: u64) -> Result<u64, LogError> {
        let st = self.shared.state.lock();
        if self.shared.is_poisoned() {
            return Err(self.shared.poison_error());
        }
        let active = st
            .active
            .as_ref()
            .map_or(0, |a| a.capacity.saturating_sub(a.write_offset));
        if active >= wanted {
            return Ok(active);
        }
        let whole = self.shared.segment_bytes - SEGMENT_HEADER_LEN as u64;
        // Under the submit mutex, as a roll would be: the spare prepared
        // here is the one the next roll takes.
        match self.shared.ensure_spare() {
            Ok(()) => Ok(whole),
            Err(LogError::NoSpace(_)) => Ok(active),
            Err(e) => Err(e),
        }
    }

    /// `submit` then `wait`.
    pub fn append(&self, batch: Batch) -> Result<Appended, LogError> {
        self.submit(batch)?.wait()
    }

    /// Deletes a sealed segment and fsyncs the directory. O(1): the file
    /// is renamed or unlinked whole. Reads already holding the segment
    /// finish normally; later reads of its locations get `BadLocation`.
    ///
    /// When no reader holds the segment and fewer than
    /// [`prepare::RECYCLED_SPARES_MAX`] spares are kept, the file is not
    /// unlinked but renamed to `recycle-<id>.tmp` and handed to the
    /// preparer, which makes it the next spare (see [`super::prepare`]).
    /// Either way the old segment's name is gone, durably, on return.
    ///
    /// A poisoned log deletes nothing: the caller decided the segment was
    /// unneeded from writes that may not be on disk (a relocation whose
    /// fsync failed), and recovery reads only what is, so the file stays
    /// for whatever the durable log still points into it.
    pub fn delete_segment(&self, id: SegmentId) -> Result<(), LogError> {
        if self.shared.is_poisoned() {
            return Err(self.shared.poison_error());
        }
        let mut segments = self.shared.segments.write();
        let seg = segments
            .get(&id)
            .cloned()
            .ok_or_else(|| LogError::InvalidArgument(format!("no segment {id}")))?;
        if !seg.is_sealed() {
            return Err(LogError::InvalidArgument(format!(
                "segment {id} is the active segment; only sealed segments can be deleted"
            )));
        }
        let (first_lsn, last_lsn) = (seg.first_lsn, seg.last_lsn());
        segments.remove(&id);
        let recycle = seg.is_idle()
            && seg
                .file
                .metadata()
                .is_ok_and(|m| m.len() == self.shared.segment_bytes)
            && self.shared.prep.accepts_freed();
        // Rename or unlink first: if that fails, nothing has changed.
        // Readers holding the segment keep their descriptor and mapping.
        let tmp = self.shared.dir.join(format!("recycle-{id}.tmp"));
        let res = if recycle {
            self.shared.io.rename(&seg.path, &tmp)
        } else {
            self.shared.io.remove(&seg.path)
        };
        if let Err(e) = res {
            segments.insert(id, seg);
            return Err(e.into());
        }
        drop(segments);
        drop(seg);
        self.shared.io.sync_dir(&self.shared.dir)?;
        if recycle {
            self.shared.prep.push_freed(Freed { path: tmp });
        }
        tracing::info!(
            segment = id,
            first_lsn,
            last_lsn,
            recycled = recycle,
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

    /// Writes and (per the sync policy) commits everything submitted so
    /// far on the caller's thread, unless the writer thread is in a pass,
    /// which then takes it; the durable hook runs after. For a log's only
    /// submitter, which would otherwise wake the writer thread and wait:
    /// the caller blocks for the write and its fdatasync. Returns whether
    /// it wrote. A write or fsync error poisons the log as on the thread.
    pub fn commit_inline(&self) -> bool {
        writer::commit_inline(&self.shared)
    }

    /// Installs (or, with `None`, removes) the hook run after each pass
    /// that may have made batches durable or poisoned the log, on the
    /// thread that ran the pass. Removing it waits for a call in flight, so once this returns
    /// the old hook never runs again.
    pub fn set_durable_hook(&self, hook: Option<super::DurableHook>) {
        *self.shared.durable_hook.lock() = hook;
    }

    /// Why the log is poisoned, if it is.
    pub fn poisoned(&self) -> Option<String> {
        self.shared.durable.lock().clone()
    }

    /// What recovery found at open (torn tail cut, counts).
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Side files that keep the bytes torn-tail cuts removed (see
    /// `recovery`), this open's and earlier ones'.
    pub fn cut_files(&self) -> Vec<std::path::PathBuf> {
        self.cut_files.lock().clone()
    }

    /// Removes the side files of torn-tail cuts: the owner calls it once a
    /// checkpoint newer than the open covers the log's end, so the cut is
    /// settled for good. A file that cannot be removed is kept and logged.
    pub fn release_cut_bytes(&self) {
        let mut files = self.cut_files.lock();
        files.retain(|path| match self.shared.io.remove(path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed the bytes a torn-tail cut kept: a newer checkpoint covers the log's end");
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove the bytes a torn-tail cut kept");
                true
            }
        });
    }

    /// Writer counters.
    pub fn stats(&self) -> LogStats {
        let s = &self.shared.stats;
        LogStats {
            commits: s.commits.load(Ordering::Relaxed),
            bytes_written: s.bytes.load(Ordering::Relaxed),
            commit_time: Duration::from_nanos(s.commit_ns.load(Ordering::Relaxed)),
            durable_lsn: self.durable_lsn(),
            spares_ready: self.shared.spares_ready(),
            spare_failures: self.shared.prep.failures.load(Ordering::Relaxed),
            spare_failure_warnings: self.shared.prep.warnings.load(Ordering::Relaxed),
            segments_recycled: self.shared.prep.recycled.load(Ordering::Relaxed),
        }
    }

    /// The IO backend this log writes through, for files kept beside it
    /// (see [`write_file_durably`]).
    pub fn io(&self) -> &Arc<dyn LogIo> {
        &self.shared.io
    }

    /// The directory of the log.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }
}

impl Drop for Log {
    /// Writes and syncs what is queued, then stops the writer.
    /// Prepared spares stay on disk: the next open takes them up again.
    fn drop(&mut self) {
        prepare::shutdown(&self.shared);
        if let Some(p) = self.preparer.take() {
            let _ = p.join();
        }
        self.shared.state.lock().shutdown = true;
        self.shared.work.notify_all();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}
