//! Per-segment reference counts: how many retained index entries point
//! into each segment of a log, kept up to date by [`super::State`]
//! as entries are added, patched, trimmed and relocated, so that
//! compaction never has to walk the whole index to find what died.
//!
//! Invariants:
//! - `count(s)` is the number of retained index entries (user events for
//!   the `evt` log, messages for the `msg` log) whose location is in
//!   segment `s`; entries whose location is still pending are not counted.
//!   A segment with no entry is absent (never a zero count).
//! - `dirty` holds every segment that lost an entry since the compactor
//!   last took the set ([`SegRefs::take_dirty`]), and after recovery every
//!   segment: only those can have become sparse.
//! - Derived, not state proper: never logged nor checkpointed, rebuilt
//!   from the index on load. Equality compares the counts only, so a
//!   recovered state equals the live one it was recovered from.

use super::loc::{unpack, PackedLoc, PENDING_LOC};
use super::{IdMap, IdSet};
use crate::log::SegmentId;

#[derive(Clone, Debug, Default)]
pub(crate) struct SegRefs {
    counts: IdMap<SegmentId, u64>,
    dirty: IdSet<SegmentId>,
}

impl PartialEq for SegRefs {
    fn eq(&self, other: &Self) -> bool {
        self.counts == other.counts
    }
}

impl Eq for SegRefs {}

impl SegRefs {
    /// Entries and capacities of the counts and of the dirty set, for the
    /// memory breakdown (`memory.rs`).
    pub(crate) fn sizes(&self) -> (usize, usize, usize, usize) {
        (
            self.counts.len(),
            self.counts.capacity(),
            self.dirty.len(),
            self.dirty.capacity(),
        )
    }

    /// Counts every location of `locs` (after a checkpoint load); every
    /// segment starts dirty.
    pub fn rebuild(locs: impl IntoIterator<Item = PackedLoc>) -> Self {
        let mut r = Self::default();
        r.add_each(locs);
        r.mark_all_dirty();
        r
    }

    /// One new entry at each location of `locs`. A run of locations in
    /// one segment (a user's events, a conversation's messages: both in
    /// log order) costs one update of the counts, not one per entry: a
    /// recount after a checkpoint load goes over every retained event.
    pub fn add_each(&mut self, locs: impl IntoIterator<Item = PackedLoc>) {
        let mut run: Option<(SegmentId, u64)> = None;
        for loc in locs {
            if loc == PENDING_LOC {
                continue;
            }
            let seg = unpack(loc).segment;
            match &mut run {
                Some((s, n)) if *s == seg => *n += 1,
                _ => {
                    if let Some((s, n)) = run.replace((seg, 1)) {
                        *self.counts.entry(s).or_default() += n;
                    }
                }
            }
        }
        if let Some((s, n)) = run {
            *self.counts.entry(s).or_default() += n;
        }
    }

    /// `n` new entries at `loc`.
    pub fn add(&mut self, loc: PackedLoc, n: u64) {
        if loc != PENDING_LOC && n > 0 {
            *self.counts.entry(unpack(loc).segment).or_default() += n;
        }
    }

    /// One entry at `loc` is gone (trimmed or moved away).
    pub fn remove(&mut self, loc: PackedLoc) {
        if loc == PENDING_LOC {
            return;
        }
        let seg = unpack(loc).segment;
        if let Some(c) = self.counts.get_mut(&seg) {
            *c -= 1;
            if *c == 0 {
                self.counts.remove(&seg);
            }
        } else {
            debug_assert!(false, "removing an uncounted entry of segment {seg}");
        }
        self.dirty.insert(seg);
    }

    /// An entry moves from `from` to `to` (a patched or relocated location).
    pub fn replace(&mut self, from: PackedLoc, to: PackedLoc) {
        if from != to {
            self.remove(from);
            self.add(to, 1);
        }
    }

    pub fn count(&self, seg: SegmentId) -> u64 {
        self.counts.get(&seg).copied().unwrap_or(0)
    }

    pub fn has_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The segments that lost an entry since the last call.
    pub fn take_dirty(&mut self) -> IdSet<SegmentId> {
        std::mem::take(&mut self.dirty)
    }

    pub fn mark_all_dirty(&mut self) {
        self.dirty.extend(self.counts.keys().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::super::loc::pack;
    use super::*;
    use crate::log::RecordLoc;

    fn at(segment: SegmentId, offset: u32) -> PackedLoc {
        pack(RecordLoc { segment, offset })
    }

    #[test]
    fn counting_a_list_by_runs_equals_counting_each_location() {
        let locs = [
            at(4, 0),
            at(4, 9),
            PENDING_LOC,
            at(4, 20),
            at(5, 0),
            at(4, 30),
            at(7, 1),
            at(7, 2),
            PENDING_LOC,
        ];
        let mut by_runs = SegRefs::default();
        by_runs.add_each(locs);
        by_runs.add_each([at(7, 3)]);
        by_runs.add_each([]);
        let mut each = SegRefs::default();
        for loc in locs.into_iter().chain([at(7, 3)]) {
            each.add(loc, 1);
        }
        assert_eq!(by_runs, each);
        assert_eq!(
            (by_runs.count(4), by_runs.count(5), by_runs.count(7)),
            (4, 1, 3)
        );
        assert_eq!(
            by_runs.counts.len(),
            3,
            "no segment counted without an entry"
        );
        assert!(
            by_runs.take_dirty().is_empty(),
            "adding marks nothing dirty"
        );
    }

    #[test]
    fn counts_follow_adds_moves_and_removals_and_removals_mark_dirty() {
        let mut r = SegRefs::default();
        r.add(at(1, 0), 3);
        r.add(PENDING_LOC, 5);
        r.replace(PENDING_LOC, at(2, 8));
        assert_eq!((r.count(1), r.count(2)), (3, 1));
        assert!(r.take_dirty().is_empty(), "adding marks nothing dirty");
        r.remove(at(1, 0));
        r.replace(at(1, 0), at(3, 0));
        assert_eq!((r.count(1), r.count(3)), (1, 1));
        assert_eq!(r.take_dirty(), IdSet::from_iter([1]));
        r.remove(at(1, 0));
        assert_eq!(r.count(1), 0);
        assert!(!r.counts.contains_key(&1), "an empty segment is absent");
        assert_eq!(r.take_dirty(), IdSet::from_iter([1]));
    }

    #[test]
    fn rebuilt_counts_equal_incremental_ones_and_start_dirty() {
        let locs = [at(1, 0), at(1, 0), at(4, 16), PENDING_LOC];
        let mut live = SegRefs::default();
        for l in &locs {
            live.add(*l, 1);
        }
        let mut rebuilt = SegRefs::rebuild(locs);
        assert_eq!(rebuilt, live);
        assert_eq!(rebuilt.take_dirty(), IdSet::from_iter([1, 4]));
    }
}
