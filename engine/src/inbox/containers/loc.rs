//! Record locations as the indexes hand them out: `segment << 32 | offset`
//! in 8 bytes. The indexes store them packed narrower where they can
//! (`event_locs`, and a conversation's tail in `chunked`).
//!
//! A message location (`MsgMeta::loc`) also says which log holds the
//! body: bit 63 set means the `evt` log (the body travels inside its
//! message effect, kind 9, the form every send writes), clear means the
//! `msg` log (a body moved there by compaction, or written by an older
//! version). Segment ids stay below 2^31, so the bit is free; event
//! locations are always in `evt` and never carry it. [`PENDING_LOC`]
//! (all ones) is neither.

/// A location in a log, packed as `segment << 32 | offset`.
pub(crate) type PackedLoc = u64;

/// Placeholder for a record whose location is not known yet (its batch is
/// not submitted); never visible to readers, which stop at the committed
/// watermark.
pub(crate) const PENDING_LOC: PackedLoc = u64::MAX;

/// Set on a message location whose body is in the `evt` log.
pub(crate) const IN_EVT: PackedLoc = 1 << 63;

pub(crate) fn pack(loc: crate::log::RecordLoc) -> PackedLoc {
    (u64::from(loc.segment) << 32) | u64::from(loc.offset)
}

pub(crate) fn unpack(v: PackedLoc) -> crate::log::RecordLoc {
    crate::log::RecordLoc {
        segment: ((v & !IN_EVT) >> 32) as u32,
        offset: (v & 0xffff_ffff) as u32,
    }
}

/// Which log a message location points into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyLog {
    Msg,
    Evt,
}

/// The log and the plain location of a (non-pending) message location.
pub(crate) fn body_at(v: PackedLoc) -> (BodyLog, PackedLoc) {
    if v != PENDING_LOC && v & IN_EVT != 0 {
        (BodyLog::Evt, v & !IN_EVT)
    } else {
        (BodyLog::Msg, v)
    }
}

/// The message location of a body inside the `evt` record at `evt_loc`.
pub(crate) fn body_in_evt(evt_loc: PackedLoc) -> PackedLoc {
    if evt_loc == PENDING_LOC {
        PENDING_LOC
    } else {
        evt_loc | IN_EVT
    }
}

/// Offset bits of a location packed near a base segment: a segment of up
/// to 128 MiB, the default size.
const NEAR_OFFSET_BITS: u32 = 27;

/// The base segment of a packed list none of whose entries is a location
/// yet (all pending): the first location sets it ([`pack_near`]).
pub(crate) const NO_BASE: u32 = u32::MAX;

/// A plain location (no log bit) packed into `segment_bits + 27` bits: its
/// segment's distance from `base`, then its offset. [`PENDING_LOC`] is
/// all ones, so the top distance is left to it. A base of [`NO_BASE`]
/// becomes the location's segment (for a real location). `None` when the
/// location is below the base, `2^segment_bits - 1` or more segments past
/// it, or 128 MiB or more into its segment. The event index
/// (`event_locs`) and a conversation's packed tail (`MsgMeta`'s `Pack`)
/// both store locations this way.
pub(crate) fn pack_near(loc: PackedLoc, base: &mut u32, segment_bits: u32) -> Option<u64> {
    let all_ones = (1u64 << (segment_bits + NEAR_OFFSET_BITS)) - 1;
    if loc == PENDING_LOC {
        return Some(all_ones);
    }
    let at = unpack(loc);
    if *base == NO_BASE {
        *base = at.segment;
    }
    let delta = u64::from(at.segment.checked_sub(*base)?);
    if delta >= (1 << segment_bits) - 1 || at.offset >= 1 << NEAR_OFFSET_BITS {
        return None;
    }
    Some((delta << NEAR_OFFSET_BITS) | u64::from(at.offset))
}

/// The location [`pack_near`] packed into `code`.
pub(crate) fn unpack_near(code: u64, base: u32, segment_bits: u32) -> PackedLoc {
    if code == (1u64 << (segment_bits + NEAR_OFFSET_BITS)) - 1 {
        return PENDING_LOC;
    }
    let segment = base + (code >> NEAR_OFFSET_BITS) as u32;
    (u64::from(segment) << 32) | (code & ((1 << NEAR_OFFSET_BITS) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::RecordLoc;

    #[test]
    fn a_body_location_in_evt_keeps_its_segment_and_offset_and_pending_stays_pending() {
        let plain = pack(RecordLoc {
            segment: 0x7fff_fffe,
            offset: 4096,
        });
        let tagged = body_in_evt(plain);
        assert_eq!(body_at(tagged), (BodyLog::Evt, plain));
        assert_eq!(unpack(tagged), unpack(plain));
        assert_eq!(body_at(plain), (BodyLog::Msg, plain));
        assert_eq!(body_in_evt(PENDING_LOC), PENDING_LOC);
        assert_eq!(body_at(PENDING_LOC).0, BodyLog::Msg);
    }

    #[test]
    fn a_location_packed_near_its_base_reads_back_and_one_out_of_reach_does_not_pack() {
        let at = |segment, offset| pack(RecordLoc { segment, offset });
        let mut base = NO_BASE;
        assert_eq!(pack_near(PENDING_LOC, &mut base, 5), Some((1 << 32) - 1));
        assert_eq!(base, NO_BASE, "a pending entry sets no base");
        let first = pack_near(at(70, 9), &mut base, 5).unwrap();
        assert_eq!(base, 70, "the first location sets it");
        assert_eq!(unpack_near(first, base, 5), at(70, 9));
        let top = pack_near(at(70 + 30, (1 << 27) - 1), &mut base, 5).unwrap();
        assert_eq!(unpack_near(top, base, 5), at(100, (1 << 27) - 1));
        assert_ne!(top, (1 << 32) - 1, "never the pending code");
        assert_eq!(unpack_near((1 << 32) - 1, base, 5), PENDING_LOC);
        for out in [at(69, 0), at(70 + 31, 0), at(70, 1 << 27)] {
            assert_eq!(pack_near(out, &mut base, 5), None, "{out:x}");
        }
        assert_eq!(
            pack_near(at(70 + 31, 0), &mut base, 13).map(|c| unpack_near(c, base, 13)),
            Some(at(101, 0))
        );
        assert_eq!(base, 70);
    }
}
