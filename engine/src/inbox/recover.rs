//! Recovery (R22): the newest valid checkpoint, then the `evt` log after
//! its LSN, applied with the same `Effect::apply` the sequencer uses.
//!
//! [`decide`] is the one verdict on a data directory, for `serve` (through
//! `Inbox::open`) and for `inboxd verify` alike: both logs planned from
//! reads alone (`crate::log::plan`), the state recovered from the planned
//! `evt` log, LSNs missing past the checkpoint refused, and every index
//! location checked against the planned ends. Only when it says serve does
//! open write anything (cut a torn tail, remove leftovers), so a refused
//! start leaves the directory byte for byte as it was.
//!
//! A cut never gives a number twice. The records of the bytes a cut
//! takes (the planned cut, and the side files of earlier cuts not yet
//! covered by a checkpoint) that still verify on their own are read
//! ([`reserve_past_cut`]): the `msg_id` counter is raised past every
//! message they hold, and each conversation's next `msg_seq` past theirs.
//! The records that follow the recovered state directly (the planned cut,
//! and a side file the log still ends at: its open crashed before the
//! reservation was durable) are applied, whatever their kind, to a copy of
//! the state, and every `sync_seq` they took is reserved too, one more
//! per user for each damaged record before them. After the cut and before
//! it serves, open commits the reservation to the `evt` log and fsyncs it
//! ([`commit_reservation`], kinds 19 and 20 in
//! `messaging/record/reservation.rs`): a reserved `msg_seq` is a tombstone,
//! a reserved `sync_seq` a gap a sync steps over, and the raised counters
//! are in every later checkpoint's rows, so they hold once the side files
//! are gone. Under `SyncPolicy::Interval` such a message may have been
//! acknowledged; none of its numbers is given to another.
//!
//! A group member (a replication index above 0, or a round mark in the
//! cut bytes) reserves nothing: its `evt` log is raft's log
//! (`server/src/cluster/store.rs`), every batch in it a round of the
//! group. The cut rounds are missing from that log, so the leader sends
//! them again with the same numbers, and a reservation batch of this node
//! alone would be in raft's log behind its back and make them fail to
//! apply. Only the `msg_id` counter is raised, in memory.
//!
//! A checkpoint that fails its checks is skipped with a warning and an
//! older one (or a full replay) is used instead: the log still holds every
//! record after the older checkpoint, so nothing is lost. A checkpoint that
//! claims more than the log holds means acknowledged log data is missing:
//! startup fails rather than silently serving less.

use std::collections::BTreeMap;

use super::checkpoint;
use super::config::InboxConfig;
use super::effect::Effect;
use super::state::record::Touched;
use super::state::{pack, Scratch, State};
use crate::api::{ConvId, MsgId, MsgSeq, SyncSeq, Uid};
use crate::error::{Error, Result};
use crate::log::{Log, LogError, LogPlan, Lsn, ReplayFn};

/// Where recovery reads the `evt` log from: the open log (serve), or its
/// directory read-only (`inboxd verify`), so both judge the same way.
pub(crate) trait EvtSource {
    /// The last durable LSN (0 = empty).
    fn durable_lsn(&self) -> Lsn;
    /// The first LSN of the oldest segment, if any.
    fn first_lsn(&self) -> Option<Lsn>;
    fn replay(&self, after: Lsn, f: &mut ReplayFn<'_>) -> std::result::Result<(), LogError>;
    /// LSN ranges missing between segments that remain (a plan knows
    /// them; an open log was checked when it was planned).
    fn gaps(&self) -> Vec<(Lsn, Lsn)> {
        Vec::new()
    }
}

impl EvtSource for Log {
    fn durable_lsn(&self) -> Lsn {
        Log::durable_lsn(self)
    }
    fn first_lsn(&self) -> Option<Lsn> {
        self.segments().first().map(|s| s.first_lsn)
    }
    fn replay(&self, after: Lsn, f: &mut ReplayFn<'_>) -> std::result::Result<(), LogError> {
        Log::replay(self, after, f)
    }
}

impl EvtSource for LogPlan {
    fn durable_lsn(&self) -> Lsn {
        self.last_lsn()
    }
    fn first_lsn(&self) -> Option<Lsn> {
        LogPlan::first_lsn(self)
    }
    fn replay(&self, after: Lsn, f: &mut ReplayFn<'_>) -> std::result::Result<(), LogError> {
        LogPlan::replay(self, after, f)
    }
    fn gaps(&self) -> Vec<(Lsn, Lsn)> {
        LogPlan::gaps(self).to_vec()
    }
}

/// What [`decide`] concluded: serve, with these plans and this state.
pub(crate) struct Verdict {
    pub msg: LogPlan,
    pub evt: LogPlan,
    pub state: State,
    pub report: RecoveryReport,
    /// What open commits after the cut, before it serves.
    pub reservation: Reservation,
}

/// Names the log in a corruption error from it, so the refusal says
/// "log, segment, offset".
fn in_log(name: &str, e: LogError) -> LogError {
    match e {
        LogError::Corruption {
            segment,
            offset,
            reason,
        } => LogError::Corruption {
            segment,
            offset,
            reason: format!(
                "log {name}{}: {reason}",
                if segment > 0 {
                    format!(" ({})", crate::log::segment_file_name(segment))
                } else {
                    String::new()
                }
            ),
        },
        e => e,
    }
}

/// The verdict on `cfg.data_dir`, from reads alone (see the module docs).
/// `lock` takes each log directory's lock for the plans to hold (`serve`);
/// without it the caller holds them (`verify`). `Err` is the refusal.
pub(crate) fn decide(cfg: &InboxConfig, lock: bool) -> Result<Verdict> {
    let plan = |name: &str| {
        let dir = cfg.data_dir.join(name);
        let planned = if lock {
            crate::log::plan_locked(&dir, cfg.segment_bytes)
        } else {
            crate::log::plan(&dir, cfg.segment_bytes)
        };
        planned.map_err(|e| in_log(name, e))
    };
    let msg = plan("msg")?;
    let evt = plan("evt")?;
    let (mut state, report) = load_state_reporting(cfg, &evt).map_err(|e| match e {
        Error::Log(e) => Error::Log(in_log("evt", e)),
        e => e,
    })?;
    let reservation = reserve_past_cut(&mut state, &evt)?;
    super::consistency::check_locations(
        &state,
        &evt.ends().into_iter().collect(),
        &msg.ends().into_iter().collect(),
    )?;
    Ok(Verdict {
        msg,
        evt,
        state,
        report,
        reservation,
    })
}

/// Where recovery started and how much it replayed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The evt LSN of the checkpoint used (0 = none: full replay).
    pub checkpoint_lsn: u64,
    /// The replication index of the checkpoint used (0 = none).
    pub checkpoint_replica_index: u64,
    /// Effect records replayed after it.
    pub records_replayed: u64,
}

pub(crate) fn load_state(cfg: &InboxConfig, evt: &Log) -> Result<State> {
    load_state_reporting(cfg, evt).map(|(st, _)| st)
}

pub(crate) fn load_state_reporting(
    cfg: &InboxConfig,
    evt: &dyn EvtSource,
) -> Result<(State, RecoveryReport)> {
    let ttl_ms = u64::try_from(cfg.idempotency_ttl.as_millis()).unwrap_or(u64::MAX);
    let durable = evt.durable_lsn();
    let scratch = if cfg.index_in_file {
        Scratch::open(&cfg.data_dir)
    } else {
        Scratch::default()
    };
    let started = std::time::Instant::now();
    let mut state = None;
    for (lsn, path) in checkpoint::list(&cfg.data_dir)? {
        if lsn > durable {
            return Err(Error::Corruption {
                what: "data directory",
                reason: format!(
                    "checkpoint {} covers evt LSN {lsn} but the log ends at {durable}: log data is missing",
                    path.display()
                ),
            });
        }
        match checkpoint::read_in(&path, scratch.clone()) {
            Ok((_, st)) => {
                state = Some(st);
                break;
            }
            Err(reason) => {
                tracing::warn!(path = %path.display(), %reason, "checkpoint is invalid; falling back to an older one or a full replay");
            }
        }
    }
    let mut state = state.unwrap_or_else(|| State::new(ttl_ms));
    state.use_scratch(scratch);
    state.idem_ttl_ms = ttl_ms;
    state.fanout.routing = crate::inbox::fanout::rows::Routing::new(cfg.placement.clone());
    state.totals = state.recount_totals();
    let after = state.evt_lsn;
    let base_index = state.replica_index;
    let loaded = started.elapsed();
    // Compaction deletes whole segments once checkpoints cover them; a log
    // that starts after the state's LSN has lost records this replay needs.
    if let Some(first) = evt.first_lsn() {
        if first > after + 1 && durable > after {
            return Err(Error::Corruption {
                what: "data directory",
                reason: format!(
                    "evt log starts at LSN {first} but the newest usable checkpoint covers only LSN \
                     {after}: log data is missing"
                ),
            });
        }
    }
    // Compaction deletes only segments a checkpoint covers: LSNs missing
    // past the state's are records a segment held and lost.
    if let Some((lo, hi)) = evt.gaps().into_iter().find(|(_, hi)| *hi > after) {
        return Err(Error::Corruption {
            what: "data directory",
            reason: format!(
                "log evt is missing LSNs {lo}..={hi} (a segment between two that remain is \
                 gone), and the newest usable checkpoint covers only LSN {after}"
            ),
        });
    }
    let mut replayed = 0u64;
    evt.replay(after, &mut |lsn, loc, kind, payload| {
        let corrupt = |reason: String| LogError::Corruption {
            segment: loc.segment,
            offset: u64::from(loc.offset),
            reason,
        };
        let effect =
            Effect::decode(kind, payload).map_err(|e| corrupt(format!("evt record: {}", e.0)))?;
        effect
            .apply(&mut state, pack(loc), 0, &mut Touched::default())
            .map_err(|e| corrupt(format!("evt record does not apply: {}", e.0)))?;
        state.evt_lsn = lsn;
        replayed += 1;
        Ok(())
    })?;
    tracing::info!(
        from_lsn = after,
        records = replayed,
        checkpoint_ms = loaded.as_millis() as u64,
        replay_ms = (started.elapsed() - loaded).as_millis() as u64,
        "inbox state recovered"
    );
    state.commit_all();
    if cfg!(debug_assertions) {
        state
            .check_invariants()
            .map_err(|e| Error::Invariant(format!("after recovery: {e}")))?;
    }
    // The compactor has not looked at any segment yet in this process.
    state.evt_refs.mark_all_dirty();
    state.body_refs.mark_all_dirty();
    state.msg_refs.mark_all_dirty();
    Ok((
        state,
        RecoveryReport {
            checkpoint_lsn: after,
            checkpoint_replica_index: base_index,
            records_replayed: replayed,
        },
    ))
}

/// What the bytes of cuts held that the recovered state would give again:
/// committed at open as one [`ReservationEffect`] and one
/// [`ReservedMsgEffect`] per reserved `msg_seq` ([`commit_reservation`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// The lowest counter the next `msg_id` may take.
    msg_counter: u64,
    /// Per conversation, the lowest `msg_seq` its next message may take.
    convs: BTreeMap<ConvId, MsgSeq>,
    /// Per user, the lowest `sync_seq` its next event may take.
    users: BTreeMap<Uid, SyncSeq>,
}

impl Reservation {
    fn raise_conv(&mut self, conv: ConvId, next: MsgSeq) {
        let at = self.convs.entry(conv).or_insert(next);
        *at = (*at).max(next);
    }

    fn raise_user(&mut self, uid: Uid, next: SyncSeq) {
        let at = self.users.entry(uid).or_insert(next);
        *at = (*at).max(next);
    }

    /// Only what is past `state`'s own counters.
    fn past(mut self, state: &State) -> Reservation {
        self.convs.retain(|conv, next| {
            let head = state.convs.get(conv).map_or(MsgSeq(0), |c| c.head());
            *next > head.next()
        });
        self.users.retain(|uid, next| {
            let head = state.users.get(uid).map_or(SyncSeq(0), |u| u.head());
            *next > head.next()
        });
        if self.msg_counter <= state.next_msg_counter {
            self.msg_counter = 0;
        }
        self
    }

    fn is_empty(&self) -> bool {
        self.msg_counter == 0 && self.convs.is_empty() && self.users.is_empty()
    }
}

/// A record the bytes of a cut held: its place, and the record when it
/// verifies on its own and decodes (`None`: damaged).
struct CutRecord {
    loc: crate::log::RecordLoc,
    effect: Option<Effect>,
}

/// The bytes of one cut: its place, its bytes, and whether the log still
/// ends where they were cut (nothing was written after them, so they
/// follow the recovered state directly).
struct CutBytes {
    segment: u32,
    offset: u64,
    bytes: Vec<u8>,
    at_end: bool,
}

/// Reserves past every number the cut bytes of the `evt` log hold (see
/// the module docs): raises `state`'s `msg_id` counter now, names each
/// message in a WARN, and returns what open must commit before it serves.
fn reserve_past_cut(state: &mut State, evt: &LogPlan) -> Result<Reservation> {
    let cuts = cut_bytes(evt).map_err(LogError::Io)?;
    let mut r = Reservation::default();
    let mut follow: Vec<CutRecord> = Vec::new();
    for cut in &cuts {
        let mut records = Vec::new();
        records_in(cut.segment, cut.offset, &cut.bytes, &mut records);
        for rec in &records {
            if let Some(m) = rec.effect.as_ref().and_then(message_of) {
                r.msg_counter = r.msg_counter.max(super::state::msg_counter(m.msg_id) + 1);
                r.raise_conv(m.conv, m.msg_seq.next());
                tracing::warn!(
                    conv = m.conv.0,
                    msg_seq = m.msg_seq.0,
                    msg_id = m.msg_id.0,
                    "a message in bytes cut from the evt log's tail: neither its msg_id nor its \
                     msg_seq is given again (the msg_seq reads as a tombstone)"
                );
            }
        }
        if cut.at_end {
            follow.extend(records);
        }
    }
    let member = state.replica_index > 0
        || (follow.iter()).any(|c| matches!(c.effect, Some(Effect::Replica(_))));
    if member {
        // Its `evt` log is raft's (see the module docs).
        state.next_msg_counter = state.next_msg_counter.max(r.msg_counter);
        tracing::warn!("a group member's evt log was cut: the leader sends the cut rounds again");
        return Ok(Reservation::default());
    }
    seqs_of(state, &follow, &mut r);
    let r = r.past(state);
    state.next_msg_counter = state.next_msg_counter.max(r.msg_counter);
    Ok(r)
}

/// The message a record holds, if it is one.
fn message_of(effect: &Effect) -> Option<&super::messaging::record::MsgEffect> {
    use super::messaging::record::Records;
    match effect {
        Effect::Messaging(Records::MsgBody(b)) => Some(&b.msg),
        Effect::Messaging(Records::Msg(m)) => Some(m),
        _ => None,
    }
}

/// The `msg_seq`s and `sync_seq`s the records of `follow` took: they
/// are applied, in order, to a copy of `state` (whatever their kind, as
/// the sequencer did), and every number they touched is reserved. A
/// damaged record before them may have taken one `sync_seq` of each of
/// their users, so each counts one more.
fn seqs_of(state: &State, follow: &[CutRecord], r: &mut Reservation) {
    if follow.is_empty() {
        return;
    }
    let mut copy = state.clone();
    let mut damaged = 0u64;
    for rec in follow {
        let Some(effect) = &rec.effect else {
            damaged += 1;
            continue;
        };
        let mut touched = Touched::default();
        if effect
            .apply(&mut copy, pack(rec.loc), 0, &mut touched)
            .is_err()
        {
            // What it depends on was in a damaged record.
            damaged += 1;
        }
        for (uid, seq) in touched.events {
            r.raise_user(uid, seq.plus(damaged + 1));
        }
        if let Some((conv, seq)) = touched.conv {
            r.raise_conv(conv, seq.next());
        }
    }
}

/// Commits `r` to `evt`, durably, and applies it to `state`: open calls
/// it after the cut and before it serves, so the reservation holds across
/// restarts and is in every later checkpoint's rows. The reserved
/// `msg_seq`s take fresh `msg_id`s past the reserved counter.
pub(crate) fn commit_reservation(evt: &Log, state: &mut State, r: Reservation) -> Result<()> {
    use super::messaging::record::{ReservationEffect, ReservedMsgEffect};
    if r.is_empty() {
        return Ok(());
    }
    let mut next_id = state.next_msg_counter;
    let mut effects = vec![Effect::from(ReservationEffect {
        msg_counter: next_id,
        users: r.users.iter().map(|(u, s)| (*u, *s)).collect(),
    })];
    for (&conv, &next) in &r.convs {
        let head = state.convs.get(&conv).map_or(MsgSeq(0), |c| c.head());
        for seq in head.next().0..next.0 {
            effects.push(Effect::from(ReservedMsgEffect {
                conv,
                msg_seq: MsgSeq(seq),
                msg_id: MsgId(next_id),
            }));
            next_id += 1;
        }
    }
    let mut batch = crate::log::Batch::new();
    for e in &effects {
        batch.push_with(e.record_kind(), |out| e.encode_into(out));
    }
    let appended = evt.append(batch)?;
    evt.flush()?;
    for (e, loc) in effects.iter().zip(&appended.locs) {
        e.apply(state, pack(*loc), 0, &mut Touched::default())
            .map_err(|e| Error::Invariant(format!("the reservation does not apply: {}", e.0)))?;
    }
    state.evt_lsn = appended.lsn;
    state.commit_all();
    tracing::warn!(
        conversations = r.convs.len(),
        msg_seqs = effects.len() - 1,
        users = r.users.len(),
        lsn = appended.lsn,
        "reserved past the cut: those msg_seqs read as tombstones, those sync_seqs are skipped"
    );
    Ok(())
}

/// The bytes the plan cuts and those of the side files of earlier cuts.
fn cut_bytes(evt: &LogPlan) -> std::io::Result<Vec<CutBytes>> {
    let end = evt.ends().last().copied();
    let mut cuts = Vec::new();
    if evt.dir().is_dir() {
        for path in crate::log::cut_files(evt.dir())? {
            if let Some((segment, offset)) = parse_cut_name(&path) {
                // The side file keeps the bytes up to the last that is not
                // zero; what followed them in the segment was zeros.
                let mut bytes = std::fs::read(&path)?;
                let segment_len =
                    std::fs::metadata(evt.dir().join(crate::log::segment_file_name(segment)))
                        .map_or(0, |m| m.len());
                let whole = segment_len.saturating_sub(offset) as usize;
                bytes.resize(whole.max(bytes.len()), 0);
                cuts.push(CutBytes {
                    segment,
                    offset,
                    bytes,
                    at_end: end == Some((segment, offset)),
                });
            }
        }
    }
    if let Some(t) = evt.cut() {
        let path = evt.dir().join(crate::log::segment_file_name(t.segment));
        let bytes = std::fs::read(path)?;
        // To the segment's end: a frame the power cut left short of its
        // last page reads on into zeros there.
        let from = usize::try_from(t.offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        cuts.push(CutBytes {
            segment: t.segment,
            offset: t.offset,
            bytes: bytes[from..].to_vec(),
            at_end: true,
        });
    }
    Ok(cuts)
}

/// `cut-<segment>-<offset>.bytes` (`crate::log::cut_file_name`).
fn parse_cut_name(path: &std::path::Path) -> Option<(u32, u64)> {
    let name = path.file_name()?.to_str()?;
    let rest = name.strip_prefix("cut-")?.strip_suffix(".bytes")?;
    let (segment, offset) = rest.split_once('-')?;
    Some((segment.parse().ok()?, offset.parse().ok()?))
}

/// Walks the frames of `bytes`, which lay at `offset` of `segment`, and
/// collects their records, decoded where their own CRC verifies (the CRC
/// is bound to the segment and offset, so only bytes written there pass).
fn records_in(segment: u32, offset: u64, bytes: &[u8], out: &mut Vec<CutRecord>) {
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    // The records' places are their offsets in the segment.
    let mut data = vec![0u8; start];
    data.extend_from_slice(bytes);
    let mut pos = start;
    while pos < data.len() {
        // A frame starts with its length then a non-zero type byte at 4:
        // runs of zeros (pages a power cut lost) are passed in one step.
        if data[pos] == 0 {
            let next = data[pos..].iter().position(|&b| b != 0);
            match next {
                Some(n) if n > 4 => {
                    pos += n - 4;
                    continue;
                }
                Some(_) => {}
                None => break,
            }
        }
        // Only a frame whose header's length fits is walked, and only up
        // to that length: a guess at every offset up to the end of the cut
        // bytes (which run to the segment's end) made open quadratic in
        // them, each guess checking a CRC over whatever length its
        // garbage named.
        let header_len = data
            .get(pos..pos + 4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
        let fits =
            header_len > crate::log::format::BATCH_HEADER_LEN && header_len <= data.len() - pos;
        let walked = fits
            .then(|| super::frames::walk_frame(segment, &data, pos, pos + header_len, None))
            .flatten();
        let Some((_, len, records)) = walked else {
            pos += 1;
            continue;
        };
        for (loc, kind, payload, ok) in records {
            out.push(CutRecord {
                loc,
                effect: ok.then(|| Effect::decode(kind, payload).ok()).flatten(),
            });
        }
        pos += len.max(1);
    }
}
