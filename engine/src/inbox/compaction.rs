//! Compaction (R19): reclaims a user's sync events below its floor (and
//! messages past the history retention), drops dead segments whole and
//! rewrites sparse `evt` ones, in the background and rate-limited; and
//! says what holds data back (`explain`).
//!
//! A pass, in order (each state change is a logged command, decided again
//! by the sequencer against the fences as they are at that instant):
//! 1. Snapshots: rows expired past their TTL are dropped (logged), then
//!    content files whose row is gone are deleted.
//! 2. Trim: per user, the compactor measures (reading event records, off
//!    the sequencer) the newest event older than the safety window and the
//!    newest older than the hard TTL; the sequencer clamps that by the
//!    fence floor and logs `Trim { events_base }`. The trim is durable
//!    before any file is touched, so a reclaimed event never comes back.
//! 3. Segments: the state counts, per segment, the retained events that
//!    point into it ([`super::seg_refs::SegRefs`], kept up to date by
//!    `apply`), so finding dead segments reads counts, not the index; the
//!    index is walked only for the segments that lost events since they
//!    were last judged. A sealed `evt` segment is dead when no retained event
//!    points into it and every record in it is covered by *both* retained
//!    checkpoints (a fallback to the older checkpoint then still replays
//!    everything it needs). Dead segments are deleted whole
//!    ([`Log::delete_segment`]: unlink + directory fsync). If dead segments
//!    wait only for checkpoint coverage, the pass writes checkpoints first.
//! 4. Rewrite: a sealed segment whose live bytes fall under
//!    `rewrite_live_fraction`, and whose live events are all past the
//!    safety window (else it straddles the trim point and empties by
//!    itself), has its live records copied forward (records
//!    with the copy flag, which replay ignores) in one durable batch; then a
//!    `Relocate` command points the events at the copies (logged, durable);
//!    only then is the old file deleted. A crash after the copy leaves dead
//!    copies; after the relocate, an old file nobody points at; either is
//!    reclaimed by a later pass. Nothing is lost, nothing comes back.
//!    Copying is throttled to `compaction_bytes_per_s`.
//!
//! 5. History retention (only with `history_retention = Some(d)`): per
//!    conversation, the compactor binary-searches message times (the
//!    sequencer-stamped `sent_at_ms` in the `msg` records) for the newest
//!    message older than `d`; the sequencer clamps it to the durable head
//!    and logs `TrimMsgs { conv, msgs_base }`. Once that is durable, a
//!    sealed `msg` segment no retained message points into is deleted
//!    whole. No checkpoint coverage is needed for it: `msg` records are
//!    data only, and any replay that re-creates index entries into a
//!    deleted segment also replays the (older-than-deletion, durable)
//!    trim that drops them again. A recall is always above the message it
//!    hides, so a prefix trim never reclaims a recall while its original
//!    is retained, and a retained original keeps its tombstone flag.
//!
//! Only one pass runs at a time; the background thread and
//! [`crate::Inbox::compact`] share the same lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::command::{decode_msg_record, pack, unpack, Effect, COPY_FLAG, PENDING_LOC};
use super::fence::{self, ms, Relocation, SnapshotPhase, SnapshotRow};
use super::sequencer::Command;
use super::state::State;
use super::{checkpoint, InboxConfig, Pending, Shared};
use crate::api::*;
use crate::error::{Error, Result};
use crate::log::format::RECORD_HEADER_LEN;
use crate::log::{Batch, LogError, RecordLoc, SegmentId, SegmentInfo};

/// A point between two steps of a pass, for crash tests: the hook set
/// with [`crate::Inbox::set_compaction_hook`] is called at each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactionStep {
    /// Trim records are durable.
    Trimmed,
    /// Checkpoints covering dead segments are written.
    Checkpointed,
    /// A dead segment file was deleted.
    SegmentDeleted,
    /// Live records of a sparse segment are copied forward, durably.
    Copied,
    /// The events point at the copies, durably.
    Relocated,
}

pub(crate) type Hook = Arc<dyn Fn(CompactionStep) + Send + Sync>;

/// Users per chunk of work done under one state lock.
const USERS_PER_CHUNK: usize = 256;
/// Event locations copied per hold of the state lock.
const EVENTS_PER_LOCK: usize = 16 << 10;
/// Bytes of live records copied per append of a rewrite: small batches
/// keep the foreground's group commits short.
const REWRITE_BATCH_BYTES: u64 = 64 << 10;
/// Trim proposals per command.
const TRIMS_PER_COMMAND: usize = 1024;
/// Conversations per chunk of work done under one state lock.
const CONVS_PER_CHUNK: usize = 256;

/// One trim proposal: the newest event older than the safety window and
/// the newest older than the hard TTL.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrimProposal {
    pub uid: Uid,
    pub safe_seq: SyncSeq,
    pub hard_seq: SyncSeq,
}

#[derive(Default)]
struct Counters {
    events_reclaimed: AtomicU64,
    messages_reclaimed: AtomicU64,
    bytes_reclaimed: AtomicU64,
    bytes_rewritten: AtomicU64,
    segments_dropped: AtomicU64,
    segments_rewritten: AtomicU64,
}

/// What the compactor keeps between passes.
#[derive(Default)]
pub(crate) struct Runtime {
    pass_lock: Mutex<()>,
    counters: Counters,
    hook: Mutex<Option<Hook>>,
    stop: Mutex<bool>,
    stop_cv: Condvar,
    /// `evt` segments that lost events and have not been judged since
    /// (taken from [`super::state::SegRefs`], kept while undecided).
    suspects: Mutex<HashSet<SegmentId>>,
    /// Per user: `(events_base, at_ms)` of the oldest retained event, so a
    /// pass tells from memory that a user has nothing old enough to trim.
    oldest: Mutex<HashMap<Uid, (SyncSeq, TimestampMs)>>,
    trim_plan: Mutex<TrimPlan>,
    /// No snapshot row expires before this (0: look at once).
    snapshots_due: Mutex<TimestampMs>,
}

/// Which users the trim step looks at (see `trim_users`).
#[derive(Default)]
struct TrimPlan {
    /// Every user is looked at once the clock reaches this (0: at once).
    next_full: TimestampMs,
    /// Users with an event past the safety window at the last look.
    watch: HashSet<Uid>,
}

impl Runtime {
    pub fn report(&self) -> CompactionReport {
        let c = &self.counters;
        CompactionReport {
            events_reclaimed: c.events_reclaimed.load(Ordering::Relaxed),
            messages_reclaimed: c.messages_reclaimed.load(Ordering::Relaxed),
            bytes_reclaimed: c.bytes_reclaimed.load(Ordering::Relaxed),
            bytes_rewritten: c.bytes_rewritten.load(Ordering::Relaxed),
            segments_dropped: c.segments_dropped.load(Ordering::Relaxed),
            segments_rewritten: c.segments_rewritten.load(Ordering::Relaxed),
        }
    }

    pub fn set_hook(&self, hook: Option<Hook>) {
        *self.hook.lock() = hook;
    }

    fn step(&self, s: CompactionStep) {
        let hook = self.hook.lock().clone();
        if let Some(h) = hook {
            h(s);
        }
    }

    /// Asks the background thread to stop (it wakes at once).
    pub fn stop(&self) {
        *self.stop.lock() = true;
        self.stop_cv.notify_all();
    }

    fn add(&self, r: &CompactionReport) {
        let c = &self.counters;
        c.events_reclaimed
            .fetch_add(r.events_reclaimed, Ordering::Relaxed);
        c.messages_reclaimed
            .fetch_add(r.messages_reclaimed, Ordering::Relaxed);
        c.bytes_reclaimed
            .fetch_add(r.bytes_reclaimed, Ordering::Relaxed);
        c.bytes_rewritten
            .fetch_add(r.bytes_rewritten, Ordering::Relaxed);
        c.segments_dropped
            .fetch_add(r.segments_dropped, Ordering::Relaxed);
        c.segments_rewritten
            .fetch_add(r.segments_rewritten, Ordering::Relaxed);
    }
}

/// Items per command, so that one command's records (`bytes_each` per
/// item, record headers included, plus one effect header) stay within what
/// one round may gather ([`super::sequencer::round_bytes_max`]): a round
/// larger than a segment could not be written.
fn per_command(shared: &Shared, bytes_each: u64, cap: usize) -> usize {
    let room = super::sequencer::round_bytes_max(shared.config.segment_bytes).saturating_sub(64);
    usize::try_from(room / bytes_each)
        .unwrap_or(usize::MAX)
        .clamp(1, cap)
}

/// How a pass hands commands to the sequencer.
pub(crate) type Submit<'a> = &'a dyn Fn(Command) -> bool;

fn call<T>(submit: Submit<'_>, make: impl FnOnce(super::sequencer::Tx<T>) -> Command) -> Result<T> {
    let (tx, pending) = Pending::channel();
    if !submit(make(tx)) {
        return Err(Error::Internal("engine is shut down".into()));
    }
    pending.wait()
}

fn checkpoint_now(submit: Submit<'_>) -> Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    if !submit(Command::Checkpoint { tx }) {
        return Err(Error::Internal("engine is shut down".into()));
    }
    rx.recv()
        .unwrap_or_else(|_| Err(Error::Internal("engine stopped".into())))
}

/// The background thread: one pass every `interval` until stopped.
pub(crate) fn run_background(
    shared: Arc<Shared>,
    tx: std::sync::mpsc::Sender<Command>,
    interval: Duration,
) {
    let submit = move |c: Command| tx.send(c).is_ok();
    loop {
        {
            let mut stop = shared.compaction.stop.lock();
            if !*stop {
                shared.compaction.stop_cv.wait_for(&mut stop, interval);
            }
            if *stop {
                return;
            }
        }
        if shared.poisoned().is_some() {
            continue;
        }
        match pass(&shared, &submit) {
            Ok(r) => tracing::debug!(?r, "compaction pass"),
            Err(e) => tracing::warn!(error = %e, "compaction pass failed; will retry"),
        }
    }
}

/// One whole compaction pass (see the module doc).
pub(crate) fn pass(shared: &Shared, submit: Submit<'_>) -> Result<CompactionReport> {
    let rt = &shared.compaction;
    let _one_at_a_time = rt.pass_lock.lock();
    // After a failed write the state may hold effects that are not on
    // disk (a relocation, a trim): a pass would delete files by them.
    if let Some(why) = shared.poisoned() {
        return Err(Error::Log(LogError::Poisoned(why)));
    }
    let mut report = CompactionReport::default();
    let result = (|| {
        reclaim_snapshots(shared, submit)?;
        trim_users(shared, submit, &mut report)?;
        reclaim_segments(shared, submit, &mut report)?;
        if let Some(retention) = shared.config.history_retention {
            trim_history(shared, submit, retention, &mut report)?;
            reclaim_msg_segments(shared, &mut report)?;
        }
        Ok(())
    })();
    rt.add(&report);
    result.map(|()| report)
}

// ---- snapshots -------------------------------------------------------

pub(crate) fn decide_drop_snapshots(
    st: &State,
    now: TimestampMs,
    candidates: &[(Uid, u64)],
) -> Vec<Effect> {
    let mut out = Vec::new();
    for &(uid, id) in candidates {
        let Some(slot) = st.users.get(&uid).and_then(|u| u.snapshots.get(&id)) else {
            continue;
        };
        if now > slot.row.expires_at_ms && slot.row.phase != SnapshotPhase::Dropped {
            out.push(Effect::Snapshot {
                uid,
                row: SnapshotRow {
                    phase: SnapshotPhase::Dropped,
                    ..slot.row
                },
            });
        }
    }
    out
}

fn reclaim_snapshots(shared: &Shared, submit: Submit<'_>) -> Result<()> {
    let now = shared.config.clock.now_ms();
    // Rows only expire, at `expires_at_ms`, and a row begun after this
    // look expires a whole TTL from now at the earliest: until the first
    // expiry is due there is nothing to drop and no file to sweep.
    let mut due = shared.compaction.snapshots_due.lock();
    if now < *due {
        return Ok(());
    }
    let mut next = now
        .saturating_add(ms(shared.config.snapshot_ttl))
        .saturating_add(1);
    let expired: Vec<(Uid, u64)> = {
        let st = shared.state.read();
        let mut expired = Vec::new();
        for (uid, u) in &st.users {
            for s in u.snapshots.values() {
                if now > s.row.expires_at_ms {
                    expired.push((*uid, s.row.snapshot_id));
                } else {
                    next = next.min(s.row.expires_at_ms.saturating_add(1));
                }
            }
        }
        expired
    };
    *due = next;
    drop(due);
    for chunk in expired.chunks(per_command(shared, 128, usize::MAX)) {
        call(submit, |tx| Command::DropSnapshots {
            candidates: chunk.to_vec(),
            tx,
        })?;
    }
    let data_dir = &shared.config.data_dir;
    for (uid, id) in shared.snapshots.files(data_dir)? {
        let present = shared
            .state
            .read()
            .users
            .get(&uid)
            .is_some_and(|u| u.snapshots.contains_key(&id));
        if !present {
            shared.snapshots.remove(data_dir, uid, id)?;
        }
    }
    Ok(())
}

// ---- trim ------------------------------------------------------------

/// The `at_ms` of a user's event, or `None` when it cannot be told (then
/// the event counts as young: kept).
fn event_at_ms(shared: &Shared, uid: Uid, seq: SyncSeq) -> Option<TimestampMs> {
    for _ in 0..2 {
        let loc = {
            let st = shared.state.read();
            let u = st.users.get(&uid)?;
            if seq <= u.events_base {
                return Some(0);
            }
            *u.events.get((seq - u.events_base - 1) as usize)?
        };
        if loc == PENDING_LOC {
            return None;
        }
        // A concurrent rewrite may move the record: then look again.
        if let Ok(rec) = shared.evt_log.read(unpack(loc)) {
            return match Effect::decode(rec.kind, &rec.payload).ok()? {
                Effect::Copied(inner) => at_of(&inner),
                e => at_of(&e),
            };
        }
    }
    None
}

fn at_of(e: &Effect) -> Option<TimestampMs> {
    match e {
        Effect::Msg(m) => Some(m.at_ms),
        Effect::Read { at_ms, .. } | Effect::Flags { at_ms, .. } => Some(*at_ms),
        _ => None,
    }
}

/// The newest seq in `(lo, hi]` whose event is at or before `cutoff`, or
/// `lo` if none. Events are stamped in sequence, so their times do not
/// decrease with the seq: a binary search, O(log n) record reads.
pub(crate) fn newest_at_or_before(
    shared: &Shared,
    uid: Uid,
    lo: SyncSeq,
    hi: SyncSeq,
    cutoff: TimestampMs,
) -> SyncSeq {
    let (mut ok, mut bad) = (lo, hi + 1);
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        match event_at_ms(shared, uid, mid) {
            Some(at) if at <= cutoff => ok = mid,
            _ => bad = mid,
        }
    }
    ok
}

/// The sequencer's decision on trim proposals: effects, and per trimmed
/// user (uid, old base, new base).
pub(crate) fn decide_trim(
    st: &State,
    cfg: &InboxConfig,
    now: TimestampMs,
    proposals: &[TrimProposal],
) -> (Vec<Effect>, Vec<(Uid, SyncSeq, SyncSeq)>) {
    let mut effects = Vec::new();
    let mut trimmed = Vec::new();
    for p in proposals {
        let Some(user) = st.users.get(&p.uid) else {
            continue;
        };
        let target = fence::trim_target(user, cfg, now, p.safe_seq, p.hard_seq);
        if target > user.events_base {
            effects.push(Effect::Trim {
                uid: p.uid,
                events_base: target,
            });
            trimmed.push((p.uid, user.events_base, target));
        }
    }
    (effects, trimmed)
}

fn trim_users(shared: &Shared, submit: Submit<'_>, report: &mut CompactionReport) -> Result<()> {
    let cfg = &shared.config;
    let now = cfg.clock.now_ms();
    let safe_cut = now.saturating_sub(ms(cfg.safety_window));
    let hard_cut = now.saturating_sub(ms(cfg.hard_ttl));
    // An event can go once it is past either bound.
    let window = ms(cfg.safety_window).min(ms(cfg.hard_ttl));
    let cut = safe_cut.max(hard_cut);
    let rt = &shared.compaction;
    let mut plan = rt.trim_plan.lock();
    let mut oldest_at = rt.oldest.lock();
    // A user none of whose events is past the safety window cannot be
    // trimmed before its oldest event is: only the users already past it
    // (`watch`) are looked at until the earliest such moment (`next_full`)
    // comes, and then every user is. A user created meanwhile has events
    // stamped after the last full look, so it is due no earlier.
    let full = now >= plan.next_full;
    let uids: Vec<Uid> = if full {
        shared.state.read().users.keys().copied().collect()
    } else {
        plan.watch.iter().copied().collect()
    };
    let mut next_due = if full {
        now.saturating_add(window.max(1))
    } else {
        plan.next_full
    };
    let mut watch = HashSet::new();
    let mut proposals = Vec::new();
    for chunk in uids.chunks(USERS_PER_CHUNK) {
        let views: Vec<(Uid, SyncSeq, SyncSeq, SyncSeq)> = {
            let st = shared.state.read();
            chunk
                .iter()
                .filter_map(|uid| {
                    let u = st.users.get(uid)?;
                    Some((
                        *uid,
                        u.events_base,
                        u.committed_seq.min(u.head()),
                        fence::fence_floor(u, cfg, now),
                    ))
                })
                .collect()
        };
        for (uid, base, committed, floor) in views {
            if committed <= base {
                continue;
            }
            // The oldest retained event's time, remembered while the base
            // stays, says without a read whether anything can go.
            let at = match oldest_at.get(&uid) {
                Some(&(b, at)) if b == base => Some(at),
                _ => {
                    let at = event_at_ms(shared, uid, base + 1);
                    if let Some(at) = at {
                        oldest_at.insert(uid, (base, at));
                    }
                    at
                }
            };
            let Some(oldest) = at else {
                // Not known yet (its record is still being written).
                watch.insert(uid);
                continue;
            };
            if oldest > cut {
                next_due = next_due.min(oldest.saturating_add(window));
                continue;
            }
            watch.insert(uid);
            if oldest > hard_cut && floor <= base {
                continue;
            }
            let hard_seq = newest_at_or_before(shared, uid, base, committed, hard_cut);
            let safe_hi = floor.min(committed);
            let safe_seq = if safe_hi > base {
                newest_at_or_before(shared, uid, base, safe_hi, safe_cut)
            } else {
                base
            };
            if safe_seq.min(floor).max(hard_seq) > base {
                proposals.push(TrimProposal {
                    uid,
                    safe_seq,
                    hard_seq,
                });
            }
        }
    }
    plan.next_full = next_due;
    plan.watch = watch;
    drop((plan, oldest_at));
    let mut any = false;
    for chunk in proposals.chunks(per_command(shared, 48, TRIMS_PER_COMMAND)) {
        let trimmed = call(submit, |tx| Command::Trim {
            proposals: chunk.to_vec(),
            tx,
        })?;
        for (_, old, new) in trimmed {
            report.events_reclaimed += new - old;
            any = true;
        }
    }
    if any {
        rt.step(CompactionStep::Trimmed);
    }
    Ok(())
}

// ---- segments --------------------------------------------------------

/// Retained events pointing into each `evt` segment: offset -> (uid, seq).
type Refs = HashMap<SegmentId, BTreeMap<u32, Vec<(Uid, SyncSeq)>>>;

/// Which events point into the segments of `only` (every segment with
/// `None`). Walks the whole index: a pass calls it only for segments that
/// lost events since they were last judged.
fn live_refs(shared: &Shared, only: Option<&HashSet<SegmentId>>) -> Refs {
    let uids: Vec<Uid> = shared.state.read().users.keys().copied().collect();
    let mut refs: Refs = HashMap::new();
    let mut slice = Vec::with_capacity(EVENTS_PER_LOCK);
    for uid in uids {
        // Copy the index a slice at a time, so the sequencer never waits
        // long for the state lock; each slice is taken with its own base,
        // so a trim in between only makes the map conservative.
        let mut next = 0;
        loop {
            let first = {
                let st = shared.state.read();
                let Some(u) = st.users.get(&uid) else { break };
                let first = next.max(u.events_base + 1);
                let lo = (first - u.events_base - 1) as usize;
                let hi = (lo + EVENTS_PER_LOCK).min(u.events.len());
                if lo >= hi {
                    break;
                }
                slice.clear();
                slice.extend_from_slice(&u.events[lo..hi]);
                first
            };
            for (i, loc) in slice.iter().enumerate() {
                if *loc == PENDING_LOC {
                    continue;
                }
                let l = unpack(*loc);
                if only.is_some_and(|s| !s.contains(&l.segment)) {
                    continue;
                }
                refs.entry(l.segment)
                    .or_default()
                    .entry(l.offset)
                    .or_default()
                    .push((uid, first + i as SyncSeq));
            }
            next = first + slice.len() as SyncSeq;
        }
    }
    refs
}

/// Bytes (headers included) of the records of segment `id` at `offsets`:
/// one sequential read of the segment.
fn live_bytes<V>(log: &crate::log::Log, id: SegmentId, offsets: &BTreeMap<u32, V>) -> Result<u64> {
    let mut bytes = 0;
    log.replay_segment(id, &mut |_, loc, _, payload| {
        if offsets.contains_key(&loc.offset) {
            bytes += (RECORD_HEADER_LEN + payload.len()) as u64;
        }
        Ok(())
    })?;
    Ok(bytes)
}

/// Bytes on disk and bytes still needed, per stream (the space
/// amplification figure). Live `evt` bytes are the records retained events
/// point at; every message is live (history is kept).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpaceUsage {
    pub evt_bytes: u64,
    pub evt_live_bytes: u64,
    pub msg_bytes: u64,
}

pub(crate) fn space_usage(shared: &Shared) -> Result<SpaceUsage> {
    let refs = live_refs(shared, None);
    let mut u = SpaceUsage::default();
    for info in shared.evt_log.segments() {
        u.evt_bytes += info.bytes;
        if let Some(offsets) = refs.get(&info.id) {
            u.evt_live_bytes += live_bytes(&shared.evt_log, info.id, offsets)?;
        }
    }
    u.msg_bytes = shared.msg_log.segments().iter().map(|s| s.bytes).sum();
    Ok(u)
}

/// The LSN every retained durable checkpoint covers: 0 until there are
/// two, since with one a corrupt file falls back to a full replay, which
/// needs every segment.
fn covered_lsn(shared: &Shared) -> u64 {
    let lsns = shared.checkpoints.lock();
    if lsns.len() < checkpoint::KEEP {
        return 0;
    }
    lsns.iter().copied().min().unwrap_or(0)
}

fn delete_segment(
    shared: &Shared,
    info: &SegmentInfo,
    report: &mut CompactionReport,
) -> Result<()> {
    shared.evt_log.delete_segment(info.id)?;
    shared.compaction.suspects.lock().remove(&info.id);
    report.segments_dropped += 1;
    report.bytes_reclaimed += info.bytes;
    shared.compaction.step(CompactionStep::SegmentDeleted);
    Ok(())
}

/// A sealed segment some events still point into, found sparse.
struct Sparse {
    info: SegmentInfo,
    live_bytes: u64,
    offsets: BTreeMap<u32, Vec<(Uid, SyncSeq)>>,
}

/// What a judged segment holds: bytes of its live records, and the newest
/// `at_ms` among them (`None` when one cannot be told: counts as young).
fn scan_live(
    log: &crate::log::Log,
    id: SegmentId,
    offsets: &BTreeMap<u32, Vec<(Uid, SyncSeq)>>,
) -> Result<(u64, Option<TimestampMs>)> {
    let mut bytes = 0;
    let mut newest = Some(0);
    log.replay_segment(id, &mut |_, loc, kind, payload| {
        if offsets.contains_key(&loc.offset) {
            bytes += (RECORD_HEADER_LEN + payload.len()) as u64;
            let at = match Effect::decode(kind, payload) {
                Ok(Effect::Copied(inner)) => at_of(&inner),
                Ok(e) => at_of(&e),
                Err(_) => None,
            };
            newest = newest.zip(at).map(|(a, b)| a.max(b));
        }
        Ok(())
    })?;
    Ok((bytes, newest))
}

fn reclaim_segments(
    shared: &Shared,
    submit: Submit<'_>,
    report: &mut CompactionReport,
) -> Result<()> {
    let rt = &shared.compaction;
    let sealed: Vec<SegmentInfo> = shared
        .evt_log
        .segments()
        .into_iter()
        .filter(|s| s.sealed)
        .collect();
    // Take the segments that lost events before reading the counts: a loss
    // in between is judged by the next pass. A sealed segment never gains
    // a reference (new events point into the active segment, and only a
    // pass relocates), so a zero count stays zero.
    let (counts, suspects) = {
        let lost = if shared.state.read().evt_refs.has_dirty() {
            shared.state.write().evt_refs.take_dirty()
        } else {
            HashSet::new()
        };
        let mut suspects = rt.suspects.lock();
        suspects.extend(lost);
        let st = shared.state.read();
        let counts: HashMap<SegmentId, u64> = sealed
            .iter()
            .map(|s| (s.id, st.evt_refs.count(s.id)))
            .collect();
        (counts, suspects.clone())
    };
    let dead: Vec<&SegmentInfo> = sealed.iter().filter(|s| counts[&s.id] == 0).collect();
    // Only a segment that lost events can have become sparse: the index is
    // walked for those alone, and only when there are any.
    let judge: HashSet<SegmentId> = sealed
        .iter()
        .filter(|s| counts[&s.id] > 0 && suspects.contains(&s.id))
        .map(|s| s.id)
        .collect();
    let mut sparse = Vec::new();
    if !judge.is_empty() {
        let mut refs = live_refs(shared, Some(&judge));
        let threshold = shared.config.rewrite_live_fraction;
        let cfg = &shared.config;
        let safe_cut = cfg.clock.now_ms().saturating_sub(ms(cfg.safety_window));
        for info in sealed.iter().filter(|s| judge.contains(&s.id)) {
            // No event left: dead by the next pass's count.
            let Some(offsets) = refs.remove(&info.id) else {
                continue;
            };
            let (live, newest) = scan_live(&shared.evt_log, info.id, &offsets)?;
            if (live as f64) < threshold * info.bytes as f64 {
                // A segment with live events still inside the safety window
                // straddles the trim point and will shed them as the window
                // passes: copying them now would only write bytes that die
                // soon. It stays a suspect and is judged again.
                if newest.is_some_and(|at| at <= safe_cut) {
                    sparse.push(Sparse {
                        info: info.clone(),
                        live_bytes: live,
                        offsets,
                    });
                }
            } else {
                // Judged dense; it becomes a suspect again when it loses
                // more events.
                rt.suspects.lock().remove(&info.id);
            }
        }
    }
    if dead.is_empty() && sparse.is_empty() {
        return Ok(());
    }
    let mut covered = covered_lsn(shared);
    // Checkpoints stall the sequencer while the state is encoded, so they
    // are written for compaction only when an eighth of the log (or more)
    // waits for them; periodic checkpoints cover the rest in time.
    let total: u64 = sealed.iter().map(|s| s.bytes).sum();
    let waiting: u64 = dead
        .iter()
        .filter(|s| s.last_lsn > covered)
        .map(|s| s.bytes)
        .chain(
            sparse
                .iter()
                .filter(|v| v.info.last_lsn > covered)
                .map(|v| v.info.bytes.saturating_sub(v.live_bytes)),
        )
        .sum();
    if waiting > 0 && waiting >= total / 8 {
        // Dead or sparse segments wait for checkpoint coverage (they hold
        // state deltas too): write two, so that both retained checkpoints
        // cover them.
        checkpoint_now(submit)?;
        checkpoint_now(submit)?;
        covered = covered_lsn(shared);
        rt.step(CompactionStep::Checkpointed);
    }
    for info in dead.into_iter().filter(|s| s.last_lsn <= covered) {
        delete_segment(shared, info, report)?;
    }
    for v in sparse.iter().filter(|v| v.info.last_lsn <= covered) {
        rewrite(shared, submit, &v.info, &v.offsets, report)?;
    }
    Ok(())
}

/// Copies the live records of one sealed segment forward (throttled to
/// `compaction_bytes_per_s`), relocates the events, deletes the old file.
fn rewrite(
    shared: &Shared,
    submit: Submit<'_>,
    info: &SegmentInfo,
    offsets: &BTreeMap<u32, Vec<(Uid, SyncSeq)>>,
    report: &mut CompactionReport,
) -> Result<()> {
    let room = REWRITE_BATCH_BYTES.min(shared.config.segment_bytes / 2);
    let rate = shared.config.compaction_bytes_per_s.max(1);
    let started = Instant::now();
    let mut copied = 0u64;
    let mut entries: Vec<(&u32, &Vec<(Uid, SyncSeq)>)> = offsets.iter().collect();
    while !entries.is_empty() {
        // One batch per chunk that fits half a segment.
        let mut batch = Batch::new();
        let mut olds = Vec::new();
        let mut size = 0u64;
        while let Some(&(off, holders)) = entries.first() {
            let rec = shared.evt_log.read(RecordLoc {
                segment: info.id,
                offset: *off,
            })?;
            let len = (RECORD_HEADER_LEN + rec.payload.len()) as u64;
            if !batch.is_empty() && size + len > room {
                break;
            }
            batch.push(rec.kind | COPY_FLAG, &rec.payload);
            size += len;
            olds.push((*off, holders));
            entries.remove(0);
        }
        let appended = shared.evt_log.append(batch)?;
        copied += size;
        // Throttle: never faster than `rate` bytes per second on average.
        let due = Duration::from_secs_f64(copied as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        shared.compaction.step(CompactionStep::Copied);
        let mut moves = Vec::new();
        for ((off, holders), new) in olds.iter().zip(&appended.locs) {
            let from = pack(RecordLoc {
                segment: info.id,
                offset: *off,
            });
            for &(uid, sync_seq) in holders.iter() {
                moves.push(Relocation {
                    uid,
                    sync_seq,
                    from,
                    to: pack(*new),
                });
            }
        }
        for chunk in moves.chunks(per_command(shared, 32, fence::RELOCATIONS_PER_RECORD_MAX)) {
            call(submit, |tx| Command::Relocate {
                moves: chunk.to_vec(),
                tx,
            })?;
        }
        shared.compaction.step(CompactionStep::Relocated);
    }
    report.bytes_rewritten += copied;
    report.segments_rewritten += 1;
    // Every event that pointed here now points at a durable copy, and the
    // relocation is durable: the file holds nothing anyone needs.
    if shared.state.read().evt_refs.count(info.id) == 0 {
        delete_segment(shared, info, report)?;
    }
    Ok(())
}

// ---- history retention -----------------------------------------------

/// The stamped time of a retained message, or `None` when it cannot be
/// told (then it counts as young: kept).
fn msg_at_ms(shared: &Shared, conv: ConvId, seq: MsgSeq) -> Option<TimestampMs> {
    let loc = {
        let st = shared.state.read();
        let c = st.convs.get(&conv)?;
        if seq <= c.msgs_base {
            return Some(0);
        }
        c.meta(seq)?.loc
    };
    if loc == PENDING_LOC {
        return None;
    }
    let rec = shared.msg_log.read(unpack(loc)).ok()?;
    let (h, _) = decode_msg_record(&rec.payload, shared.config.payload_bytes_max).ok()?;
    Some(h.sent_at_ms)
}

/// The newest message seq in `(lo, hi]` of `conv` stamped at or before
/// `cutoff`, or `lo`. Messages are stamped in sequence: a binary search.
fn newest_msg_at_or_before(
    shared: &Shared,
    conv: ConvId,
    lo: MsgSeq,
    hi: MsgSeq,
    cutoff: TimestampMs,
) -> MsgSeq {
    let (mut ok, mut bad) = (lo, hi + 1);
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        match msg_at_ms(shared, conv, mid) {
            Some(at) if at <= cutoff => ok = mid,
            _ => bad = mid,
        }
    }
    ok
}

/// The sequencer's decision on message trim proposals: never above what
/// is durable, never down. Returns the effects and (conv, old, new).
pub(crate) fn decide_trim_msgs(
    st: &State,
    proposals: &[(ConvId, MsgSeq)],
) -> (Vec<Effect>, Vec<(ConvId, MsgSeq, MsgSeq)>) {
    let mut effects = Vec::new();
    let mut trimmed = Vec::new();
    for &(conv, base) in proposals {
        let Some(c) = st.convs.get(&conv) else {
            continue;
        };
        let target = base.min(c.committed_seq).min(c.head());
        if target > c.msgs_base {
            effects.push(Effect::TrimMsgs {
                conv,
                msgs_base: target,
            });
            trimmed.push((conv, c.msgs_base, target));
        }
    }
    (effects, trimmed)
}

fn trim_history(
    shared: &Shared,
    submit: Submit<'_>,
    retention: Duration,
    report: &mut CompactionReport,
) -> Result<()> {
    let cut = shared.config.clock.now_ms().saturating_sub(ms(retention));
    let convs: Vec<ConvId> = shared.state.read().convs.keys().copied().collect();
    let mut proposals = Vec::new();
    for chunk in convs.chunks(CONVS_PER_CHUNK) {
        let views: Vec<(ConvId, MsgSeq, MsgSeq)> = {
            let st = shared.state.read();
            chunk
                .iter()
                .filter_map(|id| {
                    let c = st.convs.get(id)?;
                    Some((*id, c.msgs_base, c.committed_seq.min(c.head())))
                })
                .collect()
        };
        for (conv, base, committed) in views {
            if committed <= base {
                continue;
            }
            let target = newest_msg_at_or_before(shared, conv, base, committed, cut);
            if target > base {
                proposals.push((conv, target));
            }
        }
    }
    let mut any = false;
    for chunk in proposals.chunks(per_command(shared, 48, TRIMS_PER_COMMAND)) {
        let trimmed = call(submit, |tx| Command::TrimMsgs {
            proposals: chunk.to_vec(),
            tx,
        })?;
        for (_, old, new) in trimmed {
            report.messages_reclaimed += new - old;
            any = true;
        }
    }
    if any {
        shared.compaction.step(CompactionStep::Trimmed);
    }
    Ok(())
}

/// Deletes sealed `msg` segments whose every message is below its
/// conversation's retained base (the trims are already durable).
fn reclaim_msg_segments(shared: &Shared, report: &mut CompactionReport) -> Result<()> {
    // Listed before the counts are read: a message's location is patched
    // in by the sequencer before it submits the next `msg` batch, so every
    // record of a segment sealed by then is counted, and a sealed segment
    // never gains a message.
    let sealed: Vec<SegmentInfo> = shared
        .msg_log
        .segments()
        .into_iter()
        .filter(|s| s.sealed)
        .collect();
    let dead: Vec<SegmentInfo> = {
        // Sparse `msg` segments are not rewritten (retention is by age, so
        // a segment's messages expire together): nothing to judge.
        if shared.state.read().msg_refs.has_dirty() {
            drop(shared.state.write().msg_refs.take_dirty());
        }
        let st = shared.state.read();
        sealed
            .into_iter()
            .filter(|s| st.msg_refs.count(s.id) == 0)
            .collect()
    };
    for info in dead {
        shared.msg_log.delete_segment(info.id)?;
        report.segments_dropped += 1;
        report.bytes_reclaimed += info.bytes;
        shared.compaction.step(CompactionStep::SegmentDeleted);
    }
    Ok(())
}

// ---- explain ---------------------------------------------------------

pub(crate) fn explain(shared: &Shared, uid: Uid) -> Result<UserExplain> {
    let cfg = &shared.config;
    let now = cfg.clock.now_ms();
    let (mut fences, base, committed, fence_floor) = {
        let st = shared.state.read();
        let u = st
            .users
            .get(&uid)
            .ok_or_else(|| Error::NotFound(format!("uid {uid}")))?;
        (
            fence::fences(u, cfg, now),
            u.events_base,
            u.committed_seq.min(u.head()),
            fence::fence_floor(u, cfg, now),
        )
    };
    let safe_seq = newest_at_or_before(
        shared,
        uid,
        base,
        committed,
        now.saturating_sub(ms(cfg.safety_window)),
    );
    let hard_seq = newest_at_or_before(
        shared,
        uid,
        base,
        committed,
        now.saturating_sub(ms(cfg.hard_ttl)),
    );
    if safe_seq < committed {
        fences.push(Fence::SafetyWindow {
            oldest_kept: safe_seq + 1,
        });
    }
    fences.sort_by_key(fence::fence_seq);
    let floor = fence_floor
        .min(safe_seq)
        .max(hard_seq)
        .min(committed)
        .max(base);
    Ok(UserExplain {
        uid,
        oldest_retained: base + 1,
        committed_sync_seq: committed,
        floor,
        fences,
    })
}

pub(crate) fn explain_segment(
    shared: &Shared,
    stream: &str,
    id: SegmentId,
) -> Result<SegmentExplain> {
    let log = match stream {
        "evt" => &shared.evt_log,
        "msg" => &shared.msg_log,
        other => {
            return Err(Error::BadRequest(format!(
                "unknown stream {other:?}; expected \"evt\" or \"msg\""
            )))
        }
    };
    let info = log
        .segments()
        .into_iter()
        .find(|s| s.id == id)
        .ok_or_else(|| Error::NotFound(format!("{stream} segment {id}")))?;
    let mut held_by = Vec::new();
    if stream == "msg" {
        // Live: the records retained messages point at.
        let live: HashSet<u32> = {
            let st = shared.state.read();
            st.convs
                .values()
                .flat_map(|c| c.msgs.iter())
                .filter(|m| m.loc != PENDING_LOC)
                .map(|m| unpack(m.loc))
                .filter(|l| l.segment == id)
                .map(|l| l.offset)
                .collect()
        };
        let mut records = 0u64;
        let mut bytes = 0u64;
        log.replay_segment(id, &mut |_, loc, _, p| {
            if live.contains(&loc.offset) {
                records += 1;
                bytes += (RECORD_HEADER_LEN + p.len()) as u64;
            }
            Ok(())
        })?;
        if !info.sealed {
            held_by.push("active segment (still written)".into());
        }
        if records > 0 {
            held_by.push(match shared.config.history_retention {
                None => format!(
                    "history retention: {records} messages kept forever (no retention configured)"
                ),
                Some(d) => format!(
                    "history retention: {records} messages younger than the retention window of {} s",
                    d.as_secs()
                ),
            });
        }
        return Ok(SegmentExplain {
            stream: stream.into(),
            segment: id,
            bytes: info.bytes,
            live_bytes: bytes,
            live_records: records,
            held_by,
        });
    }
    let refs = live_refs(shared, Some(&HashSet::from([id])));
    let offsets = refs.get(&id);
    let mut live = 0;
    let live_records = offsets.map_or(0, |o| o.len() as u64);
    if let Some(offsets) = offsets {
        live = live_bytes(log, id, offsets)?;
        let mut per_user: BTreeMap<Uid, (SyncSeq, SyncSeq, u64)> = BTreeMap::new();
        for holders in offsets.values() {
            for &(uid, seq) in holders {
                let e = per_user.entry(uid).or_insert((seq, seq, 0));
                e.0 = e.0.min(seq);
                e.1 = e.1.max(seq);
                e.2 += 1;
            }
        }
        for (uid, (lo, hi, n)) in per_user {
            let why = explain(shared, uid)
                .ok()
                .and_then(|x| x.fences.first().cloned())
                .map_or_else(|| "not yet reclaimed".to_string(), |f| describe(&f));
            held_by.push(format!(
                "uid {uid}: {n} events (sync_seq {lo}..={hi}), held by {why}"
            ));
        }
    }
    if !info.sealed {
        held_by.push("active segment (still written)".into());
    } else {
        let covered = covered_lsn(shared);
        if info.last_lsn > covered {
            held_by.push(format!(
                "state deltas up to LSN {} not yet covered by both checkpoints (covered to {covered})",
                info.last_lsn
            ));
        }
    }
    Ok(SegmentExplain {
        stream: stream.into(),
        segment: id,
        bytes: info.bytes,
        live_bytes: live,
        live_records,
        held_by,
    })
}

fn describe(f: &Fence) -> String {
    match f {
        Fence::DeviceAck {
            device,
            acked_sync_seq,
        } => format!("device {device} ACK at {acked_sync_seq}"),
        Fence::RecoveryLease {
            device,
            lease_id,
            resume_from,
        } => format!("recovery lease {lease_id} of device {device} from {resume_from}"),
        Fence::Snapshot {
            snapshot_id,
            base_sync_seq,
        } => format!("snapshot {snapshot_id} at {base_sync_seq}"),
        Fence::SafetyWindow { oldest_kept } => {
            format!("safety window (events from {oldest_kept} are younger)")
        }
    }
}
