//! The machine's limits on the data disk, measured in the same run as the
//! systems: the latency of one 4 KiB pwrite + fdatasync (what one durable
//! acknowledgement costs at the very least), and sequential synced write
//! bandwidth (1 MiB pwrite + fdatasync, back to back).
//!
//! The 4 KiB probe runs twice: overwriting blocks already written (only the
//! data is flushed: the device's floor, `fdatasync-4k`) and into a
//! `fallocate`d file as inboxd's segments are (`fdatasync-4k-prealloc`: the
//! unwritten-extent conversion is journalled too). It runs a third time on
//! three files at once, one thread each, overwriting (`fdatasync-4k-x3`):
//! what three members of a replicated group on one disk pay when each
//! makes the same round durable. A disk that serializes its cache flushes
//! shows it as a latency near three times the single file's.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::Result;
use crate::hist::Latency;

/// What one limit probe measured.
#[derive(Debug)]
pub struct LimitRun {
    pub ops: u64,
    pub elapsed: Duration,
    pub bytes: u64,
    pub latency: Latency,
}

impl LimitRun {
    pub fn ops_per_s(&self) -> f64 {
        #[expect(clippy::cast_precision_loss, reason = "op counts are far below 2^52")]
        let ops = self.ops as f64;
        ops / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn preallocated(path: &Path, bytes: u64) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let len = libc::off_t::try_from(bytes).map_err(|_| "file too large")?;
    // SAFETY: the fd is open for writing and owned by `file`, which outlives
    // the call; posix_fallocate takes no pointers.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    if rc != 0 {
        return Err(format!(
            "fallocate {}: {}",
            path.display(),
            std::io::Error::from_raw_os_error(rc)
        )
        .into());
    }
    file.sync_all()?;
    Ok(file)
}

/// How the probe's file is made before the timed writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prepare {
    /// `fallocate`d: each first write to a block also converts an
    /// unwritten extent, which the fdatasync must journal (as a log pays).
    Fallocate,
    /// Written with zeros and synced first: the timed writes overwrite
    /// data, so the fdatasync flushes only data (the device's floor).
    Overwrite,
}

fn prewritten(path: &Path, bytes: u64) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let zeros = vec![0u8; 1 << 20];
    let mut offset = 0;
    while offset < bytes {
        let n = (bytes - offset).min(zeros.len() as u64);
        file.write_all_at(&zeros[..n as usize], offset)?;
        offset += n;
    }
    file.sync_all()?;
    Ok(file)
}

/// `write_bytes` pwrites at increasing offsets, each followed by fdatasync,
/// until `duration` passes or the file (of `file_bytes`) is full.
pub fn synced_writes(
    dir: &Path,
    prepare: Prepare,
    write_bytes: usize,
    file_bytes: u64,
    duration: Duration,
) -> Result<LimitRun> {
    synced_writes_to(
        &dir.join(format!("limit-{write_bytes}.dat")),
        prepare,
        write_bytes,
        file_bytes,
        duration,
    )
}

/// [`synced_writes`] on `files` files at once, one thread each: the
/// latencies of every write, and the writes of all of them per second.
pub fn synced_writes_parallel(
    dir: &Path,
    prepare: Prepare,
    write_bytes: usize,
    file_bytes: u64,
    duration: Duration,
    files: usize,
) -> Result<LimitRun> {
    let runs: Vec<Result<LimitRun>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..files)
            .map(|i| {
                let path = dir.join(format!("limit-{write_bytes}-{i}.dat"));
                s.spawn(move || synced_writes_to(&path, prepare, write_bytes, file_bytes, duration))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a probe thread panicked".into()))
            })
            .collect()
    });
    let mut all = LimitRun {
        ops: 0,
        elapsed: Duration::ZERO,
        bytes: 0,
        latency: Latency::new(),
    };
    for run in runs {
        let run = run?;
        all.ops += run.ops;
        all.bytes += run.bytes;
        all.elapsed = all.elapsed.max(run.elapsed);
        all.latency.merge(&run.latency);
    }
    Ok(all)
}

fn synced_writes_to(
    path: &Path,
    prepare: Prepare,
    write_bytes: usize,
    file_bytes: u64,
    duration: Duration,
) -> Result<LimitRun> {
    let path = path.to_path_buf();
    let file = match prepare {
        Prepare::Fallocate => preallocated(&path, file_bytes)?,
        Prepare::Overwrite => prewritten(&path, file_bytes)?,
    };
    let block: Vec<u8> = (0..write_bytes).map(|i| (i % 251) as u8).collect();
    let mut latency = Latency::new();
    let mut offset = 0u64;
    let mut ops = 0u64;
    let start = Instant::now();
    while start.elapsed() < duration && offset + write_bytes as u64 <= file_bytes {
        let t = Instant::now();
        file.write_all_at(&block, offset)?;
        file.sync_data()?;
        latency.record(t.elapsed());
        offset += write_bytes as u64;
        ops += 1;
    }
    let elapsed = start.elapsed();
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(LimitRun {
        ops,
        elapsed,
        bytes: offset,
        latency,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_writes_stop_at_the_end_of_the_file_and_count_every_byte() {
        let dir = tempfile::tempdir().expect("temp dir");
        for prepare in [Prepare::Fallocate, Prepare::Overwrite] {
            let run = synced_writes(
                dir.path(),
                prepare,
                4096,
                16 * 4096,
                Duration::from_secs(30),
            )
            .expect("run");
            assert_eq!(run.ops, 16);
            assert_eq!(run.bytes, 16 * 4096);
            assert_eq!(run.latency.count(), 16);
            assert!(run.ops_per_s() > 0.0);
            assert_eq!(
                std::fs::read_dir(dir.path()).expect("read dir").count(),
                0,
                "file removed"
            );
        }
    }

    #[test]
    fn parallel_synced_writes_count_every_file_s_writes_and_remove_the_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let run = synced_writes_parallel(
            dir.path(),
            Prepare::Overwrite,
            4096,
            8 * 4096,
            Duration::from_secs(30),
            3,
        )
        .expect("run");
        assert_eq!(run.ops, 24, "eight writes on each of three files");
        assert_eq!(run.bytes, 24 * 4096);
        assert_eq!(run.latency.count(), 24);
        assert!(run.ops_per_s() > 0.0);
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("read dir").count(),
            0,
            "files removed"
        );
    }
}
