//! The commit path in figures: how long a member's appends take to become
//! durable, how many entries each carries, and on the leader how long a
//! round takes from its proposal to its commit.
//!
//! A round on a group is committed after the leader proposed it, sent it
//! to the followers in an append, a follower made it durable and answered,
//! and raft applied the commit. openraft 0.9 keeps one append in flight to
//! each follower, so the entries per append say how much rounds wait for
//! the one before; the time an append takes to be durable says what a
//! follower adds. The counters are sums and counts (a mean is the ratio
//! of two differences), exported as `inboxd_raft_append*` and
//! `inboxd_raft_round_commit*`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Proposals remembered for their commit time; older ones are forgotten
/// (a leader whose commits stalled must not grow without bound).
const PROPOSALS_KEPT: usize = 1 << 16;

/// One member's counters.
#[derive(Debug, Default)]
pub(crate) struct CommitPath {
    appends: AtomicU64,
    appended_entries: AtomicU64,
    append_micros: AtomicU64,
    rounds_committed: AtomicU64,
    commit_micros: AtomicU64,
    /// The leader's proposals not yet committed, in index order.
    proposed: Mutex<VecDeque<(u64, Instant)>>,
}

/// What [`CommitPath`] counted since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitPathFigures {
    /// Appends raft made to this member's log (on a follower, one per
    /// append request; on the leader, its own rounds).
    pub appends: u64,
    /// Entries those appends carried.
    pub appended_entries: u64,
    /// Microseconds from each append's call to its entries being durable,
    /// summed.
    pub append_micros: u64,
    /// The leader's rounds committed whose proposal it timed.
    pub rounds_committed: u64,
    /// Microseconds from each such round's proposal to its commit, summed.
    pub round_commit_micros: u64,
}

fn micros_since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX)
}

impl CommitPath {
    /// An append of `entries` entries, called at `started`, is durable.
    pub(crate) fn appended(&self, entries: u64, started: Instant) {
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.appended_entries.fetch_add(entries, Ordering::Relaxed);
        self.append_micros
            .fetch_add(micros_since(started), Ordering::Relaxed);
    }

    /// The leader proposed round `index` to raft.
    pub(crate) fn proposed(&self, index: u64) {
        let mut q = self.proposed.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == PROPOSALS_KEPT {
            q.pop_front();
        }
        q.push_back((index, Instant::now()));
    }

    /// raft committed every round up to `index`.
    pub(crate) fn committed(&self, index: u64) {
        let mut q = self.proposed.lock().unwrap_or_else(|p| p.into_inner());
        let (mut rounds, mut micros) = (0, 0);
        while let Some(&(i, at)) = q.front() {
            if i > index {
                break;
            }
            q.pop_front();
            rounds += 1;
            micros += micros_since(at);
        }
        drop(q);
        if rounds > 0 {
            self.rounds_committed.fetch_add(rounds, Ordering::Relaxed);
            self.commit_micros.fetch_add(micros, Ordering::Relaxed);
        }
    }

    /// A leadership began or ended: proposals of an earlier one are never
    /// timed (they were committed by another leader, or discarded).
    pub(crate) fn forget_proposals(&self) {
        self.proposed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    pub(crate) fn figures(&self) -> CommitPathFigures {
        CommitPathFigures {
            appends: self.appends.load(Ordering::Relaxed),
            appended_entries: self.appended_entries.load(Ordering::Relaxed),
            append_micros: self.append_micros.load(Ordering::Relaxed),
            rounds_committed: self.rounds_committed.load(Ordering::Relaxed),
            round_commit_micros: self.commit_micros.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_times_every_proposal_up_to_its_index_and_no_later_one() {
        let path = CommitPath::default();
        for index in 1..=3 {
            path.proposed(index);
        }
        path.committed(2);
        let f = path.figures();
        assert_eq!(f.rounds_committed, 2);
        path.committed(2);
        assert_eq!(
            path.figures().rounds_committed,
            2,
            "a repeated commit times nothing"
        );
        path.committed(3);
        assert_eq!(path.figures().rounds_committed, 3);
    }

    #[test]
    fn proposals_of_an_ended_leadership_are_never_timed() {
        let path = CommitPath::default();
        path.proposed(1);
        path.forget_proposals();
        path.committed(1);
        assert_eq!(path.figures().rounds_committed, 0);
    }

    #[test]
    fn a_stalled_leader_keeps_a_bounded_number_of_proposals() {
        let path = CommitPath::default();
        for index in 1..=(PROPOSALS_KEPT as u64 + 10) {
            path.proposed(index);
        }
        path.committed(u64::MAX);
        assert_eq!(path.figures().rounds_committed, PROPOSALS_KEPT as u64);
    }

    #[test]
    fn appends_sum_their_entries_and_count_each_call() {
        let path = CommitPath::default();
        path.appended(3, Instant::now());
        path.appended(1, Instant::now());
        let f = path.figures();
        assert_eq!((f.appends, f.appended_entries), (2, 4));
    }
}
