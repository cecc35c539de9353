//! The scenario drivers. Each runs one scenario against one [`System`] and
//! returns what it measured; `main` turns that into report rows.
//!
//! Every client is a thread with its own connection (closed loop: one
//! request outstanding per connection), started together behind a barrier so
//! that the measured window has every client running. A short warm-up at the
//! start of each run is not recorded.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use crate::hist::Latency;
use crate::systems::{Conn, DeviceCursor, Result, Screen, System};
use crate::workload::{DeviceId, OpGen, Outgoing, PreSend, Uid, Workload};

/// What one run of a scenario measured.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Operations in the measured window (sends, pages).
    pub ops: u64,
    /// Sync events written (ingest: the fan-out) or read (sync).
    pub events: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    pub latency: Latency,
    /// `sync`: the read part of each page, before its ACK.
    pub read_latency: Latency,
}

impl Outcome {
    pub fn ops_per_s(&self) -> f64 {
        per_second(self.ops, self.elapsed)
    }
    pub fn events_per_s(&self) -> f64 {
        per_second(self.events, self.elapsed)
    }
}

pub fn per_second(count: u64, elapsed: Duration) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "counts are far below 2^52")]
    let count = count as f64;
    count / elapsed.as_secs_f64().max(1e-9)
}

/// A unique idempotency key per (run, client, send).
fn client_msg_id(run: u64, client: u64, n: u64) -> u128 {
    (u128::from(run) << 64) | (u128::from(client) << 40) | u128::from(n)
}

/// Runs `per_client` on `clients` threads, each with its own connection,
/// all released together once every connection is open. Errors of any
/// client fail the run (after every thread has stopped).
fn with_clients<T: std::marker::Send>(
    system: &dyn System,
    clients: usize,
    per_client: impl Fn(usize, &mut dyn Conn) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let barrier = Barrier::new(clients);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let results: Vec<Result<T>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|client| {
                let (barrier, failed, per_client) = (&barrier, &failed, &per_client);
                scope.spawn(move || {
                    let conn = system.connect();
                    if conn.is_err() {
                        failed.store(true, Ordering::SeqCst);
                    }
                    barrier.wait();
                    if failed.load(Ordering::SeqCst) {
                        return conn.and(Err("another client could not connect".into()));
                    }
                    let mut conn = conn?;
                    per_client(client, &mut *conn)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("client thread panicked".into()))
            })
            .collect()
    });
    results.into_iter().collect()
}

/// `ingest`: every client sends generated messages back to back for
/// `duration` (after `warmup`), recording each reply's latency.
pub fn ingest(
    system: &dyn System,
    workload: &Workload,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    run: u64,
) -> Result<Outcome> {
    let start = Mutex::new(None::<Instant>);
    let per_client = with_clients(system, clients, |client, conn| {
        let began = *start
            .lock()
            .expect("no panics while held")
            .get_or_insert_with(Instant::now);
        let measure_from = began + warmup;
        let stop_at = measure_from + duration;
        let mut gen = OpGen::new(run.wrapping_mul(1_000_003) ^ client as u64);
        let mut out = Outcome::default();
        let mut n = 0u64;
        loop {
            let op = gen.next_op(workload);
            let mut pair = [0; 2];
            let recipients = workload.recipients(&op, &mut pair);
            let send = Outgoing {
                conv: op.conv,
                sender: op.sender,
                recipients,
                payload: workload.payload(&op),
                client_msg_id: client_msg_id(run, client as u64, n),
            };
            n += 1;
            let t = Instant::now();
            if t >= stop_at {
                break;
            }
            conn.send(&send)?;
            let done = Instant::now();
            if t >= measure_from {
                out.latency.record(done - t);
                out.ops += 1;
                out.events += recipients.len() as u64;
                out.bytes += send.payload.len() as u64;
            }
        }
        Ok(out)
    })?;
    let mut total = Outcome {
        elapsed: duration,
        ..Outcome::default()
    };
    for out in per_client {
        total.ops += out.ops;
        total.events += out.events;
        total.bytes += out.bytes;
        total.latency.merge(&out.latency);
    }
    Ok(total)
}

/// Writes `sends` through `threads` connections in batches of `batch`:
/// the backlog a scenario reads. Sends are split by conversation, so one
/// thread owns a conversation and its seqs are written in order. Payloads
/// come from `payload(n)`.
pub fn preload<'p>(
    system: &dyn System,
    sends: &[PreSend],
    payload: &(dyn Fn(u64) -> &'p [u8] + Sync),
    threads: usize,
    batch: usize,
    run: u64,
) -> Result<Duration> {
    let start = Instant::now();
    let min_conv = sends.iter().map(|s| s.conv).min().unwrap_or(0);
    let convs = sends
        .iter()
        .map(|s| s.conv - min_conv + 1)
        .max()
        .unwrap_or(1);
    let threads = threads.max(1);
    with_clients(system, threads, |client, conn| {
        let mine: Vec<&PreSend> = sends
            .iter()
            .filter(|s| ((s.conv - min_conv) * threads as u64 / convs) as usize == client)
            .collect();
        let mut n = 0u64;
        for chunk in mine.chunks(batch.max(1)) {
            let batch: Vec<Outgoing<'_>> = chunk
                .iter()
                .map(|s| {
                    n += 1;
                    Outgoing {
                        conv: s.conv,
                        sender: s.sender,
                        recipients: &s.members[..],
                        payload: payload(n),
                        client_msg_id: client_msg_id(run, client as u64, n),
                    }
                })
                .collect();
            conn.send_batch(&batch)?;
        }
        Ok(())
    })?;
    Ok(start.elapsed())
}

/// `sync` and `reconnect-storm`: `clients` connections take devices off a
/// shared queue and catch each one up, page by page (each page read and
/// then ACKed), until its backlog is empty. `elapsed` is the time until the
/// last device is caught up.
pub fn catch_up(
    system: &dyn System,
    devices: &[(Uid, DeviceId)],
    clients: usize,
    page_limit: u32,
) -> Result<Outcome> {
    let next = AtomicUsize::new(0);
    let started = Mutex::new(None::<Instant>);
    let finished_ns = AtomicU64::new(0);
    let per_client = with_clients(system, clients, |_, conn| {
        let began = *started
            .lock()
            .expect("no panics while held")
            .get_or_insert_with(Instant::now);
        let mut out = Outcome::default();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(uid, device)) = devices.get(i) else {
                break;
            };
            let mut cursor = DeviceCursor::new(uid, device);
            loop {
                let t = Instant::now();
                let page = conn.sync_page(&mut cursor, page_limit)?;
                out.latency.record(t.elapsed());
                out.read_latency.record(page.read);
                out.ops += 1;
                out.events += u64::from(page.events);
                out.bytes += page.bytes;
                if !page.has_more {
                    break;
                }
            }
        }
        let ns = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
        finished_ns.fetch_max(ns, Ordering::Relaxed);
        Ok(out)
    })?;
    let mut total = Outcome {
        elapsed: Duration::from_nanos(finished_ns.load(Ordering::Relaxed)),
        ..Outcome::default()
    };
    for out in per_client {
        total.ops += out.ops;
        total.events += out.events;
        total.bytes += out.bytes;
        total.latency.merge(&out.latency);
        total.read_latency.merge(&out.read_latency);
    }
    Ok(total)
}

/// What `long-offline` measured.
#[derive(Debug, Default)]
pub struct LongOfflineOutcome {
    pub first_screen: Duration,
    pub total: Duration,
    pub screen: Screen,
    pub events: u64,
    pub pages: u64,
    pub bytes: u64,
}

/// `long-offline`: the returning user's device fetches its first screen
/// (conversation list and the newest `per_conv` messages of each), then
/// catches its sync stream up to the end, ACKing page by page.
pub fn long_offline(
    system: &dyn System,
    user: Uid,
    per_conv: u32,
    page_limit: u32,
) -> Result<LongOfflineOutcome> {
    let mut conn = system.connect()?;
    let start = Instant::now();
    let screen = conn.first_screen(user, per_conv)?;
    let first_screen = start.elapsed();
    let mut out = LongOfflineOutcome {
        first_screen,
        screen,
        bytes: screen.bytes,
        ..LongOfflineOutcome::default()
    };
    let mut cursor = DeviceCursor::new(user, 1);
    loop {
        let page = conn.sync_page(&mut cursor, page_limit)?;
        out.pages += 1;
        out.events += u64::from(page.events);
        out.bytes += page.bytes;
        if !page.has_more {
            break;
        }
    }
    out.total = start.elapsed();
    Ok(out)
}

/// Writes one-to-one sends with `payload_bytes` payloads until the system
/// holds `target_bytes` on disk (for `recovery` at a given size).
pub fn fill(
    system: &dyn System,
    workload: &Workload,
    target_bytes: u64,
    payload_bytes: usize,
    threads: usize,
) -> Result<Duration> {
    let start = Instant::now();
    let pool: Vec<u8> = (0..payload_bytes * 4)
        .map(|_| rand::random::<u8>())
        .collect();
    let span = (pool.len() - payload_bytes) as u64;
    let payload = |n: u64| {
        let at = (n.wrapping_mul(4099) % span) as usize;
        &pool[at..at + payload_bytes]
    };
    let direct: Vec<PreSend> = workload
        .conversations()
        .into_iter()
        .filter(|c| c.members.len() == 2)
        .take(4096)
        .map(|c| PreSend {
            conv: c.conv,
            sender: c.members[0],
            members: c.members.into(),
        })
        .collect();
    let per_round = (64usize << 20) / payload_bytes.max(1);
    let mut round = 0u64;
    while system.data_bytes() < target_bytes {
        let sends: Vec<PreSend> = direct.iter().cycle().take(per_round).cloned().collect();
        round += 1;
        preload(system, &sends, &payload, threads, 16, 0xf111 + round)?;
        if round > 100_000 {
            return Err("fill: the data directory does not grow".into());
        }
    }
    Ok(start.elapsed())
}

/// `mixed`: the ingest load at `clients`, first alone, then while another
/// thread runs compaction passes back to back. Returns both outcomes and
/// the passes run.
pub fn mixed(
    system: &dyn System,
    workload: &Workload,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    run: u64,
) -> Result<(Outcome, Outcome, u64)> {
    system.compact_now()?;
    let quiet = ingest(system, workload, clients, warmup, duration, run)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let passes = AtomicU64::new(0);
    let compacting = std::thread::scope(|scope| {
        let compactor = scope.spawn(|| -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                system.compact_now()?;
                passes.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        });
        let out = ingest(system, workload, clients, warmup, duration, run + 1);
        stop.store(true, Ordering::Relaxed);
        let compacted = compactor
            .join()
            .unwrap_or_else(|_| Err("compaction thread panicked".into()));
        compacted.and(out)
    })?;
    Ok((quiet, compacting, passes.load(Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systems::Page;
    use crate::workload::{Setup, SyncSet, WorkloadConfig};
    use std::collections::HashMap;

    /// An in-memory system: a model of the semantics the drivers rely on,
    /// so the drivers' bookkeeping can be checked without a server.
    #[derive(Default)]
    struct Model {
        streams: Mutex<HashMap<Uid, u64>>,
        /// Per user, the conversations they have messages in.
        convs: Mutex<HashMap<Uid, std::collections::BTreeSet<u64>>>,
        sends: AtomicU64,
        compactions: AtomicU64,
    }

    struct ModelConn<'a>(&'a Model);

    impl Conn for ModelConn<'_> {
        fn send(&mut self, send: &Outgoing<'_>) -> Result<()> {
            let mut streams = self.0.streams.lock().expect("lock");
            let mut convs = self.0.convs.lock().expect("lock");
            for uid in send.recipients {
                *streams.entry(*uid).or_default() += 1;
                convs.entry(*uid).or_default().insert(send.conv);
            }
            self.0.sends.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn sync_page(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<Page> {
            let len = self
                .0
                .streams
                .lock()
                .expect("lock")
                .get(&device.uid)
                .copied()
                .unwrap_or(0);
            let n = (len - device.acked).min(u64::from(limit));
            device.acked += n;
            Ok(Page {
                events: n as u32,
                bytes: n * 10,
                has_more: device.acked < len,
                read: Duration::from_micros(3),
            })
        }
        fn first_screen(&mut self, uid: Uid, per_conv: u32) -> Result<Screen> {
            let convs = self
                .0
                .convs
                .lock()
                .expect("lock")
                .get(&uid)
                .map_or(0, |c| c.len() as u32);
            Ok(Screen {
                convs,
                messages: convs * per_conv,
                bytes: u64::from(convs),
            })
        }
    }

    impl System for Model {
        fn name(&self) -> &str {
            "model"
        }
        fn connect(&self) -> Result<Box<dyn Conn + '_>> {
            Ok(Box::new(ModelConn(self)))
        }
        fn prepare(&self, _: &Setup) -> Result<()> {
            Ok(())
        }
        fn compact_now(&self) -> Result<()> {
            self.compactions.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1));
            Ok(())
        }
    }

    #[test]
    fn long_offline_fetches_the_first_screen_then_every_event_of_the_returning_user() {
        let model = Model::default();
        let lo = crate::workload::LongOffline::new(3, 10, 600, 5, 40);
        let workload = Workload::new(
            WorkloadConfig {
                users: 1_000,
                ..WorkloadConfig::default()
            },
            1,
        )
        .expect("workload");
        let payload = |n: u64| workload.payload_at(n);
        preload(&model, &lo.sends(3), &payload, 2, 50, 1).expect("preload");
        let out = long_offline(&model, lo.user, 20, 100).expect("long offline");
        assert_eq!(
            out.screen.convs, 8,
            "3 groups and 5 one-to-one conversations"
        );
        assert_eq!(out.events, 640);
        assert_eq!(out.pages, 7);
        assert!(out.first_screen <= out.total);
        assert_eq!(out.bytes, 8 + 640 * 10);
    }

    #[test]
    fn mixed_measures_the_load_alone_and_with_compaction_passes_running() {
        let model = Model::default();
        let workload = Workload::new(
            WorkloadConfig {
                users: 1_000,
                ..WorkloadConfig::default()
            },
            1,
        )
        .expect("workload");
        let (quiet, busy, passes) = mixed(
            &model,
            &workload,
            2,
            Duration::ZERO,
            Duration::from_millis(50),
            1,
        )
        .expect("mixed");
        assert!(quiet.ops > 0 && busy.ops > 0);
        assert!(passes > 0);
        // One pass before the quiet run, the rest during the busy one.
        assert_eq!(model.compactions.load(Ordering::Relaxed), passes + 1);
    }

    #[test]
    fn ingest_counts_every_recorded_send_and_its_fan_out() {
        let model = Model::default();
        let config = WorkloadConfig {
            users: 1_000,
            ..WorkloadConfig::default()
        };
        let workload = Workload::new(config, 1).expect("workload");
        let out = ingest(
            &model,
            &workload,
            4,
            Duration::ZERO,
            Duration::from_millis(100),
            1,
        )
        .expect("ingest");
        assert!(out.ops > 0);
        assert_eq!(out.latency.count(), out.ops);
        assert!(out.ops <= model.sends.load(Ordering::Relaxed));
        assert_eq!(out.bytes, out.ops * 200);
        // Two events per one-to-one send, 200 per group send.
        assert!(out.events >= 2 * out.ops && out.events <= 200 * out.ops);
    }

    #[test]
    fn catch_up_reads_every_backlogged_event_of_every_device_once() {
        let model = Model::default();
        let workload = Workload::new(
            WorkloadConfig {
                users: 1_000,
                ..WorkloadConfig::default()
            },
            1,
        )
        .expect("workload");
        let set = SyncSet::new(0, 20, 3, 250);
        let payload = |n: u64| workload.payload_at(n);
        preload(&model, &set.backlog_sends(), &payload, 3, 16, 2).expect("preload");
        let devices: Vec<_> = set.devices().collect();
        let out = catch_up(&model, &devices, 5, 100).expect("catch up");
        assert_eq!(out.events, 20 * 3 * 250);
        // 250 events in pages of 100: 3 pages per device.
        assert_eq!(out.ops, 60 * 3);
        assert_eq!(out.latency.count(), out.ops);
        assert_eq!(out.read_latency.count(), out.ops);
        assert_eq!(
            out.read_latency.quantile_us(0.5),
            3,
            "the read part is kept apart"
        );
        assert_eq!(out.bytes, out.events * 10);
    }

    #[test]
    fn a_client_that_cannot_connect_fails_the_run_without_hanging_the_others() {
        struct Refusing;
        impl System for Refusing {
            fn name(&self) -> &str {
                "refusing"
            }
            fn connect(&self) -> Result<Box<dyn Conn + '_>> {
                Err("connection refused".into())
            }
            fn prepare(&self, _: &Setup) -> Result<()> {
                Ok(())
            }
        }
        let err = catch_up(&Refusing, &[(1, 1)], 3, 100).expect_err("must fail");
        assert!(err.to_string().contains("refused") || err.to_string().contains("connect"));
    }
}
