//! Messaging: conversations, membership, messages, recall and edit, read
//! cursors and conversation flags (R1, R4, R5, R6, R8, R12–R15).
//!
//! - [`Command`]: the mutations; [`exec`] decides each against the state
//!   and hands the effects and the reply to the round ([`Sink`]);
//! - [`record`]: the message record and the `evt` records, with their
//!   codecs; [`apply`]: how they change the state;
//! - [`checkpoint`]: the messaging tables' checkpoint sections;
//! - [`read`]: pull, history and the conversation list, outside the
//!   sequencer.
//!
//! A message is one `msg` record (its body) and one `evt` record (its
//! effect: the fan-out to every member whose period covers its `msg_seq`),
//! however many recipients it has. Joins and leaves are messages with no
//! body, so they are ordered with the messages (R5).

pub(crate) mod apply;
pub(crate) mod body;
pub(crate) mod checkpoint;
pub(crate) mod idem;
pub(crate) mod large;
pub(crate) mod large_record;
pub(crate) mod read;
pub(crate) mod record;
pub(crate) mod rows;

use std::sync::Arc;

use bytes::Bytes;

use self::record::{
    encode_msg_record, FlagsEffect, MsgBodyEffect, MsgEffect, MsgHeader, ReadEffect, StoredPayload,
};
use super::fanout::{self, rows::FanoutMessage};
use super::pending::Reply;
use super::round::{fail_now, reply_with, Env, Fail, Sink, Tx};
use super::state::{State, FLAG_RECALLED, PENDING_LOC};
use crate::api::*;
use crate::error::{Error, Result};

pub(crate) enum Command {
    Join {
        uid: Uid,
        conv: ConvId,
        tx: Tx<MembershipReply>,
    },
    Leave {
        uid: Uid,
        conv: ConvId,
        tx: Tx<MembershipReply>,
    },
    Send {
        sender: Uid,
        conv: ConvId,
        kind: MessageKind,
        client_msg_id: ClientMsgId,
        msg_type: MsgType,
        target: MsgId,
        payload: StoredPayload,
        summary: Bytes,
        tx: Tx<SendReply>,
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
    /// A large group's marker clear, a compare-and-set on `version` (R7).
    ClearDirty {
        uid: Uid,
        conv: ConvId,
        version: u64,
        tx: Tx<MsgSeq>,
    },
}

/// Answers a command with a failure without running it.
pub(crate) fn fail(cmd: Command, f: &Fail) {
    match cmd {
        Command::Join { tx, .. } | Command::Leave { tx, .. } => fail_now(tx, f),
        Command::Send { tx, .. } => fail_now(tx, f),
        Command::MarkRead { tx, .. } => fail_now(tx, f),
        Command::Flags { tx, .. } => fail_now(tx, f),
        Command::ClearDirty { tx, .. } => fail_now(tx, f),
    }
}

/// Decides one command against `st` and hands the outcome to `sink`.
pub(crate) fn exec(cmd: Command, st: &mut State, env: &Env<'_>, sink: &mut dyn Sink) {
    let now = env.now;
    match cmd {
        Command::Join { uid, conv, tx } => {
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
                sink.reply(reply_with(tx, Ok(reply)));
                return;
            }
            let msg_seq = st.convs.get(&conv).map_or(MsgSeq(0), |c| c.head()).next();
            let period_id = st
                .convs
                .get(&conv)
                .and_then(|c| c.members.get(&uid))
                .map_or(0, |p| u32::try_from(p.len()).unwrap_or(u32::MAX));
            push_membership(st, sink, now, uid, conv, MessageKind::Join);
            large::maybe_switch(st, sink, conv, env.shared.config.large_group_members);
            sink.reply(reply_with(tx, Ok(MembershipReply { msg_seq, period_id })));
        }
        Command::Leave { uid, conv, tx } => {
            let Some(c) = st.convs.get(&conv).filter(|c| c.is_member(uid)) else {
                sink.reply(reply_with(
                    tx,
                    Err(Error::NotFound(format!(
                        "uid {uid} is not a member of conv {conv}"
                    ))),
                ));
                return;
            };
            let msg_seq = c.head().next();
            let period_id = c
                .members
                .get(&uid)
                .and_then(|p| p.last())
                .map_or(0, |p| p.period_id);
            push_membership(st, sink, now, uid, conv, MessageKind::Leave);
            sink.reply(reply_with(tx, Ok(MembershipReply { msg_seq, period_id })));
        }
        Command::Send {
            sender,
            conv,
            kind,
            client_msg_id,
            msg_type,
            target,
            payload,
            summary,
            tx,
        } => match decide_send(st, now, sender, conv, kind, client_msg_id, target) {
            Err(e) => sink.reply(reply_with(tx, Err(e))),
            Ok(Decision::Duplicate(original)) => {
                // Same key: the same request gets the original ids, a
                // different one CONFLICT. Comparing reads the original, so
                // it happens on the caller's thread once the round is
                // durable.
                let shared = Arc::clone(env.shared);
                let retry = read::Retry {
                    kind,
                    msg_type,
                    target,
                    payload,
                };
                sink.reply(Box::new(move |fail| {
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
                let (msg_id, msg_seq) = push_message(
                    st,
                    sink,
                    NewMessage {
                        now,
                        kind,
                        conv,
                        sender,
                        client_msg_id,
                        msg_type,
                        target,
                        target_seq,
                        payload: &payload,
                        summary,
                    },
                );
                sink.reply(reply_with(
                    tx,
                    Ok(SendReply {
                        msg_id,
                        msg_seq,
                        duplicate: false,
                    }),
                ));
            }
        },
        Command::MarkRead {
            uid,
            conv,
            read_to_seq,
            tx,
        } => match decide_mark_read(st, uid, conv, read_to_seq) {
            Err(e) => sink.reply(reply_with(tx, Err(e))),
            Ok((read_seq, unread)) if read_to_seq <= read_seq && unread_exact(st, conv) => {
                sink.reply(reply_with(tx, Ok(ReadReply { read_seq, unread })));
            }
            Ok((read_seq, _)) if read_to_seq <= read_seq => {
                let unread = unread_of(st, uid, conv);
                sink.reply(reply_with(tx, Ok(ReadReply { read_seq, unread })));
            }
            Ok(_) => {
                let effect = ReadEffect {
                    uid,
                    conv,
                    read_seq: read_to_seq,
                    at_ms: now,
                };
                sink.effect(st, effect.into());
                let reply = st
                    .users
                    .get(&uid)
                    .and_then(|u| u.convs.get(&conv))
                    .map(|uc| ReadReply {
                        read_seq: uc.read_seq,
                        unread: unread_of(st, uid, conv),
                    })
                    .ok_or_else(|| {
                        Error::Invariant(format!(
                            "uid {uid}'s state of conv {conv} vanished while marking it read"
                        ))
                    });
                sink.reply(reply_with(tx, reply));
            }
        },
        Command::ClearDirty {
            uid,
            conv,
            version,
            tx,
        } => large::exec_clear(st, sink, uid, conv, version, tx),
        Command::Flags {
            uid,
            conv,
            flags,
            tx,
        } => {
            let uc = st.users.get(&uid).and_then(|u| u.convs.get(&conv));
            match uc {
                None => sink.reply(reply_with(
                    tx,
                    Err(Error::Forbidden(format!(
                        "uid {uid} was never in conv {conv}"
                    ))),
                )),
                Some(uc) if uc.muted == flags.muted && uc.pinned == flags.pinned => {
                    sink.reply(reply_with(tx, Ok(())));
                }
                Some(_) => {
                    let effect = FlagsEffect {
                        uid,
                        conv,
                        flags,
                        at_ms: now,
                    };
                    sink.effect(st, effect.into());
                    sink.reply(reply_with(tx, Ok(())));
                }
            }
        }
    }
}

/// One message to allocate, as decided.
struct NewMessage<'a> {
    now: TimestampMs,
    sender: Uid,
    conv: ConvId,
    kind: MessageKind,
    client_msg_id: ClientMsgId,
    msg_type: MsgType,
    target: MsgId,
    target_seq: MsgSeq,
    payload: &'a StoredPayload,
    summary: Bytes,
}

/// A join or leave: a message with no body, sent by the member.
fn push_membership(
    st: &mut State,
    sink: &mut dyn Sink,
    now: TimestampMs,
    uid: Uid,
    conv: ConvId,
    kind: MessageKind,
) {
    let payload = StoredPayload {
        compressed: false,
        raw_len: 0,
        bytes: Bytes::new(),
    };
    push_message(
        st,
        sink,
        NewMessage {
            now,
            kind,
            conv,
            sender: uid,
            client_msg_id: 0,
            msg_type: 0,
            target: MsgId(0),
            target_seq: MsgSeq(0),
            payload: &payload,
            summary: record::summary_for(kind, &[], MsgId(0), uid),
        },
    );
}

/// Allocates a message's `msg_id` and `msg_seq` and hands its body and
/// effect to the round.
fn push_message(st: &mut State, sink: &mut dyn Sink, m: NewMessage<'_>) -> (MsgId, MsgSeq) {
    let msg_seq = st.convs.get(&m.conv).map_or(MsgSeq(0), |c| c.head()).next();
    let msg_id = MsgId(st.next_msg_counter); // shard id 0 in the top bits (R3)
    let header = MsgHeader {
        kind: m.kind,
        msg_type: m.msg_type,
        conv: m.conv,
        msg_seq,
        msg_id,
        sender: m.sender,
        target: m.target,
        sent_at_ms: m.now,
    };
    let body = encode_msg_record(&header, m.payload);
    let effect = MsgEffect {
        conv: m.conv,
        msg_seq,
        msg_id,
        sender: m.sender,
        kind: m.kind,
        msg_type: m.msg_type,
        target_seq: m.target_seq,
        at_ms: m.now,
        msg_loc: PENDING_LOC,
        client_msg_id: m.client_msg_id,
        summary: m.summary,
    };
    let body = Bytes::from(body);
    // Only a store that leaves some slots to other groups routes.
    let routed = st.fanout.routing.get().map(|_| fanout_message(&effect));
    sink.effect(st, MsgBodyEffect { msg: effect, body }.into());
    if let Some(m) = routed {
        fanout::route(st, sink, m);
    }
    (msg_id, msg_seq)
}

/// The message as an outbox entry carries it.
fn fanout_message(m: &MsgEffect) -> FanoutMessage {
    FanoutMessage {
        conv: m.conv,
        msg_seq: m.msg_seq,
        msg_id: m.msg_id,
        sender: m.sender,
        kind: m.kind,
        msg_type: m.msg_type,
        target_seq: m.target_seq,
        at_ms: m.at_ms,
        client_msg_id: m.client_msg_id,
        summary: m.summary.clone(),
    }
}

enum Decision {
    Duplicate(SendReply),
    New { target_seq: MsgSeq },
}

/// A send, recall or edit: a retry answers the first send, or `CONFLICT`
/// when it asks for something else ([`read::duplicate_reply`], R4); a recall
/// or edit must name a normal or edited message of the same sender that is
/// not recalled (R6).
fn decide_send(
    st: &State,
    now: TimestampMs,
    sender: Uid,
    conv: ConvId,
    kind: MessageKind,
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
        return Ok(Decision::New {
            target_seq: MsgSeq(0),
        });
    }
    let target_seq = c
        .seq_of(target)
        .ok_or_else(|| Error::NotFound(format!("message {target} in conv {conv}")))?;
    let meta = c.meta(target_seq).ok_or_else(|| {
        Error::Invariant(format!(
            "conv {conv}: msg_id {target} maps to seq {target_seq}, which is not indexed"
        ))
    })?;
    if !matches!(meta.kind, MessageKind::Normal | MessageKind::Edit) {
        return Err(Error::BadRequest(format!(
            "message {target} is a control message"
        )));
    }
    if { meta.sender } != sender {
        return Err(Error::Forbidden(format!(
            "only the sender of message {target} may change it"
        )));
    }
    if meta.flags & FLAG_RECALLED != 0 {
        return Err(Error::Conflict(format!(
            "message {target} is already recalled"
        )));
    }
    Ok(Decision::New { target_seq })
}

/// The reader's cursor and unread count before a `mark_read`; refuses a
/// non-member and a cursor beyond the head (R14).
fn decide_mark_read(
    st: &State,
    uid: Uid,
    conv: ConvId,
    read_to_seq: MsgSeq,
) -> Result<(MsgSeq, u32)> {
    let c = st
        .convs
        .get(&conv)
        .ok_or_else(|| Error::NotFound(format!("conv {conv}")))?;
    let head = c.head();
    let uc = st
        .users
        .get(&uid)
        .and_then(|u| u.convs.get(&conv))
        .ok_or_else(|| Error::Forbidden(format!("uid {uid} was never in conv {conv}")))?;
    if read_to_seq > head {
        return Err(Error::BadRequest(format!(
            "read_to_seq {read_to_seq} is beyond conv {conv}'s head {head}"
        )));
    }
    Ok((uc.read_seq, uc.unread))
}

/// Whether `conv`'s unread counts are the stored, exact ones (not a large
/// group).
fn unread_exact(st: &State, conv: ConvId) -> bool {
    st.convs.get(&conv).is_none_or(|c| c.large.is_none())
}

/// `uid`'s unread count in `conv` as a reply shows it: exact, plus the
/// approximation above a large group's switch ([`large::unread`]).
fn unread_of(st: &State, uid: Uid, conv: ConvId) -> u32 {
    let (Some(c), Some(uc)) = (
        st.convs.get(&conv),
        st.users.get(&uid).and_then(|u| u.convs.get(&conv)),
    ) else {
        return 0;
    };
    large::unread(c, uid, uc, c.head())
}
