//! The completion stage's queue: the rounds handed from the sequencer,
//! not yet finished, in order. `Shared` holds it, so that whoever makes a
//! round ready finishes it (`completion.rs`); it sits below `Shared` and
//! names only the log's ticket, the round's replies and its link.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::api::*;
use crate::inbox::replica::link::Link;
use crate::inbox::reply::{Fail, ReplyFn};
use crate::log::AppendTicket;

pub(crate) enum Outcome {
    Ticket(AppendTicket),
    Nothing,
    Failed(Fail),
}

/// A round handed from the sequencer to the completion stage.
pub(crate) struct RoundDone {
    pub id: u64,
    pub outcome: Outcome,
    pub replies: Vec<ReplyFn>,
    /// A leader's round: released once its consensus layer commits this
    /// index (the round's own, or for a round without an entry of its
    /// own, the last round applied before it was decided).
    pub replica: Option<(Arc<Link>, u64)>,
    /// What the round appended, per change (folded by the completion
    /// stage, `completion.rs`).
    pub user_marks: Vec<(Uid, SyncSeq)>,
    pub conv_marks: Vec<(ConvId, MsgSeq)>,
}

impl RoundDone {
    /// Whether the round's outcome is known now (never blocks).
    pub(super) fn is_ready(&self) -> bool {
        let decided = || {
            self.replica
                .as_ref()
                .is_none_or(|(link, index)| link.is_decided(*index))
        };
        match &self.outcome {
            Outcome::Ticket(t) => match t.poll() {
                None => false,
                Some(Err(_)) => true,
                Some(Ok(())) => decided(),
            },
            Outcome::Nothing => decided(),
            Outcome::Failed(_) => true,
        }
    }
}

/// The rounds not yet finished, in order, and the failure that ended the
/// engine (every later round fails with it).
#[derive(Default)]
pub(crate) struct Queue {
    pub(super) rounds: VecDeque<RoundDone>,
    pub(super) poisoned: Option<Fail>,
}

/// The completion stage's queue.
pub(crate) type Completions = Mutex<Queue>;
