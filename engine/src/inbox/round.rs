//! What a subsystem's decision hands to the sequencer (how its replies
//! travel is `reply.rs`, re-exported here): the interface between the generic round-and-commit engine
//! (`sequencer/`) and the subsystems that own the commands. The sequencer
//! runs any command type that implements [`Exec`]; `inbox/command.rs`
//! implements it for the enum of every subsystem's commands. The bytes
//! one round may gather ([`round_bytes_max`]) bound what a command may
//! add, so they are here too.
//!
//! A subsystem's `exec` reads the state, decides, and hands the outcome to
//! a [`Sink`]: effects (applied at once, so the next command of the round
//! sees them, and logged in the round's `evt` batch; a message's body
//! travels inside its effect), and one reply. It never writes, waits or
//! answers by itself: the reply is released by the completion stage once
//! the round is durable, or with the round's failure.

use std::sync::Arc;

use super::config::InboxConfig;
use super::effect::Effect;
use super::shared::Shared;
use super::state::State;
use crate::api::TimestampMs;
use crate::log::Log;

pub(crate) use super::reply::{fail_now, reply_with, Fail, ReplyFn, Tx};

/// Bytes of records a round may gather before it is closed: half of what
/// one batch of the log may hold. Each round's `msg` batch and its `evt`
/// batch go into one frame of their log, which must fit a segment; a round
/// closes once it reaches this, and no single command adds more than this
/// (payloads and compaction commands are bounded by it), so a batch never
/// exceeds what the log takes. A batch that did would be refused by the
/// log after the round's effects were applied.
pub(crate) fn round_bytes_max(segment_bytes: u64) -> u64 {
    Log::batch_records_bytes_max_for(segment_bytes) / 2
}

/// Where a decision goes: the round being built.
pub(crate) trait Sink {
    /// Applies `effect` to `st` and queues its record for the round's
    /// `evt` batch.
    fn effect(&mut self, st: &mut State, effect: Effect);
    /// Queues the command's reply.
    fn reply(&mut self, reply: ReplyFn);
}

/// What a decision may read besides the state: the stamped time of the
/// command (logged in its effects, so replay never reads the clock) and
/// the engine's shared parts for replies that read later.
pub(crate) struct Env<'a> {
    pub now: TimestampMs,
    pub shared: &'a Arc<Shared>,
}

/// A command the sequencer can run: it decides against the state and hands
/// the outcome to the round's [`Sink`], or is answered with a failure
/// without running. The sequencer knows nothing else of it.
pub(crate) trait Exec: Send + 'static {
    /// What the commands need besides the state and the [`Env`] (queues
    /// to other threads); the sequencer holds it for them, opaque, and
    /// drops it when it stops.
    type Services: Send;
    /// Decides the command against `st` and hands the outcome to `sink`.
    fn exec(self, st: &mut State, sink: &mut dyn Sink, env: &Env<'_>, services: &Self::Services);
    /// Answers the command with `fail` without running it.
    fn fail(self, fail: &Fail);
    /// The most record bytes the command may add to a round. The
    /// sequencer makes sure the log has that much room before it runs the
    /// command, so a full disk refuses it before anything changes (capped
    /// at the bytes one round may gather). `None`: no bound is known; the
    /// command runs in a round of its own kind, and a full disk is met at
    /// the log's submit, after which the state is reloaded.
    fn record_bytes_max(&self, _config: &InboxConfig) -> Option<u64> {
        None
    }
}
