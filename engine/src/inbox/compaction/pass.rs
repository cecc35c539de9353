//! The compaction pass (steps in the module doc of `compaction`) and the
//! background thread that runs it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::decide::TrimProposal;
use super::fences as fence;
use super::rewrite::{reclaim_msg_segments, reclaim_segments};
use super::runtime::CompactionStep;
use super::submit::*;
use super::Command;
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::config::ms;
use crate::inbox::effect::Effect;
use crate::inbox::messaging::body::read_message;
use crate::inbox::shared::Shared;
use crate::inbox::state::{unpack, PENDING_LOC};
use crate::log::LogError;

/// The background thread: one pass every `interval` until stopped.
pub(crate) fn run_background(shared: Arc<Shared>, submit: OwnedSubmit, interval: Duration) {
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
        match pass(&shared, &*submit) {
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

pub(crate) fn reclaim_snapshots(shared: &Shared, submit: Submit<'_>) -> Result<()> {
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
            for s in u.snapshots().values() {
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
            .is_some_and(|u| u.snapshots().contains_key(&id));
        if !present {
            shared
                .snapshots
                .remove(shared.evt_log.io().as_ref(), data_dir, uid, id)?;
        }
    }
    Ok(())
}

/// The `at_ms` of a user's event, or `None` when it cannot be told (then
/// the event counts as young: kept).
pub(crate) fn event_at_ms(shared: &Shared, uid: Uid, seq: SyncSeq) -> Option<TimestampMs> {
    for _ in 0..2 {
        let loc = {
            let st = shared.state.read();
            let u = st.users.get(&uid)?;
            if seq <= u.events_base {
                return Some(0);
            }
            u.events.get((seq.0 - u.events_base.0 - 1) as usize)?
        };
        if loc == PENDING_LOC {
            return None;
        }
        // A concurrent rewrite may move the record: then look again.
        if let Ok(rec) = shared.evt_log.read(unpack(loc)) {
            return Effect::decode(rec.kind, &rec.payload).ok()?.at_ms();
        }
    }
    None
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
    let (mut ok, mut bad) = (lo.0, hi.0 + 1);
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        match event_at_ms(shared, uid, SyncSeq(mid)) {
            Some(at) if at <= cutoff => ok = mid,
            _ => bad = mid,
        }
    }
    SyncSeq(ok)
}

pub(crate) fn trim_users(
    shared: &Shared,
    submit: Submit<'_>,
    report: &mut CompactionReport,
) -> Result<()> {
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
                    let at = event_at_ms(shared, uid, base.next());
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
            report.events_reclaimed += new.saturating_since(old);
            any = true;
        }
    }
    if any {
        rt.step(CompactionStep::Trimmed);
    }
    Ok(())
}

/// The stamped time of a retained message, or `None` when it cannot be
/// told (then it counts as young: kept).
pub(crate) fn msg_at_ms(shared: &Shared, conv: ConvId, seq: MsgSeq) -> Option<TimestampMs> {
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
    let (h, _) = read_message(shared, conv, seq, loc).ok()?;
    Some(h.sent_at_ms)
}

/// The newest message seq in `(lo, hi]` of `conv` stamped at or before
/// `cutoff`, or `lo`. Messages are stamped in sequence: a binary search.
pub(crate) fn newest_msg_at_or_before(
    shared: &Shared,
    conv: ConvId,
    lo: MsgSeq,
    hi: MsgSeq,
    cutoff: TimestampMs,
) -> MsgSeq {
    let (mut ok, mut bad) = (lo.0, hi.0 + 1);
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        match msg_at_ms(shared, conv, MsgSeq(mid)) {
            Some(at) if at <= cutoff => ok = mid,
            _ => bad = mid,
        }
    }
    MsgSeq(ok)
}

pub(crate) fn trim_history(
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
            report.messages_reclaimed += new.saturating_since(old);
            any = true;
        }
    }
    if any {
        shared.compaction.step(CompactionStep::Trimmed);
    }
    Ok(())
}
