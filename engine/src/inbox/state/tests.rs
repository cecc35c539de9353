//! Tests of the state's tables: their sizes in memory, and how their
//! lists grow.

use super::*;
use crate::inbox::containers::sorted::SortedSet;
use crate::inbox::containers::{event_locs, fitted_capacity, size_class_of};

/// Every conversation and every member's row of it is in memory, so
/// their sizes are the per-conversation floor; these pin them.
#[test]
fn a_conversation_and_a_members_row_keep_their_size() {
    // A large group's state is boxed: inline it was 80 more bytes in
    // every conversation, most of which never switch. Its edits are
    // out of line until it has one: inline they were 16 more, and
    // behind an `Arc` the conversation took the allocator's 160-byte
    // class instead of the 128-byte one.
    assert_eq!(std::mem::size_of::<Conv>(), 112);
    // The summary is a shared slice (16 bytes), not a `Bytes` (32):
    // two rows fill the allocator's 160-byte class, not 192.
    assert_eq!(std::mem::size_of::<Summary>(), 16);
    assert_eq!(std::mem::size_of::<UserConv>(), 80);
}

#[test]
fn a_summary_is_one_allocation_shared_by_its_rows_and_counted_once() {
    let one = Summary::new(&[7u8; 64]);
    assert_eq!(
        one.shared_bytes(),
        64 + 16,
        "alone: its bytes and the counts"
    );
    let rows = [one.clone(), one.clone()];
    drop(one);
    assert_eq!(
        rows.iter().map(Summary::shared_bytes).sum::<u64>(),
        64 + 16,
        "two rows share one"
    );
    assert_eq!(&rows[0][..], &[7u8; 64][..]);
    assert_eq!(rows[1].to_bytes(), bytes::Bytes::from(vec![7u8; 64]));
    let empty = Summary::new(&[]);
    assert_eq!((empty.shared_bytes(), empty.len()), (0, 0));
    assert_eq!(empty, Summary::default());
}

/// Every user is in memory, behind an `Arc` (16 bytes more). Its
/// snapshots and lease and snapshot counters are out of line until it
/// has one, and its order is a vector's 24 bytes: 144 and 16 fill the
/// allocator's 160-byte class (with all inline, 184 took the 192-byte
/// one).
#[test]
fn a_user_keeps_its_snapshots_and_counters_out_of_line_and_fits_160_bytes() {
    assert_eq!(std::mem::size_of::<SortedSet<ActivityKey>>(), 24);
    assert_eq!(std::mem::size_of::<User>(), 144);
    assert_eq!(size_class_of(std::mem::size_of::<User>() + 16), 160);
}

/// Every registered device is in memory; a lease, which few devices
/// hold at a time, is not inline.
#[test]
fn size_classes_are_eights_to_64_then_four_per_doubling() {
    let blocks: Vec<usize> = [1, 8, 9, 64, 65, 80, 81, 129, 464, 806, 1025]
        .into_iter()
        .map(size_class_of)
        .collect();
    assert_eq!(blocks, [8, 8, 16, 64, 80, 80, 96, 160, 512, 896, 1280]);
}

#[test]
fn a_growing_list_fills_its_block_and_grows_by_a_quarter_and_a_class_at_most() {
    for size in [8, 24, 26, 40, 56, 96, 104] {
        let mut len = 0;
        while len < 20_000 {
            let want = len + (len / 4).max(1);
            let capacity = fitted_capacity(len, want, size);
            assert!(capacity > len, "size {size}, len {len}: room for one more");
            assert!(
                capacity <= want + want / 4 + 1,
                "size {size}, len {len}: {capacity} entries for a want of {want}"
            );
            let bytes = capacity * size;
            assert!(
                size_class_of(bytes) - bytes < size,
                "size {size}: {capacity} entries ({bytes} B) leave room for another in a {} B block",
                size_class_of(bytes)
            );
            len = capacity;
        }
    }
}

#[test]
fn a_user_s_55_events_and_a_conversation_s_28_entries_take_the_class_they_fill() {
    let mut events = event_locs::EventLocs::default();
    for i in 0..55u64 {
        events.push((7 << 32) | (i * 300));
    }
    let bytes = events.allocated_bytes();
    assert_eq!(
        bytes, 253,
        "a 5-byte header and 62 entries of 4 bytes in a 256 B block"
    );
    assert_eq!(size_class_of(bytes), 256);
    let mut c = Conv::default();
    for _ in 0..28 {
        c.msgs.push(meta(0));
    }
    assert_eq!(
        c.msgs.heap_bytes().1,
        375,
        "a 45-byte header and room for 33 packed entries of 10 bytes fill a 384 B block"
    );
}

#[test]
fn message_metadata_packs_to_10_bytes_and_reads_back_exactly_or_stays_at_full_width() {
    use crate::inbox::containers::chunked::Pack;
    let at = |segment, offset| pack(crate::log::RecordLoc { segment, offset });
    let first = MsgMeta {
        loc: PENDING_LOC,
        msg_id: MsgId(1 << 40),
        sender: Uid(5 << 40),
        kind: MessageKind::Normal,
        flags: 0,
    };
    let mut base = [0u8; 44];
    first.start_base(&mut base);
    let packs = |m: MsgMeta, base: &mut [u8; 44]| {
        let mut out = [0u8; 10];
        m.narrow(base, &mut out)
            .then(|| MsgMeta::from_narrow(base, &out))
    };
    // Pending first: the first location sets the base's segment.
    assert_eq!(packs(first, &mut base), Some(first));
    let fits = [
        MsgMeta {
            loc: body_in_evt(at(700, 12)),
            sender: Uid(1),
            ..first
        },
        MsgMeta {
            loc: at(700 + 4094, (1 << 27) - 1),
            kind: MessageKind::Edit,
            flags: FLAG_RECALLED | FLAG_EDITED | FLAG_LOST,
            sender: Uid(u64::MAX - 1),
            ..first
        },
        MsgMeta {
            loc: at(701, 0),
            msg_id: MsgId((1 << 40) + u64::from(u32::MAX)),
            sender: Uid(0),
            kind: MessageKind::Recall,
            ..first
        },
    ];
    for m in fits {
        assert_eq!(packs(m, &mut base), Some(m), "{m:?}");
    }
    let too_wide = [
        MsgMeta {
            loc: at(699, 0),
            ..first
        },
        MsgMeta {
            loc: at(700 + 4095, 0),
            ..first
        },
        MsgMeta {
            loc: at(700, 1 << 27),
            ..first
        },
        MsgMeta {
            msg_id: MsgId((1 << 40) - 1),
            ..first
        },
        MsgMeta {
            msg_id: MsgId((1 << 40) + (1 << 32)),
            ..first
        },
        MsgMeta {
            sender: Uid(7),
            ..first
        },
        MsgMeta {
            sender: Uid(u64::MAX),
            ..first
        },
    ];
    for m in too_wide {
        assert_eq!(packs(m, &mut base), None, "{m:?}");
        let mut out = [0u8; 26];
        m.wide(&mut out);
        assert_eq!(MsgMeta::from_wide(&out), m);
    }
    // In a list: the tail holds both kinds exactly.
    let mut c = Conv::default();
    for m in fits.iter().chain(&too_wide) {
        c.msgs.push(*m);
    }
    assert!(c.msgs.iter().eq(fits.iter().chain(&too_wide).copied()));
}

#[test]
fn a_device_keeps_its_lease_out_of_line() {
    assert_eq!(std::mem::size_of::<Device>(), 56);
}

fn meta(loc: PackedLoc) -> MsgMeta {
    MsgMeta {
        loc,
        msg_id: MsgId(1),
        sender: Uid(1),
        kind: MessageKind::Normal,
        flags: 0,
    }
}

#[test]
fn the_bodies_hint_stops_at_the_first_body_in_evt_or_pending_and_follows_the_base() {
    let in_msg = 7 << 32;
    let in_evt = body_in_evt(9 << 32);
    let mut c = Conv::default();
    for loc in [in_msg, in_msg, in_evt, in_msg, PENDING_LOC] {
        c.msgs.push(meta(loc));
    }
    c.advance_bodies_hint();
    assert_eq!(
        c.bodies_in_msg_to.0,
        MsgSeq(2),
        "stops below the body in evt"
    );
    assert!(c.update_meta(MsgSeq(3), |m| m.loc = in_msg));
    c.advance_bodies_hint();
    assert_eq!(
        c.bodies_in_msg_to.0,
        MsgSeq(4),
        "stops below the pending one"
    );
    assert!(c.update_meta(MsgSeq(5), |m| m.loc = in_msg));
    c.advance_bodies_hint();
    assert_eq!(c.bodies_in_msg_to.0, MsgSeq(5), "the head");
    // Reclaimed history lifts it to the base.
    let mut trimmed = Conv::default();
    for _ in 0..4 {
        trimmed.msgs.push(meta(in_evt));
    }
    trimmed.msgs.remove_front(3);
    trimmed.msgs_base = MsgSeq(3);
    trimmed.advance_bodies_hint();
    assert_eq!(trimmed.bodies_in_msg_to.0, MsgSeq(3));
}
