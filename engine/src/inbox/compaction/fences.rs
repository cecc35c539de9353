//! Fences and the reclaim floor (R18, R19).
//!
//! A user's floor is the lowest of its fences: the ACK of each live device,
//! the `resume_from` of each live recovery lease, and the `base_sync_seq`
//! of each live (building or ready) snapshot. Nothing at or above the floor
//! is reclaimed, except past the hard TTL. A device is live while it is not
//! revoked (eviction by the device cap revokes) and was seen within the
//! device TTL; a RESETTING device is fenced by its snapshot, not its ACK.
//! Time only enters through the stamped `now` of the command that decides.

use crate::api::*;
use crate::inbox::config::{ms, InboxConfig};
use crate::inbox::state::User;

/// Every fence of `user` at time `now`, lowest first (ties in a fixed
/// order: devices by id, then leases, then snapshots by id).
pub(crate) fn fences(user: &User, cfg: &InboxConfig, now: TimestampMs) -> Vec<Fence> {
    let ttl = ms(cfg.device_ttl);
    let mut out = Vec::new();
    for d in &user.devices {
        let row = &d.row;
        let live = row.state != DeviceState::Revoked && now.saturating_sub(row.last_seen_ms) <= ttl;
        if !live {
            continue;
        }
        match (row.state, row.lease.as_deref()) {
            (DeviceState::Active, _) => out.push(Fence::DeviceAck {
                device: row.device,
                acked_sync_seq: row.acked_sync_seq,
            }),
            (DeviceState::Recovering, Some(l)) if now <= l.expires_at_ms => {
                out.push(Fence::RecoveryLease {
                    device: row.device,
                    lease_id: l.lease_id,
                    resume_from: l.resume_from,
                })
            }
            // An expired lease or a resetting device: its snapshot (if
            // any) fences, its old ACK does not.
            _ => {}
        }
    }
    for slot in user.snapshots().values() {
        if slot.row.fences_at(now) {
            out.push(Fence::Snapshot {
                snapshot_id: slot.row.snapshot_id,
                base_sync_seq: slot.row.base_sync_seq,
            });
        }
    }
    out.sort_by_key(fence_seq);
    out
}

pub(crate) fn fence_seq(f: &Fence) -> SyncSeq {
    match f {
        Fence::DeviceAck { acked_sync_seq, .. } => *acked_sync_seq,
        Fence::RecoveryLease { resume_from, .. } => *resume_from,
        Fence::Snapshot { base_sync_seq, .. } => *base_sync_seq,
        Fence::SafetyWindow { oldest_kept } => oldest_kept.prev(),
    }
}

/// The floor set by the fences alone: the lowest fence, or the head when
/// nothing fences.
pub(crate) fn fence_floor(user: &User, cfg: &InboxConfig, now: TimestampMs) -> SyncSeq {
    fences(user, cfg, now)
        .first()
        .map_or(user.head(), fence_seq)
}

/// What a trim may reach, given the two time bounds the compactor
/// measured: `safe_seq` is the newest event older than the safety window,
/// `hard_seq` the newest older than the hard TTL. Clamped to what is
/// durable and never below the current base.
pub(crate) fn trim_target(
    user: &User,
    cfg: &InboxConfig,
    now: TimestampMs,
    safe_seq: SyncSeq,
    hard_seq: SyncSeq,
) -> SyncSeq {
    let floor = fence_floor(user, cfg, now);
    floor
        .min(safe_seq)
        .max(hard_seq)
        .min(user.committed_seq)
        .min(user.head())
        .max(user.events_base)
}
