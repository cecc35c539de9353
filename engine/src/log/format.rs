//! The on-disk byte layout of segment files: the segment header, batch
//! frames and the records inside them. Pure code: no IO.
//!
//! Invariants:
//! - every integer is little-endian and explicitly sized;
//! - every checksum is bound to the segment id, so bytes written for another
//!   segment (a reused or stale file) never verify here;
//! - a record's checksum is also bound to its own offset, so a record read
//!   at the wrong place never verifies;
//! - an all-zero batch header is the end of the data (segments are
//!   preallocated with zeros); zero is never a valid frame type.
//!
//! The layout is drawn on [`BatchEncoder`] and in `docs/FORMAT.md`.

use super::{Lsn, RecordLoc, SegmentId};

/// Magic bytes at offset 0 of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"INBXLOG\0";
/// Format version written in every segment header.
pub const FORMAT_VERSION: u32 = 1;
/// Size of the segment header; the first batch starts here.
pub const SEGMENT_HEADER_LEN: usize = 32;
/// Size of a batch frame header.
pub const BATCH_HEADER_LEN: usize = 24;
/// Size of a record header.
pub const RECORD_HEADER_LEN: usize = 16;
/// Frame type of a batch of records. Zero is reserved for "no frame".
pub const FRAME_TYPE_BATCH: u8 = 1;
/// Segment header flag: a prepared segment, written ahead of need and not
/// yet begun. It holds no records; its `first_lsn` means nothing (1). Only
/// the newest segments of a log may carry it.
pub const SEGMENT_FLAG_PREPARED: u32 = 1;
/// Segment header flag: the file once held another segment. Past the end
/// of this segment's data (an all-zero batch header) lie stale bytes of
/// the old segment, which never verify here (every CRC is bound to the
/// segment id, and ids never repeat).
pub const SEGMENT_FLAG_RECYCLED: u32 = 2;
const SEGMENT_FLAGS_KNOWN: u32 = SEGMENT_FLAG_PREPARED | SEGMENT_FLAG_RECYCLED;

const _: () = assert!(SEGMENT_HEADER_LEN == 8 + 4 + 4 + 8 + 4 + 4);
const _: () = assert!(BATCH_HEADER_LEN == 4 + 1 + 1 + 2 + 8 + 4 + 4);
const _: () = assert!(RECORD_HEADER_LEN == 4 + 1 + 3 + 4 + 4);

/// The decoded segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub segment: SegmentId,
    /// LSN of the first batch this segment holds (or will hold). LSNs
    /// continue from it even when every older segment has been deleted.
    pub first_lsn: Lsn,
    /// [`SEGMENT_FLAG_PREPARED`], [`SEGMENT_FLAG_RECYCLED`].
    pub flags: u32,
}

impl SegmentHeader {
    /// A prepared segment not yet begun: no records, no LSN.
    pub fn is_prepared(&self) -> bool {
        self.flags & SEGMENT_FLAG_PREPARED != 0
    }
    /// Stale bytes of an older segment may follow the data.
    pub fn is_recycled(&self) -> bool {
        self.flags & SEGMENT_FLAG_RECYCLED != 0
    }
}

/// Encodes the header of a begun segment (layout on [`BatchEncoder`]).
pub fn encode_segment_header(segment: SegmentId, first_lsn: Lsn) -> [u8; SEGMENT_HEADER_LEN] {
    encode_segment_header_with_flags(segment, first_lsn, 0)
}

/// Encodes a segment header with flags.
pub fn encode_segment_header_with_flags(
    segment: SegmentId,
    first_lsn: Lsn,
    flags: u32,
) -> [u8; SEGMENT_HEADER_LEN] {
    assert!(first_lsn >= 1, "LSNs start at 1");
    assert_eq!(flags & !SEGMENT_FLAGS_KNOWN, 0, "unknown segment flags");
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[0..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&segment.to_le_bytes());
    h[16..24].copy_from_slice(&first_lsn.to_le_bytes());
    h[24..28].copy_from_slice(&flags.to_le_bytes());
    let crc = crc32fast::hash(&h[0..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(
        decode_segment_header(segment, &h),
        Ok(SegmentHeader {
            segment,
            first_lsn,
            flags
        })
    );
    h
}

/// Decodes and checks a segment header against the id its file name gives.
pub fn decode_segment_header(segment: SegmentId, bytes: &[u8]) -> Result<SegmentHeader, String> {
    let h = bytes.get(..SEGMENT_HEADER_LEN).ok_or_else(|| {
        format!(
            "file is {} bytes, shorter than the segment header",
            bytes.len()
        )
    })?;
    if h[0..8] != SEGMENT_MAGIC {
        return Err("bad segment magic".into());
    }
    let crc = u32_at(h, 28);
    if crc != crc32fast::hash(&h[0..28]) {
        return Err("segment header checksum mismatch".into());
    }
    let version = u32_at(h, 8);
    if version != FORMAT_VERSION {
        return Err(format!("unsupported format version {version}"));
    }
    let id = u32_at(h, 12);
    if id != segment {
        return Err(format!(
            "header names segment {id}, file name says {segment}"
        ));
    }
    let first_lsn = u64_at(h, 16);
    if first_lsn == 0 {
        return Err("header first LSN is 0".into());
    }
    let flags = u32_at(h, 24);
    if flags & !SEGMENT_FLAGS_KNOWN != 0 {
        return Err(format!("unknown segment header flags {flags:#x}"));
    }
    Ok(SegmentHeader {
        segment,
        first_lsn,
        flags,
    })
}

/// Encodes batches of records into frames.
///
/// All integers little-endian. A segment file is:
///
/// ```text
/// segment header (32 bytes)
///  0        8         12        16                24        28        32
///  +--------+---------+---------+-----------------+---------+---------+
///  | magic  | version | segment | first_lsn       | flags   | hdr_crc |
///  | 8 B    | u32     | id u32  | u64             | u32     | u32     |
///  +--------+---------+---------+-----------------+---------+---------+
///  hdr_crc = crc32(bytes 0..28)
///  flags   = 1 prepared (not yet begun: no records, first_lsn = 1)
///          | 2 recycled (stale bytes of an older segment follow the data)
///
/// then batch frames, back to back, then zeros (preallocated space):
///
/// batch frame header (24 bytes)
///  0         4      5       6         8                16        20        24
///  +---------+------+-------+---------+----------------+---------+---------+
///  | len u32 | type | flags | rsvd u16| lsn u64        | count   | crc u32 |
///  |         | = 1  | = 0   | = 0     |                | u32     |         |
///  +---------+------+-------+---------+----------------+---------+---------+
///  len   = whole frame in bytes, header included
///  count = number of records in the body
///  crc   = crc32(segment_id u32 ‖ header bytes 0..20 ‖ body)
///  body  = `count` records, back to back, exactly filling `len - 24`
///
/// record (16-byte header + payload)
///  0         4      5         8          12        16
///  +---------+------+---------+----------+---------+-------------------+
///  | len u32 | kind | rsvd 3B | back u32 | crc u32 | payload (len B)   |
///  +---------+------+---------+----------+---------+-------------------+
///  back = record offset - offset of its batch frame
///  crc  = crc32(segment_id u32 ‖ record offset u32 ‖ header bytes 0..12 ‖ payload)
/// ```
///
/// A [`RecordLoc`] is the segment id and the offset of a record header.
/// The per-record CRC lets a single record be read and checked without
/// reading its whole batch; the batch CRC makes the batch atomic at
/// recovery.
pub struct BatchEncoder;

impl BatchEncoder {
    /// Bytes the frame of `records` takes, or `None` if it overflows u32.
    pub fn frame_len(records: &[(u8, Vec<u8>)]) -> Option<u64> {
        let mut len = BATCH_HEADER_LEN as u64;
        for (_, payload) in records {
            len += RECORD_HEADER_LEN as u64 + payload.len() as u64;
        }
        (len <= u64::from(u32::MAX) && records.len() <= u32::MAX as usize).then_some(len)
    }

    /// Encodes one batch frame to be written at `offset` of `segment`,
    /// appending it to `out`; returns the record locations.
    pub fn encode(
        segment: SegmentId,
        offset: u32,
        lsn: Lsn,
        records: &[(u8, Vec<u8>)],
        out: &mut Vec<u8>,
    ) -> Vec<RecordLoc> {
        let frame_len = Self::frame_len(records).expect("caller checked the frame length");
        out.reserve(frame_len as usize);
        let start = Self::begin(out);
        for (kind, payload) in records {
            Self::push_record(out, start, *kind, |o| o.extend_from_slice(payload));
        }
        Self::seal(
            segment,
            offset,
            lsn,
            &mut out[start..],
            records.len() as u32,
        )
    }

    /// Begins a batch frame at the end of `out`: room for its header,
    /// which [`BatchEncoder::seal`] fills in. Returns where it starts.
    pub(crate) fn begin(out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.extend_from_slice(&[0; BATCH_HEADER_LEN]);
        start
    }

    /// Appends one record to the frame begun at `start` of `out`: its
    /// header, then the payload `write` appends. The record's CRC depends
    /// on where the frame is written, so [`BatchEncoder::seal`] computes
    /// it. A payload or frame past `u32` lengths makes a frame no segment
    /// takes; the log refuses it by its length before sealing.
    pub(crate) fn push_record(
        out: &mut Vec<u8>,
        start: usize,
        kind: u8,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        let h = out.len();
        out.extend_from_slice(&[0; RECORD_HEADER_LEN]);
        write(out);
        let len = (out.len() - h - RECORD_HEADER_LEN) as u32;
        let rel = (h - start) as u32;
        out[h..h + 4].copy_from_slice(&len.to_le_bytes());
        out[h + 4] = kind;
        out[h + 8..h + 12].copy_from_slice(&rel.to_le_bytes());
    }

    /// The `count` records of a frame built by [`BatchEncoder::begin`] and
    /// [`BatchEncoder::push_record`]: (kind, payload).
    pub(crate) fn records(frame: &[u8], count: usize) -> impl Iterator<Item = (u8, &[u8])> + '_ {
        let mut pos = BATCH_HEADER_LEN;
        (0..count).map(move |_| {
            let h = decode_record_header(&frame[pos..pos + RECORD_HEADER_LEN]);
            let payload = &frame[pos + RECORD_HEADER_LEN..pos + RECORD_HEADER_LEN + h.len as usize];
            pos += RECORD_HEADER_LEN + h.len as usize;
            (h.kind, payload)
        })
    }

    /// Fills in a frame of `count` records built by [`BatchEncoder::begin`]
    /// and [`BatchEncoder::push_record`], to be written at `offset` of
    /// `segment` as `lsn`: the batch header, each record's CRC and the
    /// batch CRC. Returns the record locations.
    pub(crate) fn seal(
        segment: SegmentId,
        offset: u32,
        lsn: Lsn,
        frame: &mut [u8],
        count: u32,
    ) -> Vec<RecordLoc> {
        let frame_len = frame.len();
        assert!(lsn >= 1);
        assert!(u64::from(offset) + frame_len as u64 <= u64::from(u32::MAX));
        frame[0..4].copy_from_slice(&(frame_len as u32).to_le_bytes());
        frame[4] = FRAME_TYPE_BATCH;
        frame[5..8].fill(0);
        frame[8..16].copy_from_slice(&lsn.to_le_bytes());
        frame[16..20].copy_from_slice(&count.to_le_bytes());
        let mut locs = Vec::with_capacity(count as usize);
        let mut pos = BATCH_HEADER_LEN;
        for _ in 0..count {
            let h = decode_record_header(&frame[pos..pos + RECORD_HEADER_LEN]);
            let end = pos + RECORD_HEADER_LEN + h.len as usize;
            let rec_offset = offset + pos as u32;
            let crc = record_crc(
                segment,
                rec_offset,
                &frame[pos..pos + 12],
                &frame[pos + RECORD_HEADER_LEN..end],
            );
            frame[pos + 12..pos + RECORD_HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
            locs.push(RecordLoc {
                segment,
                offset: rec_offset,
            });
            pos = end;
        }
        assert_eq!(pos, frame_len, "frame length drifted");
        let crc = batch_crc(segment, &frame[..20], &frame[BATCH_HEADER_LEN..]);
        frame[20..24].copy_from_slice(&crc.to_le_bytes());
        debug_assert!(decode_batch(segment, frame, 0, offset as usize).is_ok());
        locs
    }
}

fn batch_crc(segment: SegmentId, header20: &[u8], body: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&segment.to_le_bytes());
    crc.update(header20);
    crc.update(body);
    crc.finalize()
}

fn record_crc(segment: SegmentId, rec_offset: u32, header12: &[u8], payload: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&segment.to_le_bytes());
    crc.update(&rec_offset.to_le_bytes());
    crc.update(header12);
    crc.update(payload);
    crc.finalize()
}

/// Why no batch could be decoded at an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The header is all zeros: the normal end of the written data.
    End,
    /// Not a valid batch frame (torn, corrupt or stale bytes).
    Invalid(String),
}

/// A batch frame that passed every check.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    pub lsn: Lsn,
    pub frame_len: usize,
    pub count: u32,
    /// Offset of the frame in its segment.
    pub offset: usize,
    body: &'a [u8],
    segment: SegmentId,
}

impl<'a> BatchView<'a> {
    /// The records of the batch, in order, with their locations.
    pub fn records(&self) -> impl Iterator<Item = (RecordLoc, u8, &'a [u8])> + 'a {
        let body = self.body;
        let segment = self.segment;
        let base = self.offset + BATCH_HEADER_LEN;
        let mut pos = 0usize;
        std::iter::from_fn(move || {
            if pos >= body.len() {
                return None;
            }
            let len = u32_at(body, pos) as usize;
            let kind = body[pos + 4];
            let payload = &body[pos + RECORD_HEADER_LEN..pos + RECORD_HEADER_LEN + len];
            let loc = RecordLoc {
                segment,
                offset: (base + pos) as u32,
            };
            pos += RECORD_HEADER_LEN + len;
            Some((loc, kind, payload))
        })
    }
}

/// Decodes and fully checks the batch frame at `buf[pos..]`, where `buf`
/// starts at segment offset `buf_offset` (so the frame's segment offset is
/// `buf_offset + pos`). Checks the batch CRC, the record structure and
/// every record CRC.
pub fn decode_batch(
    segment: SegmentId,
    buf: &[u8],
    pos: usize,
    buf_offset: usize,
) -> Result<BatchView<'_>, FrameError> {
    let invalid = |s: String| Err(FrameError::Invalid(s));
    let Some(h) = buf.get(pos..pos + BATCH_HEADER_LEN) else {
        let rest = buf.get(pos..).unwrap_or(&[]);
        if rest.iter().all(|&b| b == 0) {
            return Err(FrameError::End);
        }
        return invalid(format!(
            "{} bytes, too short for a batch header",
            rest.len()
        ));
    };
    if h.iter().all(|&b| b == 0) {
        return Err(FrameError::End);
    }
    let len = u32_at(h, 0) as usize;
    if h[4] != FRAME_TYPE_BATCH {
        return invalid(format!("unknown frame type {}", h[4]));
    }
    if h[5] != 0 || h[6] != 0 || h[7] != 0 {
        return invalid("reserved header bytes are not zero".into());
    }
    if len < BATCH_HEADER_LEN {
        return invalid(format!("frame length {len} is shorter than its header"));
    }
    let Some(frame) = buf.get(pos..pos + len) else {
        return invalid(format!(
            "frame length {len} runs past the end of the data ({} bytes left)",
            buf.len() - pos
        ));
    };
    let lsn = u64_at(h, 8);
    let count = u32_at(h, 16);
    let crc = u32_at(h, 20);
    let body = &frame[BATCH_HEADER_LEN..];
    if crc != batch_crc(segment, &h[0..20], body) {
        return invalid("batch checksum mismatch".into());
    }
    // The checksum matched; now the structure must be exact too.
    let frame_offset = buf_offset + pos;
    let mut rpos = 0usize;
    let mut n = 0u32;
    while rpos < body.len() {
        let Some(rh) = body.get(rpos..rpos + RECORD_HEADER_LEN) else {
            return invalid(format!("record {n} header overruns the batch"));
        };
        let rlen = u32_at(rh, 0) as usize;
        let back = u32_at(rh, 8) as usize;
        let rel = BATCH_HEADER_LEN + rpos;
        if back != rel {
            return invalid(format!("record {n} back pointer {back} != {rel}"));
        }
        let Some(payload) = body.get(rpos + RECORD_HEADER_LEN..rpos + RECORD_HEADER_LEN + rlen)
        else {
            return invalid(format!("record {n} payload overruns the batch"));
        };
        let rec_offset = (frame_offset + rel) as u32;
        if u32_at(rh, 12) != record_crc(segment, rec_offset, &rh[0..12], payload) {
            return invalid(format!("record {n} checksum mismatch"));
        }
        rpos += RECORD_HEADER_LEN + rlen;
        n += 1;
    }
    if n != count {
        return invalid(format!("header says {count} records, body has {n}"));
    }
    if lsn == 0 {
        return invalid("batch LSN is 0".into());
    }
    Ok(BatchView {
        lsn,
        frame_len: len,
        count,
        offset: frame_offset,
        body,
        segment,
    })
}

/// Cheap test of whether a valid batch with an LSN above `after_lsn`
/// starts at `buf[pos..]`; used to tell a torn tail (nothing valid follows
/// the damage) from corruption (valid data after damage).
pub fn valid_batch_at(
    segment: SegmentId,
    buf: &[u8],
    pos: usize,
    buf_offset: usize,
    after_lsn: Lsn,
) -> Option<Lsn> {
    let h = buf.get(pos..pos + BATCH_HEADER_LEN)?;
    if h[4] != FRAME_TYPE_BATCH || h[5] != 0 || h[6] != 0 || h[7] != 0 {
        return None;
    }
    let len = u32_at(h, 0) as usize;
    if len < BATCH_HEADER_LEN || pos + len > buf.len() || u64_at(h, 8) <= after_lsn {
        return None;
    }
    decode_batch(segment, buf, pos, buf_offset)
        .ok()
        .map(|b| b.lsn)
}

/// A decoded record header.
#[derive(Debug, Clone, Copy)]
pub struct RecordHeader {
    pub len: u32,
    pub kind: u8,
    /// Offset of the record minus the offset of its batch frame.
    pub back: u32,
    pub crc: u32,
}

pub fn decode_record_header(h: &[u8]) -> RecordHeader {
    RecordHeader {
        len: u32_at(h, 0),
        kind: h[4],
        back: u32_at(h, 8),
        crc: u32_at(h, 12),
    }
}

/// Checks a record's CRC given its header bytes and payload.
pub fn record_crc_ok(segment: SegmentId, rec_offset: u32, header: &[u8], payload: &[u8]) -> bool {
    u32_at(header, 12) == record_crc(segment, rec_offset, &header[0..12], payload)
}

/// The frame length and record count from a batch header, unchecked.
pub fn peek_batch_header(h: &[u8]) -> Option<(u32, u8, u32)> {
    let h = h.get(..BATCH_HEADER_LEN)?;
    Some((u32_at(h, 0), h[4], u32_at(h, 16)))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recs() -> Vec<(u8, Vec<u8>)> {
        vec![
            (1, b"hello".to_vec()),
            (7, Vec::new()),
            (2, vec![0xAB; 300]),
        ]
    }

    #[test]
    fn encoded_batch_decodes_to_the_same_records_and_locations() {
        let mut out = vec![0u8; 100];
        let locs = BatchEncoder::encode(9, 100, 42, &recs(), &mut out);
        let b = decode_batch(9, &out, 100, 0).expect("valid");
        assert_eq!(b.lsn, 42);
        assert_eq!(b.count, 3);
        let got: Vec<_> = b.records().map(|(l, k, p)| (l, k, p.to_vec())).collect();
        let want: Vec<_> = locs
            .iter()
            .zip(recs())
            .map(|(l, (k, p))| (*l, k, p))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn batch_checksum_is_bound_to_the_segment_id() {
        let mut out = Vec::new();
        BatchEncoder::encode(1, 32, 1, &recs(), &mut out);
        assert!(decode_batch(1, &out, 0, 32).is_ok());
        assert!(matches!(
            decode_batch(2, &out, 0, 32),
            Err(FrameError::Invalid(_))
        ));
    }

    #[test]
    fn every_single_bit_flip_in_a_frame_is_detected() {
        let mut out = Vec::new();
        BatchEncoder::encode(3, 32, 5, &recs(), &mut out);
        for bit in 0..out.len() * 8 {
            let mut bad = out.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode_batch(3, &bad, 0, 32).is_err(),
                "flip of bit {bit} went unnoticed"
            );
        }
    }

    #[test]
    fn zero_header_is_the_end_not_an_error() {
        let zeros = [0u8; 64];
        assert_eq!(decode_batch(1, &zeros, 0, 32).unwrap_err(), FrameError::End);
        assert_eq!(
            decode_batch(1, &zeros, 50, 32).unwrap_err(),
            FrameError::End
        );
    }

    #[test]
    fn segment_header_round_trips_and_rejects_a_wrong_id() {
        let h = encode_segment_header(17, 1234);
        assert_eq!(
            decode_segment_header(17, &h),
            Ok(SegmentHeader {
                segment: 17,
                first_lsn: 1234,
                flags: 0,
            })
        );
        assert!(decode_segment_header(18, &h).is_err());
    }

    #[test]
    fn segment_header_flags_round_trip_and_unknown_flags_are_refused() {
        let h =
            encode_segment_header_with_flags(3, 1, SEGMENT_FLAG_PREPARED | SEGMENT_FLAG_RECYCLED);
        let d = decode_segment_header(3, &h).unwrap();
        assert!(d.is_prepared() && d.is_recycled());
        let mut bad = h;
        bad[24] |= 0x80;
        let crc = crc32fast::hash(&bad[0..28]);
        bad[28..32].copy_from_slice(&crc.to_le_bytes());
        assert!(decode_segment_header(3, &bad)
            .unwrap_err()
            .contains("flags"));
    }
}
