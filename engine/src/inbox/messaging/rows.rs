//! Messaging's rows in the state: a message's index entry ([`MsgMeta`],
//! packed in a conversation's tail), a conversation ([`Conv`]) and a
//! user's row of it ([`UserConv`]), the flags and markers they carry, and
//! the user ([`User`]): the events messages fan out to it (its sync
//! stream), its conversation rows and their order, with the devices'
//! and snapshots' rows it holds beside them.
//!
//! `state/` composes them into its tables and re-exports them; messaging's
//! records change them (`messaging/apply.rs`), and the devices' and
//! snapshots' records the parts of a user that are theirs. This file uses
//! nothing above the containers and those subsystems' rows, so the state
//! can hold these types without depending on any subsystem's commands or
//! records.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::api::*;
use crate::inbox::codec::{DecodeError, DecodeResult};
use crate::inbox::containers::loc::{self, body_at, body_in_evt, BodyLog, PackedLoc, PENDING_LOC};
use crate::inbox::containers::members;
use crate::inbox::containers::sorted::{SortedMap, SortedSet};
use crate::inbox::containers::{chunked, event_locs, rare, spill};
use crate::inbox::devices::rows::Device;
use crate::inbox::snapshots::rows::SnapshotSlot;

pub(crate) const OPEN: MsgSeq = MsgSeq(u64::MAX);
pub(crate) const FLAG_RECALLED: u8 = 1;
pub(crate) const FLAG_EDITED: u8 = 2;
/// The message was lost to damage and entered by a salvage
/// (`inbox::salvage`): its body holds only what the index knows, and it is
/// served as a tombstone. It still counts for unread like any message of
/// its kind (the loss changes what is shown, not what was received).
pub(crate) const FLAG_LOST: u8 = 4;

/// Per-message index entry: where the record is and what the state
/// machine needs without reading it.
///
/// Packed to 2-byte alignment: 26 bytes instead of 32, as there is one
/// per retained message. Its fields are read and written by value (a
/// reference to one would be unaligned, which the compiler refuses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, packed(2))]
pub(crate) struct MsgMeta {
    pub loc: PackedLoc,
    pub msg_id: MsgId,
    pub sender: Uid,
    pub kind: MessageKind,
    /// [`FLAG_RECALLED`] / [`FLAG_EDITED`] / [`FLAG_LOST`]: any makes it a
    /// tombstone.
    pub flags: u8,
}

// SAFETY: integers and a field-less enum, no pointers; the state's scratch
// file gives back only the bytes written from a `MsgMeta`.
unsafe impl spill::Plain for MsgMeta {}

/// A message's metadata in a conversation's tail ([`chunked`]): 10 bytes
/// against the tail's base, which holds its first entry's segment and
/// `msg_id` and up to four senders:
/// - the location, 5 bytes: the log bit, the segment's distance from the
///   base (12 bits, up to 4,094: about 512 GiB of log at the default
///   128 MiB segment) and a 27-bit offset; all ones while pending;
/// - the `msg_id`'s distance from the base's, 4 bytes;
/// - one byte: the kind (3 bits), the flags (3 bits) and which of the
///   base's senders sent it (2 bits).
///
/// An entry outside those ranges, or from a fifth sender, turns its tail
/// to the full 26 bytes. A one-to-one conversation's tail never does.
impl chunked::Pack for MsgMeta {
    const NARROW: usize = 10;
    const WIDE: usize = 26;
    const BASE: usize = 12 + 8 * PACKED_SENDERS;

    fn start_base(&self, base: &mut [u8]) {
        // The first location packed sets the segment (`pack_near`).
        base[..4].copy_from_slice(&loc::NO_BASE.to_le_bytes());
        base[4..12].copy_from_slice(&self.msg_id.0.to_le_bytes());
        base[12..].fill(0xff);
    }

    fn narrow(&self, base: &mut [u8], out: &mut [u8]) -> bool {
        let base_id = u64::from_le_bytes(base[4..12].try_into().expect("8 bytes"));
        let Some(Ok(id)) = self.msg_id.0.checked_sub(base_id).map(u32::try_from) else {
            return false;
        };
        if self.flags >= 8 {
            return false;
        }
        let Some(sender) = sender_slot(&mut base[12..], self.sender) else {
            return false;
        };
        let (log, plain) = body_at(self.loc);
        let mut base_segment = u32::from_le_bytes(base[..4].try_into().expect("4 bytes"));
        let Some(near) = loc::pack_near(plain, &mut base_segment, TAIL_SEGMENT_BITS) else {
            return false;
        };
        base[..4].copy_from_slice(&base_segment.to_le_bytes());
        let loc = (u64::from(log == BodyLog::Evt) << 39) | near;
        out[..5].copy_from_slice(&loc.to_le_bytes()[..5]);
        out[5..9].copy_from_slice(&id.to_le_bytes());
        out[9] = kind_code(self.kind) | (self.flags << 3) | (sender << 6);
        true
    }

    fn from_narrow(base: &[u8], b: &[u8]) -> Self {
        let base_segment = u32::from_le_bytes(base[..4].try_into().expect("4 bytes"));
        let base_id = u64::from_le_bytes(base[4..12].try_into().expect("8 bytes"));
        let mut word = [0u8; 8];
        word[..5].copy_from_slice(&b[..5]);
        let code = u64::from_le_bytes(word);
        let plain = loc::unpack_near(code & ((1 << 39) - 1), base_segment, TAIL_SEGMENT_BITS);
        let loc = if code >> 39 == 1 {
            body_in_evt(plain)
        } else {
            plain
        };
        let slot = 12 + 8 * usize::from(b[9] >> 6);
        MsgMeta {
            loc,
            msg_id: MsgId(
                base_id + u64::from(u32::from_le_bytes(b[5..9].try_into().expect("4 bytes"))),
            ),
            sender: Uid(u64::from_le_bytes(
                base[slot..slot + 8].try_into().expect("8 bytes"),
            )),
            kind: kind_from_code(b[9] & 7).expect("a kind this process packed"),
            flags: (b[9] >> 3) & 7,
        }
    }

    fn wide(&self, out: &mut [u8]) {
        let (loc, id, sender) = (self.loc, self.msg_id.0, self.sender.0);
        out[..8].copy_from_slice(&loc.to_le_bytes());
        out[8..16].copy_from_slice(&id.to_le_bytes());
        out[16..24].copy_from_slice(&sender.to_le_bytes());
        out[24] = kind_code(self.kind);
        out[25] = self.flags;
    }

    fn from_wide(b: &[u8]) -> Self {
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        MsgMeta {
            loc: word(0),
            msg_id: MsgId(word(8)),
            sender: Uid(word(16)),
            kind: kind_from_code(b[24]).expect("a kind this process packed"),
            flags: b[25],
        }
    }
}

/// Senders a packed tail names in its base.
const PACKED_SENDERS: usize = 4;

/// The index of `sender` among a packed tail's senders, which takes a free
/// slot (all ones) when it is not there yet; `None` when all are taken
/// by others, or for the uid that marks a free slot.
fn sender_slot(slots: &mut [u8], sender: Uid) -> Option<u8> {
    let free = u64::MAX;
    if sender.0 == free {
        return None;
    }
    for (i, slot) in slots.chunks_exact_mut(8).enumerate() {
        let uid = u64::from_le_bytes(slot.try_into().expect("8 bytes"));
        if uid == sender.0 {
            return Some(i as u8);
        }
        if uid == free {
            slot.copy_from_slice(&sender.0.to_le_bytes());
            return Some(i as u8);
        }
    }
    None
}

/// Bits of a packed tail entry's segment distance: 4,094 segments past
/// the base at most (`loc::pack_near`), about 512 GiB of log at the
/// default 128 MiB segment. With the log bit and the offset, 40 bits.
const TAIL_SEGMENT_BITS: u32 = 12;

impl MsgMeta {
    pub fn tombstone(self) -> bool {
        self.flags != 0
    }

    /// True when a conversation summary whose last entry is this one shows
    /// no body: the entry was recalled or edited, or it is a control entry
    /// (a recall's or a join's summary is an id, not text for a UI).
    pub fn hides_summary(self) -> bool {
        self.tombstone() || !matches!(self.kind, MessageKind::Normal | MessageKind::Edit)
    }
}

#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub(crate) struct Conv {
    /// `msg_seq` just below the first retained message (history
    /// retention, R19); only grows.
    pub msgs_base: MsgSeq,
    /// Shared in chunks, so a checkpoint's copy of the state costs a
    /// write to a long conversation one chunk, not its whole history.
    pub msgs: chunked::ChunkedVec<MsgMeta>,
    /// Shared on its own: a send changes no membership, so a checkpoint's
    /// copy of the state costs a send to a large group no copy of it.
    pub members: Arc<members::Members>,
    /// The edits of each retained message that is not recalled, by the
    /// `msg_seq` they target: a recall tombstones the edits of what it
    /// recalls, and theirs, so no edit serves a recalled body (R6). An
    /// edit recalled on its own stays listed under its target.
    pub edits: rare::Rare<BTreeMap<MsgSeq, Vec<MsgSeq>>>,
    /// Highest durable `msg_seq` (not state: maintained by the completion
    /// stage).
    pub committed_seq: MsgSeq,
    /// Set once the conversation is a large group (R7,
    /// `messaging::large`): messages above the switch are not fanned out.
    /// Boxed: most conversations never switch, and inline it was 80 of
    /// the 200 bytes of every one of them.
    pub large: Option<Box<LargeMode>>,
    /// Every retained message at or below it has its body in `msg`
    /// (not state: a hint that spares compaction a walk of the whole
    /// history when it looks for bodies still in `evt`).
    pub bodies_in_msg_to: SeqHint,
}

impl rare::Empty for BTreeMap<MsgSeq, Vec<MsgSeq>> {
    fn empty() -> &'static Self {
        static NONE: BTreeMap<MsgSeq, Vec<MsgSeq>> = BTreeMap::new();
        &NONE
    }
}

/// A position kept beside the state to speed a search, never part of
/// what the state says: two states are equal whatever their hints.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct SeqHint(pub MsgSeq);

impl PartialEq for SeqHint {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SeqHint {}

/// A large group's shared state: where it switched modes and its newest
/// entry, which stands in for every member's `last_*` fields above the
/// switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LargeMode {
    /// Messages at or below it were fanned out; those above were not.
    pub switch_seq: MsgSeq,
    pub last: LastEntry,
    /// Round of the last change (not state, see the module doc).
    pub stamp: u64,
}

/// The newest entry of a conversation, as a conversation list shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LastEntry {
    pub msg_seq: MsgSeq,
    pub msg_id: MsgId,
    pub sender: Uid,
    pub summary: Summary,
    pub at_ms: TimestampMs,
}

/// A message's summary as the conversation rows keep it: one allocation
/// per message, shared by the row of every member it reached, and 16
/// bytes in each row, where a `Bytes` took 32 and, once cloned, a shared
/// header of its own. Empty holds nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary(Option<Arc<[u8]>>);

impl Summary {
    pub fn new(bytes: &[u8]) -> Self {
        Summary((!bytes.is_empty()).then(|| Arc::from(bytes)))
    }

    /// A copy for a reply.
    pub fn to_bytes(&self) -> Bytes {
        Bytes::copy_from_slice(self)
    }

    /// This holder's share of the allocation (its bytes and the count
    /// header, divided among the rows that share it), so that summing it
    /// over every row counts each summary once.
    pub fn shared_bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |a| {
            let whole = (a.len() + 2 * std::mem::size_of::<usize>()) as u64;
            whole / Arc::strong_count(a) as u64
        })
    }
}

impl std::ops::Deref for Summary {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.as_deref().unwrap_or_default()
    }
}

impl Conv {
    pub fn head(&self) -> MsgSeq {
        self.msgs_base.plus(self.msgs.len() as u64)
    }
    pub fn is_member(&self, uid: Uid) -> bool {
        self.members
            .get(&uid)
            .and_then(|p| p.last())
            .is_some_and(|p| p.leave_seq == OPEN)
    }
    /// Members whose period covers `seq`, in uid order (R5).
    pub fn members_at(&self, seq: MsgSeq) -> Vec<Uid> {
        self.members
            .iter()
            .filter(|(_, ps)| ps.iter().any(|p| p.covers(seq)))
            .map(|(uid, _)| *uid)
            .collect()
    }
    /// Looks a message up by id: ids grow with seq inside a conversation.
    pub fn seq_of(&self, msg_id: MsgId) -> Option<MsgSeq> {
        let i = self.msgs.binary_search_by_key(&msg_id, |m| m.msg_id).ok()?;
        Some(self.msgs_base.plus(i as u64 + 1))
    }
    /// The retained message at `seq` (`None` at or below `msgs_base`).
    pub fn meta(&self, seq: MsgSeq) -> Option<MsgMeta> {
        self.msgs.get(self.meta_index(seq)?)
    }
    /// Changes the retained message at `seq` with `f`; false when there is
    /// none.
    pub fn update_meta(&mut self, seq: MsgSeq, f: impl FnOnce(&mut MsgMeta)) -> bool {
        match self.meta_index(seq) {
            Some(i) => self.msgs.update(i, f),
            None => false,
        }
    }
    fn meta_index(&self, seq: MsgSeq) -> Option<usize> {
        if seq <= self.msgs_base {
            return None;
        }
        usize::try_from(seq.checked_since(self.msgs_base.next())?).ok()
    }
    /// Moves [`Conv::bodies_in_msg_to`] past the messages above it whose
    /// bodies are in `msg` (and past those reclaimed).
    pub fn advance_bodies_hint(&mut self) {
        let mut at = self.bodies_in_msg_to.0.max(self.msgs_base);
        while let Some(m) = self.meta(at.next()) {
            if m.loc == PENDING_LOC || body_at(m.loc).0 == BodyLog::Evt {
                break;
            }
            at = at.next();
        }
        self.bodies_in_msg_to = SeqHint(at);
    }

    /// The highest `msg_seq` that was fanned out: the switch of a large
    /// group, [`OPEN`] for any other conversation.
    pub fn fanned_out_until(&self) -> MsgSeq {
        self.large.as_ref().map_or(OPEN, |l| l.switch_seq)
    }
}

/// Ordering key of a user's conversation list: last activity, then the
/// last message's id (global and increasing) to break ties, then conv.
pub(crate) type ActivityKey = (TimestampMs, MsgId, ConvId);

/// What a recipient's row keeps of a message ([`User::take_message`]).
pub(crate) struct RecipientMessage<'a> {
    pub conv: ConvId,
    pub msg_seq: MsgSeq,
    pub msg_id: MsgId,
    pub sender: Uid,
    pub kind: MessageKind,
    pub at_ms: TimestampMs,
    pub summary: &'a Summary,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct UserConv {
    pub read_seq: MsgSeq,
    pub unread: u32,
    pub last_msg_seq: MsgSeq,
    pub last_msg_id: MsgId,
    pub last_sender: Uid,
    pub last_summary: Summary,
    pub last_activity_ms: TimestampMs,
    pub muted: bool,
    pub pinned: bool,
    /// Large groups: the dirty marker's cleared position (R7); only grows.
    pub cleared_seq: MsgSeq,
    pub stamp: u64,
}

impl UserConv {
    pub fn key(&self, conv: ConvId) -> ActivityKey {
        (self.last_activity_ms, self.last_msg_id, conv)
    }

    /// The row served by the conversation list and snapshots. A last entry
    /// that [`MsgMeta::hides_summary`] shows no summary (R6).
    pub fn summary(&self, conv: ConvId, hide_body: bool) -> ConvSummary {
        ConvSummary {
            conv,
            last_msg_seq: self.last_msg_seq,
            last_msg_id: self.last_msg_id,
            last_sender: self.last_sender,
            last_summary: if hide_body {
                Bytes::new()
            } else {
                self.last_summary.to_bytes()
            },
            unread: self.unread,
            read_seq: self.read_seq,
            last_activity_ms: self.last_activity_ms,
            muted: self.muted,
            pinned: self.pinned,
        }
    }
}

/// A message kind's byte, the same in a record, a packed index entry,
/// a checkpoint and a snapshot file.
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

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct User {
    /// `sync_seq` just below the first retained event.
    pub events_base: SyncSeq,
    /// Locations of the retained events, 4 or 5 bytes each where they
    /// allow it ([`event_locs`]).
    pub events: event_locs::EventLocs,
    /// Highest durable `sync_seq` (not state: completion stage).
    pub committed_seq: SyncSeq,
    /// Registered devices, revoked ones included, in registration order.
    pub devices: Vec<Device>,
    /// The user's row of each conversation it is in.
    pub convs: SortedMap<ConvId, UserConv>,
    /// The rows' keys by activity: the conversation list's order.
    pub order: SortedSet<ActivityKey>,
    /// Snapshots and the lease and snapshot counters: out of line until
    /// the user has one.
    pub recovery: rare::Rare<Recovery>,
}

/// What a user holds once a device of it recovers (R17, R18): its
/// snapshots by id, and the next lease and snapshot ids. Few users ever
/// have either, so a [`User`] keeps this out of line ([`rare::Rare`]):
/// inline, its 40 bytes put every user in the allocator's 192-byte class
/// instead of the 160-byte one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Recovery {
    pub snapshots: BTreeMap<u64, SnapshotSlot>,
    pub next_lease_id: u64,
    pub next_snapshot_id: u64,
}

impl rare::Empty for Recovery {
    fn empty() -> &'static Self {
        static EMPTY: Recovery = Recovery {
            snapshots: BTreeMap::new(),
            next_lease_id: 0,
            next_snapshot_id: 0,
        };
        &EMPTY
    }
}

impl User {
    /// Snapshots by id (R18).
    pub fn snapshots(&self) -> &BTreeMap<u64, SnapshotSlot> {
        &self.recovery.snapshots
    }

    pub fn next_lease_id(&self) -> u64 {
        self.recovery.next_lease_id
    }

    pub fn next_snapshot_id(&self) -> u64 {
        self.recovery.next_snapshot_id
    }

    /// Raises the next lease id to at least `id`; a user keeps no box for
    /// a counter at 0.
    pub fn raise_next_lease_id(&mut self, id: u64) {
        if id > self.next_lease_id() {
            self.recovery.make_mut().next_lease_id = id;
        }
    }

    /// Raises the next snapshot id to at least `id`, likewise.
    pub fn raise_next_snapshot_id(&mut self, id: u64) {
        if id > self.next_snapshot_id() {
            self.recovery.make_mut().next_snapshot_id = id;
        }
    }

    pub fn head(&self) -> SyncSeq {
        self.events_base.plus(self.events.len() as u64)
    }

    /// Starts loading the lines a message's apply touches beyond the user
    /// itself: its events' header and end, where the new one goes, its rows'
    /// keys and first row, and its order ([`prefetch`]).
    pub fn prefetch_for_message(&self) {
        self.events.prefetch();
        self.convs.prefetch();
        self.order.prefetch();
    }

    pub fn device(&self, id: DeviceId) -> Option<&Device> {
        self.devices.iter().find(|d| d.row.device == id)
    }
    pub(crate) fn push_event(&mut self, loc: PackedLoc) -> SyncSeq {
        self.events.push(loc);
        self.head()
    }

    /// A message's mark on this user, `uid`, as a recipient: its event at
    /// `evt_loc`, and the conversation's row (last entry, unread, activity
    /// order). The one place a recipient takes a message, whether the send
    /// was applied here or delivered from another group.
    pub(crate) fn take_message(
        &mut self,
        uid: Uid,
        m: &RecipientMessage<'_>,
        evt_loc: PackedLoc,
        stamp: u64,
    ) -> SyncSeq {
        let seq = self.push_event(evt_loc);
        let uc = self.convs.get_or_default(m.conv);
        let old_key = uc.key(m.conv);
        uc.last_msg_seq = m.msg_seq;
        uc.last_msg_id = m.msg_id;
        uc.last_sender = m.sender;
        uc.last_summary = m.summary.clone();
        uc.last_activity_ms = m.at_ms;
        if m.kind == MessageKind::Normal && m.sender != uid {
            uc.unread = uc.unread.saturating_add(1);
        }
        uc.stamp = stamp;
        let new_key = uc.key(m.conv);
        self.order.replace(&old_key, new_key);
        seq
    }
}
