//! The records the inbox writes: message records in the `msg` log and
//! effect records in the `evt` (command) log.
//!
//! An effect is the *outcome* of a command as decided by the sequencer
//! (ids, seqs, the device row after the change, the stamped time), never
//! the request itself: replay applies effects with [`super::state::State::apply`]
//! and never re-decides, so it rebuilds exactly the state the sequencer had
//! even if configuration or the clock differ at restart.
//!
//! ## `msg` record (log record kind [`MSG_RECORD`])
//! ```text
//! 0  u8   format version (1)
//! 1  u8   flags: bit 0 = payload is zstd-compressed
//! 2  u8   message kind (0 normal, 1 join, 2 leave, 3 recall, 4 edit)
//! 3  u16  msg_type
//! 5  u64  conv
//! 13 u64  msg_seq
//! 21 u64  msg_id
//! 29 u64  sender
//! 37 u64  target msg_id (0 = none)
//! 45 u64  sent_at_ms
//! 53 u32  raw payload length (before compression)
//! 57 u32  stored length, then the stored payload bytes
//! ```
//!
//! ## `evt` records (all little-endian, first byte = format version 1)
//! - [`EFFECT_MSG`]: conv u64, msg_seq u64, msg_id u64, sender u64, kind u8,
//!   msg_type u16, target_seq u64, at_ms u64, msg_loc u64 (segment << 32 |
//!   offset), client_msg_id u128, summary (u8 length + bytes, <= 64).
//! - [`EFFECT_READ`]: uid u64, conv u64, read_seq u64, at_ms u64.
//! - [`EFFECT_FLAGS`]: uid u64, conv u64, muted u8, pinned u8, at_ms u64.
//! - [`EFFECT_DEVICE`]: uid u64, then the full device row (see
//!   [`DeviceRow`]): the row after the change, so replay is an upsert.
//! - [`EFFECT_SNAPSHOT`], [`EFFECT_TRIM`], [`EFFECT_TRIM_MSGS`],
//!   [`EFFECT_RELOCATE`] and copies (kind | [`COPY_FLAG`]): compaction and
//!   snapshot records, laid out in [`super::fence`].

use bytes::Bytes;

use super::codec::{DecodeError, DecodeResult, Reader, Writer};
use crate::api::*;

pub(crate) const MSG_RECORD: u8 = 1;
pub(crate) const EFFECT_MSG: u8 = 1;
pub(crate) const EFFECT_READ: u8 = 2;
pub(crate) const EFFECT_FLAGS: u8 = 3;
pub(crate) const EFFECT_DEVICE: u8 = 4;
pub(crate) const EFFECT_SNAPSHOT: u8 = 5;
pub(crate) const EFFECT_TRIM: u8 = 6;
pub(crate) const EFFECT_RELOCATE: u8 = 7;
pub(crate) const EFFECT_TRIM_MSGS: u8 = 8;
/// Set on the kind of a record copied forward by a segment rewrite.
pub(crate) const COPY_FLAG: u8 = 0x80;

const FORMAT_VERSION: u8 = 1;
const FLAG_ZSTD: u8 = 1;
/// Payloads shorter than this are never worth a zstd frame.
const COMPRESS_MIN_BYTES: usize = 64;

/// A location in a log, packed as `segment << 32 | offset`: 8 bytes per
/// index entry.
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

pub(crate) fn kind_code(kind: MessageKind) -> u8 {
    match kind {
        MessageKind::Normal => 0,
        MessageKind::Join => 1,
        MessageKind::Leave => 2,
        MessageKind::Recall => 3,
        MessageKind::Edit => 4,
    }
}

pub(crate) fn kind_from_code(code: u8) -> DecodeResult<MessageKind> {
    Ok(match code {
        0 => MessageKind::Normal,
        1 => MessageKind::Join,
        2 => MessageKind::Leave,
        3 => MessageKind::Recall,
        4 => MessageKind::Edit,
        _ => return Err(DecodeError("unknown message kind")),
    })
}

/// A payload as stored: compressed with zstd when that is smaller (R8).
/// Built on the caller's thread so compression never runs in the sequencer.
/// Compression is deterministic: equal payloads store equal bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredPayload {
    pub compressed: bool,
    pub raw_len: u32,
    pub bytes: Bytes,
}

impl StoredPayload {
    pub fn new(payload: &Bytes) -> Self {
        let raw_len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        if payload.len() >= COMPRESS_MIN_BYTES {
            if let Ok(c) = COMPRESSOR
                .with(|z| z.borrow_mut().as_mut().map(|z| z.compress(payload)))
                .unwrap_or_else(|| zstd::bulk::compress(payload, ZSTD_LEVEL))
            {
                if c.len() < payload.len() {
                    return Self {
                        compressed: true,
                        raw_len,
                        bytes: Bytes::from(c),
                    };
                }
            }
        }
        Self {
            compressed: false,
            raw_len,
            bytes: payload.clone(),
        }
    }
}

const ZSTD_LEVEL: i32 = 3;

thread_local! {
    // A zstd context costs far more to set up than a small payload costs
    // to (de)compress, so each thread keeps one.
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        std::cell::RefCell::new(zstd::bulk::Compressor::new(ZSTD_LEVEL).ok());
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        std::cell::RefCell::new(zstd::bulk::Decompressor::new().ok());
}

/// The header fields of a message record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MsgHeader {
    pub kind: MessageKind,
    pub msg_type: MsgType,
    pub conv: ConvId,
    pub msg_seq: MsgSeq,
    pub msg_id: MsgId,
    pub sender: Uid,
    pub target: MsgId,
    pub sent_at_ms: TimestampMs,
}

/// Where `msg_loc` sits in an encoded [`Effect::Msg`] record: after the
/// version byte, conv, msg_seq, msg_id, sender (u64 each), kind (u8),
/// msg_type (u16), target_seq and at_ms (u64 each). Every field before it
/// is fixed-width.
const MSG_LOC_AT: usize = 1 + 4 * 8 + 1 + 2 + 2 * 8;

/// Writes `loc` into an encoded [`Effect::Msg`] record, so the sequencer
/// encodes each effect once and fills in the message's location when the
/// `msg` batch has been placed.
pub(crate) fn set_msg_loc(record: &mut [u8], loc: PackedLoc) {
    record[MSG_LOC_AT..MSG_LOC_AT + 8].copy_from_slice(&loc.to_le_bytes());
}

/// Bytes one message adds to a round besides its payload, at most: its
/// `msg` record's header and fields, its `evt` record (summary included),
/// and both record headers. Pinned by a test.
pub(crate) const MESSAGE_OVERHEAD_MAX: u64 = 512;

pub(crate) fn encode_msg_record(h: &MsgHeader, p: &StoredPayload) -> Vec<u8> {
    let mut w = Writer::with_capacity(64 + p.bytes.len());
    w.u8(FORMAT_VERSION);
    w.u8(if p.compressed { FLAG_ZSTD } else { 0 });
    w.u8(kind_code(h.kind));
    w.u16(h.msg_type);
    w.u64(h.conv);
    w.u64(h.msg_seq);
    w.u64(h.msg_id);
    w.u64(h.sender);
    w.u64(h.target);
    w.u64(h.sent_at_ms);
    w.u32(p.raw_len);
    w.bytes(&p.bytes);
    w.buf
}

/// Decodes a message record; `raw_len_max` bounds the decompressed size.
pub(crate) fn decode_msg_record(buf: &[u8], raw_len_max: u32) -> DecodeResult<(MsgHeader, Bytes)> {
    let mut r = Reader::new(buf);
    if r.u8()? != FORMAT_VERSION {
        return Err(DecodeError("unknown message record version"));
    }
    let flags = r.u8()?;
    let h = MsgHeader {
        kind: kind_from_code(r.u8()?)?,
        msg_type: r.u16()?,
        conv: r.u64()?,
        msg_seq: r.u64()?,
        msg_id: r.u64()?,
        sender: r.u64()?,
        target: r.u64()?,
        sent_at_ms: r.u64()?,
    };
    let raw_len = r.u32()?;
    let stored = r.bytes()?;
    if raw_len > raw_len_max {
        return Err(DecodeError("payload longer than the configured maximum"));
    }
    let payload = if flags & FLAG_ZSTD != 0 {
        let out = DECOMPRESSOR
            .with(|z| {
                z.borrow_mut()
                    .as_mut()
                    .map(|z| z.decompress(stored, raw_len as usize))
            })
            .unwrap_or_else(|| zstd::bulk::decompress(stored, raw_len as usize))
            .map_err(|_| DecodeError("zstd payload does not decompress"))?;
        if out.len() != raw_len as usize {
            return Err(DecodeError("decompressed length mismatch"));
        }
        Bytes::from(out)
    } else {
        Bytes::copy_from_slice(stored)
    };
    Ok((h, payload))
}

/// A message's effect on the state: the message itself, its fan-out and
/// the recipients' conversation state (R4, R5, R6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MsgEffect {
    pub conv: ConvId,
    pub msg_seq: MsgSeq,
    pub msg_id: MsgId,
    pub sender: Uid,
    pub kind: MessageKind,
    pub msg_type: MsgType,
    /// For recall/edit: the target's `msg_seq` (0 = none).
    pub target_seq: MsgSeq,
    pub at_ms: TimestampMs,
    pub msg_loc: PackedLoc,
    /// 0 for join/leave, which are not idempotency-keyed.
    pub client_msg_id: ClientMsgId,
    pub summary: Bytes,
}

/// A device row after a change. Replay upserts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceRow {
    pub device: DeviceId,
    pub generation: Generation,
    pub acked_sync_seq: SyncSeq,
    pub state: DeviceState,
    pub last_seen_ms: TimestampMs,
    pub lease: Option<LeaseInfo>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    Msg(MsgEffect),
    Read {
        uid: Uid,
        conv: ConvId,
        read_seq: MsgSeq,
        at_ms: TimestampMs,
    },
    Flags {
        uid: Uid,
        conv: ConvId,
        flags: ConvFlags,
        at_ms: TimestampMs,
    },
    Device {
        uid: Uid,
        row: DeviceRow,
    },
    /// A snapshot row after a change (R18); replay upserts or drops it.
    Snapshot {
        uid: Uid,
        row: super::fence::SnapshotRow,
    },
    /// The user's retained events now start after `events_base` (R19).
    Trim {
        uid: Uid,
        events_base: SyncSeq,
    },
    /// The conversation's retained messages now start after `msgs_base`
    /// (history retention, R19).
    TrimMsgs {
        conv: ConvId,
        msgs_base: MsgSeq,
    },
    /// Events now read from copies of their records (segment rewrite).
    Relocate(Vec<super::fence::Relocation>),
    /// A live record copied forward by a segment rewrite: data for the
    /// events that point at it; applying it changes nothing.
    Copied(Box<Effect>),
}

pub(crate) fn state_code(s: DeviceState) -> u8 {
    match s {
        DeviceState::Active => 0,
        DeviceState::Recovering => 1,
        DeviceState::Resetting => 2,
        DeviceState::Revoked => 3,
    }
}

pub(crate) fn state_from_code(c: u8) -> DecodeResult<DeviceState> {
    Ok(match c {
        0 => DeviceState::Active,
        1 => DeviceState::Recovering,
        2 => DeviceState::Resetting,
        3 => DeviceState::Revoked,
        _ => return Err(DecodeError("unknown device state")),
    })
}

pub(crate) fn put_device_row(w: &mut Writer, row: &DeviceRow) {
    w.u64(row.device);
    w.u64(row.generation);
    w.u64(row.acked_sync_seq);
    w.u8(state_code(row.state));
    w.u64(row.last_seen_ms);
    match &row.lease {
        None => w.u8(0),
        Some(l) => {
            w.u8(1);
            w.u64(l.lease_id);
            w.u64(l.resume_from);
            w.u64(l.hwm);
            w.u64(l.expires_at_ms);
        }
    }
}

pub(crate) fn get_device_row(r: &mut Reader<'_>) -> DecodeResult<DeviceRow> {
    let device = r.u64()?;
    let generation = r.u64()?;
    let acked_sync_seq = r.u64()?;
    let state = state_from_code(r.u8()?)?;
    let last_seen_ms = r.u64()?;
    let lease = match r.u8()? {
        0 => None,
        1 => Some(LeaseInfo {
            lease_id: r.u64()?,
            resume_from: r.u64()?,
            hwm: r.u64()?,
            expires_at_ms: r.u64()?,
        }),
        _ => return Err(DecodeError("bad lease tag")),
    };
    Ok(DeviceRow {
        device,
        generation,
        acked_sync_seq,
        state,
        last_seen_ms,
        lease,
    })
}

impl Effect {
    /// The `evt` log record kind.
    pub fn record_kind(&self) -> u8 {
        match self {
            Effect::Msg(_) => EFFECT_MSG,
            Effect::Read { .. } => EFFECT_READ,
            Effect::Flags { .. } => EFFECT_FLAGS,
            Effect::Device { .. } => EFFECT_DEVICE,
            Effect::Snapshot { .. } => EFFECT_SNAPSHOT,
            Effect::Trim { .. } => EFFECT_TRIM,
            Effect::TrimMsgs { .. } => EFFECT_TRIM_MSGS,
            Effect::Relocate(_) => EFFECT_RELOCATE,
            Effect::Copied(inner) => inner.record_kind() | COPY_FLAG,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        if let Effect::Copied(inner) = self {
            return inner.encode();
        }
        let mut w = Writer::with_capacity(96);
        w.u8(FORMAT_VERSION);
        match self {
            Effect::Msg(m) => {
                w.u64(m.conv);
                w.u64(m.msg_seq);
                w.u64(m.msg_id);
                w.u64(m.sender);
                w.u8(kind_code(m.kind));
                w.u16(m.msg_type);
                w.u64(m.target_seq);
                w.u64(m.at_ms);
                w.u64(m.msg_loc);
                w.u128(m.client_msg_id);
                w.short_bytes(&m.summary);
            }
            Effect::Read {
                uid,
                conv,
                read_seq,
                at_ms,
            } => {
                w.u64(*uid);
                w.u64(*conv);
                w.u64(*read_seq);
                w.u64(*at_ms);
            }
            Effect::Flags {
                uid,
                conv,
                flags,
                at_ms,
            } => {
                w.u64(*uid);
                w.u64(*conv);
                w.bool(flags.muted);
                w.bool(flags.pinned);
                w.u64(*at_ms);
            }
            Effect::Device { uid, row } => {
                w.u64(*uid);
                put_device_row(&mut w, row);
            }
            Effect::Snapshot { .. }
            | Effect::Trim { .. }
            | Effect::TrimMsgs { .. }
            | Effect::Relocate(_) => {
                super::fence::encode_effect(&mut w, self);
            }
            // Returned above.
            Effect::Copied(_) => {}
        }
        w.buf
    }

    pub fn decode(record_kind: u8, buf: &[u8]) -> DecodeResult<Effect> {
        if record_kind & COPY_FLAG != 0 {
            let inner = Effect::decode(record_kind & !COPY_FLAG, buf)?;
            return Ok(Effect::Copied(Box::new(inner)));
        }
        let mut r = Reader::new(buf);
        if r.u8()? != FORMAT_VERSION {
            return Err(DecodeError("unknown effect record version"));
        }
        let effect = match record_kind {
            EFFECT_MSG => Effect::Msg(MsgEffect {
                conv: r.u64()?,
                msg_seq: r.u64()?,
                msg_id: r.u64()?,
                sender: r.u64()?,
                kind: kind_from_code(r.u8()?)?,
                msg_type: r.u16()?,
                target_seq: r.u64()?,
                at_ms: r.u64()?,
                msg_loc: r.u64()?,
                client_msg_id: r.u128()?,
                summary: r.short_bytes()?,
            }),
            EFFECT_READ => Effect::Read {
                uid: r.u64()?,
                conv: r.u64()?,
                read_seq: r.u64()?,
                at_ms: r.u64()?,
            },
            EFFECT_FLAGS => Effect::Flags {
                uid: r.u64()?,
                conv: r.u64()?,
                flags: ConvFlags {
                    muted: r.bool()?,
                    pinned: r.bool()?,
                },
                at_ms: r.u64()?,
            },
            EFFECT_DEVICE => Effect::Device {
                uid: r.u64()?,
                row: get_device_row(&mut r)?,
            },
            EFFECT_SNAPSHOT | EFFECT_TRIM | EFFECT_TRIM_MSGS | EFFECT_RELOCATE => {
                super::fence::decode_effect(record_kind, &mut r)?
            }
            _ => return Err(DecodeError("unknown effect record kind")),
        };
        if !r.is_empty() {
            return Err(DecodeError("trailing bytes in effect record"));
        }
        Ok(effect)
    }

    /// The sync event a user sees for this effect, at `sync_seq`.
    pub fn to_event(&self, sync_seq: SyncSeq) -> Option<SyncEvent> {
        Some(match self {
            Effect::Msg(m) => SyncEvent {
                sync_seq,
                kind: match m.kind {
                    MessageKind::Normal => EventKind::Msg,
                    MessageKind::Recall => EventKind::Recall,
                    MessageKind::Edit => EventKind::Edit,
                    MessageKind::Join | MessageKind::Leave => EventKind::Member,
                },
                conv: m.conv,
                msg_seq: m.msg_seq,
                msg_id: m.msg_id,
                at_ms: m.at_ms,
                summary: m.summary.clone(),
            },
            Effect::Read {
                conv,
                read_seq,
                at_ms,
                ..
            } => SyncEvent {
                sync_seq,
                kind: EventKind::Read,
                conv: *conv,
                msg_seq: *read_seq,
                msg_id: 0,
                at_ms: *at_ms,
                summary: Bytes::new(),
            },
            Effect::Flags {
                conv, flags, at_ms, ..
            } => SyncEvent {
                sync_seq,
                kind: EventKind::Conv,
                conv: *conv,
                msg_seq: 0,
                msg_id: 0,
                at_ms: *at_ms,
                summary: Bytes::copy_from_slice(&[
                    u8::from(flags.muted) | (u8::from(flags.pinned) << 1)
                ]),
            },
            Effect::Copied(inner) => return inner.to_event(sync_seq),
            Effect::Device { .. }
            | Effect::Snapshot { .. }
            | Effect::Trim { .. }
            | Effect::TrimMsgs { .. }
            | Effect::Relocate(_) => return None,
        })
    }
}

/// The inline summary of a message event (at most [`SUMMARY_BYTES_MAX`]):
/// normal and edit messages carry the payload's first bytes; a recall
/// carries the target `msg_id` (u64 LE); join and leave carry the member's
/// uid (u64 LE).
pub(crate) fn summary_for(kind: MessageKind, payload: &[u8], target: MsgId, member: Uid) -> Bytes {
    match kind {
        MessageKind::Normal | MessageKind::Edit => {
            Bytes::copy_from_slice(&payload[..payload.len().min(SUMMARY_BYTES_MAX)])
        }
        MessageKind::Recall => Bytes::copy_from_slice(&target.to_le_bytes()),
        MessageKind::Join | MessageKind::Leave => Bytes::copy_from_slice(&member.to_le_bytes()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn setting_msg_loc_in_an_encoded_record_equals_encoding_it_with_the_loc() {
        let mut m = MsgEffect {
            conv: 7,
            msg_seq: 3,
            msg_id: 99,
            sender: 1,
            kind: MessageKind::Normal,
            msg_type: 12,
            target_seq: 0,
            at_ms: 5,
            msg_loc: PENDING_LOC,
            client_msg_id: 42,
            summary: Bytes::from_static(b"hi"),
        };
        let mut record = Effect::Msg(m.clone()).encode();
        let loc = pack(crate::log::RecordLoc {
            segment: 3,
            offset: 4096,
        });
        set_msg_loc(&mut record, loc);
        m.msg_loc = loc;
        assert_eq!(record, Effect::Msg(m).encode());
    }

    #[test]
    fn a_message_adds_at_most_the_overhead_bound_besides_its_payload() {
        let payload = Bytes::from(vec![7u8; 1000]);
        let stored = StoredPayload {
            compressed: false,
            raw_len: 1000,
            bytes: payload.clone(),
        };
        let header = MsgHeader {
            kind: MessageKind::Normal,
            msg_type: u16::MAX,
            conv: u64::MAX,
            msg_seq: u64::MAX,
            msg_id: u64::MAX,
            sender: u64::MAX,
            target: u64::MAX,
            sent_at_ms: u64::MAX,
        };
        let msg = encode_msg_record(&header, &stored).len() - payload.len();
        let evt = Effect::Msg(MsgEffect {
            conv: u64::MAX,
            msg_seq: u64::MAX,
            msg_id: u64::MAX,
            sender: u64::MAX,
            kind: MessageKind::Normal,
            msg_type: u16::MAX,
            target_seq: u64::MAX,
            at_ms: u64::MAX,
            msg_loc: u64::MAX,
            client_msg_id: u128::MAX,
            summary: Bytes::from(vec![1u8; SUMMARY_BYTES_MAX]),
        })
        .encode()
        .len();
        let total = (msg + evt + 2 * crate::log::format::RECORD_HEADER_LEN) as u64;
        assert!(total <= MESSAGE_OVERHEAD_MAX, "{total} bytes of overhead");
    }

    #[test]
    fn effects_round_trip_through_their_encoding() {
        let effects = [
            Effect::Msg(MsgEffect {
                conv: 7,
                msg_seq: 3,
                msg_id: 99,
                sender: 1,
                kind: MessageKind::Edit,
                msg_type: 12,
                target_seq: 2,
                at_ms: 1000,
                msg_loc: pack(crate::log::RecordLoc {
                    segment: 4,
                    offset: 512,
                }),
                client_msg_id: u128::MAX - 5,
                summary: Bytes::from_static(b"hello"),
            }),
            Effect::Read {
                uid: 1,
                conv: 2,
                read_seq: 3,
                at_ms: 4,
            },
            Effect::Flags {
                uid: 1,
                conv: 2,
                flags: ConvFlags {
                    muted: true,
                    pinned: false,
                },
                at_ms: 4,
            },
            Effect::Device {
                uid: 5,
                row: DeviceRow {
                    device: 6,
                    generation: 7,
                    acked_sync_seq: 8,
                    state: DeviceState::Recovering,
                    last_seen_ms: 9,
                    lease: Some(LeaseInfo {
                        lease_id: 1,
                        resume_from: 2,
                        hwm: 3,
                        expires_at_ms: 4,
                    }),
                },
            },
        ];
        assert_round_trips(&effects);
    }

    /// Each effect decodes back to itself, and every strict prefix of its
    /// encoding is rejected, never misread.
    pub(crate) fn assert_round_trips(effects: &[Effect]) {
        for e in effects {
            let bytes = e.encode();
            assert_eq!(Effect::decode(e.record_kind(), &bytes), Ok(e.clone()));
            for cut in 0..bytes.len() {
                assert!(Effect::decode(e.record_kind(), &bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn compressible_payload_is_stored_compressed_and_read_back_whole() {
        let payload = Bytes::from(vec![b'a'; 4096]);
        let stored = StoredPayload::new(&payload);
        assert!(stored.compressed);
        assert!(stored.bytes.len() < 200);
        let h = MsgHeader {
            kind: MessageKind::Normal,
            msg_type: 1,
            conv: 2,
            msg_seq: 3,
            msg_id: 4,
            sender: 5,
            target: 0,
            sent_at_ms: 6,
        };
        let rec = encode_msg_record(&h, &stored);
        let (h2, p2) = decode_msg_record(&rec, 64 << 10).unwrap();
        assert_eq!(h2, h);
        assert_eq!(p2, payload);
        // A small limit refuses to inflate it.
        assert!(decode_msg_record(&rec, 100).is_err());
    }

    #[test]
    fn incompressible_payload_is_stored_raw() {
        let payload: Vec<u8> = (0..256u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let stored = StoredPayload::new(&Bytes::from(payload.clone()));
        assert!(!stored.compressed);
        assert_eq!(&stored.bytes[..], &payload[..]);
    }
}
