//! The sequencer: a generic round-and-commit engine.
//!
//! It takes commands of any type that implements [`Exec`] (the engine's is
//! `inbox/command.rs`, which hands each to the subsystem that owns it),
//! lets each decide against the state and give back effects and a reply
//! through a [`Sink`], applies the effects, batches their records, commits
//! the batches and passes the round to the completion stage
//! ([`completion`]), which releases the replies once the round is durable.
//! It knows nothing of messages, devices, snapshots or compaction, and
//! imports none of them: only effects (a message's body travels inside its
//! effect; a device row's change tells the ack views what it replaces,
//! [`Effect::device_row_before`]), replies, rounds and checkpoints. It
//! does name the replica link and recovery: a change of replication role
//! stops its rounds and reloads the state.
//!
//! The sequencer takes whatever commands are queued as one *round*: it
//! decides and applies each in order (so the next one sees its effects),
//! then writes the round's effects as one `evt` batch: one write and one
//! fdatasync of one log commit the round, bodies included. It queues the
//! `evt` ticket for the completion stage, which the log's writer runs once
//! the batch is durable, and goes on with the next round while that one
//! syncs (pipelining).
//!
//! Replication (`replica.rs`): in the default *local* role the above is
//! all. A *leader* closes each round that changes state with a round mark
//! and hands its records out as an entry; the completion stage releases
//! its replies once the consensus layer has committed it too. A
//! *follower* refuses client commands and runs each leader's entry as a
//! round of its own through the same sink.
//!
//! Checkpoints: the sequencer drains the pipeline and copies the state (so
//! the copy is the state at one LSN; users and conversations are shared,
//! copy on write), then hands the copy to the checkpoint-writer thread and
//! goes on; the encoding, the file's write and its fsyncs never stall a
//! round. At most one periodic checkpoint is queued or in flight;
//! a `Checkpoint` command is answered by the writer once its file is
//! durable; at shutdown the final one is handed off last and waited for.
//!
//! Failure rules:
//! - A write or fsync failure poisons the engine: that round and every
//!   later one fail, and no later mutation is accepted (fail-stop, R21).
//! - A full disk is met before a client's command changes anything: a
//!   round of client commands first asks the log for the room its batch
//!   will find (`Log::room`, which prepares the next segment if it must),
//!   and a command that might not fit what is left starts a new round.
//!   When even the first command might not fit, the round is *refused*:
//!   its commands are decided against the state but their effects are not
//!   applied, and if any had one, every reply of the round fails with
//!   `NoSpace` (a round of commands with no effect is answered). Refusing
//!   costs nothing, and the state never held the refused changes.
//! - A sync in a refused round that kept its device's generation is still
//!   served (all it loses is its `last_seen` refresh): a full disk stops
//!   writes, not syncs.
//! - `NoSpace` on submit all the same (a round of compaction's commands,
//!   which have no small bound and free the disk, so they are never
//!   refused ahead; or another writer of the log took the spare): nothing
//!   of the round is durable; the sequencer waits for earlier rounds, then
//!   reloads the state from the checkpoint and the log, so the failed round
//!   leaves no trace in memory.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::placement::Placement;

use super::effect::Effect;
use super::recover;
use super::round::round_bytes_max;
use super::round::{Env, Exec, Fail, ReplyFn, Sink};
use super::shared::Shared;
use super::state::record::Touched;
use super::state::{body_in_evt, pack, State, PENDING_LOC};
use crate::api::*;
use crate::error::{Error, Result};
use crate::log::{AppendTicket, Batch, LogError};

pub(crate) mod checkpoints;
pub(crate) mod completion;
pub(crate) mod completion_queue;
pub(crate) mod replica;

use completion_queue::{Outcome, RoundDone};
use replica::Role;

/// At most this many commands per round, to bound a round's latency.
const ROUND_COMMANDS_MAX: usize = 4096;

/// A command for the sequencer: one to run (`C`: see [`Exec`]), or a
/// control command.
pub(crate) enum Command<C> {
    Run(C),
    /// Write a checkpoint now; answered once it is durable.
    Checkpoint {
        tx: mpsc::Sender<Result<()>>,
    },
    /// Finish the rounds in hand, write the final checkpoint and stop.
    Shutdown {
        tx: mpsc::Sender<Result<()>>,
    },
    /// Replication: change role, apply an entry, discard rounds. Runs in
    /// order with the commands around it, each round closed first.
    Replica(replica::Control),
    /// Nothing to run: the sequencer's thread looks at what is due (a
    /// periodic checkpoint) after a round that ran on a caller's thread
    /// ([`Core::run_here`]) found one due.
    Tick,
}

#[derive(Default)]
struct RoundBuf {
    /// The round's `evt` batch: each effect encoded once, into the frame
    /// the log writes, as it is decided.
    evt: Batch,
    /// Index entries that point at a record of this round, patched with
    /// its location once the batch is placed: events, and messages whose
    /// body is in the record.
    event_patches: Vec<(Uid, SyncSeq, usize)>,
    body_patches: Vec<(ConvId, MsgSeq, usize)>,
    replies: Vec<ReplyFn>,
    /// The newest event of each user and message of each conversation the
    /// round appended, one entry per change (duplicates are folded by the
    /// completion stage, which raises the committed marks to them).
    user_marks: Vec<(Uid, SyncSeq)>,
    conv_marks: Vec<(ConvId, MsgSeq)>,
    /// Framed bytes of the records gathered so far (see [`round_bytes_max`]; also what counts towards the next periodic
    /// checkpoint).
    size: u64,
    /// A leader's round: the link to its consensus layer and the round's
    /// replication index (see `replica.rs`).
    replica: Option<(Arc<crate::inbox::replica::link::Link>, u64)>,
    /// Frame bytes the log guaranteed this round's batch when its first
    /// command came (see [`crate::log::Log::room`]).
    room: Option<u64>,
    /// The disk had no room for the round's first command: its commands
    /// are decided but nothing is applied or written.
    refused: bool,
    /// A refused round had a command with an effect.
    refused_effects: bool,
}

/// Bytes a batch needs beyond its records: the batch header, and a
/// leader's round mark.
const ROUND_SLACK_BYTES: u64 = 256;

/// The round as the subsystems see it.
struct RoundSink<'a> {
    shared: &'a Shared,
    round: &'a mut RoundBuf,
    round_id: u64,
}

impl Sink for RoundSink<'_> {
    fn effect(&mut self, st: &mut State, effect: Effect) {
        let r = &mut *self.round;
        if r.refused {
            // Nothing can be written: the change is not made at all.
            r.refused_effects = true;
            return;
        }
        let idx = r.evt.len();
        let mut touched = Touched::default();
        let device_change = effect.device_row_before(st);
        if let Err(e) = effect.apply(st, PENDING_LOC, self.round_id, &mut touched) {
            // The decision was made on this very state, so this is a bug;
            // stop writing rather than log something inconsistent.
            self.shared.poison(format!(
                "broken invariant: decided effect does not apply: {}",
                e.0
            ));
        }
        if let Some((uid, device, before)) = device_change {
            let settled = self.shared.progress.lock().settled;
            (self.shared.ack_views).changed(uid, device, before, self.round_id, settled);
        }
        for (uid, seq) in touched.events {
            r.event_patches.push((uid, seq, idx));
            r.user_marks.push((uid, seq));
        }
        if let Some((conv, seq)) = touched.conv {
            r.conv_marks.push((conv, seq));
        }
        if let Some((conv, seq)) = touched.body {
            r.body_patches.push((conv, seq, idx));
        }
        let before = r.evt.encoded_len();
        r.evt
            .push_with(effect.record_kind(), |out| effect.encode_into(out));
        r.size += r.evt.encoded_len() - before;
    }

    fn reply(&mut self, reply: ReplyFn) {
        self.round.replies.push(reply);
    }
}

pub(crate) struct Sequencer<C: Exec> {
    shared: Arc<Shared>,
    /// The checkpoint writer's queue; dropped when the sequencer stops, which
    /// lets the writer finish the final checkpoint and exit.
    checkpoints: mpsc::Sender<checkpoints::Job>,
    /// Set while a periodic checkpoint is queued or being written.
    periodic_busy: Arc<AtomicBool>,
    /// What the commands need besides the state, held for them.
    services: C::Services,
    next_round: u64,
    bytes_since_checkpoint: u64,
    /// Who commits the rounds: the local log alone, or a consensus layer.
    role: Role,
}

impl<C: Exec> Sequencer<C> {
    pub fn new(
        shared: Arc<Shared>,
        checkpoints: mpsc::Sender<checkpoints::Job>,
        services: C::Services,
    ) -> Self {
        Self {
            shared,
            checkpoints,
            periodic_busy: Arc::new(AtomicBool::new(false)),
            services,
            next_round: 1,
            bytes_since_checkpoint: 0,
            role: Role::Local,
        }
    }

    /// Runs `cmds` (what the queue held, in order) as one round or more:
    /// decides and applies each, writes and commits the rounds, then runs
    /// the control commands among them. Returns whether a `Shutdown` was
    /// among them. The periodic checkpoint is the caller's
    /// ([`Sequencer::checkpoint_if_due`]).
    fn run_commands(&mut self, cmds: Vec<Command<C>>, placement: Option<&mut Placement>) -> bool {
        let commands = cmds.len();
        let mut control = Vec::new();
        let mut round = RoundBuf::default();
        let mut id = self.next_round;
        let bytes_max = round_bytes_max(self.shared.config.segment_bytes);
        for cmd in cmds {
            match cmd {
                c @ (Command::Checkpoint { .. } | Command::Shutdown { .. }) => control.push(c),
                Command::Run(c) => {
                    // A client's command joins a round that has room
                    // for it; compaction's commands (no bound) run in
                    // rounds of their own, as before the room check.
                    let need = c
                        .record_bytes_max(&self.shared.config)
                        .map(|bound| bound.min(bytes_max) + ROUND_SLACK_BYTES);
                    let fits = match need {
                        Some(need) => round
                            .room
                            .is_some_and(|room| round.refused || round.size + need <= room),
                        None => round.room.is_none(),
                    };
                    if !fits && (!round.replies.is_empty() || round.room.is_some()) {
                        self.next_round += 1;
                        self.finish_round(id, std::mem::take(&mut round));
                        id = self.next_round;
                    }
                    if let (Some(need), None) = (need, round.room) {
                        self.open_round(&mut round, need);
                    }
                    self.exec(c, id, &mut round);
                    if round.size >= bytes_max && !round.replies.is_empty() {
                        self.next_round += 1;
                        self.finish_round(id, std::mem::take(&mut round));
                        id = self.next_round;
                    }
                }
                Command::Tick => {}
                Command::Replica(c) => {
                    if !round.replies.is_empty() {
                        self.next_round += 1;
                        self.finish_round(id, std::mem::take(&mut round));
                    }
                    self.replica(c);
                    // The rows may now come from another node's rounds.
                    self.shared.ack_views.clear();
                    id = self.next_round;
                }
            }
        }
        if !round.replies.is_empty() {
            self.next_round += 1;
            self.finish_round(id, round);
        }
        self.commit_submitted();
        // Here, just after the round's fdatasync returned (when this
        // thread wrote the round, as it does whenever the writer thread
        // is idle, which light load means): the thread runs where the
        // kernel woke it, near the disk's completions, which is where a
        // gathered pipeline waits for them best.
        if let Some(gathered) = placement.and_then(|p| p.after_round(commands)) {
            self.shared
                .pipeline_on_one_cpu
                .store(gathered, Ordering::Relaxed);
            tracing::debug!(gathered, "write pipeline placement changed");
        }
        let mut stop = false;
        for c in control {
            match c {
                Command::Checkpoint { tx } => {
                    self.checkpoint(checkpoints::Done::Caller(tx));
                }
                Command::Shutdown { tx } => {
                    // Rounds the consensus layer has not committed
                    // will not be now.
                    self.end_leadership("the engine is shutting down");
                    let flushed = self.drain().and_then(|()| {
                        self.shared.msg_log.flush()?;
                        self.shared.evt_log.flush()?;
                        Ok(())
                    });
                    // The final checkpoint queues behind any earlier
                    // one; the caller hears back once it is durable.
                    match flushed {
                        Ok(()) => self.checkpoint(checkpoints::Done::Caller(tx)),
                        Err(e) => drop(tx.send(Err(e))),
                    }
                    stop = true;
                }
                _ => {}
            }
        }
        stop
    }

    /// Whether enough has been written since the last checkpoint for a
    /// periodic one, and none is queued or in flight.
    fn checkpoint_due(&self) -> bool {
        self.bytes_since_checkpoint >= self.checkpoint_every()
            && !self.periodic_busy.load(Ordering::Acquire)
    }

    /// Log bytes between periodic checkpoints: `checkpoint_every_bytes`,
    /// or `checkpoint_every_state_percent` of the newest checkpoint's size
    /// if that is more.
    fn checkpoint_every(&self) -> u64 {
        let config = &self.shared.config;
        let newest = self.shared.newest_checkpoint_bytes.load(Ordering::Relaxed);
        let share = newest.saturating_mul(u64::from(config.checkpoint_every_state_percent)) / 100;
        config.checkpoint_every_bytes.max(share)
    }

    /// Starts a periodic checkpoint if one is due. Skipped while one is
    /// still in flight: its bytes count towards the next, and no second
    /// image piles up in memory.
    fn checkpoint_if_due(&mut self) {
        if self.checkpoint_due() {
            self.periodic_busy.store(true, Ordering::Release);
            let busy = Arc::clone(&self.periodic_busy);
            self.checkpoint(checkpoints::Done::Periodic(busy));
        }
    }

    /// Writes and commits the rounds' batches submitted so far, here on
    /// the sequencer's thread while the log's writer thread is idle (else
    /// that thread does). New commands gather in the queue meanwhile and
    /// make the next round, as they would behind the writer thread; what
    /// this saves is waking that thread and waiting for it. Called before
    /// anything that waits for a round to finish.
    fn commit_submitted(&self) {
        self.shared.evt_log.commit_inline();
    }

    /// Commits what was submitted and waits until every round up to
    /// `round` is finished. The pump finishes rounds whose batches a log
    /// poisoned off a pass will never write (an inline segment prepare
    /// that failed); durable ones are finished by the pass that wrote
    /// them.
    fn wait_finished(&self, round: u64) {
        self.commit_submitted();
        completion::pump(&self.shared);
        self.shared.wait_settled(round);
    }

    /// Waits until every submitted round is finished.
    fn drain(&self) -> Result<()> {
        self.wait_finished(self.next_round - 1);
        match self.shared.poisoned() {
            Some(m) => Err(Error::Log(LogError::Poisoned(m))),
            None => Ok(()),
        }
    }

    /// Drains the pipeline, copies the state at its LSN and hands the copy
    /// to the writer thread, which encodes and writes it; `done` hears how
    /// the write went.
    fn checkpoint(&mut self, done: checkpoints::Done) {
        if let Err(e) = self.drain() {
            done.finish(0, Err(e));
            return;
        }
        // A copy in O(users + conversations): the entries are shared, and
        // the writer thread encodes it while rounds go on (copy on write).
        let state = Box::new(self.shared.state.read().clone());
        self.bytes_since_checkpoint = 0;
        let lsn = state.evt_lsn;
        self.shared.note_round_base(state.replica_index, lsn);
        let job = checkpoints::Job::Write { state, done };
        if let Err(mpsc::SendError(checkpoints::Job::Write { done, .. })) =
            self.checkpoints.send(job)
        {
            done.finish(lsn, Err(Error::ShuttingDown));
        }
    }

    /// Waits until the writer has finished every checkpoint handed to it,
    /// so a reload from disk never races a file being renamed or pruned.
    fn wait_checkpoints(&self) {
        let (tx, rx) = mpsc::channel();
        if self.checkpoints.send(checkpoints::Job::Barrier(tx)).is_ok() {
            let _ = rx.recv();
        }
    }

    fn exec(&mut self, cmd: C, round_id: u64, r: &mut RoundBuf) {
        if let Some(m) = self.shared.poisoned() {
            cmd.fail(&Fail::Poisoned(m));
            return;
        }
        if let Role::Follower = self.role {
            cmd.fail(&Fail::NotLeader(
                "this node follows; send to the leader".into(),
            ));
            return;
        }
        let env = Env {
            now: self.shared.config.clock.now_ms(),
            shared: &self.shared,
        };
        let mut st = self.shared.state.write();
        let st = &mut *st;
        let mut sink = RoundSink {
            shared: &self.shared,
            round: r,
            round_id,
        };
        cmd.exec(st, &mut sink, &env, &self.services);
    }

    /// Asks the log for the room the round's batch will find, wanting at
    /// least `need` bytes (the first command's bound): the log prepares the
    /// next segment now if the active one has less. Without room for
    /// `need`, the disk is full, and the round is refused.
    fn open_round(&self, r: &mut RoundBuf, need: u64) {
        // A poisoned log: `write_round` fails the round.
        let room = self.shared.evt_log.room(need).unwrap_or(u64::MAX);
        r.room = Some(room);
        if room < need {
            r.refused = true;
            self.shared
                .rounds_refused_for_space
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn finish_round(&mut self, id: u64, mut r: RoundBuf) {
        if let (true, Some(room)) = (r.refused, r.room) {
            let outcome = if r.refused_effects {
                Outcome::Failed(Fail::NoSpace(format!(
                    "the disk has no room for the next segment of the evt log \
                     ({room} bytes left in the active one)"
                )))
            } else {
                Outcome::Nothing
            };
            // A refused round applied nothing, so it marks nothing.
            debug_assert!(r.user_marks.is_empty() && r.conv_marks.is_empty());
            self.hold_behind_uncommitted(&outcome, &mut r);
            self.queue_for_completion(id, outcome, &mut r);
            return;
        }
        let outcome = match self.write_round(&mut r) {
            Ok(Some(ticket)) => Outcome::Ticket(ticket),
            Ok(None) => Outcome::Nothing,
            Err(Fail::NoSpace(m)) => {
                // Nothing of this round is durable: wait for the earlier
                // rounds, then rebuild memory from disk so no trace of it
                // stays behind.
                self.wait_finished(id - 1);
                self.wait_checkpoints();
                self.shared
                    .state_reloads_for_space
                    .fetch_add(1, Ordering::Relaxed);
                match recover::load_state(&self.shared.config, &self.shared.evt_log) {
                    Ok(state) => {
                        *self.shared.state.write() = state;
                        self.shared.ack_views.clear();
                    }
                    Err(e) => self
                        .shared
                        .poison(format!("reload after ENOSPC failed: {e}")),
                }
                Outcome::Failed(Fail::NoSpace(m))
            }
            Err(f @ Fail::NotLeader(_)) => Outcome::Failed(f),
            Err(f @ Fail::Poisoned(_)) => {
                if let Fail::Poisoned(m) = &f {
                    self.shared.poison(m.clone());
                }
                Outcome::Failed(f)
            }
        };
        self.bytes_since_checkpoint += r.size;
        self.hold_behind_uncommitted(&outcome, &mut r);
        self.queue_for_completion(id, outcome, &mut r);
    }

    /// A leader's round that hands out no entry of its own (an idempotent
    /// retry answered from the table, a refusal decided against the
    /// state, a round of this node's own files) still answers from a
    /// state that holds every round applied before it, committed or not.
    /// Its replies wait for the last of those rounds to commit, and fail
    /// with `NotLeader` if the leadership ends first: an answer never
    /// rests on a round the group may discard.
    fn hold_behind_uncommitted(&self, outcome: &Outcome, r: &mut RoundBuf) {
        let Role::Leader(link) = &self.role else {
            return;
        };
        if r.replica.is_some() || matches!(outcome, Outcome::Failed(_)) {
            return;
        }
        let applied = self.shared.state.read().replica_index;
        r.replica = Some((Arc::clone(link), applied));
    }

    /// Hands round `id` with its outcome, replies and marks to the
    /// completion stage.
    fn queue_for_completion(&self, id: u64, outcome: Outcome, r: &mut RoundBuf) {
        completion::submit(
            &self.shared,
            RoundDone {
                id,
                outcome,
                replies: std::mem::take(&mut r.replies),
                replica: r.replica.take(),
                user_marks: std::mem::take(&mut r.user_marks),
                conv_marks: std::mem::take(&mut r.conv_marks),
            },
        );
    }

    /// Writes the round: one `evt` batch, submitted without waking the
    /// log's writer thread (`commit_submitted` writes it, or that thread
    /// does).
    fn write_round(&self, r: &mut RoundBuf) -> std::result::Result<Option<AppendTicket>, Fail> {
        if let Some(m) = self
            .shared
            .poisoned()
            .or_else(|| self.shared.check_msg_log())
        {
            return Err(Fail::Poisoned(m));
        }
        if r.evt.is_empty() {
            return Ok(None);
        }
        let entry = match &self.role {
            Role::Leader(link) => self.mark_round(link, r),
            _ => None,
        };
        let ticket = self
            .shared
            .evt_log
            .submit_deferred(std::mem::take(&mut r.evt))
            .map_err(|e| Fail::from_log(&e))?;
        {
            let mut st = self.shared.state.write();
            for &(uid, seq, idx) in &r.event_patches {
                let loc = ticket.locs.get(idx).map_or(PENDING_LOC, |l| pack(*l));
                st.patch_event(uid, seq, loc);
            }
            for &(conv, seq, idx) in &r.body_patches {
                let loc = ticket.locs.get(idx).map_or(PENDING_LOC, |l| pack(*l));
                st.patch_msg(conv, seq, body_in_evt(loc));
            }
            st.evt_lsn = ticket.lsn;
        }
        if let (Some(entry), Some((link, _))) = (entry, &r.replica) {
            link.hand_off(entry);
        }
        Ok(Some(ticket))
    }
}

/// The sequencer's queue: a sender that counts the commands queued and
/// not yet taken by the sequencer's thread (which takes them under the
/// lock and runs them before it lets go), so that a caller may run a
/// command on its own thread ([`Core::run_here`]) only when nothing waits
/// ahead of it.
pub(crate) struct Queue<C> {
    tx: mpsc::Sender<Command<C>>,
    queued: Arc<AtomicUsize>,
}

impl<C> Clone for Queue<C> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            queued: Arc::clone(&self.queued),
        }
    }
}

impl<C> Queue<C> {
    /// Queues `cmd` for the sequencer's thread; fails once it has stopped.
    pub fn send(&self, cmd: Command<C>) -> std::result::Result<(), mpsc::SendError<Command<C>>> {
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.tx.send(cmd).inspect_err(|_| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        })
    }
}

/// The sequencer, shared by its thread and by callers that run a command
/// on their own thread. Whoever holds the lock runs rounds; the sequencer
/// is taken out when its thread stops, which drops the checkpoint
/// writer's queue and the commands' services and so lets those threads
/// end.
pub(crate) struct Core<C: Exec> {
    seq: Mutex<Option<Sequencer<C>>>,
    /// Commands queued and not yet taken (see [`Queue`]).
    queued: Arc<AtomicUsize>,
}

/// How long [`Core::run_here`] waits for the sequencer's thread to
/// finish a round in hand before it queues its command instead.
const HERE_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(50);

/// Makes the sequencer's queue, the core callers share, and what its
/// thread runs.
pub(crate) fn start<C: Exec>(
    seq: Sequencer<C>,
) -> (Queue<C>, Arc<Core<C>>, impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let colocate = seq.shared.config.colocate_when_light;
    let core = Arc::new(Core {
        seq: Mutex::new(Some(seq)),
        queued: Arc::clone(&queued),
    });
    let thread_core = Arc::clone(&core);
    (Queue { tx, queued }, core, move || {
        thread_core.run(rx, colocate)
    })
}

impl<C: Exec> Core<C> {
    /// The sequencer's thread: takes whatever commands are queued as the
    /// next round, until a `Shutdown` or until every sender is gone.
    fn run(&self, rx: mpsc::Receiver<Command<C>>, colocate: bool) {
        // Made here: it places the thread it runs on.
        let mut placement = Placement::new(colocate);
        while let Ok(first) = rx.recv() {
            let mut cmds = vec![first];
            while cmds.len() < ROUND_COMMANDS_MAX {
                match rx.try_recv() {
                    Ok(c) => cmds.push(c),
                    Err(_) => break,
                }
            }
            let taken = cmds.len();
            let mut guard = self.seq.lock();
            // Taken, and run before the lock is let go: a caller that
            // finds nothing queued and then takes the lock runs after
            // them.
            self.queued.fetch_sub(taken, Ordering::SeqCst);
            let Some(seq) = guard.as_mut() else { break };
            if seq.run_commands(cmds, Some(&mut placement)) {
                // Stopped for good: nothing runs after the shutdown's
                // final checkpoint.
                drop(guard.take());
                return;
            }
            seq.checkpoint_if_due();
        }
        drop(self.seq.lock().take());
    }

    /// Runs `cmd` as a round of its own on the calling thread, which waits
    /// for its write and fdatasync (unless the log's writer thread is
    /// busy and commits it): no hand-off to the sequencer's thread and
    /// back. Only when that changes no order: nothing is queued ahead
    /// (a round the sequencer's thread has in hand is waited for, up to
    /// [`HERE_WAIT_MAX`]), and this node commits alone (a leader's rounds
    /// go through the consensus layer, a follower refuses). Otherwise
    /// gives `cmd` back, to be queued.
    pub fn run_here(&self, cmd: C, queue: &Queue<C>) -> Option<C> {
        // The sequencer's thread may be finishing a round it took before
        // (its commands no longer count as queued): wait for it as a
        // queued command would, but not for long.
        let Some(mut guard) = self.seq.try_lock_for(HERE_WAIT_MAX) else {
            return Some(cmd);
        };
        let Some(seq) = guard.as_mut() else {
            return Some(cmd);
        };
        if self.queued.load(Ordering::SeqCst) != 0 || !matches!(seq.role, Role::Local) {
            return Some(cmd);
        }
        seq.run_commands(vec![Command::Run(cmd)], None);
        // A periodic checkpoint drains the pipeline and copies the state:
        // the sequencer's thread does that, not a caller.
        let due = seq.checkpoint_due();
        drop(guard);
        if due {
            let _ = queue.send(Command::Tick);
        }
        None
    }
}
