//! What a send costs with and without a placement: the same sends to one
//! conversation of 8 members on a store with no placement, on one whose
//! placement owns every slot (which must cost the same: it routes
//! nothing), and on one that leaves half the slots to another group
//! (which writes an outbox entry per send).
//!
//! `cargo run --release -p inbox-engine --example fanout_cost [sends] [rounds]`
//!
//! Each configuration runs `rounds` times, interleaved, on a fresh store
//! in a temp directory with fsync off (the figure is the engine's CPU per
//! send, not the disk's), with 64 sends in flight; it prints the median
//! µs per send of each.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use inbox_engine::inbox::{GroupId, Placement, Slot, SlotRange, SLOTS};
use inbox_engine::log::SyncPolicy;
use inbox_engine::*;

const MEMBERS: u64 = 8;
const IN_FLIGHT: usize = 64;

fn split() -> Arc<Placement> {
    let r = |first: u16, last: u16, g: u32| SlotRange {
        first: Slot(first),
        last: Slot(last),
        group: GroupId(g),
    };
    let ranges = vec![r(0, SLOTS / 2 - 1, 1), r(SLOTS / 2, SLOTS - 1, 2)];
    Arc::new(Placement::new(1, GroupId(1), ranges).expect("two halves cover every slot"))
}

/// µs per send over `sends` sends on a fresh store placed by `placement`.
fn run(placement: Option<Arc<Placement>>, sends: u64) -> f64 {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = InboxConfig::new(dir.path());
    c.sync = SyncPolicy::None;
    c.compaction_interval = None;
    c.placement = placement;
    let inbox = Inbox::open(c).expect("open");
    // A conversation this store owns in every configuration.
    let conv = ConvId(
        (1..)
            .find(|&id| split().owns(inbox_engine::inbox::slot(id)))
            .expect("an id in the first half"),
    );
    for uid in 1..=MEMBERS {
        inbox.join(Uid(uid), conv).wait().expect("join");
    }
    let payload = Bytes::from_static(b"a message of a few dozen bytes, as most are");
    let started = Instant::now();
    let mut pending = std::collections::VecDeque::new();
    for i in 0..sends {
        pending.push_back(inbox.send(SendRequest {
            conv,
            sender: Uid(1 + i % MEMBERS),
            client_msg_id: u128::from(i) + 1,
            msg_type: 1,
            payload: payload.clone(),
        }));
        if pending.len() >= IN_FLIGHT {
            pending.pop_front().expect("queued").wait().expect("send");
        }
    }
    for p in pending {
        p.wait().expect("send");
    }
    let us = started.elapsed().as_secs_f64() * 1e6 / sends as f64;
    inbox.shutdown().expect("shutdown");
    us
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let sends: u64 = args.next().map_or(50_000, |a| a.parse().expect("sends"));
    let rounds: usize = args.next().map_or(5, |a| a.parse().expect("rounds"));
    let configs: [(&str, Option<Arc<Placement>>); 3] = [
        ("no placement", None),
        (
            "placement owning every slot",
            Some(Arc::new(Placement::single(GroupId(1)))),
        ),
        ("half the slots elsewhere", Some(split())),
    ];
    let mut times = vec![Vec::new(); configs.len()];
    for _ in 0..rounds {
        for (i, (_, p)) in configs.iter().enumerate() {
            times[i].push(run(p.clone(), sends));
        }
    }
    println!(
        "{sends} sends to {MEMBERS} members, {IN_FLIGHT} in flight, fsync off, median of {rounds}:"
    );
    for ((name, _), t) in configs.iter().zip(times) {
        let all: Vec<String> = t.iter().map(|x| format!("{x:.2}")).collect();
        println!(
            "  {name:<30} {:>6.2} µs/send  ({})",
            median(t),
            all.join(" ")
        );
    }
}
