//! The fan-out records, with their codecs and their `apply`, and the
//! fan-out checkpoint section.
//!
//! ## `evt` records (after the format byte, little-endian)
//! A message, as [`FanoutMessage`]: conv u64, msg_seq u64, msg_id u64,
//! sender u64, kind u8, msg_type u16, target_seq u64, at_ms u64,
//! client_msg_id u128, summary (u8 length + bytes, <= 64). Recipients: a
//! u64 count, then per recipient uid u64, period_id u32. Uncounted users
//! (a recall's): a u64 count, then per user uid u64.
//! - [`OutboxEffect`] (kind 15): dest u32, seq u64, the message, its
//!   recipients in `dest`, its uncounted users in `dest`. Written by a
//!   send in the same round as its message, so it is durable with it.
//! - [`OutboxTrimEffect`] (kind 16): dest u32, through u64: the
//!   destination committed every entry through `through`.
//! - [`DeliveredEffect`] (kind 17): source u32, seq u64, the message, the
//!   recipients whose events this record appends (those not applied
//!   before), the uncounted users not applied before. Every event it
//!   appends points at it and reads as the message's sync event; their
//!   keys are the entry's dedup record.
//! - [`InboundTrimEffect`] (kind 18): source u32, through u64: the source
//!   trimmed through `through`; the dedup records at or below it go.

use std::sync::Arc;

use super::rows::{Fanout, FanoutMessage, Inbound, OutboxEntry, Recipient, UNCOUNT_PERIOD};
use super::slot::GroupId;
use crate::api::*;
use crate::inbox::codec::{DecodeError, DecodeResult, Reader, Writer};
use crate::inbox::messaging::rows::{kind_code, kind_from_code, RecipientMessage};
use crate::inbox::state::record::{record_set, ApplyAt, ApplyError, Record};
use crate::inbox::state::{State, Summary};

record_set! {
    /// The `evt` records fan-out owns.
    pub(crate) enum Records in Effect::Fanout {
        Outbox(OutboxEffect),
        OutboxTrim(OutboxTrimEffect),
        Delivered(DeliveredEffect),
        InboundTrim(InboundTrimEffect),
    }
}

/// An outbox entry written by a send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OutboxEffect {
    pub dest: GroupId,
    pub entry: OutboxEntry,
}

/// A source trims its outbox for `dest` through `through`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OutboxTrimEffect {
    pub dest: GroupId,
    pub through: u64,
}

/// A destination applies entry `seq` of `source`: `applied` get their
/// events (the entry's recipients not applied before).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeliveredEffect {
    pub source: GroupId,
    pub seq: u64,
    pub message: FanoutMessage,
    pub applied: Vec<Recipient>,
    /// A recall's target leaves these users' unread counts.
    pub uncounted: Vec<Uid>,
}

/// A destination forgets the dedup records of `source` through `through`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InboundTrimEffect {
    pub source: GroupId,
    pub through: u64,
}

pub(crate) fn put_message(w: &mut Writer, m: &FanoutMessage) {
    w.u64(m.conv);
    w.u64(m.msg_seq);
    w.u64(m.msg_id);
    w.u64(m.sender);
    w.u8(kind_code(m.kind));
    w.u16(m.msg_type);
    w.u64(m.target_seq);
    w.u64(m.at_ms);
    w.u128(m.client_msg_id);
    w.short_bytes(&m.summary);
}

pub(crate) fn get_message(r: &mut Reader<'_>) -> DecodeResult<FanoutMessage> {
    Ok(FanoutMessage {
        conv: r.id()?,
        msg_seq: r.id()?,
        msg_id: r.id()?,
        sender: r.id()?,
        kind: kind_from_code(r.u8()?)?,
        msg_type: r.u16()?,
        target_seq: r.id()?,
        at_ms: r.u64()?,
        client_msg_id: r.u128()?,
        summary: r.short_bytes()?,
    })
}

fn put_recipients(w: &mut Writer, rs: &[Recipient]) {
    w.u64(rs.len() as u64);
    for r in rs {
        w.u64(r.uid);
        w.u32(r.period_id);
    }
}

fn put_uids(w: &mut Writer, uids: &[Uid]) {
    w.u64(uids.len() as u64);
    for uid in uids {
        w.u64(*uid);
    }
}

fn get_uids(r: &mut Reader<'_>) -> DecodeResult<Vec<Uid>> {
    let n = r.count(8)?;
    (0..n).map(|_| r.id()).collect()
}

fn get_recipients(r: &mut Reader<'_>) -> DecodeResult<Vec<Recipient>> {
    let n = r.count(12)?;
    (0..n)
        .map(|_| {
            Ok(Recipient {
                uid: r.id()?,
                period_id: r.u32()?,
            })
        })
        .collect()
}

/// The sync event a recipient sees for `m` (the same as the event of the
/// source's message record).
pub(crate) fn event_of(m: &FanoutMessage, sync_seq: SyncSeq) -> SyncEvent {
    SyncEvent {
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
    }
}

fn describe_message(m: &FanoutMessage) -> String {
    format!(
        "conv {} msg_seq {} msg_id {} sender {} kind {}",
        m.conv,
        m.msg_seq,
        m.msg_id,
        m.sender,
        kind_code(m.kind)
    )
}

impl Record for OutboxEffect {
    const KIND: u8 = 15;
    const NAME: &'static str = "outbox";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u32(self.dest.0);
        w.u64(self.entry.seq);
        put_message(w, &self.entry.message);
        put_recipients(w, &self.entry.recipients);
        put_uids(w, &self.entry.uncount);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(OutboxEffect {
            dest: GroupId(r.u32()?),
            entry: OutboxEntry {
                seq: r.u64()?,
                message: get_message(r)?,
                recipients: get_recipients(r)?,
                uncount: get_uids(r)?,
            },
        })
    }

    fn describe(&self) -> String {
        format!(
            "dest {} seq {} {} recipients {}",
            self.dest,
            self.entry.seq,
            describe_message(&self.entry.message),
            self.entry.recipients.len()
        )
    }

    fn apply(&self, st: &mut State, _at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let outbox = st.fanout.outboxes.entry(self.dest).or_default();
        if self.entry.seq != outbox.last_seq + 1 {
            return Err(ApplyError(format!(
                "outbox entry {} for {} does not follow {}",
                self.entry.seq, self.dest, outbox.last_seq
            )));
        }
        outbox.last_seq = self.entry.seq;
        outbox
            .entries
            .insert(self.entry.seq, Arc::new(self.entry.clone()));
        Ok(())
    }

    fn at_ms(&self) -> Option<TimestampMs> {
        Some(self.entry.message.at_ms)
    }
}

impl Record for OutboxTrimEffect {
    const KIND: u8 = 16;
    const NAME: &'static str = "outbox-trim";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u32(self.dest.0);
        w.u64(self.through);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(OutboxTrimEffect {
            dest: GroupId(r.u32()?),
            through: r.u64()?,
        })
    }

    fn describe(&self) -> String {
        format!("dest {} through {}", self.dest, self.through)
    }

    fn apply(&self, st: &mut State, _at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let outbox = st.fanout.outboxes.entry(self.dest).or_default();
        if self.through > outbox.last_seq || self.through <= outbox.trimmed_through {
            return Err(ApplyError(format!(
                "outbox trim of {} through {} outside ({}, {}]",
                self.dest, self.through, outbox.trimmed_through, outbox.last_seq
            )));
        }
        outbox.trimmed_through = self.through;
        outbox.entries = outbox.entries.split_off(&(self.through + 1));
        Ok(())
    }
}

impl Record for DeliveredEffect {
    const KIND: u8 = 17;
    const NAME: &'static str = "fanout-delivered";
    const MAY_APPEND_EVENTS: bool = true;

    fn encode_body(&self, w: &mut Writer) {
        w.u32(self.source.0);
        w.u64(self.seq);
        put_message(w, &self.message);
        put_recipients(w, &self.applied);
        put_uids(w, &self.uncounted);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(DeliveredEffect {
            source: GroupId(r.u32()?),
            seq: r.u64()?,
            message: get_message(r)?,
            applied: get_recipients(r)?,
            uncounted: get_uids(r)?,
        })
    }

    fn describe(&self) -> String {
        format!(
            "source {} seq {} {} applied {} uncounted {}",
            self.source,
            self.seq,
            describe_message(&self.message),
            self.applied.len(),
            self.uncounted.len()
        )
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let m = &self.message;
        let inbound = st.fanout.inbound.entry(self.source).or_default();
        if self.seq != inbound.applied_through + 1 || self.seq <= inbound.source_trimmed {
            return Err(ApplyError(format!(
                "delivery {} from {} does not follow {}",
                self.seq, self.source, inbound.applied_through
            )));
        }
        let uncount_keys =
            (self.uncounted.iter()).map(|&uid| (m.conv, m.msg_seq, uid, UNCOUNT_PERIOD));
        let keys: Vec<_> = (self.applied.iter())
            .map(|r| (m.conv, m.msg_seq, r.uid, r.period_id))
            .chain(uncount_keys)
            .collect();
        for key in &keys {
            if inbound.keys.contains(key) {
                return Err(ApplyError(format!(
                    "uid {} gets message {} of conv {} twice",
                    key.2, m.msg_seq, m.conv
                )));
            }
        }
        inbound.applied_through = self.seq;
        inbound.keys.extend(keys.iter().copied());
        inbound.dedup.insert(self.seq, keys);
        let summary = Summary::new(&m.summary);
        // Entries of one source come in `msg_seq` order per conversation,
        // so the newest is the last applied.
        let taken = RecipientMessage {
            conv: m.conv,
            msg_seq: m.msg_seq,
            msg_id: m.msg_id,
            sender: m.sender,
            kind: m.kind,
            at_ms: m.at_ms,
            summary: &summary,
        };
        for r in &self.applied {
            let user = Arc::make_mut(st.users.entry(r.uid).or_default());
            let seq = user.take_message(r.uid, &taken, at.evt_loc, at.stamp);
            at.touched.events.push((r.uid, seq));
        }
        // A recall takes its target out of the unread count of whoever
        // received it and has not read it, as it does where the
        // conversation lives.
        for uid in &self.uncounted {
            let uc =
                (st.users.get_mut(uid).map(Arc::make_mut)).and_then(|u| u.convs.get_mut(&m.conv));
            if let Some(uc) = uc.filter(|uc| uc.read_seq < m.target_seq) {
                uc.unread = uc.unread.saturating_sub(1);
                uc.stamp = at.stamp;
            }
        }
        Ok(())
    }

    fn at_ms(&self) -> Option<TimestampMs> {
        Some(self.message.at_ms)
    }

    fn to_event(&self, sync_seq: SyncSeq) -> Option<SyncEvent> {
        Some(event_of(&self.message, sync_seq))
    }

    fn decode_event(r: &mut Reader<'_>, sync_seq: SyncSeq) -> DecodeResult<Option<SyncEvent>> {
        let d = Self::decode_body(r)?;
        Ok(Some(event_of(&d.message, sync_seq)))
    }
}

impl Record for InboundTrimEffect {
    const KIND: u8 = 18;
    const NAME: &'static str = "fanout-forget";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u32(self.source.0);
        w.u64(self.through);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(InboundTrimEffect {
            source: GroupId(r.u32()?),
            through: r.u64()?,
        })
    }

    fn describe(&self) -> String {
        format!("source {} through {}", self.source, self.through)
    }

    fn apply(&self, st: &mut State, _at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let inbound = st.fanout.inbound.entry(self.source).or_default();
        if self.through <= inbound.source_trimmed {
            return Err(ApplyError(format!(
                "dedup trim of {} through {} is not above {}",
                self.source, self.through, inbound.source_trimmed
            )));
        }
        inbound.forget_through(self.through);
        Ok(())
    }
}

/// The fan-out checkpoint section: per destination, `dest` u32,
/// `last_seq` u64, `trimmed_through` u64, then its entries (seq, the
/// message, its recipients, its uncounted users); per source, `source` u32, `applied_through`
/// u64, `source_trimmed` u64, then its dedup records (seq u64, then the
/// keys: count u64, conv u64, msg_seq u64, uid u64, period_id u32 each).
pub(crate) fn put_section(w: &mut Writer, f: &Fanout) {
    w.u64(f.outboxes.len() as u64);
    for (dest, o) in &f.outboxes {
        w.u32(dest.0);
        w.u64(o.last_seq);
        w.u64(o.trimmed_through);
        w.u64(o.entries.len() as u64);
        for e in o.entries.values() {
            w.u64(e.seq);
            put_message(w, &e.message);
            put_recipients(w, &e.recipients);
            put_uids(w, &e.uncount);
        }
    }
    w.u64(f.inbound.len() as u64);
    for (source, i) in &f.inbound {
        w.u32(source.0);
        w.u64(i.applied_through);
        w.u64(i.source_trimmed);
        w.u64(i.dedup.len() as u64);
        for (seq, keys) in &i.dedup {
            w.u64(*seq);
            w.u64(keys.len() as u64);
            for (conv, msg_seq, uid, period_id) in keys {
                w.u64(*conv);
                w.u64(*msg_seq);
                w.u64(*uid);
                w.u32(*period_id);
            }
        }
    }
}

pub(crate) fn get_section(r: &mut Reader<'_>, f: &mut Fanout) -> DecodeResult<()> {
    for _ in 0..r.count(28)? {
        let dest = GroupId(r.u32()?);
        let o = f.outboxes.entry(dest).or_default();
        o.last_seq = r.u64()?;
        o.trimmed_through = r.u64()?;
        for _ in 0..r.count(8)? {
            let e = OutboxEntry {
                seq: r.u64()?,
                message: get_message(r)?,
                recipients: get_recipients(r)?,
                uncount: get_uids(r)?,
            };
            if e.seq <= o.trimmed_through || e.seq > o.last_seq {
                return Err(DecodeError("outbox entry outside its outbox's range"));
            }
            o.entries.insert(e.seq, Arc::new(e));
        }
    }
    for _ in 0..r.count(28)? {
        let source = GroupId(r.u32()?);
        let i: &mut Inbound = f.inbound.entry(source).or_default();
        i.applied_through = r.u64()?;
        i.source_trimmed = r.u64()?;
        for _ in 0..r.count(16)? {
            let seq = r.u64()?;
            let n = r.count(28)?;
            let keys = (0..n)
                .map(|_| Ok((r.id()?, r.id()?, r.id()?, r.u32()?)))
                .collect::<DecodeResult<Vec<_>>>()?;
            i.keys.extend(keys.iter().copied());
            i.dedup.insert(seq, keys);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::effect::tests::assert_round_trips;
    use crate::inbox::effect::Effect;
    use bytes::Bytes;

    fn message() -> FanoutMessage {
        FanoutMessage {
            conv: ConvId(7),
            msg_seq: MsgSeq(3),
            msg_id: MsgId(99),
            sender: Uid(1),
            kind: MessageKind::Normal,
            msg_type: 4,
            target_seq: MsgSeq(0),
            at_ms: 1000,
            client_msg_id: 77,
            summary: Bytes::from_static(b"hi"),
        }
    }

    #[test]
    fn fanout_records_round_trip_and_reject_every_prefix() {
        let recipients = vec![
            Recipient {
                uid: Uid(5),
                period_id: 0,
            },
            Recipient {
                uid: Uid(6),
                period_id: 2,
            },
        ];
        assert_round_trips(&[
            Effect::from(OutboxEffect {
                dest: GroupId(2),
                entry: OutboxEntry {
                    seq: 9,
                    message: message(),
                    recipients: recipients.clone(),
                    uncount: vec![Uid(8), Uid(9)],
                },
            }),
            Effect::from(OutboxTrimEffect {
                dest: GroupId(2),
                through: 8,
            }),
            Effect::from(DeliveredEffect {
                source: GroupId(1),
                seq: 9,
                message: message(),
                applied: recipients,
                uncounted: vec![Uid(8)],
            }),
            Effect::from(InboundTrimEffect {
                source: GroupId(1),
                through: 4,
            }),
        ]);
    }

    #[test]
    fn outboxes_and_dedup_records_round_trip_through_a_checkpoint() {
        use crate::inbox::checkpoint::{decode_state, encode_state};
        let mut st = State::new(0);
        let o = st.fanout.outboxes.entry(GroupId(2)).or_default();
        o.last_seq = 5;
        o.trimmed_through = 3;
        for seq in 4..=5 {
            let entry = OutboxEntry {
                seq,
                message: message(),
                recipients: vec![Recipient {
                    uid: Uid(seq),
                    period_id: 1,
                }],
                uncount: vec![],
            };
            o.entries.insert(seq, Arc::new(entry));
        }
        let i = st.fanout.inbound.entry(GroupId(3)).or_default();
        i.applied_through = 9;
        i.source_trimmed = 7;
        let keys = vec![
            (ConvId(1), MsgSeq(2), Uid(3), 0),
            (ConvId(1), MsgSeq(2), Uid(4), 1),
        ];
        i.keys.extend(keys.iter().copied());
        i.dedup.insert(8, keys);
        let back = decode_state(&encode_state(&st)).unwrap();
        assert_eq!(back.fanout, st.fanout);
        assert_eq!(back.fanout.inbound[&GroupId(3)].keys.len(), 2);
        // A state with no fan-out writes no section: a single store's
        // checkpoint is as before.
        let plain = State::new(0);
        assert!(decode_state(&encode_state(&plain))
            .unwrap()
            .fanout
            .is_empty());
    }
}
