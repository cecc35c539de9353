//! What a device's durable ACK is while newer ACKs wait for their round.
//!
//! A device catching up ACKs each page, best carried by the `SYNC` of the
//! next ([`super::carried_ack`]). The sequencer applies the ACK to the
//! state at once; the row is durable only once the ACK's round settles,
//! and until then a read that reveals the row must wait ([`super::read`]).
//! So each page waited for the fsync of the ACK before it, and a catch-up
//! ran at one page per fsync.
//!
//! A later page of a batch needs nothing an ACK changes but the
//! `acked_sync_seq` it reports: its events come from its token, and an ACK
//! changes neither the generation, the state nor the lease. So it need not
//! wait, if it reports the ACK that is durable. [`AckViews`] keeps that
//! ACK for each device whose newest changes moved only its ACK (and its
//! `last_seen`), until they settle:
//!
//! - the sequencer tells it of every change of a device row
//!   ([`AckViews::changed`]), in the order it makes them;
//! - a reader that finds a row not yet durable asks it for the row's
//!   durable ACK ([`AckViews::durable_acked`]): it answers only for the row
//!   as the reader saw it (same stamp), with the round that must have
//!   settled for the answer to hold.
//!
//! An answer errs one way only: the ACK it gives was durable, and one
//! made since may be too. Entries of settled rows are dropped as the
//! table grows, so it holds about the devices that ACKed within the last
//! fsync or two.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::api::*;
use crate::inbox::devices::rows::DeviceRow;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct View {
    /// The row's stamp after its newest change, which moved only its ACK.
    stamp: u64,
    /// The stamp of the row before the first of those changes: once it
    /// has settled, `durable_acked` is durable.
    base: u64,
    /// The row's ACK before the first of those changes.
    durable_acked: SyncSeq,
}

/// The table; one per engine, in [`crate::inbox::shared::Shared`].
#[derive(Default)]
pub(crate) struct AckViews {
    inner: Mutex<Views>,
}

#[derive(Default)]
struct Views {
    map: HashMap<(Uid, DeviceId), View>,
    /// The size at which settled entries are dropped next.
    prune_at: usize,
}

/// Entries kept before the first prune.
const PRUNE_MIN: usize = 64;

/// A row before a change: what the change is compared with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Before {
    /// Whether the change moved only the ACK and `last_seen`.
    pub ack_only: bool,
    pub acked: SyncSeq,
    pub stamp: u64,
}

impl Before {
    /// `row` at `stamp`, about to become `after`.
    pub fn of(row: &DeviceRow, stamp: u64, after: &DeviceRow) -> Self {
        Before {
            ack_only: only_ack_moved(row, after),
            acked: row.acked_sync_seq,
            stamp,
        }
    }
}

/// Whether `after` differs from `before` in its ACK and `last_seen` alone.
/// Every other field is named, so a field added to the row is compared
/// here (or the build fails) rather than taken for part of an ACK.
fn only_ack_moved(before: &DeviceRow, after: &DeviceRow) -> bool {
    let DeviceRow {
        device,
        generation,
        acked_sync_seq: _,
        state,
        last_seen_ms: _,
        lease,
    } = before;
    *device == after.device
        && *generation == after.generation
        && *state == after.state
        && *lease == after.lease
}

impl AckViews {
    /// The sequencer changed the row of `uid`'s `device` in round `stamp`
    /// (`before`: the row as it was, `None` for a new device); every round
    /// up to `settled` has settled.
    pub fn changed(
        &self,
        uid: Uid,
        device: DeviceId,
        before: Option<Before>,
        stamp: u64,
        settled: u64,
    ) {
        let key = (uid, device);
        let mut v = self.inner.lock();
        let Some(before) = before.filter(|b| b.ack_only) else {
            v.map.remove(&key);
            return;
        };
        let view = match v.map.get(&key) {
            // The row's earlier changes, not yet settled, moved only its
            // ACK too: what is durable is still what was before them.
            Some(earlier) if earlier.stamp == before.stamp && before.stamp > settled => {
                View { stamp, ..*earlier }
            }
            _ => View {
                stamp,
                base: before.stamp,
                durable_acked: before.acked,
            },
        };
        v.map.insert(key, view);
        if v.map.len() >= v.prune_at.max(PRUNE_MIN) {
            v.map.retain(|_, view| view.stamp > settled);
            v.prune_at = 2 * v.map.len();
        }
    }

    /// The durable ACK of `uid`'s `device` as a reader saw its row, at
    /// `stamp`, and the round that must have settled for it to be: `None`
    /// unless every change of the row not yet settled moved only its ACK.
    pub fn durable_acked(&self, uid: Uid, device: DeviceId, stamp: u64) -> Option<(SyncSeq, u64)> {
        let v = self.inner.lock();
        let view = v.map.get(&(uid, device))?;
        (view.stamp == stamp).then_some((view.durable_acked, view.base))
    }

    /// Forgets every row: the state they were kept for is being replaced.
    pub fn clear(&self) {
        let mut v = self.inner.lock();
        v.map.clear();
        v.prune_at = 0;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: Uid = Uid(3);
    const PHONE: DeviceId = DeviceId(1);

    fn row(acked: u64) -> DeviceRow {
        DeviceRow {
            device: PHONE,
            generation: Generation(2),
            acked_sync_seq: SyncSeq(acked),
            state: DeviceState::Active,
            last_seen_ms: acked,
            lease: None,
        }
    }

    fn ack(views: &AckViews, from: u64, to: u64, before_stamp: u64, stamp: u64, settled: u64) {
        let before = Before::of(&row(from), before_stamp, &row(to));
        views.changed(UID, PHONE, Some(before), stamp, settled);
    }

    #[test]
    fn an_ack_not_yet_durable_is_reported_as_the_ack_before_it() {
        let views = AckViews::default();
        ack(&views, 10, 20, 5, 7, 6);
        assert_eq!(views.durable_acked(UID, PHONE, 7), Some((SyncSeq(10), 5)));
        // Only for the row as the reader saw it.
        assert_eq!(views.durable_acked(UID, PHONE, 8), None);
        assert_eq!(views.durable_acked(Uid(4), PHONE, 7), None);
    }

    #[test]
    fn acks_waiting_one_behind_another_report_the_ack_before_the_first() {
        let views = AckViews::default();
        ack(&views, 10, 20, 5, 7, 6);
        ack(&views, 20, 30, 7, 8, 6);
        assert_eq!(views.durable_acked(UID, PHONE, 8), Some((SyncSeq(10), 5)));
        // Once the first has settled, the next starts from it.
        ack(&views, 30, 40, 8, 9, 8);
        assert_eq!(views.durable_acked(UID, PHONE, 9), Some((SyncSeq(30), 8)));
    }

    #[test]
    fn a_change_beyond_the_ack_leaves_no_view() {
        let views = AckViews::default();
        ack(&views, 10, 20, 5, 7, 6);
        let mut bumped = row(20);
        bumped.generation = Generation(3);
        views.changed(UID, PHONE, Some(Before::of(&row(20), 7, &bumped)), 8, 6);
        assert_eq!(views.durable_acked(UID, PHONE, 8), None);
        // An ACK after it needs that change settled: its base is the bump.
        ack(&views, 20, 30, 8, 9, 6);
        assert_eq!(views.durable_acked(UID, PHONE, 9), Some((SyncSeq(20), 8)));
        // A new device has no view.
        views.changed(UID, DeviceId(9), None, 10, 6);
        assert_eq!(views.durable_acked(UID, DeviceId(9), 10), None);
    }

    #[test]
    fn a_lease_that_moves_is_not_an_ack() {
        let mut leased = row(20);
        leased.lease = Some(Box::new(LeaseInfo {
            lease_id: 1,
            resume_from: SyncSeq(0),
            hwm: SyncSeq(50),
            expires_at_ms: 9,
        }));
        assert!(!Before::of(&row(10), 5, &leased).ack_only);
        assert!(Before::of(&row(10), 5, &row(20)).ack_only);
    }

    #[test]
    fn settled_rows_are_dropped_as_the_table_grows() {
        let views = AckViews::default();
        // Each device ACKs once, in round uid + 1, while the rounds up to
        // eight before it have settled.
        for uid in 0..PRUNE_MIN as u64 * 4 {
            let before = Before::of(&row(1), uid, &row(2));
            views.changed(
                Uid(uid),
                PHONE,
                Some(before),
                uid + 1,
                uid.saturating_sub(8),
            );
        }
        // Rows whose round settled go at the next prune: a few unsettled
        // ones and those added since stay, not one per device.
        assert!(views.len() <= PRUNE_MIN, "{} kept", views.len());
        let newest = PRUNE_MIN as u64 * 4 - 1;
        assert!(views
            .durable_acked(Uid(newest), PHONE, newest + 1)
            .is_some());
        views.clear();
        assert_eq!(views.len(), 0);
    }
}
