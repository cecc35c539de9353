//! Step 1 and 2 of a salvage: the newest checkpoint that verifies (or an
//! empty state), then every record of the `evt` log after it that can be
//! applied, through the same [`Effect::apply`] recovery uses.
//!
//! What cannot be applied is skipped and written down, never guessed:
//! - a record whose CRC verifies but does not decode is no damage but a
//!   format this version does not know: the salvage is refused;
//! - a record whose CRC verifies but which does not apply (a recall of a
//!   lost message, say) is skipped, and a half applied record never stays
//!   ([`super::guard`]);
//! - a message record whose CRC fails is applied only when its fields
//!   agree with the copy of them inside its body (conversation, `msg_seq`,
//!   `msg_id`, sender, kind, type, time) and with the state, with no
//!   summary and no idempotency key (neither is repeated in the body):
//!   the conversation and its recipients then keep their exact numbering,
//!   and the write step finds the record unreadable and reports the
//!   message and every event that pointed at it as lost;
//! - any other damage may have held events of any user, whose `sync_seq`
//!   numbering is then unknown: the salvage becomes *uncertain*, and the
//!   write step makes every device reset (`SalvageReport::uncertain`);
//! - a message that arrives after a gap in its conversation (its
//!   predecessors were in lost records) keeps its `msg_seq`: the gap is
//!   filled with *lost* entries (flag `FLAG_LOST`), served as tombstones
//!   ([`super::guard`]).

use super::guard::Guard;
use super::report::{Damage, SalvageReport};
use super::source::{Item, LogFiles};
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::checkpoint;
use crate::inbox::codec::Reader;
use crate::inbox::effect::{Effect, KIND_TABLES};
use crate::inbox::messaging::record::{decode_msg_header, MsgBodyEffect, Records};
use crate::inbox::state::record::Record;
use crate::inbox::state::State;
use crate::log::{Lsn, RecordLoc};

/// Loads the newest checkpoint of `data_dir` that verifies; `None` (with
/// the reasons) when none does. One that covers more of the log than
/// verifies is still the best state there is (its batches were durable
/// when it was written): it is taken, and the write step finds which of
/// its bodies and events pointed into the damaged part.
pub(super) fn load_checkpoint(
    data_dir: &std::path::Path,
    last_lsn: Lsn,
    report: &mut SalvageReport,
) -> Result<Option<State>> {
    for (lsn, path) in checkpoint::list(data_dir)? {
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        match checkpoint::read(&path) {
            Ok((_, st)) => {
                if lsn > last_lsn {
                    report.damage.push(Damage::new(
                        "checkpoint",
                        0,
                        0,
                        format!(
                            "{name} covers evt LSN {lsn} but the last batch that verifies is \
                             {last_lsn}: the batches in between are damaged or gone"
                        ),
                    ));
                }
                report.checkpoint_lsn = Some(lsn);
                return Ok(Some(st));
            }
            Err(reason) => report.checkpoints_skipped.push((name, reason)),
        }
    }
    Ok(None)
}

/// The last LSN of a batch that verifies anywhere in the log.
pub(super) fn last_valid_lsn(evt: &LogFiles) -> Lsn {
    let mut last = 0;
    evt.scan(&mut |item| {
        if let Item::Record {
            lsn,
            batch_ok: true,
            ..
        } = item
        {
            last = last.max(lsn);
        }
    });
    last
}

/// Applies every record of `evt` after `st.evt_lsn` that can be applied.
pub(super) fn replay(evt: &LogFiles, st: &mut State, report: &mut SalvageReport) -> Result<()> {
    let after = st.evt_lsn;
    let mut fatal: Option<Error> = None;
    let mut first_lsn: Option<Lsn> = None;
    let mut last_seen: Lsn = 0;
    let mut guard = Guard::default();
    evt.scan(&mut |item| {
        if fatal.is_some() {
            return;
        }
        if let Item::Record { lsn, .. } | Item::Damaged { lsn, .. } = item {
            last_seen = last_seen.max(lsn);
        }
        match item {
            Item::Record {
                lsn,
                loc,
                kind,
                payload,
                batch_ok,
            } => {
                first_lsn.get_or_insert(lsn);
                if !batch_ok {
                    report.damage.push(kept_record("evt", loc));
                }
                if lsn <= after {
                    return;
                }
                match Effect::decode(kind, payload) {
                    Ok(effect) => {
                        if let Err(e) = guard.apply(st, effect, loc, report) {
                            fatal = Some(e);
                        }
                    }
                    // Its CRC verifies, so this is not damage: a format
                    // this binary does not know (a newer version wrote
                    // it). Salvaging on would drop what it says.
                    Err(e) => {
                        fatal = Some(Error::Corruption {
                            what: "evt",
                            reason: format!(
                                "segment {} offset {}: a record that verifies does not decode \
                                 ({}): was the directory written by a newer inboxd? Salvage it \
                                 with that version",
                                loc.segment, loc.offset, e.0
                            ),
                        });
                    }
                }
                st.evt_lsn = st.evt_lsn.max(lsn);
            }
            Item::Damaged {
                lsn,
                loc,
                kind,
                payload,
            } => {
                first_lsn.get_or_insert(lsn);
                report.damage.push(damaged_record("evt", loc, kind));
                // What the checkpoint covers is in the state already; the
                // write step finds whatever of it pointed here.
                if lsn <= after {
                    return;
                }
                report.records_lost += 1;
                match recover_message(payload, st) {
                    Some(effect) => {
                        if let Err(e) = guard.apply(st, effect, loc, report) {
                            fatal = Some(e);
                        }
                    }
                    None if holds_no_events(kind, payload) => {}
                    None => report.make_uncertain(
                        "a damaged record that may have held events could not be read",
                    ),
                }
                st.evt_lsn = st.evt_lsn.max(lsn);
            }
            Item::Lost {
                segment,
                offset,
                lsns,
                reason,
            } => {
                report
                    .damage
                    .push(Damage::new("evt", segment, offset, reason));
                // Damage whose LSNs are not known here is measured by the
                // next batch that verifies, which reports the gap as its
                // own `Lost` (or the damage is a torn tail).
                if lsns.is_some_and(|(_, last)| last > after) {
                    report.make_uncertain("whole batches of the evt log are lost");
                }
            }
            Item::Deleted {
                lsns: (first, last),
            } if last > after => {
                report.damage.push(Damage::new(
                    "evt",
                    0,
                    0,
                    format!(
                        "batches {first}..={last} are in segments that are gone, and the \
                         state covers only LSN {after}"
                    ),
                ));
                report.make_uncertain("whole batches of the evt log are gone");
            }
            Item::Deleted { .. } => {}
            // Unacknowledged, unless a checkpoint covers what it held.
            Item::TornTail {
                segment,
                offset,
                bytes,
            } if after <= last_seen => report.torn_tail = Some((segment, offset, bytes)),
            Item::TornTail {
                segment, offset, ..
            } => report.damage.push(Damage::new(
                "evt",
                segment,
                offset,
                format!(
                    "the end of the log does not verify, but the checkpoint covers it up to LSN \
                     {after}: a loss, not a torn write"
                ),
            )),
        }
    });
    if let Some(e) = fatal {
        return Err(e);
    }
    // A log that starts after what the state covers lost the batches in
    // between (segments deleted, or never there).
    if let Some(first) = first_lsn {
        if first > after + 1 {
            report.damage.push(Damage::new(
                "evt",
                0,
                0,
                format!("the log starts at LSN {first} but the state covers only LSN {after}"),
            ));
            report.make_uncertain("batches before the first segment are missing");
        }
    }
    Ok(())
}

/// Writes down every damaged place of the `msg` log. Nothing is replayed
/// from it (it holds bodies the state points at, which the write step
/// reads back by location), but the report names every damaged place met
/// in either log, whether or not the state still needed what it held.
pub(super) fn note_msg_damage(msg: &LogFiles, report: &mut SalvageReport) {
    msg.scan(&mut |item| match item {
        Item::Record {
            loc,
            batch_ok: false,
            ..
        } => report.damage.push(kept_record("msg", loc)),
        Item::Record { .. } => {}
        Item::Damaged { loc, kind, .. } => report.damage.push(damaged_record("msg", loc, kind)),
        Item::Lost {
            segment,
            offset,
            reason,
            ..
        } => report
            .damage
            .push(Damage::new("msg", segment, offset, reason)),
        // Compaction deletes `msg` segments no body points into; one that
        // a body needed is named by the write step when it does not read
        // back.
        Item::Deleted { .. } => {}
        // A torn write at the end is no loss unless a body the state
        // points at lay there, which the write step then names.
        Item::TornTail { .. } => {}
    });
}

fn kept_record(log: &'static str, loc: RecordLoc) -> Damage {
    Damage::new(
        log,
        loc.segment,
        loc.offset.into(),
        "batch check fails but this record verifies on its own: kept".into(),
    )
}

fn damaged_record(log: &'static str, loc: RecordLoc, kind: u8) -> Damage {
    Damage::new(
        log,
        loc.segment,
        loc.offset.into(),
        format!("record of kind {kind} fails its checksum"),
    )
}

/// The effect of a damaged message record, when the fields the state
/// needs are repeated in its body and both copies agree, and it follows
/// its conversation's head: without its summary and idempotency key,
/// which are not repeated. `None` otherwise.
///
/// The payload is read as a message whatever the damaged header's kind
/// byte says: one that reads exactly as a message and agrees with its
/// body's copy is one.
fn recover_message(payload: &[u8], st: &State) -> Option<Effect> {
    let Ok(Effect::Messaging(Records::MsgBody(b))) = Effect::decode(MsgBodyEffect::KIND, payload)
    else {
        return None;
    };
    let (_, h) = decode_msg_header(&mut Reader::new(&b.body)).ok()?;
    let m = &b.msg;
    let agree = h.conv == m.conv
        && h.msg_seq == m.msg_seq
        && h.msg_id == m.msg_id
        && h.sender == m.sender
        && h.kind == m.kind
        && h.msg_type == m.msg_type
        && h.sent_at_ms == m.at_ms;
    if !agree {
        return None;
    }
    let head = st.convs.get(&m.conv).map_or(MsgSeq(0), |c| c.head());
    if m.msg_seq != head.next() {
        return None;
    }
    // A recall or edit names its target twice too: by seq here, by id in
    // the body.
    if m.target_seq != MsgSeq(0) {
        let target = st.convs.get(&m.conv)?.meta(m.target_seq)?;
        if { target.msg_id } != h.target {
            return None;
        }
    } else if h.target != MsgId(0) {
        return None;
    }
    let mut msg = m.clone();
    msg.summary = bytes::Bytes::new();
    msg.client_msg_id = 0;
    Some(Effect::from(MsgBodyEffect { msg, body: b.body }))
}

/// True when a damaged record still decodes exactly as a kind that never
/// appends an event nor changes whom a message reaches, and its payload
/// does not also read exactly as a kind that does: then losing it loses
/// no `sync_seq`, even if the damage is in its kind byte (a message whose
/// kind byte turned into a device row's would still read as a message).
fn holds_no_events(kind: u8, payload: &[u8]) -> bool {
    Effect::decode(kind, payload).is_ok_and(|e| !may_hold_events(&e))
        && event_kinds().all(|k| Effect::decode(k, payload).is_err())
}

/// The kinds whose records may append events: those whose [`Record`]
/// impl says so.
fn event_kinds() -> impl Iterator<Item = u8> {
    KIND_TABLES
        .iter()
        .flat_map(|set| set.iter())
        .filter(|k| k.may_append_events)
        .map(|k| k.code)
}

/// Whether applying `effect` may append events or change whom later
/// messages reach, as its kind's [`Record::MAY_APPEND_EVENTS`] says. A
/// copy is judged as what it copies: a damaged kind byte may have set the
/// copy bit of an original.
pub(super) fn may_hold_events(effect: &Effect) -> bool {
    effect.may_append_events()
}
