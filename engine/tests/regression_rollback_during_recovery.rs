//! A device that loses data again while its recovery lease is open is a
//! rollback like any other: it used to be served from the lease's
//! `resume_from`, silently skipping the events it had lost.

mod inbox_common;

use inbox_common::*;
use inbox_engine::*;

const PHONE: DeviceId = DeviceId(1);

#[test]
fn a_sync_below_the_lease_resume_point_gets_a_new_generation_and_lease() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    h.send_many(ConvId(10), Uid(1), 100, 20);
    let (_, gen, acked) = h.catch_up(Uid(2), PHONE, gen, SyncSeq(0));
    assert!(acked >= SyncSeq(20));

    // Restored from a backup at 15: a lease from 15.
    let first = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(15), 100, None)
        .unwrap();
    let lease = first.lease.expect("a recovery lease");
    assert_eq!(lease.resume_from, SyncSeq(15));
    assert_eq!(first.generation, gen.next());

    // Loses data again, down to 4, before finishing the lease.
    let again = h
        .sync(Uid(2), PHONE, Some(first.generation), SyncSeq(4), 100, None)
        .unwrap();
    assert_eq!(
        again.generation,
        first.generation.next(),
        "a rollback bumps the generation"
    );
    let lease2 = again.lease.expect("a new recovery lease");
    assert_eq!(
        lease2.resume_from,
        SyncSeq(4),
        "served from where the device now is"
    );
    assert_ne!(lease2.lease_id, lease.lease_id);
    assert_eq!(again.events.first().map(|e| e.sync_seq), Some(SyncSeq(5)));
}

#[test]
fn a_sync_at_or_above_the_lease_resume_point_keeps_the_lease() {
    let h = Harness::new();
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    h.send_many(ConvId(10), Uid(1), 100, 20);
    let (_, gen, _) = h.catch_up(Uid(2), PHONE, gen, SyncSeq(0));
    let first = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(15), 100, None)
        .unwrap();
    let lease = first.lease.expect("a recovery lease");
    let again = h
        .sync(
            Uid(2),
            PHONE,
            Some(first.generation),
            SyncSeq(15),
            100,
            None,
        )
        .unwrap();
    assert_eq!(again.generation, first.generation);
    assert_eq!(again.lease.map(|l| l.lease_id), Some(lease.lease_id));
}

#[test]
fn a_sync_far_below_the_lease_resume_point_gets_reset_required() {
    let h = Harness::with(|c| c.recovery_lease_events_max = 8);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    h.send_many(ConvId(10), Uid(1), 100, 20);
    let (_, gen, acked) = h.catch_up(Uid(2), PHONE, gen, SyncSeq(0));
    let first = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(acked.0 - 3), 100, None)
        .unwrap();
    assert!(first.lease.is_some());
    let again = h.sync(Uid(2), PHONE, Some(first.generation), SyncSeq(1), 100, None);
    match again {
        Err(Error::ResetRequired { generation }) => assert_eq!(generation, first.generation.next()),
        other => panic!("expected RESET_REQUIRED, got {other:?}"),
    }
}
