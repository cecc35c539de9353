//! Replication, engine side: a committed round as one self-contained
//! [`Entry`], the leader's hand-off of entries and its commit point
//! ([`Leader`]), a follower's apply of an entry, and the rollback of
//! rounds that will never commit ([`Inbox::discard_from`]). The consensus
//! layer (raft) sits on top of this API; see `docs/CLUSTER.md`. The entry
//! and the leader's link are in `link.rs`, below the sequencer that hands
//! entries to it.
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
pub(crate) mod link;
pub(crate) mod record;

pub use image::{
    copy_top_files, exchange_dirs, image_info, stage_image, Image, ImageCheck, ImageInfo,
};
pub use link::Entry;
use link::{is_replicated_kind, Link};

use std::sync::{mpsc, Arc};
use std::time::Duration;

use super::effect::Effect;
use super::handle::Inbox;
use super::pending::Pending;
use super::sequencer::replica::Control;
use super::state::record::Record;
use crate::error::{Error, Result};

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
