//! The one-process-per-directory lock.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::LogError;

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
