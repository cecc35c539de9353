//! The snapshot steps the sequencer decides (R18): begin (bump the
//! generation, RESETTING, freeze S, capture the plan) and acknowledge
//! (ACTIVE at `acked = S`).

use super::build::Plan;
use super::record::SnapshotEffect;
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::config::ms;
use crate::inbox::config::InboxConfig;
use crate::inbox::devices::decide::{device_row, device_row_at, info};
use crate::inbox::devices::record::DeviceEffect;
use crate::inbox::effect::Effect;
use crate::inbox::shared::Shared;
use crate::inbox::state::{DeviceRow, MsgMeta, SnapshotPhase, SnapshotRow, State};

/// The begin step: effects to log and the plan, captured from `st` at S.
pub(crate) fn decide_begin(
    st: &State,
    cfg: &InboxConfig,
    now: TimestampMs,
    uid: Uid,
    device: DeviceId,
) -> Result<(Vec<Effect>, Plan)> {
    let row = device_row(st, uid, device)?;
    if row.state == DeviceState::Revoked {
        return Err(Error::DeviceRevoked);
    }
    let user = st
        .users
        .get(&uid)
        .ok_or_else(|| Error::Invariant(format!("uid {uid} has a device row but no user")))?;
    let base_sync_seq = user.head();
    let snapshot_id = user.next_snapshot_id().max(1);
    let row = DeviceRow {
        generation: row.generation.next(),
        state: DeviceState::Resetting,
        lease: None,
        last_seen_ms: now.max(row.last_seen_ms),
        ..row
    };
    let mut effects = vec![Effect::from(DeviceEffect {
        uid,
        row: row.clone(),
    })];
    // An earlier snapshot of this device is superseded: its generation is
    // dead, so it can never be acknowledged.
    for slot in user.snapshots().values() {
        if slot.row.device == device && slot.row.phase == SnapshotPhase::Live {
            effects.push(Effect::from(SnapshotEffect {
                uid,
                row: SnapshotRow {
                    phase: SnapshotPhase::Dropped,
                    ..slot.row
                },
            }));
        }
    }
    effects.push(Effect::from(SnapshotEffect {
        uid,
        row: SnapshotRow {
            snapshot_id,
            device,
            generation: row.generation,
            base_sync_seq,
            created_at_ms: now,
            expires_at_ms: now.saturating_add(ms(cfg.snapshot_ttl)),
            phase: SnapshotPhase::Live,
        },
    }));

    let n = cfg.snapshot_messages_per_conv as usize;
    let mut convs = Vec::with_capacity(user.convs.len());
    let mut messages = Vec::with_capacity(user.convs.len());
    for key in user.order.iter().rev() {
        let conv = key.2;
        let Some(uc) = user.convs.get(&conv) else {
            continue;
        };
        let c = st.convs.get(&conv);
        // A large group's row carries its head, not the member's last
        // fanned-out entry (R7).
        if let Some((row, _)) =
            c.and_then(|c| crate::inbox::messaging::large::row_at(c, uid, conv, uc, c.head()))
        {
            convs.push(row);
        } else {
            let last_tomb = c
                .and_then(|c| c.meta(uc.last_msg_seq))
                .is_some_and(MsgMeta::hides_summary);
            convs.push(uc.summary(conv, last_tomb));
        }
        let mut last = Vec::new();
        if let Some(c) = c {
            let head = c.head();
            if let Some(periods) = c.members.get(&uid) {
                'periods: for p in periods.iter().rev() {
                    let hi = p.leave_seq.min(head);
                    let mut seq = hi;
                    while seq >= p.join_seq && seq > MsgSeq(0) {
                        if last.len() == n {
                            break 'periods;
                        }
                        if let Some(m) = c.meta(seq) {
                            last.push((seq, m));
                        }
                        seq = seq.prev();
                    }
                }
            }
        }
        last.reverse();
        messages.push(last);
    }
    Ok((
        effects,
        Plan {
            uid,
            snapshot_id,
            generation: row.generation,
            base_sync_seq,
            convs,
            messages,
        },
    ))
}

/// `ack_snapshot`: the device becomes ACTIVE at `acked = S`, only in the
/// snapshot's generation and while RESETTING.
pub(crate) fn decide_ack(
    shared: &Shared,
    st: &State,
    now: TimestampMs,
    uid: Uid,
    device: DeviceId,
    id: u64,
    generation: Generation,
) -> Result<(Vec<Effect>, DeviceInfo)> {
    let row = device_row_at(st, uid, device, generation)?;
    if row.state != DeviceState::Resetting {
        return Err(Error::Conflict(format!(
            "device {device} is not resetting; nothing to acknowledge"
        )));
    }
    let user = st.users.get(&uid);
    let snap = match user.and_then(|u| u.snapshots().get(&id)) {
        Some(slot) => slot.row,
        // Issued, then superseded by a later BEGIN_SNAPSHOT of its device
        // or dropped after it expired: a lost compare-and-set, like a
        // snapshot of another generation.
        None if id != 0 && user.is_some_and(|u| id < u.next_snapshot_id()) => {
            return Err(Error::Conflict(format!(
                "snapshot {id} was superseded or has expired; begin a new one"
            )))
        }
        None => return Err(Error::NotFound(format!("snapshot {id} of uid {uid}"))),
    };
    if snap.device != device || snap.generation != generation {
        return Err(Error::Conflict(format!(
            "snapshot {id} belongs to another device or generation"
        )));
    }
    if snap.phase != SnapshotPhase::Live {
        return Err(Error::Conflict(format!("snapshot {id} is not live")));
    }
    if now > snap.expires_at_ms {
        return Err(Error::Conflict(format!(
            "snapshot {id} has expired; begin a new one"
        )));
    }
    if !shared.snapshots.is_ready(&shared.config.data_dir, uid, id) {
        return Err(Error::Conflict(format!("snapshot {id} is still building")));
    }
    let row = DeviceRow {
        state: DeviceState::Active,
        acked_sync_seq: snap.base_sync_seq,
        lease: None,
        last_seen_ms: now.max(row.last_seen_ms),
        ..row
    };
    let device = info(&row);
    Ok((
        vec![
            Effect::from(DeviceEffect { uid, row }),
            Effect::from(SnapshotEffect {
                uid,
                row: SnapshotRow {
                    phase: SnapshotPhase::Installed,
                    ..snap
                },
            }),
        ],
        device,
    ))
}
