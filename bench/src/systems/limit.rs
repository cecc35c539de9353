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
//!
//! Two probes measure what a request over loopback TCP costs at the very
//! least: one client thread and one server thread trading a request for a
//! reply, closed loop (`tcp-round-trip`), and the same with the server
//! making each request durable before it answers, one 4 KiB overwrite and
//! fdatasync per request (`tcp-durable`): what a durable server that does
//! nothing else gets on this machine at one connection. Both report the
//! server thread's CPU per request (`CLOCK_THREAD_CPUTIME_ID`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
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
    /// CPU time (user + system) of the probe's server thread, for the
    /// loopback probes.
    pub server_cpu: Option<Duration>,
}

impl LimitRun {
    pub fn ops_per_s(&self) -> f64 {
        #[expect(clippy::cast_precision_loss, reason = "op counts are far below 2^52")]
        let ops = self.ops as f64;
        ops / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The server thread's CPU per operation, µs, where it was measured.
    pub fn server_cpu_us_per_op(&self) -> Option<f64> {
        #[expect(clippy::cast_precision_loss, reason = "op counts are far below 2^52")]
        let ops = self.ops as f64;
        self.server_cpu
            .filter(|_| self.ops > 0)
            .map(|cpu| cpu.as_secs_f64() * 1e6 / ops)
    }
}

/// The calling thread's CPU time so far, user and system.
fn thread_cpu() -> std::io::Result<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    ))
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
        server_cpu: None,
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
        server_cpu: None,
    })
}

/// Round trips over loopback TCP: a request of `request_bytes`, answered
/// with `reply_bytes`, one at a time, until `duration` passes (at least
/// one). With
/// `durable` set to a directory, the server overwrites 4 KiB of a file
/// prepared there and fdatasyncs it before each answer, as a store that
/// does nothing else would.
pub fn loopback_round_trips(
    durable: Option<&Path>,
    request_bytes: usize,
    reply_bytes: usize,
    duration: Duration,
) -> Result<LimitRun> {
    const FILE_BYTES: u64 = 64 << 20;
    let file = match durable {
        Some(dir) => {
            let path = dir.join("limit-tcp-durable.dat");
            let file = prewritten(&path, FILE_BYTES)?;
            std::fs::remove_file(&path)?;
            Some(file)
        }
        None => None,
    };
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::Builder::new()
        .name("limit-tcp-server".into())
        .spawn(move || -> std::io::Result<Duration> {
            let (mut conn, _) = listener.accept()?;
            conn.set_nodelay(true)?;
            let cpu_at_start = thread_cpu()?;
            let mut request = vec![0u8; request_bytes];
            let reply = vec![7u8; reply_bytes];
            let block = vec![5u8; 4096];
            let mut offset = 0u64;
            loop {
                match conn.read_exact(&mut request) {
                    Ok(()) => {}
                    // The client is done.
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        return Ok(thread_cpu()?.saturating_sub(cpu_at_start));
                    }
                    Err(e) => return Err(e),
                }
                if let Some(file) = &file {
                    file.write_all_at(&block, offset)?;
                    file.sync_data()?;
                    offset = (offset + 4096) % FILE_BYTES;
                }
                conn.write_all(&reply)?;
            }
        })?;
    let mut conn = TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    let request: Vec<u8> = (0..request_bytes).map(|i| (i % 251) as u8).collect();
    let mut reply = vec![0u8; reply_bytes];
    let mut latency = Latency::new();
    let mut ops = 0u64;
    let start = Instant::now();
    let traded = loop {
        // At least one, however long the start took.
        if ops > 0 && start.elapsed() >= duration {
            break Ok(());
        }
        let t = Instant::now();
        if let Err(e) = conn
            .write_all(&request)
            .and_then(|()| conn.read_exact(&mut reply))
        {
            break Err(e);
        }
        latency.record(t.elapsed());
        ops += 1;
    };
    let elapsed = start.elapsed();
    // Ends the server's loop; its own error, if any, says more than ours.
    let _ = conn.shutdown(Shutdown::Write);
    let served = server
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the probe's server thread panicked")));
    let server_cpu = served?;
    traded?;
    Ok(LimitRun {
        ops,
        elapsed,
        bytes: ops * (request_bytes + reply_bytes) as u64,
        latency,
        server_cpu: Some(server_cpu),
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

    #[test]
    fn loopback_round_trips_count_every_answer_with_and_without_a_durable_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        for durable in [None, Some(dir.path())] {
            let run =
                loopback_round_trips(durable, 300, 40, Duration::from_millis(50)).expect("probe");
            assert!(run.ops > 0, "at least one round trip, however slow");
            assert_eq!(run.latency.count(), run.ops);
            assert_eq!(run.bytes, run.ops * 340);
            let cpu = run
                .server_cpu_us_per_op()
                .expect("the server's CPU measured");
            assert!(cpu > 0.0, "a server that answered spent CPU: {cpu}");
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("read dir").count(),
            0,
            "the durable probe's file removed"
        );
    }
}
