//! `Inbox::memory` reports each structure's bytes, and they follow what
//! the structures hold (R29): sends grow the idempotency table, the
//! message metadata and the event index by their entry sizes; users and
//! devices grow with registrations.

mod inbox_common;

use inbox_common::*;
use inbox_engine::*;

const CONV: ConvId = ConvId(10);

fn live(r: &MemoryReport, structure: &str) -> u64 {
    r.get(structure)
        .unwrap_or_else(|| panic!("{structure} is reported"))
        .live
}

#[test]
fn every_structure_is_reported_with_allocated_at_least_live() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    h.send_many(CONV, Uid(1), 1, 10);
    let r = h.ib().memory();
    for name in [
        "users",
        "devices",
        "user_conversations",
        "conversations",
        "message_metadata",
        "event_index",
        "idempotency",
        "snapshot_rows",
        "segment_counts",
        "snapshot_cache",
        "log_mmaps",
    ] {
        let m = r.get(name).unwrap_or_else(|| panic!("{name} is reported"));
        assert!(m.allocated >= m.live, "{m:?}");
    }
}

#[test]
fn sends_with_keys_grow_the_idempotency_table_metadata_and_events_by_their_entry_sizes() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    let before = h.ib().memory();
    h.send_many(CONV, Uid(1), 100, 1000);
    let after = h.ib().memory();
    let grew = |s: &str| live(&after, s) - live(&before, s);
    assert_eq!(grew("idempotency"), 1000 * 24, "24 bytes per key");
    assert_eq!(grew("message_metadata"), 1000 * 26, "26 bytes per message");
    assert_eq!(
        grew("event_index"),
        2 * 1000 * 8,
        "8 bytes per event, two members"
    );
    assert!(after.get("idempotency").unwrap().allocated >= 1000 * 24);
}

#[test]
fn registrations_grow_users_and_devices() {
    let h = Harness::new();
    let before = h.ib().memory();
    for uid in 1..=50 {
        h.register(Uid(uid), DeviceId(1));
    }
    let after = h.ib().memory();
    assert!(live(&after, "users") > live(&before, "users"));
    assert!(live(&after, "devices") >= live(&before, "devices") + 50 * 32);
}

#[test]
fn the_idempotency_table_is_the_same_size_after_a_restart() {
    let mut h = Harness::new();
    h.join(Uid(1), CONV);
    h.send_many(CONV, Uid(1), 100, 300);
    let before = live(&h.ib().memory(), "idempotency");
    h.ib().checkpoint().unwrap();
    h.restart(true, |_| {});
    assert_eq!(live(&h.ib().memory(), "idempotency"), before);
}
