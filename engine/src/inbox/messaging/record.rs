//! The messaging records: the message record in the `msg` log, and the
//! `evt` records of messages, read cursors and conversation flags, with
//! their codecs and their `apply` (in [`super::apply`] for messages).
//!
//! ## The message body (log record kind [`MSG_RECORD`] in `msg`)
//!
//! A send writes its body inside its message effect in `evt`
//! ([`MsgBodyEffect`], kind 9), so a round is one batch of one log; a body
//! sits in the `msg` log only once compaction moved it there (or it was
//! written by an older version, with a kind 1 effect pointing at it).
//! Both places hold the same bytes:
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
//! ## `evt` records (after the format byte, little-endian)
//! - [`MsgEffect`] (kind 1): conv u64, msg_seq u64, msg_id u64, sender
//!   u64, kind u8, msg_type u16, target_seq u64, at_ms u64, msg_loc u64
//!   (segment << 32 | offset), client_msg_id u128, summary (u8 length +
//!   bytes, <= 64).
//! - [`MsgBodyEffect`] (kind 9): the kind 1 fields without msg_loc
//!   (conv .. at_ms, client_msg_id, summary), then the body: bytes (u32
//!   length + the message record above). The message's location is this
//!   record's own, marked as in `evt` (`containers::loc`).
//! - [`ReadEffect`] (kind 2): uid u64, conv u64, read_seq u64, at_ms u64.
//! - [`FlagsEffect`] (kind 3): uid u64, conv u64, muted u8, pinned u8,
//!   at_ms u64.
//! - [`ReservationEffect`] (kind 19) and [`ReservedMsgEffect`] (kind 20):
//!   what an open reserves past a cut tail (`record/reservation.rs`).

use bytes::Bytes;

use std::sync::Arc;

mod reservation;

use super::large_record::{ClearEffect, ModeEffect};
pub(crate) use super::rows::{kind_code, kind_from_code};
use crate::api::*;
use crate::inbox::codec::{DecodeError, DecodeResult, Reader, Writer};
use crate::inbox::state::record::{record_set, ApplyAt, ApplyError, Record};
use crate::inbox::state::{body_in_evt, PackedLoc, State};
pub(crate) use reservation::{ReservationEffect, ReservedMsgEffect};

record_set! {
    /// The `evt` records messaging owns.
    pub(crate) enum Records in Effect::Messaging {
        Msg(MsgEffect),
        MsgBody(MsgBodyEffect),
        Read(ReadEffect),
        Flags(FlagsEffect),
        Mode(ModeEffect),
        Clear(ClearEffect),
        Reservation(ReservationEffect),
        Reserved(ReservedMsgEffect),
    }
}

pub(crate) const MSG_RECORD: u8 = 1;
const FORMAT_VERSION: u8 = 1;
const FLAG_ZSTD: u8 = 1;
/// Payloads shorter than this are never worth a zstd frame.
const COMPRESS_MIN_BYTES: usize = 64;
/// How many leading bytes [`looks_random`] looks at.
const RANDOM_SAMPLE_BYTES: usize = 512;

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
        if payload.len() >= COMPRESS_MIN_BYTES && !looks_random(payload) {
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

/// Whether `payload` starts like uniformly random bytes: an end-to-end
/// encrypted message, or compressed media. zstd cannot shrink those, and
/// trying costs more than the rest of a send on the caller's thread.
///
/// The test counts the distinct byte values among the first
/// [`RANDOM_SAMPLE_BYTES`]: `n` random bytes show about
/// `256 * (1 - (255/256)^n)` of them (139 of 200), text a few dozen, and
/// base64 at most 64, so those are still compressed. A payload that is
/// random only at its start and compressible after it is stored as it
/// came: that costs disk, never correctness. The answer depends on the
/// bytes alone, so equal payloads are still stored equally.
fn looks_random(payload: &[u8]) -> bool {
    let sample = &payload[..payload.len().min(RANDOM_SAMPLE_BYTES)];
    let mut seen = [0u64; 4];
    for &b in sample {
        seen[usize::from(b >> 6)] |= 1 << (b & 63);
    }
    let distinct: u32 = seen.iter().map(|w| w.count_ones()).sum();
    // Nine tenths of what uniform bytes would show: 125 of 200, 199 of 512.
    let n = sample.len() as f64;
    let expected = 256.0 * (1.0 - (255.0f64 / 256.0).powf(n));
    f64::from(distinct) >= 0.9 * expected
}

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

/// Bytes one message adds to a round besides its payload, at most: its
/// body's header and fields and its `evt` record around it (summary
/// included, with its record header). Pinned by a test.
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

/// The version, flags and header fields of a message record, up to its
/// payload length. Split out so that salvage can read the header of a
/// record whose payload may be damaged.
pub(crate) fn decode_msg_header(r: &mut Reader<'_>) -> DecodeResult<(u8, MsgHeader)> {
    if r.u8()? != FORMAT_VERSION {
        return Err(DecodeError("unknown message record version"));
    }
    let flags = r.u8()?;
    let h = MsgHeader {
        kind: kind_from_code(r.u8()?)?,
        msg_type: r.u16()?,
        conv: r.id()?,
        msg_seq: r.id()?,
        msg_id: r.id()?,
        sender: r.id()?,
        target: r.id()?,
        sent_at_ms: r.u64()?,
    };
    Ok((flags, h))
}

/// A message kind's name in `inboxd dump` lines.
fn kind_name(kind: MessageKind) -> &'static str {
    match kind {
        MessageKind::Normal => "normal",
        MessageKind::Join => "join",
        MessageKind::Leave => "leave",
        MessageKind::Recall => "recall",
        MessageKind::Edit => "edit",
    }
}

/// A message record in one line for `inboxd dump`: its header and the
/// lengths of its body, never the body itself.
pub(crate) fn describe_msg_record(record: &[u8]) -> DecodeResult<String> {
    let mut r = Reader::new(record);
    let (flags, h) = decode_msg_header(&mut r)?;
    let raw_len = r.u32()?;
    let stored_len = r.bytes()?.len();
    let zstd = if flags & FLAG_ZSTD != 0 { " zstd" } else { "" };
    Ok(format!(
        "message conv {} msg_seq {} msg_id {} sender {} {} type {} target {} at_ms {} body {raw_len} bytes (stored {stored_len}{zstd})",
        h.conv,
        h.msg_seq,
        h.msg_id,
        h.sender,
        kind_name(h.kind),
        h.msg_type,
        h.target,
        h.sent_at_ms
    ))
}

/// Decodes a message record; `raw_len_max` bounds the decompressed size.
pub(crate) fn decode_msg_record(buf: &[u8], raw_len_max: u32) -> DecodeResult<(MsgHeader, Bytes)> {
    let mut r = Reader::new(buf);
    let (flags, h) = decode_msg_header(&mut r)?;
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

/// A message's effect with its body inside (kind 9): what a send writes,
/// so that one `evt` batch commits the round. The message's index entry
/// points at this record; the events of its recipients do too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MsgBodyEffect {
    /// `msg_loc` is not encoded: it is this record's own location.
    pub msg: MsgEffect,
    /// The message record ([`encode_msg_record`]).
    pub body: Bytes,
}

impl MsgEffect {
    fn encode_fields(&self, w: &mut Writer, with_loc: bool) {
        w.u64(self.conv);
        w.u64(self.msg_seq);
        w.u64(self.msg_id);
        w.u64(self.sender);
        w.u8(kind_code(self.kind));
        w.u16(self.msg_type);
        w.u64(self.target_seq);
        w.u64(self.at_ms);
        if with_loc {
            w.u64(self.msg_loc);
        }
        w.u128(self.client_msg_id);
        w.short_bytes(&self.summary);
    }

    fn decode_fields(r: &mut Reader<'_>, with_loc: bool) -> DecodeResult<Self> {
        Ok(MsgEffect {
            conv: r.id()?,
            msg_seq: r.id()?,
            msg_id: r.id()?,
            sender: r.id()?,
            kind: kind_from_code(r.u8()?)?,
            msg_type: r.u16()?,
            target_seq: r.id()?,
            at_ms: r.u64()?,
            msg_loc: if with_loc { r.u64()? } else { 0 },
            client_msg_id: r.u128()?,
            summary: r.short_bytes()?,
        })
    }

    /// The fields `inboxd dump` shows: never the summary, which holds the
    /// message's first bytes.
    fn describe_fields(&self) -> String {
        format!(
            "conv {} msg_seq {} msg_id {} sender {} {} type {} target_seq {} at_ms {}",
            self.conv,
            self.msg_seq,
            self.msg_id,
            self.sender,
            kind_name(self.kind),
            self.msg_type,
            self.target_seq,
            self.at_ms
        )
    }

    /// The message as the sync event of a user that holds it at
    /// `sync_seq`, with `summary`.
    fn event(&self, sync_seq: SyncSeq, summary: Bytes) -> SyncEvent {
        SyncEvent {
            sync_seq,
            kind: match self.kind {
                MessageKind::Normal => EventKind::Msg,
                MessageKind::Recall => EventKind::Recall,
                MessageKind::Edit => EventKind::Edit,
                MessageKind::Join | MessageKind::Leave => EventKind::Member,
            },
            conv: self.conv,
            msg_seq: self.msg_seq,
            msg_id: self.msg_id,
            at_ms: self.at_ms,
            summary,
        }
    }

    /// [`Record::to_event`] of a message decoded for a sync page: the
    /// summary moves into the event. A clone would take and drop a count
    /// on the page's summary arena for every event, all on one cache line:
    /// `sync_page_100` took 13.6 to 14.2 µs that way against 11.7 to 11.8.
    fn into_event(mut self, sync_seq: SyncSeq) -> SyncEvent {
        let summary = std::mem::take(&mut self.summary);
        self.event(sync_seq, summary)
    }
}

impl Record for MsgBodyEffect {
    const KIND: u8 = 9;
    const NAME: &'static str = "message";
    const MAY_APPEND_EVENTS: bool = true;

    fn encode_body(&self, w: &mut Writer) {
        self.msg.encode_fields(w, false);
        w.bytes(&self.body);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        let mut msg = MsgEffect::decode_fields(r, false)?;
        // Not stored: the record's own location, known where it is read.
        msg.msg_loc = crate::inbox::state::PENDING_LOC;
        Ok(MsgBodyEffect {
            msg,
            body: Bytes::copy_from_slice(r.bytes()?),
        })
    }

    /// The message's fields, then its body described as a `msg` record
    /// (never its bytes).
    fn describe(&self) -> String {
        let body = describe_msg_record(&self.body)
            .unwrap_or_else(|e| format!("unreadable message record ({})", e.0));
        format!("{} with its body: {body}", self.msg.describe_fields())
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let m = MsgEffect {
            msg_loc: body_in_evt(at.evt_loc),
            ..self.msg.clone()
        };
        at.touched.body = Some((m.conv, m.msg_seq));
        st.apply_msg(&m, at.evt_loc, at.stamp, at.touched)
    }

    fn at_ms(&self) -> Option<TimestampMs> {
        Some(self.msg.at_ms)
    }

    fn to_event(&self, sync_seq: SyncSeq) -> Option<SyncEvent> {
        self.msg.to_event(sync_seq)
    }

    /// The event is the message's fields; the body is stepped over in
    /// place, never copied.
    fn decode_event(r: &mut Reader<'_>, sync_seq: SyncSeq) -> DecodeResult<Option<SyncEvent>> {
        let msg = MsgEffect::decode_fields(r, false)?;
        r.bytes()?;
        Ok(Some(msg.into_event(sync_seq)))
    }
}

/// A read cursor moved forward (R14); the reader's event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReadEffect {
    pub uid: Uid,
    pub conv: ConvId,
    pub read_seq: MsgSeq,
    pub at_ms: TimestampMs,
}

/// A conversation's flags changed for one user; the user's event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FlagsEffect {
    pub uid: Uid,
    pub conv: ConvId,
    pub flags: ConvFlags,
    pub at_ms: TimestampMs,
}

impl Record for MsgEffect {
    const KIND: u8 = 1;
    const NAME: &'static str = "message-ref";
    const MAY_APPEND_EVENTS: bool = true;

    fn encode_body(&self, w: &mut Writer) {
        self.encode_fields(w, true);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        MsgEffect::decode_fields(r, true)
    }

    /// A copy made by a segment rewrite has no location of its own (the
    /// index says where the body went): it says so.
    fn describe(&self) -> String {
        if self.msg_loc == crate::inbox::state::PENDING_LOC {
            return format!("{} body where the index says", self.describe_fields());
        }
        let loc = crate::inbox::state::unpack(self.msg_loc);
        format!(
            "{} body at msg {}:{}",
            self.describe_fields(),
            loc.segment,
            loc.offset
        )
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        st.apply_msg(self, at.evt_loc, at.stamp, at.touched)
    }

    fn at_ms(&self) -> Option<TimestampMs> {
        Some(self.at_ms)
    }

    fn to_event(&self, sync_seq: SyncSeq) -> Option<SyncEvent> {
        Some(self.event(sync_seq, self.summary.clone()))
    }

    fn decode_event(r: &mut Reader<'_>, sync_seq: SyncSeq) -> DecodeResult<Option<SyncEvent>> {
        Ok(Some(Self::decode_body(r)?.into_event(sync_seq)))
    }
}

impl Record for ReadEffect {
    const KIND: u8 = 2;
    const NAME: &'static str = "read";
    const MAY_APPEND_EVENTS: bool = true;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.uid);
        w.u64(self.conv);
        w.u64(self.read_seq);
        w.u64(self.at_ms);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(ReadEffect {
            uid: r.id()?,
            conv: r.id()?,
            read_seq: r.id()?,
            at_ms: r.u64()?,
        })
    }

    fn describe(&self) -> String {
        format!(
            "uid {} conv {} read_seq {} at_ms {}",
            self.uid, self.conv, self.read_seq, self.at_ms
        )
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let (uid, conv, read_seq, stamp) = (&self.uid, &self.conv, &self.read_seq, at.stamp);
        let (evt_loc, touched) = (at.evt_loc, at.touched);
        let countable = st.countable_between(*uid, *conv, *read_seq);
        let user = st
            .users
            .get_mut(uid)
            .map(Arc::make_mut)
            .ok_or_else(|| ApplyError(format!("read by unknown user {uid}")))?;
        let uc = user
            .convs
            .get_mut(conv)
            .ok_or_else(|| ApplyError(format!("read of conv {conv} by non-member {uid}")))?;
        if *read_seq > uc.read_seq {
            uc.unread = uc.unread.saturating_sub(countable);
            uc.read_seq = *read_seq;
        }
        uc.stamp = stamp;
        let seq = user.push_event(evt_loc);
        touched.events.push((*uid, seq));
        Ok(())
    }

    fn at_ms(&self) -> Option<TimestampMs> {
        Some(self.at_ms)
    }

    fn to_event(&self, sync_seq: SyncSeq) -> Option<SyncEvent> {
        Some(SyncEvent {
            sync_seq,
            kind: EventKind::Read,
            conv: self.conv,
            msg_seq: self.read_seq,
            msg_id: MsgId(0),
            at_ms: self.at_ms,
            summary: Bytes::new(),
        })
    }
}

impl Record for FlagsEffect {
    const KIND: u8 = 3;
    const NAME: &'static str = "flags";
    const MAY_APPEND_EVENTS: bool = true;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.uid);
        w.u64(self.conv);
        w.bool(self.flags.muted);
        w.bool(self.flags.pinned);
        w.u64(self.at_ms);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(FlagsEffect {
            uid: r.id()?,
            conv: r.id()?,
            flags: ConvFlags {
                muted: r.bool()?,
                pinned: r.bool()?,
            },
            at_ms: r.u64()?,
        })
    }

    fn describe(&self) -> String {
        format!(
            "uid {} conv {} muted {} pinned {} at_ms {}",
            self.uid, self.conv, self.flags.muted, self.flags.pinned, self.at_ms
        )
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let (uid, conv, flags, stamp) = (&self.uid, &self.conv, &self.flags, at.stamp);
        let (evt_loc, touched) = (at.evt_loc, at.touched);
        let user = st
            .users
            .get_mut(uid)
            .map(Arc::make_mut)
            .ok_or_else(|| ApplyError(format!("flags by unknown user {uid}")))?;
        let uc = user
            .convs
            .get_mut(conv)
            .ok_or_else(|| ApplyError(format!("flags of conv {conv} by non-member {uid}")))?;
        uc.muted = flags.muted;
        uc.pinned = flags.pinned;
        uc.stamp = stamp;
        let seq = user.push_event(evt_loc);
        touched.events.push((*uid, seq));
        Ok(())
    }

    fn at_ms(&self) -> Option<TimestampMs> {
        Some(self.at_ms)
    }

    fn to_event(&self, sync_seq: SyncSeq) -> Option<SyncEvent> {
        Some(SyncEvent {
            sync_seq,
            kind: EventKind::Conv,
            conv: self.conv,
            msg_seq: MsgSeq(0),
            msg_id: MsgId(0),
            at_ms: self.at_ms,
            summary: Bytes::copy_from_slice(&[
                u8::from(self.flags.muted) | (u8::from(self.flags.pinned) << 1)
            ]),
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
        MessageKind::Recall => Bytes::copy_from_slice(&target.0.to_le_bytes()),
        MessageKind::Join | MessageKind::Leave => Bytes::copy_from_slice(&member.0.to_le_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::effect::Effect;

    /// Bytes from a fixed xorshift stream: uniform, like ciphertext.
    fn random_bytes(n: usize, mut x: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn random_payloads_skip_zstd_and_are_stored_as_they_came() {
        for (n, seed) in [(64, 1), (200, 2), (512, 3), (4096, 4), (100_000, 5)] {
            let payload = Bytes::from(random_bytes(n, seed));
            assert!(looks_random(&payload), "{n} random bytes");
            let stored = StoredPayload::new(&payload);
            assert!(!stored.compressed, "{n} random bytes");
            assert_eq!(stored.bytes, payload);
        }
    }

    #[test]
    fn text_json_and_base64_payloads_are_still_compressed() {
        let text = Bytes::from(
            "Running late, the lift is stuck between floors again. Order without me? ".repeat(3),
        );
        let json = Bytes::from(
            r#"{"type":"text","body":"see you at eight","mentions":[],"reply_to":null,"client":"ios-7.2"}"#
                .repeat(2),
        );
        // Base64 of random bytes: 64 symbols, 6 bits of 8; zstd's entropy
        // stage takes about a quarter off.
        const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let base64 = Bytes::from(
            random_bytes(600, 9)
                .iter()
                .map(|b| B64[usize::from(b & 63)])
                .collect::<Vec<u8>>(),
        );
        for (what, payload) in [("text", text), ("json", json), ("base64", base64)] {
            assert!(!looks_random(&payload), "{what} looked random");
            let stored = StoredPayload::new(&payload);
            assert!(stored.compressed, "{what} was not compressed");
            assert!(stored.bytes.len() < payload.len(), "{what}");
        }
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
            conv: ConvId(u64::MAX),
            msg_seq: MsgSeq(u64::MAX),
            msg_id: MsgId(u64::MAX),
            sender: Uid(u64::MAX),
            target: MsgId(u64::MAX),
            sent_at_ms: u64::MAX,
        };
        let body = Bytes::from(encode_msg_record(&header, &stored));
        let msg = MsgEffect {
            conv: ConvId(u64::MAX),
            msg_seq: MsgSeq(u64::MAX),
            msg_id: MsgId(u64::MAX),
            sender: Uid(u64::MAX),
            kind: MessageKind::Normal,
            msg_type: u16::MAX,
            target_seq: MsgSeq(u64::MAX),
            at_ms: u64::MAX,
            msg_loc: u64::MAX,
            client_msg_id: u128::MAX,
            summary: Bytes::from(vec![1u8; SUMMARY_BYTES_MAX]),
        };
        let evt = Effect::from(MsgBodyEffect { msg, body }).encode().len() - payload.len();
        let total = (evt + crate::log::Log::RECORD_OVERHEAD_BYTES as usize) as u64;
        assert!(total <= MESSAGE_OVERHEAD_MAX, "{total} bytes of overhead");
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
            conv: ConvId(2),
            msg_seq: MsgSeq(3),
            msg_id: MsgId(4),
            sender: Uid(5),
            target: MsgId(0),
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
