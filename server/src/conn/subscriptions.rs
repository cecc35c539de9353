//! One connection's hint subscriptions: the uids it listens to, its
//! mailboxes on the daemon's hint routes, and the tasks that push what
//! lands in them.
//!
//! A connection holds at most `subscribe_uids_max` subscriptions and all
//! connections together at most `subscriptions_max`: a `SUBSCRIBE` over
//! the first is refused `TOO_LARGE`, over the second `RATE_LIMITED`, and
//! adds nothing. Dropping [`Subscriptions`] gives every subscription back
//! to the shared budget and takes the mailboxes off the routes, however
//! the connection ends.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use inbox_wire::{DirtyHint, ErrorCode, ErrorReply, Frame, Hint};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::Shared;
use crate::hints::{self, Mailbox};

/// Retry-after for a `SUBSCRIBE` refused at the server-wide cap: room comes
/// back as other connections unsubscribe or close, not on a clock.
const SUBSCRIBE_RETRY_MS: u64 = 1_000;

pub(super) struct Subscriptions {
    shared: Arc<Shared>,
    uids: HashSet<u64>,
    mailbox: Arc<Mailbox<Hint>>,
    dirty_mailbox: Arc<Mailbox<DirtyHint>>,
    /// Set by the first `SUBSCRIBE_DIRTY`: from then on every uid the
    /// connection subscribes to is also routed `DIRTY_HINT`s.
    dirty_routed: bool,
    hint_task: Option<JoinHandle<()>>,
    dirty_hint_task: Option<JoinHandle<()>>,
    /// Flipped when the connection closes: the push tasks stop.
    closed: watch::Sender<bool>,
}

impl Subscriptions {
    pub(super) fn new(shared: Arc<Shared>) -> Subscriptions {
        Subscriptions {
            shared,
            uids: HashSet::new(),
            mailbox: Arc::default(),
            dirty_mailbox: Arc::default(),
            dirty_routed: false,
            hint_task: None,
            dirty_hint_task: None,
            closed: watch::channel(false).0,
        }
    }

    /// `SUBSCRIBE` (or, `dirty`, `SUBSCRIBE_DIRTY`) to `uids`, all or
    /// nothing; pushes go out through `tx`.
    pub(super) fn subscribe(
        &mut self,
        uids: &[u64],
        dirty: bool,
        tx: &mpsc::Sender<Frame>,
    ) -> Result<(), ErrorReply> {
        let fresh = self.reserve(uids)?;
        let shared = Arc::clone(&self.shared);
        shared.hint_routes.add(&fresh, &self.mailbox);
        if self.dirty_routed {
            shared.dirty_routes.add(&fresh, &self.dirty_mailbox);
        } else if dirty {
            // Every uid held, fresh or not, none routed yet.
            self.dirty_routed = true;
            let held: Vec<u64> = self.uids.iter().copied().collect();
            shared.dirty_routes.add(&held, &self.dirty_mailbox);
        }
        if self.hint_task.is_none() {
            self.hint_task = Some(self.pusher(&self.mailbox, tx));
        }
        if self.dirty_routed && self.dirty_hint_task.is_none() {
            self.dirty_hint_task = Some(self.pusher(&self.dirty_mailbox, tx));
        }
        Ok(())
    }

    /// `UNSUBSCRIBE` from `uids` (those not held are ignored).
    pub(super) fn unsubscribe(&mut self, uids: &[u64]) {
        let gone: Vec<u64> = uids
            .iter()
            .copied()
            .filter(|uid| self.uids.remove(uid))
            .collect();
        self.release(&gone);
    }

    /// Stops the push tasks and waits until they have.
    pub(super) async fn stop_pushing(&mut self) {
        let _ = self.closed.send(true);
        for task in [self.hint_task.take(), self.dirty_hint_task.take()]
            .into_iter()
            .flatten()
        {
            let _ = task.await;
        }
    }

    /// Adds `uids` to the connection's subscriptions, all or nothing,
    /// within the per-connection and the total caps; returns those it did
    /// not hold.
    fn reserve(&mut self, uids: &[u64]) -> Result<Vec<u64>, ErrorReply> {
        let mut fresh: Vec<u64> = uids
            .iter()
            .copied()
            .filter(|uid| !self.uids.contains(uid))
            .collect();
        fresh.sort_unstable();
        fresh.dedup();
        let limits = &self.shared.limits;
        let per_connection = u64::from(limits.subscribe_uids_max);
        let wanted = fresh.len() as u64;
        let held = self.uids.len();
        if held as u64 + wanted > per_connection {
            return Err(ErrorReply::new(
                ErrorCode::TooLarge,
                per_connection,
                format!(
                    "a connection may subscribe to at most {per_connection} uids ({held} held, {wanted} new)"
                ),
            ));
        }
        let total_max = limits.subscriptions_max;
        let reserved = self.shared.metrics.subscriptions.inner().fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |held| held.checked_add(wanted).filter(|total| *total <= total_max),
        );
        if reserved.is_err() {
            return Err(ErrorReply::new(
                ErrorCode::RateLimited,
                SUBSCRIBE_RETRY_MS,
                format!("the server holds its maximum of {total_max} subscriptions; retry later"),
            ));
        }
        self.uids.extend(fresh.iter().copied());
        Ok(fresh)
    }

    /// Takes `gone` (no longer held) off the routes and gives them back
    /// to the shared budget.
    fn release(&self, gone: &[u64]) {
        self.shared.hint_routes.remove(gone, &self.mailbox);
        self.shared.dirty_routes.remove(gone, &self.dirty_mailbox);
        self.shared
            .metrics
            .subscriptions
            .inner()
            .fetch_sub(gone.len() as u64, Ordering::Relaxed);
    }

    fn pusher<P: hints::Pushed>(
        &self,
        mailbox: &Arc<Mailbox<P>>,
        tx: &mpsc::Sender<Frame>,
    ) -> JoinHandle<()> {
        tokio::spawn(hints::push_loop(
            Arc::clone(mailbox),
            tx.clone(),
            Arc::clone(&self.shared.metrics),
            self.closed.subscribe(),
        ))
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        let held: Vec<u64> = self.uids.drain().collect();
        self.release(&held);
    }
}
