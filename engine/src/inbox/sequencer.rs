//! The sequencer thread and the completion stage.
//!
//! The sequencer takes whatever commands are queued as one *round*: it
//! decides and applies each in order (so the next one sees its effects),
//! then writes the round's messages as one `msg` batch, waits for that to
//! be durable, and writes the round's effects as one `evt` batch, so an
//! `evt` record never points at a message that could vanish. It hands the
//! `evt` ticket to the completion stage and goes on with the next round
//! while that one syncs (pipelining).
//!
//! The completion stage finishes rounds strictly in order: it waits for
//! durability, advances the committed watermarks, releases every reply of
//! the round (errors too, so no answer ever reflects a change that is not
//! durable) and publishes one coalesced hint per user.
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
//! - `NoSpace` on submit: nothing of the round is durable; the sequencer
//!   waits for earlier rounds, then reloads the state from the checkpoint
//!   and the log, so the failed round leaves no trace in memory. A sync in
//!   that round that kept its device's generation is still served (all it
//!   loses is its `last_seen` refresh): a full disk stops writes, not syncs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::command::*;
use super::state::{State, Touched};
use super::sync::{self, SyncOutcome};
use super::token::TokenClaims;
use super::{checkpoint, compaction, read, recover, snapshot, Reply, Shared};
use crate::api::*;
use crate::error::{Error, Result};
use crate::log::format::{BATCH_HEADER_LEN, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::log::{AppendTicket, Batch, LogError};

/// At most this many commands per round, to bound a round's latency.
const ROUND_COMMANDS_MAX: usize = 4096;

/// Bytes of records a round may gather before it is closed: half of what
/// a segment holds after its header and one batch header. Each round's
/// `msg` batch and its `evt` batch go into one frame of their log, which
/// must fit a segment; a round closes once it reaches this, and no single
/// command adds more than this (payloads and compaction commands are
/// bounded by it), so a batch never exceeds a segment. A batch that did
/// would be refused by the log after the round's effects were applied.
pub(crate) fn round_bytes_max(segment_bytes: u64) -> u64 {
    let room = segment_bytes.saturating_sub((SEGMENT_HEADER_LEN + BATCH_HEADER_LEN) as u64);
    room / 2
}

pub(crate) type Tx<T> = oneshot::Sender<Reply<T>>;

pub(crate) enum Command {
    Join {
        conv: ConvId,
        uid: Uid,
        tx: Tx<MembershipReply>,
    },
    Leave {
        conv: ConvId,
        uid: Uid,
        tx: Tx<MembershipReply>,
    },
    Send {
        kind: MessageKind,
        conv: ConvId,
        sender: Uid,
        client_msg_id: ClientMsgId,
        msg_type: MsgType,
        target: MsgId,
        payload: StoredPayload,
        summary: Bytes,
        tx: Tx<SendReply>,
    },
    Register {
        uid: Uid,
        device: DeviceId,
        tx: Tx<RegisterReply>,
    },
    Revoke {
        uid: Uid,
        device: DeviceId,
        tx: Tx<DeviceInfo>,
    },
    Sync {
        req: SyncRequest,
        claims: Option<TokenClaims>,
        tx: Tx<SyncPage>,
    },
    Ack {
        req: AckRequest,
        claims: TokenClaims,
        tx: Tx<AckReply>,
    },
    FinishLease {
        uid: Uid,
        device: DeviceId,
        lease_id: u64,
        generation: Generation,
        tx: Tx<DeviceInfo>,
    },
    MarkRead {
        uid: Uid,
        conv: ConvId,
        read_to_seq: MsgSeq,
        tx: Tx<ReadReply>,
    },
    Flags {
        uid: Uid,
        conv: ConvId,
        flags: ConvFlags,
        tx: Tx<()>,
    },
    BeginSnapshot {
        uid: Uid,
        device: DeviceId,
        tx: Tx<SnapshotInfo>,
    },
    AckSnapshot {
        uid: Uid,
        device: DeviceId,
        snapshot_id: u64,
        generation: Generation,
        tx: Tx<DeviceInfo>,
    },
    /// Compaction: trim users' events (decided again against the fences).
    Trim {
        proposals: Vec<compaction::TrimProposal>,
        tx: Tx<Vec<(Uid, SyncSeq, SyncSeq)>>,
    },
    /// Compaction: reclaim conversations' messages past the history
    /// retention, proposed as (conv, new base); replies (conv, old, new).
    TrimMsgs {
        proposals: Vec<(ConvId, MsgSeq)>,
        tx: Tx<Vec<(ConvId, MsgSeq, MsgSeq)>>,
    },
    /// Compaction: point events at copies of their records.
    Relocate {
        moves: Vec<super::fence::Relocation>,
        tx: Tx<()>,
    },
    /// Compaction: forget snapshots past their TTL.
    DropSnapshots {
        candidates: Vec<(Uid, u64)>,
        tx: Tx<()>,
    },
    Checkpoint {
        tx: mpsc::Sender<Result<()>>,
    },
    Shutdown {
        tx: mpsc::Sender<Result<()>>,
    },
}

/// Why a round failed; turned into an [`Error`] per reply.
#[derive(Clone, Debug)]
pub(crate) enum Fail {
    Poisoned(String),
    NoSpace(String),
}

impl Fail {
    fn from_log(e: &LogError) -> Fail {
        match e {
            LogError::NoSpace(m) => Fail::NoSpace(m.clone()),
            other => Fail::Poisoned(other.to_string()),
        }
    }
    pub fn to_error(&self) -> Error {
        match self {
            Fail::Poisoned(m) => Error::Log(LogError::Poisoned(m.clone())),
            Fail::NoSpace(m) => Error::NoSpace(m.clone()),
        }
    }
}

type ReplyFn = Box<dyn FnOnce(Option<&Fail>) + Send>;

fn reply_with<T: Send + 'static>(tx: Tx<T>, result: Result<T>) -> ReplyFn {
    Box::new(move |fail| {
        let r = match fail {
            Some(f) => Err(f.to_error()),
            None => result,
        };
        let _ = tx.send(Reply::Done(r));
    })
}

enum Outcome {
    Ticket(AppendTicket),
    Nothing,
    Failed(Fail),
}

pub(crate) struct RoundDone {
    id: u64,
    outcome: Outcome,
    replies: Vec<ReplyFn>,
    user_marks: BTreeMap<Uid, SyncSeq>,
    conv_marks: BTreeMap<ConvId, MsgSeq>,
}

#[derive(Default)]
struct RoundBuf {
    msg_batch: Batch,
    /// Per msg record: the message to patch and the `evt` record holding it.
    msg_targets: Vec<(ConvId, MsgSeq, usize)>,
    /// The round's effects, encoded once as they are decided (kind, bytes);
    /// a message's location is set in its record once the `msg` batch is
    /// placed ([`set_msg_loc`]).
    evt_records: Vec<(u8, Vec<u8>)>,
    event_patches: Vec<(Uid, SyncSeq, usize)>,
    replies: Vec<ReplyFn>,
    user_marks: BTreeMap<Uid, SyncSeq>,
    conv_marks: BTreeMap<ConvId, MsgSeq>,
    /// Framed bytes of the records gathered so far, both logs together
    /// (see [`round_bytes_max`]; also what counts towards the next periodic
    /// checkpoint).
    size: u64,
}

pub(crate) struct Sequencer {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Command>,
    done: mpsc::Sender<RoundDone>,
    /// The checkpoint writer's queue; dropped when the sequencer stops, which
    /// lets the writer finish the final checkpoint and exit.
    checkpoints: mpsc::Sender<checkpoint::Job>,
    /// Set while a periodic checkpoint is queued or being written.
    periodic_busy: Arc<AtomicBool>,
    /// The snapshot builder's queue, cloned into each begin step's reply.
    snapshot_jobs: mpsc::Sender<snapshot::Job>,
    next_round: u64,
    bytes_since_checkpoint: u64,
}

impl Sequencer {
    pub fn new(
        shared: Arc<Shared>,
        rx: mpsc::Receiver<Command>,
        done: mpsc::Sender<RoundDone>,
        checkpoints: mpsc::Sender<checkpoint::Job>,
        snapshot_jobs: mpsc::Sender<snapshot::Job>,
    ) -> Self {
        Self {
            shared,
            rx,
            done,
            checkpoints,
            periodic_busy: Arc::new(AtomicBool::new(false)),
            snapshot_jobs,
            next_round: 1,
            bytes_since_checkpoint: 0,
        }
    }

    pub fn run(mut self) {
        while let Ok(first) = self.rx.recv() {
            let mut cmds = vec![first];
            while cmds.len() < ROUND_COMMANDS_MAX {
                match self.rx.try_recv() {
                    Ok(c) => cmds.push(c),
                    Err(_) => break,
                }
            }
            let mut control = Vec::new();
            let mut round = RoundBuf::default();
            let mut id = self.next_round;
            let bytes_max = round_bytes_max(self.shared.config.segment_bytes);
            for cmd in cmds {
                match cmd {
                    c @ (Command::Checkpoint { .. } | Command::Shutdown { .. }) => control.push(c),
                    c => {
                        self.exec(c, id, &mut round);
                        if round.size >= bytes_max && !round.replies.is_empty() {
                            self.next_round += 1;
                            self.finish_round(id, std::mem::take(&mut round));
                            id = self.next_round;
                        }
                    }
                }
            }
            if !round.replies.is_empty() {
                self.next_round += 1;
                self.finish_round(id, round);
            }
            let mut stop = false;
            for c in control {
                match c {
                    Command::Checkpoint { tx } => {
                        self.checkpoint(checkpoint::Done::Caller(tx));
                    }
                    Command::Shutdown { tx } => {
                        let flushed = self.drain().and_then(|()| {
                            self.shared.msg_log.flush()?;
                            self.shared.evt_log.flush()?;
                            Ok(())
                        });
                        // The final checkpoint queues behind any earlier
                        // one; the caller hears back once it is durable.
                        match flushed {
                            Ok(()) => self.checkpoint(checkpoint::Done::Caller(tx)),
                            Err(e) => drop(tx.send(Err(e))),
                        }
                        stop = true;
                    }
                    _ => {}
                }
            }
            if stop {
                break;
            }
            if self.bytes_since_checkpoint >= self.shared.config.checkpoint_every_bytes
                && !self.periodic_busy.load(Ordering::Acquire)
            {
                // Skipped while one is still in flight: its bytes count
                // towards the next, and no second image piles up in memory.
                self.periodic_busy.store(true, Ordering::Release);
                let busy = Arc::clone(&self.periodic_busy);
                self.checkpoint(checkpoint::Done::Periodic(busy));
            }
        }
    }

    /// Waits until every submitted round is finished.
    fn drain(&self) -> Result<()> {
        self.shared.wait_settled(self.next_round - 1);
        match self.shared.poisoned() {
            Some(m) => Err(Error::Log(LogError::Poisoned(m))),
            None => Ok(()),
        }
    }

    /// Drains the pipeline, copies the state at its LSN and hands the copy
    /// to the writer thread, which encodes and writes it; `done` hears how
    /// the write went.
    fn checkpoint(&mut self, done: checkpoint::Done) {
        if let Err(e) = self.drain() {
            done.finish(0, Err(e));
            return;
        }
        // A copy in O(users + conversations): the entries are shared, and
        // the writer thread encodes it while rounds go on (copy on write).
        let state = Box::new(self.shared.state.read().clone());
        self.bytes_since_checkpoint = 0;
        let lsn = state.evt_lsn;
        let job = checkpoint::Job::Write { state, done };
        if let Err(mpsc::SendError(checkpoint::Job::Write { done, .. })) =
            self.checkpoints.send(job)
        {
            done.finish(
                lsn,
                Err(Error::Internal("checkpoint writer stopped".into())),
            );
        }
    }

    /// Waits until the writer has finished every checkpoint handed to it,
    /// so a reload from disk never races a file being renamed or pruned.
    fn wait_checkpoints(&self) {
        let (tx, rx) = mpsc::channel();
        if self.checkpoints.send(checkpoint::Job::Barrier(tx)).is_ok() {
            let _ = rx.recv();
        }
    }

    fn exec(&mut self, cmd: Command, round_id: u64, r: &mut RoundBuf) {
        if let Some(m) = self.shared.poisoned() {
            let fail = Fail::Poisoned(m);
            fail_command(cmd, &fail);
            return;
        }
        let now = self.shared.config.clock.now_ms();
        let mut st = self.shared.state.write();
        let st = &mut *st;
        match cmd {
            Command::Join { conv, uid, tx } => {
                let existing = st.convs.get(&conv).and_then(|c| {
                    c.is_member(uid)
                        .then(|| c.members.get(&uid).and_then(|p| p.last()).copied())
                        .flatten()
                });
                if let Some(p) = existing {
                    let reply = MembershipReply {
                        msg_seq: p.join_seq,
                        period_id: p.period_id,
                    };
                    r.replies.push(reply_with(tx, Ok(reply)));
                    return;
                }
                let msg_seq = st.convs.get(&conv).map_or(0, |c| c.head()) + 1;
                let period_id = st
                    .convs
                    .get(&conv)
                    .and_then(|c| c.members.get(&uid))
                    .map_or(0, |p| u32::try_from(p.len()).unwrap_or(u32::MAX));
                self.push_membership(st, r, round_id, now, MessageKind::Join, conv, uid);
                r.replies
                    .push(reply_with(tx, Ok(MembershipReply { msg_seq, period_id })));
            }
            Command::Leave { conv, uid, tx } => {
                let Some(c) = st.convs.get(&conv).filter(|c| c.is_member(uid)) else {
                    r.replies.push(reply_with(
                        tx,
                        Err(Error::NotFound(format!(
                            "uid {uid} is not a member of conv {conv}"
                        ))),
                    ));
                    return;
                };
                let msg_seq = c.head() + 1;
                let period_id = c
                    .members
                    .get(&uid)
                    .and_then(|p| p.last())
                    .map_or(0, |p| p.period_id);
                self.push_membership(st, r, round_id, now, MessageKind::Leave, conv, uid);
                r.replies
                    .push(reply_with(tx, Ok(MembershipReply { msg_seq, period_id })));
            }
            Command::Send {
                kind,
                conv,
                sender,
                client_msg_id,
                msg_type,
                target,
                payload,
                summary,
                tx,
            } => {
                let result = decide_send(st, now, kind, conv, sender, client_msg_id, target);
                match result {
                    Err(e) => r.replies.push(reply_with(tx, Err(e))),
                    Ok(Decision::Duplicate(original)) => {
                        // Same key: the same request gets the original ids,
                        // a different one CONFLICT. Comparing reads the
                        // original, so it happens on the caller's thread.
                        let shared = Arc::clone(&self.shared);
                        let retry = read::Retry {
                            kind,
                            msg_type,
                            target,
                            payload,
                        };
                        r.replies.push(Box::new(move |fail| {
                            let reply = match fail {
                                Some(f) => Reply::Done(Err(f.to_error())),
                                None => Reply::Later(Box::new(move || {
                                    read::duplicate_reply(&shared, conv, original, &retry)
                                })),
                            };
                            let _ = tx.send(reply);
                        }));
                    }
                    Ok(Decision::New { target_seq }) => {
                        let (msg_id, msg_seq) = self.push_message(
                            st,
                            r,
                            round_id,
                            now,
                            kind,
                            conv,
                            sender,
                            client_msg_id,
                            msg_type,
                            target,
                            &payload,
                            summary,
                            target_seq,
                        );
                        r.replies.push(reply_with(
                            tx,
                            Ok(SendReply {
                                msg_id,
                                msg_seq,
                                duplicate: false,
                            }),
                        ));
                    }
                }
            }
            Command::Register { uid, device, tx } => {
                let (effects, reply) =
                    sync::decide_register(st, &self.shared.config, now, uid, device);
                self.push_effects(st, r, round_id, effects);
                r.replies.push(reply_with(tx, Ok(reply)));
            }
            Command::Revoke { uid, device, tx } => {
                let result = sync::decide_revoke(st, uid, device).map(|(effects, reply)| {
                    self.push_effects(st, r, round_id, effects);
                    reply
                });
                r.replies.push(reply_with(tx, result));
            }
            Command::Sync { req, claims, tx } => {
                let result = sync::decide_sync(st, &self.shared.config, now, &req, claims.as_ref());
                match result {
                    Err(e) => r.replies.push(reply_with(tx, Err(e))),
                    Ok((effects, outcome)) => {
                        self.push_effects(st, r, round_id, effects);
                        match outcome {
                            SyncOutcome::Reset(generation) => {
                                r.replies
                                    .push(reply_with(tx, Err(Error::ResetRequired { generation })));
                            }
                            SyncOutcome::Page(plan) => {
                                let shared = Arc::clone(&self.shared);
                                // Same generation: the sync wrote at most its
                                // last_seen refresh, whose loss is harmless,
                                // so a full disk must not keep the page from
                                // the device (the page reads durable events).
                                let keeps_generation = req.generation == Some(plan.generation);
                                r.replies.push(Box::new(move |fail| {
                                    let reply = match fail {
                                        Some(Fail::NoSpace(_)) if keeps_generation => {
                                            Reply::Later(Box::new(move || {
                                                read::sync_page(&shared, &plan)
                                            }))
                                        }
                                        Some(f) => Reply::Done(Err(f.to_error())),
                                        None => Reply::Later(Box::new(move || {
                                            read::sync_page(&shared, &plan)
                                        })),
                                    };
                                    let _ = tx.send(reply);
                                }));
                            }
                        }
                    }
                }
            }
            Command::Ack { req, claims, tx } => {
                let result = sync::decide_ack(st, now, &req, &claims).map(|(effects, reply)| {
                    self.push_effects(st, r, round_id, effects);
                    reply
                });
                r.replies.push(reply_with(tx, result));
            }
            Command::FinishLease {
                uid,
                device,
                lease_id,
                generation,
                tx,
            } => {
                let result = sync::decide_finish_lease(st, now, uid, device, lease_id, generation)
                    .map(|(effects, reply)| {
                        self.push_effects(st, r, round_id, effects);
                        reply
                    });
                r.replies.push(reply_with(tx, result));
            }
            Command::MarkRead {
                uid,
                conv,
                read_to_seq,
                tx,
            } => {
                let result = (|| {
                    let c = st
                        .convs
                        .get(&conv)
                        .ok_or_else(|| Error::NotFound(format!("conv {conv}")))?;
                    let head = c.head();
                    let uc = st
                        .users
                        .get(&uid)
                        .and_then(|u| u.convs.get(&conv))
                        .ok_or_else(|| {
                            Error::Forbidden(format!("uid {uid} was never in conv {conv}"))
                        })?;
                    if read_to_seq > head {
                        return Err(Error::BadRequest(format!(
                            "read_to_seq {read_to_seq} is beyond conv {conv}'s head {head}"
                        )));
                    }
                    Ok((uc.read_seq, uc.unread))
                })();
                match result {
                    Err(e) => r.replies.push(reply_with(tx, Err(e))),
                    Ok((read_seq, unread)) if read_to_seq <= read_seq => {
                        r.replies
                            .push(reply_with(tx, Ok(ReadReply { read_seq, unread })));
                    }
                    Ok(_) => {
                        let effect = Effect::Read {
                            uid,
                            conv,
                            read_seq: read_to_seq,
                            at_ms: now,
                        };
                        self.push_effects(st, r, round_id, vec![effect]);
                        let reply = st
                            .users
                            .get(&uid)
                            .and_then(|u| u.convs.get(&conv))
                            .map(|uc| ReadReply {
                                read_seq: uc.read_seq,
                                unread: uc.unread,
                            })
                            .ok_or_else(|| Error::Internal("conversation state vanished".into()));
                        r.replies.push(reply_with(tx, reply));
                    }
                }
            }
            Command::Flags {
                uid,
                conv,
                flags,
                tx,
            } => {
                let uc = st.users.get(&uid).and_then(|u| u.convs.get(&conv));
                match uc {
                    None => r.replies.push(reply_with(
                        tx,
                        Err(Error::Forbidden(format!(
                            "uid {uid} was never in conv {conv}"
                        ))),
                    )),
                    Some(uc) if uc.muted == flags.muted && uc.pinned == flags.pinned => {
                        r.replies.push(reply_with(tx, Ok(())));
                    }
                    Some(_) => {
                        let effect = Effect::Flags {
                            uid,
                            conv,
                            flags,
                            at_ms: now,
                        };
                        self.push_effects(st, r, round_id, vec![effect]);
                        r.replies.push(reply_with(tx, Ok(())));
                    }
                }
            }
            Command::BeginSnapshot { uid, device, tx } => {
                match snapshot::decide_begin(st, &self.shared.config, now, uid, device) {
                    Err(e) => r.replies.push(reply_with(tx, Err(e))),
                    Ok((effects, plan)) => {
                        self.push_effects(st, r, round_id, effects);
                        // The content is built from the plan captured at S,
                        // on the builder thread once the step is durable,
                        // whether or not the caller still waits.
                        let jobs = self.snapshot_jobs.clone();
                        r.replies.push(Box::new(move |fail| match fail {
                            Some(f) => drop(tx.send(Reply::Done(Err(f.to_error())))),
                            None => {
                                if let Err(mpsc::SendError(job)) =
                                    jobs.send(snapshot::Job { plan, tx })
                                {
                                    let e = Error::Internal("snapshot builder stopped".into());
                                    drop(job.tx.send(Reply::Done(Err(e))));
                                }
                            }
                        }));
                    }
                }
            }
            Command::AckSnapshot {
                uid,
                device,
                snapshot_id,
                generation,
                tx,
            } => {
                let result = snapshot::decide_ack(
                    &self.shared,
                    st,
                    now,
                    uid,
                    device,
                    snapshot_id,
                    generation,
                )
                .map(|(effects, reply)| {
                    self.push_effects(st, r, round_id, effects);
                    reply
                });
                r.replies.push(reply_with(tx, result));
            }
            Command::Trim { proposals, tx } => {
                let (effects, trimmed) =
                    compaction::decide_trim(st, &self.shared.config, now, &proposals);
                self.push_effects(st, r, round_id, effects);
                r.replies.push(reply_with(tx, Ok(trimmed)));
            }
            Command::TrimMsgs { proposals, tx } => {
                let (effects, trimmed) = compaction::decide_trim_msgs(st, &proposals);
                self.push_effects(st, r, round_id, effects);
                r.replies.push(reply_with(tx, Ok(trimmed)));
            }
            Command::Relocate { moves, tx } => {
                self.push_effects(st, r, round_id, vec![Effect::Relocate(moves)]);
                r.replies.push(reply_with(tx, Ok(())));
            }
            Command::DropSnapshots { candidates, tx } => {
                let effects = compaction::decide_drop_snapshots(st, now, &candidates);
                self.push_effects(st, r, round_id, effects);
                r.replies.push(reply_with(tx, Ok(())));
            }
            Command::Checkpoint { .. } | Command::Shutdown { .. } => {}
        }
    }

    /// A join or leave: a message with no body, sent by the member.
    #[expect(
        clippy::too_many_arguments,
        reason = "the round's context and the membership change, kept flat like push_message"
    )]
    fn push_membership(
        &self,
        st: &mut State,
        r: &mut RoundBuf,
        round_id: u64,
        now: TimestampMs,
        kind: MessageKind,
        conv: ConvId,
        uid: Uid,
    ) {
        let summary = summary_for(kind, &[], 0, uid);
        self.push_message(
            st,
            r,
            round_id,
            now,
            kind,
            conv,
            uid,
            0,
            0,
            0,
            &empty_payload(),
            summary,
            0,
        );
    }

    /// Allocates a message, applies its effect and queues its records.
    #[expect(
        clippy::too_many_arguments,
        reason = "one message's fields, kept flat for the hot path"
    )]
    fn push_message(
        &self,
        st: &mut State,
        r: &mut RoundBuf,
        round_id: u64,
        now: TimestampMs,
        kind: MessageKind,
        conv: ConvId,
        sender: Uid,
        client_msg_id: ClientMsgId,
        msg_type: MsgType,
        target: MsgId,
        payload: &StoredPayload,
        summary: Bytes,
        target_seq: MsgSeq,
    ) -> (MsgId, MsgSeq) {
        let msg_seq = st.convs.get(&conv).map_or(0, |c| c.head()) + 1;
        let msg_id = st.next_msg_counter; // shard id 0 in the top bits (R3)
        let header = MsgHeader {
            kind,
            msg_type,
            conv,
            msg_seq,
            msg_id,
            sender,
            target,
            sent_at_ms: now,
        };
        let record = encode_msg_record(&header, payload);
        let effect = Effect::Msg(MsgEffect {
            conv,
            msg_seq,
            msg_id,
            sender,
            kind,
            msg_type,
            target_seq,
            at_ms: now,
            msg_loc: PENDING_LOC,
            client_msg_id,
            summary,
        });
        let idx = r.evt_records.len();
        self.push_effects(st, r, round_id, vec![effect]);
        r.size += (RECORD_HEADER_LEN + record.len()) as u64;
        r.msg_batch.push_owned(MSG_RECORD, record);
        r.msg_targets.push((conv, msg_seq, idx));
        (msg_id, msg_seq)
    }

    fn push_effects(&self, st: &mut State, r: &mut RoundBuf, round_id: u64, effects: Vec<Effect>) {
        for effect in effects {
            let idx = r.evt_records.len();
            let mut touched = Touched::default();
            if let Err(e) = st.apply(&effect, PENDING_LOC, round_id, &mut touched) {
                // The decision was made on this very state, so this is a
                // bug; stop writing rather than log something inconsistent.
                self.shared
                    .poison(format!("internal: decided effect does not apply: {}", e.0));
            }
            for (uid, seq) in touched.events {
                r.event_patches.push((uid, seq, idx));
                r.user_marks.insert(uid, seq);
            }
            if let Some((conv, seq)) = touched.conv {
                r.conv_marks.insert(conv, seq);
            }
            let record = effect.encode();
            r.size += (RECORD_HEADER_LEN + record.len()) as u64;
            r.evt_records.push((effect.record_kind(), record));
        }
    }

    fn finish_round(&mut self, id: u64, mut r: RoundBuf) {
        let outcome = match self.write_round(&mut r) {
            Ok(Some(ticket)) => Outcome::Ticket(ticket),
            Ok(None) => Outcome::Nothing,
            Err(Fail::NoSpace(m)) => {
                // Nothing of this round is durable: wait for the earlier
                // rounds, then rebuild memory from disk so no trace of it
                // stays behind.
                self.shared.wait_settled(id - 1);
                self.wait_checkpoints();
                match recover::load_state(&self.shared.config, &self.shared.evt_log) {
                    Ok(state) => *self.shared.state.write() = state,
                    Err(e) => self
                        .shared
                        .poison(format!("reload after ENOSPC failed: {e}")),
                }
                Outcome::Failed(Fail::NoSpace(m))
            }
            Err(f @ Fail::Poisoned(_)) => {
                if let Fail::Poisoned(m) = &f {
                    self.shared.poison(m.clone());
                }
                Outcome::Failed(f)
            }
        };
        self.bytes_since_checkpoint += r.size;
        let _ = self.done.send(RoundDone {
            id,
            outcome,
            replies: std::mem::take(&mut r.replies),
            user_marks: std::mem::take(&mut r.user_marks),
            conv_marks: std::mem::take(&mut r.conv_marks),
        });
    }

    /// Writes the round: messages first (durable), then effects (submitted).
    fn write_round(&self, r: &mut RoundBuf) -> std::result::Result<Option<AppendTicket>, Fail> {
        if let Some(m) = self.shared.poisoned() {
            return Err(Fail::Poisoned(m));
        }
        if !r.msg_batch.is_empty() {
            let ticket = self
                .shared
                .msg_log
                .submit(std::mem::take(&mut r.msg_batch))
                .map_err(|e| Fail::from_log(&e))?;
            {
                let mut st = self.shared.state.write();
                for (i, &(conv, seq, idx)) in r.msg_targets.iter().enumerate() {
                    let loc = ticket.locs.get(i).map_or(PENDING_LOC, |l| pack(*l));
                    st.patch_msg(conv, seq, loc);
                    if let Some((_, record)) = r.evt_records.get_mut(idx) {
                        set_msg_loc(record, loc);
                    }
                }
            }
            // An evt record must never point at a message that could vanish.
            ticket.wait().map_err(|e| Fail::Poisoned(e.to_string()))?;
        }
        if r.evt_records.is_empty() {
            return Ok(None);
        }
        let mut batch = Batch::new();
        for (kind, record) in r.evt_records.drain(..) {
            batch.push_owned(kind, record);
        }
        let ticket = self
            .shared
            .evt_log
            .submit(batch)
            .map_err(|e| Fail::from_log(&e))?;
        {
            let mut st = self.shared.state.write();
            for &(uid, seq, idx) in &r.event_patches {
                let loc = ticket.locs.get(idx).map_or(PENDING_LOC, |l| pack(*l));
                st.patch_event(uid, seq, loc);
            }
            st.evt_lsn = ticket.lsn;
        }
        Ok(Some(ticket))
    }
}

fn empty_payload() -> StoredPayload {
    StoredPayload {
        compressed: false,
        raw_len: 0,
        bytes: Bytes::new(),
    }
}

enum Decision {
    Duplicate(SendReply),
    New { target_seq: MsgSeq },
}

fn decide_send(
    st: &State,
    now: TimestampMs,
    kind: MessageKind,
    conv: ConvId,
    sender: Uid,
    client_msg_id: ClientMsgId,
    target: MsgId,
) -> Result<Decision> {
    if let Some(e) = st.idem_lookup(sender, client_msg_id, now) {
        if e.conv != conv {
            return Err(Error::Conflict(format!(
                "client_msg_id was already used by uid {sender} in conv {}",
                e.conv
            )));
        }
        return Ok(Decision::Duplicate(SendReply {
            msg_id: e.msg_id,
            msg_seq: e.msg_seq,
            duplicate: true,
        }));
    }
    let c = st
        .convs
        .get(&conv)
        .ok_or_else(|| Error::NotFound(format!("conv {conv}")))?;
    if !c.is_member(sender) {
        return Err(Error::Forbidden(format!(
            "uid {sender} is not a member of conv {conv}"
        )));
    }
    if kind == MessageKind::Normal {
        return Ok(Decision::New { target_seq: 0 });
    }
    let target_seq = c
        .seq_of(target)
        .ok_or_else(|| Error::NotFound(format!("message {target} in conv {conv}")))?;
    let meta = c
        .meta(target_seq)
        .ok_or_else(|| Error::Internal("message index out of step".into()))?;
    if !matches!(meta.kind, MessageKind::Normal | MessageKind::Edit) {
        return Err(Error::BadRequest(format!(
            "message {target} is a control message"
        )));
    }
    if meta.sender != sender {
        return Err(Error::Forbidden(format!(
            "only the sender of message {target} may change it"
        )));
    }
    if meta.flags & super::state::FLAG_RECALLED != 0 {
        return Err(Error::Conflict(format!(
            "message {target} is already recalled"
        )));
    }
    Ok(Decision::New { target_seq })
}

/// Answers a command with a failure without running it.
fn fail_command(cmd: Command, fail: &Fail) {
    fn e<T>(tx: Tx<T>, fail: &Fail) {
        let _ = tx.send(Reply::Done(Err(fail.to_error())));
    }
    match cmd {
        Command::Join { tx, .. } | Command::Leave { tx, .. } => e(tx, fail),
        Command::Send { tx, .. } => e(tx, fail),
        Command::Register { tx, .. } => e(tx, fail),
        Command::Revoke { tx, .. } | Command::FinishLease { tx, .. } => e(tx, fail),
        Command::Sync { tx, .. } => e(tx, fail),
        Command::Ack { tx, .. } => e(tx, fail),
        Command::MarkRead { tx, .. } => e(tx, fail),
        Command::Flags { tx, .. } => e(tx, fail),
        Command::BeginSnapshot { tx, .. } => e(tx, fail),
        Command::AckSnapshot { tx, .. } => e(tx, fail),
        Command::Trim { tx, .. } => e(tx, fail),
        Command::TrimMsgs { tx, .. } => e(tx, fail),
        Command::Relocate { tx, .. } | Command::DropSnapshots { tx, .. } => e(tx, fail),
        Command::Checkpoint { tx } | Command::Shutdown { tx } => {
            drop(tx.send(Err(fail.to_error())))
        }
    }
}

/// The completion stage: finishes rounds in order (see the module doc).
pub(crate) fn run_completion(shared: Arc<Shared>, rx: mpsc::Receiver<RoundDone>) {
    let mut poisoned: Option<Fail> = None;
    while let Ok(done) = rx.recv() {
        let result: std::result::Result<(), Fail> = match (&poisoned, done.outcome) {
            (Some(f), _) => Err(f.clone()),
            (None, Outcome::Ticket(t)) => t
                .wait()
                .map(|_| ())
                .map_err(|e| Fail::Poisoned(e.to_string())),
            (None, Outcome::Nothing) => Ok(()),
            (None, Outcome::Failed(f)) => Err(f),
        };
        let mut hints = Vec::new();
        match &result {
            Ok(()) => {
                let mut st = shared.state.write();
                for (&uid, &seq) in &done.user_marks {
                    if let Some(u) = st.users.get_mut(&uid).map(Arc::make_mut) {
                        u.committed_seq = u.committed_seq.max(seq);
                        hints.push(super::Hint {
                            uid,
                            committed_sync_seq: u.committed_seq,
                        });
                    }
                }
                for (&conv, &seq) in &done.conv_marks {
                    if let Some(c) = st.convs.get_mut(&conv).map(Arc::make_mut) {
                        c.committed_seq = c.committed_seq.max(seq);
                    }
                }
            }
            Err(f @ Fail::Poisoned(m)) => {
                shared.poison(m.clone());
                poisoned = Some(f.clone());
            }
            Err(Fail::NoSpace(_)) => {}
        }
        shared
            .rounds_written
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shared.settle(done.id);
        // Hints go out before the replies, so a writer that got its reply
        // knows its readers' subscribers have been told.
        if !hints.is_empty() {
            // No receiver is fine: hints are best effort (R16).
            let _ = shared.hints.send(hints);
        }
        let fail = result.err();
        for reply in done.replies {
            reply(fail.as_ref());
        }
    }
}
