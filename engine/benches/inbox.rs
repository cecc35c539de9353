//! Inbox engine benches: send (1:1 and to a 200-member group), a 100-event
//! sync page, a 50-message pull. Also prints the index bytes per event, and
//! the p50/p99/max of sends while checkpoints are written back to back
//! (`inbox/send_p99_during_checkpoints`, printed, not a criterion figure:
//! the figure wanted is a tail latency under interference).
//!
//! `cargo bench -p inbox-engine --bench inbox`
//! (only the checkpoint figure:
//! `cargo bench -p inbox-engine --bench inbox -- send_p99_during_checkpoints`)
//!
//! Sends run with `SyncPolicy::None` (engine cost, no fdatasync) and, for
//! 1:1, also with `Always` (one fdatasync per log per round).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hdrhistogram::Histogram;
use inbox_engine::inbox::{ManualClock, Pending};
use inbox_engine::log::SyncPolicy;
use inbox_engine::*;

fn open(dir: &std::path::Path, sync: SyncPolicy) -> Inbox {
    let mut c = InboxConfig::new(dir);
    c.sync = sync;
    c.segment_bytes = 64 << 20;
    c.clock = Arc::new(ManualClock::new(1_700_000_000_000));
    Inbox::open(c).unwrap()
}

fn send(ib: &Inbox, conv: ConvId, sender: Uid, cmid: u128, payload: &Bytes) -> SendReply {
    ib.send(SendRequest {
        conv,
        sender,
        client_msg_id: cmid,
        msg_type: 1,
        payload: payload.clone(),
    })
    .wait()
    .unwrap()
}

/// Whether the command line's filters select the hand-timed bench `name`
/// (these print their figures instead of going through criterion).
fn selected(name: &str) -> bool {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .all(|filter| name.contains(filter.as_str()))
}

/// `n` sends from uid 1 to `conv`, `in_flight` at a time.
fn fill(ib: &Inbox, conv: ConvId, n: u128, in_flight: u128, payload: &Bytes) {
    fill_with(n as u64, in_flight as u64, |key| {
        ib.send(SendRequest {
            conv,
            sender: Uid(1),
            client_msg_id: u128::from(key),
            msg_type: 1,
            payload: payload.clone(),
        })
    });
}

/// `send(key)` for keys `0..n`, `in_flight` at a time.
fn fill_with(n: u64, in_flight: u64, send: impl Fn(u64) -> Pending<SendReply>) {
    for chunk in 0..n / in_flight {
        let pending: Vec<_> = (chunk * in_flight..(chunk + 1) * in_flight)
            .map(&send)
            .collect();
        for p in pending {
            p.wait().unwrap();
        }
    }
}

fn benches(c: &mut Criterion) {
    let payload = Bytes::from(vec![b'p'; 200]);
    let mut g = c.benchmark_group("inbox");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    for (name, policy) in [
        ("send_1to1_sync_none", SyncPolicy::None),
        ("send_1to1_sync_always", SyncPolicy::Always),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let ib = open(dir.path(), policy);
        ib.join(Uid(1), ConvId(1)).wait().unwrap();
        ib.join(Uid(2), ConvId(1)).wait().unwrap();
        let mut cmid = 0u128;
        g.throughput(Throughput::Elements(1));
        g.bench_function(name, |b| {
            b.iter(|| {
                cmid += 1;
                send(&ib, ConvId(1), Uid(1), cmid, &payload)
            })
        });
    }

    {
        let dir = tempfile::tempdir().unwrap();
        let ib = open(dir.path(), SyncPolicy::None);
        for uid in 1..=200 {
            ib.join(Uid(uid), ConvId(2)).wait().unwrap();
        }
        let mut cmid = 0u128;
        g.throughput(Throughput::Elements(200));
        g.bench_function("send_group_200_sync_none", |b| {
            b.iter(|| {
                cmid += 1;
                send(&ib, ConvId(2), Uid(1), cmid, &payload)
            })
        });
    }

    {
        let dir = tempfile::tempdir().unwrap();
        let ib = open(dir.path(), SyncPolicy::None);
        ib.join(Uid(1), ConvId(3)).wait().unwrap();
        ib.join(Uid(2), ConvId(3)).wait().unwrap();
        let gen = ib
            .register_device(Uid(2), DeviceId(1))
            .wait()
            .unwrap()
            .device
            .generation;
        const SENDS: u128 = 10_000;
        let pending: Vec<_> = (0..SENDS)
            .map(|i| {
                ib.send(SendRequest {
                    conv: ConvId(3),
                    sender: Uid(1),
                    client_msg_id: i,
                    msg_type: 1,
                    payload: payload.clone(),
                })
            })
            .collect();
        for p in pending {
            p.wait().unwrap();
        }
        let (event_bytes, msg_bytes) = ib.index_bytes();
        let stats = ib.stats();
        eprintln!(
            "index: {} events, {} messages; event index {:.1} B/event, message index {:.1} B/message, total {:.1} B/event",
            stats.events_live,
            stats.messages,
            event_bytes as f64 / stats.events_live as f64,
            msg_bytes as f64 / stats.messages as f64,
            (event_bytes + msg_bytes) as f64 / stats.events_live as f64,
        );
        let memory = ib.memory();
        let idem = memory.get("idempotency").cloned().unwrap_or_default();
        // Each send above has its own key.
        eprintln!(
            "idempotency table: {SENDS} keys; {:.1} B/key live, {:.1} B/key allocated",
            idem.live as f64 / SENDS as f64,
            idem.allocated as f64 / SENDS as f64,
        );
        g.throughput(Throughput::Elements(100));
        g.bench_function("sync_page_100", |b| {
            b.iter(|| {
                let page = ib
                    .sync(SyncRequest {
                        uid: Uid(2),
                        device: DeviceId(1),
                        generation: Some(gen),
                        local_applied_seq: SyncSeq(0),
                        limit: 100,
                        batch_token: None,
                    })
                    .wait()
                    .unwrap();
                assert_eq!(page.events.len(), 100);
                page
            })
        });
        g.throughput(Throughput::Elements(50));
        g.bench_function("pull_50", |b| {
            let mut after = 0u64;
            b.iter(|| {
                after = (after + 50) % 9_900;
                let r = ib.pull(Uid(2), &[(ConvId(3), MsgSeq(after))], 50).unwrap();
                assert_eq!(r[0].messages.len(), 50);
                r
            })
        });
    }
    g.finish();
}

/// Members of the group whose fan-out makes the state (and so every
/// checkpoint) large: 20,000 sends x 200 members = 4M events.
const STALL_MEMBERS: u64 = 200;
const STALL_FILL_SENDS: u128 = 20_000;
const STALL_SENDS: usize = 2_000;
/// Checkpoints written back to back while the foreground sends.
const STALL_CHECKPOINTS: u64 = 30;

/// 1:1 sends, one at a time, each timed, until `n` are done or `stop` is
/// set.
fn timed_sends(
    ib: &Inbox,
    first_cmid: u128,
    payload: &Bytes,
    n: usize,
    stop: &AtomicBool,
) -> Histogram<u64> {
    let mut h = Histogram::<u64>::new(3).unwrap();
    for i in 0..n {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        send(ib, ConvId(10), Uid(1001), first_cmid + i as u128, payload);
        h.record(t.elapsed().as_micros() as u64).unwrap();
    }
    h
}

fn print_hist(label: &str, h: &Histogram<u64>) {
    eprintln!(
        "{label}: n={} p50={}us p99={}us max={}us",
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max()
    );
}

/// Send latency with no checkpoint running, then while another thread
/// calls `checkpoint()` back to back (`STALL_CHECKPOINTS` times), over a
/// store whose checkpoint is tens of MB (`SyncPolicy::Always`, so the
/// checkpoint's fsync is real).
fn checkpoint_stall(_c: &mut Criterion) {
    let name = "inbox/send_p99_during_checkpoints";
    if !selected(name) {
        return;
    }
    let payload = Bytes::from(vec![b'p'; 200]);
    let dir = tempfile::tempdir().unwrap();
    let ib = Arc::new(open(dir.path(), SyncPolicy::Always));
    for uid in 1..=STALL_MEMBERS {
        ib.join(Uid(uid), ConvId(20)).wait().unwrap();
    }
    ib.join(Uid(1001), ConvId(10)).wait().unwrap();
    ib.join(Uid(1002), ConvId(10)).wait().unwrap();
    fill(&ib, ConvId(20), STALL_FILL_SENDS, 5_000, &payload);
    let t = Instant::now();
    ib.checkpoint().unwrap();
    let ckpt_bytes: u64 = std::fs::read_dir(dir.path().join("checkpoint"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .max()
        .unwrap_or(0);
    eprintln!(
        "{name}: {} events live; one checkpoint() = {:?}, {:.1} MB",
        ib.stats().events_live,
        t.elapsed(),
        ckpt_bytes as f64 / 1e6
    );
    let never = AtomicBool::new(false);
    print_hist(
        &format!("{name}: no checkpoint"),
        &timed_sends(&ib, 1_000_000, &payload, STALL_SENDS, &never),
    );
    let done = Arc::new(AtomicBool::new(false));
    let checkpoint_us = Arc::new(AtomicU64::new(0));
    let bg = {
        let (ib, done, us) = (
            Arc::clone(&ib),
            Arc::clone(&done),
            Arc::clone(&checkpoint_us),
        );
        std::thread::spawn(move || {
            for _ in 0..STALL_CHECKPOINTS {
                let t = Instant::now();
                ib.checkpoint().unwrap();
                us.fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            done.store(true, Ordering::Relaxed);
        })
    };
    let h = timed_sends(&ib, 2_000_000, &payload, usize::MAX, &done);
    bg.join().unwrap();
    print_hist(
        &format!(
            "{name}: {STALL_CHECKPOINTS} checkpoints back to back (mean checkpoint() {} ms)",
            checkpoint_us.load(Ordering::Relaxed) / STALL_CHECKPOINTS / 1000
        ),
        &h,
    );
}

/// Under `cargo bench`; outside it (criterion's test mode under `cargo
/// test`) a bench makes a small run that only proves it still works.
fn full_run() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// `rounds` times: the time of a send with no checkpoint running, then of
/// one made 1 ms after a checkpoint starts, while its writer still holds
/// its copy of the state, as a periodic checkpoint's writes do; prints
/// both. `send` sends with the key it is given and waits for the reply.
fn sends_beside_checkpoints(name: &str, ib: &Arc<Inbox>, rounds: u64, send: impl Fn(u64)) {
    let mut plain = Histogram::<u64>::new(3).unwrap();
    let mut after = Histogram::<u64>::new(3).unwrap();
    for round in 0..rounds {
        let t = Instant::now();
        send(10_000_000 + round);
        plain.record(t.elapsed().as_micros() as u64).unwrap();
        let writer = {
            let ib = Arc::clone(ib);
            std::thread::spawn(move || ib.checkpoint().unwrap())
        };
        std::thread::sleep(Duration::from_millis(1));
        let t = Instant::now();
        send(20_000_000 + round);
        after.record(t.elapsed().as_micros() as u64).unwrap();
        writer.join().unwrap();
    }
    print_hist(&format!("{name}: send, no checkpoint before"), &plain);
    print_hist(
        &format!("{name}: send while a checkpoint is written"),
        &after,
    );
}

/// Messages in the conversation of `send_after_checkpoint_long_history`.
const LONG_HISTORY_MSGS: u128 = 500_000;
const LONG_HISTORY_ROUNDS: u64 = 20;

/// A send into a conversation with a long history while a checkpoint is
/// being written, against a send with no checkpoint running. The
/// checkpoint's writer shares the state with the sequencer, so the first
/// change to a conversation meanwhile copies what of it is shared.
fn send_after_checkpoint(_c: &mut Criterion) {
    let name = "inbox/send_after_checkpoint_long_history";
    if !selected(name) {
        return;
    }
    let (messages, rounds) = if full_run() {
        (LONG_HISTORY_MSGS, LONG_HISTORY_ROUNDS)
    } else {
        (20_000, 2)
    };
    let payload = Bytes::from(vec![b'p'; 100]);
    let dir = tempfile::tempdir().unwrap();
    let ib = Arc::new(open(dir.path(), SyncPolicy::None));
    for uid in 1..=2_000 {
        ib.join(Uid(uid), ConvId(30)).wait().unwrap();
    }
    fill(&ib, ConvId(30), messages, 10_000, &payload);
    eprintln!("{name}: {messages} messages, 2,000 members (large group), sync none");
    sends_beside_checkpoints(name, &ib, rounds, |key| {
        send(&ib, ConvId(30), Uid(2), u128::from(key), &payload);
    });
}

/// Sends of `send_after_checkpoint_many_keys`, and the 1:1
/// conversations they are spread over.
const MANY_KEYS_SENDS: u64 = 1_000_000;
const MANY_KEYS_CONVS: u64 = 10_000;

/// A send while a checkpoint is being written, against a send with no
/// checkpoint running, on a store whose idempotency table holds a
/// million keys (all in its newest bucket, as hours of sends are). The
/// copy of the state a checkpoint takes is made on the sequencer, so
/// whatever it copies rather than shares delays the sends behind it.
fn send_after_checkpoint_many_keys(_c: &mut Criterion) {
    let name = "inbox/send_after_checkpoint_many_keys";
    if !selected(name) {
        return;
    }
    let (sends, rounds) = if full_run() {
        (MANY_KEYS_SENDS, 20)
    } else {
        (20_000, 2)
    };
    let payload = Bytes::from(vec![b'p'; 100]);
    let dir = tempfile::tempdir().unwrap();
    let ib = Arc::new(open(dir.path(), SyncPolicy::None));
    for c in 0..MANY_KEYS_CONVS {
        ib.join(Uid(2 * c + 1), ConvId(c)).wait().unwrap();
        ib.join(Uid(2 * c + 2), ConvId(c)).wait().unwrap();
    }
    let send_one = |i: u64| {
        let c = i % MANY_KEYS_CONVS;
        ib.send(SendRequest {
            conv: ConvId(c),
            sender: Uid(2 * c + 1),
            client_msg_id: u128::from(i),
            msg_type: 1,
            payload: payload.clone(),
        })
    };
    fill_with(sends, 10_000, send_one);
    eprintln!(
        "{name}: {sends} keys over {MANY_KEYS_CONVS} 1:1 conversations, sync none; idempotency table {:.1} MB",
        ib.memory().get("idempotency").map_or(0, |m| m.allocated) as f64 / 1e6
    );
    sends_beside_checkpoints(name, &ib, rounds, |key| {
        send_one(key).wait().unwrap();
    });
}

/// Opening a store whose log holds `REPLAY_SENDS` sends after its newest
/// checkpoint: the replay a restart after a kill pays. The sends are the
/// harness's `mixed` shape: 2,000 users, 95% of sends one-to-one and 5%
/// to groups of 200, so 11.9 recipients a send on average, each a user,
/// an event list and a conversation row the replay finds and changes.
const REPLAY_SENDS: u64 = 40_000;

fn replay(c: &mut Criterion) {
    const USERS: u64 = 2_000;
    const GROUPS: u64 = 10;
    const GROUP_MEMBERS: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut c = InboxConfig::new(dir.path());
        c.sync = SyncPolicy::None;
        c.segment_bytes = 64 << 20;
        // No periodic checkpoint: everything below is replayed.
        c.checkpoint_every_bytes = u64::MAX;
        c.clock = Arc::new(ManualClock::new(1_700_000_000_000));
        c
    };
    {
        let ib = Inbox::open(config()).unwrap();
        let joins: Vec<_> = (1..=USERS)
            .map(|uid| ib.join(Uid(uid), ConvId(uid.div_ceil(2))))
            .chain((0..GROUPS).flat_map(|g| {
                let ib = &ib;
                (0..GROUP_MEMBERS).map(move |m| {
                    ib.join(
                        Uid(1 + (g * GROUP_MEMBERS + m) % USERS),
                        ConvId(100_000 + g),
                    )
                })
            }))
            .collect();
        for j in joins {
            j.wait().unwrap();
        }
        let payload = Bytes::from(vec![b'r'; 200]);
        fill_with(REPLAY_SENDS, 256, |key| {
            let (conv, sender) = if key % 20 == 0 {
                let g = (key / 20) % GROUPS;
                (ConvId(100_000 + g), Uid(1 + (g * GROUP_MEMBERS) % USERS))
            } else {
                let uid = 1 + key % USERS;
                (ConvId(uid.div_ceil(2)), Uid(uid))
            };
            ib.send(SendRequest {
                conv,
                sender,
                client_msg_id: u128::from(key),
                msg_type: 1,
                payload: payload.clone(),
            })
        });
        // As a kill leaves it: no final checkpoint.
        ib.halt();
    }
    let mut records = None;
    let mut g = c.benchmark_group("inbox");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Elements(REPLAY_SENDS));
    g.bench_function("replay_40k_sends", |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                let ib = Inbox::open(config()).unwrap();
                took += started.elapsed();
                let report = ib.recovery_report();
                // Every open replays the same log: none writes a checkpoint.
                let replayed = *records.get_or_insert(report.records_replayed);
                assert_eq!(report.records_replayed, replayed);
                assert!(replayed >= REPLAY_SENDS, "only {replayed} records replayed");
                ib.halt();
            }
            took
        })
    });
    g.finish();
    if let Some(records) = records {
        eprintln!("replay: {records} records after the newest checkpoint, {REPLAY_SENDS} sends");
    }
}

/// One look at the kernel's page-cache counters, as the daemon takes
/// every 100 ms: a read of `/proc/vmstat` and the sum of its reclaim lines.
fn page_cache_look(c: &mut Criterion) {
    if inbox_engine::log::reclaims_so_far().is_none() {
        eprintln!("page_cache_look: no /proc/vmstat here; nothing to time");
        return;
    }
    c.bench_function("page_cache_look", |b| {
        b.iter(|| std::hint::black_box(inbox_engine::log::reclaims_so_far()))
    });
}

criterion_group!(
    inbox,
    benches,
    page_cache_look,
    replay,
    checkpoint_stall,
    send_after_checkpoint,
    send_after_checkpoint_many_keys
);
criterion_main!(inbox);
