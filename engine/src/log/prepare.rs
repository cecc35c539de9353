//! Segments prepared ahead of need, and recycled segment files.
//!
//! The first write into a fallocated (unwritten) block makes its fdatasync
//! commit file-system metadata as well as data, which costs noticeably
//! more than overwriting a block that was written before. So a new segment
//! is *written* in full before any commit goes into it: zeros over its
//! whole length, a prepared header (flag [`SEGMENT_FLAG_PREPARED`], no
//! LSN), one fdatasync, then the rename to its final name
//! (`<id>.seg`, the next segment id) and an fsync of the directory. When
//! the log rolls into it, the writer only overwrites the header with the
//! segment's first LSN (one block, already written); a commit's fdatasync
//! then flushes data only.
//!
//! The "segment preparer" thread keeps [`LogOptions::spare_segments`]
//! such spares ready, so no commit waits for preparation in the steady
//! state. A roll that finds none ready prepares one inline, under the
//! submit mutex, as before: running out of disk space is met there, before
//! the batch is accepted, and changes nothing (`NoSpace`).
//!
//! A segment that compaction frees ([`super::Log::delete_segment`]) is
//! renamed to `recycle-<id>.tmp` (directory fsynced before the delete
//! returns, so the old segment is gone for good) and handed here: the
//! preparer writes a prepared header for the next id with flag
//! [`SEGMENT_FLAG_RECYCLED`] and an all-zero batch header right after it
//! (the end of the data), fdatasyncs, renames it to `<id>.seg` and fsyncs
//! the directory. The old segment's bytes stay past that end: every CRC is
//! bound to the segment id and ids never repeat, so they never verify as
//! the new segment's data. At most [`RECYCLED_SPARES_MAX`] spares are kept;
//! a freed segment beyond that is deleted.
//!
//! Invariants:
//! - a spare's name on disk is `<id>.seg` only after its header (and, for
//!   a fresh one, its zeros) are synced, so after a power cut a prepared
//!   segment is either whole or absent (its `*.tmp` is removed at open);
//! - spare ids are taken from one counter in increasing order, and a roll
//!   takes the lowest, so begun segments keep increasing ids;
//! - a failure of the background preparer poisons nothing: the spare is
//!   refused (removed, its id never used) and a later roll prepares inline;
//!   an inline failure other than a full disk poisons the log.
//!
//! [`SEGMENT_FLAG_PREPARED`]: super::format::SEGMENT_FLAG_PREPARED
//! [`SEGMENT_FLAG_RECYCLED`]: super::format::SEGMENT_FLAG_RECYCLED
//! [`LogOptions::spare_segments`]: super::LogOptions::spare_segments

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::format::{
    self, BATCH_HEADER_LEN, SEGMENT_FLAG_PREPARED, SEGMENT_FLAG_RECYCLED, SEGMENT_HEADER_LEN,
};
use super::io::is_no_space;
use super::segment::segment_file_name;
use super::shared::Shared;
use super::{LogError, SegmentId, SegmentPrep};

/// Most spares kept, counting freed segments waiting to be recycled.
pub const RECYCLED_SPARES_MAX: usize = 2;

/// The least time between two WARNs of failed background preparations.
pub const SPARE_FAILURE_WARN_EVERY: Duration = Duration::from_secs(60);

/// A prepared segment, ready to be begun.
#[derive(Debug)]
pub(crate) struct Spare {
    pub id: SegmentId,
    pub path: PathBuf,
    pub file: File,
    /// Stale bytes of an older segment follow the end marker.
    pub recycled: bool,
}

/// A freed segment file waiting to be recycled.
#[derive(Debug)]
pub(crate) struct Freed {
    pub path: PathBuf,
}

#[derive(Debug, Default)]
pub(crate) struct PrepState {
    pub ready: VecDeque<Spare>,
    pub freed: Vec<Freed>,
    /// Set when a spare is taken (and at open); cleared when a background
    /// attempt fails, so a full disk is not retried in a loop.
    pub wanted: bool,
    pub shutdown: bool,
}

/// The preparer's share of the log state.
#[derive(Debug)]
pub(crate) struct Preparer {
    pub state: Mutex<PrepState>,
    pub cv: Condvar,
    /// One preparation at a time (background or inline), so spare ids are
    /// ready in the order they were taken.
    pub busy: Mutex<()>,
    /// The next segment id to hand out; ids never repeat.
    pub next_id: AtomicU32,
    pub target: usize,
    pub mode: SegmentPrep,
    tmp_seq: AtomicU64,
    /// Background attempts that failed (spare refused, nothing poisoned).
    pub failures: AtomicU64,
    /// WARNs logged for them, and when the last was (with the failures
    /// counted then): see [`SPARE_FAILURE_WARN_EVERY`].
    pub warnings: AtomicU64,
    last_warning: Mutex<Option<(Instant, u64)>>,
    pub recycled: AtomicU64,
}

impl Preparer {
    pub fn new(next_id: SegmentId, target: usize, mode: SegmentPrep, ready: Vec<Spare>) -> Self {
        Self {
            state: Mutex::new(PrepState {
                ready: ready.into(),
                freed: Vec::new(),
                wanted: true,
                shutdown: false,
            }),
            cv: Condvar::new(),
            busy: Mutex::new(()),
            next_id: AtomicU32::new(next_id),
            target,
            mode,
            tmp_seq: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            warnings: AtomicU64::new(0),
            last_warning: Mutex::new(None),
            recycled: AtomicU64::new(0),
        }
    }

    /// Room for one more freed segment to be kept for recycling.
    pub fn accepts_freed(&self) -> bool {
        let st = self.state.lock();
        !st.shutdown && st.ready.len() + st.freed.len() < RECYCLED_SPARES_MAX.max(self.target)
    }

    pub fn push_freed(&self, freed: Freed) {
        self.state.lock().freed.push(freed);
        self.cv.notify_all();
    }

    fn take_id(&self) -> Result<SegmentId, LogError> {
        self.next_id
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |id| id.checked_add(1))
            .map_err(|_| LogError::InvalidArgument("segment ids exhausted".into()))
    }

    /// Logs a failed background preparation, at most once per
    /// [`SPARE_FAILURE_WARN_EVERY`]: on a full disk every refused write
    /// asks for the segment again, and each attempt fails the same way.
    fn warn_failure(&self, dir: &Path, e: &LogError, failures: u64) {
        let mut last = self.last_warning.lock();
        let now = Instant::now();
        if let Some((at, _)) = *last {
            if now.duration_since(at) < SPARE_FAILURE_WARN_EVERY {
                return;
            }
        }
        let since = failures - last.map_or(0, |(_, counted)| counted);
        *last = Some((now, failures));
        self.warnings.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(dir = %dir.display(), error = %e, failed_attempts = since,
            "could not prepare the next segment ahead of need; the next roll prepares it inline \
             (logged at most once a minute)");
    }

    fn tmp_path(&self, dir: &Path) -> PathBuf {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        dir.join(format!("prealloc-{n}.tmp"))
    }
}

enum Job {
    Fresh,
    Recycle(Freed),
}

impl Shared {
    /// A spare for a roll: a ready one, or one prepared inline (a freed
    /// segment if one waits, else a fresh file). Called under the submit
    /// mutex. On `NoSpace` nothing has changed.
    pub(super) fn take_spare(&self) -> Result<Spare, LogError> {
        let _busy = self.prep.busy.lock();
        let job = {
            let mut st = self.prep.state.lock();
            st.wanted = true;
            if let Some(s) = st.ready.pop_front() {
                drop(st);
                self.prep.cv.notify_all();
                return Ok(s);
            }
            match st.freed.pop() {
                Some(f) => Job::Recycle(f),
                None => Job::Fresh,
            }
        };
        self.prep.cv.notify_all();
        match self.prepare(job) {
            Ok(s) => Ok(s),
            Err(e @ LogError::NoSpace(_)) => Err(e),
            Err(e) => {
                self.poison(format!("preparing a segment inline failed: {e}"));
                Err(self.poison_error())
            }
        }
    }

    /// Makes sure a spare is ready for the next roll: returns at once if
    /// one waits, else prepares one inline. Called under the submit mutex.
    /// On `NoSpace` nothing has changed.
    pub(super) fn ensure_spare(&self) -> Result<(), LogError> {
        if !self.prep.state.lock().ready.is_empty() {
            return Ok(());
        }
        let spare = self.take_spare()?;
        // The spare with the lowest id goes first, as `take_spare` took it.
        self.prep.state.lock().ready.push_front(spare);
        Ok(())
    }

    /// Prepares one spare (see the module docs). On error nothing named
    /// `*.seg` is left for it (best effort), and its id goes back for the
    /// next preparation once its file is gone.
    fn prepare(&self, job: Job) -> Result<Spare, LogError> {
        let id = match self.prep.take_id() {
            Ok(id) => id,
            Err(e) => {
                if let Job::Recycle(f) = &job {
                    let _ = self.io.remove(&f.path);
                }
                return Err(e);
            }
        };
        let (tmp, recycled) = match &job {
            Job::Fresh => (self.prep.tmp_path(&self.dir), false),
            Job::Recycle(f) => (f.path.clone(), true),
        };
        let path = self.dir.join(segment_file_name(id));
        let mut renamed = false;
        let res = (|| -> std::io::Result<File> {
            let file = if recycled {
                let file = self.io.open_existing(&tmp)?;
                if file.metadata()?.len() != self.segment_bytes {
                    return Err(std::io::Error::other(
                        "freed segment is not of the configured size",
                    ));
                }
                file
            } else {
                let file = self.io.create_preallocated(&tmp, self.segment_bytes)?;
                if self.prep.mode == SegmentPrep::Write {
                    self.fill_zeros(&file)?;
                }
                file
            };
            let mut flags = SEGMENT_FLAG_PREPARED;
            if recycled {
                flags |= SEGMENT_FLAG_RECYCLED;
            }
            let mut head = vec![0u8; SEGMENT_HEADER_LEN + BATCH_HEADER_LEN];
            head[..SEGMENT_HEADER_LEN]
                .copy_from_slice(&format::encode_segment_header_with_flags(id, 1, flags));
            self.io.write_prepared(&file, 0, &head, true)?;
            self.io.rename(&tmp, &path)?;
            renamed = true;
            self.io.sync_dir(&self.dir)?;
            Ok(file)
        })();
        match res {
            Ok(file) => {
                if recycled {
                    self.prep.recycled.fetch_add(1, Ordering::Relaxed);
                }
                tracing::debug!(segment = id, recycled, "segment prepared");
                Ok(Spare {
                    id,
                    path,
                    file,
                    recycled,
                })
            }
            Err(e) => {
                let removed = match self.io.remove(if renamed { &path } else { &tmp }) {
                    Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                    Ok(()) => true,
                };
                // A full disk: nothing holds the id any more, and the next
                // preparation takes it again, so attempts refused for lack
                // of space do not make segment numbers skip. Preparations
                // run one at a time (`busy`), so no later id was taken
                // meanwhile. After any other failure (a file that could
                // not be removed, an fsync error) the id stays used.
                if removed && !recycled && is_no_space(&e) {
                    let _ = self.prep.next_id.compare_exchange(
                        id + 1,
                        id,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
                if is_no_space(&e) {
                    Err(LogError::NoSpace(format!(
                        "preallocating {} bytes in {}: {e}",
                        self.segment_bytes,
                        self.dir.display()
                    )))
                } else {
                    Err(e.into())
                }
            }
        }
    }

    /// Writes zeros over the whole (fallocated) file, so that later
    /// commits overwrite written blocks. Synced by the header write after.
    fn fill_zeros(&self, file: &File) -> std::io::Result<()> {
        super::io::fill_with_zeros(0, self.segment_bytes, |at, zeros| {
            self.io.write_prepared(file, at, zeros, false)
        })
    }

    /// Prepared spares ready now.
    pub(super) fn spares_ready(&self) -> usize {
        self.prep.state.lock().ready.len()
    }
}

/// The background preparer thread: keeps the spares topped up.
pub(crate) fn run(shared: Arc<Shared>) {
    let p = &shared.prep;
    let cap = RECYCLED_SPARES_MAX.max(p.target);
    loop {
        {
            let mut st = p.state.lock();
            loop {
                if st.shutdown {
                    return;
                }
                let recycle = !st.freed.is_empty() && st.ready.len() < cap;
                let fresh = st.wanted && st.ready.len() < p.target;
                if (recycle || fresh) && !shared.is_poisoned() {
                    break;
                }
                p.cv.wait(&mut st);
            }
        }
        let _busy = p.busy.lock();
        let job = {
            let mut st = p.state.lock();
            if st.shutdown {
                return;
            }
            if !st.freed.is_empty() && st.ready.len() < cap {
                Job::Recycle(st.freed.pop().expect("not empty"))
            } else if st.wanted && st.ready.len() < p.target {
                Job::Fresh
            } else {
                continue;
            }
        };
        match shared.prepare(job) {
            Ok(spare) => {
                let mut st = p.state.lock();
                st.ready.push_back(spare);
            }
            Err(e) => {
                let failures = p.failures.fetch_add(1, Ordering::Relaxed) + 1;
                p.state.lock().wanted = false;
                p.warn_failure(&shared.dir, &e, failures);
            }
        }
        p.cv.notify_all();
    }
}

/// Stops the preparer; freed segments not yet recycled are deleted (the
/// prepared spares stay: they are valid segments the next open reuses).
pub(crate) fn shutdown(shared: &Shared) {
    let freed = {
        let mut st = shared.prep.state.lock();
        st.shutdown = true;
        std::mem::take(&mut st.freed)
    };
    shared.prep.cv.notify_all();
    for f in freed {
        let _ = shared.io.remove(&f.path);
    }
}
