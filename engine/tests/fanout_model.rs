//! A model test of the fan-out protocol between groups: three stores,
//! each owning a third of the slots, conversations whose members live in
//! all three, and a simulated forwarder whose channel duplicates,
//! reorders, delays and loses deliveries and acknowledgements, while
//! either side restarts (cleanly, or from a crash image) at random points.
//!
//! Checked against a model of what each user must see, once the channel
//! stops losing and the forwarder has drained every outbox:
//! - every message (sends, recalls, joins, leaves) appears exactly once in the
//!   event stream of every member whose period covers its `msg_seq`, in
//!   `msg_seq` order per conversation, and nothing else does;
//! - every user's `sync_seq`s run from 1 without a gap;
//! - unread counts are exact, recalled messages taken out of them;
//! - every outbox is empty, and every dedup record is dropped once its
//!   entry is trimmed.

mod inbox_common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use inbox_common::config;
use inbox_engine::inbox::{
    GroupId, InboxConfig, ManualClock, OutboxEntry, Placement, Slot, SlotRange, SLOTS,
};
use inbox_engine::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const GROUPS: u32 = 3;
const USERS: u64 = 15;
const CONVS: u64 = 5;

/// The same map on every store, seen from group `here`.
fn placement(here: u32) -> Arc<Placement> {
    let third = SLOTS / 3;
    let r = |first: u16, last: u16, g: u32| SlotRange {
        first: Slot(first),
        last: Slot(last),
        group: GroupId(g),
    };
    let ranges = vec![
        r(0, third - 1, 1),
        r(third, 2 * third - 1, 2),
        r(2 * third, SLOTS - 1, 3),
    ];
    Arc::new(Placement::new(7, GroupId(here), ranges).unwrap())
}

/// One group's store: its directory and its engine.
struct Store {
    group: u32,
    inbox: Option<Inbox>,
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
}

impl Store {
    fn config(&self) -> InboxConfig {
        let mut c = config(self.dir.path(), &self.clock);
        c.placement = Some(placement(self.group));
        c
    }

    fn open(group: u32, clock: &Arc<ManualClock>) -> Store {
        let mut s = Store {
            group,
            inbox: None,
            dir: tempfile::tempdir().unwrap(),
            clock: Arc::clone(clock),
        };
        s.inbox = Some(Inbox::open(s.config()).unwrap());
        s
    }

    fn ib(&self) -> &Inbox {
        self.inbox.as_ref().unwrap()
    }

    /// Closes and reopens; without checkpoints recovery replays the log.
    fn restart(&mut self, keep_checkpoints: bool) {
        drop(self.inbox.take());
        if !keep_checkpoints {
            let _ = std::fs::remove_dir_all(self.dir.path().join("checkpoint"));
        }
        self.inbox = Some(Inbox::open(self.config()).unwrap());
    }

    /// Opens a copy of the directory taken while the engine runs, as a
    /// killed process leaves it, and abandons the old engine.
    fn crash(&mut self) {
        let image = tempfile::tempdir().unwrap();
        inbox_common::copy_running_dir(self.dir.path(), image.path());
        if let Some(old) = self.inbox.take() {
            old.halt();
        }
        self.dir = image;
        self.inbox = Some(Inbox::open(self.config()).unwrap());
    }
}

/// What travels between groups.
#[derive(Clone, Debug)]
enum Packet {
    /// Outbox entries of `from` for `to`, with `from`'s trim watermark.
    Deliver {
        from: u32,
        to: u32,
        entries: Vec<OutboxEntry>,
        trimmed: u64,
    },
    /// `from` committed every entry of `to` through `applied`.
    Applied { from: u32, to: u32, applied: u64 },
}

/// What each user must see.
#[derive(Default)]
struct Model {
    /// Per conversation, every message: (msg_seq, kind, sender).
    log: BTreeMap<ConvId, Vec<(MsgSeq, MessageKind, Uid)>>,
    /// Per (conversation, user), the periods: (join_seq, leave_seq or
    /// `u64::MAX` while open).
    periods: BTreeMap<(ConvId, Uid), Vec<(MsgSeq, MsgSeq)>>,
    /// Normal messages not recalled, with their ids, per (conv, sender).
    recallable: BTreeMap<(ConvId, Uid), Vec<(MsgSeq, MsgId)>>,
    recalled: BTreeSet<(ConvId, MsgSeq)>,
}

impl Model {
    fn is_member(&self, conv: ConvId, uid: Uid) -> bool {
        self.periods
            .get(&(conv, uid))
            .and_then(|ps| ps.last())
            .is_some_and(|p| p.1 == MsgSeq(u64::MAX))
    }

    fn members(&self, conv: ConvId) -> Vec<Uid> {
        (1..=USERS)
            .map(Uid)
            .filter(|&u| self.is_member(conv, u))
            .collect()
    }

    fn record(&mut self, conv: ConvId, seq: MsgSeq, kind: MessageKind, sender: Uid) {
        let log = self.log.entry(conv).or_default();
        assert_eq!(log.last().map_or(0, |m| m.0 .0) + 1, seq.0, "msg_seq gap");
        log.push((seq, kind, sender));
        let ps = self.periods.entry((conv, sender)).or_default();
        match kind {
            MessageKind::Join => ps.push((seq, MsgSeq(u64::MAX))),
            MessageKind::Leave => ps.last_mut().unwrap().1 = seq,
            _ => {}
        }
    }

    fn covers(&self, conv: ConvId, uid: Uid, seq: MsgSeq) -> bool {
        self.periods
            .get(&(conv, uid))
            .is_some_and(|ps| ps.iter().any(|p| p.0 <= seq && seq <= p.1))
    }

    /// `uid`'s events, (conv, msg_seq) in conversation and seq order.
    fn events_of(&self, uid: Uid) -> BTreeSet<(ConvId, MsgSeq)> {
        let mut out = BTreeSet::new();
        for (&conv, log) in &self.log {
            for &(seq, _, _) in log {
                if self.covers(conv, uid, seq) {
                    out.insert((conv, seq));
                }
            }
        }
        out
    }

    fn unread_of(&self, uid: Uid, conv: ConvId) -> u32 {
        let log = self.log.get(&conv).map_or(&[][..], |l| &l[..]);
        log.iter()
            .filter(|&&(seq, kind, sender)| {
                kind == MessageKind::Normal
                    && sender != uid
                    && !self.recalled.contains(&(conv, seq))
                    && self.covers(conv, uid, seq)
            })
            .count() as u32
    }
}

struct World {
    stores: Vec<Store>,
    model: Model,
    channel: Vec<Packet>,
    rng: StdRng,
    next_cmid: u128,
    /// Per (source, destination), the last entry the forwarder sent: it
    /// pipelines from there, and goes back to the oldest entry now and
    /// then (a real one would on a timeout).
    sent: BTreeMap<(u32, u32), u64>,
    /// Counts of what happened, to show the run reached every case.
    reached: BTreeMap<&'static str, u64>,
}

impl World {
    fn new(seed: u64) -> World {
        let clock = Arc::new(ManualClock::new(inbox_common::T0));
        World {
            stores: (1..=GROUPS).map(|g| Store::open(g, &clock)).collect(),
            model: Model::default(),
            channel: Vec::new(),
            rng: StdRng::seed_from_u64(seed),
            next_cmid: 1,
            sent: BTreeMap::new(),
            reached: BTreeMap::new(),
        }
    }

    fn count(&mut self, what: &'static str, n: u64) {
        *self.reached.entry(what).or_default() += n;
    }

    fn home(&self, id: u64) -> &Store {
        let g = placement(1).owner(inbox_engine::inbox::slot(id)).0;
        &self.stores[(g - 1) as usize]
    }

    fn join(&mut self, conv: ConvId, uid: Uid) {
        let r = self.home(conv.0).ib().join(uid, conv).wait().unwrap();
        self.model.record(conv, r.msg_seq, MessageKind::Join, uid);
        self.count("join", 1);
    }

    fn leave(&mut self, conv: ConvId, uid: Uid) {
        let r = self.home(conv.0).ib().leave(uid, conv).wait().unwrap();
        self.model.record(conv, r.msg_seq, MessageKind::Leave, uid);
        self.count("leave", 1);
    }

    fn send(&mut self, conv: ConvId, sender: Uid) {
        let cmid = self.next_cmid;
        self.next_cmid += 1;
        let req = SendRequest {
            conv,
            sender,
            client_msg_id: cmid,
            msg_type: 1,
            payload: Bytes::from(format!("message {cmid}")),
        };
        let r = self.home(conv.0).ib().send(req).wait().unwrap();
        self.model
            .record(conv, r.msg_seq, MessageKind::Normal, sender);
        (self.model.recallable.entry((conv, sender)).or_default()).push((r.msg_seq, r.msg_id));
        self.count("send", 1);
    }

    /// `sender` recalls one of its messages in `conv`, if it has one.
    fn recall(&mut self, conv: ConvId, sender: Uid) {
        let Some(own) = self.model.recallable.get_mut(&(conv, sender)) else {
            return;
        };
        if own.is_empty() {
            return;
        }
        let (target_seq, target) = own.swap_remove(self.rng.gen_range(0..own.len()));
        let cmid = self.next_cmid;
        self.next_cmid += 1;
        let req = RecallRequest {
            sender,
            conv,
            client_msg_id: cmid,
            target,
        };
        let r = self.home(conv.0).ib().recall(req).wait().unwrap();
        self.model
            .record(conv, r.msg_seq, MessageKind::Recall, sender);
        self.model.recalled.insert((conv, target_seq));
        self.count("recall", 1);
    }

    /// The forwarder of `from` reads its outbox for `to` and puts a
    /// delivery on the channel (sometimes twice).
    fn forward(&mut self, from: u32, to: u32) {
        let inbox = self.stores[(from - 1) as usize].ib();
        let limit = self.rng.gen_range(1..6);
        let sent = self.sent.entry((from, to)).or_default();
        if self.rng.gen_bool(0.4) {
            *sent = 0;
        }
        let batch = inbox
            .fanout_outbox(GroupId(to), *sent, limit)
            .wait()
            .unwrap();
        *sent = batch.entries.last().map_or(*sent, |e| e.seq);
        let packet = Packet::Deliver {
            from,
            to,
            entries: batch.entries,
            trimmed: batch.trimmed_through,
        };
        if self.rng.gen_bool(0.2) {
            self.channel.push(packet.clone());
            self.count("duplicated", 1);
        }
        self.channel.push(packet);
    }

    /// Takes one packet off the channel at random (reordering); with
    /// `lossy`, loses some.
    fn carry(&mut self, lossy: bool) {
        if self.channel.is_empty() {
            return;
        }
        let i = self.rng.gen_range(0..self.channel.len());
        let packet = self.channel.swap_remove(i);
        if lossy && self.rng.gen_bool(0.15) {
            self.count("lost", 1);
            return;
        }
        match packet {
            Packet::Deliver {
                from,
                to,
                entries,
                trimmed,
            } => {
                let inbox = self.stores[(to - 1) as usize].ib();
                let r = inbox
                    .fanout_deliver(GroupId(from), entries, trimmed)
                    .wait()
                    .unwrap();
                self.count("events appended", r.events_appended);
                self.count("duplicate recipients skipped", r.duplicates);
                self.count("entries held back", r.held_back);
                self.channel.push(Packet::Applied {
                    from: to,
                    to: from,
                    applied: r.applied_through,
                });
            }
            Packet::Applied { from, to, applied } => {
                let inbox = self.stores[(to - 1) as usize].ib();
                let before = trimmed_for(inbox, from);
                let after = inbox.fanout_trim(GroupId(from), applied).wait().unwrap();
                assert!(after >= before && after >= applied);
                self.count("trims", u64::from(after > before));
            }
        }
    }

    fn step(&mut self, lossy: bool) {
        let roll = self.rng.gen_range(0..100);
        let conv = ConvId(self.rng.gen_range(1..=CONVS));
        let uid = Uid(self.rng.gen_range(1..=USERS));
        match roll {
            0..=29 => {
                let members = self.model.members(conv);
                if !members.is_empty() {
                    let sender = members[self.rng.gen_range(0..members.len())];
                    if self.rng.gen_bool(0.2) {
                        self.recall(conv, sender);
                    } else {
                        self.send(conv, sender);
                    }
                }
            }
            30..=34 => {
                if self.model.is_member(conv, uid) {
                    self.leave(conv, uid);
                } else {
                    self.join(conv, uid);
                }
            }
            35..=59 => {
                let from = self.rng.gen_range(1..=GROUPS);
                let to = self.rng.gen_range(1..=GROUPS);
                if from != to {
                    self.forward(from, to);
                }
            }
            60..=96 => self.carry(lossy),
            _ => {
                let g = self.rng.gen_range(0..GROUPS as usize);
                match self.rng.gen_range(0..3) {
                    0 => self.stores[g].restart(true),
                    1 => self.stores[g].restart(false),
                    _ => self.stores[g].crash(),
                }
                self.count("restarts", 1);
            }
        }
    }

    /// With a channel that no longer loses, forwards and carries until
    /// every outbox is empty and every trim has reached its destination.
    fn drain(&mut self) {
        for _ in 0..10_000 {
            for from in 1..=GROUPS {
                for to in 1..=GROUPS {
                    if from != to {
                        self.forward(from, to);
                    }
                }
            }
            while !self.channel.is_empty() {
                self.carry(false);
            }
            if self.settled() {
                return;
            }
        }
        panic!("the outboxes never drained: {:?}", self.status());
    }

    fn status(&self) -> Vec<inbox_engine::inbox::FanoutStatus> {
        self.stores.iter().map(|s| s.ib().fanout_status()).collect()
    }

    /// Every outbox empty, and every destination has seen the final trim.
    fn settled(&self) -> bool {
        let status = self.status();
        status.iter().enumerate().all(|(i, s)| {
            s.outboxes.iter().all(|o| {
                let dest = &status[(o.dest.0 - 1) as usize];
                let seen = dest
                    .inbound
                    .iter()
                    .find(|x| x.source.0 == i as u32 + 1)
                    .map_or(0, |x| x.source_trimmed);
                o.depth == 0 && seen == o.trimmed_through
            })
        })
    }

    fn check(&self) {
        let mut events_checked = 0;
        for uid in (1..=USERS).map(Uid) {
            let store = self.home(uid.0);
            let events = all_events(store.ib(), uid);
            let seqs: Vec<u64> = events.iter().map(|e| e.sync_seq.0).collect();
            let expected_seqs: Vec<u64> = (1..=events.len() as u64).collect();
            assert_eq!(seqs, expected_seqs, "uid {uid}: sync_seq gap");
            let mut seen = BTreeSet::new();
            let mut last_per_conv: BTreeMap<ConvId, MsgSeq> = BTreeMap::new();
            for e in &events {
                assert!(
                    seen.insert((e.conv, e.msg_seq)),
                    "uid {uid}: conv {} msg_seq {} twice",
                    e.conv,
                    e.msg_seq
                );
                let last = last_per_conv.entry(e.conv).or_default();
                assert!(*last < e.msg_seq, "uid {uid}: conv {} out of order", e.conv);
                *last = e.msg_seq;
            }
            assert_eq!(seen, self.model.events_of(uid), "uid {uid}: events");
            events_checked += events.len();
            let list = store.ib().conv_list(uid, 500, None).unwrap();
            for row in &list.convs {
                assert_eq!(
                    row.unread,
                    self.model.unread_of(uid, row.conv),
                    "uid {uid} conv {}: unread",
                    row.conv
                );
            }
            let listed: BTreeSet<ConvId> = list.convs.iter().map(|r| r.conv).collect();
            let expected: BTreeSet<ConvId> = seen.iter().map(|e| e.0).collect();
            assert_eq!(listed, expected, "uid {uid}: conversation list");
        }
        for s in self.status() {
            for o in &s.outboxes {
                assert_eq!(o.depth, 0, "{o:?}");
            }
            for i in &s.inbound {
                assert_eq!(i.source_trimmed, i.applied_through, "{i:?}");
                assert_eq!((i.dedup_entries, i.dedup_keys), (0, 0), "{i:?}");
            }
        }
        assert!(events_checked > 0);
    }
}

fn trimmed_for(inbox: &Inbox, dest: u32) -> u64 {
    inbox
        .fanout_status()
        .outboxes
        .iter()
        .find(|o| o.dest.0 == dest)
        .map_or(0, |o| o.trimmed_through)
}

/// Every event of `uid`, through a device registered for it.
fn all_events(inbox: &Inbox, uid: Uid) -> Vec<SyncEvent> {
    let device = DeviceId(1_000 + uid.0);
    let gen = inbox
        .register_device(uid, device)
        .wait()
        .unwrap()
        .device
        .generation;
    let sync = |local: SyncSeq, token: Option<Bytes>| {
        inbox
            .sync(SyncRequest {
                uid,
                device,
                generation: Some(gen),
                local_applied_seq: local,
                limit: 500,
                batch_token: token,
            })
            .wait()
            .unwrap()
    };
    let mut page = sync(SyncSeq(0), None);
    let token = page.batch_token.clone();
    let mut events = std::mem::take(&mut page.events);
    while page.has_more {
        page = sync(page.next_cursor, Some(token.clone()));
        events.append(&mut page.events);
    }
    events
}

fn run(seed: u64, steps: usize) -> BTreeMap<&'static str, u64> {
    let mut w = World::new(seed);
    // Every conversation starts with members in every group.
    for conv in (1..=CONVS).map(ConvId) {
        for uid in (1..=USERS).map(Uid) {
            if w.rng.gen_bool(0.5) {
                w.join(conv, uid);
            }
        }
    }
    for _ in 0..steps {
        w.step(true);
    }
    w.drain();
    w.check();
    w.reached
}

#[test]
fn every_member_gets_every_message_exactly_once_across_groups_under_a_faulty_channel() {
    let mut total: BTreeMap<&'static str, u64> = BTreeMap::new();
    // FANOUT_MODEL_SEEDS=n runs seeds 1..=n instead of three.
    let seeds: u64 = std::env::var("FANOUT_MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    for seed in 1..=seeds {
        for (k, v) in run(seed, 400) {
            *total.entry(k).or_default() += v;
        }
    }
    eprintln!("fan-out model: {total:?}");
    // The run reached every case it is meant to exercise.
    for case in [
        "send",
        "recall",
        "join",
        "leave",
        "duplicated",
        "lost",
        "restarts",
        "events appended",
        "duplicate recipients skipped",
        "entries held back",
        "trims",
    ] {
        assert!(
            total.get(case).copied().unwrap_or(0) > 0,
            "the model never reached {case}: {total:?}"
        );
    }
}
