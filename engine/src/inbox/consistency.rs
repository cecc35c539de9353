//! Cross-log consistency: every location the indexes hold must be a
//! durable record of the log it names. Checked at open (after recovery)
//! and by `inboxd verify`, through the same functions, so the two always
//! agree on what refuses to start.
//!
//! Recovery cuts a torn tail of each log independently, and a checkpoint
//! or a replayed effect can point into a log whose tail was lost (a `msg`
//! segment truncated after a clean shutdown, say). Serving such a state
//! would answer `INTERNAL` for that message forever; refusing to open,
//! naming the entry and the place, lets an operator restore the data
//! instead. The check is cheap: one lookup per index entry, against each
//! log's recovered segment ends, no record read.

use std::collections::BTreeMap;

use super::state::{body_at, unpack, BodyLog, PackedLoc, State, PENDING_LOC};
use crate::error::{Error, Result};
use crate::log::{Log, SegmentId};

/// The end of the durable data of each segment of one log.
pub(crate) type Ends = BTreeMap<SegmentId, u64>;

fn check_at(ends: &Ends, loc: PackedLoc) -> std::result::Result<(), String> {
    if loc == PENDING_LOC {
        return Err("no location".into());
    }
    let at = unpack(loc);
    match ends.get(&at.segment) {
        None => Err(format!(
            "segment {} offset {}, a segment that does not exist",
            at.segment, at.offset
        )),
        Some(&end) if u64::from(at.offset) + Log::RECORD_OVERHEAD_BYTES > end => Err(format!(
            "segment {} offset {}, beyond the segment's durable end {end}",
            at.segment, at.offset
        )),
        Some(_) => Ok(()),
    }
}

/// Checks every message location (into `evt` or `msg`) and every event
/// location (into `evt`) of `st` against the logs' segment ends; the
/// first that does not resolve is named in the error.
pub(crate) fn check_locations(st: &State, evt: &Ends, msg: &Ends) -> Result<()> {
    let missing = |what: String| Error::Corruption {
        what: "data directory",
        reason: format!("{what}: the record is missing (a log lost its tail or a segment)"),
    };
    let mut convs: Vec<_> = st.convs.iter().collect();
    convs.sort_unstable_by_key(|(id, _)| **id);
    for (conv, c) in convs {
        for (i, m) in c.msgs.iter().enumerate() {
            let seq = c.msgs_base.plus(i as u64 + 1);
            let (log, at) = body_at(m.loc);
            let (name, ends) = match log {
                BodyLog::Evt => ("evt", evt),
                BodyLog::Msg => ("msg", msg),
            };
            let at = if m.loc == PENDING_LOC {
                PENDING_LOC
            } else {
                at
            };
            check_at(ends, at).map_err(|e| {
                missing(format!(
                    "conv {conv} message msg_seq {seq} points into the {name} log at {e}"
                ))
            })?;
        }
    }
    let mut users: Vec<_> = st.users.iter().collect();
    users.sort_unstable_by_key(|(id, _)| **id);
    for (uid, u) in users {
        for (i, loc) in u.events.iter().enumerate() {
            let seq = u.events_base.plus(i as u64 + 1);
            check_at(evt, loc).map_err(|e| {
                missing(format!(
                    "uid {uid} event sync_seq {seq} points into the evt log at {e}"
                ))
            })?;
        }
    }
    Ok(())
}
