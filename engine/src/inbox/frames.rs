//! Which records a batch frame held when the frame's own CRC fails.
//!
//! The frame header's fields (length, record count, LSN) are only hints:
//! what counts is that records fill the frame exactly, each record header
//! carrying the back pointer of its own place. A record header whose back
//! pointer or length does not fit is taken with the value that fits only
//! if the record's CRC, which covers its header and is bound to its
//! segment and offset, then verifies: the record is then exactly what was
//! written. A record whose CRC fails stays *damaged*, and the caller
//! trusts none of it blindly.
//!
//! Salvage walks damaged frames with it to copy what they still hold, and
//! recovery to read the records of a torn tail it cuts; it knows only the
//! log's format, so both sit above it.

use crate::log::format::{
    decode_record_header, record_crc_ok, BATCH_HEADER_LEN, RECORD_HEADER_LEN,
};
use crate::log::{Lsn, RecordLoc, SegmentId};

/// A walked record: location, kind, payload, whether its CRC verifies.
pub(crate) type Walked<'a> = (RecordLoc, u8, &'a [u8], bool);

/// Walks the frame at `pos`, which ends at its header's length or at
/// `limit` (where the next valid frame starts, or the end of the data).
/// Returns its LSN (`expected`, the one the log's order gives it, else
/// the header's), its length and its records; `None` when no end makes
/// the records fit.
pub(crate) fn walk_frame<'a>(
    id: SegmentId,
    data: &'a [u8],
    pos: usize,
    limit: usize,
    expected: Option<Lsn>,
) -> Option<(Lsn, usize, Vec<Walked<'a>>)> {
    let h = data.get(pos..pos + BATCH_HEADER_LEN)?;
    let header_len = u32::from_le_bytes(h[0..4].try_into().ok()?) as usize;
    let header_lsn = u64::from_le_bytes(h[8..16].try_into().ok()?);
    let lsn = match expected {
        Some(e) => e,
        None if header_lsn != 0 => header_lsn,
        None => return None,
    };
    let by_header = header_len > BATCH_HEADER_LEN && pos + header_len <= limit;
    let ends = [
        (by_header, pos + header_len, false),
        (true, limit, limit == data.len()),
    ];
    for (usable, end, zero_ends) in ends {
        if let Some((records, at)) = usable
            .then(|| walk_records(id, data, pos, end, zero_ends))
            .flatten()
        {
            return Some((lsn, at - pos, records));
        }
    }
    None
}

/// The records from `pos` + the frame header up to `end` exactly (or, with
/// `zero_ends`, up to an all-zero record header: the end of the data).
fn walk_records<'a>(
    id: SegmentId,
    data: &'a [u8],
    pos: usize,
    end: usize,
    zero_ends: bool,
) -> Option<(Vec<Walked<'a>>, usize)> {
    let mut out = Vec::new();
    let mut at = pos + BATCH_HEADER_LEN;
    while at < end {
        if zero_ends && !out.is_empty() && is_zero_header(data, at) {
            break;
        }
        let (kind, payload, ok, next) = record_at(id, data, pos, at, end, zero_ends)?;
        let offset = u32::try_from(at).ok()?;
        out.push((
            RecordLoc {
                segment: id,
                offset,
            },
            kind,
            payload,
            ok,
        ));
        at = next;
    }
    (!out.is_empty()).then_some((out, at))
}

/// The record at `at` in the frame at `pos`: kind, payload, whether its
/// CRC verifies, and where the next record starts.
fn record_at(
    id: SegmentId,
    data: &[u8],
    pos: usize,
    at: usize,
    end: usize,
    zero_ends: bool,
) -> Option<(u8, &[u8], bool, usize)> {
    let header = data.get(at..at + RECORD_HEADER_LEN)?;
    let rh = decode_record_header(header);
    let rel = u32::try_from(at - pos).ok()?;
    let offset = u32::try_from(at).ok()?;
    let start = at + RECORD_HEADER_LEN;
    let fits = |next: usize| {
        next == end
            || (zero_ends && is_zero_header(data, next))
            || (next + RECORD_HEADER_LEN <= end
                && data
                    .get(next + 8..next + 12)
                    .zip(u32::try_from(next - pos).ok())
                    .is_some_and(|(b, rel)| b == rel.to_le_bytes()))
    };
    // As written.
    let written = (rh.back == rel)
        .then(|| start.checked_add(rh.len as usize))
        .flatten()
        .filter(|&next| next <= end);
    if let Some(next) = written {
        if record_crc_ok(id, offset, header, &data[start..next]) {
            return Some((rh.kind, &data[start..next], true, next));
        }
    }
    // A damaged back pointer or length: the values that fit, if the
    // record's CRC then verifies.
    let mut fixed = [0u8; RECORD_HEADER_LEN];
    fixed.copy_from_slice(header);
    fixed[8..12].copy_from_slice(&rel.to_le_bytes());
    for next in (start..=end).filter(|&n| fits(n)) {
        let len = u32::try_from(next - start).ok()?;
        fixed[0..4].copy_from_slice(&len.to_le_bytes());
        if record_crc_ok(id, offset, &fixed, &data[start..next]) {
            return Some((rh.kind, &data[start..next], true, next));
        }
    }
    // Damaged inside, but its header still fits its place.
    written
        .filter(|&next| fits(next))
        .map(|next| (rh.kind, &data[start..next], false, next))
}

fn is_zero_header(data: &[u8], at: usize) -> bool {
    data.get(at..at + RECORD_HEADER_LEN)
        .is_some_and(|h| h.iter().all(|&b| b == 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::format::BatchEncoder;

    /// A frame of three records at offset 32 of segment 7, and where each
    /// record starts.
    fn frame() -> (Vec<u8>, Vec<u32>) {
        let records = vec![
            (9u8, b"first record".to_vec()),
            (4, b"second".to_vec()),
            (2, vec![7u8; 40]),
        ];
        let mut out = vec![0u8; 32];
        let locs = BatchEncoder::encode(7, 32, 5, &records, &mut out);
        out.resize(out.len() + 64, 0);
        (out, locs.iter().map(|l| l.offset).collect())
    }

    fn walk(data: &[u8]) -> Option<Vec<(u8, bool)>> {
        walk_frame(7, data, 32, data.len(), Some(5))
            .map(|(_, _, r)| r.iter().map(|(_, k, _, ok)| (*k, *ok)).collect())
    }

    #[test]
    fn a_damaged_frame_header_loses_no_record() {
        for field in [0usize, 16, 9] {
            let (mut data, _) = frame();
            data[32 + field] ^= 0x40; // length, count, LSN
            assert_eq!(
                walk(&data),
                Some(vec![(9, true), (4, true), (2, true)]),
                "field at {field}"
            );
        }
    }

    #[test]
    fn a_damaged_back_pointer_or_length_is_taken_only_once_the_record_crc_verifies() {
        let (clean, at) = frame();
        for field in [8usize, 0] {
            let mut data = clean.clone();
            data[at[1] as usize + field] ^= 0x01;
            assert_eq!(walk(&data), Some(vec![(9, true), (4, true), (2, true)]));
        }
        // A damaged payload keeps its place but not its trust.
        let mut data = clean;
        data[at[1] as usize + RECORD_HEADER_LEN + 2] ^= 0x01;
        assert_eq!(walk(&data), Some(vec![(9, true), (4, false), (2, true)]));
    }
}
