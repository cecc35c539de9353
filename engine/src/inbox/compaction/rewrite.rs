//! Steps 3 and 4 of a pass: dead segments are deleted whole, sparse ones
//! are rewritten (see the module doc of `compaction`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::bodies::move_bodies_out;
use super::record::{Relocation, RELOCATIONS_PER_RECORD_MAX};
use super::runtime::CompactionStep;
use super::submit::*;
use super::Command;
use crate::api::*;
use crate::error::Result;
use crate::inbox::checkpoint;
use crate::inbox::config::ms;
use crate::inbox::effect::{Effect, COPY_FLAG};
use crate::inbox::messaging::body::without_body;
use crate::inbox::shared::Shared;
use crate::inbox::state::{pack, unpack, PENDING_LOC};
use crate::log::{Batch, RecordLoc, SegmentId, SegmentInfo};

/// Retained events pointing into each `evt` segment: offset -> (uid, seq).
pub(crate) type Refs = HashMap<SegmentId, BTreeMap<u32, Vec<(Uid, SyncSeq)>>>;

/// Which events point into the segments of `only` (every segment with
/// `None`). Walks the whole index: a pass calls it only for segments that
/// lost events since they were last judged.
pub(crate) fn live_refs(shared: &Shared, only: Option<&HashSet<SegmentId>>) -> Refs {
    let uids: Vec<Uid> = shared.state.read().users.keys().copied().collect();
    let mut refs: Refs = HashMap::new();
    let mut slice = Vec::with_capacity(EVENTS_PER_LOCK);
    for uid in uids {
        // Copy the index a slice at a time, so the sequencer never waits
        // long for the state lock; each slice is taken with its own base,
        // so a trim in between only makes the map conservative.
        let mut next = SyncSeq(0);
        loop {
            let first = {
                let st = shared.state.read();
                let Some(u) = st.users.get(&uid) else { break };
                let first = next.max(u.events_base.next());
                let lo = (first.0 - u.events_base.0 - 1) as usize;
                let hi = (lo + EVENTS_PER_LOCK).min(u.events.len());
                if lo >= hi {
                    break;
                }
                slice.clear();
                slice.extend(u.events.range(lo, hi).expect("lo < hi <= len"));
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
                    .push((uid, first.plus(i as u64)));
            }
            next = first.plus(slice.len() as u64);
        }
    }
    refs
}

/// The LSN every retained durable checkpoint covers: 0 until there are
/// two, since with one a corrupt file falls back to a full replay, which
/// needs every segment.
pub(crate) fn covered_lsn(shared: &Shared) -> u64 {
    let lsns = shared.checkpoints.lock();
    if lsns.len() < checkpoint::KEEP {
        return 0;
    }
    lsns.iter().copied().min().unwrap_or(0)
}

pub(crate) fn delete_segment(
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

/// Marks the active `evt` segment as one to judge once sealed: a pass
/// writes records there that no index points at (copies' relocations,
/// body moves), so it may turn sparse without ever losing an entry.
pub(crate) fn suspect_active(shared: &Shared) {
    if let Some(active) = shared.evt_log.segments().last() {
        shared.compaction.suspects.lock().insert(active.id);
    }
}

/// A sealed segment some events still point into, found sparse.
pub(crate) struct Sparse {
    info: SegmentInfo,
    live_bytes: u64,
    offsets: BTreeMap<u32, Vec<(Uid, SyncSeq)>>,
}

/// What a judged segment holds: bytes of its live records, and the newest
/// `at_ms` among them (`None` when one cannot be told: counts as young).
pub(crate) fn scan_live(
    log: &crate::log::Log,
    id: SegmentId,
    offsets: &BTreeMap<u32, Vec<(Uid, SyncSeq)>>,
) -> Result<(u64, Option<TimestampMs>)> {
    let mut bytes = 0;
    let mut newest = Some(0);
    log.replay_segment(id, &mut |_, loc, kind, payload| {
        if offsets.contains_key(&loc.offset) {
            bytes += (RECORD_HEADER_LEN + payload.len()) as u64;
            // A copy carries its original's time.
            let at = Effect::decode(kind, payload).ok().and_then(|e| e.at_ms());
            newest = newest.zip(at).map(|(a, b)| a.max(b));
        }
        Ok(())
    })?;
    Ok((bytes, newest))
}

pub(crate) fn reclaim_segments(
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
    // Segments that only message bodies hold: move the bodies to `msg`
    // first, so the segments die like any other below.
    let held_by_bodies: HashSet<SegmentId> = {
        let st = shared.state.read();
        sealed
            .iter()
            .filter(|s| {
                let bodies = st.body_refs.count(s.id);
                bodies > 0 && st.evt_refs.count(s.id) == bodies
            })
            .map(|s| s.id)
            .collect()
    };
    if !held_by_bodies.is_empty() {
        move_bodies_out(shared, submit, &held_by_bodies)?;
    }
    // Take the segments that lost events before reading the counts: a loss
    // in between is judged by the next pass. A sealed segment never gains
    // a reference (new events point into the active segment, and only a
    // pass relocates), so a zero count stays zero.
    let (counts, suspects) = {
        let lost = if shared.state.read().evt_refs.has_dirty() {
            shared.state.write().evt_refs.take_dirty()
        } else {
            Default::default()
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
pub(crate) fn rewrite(
    shared: &Shared,
    submit: Submit<'_>,
    info: &SegmentInfo,
    offsets: &BTreeMap<u32, Vec<(Uid, SyncSeq)>>,
    report: &mut CompactionReport,
) -> Result<()> {
    // The bodies of retained messages go to `msg` first: the copies below
    // serve the events only.
    move_bodies_out(shared, submit, &HashSet::from([info.id]))?;
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
            // A message effect is copied without its body, which has
            // just moved to `msg`.
            let (kind, payload) =
                without_body(rec.kind, &rec.payload).unwrap_or((rec.kind, rec.payload));
            let len = (RECORD_HEADER_LEN + payload.len()) as u64;
            if !batch.is_empty() && size + len > room {
                break;
            }
            batch.push(kind | COPY_FLAG, &payload);
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
        for chunk in moves.chunks(per_command(shared, 32, RELOCATIONS_PER_RECORD_MAX)) {
            call(submit, |tx| Command::Relocate {
                moves: chunk.to_vec(),
                tx,
            })?;
        }
        suspect_active(shared);
        shared.compaction.step(CompactionStep::Relocated);
    }
    report.bytes_rewritten += copied;
    report.segments_rewritten += 1;
    // Every event that pointed here now points at a durable copy, every
    // body at its durable `msg` copy, and the moves are durable: the file
    // holds nothing anyone needs.
    if shared.state.read().evt_refs.count(info.id) == 0 {
        delete_segment(shared, info, report)?;
    }
    Ok(())
}

/// Deletes sealed `msg` segments whose every message is below its
/// conversation's retained base (the trims are already durable).
pub(crate) fn reclaim_msg_segments(shared: &Shared, report: &mut CompactionReport) -> Result<()> {
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
