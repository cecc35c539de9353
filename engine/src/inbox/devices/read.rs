//! Device reads: sync pages and the device list (R9, R10).
//!
//! A sync that changes nothing (see [`sync_unchanged`]) is decided here
//! too, by the sequencer's own `decide_sync`, so it never waits behind a
//! round's fsync; one that needs a change still goes through the sequencer.
//!
//! Invariant: a read never reveals a change that is not durable. Events
//! are clamped to the user's committed watermark; device rows are served
//! only once the round that last changed them has settled. A tombstoned
//! message's event never carries its body's summary (R6).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::decide::{self as sync, info, SyncOutcome, SyncPlan};
use super::record::Records;
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::effect::{Effect, COPY_FLAG};
use crate::inbox::messaging::read::corrupt;
use crate::inbox::messaging::record::ReservationEffect;
use crate::inbox::pending::Reply;
use crate::inbox::shared::{blocking, Miss, Shared};
use crate::inbox::state::record::Record;
use crate::inbox::state::{unpack, DeviceRow, MsgMeta, PackedLoc};
use crate::inbox::token::TokenClaims;

/// Decides a sync without the sequencer when it changes nothing: the
/// sequencer's `decide_sync` on the current state yields no effect, the
/// device row it was decided on is durable (its round has settled), and
/// the batch ends at or below the user's committed watermark. The answer
/// is then the one the sequencer would give, only earlier: no command of
/// a later round can have been acknowledged to anyone yet.
///
/// A later page of a batch is answered here too while its device's only
/// changes not yet durable moved its ACK (a page's ACK carried by the next
/// page's sync, [`super::ack_view`]): the page reports the ACK that is
/// durable, and nothing else it shows depends on an ACK.
///
/// The one change such a sync may still want is a `last_seen` refresh
/// (at most once a second per device): the page does not reveal it, so
/// the sync is answered here all the same, and the answer says `true`: log
/// the refresh on its own (`Command::Touch`), without holding the page
/// for its fsync.
///
/// `None` means the sync needs a state change the page depends on
/// (generation bump, lease, reset), depends on a change that is not
/// durable yet, or the engine is poisoned: send it to the sequencer.
pub(crate) fn sync_unchanged(
    shared: &Shared,
    now: TimestampMs,
    req: &SyncRequest,
    options: &SyncOptions,
    claims: Option<&TokenClaims>,
) -> Option<Result<(SyncPlan, bool)>> {
    if shared.poisoned().is_some() {
        return None;
    }
    let (stamp, decided) = {
        let st = shared.state.read();
        let user = st.users.get(&req.uid);
        let device = user.and_then(|u| u.device(req.device));
        let stamp = device.map_or(0, |d| d.stamp);
        let row = device.map(|d| &d.row);
        let decided = match sync::decide_sync(&st, &shared.config, now, req, options, claims) {
            Err(e) => Err(e),
            Ok((effects, SyncOutcome::Page(plan))) => {
                let touch = match effects.as_slice() {
                    [] => false,
                    [Effect::Devices(Records::Device(e))]
                        if row.is_some_and(|r| only_seen(r, &e.row)) =>
                    {
                        true
                    }
                    _ => return None,
                };
                let committed = user.map_or(SyncSeq(0), |u| u.committed_seq);
                if plan.hwm > committed {
                    return None;
                }
                Ok((plan, touch))
            }
            Ok(_) => return None,
        };
        (stamp, decided)
    };
    // Checked after the state lock is released, as the other reads do: the
    // stamp only grows, so a settled stamp means the row decided on is
    // durable.
    match shared.is_settled(stamp) {
        Ok(true) => Some(decided),
        Ok(false) if claims.is_some() => {
            let (durable_acked, base) =
                shared.ack_views.durable_acked(req.uid, req.device, stamp)?;
            if !shared.is_settled(base).ok()? {
                return None;
            }
            // An error would come from the row as it is now; only a page
            // is answered from a row that is not all durable.
            let (mut plan, touch) = decided.ok()?;
            plan.acked = plan.acked.min(durable_acked);
            Some(Ok((plan, touch)))
        }
        Ok(false) | Err(_) => None,
    }
}

/// Whether `after` differs from `before` in `last_seen_ms` alone.
fn only_seen(before: &DeviceRow, after: &DeviceRow) -> bool {
    DeviceRow {
        last_seen_ms: before.last_seen_ms,
        ..after.clone()
    } == *before
}

/// The reply that builds `plan`'s page. A page whose records the page
/// cache holds ([`records_are_cached`]) is built wherever the caller is:
/// reading them costs memory copies, not a disk wait, and a hop to a
/// blocking thread would cost more than the page. Any other page may have
/// to come from the disk: it is built where IO is allowed.
pub(crate) fn page_reply(shared: Arc<Shared>, plan: SyncPlan) -> Reply<SyncPage> {
    let resident = records_are_cached(&shared, &plan);
    let build: Box<dyn FnOnce() -> Result<SyncPage> + Send> =
        Box::new(move || sync_page(&shared, &plan));
    if resident {
        Reply::Resident(build)
    } else {
        Reply::Later(build)
    }
}

/// Whether every event record of `plan` is in the page cache as far as
/// the log can tell: in a recent segment of the `evt` log, or written by
/// this process since the last reclaim a recent look at the kernel's
/// counters saw ([`crate::log::Log::cached_floor`]). Compaction may move a
/// record meanwhile, only ever forward into a newer segment (which it
/// writes, so the record stays cached), so the answer stays true or errs
/// towards IO.
fn records_are_cached(shared: &Shared, plan: &SyncPlan) -> bool {
    let floor = shared.evt_log.cached_floor();
    let st = shared.state.read();
    let Some(user) = st.users.get(&plan.uid) else {
        return false;
    };
    let (Some(lo), Some(hi)) = (
        plan.start.0.checked_sub(user.events_base.0),
        plan.end.0.checked_sub(user.events_base.0),
    ) else {
        return false;
    };
    user.events
        .range(lo as usize, hi as usize)
        .is_some_and(|mut locs| locs.all(|l| unpack(l) >= floor))
}

pub(crate) fn sync_page(shared: &Shared, plan: &SyncPlan) -> Result<SyncPage> {
    // Compaction may move records (rewrite) or drop them (trim) between
    // copying the locations and reading them: then look again, which
    // either finds the moved records or answers RESET_REQUIRED.
    let mut attempt = 0;
    loop {
        attempt += 1;
        match sync_page_once(shared, plan) {
            Err(Error::Log(crate::log::LogError::BadLocation { .. })) if attempt < 3 => continue,
            other => return other,
        }
    }
}

fn sync_page_once(shared: &Shared, plan: &SyncPlan) -> Result<SyncPage> {
    let locs: Vec<PackedLoc> = {
        let st = shared.state.read();
        let user = st.users.get(&plan.uid).ok_or_else(|| {
            Error::Invariant(format!(
                "uid {} vanished while its sync was served",
                plan.uid
            ))
        })?;
        if plan.start < user.events_base {
            return Err(Error::ResetRequired {
                generation: plan.generation,
            });
        }
        let lo = (plan.start.0 - user.events_base.0) as usize;
        let hi = (plan.end.0 - user.events_base.0) as usize;
        let locs = user
            .events
            .range(lo, hi)
            .ok_or_else(|| Error::Invariant("sync range beyond the event index".into()))?
            .collect();
        locs
    };
    // Read in place and decoded as far as the event goes: a message's
    // body, which travels in the same record, is never copied.
    let mut seq = plan.start;
    // Room for every summary at its longest, so the page's summaries share
    // one allocation.
    let mut summaries = BytesMut::with_capacity(locs.len() * SUMMARY_BYTES_MAX);
    let mut events: Result<Vec<SyncEvent>> = Ok(Vec::with_capacity(locs.len()));
    shared.evt_log.read_ahead(locs.iter().map(|l| unpack(*l)));
    shared
        .evt_log
        .read_each(locs.iter().map(|l| unpack(*l)), |kind, payload| {
            seq = seq.plus(1);
            let Ok(page) = &mut events else {
                return;
            };
            match Effect::decode_event_in(kind, payload, seq, &mut summaries) {
                Ok(Some(ev)) => page.push(ev),
                // A `sync_seq` a cut reserved: skipped, the cursor moves on.
                Ok(None) if kind & !COPY_FLAG == ReservationEffect::KIND => {}
                Ok(None) => {
                    events = Err(Error::Invariant(
                        "event index points at a record that is no event".into(),
                    ))
                }
                Err(e) => events = Err(corrupt("evt", &e)),
            }
        })?;
    let mut events = events?;
    if plan.without_summaries {
        for ev in &mut events {
            ev.summary = Bytes::new();
        }
    } else {
        // A tombstoned message's event never carries its body's summary.
        let st = shared.state.read();
        for ev in &mut events {
            if matches!(ev.kind, EventKind::Msg | EventKind::Edit)
                && st
                    .convs
                    .get(&ev.conv)
                    .and_then(|c| c.meta(ev.msg_seq))
                    .is_some_and(MsgMeta::tombstone)
            {
                ev.summary = Bytes::new();
            }
        }
    }
    Ok(SyncPage {
        events,
        next_cursor: plan.end,
        has_more: plan.end < plan.hwm,
        acked_sync_seq: plan.acked,
        batch_hwm: plan.hwm,
        batch_token: plan.token.clone(),
        generation: plan.generation,
        lease: plan.lease,
    })
}

pub(crate) fn devices(shared: &Shared, uid: Uid) -> Result<Vec<DeviceInfo>> {
    blocking(shared, || devices_once(shared, uid))
}

/// One look at `uid`'s devices: memory only, no log record read.
pub(crate) fn devices_once(
    shared: &Shared,
    uid: Uid,
) -> std::result::Result<Vec<DeviceInfo>, Miss> {
    // A sync that came before queued its `last_seen` refresh: show it.
    if shared.touches.pending(uid) {
        return Err(Miss::Unsettled(shared.next_round()));
    }
    let st = shared.state.read();
    let Some(user) = st.users.get(&uid) else {
        return Ok(Vec::new());
    };
    let stamp = user.devices.iter().map(|d| d.stamp).max().unwrap_or(0);
    let out: Vec<DeviceInfo> = user.devices.iter().map(|d| info(&d.row)).collect();
    drop(st);
    shared.check_settled(stamp)?;
    Ok(out)
}
