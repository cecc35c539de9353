//! Fan-out across groups: the outbox a send writes for the recipients
//! that live in other groups, and the exactly-once application of those
//! entries where the recipients live.
//!
//! - [`slot`]: the slot of an id and the [`Placement`](slot::Placement)
//!   a store is configured with (a store that owns every slot routes
//!   nothing, and behaves as one with no placement);
//! - [`rows`]: the outbox per destination and the applied watermark and
//!   dedup records per source, which the state holds;
//! - [`record`]: their `evt` records and checkpoint section;
//! - here: [`route`], the send path's hook, and the commands a forwarder
//!   drives: read an outbox, deliver a batch, trim an outbox.
//!
//! The protocol, per (source, destination) pair:
//! 1. a send decides `msg_seq`, stores the message and appends the events
//!    of the members this store owns, and writes one outbox entry per
//!    other destination group, all in one round;
//! 2. the forwarder reads the outbox ([`Command::Outbox`]; answered once
//!    the round that read it is durable, so it never hands out an entry
//!    the source could still lose) and delivers it;
//! 3. the destination applies each entry in sequence order
//!    ([`Command::Deliver`]): each recipient once, deduplicated by
//!    (conversation, message, uid, membership period), and answers its
//!    applied watermark once that is durable;
//! 4. the source trims through that watermark ([`Command::Trim`]); the
//!    next delivery carries the trim, and the destination drops the dedup
//!    records at or below it.

pub(crate) mod record;
pub(crate) mod rows;
pub(crate) mod slot;

use std::collections::BTreeMap;

use self::record::{DeliveredEffect, InboundTrimEffect, OutboxEffect, OutboxTrimEffect};
use self::rows::{FanoutMessage, OutboxEntry, Recipient, UNCOUNT_PERIOD};
use self::slot::GroupId;
use super::round::{fail_now, reply_with, Fail, Sink, Tx};
use super::state::State;
use crate::api::{MessageKind, Uid, SUMMARY_BYTES_MAX};
use crate::error::{Error, Result};

/// Entries an outbox read hands out at most, and the count a `limit` of
/// 0 asks for.
pub const OUTBOX_READ_MAX: usize = 1024;

/// What an outbox read answers: the entries after the asked position,
/// oldest first, and how far the outbox is trimmed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutboxBatch {
    pub entries: Vec<OutboxEntry>,
    /// Every entry at or below it is trimmed: what a delivery carries so
    /// that the destination drops its dedup records.
    pub trimmed_through: u64,
    /// The highest sequence number given out for the destination.
    pub last_seq: u64,
}

/// What a delivery answers, once durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeliverReply {
    /// Every entry of the source at or below it is applied here.
    pub applied_through: u64,
    /// Events this delivery appended.
    pub events_appended: u64,
    /// Recipients skipped as already applied (a duplicate delivery).
    pub duplicates: u64,
    /// Entries held back behind a gap (an earlier entry is missing): the
    /// forwarder sends from `applied_through + 1` again.
    pub held_back: u64,
}

pub(crate) enum Command {
    /// Reads the outbox for `dest` after `after`, at most `limit` entries.
    Outbox {
        dest: GroupId,
        after: u64,
        limit: usize,
        tx: Tx<OutboxBatch>,
    },
    /// Applies `entries` of `source` here; `source_trimmed` is how far the
    /// source trimmed its outbox for this store.
    Deliver {
        source: GroupId,
        entries: Vec<OutboxEntry>,
        source_trimmed: u64,
        tx: Tx<DeliverReply>,
    },
    /// Trims the outbox for `dest` through `through` (the destination
    /// committed it); answers how far it is trimmed.
    Trim {
        dest: GroupId,
        through: u64,
        tx: Tx<u64>,
    },
}

pub(crate) fn fail(cmd: Command, f: &Fail) {
    match cmd {
        Command::Outbox { tx, .. } => fail_now(tx, f),
        Command::Deliver { tx, .. } => fail_now(tx, f),
        Command::Trim { tx, .. } => fail_now(tx, f),
    }
}

/// The most record bytes a command adds: a delivery writes at most its
/// entries again, with a little more per record.
pub(crate) fn record_bytes_max(cmd: &Command) -> u64 {
    const RECORD_OVERHEAD: u64 = 256;
    match cmd {
        Command::Outbox { .. } | Command::Trim { .. } => RECORD_OVERHEAD,
        Command::Deliver { entries, .. } => {
            let per_entry = |e: &OutboxEntry| {
                RECORD_OVERHEAD + 12 * e.recipients.len() as u64 + 8 * e.uncount.len() as u64
            };
            RECORD_OVERHEAD + entries.iter().map(per_entry).sum::<u64>()
        }
    }
}

pub(crate) fn exec(cmd: Command, st: &mut State, sink: &mut dyn Sink) {
    match cmd {
        Command::Outbox {
            dest,
            after,
            limit,
            tx,
        } => {
            // Read now, answered once this round is durable: every entry
            // read was applied by this round or an earlier one.
            let batch = st
                .fanout
                .outboxes
                .get(&dest)
                .map_or_else(OutboxBatch::default, |o| OutboxBatch {
                    entries: (o.entries.range(after + 1..))
                        .take(match limit {
                            0 => OUTBOX_READ_MAX,
                            n => n.min(OUTBOX_READ_MAX),
                        })
                        .map(|(_, e)| (**e).clone())
                        .collect(),
                    trimmed_through: o.trimmed_through,
                    last_seq: o.last_seq,
                });
            sink.reply(reply_with(tx, Ok(batch)));
        }
        Command::Deliver {
            source,
            entries,
            source_trimmed,
            tx,
        } => {
            let reply = deliver(st, sink, source, entries, source_trimmed);
            sink.reply(reply_with(tx, reply));
        }
        Command::Trim { dest, through, tx } => {
            let reply = trim(st, sink, dest, through);
            sink.reply(reply_with(tx, reply));
        }
    }
}

/// Refuses a delivery this store cannot take, before anything changes.
fn check_delivery(st: &State, source: GroupId, entries: &[OutboxEntry]) -> Result<()> {
    let Some(placement) = st.fanout.routing.get() else {
        return Err(Error::BadRequest(
            "this store owns every slot: it takes no fan-out delivery".into(),
        ));
    };
    if source == placement.here() {
        return Err(Error::BadRequest(format!(
            "a delivery from {source} to itself"
        )));
    }
    for e in entries {
        if e.seq == 0 {
            return Err(Error::BadRequest("outbox entry 0".into()));
        }
        if e.message.summary.len() > SUMMARY_BYTES_MAX {
            return Err(Error::BadRequest(format!(
                "outbox entry {}: summary of {} bytes",
                e.seq,
                e.message.summary.len()
            )));
        }
        let uids = (e.recipients.iter().map(|r| r.uid)).chain(e.uncount.iter().copied());
        if let Some(uid) = uids.into_iter().find(|&u| !placement.owns_uid(u)) {
            return Err(Error::BadRequest(format!(
                "outbox entry {}: uid {uid} does not live in {}",
                e.seq,
                placement.here()
            )));
        }
        if e.recipients.iter().any(|r| r.period_id == UNCOUNT_PERIOD) {
            return Err(Error::BadRequest(format!(
                "outbox entry {}: period {UNCOUNT_PERIOD}",
                e.seq
            )));
        }
    }
    Ok(())
}

fn deliver(
    st: &mut State,
    sink: &mut dyn Sink,
    source: GroupId,
    mut entries: Vec<OutboxEntry>,
    source_trimmed: u64,
) -> Result<DeliverReply> {
    check_delivery(st, source, &entries)?;
    entries.sort_by_key(|e| e.seq);
    entries.dedup_by_key(|e| e.seq);
    let mut reply = DeliverReply::default();
    let inbound = st.fanout.inbound.get(&source);
    let known_trim = inbound.map_or(0, |i| i.source_trimmed);
    // The trim first: an entry at or below it is never applied again.
    // The destination never forgets what it has not applied.
    let applied = inbound.map_or(0, |i| i.applied_through);
    let forget = source_trimmed.min(applied);
    if forget > known_trim {
        let effect = InboundTrimEffect {
            source,
            through: forget,
        };
        sink.effect(st, effect.into());
    }
    for e in entries {
        let inbound = st.fanout.inbound.get(&source);
        let applied = inbound.map_or(0, |i| i.applied_through);
        if e.seq <= applied {
            // A copy of an entry applied before (its dedup record, or the
            // source's trim, covers it).
            reply.duplicates += e.recipients.len() as u64;
            continue;
        }
        if e.seq > applied + 1 {
            reply.held_back += 1;
            continue;
        }
        // A recipient already applied under another entry (the same
        // message routed again, as after a move) is skipped by its key.
        let is_new = |r: &Recipient| {
            let key = (e.message.conv, e.message.msg_seq, r.uid, r.period_id);
            inbound.is_none_or(|i| !i.keys.contains(&key))
        };
        let mut fresh: Vec<Recipient> = e.recipients.iter().copied().filter(is_new).collect();
        fresh.sort_unstable();
        fresh.dedup();
        let uncount_is_new = |uid: &Uid| {
            is_new(&Recipient {
                uid: *uid,
                period_id: UNCOUNT_PERIOD,
            })
        };
        let mut uncounted: Vec<Uid> = e.uncount.iter().copied().filter(uncount_is_new).collect();
        uncounted.sort_unstable();
        uncounted.dedup();
        reply.duplicates += (e.recipients.len() - fresh.len()) as u64;
        reply.events_appended += fresh.len() as u64;
        let effect = DeliveredEffect {
            source,
            seq: e.seq,
            message: e.message,
            applied: fresh,
            uncounted,
        };
        sink.effect(st, effect.into());
    }
    reply.applied_through = st
        .fanout
        .inbound
        .get(&source)
        .map_or(0, |i| i.applied_through);
    Ok(reply)
}

fn trim(st: &mut State, sink: &mut dyn Sink, dest: GroupId, through: u64) -> Result<u64> {
    let Some(outbox) = st.fanout.outboxes.get(&dest) else {
        // Nothing was ever written for `dest`: only a trim of nothing fits.
        return match through {
            0 => Ok(0),
            _ => Err(Error::NotFound(format!("no outbox for {dest}"))),
        };
    };
    if through > outbox.last_seq {
        return Err(Error::BadRequest(format!(
            "trim of the outbox for {dest} through {through}, past its last entry {}",
            outbox.last_seq
        )));
    }
    if through > outbox.trimmed_through {
        sink.effect(st, OutboxTrimEffect { dest, through }.into());
    }
    Ok(through.max(outbox_trimmed(st, dest)))
}

fn outbox_trimmed(st: &State, dest: GroupId) -> u64 {
    st.fanout
        .outboxes
        .get(&dest)
        .map_or(0, |o| o.trimmed_through)
}

/// The send path's hook, run right after a message was applied (only on
/// a store whose placement leaves some slots to other groups): one outbox
/// entry per other group that holds recipients of `m`, with their
/// membership periods. Above a large group's switch only a joining or
/// leaving member gets an event, as here. A recall also names, per group,
/// the members who received its target, whose unread count it lowers.
pub(crate) fn route(st: &mut State, sink: &mut dyn Sink, m: FanoutMessage) {
    let Some(placement) = st.fanout.routing.get() else {
        return;
    };
    let Some(conv) = st.convs.get(&m.conv) else {
        return;
    };
    let mut by_group: BTreeMap<GroupId, (Vec<Recipient>, Vec<Uid>)> = BTreeMap::new();
    // A recall of a message that counted as unread: the target's sender
    // (whose own message never counted).
    let uncount_for = (m.kind == MessageKind::Recall && m.target_seq <= conv.fanned_out_until())
        .then(|| conv.meta(m.target_seq))
        .flatten()
        .filter(|t| t.kind == MessageKind::Normal)
        .map(|t| t.sender);
    let large = conv.large.is_some();
    for (&uid, periods) in conv.members.iter() {
        let group = placement.owner_of_uid(uid);
        if group == placement.here() {
            continue;
        }
        if let Some(target_sender) = uncount_for {
            if uid != target_sender && periods.iter().any(|p| p.covers(m.target_seq)) {
                by_group.entry(group).or_default().1.push(uid);
            }
        }
        if large && !(matches!(m.kind, MessageKind::Join | MessageKind::Leave) && uid == m.sender) {
            continue;
        }
        let Some(p) = periods.iter().find(|p| p.covers(m.msg_seq)) else {
            continue;
        };
        by_group.entry(group).or_default().0.push(Recipient {
            uid,
            period_id: p.period_id,
        });
    }
    for (dest, (mut recipients, mut uncount)) in by_group {
        recipients.sort_unstable();
        uncount.sort_unstable();
        let seq = st.fanout.outboxes.get(&dest).map_or(0, |o| o.last_seq) + 1;
        let entry = OutboxEntry {
            seq,
            message: m.clone(),
            recipients,
            uncount,
        };
        sink.effect(st, OutboxEffect { dest, entry }.into());
    }
}

/// One outbox, as [`status`] shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutboxStatus {
    pub dest: GroupId,
    /// Entries written and not yet trimmed.
    pub depth: u64,
    pub last_seq: u64,
    pub trimmed_through: u64,
}

/// What was applied from one source, as [`status`] shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboundStatus {
    pub source: GroupId,
    pub applied_through: u64,
    pub source_trimmed: u64,
    /// Entries whose dedup records are still held.
    pub dedup_entries: u64,
    /// Dedup keys held.
    pub dedup_keys: u64,
}

/// The fan-out watermarks of a store, for the forwarder and for checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FanoutStatus {
    pub outboxes: Vec<OutboxStatus>,
    pub inbound: Vec<InboundStatus>,
}

/// The watermarks in `st`.
pub(crate) fn status(st: &State) -> FanoutStatus {
    let f = &st.fanout;
    FanoutStatus {
        outboxes: (f.outboxes.iter())
            .map(|(&dest, o)| OutboxStatus {
                dest,
                depth: o.entries.len() as u64,
                last_seq: o.last_seq,
                trimmed_through: o.trimmed_through,
            })
            .collect(),
        inbound: (f.inbound.iter())
            .map(|(&source, i)| InboundStatus {
                source,
                applied_through: i.applied_through,
                source_trimmed: i.source_trimmed,
                dedup_entries: i.dedup.len() as u64,
                dedup_keys: i.keys.len() as u64,
            })
            .collect(),
    }
}
