//! Scenario tests of the inbox semantics (R1–R17): each pins one behaviour
//! a backend relies on.

mod inbox_common;

use std::time::Duration;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::*;

const PHONE: DeviceId = DeviceId(1);
const DESKTOP: DeviceId = DeviceId(2);
const WEB: DeviceId = DeviceId(3);

fn msg_seqs(events: &[SyncEvent]) -> Vec<MsgSeq> {
    events
        .iter()
        .filter(|e| e.kind == EventKind::Msg)
        .map(|e| e.msg_seq)
        .collect()
}

#[test]
fn phone_offline_three_minutes_gets_all_twelve_messages_in_order_once() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    let (_, gen, acked) = h.catch_up(Uid(2), PHONE, gen, SyncSeq(0));
    // Offline for three minutes while twelve messages arrive.
    for i in 0..12 {
        h.advance(Duration::from_secs(15));
        h.send(ConvId(10), Uid(1), 100 + i, &format!("msg {i}"));
    }
    let (events, _, acked2) = h.catch_up(Uid(2), PHONE, gen, acked);
    let seqs = msg_seqs(&events);
    assert_eq!(seqs.len(), 12, "all twelve arrive");
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "in order, none twice: {seqs:?}"
    );
    let sync_seqs: Vec<_> = events.iter().map(|e| e.sync_seq).collect();
    assert_eq!(
        sync_seqs,
        acked.next().through(acked2).collect::<Vec<_>>(),
        "contiguous sync_seq"
    );
    // Syncing again after the ACK serves nothing twice.
    let again = h.sync(Uid(2), PHONE, Some(gen), acked2, 100, None).unwrap();
    assert!(again.events.is_empty());
    assert!(!again.has_more);
}

#[test]
fn phone_desktop_and_web_catch_up_independently_and_one_ack_never_moves_another() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gp = h.register(Uid(2), PHONE).device.generation;
    let gd = h.register(Uid(2), DESKTOP).device.generation;
    let gw = h.register(Uid(2), WEB).device.generation;
    h.send_many(ConvId(10), Uid(1), 1000, 30);
    let (phone_events, _, phone_ack) = h.catch_up(Uid(2), PHONE, gp, SyncSeq(0));
    let devices = h.ib().devices(Uid(2)).unwrap();
    let ack_of = |d: DeviceId| {
        devices
            .iter()
            .find(|x| x.device == d)
            .unwrap()
            .acked_sync_seq
    };
    assert_eq!(ack_of(PHONE), phone_ack);
    assert_eq!(
        ack_of(DESKTOP),
        SyncSeq(0),
        "the phone's ACK does not move the desktop"
    );
    assert_eq!(ack_of(WEB), SyncSeq(0));
    // Desktop reads a first page only and ACKs part of it.
    let page = h
        .sync(Uid(2), DESKTOP, Some(gd), SyncSeq(0), 10, None)
        .unwrap();
    h.ack(Uid(2), DESKTOP, gd, page.next_cursor, &page.batch_token)
        .unwrap();
    h.send_many(ConvId(10), Uid(1), 2000, 5);
    let (web_events, _, web_ack) = h.catch_up(Uid(2), WEB, gw, SyncSeq(0));
    assert_eq!(web_events.len(), phone_events.len() + 5);
    let (desk_events, _, desk_ack) = h.catch_up(Uid(2), DESKTOP, gd, SyncSeq(10));
    assert_eq!(desk_events.first().unwrap().sync_seq, SyncSeq(11));
    assert_eq!(desk_ack, web_ack);
    let devices = h.ib().devices(Uid(2)).unwrap();
    assert_eq!(
        devices
            .iter()
            .find(|x| x.device == PHONE)
            .unwrap()
            .acked_sync_seq,
        phone_ack
    );
}

#[test]
fn acks_arriving_out_of_order_never_move_a_cursor_back() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    // 9014 events for uid 2: the join plus 9013 messages.
    h.send_many(ConvId(10), Uid(1), 0, 9013);
    let page = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 500, None)
        .unwrap();
    assert_eq!(page.batch_hwm, SyncSeq(9014));
    let t = page.batch_token;
    assert_eq!(
        h.ack(Uid(2), PHONE, gen, SyncSeq(9014), &t)
            .unwrap()
            .acked_sync_seq,
        SyncSeq(9014)
    );
    assert_eq!(
        h.ack(Uid(2), PHONE, gen, SyncSeq(9008), &t)
            .unwrap()
            .acked_sync_seq,
        SyncSeq(9014),
        "older ACK is a no-op"
    );
    let d = h.ib().devices(Uid(2)).unwrap()[0];
    assert_eq!(d.acked_sync_seq, SyncSeq(9014));
    // And never beyond the batch hwm.
    h.send(ConvId(10), Uid(1), 99_999, "late");
    assert!(matches!(
        h.ack(Uid(2), PHONE, gen, SyncSeq(9015), &t),
        Err(Error::AckBeyondHwm {
            seq: SyncSeq(9015),
            batch_hwm: SyncSeq(9014)
        })
    ));
}

#[test]
fn pulling_is_not_acking_a_crash_mid_page_reserves_the_same_page() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    h.send_many(ConvId(10), Uid(1), 0, 250);
    let first = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 100, None)
        .unwrap();
    let second = h
        .sync(
            Uid(2),
            PHONE,
            Some(gen),
            first.next_cursor,
            100,
            Some(first.batch_token.clone()),
        )
        .unwrap();
    // The app crashes while applying the second page: nothing was ACKed
    // and its local position is still 0. It gets the same first page.
    let again = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 100, None)
        .unwrap();
    assert_eq!(again.events, first.events);
    assert_eq!(again.acked_sync_seq, SyncSeq(0));
    // After ACKing the first page only, the same second page comes back.
    h.ack(Uid(2), PHONE, gen, first.next_cursor, &first.batch_token)
        .unwrap();
    let resumed = h
        .sync(Uid(2), PHONE, Some(gen), first.next_cursor, 100, None)
        .unwrap();
    assert_eq!(resumed.events, second.events);
}

#[test]
fn late_ack_from_an_old_generation_is_refused_after_a_reset() {
    let h = Harness::with(|c| c.recovery_lease_events_max = 5);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    h.send_many(ConvId(10), Uid(1), 0, 40);
    let old = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 100, None)
        .unwrap();
    h.ack(Uid(2), PHONE, gen, SyncSeq(20), &old.batch_token)
        .unwrap();
    // The app is reinstalled: no generation, nothing local. The gap (20)
    // is above the lease limit (5): RESET_REQUIRED with a new generation.
    let err = h
        .sync(Uid(2), PHONE, None, SyncSeq(0), 100, None)
        .unwrap_err();
    let Error::ResetRequired { generation } = err else {
        panic!("expected ResetRequired, got {err:?}")
    };
    assert_eq!(generation, gen.next());
    // The old install's late ACK dies.
    assert!(matches!(
        h.ack(Uid(2), PHONE, gen, SyncSeq(40), &old.batch_token),
        Err(Error::StaleGeneration { current }) if current == gen.next()
    ));
    // ...and even with the new generation a resetting device cannot ACK.
    assert!(matches!(
        h.ack(Uid(2), PHONE, gen.next(), SyncSeq(40), &old.batch_token),
        Err(Error::DeviceResetting)
    ));
    let d = h.ib().devices(Uid(2)).unwrap()[0];
    assert_eq!(d.acked_sync_seq, SyncSeq(20));
    assert_eq!(d.state, DeviceState::Resetting);
}

#[test]
fn local_rollback_below_the_ack_gets_a_recovery_lease_finished_by_its_own_cas() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    h.send_many(ConvId(10), Uid(1), 0, 30);
    let (_, _, acked) = h.catch_up(Uid(2), PHONE, gen, SyncSeq(0));
    assert_eq!(acked, SyncSeq(31));
    // The phone restored a backup at 25: below the server ACK.
    let page = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(25), 100, None)
        .unwrap();
    let lease = page.lease.expect("a recovery lease");
    assert_eq!(page.generation, gen.next());
    assert_eq!((lease.resume_from, lease.hwm), (SyncSeq(25), SyncSeq(31)));
    assert_eq!(
        page.events.iter().map(|e| e.sync_seq).collect::<Vec<_>>(),
        SyncSeq(26).through(SyncSeq(31)).collect::<Vec<_>>()
    );
    assert_eq!(
        h.ib().devices(Uid(2)).unwrap()[0].state,
        DeviceState::Recovering
    );
    // New messages during the lease do not move its frozen hwm.
    h.send(ConvId(10), Uid(1), 500, "during lease");
    let again = h
        .sync(Uid(2), PHONE, Some(gen.next()), SyncSeq(25), 100, None)
        .unwrap();
    assert_eq!(again.batch_hwm, SyncSeq(31));
    // The CAS needs the right lease id and generation.
    assert!(matches!(
        h.ib()
            .finish_lease(Uid(2), PHONE, lease.lease_id + 1, gen.next())
            .wait(),
        Err(Error::Conflict(_))
    ));
    assert!(matches!(
        h.ib()
            .finish_lease(Uid(2), PHONE, lease.lease_id, gen)
            .wait(),
        Err(Error::StaleGeneration { .. })
    ));
    let d = h
        .ib()
        .finish_lease(Uid(2), PHONE, lease.lease_id, gen.next())
        .wait()
        .unwrap();
    assert_eq!(d.state, DeviceState::Active);
    let (events, _, _) = h.catch_up(Uid(2), PHONE, gen.next(), SyncSeq(31));
    assert_eq!(msg_seqs(&events), vec![MsgSeq(33)]);
}

#[test]
fn an_expired_recovery_lease_sends_the_device_to_reset() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    h.send_many(ConvId(10), Uid(1), 0, 10);
    let (_, _, _) = h.catch_up(Uid(2), PHONE, gen, SyncSeq(0));
    let page = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(5), 100, None)
        .unwrap();
    assert!(page.lease.is_some());
    h.advance(Duration::from_secs(3600));
    assert!(matches!(
        h.sync(
            Uid(2),
            PHONE,
            Some(gen.next()),
            SyncSeq(5),
            100,
            Some(page.batch_token.clone())
        ),
        Err(Error::BadToken)
    ));
    assert!(matches!(
        h.sync(Uid(2), PHONE, Some(gen.next()), SyncSeq(5), 100, None),
        Err(Error::ResetRequired { generation }) if generation == gen.plus(2)
    ));
}

#[test]
fn same_client_msg_id_retried_concurrently_yields_exactly_one_message() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let replies: Vec<SendReply> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    h.ib()
                        .send(SendRequest {
                            conv: ConvId(10),
                            sender: Uid(1),
                            client_msg_id: 777,
                            msg_type: 1,
                            payload: Bytes::from_static(b"once"),
                        })
                        .wait()
                        .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(replies
        .iter()
        .all(|r| r.msg_id == replies[0].msg_id && r.msg_seq == replies[0].msg_seq));
    assert_eq!(replies.iter().filter(|r| !r.duplicate).count(), 1);
    let pulled = h.ib().pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 50).unwrap();
    let normal: Vec<_> = pulled[0]
        .messages
        .iter()
        .filter(|m| m.kind == MessageKind::Normal)
        .collect();
    assert_eq!(normal.len(), 1);
    // Reusing the key in another conversation is a conflict, not a send.
    h.join(Uid(1), ConvId(11));
    assert!(matches!(
        h.ib()
            .send(SendRequest {
                conv: ConvId(11),
                sender: Uid(1),
                client_msg_id: 777,
                msg_type: 1,
                payload: Bytes::new()
            })
            .wait(),
        Err(Error::Conflict(_))
    ));
}

#[test]
fn concurrent_senders_to_one_conversation_get_distinct_ordered_seqs() {
    let h = Harness::new();
    for uid in 1..=4 {
        h.join(Uid(uid), ConvId(10));
    }
    let mut seqs: Vec<MsgSeq> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..=4u64)
            .map(|uid| {
                let h = &h;
                s.spawn(move || h.send_many(ConvId(10), Uid(uid), u128::from(uid) << 32, 50))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .map(|r| r.msg_seq)
            .collect()
    });
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        MsgSeq(5).through(MsgSeq(204)).collect::<Vec<_>>(),
        "no gaps, no duplicates"
    );
}

#[test]
fn recall_seen_before_the_original_never_shows_the_original() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    let original = h.send(ConvId(10), Uid(1), 1, "secret body");
    let recall = h
        .ib()
        .recall(RecallRequest {
            conv: ConvId(10),
            sender: Uid(1),
            client_msg_id: 2,
            target: original.msg_id,
        })
        .wait()
        .unwrap();
    assert_eq!(
        recall.msg_seq,
        original.msg_seq.next(),
        "a recall has its own msg_seq"
    );
    // The device syncs: the original's event carries no body summary.
    let (events, _, _) = h.catch_up(Uid(2), PHONE, gen, SyncSeq(0));
    let orig_ev = events.iter().find(|e| e.msg_id == original.msg_id).unwrap();
    assert!(orig_ev.summary.is_empty());
    let recall_ev = events.iter().find(|e| e.kind == EventKind::Recall).unwrap();
    assert_eq!(&recall_ev.summary[..], &original.msg_id.get().to_le_bytes());
    // Pull, history and the conversation list never show the body.
    for m in &h.ib().pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 50).unwrap()[0].messages {
        assert!(!m.payload.windows(6).any(|w| w == b"secret"), "{m:?}");
    }
    let hist = h.ib().history(Uid(2), ConvId(10), None, 50).unwrap();
    let tomb = hist
        .messages
        .iter()
        .find(|m| m.msg_id == original.msg_id)
        .unwrap();
    assert!(tomb.tombstone && tomb.payload.is_empty());
    let recall_msg = hist
        .messages
        .iter()
        .find(|m| m.kind == MessageKind::Recall)
        .unwrap();
    assert_eq!(recall_msg.target, Some(original.msg_id));
    let list = h.ib().conv_list(Uid(2), 10, None).unwrap();
    assert_eq!(
        list.convs[0].unread, 0,
        "a recalled message is no longer unread"
    );
    // A second recall is refused, and only the sender may recall.
    let again = h.ib().recall(RecallRequest {
        conv: ConvId(10),
        sender: Uid(1),
        client_msg_id: 3,
        target: original.msg_id,
    });
    assert!(matches!(again.wait(), Err(Error::Conflict(_))));
    let other = h.send(ConvId(10), Uid(1), 4, "x");
    let by_other = h.ib().recall(RecallRequest {
        conv: ConvId(10),
        sender: Uid(2),
        client_msg_id: 5,
        target: other.msg_id,
    });
    assert!(matches!(by_other.wait(), Err(Error::Forbidden(_))));
}

#[test]
fn an_edit_serves_the_new_body_and_tombstones_the_old_one() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let original = h.send(ConvId(10), Uid(1), 1, "typo");
    let edit = h
        .ib()
        .edit(EditRequest {
            conv: ConvId(10),
            sender: Uid(1),
            client_msg_id: 2,
            target: original.msg_id,
            payload: Bytes::from_static(b"fixed"),
        })
        .wait()
        .unwrap();
    let msgs = &h.ib().pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 50).unwrap()[0].messages;
    let old = msgs.iter().find(|m| m.msg_id == original.msg_id).unwrap();
    assert!(old.tombstone && old.payload.is_empty());
    let new = msgs.iter().find(|m| m.msg_id == edit.msg_id).unwrap();
    assert_eq!(
        (new.kind, &new.payload[..], new.target),
        (MessageKind::Edit, &b"fixed"[..], Some(original.msg_id))
    );
    // The edit does not count as a second unread message.
    assert_eq!(
        h.ib().conv_list(Uid(2), 10, None).unwrap().convs[0].unread,
        1
    );
}

#[test]
fn mark_read_racing_a_new_message_leaves_the_new_message_unread() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    let seen = h
        .send_many(ConvId(10), Uid(1), 0, 3)
        .last()
        .unwrap()
        .msg_seq;
    // The reader marks up to what it saw while a new message lands.
    let racing = h.ib().send(SendRequest {
        conv: ConvId(10),
        sender: Uid(1),
        client_msg_id: 99,
        msg_type: 1,
        payload: Bytes::from_static(b"new"),
    });
    let read = h.ib().mark_read(Uid(2), ConvId(10), seen).wait().unwrap();
    racing.wait().unwrap();
    assert_eq!(read.read_seq, seen);
    let conv = &h.ib().conv_list(Uid(2), 10, None).unwrap().convs[0];
    assert_eq!(
        (conv.read_seq, conv.unread),
        (seen, 1),
        "the racing message stays unread"
    );
    // Read only moves forward; max across devices wins.
    let back = h
        .ib()
        .mark_read(Uid(2), ConvId(10), MsgSeq(1))
        .wait()
        .unwrap();
    assert_eq!((back.read_seq, back.unread), (seen, 1));
    // The user's other devices learn it through a read event.
    let (events, _, _) = h.catch_up(Uid(2), PHONE, gen, SyncSeq(0));
    let read_ev = events.iter().find(|e| e.kind == EventKind::Read).unwrap();
    assert_eq!((read_ev.conv, read_ev.msg_seq), (ConvId(10), seen));
    // Own messages never count as unread.
    assert_eq!(
        h.ib().conv_list(Uid(1), 10, None).unwrap().convs[0].unread,
        0
    );
}

#[test]
fn leave_then_late_fanout_delivers_only_messages_before_the_leave_and_rejoin_gets_nothing_from_the_gap(
) {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    let before = h.send(ConvId(10), Uid(1), 1, "before leave");
    let left = h.ib().leave(Uid(2), ConvId(10)).wait().unwrap();
    let gap = h.send(ConvId(10), Uid(1), 2, "in the gap");
    assert!(matches!(
        h.ib()
            .send(SendRequest {
                conv: ConvId(10),
                sender: Uid(2),
                client_msg_id: 9,
                msg_type: 1,
                payload: Bytes::new()
            })
            .wait(),
        Err(Error::Forbidden(_))
    ));
    // Left but not yet back: the device still gets what was sent before.
    let (events, gen2, acked) = h.catch_up(Uid(2), PHONE, gen, SyncSeq(0));
    assert_eq!(msg_seqs(&events), vec![before.msg_seq]);
    assert!(events
        .iter()
        .any(|e| e.kind == EventKind::Member && e.msg_seq == left.msg_seq));
    let pulled = &h.ib().pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 50).unwrap()[0];
    assert!(pulled.messages.iter().all(|m| m.msg_seq <= left.msg_seq));
    assert!(pulled.messages.iter().any(|m| m.msg_id == before.msg_id));
    // The head inside the leaver's periods is its leave, not the gap (R7:
    // pull shows the authoritative head a member may read up to).
    assert_eq!(pulled.max_seq, left.msg_seq);
    assert!(gap.msg_seq > left.msg_seq);
    let rejoin = h.join(Uid(2), ConvId(10));
    assert_eq!(rejoin.period_id, 1, "a re-join is a new period");
    let after = h.send(ConvId(10), Uid(1), 3, "after rejoin");
    let (events, _, _) = h.catch_up(Uid(2), PHONE, gen2, acked);
    assert_eq!(msg_seqs(&events), vec![after.msg_seq]);
    let all: Vec<MsgSeq> = h.ib().pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 50).unwrap()[0]
        .messages
        .iter()
        .map(|m| m.msg_seq)
        .collect();
    assert!(!all.contains(&gap.msg_seq), "nothing from the gap: {all:?}");
    let hist: Vec<MsgSeq> = h
        .ib()
        .history(Uid(2), ConvId(10), None, 50)
        .unwrap()
        .messages
        .iter()
        .map(|m| m.msg_seq)
        .collect();
    assert!(!hist.contains(&gap.msg_seq));
    assert_eq!(hist, {
        let mut v = all.clone();
        v.reverse();
        v
    });
    // Never a member: forbidden.
    assert!(matches!(
        h.ib().pull(Uid(3), &[(ConvId(10), MsgSeq(0))], 50),
        Err(Error::Forbidden(_))
    ));
    assert!(matches!(
        h.ib().history(Uid(3), ConvId(10), None, 5),
        Err(Error::Forbidden(_))
    ));
}

#[test]
fn user_back_after_five_days_gets_first_page_per_conv_with_has_more_and_complete_one_to_one_chats()
{
    let h = Harness::new();
    let me = 1;
    // A 200-strong group (a few members are enough to fan out) and eight
    // one-to-one chats.
    h.join(Uid(me), ConvId(100));
    h.join(Uid(2), ConvId(100));
    for peer in 0..8u64 {
        h.join(Uid(me), ConvId(200 + peer));
        h.join(Uid(300 + peer), ConvId(200 + peer));
    }
    let pending: Vec<_> = (0..32_000u64)
        .map(|i| {
            if i % 4_000 == 0 {
                h.advance(Duration::from_secs(3600 * 15));
            }
            h.ib().send(SendRequest {
                conv: ConvId(100),
                sender: Uid(2),
                client_msg_id: u128::from(i),
                msg_type: 1,
                payload: Bytes::from_static(b"group chatter"),
            })
        })
        .chain((0..800u64).map(|i| {
            let peer = i % 8;
            h.ib().send(SendRequest {
                conv: ConvId(200 + peer),
                sender: Uid(300 + peer),
                client_msg_id: u128::from(i),
                msg_type: 1,
                payload: Bytes::from(format!("dm {i}")),
            })
        }))
        .collect();
    for p in pending {
        p.wait().unwrap();
    }
    let list = h.ib().conv_list(Uid(me), 50, None).unwrap();
    assert_eq!(list.convs.len(), 9);
    let cursors: Vec<(ConvId, MsgSeq)> = list.convs.iter().map(|c| (c.conv, c.read_seq)).collect();
    let first = h.ib().pull(Uid(me), &cursors, 200).unwrap();
    for cp in &first {
        if cp.conv == ConvId(100) {
            assert!(cp.has_more, "the hot group has more");
            assert_eq!(cp.messages.len(), 200);
            assert_eq!(cp.max_seq, MsgSeq(2 + 32_000));
        } else {
            // Two joins then 100 messages: all there on the first screen.
            assert!(!cp.has_more, "one-to-one chat {} is complete", cp.conv);
            assert_eq!(cp.messages.len(), 102);
            assert_eq!(
                cp.messages
                    .iter()
                    .filter(|m| m.kind == MessageKind::Normal)
                    .count(),
                100
            );
        }
    }
    let group = list.convs.iter().find(|c| c.conv == ConvId(100)).unwrap();
    assert_eq!(group.unread, 32_000);
}

#[test]
fn conv_list_is_ordered_by_last_activity_and_pages_with_its_cursor() {
    let h = Harness::new();
    for conv in 1..=5 {
        h.join(Uid(1), ConvId(conv));
        h.join(Uid(2), ConvId(conv));
    }
    for conv in [3, 1, 5, 2, 4] {
        h.advance(Duration::from_secs(1));
        h.send(ConvId(conv), Uid(2), u128::from(conv), "hi");
    }
    h.ib()
        .set_conv_flags(
            Uid(1),
            ConvId(5),
            ConvFlags {
                muted: true,
                pinned: true,
            },
        )
        .wait()
        .unwrap();
    let p1 = h.ib().conv_list(Uid(1), 2, None).unwrap();
    assert_eq!(
        p1.convs.iter().map(|c| c.conv).collect::<Vec<_>>(),
        vec![ConvId(4), ConvId(2)]
    );
    let p2 = h.ib().conv_list(Uid(1), 2, p1.next_cursor.clone()).unwrap();
    assert_eq!(
        p2.convs.iter().map(|c| c.conv).collect::<Vec<_>>(),
        vec![ConvId(5), ConvId(1)]
    );
    assert!(p2.convs[0].muted && p2.convs[0].pinned);
    let p3 = h.ib().conv_list(Uid(1), 2, p2.next_cursor.clone()).unwrap();
    assert_eq!(
        p3.convs.iter().map(|c| c.conv).collect::<Vec<_>>(),
        vec![ConvId(3)]
    );
    assert!(p3.next_cursor.is_none());
    assert_eq!(p3.convs[0].last_summary, Bytes::from_static(b"hi"));
    assert!(matches!(
        h.ib()
            .conv_list(Uid(1), 2, Some(Bytes::from_static(b"junk"))),
        Err(Error::BadRequest(_))
    ));
    assert!(matches!(
        h.ib().conv_list(Uid(1), 501, None),
        Err(Error::BadRequest(_))
    ));
    assert_eq!(
        h.ib().conv_list(Uid(1), 0, None).unwrap().convs.len(),
        5,
        "0 = the default"
    );
}

#[test]
fn device_cap_evicts_the_least_recently_seen_which_then_gets_device_revoked() {
    let h = Harness::new();
    for d in 1..=5 {
        h.advance(Duration::from_secs(10));
        h.register(Uid(7), DeviceId(d));
    }
    // Device 1 is seen again, so device 2 is now the least recently seen.
    h.advance(Duration::from_secs(10));
    h.sync(
        Uid(7),
        DeviceId(1),
        Some(Generation(1)),
        SyncSeq(0),
        10,
        None,
    )
    .unwrap();
    h.advance(Duration::from_secs(10));
    let reply = h.register(Uid(7), DeviceId(6));
    assert_eq!(reply.evicted, Some(DeviceId(2)));
    assert!(matches!(
        h.sync(
            Uid(7),
            DeviceId(2),
            Some(Generation(1)),
            SyncSeq(0),
            10,
            None
        ),
        Err(Error::DeviceRevoked)
    ));
    let live = h
        .ib()
        .devices(Uid(7))
        .unwrap()
        .iter()
        .filter(|d| d.state != DeviceState::Revoked)
        .count();
    assert_eq!(live, 5);
    let revoked = h.ib().revoke_device(Uid(7), DeviceId(3)).wait().unwrap();
    assert_eq!(revoked.state, DeviceState::Revoked);
    assert!(matches!(
        h.sync(
            Uid(7),
            DeviceId(3),
            Some(Generation(1)),
            SyncSeq(0),
            10,
            None
        ),
        Err(Error::DeviceRevoked)
    ));
    assert!(matches!(
        h.sync(
            Uid(7),
            DeviceId(99),
            Some(Generation(1)),
            SyncSeq(0),
            10,
            None
        ),
        Err(Error::NotFound(_))
    ));
}

#[test]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let h = Harness::with(|c| c.payload_bytes_max = 1024);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    let digest = h.ib().state_digest();
    let big = SendRequest {
        conv: ConvId(10),
        sender: Uid(1),
        client_msg_id: 1,
        msg_type: 1,
        payload: Bytes::from(vec![0u8; 1025]),
    };
    assert!(matches!(
        h.ib().send(big).wait(),
        Err(Error::TooLarge {
            size: 1025,
            limit: 1024
        })
    ));
    let to_unknown = SendRequest {
        conv: ConvId(11),
        sender: Uid(1),
        client_msg_id: 2,
        msg_type: 1,
        payload: Bytes::new(),
    };
    assert!(matches!(
        h.ib().send(to_unknown).wait(),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        h.ib().pull(Uid(2), &[(ConvId(10), MsgSeq(0))], 501),
        Err(Error::BadRequest(_))
    ));
    assert!(matches!(
        h.ib().history(Uid(2), ConvId(10), None, 501),
        Err(Error::BadRequest(_))
    ));
    assert!(matches!(
        h.sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 501, None),
        Err(Error::BadRequest(_))
    ));
    assert!(matches!(
        h.sync(
            Uid(2),
            PHONE,
            Some(gen),
            SyncSeq(0),
            10,
            Some(Bytes::from_static(b"forged"))
        ),
        Err(Error::BadToken)
    ));
    assert!(matches!(
        h.ib().mark_read(Uid(2), ConvId(10), MsgSeq(99)).wait(),
        Err(Error::BadRequest(_))
    ));
    assert!(matches!(
        h.ib().mark_read(Uid(3), ConvId(10), MsgSeq(1)).wait(),
        Err(Error::Forbidden(_))
    ));
    assert!(matches!(
        h.ib().leave(Uid(3), ConvId(10)).wait(),
        Err(Error::NotFound(_))
    ));
    // A token forged for another device is refused.
    let page = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 10, None)
        .unwrap();
    let mut forged = page.batch_token.to_vec();
    forged[1] ^= 1;
    assert!(matches!(
        h.ack(Uid(2), PHONE, gen, SyncSeq(1), &Bytes::from(forged)),
        Err(Error::BadToken)
    ));
    assert_eq!(h.ib().state_digest(), digest, "no state change");
}

#[test]
fn payloads_round_trip_whole_whether_or_not_they_compress() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let compressible = Bytes::from(vec![b'z'; 60_000]);
    let random: Bytes = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect::<Vec<_>>()
        .into();
    for (i, p) in [compressible.clone(), random.clone()]
        .into_iter()
        .enumerate()
    {
        h.ib()
            .send(SendRequest {
                conv: ConvId(10),
                sender: Uid(1),
                client_msg_id: i as u128,
                msg_type: 3,
                payload: p,
            })
            .wait()
            .unwrap();
    }
    let msgs = &h.ib().pull(Uid(2), &[(ConvId(10), MsgSeq(2))], 50).unwrap()[0].messages;
    assert_eq!(msgs[0].payload, compressible);
    assert_eq!(msgs[1].payload, random);
    assert_eq!(msgs[0].msg_type, 3);
}

#[test]
fn hints_carry_the_committed_high_watermark_once_per_round() {
    let h = Harness::new();
    let mut rx = h.ib().subscribe_hints();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.send(ConvId(10), Uid(1), 1, "x");
    let mut latest = std::collections::HashMap::new();
    while let Ok(batch) = rx.try_recv() {
        for hint in batch {
            latest.insert(hint.uid, hint.committed_sync_seq);
        }
    }
    assert_eq!(latest.get(&Uid(2)), Some(&SyncSeq(2)));
    assert_eq!(latest.get(&Uid(1)), Some(&SyncSeq(3)));
}

#[test]
fn stats_count_the_fsyncs_and_their_time_under_the_always_policy() {
    let h = Harness::with(|c| c.sync = inbox_engine::log::SyncPolicy::Always);
    h.ib().join(Uid(1), ConvId(1)).wait().unwrap();
    h.ib().join(Uid(2), ConvId(1)).wait().unwrap();
    let before = h.ib().stats();
    h.ib()
        .send(SendRequest {
            conv: ConvId(1),
            sender: Uid(1),
            client_msg_id: 1,
            msg_type: 1,
            payload: Bytes::from_static(b"hi"),
        })
        .wait()
        .unwrap();
    let after = h.ib().stats();
    // A send commits one log, bodies and effects together: one synced
    // commit.
    assert!(
        after.fsyncs == before.fsyncs + 1,
        "fsyncs went from {} to {}",
        before.fsyncs,
        after.fsyncs
    );
    assert!(after.fsync_latency_us_sum > before.fsync_latency_us_sum);
}
