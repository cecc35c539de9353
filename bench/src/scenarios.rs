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
use crate::systems::{Conn, DeviceCursor, Result, System};
use crate::workload::{ConvId, DeviceId, OpGen, Outgoing, Uid, Workload};

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

/// Writes `sends` (conversation, sender, members) through `threads`
/// connections in batches of `batch`: the backlog a sync scenario reads.
/// Sends are split by conversation, so one thread owns a conversation and
/// its seqs are written in order.
pub fn preload(
    system: &dyn System,
    workload: &Workload,
    sends: &[(ConvId, Uid, [Uid; 2])],
    threads: usize,
    batch: usize,
    run: u64,
) -> Result<Duration> {
    let start = Instant::now();
    let min_conv = sends.iter().map(|s| s.0).min().unwrap_or(0);
    let convs = sends.iter().map(|s| s.0 - min_conv + 1).max().unwrap_or(1);
    let threads = threads.max(1);
    with_clients(system, threads, |client, conn| {
        let mine: Vec<&(ConvId, Uid, [Uid; 2])> = sends
            .iter()
            .filter(|s| ((s.0 - min_conv) * threads as u64 / convs) as usize == client)
            .collect();
        let mut n = 0u64;
        for chunk in mine.chunks(batch.max(1)) {
            let batch: Vec<Outgoing<'_>> = chunk
                .iter()
                .map(|(conv, sender, members)| {
                    n += 1;
                    Outgoing {
                        conv: *conv,
                        sender: *sender,
                        recipients: &members[..],
                        payload: workload.payload_at(n.wrapping_mul(7919)),
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
    }
    Ok(total)
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
        sends: AtomicU64,
    }

    struct ModelConn<'a>(&'a Model);

    impl Conn for ModelConn<'_> {
        fn send(&mut self, send: &Outgoing<'_>) -> Result<()> {
            let mut streams = self.0.streams.lock().expect("lock");
            for uid in send.recipients {
                *streams.entry(*uid).or_default() += 1;
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
        preload(&model, &workload, &set.backlog_sends(), 3, 16, 2).expect("preload");
        let devices: Vec<_> = set.devices().collect();
        let out = catch_up(&model, &devices, 5, 100).expect("catch up");
        assert_eq!(out.events, 20 * 3 * 250);
        // 250 events in pages of 100: 3 pages per device.
        assert_eq!(out.ops, 60 * 3);
        assert_eq!(out.latency.count(), out.ops);
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
