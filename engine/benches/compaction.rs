//! Foreground latency with and without compaction running (R19): p50 and
//! p99 of `send` and of a sync page (first page, 100 events), measured by
//! the same foreground loop, once with no compaction and once while the
//! background compaction thread runs a pass every second over a store
//! where half of every `evt` segment is dead. Twice: with every write
//! fsynced, and without fsync (which leaves only what compaction itself
//! does to the foreground: CPU, locks, sequencer rounds, writer batches).
//!
//! Run: `cargo bench -p inbox-engine --bench compaction`
//! (prints the figures; `harness = false`, no criterion, because the
//! figure wanted is a tail latency under interference, not a mean).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use inbox_engine::inbox::ManualClock;
use inbox_engine::log::SyncPolicy;
use inbox_engine::*;

const USERS: u64 = 20;
/// Even users: they ACK everything, so their events die.
const CONV_ACKING: ConvId = ConvId(1);
/// Odd users: they never ACK, so their events stay (sparse segments).
const CONV_HOLDING: ConvId = ConvId(2);
const DEVICE: DeviceId = DeviceId(1);

fn conv_of(uid: Uid) -> ConvId {
    if uid.get() % 2 == 0 {
        CONV_ACKING
    } else {
        CONV_HOLDING
    }
}

fn open(
    dir: &std::path::Path,
    clock: &Arc<ManualClock>,
    sync: SyncPolicy,
    every: Option<Duration>,
) -> Inbox {
    let mut c = InboxConfig::new(dir);
    c.sync = sync;
    c.segment_bytes = 1 << 20;
    c.safety_window = Duration::from_secs(60);
    c.rewrite_live_fraction = 0.6;
    c.compaction_interval = every;
    c.clock = clock.clone();
    Inbox::open(c).unwrap()
}

/// Fills the store: every user in one group, all devices ACK, then time
/// moves on, so most `evt` segments are dead or sparse.
fn fill(ib: &Inbox, clock: &ManualClock, n: u64) -> Vec<(Uid, Generation, SyncSeq)> {
    for uid in 1..=USERS {
        ib.join(Uid(uid), conv_of(Uid(uid))).wait().unwrap();
    }
    let mut devs: Vec<(Uid, Generation, SyncSeq)> = (1..=USERS)
        .map(|uid| {
            let g = ib
                .register_device(Uid(uid), DEVICE)
                .wait()
                .unwrap()
                .device
                .generation;
            (Uid(uid), g, SyncSeq(0))
        })
        .collect();
    let pending: Vec<_> = (0..n)
        .map(|i| ib.send(req(u128::from(i) + 1_000_000, Uid(1 + i % USERS))))
        .collect();
    for p in pending {
        p.wait().unwrap();
    }
    // The two conversations' records interleave in the segments: once the
    // even users ACK, half of every segment is dead (sparse, rewritten)
    // and the ACK records die with the next checkpoints.
    for (uid, gen, acked) in devs.iter_mut().filter(|(u, _, _)| u.get() % 2 == 0) {
        let first = ib
            .sync(sync_req(*uid, *gen, SyncSeq(0), None))
            .wait()
            .unwrap();
        let hwm = first.batch_hwm;
        let r = ib
            .ack(AckRequest {
                uid: *uid,
                device: DEVICE,
                generation: first.generation,
                seq: hwm,
                batch_token: first.batch_token,
            })
            .wait()
            .unwrap();
        *acked = r.acked_sync_seq;
        *gen = first.generation;
    }
    clock.advance(Duration::from_secs(3600));
    devs
}

fn req(cmid: u128, sender: Uid) -> SendRequest {
    SendRequest {
        conv: conv_of(sender),
        sender,
        client_msg_id: cmid,
        msg_type: 1,
        payload: Bytes::from(vec![b'x'; 200]),
    }
}

fn sync_req(uid: Uid, gen: Generation, local: SyncSeq, token: Option<Bytes>) -> SyncRequest {
    SyncRequest {
        uid,
        device: DEVICE,
        generation: Some(gen),
        local_applied_seq: local,
        limit: 100,
        batch_token: token,
    }
}

struct Figures {
    send: Histogram<u64>,
    sync: Histogram<u64>,
}

fn foreground(
    ib: &Inbox,
    clock: &ManualClock,
    devs: &[(Uid, Generation, SyncSeq)],
    ops: u64,
    at_least: Duration,
    base: u128,
) -> Figures {
    let mut f = Figures {
        send: Histogram::new(3).unwrap(),
        sync: Histogram::new(3).unwrap(),
    };
    let started = Instant::now();
    let mut i = 0;
    // At least `ops` iterations and `at_least` long, so that background
    // passes run during the measurement whatever the disk's speed.
    while i < ops || started.elapsed() < at_least {
        let t = Instant::now();
        ib.send(req(base + u128::from(i), Uid(1 + i % USERS)))
            .wait()
            .unwrap();
        f.send.record(t.elapsed().as_micros() as u64).unwrap();
        // A slow (non-ACKing) user's first page: 100 events read from evt.
        let (uid, gen, acked) = devs[(i as usize * 2) % devs.len()];
        if i % 200 == 199 {
            // Time moves on, so the background passes find new work.
            clock.advance(Duration::from_secs(30));
        }
        let t = Instant::now();
        let page = ib.sync(sync_req(uid, gen, acked, None)).wait().unwrap();
        f.sync.record(t.elapsed().as_micros() as u64).unwrap();
        assert!(!page.events.is_empty());
        i += 1;
    }
    f
}

fn print(label: &str, f: &Figures) {
    println!(
        "{label:<40} send p50 {:>6} us  p99 {:>6} us | sync page p50 {:>6} us  p99 {:>6} us",
        f.send.value_at_quantile(0.5),
        f.send.value_at_quantile(0.99),
        f.sync.value_at_quantile(0.5),
        f.sync.value_at_quantile(0.99),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs us too:
    // keep that a quick smoke run.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (n, ops, at_least) = if quick {
        (2_000, 50, Duration::ZERO)
    } else {
        (30_000, 6_000, Duration::from_secs(8))
    };
    // With every write fsynced, the disk's own jitter dominates the tail;
    // without fsync, what is left is what compaction does to the
    // foreground (CPU, locks, sequencer rounds, writer batches).
    for (name, sync) in [
        ("fsync always", SyncPolicy::Always),
        ("no fsync", SyncPolicy::None),
    ] {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let dir = tempfile::tempdir().unwrap();
        let ib = open(dir.path(), &clock, sync, None);
        let devs = fill(&ib, &clock, n);
        let idle = foreground(&ib, &clock, &devs, ops, at_least, 10_000_000);
        print(&format!("{name}, without compaction"), &idle);
        drop(ib);

        // The background thread, one pass per second (the default is one
        // a minute), over a store where half of every segment is dead.
        let dir = tempfile::tempdir().unwrap();
        let ib = open(dir.path(), &clock, sync, Some(Duration::from_secs(1)));
        let devs = fill(&ib, &clock, n);
        let busy = foreground(&ib, &clock, &devs, ops, at_least, 20_000_000);
        print(&format!("{name}, while compaction runs"), &busy);
        println!("compaction meanwhile: {:?}", ib.stats().compaction);
    }
}
