//! io_uring backend: the group-commit write and its fdatasync are submitted
//! together as a linked pair (write -> fsync(DATASYNC)), costing one
//! `io_uring_enter` instead of two syscalls.
//!
//! Invariants: the ring is used by one caller at a time (a mutex); every
//! submitted entry is waited for before the call returns, so the buffer and
//! the file descriptor outlive the kernel's use of them. A short write
//! cancels the linked fsync (-ECANCELED); the rest is then written and
//! synced with further entries, so a short write is never reported as
//! success. Creates, renames and deletes are rare and go through std.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use io_uring::{opcode, squeue, types, IoUring};
use parking_lot::Mutex;

use super::io::{LogIo, PwriteIo};

const WRITE: u64 = 1;
const FSYNC: u64 = 2;
/// Largest single write entry (the SQE length field is u32).
const CHUNK_MAX: usize = 1 << 30;

/// The io_uring backend.
pub struct UringIo {
    ring: Mutex<IoUring>,
    std: PwriteIo,
}

impl std::fmt::Debug for UringIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UringIo")
    }
}

impl UringIo {
    /// Sets up a small ring. Fails if the kernel has no io_uring or it is
    /// disabled (`kernel.io_uring_disabled`, seccomp).
    pub fn new() -> io::Result<Self> {
        let ring = IoUring::new(8)?;
        Ok(Self {
            ring: Mutex::new(ring),
            std: PwriteIo,
        })
    }

    /// Submits `entries` and waits for exactly their completions; returns
    /// the results by user_data (WRITE, FSYNC).
    fn run(ring: &mut IoUring, entries: &[squeue::Entry]) -> io::Result<[Option<i32>; 2]> {
        // SAFETY: the entries reference a buffer and an fd that the caller
        // keeps alive until this function returns, and it returns only
        // after every pushed entry has completed (or the ring is broken,
        // in which case the caller poisons the log and never writes
        // through this ring again).
        unsafe {
            let mut sq = ring.submission();
            for e in entries {
                sq.push(e)
                    .map_err(|_| io::Error::other("io_uring submission queue full"))?;
            }
        }
        let mut results = [None, None];
        let mut done = 0;
        while done < entries.len() {
            match ring.submit_and_wait(entries.len() - done) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            for cqe in ring.completion() {
                let slot = if cqe.user_data() == WRITE { 0 } else { 1 };
                results[slot] = Some(cqe.result());
                done += 1;
            }
        }
        Ok(results)
    }
}

impl LogIo for UringIo {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn create_preallocated(&self, path: &Path, len: u64) -> io::Result<File> {
        self.std.create_preallocated(path, len)
    }

    fn open_existing(&self, path: &Path) -> io::Result<File> {
        self.std.open_existing(path)
    }

    fn allocate(&self, file: &File, len: u64) -> io::Result<()> {
        self.std.allocate(file, len)
    }

    fn write_at(&self, file: &File, offset: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        let mut ring = self.ring.lock();
        let fd = types::Fd(file.as_raw_fd());
        let mut written = 0usize;
        let mut synced = !sync;
        while written < buf.len() || !synced {
            let rest = &buf[written..];
            let n = rest.len().min(CHUNK_MAX);
            let last = n == rest.len();
            let mut entries = Vec::with_capacity(2);
            if n > 0 {
                let mut w = opcode::Write::new(fd, rest.as_ptr(), n as u32)
                    .offset(offset + written as u64)
                    .build()
                    .user_data(WRITE);
                if last && !synced {
                    w = w.flags(squeue::Flags::IO_LINK);
                }
                entries.push(w);
            }
            if last && !synced {
                entries.push(
                    opcode::Fsync::new(fd)
                        .flags(types::FsyncFlags::DATASYNC)
                        .build()
                        .user_data(FSYNC),
                );
            }
            let [w, f] = Self::run(&mut ring, &entries)?;
            if let Some(res) = w {
                if res < 0 {
                    return Err(io::Error::from_raw_os_error(-res));
                }
                if res == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "io_uring write of 0 bytes",
                    ));
                }
                written += res as usize;
            }
            if let Some(res) = f {
                match res {
                    0 => synced = true,
                    // The write before it was short; go round again.
                    r if r == -libc::ECANCELED && written < buf.len() => {}
                    r => return Err(io::Error::from_raw_os_error(-r)),
                }
            }
        }
        Ok(())
    }

    /// Through pwrite, not the ring: preparing a segment writes and syncs
    /// a whole file, and commits must not wait behind the ring's mutex
    /// meanwhile.
    fn write_prepared(&self, file: &File, offset: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        self.std.write_at(file, offset, buf, sync)
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        let mut ring = self.ring.lock();
        let e = opcode::Fsync::new(types::Fd(file.as_raw_fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(FSYNC);
        let [_, f] = Self::run(&mut ring, &[e])?;
        match f {
            Some(0) => Ok(()),
            Some(r) => Err(io::Error::from_raw_os_error(-r)),
            None => Err(io::Error::other("io_uring fsync without completion")),
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.std.rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.std.remove(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.std.sync_dir(dir)
    }
}
