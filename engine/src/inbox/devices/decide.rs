//! Device registry, sync batches, ACKs and recovery leases (R9, R10, R11,
//! R17): the decisions the sequencer makes for them.
//!
//! Each `decide_*` function reads the state and returns the effects to log
//! (full device rows) and the answer; it changes nothing itself. The rules:
//! - Sync resumes from the server ACK when the generation matches and the
//!   device's local position is not below it. Otherwise the generation is
//!   bumped, which kills every older token and late ACK, and the device
//!   gets a recovery lease (frozen `resume_from`/`hwm`, RECOVERING, expiry)
//!   when the gap is small and the events are retained, or
//!   `RESET_REQUIRED` (RESETTING) when not. A resume point below the oldest
//!   retained event is always `RESET_REQUIRED`, never an empty page.
//! - The batch high watermark is fixed on the first page and carried in the
//!   token; later pages are served from the token, not from the device row.
//! - ACKs move forward only and never past the token's hwm.

use bytes::Bytes;

use super::record::DeviceEffect;
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::config::InboxConfig;
use crate::inbox::effect::Effect;
use crate::inbox::state::{DeviceRow, State};
use crate::inbox::token::{self, TokenClaims};

/// A sync that only refreshes `last_seen` logs it at most this often, so
/// that a busy device's syncs stay free of writes.
pub(crate) const LAST_SEEN_GRANULARITY_MS: u64 = 1_000;

/// What a sync page will hold, decided by the sequencer; the events are
/// read after the round is durable, outside the sequencer.
#[derive(Clone, Debug)]
pub(crate) struct SyncPlan {
    pub uid: Uid,
    /// Exclusive.
    pub start: SyncSeq,
    /// Inclusive.
    pub end: SyncSeq,
    pub hwm: SyncSeq,
    pub acked: SyncSeq,
    pub generation: Generation,
    pub token: Bytes,
    pub lease: Option<LeaseInfo>,
    /// Serve the events without their summaries.
    pub without_summaries: bool,
}

pub(crate) enum SyncOutcome {
    Page(SyncPlan),
    Reset(Generation),
}

pub(crate) fn info(row: &DeviceRow) -> DeviceInfo {
    DeviceInfo {
        device: row.device,
        generation: row.generation,
        acked_sync_seq: row.acked_sync_seq,
        state: row.state,
        last_seen_ms: row.last_seen_ms,
    }
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn device_row(st: &State, uid: Uid, device: DeviceId) -> Result<DeviceRow> {
    st.users
        .get(&uid)
        .and_then(|u| u.device(device))
        .map(|d| d.row.clone())
        .ok_or_else(|| Error::NotFound(format!("device {device} of uid {uid} is not registered")))
}

/// A registered device's row, refused when it is revoked or when the
/// caller holds another generation (ACK, finishing a lease, finishing a
/// snapshot install).
pub(crate) fn device_row_at(
    st: &State,
    uid: Uid,
    device: DeviceId,
    generation: Generation,
) -> Result<DeviceRow> {
    let row = device_row(st, uid, device)?;
    if row.state == DeviceState::Revoked {
        return Err(Error::DeviceRevoked);
    }
    if row.generation != generation {
        return Err(Error::StaleGeneration {
            current: row.generation,
        });
    }
    Ok(row)
}

pub(crate) fn decide_register(
    st: &State,
    cfg: &InboxConfig,
    now: TimestampMs,
    uid: Uid,
    device: DeviceId,
) -> (Vec<Effect>, RegisterReply) {
    let user = st.users.get(&uid);
    let existing = user.and_then(|u| u.device(device)).map(|d| &d.row);
    if let Some(row) = existing.filter(|r| r.state != DeviceState::Revoked) {
        let row = DeviceRow {
            last_seen_ms: now.max(row.last_seen_ms),
            ..row.clone()
        };
        let device = info(&row);
        return (
            vec![Effect::from(DeviceEffect { uid, row })],
            RegisterReply {
                device,
                evicted: None,
            },
        );
    }
    let mut effects = Vec::new();
    let mut evicted = None;
    if let Some(user) = user {
        let live: Vec<&DeviceRow> = user
            .devices
            .iter()
            .map(|d| &d.row)
            .filter(|r| r.state != DeviceState::Revoked && r.device != device)
            .collect();
        if live.len() >= cfg.devices_per_user_max.max(1) as usize {
            // Least recently seen goes; ties go to the lowest device id.
            if let Some(victim) = live.iter().min_by_key(|r| (r.last_seen_ms, r.device)) {
                let row = DeviceRow {
                    state: DeviceState::Revoked,
                    lease: None,
                    ..**victim
                };
                evicted = Some(row.device);
                effects.push(Effect::from(DeviceEffect { uid, row }));
            }
        }
    }
    let row = DeviceRow {
        device,
        generation: existing.map_or(Generation(1), |r| r.generation.next()),
        acked_sync_seq: SyncSeq(0),
        state: DeviceState::Active,
        last_seen_ms: now,
        lease: None,
    };
    let device = info(&row);
    effects.push(Effect::from(DeviceEffect { uid, row }));
    (effects, RegisterReply { device, evicted })
}

pub(crate) fn decide_revoke(
    st: &State,
    uid: Uid,
    device: DeviceId,
) -> Result<(Vec<Effect>, DeviceInfo)> {
    let row = device_row(st, uid, device)?;
    if row.state == DeviceState::Revoked {
        return Ok((Vec::new(), info(&row)));
    }
    let row = DeviceRow {
        state: DeviceState::Revoked,
        lease: None,
        ..row
    };
    let device = info(&row);
    Ok((vec![Effect::from(DeviceEffect { uid, row })], device))
}

pub(crate) fn decide_sync(
    st: &State,
    cfg: &InboxConfig,
    now: TimestampMs,
    req: &SyncRequest,
    options: &SyncOptions,
    claims: Option<&TokenClaims>,
) -> Result<(Vec<Effect>, SyncOutcome)> {
    if options.max_replay == Some(0) {
        return Err(Error::BadRequest(
            "sync max_replay 0 is refused: a replay limit is at least 1 (leave it out for no limit)"
                .into(),
        ));
    }
    // Starting a batch whose backlog is over the device's own limit: a
    // snapshot instead (the same reset as any other).
    let over_limit = |resume_from: SyncSeq, hwm: SyncSeq| {
        options
            .max_replay
            .is_some_and(|m| hwm.0.saturating_sub(resume_from.0) > m)
    };
    let limit = if req.limit == 0 {
        cfg.sync_page_default
    } else {
        req.limit
    };
    if limit > cfg.sync_page_max {
        return Err(Error::BadRequest(format!(
            "sync limit {limit} is above the cap of {}",
            cfg.sync_page_max
        )));
    }
    let uid = req.uid;
    let row = device_row(st, uid, req.device)?;
    let user = st
        .users
        .get(&uid)
        .ok_or_else(|| Error::Invariant(format!("uid {uid} has a device row but no user")))?;
    let base = user.events_base;
    let committed = user.committed_seq;
    if row.state == DeviceState::Revoked {
        return Err(Error::DeviceRevoked);
    }
    let reset = |row: DeviceRow| {
        let row = DeviceRow {
            generation: row.generation.next(),
            state: DeviceState::Resetting,
            lease: None,
            last_seen_ms: now.max(row.last_seen_ms),
            ..row
        };
        (
            vec![Effect::from(DeviceEffect {
                uid,
                row: row.clone(),
            })],
            SyncOutcome::Reset(row.generation),
        )
    };
    let page =
        |resume_from: SyncSeq, start: SyncSeq, hwm: SyncSeq, token: Bytes, row: &DeviceRow| {
            let start = start.clamp(resume_from, hwm);
            SyncOutcome::Page(SyncPlan {
                uid,
                start,
                end: hwm.min(SyncSeq(start.0.saturating_add(u64::from(limit)))),
                hwm,
                acked: row.acked_sync_seq,
                generation: row.generation,
                token,
                lease: row.lease.as_deref().copied(),
                without_summaries: options.without_summaries,
            })
        };
    let sign = |generation, resume_from, hwm, expires_at_ms| {
        token::sign(
            &cfg.token_key,
            &TokenClaims {
                uid,
                device: req.device,
                generation,
                resume_from,
                hwm,
                expires_at_ms,
            },
        )
    };

    // A later page of a batch: everything comes from the token.
    if let Some(c) = claims {
        if c.uid != uid || c.device != req.device {
            return Err(Error::BadToken);
        }
        if c.generation != row.generation || req.generation != Some(row.generation) {
            return Err(Error::StaleGeneration {
                current: row.generation,
            });
        }
        if row.state == DeviceState::Resetting {
            return Err(Error::ResetRequired {
                generation: row.generation,
            });
        }
        if c.resume_from < base {
            return Ok(reset(row));
        }
        let token = req.batch_token.clone().unwrap_or_default();
        return Ok((
            Vec::new(),
            page(c.resume_from, req.local_applied_seq, c.hwm, token, &row),
        ));
    }

    if row.state == DeviceState::Resetting {
        return Err(Error::ResetRequired {
            generation: row.generation,
        });
    }
    if let (DeviceState::Recovering, Some(lease)) = (row.state, row.lease.as_deref().copied()) {
        if now > lease.expires_at_ms
            || lease.resume_from < base
            || over_limit(lease.resume_from, lease.hwm)
        {
            // An expired lease no longer fences its events: only a
            // snapshot can bring the device back without a gap.
            return Ok(reset(row));
        }
        // A device that lost data again, below where its lease resumes,
        // falls through to a rollback like any other (R10).
        if req.generation == Some(row.generation) && req.local_applied_seq >= lease.resume_from {
            let token = sign(
                row.generation,
                lease.resume_from,
                lease.hwm,
                lease.expires_at_ms,
            );
            return Ok((
                Vec::new(),
                page(lease.resume_from, lease.resume_from, lease.hwm, token, &row),
            ));
        }
    }
    if row.state == DeviceState::Active
        && req.generation == Some(row.generation)
        && req.local_applied_seq >= row.acked_sync_seq
    {
        let resume_from = row.acked_sync_seq;
        if resume_from < base || over_limit(resume_from, committed) {
            return Ok(reset(row));
        }
        let mut effects = Vec::new();
        let mut row = row;
        if now >= row.last_seen_ms.saturating_add(LAST_SEEN_GRANULARITY_MS) {
            row.last_seen_ms = now;
            effects.push(Effect::from(DeviceEffect {
                uid,
                row: row.clone(),
            }));
        }
        let token = sign(
            row.generation,
            resume_from,
            committed,
            now.saturating_add(ms(cfg.batch_token_ttl)),
        );
        return Ok((
            effects,
            page(resume_from, resume_from, committed, token, &row),
        ));
    }

    // Local state below the server ACK, or a missing / mismatched
    // generation: bump the generation, then lease or reset (R10).
    let from = req.local_applied_seq.min(row.acked_sync_seq);
    let gap = row.acked_sync_seq.0 - from.0;
    if gap > cfg.recovery_lease_events_max || from < base || over_limit(from, committed) {
        return Ok(reset(row));
    }
    let lease = LeaseInfo {
        lease_id: user.next_lease_id().max(1),
        resume_from: from,
        hwm: committed,
        expires_at_ms: now.saturating_add(ms(cfg.recovery_lease_ttl)),
    };
    let row = DeviceRow {
        generation: row.generation.next(),
        state: DeviceState::Recovering,
        lease: Some(Box::new(lease)),
        last_seen_ms: now.max(row.last_seen_ms),
        ..row
    };
    let token = sign(
        row.generation,
        lease.resume_from,
        lease.hwm,
        lease.expires_at_ms,
    );
    Ok((
        vec![Effect::from(DeviceEffect {
            uid,
            row: row.clone(),
        })],
        page(lease.resume_from, lease.resume_from, lease.hwm, token, &row),
    ))
}

pub(crate) fn decide_ack(
    st: &State,
    now: TimestampMs,
    req: &AckRequest,
    claims: &TokenClaims,
) -> Result<(Vec<Effect>, AckReply)> {
    let row = device_row_at(st, req.uid, req.device, req.generation)?;
    if row.state == DeviceState::Resetting {
        return Err(Error::DeviceResetting);
    }
    if claims.uid != req.uid || claims.device != req.device || claims.generation != req.generation {
        return Err(Error::BadToken);
    }
    if req.seq > claims.hwm {
        return Err(Error::AckBeyondHwm {
            seq: req.seq,
            batch_hwm: claims.hwm,
        });
    }
    if req.seq <= row.acked_sync_seq {
        return Ok((
            Vec::new(),
            AckReply {
                acked_sync_seq: row.acked_sync_seq,
            },
        ));
    }
    let row = DeviceRow {
        acked_sync_seq: req.seq,
        last_seen_ms: now.max(row.last_seen_ms),
        ..row
    };
    Ok((
        vec![Effect::from(DeviceEffect { uid: req.uid, row })],
        AckReply {
            acked_sync_seq: req.seq,
        },
    ))
}

pub(crate) fn decide_finish_lease(
    st: &State,
    now: TimestampMs,
    uid: Uid,
    device: DeviceId,
    lease_id: u64,
    generation: Generation,
) -> Result<(Vec<Effect>, DeviceInfo)> {
    let row = device_row_at(st, uid, device, generation)?;
    let lease = match (row.state, row.lease) {
        (DeviceState::Recovering, Some(l)) if l.lease_id == lease_id => l,
        _ => {
            return Err(Error::Conflict(format!(
                "lease {lease_id} is not the device's current lease"
            )))
        }
    };
    if now > lease.expires_at_ms {
        return Err(Error::Conflict(format!("lease {lease_id} has expired")));
    }
    let row = DeviceRow {
        state: DeviceState::Active,
        lease: None,
        last_seen_ms: now.max(row.last_seen_ms),
        ..row
    };
    let device = info(&row);
    Ok((vec![Effect::from(DeviceEffect { uid, row })], device))
}

/// Records that a device was seen at `now`: the `last_seen` refresh of a
/// sync answered without the sequencer (see `read::sync_unchanged`), logged
/// on its own. Changes nothing when the row moved on meanwhile (another
/// generation, revoked) or was refreshed within the granularity: a stale
/// refresh is dropped, never applied over a newer row.
pub(crate) fn decide_touch(
    st: &State,
    now: TimestampMs,
    uid: Uid,
    device: DeviceId,
    generation: Generation,
) -> Result<(Vec<Effect>, ())> {
    let row = device_row(st, uid, device)?;
    if row.generation != generation
        || row.state == DeviceState::Revoked
        || now < row.last_seen_ms.saturating_add(LAST_SEEN_GRANULARITY_MS)
    {
        return Ok((Vec::new(), ()));
    }
    let row = DeviceRow {
        last_seen_ms: now,
        ..row
    };
    Ok((vec![Effect::from(DeviceEffect { uid, row })], ()))
}
