//! Foreground latency with and without compaction running (R19): p50 and
//! p99 of `send` and of a sync page (first page, 100 events), measured by
//! the same foreground loop, once with no compaction and once while a
//! thread runs compaction passes back to back over a store full of dead
//! and sparse segments.
//!
//! Run: `cargo bench -p inbox-engine --bench compaction`
//! (prints the figures; `harness = false`, no criterion, because the
//! figure wanted is a tail latency under interference, not a mean).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use inbox_engine::inbox::ManualClock;
use inbox_engine::log::SyncPolicy;
use inbox_engine::*;

const USERS: u64 = 20;
const CONV: ConvId = 1;
const DEVICE: DeviceId = 1;

fn open(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Inbox {
    let mut c = InboxConfig::new(dir);
    c.sync = SyncPolicy::Always;
    c.segment_bytes = 1 << 20;
    c.safety_window = Duration::from_secs(60);
    c.compaction_interval = None;
    c.clock = clock.clone();
    Inbox::open(c).unwrap()
}

/// Fills the store: every user in one group, all devices ACK, then time
/// moves on, so most `evt` segments are dead or sparse.
fn fill(ib: &Inbox, clock: &ManualClock, n: u64) -> Vec<(Uid, Generation, SyncSeq)> {
    for uid in 1..=USERS {
        ib.join(CONV, uid).wait().unwrap();
    }
    let mut devs: Vec<(Uid, Generation, SyncSeq)> = (1..=USERS)
        .map(|uid| {
            let g = ib
                .register_device(uid, DEVICE)
                .wait()
                .unwrap()
                .device
                .generation;
            (uid, g, 0)
        })
        .collect();
    let pending: Vec<_> = (0..n)
        .map(|i| ib.send(req(u128::from(i) + 1_000_000, 1 + i % USERS)))
        .collect();
    for p in pending {
        p.wait().unwrap();
    }
    // Half the users ACK everything; the rest hold their events back,
    // which leaves sparse segments to rewrite.
    for (uid, gen, acked) in devs.iter_mut().filter(|(u, _, _)| u % 2 == 0) {
        let first = ib.sync(sync_req(*uid, *gen, 0, None)).wait().unwrap();
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
        conv: CONV,
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
    base: u128,
) -> Figures {
    let mut f = Figures {
        send: Histogram::new(3).unwrap(),
        sync: Histogram::new(3).unwrap(),
    };
    for i in 0..ops {
        let t = Instant::now();
        ib.send(req(base + u128::from(i), 1 + i % USERS))
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
    }
    f
}

fn print(label: &str, f: &Figures) {
    println!(
        "{label:<28} send p50 {:>6} us  p99 {:>6} us | sync page p50 {:>6} us  p99 {:>6} us",
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
    let (n, ops) = if quick { (2_000, 50) } else { (60_000, 2_000) };
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));

    let dir = tempfile::tempdir().unwrap();
    let ib = open(dir.path(), &clock);
    let devs = fill(&ib, &clock, n);
    let idle = foreground(&ib, &clock, &devs, ops, 10_000_000);
    print("without compaction", &idle);
    drop(ib);

    let dir = tempfile::tempdir().unwrap();
    let ib = Arc::new(open(dir.path(), &clock));
    let devs = fill(&ib, &clock, n);
    let stop = Arc::new(AtomicBool::new(false));
    let bg = {
        let ib = Arc::clone(&ib);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut total = CompactionReport::default();
            let mut passes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = ib.compact().unwrap();
                total.bytes_reclaimed += r.bytes_reclaimed;
                total.bytes_rewritten += r.bytes_rewritten;
                total.segments_dropped += r.segments_dropped;
                total.segments_rewritten += r.segments_rewritten;
                total.events_reclaimed += r.events_reclaimed;
                passes += 1;
            }
            (passes, total)
        })
    };
    let busy = foreground(&ib, &clock, &devs, ops, 20_000_000);
    stop.store(true, Ordering::Relaxed);
    let (passes, total) = bg.join().unwrap();
    print("while compaction runs", &busy);
    println!("compaction meanwhile: {passes} passes, {total:?}");
}
