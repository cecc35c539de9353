//! `SyncOptions`: a replay limit the device chooses (over it, the answer
//! is `RESET_REQUIRED` and the snapshot path follows), and events without
//! message summaries; a bad limit is refused and changes nothing.

mod inbox_common;

use inbox_common::*;
use inbox_engine::*;

const PHONE: DeviceId = DeviceId(1);

fn req(uid: Uid, generation: Generation, local: SyncSeq) -> SyncRequest {
    SyncRequest {
        uid,
        device: PHONE,
        generation: Some(generation),
        local_applied_seq: local,
        limit: 0,
        batch_token: None,
    }
}

/// User 2 in conversation 1 with `n` messages from user 1 waiting.
fn backlog(n: u64) -> (Harness, Generation) {
    let h = Harness::new();
    h.join(Uid(1), ConvId(1));
    h.join(Uid(2), ConvId(1));
    let gen = h.register(Uid(2), PHONE).device.generation;
    for i in 0..n {
        h.send(
            ConvId(1),
            Uid(1),
            u128::from(i) + 1,
            &format!("message {i}"),
        );
    }
    (h, gen)
}

#[test]
fn a_backlog_over_the_device_s_replay_limit_answers_reset_required() {
    let (h, gen) = backlog(10);
    let head = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 0, None)
        .unwrap()
        .batch_hwm;
    let options = SyncOptions {
        max_replay: Some(head.0 - 1),
        ..SyncOptions::default()
    };
    let err = h
        .ib()
        .sync_with(req(Uid(2), gen, SyncSeq(0)), options)
        .wait()
        .unwrap_err();
    let Error::ResetRequired { generation } = err else {
        panic!("expected RESET_REQUIRED, got {err:?}");
    };
    assert_eq!(
        generation,
        Generation(gen.0 + 1),
        "the reset bumps the generation"
    );
    // The snapshot path follows, as for any reset.
    let snap = h.ib().begin_snapshot(Uid(2), PHONE).wait().unwrap();
    assert_eq!(snap.base_sync_seq, head);
}

#[test]
fn a_backlog_within_the_replay_limit_is_replayed() {
    let (h, gen) = backlog(10);
    let head = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 0, None)
        .unwrap()
        .batch_hwm;
    let options = SyncOptions {
        max_replay: Some(head.0),
        ..SyncOptions::default()
    };
    let page = h
        .ib()
        .sync_with(req(Uid(2), gen, SyncSeq(0)), options)
        .wait()
        .unwrap();
    assert_eq!(page.generation, gen);
    assert_eq!(page.events.len() as u64, head.0);
}

#[test]
fn a_replay_limit_of_zero_is_refused_and_changes_nothing() {
    let (h, gen) = backlog(3);
    let before = h.ib().state_digest();
    let options = SyncOptions {
        max_replay: Some(0),
        ..SyncOptions::default()
    };
    let err = h
        .ib()
        .sync_with(req(Uid(2), gen, SyncSeq(0)), options)
        .wait()
        .unwrap_err();
    assert!(
        matches!(&err, Error::BadRequest(m) if m.contains("max_replay")),
        "{err:?}"
    );
    assert_eq!(h.ib().state_digest(), before, "nothing changed");
    assert_eq!(h.ib().devices(Uid(2)).unwrap()[0].generation, gen);
}

#[test]
fn events_without_summaries_carry_none_and_are_otherwise_the_same() {
    let (h, gen) = backlog(5);
    let with = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 0, None)
        .unwrap();
    assert!(with.events.iter().any(|e| !e.summary.is_empty()));
    let options = SyncOptions {
        without_summaries: true,
        ..SyncOptions::default()
    };
    let without = h
        .ib()
        .sync_with(req(Uid(2), gen, SyncSeq(0)), options)
        .wait()
        .unwrap();
    assert!(without.events.iter().all(|e| e.summary.is_empty()));
    assert_eq!(without.events.len(), with.events.len());
    for (a, b) in with.events.iter().zip(&without.events) {
        assert_eq!(
            (a.sync_seq, a.kind, a.conv, a.msg_seq),
            (b.sync_seq, b.kind, b.conv, b.msg_seq)
        );
    }
}

/// The device's ACK as the engine holds it once every command queued
/// before this call has run: a registration is a write of its own, queued
/// behind whatever the sync submitted.
fn acked_after_queue(h: &Harness, uid: Uid) -> SyncSeq {
    h.register(uid, DeviceId(99));
    let devices = h.ib().devices(uid).unwrap();
    devices
        .iter()
        .find(|d| d.device == PHONE)
        .unwrap()
        .acked_sync_seq
}

/// User 2's first page of 10, and the request for the page after it.
fn first_page_and_next(h: &Harness, gen: Generation) -> (SyncPage, SyncRequest) {
    let first = h
        .ib()
        .sync(SyncRequest {
            limit: 10,
            ..req(Uid(2), gen, SyncSeq(0))
        })
        .wait()
        .unwrap();
    assert!(first.has_more);
    let next = SyncRequest {
        local_applied_seq: first.next_cursor,
        limit: 10,
        batch_token: Some(first.batch_token.clone()),
        ..req(Uid(2), gen, SyncSeq(0))
    };
    (first, next)
}

#[test]
fn an_ack_carried_by_the_next_sync_moves_the_device_forward_and_survives_a_restart() {
    let (mut h, gen) = backlog(30);
    let (first, next) = first_page_and_next(&h, gen);
    let options = SyncOptions {
        ack_through: Some(first.next_cursor),
        ..SyncOptions::default()
    };
    let second = h.ib().sync_with(next, options).wait().unwrap();
    assert_eq!(
        second.events.first().map(|e| e.sync_seq),
        Some(first.next_cursor.plus(1)),
        "the page after the ACKed one"
    );
    assert_eq!(acked_after_queue(&h, Uid(2)), first.next_cursor);
    h.restart(true, |_| {});
    assert_eq!(acked_after_queue(&h, Uid(2)), first.next_cursor, "durable");
}

#[test]
fn an_ack_carried_by_sync_that_ack_would_refuse_fails_the_sync_and_moves_nothing() {
    let (h, gen) = backlog(30);
    let (first, next) = first_page_and_next(&h, gen);
    let beyond = SyncOptions {
        ack_through: Some(first.batch_hwm.plus(1)),
        ..SyncOptions::default()
    };
    let err = h.ib().sync_with(next.clone(), beyond).wait().unwrap_err();
    assert!(
        matches!(err, Error::AckBeyondHwm { .. }),
        "beyond the batch's high-water mark: {err:?}"
    );
    // The first page of a batch has no token to ACK with.
    let untokened = SyncOptions {
        ack_through: Some(first.next_cursor),
        ..SyncOptions::default()
    };
    let err = h
        .ib()
        .sync_with(req(Uid(2), gen, first.next_cursor), untokened)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err:?}");
    // A valid ACK on a sync refused for a reason of its own.
    let carried = SyncOptions {
        ack_through: Some(first.next_cursor),
        ..SyncOptions::default()
    };
    let too_long = SyncRequest {
        limit: 100_000,
        ..next.clone()
    };
    let err = h.ib().sync_with(too_long, carried).wait().unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err:?}");
    assert_eq!(acked_after_queue(&h, Uid(2)), SyncSeq(0), "nothing ACKed");
}

#[test]
fn a_catch_up_that_carries_every_page_s_ack_ends_acked_at_its_last_carried_ack() {
    let (h, gen) = backlog(60);
    let (first, mut next) = first_page_and_next(&h, gen);
    let mut acked = first.next_cursor;
    let mut pages = 1;
    loop {
        let options = SyncOptions {
            ack_through: Some(acked),
            ..SyncOptions::default()
        };
        // Back to back: whether a sync is answered from the state or, with
        // the ACK the last one carried still in its round, in a round of
        // its own, the device ends at the last ACK carried.
        let page = h.ib().sync_with(next.clone(), options).wait().unwrap();
        pages += 1;
        if !page.has_more {
            break;
        }
        acked = page.next_cursor;
        next.local_applied_seq = page.next_cursor;
    }
    assert!(pages >= 5, "pages: {pages}");
    assert_eq!(acked_after_queue(&h, Uid(2)), acked);
}
