//! The records an open writes after it cut a torn tail whose records
//! still verify (`inbox/recover.rs`): the numbers those records hold may
//! have reached a client (under `SyncPolicy::Interval` a write is
//! acknowledged before its fdatasync), so none is given again.
//!
//! - [`ReservationEffect`] (kind 19, `reservation`): raises the `msg_id`
//!   counter, and each named user's next `sync_seq`. The `sync_seq`s it
//!   skips are index entries that point at this record, which is no
//!   event: a sync page steps over them (its cursor still moves past
//!   them), so a device's cursor jumps the gap.
//! - [`ReservedMsgEffect`] (kind 20, `reserved-message`): one `msg_seq` of
//!   a conversation that holds no message. It is entered like a message
//!   salvage lost (flag `FLAG_LOST`) and also flagged recalled, so it
//!   never counts for unread and cannot be edited or recalled; its body
//!   is the record itself, read as an empty tombstone with only what the
//!   index knows (as salvage writes a lost body). It reaches no member:
//!   no event, no conversation row changes.
//!
//! ## `evt` records (after the format byte, little-endian)
//! - kind 19: msg_counter u64 (the lowest counter the next `msg_id` may
//!   take), count u64, then per user: uid u64, next_sync_seq u64 (the
//!   lowest `sync_seq` its next event may take).
//! - kind 20: conv u64, msg_seq u64 (the conversation's head + 1),
//!   msg_id u64.

use std::sync::Arc;

use bytes::Bytes;

use super::{encode_msg_record, MsgHeader, StoredPayload};
use crate::api::*;
use crate::inbox::codec::{DecodeResult, Reader, Writer};
use crate::inbox::state::record::{ApplyAt, ApplyError, Record};
use crate::inbox::state::{
    body_in_evt, count_msg_ref, msg_counter, MsgMeta, State, FLAG_LOST, FLAG_RECALLED,
};

/// Raises the `msg_id` counter and users' next `sync_seq` past numbers a
/// cut took (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReservationEffect {
    /// The lowest counter the next `msg_id` may take.
    pub msg_counter: u64,
    /// Per user, the lowest `sync_seq` its next event may take.
    pub users: Vec<(Uid, SyncSeq)>,
}

impl Record for ReservationEffect {
    const KIND: u8 = 19;
    const NAME: &'static str = "reservation";
    /// It takes `sync_seq`s (as gaps): a lost one may have taken some.
    const MAY_APPEND_EVENTS: bool = true;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.msg_counter);
        w.u64(self.users.len() as u64);
        for (uid, next) in &self.users {
            w.u64(*uid);
            w.u64(*next);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        let msg_counter = r.u64()?;
        let n = r.count(16)?;
        let users = (0..n)
            .map(|_| Ok((r.id()?, r.id()?)))
            .collect::<DecodeResult<_>>()?;
        Ok(ReservationEffect { msg_counter, users })
    }

    fn describe(&self) -> String {
        let users: Vec<String> = (self.users.iter())
            .map(|(uid, next)| format!("{uid}:{next}"))
            .collect();
        format!(
            "msg_counter {} next sync_seq of uid {}",
            self.msg_counter,
            if users.is_empty() {
                "none".to_string()
            } else {
                users.join(",")
            }
        )
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        st.next_msg_counter = st.next_msg_counter.max(self.msg_counter);
        for &(uid, next) in &self.users {
            let user = Arc::make_mut(st.users.entry(uid).or_default());
            // Gaps point at this record, which is no event.
            while user.head().next() < next {
                let seq = user.push_event(at.evt_loc);
                at.touched.events.push((uid, seq));
            }
        }
        Ok(())
    }
}

/// One `msg_seq` of a conversation that holds no message: a tombstone
/// (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReservedMsgEffect {
    pub conv: ConvId,
    pub msg_seq: MsgSeq,
    pub msg_id: MsgId,
}

impl ReservedMsgEffect {
    /// The tombstone's body: what the index knows and no payload, as
    /// salvage writes the body of a lost message.
    pub(crate) fn body(&self) -> Bytes {
        let header = MsgHeader {
            kind: MessageKind::Normal,
            msg_type: 0,
            conv: self.conv,
            msg_seq: self.msg_seq,
            msg_id: self.msg_id,
            sender: Uid(0),
            target: MsgId(0),
            sent_at_ms: 0,
        };
        Bytes::from(encode_msg_record(
            &header,
            &StoredPayload::new(&Bytes::new()),
        ))
    }
}

impl Record for ReservedMsgEffect {
    const KIND: u8 = 20;
    const NAME: &'static str = "reserved-message";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.conv);
        w.u64(self.msg_seq);
        w.u64(self.msg_id);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(ReservedMsgEffect {
            conv: r.id()?,
            msg_seq: r.id()?,
            msg_id: r.id()?,
        })
    }

    fn describe(&self) -> String {
        format!(
            "conv {} msg_seq {} msg_id {}",
            self.conv, self.msg_seq, self.msg_id
        )
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        let conv = Arc::make_mut(st.convs.entry(self.conv).or_default());
        if self.msg_seq != conv.head().next() {
            return Err(ApplyError(format!(
                "reserved seq {} of conv {} does not follow head {}",
                self.msg_seq,
                self.conv,
                conv.head()
            )));
        }
        if let (Some(file), None) = (&st.scratch.0, conv.msgs.file()) {
            conv.msgs.use_file(file);
        }
        let loc = body_in_evt(at.evt_loc);
        conv.msgs.push(MsgMeta {
            loc,
            msg_id: self.msg_id,
            sender: Uid(0),
            kind: MessageKind::Normal,
            flags: FLAG_LOST | FLAG_RECALLED,
        });
        count_msg_ref(
            [&mut st.evt_refs, &mut st.body_refs, &mut st.msg_refs],
            loc,
            true,
        );
        st.totals.messages += 1;
        st.next_msg_counter = st.next_msg_counter.max(msg_counter(self.msg_id) + 1);
        at.touched.conv = Some((self.conv, self.msg_seq));
        at.touched.body = Some((self.conv, self.msg_seq));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::effect::Effect;
    use crate::inbox::state::record::Touched;
    use crate::inbox::state::{pack, State};
    use crate::log::RecordLoc;

    #[test]
    fn a_reservation_takes_each_users_seqs_below_its_next_as_gaps_and_raises_the_counter() {
        let mut st = State::new(0);
        let at = pack(RecordLoc {
            segment: 1,
            offset: 64,
        });
        let r = Effect::from(ReservationEffect {
            msg_counter: 40,
            users: vec![(Uid(1), SyncSeq(4)), (Uid(2), SyncSeq(1))],
        });
        let mut touched = Touched::default();
        r.apply(&mut st, at, 0, &mut touched).unwrap();
        assert_eq!(st.next_msg_counter, 40);
        assert_eq!(st.users[&Uid(1)].head(), SyncSeq(3));
        assert_eq!(st.users[&Uid(2)].head(), SyncSeq(0));
        assert_eq!(
            touched.events,
            vec![
                (Uid(1), SyncSeq(1)),
                (Uid(1), SyncSeq(2)),
                (Uid(1), SyncSeq(3))
            ]
        );
        // Applied again (a replay over a checkpoint that has it): no change.
        let mut again = Touched::default();
        r.apply(&mut st, at, 0, &mut again).unwrap();
        assert!(again.events.is_empty());
        assert_eq!(st.users[&Uid(1)].head(), SyncSeq(3));
        assert_eq!(Effect::decode(19, &r.encode()).unwrap(), r);
    }

    #[test]
    fn a_reserved_message_is_a_tombstone_at_the_next_seq_and_nothing_else() {
        let mut st = State::new(0);
        let at = pack(RecordLoc {
            segment: 2,
            offset: 128,
        });
        let m = ReservedMsgEffect {
            conv: ConvId(7),
            msg_seq: MsgSeq(1),
            msg_id: MsgId(9),
        };
        let e = Effect::from(m.clone());
        e.apply(&mut st, at, 0, &mut Touched::default()).unwrap();
        let meta = st.convs[&ConvId(7)].meta(MsgSeq(1)).unwrap();
        assert!(meta.tombstone());
        assert_eq!({ meta.msg_id }, MsgId(9));
        assert_eq!(st.next_msg_counter, 10);
        assert!(st.users.is_empty(), "it reaches nobody");
        // A second one at the same seq does not follow the head.
        assert!(e.apply(&mut st, at, 0, &mut Touched::default()).is_err());
        let (h, payload) = super::super::decode_msg_record(&m.body(), 1024).unwrap();
        assert_eq!(
            (h.conv, h.msg_seq, h.msg_id),
            (ConvId(7), MsgSeq(1), MsgId(9))
        );
        assert!(payload.is_empty());
        assert_eq!(Effect::decode(20, &e.encode()).unwrap(), e);
    }
}
