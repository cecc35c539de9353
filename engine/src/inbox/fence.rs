//! Fences and the reclaim floor (R18, R19): the state compaction and the
//! snapshot protocol add to the inbox, and the records that change it.
//!
//! A user's floor is the lowest of its fences: the ACK of each live device,
//! the `resume_from` of each live recovery lease, and the `base_sync_seq`
//! of each live (building or ready) snapshot. Nothing at or above the floor
//! is reclaimed, except past the hard TTL. A device is live while it is not
//! revoked (eviction by the device cap revokes) and was seen within the
//! device TTL; a RESETTING device is fenced by its snapshot, not its ACK.
//!
//! Invariants:
//! - every change here is an effect in the `evt` log, applied by
//!   [`State::apply`], so replay rebuilds it; time only enters through
//!   the stamped `now` of the command that decided the effect;
//! - `events_base` only grows ([`Effect::Trim`] below the base is a no-op),
//!   so a reclaimed event never comes back after a restart; likewise a
//!   conversation's `msgs_base` ([`Effect::TrimMsgs`]);
//! - a relocation moves an event only if it still points at the record
//!   that was copied.
//!
//! ## Records (log record kinds, little-endian, after the format byte)
//! - `EFFECT_SNAPSHOT` (5): uid u64, snapshot_id u64, device u64,
//!   generation u64, base_sync_seq u64, created_at_ms u64, expires_at_ms
//!   u64, phase u8 (0 live, 1 installed, 2 dropped).
//! - `EFFECT_TRIM` (6): uid u64, events_base u64.
//! - `EFFECT_TRIM_MSGS` (8): conv u64, msgs_base u64 (history retention:
//!   the conversation's messages at or below `msgs_base` are reclaimed).
//! - `EFFECT_RELOCATE` (7): count u32, then per move: uid u64, sync_seq
//!   u64, from u64 (packed location), to u64.
//! - a copy: the original record's kind with bit 7 set, and its payload
//!   unchanged.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::codec::{DecodeError, DecodeResult, Reader, Writer};
use super::command::{
    Effect, PackedLoc, EFFECT_RELOCATE, EFFECT_SNAPSHOT, EFFECT_TRIM, EFFECT_TRIM_MSGS,
};
use super::state::{ApplyError, State, User};
use super::InboxConfig;
use crate::api::*;

/// Where a snapshot is in its life, as logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SnapshotPhase {
    /// Building or ready (ready once its content file is written).
    Live,
    /// Acknowledged by its device: no longer fences.
    Installed,
    /// Superseded or expired and forgotten.
    Dropped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotRow {
    pub snapshot_id: u64,
    pub device: DeviceId,
    pub generation: Generation,
    pub base_sync_seq: SyncSeq,
    pub created_at_ms: TimestampMs,
    pub expires_at_ms: TimestampMs,
    pub phase: SnapshotPhase,
}

impl SnapshotRow {
    /// Fences while live and not expired.
    pub fn fences_at(&self, now: TimestampMs) -> bool {
        self.phase == SnapshotPhase::Live && now <= self.expires_at_ms
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotSlot {
    pub row: SnapshotRow,
    /// Round of the last change (not state, see [`super::state`]).
    pub stamp: u64,
}

/// One event moved to a copy of its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Relocation {
    pub uid: Uid,
    pub sync_seq: SyncSeq,
    pub from: PackedLoc,
    pub to: PackedLoc,
}

/// Upper bound on moves in one relocate record, so that one command never
/// holds the sequencer for long.
pub(crate) const RELOCATIONS_PER_RECORD_MAX: usize = 4096;

fn phase_code(p: SnapshotPhase) -> u8 {
    match p {
        SnapshotPhase::Live => 0,
        SnapshotPhase::Installed => 1,
        SnapshotPhase::Dropped => 2,
    }
}

fn phase_from_code(c: u8) -> DecodeResult<SnapshotPhase> {
    Ok(match c {
        0 => SnapshotPhase::Live,
        1 => SnapshotPhase::Installed,
        2 => SnapshotPhase::Dropped,
        _ => return Err(DecodeError("unknown snapshot phase")),
    })
}

fn put_snapshot_row(w: &mut Writer, row: &SnapshotRow) {
    w.u64(row.snapshot_id);
    w.u64(row.device);
    w.u64(row.generation);
    w.u64(row.base_sync_seq);
    w.u64(row.created_at_ms);
    w.u64(row.expires_at_ms);
    w.u8(phase_code(row.phase));
}

fn get_snapshot_row(r: &mut Reader<'_>) -> DecodeResult<SnapshotRow> {
    Ok(SnapshotRow {
        snapshot_id: r.u64()?,
        device: r.u64()?,
        generation: r.u64()?,
        base_sync_seq: r.u64()?,
        created_at_ms: r.u64()?,
        expires_at_ms: r.u64()?,
        phase: phase_from_code(r.u8()?)?,
    })
}

/// Encodes the body of the effects this module owns (after the format
/// byte, which [`Effect::encode`] wrote).
pub(crate) fn encode_effect(w: &mut Writer, e: &Effect) {
    match e {
        Effect::Snapshot { uid, row } => {
            w.u64(*uid);
            put_snapshot_row(w, row);
        }
        Effect::Trim { uid, events_base } => {
            w.u64(*uid);
            w.u64(*events_base);
        }
        Effect::TrimMsgs { conv, msgs_base } => {
            w.u64(*conv);
            w.u64(*msgs_base);
        }
        Effect::Relocate(moves) => {
            w.u32(u32::try_from(moves.len()).unwrap_or(u32::MAX));
            for m in moves {
                w.u64(m.uid);
                w.u64(m.sync_seq);
                w.u64(m.from);
                w.u64(m.to);
            }
        }
        _ => {}
    }
}

pub(crate) fn decode_effect(kind: u8, r: &mut Reader<'_>) -> DecodeResult<Effect> {
    Ok(match kind {
        EFFECT_SNAPSHOT => Effect::Snapshot {
            uid: r.u64()?,
            row: get_snapshot_row(r)?,
        },
        EFFECT_TRIM => Effect::Trim {
            uid: r.u64()?,
            events_base: r.u64()?,
        },
        EFFECT_TRIM_MSGS => Effect::TrimMsgs {
            conv: r.u64()?,
            msgs_base: r.u64()?,
        },
        EFFECT_RELOCATE => {
            let n = r.u32()? as usize;
            if n > RELOCATIONS_PER_RECORD_MAX {
                return Err(DecodeError("too many relocations in one record"));
            }
            let mut moves = Vec::with_capacity(n);
            for _ in 0..n {
                moves.push(Relocation {
                    uid: r.u64()?,
                    sync_seq: r.u64()?,
                    from: r.u64()?,
                    to: r.u64()?,
                });
            }
            Effect::Relocate(moves)
        }
        _ => return Err(DecodeError("unknown effect record kind")),
    })
}

impl State {
    pub(crate) fn apply_snapshot(&mut self, uid: Uid, row: &SnapshotRow, stamp: u64) {
        let user = Arc::make_mut(self.users.entry(uid).or_default());
        user.next_snapshot_id = user.next_snapshot_id.max(row.snapshot_id + 1);
        if row.phase == SnapshotPhase::Dropped {
            user.snapshots.remove(&row.snapshot_id);
        } else {
            user.snapshots
                .insert(row.snapshot_id, SnapshotSlot { row: *row, stamp });
        }
    }

    pub(crate) fn apply_trim(&mut self, uid: Uid, events_base: SyncSeq) -> Result<(), ApplyError> {
        let user = self
            .users
            .get_mut(&uid)
            .map(Arc::make_mut)
            .ok_or_else(|| ApplyError(format!("trim of unknown user {uid}")))?;
        if events_base <= user.events_base {
            return Ok(());
        }
        if events_base > user.head() {
            return Err(ApplyError(format!(
                "trim of uid {uid} to {events_base} is beyond its head {}",
                user.head()
            )));
        }
        let n = usize::try_from(events_base - user.events_base)
            .map_err(|_| ApplyError("trim length overflows".into()))?;
        for loc in user.events.drain(..n) {
            self.evt_refs.remove(loc);
        }
        user.events.shrink_to(user.events.len() * 2);
        user.events_base = events_base;
        Ok(())
    }

    /// Reclaims a conversation's messages at or below `msgs_base` (history
    /// retention). Each member's `unread` drops by the reclaimed messages
    /// that still counted for it, so `unread` keeps counting exactly the
    /// retained unread messages; read cursors do not move.
    pub(crate) fn apply_trim_msgs(
        &mut self,
        conv: ConvId,
        msgs_base: MsgSeq,
        stamp: u64,
    ) -> Result<(), ApplyError> {
        let (old_base, head, members) = {
            let c = self
                .convs
                .get(&conv)
                .ok_or_else(|| ApplyError(format!("message trim of unknown conv {conv}")))?;
            (
                c.msgs_base,
                c.head(),
                c.members.keys().copied().collect::<Vec<_>>(),
            )
        };
        if msgs_base <= old_base {
            return Ok(());
        }
        if msgs_base > head {
            return Err(ApplyError(format!(
                "message trim of conv {conv} to {msgs_base} is beyond its head {head}"
            )));
        }
        for uid in members {
            let gone = self.countable_between(uid, conv, msgs_base);
            if gone == 0 {
                continue;
            }
            if let Some(uc) = self
                .users
                .get_mut(&uid)
                .map(Arc::make_mut)
                .and_then(|u| u.convs.get_mut(&conv))
            {
                uc.unread = uc.unread.saturating_sub(gone);
                uc.stamp = stamp;
            }
        }
        let c = self
            .convs
            .get_mut(&conv)
            .map(Arc::make_mut)
            .ok_or_else(|| ApplyError("conv vanished".into()))?;
        let n = usize::try_from(msgs_base - old_base)
            .map_err(|_| ApplyError("message trim length overflows".into()))?;
        for m in c.msgs.drain(..n) {
            self.msg_refs.remove(m.loc);
        }
        c.msgs.shrink_to(c.msgs.len() * 2);
        c.msgs_base = msgs_base;
        Ok(())
    }

    pub(crate) fn apply_relocate(&mut self, moves: &[Relocation]) {
        for m in moves {
            let Some(user) = self.users.get_mut(&m.uid).map(Arc::make_mut) else {
                continue;
            };
            if m.sync_seq <= user.events_base {
                continue;
            }
            let i = (m.sync_seq - user.events_base - 1) as usize;
            if let Some(slot) = user.events.get_mut(i) {
                if *slot == m.from {
                    self.evt_refs.replace(m.from, m.to);
                    *slot = m.to;
                }
            }
        }
    }
}

/// Appends the snapshot tables to a checkpoint body. Users without any
/// snapshot history are left out.
pub(crate) fn encode_checkpoint_section(w: &mut Writer, st: &State) {
    let mut users: Vec<(&Uid, &Arc<User>)> = st
        .users
        .iter()
        .filter(|(_, u)| u.next_snapshot_id != 0 || !u.snapshots.is_empty())
        .collect();
    users.sort_unstable_by_key(|(uid, _)| **uid);
    w.u64(users.len() as u64);
    for (uid, u) in users {
        w.u64(*uid);
        w.u64(u.next_snapshot_id);
        w.u64(u.snapshots.len() as u64);
        for slot in u.snapshots.values() {
            put_snapshot_row(w, &slot.row);
        }
    }
}

pub(crate) fn decode_checkpoint_section(r: &mut Reader<'_>, st: &mut State) -> DecodeResult<()> {
    for _ in 0..r.count(24)? {
        let uid = r.u64()?;
        let next = r.u64()?;
        let mut snapshots = BTreeMap::new();
        for _ in 0..r.count(49)? {
            let row = get_snapshot_row(r)?;
            snapshots.insert(row.snapshot_id, SnapshotSlot { row, stamp: 0 });
        }
        let user = Arc::make_mut(st.users.entry(uid).or_default());
        user.next_snapshot_id = next;
        user.snapshots = snapshots;
    }
    Ok(())
}

pub(crate) fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

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
        match (row.state, row.lease) {
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
    for slot in user.snapshots.values() {
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
        Fence::SafetyWindow { oldest_kept } => oldest_kept.saturating_sub(1),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::state::SegRefs;

    #[test]
    fn compaction_and_snapshot_records_round_trip_and_reject_every_prefix() {
        let effects = [
            Effect::Snapshot {
                uid: 9,
                row: SnapshotRow {
                    snapshot_id: 3,
                    device: 2,
                    generation: 7,
                    base_sync_seq: 120,
                    created_at_ms: 1_000,
                    expires_at_ms: 2_000,
                    phase: SnapshotPhase::Installed,
                },
            },
            Effect::Trim {
                uid: 9,
                events_base: 77,
            },
            Effect::TrimMsgs {
                conv: 4,
                msgs_base: 31,
            },
            Effect::Relocate(vec![Relocation {
                uid: 9,
                sync_seq: 80,
                from: 1 << 32 | 64,
                to: 5 << 32 | 128,
            }]),
            Effect::Copied(Box::new(Effect::Read {
                uid: 1,
                conv: 2,
                read_seq: 3,
                at_ms: 4,
            })),
        ];
        crate::inbox::command::tests::assert_round_trips(&effects);
    }

    #[test]
    fn trim_never_moves_the_base_down_and_relocate_skips_moved_events() {
        let mut st = State::new(0);
        let user = Arc::make_mut(st.users.entry(1).or_default());
        user.events = vec![10, 11, 12, 13];
        st.evt_refs = SegRefs::rebuild(&st.users[&1].events);
        st.apply_trim(1, 2).unwrap();
        assert_eq!(st.users[&1].events_base, 2);
        assert_eq!(st.users[&1].events, vec![12, 13]);
        st.apply_trim(1, 1).unwrap();
        assert_eq!(st.users[&1].events_base, 2, "a lower trim is a no-op");
        assert!(st.apply_trim(1, 9).is_err(), "beyond the head");
        st.apply_relocate(&[
            Relocation {
                uid: 1,
                sync_seq: 3,
                from: 12,
                to: 99,
            },
            Relocation {
                uid: 1,
                sync_seq: 4,
                from: 55,
                to: 98,
            },
            Relocation {
                uid: 1,
                sync_seq: 1,
                from: 10,
                to: 97,
            },
        ]);
        assert_eq!(st.users[&1].events, vec![99, 13]);
        st.check_seg_refs().unwrap();
    }
}
