//! How replies travel: the sending half of a [`super::Pending`] and what
//! it delivers ([`Reply`]), why a round failed ([`Fail`]), and a reply
//! waiting for its round's outcome ([`ReplyFn`]).
//!
//! These sit below everything that holds or sends a reply: the state
//! readers ([`super::read`]), the completion stage's queue in `Shared`,
//! and the decisions that queue replies (`round.rs` re-exports them).

use crate::error::{Error, Result};
use crate::log::LogError;

/// The sending half of a [`super::Pending`] reply.
pub(crate) type Tx<T> = tokio::sync::oneshot::Sender<Reply<T>>;

/// How a reply is delivered: a finished result, or a closure that builds
/// it on the caller's thread (sync pages read their events there, so the
/// sequencer never reads the log).
pub(crate) enum Reply<T> {
    Done(Result<T>),
    /// Builds the answer from log records that may have to come from the
    /// disk: an async server runs it on a blocking thread.
    Later(Box<dyn FnOnce() -> Result<T> + Send>),
    /// Builds the answer from memory and from log records written moments
    /// ago (see [`crate::log::Log::recent_floor`]), which the page cache
    /// holds: cheap enough to run on any thread, async workers included.
    Resident(Box<dyn FnOnce() -> Result<T> + Send>),
}

impl<T> Reply<T> {
    pub(crate) fn finish(self) -> Result<T> {
        match self {
            Reply::Done(r) => r,
            Reply::Later(f) | Reply::Resident(f) => f(),
        }
    }
}

/// Why a round failed; turned into an [`Error`] per reply.
#[derive(Clone, Debug)]
pub(crate) enum Fail {
    Poisoned(String),
    NoSpace(String),
    /// A replicated round that will not commit here: the leadership ended
    /// first, or this node follows.
    NotLeader(String),
}

impl Fail {
    pub fn from_log(e: &LogError) -> Fail {
        match e {
            LogError::NoSpace(m) => Fail::NoSpace(m.clone()),
            other => Fail::Poisoned(other.to_string()),
        }
    }
    pub fn to_error(&self) -> Error {
        match self {
            Fail::Poisoned(m) => Error::Log(LogError::Poisoned(m.clone())),
            Fail::NoSpace(m) => Error::NoSpace(m.clone()),
            Fail::NotLeader(m) => Error::NotLeader(m.clone()),
        }
    }
}

/// A reply, released with the round's outcome (`None`: durable).
pub(crate) type ReplyFn = Box<dyn FnOnce(Option<&Fail>) + Send>;

/// The usual reply: `result` once durable, the failure otherwise.
pub(crate) fn reply_with<T: Send + 'static>(tx: Tx<T>, result: Result<T>) -> ReplyFn {
    Box::new(move |fail| {
        let r = match fail {
            Some(f) => Err(f.to_error()),
            None => result,
        };
        let _ = tx.send(Reply::Done(r));
    })
}

/// Answers a command with a failure without running it.
pub(crate) fn fail_now<T>(tx: Tx<T>, fail: &Fail) {
    let _ = tx.send(Reply::Done(Err(fail.to_error())));
}
