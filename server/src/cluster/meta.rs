//! What raft keeps beside the engine's log: the vote, which leader (term
//! and node) wrote each range of indexes, the membership entries and the
//! last purged log id. One small file in the data directory, replaced
//! whole and durably (tmp, fsync, rename, directory fsync) on every
//! change; it changes on elections and membership changes, never per
//! round.
//!
//! The rounds themselves are the engine's `evt` log: an index is a round
//! there, and its term is looked up here. The file is written *before* the
//! rounds it describes are applied, and after a discard, so a crash between
//! leaves ranges that start past the log's end, which are never consulted
//! and are dropped by the next append or truncation.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use inbox_engine::log::{write_file_durably, PwriteIo};
use openraft::{CommittedLeaderId, LogId, Membership, Vote};
use serde::{Deserialize, Serialize};

use super::Peer;

const FILE: &str = "raft-meta.json";
const TMP: &str = "raft-meta.json.tmp";

/// The raft metadata of one node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Meta {
    /// The last vote granted or held.
    pub vote: Option<Vote<u64>>,
    /// `(first index, leader)`: the leader that wrote the entries from
    /// `first index` up to the next range's start.
    pub leaders: Vec<(u64, CommittedLeaderId<u64>)>,
    /// Membership entries by index (index 0 is the initial membership).
    pub memberships: BTreeMap<u64, Membership<u64, Peer>>,
    /// The last log id purged.
    pub purged: Option<LogId<u64>>,
    /// A log id raft had applied (so committed) when this file was last
    /// written: raft's applied point at the next start, so that raft's
    /// own start reads only the log after it (for the last membership),
    /// not the log since the last snapshot. Written every
    /// [`APPLIED_SAVE_EVERY`] indexes, never per round; absent in files
    /// of earlier releases.
    #[serde(default)]
    pub applied: Option<LogId<u64>>,
}

/// Indexes raft applies between two writes of [`Meta::applied`]: what a
/// restart may read back from the log for raft's start, at most.
pub(crate) const APPLIED_SAVE_EVERY: u64 = 1024;

impl Meta {
    fn path(dir: &Path) -> PathBuf {
        dir.join(FILE)
    }

    /// Reads the file, or an empty `Meta` if there is none yet.
    pub fn load(dir: &Path) -> io::Result<Meta> {
        match std::fs::read(Self::path(dir)) {
            Ok(buf) => serde_json::from_slice(&buf).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: {e}", Self::path(dir).display()),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Meta::default()),
            Err(e) => Err(e),
        }
    }

    /// Replaces the file, durably.
    pub fn store(&self, dir: &Path) -> io::Result<()> {
        let buf = serde_json::to_vec(self).map_err(io::Error::other)?;
        write_file_durably(&PwriteIo, &dir.join(TMP), &Self::path(dir), &buf)
    }

    /// The leader that wrote entry `index`.
    pub fn leader_at(&self, index: u64) -> CommittedLeaderId<u64> {
        self.leaders
            .iter()
            .rev()
            .find(|(first, _)| *first <= index)
            .map(|(_, l)| *l)
            .unwrap_or_default()
    }

    /// Forgets everything about entries from `index` on (a truncation, or
    /// an append that overwrites them).
    pub fn cut_from(&mut self, index: u64) {
        self.leaders.retain(|(first, _)| *first < index);
        self.memberships.retain(|i, _| *i < index);
    }

    /// Notes that `leader` wrote entry `index` (appended after the rest).
    pub fn note(&mut self, index: u64, leader: CommittedLeaderId<u64>) {
        self.cut_from(index);
        if self.leaders.last().map(|(_, l)| *l) != Some(leader) {
            self.leaders.push((index, leader));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaders_are_ranges_and_a_cut_forgets_the_tail() {
        let mut m = Meta::default();
        let l = |term| CommittedLeaderId::new(term, 1);
        m.note(1, l(1));
        m.note(2, l(1));
        m.note(5, l(2));
        assert_eq!(m.leaders, vec![(1, l(1)), (5, l(2))]);
        assert_eq!(m.leader_at(4), l(1));
        assert_eq!(m.leader_at(9), l(2));
        m.note(3, l(3));
        assert_eq!(m.leaders, vec![(1, l(1)), (3, l(3))]);
        m.cut_from(1);
        assert!(m.leaders.is_empty());
    }

    #[test]
    fn the_file_round_trips_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Meta::load(dir.path()).unwrap(), Meta::default());
        let mut m = Meta {
            vote: Some(Vote::new(3, 2)),
            ..Meta::default()
        };
        m.note(7, CommittedLeaderId::new(3, 2));
        m.store(dir.path()).unwrap();
        assert_eq!(Meta::load(dir.path()).unwrap(), m);
        std::fs::write(dir.path().join(FILE), b"{not json").unwrap();
        assert!(Meta::load(dir.path()).is_err());
    }

    /// A `raft-meta.json` as inboxd wrote it on openraft 0.9 (pretty-printed;
    /// the daemon writes it compact): a voted, committed leader, three
    /// leader ranges, the initial and a three-member membership, a purge
    /// and a saved applied point.
    const FIXTURE_0_9: &str = include_str!("testdata/raft-meta-0.9.json");

    #[test]
    fn a_metadata_file_written_on_openraft_0_9_loads_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), FIXTURE_0_9).unwrap();
        let m = Meta::load(dir.path()).unwrap();

        let vote = m.vote.expect("the fixture holds a vote");
        assert_eq!(vote, Vote::new_committed(4, 2));
        let l = CommittedLeaderId::new;
        assert_eq!(m.leaders, vec![(1, l(1, 1)), (5, l(3, 2)), (900, l(4, 2))]);
        assert_eq!(m.leader_at(4), l(1, 1));
        assert_eq!(m.leader_at(899), l(3, 2));
        assert_eq!(m.purged, Some(LogId::new(l(3, 2), 40)));
        assert_eq!(m.applied, Some(LogId::new(l(4, 2), 1024)));
        assert_eq!(
            m.memberships.keys().copied().collect::<Vec<_>>(),
            vec![0, 2]
        );
        let three = &m.memberships[&2];
        let voters: Vec<u64> = three.voter_ids().collect();
        assert_eq!(voters, vec![1, 2, 3]);
        let peer = three.get_node(&3).expect("member 3 has addresses");
        assert_eq!(peer.raft_addr, "10.0.0.3:7001");
        assert_eq!(peer.client_addr, "10.0.0.3:7000");
        assert_eq!(m.memberships[&0].voter_ids().collect::<Vec<_>>(), vec![1]);

        // Written again by this build and read back, it is the same; and
        // it is the same JSON value as the old file (no field renamed).
        m.store(dir.path()).unwrap();
        assert_eq!(Meta::load(dir.path()).unwrap(), m);
        let old: serde_json::Value = serde_json::from_str(FIXTURE_0_9).unwrap();
        let new: serde_json::Value = serde_json::to_value(&m).unwrap();
        assert_eq!(new, old);
    }
}
