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
}
