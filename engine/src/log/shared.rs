//! State shared by the log handle, the tickets and the writer thread: the
//! submit side (LSN and space assignment, the queue), the durable LSN and
//! the poison flag, and rolling to a new segment.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use super::format::{self, SEGMENT_HEADER_LEN};
use super::io::LogIo;
use super::prepare::Preparer;
use super::segment::Segment;
use super::writer::{self, Item};
use super::{LogError, Lsn, SegmentId, SyncPolicy};

/// The submit side, under one mutex: LSN and space assignment, the queue.
pub(super) struct SubmitState {
    pub(super) next_lsn: Lsn,
    pub(super) active: Option<ActiveTail>,
    pub(super) queue: Vec<Item>,
    pub(super) shutdown: bool,
}

pub(super) struct ActiveTail {
    pub(super) seg: Arc<Segment>,
    /// Where the next batch goes (reserved, not necessarily written).
    pub(super) write_offset: u64,
    pub(super) capacity: u64,
}

/// State shared by the log handle, tickets and the writer thread.
pub(super) struct Shared {
    pub(super) dir: PathBuf,
    pub(super) segment_bytes: u64,
    pub(super) sync: SyncPolicy,
    pub(super) io: Arc<dyn LogIo>,
    pub(super) state: Mutex<SubmitState>,
    /// Wakes the writer.
    pub(super) work: Condvar,
    /// Durable LSN and poison reason, for waiters.
    pub(super) durable: Mutex<Option<String>>,
    pub(super) durable_cv: Condvar,
    pub(super) durable_lsn: AtomicU64,
    pub(super) poisoned: AtomicBool,
    pub(super) segments: RwLock<BTreeMap<SegmentId, Arc<Segment>>>,
    /// Where what was found on disk at open ends: the segment that was
    /// active then and its write offset, or the newest sealed segment and
    /// `u64::MAX` (`None`: nothing was found). This process appends after
    /// it, in that segment or in newer ones (ids only grow): before it are
    /// the pages that may not be in the page cache
    /// ([`super::Log::read_ahead`]).
    pub(super) found_end: Option<(SegmentId, u64)>,
    /// What the last look at the kernel's reclaim counters says is cached
    /// (`log/cache.rs`).
    pub(super) cache: super::cache::CacheWatch,
    pub(super) prep: Preparer,
    pub(super) stats: writer::Stats,
    /// Called after each pass that may have made batches durable or
    /// poisoned the log, on the thread that ran it (see [`DurableHook`]). Held
    /// while it runs, so clearing it waits for a call in flight.
    pub(super) durable_hook: Mutex<Option<DurableHook>>,
    /// The writer's state between passes; held for a pass, by the writer
    /// thread or by an inline commit (`writer::commit_inline`).
    pub(super) writer: Mutex<writer::WriterState>,
}

/// What the owner of a log runs once batches are durable, on the thread
/// that wrote them (the writer thread, or a caller of
/// `Log::commit_inline`): it finishes whatever waited for them there,
/// without waking a thread of its own. It must not block on this log's
/// writer.
pub type DurableHook = Box<dyn Fn() + Send + Sync>;

impl Shared {
    pub(super) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    pub(super) fn poison_error(&self) -> LogError {
        let reason = self.durable.lock().clone().unwrap_or_default();
        LogError::Poisoned(reason)
    }

    /// Stops the log for good (R21) and fails every waiter not yet durable.
    pub(super) fn poison(&self, reason: String) {
        let mut p = self.durable.lock();
        if p.is_none() {
            tracing::error!(dir = %self.dir.display(), %reason, "segment log poisoned; appends fail until restart");
            *p = Some(reason);
        }
        self.poisoned.store(true, Ordering::Release);
        self.durable_cv.notify_all();
    }

    pub(super) fn publish_durable(&self, lsn: Lsn) {
        let _g = self.durable.lock();
        debug_assert!(lsn >= self.durable_lsn.load(Ordering::Relaxed));
        self.durable_lsn.store(lsn, Ordering::Release);
        self.durable_cv.notify_all();
    }

    pub(super) fn wait_durable(&self, lsn: Lsn) -> Result<(), LogError> {
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

    /// Starts the next segment for a batch that does not fit. On error
    /// nothing has changed.
    pub(super) fn roll(&self, st: &mut SubmitState) -> Result<(), LogError> {
        let spare = self.take_spare()?;
        let first_lsn = st.next_lsn;
        let mut seg = Segment::new(
            spare.id,
            spare.path,
            spare.file,
            first_lsn,
            first_lsn - 1,
            SEGMENT_HEADER_LEN as u64,
            false,
        );
        let mut flags = 0;
        if spare.recycled {
            seg = seg.with_end_marker(self.segment_bytes);
            flags |= format::SEGMENT_FLAG_RECYCLED;
        }
        let seg = Arc::new(seg);
        let old = st.active.take().map(|a| a.seg);
        st.queue.push(Item::Roll {
            old,
            new: Arc::clone(&seg),
            header: format::encode_segment_header_with_flags(spare.id, first_lsn, flags),
        });
        st.active = Some(ActiveTail {
            seg,
            write_offset: SEGMENT_HEADER_LEN as u64,
            capacity: self.segment_bytes,
        });
        Ok(())
    }
}
