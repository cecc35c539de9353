//! Fences and snapshots (R10, R17, R18, R19): what compaction may take and
//! what it must leave, and how a reset device comes back without a gap.

mod inbox_common;

use std::time::Duration;

use inbox_common::*;
use inbox_engine::*;

const PHONE: DeviceId = DeviceId(1);
const DESKTOP: DeviceId = DeviceId(2);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn tune(c: &mut InboxConfig) {
    c.segment_bytes = 64 << 10;
    c.safety_window = HOUR;
    c.hard_ttl = 3 * DAY;
    c.device_ttl = 30 * DAY;
    c.snapshot_ttl = HOUR;
    c.recovery_lease_ttl = 10 * HOUR;
    c.compaction_interval = None;
}

fn seqs(events: &[SyncEvent]) -> Vec<SyncSeq> {
    events.iter().map(|e| e.sync_seq).collect()
}

#[test]
fn slow_device_holds_back_compaction_of_its_events_until_it_acks() {
    let h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gp = h.register(Uid(2), PHONE).device.generation;
    let gd = h.register(Uid(2), DESKTOP).device.generation;
    h.send_many(ConvId(10), Uid(1), 1000, 60);
    let (_, _, phone_ack) = h.catch_up(Uid(2), PHONE, gp, SyncSeq(0));
    h.advance(2 * HOUR);
    let report = h.ib().compact().unwrap();
    let x = h.ib().explain(Uid(2)).unwrap();
    assert_eq!(
        x.oldest_retained,
        SyncSeq(1),
        "the desktop's events are all kept"
    );
    assert_eq!(
        x.fences.first(),
        Some(&Fence::DeviceAck {
            device: DESKTOP,
            acked_sync_seq: SyncSeq(0)
        }),
        "the slow desktop holds the floor: {x:?}"
    );
    assert_eq!(x.floor, SyncSeq(0));
    // The desktop still gets every event, whole.
    let (events, gd, desk_ack) = h.catch_up(Uid(2), DESKTOP, gd, SyncSeq(0));
    assert_eq!(
        seqs(&events),
        SyncSeq(1).through(phone_ack).collect::<Vec<_>>()
    );
    // User 1 (the sender) has no devices: its old events go.
    assert!(report.events_reclaimed > 0, "{report:?}");
    // Once the desktop has ACKed, its events go too.
    let report = h.ib().compact().unwrap();
    assert!(report.events_reclaimed >= desk_ack.get(), "{report:?}");
    let x = h.ib().explain(Uid(2)).unwrap();
    assert_eq!(x.oldest_retained, desk_ack.next(), "{x:?}");
    assert_eq!(x.floor, desk_ack);
    // A rollback below the reclaimed range is a reset, never a short page.
    let err = h
        .sync(Uid(2), DESKTOP, Some(gd), SyncSeq(0), 100, None)
        .unwrap_err();
    assert!(matches!(err, Error::ResetRequired { .. }), "{err:?}");
}

#[test]
fn events_younger_than_the_safety_window_are_kept_even_when_acked() {
    let h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gp = h.register(Uid(2), PHONE).device.generation;
    h.send_many(ConvId(10), Uid(1), 1000, 20);
    let (_, _, ack) = h.catch_up(Uid(2), PHONE, gp, SyncSeq(0));
    h.ib().compact().unwrap();
    let x = h.ib().explain(Uid(2)).unwrap();
    assert_eq!(x.oldest_retained, SyncSeq(1), "{x:?}");
    assert!(
        x.fences.iter().any(|f| matches!(
            f,
            Fence::SafetyWindow {
                oldest_kept: SyncSeq(1)
            }
        )),
        "{x:?}"
    );
    h.advance(2 * HOUR);
    h.ib().compact().unwrap();
    assert_eq!(h.ib().explain(Uid(2)).unwrap().oldest_retained, ack.next());
}

#[test]
fn device_past_the_hard_ttl_gets_reset_required_installs_a_snapshot_and_catches_up_from_s_plus_one()
{
    let h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.join(Uid(2), ConvId(11));
    h.join(Uid(3), ConvId(11));
    let gd = h.register(Uid(2), DESKTOP).device.generation;
    h.send_many(ConvId(10), Uid(1), 1000, 40);
    h.send(ConvId(11), Uid(3), 5000, "hello from 3");
    let r = h.send(ConvId(10), Uid(1), 6000, "to be recalled");
    h.ib()
        .recall(RecallRequest {
            conv: ConvId(10),
            sender: Uid(1),
            client_msg_id: 6001,
            target: r.msg_id,
        })
        .wait()
        .unwrap();
    h.ib()
        .mark_read(Uid(2), ConvId(10), MsgSeq(5))
        .wait()
        .unwrap();
    // The desktop never ACKs; past the hard TTL its events go anyway.
    h.advance(4 * DAY);
    h.register(Uid(2), PHONE); // some activity now
    let report = h.ib().compact().unwrap();
    assert!(report.events_reclaimed > 0);
    let head_before = h.ib().explain(Uid(2)).unwrap().committed_sync_seq;
    assert_eq!(
        h.ib().explain(Uid(2)).unwrap().oldest_retained,
        head_before.next()
    );
    let err = h
        .sync(Uid(2), DESKTOP, Some(gd), SyncSeq(0), 100, None)
        .unwrap_err();
    let Error::ResetRequired { generation } = err else {
        panic!("expected RESET_REQUIRED, got {err:?}");
    };
    assert!(generation > gd);

    let info = h.ib().begin_snapshot(Uid(2), DESKTOP).wait().unwrap();
    assert_eq!(info.state, SnapshotState::Ready);
    assert_eq!(info.base_sync_seq, head_before);
    assert!(info.generation > generation);
    // Messages after S.
    let after: Vec<_> = (0..5)
        .map(|i| h.send(ConvId(10), Uid(1), 7000 + i, &format!("after {i}")))
        .collect();
    let mut convs = Vec::new();
    let mut msgs = Vec::new();
    for p in 0..info.pages {
        let page = h.ib().snapshot_page(Uid(2), info.snapshot_id, p).unwrap();
        convs.extend(page.convs);
        msgs.extend(page.messages);
    }
    let c10 = convs
        .iter()
        .find(|c| c.conv == ConvId(10))
        .expect("conv 10 listed");
    assert_eq!(c10.read_seq, MsgSeq(5), "read cursor as of S");
    let last20: Vec<_> = msgs.iter().filter(|m| m.conv == ConvId(10)).collect();
    assert_eq!(last20.len(), 20, "the last N messages of the conversation");
    assert!(last20.iter().all(|m| m.msg_seq <= c10.last_msg_seq));
    let recalled = msgs.iter().find(|m| m.msg_id == r.msg_id).unwrap();
    assert!(recalled.tombstone && recalled.payload.is_empty());
    assert!(convs.iter().any(|c| c.conv == ConvId(11)));
    // Install: ACTIVE at S, then catch up from S+1 with no gap.
    let dev = h
        .ib()
        .ack_snapshot(Uid(2), DESKTOP, info.snapshot_id, info.generation)
        .wait()
        .unwrap();
    assert_eq!(dev.state, DeviceState::Active);
    assert_eq!(dev.acked_sync_seq, info.base_sync_seq);
    let (events, _, _) = h.catch_up(Uid(2), DESKTOP, info.generation, info.base_sync_seq);
    assert_eq!(
        seqs(&events),
        info.base_sync_seq
            .next()
            .through(info.base_sync_seq.plus(5))
            .collect::<Vec<_>>()
    );
    let got: Vec<MsgSeq> = events.iter().map(|e| e.msg_seq).collect();
    assert_eq!(got, after.iter().map(|r| r.msg_seq).collect::<Vec<_>>());
}

#[test]
fn compaction_in_the_middle_of_a_recovery_lease_serves_every_page_whole() {
    let h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gp = h.register(Uid(2), PHONE).device.generation;
    h.send_many(ConvId(10), Uid(1), 1000, 300);
    let (_, gp, acked) = h.catch_up(Uid(2), PHONE, gp, SyncSeq(0));
    h.advance(2 * HOUR);
    // The phone rolled back to 50: a recovery lease from 50 to the head.
    let first = h
        .sync(Uid(2), PHONE, Some(gp), SyncSeq(50), 40, None)
        .unwrap();
    let lease = first.lease.expect("a recovery lease");
    assert_eq!(lease.resume_from, SyncSeq(50));
    let mut pages = vec![first.events.clone()];
    let (mut cursor, mut more) = (first.next_cursor, first.has_more);
    let mut compactions = 0;
    while more {
        // Compaction runs between every two pages, and reclaims elsewhere.
        h.send_many(
            ConvId(10),
            Uid(1),
            50_000 + u128::from(cursor.get()) * 1000,
            30,
        );
        h.advance(Duration::from_secs(60));
        let r = h.ib().compact().unwrap();
        compactions += u64::from(r.events_reclaimed > 0);
        let x = h.ib().explain(Uid(2)).unwrap();
        assert!(
            x.oldest_retained <= SyncSeq(51),
            "the lease fences from 50: {x:?}"
        );
        let p = h
            .sync(
                Uid(2),
                PHONE,
                Some(first.generation),
                cursor,
                40,
                Some(first.batch_token.clone()),
            )
            .unwrap();
        pages.push(p.events.clone());
        cursor = p.next_cursor;
        more = p.has_more;
    }
    assert!(compactions > 0, "compaction reclaimed something meanwhile");
    for p in &pages[..pages.len() - 1] {
        assert_eq!(p.len(), 40, "every page whole");
    }
    let all: Vec<SyncSeq> = pages.iter().flatten().map(|e| e.sync_seq).collect();
    assert_eq!(all, SyncSeq(51).through(acked).collect::<Vec<_>>());
    h.ib()
        .finish_lease(Uid(2), PHONE, lease.lease_id, first.generation)
        .wait()
        .unwrap();
}

#[test]
fn messages_arriving_while_a_snapshot_is_built_stay_out_of_it() {
    let h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.register(Uid(2), DESKTOP);
    let gp = h.register(Uid(2), PHONE).device.generation;
    h.send_many(ConvId(10), Uid(1), 1000, 10);
    // The snapshot and a stream of sends are in flight together.
    let sends: Vec<_> = (0..30u128)
        .map(|i| {
            h.ib().send(SendRequest {
                conv: ConvId(10),
                sender: Uid(1),
                client_msg_id: 2000 + i,
                msg_type: 1,
                payload: bytes::Bytes::from(format!("late {i}")),
            })
        })
        .collect();
    let snap = h.ib().begin_snapshot(Uid(2), DESKTOP);
    let more: Vec<_> = (0..30u128)
        .map(|i| {
            h.ib().send(SendRequest {
                conv: ConvId(10),
                sender: Uid(1),
                client_msg_id: 3000 + i,
                msg_type: 1,
                payload: bytes::Bytes::from(format!("later {i}")),
            })
        })
        .collect();
    let info = snap.wait().unwrap();
    for p in sends.into_iter().chain(more) {
        p.wait().unwrap();
    }
    let s = info.base_sync_seq;
    // What the user's stream says the state at S is.
    let (events, _, _) = h.catch_up(Uid(2), PHONE, gp, SyncSeq(0));
    let upto_s: Vec<&SyncEvent> = events.iter().filter(|e| e.sync_seq <= s).collect();
    let last_at_s = upto_s.iter().map(|e| e.msg_seq).max().unwrap();
    let unread_at_s = upto_s.iter().filter(|e| e.kind == EventKind::Msg).count() as u32;
    assert!(
        events.len() as u64 > s.get(),
        "sends landed after S too ({} events, S = {s})",
        events.len()
    );
    let page = h.ib().snapshot_page(Uid(2), info.snapshot_id, 0).unwrap();
    let c = page.convs.iter().find(|c| c.conv == ConvId(10)).unwrap();
    assert_eq!(c.last_msg_seq, last_at_s, "conversation head exactly at S");
    assert_eq!(c.unread, unread_at_s, "unread exactly at S");
    let mseqs: Vec<MsgSeq> = page.messages.iter().map(|m| m.msg_seq).collect();
    let want: Vec<MsgSeq> = MsgSeq(last_at_s.get().saturating_sub(19).max(2))
        .through(last_at_s)
        .collect();
    assert_eq!(mseqs, want, "the last N messages up to S, none after");
    // The same snapshot, asked again, is byte-identical.
    assert_eq!(
        h.ib().snapshot_page(Uid(2), info.snapshot_id, 0).unwrap(),
        page
    );
    assert_eq!(
        h.ib()
            .snapshot_info(Uid(2), info.snapshot_id)
            .unwrap()
            .manifest_digest,
        info.manifest_digest
    );
}

#[test]
fn late_ack_from_the_generation_before_a_snapshot_is_refused() {
    let h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let g = h.register(Uid(2), DESKTOP).device.generation;
    h.send_many(ConvId(10), Uid(1), 1000, 10);
    let page = h
        .sync(Uid(2), DESKTOP, Some(g), SyncSeq(0), 100, None)
        .unwrap();
    let info = h.ib().begin_snapshot(Uid(2), DESKTOP).wait().unwrap();
    assert_eq!(info.generation, g.next());
    let err = h
        .ack(Uid(2), DESKTOP, g, SyncSeq(5), &page.batch_token)
        .unwrap_err();
    assert!(
        matches!(err, Error::StaleGeneration { current } if current == g.next()),
        "{err:?}"
    );
    let err = h
        .ib()
        .ack_snapshot(Uid(2), DESKTOP, info.snapshot_id, g)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::StaleGeneration { .. }), "{err:?}");
    let dev = h
        .ib()
        .ack_snapshot(Uid(2), DESKTOP, info.snapshot_id, info.generation)
        .wait()
        .unwrap();
    assert_eq!(dev.acked_sync_seq, info.base_sync_seq);
    // Installed: a second install of the same snapshot is a conflict, and
    // the old generation's ACK is still refused.
    let err = h
        .ib()
        .ack_snapshot(Uid(2), DESKTOP, info.snapshot_id, info.generation)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    assert!(h
        .ack(Uid(2), DESKTOP, g, SyncSeq(10), &page.batch_token)
        .is_err());
    assert_eq!(
        h.ib()
            .snapshot_info(Uid(2), info.snapshot_id)
            .unwrap()
            .state,
        SnapshotState::Installed
    );
}

#[test]
fn interrupted_install_fetches_the_same_snapshot_again_after_a_restart() {
    let mut h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.register(Uid(2), DESKTOP);
    h.send_many(ConvId(10), Uid(1), 1000, 25);
    let info = h.ib().begin_snapshot(Uid(2), DESKTOP).wait().unwrap();
    let before = h.ib().snapshot_page(Uid(2), info.snapshot_id, 0).unwrap();
    h.restart(true, tune);
    let again = h.ib().snapshot_info(Uid(2), info.snapshot_id).unwrap();
    assert_eq!(again, info, "same snapshot, same digest");
    assert_eq!(
        h.ib().snapshot_page(Uid(2), info.snapshot_id, 0).unwrap(),
        before
    );
    // The snapshot still fences its events after the restart.
    h.advance(Duration::from_secs(1800));
    h.ib().compact().unwrap();
    let x = h.ib().explain(Uid(2)).unwrap();
    assert!(x.fences.iter().any(|f| matches!(f, Fence::Snapshot { base_sync_seq, .. } if *base_sync_seq == info.base_sync_seq)));
    h.ib()
        .ack_snapshot(Uid(2), DESKTOP, info.snapshot_id, info.generation)
        .wait()
        .unwrap();
}

#[test]
fn expired_snapshot_stops_fencing_and_its_install_is_refused() {
    let h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.register(Uid(2), DESKTOP);
    h.send_many(ConvId(10), Uid(1), 1000, 5);
    let info = h.ib().begin_snapshot(Uid(2), DESKTOP).wait().unwrap();
    // A pass before the expiry drops nothing, and must not stop a later
    // pass from dropping the row once it has expired.
    h.ib().compact().unwrap();
    assert!(h.ib().snapshot_info(Uid(2), info.snapshot_id).is_ok());
    assert!(h
        .ib()
        .explain(Uid(2))
        .unwrap()
        .fences
        .iter()
        .any(|f| matches!(f, Fence::Snapshot { .. })));
    h.advance(2 * HOUR);
    assert_eq!(
        h.ib()
            .snapshot_info(Uid(2), info.snapshot_id)
            .unwrap()
            .state,
        SnapshotState::Expired
    );
    assert!(!h
        .ib()
        .explain(Uid(2))
        .unwrap()
        .fences
        .iter()
        .any(|f| matches!(f, Fence::Snapshot { .. })));
    let err = h
        .ib()
        .ack_snapshot(Uid(2), DESKTOP, info.snapshot_id, info.generation)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    // The device begins a new one.
    let next = h.ib().begin_snapshot(Uid(2), DESKTOP).wait().unwrap();
    assert!(next.snapshot_id > info.snapshot_id);
    h.ib().compact().unwrap();
    assert!(
        h.ib().snapshot_info(Uid(2), info.snapshot_id).is_err(),
        "expired rows are dropped"
    );
    assert!(
        h.ib().snapshot_info(Uid(2), next.snapshot_id).is_ok(),
        "live rows stay"
    );
}

#[test]
fn explain_segment_names_the_users_and_fences_holding_it() {
    let h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.register(Uid(2), DESKTOP);
    h.send_many(ConvId(10), Uid(1), 1000, 400);
    h.advance(2 * HOUR);
    h.ib().compact().unwrap();
    let first = h.ib().explain_segment("evt", 1).unwrap();
    assert!(first.live_records > 0);
    assert!(
        first
            .held_by
            .iter()
            .any(|s| s.contains("uid 2") && s.contains("device 2 ACK at 0")),
        "{first:?}"
    );
    assert!(h.ib().explain_segment("msg", 1).unwrap().live_records > 0);
    assert!(matches!(
        h.ib().explain_segment("nope", 1),
        Err(Error::BadRequest(_))
    ));
}

#[test]
fn events_that_age_past_the_window_between_passes_are_reclaimed_when_due() {
    let h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.send_many(ConvId(10), Uid(1), 1000, 10);
    // Nothing is old enough: the pass notes when the oldest event will be.
    assert_eq!(h.ib().compact().unwrap().events_reclaimed, 0);
    h.advance(HOUR / 2);
    // A user who appears between passes, with younger events.
    h.join(Uid(3), ConvId(20));
    h.send_many(ConvId(20), Uid(3), 2000, 5);
    assert_eq!(h.ib().compact().unwrap().events_reclaimed, 0);
    // Past the window for the first ten sends only (no devices, no fences).
    h.advance(HOUR / 2 + Duration::from_secs(60));
    h.ib().compact().unwrap();
    for uid in [1, 2] {
        let x = h.ib().explain(Uid(uid)).unwrap();
        assert_eq!(
            x.oldest_retained,
            x.committed_sync_seq.next(),
            "all gone: {x:?}"
        );
    }
    assert_eq!(
        h.ib().explain(Uid(3)).unwrap().oldest_retained,
        SyncSeq(1),
        "still young"
    );
    h.advance(HOUR / 2);
    h.ib().compact().unwrap();
    assert_eq!(h.ib().explain(Uid(3)).unwrap().oldest_retained, SyncSeq(7));
}

#[test]
fn a_segment_counts_as_covered_only_once_two_durable_checkpoints_cover_it() {
    let h = Harness::with(tune);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    h.send_many(ConvId(10), Uid(1), 1000, 800);
    let waits = |x: &SegmentExplain| x.held_by.iter().any(|s| s.contains("not yet covered"));
    let first = h.ib().explain_segment("evt", 1).unwrap();
    assert!(waits(&first), "no checkpoint yet: {first:?}");
    // With one checkpoint, a corrupt file would fall back to a full
    // replay, which needs every segment.
    h.ib().checkpoint().unwrap();
    let first = h.ib().explain_segment("evt", 1).unwrap();
    assert!(waits(&first), "one checkpoint is not enough: {first:?}");
    h.ib().checkpoint().unwrap();
    let first = h.ib().explain_segment("evt", 1).unwrap();
    assert!(
        !waits(&first),
        "two durable checkpoints cover it: {first:?}"
    );
}
