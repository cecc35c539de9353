//! `Inbox::memory` reports each structure's bytes, and they follow what
//! the structures hold (R29): sends grow the idempotency table, the
//! message metadata and the event index by their entry sizes (packed where
//! the structure packs them); users and
//! devices grow with registrations.

mod inbox_common;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::*;

const CONV: ConvId = ConvId(10);

fn used<'a>(r: &'a MemoryReport, structure: &str) -> &'a MemoryUse {
    r.get(structure)
        .unwrap_or_else(|| panic!("{structure} is reported"))
}

fn live(r: &MemoryReport, structure: &str) -> u64 {
    used(r, structure).live
}

fn allocated(r: &MemoryReport, structure: &str) -> u64 {
    used(r, structure).allocated
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
        "message_metadata_file",
        "idempotency_file",
        "snapshot_cache",
        "log_mmaps",
    ] {
        let m = used(&r, name);
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
    // 1,002 messages (the two joins, then the sends): full chunks of 157
    // at 26 bytes each, on the heap or in the scratch file, and the rest
    // in the tail, packed to 10 bytes after its 45-byte header.
    let in_chunks = 1002 / 157 * 157;
    assert_eq!(
        live(&after, "message_metadata") + live(&after, "message_metadata_file"),
        in_chunks * 26 + 45 + (1002 - in_chunks) * 10,
        "26 bytes per message in a chunk, 10 in the tail"
    );
    assert_eq!(
        grew("event_index"),
        2 * 1000 * 4,
        "4 bytes per event, two members: the events lie within 31 segments"
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
fn a_message_s_summary_is_counted_once_for_all_the_rows_it_reached() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    let before = h.ib().memory();
    h.send(CONV, Uid(1), 1, &"x".repeat(200));
    let after = h.ib().memory();
    // The rows and the order already hold both members; the new last
    // entry replaced the join's summary (an 8-byte uid) in both rows.
    let grew = live(&after, "user_conversations") - live(&before, "user_conversations");
    assert_eq!(
        grew,
        (64 + 16) - (8 + 16),
        "one 64-byte summary with its counts for two rows, where the join's was"
    );
}

#[test]
fn a_user_with_one_device_and_a_pair_of_members_allocate_no_room_for_four() {
    let h = Harness::new();
    let before = h.ib().memory();
    h.register(Uid(1), DeviceId(1));
    let after = h.ib().memory();
    let device = allocated(&after, "devices") - allocated(&before, "devices");
    assert_eq!(
        device,
        live(&after, "devices") - live(&before, "devices"),
        "one device, one device's room"
    );
    h.register(Uid(1), DeviceId(2));
    h.register(Uid(1), DeviceId(3));
    let three = h.ib().memory();
    assert_eq!(
        allocated(&three, "devices") - allocated(&before, "devices"),
        3 * device,
        "three devices, three devices' room"
    );

    // The conversation's map slot and the conversation itself come with
    // the first member; each member after it costs its own entry.
    h.join(Uid(1), CONV);
    let slack = |r: &MemoryReport| allocated(r, "conversations") - live(r, "conversations");
    let mut last = h.ib().memory();
    for uid in 2..=3 {
        h.join(Uid(uid), CONV);
        let now = h.ib().memory();
        assert_eq!(
            slack(&now),
            slack(&last),
            "member {uid}: room for members that never joined"
        );
        assert_eq!(
            live(&now, "conversations") - live(&last, "conversations"),
            40
        );
        last = now;
    }
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

/// Messages of the conversation, oldest first, as its member reads them.
fn whole_history(h: &Harness, uid: Uid) -> Vec<(MsgSeq, MsgId, Bytes)> {
    h.whole_history(uid, CONV)
        .into_iter()
        .map(|m| (m.msg_seq, m.msg_id, m.payload))
        .collect()
}

#[test]
fn a_long_history_keeps_its_index_in_file_pages_and_only_the_newest_on_the_heap() {
    let mut h = Harness::new();
    h.join(Uid(1), CONV);
    h.send_many(CONV, Uid(1), 1, 3000);
    let messages = 3001; // the join is an entry too
    let chunk = 4096 / 26;
    // The tail's entries are packed: 10 bytes each after a 45-byte header.
    let tail = 45 + (messages % chunk) * 10;
    let check = |h: &Harness, when: &str| {
        let r = h.ib().memory();
        let heap = live(&r, "message_metadata");
        let file = r.get("message_metadata_file").unwrap();
        assert_eq!(
            heap + file.live,
            (messages / chunk * chunk) * 26 + tail,
            "{when}: every entry is counted once"
        );
        assert_eq!(
            heap, tail,
            "{when}: only the entries after the last full page are on the heap"
        );
        assert_eq!(
            file.allocated,
            (messages / chunk) * 4096,
            "{when}: a page per chunk"
        );
    };
    check(&h, "live");
    let before = whole_history(&h, Uid(1));
    assert_eq!(before.len() as u64, messages);
    h.ib().checkpoint().unwrap();
    h.kill_restart(|_| {});
    check(&h, "after a kill, from the checkpoint");
    assert_eq!(whole_history(&h, Uid(1)), before, "after a kill");
    h.restart(false, |_| {});
    check(&h, "after a full replay");
    assert_eq!(whole_history(&h, Uid(1)), before, "after a full replay");
    h.restart(true, |c| c.index_in_file = false);
    let r = h.ib().memory();
    assert_eq!(
        live(&r, "message_metadata"),
        (messages / chunk * chunk) * 26 + tail,
        "all on the heap when told"
    );
    assert_eq!(live(&r, "message_metadata_file"), 0);
    assert_eq!(whole_history(&h, Uid(1)), before, "on the heap");
}
