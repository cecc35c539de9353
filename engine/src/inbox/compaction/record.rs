//! The compaction records (R19): trims of a user's events and of a
//! conversation's messages, relocations of events to copies of their
//! records, and the copies themselves.
//!
//! Invariants:
//! - `events_base` only grows (a trim below the base is a no-op), so a
//!   reclaimed event never comes back after a restart; likewise a
//!   conversation's `msgs_base`;
//! - a relocation moves an event only if it still points at the record
//!   that was copied.
//!
//! ## `evt` records (after the format byte, little-endian)
//! - [`TrimEffect`] (kind 6): uid u64, events_base u64.
//! - [`RelocateEffect`] (kind 7): count u32 (at most
//!   [`RELOCATIONS_PER_RECORD_MAX`]), then per move: uid u64, sync_seq
//!   u64, from u64 (packed location), to u64.
//! - [`TrimMsgsEffect`] (kind 8): conv u64, msgs_base u64 (history
//!   retention: the conversation's messages at or below `msgs_base` are
//!   reclaimed).
//! - [`MoveBodiesEffect`] (kind 10): count u32 (at most
//!   [`RELOCATIONS_PER_RECORD_MAX`]), then per move: conv u64, msg_seq
//!   u64, from u64 (message location: in `evt`), to u64 (in `msg`).
//! - a copy: the original record's kind with bit 7 set, and its payload
//!   unchanged (see `Effect::Copied`).

use std::sync::Arc;

use crate::api::*;
use crate::inbox::codec::{DecodeError, DecodeResult, Reader, Writer};
use crate::inbox::state::record::{record_set, ApplyAt, ApplyError, Record};
use crate::inbox::state::{PackedLoc, State};

record_set! {
    /// The `evt` records compaction owns.
    pub(crate) enum Records in Effect::Compaction {
        Trim(TrimEffect),
        Relocate(RelocateEffect),
        TrimMsgs(TrimMsgsEffect),
        MoveBodies(MoveBodiesEffect),
    }
}

/// Messages now read their bodies from copies in the `msg` log, made by
/// compaction before it deletes or rewrites the `evt` segment that held
/// them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MoveBodiesEffect(pub Vec<BodyMove>);

/// One message body moved (message locations, see `containers::loc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BodyMove {
    pub conv: ConvId,
    pub msg_seq: MsgSeq,
    pub from: PackedLoc,
    pub to: PackedLoc,
}

impl Record for MoveBodiesEffect {
    const KIND: u8 = 10;
    const NAME: &'static str = "move-bodies";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u32(u32::try_from(self.0.len()).unwrap_or(u32::MAX));
        for m in &self.0 {
            w.u64(m.conv);
            w.u64(m.msg_seq);
            w.u64(m.from);
            w.u64(m.to);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        let n = r.u32()? as usize;
        if n > RELOCATIONS_PER_RECORD_MAX {
            return Err(DecodeError("too many body moves in one record"));
        }
        let mut moves = Vec::with_capacity(n);
        for _ in 0..n {
            moves.push(BodyMove {
                conv: r.id()?,
                msg_seq: r.id()?,
                from: r.u64()?,
                to: r.u64()?,
            });
        }
        Ok(MoveBodiesEffect(moves))
    }

    fn describe(&self) -> String {
        format!("{} messages to msg", self.0.len())
    }

    fn apply(&self, st: &mut State, _at: ApplyAt<'_>) -> Result<(), ApplyError> {
        st.apply_move_bodies(&self.0);
        Ok(())
    }
}

/// The user's retained events now start after `events_base`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TrimEffect {
    pub uid: Uid,
    pub events_base: SyncSeq,
}

/// The conversation's retained messages now start after `msgs_base`
/// (history retention).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TrimMsgsEffect {
    pub conv: ConvId,
    pub msgs_base: MsgSeq,
}

/// Events now read from copies of their records (segment rewrite).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RelocateEffect(pub Vec<Relocation>);

/// One event moved to a copy of its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Relocation {
    pub uid: Uid,
    pub sync_seq: SyncSeq,
    pub from: PackedLoc,
    pub to: PackedLoc,
}

/// Upper bound on moves in one relocate record, so that one command never
/// holds the sequencer for long.
pub(crate) const RELOCATIONS_PER_RECORD_MAX: usize = 4096;

impl Record for TrimEffect {
    const KIND: u8 = 6;
    const NAME: &'static str = "trim";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.uid);
        w.u64(self.events_base);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(TrimEffect {
            uid: r.id()?,
            events_base: r.id()?,
        })
    }

    fn describe(&self) -> String {
        format!("uid {} events_base {}", self.uid, self.events_base)
    }

    fn apply(&self, st: &mut State, _at: ApplyAt<'_>) -> Result<(), ApplyError> {
        st.apply_trim(self.uid, self.events_base)
    }
}

impl Record for RelocateEffect {
    const KIND: u8 = 7;
    const NAME: &'static str = "relocate";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u32(u32::try_from(self.0.len()).unwrap_or(u32::MAX));
        for m in &self.0 {
            w.u64(m.uid);
            w.u64(m.sync_seq);
            w.u64(m.from);
            w.u64(m.to);
        }
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        let n = r.u32()? as usize;
        if n > RELOCATIONS_PER_RECORD_MAX {
            return Err(DecodeError("too many relocations in one record"));
        }
        let mut moves = Vec::with_capacity(n);
        for _ in 0..n {
            moves.push(Relocation {
                uid: r.id()?,
                sync_seq: r.id()?,
                from: r.u64()?,
                to: r.u64()?,
            });
        }
        Ok(RelocateEffect(moves))
    }

    fn describe(&self) -> String {
        format!("{} events", self.0.len())
    }

    fn apply(&self, st: &mut State, _at: ApplyAt<'_>) -> Result<(), ApplyError> {
        st.apply_relocate(&self.0);
        Ok(())
    }
}

impl Record for TrimMsgsEffect {
    const KIND: u8 = 8;
    const NAME: &'static str = "trim-messages";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.conv);
        w.u64(self.msgs_base);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(TrimMsgsEffect {
            conv: r.id()?,
            msgs_base: r.id()?,
        })
    }

    fn describe(&self) -> String {
        format!("conv {} msgs_base {}", self.conv, self.msgs_base)
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        st.apply_trim_msgs(self.conv, self.msgs_base, at.stamp)
    }
}

impl State {
    pub(crate) fn apply_trim(&mut self, uid: Uid, events_base: SyncSeq) -> Result<(), ApplyError> {
        let user = self
            .users
            .get_mut(&uid)
            .map(Arc::make_mut)
            .ok_or_else(|| ApplyError(format!("trim of unknown user {uid}")))?;
        if events_base <= user.events_base {
            return Ok(());
        }
        if events_base > user.head() {
            return Err(ApplyError(format!(
                "trim of uid {uid} to {events_base} is beyond its head {}",
                user.head()
            )));
        }
        let n = usize::try_from(events_base.0 - user.events_base.0)
            .map_err(|_| ApplyError("trim length overflows".into()))?;
        for loc in user.events.remove_front(n) {
            self.evt_refs.remove(loc);
        }
        self.totals.events = self.totals.events.saturating_sub(n as u64);
        user.events_base = events_base;
        Ok(())
    }

    /// Reclaims a conversation's messages at or below `msgs_base` (history
    /// retention). Each member's `unread` drops by the reclaimed messages
    /// that still counted for it, so `unread` keeps counting exactly the
    /// retained unread messages; read cursors do not move.
    pub(crate) fn apply_trim_msgs(
        &mut self,
        conv: ConvId,
        msgs_base: MsgSeq,
        stamp: u64,
    ) -> Result<(), ApplyError> {
        let (old_base, head, members) = {
            let c = self
                .convs
                .get(&conv)
                .ok_or_else(|| ApplyError(format!("message trim of unknown conv {conv}")))?;
            (
                c.msgs_base,
                c.head(),
                c.members.keys().copied().collect::<Vec<_>>(),
            )
        };
        if msgs_base <= old_base {
            return Ok(());
        }
        if msgs_base > head {
            return Err(ApplyError(format!(
                "message trim of conv {conv} to {msgs_base} is beyond its head {head}"
            )));
        }
        for uid in members {
            let gone = self.countable_between(uid, conv, msgs_base);
            if gone == 0 {
                continue;
            }
            if let Some(uc) = self
                .users
                .get_mut(&uid)
                .map(Arc::make_mut)
                .and_then(|u| u.convs.get_mut(&conv))
            {
                uc.unread = uc.unread.saturating_sub(gone);
                uc.stamp = stamp;
            }
        }
        let c = self
            .convs
            .get_mut(&conv)
            .map(Arc::make_mut)
            .ok_or_else(|| ApplyError("conv vanished".into()))?;
        let n = usize::try_from(msgs_base.0 - old_base.0)
            .map_err(|_| ApplyError("message trim length overflows".into()))?;
        let gone: Vec<PackedLoc> = c.msgs.remove_front(n).iter().map(|m| m.loc).collect();
        self.totals.messages = self.totals.messages.saturating_sub(n as u64);
        c.msgs_base = msgs_base;
        // A trim takes a prefix and an edit is above its target, so the
        // links of reclaimed targets are exactly the ones to drop.
        if let Some(edits) = c.edits.written() {
            let kept = edits.split_off(&msgs_base.next());
            c.edits = kept.into();
        }
        for loc in gone {
            self.remove_msg_ref(loc);
        }
        Ok(())
    }

    /// Points each message at its body's new place, only if it still
    /// points at the old one (a message trimmed since is skipped).
    pub(crate) fn apply_move_bodies(&mut self, moves: &[BodyMove]) {
        for m in moves {
            let still_there = self
                .convs
                .get(&m.conv)
                .and_then(|c| c.meta(m.msg_seq))
                .is_some_and(|meta| meta.loc == m.from);
            if still_there {
                self.patch_msg(m.conv, m.msg_seq, m.to);
            }
        }
        let mut convs: Vec<ConvId> = moves.iter().map(|m| m.conv).collect();
        convs.sort_unstable();
        convs.dedup();
        for conv in convs {
            if let Some(c) = self.convs.get_mut(&conv) {
                Arc::make_mut(c).advance_bodies_hint();
            }
        }
    }

    pub(crate) fn apply_relocate(&mut self, moves: &[Relocation]) {
        for m in moves {
            let Some(user) = self.users.get_mut(&m.uid).map(Arc::make_mut) else {
                continue;
            };
            if m.sync_seq <= user.events_base {
                continue;
            }
            let i = (m.sync_seq.0 - user.events_base.0 - 1) as usize;
            if user.events.get(i) == Some(m.from) {
                self.evt_refs.replace(m.from, m.to);
                user.events.replace(i, m.to);
            }
        }
    }
}

/// History retention in a checkpoint (optional, last): the conversations
/// whose message base moved, by id, as (conv u64, msgs_base u64) after a
/// u64 count. The conversation table above holds only retained messages.
pub(crate) fn put_msg_bases(w: &mut Writer, st: &State) {
    let mut bases: Vec<(ConvId, MsgSeq)> = st
        .convs
        .iter()
        .filter(|(_, c)| c.msgs_base > MsgSeq(0))
        .map(|(id, c)| (*id, c.msgs_base))
        .collect();
    bases.sort_unstable();
    w.u64(bases.len() as u64);
    for (conv, base) in bases {
        w.u64(conv);
        w.u64(base);
    }
}

pub(crate) fn get_msg_bases(r: &mut Reader<'_>, st: &mut State) -> DecodeResult<()> {
    for _ in 0..r.count(16)? {
        let conv: ConvId = r.id()?;
        let base: MsgSeq = r.id()?;
        st.convs
            .get_mut(&conv)
            .map(Arc::make_mut)
            .ok_or(DecodeError("message base of an unknown conv"))?
            .msgs_base = base;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::state::SegRefs;

    #[test]
    fn trim_never_moves_the_base_down_and_relocate_skips_moved_events() {
        let mut st = State::new(0);
        let user = Arc::make_mut(st.users.entry(Uid(1)).or_default());
        user.events = [10, 11, 12, 13].into_iter().collect();
        st.evt_refs = SegRefs::rebuild(st.users[&Uid(1)].events.iter());
        st.totals = st.recount_totals();
        st.apply_trim(Uid(1), SyncSeq(2)).unwrap();
        assert_eq!(st.users[&Uid(1)].events_base, SyncSeq(2));
        assert_eq!(
            st.users[&Uid(1)].events.iter().collect::<Vec<_>>(),
            vec![12, 13]
        );
        st.apply_trim(Uid(1), SyncSeq(1)).unwrap();
        assert_eq!(
            st.users[&Uid(1)].events_base,
            SyncSeq(2),
            "a lower trim is a no-op"
        );
        assert!(
            st.apply_trim(Uid(1), SyncSeq(9)).is_err(),
            "beyond the head"
        );
        st.apply_relocate(&[
            Relocation {
                uid: Uid(1),
                sync_seq: SyncSeq(3),
                from: 12,
                to: 99,
            },
            Relocation {
                uid: Uid(1),
                sync_seq: SyncSeq(4),
                from: 55,
                to: 98,
            },
            Relocation {
                uid: Uid(1),
                sync_seq: SyncSeq(1),
                from: 10,
                to: 97,
            },
        ]);
        assert_eq!(
            st.users[&Uid(1)].events.iter().collect::<Vec<_>>(),
            vec![99, 13]
        );
        st.check_seg_refs().unwrap();
    }
}
