//! The small IO surface the log writes through, and its portable
//! pwrite + fdatasync backend.
//!
//! Everything that changes files on disk goes through [`LogIo`]: creating
//! preallocated segments, writes, data syncs, renames, deletes and
//! directory syncs. Reads do not: they use memmap2 or pread on the segment
//! files directly, and only ever below the durable length. Keeping the
//! mutating side behind a trait lets tests inject failures (ENOSPC, EIO on
//! fsync) and build crash images ([`super::faulty::FaultyIo`]).
//!
//! Contract of every backend: `write_at` writes the whole buffer or returns
//! an error (short writes are continued, never reported as success); when
//! `sync` is set it returns only after the data is on stable storage
//! (fdatasync). An error from `write_at` or `sync_data` means the bytes may
//! or may not be on disk; the caller must poison, never retry.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// The mutating file operations of the log.
pub trait LogIo: Send + Sync + std::fmt::Debug {
    /// A short name for logs and benchmarks.
    fn name(&self) -> &'static str;
    /// Creates `path` (which must not exist) with `len` bytes really
    /// allocated (fallocate, not a sparse file) and reading as zeros. On
    /// error no file is left behind.
    fn create_preallocated(&self, path: &Path, len: u64) -> io::Result<File>;
    /// Opens an existing segment file for reading and writing.
    fn open_existing(&self, path: &Path) -> io::Result<File>;
    /// Makes sure `file` has `len` bytes allocated (extending it).
    fn allocate(&self, file: &File, len: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`; with `sync`, also fdatasyncs.
    fn write_at(&self, file: &File, offset: u64, buf: &[u8], sync: bool) -> io::Result<()>;
    /// fdatasync.
    fn sync_data(&self, file: &File) -> io::Result<()>;
    /// [`LogIo::write_at`] for preparing a segment ahead of need, on the
    /// preparer thread: bulk writes of zeros and a header, and the sync of
    /// a whole new file. A backend that serializes commits (one shared
    /// submission ring) must not make commits wait behind these.
    fn write_prepared(&self, file: &File, offset: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        self.write_at(file, offset, buf, sync)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// fsync of a directory, making creates, renames and deletes in it
    /// durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// Writes `buf` as the file `path`, durably, through `io`: `tmp` is
/// created at exactly `buf`'s length (preallocated, so a full disk fails
/// here), written and synced, renamed to `path`, and the directory synced.
/// A `tmp` left by an earlier crash is replaced. On error `tmp` is removed
/// (best effort) and `path` is untouched, so a reader sees the old file or
/// the new one, whole. Used for the files beside the logs (checkpoints,
/// snapshots), so fault injection and the power-cut model cover them too.
pub fn write_file_durably(io: &dyn LogIo, tmp: &Path, path: &Path, buf: &[u8]) -> io::Result<()> {
    if buf.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a durable file needs at least one byte",
        ));
    }
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no directory"))?;
    if tmp.exists() {
        io.remove(tmp)?;
    }
    let written = (|| {
        let f = io.create_preallocated(tmp, buf.len() as u64)?;
        io.write_at(&f, 0, buf, true)?;
        drop(f);
        io.rename(tmp, path)
    })();
    if let Err(e) = written {
        if tmp.exists() {
            let _ = io.remove(tmp);
        }
        return Err(e);
    }
    io.sync_dir(dir)
}

/// Whether an IO error means the disk (or quota) is full.
pub fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Portable backend: pwrite(2) then fdatasync(2).
#[derive(Debug, Default, Clone, Copy)]
pub struct PwriteIo;

impl LogIo for PwriteIo {
    fn name(&self) -> &'static str {
        "pwrite"
    }

    fn create_preallocated(&self, path: &Path, len: u64) -> io::Result<File> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        if let Err(e) = fallocate(&file, len) {
            drop(file);
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Ok(file)
    }

    fn open_existing(&self, path: &Path) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).open(path)
    }

    fn allocate(&self, file: &File, len: u64) -> io::Result<()> {
        fallocate(file, len)
    }

    fn write_at(&self, file: &File, offset: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        // write_all_at continues short writes and retries EINTR.
        file.write_all_at(buf, offset)?;
        if sync {
            file.sync_data()?;
        }
        Ok(())
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// Allocates `len` bytes for `file` with fallocate(2), so that a full disk
/// shows up here as ENOSPC and never later as a failed write or a SIGBUS on
/// a mapping. Filesystems without fallocate get real zeros written instead
/// (still not sparse).
pub(crate) fn fallocate(file: &File, len: u64) -> io::Result<()> {
    let len_off = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length overflows off_t"))?;
    loop {
        // SAFETY: fallocate only reads its integer arguments; the fd is
        // owned by `file` and open for the duration of the call.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len_off) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) => return write_zeros(file, len),
            _ => return Err(e),
        }
    }
}

/// A mebibyte of zeros for the writes that fill files. A zeroed static
/// lives in the binary's zero-initialized section: its pages are the
/// kernel's shared zero page until written, which nothing does, so it
/// costs neither heap nor resident memory. (A buffer allocated per fill
/// held a mebibyte of the daemon's heap for as long as a segment took to
/// prepare, which made the heap a request reports jump by that much.)
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// Writes zeros over `from..to`, a mebibyte at a time, through `write`
/// (given an offset and the zeros to write there).
pub(crate) fn fill_with_zeros(
    from: u64,
    to: u64,
    mut write: impl FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64) as usize;
        write(at, &ZEROS[..n])?;
        at += n as u64;
    }
    Ok(())
}

fn write_zeros(file: &File, len: u64) -> io::Result<()> {
    let cur = file.metadata()?.len();
    fill_with_zeros(cur, len, |at, zeros| file.write_all_at(zeros, at))
}
