//! Failpoints for whole-daemon fault injection (cargo feature
//! `failpoints`; absent from normal builds, so they cost nothing there).
//!
//! [`crate::Inbox::open`] reads [`ENV_VAR`] when the feature is on and, if
//! it names any failpoint, puts both logs' IO behind a [`FailpointIo`]
//! wrapping the configured backend. The value is a comma-separated list:
//!
//! | failpoint | effect |
//! |---|---|
//! | `fsync_eio_after=N` | the first N data syncs succeed, the next one fails with EIO, and later ones succeed again (a disk that "recovers" after losing dirty pages: the engine must not carry on as if the failed sync had worked) |
//! | `enospc_marker=NAME` | while the file `DATA_DIR/NAME` exists, preallocating or extending a segment fails with ENOSPC (the only place a full disk can show up: segments are written only inside preallocated space); deleting the file frees the space |
//! | `torn_write_after=N` | the first N data writes succeed; the next one writes only the first half of its bytes and fails with EIO (a torn write in the middle of a group-committed batch); later writes succeed |
//! | `fsync_hold_marker=NAME` | while the file `DATA_DIR/NAME` exists, every data sync waits (the log writer is stuck in its fsync, as on a stalled disk); the first sync held creates `DATA_DIR/NAME.held`, so a test knows a round is stuck; deleting `NAME` lets them all go on |
//! | `panic_on_write_after=N` | the first N data writes succeed; the next one panics on the thread that makes it (the log writer): a bug in an engine thread, for the daemon's fatal-panic path |
//!
//! Counts are shared by the `msg` and `evt` logs. Directory syncs, renames
//! and removals are passed through untouched.
//!
//! Invariant: with no failpoint named (or the variable unset) the engine
//! opens exactly as without the feature.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::log::{IoBackend, LogIo, PwriteIo, UringIo};

/// The environment variable that names the failpoints.
pub const ENV_VAR: &str = "INBOXD_FAILPOINTS";

/// Which faults to inject, parsed from [`ENV_VAR`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub fsync_eio_after: Option<u64>,
    /// Absolute path of the marker file.
    pub enospc_marker: Option<PathBuf>,
    pub torn_write_after: Option<u64>,
    pub panic_on_write_after: Option<u64>,
    /// Absolute path of the marker file that holds data syncs.
    pub fsync_hold_marker: Option<PathBuf>,
}

impl Plan {
    /// Parses `spec` (see the module docs); relative marker names are
    /// taken inside `data_dir`. Unknown names and bad numbers are refused,
    /// so a typo cannot silently disable a failpoint.
    pub fn parse(spec: &str, data_dir: &Path) -> Result<Plan> {
        let mut plan = Plan::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let bad = |why: &str| Error::BadRequest(format!("{ENV_VAR}: {item:?}: {why}"));
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| bad("expected NAME=VALUE"))?;
            let count = || value.parse::<u64>().map_err(|_| bad("expected a count"));
            match name {
                "fsync_eio_after" => plan.fsync_eio_after = Some(count()?),
                "torn_write_after" => plan.torn_write_after = Some(count()?),
                "panic_on_write_after" => plan.panic_on_write_after = Some(count()?),
                "enospc_marker" if !value.is_empty() => {
                    plan.enospc_marker = Some(data_dir.join(value));
                }
                "fsync_hold_marker" if !value.is_empty() => {
                    plan.fsync_hold_marker = Some(data_dir.join(value));
                }
                _ => return Err(bad("unknown failpoint")),
            }
        }
        Ok(plan)
    }

    pub fn is_empty(&self) -> bool {
        *self == Plan::default()
    }
}

/// The IO backend to open the logs with, when [`ENV_VAR`] names any
/// failpoint.
pub(crate) fn io_from_env(data_dir: &Path, backend: IoBackend) -> Result<Option<Arc<dyn LogIo>>> {
    let Ok(spec) = std::env::var(ENV_VAR) else {
        return Ok(None);
    };
    let plan = Plan::parse(&spec, data_dir)?;
    if plan.is_empty() {
        return Ok(None);
    }
    let inner: Arc<dyn LogIo> = match backend {
        IoBackend::Pwrite => Arc::new(PwriteIo),
        IoBackend::IoUring => Arc::new(UringIo::new().map_err(crate::log::LogError::Io)?),
    };
    tracing::warn!(
        ?plan,
        "failpoints active: the log's IO will fail on purpose"
    );
    Ok(Some(Arc::new(FailpointIo::new(inner, plan))))
}

/// A [`LogIo`] that injects the faults of a [`Plan`] into another backend.
#[derive(Debug)]
pub struct FailpointIo {
    inner: Arc<dyn LogIo>,
    plan: Plan,
    syncs: AtomicU64,
    writes: AtomicU64,
    /// Inodes of segment files being prepared (`prealloc-*`, `recycle-*`).
    /// Their writes and syncs do not count towards the plan's numbers: the
    /// preparer runs on its own thread at its own pace, so counting them
    /// would move the chosen write or sync between runs.
    preparing: parking_lot::Mutex<std::collections::HashSet<u64>>,
}

/// Whether `path` names a segment file the log is still preparing.
fn is_preparing_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("prealloc-") || n.starts_with("recycle-"))
}

fn ino(file: &File) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    file.metadata().ok().map(|m| m.ino())
}

impl FailpointIo {
    pub fn new(inner: Arc<dyn LogIo>, plan: Plan) -> Self {
        Self {
            inner,
            plan,
            syncs: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            preparing: parking_lot::Mutex::new(std::collections::HashSet::new()),
        }
    }

    fn preparing(&self, file: &File) -> bool {
        ino(file).is_some_and(|i| self.preparing.lock().contains(&i))
    }

    fn out_of_space(&self) -> io::Result<()> {
        match &self.plan.enospc_marker {
            Some(marker) if marker.exists() => {
                tracing::warn!(marker = %marker.display(), "failpoint: ENOSPC");
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            }
            _ => Ok(()),
        }
    }

    /// Counts one data sync; holds it while the hold marker exists; fails
    /// it when it is the chosen one.
    fn sync_failpoint(&self) -> io::Result<()> {
        if let Some(marker) = &self.plan.fsync_hold_marker {
            let mut told = false;
            while marker.exists() {
                if !told {
                    tracing::warn!(marker = %marker.display(), "failpoint: fsync held");
                    let mut held = marker.clone().into_os_string();
                    held.push(".held");
                    std::fs::write(held, b"")?;
                    told = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        let n = self.syncs.fetch_add(1, Ordering::SeqCst);
        if self.plan.fsync_eio_after == Some(n) {
            tracing::warn!(sync = n + 1, "failpoint: fsync fails with EIO");
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

impl LogIo for FailpointIo {
    fn name(&self) -> &'static str {
        "failpoints"
    }

    fn create_preallocated(&self, path: &Path, len: u64) -> io::Result<File> {
        self.out_of_space()?;
        let file = self.inner.create_preallocated(path, len)?;
        if is_preparing_name(path) {
            if let Some(i) = ino(&file) {
                self.preparing.lock().insert(i);
            }
        }
        Ok(file)
    }

    fn open_existing(&self, path: &Path) -> io::Result<File> {
        self.inner.open_existing(path)
    }

    fn allocate(&self, file: &File, len: u64) -> io::Result<()> {
        self.out_of_space()?;
        self.inner.allocate(file, len)
    }

    fn write_at(&self, file: &File, offset: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        if self.preparing(file) {
            return self.inner.write_at(file, offset, buf, sync);
        }
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        if self.plan.panic_on_write_after == Some(n) {
            panic!("failpoint: panic_on_write_after={n}");
        }
        if self.plan.torn_write_after == Some(n) {
            let half = buf.len() / 2;
            tracing::warn!(
                write = n + 1,
                bytes = buf.len(),
                written = half,
                "failpoint: torn write"
            );
            self.inner.write_at(file, offset, &buf[..half], false)?;
            // Make the torn bytes really reach the disk, as a power cut
            // after a partial write would leave them.
            self.inner.sync_data(file)?;
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.write_at(file, offset, buf, false)?;
        if sync {
            self.sync_failpoint()?;
            self.inner.sync_data(file)?;
        }
        Ok(())
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        if !self.preparing(file) {
            self.sync_failpoint()?;
        }
        self.inner.sync_data(file)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)?;
        if let Some(i) = std::fs::metadata(to).ok().map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.ino()
        }) {
            let mut preparing = self.preparing.lock();
            if is_preparing_name(to) {
                preparing.insert(i);
            } else {
                preparing.remove(&i);
            }
        }
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_parses_every_failpoint_and_refuses_typos() {
        let dir = Path::new("/data");
        let plan = Plan::parse(
            "fsync_eio_after=3, enospc_marker=FULL,torn_write_after=7,fsync_hold_marker=HOLD",
            dir,
        )
        .unwrap();
        assert_eq!(
            plan,
            Plan {
                fsync_eio_after: Some(3),
                enospc_marker: Some(PathBuf::from("/data/FULL")),
                torn_write_after: Some(7),
                panic_on_write_after: None,
                fsync_hold_marker: Some(PathBuf::from("/data/HOLD")),
            }
        );
        assert!(Plan::parse("fsync_hold_marker=", dir).is_err());
        assert!(Plan::parse("", dir).unwrap().is_empty());
        assert!(Plan::parse("fsync_eio_afterr=3", dir).is_err());
        assert!(Plan::parse("fsync_eio_after=x", dir).is_err());
        assert!(Plan::parse("enospc_marker=", dir).is_err());
    }

    #[test]
    fn the_chosen_sync_fails_once_and_the_marker_gates_preallocation() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("FULL");
        let io = FailpointIo::new(
            Arc::new(PwriteIo),
            Plan {
                fsync_eio_after: Some(1),
                enospc_marker: Some(marker.clone()),
                torn_write_after: None,
                panic_on_write_after: None,
                fsync_hold_marker: None,
            },
        );
        let file = io.create_preallocated(&dir.path().join("a"), 4096).unwrap();
        io.sync_data(&file).unwrap();
        assert_eq!(
            io.sync_data(&file).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        io.sync_data(&file).unwrap();
        std::fs::write(&marker, b"").unwrap();
        let full = io
            .create_preallocated(&dir.path().join("b"), 4096)
            .unwrap_err();
        assert_eq!(full.raw_os_error(), Some(libc::ENOSPC));
        assert!(!dir.path().join("b").exists(), "nothing left behind");
        std::fs::remove_file(&marker).unwrap();
        io.create_preallocated(&dir.path().join("b"), 4096).unwrap();
    }

    #[test]
    fn a_torn_write_leaves_the_first_half_and_fails() {
        let dir = tempfile::tempdir().unwrap();
        let io = FailpointIo::new(
            Arc::new(PwriteIo),
            Plan {
                torn_write_after: Some(0),
                ..Plan::default()
            },
        );
        let file = io.create_preallocated(&dir.path().join("a"), 4096).unwrap();
        let err = io.write_at(&file, 0, &[7u8; 100], true).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        let bytes = std::fs::read(dir.path().join("a")).unwrap();
        assert!(bytes[..50].iter().all(|b| *b == 7));
        assert!(bytes[50..].iter().all(|b| *b == 0));
        io.write_at(&file, 0, &[9u8; 10], true).unwrap();
    }
}
