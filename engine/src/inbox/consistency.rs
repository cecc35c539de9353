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
use std::path::Path;

use super::config::InboxConfig;
use super::recover::{self, EvtSource, RecoveryReport};
use super::state::{body_at, unpack, BodyLog, PackedLoc, State, PENDING_LOC};
use crate::error::{Error, Result};
use crate::log::{self, Log, LogError, Lsn, ReplayFn, SegmentId};

/// The end of the durable data of each segment of one log.
pub(crate) type Ends = BTreeMap<SegmentId, u64>;

/// The ends of an open log's segments.
pub(crate) fn ends_of(log: &Log) -> Ends {
    log.segments()
        .into_iter()
        .map(|s| (s.id, s.bytes))
        .collect()
}

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

/// The `evt` log of a directory, read-only, as verify sees it.
struct DirSource<'a> {
    dir: &'a Path,
    report: &'a log::VerifyReport,
}

impl EvtSource for DirSource<'_> {
    fn durable_lsn(&self) -> Lsn {
        self.report.last_lsn.unwrap_or(0)
    }
    fn first_lsn(&self) -> Option<Lsn> {
        // The oldest begun segment (prepared ones carry no LSN yet).
        self.report.segments.iter().find_map(|s| s.first_lsn)
    }
    fn replay(&self, after: Lsn, f: &mut ReplayFn<'_>) -> std::result::Result<(), LogError> {
        if self.dir.exists() {
            log::replay_dir(self.dir, after, f)?;
        }
        Ok(())
    }
}

fn verify_log(dir: &Path) -> Result<log::VerifyReport> {
    if !dir.exists() {
        return Ok(log::VerifyReport::default());
    }
    let report = log::verify(dir)?;
    if let Some(p) = report
        .problems
        .iter()
        .find(|p| p.kind == log::ProblemKind::Corruption)
    {
        return Err(LogError::Corruption {
            segment: p.segment,
            offset: p.offset,
            reason: p.reason.clone(),
        }
        .into());
    }
    Ok(report)
}

fn segment_ends(report: &log::VerifyReport) -> Ends {
    report.segments.iter().map(|s| (s.id, s.bytes)).collect()
}

/// What `Inbox::open` would conclude about `config.data_dir`, read-only:
/// both logs scanned as recovery scans them (a torn tail left out, as
/// open cuts it), the state recovered from the newest usable checkpoint
/// and the `evt` log after it (a checkpoint beyond the log's end refuses),
/// then every index location checked against both logs. Never writes.
pub fn verify_data_dir(config: &InboxConfig) -> Result<RecoveryReport> {
    let data = &config.data_dir;
    let evt_dir = data.join("evt");
    let evt = verify_log(&evt_dir)?;
    let msg = verify_log(&data.join("msg"))?;
    let source = DirSource {
        dir: &evt_dir,
        report: &evt,
    };
    let (state, report) = recover::load_state_reporting(config, &source)?;
    check_locations(&state, &segment_ends(&evt), &segment_ends(&msg))?;
    Ok(report)
}
