//! The sequencer's side of replication (`inbox/replica/`): its role, the
//! commit seam a leader's rounds go through, a follower's apply of an
//! entry, and the rollback of discarded rounds.
//!
//! The seam: in the local role a round is committed once its `evt` batch
//! is durable, as always (no copy, no extra hand-off). In the leader role
//! the round's batch is closed by a round mark, its replicated records are
//! copied into an [`Entry`] handed to the consensus layer, and the
//! completion stage releases the replies once the batch is durable *and*
//! the entry is committed ([`Link::wait_committed`]).

use std::sync::{mpsc, Arc};

use super::{RoundBuf, RoundSink, Sequencer};
use crate::error::{Error, Result};
use crate::inbox::checkpoint;
use crate::inbox::effect::Effect;
use crate::inbox::pending::Reply;
use crate::inbox::recover;
use crate::inbox::replica::link::{is_replicated_kind, Entry, Link};
use crate::inbox::replica::record::RoundMark;
use crate::inbox::round::{reply_with, Exec, Fail, Sink, Tx};
use crate::inbox::state::record::{Record, Touched};
use crate::inbox::state::{State, PENDING_LOC};
use crate::log::LogError;

/// Who commits this node's rounds.
pub(crate) enum Role {
    /// A single node: durable in the local log is committed.
    Local,
    /// Rounds are handed to the consensus layer through the link.
    Leader(Arc<Link>),
    /// Rounds come from the leader as entries; client commands are refused.
    Follower,
}

/// Replication commands for the sequencer, run in order with the rounds.
pub(crate) enum Control {
    Lead {
        /// Rounds up to this index count as committed (capped at the
        /// rounds applied).
        committed: u64,
        tx: mpsc::Sender<Result<Arc<Link>>>,
    },
    Follow {
        tx: mpsc::Sender<Result<()>>,
    },
    Apply {
        entry: Entry,
        tx: Tx<()>,
    },
    Discard {
        from: u64,
        tx: mpsc::Sender<Result<()>>,
    },
    /// A copy of the state once every round in hand has settled (on a
    /// leader: committed), as a periodic checkpoint takes it: for a
    /// replica image.
    Copy {
        tx: mpsc::Sender<Result<Box<State>>>,
    },
}

impl<C: Exec> Sequencer<C> {
    pub(super) fn replica(&mut self, c: Control) {
        match c {
            Control::Lead { committed, tx } => {
                let committed = committed.min(self.shared.state.read().replica_index);
                // The link lets the completion stage finish the rounds a
                // commit decides; it holds the engine weakly.
                let engine = Arc::downgrade(&self.shared);
                let on_decided = Box::new(move || {
                    if let Some(shared) = engine.upgrade() {
                        super::completion::pump(&shared);
                    }
                });
                let link = Link::new(committed, on_decided);
                self.end_leadership("a new term began");
                self.role = Role::Leader(Arc::clone(&link));
                let _ = tx.send(Ok(link));
            }
            Control::Follow { tx } => {
                self.end_leadership("this node no longer leads");
                self.role = Role::Follower;
                let _ = tx.send(Ok(()));
            }
            Control::Apply { entry, tx } => self.apply_entry(entry, tx),
            Control::Discard { from, tx } => {
                let _ = tx.send(self.discard_from(from));
            }
            Control::Copy { tx } => {
                // O(users + conversations): the entries are shared, copy
                // on write, so rounds go on while the image is written.
                let copy = self
                    .drain()
                    .map(|()| Box::new(self.shared.state.read().clone()));
                let _ = tx.send(copy);
            }
        }
    }

    /// Ends a leadership, if this node leads: rounds not committed fail.
    pub(super) fn end_leadership(&mut self, why: &str) {
        if let Role::Leader(link) = &self.role {
            link.end(format!("not the leader: {why}"));
        }
    }

    /// Leader only: closes the round with its round mark and copies its
    /// replicated records into an entry. A round with none (it only
    /// touched this node's files) is neither marked nor handed out.
    pub(super) fn mark_round(&self, link: &Arc<Link>, r: &mut RoundBuf) -> Option<Entry> {
        let records: Vec<(u8, Vec<u8>)> = r
            .evt
            .records()
            .filter(|(kind, _)| is_replicated_kind(*kind))
            .map(|(kind, payload)| (kind, payload.to_vec()))
            .collect();
        if records.is_empty() {
            return None;
        }
        let index = {
            let mut st = self.shared.state.write();
            let mark = Effect::from(RoundMark {
                index: st.replica_index + 1,
            });
            if let Err(e) = mark.apply(&mut st, PENDING_LOC, 0, &mut Touched::default()) {
                self.shared
                    .poison(format!("broken invariant: round mark: {}", e.0));
            }
            r.evt
                .push_with(mark.record_kind(), |out| mark.encode_into(out));
            st.replica_index
        };
        r.replica = Some((Arc::clone(link), index));
        Some(Entry::new(index, records))
    }

    /// Follower only: applies a leader's entry as one round of its own.
    fn apply_entry(&mut self, entry: Entry, tx: Tx<()>) {
        let refuse = |tx: Tx<()>, e: Error| {
            let _ = tx.send(Reply::Done(Err(e)));
        };
        if let Some(m) = self.shared.poisoned() {
            return refuse(tx, Fail::Poisoned(m).to_error());
        }
        if !matches!(self.role, Role::Follower) {
            return refuse(
                tx,
                Error::BadRequest("only a follower applies a leader's entries".into()),
            );
        }
        let mut effects = Vec::with_capacity(entry.records().len() + 1);
        for (kind, payload) in entry.records() {
            let bad = |why: String| {
                Error::BadRequest(format!(
                    "entry {}: record kind {kind}: {why}",
                    entry.index()
                ))
            };
            if !is_replicated_kind(*kind) {
                return refuse(tx, bad("not a replicated record".into()));
            }
            let effect = match Effect::decode(*kind, payload) {
                Ok(e) => e,
                Err(e) => return refuse(tx, bad(e.0.to_string())),
            };
            // Written back exactly as the leader's batch holds it.
            if effect.encode() != *payload {
                return refuse(tx, bad("not in canonical encoding".into()));
            }
            effects.push(effect);
        }
        let applied = self.shared.state.read().replica_index;
        if entry.index() != applied + 1 {
            return refuse(
                tx,
                Error::BadRequest(format!(
                    "entry {} does not follow replication index {applied}",
                    entry.index()
                )),
            );
        }
        effects.push(Effect::from(RoundMark {
            index: entry.index(),
        }));
        let id = self.next_round;
        self.next_round += 1;
        let mut round = RoundBuf::default();
        {
            let mut st = self.shared.state.write();
            let mut sink = RoundSink {
                shared: &self.shared,
                round: &mut round,
                round_id: id,
            };
            for effect in effects {
                sink.effect(&mut st, effect);
            }
            sink.reply(reply_with(tx, Ok(())));
        }
        self.finish_round(id, round);
    }

    /// Drops the rounds from `from` on and rebuilds the state from what is
    /// left (see [`crate::Inbox::discard_from`]).
    fn discard_from(&mut self, from: u64) -> Result<()> {
        if from == 0 {
            return Err(Error::BadRequest("replication indexes start at 1".into()));
        }
        if let Role::Leader(link) = &self.role {
            let committed = link.committed();
            if from <= committed {
                return Err(Error::BadRequest(format!(
                    "round {from} is committed (up to {committed}); it cannot be discarded"
                )));
            }
        }
        self.end_leadership(&format!("rounds from {from} on were discarded"));
        if matches!(self.role, Role::Leader(_)) {
            self.role = Role::Follower;
        }
        // Every round in hand finishes (the discarded ones fail), so no
        // reply is pending on what is about to go.
        self.wait_finished(self.next_round - 1);
        self.wait_checkpoints();
        if let Some(m) = self.shared.poisoned() {
            return Err(Error::Log(LogError::Poisoned(m)));
        }
        if from > self.shared.state.read().replica_index {
            return Ok(());
        }
        let evt = &self.shared.evt_log;
        evt.flush()?;
        let Some(first) = self.round_lsn(from)? else {
            return Ok(());
        };
        let keep = first - 1;
        // Compaction may have acted on a relocation or body move (deleted
        // the old file): dropping its record would lose data.
        let mut local = None;
        evt.replay(keep, &mut |lsn, _, kind, _| {
            if !is_replicated_kind(kind) && kind != RoundMark::KIND && local.is_none() {
                local = Some(lsn);
            }
            Ok(())
        })?;
        if let Some(lsn) = local {
            let why = format!(
                "discarding rounds from {from} would drop this node's compaction record at LSN {lsn}; restart and resynchronise"
            );
            self.shared.poison(why.clone());
            return Err(Error::Log(LogError::Poisoned(why)));
        }
        let rebuilt = self
            .drop_checkpoints_after(keep)
            .and_then(|()| Ok(evt.truncate_after(keep)?))
            .and_then(|()| recover::load_state(&self.shared.config, evt));
        match rebuilt {
            Ok(state) => {
                *self.shared.state.write() = state;
                self.shared.ack_views.clear();
                self.shared.forget_round_bases_after(keep);
                tracing::warn!(
                    from,
                    lsn = keep,
                    "replicated rounds discarded; state rebuilt"
                );
                Ok(())
            }
            Err(e) => {
                self.shared
                    .poison(format!("rebuild after discarding rounds failed: {e}"));
                Err(e)
            }
        }
    }

    /// The LSN of the batch that holds round `index`'s mark, if the log
    /// still holds it.
    fn round_lsn(&self, index: u64) -> Result<Option<u64>> {
        let mut found = None;
        self.shared
            .evt_log
            .replay(0, &mut |lsn, _, kind, payload| {
                if found.is_none() && kind == RoundMark::KIND {
                    if let Ok(Effect::Replica(m)) = Effect::decode(kind, payload) {
                        let crate::inbox::replica::record::Records::Mark(m) = m;
                        if m.index == index {
                            found = Some(lsn);
                        }
                    }
                }
                Ok(())
            })?;
        Ok(found)
    }

    /// Removes the checkpoints that cover a batch about to be dropped (a
    /// follower's, whose rounds settle once durable).
    fn drop_checkpoints_after(&self, keep: u64) -> Result<()> {
        let data = &self.shared.config.data_dir;
        let io = self.shared.evt_log.io();
        let mut removed = false;
        for (lsn, path) in checkpoint::list(data)? {
            if lsn > keep {
                io.remove(&path).map_err(LogError::Io)?;
                removed = true;
            }
        }
        if removed {
            io.sync_dir(&checkpoint::dir(data)).map_err(LogError::Io)?;
            self.shared
                .know_checkpoints(&checkpoint::durable_list(data)?);
        }
        Ok(())
    }
}
