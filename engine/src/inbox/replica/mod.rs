//! Replication, engine side: a committed round as one self-contained
//! [`Entry`], the leader's hand-off of entries and its commit point
//! ([`Leader`]), a follower's apply of an entry, and the rollback of
//! rounds that will never commit ([`Inbox::discard_from`]). The consensus
//! layer (raft) sits on top of this API; see `docs/CLUSTER.md`.
//!
//! A node is in one of three roles, held by the sequencer:
//! - *local* (the default, a single node): rounds commit once durable in
//!   the local log, exactly as before; nothing here is involved;
//! - *leader* ([`Inbox::lead`]): each round that changes state is closed by
//!   a round mark (`record.rs`) carrying its replication index, written to
//!   the local `evt` log as before, and handed out as an [`Entry`]; its
//!   replies are released once it is durable locally *and* the consensus
//!   layer has called [`Leader::commit`] for its index;
//! - *follower* ([`Inbox::follow`]): client commands are refused with
//!   [`Error::NotLeader`]; [`Inbox::apply_entry`] applies a leader's entry
//!   through the same effect application and log append as a local round
//!   (the follower places the batch in its own log and points its indexes
//!   at its own locations, so logs need not be byte-identical).
//!
//! An entry holds the records of the round that every node must apply,
//! byte for byte as the leader's `evt` batch holds them. Records that only
//! describe the leader's own files (a relocation of events to copies, body
//! moves to `msg`, copies) are not in it: each node compacts its own files.

pub(crate) mod image;
pub(crate) mod record;

pub use image::{
    copy_top_files, exchange_dirs, image_info, stage_image, Image, ImageCheck, ImageInfo,
};

use std::collections::VecDeque;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::compaction::record::{MoveBodiesEffect, RelocateEffect};
use super::effect::{Effect, COPY_FLAG};
use super::pending::Pending;
use super::round::Fail;
use super::sequencer::replica::Control;
use super::state::record::Record;
use super::Inbox;
use crate::error::{Error, Result};

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
    st: Mutex<LinkState>,
    cv: Condvar,
    /// Wakes an async consensus layer waiting in
    /// [`Leader::next_entries`]: an entry was handed off, or the
    /// leadership ended (one waiter; a wake with none waiting is kept).
    ready: tokio::sync::Notify,
    /// Wakes every async waiter of [`Leader::settled`]: a commit, or the
    /// end of the leadership.
    decided: tokio::sync::Notify,
    /// The engine whose completion stage finishes the rounds this link
    /// decides (weak: a link must not keep a closed engine open).
    engine: std::sync::Weak<super::shared::Shared>,
}

struct LinkState {
    /// Entries handed off, not yet taken by the consensus layer.
    outbox: VecDeque<Entry>,
    /// Rounds up to this index are committed.
    committed: u64,
    /// Set when the leadership ended: rounds not committed by then fail.
    ended: Option<String>,
}

impl Link {
    pub(crate) fn new(committed: u64, engine: std::sync::Weak<super::shared::Shared>) -> Arc<Link> {
        Arc::new(Link {
            st: Mutex::new(LinkState {
                outbox: VecDeque::new(),
                committed,
                ended: None,
            }),
            cv: Condvar::new(),
            ready: tokio::sync::Notify::new(),
            decided: tokio::sync::Notify::new(),
            engine,
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
    fn finish_decided(&self) {
        if let Some(shared) = self.engine.upgrade() {
            crate::inbox::sequencer::completion::pump(&shared);
        }
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

/// The consensus layer's handle on a leading engine: takes the entries
/// to replicate and tells which are committed.
pub struct Leader {
    link: Arc<Link>,
    /// Weak: a leader handle must not keep a closed engine's files open.
    shared: std::sync::Weak<super::shared::Shared>,
}

impl Leader {
    /// Every entry handed off since the last call, in index order.
    pub fn take_entries(&self) -> Vec<Entry> {
        self.link.st.lock().outbox.drain(..).collect()
    }

    /// Like [`Leader::take_entries`], waiting up to `timeout` for one.
    pub fn wait_entries(&self, timeout: Duration) -> Vec<Entry> {
        let mut st = self.link.st.lock();
        if st.outbox.is_empty() && st.ended.is_none() {
            self.link.cv.wait_for(&mut st, timeout);
        }
        st.outbox.drain(..).collect()
    }

    /// Every entry handed off since the last call, in index order, once
    /// there is one: for a consensus layer that runs as an async task (the
    /// sequencer's hand-off wakes it directly, no thread in between).
    /// Empty once the leadership has ended.
    pub async fn next_entries(&self) -> Vec<Entry> {
        loop {
            {
                let mut st = self.link.st.lock();
                if !st.outbox.is_empty() || st.ended.is_some() {
                    return st.outbox.drain(..).collect();
                }
            }
            self.link.ready.notified().await;
        }
    }

    /// Rounds up to `index` are committed (stored by a majority): their
    /// replies are released once they are durable here too.
    pub fn commit(&self, index: u64) {
        {
            let mut st = self.link.st.lock();
            st.committed = st.committed.max(index);
            self.link.cv.notify_all();
            self.link.decided.notify_waiters();
        }
        self.link.finish_decided();
    }

    /// Ends this leadership now, from outside the sequencer: the rounds
    /// it did not commit fail (`NotLeader`) and none is handed out again.
    /// The consensus layer calls it as soon as it knows another node
    /// leads, before it queues [`Inbox::follow`] behind whatever the
    /// sequencer is doing, which may be waiting for those very rounds (a
    /// replica image's copy drains them).
    pub fn end(&self, why: &str) {
        self.link.end(format!("not the leader: {why}"));
    }

    /// The highest index committed so far.
    pub fn committed(&self) -> u64 {
        self.link.committed()
    }

    /// Waits until every round this engine has applied so far is
    /// committed, or fails with [`Error::NotLeader`] once this leadership
    /// ends first. A leader applies its rounds before they commit, so a
    /// read of its state may see a round the group later discards: the
    /// read's answer goes out only after this returns `Ok` (the rounds it
    /// can have seen were all applied before the call).
    pub async fn settled(&self) -> Result<()> {
        let shared = self.shared.upgrade().ok_or(Error::ShuttingDown)?;
        let applied = shared.state.read().replica_index;
        drop(shared);
        loop {
            let decided = self.link.decided.notified();
            let mut decided = std::pin::pin!(decided);
            // Registered before the check, so a commit between the check
            // and the wait is not missed.
            decided.as_mut().enable();
            {
                let st = self.link.st.lock();
                if st.committed >= applied {
                    return Ok(());
                }
                if let Some(why) = &st.ended {
                    return Err(Error::NotLeader(format!(
                        "a read saw round {applied}, not committed: {why}"
                    )));
                }
            }
            decided.await;
        }
    }

    /// Whether this leadership has ended (the engine follows, discarded
    /// rounds, or leads again under a new handle).
    pub fn is_ended(&self) -> bool {
        self.link.st.lock().ended.is_some()
    }

    /// Blocks until every entry taken so far is durable in this node's
    /// log: an entry is handed off once its batch is submitted, so a flush
    /// after taking it covers it. The consensus layer stores the leader's
    /// own entries this way instead of writing them a second time.
    pub fn flush(&self) -> Result<()> {
        let shared = self.shared.upgrade().ok_or(Error::ShuttingDown)?;
        Ok(shared.evt_log.flush()?)
    }
}

impl Inbox {
    fn control<T>(&self, make: impl FnOnce(mpsc::Sender<Result<T>>) -> Control) -> Result<T> {
        let (tx, rx) = mpsc::channel();
        let sent = match &*self.tx.lock() {
            Some(s) => s.send(super::sequencer::Command::Replica(make(tx))).is_ok(),
            None => false,
        };
        if !sent {
            return Err(Error::ShuttingDown);
        }
        rx.recv().unwrap_or(Err(Error::ShuttingDown))
    }

    /// Makes this engine the leader: from the next round on, rounds are
    /// handed out as entries and answered once committed. Rounds already
    /// in the log count as committed (see [`Inbox::lead_after`] for a
    /// leader whose log has a tail not yet committed).
    pub fn lead(&self) -> Result<Leader> {
        self.lead_after(u64::MAX)
    }

    /// [`Inbox::lead`] for a node whose log may end in rounds it appended
    /// as a follower that are not committed yet: only rounds up to
    /// `committed` count as committed, and an answer resting on a later
    /// one waits for the consensus layer to commit it
    /// ([`Leader::commit`]), as for the leader's own rounds.
    pub fn lead_after(&self, committed: u64) -> Result<Leader> {
        let link = self.control(|tx| Control::Lead { committed, tx })?;
        Ok(Leader {
            link,
            shared: Arc::downgrade(&self.shared),
        })
    }

    /// Makes this engine a follower: client commands are refused with
    /// [`Error::NotLeader`], and a leader's rounds not yet committed fail
    /// with it (their outcome is for the next leader to decide).
    pub fn follow(&self) -> Result<()> {
        self.control(|tx| Control::Follow { tx })
    }

    /// Applies a leader's entry (follower only) as one round: the same
    /// effect application and log append as the leader's, placed in this
    /// node's own log. Answered once durable. An entry that does not follow
    /// [`Inbox::replica_index`] or does not decode is refused with
    /// [`Error::BadRequest`] and changes nothing.
    pub fn apply_entry(&self, entry: Entry) -> Pending<()> {
        let (tx, pending) = Pending::channel();
        let sent = match &*self.tx.lock() {
            Some(s) => s
                .send(super::sequencer::Command::Replica(Control::Apply {
                    entry,
                    tx,
                }))
                .is_ok(),
            None => false,
        };
        if sent {
            pending
        } else {
            Pending::ready(Err(Error::ShuttingDown))
        }
    }

    /// Discards the rounds from index `from` on (leadership lost, or a
    /// follower's tail that conflicts with the new leader's): a leader's
    /// replies not yet released fail with [`Error::NotLeader`] and it
    /// becomes a follower; the log is truncated before the batch of round
    /// `from`, and the state is rebuilt from the checkpoint and the log
    /// that is left, as after a restart. A committed round cannot be
    /// discarded ([`Error::BadRequest`]).
    pub fn discard_from(&self, from: u64) -> Result<()> {
        self.control(|tx| Control::Discard { from, tx })
    }

    /// The replication index of the last round applied (durable once its
    /// reply was released; after a restart, what the log holds): a
    /// follower asks its leader for the entries after it.
    pub fn replica_index(&self) -> u64 {
        self.shared.state.read().replica_index
    }

    /// Reads the entries with indexes in `from..=to` back from this node's
    /// `evt` log, in index order, for a follower that lags: the records of
    /// each batch closed by a round mark. Entries whose batches are no
    /// longer in the log (compacted away) are missing from the answer; the
    /// consensus layer sends such a follower a snapshot instead. It reads
    /// the log from the newest checkpoint (of this process) that precedes
    /// `from`, or from its start: callers keep recent entries in memory.
    pub fn read_entries(&self, from: u64, to: u64) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        if from > to {
            return Ok(out);
        }
        let base = self.shared.round_base_below(from);
        let mut batch: (u64, Vec<(u8, Vec<u8>)>) = (0, Vec::new());
        self.shared
            .evt_log
            .replay(base, &mut |lsn, _, kind, payload| {
                if lsn != batch.0 {
                    batch = (lsn, Vec::new());
                }
                if kind == record::RoundMark::KIND {
                    let index = Effect::decode(kind, payload).ok().and_then(|e| match e {
                        Effect::Replica(record::Records::Mark(m)) => Some(m.index),
                        _ => None,
                    });
                    if let Some(index) = index.filter(|i| (from..=to).contains(i)) {
                        out.push(Entry::new(index, std::mem::take(&mut batch.1)));
                    }
                } else if is_replicated_kind(kind) {
                    batch.1.push((kind, payload.to_vec()));
                }
                Ok(())
            })?;
        Ok(out)
    }

    /// SHA-256 of the canonical state encoding with what is this node's
    /// own left out: log locations (each node places batches in its own
    /// log, and compacts its own files) and the log's LSN. A leader and
    /// its followers that applied the same rounds have equal digests.
    #[doc(hidden)]
    pub fn replica_digest(&self) -> [u8; 32] {
        let st = self.shared.state.read().clone();
        image::digest_of(&st)
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
