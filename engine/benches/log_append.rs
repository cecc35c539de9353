//! Segment log append throughput under `SyncPolicy::Always`: 200-byte
//! records from 1, 4 and 16 concurrent appenders, for both IO backends and
//! both ways of preparing a segment (written in full before use, the
//! default, or only fallocated), next to the machine's limit measured in
//! the same run on the same disk: one 4 KiB pwrite + fdatasync that
//! overwrites written blocks, and the same write made with `O_DIRECT`.
//!
//! Each case waits until the preparer has its spare segment ready before
//! it measures: the figures are the steady state, where preparation is
//! off the commit path (it costs one segment of writes per segment of
//! data, in the background).
//!
//! `cargo bench -p inbox-engine --bench log_append`
//!
//! Criterion reports appends/s (one element = one acknowledged append of
//! one 200-byte record). After the run a summary prints MB/s of payload,
//! mean and median (p50) ack latency (with one appender, one ack is one
//! group commit), the mean time of one group commit (write + fdatasync) in
//! the same case, appends per commit, and ack latency / commit time: the
//! last two are ratios within one case, so they hold on a disk whose
//! latency drifts during the run. Cases run in pairs next to each other
//! in time: the two preparations within a backend
//! (`INBOX_BENCH_FALLOCATED_FIRST=1` swaps them), the backends within an
//! appender count (`INBOX_BENCH_URING_FIRST=1` swaps them).
//! The data directory is under the target dir (same disk as the build);
//! set INBOX_BENCH_DIR to measure another disk.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use inbox_engine::log::{Batch, IoBackend, Log, LogOptions, SegmentPrep, SyncPolicy};
use parking_lot::Mutex;

const RECORD_BYTES: usize = 200;

fn bench_root() -> PathBuf {
    std::env::var_os("INBOX_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
}

#[derive(Default)]
struct Totals {
    appends: AtomicU64,
    wall_ns: AtomicU64,
    latency_ns: AtomicU64,
    /// Every ack latency, for the median.
    samples: Mutex<Vec<u32>>,
}

struct Line {
    name: String,
    appends: u64,
    wall: Duration,
    latency_mean: Duration,
    latency_p50: Duration,
    per_commit: f64,
    /// Mean time of one group commit (write + fdatasync) in this case.
    commit_mean: Duration,
    bytes_per_op: usize,
}

fn bench_log(c: &mut Criterion, summary: &Mutex<Vec<Line>>) {
    let mut group = c.benchmark_group("log_append_always");
    group.throughput(Throughput::Elements(1));
    // Backends alternate within each appender count, so the two runs of a
    // pair are next to each other in time on a disk whose latency drifts.
    // INBOX_BENCH_URING_FIRST=1 swaps the order inside each pair, to check
    // that a difference is not just drift.
    let mut order = [IoBackend::Pwrite, IoBackend::IoUring];
    if std::env::var_os("INBOX_BENCH_URING_FIRST").is_some() {
        order.reverse();
    }
    // Within each backend the two preparations are next to each other too;
    // INBOX_BENCH_FALLOCATED_FIRST=1 swaps them.
    let mut preps = [SegmentPrep::Write, SegmentPrep::Fallocate];
    if std::env::var_os("INBOX_BENCH_FALLOCATED_FIRST").is_some() {
        preps.reverse();
    }
    let cases: Vec<(IoBackend, SegmentPrep)> = order
        .iter()
        .flat_map(|io| preps.map(|p| (*io, p)))
        .collect();
    for appenders in [1usize, 4, 16] {
        for &(io, prep) in &cases {
            let dir = tempfile::tempdir_in(bench_root()).unwrap();
            let mut opts = LogOptions::new(dir.path());
            opts.sync = SyncPolicy::Always;
            opts.io = io;
            opts.prepare = prep;
            let log = Arc::new(Log::open(opts).unwrap());
            // Begin the first segment, then let the next spare be ready.
            let mut first = Batch::new();
            first.push(1, &[0x5A; RECORD_BYTES]);
            log.append(first).unwrap();
            while log.stats().spares_ready == 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
            let totals = Arc::new(Totals::default());
            let prep_name = match prep {
                SegmentPrep::Write => "written",
                SegmentPrep::Fallocate => "fallocated",
            };
            let name = format!("{}/{prep_name}", format!("{io:?}").to_lowercase());
            group.bench_function(BenchmarkId::new(&name, appenders), |b| {
                b.iter_custom(|iters| {
                    let per = iters.div_ceil(appenders as u64);
                    let start = Instant::now();
                    let threads: Vec<_> = (0..appenders)
                        .map(|_| {
                            let (log, totals) = (Arc::clone(&log), Arc::clone(&totals));
                            std::thread::spawn(move || {
                                let payload = [0x5Au8; RECORD_BYTES];
                                let mut lat = 0u64;
                                let mut samples = Vec::with_capacity(per as usize);
                                for _ in 0..per {
                                    let mut batch = Batch::new();
                                    batch.push(1, &payload);
                                    let t = Instant::now();
                                    log.append(batch).unwrap();
                                    let ns = t.elapsed().as_nanos() as u64;
                                    lat += ns;
                                    samples.push(ns.min(u64::from(u32::MAX)) as u32);
                                }
                                totals.latency_ns.fetch_add(lat, Ordering::Relaxed);
                                totals.samples.lock().extend(samples);
                                totals.appends.fetch_add(per, Ordering::Relaxed);
                            })
                        })
                        .collect();
                    for t in threads {
                        t.join().unwrap();
                    }
                    let took = start.elapsed();
                    totals
                        .wall_ns
                        .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
                    // Time for `iters` appends (rounding up to whole
                    // per-thread shares is under 16 appends per sample).
                    took.mul_f64(iters as f64 / (per * appenders as u64) as f64)
                });
            });
            let appends = totals.appends.load(Ordering::Relaxed);
            let stats = log.stats();
            summary.lock().push(Line {
                name: format!("{name}/{appenders}"),
                appends,
                wall: Duration::from_nanos(totals.wall_ns.load(Ordering::Relaxed)),
                latency_mean: Duration::from_nanos(
                    totals.latency_ns.load(Ordering::Relaxed) / appends.max(1),
                ),
                latency_p50: median(&mut totals.samples.lock()),
                per_commit: stats.durable_lsn as f64 / stats.commits.max(1) as f64,
                commit_mean: stats.commit_time / stats.commits.max(1) as u32,
                bytes_per_op: RECORD_BYTES,
            });
        }
    }
    group.finish();
}

/// How the raw probe writes: through the page cache, or around it
/// (`O_DIRECT`, 4 KiB-aligned buffer and offsets).
#[derive(Clone, Copy, PartialEq, Eq)]
enum RawIo {
    Buffered,
    Direct,
}

/// A 4 KiB block of 0xA5 at a 4 KiB-aligned address, as `O_DIRECT` needs.
#[repr(C, align(4096))]
struct AlignedBlock([u8; 4096]);

fn bench_raw(c: &mut Criterion, summary: &Mutex<Vec<Line>>, when: &str, io: RawIo) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut group = c.benchmark_group("raw_disk");
    group.throughput(Throughput::Elements(1));
    let dir = tempfile::tempdir_in(bench_root()).unwrap();
    let path = dir.path().join("raw");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    const FILE_BYTES: u64 = 64 << 20;
    file.set_len(FILE_BYTES).unwrap();
    file.write_all_at(&vec![0u8; FILE_BYTES as usize], 0)
        .unwrap();
    file.sync_all().unwrap();
    // Overwrites of written blocks either way; direct IO reopens the file.
    let file = match io {
        RawIo::Buffered => file,
        RawIo::Direct => std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap(),
    };
    let aligned = Box::new(AlignedBlock([0xA5u8; 4096]));
    let block = &aligned.0;
    let probe = match io {
        RawIo::Buffered => "pwrite_4k_fdatasync",
        RawIo::Direct => "odirect_4k_fdatasync",
    };
    let mut at = 0u64;
    let mut n = 0u64;
    let mut wall = Duration::ZERO;
    let mut samples: Vec<u32> = Vec::new();
    group.bench_function(BenchmarkId::new(probe, when), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                let t = Instant::now();
                file.write_all_at(block, at).unwrap();
                file.sync_data().unwrap();
                samples.push(t.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
                at = (at + 4096) % FILE_BYTES;
            }
            let took = start.elapsed();
            n += iters;
            wall += took;
            took
        });
    });
    group.finish();
    summary.lock().push(Line {
        name: match io {
            RawIo::Buffered => format!("raw 4KiB pwrite+fdatasync ({when})"),
            RawIo::Direct => format!("raw 4KiB O_DIRECT+fdatasync ({when})"),
        },
        appends: n,
        wall,
        latency_mean: wall / n.max(1) as u32,
        latency_p50: median(&mut samples),
        per_commit: 1.0,
        commit_mean: wall / n.max(1) as u32,
        bytes_per_op: block.len(),
    });
}

fn median(samples: &mut [u32]) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mid = samples.len() / 2;
    let (_, m, _) = samples.select_nth_unstable(mid);
    Duration::from_nanos(u64::from(*m))
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let summary = Mutex::new(Vec::new());
    // The machine's limit, before and after, to show the drift of the run;
    // each time beside the same write through O_DIRECT, which the log does
    // not use (docs/ARCHITECTURE.md says why).
    bench_raw(&mut c, &summary, "before", RawIo::Buffered);
    bench_raw(&mut c, &summary, "before", RawIo::Direct);
    bench_log(&mut c, &summary);
    bench_raw(&mut c, &summary, "after", RawIo::Direct);
    bench_raw(&mut c, &summary, "after", RawIo::Buffered);
    c.final_summary();
    println!("\nsummary (log: 200-byte records, SyncPolicy::Always; raw: 4 KiB writes):");
    println!(
        "{:<40} {:>10} {:>8} {:>14} {:>13} {:>16} {:>15} {:>10}",
        "case",
        "appends/s",
        "MB/s",
        "mean ack (us)",
        "p50 ack (us)",
        "mean commit (us)",
        "appends/commit",
        "ack/commit"
    );
    for l in summary.lock().iter() {
        let secs = l.wall.as_secs_f64().max(1e-9);
        let rate = l.appends as f64 / secs;
        let mb = rate * l.bytes_per_op as f64 / 1e6;
        println!(
            "{:<40} {:>10.0} {:>8.2} {:>14.0} {:>13.0} {:>16.0} {:>15.1} {:>10.2}",
            l.name,
            rate,
            mb,
            l.latency_mean.as_secs_f64() * 1e6,
            l.latency_p50.as_secs_f64() * 1e6,
            l.commit_mean.as_secs_f64() * 1e6,
            l.per_commit,
            l.latency_mean.as_secs_f64() / l.commit_mean.as_secs_f64().max(1e-9)
        );
    }
}
