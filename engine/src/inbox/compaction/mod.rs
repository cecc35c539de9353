//! Compaction (R19): reclaims a user's sync events below its floor (and
//! messages past the history retention), drops dead segments whole and
//! rewrites sparse `evt` ones, in the background and rate-limited; and
//! says what holds data back (`explain`).
//!
//! A pass, in order (each state change is a logged command, decided again
//! by the sequencer against the fences as they are at that instant):
//! 1. Snapshots: rows expired past their TTL are dropped (logged), then
//!    content files whose row is gone are deleted.
//! 2. Trim: per user, the compactor measures (reading event records, off
//!    the sequencer) the newest event older than the safety window and the
//!    newest older than the hard TTL; the sequencer clamps that by the
//!    fence floor and logs `Trim { events_base }`. The trim is durable
//!    before any file is touched, so a reclaimed event never comes back.
//! 3. Segments: the state counts, per segment, the retained events that
//!    point into it (`SegRefs`, kept up to date by
//!    `apply`), so finding dead segments reads counts, not the index; the
//!    index is walked only for the segments that lost events since they
//!    were last judged. A sealed `evt` segment is dead when no retained event
//!    points into it and every record in it is covered by *both* retained
//!    checkpoints (a fallback to the older checkpoint then still replays
//!    everything it needs). Dead segments are deleted whole
//!    (`Log::delete_segment`: unlink + directory fsync). If dead segments
//!    wait only for checkpoint coverage, the pass writes checkpoints first.
//! 4. Rewrite: a sealed segment whose live bytes fall under
//!    `rewrite_live_fraction`, and whose live events are all past the
//!    safety window (else it straddles the trim point and empties by
//!    itself), has its live records copied forward (records
//!    with the copy flag, which replay ignores) in one durable batch; then a
//!    `Relocate` command points the events at the copies (logged, durable);
//!    only then is the old file deleted. A crash after the copy leaves dead
//!    copies; after the relocate, an old file nobody points at; either is
//!    reclaimed by a later pass. Nothing is lost, nothing comes back.
//!    Copying is throttled to `compaction_bytes_per_s`.
//!
//! 5. History retention (only with `history_retention = Some(d)`): per
//!    conversation, the compactor binary-searches message times (the
//!    sequencer-stamped `sent_at_ms` in the `msg` records) for the newest
//!    message older than `d`; the sequencer clamps it to the durable head
//!    and logs `TrimMsgs { conv, msgs_base }`. Once that is durable, a
//!    sealed `msg` segment no retained message points into is deleted
//!    whole. No checkpoint coverage is needed for it: `msg` records are
//!    data only, and any replay that re-creates index entries into a
//!    deleted segment also replays the (older-than-deletion, durable)
//!    trim that drops them again. A recall is always above the message it
//!    hides, so a prefix trim never reclaims a recall while its original
//!    is retained, and a retained original keeps its tombstone flag.
//!
//! Only one pass runs at a time; the background thread and
//! [`crate::Inbox::compact`] share the same lock.
//!
//! Files: [`pass`] (the pass and its thread), [`rewrite`] (dead and
//! sparse segments), [`decide`] (the steps the sequencer decides),
//! [`record`] (their records and `apply`), [`fences`] (the floor),
//! [`explain`] (what holds data back, space usage), [`runtime`] and
//! [`submit`].

pub(crate) mod bodies;
pub(crate) mod decide;
pub(crate) mod explain;
pub(crate) mod fences;
pub(crate) mod pass;
pub(crate) mod record;
pub(crate) mod rewrite;
pub(crate) mod runtime;
pub(crate) mod submit;

pub use explain::SpaceUsage;
pub use runtime::CompactionStep;

use self::record::{BodyMove, MoveBodiesEffect, RelocateEffect, Relocation};
use super::round::{fail_now, reply_with, Env, Fail, Sink, Tx};
use super::state::State;
use crate::api::*;

pub(crate) enum Command {
    /// Trim users' events (decided again against the fences).
    Trim {
        proposals: Vec<decide::TrimProposal>,
        tx: Tx<Vec<(Uid, SyncSeq, SyncSeq)>>,
    },
    /// Reclaim conversations' messages past the history retention,
    /// proposed as (conv, new base); replies (conv, old, new).
    TrimMsgs {
        proposals: Vec<(ConvId, MsgSeq)>,
        tx: Tx<Vec<(ConvId, MsgSeq, MsgSeq)>>,
    },
    /// Point events at copies of their records.
    Relocate { moves: Vec<Relocation>, tx: Tx<()> },
    /// Point messages at copies of their bodies in the `msg` log.
    MoveBodies { moves: Vec<BodyMove>, tx: Tx<()> },
    /// Forget snapshots past their TTL.
    DropSnapshots {
        candidates: Vec<(Uid, u64)>,
        tx: Tx<()>,
    },
}

/// Answers a command with a failure without running it.
pub(crate) fn fail(cmd: Command, f: &Fail) {
    match cmd {
        Command::Trim { tx, .. } => fail_now(tx, f),
        Command::TrimMsgs { tx, .. } => fail_now(tx, f),
        Command::Relocate { tx, .. }
        | Command::MoveBodies { tx, .. }
        | Command::DropSnapshots { tx, .. } => fail_now(tx, f),
    }
}

/// Decides one command against `st` and hands the outcome to `sink`.
pub(crate) fn exec(cmd: Command, st: &mut State, env: &Env<'_>, sink: &mut dyn Sink) {
    let now = env.now;
    match cmd {
        Command::Trim { proposals, tx } => {
            let (effects, trimmed) = decide::decide_trim(st, &env.shared.config, now, &proposals);
            for e in effects {
                sink.effect(st, e);
            }
            sink.reply(reply_with(tx, Ok(trimmed)));
        }
        Command::TrimMsgs { proposals, tx } => {
            let (effects, trimmed) = decide::decide_trim_msgs(st, &proposals);
            for e in effects {
                sink.effect(st, e);
            }
            sink.reply(reply_with(tx, Ok(trimmed)));
        }
        Command::Relocate { moves, tx } => {
            sink.effect(st, RelocateEffect(moves).into());
            sink.reply(reply_with(tx, Ok(())));
        }
        Command::MoveBodies { moves, tx } => {
            sink.effect(st, MoveBodiesEffect(moves).into());
            sink.reply(reply_with(tx, Ok(())));
        }
        Command::DropSnapshots { candidates, tx } => {
            let effects = decide::decide_drop_snapshots(st, now, &candidates);
            for e in effects {
                sink.effect(st, e);
            }
            sink.reply(reply_with(tx, Ok(())));
        }
    }
}
