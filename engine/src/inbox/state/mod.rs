//! The inbox's in-memory tables. Only the records' `apply` functions
//! change them ([`record::Record`]; each subsystem owns its records).
//!
//! The state composes them: [`State`] is here; the row types belong to
//! their subsystems (`messaging/rows.rs`, with the per-user aggregate
//! [`User`] that holds the devices' and snapshots' rows too,
//! `devices/rows.rs`, `snapshots/rows.rs`, and messaging's idempotency
//! table, `messaging/idem.rs`), which use nothing above `containers/`
//! but each other's rows, and are re-exported here.
//!
//! Invariants (checked by [`State::check_invariants`]):
//! - `apply` is a pure function of (state, record, record location): the
//!   sequencer calls it live and recovery calls it on replay, so both build
//!   the same state. It never reads the clock or the configuration (the
//!   idempotency TTL is part of the state).
//! - Every iteration whose order matters goes over ordered maps.
//! - `Conv::msgs[seq - msgs_base - 1]` is the message at `msg_seq = seq`
//!   (contiguous, R1; seqs at or below `msgs_base` are reclaimed by history
//!   retention and never served again); `User::events[seq - events_base - 1]` is the user's event at
//!   `sync_seq = seq` (contiguous, R2).
//! - Membership periods of one user in one conversation never overlap and
//!   are ordered; a period covers `join_seq..=leave_seq` (R5).
//! - `unread` of `(uid, conv)` is the number of messages that are of kind
//!   normal, not recalled, not sent by `uid`, inside one of `uid`'s periods,
//!   retained (above the conversation's `msgs_base`) and above `read_seq`
//!   (R14).
//! - `stamp` fields (the sequencer round of the last change) and the
//!   committed watermarks are not state proper: readers use them to avoid
//!   revealing changes that are not durable yet.

use std::sync::Arc;

mod invariants;
pub(crate) mod memory;
pub(crate) mod record;
mod seg_refs;

use crate::api::*;
pub(crate) use crate::inbox::containers::members::Period;
pub(crate) use crate::inbox::containers::{grow_for_one, IdMap, IdSet};
use crate::inbox::containers::{loc, spill};
pub(crate) use crate::inbox::devices::rows::{Device, DeviceRow};
use crate::inbox::messaging::idem;
pub(crate) use crate::inbox::messaging::rows::*;
pub(crate) use crate::inbox::snapshots::rows::{SnapshotPhase, SnapshotRow, SnapshotSlot};
use crate::prefetch::prefetch;
pub(crate) use loc::{body_at, body_in_evt, pack, unpack, BodyLog, PackedLoc, PENDING_LOC};
pub(crate) use seg_refs::SegRefs;

/// Where the send an idempotency key names went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IdemEntry {
    pub conv: ConvId,
    pub msg_id: MsgId,
    pub msg_seq: MsgSeq,
}

/// Conversations and users are behind `Arc`s, so that a checkpoint takes a
/// copy of the whole state in O(users + conversations) pointer copies under
/// the lock and encodes it elsewhere; a change to an entry the copy still
/// shares clones that entry first ([`Arc::make_mut`], copy on write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct State {
    pub convs: IdMap<ConvId, Arc<Conv>>,
    pub users: IdMap<Uid, Arc<User>>,
    /// Idempotency keys of the last `idem_ttl_ms` ([`idem`]).
    pub idem: idem::IdemTable,
    pub idem_ttl_ms: u64,
    /// Next msg_id counter value (the low bits of a msg_id).
    pub next_msg_counter: u64,
    /// LSN of the last `evt` batch applied.
    pub evt_lsn: u64,
    /// Replication index of the last replicated round applied (its round
    /// mark, `replica/record.rs`); 0 on a store that never replicated.
    pub replica_index: u64,
    /// Retained events and message bodies per `evt` segment (derived:
    /// see [`SegRefs`]): a segment with a count is needed, whatever holds it.
    pub evt_refs: SegRefs,
    /// Of those, the retained message bodies per `evt` segment: what
    /// compaction must move to `msg` before the segment can go.
    pub body_refs: SegRefs,
    /// Retained messages per `msg` segment (derived: see [`SegRefs`]).
    pub msg_refs: SegRefs,
    /// Entry counts for `stats()` (derived: kept on apply, recounted on
    /// load), so that reading them never walks the state.
    pub totals: Totals,
    /// Where conversations keep the full chunks of their message index
    /// (not state: where it is kept, not what it holds).
    pub scratch: Scratch,
    /// The outboxes to other groups and what was applied from them
    /// (`fanout`); empty on a store that owns every slot.
    pub fanout: crate::inbox::fanout::rows::Fanout,
}

/// The scratch file of a state's message index ([`spill`]), if it has
/// one. Two states are equal whatever their scratch files.
#[derive(Clone, Default)]
pub(crate) struct Scratch(pub Option<Arc<spill::Arena>>);

impl Scratch {
    /// A new scratch file in `dir`; none (the heap) if the file system
    /// refuses one.
    pub fn open(dir: &std::path::Path) -> Self {
        match spill::Arena::open(dir) {
            Ok(a) => Self(Some(a)),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "no scratch file for the message index; it stays on the heap");
                Self(None)
            }
        }
    }
}

impl PartialEq for Scratch {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Scratch {}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(a) => write!(f, "Scratch({a:?})"),
            None => write!(f, "Scratch(heap)"),
        }
    }
}

/// How many retained events, retained messages and device rows the state
/// holds. Invariant: equal to a recount ([`State::recount_totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub events: u64,
    pub messages: u64,
    pub devices: u64,
}

/// Counts (or uncounts) a message location in `[evt, body, msg]`: a body
/// in `evt` holds its segment like an event does, and is counted apart too.
pub(crate) fn count_msg_ref(refs: [&mut SegRefs; 3], loc: PackedLoc, add: bool) {
    let [evt, body, msg] = refs;
    let targets: Vec<&mut SegRefs> = match body_at(loc) {
        (BodyLog::Evt, _) => vec![evt, body],
        (BodyLog::Msg, _) => vec![msg],
    };
    let at = body_at(loc).1;
    for r in targets {
        if add {
            r.add(at, 1);
        } else {
            r.remove(at);
        }
    }
}

/// Starts loading every line of the allocation behind `user`'s `Arc`: its
/// counts, which `Arc::make_mut` reads, and the user's fields.
pub(crate) fn prefetch_user(user: &Arc<User>) {
    // The counts are two words before the value.
    let start = Arc::as_ptr(user).cast::<u8>().wrapping_sub(16);
    let len = 16 + size_of::<User>();
    for at in (0..len).step_by(64).chain([len - 1]) {
        prefetch(start.wrapping_add(at));
    }
}

/// The counter part of a msg_id (below the shard bits, R3).
pub(crate) fn msg_counter(msg_id: MsgId) -> u64 {
    msg_id.0 & ((1u64 << (64 - MSG_ID_SHARD_BITS)) - 1)
}

impl State {
    pub fn new(idem_ttl_ms: u64) -> Self {
        Self {
            convs: IdMap::default(),
            users: IdMap::default(),
            idem: idem::IdemTable::default(),
            idem_ttl_ms,
            next_msg_counter: 1,
            evt_lsn: 0,
            replica_index: 0,
            evt_refs: SegRefs::default(),
            body_refs: SegRefs::default(),
            msg_refs: SegRefs::default(),
            totals: Totals::default(),
            scratch: Scratch::default(),
            fanout: Default::default(),
        }
    }

    /// Keeps the message index's full chunks and the idempotency table's
    /// sorted runs in `scratch` from now on, those already here included.
    pub fn use_scratch(&mut self, scratch: Scratch) {
        if let Some(file) = &scratch.0 {
            for c in self.convs.values_mut() {
                Arc::make_mut(c).msgs.use_file(file);
            }
            self.idem.use_file(file);
        }
        self.scratch = scratch;
    }

    /// The entry counts, counted afresh: O(users + conversations).
    pub(crate) fn recount_totals(&self) -> Totals {
        Totals {
            events: self.users.values().map(|u| u.events.len() as u64).sum(),
            messages: self.convs.values().map(|c| c.msgs.len() as u64).sum(),
            devices: self.users.values().map(|u| u.devices.len() as u64).sum(),
        }
    }

    /// Counts a message location in the segment of the log it points into.
    pub fn add_msg_ref(&mut self, loc: PackedLoc) {
        count_msg_ref(
            [&mut self.evt_refs, &mut self.body_refs, &mut self.msg_refs],
            loc,
            true,
        );
    }

    /// Uncounts a message location (trimmed or moved away).
    pub fn remove_msg_ref(&mut self, loc: PackedLoc) {
        count_msg_ref(
            [&mut self.evt_refs, &mut self.body_refs, &mut self.msg_refs],
            loc,
            false,
        );
    }

    /// Recounts every segment reference from the indexes (after a
    /// checkpoint load, and to check the incremental counts).
    pub fn recount_seg_refs(&self) -> (SegRefs, SegRefs, SegRefs) {
        let mut evt = SegRefs::rebuild(self.users.values().flat_map(|u| u.events.iter()));
        let mut body = SegRefs::default();
        let mut msg = SegRefs::default();
        for c in self.convs.values() {
            let in_log = |log| {
                c.msgs.iter().filter_map(move |m| match body_at(m.loc) {
                    (l, at) if l == log => Some(at),
                    _ => None,
                })
            };
            // A body in `evt` is an entry of both `evt` and `body`.
            evt.add_each(in_log(BodyLog::Evt));
            body.add_each(in_log(BodyLog::Evt));
            msg.add_each(in_log(BodyLog::Msg));
        }
        evt.mark_all_dirty();
        body.mark_all_dirty();
        msg.mark_all_dirty();
        (evt, body, msg)
    }

    /// The send `(sender, cmid)` names at time `now`, if it is remembered.
    /// The table only knows fingerprints ([`idem`]): of the entries whose
    /// fingerprint matches, the key's is the one whose message `sender`
    /// sent, which the message index tells. A message reclaimed by history
    /// retention is no longer indexed; its entry is taken when `sender` was
    /// a member of its conversation at its `msg_seq` (the periods stay),
    /// and its msg_id is below every retained one's.
    pub fn idem_lookup(
        &self,
        sender: Uid,
        cmid: ClientMsgId,
        now: TimestampMs,
    ) -> Option<IdemEntry> {
        let candidates = self.idem.candidates(sender, cmid, now, self.idem_ttl_ms);
        candidates.into_iter().find_map(|e| {
            let c = self.convs.get(&e.conv)?;
            let msg_seq = idem::seq_below(c.head(), e.seq_lo)?;
            let sent_by_sender = match c.meta(msg_seq) {
                Some(m) => sender == { m.sender } && e.msg_id == { m.msg_id },
                // Reclaimed by history retention: a member then, and sent
                // before the first message still retained.
                None => {
                    msg_seq <= c.msgs_base
                        && c.members
                            .get(&sender)
                            .is_some_and(|ps| ps.iter().any(|p| p.covers(msg_seq)))
                        && c.meta(c.msgs_base.next())
                            .is_none_or(|first| e.msg_id < { first.msg_id })
                }
            };
            sent_by_sender.then_some(IdemEntry {
                conv: e.conv,
                msg_id: e.msg_id,
                msg_seq,
            })
        })
    }

    /// Patches the location of an event whose record was just submitted.
    pub fn patch_event(&mut self, uid: Uid, seq: SyncSeq, loc: PackedLoc) {
        if let Some(user) = self.users.get_mut(&uid).map(Arc::make_mut) {
            if seq > user.events_base {
                let i = (seq.0 - user.events_base.0 - 1) as usize;
                if let Some(old) = user.events.replace(i, loc) {
                    self.evt_refs.replace(old, loc);
                }
            }
        }
    }

    /// Patches the location of a message whose record was just submitted.
    pub fn patch_msg(&mut self, conv: ConvId, seq: MsgSeq, loc: PackedLoc) {
        let mut old = None;
        if let Some(c) = self.convs.get_mut(&conv).map(Arc::make_mut) {
            c.update_meta(seq, |meta| {
                old = Some(meta.loc);
                meta.loc = loc;
            });
        }
        if let Some(old) = old {
            if old != loc {
                self.remove_msg_ref(old);
                self.add_msg_ref(loc);
            }
        }
    }

    /// Marks everything as durable: used after recovery.
    pub fn commit_all(&mut self) {
        for c in self.convs.values_mut().map(Arc::make_mut) {
            c.committed_seq = c.head();
        }
        for u in self.users.values_mut().map(Arc::make_mut) {
            u.committed_seq = u.head();
        }
    }

    /// Recounts both indexes and compares with the incremental counts.
    pub fn check_seg_refs(&self) -> Result<(), String> {
        let (evt, body, msg) = self.recount_seg_refs();
        if evt != self.evt_refs {
            return Err(format!(
                "evt segment refs: kept {:?}, recounted {:?}",
                self.evt_refs, evt
            ));
        }
        if body != self.body_refs {
            return Err(format!(
                "evt body refs: kept {:?}, recounted {:?}",
                self.body_refs, body
            ));
        }
        if msg != self.msg_refs {
            return Err(format!(
                "msg segment refs: kept {:?}, recounted {:?}",
                self.msg_refs, msg
            ));
        }
        Ok(())
    }

    /// Bytes held by the event and message indexes (the packed location
    /// vectors and message metadata), for stats and BENCHMARKS.md.
    /// Bytes of both indexes, walking them: capacities, exact.
    pub fn index_bytes(&self) -> (u64, u64) {
        let events: usize = self
            .users
            .values()
            .map(|u| u.events.allocated_bytes())
            .sum();
        let msgs: usize = self
            .convs
            .values()
            .map(|c| c.msgs.heap_bytes().1 + c.msgs.overhead_bytes())
            .sum();
        (events as u64, msgs as u64)
    }
}

/// Bytes of the event index and of the message index, estimated from the
/// entry counts (lengths, not capacities): what `stats()` reports. Each
/// entry counts at its widest: 8 bytes an event ([`event_locs`]) and 26 a
/// message (a chunk's; a packed tail's are 10, [`chunked`]), so both parts
/// are upper bounds; the memory breakdown has the exact bytes.
pub(crate) fn index_bytes_estimate(totals: &Totals) -> (u64, u64) {
    (
        totals.events * 8,
        totals.messages * std::mem::size_of::<MsgMeta>() as u64,
    )
}

#[cfg(test)]
mod tests;
