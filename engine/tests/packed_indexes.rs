//! The packed indexes, through the engine:
//! - a user's event index packs each location to 4 bytes while the user's
//!   events lie within 31 `evt` segments, 5 within 8,191
//!   (`state/event_locs.rs`). With segments small enough that a few
//!   thousand sends span many of them, the lists widen, every event syncs
//!   back in order through restarts from a checkpoint, a kill and a full
//!   replay, and a list whose old front is trimmed away packs narrow again;
//! - a conversation's tail packs its entries to 10 bytes for up to four
//!   senders (`state/chunked.rs`): a fifth turns it to 26 bytes, and the
//!   history reads back the same either way and through restarts.

mod inbox_common;

use inbox_common::*;
use inbox_engine::*;

const QUIET_CONV: ConvId = ConvId(1);
const BUSY_CONV: ConvId = ConvId(2);
const QUIET: Uid = Uid(1);
const BUSY: Uid = Uid(2);
const PEER: Uid = Uid(3);
const USERS: [Uid; 3] = [QUIET, BUSY, PEER];

fn small_segments(c: &mut InboxConfig) {
    c.segment_bytes = 4096;
    c.safety_window = std::time::Duration::ZERO;
}

type Event = (SyncSeq, EventKind, ConvId, MsgSeq, MsgId);

/// The retained events of `uid` after `from`, as its first device reads
/// them (reading acknowledges nothing).
fn events_after(h: &Harness, uid: Uid, from: SyncSeq) -> Vec<Event> {
    let gen = h.register(uid, DeviceId(1)).device.generation;
    let mut out = Vec::new();
    let mut token = None;
    let mut cursor = from;
    loop {
        let page = h
            .sync(uid, DeviceId(1), Some(gen), cursor, 100, token.clone())
            .unwrap();
        out.extend(
            page.events
                .iter()
                .map(|e| (e.sync_seq, e.kind, e.conv, e.msg_seq, e.msg_id)),
        );
        cursor = page.next_cursor;
        token = Some(page.batch_token.clone());
        if !page.has_more {
            return out;
        }
    }
}

fn events(h: &Harness, uid: Uid) -> Vec<Event> {
    events_after(h, uid, SyncSeq(0))
}

fn event_index_bytes(h: &Harness) -> u64 {
    h.ib().memory().get("event_index").unwrap().live
}

#[test]
fn events_spread_over_many_segments_widen_the_list_and_sync_back_in_order_through_restarts() {
    let mut h = Harness::with(small_segments);
    h.join(QUIET, QUIET_CONV);
    h.join(PEER, QUIET_CONV);
    h.join(BUSY, BUSY_CONV);
    h.join(PEER, BUSY_CONV);
    h.send(QUIET_CONV, PEER, 1, "before the traffic");
    for round in 0..6u128 {
        h.send_many(BUSY_CONV, PEER, 1_000 + round * 500, 500);
    }
    h.send(QUIET_CONV, PEER, 2, "after the traffic");
    let segments = h.evt_segment_files();
    assert!(
        segments > 40,
        "the traffic spans more than 31 segments: {segments}"
    );

    let before: Vec<_> = USERS.iter().map(|&u| events(&h, u)).collect();
    // Each user's events span the traffic, so each list is 5 bytes an
    // event after its 5-byte header.
    let widened: u64 = before.iter().map(|e| 5 + 5 * e.len() as u64).sum();
    assert_eq!(event_index_bytes(&h), widened, "every list at 5 bytes");
    let quiet = &before[0];
    assert_eq!(
        quiet.iter().filter(|e| e.1 == EventKind::Msg).count(),
        2,
        "{quiet:?}"
    );

    h.ib().checkpoint().unwrap();
    h.restart(true, small_segments);
    let from_checkpoint: Vec<_> = USERS.iter().map(|&u| events(&h, u)).collect();
    assert_eq!(from_checkpoint, before, "from the checkpoint");
    assert_eq!(event_index_bytes(&h), widened, "from the checkpoint");
    h.kill_restart(small_segments);
    let after_kill: Vec<_> = USERS.iter().map(|&u| events(&h, u)).collect();
    assert_eq!(after_kill, before, "after a kill");
    h.restart(false, small_segments);
    let replayed: Vec<_> = USERS.iter().map(|&u| events(&h, u)).collect();
    assert_eq!(replayed, before, "after a full replay");
    assert_eq!(event_index_bytes(&h), widened, "after a full replay");

    // BUSY's device takes everything; a trim drops its list's old front.
    // Its new events then lie in the newest segments: 4 bytes again.
    let gen = h.register(BUSY, DeviceId(1)).device.generation;
    let (_, _, acked) = h.catch_up(BUSY, DeviceId(1), gen, SyncSeq(0));
    h.ib().compact().unwrap();
    h.send_many(BUSY_CONV, PEER, 9_000, 20);
    let busy = events_after(&h, BUSY, acked);
    assert_eq!(busy.len(), 20, "only the new events are retained");
    let others: u64 = [&before[0], &before[2]]
        .iter()
        .map(|e| 5 + 5 * e.len() as u64)
        .sum();
    // PEER's list keeps its span; it also got the 20 new events.
    assert_eq!(
        event_index_bytes(&h),
        others + 5 * 20 + (5 + 4 * 20),
        "the trimmed list packs at 4 bytes"
    );
    assert!(busy
        .iter()
        .all(|e| e.1 == EventKind::Msg && e.2 == BUSY_CONV));
    assert!(busy.windows(2).all(|w| w[1].0 == w[0].0.next()));
}

#[test]
fn a_fifth_sender_turns_the_tail_to_full_width_and_the_history_reads_back_the_same() {
    const GROUP: ConvId = ConvId(7);
    let mut h = Harness::new();
    let members: Vec<Uid> = (10..16).map(Uid).collect();
    for &uid in &members {
        h.join(uid, GROUP);
    }
    let tail_bytes = |h: &Harness| h.ib().memory().get("message_metadata").unwrap().live;
    // Six joins, each its member's own entry: the fifth joiner is a fifth
    // sender, so the tail already holds every entry at 26 bytes.
    assert_eq!(tail_bytes(&h), 45 + 6 * 26);
    for (i, &uid) in members.iter().enumerate() {
        h.send(GROUP, uid, 100 + i as u128, &format!("from {uid}"));
    }
    assert_eq!(tail_bytes(&h), 45 + 12 * 26);
    let before = h.whole_history(members[0], GROUP);
    assert_eq!(before.len(), 12);
    h.ib().checkpoint().unwrap();
    h.restart(true, |_| {});
    assert_eq!(
        h.whole_history(members[0], GROUP),
        before,
        "from the checkpoint"
    );
    h.restart(false, |_| {});
    assert_eq!(
        h.whole_history(members[0], GROUP),
        before,
        "after a full replay"
    );
    assert_eq!(tail_bytes(&h), 45 + 12 * 26);

    // Four senders pack: a one-to-one conversation and a group of four.
    const SMALL: ConvId = ConvId(8);
    for &uid in &members[..4] {
        h.join(uid, SMALL);
    }
    for (i, &uid) in members[..4].iter().enumerate() {
        h.send(SMALL, uid, 200 + i as u128, "hi");
    }
    assert_eq!(tail_bytes(&h), 45 + 12 * 26 + 45 + 8 * 10);
}
