//! Inbox engine benches: send (1:1 and to a 200-member group), a 100-event
//! sync page, a 50-message pull. Also prints the index bytes per event.
//!
//! `cargo bench -p inbox-engine --bench inbox`
//!
//! Sends run with `SyncPolicy::None` (engine cost, no fdatasync) and, for
//! 1:1, also with `Always` (one fdatasync per log per round).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use inbox_engine::inbox::ManualClock;
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
        ib.join(1, 1).wait().unwrap();
        ib.join(1, 2).wait().unwrap();
        let mut cmid = 0u128;
        g.throughput(Throughput::Elements(1));
        g.bench_function(name, |b| {
            b.iter(|| {
                cmid += 1;
                send(&ib, 1, 1, cmid, &payload)
            })
        });
    }

    {
        let dir = tempfile::tempdir().unwrap();
        let ib = open(dir.path(), SyncPolicy::None);
        for uid in 1..=200 {
            ib.join(2, uid).wait().unwrap();
        }
        let mut cmid = 0u128;
        g.throughput(Throughput::Elements(200));
        g.bench_function("send_group_200_sync_none", |b| {
            b.iter(|| {
                cmid += 1;
                send(&ib, 2, 1, cmid, &payload)
            })
        });
    }

    {
        let dir = tempfile::tempdir().unwrap();
        let ib = open(dir.path(), SyncPolicy::None);
        ib.join(3, 1).wait().unwrap();
        ib.join(3, 2).wait().unwrap();
        let gen = ib.register_device(2, 1).wait().unwrap().device.generation;
        let pending: Vec<_> = (0..10_000u128)
            .map(|i| {
                ib.send(SendRequest {
                    conv: 3,
                    sender: 1,
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
        g.throughput(Throughput::Elements(100));
        g.bench_function("sync_page_100", |b| {
            b.iter(|| {
                let page = ib
                    .sync(SyncRequest {
                        uid: 2,
                        device: 1,
                        generation: Some(gen),
                        local_applied_seq: 0,
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
                let r = ib.pull(2, &[(3, after)], 50).unwrap();
                assert_eq!(r[0].messages.len(), 50);
                r
            })
        });
    }
    g.finish();
}

criterion_group!(inbox, benches);
criterion_main!(inbox);
