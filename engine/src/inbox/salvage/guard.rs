//! Applying records once something was lost: a record may then depend on
//! what is gone (a recall of a lost message, a message after a gap), and
//! one that fails to apply must leave no trace, since `apply` may have
//! changed part of the state before it found the problem.
//!
//! A copy of the state is taken every [`COPY_EVERY`] records (users and
//! conversations are shared `Arc`s, so a copy is one pointer per entry)
//! and the records applied since are kept; a record that fails puts the
//! copy back and applies those records again, which succeeds exactly as
//! before (`apply` is a pure function of the state and the record). So a
//! failure costs at most [`COPY_EVERY`] applies, and success a copy per
//! [`COPY_EVERY`] records.
//!
//! Before anything was lost, a record that verifies and does not apply is
//! not damage salvage may skip: the log does not belong to its checkpoint,
//! and salvage refuses, as recovery does.

use std::sync::Arc;

use super::replay::may_hold_events;
use super::report::{Damage, SalvageReport};
use super::FLAG_LOST;
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::effect::Effect;
use crate::inbox::messaging::record::Records;
use crate::inbox::state::record::{ApplyError, Touched};
use crate::inbox::state::{pack, MsgMeta, PackedLoc, State, PENDING_LOC};
use crate::log::RecordLoc;

/// Records applied between two copies of the state.
const COPY_EVERY: usize = 1024;

#[derive(Default)]
pub(super) struct Guard {
    copy: Option<State>,
    since: Vec<(Effect, PackedLoc)>,
}

impl Guard {
    /// Applies `effect`, the record at `loc`; see the module doc.
    pub(super) fn apply(
        &mut self,
        st: &mut State,
        effect: Effect,
        loc: RecordLoc,
        report: &mut SalvageReport,
    ) -> Result<()> {
        let at = pack(loc);
        let place = |what: String| Error::Corruption {
            what: "evt",
            reason: format!("segment {} offset {}: {what}", loc.segment, loc.offset),
        };
        if !report.anything_lost() {
            effect
                .apply(st, at, 0, &mut Touched::default())
                .map_err(|e| {
                    place(format!(
                        "a record that verifies does not apply before any damage was met: {}",
                        e.0
                    ))
                })?;
            report.records_applied += 1;
            return Ok(());
        }
        if self.copy.is_none() || self.since.len() >= COPY_EVERY {
            self.copy = Some(st.clone());
            self.since.clear();
        }
        match run(st, &effect, at) {
            Ok(()) => {
                report.records_applied += 1;
                self.since.push((effect, at));
            }
            Err(e) => {
                *st = self.copy.clone().expect("taken above");
                for (again, at) in &self.since {
                    run(st, again, *at).map_err(|e| {
                        Error::Invariant(format!(
                            "salvage: a record that applied does not apply again: {}",
                            e.0
                        ))
                    })?;
                }
                report.records_skipped.push(Damage::new(
                    "evt",
                    loc.segment,
                    loc.offset.into(),
                    format!("does not apply after the loss: {}", e.0),
                ));
                if may_hold_events(&effect) {
                    report.make_uncertain("a record that depends on lost data was skipped");
                }
            }
        }
        Ok(())
    }
}

fn run(st: &mut State, effect: &Effect, at: PackedLoc) -> std::result::Result<(), ApplyError> {
    fill_gap(st, effect);
    effect.apply(st, at, 0, &mut Touched::default())
}

/// A message whose `msg_seq` is past its conversation's head: the ones in
/// between were in lost records. They are entered as lost, with `msg_id`s
/// between their neighbours' (ids grow with `msg_seq` in a conversation),
/// so that this message lands at its own `msg_seq`.
fn fill_gap(st: &mut State, effect: &Effect) {
    let m = match effect {
        Effect::Messaging(Records::MsgBody(b)) => &b.msg,
        Effect::Messaging(Records::Msg(m)) => m,
        _ => return,
    };
    let conv = st.convs.entry(m.conv).or_default();
    let head = conv.head();
    if m.msg_seq <= head.next() {
        return;
    }
    let missing = m.msg_seq.0 - head.0 - 1;
    let last = conv
        .msgs
        .len()
        .checked_sub(1)
        .and_then(|i| conv.msgs.get(i));
    let prev_id = last.map_or(0, |x| x.msg_id.0);
    if m.msg_id.0.saturating_sub(prev_id) <= missing {
        return; // no room for their ids: the message does not apply
    }
    let conv = Arc::make_mut(conv);
    for i in 0..missing {
        conv.msgs.push(MsgMeta {
            loc: PENDING_LOC,
            msg_id: MsgId(prev_id + 1 + i),
            sender: Uid(0),
            kind: MessageKind::Normal,
            flags: FLAG_LOST,
        });
    }
    st.totals.messages += missing;
}
