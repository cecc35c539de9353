//! What holds data back, per user and per segment, and the space figures
//! (R19: the store can explain which fence holds data back).

use std::collections::{BTreeMap, HashSet};

use super::fences as fence;
use super::pass::newest_at_or_before;
use super::rewrite::{covered_lsn, live_refs};
use super::submit::RECORD_HEADER_LEN;
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::config::ms;
use crate::inbox::shared::Shared;
use crate::inbox::state::{body_at, unpack, BodyLog, PENDING_LOC};
use crate::log::SegmentId;

/// Bytes (headers included) of the records of segment `id` at `offsets`:
/// one sequential read of the segment.
pub(crate) fn live_bytes<V>(
    log: &crate::log::Log,
    id: SegmentId,
    offsets: &BTreeMap<u32, V>,
) -> Result<u64> {
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
            oldest_kept: safe_seq.next(),
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
        oldest_retained: base.next(),
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
                .filter(|m| m.loc != PENDING_LOC && body_at(m.loc).0 == BodyLog::Msg)
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
    let bodies = shared.state.read().body_refs.count(id);
    if bodies > 0 {
        held_by.push(format!(
            "{bodies} bodies of retained messages (moved to msg by compaction once no event \
             holds the segment, or before it is rewritten)"
        ));
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

pub(crate) fn describe(f: &Fence) -> String {
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
