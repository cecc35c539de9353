//! Record locations as the indexes hold them: `segment << 32 | offset`,
//! 8 bytes per index entry.

/// A location in a log, packed as `segment << 32 | offset`.
pub(crate) type PackedLoc = u64;

/// Placeholder for a record whose location is not known yet (its batch is
/// not submitted); never visible to readers, which stop at the committed
/// watermark.
pub(crate) const PENDING_LOC: PackedLoc = u64::MAX;

pub(crate) fn pack(loc: crate::log::RecordLoc) -> PackedLoc {
    (u64::from(loc.segment) << 32) | u64::from(loc.offset)
}

pub(crate) fn unpack(v: PackedLoc) -> crate::log::RecordLoc {
    crate::log::RecordLoc {
        segment: (v >> 32) as u32,
        offset: (v & 0xffff_ffff) as u32,
    }
}
