//! Replies: released once the command behind them is durable.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::read::Read;
pub(crate) use super::reply::{Reply, Tx};
use crate::error::{Error, Result};

/// A reply that is released once the command behind it is durable.
///
/// Await it from async code, or call [`Pending::wait`] from a plain thread.
pub struct Pending<T>(tokio::sync::oneshot::Receiver<Reply<T>>);

impl<T> Pending<T> {
    /// A pending reply and the sender that completes it.
    pub(crate) fn channel() -> (tokio::sync::oneshot::Sender<Reply<T>>, Self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (tx, Self(rx))
    }

    pub(crate) fn ready(result: Result<T>) -> Self {
        let (tx, pending) = Self::channel();
        // The receiver is alive in `pending`, so the send cannot fail.
        let _ = tx.send(Reply::Done(result));
        pending
    }

    /// Whether the reply has been released and waits to be taken: one
    /// that [`crate::Inbox::send_here`] committed on the calling thread
    /// is, by the time that call returns.
    pub fn is_released(&self) -> bool {
        !self.0.is_empty()
    }

    /// Blocks until the reply is ready. Must not be called from inside an
    /// async runtime; await the `Pending` there instead.
    pub fn wait(self) -> Result<T> {
        self.wait_read().wait()
    }

    /// Blocks until the reply is released; what is left is a [`Read`]
    /// (a sync page still has to read its events).
    fn wait_read(self) -> Read<T> {
        match self.0.blocking_recv() {
            Ok(reply) => Read::from_reply(reply),
            Err(_) => Read::ready(Err(stopped())),
        }
    }

    /// Resolves once the reply is released, without reading anything: an
    /// async server then runs the returned [`Read`] where IO is allowed
    /// (awaiting the `Pending` itself would read the log inside `poll`).
    pub async fn released(self) -> Read<T> {
        match self.0.await {
            Ok(reply) => Read::from_reply(reply),
            Err(_) => Read::ready(Err(stopped())),
        }
    }
}

/// The engine stopped (shut down, or its thread died) before replying.
fn stopped() -> Error {
    Error::ShuttingDown
}

impl<T> Future for Pending<T> {
    type Output = Result<T>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|received| match received {
                Ok(reply) => reply.finish(),
                Err(_) => Err(stopped()),
            })
    }
}
