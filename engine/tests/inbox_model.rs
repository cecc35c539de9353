//! Random operation sequences against a simple in-memory reference model
//! that computes every answer by definition (unread by counting, events by
//! replaying fan-out over membership periods), across clean restarts with
//! and without a checkpoint and kills (the engine abandoned without its
//! shutdown checkpoint; checkpoints are written every 4 KiB of log, so a
//! kill is followed by replay after one). Pulls, conversation lists and
//! syncs are read in small pages. The engine and the model must agree on
//! every answer.
//!
//! The run counts what it reached (kills, replays after a checkpoint,
//! multi-page pulls, conversation lists and syncs, recalls, duplicate
//! retries, large-group switches and marker clears that lost their
//! compare-and-set) and fails when one never happened. A conversation of
//! all three users is a large group (threshold 2): above its switch the
//! model fans out only a member's own join and leave, derives each
//! member's dirty marker from the head and approximates unread (R7). Compaction, leases and
//! resets are checked against fences in `compaction_model.rs`.

mod inbox_common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::*;
use proptest::prelude::*;

const UIDS: u64 = 3;
const CONVS: u64 = 2;

#[derive(Clone, Debug)]
enum Op {
    Join(ConvId, Uid),
    Leave(ConvId, Uid),
    Send(ConvId, Uid, u128, u8),
    Recall(ConvId, Uid, usize),
    MarkRead(Uid, ConvId, usize),
    Register(Uid, DeviceId),
    SyncAll(Uid, DeviceId),
    Pull(Uid, ConvId),
    ConvList(Uid),
    /// A marker clear; `stale` clears a version older than the target.
    ClearDirty(Uid, ConvId, bool),
    Restart {
        checkpoint: bool,
    },
    Kill,
}

/// What the cases reached, summed over the run.
static REACHED: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];
const REACHED_NAMES: [&str; 9] = [
    "kills",
    "replays after a checkpoint",
    "multi-page pulls",
    "multi-page conversation lists",
    "multi-page syncs",
    "recalls",
    "duplicate retries",
    "large-group switches",
    "clears that lost their compare-and-set",
];
const KILLS: usize = 0;
const REPLAYS: usize = 1;
const PULL_PAGES: usize = 2;
const LIST_PAGES: usize = 3;
const SYNC_PAGES: usize = 4;
const RECALLS: usize = 5;
const RETRIES: usize = 6;
const SWITCHES: usize = 7;
const MOVED: usize = 8;
/// More current members than this make a large group.
const LARGE_ABOVE: u32 = 2;

fn reached(what: usize) {
    REACHED[what].fetch_add(1, Ordering::Relaxed);
}

fn tune(c: &mut InboxConfig) {
    c.checkpoint_every_bytes = 4 << 10;
    c.checkpoint_every_state_percent = 0;
    c.large_group_members = LARGE_ABOVE;
}

fn op() -> impl Strategy<Value = Op> {
    let conv = 1..=CONVS;
    let uid = 1..=UIDS;
    prop_oneof![
        3 => (conv.clone(), uid.clone()).prop_map(|(c, u)| Op::Join(ConvId(c), Uid(u))),
        1 => (conv.clone(), uid.clone()).prop_map(|(c, u)| Op::Leave(ConvId(c), Uid(u))),
        6 => (conv.clone(), uid.clone(), 0..8u128, any::<u8>()).prop_map(|(c, u, m, b)| Op::Send(ConvId(c), Uid(u), m, b)),
        1 => (conv.clone(), uid.clone(), any::<usize>()).prop_map(|(c, u, i)| Op::Recall(ConvId(c), Uid(u), i)),
        2 => (uid.clone(), conv.clone(), any::<usize>()).prop_map(|(u, c, i)| Op::MarkRead(Uid(u), ConvId(c), i)),
        1 => (uid.clone(), 1..=2u64).prop_map(|(u, d)| Op::Register(Uid(u), DeviceId(d))),
        2 => (uid.clone(), 1..=2u64).prop_map(|(u, d)| Op::SyncAll(Uid(u), DeviceId(d))),
        2 => (uid.clone(), conv.clone()).prop_map(|(u, c)| Op::Pull(Uid(u), ConvId(c))),
        1 => uid.clone().prop_map(|u| Op::ConvList(Uid(u))),
        2 => (uid.clone(), conv.clone(), any::<bool>()).prop_map(|(u, c, s)| Op::ClearDirty(Uid(u), ConvId(c), s)),
        1 => any::<bool>().prop_map(|checkpoint| Op::Restart { checkpoint }),
        1 => Just(Op::Kill),
    ]
}

#[derive(Clone, Debug)]
struct MMsg {
    id: MsgId,
    sender: Uid,
    kind: MessageKind,
    payload: Bytes,
    tombstone: bool,
    recalled: bool,
}

#[derive(Default)]
struct MConv {
    msgs: Vec<MMsg>,
    periods: BTreeMap<Uid, Vec<(MsgSeq, MsgSeq)>>,
    /// A large group's switch: entries above it are not fanned out.
    switch: Option<MsgSeq>,
}

impl MConv {
    fn covers(&self, uid: Uid, seq: MsgSeq) -> bool {
        self.periods
            .get(&uid)
            .is_some_and(|ps| ps.iter().any(|&(j, l)| j <= seq && seq <= l))
    }
    fn member(&self, uid: Uid) -> bool {
        self.periods
            .get(&uid)
            .and_then(|p| p.last())
            .is_some_and(|p| p.1 == MsgSeq(u64::MAX))
    }
    /// The newest entry inside `uid`'s periods: the marker's target.
    fn target(&self, uid: Uid) -> MsgSeq {
        (1..=self.msgs.len() as u64)
            .rev()
            .map(MsgSeq)
            .find(|s| self.covers(uid, *s))
            .unwrap_or(MsgSeq(0))
    }
    fn joined_at(&self, uid: Uid, seq: MsgSeq) -> bool {
        self.periods
            .get(&uid)
            .is_some_and(|ps| ps.iter().any(|p| p.0 == seq))
    }
}

/// Per idempotency key: conversation, ids, and the payload of a send
/// (`None` for a recall): a retry is a duplicate only if it is the same
/// send.
type IdemSeen = (ConvId, MsgId, MsgSeq, Option<Bytes>);

#[derive(Default)]
struct Model {
    convs: HashMap<ConvId, MConv>,
    /// Per user: (kind, conv, msg_seq) of each event, sync_seq = index + 1.
    events: HashMap<Uid, Vec<(EventKind, ConvId, MsgSeq)>>,
    read: HashMap<(Uid, ConvId), MsgSeq>,
    idem: HashMap<(Uid, u128), IdemSeen>,
    devices: HashMap<(Uid, DeviceId), (Generation, SyncSeq)>,
    /// Marker clears of large groups.
    cleared: HashMap<(Uid, ConvId), MsgSeq>,
    next_id: u64,
}

impl Model {
    fn push_msg(
        &mut self,
        conv: ConvId,
        sender: Uid,
        kind: MessageKind,
        payload: Bytes,
    ) -> (MsgId, MsgSeq) {
        self.next_id += 1;
        let id = self.next_id;
        let c = self.convs.entry(conv).or_default();
        c.msgs.push(MMsg {
            id: MsgId(id),
            sender,
            kind,
            payload,
            tombstone: false,
            recalled: false,
        });
        let seq = MsgSeq(c.msgs.len() as u64);
        if kind == MessageKind::Join {
            c.periods
                .entry(sender)
                .or_default()
                .push((seq, MsgSeq(u64::MAX)));
        }
        let ev = match kind {
            MessageKind::Normal => EventKind::Msg,
            MessageKind::Recall => EventKind::Recall,
            MessageKind::Edit => EventKind::Edit,
            _ => EventKind::Member,
        };
        let recipients: Vec<Uid> = match c.switch {
            Some(s) if seq > s && matches!(kind, MessageKind::Join | MessageKind::Leave) => {
                vec![sender]
            }
            Some(s) if seq > s => Vec::new(),
            _ => (1..=UIDS).map(Uid).filter(|u| c.covers(*u, seq)).collect(),
        };
        if kind == MessageKind::Leave {
            if let Some(p) = c.periods.get_mut(&sender).and_then(|p| p.last_mut()) {
                p.1 = seq;
            }
        }
        let members = (1..=UIDS).filter(|u| c.member(Uid(*u))).count() as u32;
        if c.switch.is_none() && kind == MessageKind::Join && members > LARGE_ABOVE {
            c.switch = Some(seq);
            reached(SWITCHES);
        }
        for u in recipients {
            self.events.entry(u).or_default().push((ev, conv, seq));
        }
        (MsgId(id), seq)
    }

    /// `uid`'s dirty large groups, by definition: the target is above both
    /// the clear and the last entry fanned out to it.
    fn markers(&self, uid: Uid) -> Vec<(ConvId, MsgSeq)> {
        let mut out: Vec<(ConvId, MsgSeq)> = self
            .convs
            .iter()
            .filter(|(_, c)| c.switch.is_some())
            .filter_map(|(&conv, c)| {
                let fanned = self
                    .events
                    .get(&uid)
                    .into_iter()
                    .flatten()
                    .filter(|e| e.1 == conv && e.0 != EventKind::Read)
                    .map(|e| e.2)
                    .max()?;
                let cleared = self.cleared.get(&(uid, conv)).copied().unwrap_or_default();
                let target = c.target(uid);
                (target > fanned.max(cleared)).then_some((conv, target))
            })
            .collect();
        out.sort_unstable();
        out
    }

    fn unread(&self, uid: Uid, conv: ConvId) -> u32 {
        let c = &self.convs[&conv];
        let read = self.read.get(&(uid, conv)).copied().unwrap_or(MsgSeq(0));
        c.msgs
            .iter()
            .enumerate()
            .filter(|(i, m)| {
                let seq = MsgSeq(*i as u64 + 1);
                if c.switch.is_some_and(|s| seq > s) {
                    // Above the switch: every entry after the cursor but
                    // the member's own joins (R7's approximation).
                    return seq > read && c.covers(uid, seq) && !c.joined_at(uid, seq);
                }
                m.kind == MessageKind::Normal
                    && !m.recalled
                    && m.sender != uid
                    && seq > read
                    && c.covers(uid, seq)
            })
            .count() as u32
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut h = Harness::with(tune);
    let mut m = Model::default();
    for op in ops {
        match op {
            Op::Join(conv, uid) => {
                let r = h.ib().join(uid, conv).wait().unwrap();
                let c = m.convs.entry(conv).or_default();
                if c.member(uid) {
                    let p = c.periods[&uid].last().unwrap();
                    prop_assert_eq!(r.msg_seq, p.0);
                } else {
                    let (_, seq) = m.push_msg(conv, uid, MessageKind::Join, Bytes::new());
                    prop_assert_eq!(r.msg_seq, seq);
                }
            }
            Op::Leave(conv, uid) => {
                let r = h.ib().leave(uid, conv).wait();
                if m.convs.get(&conv).is_some_and(|c| c.member(uid)) {
                    let (_, seq) = m.push_msg(conv, uid, MessageKind::Leave, Bytes::new());
                    prop_assert_eq!(r.unwrap().msg_seq, seq);
                } else {
                    prop_assert!(matches!(r, Err(Error::NotFound(_))), "{:?}", r);
                }
            }
            Op::Send(conv, uid, cmid, b) => {
                // An even `b` sends the key's own body, so a retry repeats
                // the request exactly (duplicate); an odd one sends a body of
                // its own, so a retry under a used key is a different request
                // (CONFLICT).
                let fill = if b % 2 == 0 { cmid as u8 } else { b };
                let payload = Bytes::from(vec![fill; usize::from(fill % 5) * 40]);
                let r = h
                    .ib()
                    .send(SendRequest {
                        conv,
                        sender: uid,
                        client_msg_id: cmid,
                        msg_type: 1,
                        payload: payload.clone(),
                    })
                    .wait();
                if let Some((c0, id, seq, sent)) = m.idem.get(&(uid, cmid)).cloned() {
                    if c0 == conv && sent.as_ref() == Some(&payload) {
                        reached(RETRIES);
                        prop_assert_eq!(
                            r.unwrap(),
                            SendReply {
                                msg_id: id,
                                msg_seq: seq,
                                duplicate: true
                            }
                        );
                    } else {
                        prop_assert!(matches!(r, Err(Error::Conflict(_))), "{:?}", r);
                    }
                } else if !m.convs.contains_key(&conv) {
                    prop_assert!(matches!(r, Err(Error::NotFound(_))), "{:?}", r);
                } else if !m.convs[&conv].member(uid) {
                    prop_assert!(matches!(r, Err(Error::Forbidden(_))), "{:?}", r);
                } else {
                    let (id, seq) = m.push_msg(conv, uid, MessageKind::Normal, payload.clone());
                    m.idem.insert((uid, cmid), (conv, id, seq, Some(payload)));
                    prop_assert_eq!(
                        r.unwrap(),
                        SendReply {
                            msg_id: id,
                            msg_seq: seq,
                            duplicate: false
                        }
                    );
                }
            }
            Op::Recall(conv, uid, pick) => {
                // Recall one of the user's own live messages, if any.
                let Some(c) = m.convs.get(&conv) else {
                    continue;
                };
                if !c.member(uid) {
                    continue;
                }
                let own: Vec<usize> = c
                    .msgs
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| {
                        x.sender == uid && x.kind == MessageKind::Normal && !x.recalled
                    })
                    .map(|(i, _)| i)
                    .collect();
                if own.is_empty() {
                    continue;
                }
                let i = own[pick % own.len()];
                let target = c.msgs[i].id;
                let cmid = 1_000_000 + u128::from(m.next_id);
                let r = h
                    .ib()
                    .recall(RecallRequest {
                        conv,
                        sender: uid,
                        client_msg_id: cmid,
                        target,
                    })
                    .wait()
                    .unwrap();
                let mc = m.convs.get_mut(&conv).unwrap();
                mc.msgs[i].recalled = true;
                mc.msgs[i].tombstone = true;
                let (id, seq) = m.push_msg(conv, uid, MessageKind::Recall, Bytes::new());
                m.idem.insert((uid, cmid), (conv, id, seq, None));
                prop_assert_eq!((r.msg_id, r.msg_seq), (id, seq));
                reached(RECALLS);
            }
            Op::MarkRead(uid, conv, pick) => {
                let head = m.convs.get(&conv).map_or(0, |c| c.msgs.len() as u64);
                let to = if head == 0 {
                    MsgSeq(0)
                } else {
                    MsgSeq(pick as u64 % (head + 1))
                };
                let r = h.ib().mark_read(uid, conv, to).wait();
                let ever = m
                    .convs
                    .get(&conv)
                    .is_some_and(|c| c.periods.contains_key(&uid));
                if !m.convs.contains_key(&conv) {
                    prop_assert!(matches!(r, Err(Error::NotFound(_))), "{:?}", r);
                } else if !ever {
                    prop_assert!(matches!(r, Err(Error::Forbidden(_))), "{:?}", r);
                } else {
                    let cur = m.read.entry((uid, conv)).or_insert(MsgSeq(0));
                    if to > *cur {
                        *cur = to;
                        m.events
                            .entry(uid)
                            .or_default()
                            .push((EventKind::Read, conv, to));
                    }
                    let read_seq = *cur;
                    let r = r.unwrap();
                    prop_assert_eq!((r.read_seq, r.unread), (read_seq, m.unread(uid, conv)));
                }
            }
            Op::Register(uid, dev) => {
                let r = h.register(uid, dev);
                let entry = m
                    .devices
                    .entry((uid, dev))
                    .or_insert((Generation(1), SyncSeq(0)));
                prop_assert_eq!(r.device.generation, entry.0);
                prop_assert_eq!(r.device.acked_sync_seq, entry.1);
            }
            Op::SyncAll(uid, dev) => {
                let Some(&(gen, acked)) = m.devices.get(&(uid, dev)) else {
                    let r = h.sync(uid, dev, Some(Generation(1)), SyncSeq(0), 7, None);
                    prop_assert!(matches!(r, Err(Error::NotFound(_))), "{:?}", r);
                    continue;
                };
                let mut got = Vec::new();
                let first = h.sync(uid, dev, Some(gen), acked, 7, None).unwrap();
                let token = first.batch_token.clone();
                let (mut cursor, mut more) = (first.next_cursor, first.has_more);
                got.extend(first.events);
                if more {
                    reached(SYNC_PAGES);
                }
                while more {
                    let p = h
                        .sync(uid, dev, Some(gen), cursor, 7, Some(token.clone()))
                        .unwrap();
                    got.extend(p.events);
                    cursor = p.next_cursor;
                    more = p.has_more;
                }
                let all = m.events.get(&uid).cloned().unwrap_or_default();
                let want: Vec<(SyncSeq, EventKind, ConvId, MsgSeq)> = all
                    .iter()
                    .enumerate()
                    .skip(acked.get() as usize)
                    .map(|(i, &(k, c, s))| (SyncSeq(i as u64 + 1), k, c, s))
                    .collect();
                let got_t: Vec<_> = got
                    .iter()
                    .map(|e| (e.sync_seq, e.kind, e.conv, e.msg_seq))
                    .collect();
                prop_assert_eq!(&got_t, &want);
                for e in &got {
                    if e.kind == EventKind::Msg
                        && m.convs[&e.conv].msgs[e.msg_seq.get() as usize - 1].tombstone
                    {
                        prop_assert!(e.summary.is_empty());
                    }
                }
                let markers: Vec<(ConvId, MsgSeq)> = h
                    .ib()
                    .dirty_markers(uid)
                    .unwrap()
                    .iter()
                    .map(|d| (d.conv, d.target_msg_seq))
                    .collect();
                prop_assert_eq!(markers, m.markers(uid));
                let a = h.ack(uid, dev, gen, cursor, &token).unwrap();
                prop_assert_eq!(a.acked_sync_seq, cursor.max(acked));
                m.devices.insert((uid, dev), (gen, cursor.max(acked)));
            }
            Op::Pull(uid, conv) => {
                // Pages of 3 messages, each starting after the last seen.
                let r = h.ib().pull(uid, &[(conv, MsgSeq(0))], 3);
                let Some(c) = m.convs.get(&conv).filter(|c| c.periods.contains_key(&uid)) else {
                    prop_assert!(matches!(r, Err(Error::Forbidden(_))), "{:?}", r);
                    continue;
                };
                let want: Vec<(MsgSeq, MsgId, MessageKind, bool, Bytes)> = c
                    .msgs
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| c.covers(uid, MsgSeq(*i as u64 + 1)))
                    .map(|(i, x)| {
                        let payload = if x.tombstone {
                            Bytes::new()
                        } else {
                            x.payload.clone()
                        };
                        (MsgSeq(i as u64 + 1), x.id, x.kind, x.tombstone, payload)
                    })
                    .collect();
                let mut r = r.unwrap();
                let max_seq = r[0].max_seq;
                let mut got: Vec<_> = Vec::new();
                loop {
                    let page = &r[0];
                    got.extend(
                        page.messages
                            .iter()
                            .map(|x| (x.msg_seq, x.msg_id, x.kind, x.tombstone, x.payload.clone())),
                    );
                    let Some(last) = page.messages.last().filter(|_| page.has_more) else {
                        break;
                    };
                    reached(PULL_PAGES);
                    r = h.ib().pull(uid, &[(conv, last.msg_seq)], 3).unwrap();
                }
                prop_assert_eq!(got, want);
                prop_assert_eq!(max_seq, c.target(uid), "the head inside the periods");
            }
            Op::ConvList(uid) => {
                // Pages of one conversation, following the cursor.
                let mut page = h.ib().conv_list(uid, 1, None).unwrap();
                let mut rows = std::mem::take(&mut page.convs);
                while let Some(cursor) = page.next_cursor.clone() {
                    reached(LIST_PAGES);
                    page = h.ib().conv_list(uid, 1, Some(cursor)).unwrap();
                    rows.append(&mut page.convs);
                }
                let mut want: Vec<(MsgId, ConvId, MsgSeq, u32, MsgSeq)> = m
                    .convs
                    .iter()
                    .filter(|(_, c)| c.periods.contains_key(&uid))
                    .map(|(&conv, c)| {
                        let last = (1..=(c.msgs.len() as u64))
                            .rev()
                            .find(|s| c.covers(uid, MsgSeq(*s)))
                            .unwrap();
                        let read = m.read.get(&(uid, conv)).copied().unwrap_or(MsgSeq(0));
                        (
                            c.msgs[last as usize - 1].id,
                            conv,
                            MsgSeq(last),
                            m.unread(uid, conv),
                            read,
                        )
                    })
                    .collect();
                want.sort_unstable_by(|a, b| b.cmp(a));
                let got: Vec<_> = rows
                    .iter()
                    .map(|s| (s.last_msg_id, s.conv, s.last_msg_seq, s.unread, s.read_seq))
                    .collect();
                prop_assert_eq!(got, want);
            }
            Op::ClearDirty(uid, conv, stale) => {
                let target = m.convs.get(&conv).map(|c| c.target(uid));
                let version = target.map_or(1, |t| t.0.saturating_sub(u64::from(stale)));
                let r = h.ib().clear_dirty(uid, conv, version).wait();
                let Some(c) = m.convs.get(&conv) else {
                    prop_assert!(matches!(r, Err(Error::NotFound(_))), "{:?}", r);
                    continue;
                };
                if !c.periods.contains_key(&uid) {
                    prop_assert!(matches!(r, Err(Error::Forbidden(_))), "{:?}", r);
                } else if c.switch.is_none() {
                    prop_assert!(matches!(r, Err(Error::BadRequest(_))), "{:?}", r);
                } else if stale {
                    reached(MOVED);
                    let t = c.target(uid).0;
                    prop_assert!(
                        matches!(r, Err(Error::MarkerMoved { version }) if version == t),
                        "{:?}",
                        r
                    );
                } else {
                    let t = c.target(uid);
                    prop_assert_eq!(r.unwrap(), t);
                    let cl = m.cleared.entry((uid, conv)).or_default();
                    *cl = (*cl).max(t);
                }
            }
            Op::Restart { checkpoint } => {
                let digest = h.ib().state_digest();
                // Without checkpoints, recovery replays the whole log.
                h.restart(checkpoint, tune);
                prop_assert_eq!(
                    h.ib().state_digest(),
                    digest,
                    "restart rebuilt a different state"
                );
            }
            Op::Kill => {
                let digest = h.ib().state_digest();
                h.kill_restart(tune);
                let recovery = h.ib().recovery_report();
                if recovery.checkpoint_lsn > 0 && recovery.records_replayed > 0 {
                    reached(REPLAYS);
                }
                reached(KILLS);
                prop_assert_eq!(
                    h.ib().state_digest(),
                    digest,
                    "a kill and recovery rebuilt a different state"
                );
            }
        }
        // The state machine's own invariants hold after every step.
        if let Err(e) = h.ib().check_invariants() {
            return Err(TestCaseError::fail(format!("broken invariant: {e}")));
        }
    }
    Ok(())
}

#[test]
fn engine_agrees_with_the_reference_model_across_restarts() {
    let config = ProptestConfig {
        cases: 48,
        max_shrink_iters: 2_000,
        // Failing cases are saved next to this file and replayed first.
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    // A fixed seed: the counts checked below are those of the same cases
    // on every run. The regressions file is replayed first.
    let config_cases = config.cases;
    let rng = proptest::test_runner::TestRng::deterministic_rng(config.rng_algorithm);
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(config, rng);
    let result = runner.run(&proptest::collection::vec(op(), 1..120), run);
    if let Err(e) = result {
        panic!("{e}");
    }
    assert_every_case_reached("inbox_model", config_cases, &REACHED_NAMES, &REACHED);
}
