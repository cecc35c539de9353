//! Model-based test of compaction against fences (R10, R18, R19): random
//! sends, syncs, ACKs, recovery leases, snapshots, compactions, clock moves
//! and restarts, checked against a reference model of every user's stream.
//!
//! Invariant: everything a fence protects is still served, whole and equal
//! to the model; a snapshot holds the model's state at its S; and what
//! compaction reclaimed never comes back.
//!
//! Restarts are clean shutdowns or kills (the engine abandoned without its
//! shutdown checkpoint; checkpoints are written every 8 KiB of log, so a
//! kill is followed by replay after one). The run counts what it reached
//! (events reclaimed, segments dropped and rewritten, leases, resets,
//! snapshots, replays) and fails when one never happened.

mod inbox_common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use inbox_common::*;
use inbox_engine::*;
use proptest::prelude::*;

const USERS: u64 = 3;
const DEVICES: u64 = 2;
const CONVS: [(ConvId, &[Uid]); 2] = [
    (ConvId(10), &[Uid(1), Uid(2), Uid(3)]),
    (ConvId(20), &[Uid(1), Uid(2)]),
];

fn tune(c: &mut InboxConfig) {
    // The smallest segments, so a few hundred events seal several and
    // compaction has whole segments to drop and sparse ones to rewrite.
    c.segment_bytes = inbox_engine::log::SEGMENT_BYTES_MIN;
    c.safety_window = Duration::from_secs(3600);
    // Far away: every device stays live, so every fence holds.
    c.hard_ttl = Duration::from_secs(1000 * 86_400);
    c.device_ttl = Duration::from_secs(1000 * 86_400);
    c.recovery_lease_ttl = Duration::from_secs(1000 * 86_400);
    c.snapshot_ttl = Duration::from_secs(1000 * 86_400);
    c.rewrite_live_fraction = 0.7;
    c.compaction_interval = None;
    c.checkpoint_every_bytes = 8 << 10;
    c.checkpoint_every_state_percent = 0;
}

/// What the cases reached, summed over the run.
static REACHED: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
const REACHED_NAMES: [&str; 8] = [
    "events reclaimed",
    "segments dropped",
    "segments rewritten",
    "recovery leases",
    "resets",
    "snapshots installed",
    "kill restarts",
    "replays after a checkpoint",
];
const RECLAIMED: usize = 0;
const DROPPED: usize = 1;
const REWRITTEN: usize = 2;
const LEASES: usize = 3;
const RESETS: usize = 4;
const SNAPSHOTS: usize = 5;
const KILLS: usize = 6;
const REPLAYS: usize = 7;

fn reached(what: usize, n: u64) {
    REACHED[what].fetch_add(n, Ordering::Relaxed);
}

#[derive(Clone, Debug)]
enum Op {
    Send {
        conv: usize,
        sender: usize,
        n: u8,
    },
    CatchUp {
        uid: u64,
        dev: u64,
    },
    /// Reads one page and ACKs part of it.
    PartialAck {
        uid: u64,
        dev: u64,
        keep: u8,
    },
    /// The device lost `back` events locally: a recovery lease.
    Rollback {
        uid: u64,
        dev: u64,
        back: u8,
    },
    Snapshot {
        uid: u64,
        dev: u64,
    },
    Advance {
        minutes: u16,
    },
    Compact,
    /// A clean shutdown, or a kill (no shutdown checkpoint).
    Restart {
        kill: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, 0..2usize, 1..30u8).prop_map(|(conv, sender, n)| Op::Send { conv, sender, n }),
        3 => (1..=USERS, 1..=DEVICES).prop_map(|(uid, dev)| Op::CatchUp { uid, dev }),
        2 => (1..=USERS, 1..=DEVICES, 0..40u8).prop_map(|(uid, dev, keep)| Op::PartialAck { uid, dev, keep }),
        1 => (1..=USERS, 1..=DEVICES, 1..40u8).prop_map(|(uid, dev, back)| Op::Rollback { uid, dev, back }),
        1 => (1..=USERS, 1..=DEVICES).prop_map(|(uid, dev)| Op::Snapshot { uid, dev }),
        2 => (1..180u16).prop_map(|minutes| Op::Advance { minutes }),
        3 => Just(Op::Compact),
        1 => any::<bool>().prop_map(|kill| Op::Restart { kill }),
    ]
}

#[derive(Default, Clone, Copy)]
struct Dev {
    gen: Generation,
    acked: SyncSeq,
}

struct Model {
    /// Per user: (conv, msg_seq) of each event, in sync_seq order from 1.
    events: BTreeMap<Uid, Vec<(ConvId, MsgSeq)>>,
    devs: BTreeMap<(Uid, DeviceId), Dev>,
    heads: BTreeMap<ConvId, MsgSeq>,
    /// Per user, the oldest retained event seen so far (never goes down).
    oldest: BTreeMap<Uid, SyncSeq>,
}

impl Model {
    fn check_page(&self, uid: Uid, events: &[SyncEvent], from: SyncSeq) {
        let want = &self.events[&uid];
        for (i, e) in events.iter().enumerate() {
            let seq = from.plus(1 + i as u64);
            assert_eq!(e.sync_seq, seq, "contiguous");
            assert_eq!(
                (e.conv, e.msg_seq),
                want[(seq.get() - 1) as usize],
                "uid {uid} event {seq}"
            );
        }
    }
}

/// All pages of a batch; returns the events and the first page.
fn batch(
    h: &Harness,
    uid: Uid,
    dev: DeviceId,
    gen: Generation,
    local: SyncSeq,
) -> (Vec<SyncEvent>, SyncPage) {
    let first = h.sync(uid, dev, Some(gen), local, 7, None).unwrap();
    let mut out = first.events.clone();
    let (mut cursor, mut more) = (first.next_cursor, first.has_more);
    while more {
        let p = h
            .sync(
                uid,
                dev,
                Some(first.generation),
                cursor,
                7,
                Some(first.batch_token.clone()),
            )
            .unwrap();
        assert!(p.events.len() == 7 || !p.has_more, "a page is whole");
        out.extend(p.events);
        cursor = p.next_cursor;
        more = p.has_more;
    }
    (out, first)
}

fn run(ops: Vec<Op>) {
    let mut h = Harness::with(tune);
    let mut m = Model {
        events: BTreeMap::new(),
        devs: BTreeMap::new(),
        heads: BTreeMap::new(),
        oldest: BTreeMap::new(),
    };
    for (conv, members) in CONVS {
        for &uid in members {
            h.join(uid, conv);
            let head = m.heads.entry(conv).or_default();
            *head = head.next();
            let j = *head;
            // A join is an event for every member at that point, the joiner
            // included.
            for &other in members.iter().take_while(|&&o| o <= uid) {
                m.events.entry(other).or_default().push((conv, j));
            }
        }
    }
    for uid in 1..=USERS {
        for dev in 1..=DEVICES {
            let gen = h.register(Uid(uid), DeviceId(dev)).device.generation;
            m.devs.insert(
                (Uid(uid), DeviceId(dev)),
                Dev {
                    gen,
                    acked: SyncSeq(0),
                },
            );
        }
    }
    let mut cmid = 1u128;
    for op in ops {
        match op {
            Op::Send { conv, sender, n } => {
                let (conv, members) = CONVS[conv];
                let from = members[sender % members.len()];
                for _ in 0..n {
                    let r = h.send(conv, from, cmid, "m");
                    cmid += 1;
                    *m.heads.get_mut(&conv).unwrap() = r.msg_seq;
                    for &uid in members {
                        m.events.get_mut(&uid).unwrap().push((conv, r.msg_seq));
                    }
                }
            }
            Op::CatchUp { uid, dev } => {
                let d = m.devs[&(Uid(uid), DeviceId(dev))];
                let (events, gen, acked) = h.catch_up(Uid(uid), DeviceId(dev), d.gen, d.acked);
                m.check_page(Uid(uid), &events, d.acked);
                assert_eq!(
                    acked,
                    SyncSeq(m.events[&Uid(uid)].len() as u64),
                    "caught up to the head"
                );
                m.devs.insert((Uid(uid), DeviceId(dev)), Dev { gen, acked });
            }
            Op::PartialAck { uid, dev, keep } => {
                let d = m.devs[&(Uid(uid), DeviceId(dev))];
                let p = h
                    .sync(Uid(uid), DeviceId(dev), Some(d.gen), d.acked, 50, None)
                    .unwrap();
                m.check_page(Uid(uid), &p.events, d.acked);
                let seq = d.acked.plus(u64::from(keep).min(p.events.len() as u64));
                let a = h
                    .ack(Uid(uid), DeviceId(dev), p.generation, seq, &p.batch_token)
                    .unwrap();
                assert_eq!(a.acked_sync_seq, seq.max(d.acked));
                m.devs.insert(
                    (Uid(uid), DeviceId(dev)),
                    Dev {
                        gen: p.generation,
                        acked: a.acked_sync_seq,
                    },
                );
            }
            Op::Rollback { uid, dev, back } => {
                let d = m.devs[&(Uid(uid), DeviceId(dev))];
                let local = SyncSeq(d.acked.get().saturating_sub(u64::from(back)));
                if local == d.acked {
                    continue;
                }
                // The ACK fences from `d.acked`, so events below it may be
                // gone: a lease when they are all there, a reset otherwise.
                match h.sync(Uid(uid), DeviceId(dev), Some(d.gen), local, 7, None) {
                    Ok(first) => {
                        let lease = first.lease.expect("a rollback gets a lease");
                        reached(LEASES, 1);
                        assert_eq!(lease.resume_from, local);
                        let gen = first.generation;
                        let (events, _) = batch(&h, Uid(uid), DeviceId(dev), gen, local);
                        m.check_page(Uid(uid), &events, local);
                        let info = h
                            .ib()
                            .finish_lease(Uid(uid), DeviceId(dev), lease.lease_id, gen)
                            .wait()
                            .unwrap();
                        m.devs.insert(
                            (Uid(uid), DeviceId(dev)),
                            Dev {
                                gen: info.generation,
                                acked: info.acked_sync_seq,
                            },
                        );
                    }
                    Err(Error::ResetRequired { .. }) => {
                        let oldest = h.ib().explain(Uid(uid)).unwrap().oldest_retained;
                        assert!(local < oldest, "reset only when the events are gone");
                        reached(RESETS, 1);
                        install_snapshot(&h, &mut m, Uid(uid), DeviceId(dev));
                    }
                    Err(e) => panic!("rollback sync failed: {e:?}"),
                }
            }
            Op::Snapshot { uid, dev } => install_snapshot(&h, &mut m, Uid(uid), DeviceId(dev)),
            Op::Advance { minutes } => h.advance(Duration::from_secs(u64::from(minutes) * 60)),
            Op::Compact => {
                let report = h.ib().compact().unwrap();
                reached(RECLAIMED, report.events_reclaimed);
                reached(DROPPED, report.segments_dropped);
                reached(REWRITTEN, report.segments_rewritten);
            }
            Op::Restart { kill } => {
                if kill {
                    h.kill_restart(tune);
                    reached(KILLS, 1);
                } else {
                    h.restart(true, tune);
                }
                let recovery = h.ib().recovery_report();
                if recovery.checkpoint_lsn > 0 && recovery.records_replayed > 0 {
                    reached(REPLAYS, 1);
                }
            }
        }
        // What compaction counts per segment matches the index.
        h.ib().check_segment_refs().unwrap();
        // So do the state machine's other invariants.
        h.ib().check_invariants().unwrap();
        // Fences hold, and reclaimed events stay reclaimed.
        for uid in 1..=USERS {
            let x = h.ib().explain(Uid(uid)).unwrap();
            let min_ack = (1..=DEVICES)
                .map(|d| m.devs[&(Uid(uid), DeviceId(d))].acked)
                .min()
                .unwrap();
            assert!(
                x.oldest_retained <= min_ack.next(),
                "uid {uid}: {x:?} below an ACK {min_ack}"
            );
            let prev = m.oldest.entry(Uid(uid)).or_insert(SyncSeq(1));
            assert!(
                x.oldest_retained >= *prev,
                "uid {uid}: reclaimed events came back"
            );
            *prev = x.oldest_retained;
            assert_eq!(
                x.committed_sync_seq,
                SyncSeq(m.events[&Uid(uid)].len() as u64)
            );
        }
    }
    // Every device can still catch up from its ACK, and gets the model.
    for ((uid, dev), d) in m.devs.clone() {
        let (events, _, _) = h.catch_up(uid, dev, d.gen, d.acked);
        m.check_page(uid, &events, d.acked);
    }
}

fn install_snapshot(h: &Harness, m: &mut Model, uid: Uid, dev: DeviceId) {
    reached(SNAPSHOTS, 1);
    let info = h.ib().begin_snapshot(uid, dev).wait().unwrap();
    let head = SyncSeq(m.events[&uid].len() as u64);
    assert_eq!(info.base_sync_seq, head, "S is the head");
    let mut convs = Vec::new();
    for p in 0..info.pages {
        convs.extend(
            h.ib()
                .snapshot_page(uid, info.snapshot_id, p)
                .unwrap()
                .convs,
        );
    }
    for c in &convs {
        let last = m.events[&uid]
            .iter()
            .filter(|(conv, _)| *conv == c.conv)
            .map(|(_, s)| *s)
            .max()
            .unwrap();
        assert_eq!(c.last_msg_seq, last, "conv {} of uid {uid} at S", c.conv);
    }
    let d = h
        .ib()
        .ack_snapshot(uid, dev, info.snapshot_id, info.generation)
        .wait()
        .unwrap();
    assert_eq!(d.acked_sync_seq, head);
    m.devs.insert(
        (uid, dev),
        Dev {
            gen: d.generation,
            acked: head,
        },
    );
}

#[test]
fn compaction_never_takes_what_a_fence_protects_and_answers_match_the_model() {
    let config = ProptestConfig {
        cases: 24,
        max_shrink_iters: 200,
        // Failing cases are saved next to this file and replayed first.
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    // A fixed seed: the counts checked below are those of the same 24
    // cases on every run.
    let config_cases = config.cases;
    let rng = proptest::test_runner::TestRng::deterministic_rng(config.rng_algorithm);
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(config, rng);
    let result = runner.run(&proptest::collection::vec(op(), 1..60), |ops| {
        run(ops);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert_every_case_reached("compaction_model", config_cases, &REACHED_NAMES, &REACHED);
}
