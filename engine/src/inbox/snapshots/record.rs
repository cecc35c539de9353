//! The snapshot record: a snapshot row after a change (R18). Replay
//! upserts it, or forgets the snapshot when the row says dropped.
//!
//! ## `evt` record (kind 5, after the format byte, little-endian)
//! ```text
//! uid u64, snapshot_id u64, device u64, generation u64,
//! base_sync_seq u64, created_at_ms u64, expires_at_ms u64,
//! phase u8 (0 live, 1 installed, 2 dropped)
//! ```
//!
//! ## Checkpoint section
//! Users with any snapshot history, by uid: count u64, then per user: uid
//! u64, next_snapshot_id u64, count u64, then the rows (from snapshot_id
//! on, 49 bytes each).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::*;
use crate::inbox::codec::{DecodeError, DecodeResult, Reader, Writer};
use crate::inbox::state::record::{record_set, ApplyAt, ApplyError, Record};
use crate::inbox::state::{SnapshotPhase, SnapshotRow, SnapshotSlot, State, User};

record_set! {
    /// The `evt` records the snapshots subsystem owns.
    pub(crate) enum Records in Effect::Snapshots {
        Snapshot(SnapshotEffect),
    }
}

/// A snapshot row after a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotEffect {
    pub uid: Uid,
    pub row: SnapshotRow,
}

impl Record for SnapshotEffect {
    const KIND: u8 = 5;
    const NAME: &'static str = "snapshot";
    const MAY_APPEND_EVENTS: bool = false;

    fn encode_body(&self, w: &mut Writer) {
        w.u64(self.uid);
        put_snapshot_row(w, &self.row);
    }

    fn decode_body(r: &mut Reader<'_>) -> DecodeResult<Self> {
        Ok(SnapshotEffect {
            uid: r.id()?,
            row: get_snapshot_row(r)?,
        })
    }

    fn describe(&self) -> String {
        let r = &self.row;
        format!(
            "uid {} snapshot_id {} device {} generation {} base_sync_seq {} created_at_ms {} expires_at_ms {} phase {:?}",
            self.uid,
            r.snapshot_id,
            r.device,
            r.generation,
            r.base_sync_seq,
            r.created_at_ms,
            r.expires_at_ms,
            r.phase
        )
    }

    fn apply(&self, st: &mut State, at: ApplyAt<'_>) -> Result<(), ApplyError> {
        st.apply_snapshot(self.uid, &self.row, at.stamp);
        Ok(())
    }
}

impl State {
    pub(crate) fn apply_snapshot(&mut self, uid: Uid, row: &SnapshotRow, stamp: u64) {
        let user = Arc::make_mut(self.users.entry(uid).or_default());
        user.raise_next_snapshot_id(row.snapshot_id + 1);
        if row.phase == SnapshotPhase::Dropped {
            if let Some(recovery) = user.recovery.written() {
                recovery.snapshots.remove(&row.snapshot_id);
            }
        } else {
            user.recovery
                .make_mut()
                .snapshots
                .insert(row.snapshot_id, SnapshotSlot { row: *row, stamp });
        }
    }
}

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

pub(crate) fn put_snapshot_row(w: &mut Writer, row: &SnapshotRow) {
    w.u64(row.snapshot_id);
    w.u64(row.device);
    w.u64(row.generation);
    w.u64(row.base_sync_seq);
    w.u64(row.created_at_ms);
    w.u64(row.expires_at_ms);
    w.u8(phase_code(row.phase));
}

pub(crate) fn get_snapshot_row(r: &mut Reader<'_>) -> DecodeResult<SnapshotRow> {
    Ok(SnapshotRow {
        snapshot_id: r.u64()?,
        device: r.id()?,
        generation: r.id()?,
        base_sync_seq: r.id()?,
        created_at_ms: r.u64()?,
        expires_at_ms: r.u64()?,
        phase: phase_from_code(r.u8()?)?,
    })
}

/// Appends the snapshot tables to a checkpoint body. Users without any
/// snapshot history are left out.
pub(crate) fn encode_checkpoint_section(w: &mut Writer, st: &State) {
    let mut users: Vec<(&Uid, &Arc<User>)> = st
        .users
        .iter()
        .filter(|(_, u)| u.next_snapshot_id() != 0 || !u.snapshots().is_empty())
        .collect();
    users.sort_unstable_by_key(|(uid, _)| **uid);
    w.u64(users.len() as u64);
    for (uid, u) in users {
        w.u64(*uid);
        w.u64(u.next_snapshot_id());
        w.u64(u.snapshots().len() as u64);
        for slot in u.snapshots().values() {
            put_snapshot_row(w, &slot.row);
        }
    }
}

pub(crate) fn decode_checkpoint_section(r: &mut Reader<'_>, st: &mut State) -> DecodeResult<()> {
    for _ in 0..r.count(24)? {
        let uid: Uid = r.id()?;
        let next = r.u64()?;
        let mut snapshots = BTreeMap::new();
        for _ in 0..r.count(49)? {
            let row = get_snapshot_row(r)?;
            snapshots.insert(row.snapshot_id, SnapshotSlot { row, stamp: 0 });
        }
        let user = Arc::make_mut(st.users.entry(uid).or_default());
        user.raise_next_snapshot_id(next);
        if !snapshots.is_empty() {
            user.recovery.make_mut().snapshots = snapshots;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(snapshot_id: u64, phase: SnapshotPhase) -> SnapshotRow {
        SnapshotRow {
            snapshot_id,
            device: DeviceId(1),
            generation: Generation(1),
            base_sync_seq: SyncSeq(0),
            created_at_ms: 0,
            expires_at_ms: 1,
            phase,
        }
    }

    /// A user's snapshots and counters are out of line until it has one: a
    /// user that never had a snapshot holds no box, and the drop of one
    /// it no longer holds still moves its counter past that id.
    #[test]
    fn a_user_without_snapshots_holds_no_box_and_a_drop_still_moves_the_counter() {
        let mut st = State::new(0);
        st.users.entry(Uid(1)).or_default();
        assert!(!st.users[&Uid(1)].recovery.is_allocated());
        st.apply_snapshot(Uid(1), &row(3, SnapshotPhase::Dropped), 1);
        let user = &st.users[&Uid(1)];
        assert!(user.snapshots().is_empty());
        assert_eq!(user.next_snapshot_id(), 4);
        st.apply_snapshot(Uid(1), &row(4, SnapshotPhase::Live), 2);
        st.apply_snapshot(Uid(1), &row(4, SnapshotPhase::Dropped), 3);
        let user = &st.users[&Uid(1)];
        assert!(user.snapshots().is_empty());
        assert_eq!(user.next_snapshot_id(), 5);
    }
}
