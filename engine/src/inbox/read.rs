//! [`Read`]: a read that an async server can run without ever blocking one
//! of its workers.
//!
//! A read may need two kinds of waiting, and they are kept apart:
//! - a row it would return was changed by a round that has not settled
//!   (visibility, see `docs/ARCHITECTURE.md`): that wait is a value to
//!   await ([`Read::settled`]), never a blocked thread;
//! - reading log records or a snapshot file is IO: [`Read::attempt`] does
//!   it, and says beforehand ([`Read::may_do_io`]) whether it may, so a
//!   server runs those attempts on a bounded pool of blocking threads.
//!
//! The engine stays runtime-agnostic: nothing here spawns or names a
//! runtime.

use std::future::Future;
use std::sync::Arc;

use super::reply::Reply;
use super::shared::{Miss, Shared};
use crate::error::Result;

/// An attempt at a read; the flag says whether it may do IO.
type Attempt<T> = Box<dyn FnMut(&Shared, bool) -> std::result::Result<T, Miss> + Send>;

enum Step<T> {
    /// The answer, already there.
    Ready(Option<Result<T>>),
    /// Builds the answer once (a sync page reading its events); `io`
    /// unless its records are resident.
    Once {
        build: Option<Box<dyn FnOnce() -> Result<T> + Send>>,
        io: bool,
    },
    /// Looks at the state, perhaps reads records; may find a row that is
    /// not durable yet, then looks again once its round has settled. One
    /// made without IO may find that it needs some ([`Miss::NeedsIo`]):
    /// then `io` is set and it is attempted again.
    Retry {
        shared: Arc<Shared>,
        attempt: Attempt<T>,
        io: bool,
    },
}

/// A read, ready to be attempted. Use [`Read::wait`] on a plain thread;
/// an async caller loops over [`Read::attempt`] and [`Read::settled`].
pub struct Read<T> {
    step: Step<T>,
    /// The round the last attempt found unsettled (0: none).
    waiting: u64,
}

impl<T> Read<T> {
    pub(crate) fn ready(result: Result<T>) -> Self {
        Self {
            step: Step::Ready(Some(result)),
            waiting: 0,
        }
    }

    pub(crate) fn from_reply(reply: Reply<T>) -> Self {
        match reply {
            Reply::Done(r) => Self::ready(r),
            Reply::Later(f) => Self {
                step: Step::Once {
                    build: Some(f),
                    io: true,
                },
                waiting: 0,
            },
            Reply::Resident(f) => Self {
                step: Step::Once {
                    build: Some(f),
                    io: false,
                },
                waiting: 0,
            },
        }
    }

    /// A read of memory only (the state under its lock): it never does IO
    /// and may run on any thread.
    pub(crate) fn memory(
        shared: &Arc<Shared>,
        mut attempt: impl FnMut(&Shared) -> std::result::Result<T, Miss> + Send + 'static,
    ) -> Self {
        Self::retry(shared, move |sh, _| attempt(sh), false)
    }

    /// A read that may read log records or files.
    pub(crate) fn io(
        shared: &Arc<Shared>,
        mut attempt: impl FnMut(&Shared) -> std::result::Result<T, Miss> + Send + 'static,
    ) -> Self {
        Self::retry(shared, move |sh, _| attempt(sh), true)
    }

    /// A read of log records that is first attempted without IO: told so
    /// by the flag, `attempt` answers [`Miss::NeedsIo`] when a record it
    /// would read may not be in the page cache, and the read then says it
    /// may do IO ([`Read::may_do_io`]) for the next attempt.
    pub(crate) fn cached_first(
        shared: &Arc<Shared>,
        attempt: impl FnMut(&Shared, bool) -> std::result::Result<T, Miss> + Send + 'static,
    ) -> Self {
        Self::retry(shared, attempt, false)
    }

    fn retry(
        shared: &Arc<Shared>,
        attempt: impl FnMut(&Shared, bool) -> std::result::Result<T, Miss> + Send + 'static,
        io: bool,
    ) -> Self {
        Self {
            step: Step::Retry {
                shared: Arc::clone(shared),
                attempt: Box::new(attempt),
                io,
            },
            waiting: 0,
        }
    }

    /// Whether [`Read::attempt`] may read the disk (log records, snapshot
    /// files): run it on a blocking thread then. `false` means it only
    /// takes the state lock (held by the sequencer for one apply at most)
    /// and copies from memory: the state, or log records that the page
    /// cache holds as far as the log can tell (`crate::log::Log::cached_floor`).
    pub fn may_do_io(&self) -> bool {
        match &self.step {
            Step::Ready(_) => false,
            Step::Once { io, .. } | Step::Retry { io, .. } => *io,
        }
    }

    /// Tries once. `None`: a row the answer needs is not durable yet, or
    /// a record it needs may have to come from the disk; await
    /// [`Read::settled`] and try again (where [`Read::may_do_io`] now
    /// says). Never blocks on a round.
    pub fn attempt(&mut self) -> Option<Result<T>> {
        self.waiting = 0;
        match &mut self.step {
            Step::Ready(r) => Some(r.take().unwrap_or_else(|| Err(answered()))),
            Step::Once { build, .. } => Some(build.take().map_or_else(|| Err(answered()), |f| f())),
            Step::Retry {
                shared,
                attempt,
                io,
            } => match attempt(shared, *io) {
                Ok(v) => Some(Ok(v)),
                Err(Miss::Err(e)) => Some(Err(e)),
                Err(Miss::Unsettled(round)) => {
                    self.waiting = round;
                    None
                }
                Err(Miss::NeedsIo) if !*io => {
                    *io = true;
                    None
                }
                Err(Miss::NeedsIo) => Some(Err(crate::error::Error::Internal(
                    "a read allowed IO asked for IO".into(),
                ))),
            },
        }
    }

    /// Resolves once the round the last attempt waited for has settled (or
    /// the engine is poisoned: the next attempt then says so).
    /// The future holds no borrow of the read, so it is `Send` whatever
    /// the read holds.
    pub fn settled(&self) -> impl Future<Output = ()> + Send + 'static {
        let wait = match &self.step {
            Step::Retry { shared, .. } => Some((Arc::clone(shared), self.waiting)),
            _ => None,
        };
        async move {
            if let Some((shared, round)) = wait {
                shared.settled_async(round).await;
            }
        }
    }

    /// Runs the read to its answer, blocking this thread on unsettled
    /// rounds. Not for async workers.
    pub fn wait(mut self) -> Result<T> {
        loop {
            if let Some(r) = self.attempt() {
                return r;
            }
            if let Step::Retry { shared, .. } = &self.step {
                shared.wait_settled(self.waiting);
            }
        }
    }
}

/// Attempting a read that already answered is a caller bug.
fn answered() -> crate::error::Error {
    crate::error::Error::Internal("read attempted after it answered".into())
}
