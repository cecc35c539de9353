//! State shared by the log handle, the tickets and the writer thread: the
//! submit side (LSN and space assignment, the queue), the durable LSN and
//! the poison flag, and rolling to a new segment.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use super::format::{self, SEGMENT_HEADER_LEN};
use super::io::{self, LogIo};
use super::segment::{self, Segment};
use super::writer::{self, Item};
use super::{LogError, Lsn, SegmentId, SyncPolicy};

/// The submit side, under one mutex: LSN and space assignment, the queue.
pub(super) struct SubmitState {
    pub(super) next_lsn: Lsn,
    pub(super) next_segment_id: SegmentId,
    pub(super) active: Option<ActiveTail>,
    /// A preallocated file ready to become the next segment.
    pub(super) spare: Option<Spare>,
    pub(super) queue: Vec<Item>,
    pub(super) spare_wanted: bool,
    pub(super) shutdown: bool,
}

pub(super) struct ActiveTail {
    pub(super) seg: Arc<Segment>,
    /// Where the next batch goes (reserved, not necessarily written).
    pub(super) write_offset: u64,
    pub(super) capacity: u64,
}

pub(super) struct Spare {
    pub(super) file: File,
    pub(super) path: PathBuf,
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
    pub(super) prealloc_seq: AtomicU64,
    pub(super) stats: writer::Stats,
}

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

    /// Creates a preallocated file for the next segment.
    pub(super) fn preallocate(&self) -> Result<Spare, LogError> {
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
    pub(super) fn preallocate_spare_in_background(&self) {
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
    pub(super) fn roll(&self, st: &mut SubmitState) -> Result<(), LogError> {
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
