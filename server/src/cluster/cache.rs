//! The recent raft entries a node keeps in memory, so that replication to
//! a follower that keeps up never reads the log back. Bounded by a count
//! and by the bytes of the rounds it holds, whichever is reached first: a
//! count alone let rounds of large messages pin hundreds of MB (8,192
//! rounds of one 16 KiB send each is 128 MiB).

use std::collections::BTreeMap;

use super::{RaftEntry, Round};

/// At most this many entries.
pub(crate) const ENTRIES_MAX: usize = 8192;
/// At most this many bytes of round payloads (an entry's own fields and
/// the map's nodes come on top, a few dozen bytes each).
pub(crate) const BYTES_MAX: usize = 32 << 20;

#[derive(Default)]
pub(crate) struct EntryCache {
    entries: BTreeMap<u64, RaftEntry>,
    bytes: usize,
}

fn size(e: &RaftEntry) -> usize {
    match &e.payload {
        openraft::EntryPayload::Normal(Round(payload)) => payload.len(),
        _ => 0,
    }
}

impl EntryCache {
    pub fn get(&self, index: u64) -> Option<&RaftEntry> {
        self.entries.get(&index)
    }

    pub fn contains(&self, index: u64) -> bool {
        self.entries.contains_key(&index)
    }

    /// Adds the newest entry, dropping the oldest past the bounds.
    pub fn push(&mut self, index: u64, e: RaftEntry) {
        self.bytes += size(&e);
        if let Some(old) = self.entries.insert(index, e) {
            self.bytes -= size(&old);
        }
        while self.entries.len() > ENTRIES_MAX || self.bytes > BYTES_MAX {
            let Some((_, old)) = self.entries.pop_first() else {
                break;
            };
            self.bytes -= size(&old);
        }
    }

    /// Drops the entries from `index` on (a truncated tail).
    pub fn cut_from(&mut self, index: u64) {
        let cut = self.entries.split_off(&index);
        self.bytes -= cut.values().map(size).sum::<usize>();
    }

    /// Drops the entries up to `index` (purged).
    pub fn drop_through(&mut self, index: u64) {
        let kept = self.entries.split_off(&(index + 1));
        let dropped = std::mem::replace(&mut self.entries, kept);
        self.bytes -= dropped.values().map(size).sum::<usize>();
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Entries held and the bytes of their rounds.
    pub fn held(&self) -> (usize, usize) {
        (self.entries.len(), self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{EntryPayload, LeaderId, LogId};
    use super::*;
    use openraft::vote::RaftLeaderId as _;

    fn entry(index: u64, bytes: usize) -> RaftEntry {
        RaftEntry {
            log_id: LogId::new(LeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Round(vec![7; bytes])),
        }
    }

    #[test]
    fn large_rounds_are_dropped_by_bytes_before_the_count_is_reached() {
        let mut c = EntryCache::default();
        let round = 1 << 20;
        for i in 1..=100 {
            c.push(i, entry(i, round));
        }
        let (held, bytes) = c.held();
        assert_eq!(held, BYTES_MAX / round);
        assert_eq!(bytes, held * round);
        assert!(!c.contains(100 - held as u64) && c.contains(101 - held as u64));
        assert!(c.get(100).is_some());
    }

    #[test]
    fn small_rounds_are_dropped_by_count() {
        let mut c = EntryCache::default();
        for i in 1..=(ENTRIES_MAX as u64 + 10) {
            c.push(i, entry(i, 10));
        }
        assert_eq!(c.held(), (ENTRIES_MAX, ENTRIES_MAX * 10));
        assert!(!c.contains(10) && c.contains(11));
    }

    #[test]
    fn a_cut_and_a_purge_keep_the_byte_count_exact() {
        let mut c = EntryCache::default();
        for i in 1..=10 {
            c.push(i, entry(i, 100 * i as usize));
        }
        c.cut_from(8);
        assert_eq!(c.held(), (7, 100 * (1..=7).sum::<usize>()));
        c.drop_through(3);
        assert_eq!(c.held(), (4, 100 * (4..=7).sum::<usize>()));
        assert!(!c.contains(3) && c.contains(4) && !c.contains(8));
        // The same index written again (a new leader's entry) replaces it.
        c.push(7, entry(7, 50));
        assert_eq!(c.held(), (4, 100 * (4..=6).sum::<usize>() + 50));
        c.clear();
        assert_eq!(c.held(), (0, 0));
    }
}
