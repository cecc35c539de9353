//! Large groups (R7): above the member threshold a conversation writes no
//! event per member; each member's dirty marker is derived from the head
//! and cleared by a compare-and-set on the version it observed.

mod inbox_common;

use inbox_common::*;
use inbox_engine::inbox::LargeGroupHint;
use inbox_engine::*;

const CONV: ConvId = ConvId(7);
const PHONE: DeviceId = DeviceId(1);
/// Four members make the group large.
const THRESHOLD: u32 = 3;

fn harness() -> Harness {
    Harness::with(|c| c.large_group_members = THRESHOLD)
}

fn tune(c: &mut InboxConfig) {
    c.large_group_members = THRESHOLD;
}

/// Members 1..=4 join; the fourth join switches the group.
fn large_group(h: &Harness) -> MsgSeq {
    for uid in 1..=4 {
        h.join(Uid(uid), CONV);
    }
    let mode = h.ib().conv_mode(CONV, None).unwrap();
    assert!(mode.large);
    mode.switch_seq.unwrap()
}

fn marker(h: &Harness, uid: Uid) -> Option<DirtyMarker> {
    h.ib()
        .dirty_markers(uid)
        .unwrap()
        .into_iter()
        .find(|m| m.conv == CONV)
}

fn row(h: &Harness, uid: Uid) -> ConvSummary {
    let list = h.ib().conv_list(uid, 100, None).unwrap();
    list.convs.into_iter().find(|c| c.conv == CONV).unwrap()
}

fn pull(h: &Harness, uid: Uid, after: MsgSeq) -> ConvPull {
    h.ib()
        .pull(uid, &[(CONV, after)], 500)
        .unwrap()
        .pop()
        .unwrap()
}

fn events(h: &Harness, uid: Uid) -> Vec<SyncEvent> {
    let gen = h.register(uid, PHONE).device.generation;
    h.catch_up(uid, PHONE, gen, SyncSeq(0)).0
}

#[test]
fn the_join_that_crosses_the_threshold_switches_at_its_own_msg_seq() {
    let h = harness();
    for uid in 1..=3 {
        h.join(Uid(uid), CONV);
    }
    assert!(
        !h.ib().conv_mode(CONV, None).unwrap().large,
        "3 is not above 3"
    );
    let fourth = h.join(Uid(4), CONV);
    let mode = h.ib().conv_mode(CONV, None).unwrap();
    assert!(mode.large);
    assert_eq!(mode.switch_seq, Some(fourth.msg_seq));
    assert_eq!(mode.members, 4);
}

#[test]
fn a_message_in_a_large_group_writes_no_event_for_any_member() {
    let h = harness();
    let switch = large_group(&h);
    let before: Vec<usize> = (1..=4).map(|u| events(&h, Uid(u)).len()).collect();
    let sent = h.send(CONV, Uid(1), 1, "hello all");
    for uid in 1..=4 {
        let evs = events(&h, Uid(uid));
        assert_eq!(
            evs.len(),
            before[uid as usize - 1],
            "uid {uid} got an event"
        );
        assert!(evs.iter().all(|e| e.msg_seq <= switch));
    }
    // Every member, the sender too, sees the marker up to the message.
    for uid in 1..=4 {
        let m = marker(&h, Uid(uid)).expect("dirty");
        assert_eq!(m.target_msg_seq, sent.msg_seq);
        assert_eq!(m.version, sent.msg_seq.0);
    }
}

#[test]
fn a_join_in_a_large_group_writes_one_event_for_the_joiner_only() {
    let h = harness();
    large_group(&h);
    let before: Vec<usize> = (1..=4).map(|u| events(&h, Uid(u)).len()).collect();
    let joined = h.join(Uid(5), CONV);
    for uid in 1..=4 {
        assert_eq!(events(&h, Uid(uid)).len(), before[uid as usize - 1]);
    }
    let mine = events(&h, Uid(5));
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].kind, EventKind::Member);
    assert_eq!(mine[0].msg_seq, joined.msg_seq);
    assert_eq!(marker(&h, Uid(5)), None, "nothing after its own join");
}

#[test]
fn a_clear_of_the_observed_version_clears_the_marker() {
    let h = harness();
    large_group(&h);
    h.send(CONV, Uid(1), 1, "one");
    let m = marker(&h, Uid(2)).unwrap();
    let p = pull(&h, Uid(2), MsgSeq(0));
    assert_eq!(p.messages.last().unwrap().msg_seq, m.target_msg_seq);
    let cleared = h.ib().clear_dirty(Uid(2), CONV, m.version).wait().unwrap();
    assert_eq!(cleared, m.target_msg_seq);
    assert_eq!(marker(&h, Uid(2)), None);
    // Another member's marker is its own.
    assert!(marker(&h, Uid(3)).is_some());
    // Clearing again is harmless.
    let again = h.ib().clear_dirty(Uid(2), CONV, m.version).wait().unwrap();
    assert_eq!(again, m.target_msg_seq);
}

#[test]
fn a_message_between_reading_the_target_and_clearing_fails_the_clear_and_the_marker_stays() {
    let h = harness();
    large_group(&h);
    h.send(CONV, Uid(1), 1, "one");
    let observed = marker(&h, Uid(2)).unwrap();
    // The client pulls up to the target and stores it; meanwhile:
    let newer = h.send(CONV, Uid(3), 2, "two");
    let err = h
        .ib()
        .clear_dirty(Uid(2), CONV, observed.version)
        .wait()
        .unwrap_err();
    match err {
        Error::MarkerMoved { version } => assert_eq!(version, newer.msg_seq.0),
        other => panic!("expected MarkerMoved, got {other}"),
    }
    let still = marker(&h, Uid(2)).expect("the marker stays dirty");
    assert_eq!(still.target_msg_seq, newer.msg_seq);
    assert_eq!(row(&h, Uid(2)).last_msg_seq, newer.msg_seq);
    // A version beyond the target is refused, and changes nothing.
    let beyond = h.ib().clear_dirty(Uid(2), CONV, still.version + 1).wait();
    assert!(matches!(beyond, Err(Error::BadRequest(_))));
    assert_eq!(marker(&h, Uid(2)), Some(still));
}

#[test]
fn a_lost_marker_does_not_stop_opening_the_conversation_from_catching_up() {
    let h = harness();
    large_group(&h);
    let sent = h.send_many(CONV, Uid(1), 10, 5);
    let head = sent.last().unwrap().msg_seq;
    // The device never looks at its markers: it opens the conversation.
    let s = row(&h, Uid(2));
    assert_eq!(s.last_msg_seq, head);
    assert_eq!(s.last_summary, bytes::Bytes::from("m4"));
    let p = pull(&h, Uid(2), MsgSeq(0));
    assert_eq!(p.max_seq, head);
    assert_eq!(p.messages.last().unwrap().msg_seq, head);
}

#[test]
fn a_leave_concurrent_with_a_message_bounds_the_leaver_at_its_period_end() {
    let h = harness();
    large_group(&h);
    h.send(CONV, Uid(1), 1, "before");
    // Both in one round, in this order.
    let leave = h.ib().leave(Uid(2), CONV);
    let send = h.ib().send(SendRequest {
        conv: CONV,
        sender: Uid(1),
        client_msg_id: 2,
        msg_type: 1,
        payload: bytes::Bytes::from_static(b"after"),
    });
    let left = leave.wait().unwrap();
    let after = send.wait().unwrap();
    assert!(after.msg_seq > left.msg_seq);
    let p = pull(&h, Uid(2), MsgSeq(0));
    assert_eq!(
        p.max_seq, left.msg_seq,
        "the leaver's head is its period's end"
    );
    assert_eq!(p.messages.last().unwrap().msg_seq, left.msg_seq);
    assert_eq!(row(&h, Uid(2)).last_msg_seq, left.msg_seq);
    // Its own leave was fanned out to it, so nothing is dirty.
    assert_eq!(marker(&h, Uid(2)), None);
    assert_eq!(marker(&h, Uid(3)).unwrap().target_msg_seq, after.msg_seq);
}

#[test]
fn the_switch_leaves_no_gap_and_no_duplicate_in_sync_pull_and_unread() {
    let h = harness();
    for uid in 1..=3 {
        h.join(Uid(uid), CONV);
    }
    let fanned = h.send_many(CONV, Uid(1), 100, 3);
    let switch = h.join(Uid(4), CONV).msg_seq;
    let marked = h.send_many(CONV, Uid(1), 200, 4);
    let head = marked.last().unwrap().msg_seq;

    // Sync carries every entry up to the switch, once, and none above.
    let evs = events(&h, Uid(2));
    let mut seqs: Vec<MsgSeq> = evs.iter().map(|e| e.msg_seq).collect();
    let n = seqs.len();
    seqs.dedup();
    assert_eq!(seqs.len(), n, "no duplicate");
    assert_eq!(*seqs.last().unwrap(), switch);
    assert!(fanned.iter().all(|s| seqs.contains(&s.msg_seq)));
    // Pulling from the last synced entry gets exactly the rest.
    let p = pull(&h, Uid(2), switch);
    let pulled: Vec<MsgSeq> = p.messages.iter().map(|m| m.msg_seq).collect();
    let expect: Vec<MsgSeq> = marked.iter().map(|s| s.msg_seq).collect();
    assert_eq!(pulled, expect);
    assert_eq!(marker(&h, Uid(2)).unwrap().target_msg_seq, head);
    // Unread: 3 exact below the switch, 4 above, nothing counted twice.
    assert_eq!(row(&h, Uid(2)).unread, 7);
    let r = h.ib().mark_read(Uid(2), CONV, switch).wait().unwrap();
    assert_eq!(r.unread, 4);
    let r = h.ib().mark_read(Uid(2), CONV, head).wait().unwrap();
    assert_eq!(r.unread, 0);
    assert_eq!(row(&h, Uid(2)).unread, 0);
}

#[test]
fn a_group_that_shrinks_below_the_threshold_stays_large() {
    let h = harness();
    let switch = large_group(&h);
    h.ib().leave(Uid(4), CONV).wait().unwrap();
    h.ib().leave(Uid(3), CONV).wait().unwrap();
    let mode = h.ib().conv_mode(CONV, None).unwrap();
    assert!(mode.large);
    assert_eq!(mode.switch_seq, Some(switch));
    assert_eq!(mode.members, 2);
}

#[test]
fn mode_markers_and_clears_survive_a_restart_with_and_without_checkpoints() {
    for keep in [true, false] {
        let mut h = harness();
        let switch = large_group(&h);
        h.send(CONV, Uid(1), 1, "one");
        let m = marker(&h, Uid(2)).unwrap();
        h.ib().clear_dirty(Uid(2), CONV, m.version).wait().unwrap();
        h.send(CONV, Uid(1), 2, "two");
        let before = (
            h.ib().conv_mode(CONV, Some(Uid(2))).unwrap(),
            h.ib().dirty_markers(Uid(2)).unwrap(),
            h.ib().dirty_markers(Uid(3)).unwrap(),
            row(&h, Uid(3)),
        );
        h.restart(keep, tune);
        let after = (
            h.ib().conv_mode(CONV, Some(Uid(2))).unwrap(),
            h.ib().dirty_markers(Uid(2)).unwrap(),
            h.ib().dirty_markers(Uid(3)).unwrap(),
            row(&h, Uid(3)),
        );
        assert_eq!(before, after, "keep checkpoints: {keep}");
        assert_eq!(after.0.switch_seq, Some(switch));
    }
}

#[test]
fn a_kill_right_after_the_switching_join_recovers_one_mode() {
    let mut h = harness();
    for uid in 1..=3 {
        h.join(Uid(uid), CONV);
    }
    let fourth = h.join(Uid(4), CONV);
    h.kill_restart(tune);
    let mode = h.ib().conv_mode(CONV, None).unwrap();
    // The join and the switch are one batch: the join is durable (it was
    // answered), so the switch is too.
    assert!(mode.large);
    assert_eq!(mode.switch_seq, Some(fourth.msg_seq));
    assert_eq!(mode.head, fourth.msg_seq);
}

#[test]
fn a_clear_outside_a_large_group_is_refused() {
    let h = harness();
    h.join(Uid(1), CONV);
    let r = h.ib().clear_dirty(Uid(1), CONV, 1).wait();
    assert!(matches!(r, Err(Error::BadRequest(_))));
    let r = h.ib().clear_dirty(Uid(9), CONV, 1).wait();
    assert!(matches!(r, Err(Error::Forbidden(_))));
}

#[test]
fn a_snapshot_of_a_member_carries_the_large_groups_head_and_the_marker_stays() {
    let h = harness();
    large_group(&h);
    let sent = h.send(CONV, Uid(1), 1, "after the switch");
    h.register(Uid(2), PHONE);
    let info = h.ib().begin_snapshot(Uid(2), PHONE).wait().unwrap();
    let page = h.ib().snapshot_page(Uid(2), info.snapshot_id, 0).unwrap();
    let s = page.convs.iter().find(|c| c.conv == CONV).unwrap();
    assert_eq!(s.last_msg_seq, sent.msg_seq);
    assert_eq!(s.last_summary, bytes::Bytes::from("after the switch"));
    assert!(page
        .messages
        .iter()
        .any(|m| m.conv == CONV && m.msg_seq == sent.msg_seq));
    assert_eq!(marker(&h, Uid(2)).unwrap().target_msg_seq, sent.msg_seq);
}

#[test]
fn a_message_in_a_large_group_hints_its_head_and_members_markers_match_dirty() {
    let h = harness();
    h.join(Uid(9), ConvId(8));
    large_group(&h);
    let mut hints = h.ib().subscribe_large_group_hints();
    // A message elsewhere is no large-group hint.
    h.send(ConvId(8), Uid(9), 1, "small");
    let sent = h.send(CONV, Uid(1), 2, "one");
    let got = hints
        .try_recv()
        .expect("a hint after the large group's round");
    assert_eq!(
        got,
        vec![LargeGroupHint {
            conv: CONV,
            head: sent.msg_seq
        }]
    );
    assert!(
        hints.try_recv().is_err(),
        "one hint, for the large group only"
    );

    // Each member's marker is what DIRTY lists; uid 9 is no member.
    let uids = [Uid(1), Uid(2), Uid(3), Uid(4), Uid(9)];
    let among = h.ib().dirty_markers_among(CONV, &uids);
    let want: Vec<(Uid, DirtyMarker)> = uids
        .iter()
        .filter_map(|&uid| marker(&h, uid).map(|m| (uid, m)))
        .collect();
    assert_eq!(among, want);
    assert!(
        among
            .iter()
            .any(|(uid, m)| *uid == Uid(2) && m.target_msg_seq == sent.msg_seq),
        "{among:?}"
    );
    // Once cleared, a member drops out.
    h.ib()
        .clear_dirty(Uid(2), CONV, sent.msg_seq.0)
        .wait()
        .unwrap();
    let after = h.ib().dirty_markers_among(CONV, &uids);
    assert!(after.iter().all(|(uid, _)| *uid != Uid(2)), "{after:?}");
    assert!(after.iter().any(|(uid, _)| *uid == Uid(3)), "{after:?}");
}
