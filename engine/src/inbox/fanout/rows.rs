//! The fan-out tables the state holds: this store's placement, its outbox
//! per destination group, and what it applied from each source group.
//!
//! Invariants (checked where the records apply, `fanout::record`):
//! - an outbox's entries have consecutive sequence numbers, from
//!   `trimmed_through + 1` to `last_seq`;
//! - an inbound source's dedup records are those of entries above
//!   `source_trimmed` and at or below `applied_through`, and `keys` is
//!   exactly the union of their keys.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;

use super::slot::{GroupId, Placement};
use crate::api::{ClientMsgId, ConvId, MessageKind, MsgId, MsgSeq, MsgType, TimestampMs, Uid};

/// A message as a destination group needs it to append its recipients'
/// events and conversation rows: the fields of the source's message
/// effect, without its body (history is read where the conversation
/// lives).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FanoutMessage {
    pub conv: ConvId,
    pub msg_seq: MsgSeq,
    pub msg_id: MsgId,
    pub sender: Uid,
    pub kind: MessageKind,
    pub msg_type: MsgType,
    pub target_seq: MsgSeq,
    pub at_ms: TimestampMs,
    pub client_msg_id: ClientMsgId,
    /// At most 64 bytes, as the source's summary.
    pub summary: Bytes,
}

/// A recipient in another group, with the membership period that covers
/// the message: with the conversation and the message, the key a
/// destination deduplicates by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Recipient {
    pub uid: Uid,
    pub period_id: u32,
}

/// One outbox entry: one message for one destination group, with every
/// recipient it has there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEntry {
    /// Per destination, from 1, consecutive.
    pub seq: u64,
    pub message: FanoutMessage,
    /// Who gets the message's event.
    pub recipients: Vec<Recipient>,
    /// For a recall: who received its target and counted it unread; their
    /// count drops (if they had not read it), with no event of its own.
    pub uncount: Vec<Uid>,
}

/// What a destination deduplicates one recipient's event by.
pub(crate) type DedupKey = (ConvId, MsgSeq, Uid, u32);

/// The period of a dedup key that stands for a recall's unread
/// correction of a user, not an event (periods count from 0 up).
pub(crate) const UNCOUNT_PERIOD: u32 = u32::MAX;

/// The entries not yet trimmed for one destination.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Outbox {
    /// The highest sequence number given out (0: none yet).
    pub last_seq: u64,
    /// Entries at or below it are gone: the destination committed them.
    pub trimmed_through: u64,
    pub entries: BTreeMap<u64, Arc<OutboxEntry>>,
}

/// What this store applied from one source group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Inbound {
    /// Every entry at or below it is applied: the forwarder's watermark.
    pub applied_through: u64,
    /// The source trimmed its outbox through here: an entry at or below it
    /// is never sent again, so its dedup records are gone and a late copy
    /// of it is dropped whole.
    pub source_trimmed: u64,
    /// Dedup records per entry, kept until the source trims the entry.
    pub dedup: BTreeMap<u64, Vec<DedupKey>>,
    /// The keys of `dedup`, for the check per recipient (derived).
    pub keys: HashSet<DedupKey>,
}

impl Inbound {
    /// Drops the dedup records of entries at or below `through`.
    pub fn forget_through(&mut self, through: u64) {
        self.source_trimmed = self.source_trimmed.max(through);
        while let Some(entry) = self.dedup.first_entry() {
            if *entry.key() > through {
                break;
            }
            for key in entry.remove() {
                self.keys.remove(&key);
            }
        }
    }
}

/// The placement the state routes by: configuration, not state, so two
/// states are equal whatever their placements (a checkpoint does not hold
/// it; recovery installs the configured one).
#[derive(Clone, Debug, Default)]
pub(crate) struct Routing(Option<Arc<Placement>>);

impl Routing {
    /// The placement to route by: none when this store owns every slot,
    /// so that such a store does no fan-out work at all.
    pub fn new(placement: Option<Arc<Placement>>) -> Self {
        Self(placement.filter(|p| !p.owns_all()))
    }

    /// The placement, when some slots live in other groups.
    #[inline]
    pub fn get(&self) -> Option<&Placement> {
        self.0.as_deref()
    }
}

impl PartialEq for Routing {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Routing {}

/// The fan-out tables of the state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fanout {
    pub routing: Routing,
    pub outboxes: BTreeMap<GroupId, Outbox>,
    pub inbound: BTreeMap<GroupId, Inbound>,
}

impl Fanout {
    pub fn is_empty(&self) -> bool {
        self.outboxes.is_empty() && self.inbound.is_empty()
    }
}
