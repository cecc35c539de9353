//! What a round becomes for replication and what the leader's sequencer,
//! its completion stage and the consensus layer share: the [`Entry`] (a
//! round's replicated records), which record kinds it carries, and the
//! [`Link`] of one term of leadership (entries handed off, the commit
//! point, the end of the leadership).
//!
//! It sits below the sequencer and below `Shared` (the completion stage's
//! queue holds a round's link), so it names neither: a commit lets the
//! completion stage finish rounds through the callback the sequencer
//! gives the link when it makes it.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::record;
use crate::error::{Error, Result};
use crate::inbox::compaction::record::{MoveBodiesEffect, RelocateEffect};
use crate::inbox::effect::COPY_FLAG;
use crate::inbox::reply::Fail;
use crate::inbox::state::record::Record;

/// Whether a record of this kind is part of a replicated entry; the rest
/// describe the node's own files.
pub(crate) fn is_replicated_kind(kind: u8) -> bool {
    kind & COPY_FLAG == 0
        && kind != RelocateEffect::KIND
        && kind != MoveBodiesEffect::KIND
        && kind != record::RoundMark::KIND
}

const ENTRY_MAGIC: &[u8; 4] = b"IXRE";
const ENTRY_VERSION: u8 = 1;

/// One round as the unit of replication: its replication index and the
/// `evt` records every node applies, as encoded in the leader's batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    index: u64,
    records: Vec<(u8, Vec<u8>)>,
}

impl Entry {
    pub(crate) fn new(index: u64, records: Vec<(u8, Vec<u8>)>) -> Entry {
        Entry { index, records }
    }

    /// A round that changes no state and only takes its index: what the
    /// consensus layer stores for entries of its own (a new leader's blank
    /// entry, a membership change), so the log has no gap.
    pub fn empty(index: u64) -> Entry {
        Entry {
            index,
            records: Vec::new(),
        }
    }

    /// Whether this is an [`Entry::empty`] round.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The round's replication index (the raft log index it is stored at).
    pub fn index(&self) -> u64 {
        self.index
    }

    pub(crate) fn records(&self) -> &[(u8, Vec<u8>)] {
        &self.records
    }

    /// The entry as bytes for the wire and the raft log:
    /// ```text
    /// "IXRE" [4], version u8 (1), index u64, count u32,
    /// count × (kind u8, len u32, payload [len]), CRC32 u32 of all before
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let len: usize = self.records.iter().map(|(_, p)| 5 + p.len()).sum();
        let mut buf = Vec::with_capacity(4 + 1 + 8 + 4 + len + 4);
        buf.extend_from_slice(ENTRY_MAGIC);
        buf.push(ENTRY_VERSION);
        buf.extend_from_slice(&self.index.to_le_bytes());
        buf.extend_from_slice(&(self.records.len() as u32).to_le_bytes());
        for (kind, payload) in &self.records {
            buf.push(*kind);
            buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            buf.extend_from_slice(payload);
        }
        let crc = crc32fast::hash(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        buf
    }

    /// Decodes [`Entry::encode`]'s bytes; anything else is refused with
    /// [`Error::BadRequest`]. The records themselves are checked when the
    /// entry is applied.
    pub fn decode(buf: &[u8]) -> Result<Entry> {
        let bad = |why: &str| Error::BadRequest(format!("replication entry: {why}"));
        if buf.len() < 4 + 1 + 8 + 4 + 4 || &buf[..4] != ENTRY_MAGIC {
            return Err(bad("not an entry"));
        }
        let (body, crc) = buf.split_at(buf.len() - 4);
        if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(bad("CRC mismatch"));
        }
        if body[4] != ENTRY_VERSION {
            return Err(bad("unknown version"));
        }
        let index = u64::from_le_bytes(body[5..13].try_into().expect("8 bytes"));
        let count = u32::from_le_bytes(body[13..17].try_into().expect("4 bytes")) as usize;
        let mut at = 17;
        let mut records = Vec::with_capacity(count.min(body.len() / 5));
        for _ in 0..count {
            if at + 5 > body.len() {
                return Err(bad("truncated"));
            }
            let kind = body[at];
            let len =
                u32::from_le_bytes(body[at + 1..at + 5].try_into().expect("4 bytes")) as usize;
            at += 5;
            if body.len() - at < len {
                return Err(bad("truncated"));
            }
            records.push((kind, body[at..at + len].to_vec()));
            at += len;
        }
        if at != body.len() {
            return Err(bad("trailing bytes"));
        }
        Ok(Entry { index, records })
    }
}

/// What the leader's sequencer, its completion stage and the consensus
/// layer share for one term of leadership.
pub(crate) struct Link {
    pub(super) st: Mutex<LinkState>,
    pub(super) cv: Condvar,
    /// Wakes an async consensus layer waiting in
    /// [`Leader::next_entries`]: an entry was handed off, or the
    /// leadership ended (one waiter; a wake with none waiting is kept).
    pub(super) ready: tokio::sync::Notify,
    /// Wakes every async waiter of [`Leader::settled`]: a commit, or the
    /// end of the leadership.
    pub(super) decided: tokio::sync::Notify,
    /// Lets the engine's completion stage finish the rounds a commit or
    /// the end of the leadership decided (the sequencer, which makes the
    /// link, says how; it holds the engine weakly, so a link never keeps a
    /// closed engine open).
    on_decided: Box<dyn Fn() + Send + Sync>,
}

pub(super) struct LinkState {
    /// Entries handed off, not yet taken by the consensus layer.
    pub(super) outbox: VecDeque<Entry>,
    /// Rounds up to this index are committed.
    pub(super) committed: u64,
    /// Set when the leadership ended: rounds not committed by then fail.
    pub(super) ended: Option<String>,
}

impl Link {
    pub(crate) fn new(committed: u64, on_decided: Box<dyn Fn() + Send + Sync>) -> Arc<Link> {
        Arc::new(Link {
            st: Mutex::new(LinkState {
                outbox: VecDeque::new(),
                committed,
                ended: None,
            }),
            cv: Condvar::new(),
            ready: tokio::sync::Notify::new(),
            decided: tokio::sync::Notify::new(),
            on_decided,
        })
    }

    /// Whether round `index` is committed, or never will be under this
    /// leadership (never blocks).
    pub(crate) fn is_decided(&self, index: u64) -> bool {
        let st = self.st.lock();
        st.committed >= index || st.ended.is_some()
    }

    /// Lets the completion stage finish the rounds a commit or the end of
    /// the leadership decided.
    pub(super) fn finish_decided(&self) {
        (self.on_decided)();
    }

    /// Hands a round's entry to the consensus layer, unless the
    /// leadership has ended (it may end from outside the sequencer,
    /// [`super::Leader::end`]): then the round is never proposed and fails
    /// like every round not committed.
    pub(crate) fn hand_off(&self, entry: Entry) {
        let mut st = self.st.lock();
        if st.ended.is_some() {
            return;
        }
        st.outbox.push_back(entry);
        self.cv.notify_all();
        self.ready.notify_one();
    }

    pub(crate) fn committed(&self) -> u64 {
        self.st.lock().committed
    }

    /// Blocks until round `index` is committed, or fails once the
    /// leadership has ended without it.
    pub(crate) fn wait_committed(&self, index: u64) -> std::result::Result<(), Fail> {
        let mut st = self.st.lock();
        loop {
            if st.committed >= index {
                return Ok(());
            }
            if let Some(why) = &st.ended {
                return Err(Fail::NotLeader(format!("round {index}: {why}")));
            }
            self.cv.wait(&mut st);
        }
    }

    /// Ends the leadership: entries not yet taken are dropped, and every
    /// round not committed fails with `why`.
    pub(crate) fn end(&self, why: String) {
        {
            let mut st = self.st.lock();
            st.outbox.clear();
            st.ended.get_or_insert(why);
            self.cv.notify_all();
            self.ready.notify_one();
            self.decided.notify_waiters();
        }
        self.finish_decided();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_round_trips_and_damage_is_refused() {
        let e = Entry::new(42, vec![(9, vec![1, 2, 3]), (4, vec![]), (6, vec![7; 300])]);
        let buf = e.encode();
        assert_eq!(Entry::decode(&buf).unwrap(), e);
        for i in 0..buf.len() {
            let mut b = buf.clone();
            b[i] ^= 0x10;
            assert!(Entry::decode(&b).is_err(), "flip at {i}");
        }
        assert!(Entry::decode(&buf[..buf.len() - 1]).is_err());
    }

    #[test]
    fn records_about_the_nodes_own_files_are_not_replicated() {
        assert!(!is_replicated_kind(RelocateEffect::KIND));
        assert!(!is_replicated_kind(MoveBodiesEffect::KIND));
        assert!(!is_replicated_kind(9 | COPY_FLAG));
        assert!(!is_replicated_kind(record::RoundMark::KIND));
        assert!(is_replicated_kind(9));
        assert!(is_replicated_kind(4));
    }
}
