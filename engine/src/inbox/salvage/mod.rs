//! Salvage (`inboxd salvage`): copies everything of a damaged data
//! directory that still verifies into a fresh one, and says exactly what
//! was lost.
//!
//! The source is only read: its segment files are mapped read-only, its
//! checkpoints read, and its log directories' locks taken the way the
//! offline tools take them (an existing `LOCK` file is opened read-only,
//! never created), so a running daemon's directory is refused. The new
//! directory is built beside the target (`.<name>.salvage`) and renamed
//! into place only once its checkpoint is durable: a salvage cut short
//! leaves no half-written data directory under the target's name.
//!
//! The steps ([`replay`], [`write`]):
//! 1. the newest checkpoint that verifies (falling back as recovery
//!    does), else an empty state;
//! 2. every record of the `evt` log after it that can be applied, going on
//!    past damage ([`source`]);
//! 3. every retained body and event read back and copied into new logs,
//!    locations remapped; what does not read back is lost, each user's
//!    floor is raised past their last lost event (a device behind it gets
//!    `RESET_REQUIRED`, one past it syncs on), a lost message stays at its
//!    `msg_seq` as a tombstone;
//! 4. the state's full invariant check, then a checkpoint of it.
//!
//! Invariants: the source is never written; the new directory opens with
//! `Inbox::open` and passes `verify_data_dir`; nothing lost is served
//! (a lost body is a tombstone, a lost event is below the floor).

mod guard;
mod replay;
mod report;
mod source;
pub(crate) mod write;

pub use report::{Damage, LostEvents, LostMessages, RaisedFloor, SalvageReport};

use std::fs::File;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::checkpoint;
use super::config::InboxConfig;
use super::handle::Inbox;
use super::state::State;
use crate::error::{Error, Result};
pub(crate) use crate::inbox::state::FLAG_LOST;
use crate::log::{LogError, SegmentPrep};
use source::LogFiles;

/// Salvages `config.data_dir` into `to` (which must not exist, or be an
/// empty directory). `config` gives the source's directory, the segment
/// size of the new logs and the idempotency TTL.
pub fn salvage(config: &InboxConfig, to: &Path) -> Result<SalvageReport> {
    let from = &config.data_dir;
    check_source(from)?;
    check_target(from, to)?;
    let tmp = staging_dir(to)?;
    if tmp.exists() {
        return Err(Error::BadRequest(format!(
            "{} exists (left by a salvage that was cut short?); remove it first",
            tmp.display()
        )));
    }
    let _locks = lock_source(from)?;
    let evt = LogFiles::open(&from.join("evt")).map_err(LogError::Io)?;
    let msg = LogFiles::open(&from.join("msg")).map_err(LogError::Io)?;
    let mut report = SalvageReport::default();
    // A file cut short lost whatever it held past its end, silently to a
    // scan of its contents.
    for (name, files) in [("evt", &evt), ("msg", &msg)] {
        for (id, len, why) in files.short_files() {
            report
                .damage
                .push(report::Damage::new(name, *id, *len, why.clone()));
        }
    }
    let ttl_ms = u64::try_from(config.idempotency_ttl.as_millis()).unwrap_or(u64::MAX);
    let last_lsn = replay::last_valid_lsn(&evt);
    let mut state =
        replay::load_checkpoint(from, last_lsn, &mut report)?.unwrap_or_else(|| State::new(ttl_ms));
    state.idem_ttl_ms = ttl_ms;
    replay::replay(&evt, &mut state, &mut report)?;
    replay::note_msg_damage(&msg, &mut report);

    // Private, as a data directory is (it holds the keys).
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .map_err(LogError::Io)?;
    let built = build(config, &tmp, &evt, &msg, state, &mut report);
    if let Err(e) = built.and_then(|()| publish(&tmp, to)) {
        // Best effort: what was staged is of no use.
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    Ok(report)
}

fn build(
    config: &InboxConfig,
    tmp: &Path,
    evt: &LogFiles,
    msg: &LogFiles,
    state: State,
    report: &mut SalvageReport,
) -> Result<()> {
    let target = write::Target {
        dir: tmp,
        segment_bytes: config.segment_bytes,
        // A body is read only once its CRC verified: its length is the
        // one written, under whatever limit the daemon had then.
        payload_max: u32::MAX,
        prep: SegmentPrep::Write,
    };
    write::write(&target, evt, msg, state, report)?;
    report.files_copied = copy_other_files(&config.data_dir, tmp)?;
    fsync_dir(tmp)
}

/// A data directory has an `evt` log or a checkpoint.
fn check_source(from: &Path) -> Result<()> {
    let is_data_dir = from.join("evt").is_dir() || checkpoint::dir(from).is_dir();
    if !is_data_dir {
        return Err(Error::BadRequest(format!(
            "{} is not an inboxd data directory (no evt log and no checkpoint)",
            from.display()
        )));
    }
    Ok(())
}

/// The target must be new or empty, and not inside the source (which is
/// never written).
fn check_target(from: &Path, to: &Path) -> Result<()> {
    if let Ok(mut entries) = std::fs::read_dir(to) {
        if entries.next().is_some() {
            return Err(Error::BadRequest(format!(
                "{} is not empty; salvage writes only into a new or empty directory",
                to.display()
            )));
        }
    } else if to.exists() {
        return Err(Error::BadRequest(format!(
            "{} exists and is not a directory",
            to.display()
        )));
    }
    let from = from.canonicalize().map_err(LogError::Io)?;
    let parent = to
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let parent = parent.canonicalize().map_err(|e| {
        Error::BadRequest(format!(
            "the directory that would hold {} is not usable: {e}",
            to.display()
        ))
    })?;
    if parent.starts_with(&from) {
        return Err(Error::BadRequest(format!(
            "{} is inside the source {}, which salvage never writes",
            to.display(),
            from.display()
        )));
    }
    Ok(())
}

/// Where the new directory is built: beside the target, hidden.
fn staging_dir(to: &Path) -> Result<PathBuf> {
    let name = to
        .file_name()
        .ok_or_else(|| Error::BadRequest(format!("{} names no directory", to.display())))?;
    let mut staged = std::ffi::OsString::from(".");
    staged.push(name);
    staged.push(".salvage");
    Ok(to.with_file_name(staged))
}

/// Takes each source log directory's lock through an existing `LOCK`
/// file opened read-only (a directory without one has never been opened
/// by a daemon, so none holds it), so that the source is never written.
fn lock_source(from: &Path) -> Result<Vec<File>> {
    let mut locks = Vec::new();
    for name in ["msg", "evt"] {
        let path = from.join(name).join("LOCK");
        let Ok(f) = File::open(&path) else { continue };
        // SAFETY: flock only reads its integer arguments; the fd is owned
        // by `f`, which outlives the call.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::BadRequest(format!(
                "log directory {} is in use by another process ({e}); stop the daemon first",
                from.join(name).display()
            )));
        }
        locks.push(f);
    }
    Ok(locks)
}

/// Copies what salvage does not rebuild, as it is: the regular files at
/// the top of the data directory (the daemon's batch token key, with its
/// permissions) and the snapshot files (each checks itself when read).
fn copy_other_files(from: &Path, to: &Path) -> Result<u64> {
    let mut copied = 0;
    for (src, dst) in [
        (from.to_path_buf(), to.to_path_buf()),
        (from.join("snap"), to.join("snap")),
    ] {
        let Ok(entries) = std::fs::read_dir(&src) else {
            continue;
        };
        std::fs::create_dir_all(&dst).map_err(LogError::Io)?;
        for entry in entries {
            let entry = entry.map_err(LogError::Io)?;
            if !entry.file_type().map_err(LogError::Io)?.is_file() {
                continue;
            }
            let name = entry.file_name();
            if name.to_string_lossy().ends_with(".tmp") {
                continue;
            }
            let target = dst.join(&name);
            std::fs::copy(entry.path(), &target).map_err(LogError::Io)?;
            File::open(&target)
                .and_then(|f| f.sync_all())
                .map_err(LogError::Io)?;
            copied += 1;
        }
        fsync_dir(&dst)?;
    }
    Ok(copied)
}

/// Renames the staged directory to the target (replacing an empty one)
/// and makes the rename durable.
fn publish(tmp: &Path, to: &Path) -> Result<()> {
    if to.is_dir() {
        std::fs::remove_dir(to).map_err(LogError::Io)?;
    }
    std::fs::rename(tmp, to).map_err(LogError::Io)?;
    let parent = to
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fsync_dir(parent)
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| LogError::Io(e).into())
}

impl Inbox {
    /// SHA-256 of the canonical state encoding with every record location
    /// and the `evt` LSN left out: equal for two stores that hold the same
    /// state in different files (a salvaged copy and its source).
    #[doc(hidden)]
    pub fn location_free_digest(&self) -> [u8; 32] {
        use sha2::Digest;
        let mut st = self.shared.state.read().clone();
        st.evt_lsn = 0;
        for c in st.convs.values_mut() {
            std::sync::Arc::make_mut(c).msgs.for_each_mut(|m| m.loc = 0);
        }
        for u in st.users.values_mut() {
            std::sync::Arc::make_mut(u).events.map_in_place(|_, _| 0);
        }
        sha2::Sha256::digest(checkpoint::encode_state(&st)).into()
    }
}
