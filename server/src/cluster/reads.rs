//! Read-index confirmations shared by the reads that wait for them.
//!
//! A read on the leader is linearizable once a heartbeat round started
//! after the read arrived has confirmed, with a quorum, that this node
//! still leads, and the node has applied what was committed when that
//! round began (`Raft::ensure_linearizable`). One such round serves every
//! read that arrived before it began, so reads queue for the next round
//! instead of each starting its own: at most one round runs at a time, and
//! a read waits for at most the one running and the next. Under load the
//! cost of confirming is then one heartbeat round per round trip, not one
//! per read.
//!
//! A read that arrives while a round runs waits for the next one: the
//! running round may have taken its commit index before the read arrived,
//! which would let the read miss a write acknowledged just before it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use super::InboxRaft;

/// How long one round may take before its reads are refused.
pub(crate) const CONFIRM_WITHIN: Duration = Duration::from_secs(4);

/// The outcome of a round: `Err` carries why leadership was not confirmed.
type Outcome = Result<(), String>;

#[derive(Default)]
struct Queue {
    /// A round is running (its driver task owns the reads it took).
    running: bool,
    /// Reads waiting for a round that has not begun yet.
    waiting: Vec<oneshot::Sender<Outcome>>,
}

/// Shared by every read of a node (one per raft instance).
#[derive(Default)]
pub(crate) struct ReadBarrier {
    queue: Mutex<Queue>,
    /// Rounds run, for the tests and the metrics.
    rounds: std::sync::atomic::AtomicU64,
}

impl ReadBarrier {
    /// Waits until a round begun after this call has confirmed this
    /// node's leadership (and it applied what was committed then).
    pub(crate) async fn confirm(self: &Arc<Self>, raft: &InboxRaft) -> Outcome {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.waiting.push(tx);
            !std::mem::replace(&mut q.running, true)
        };
        if start {
            // Its own task: a driver must not stop with the read that
            // started it (a client may drop its connection).
            tokio::spawn(Arc::clone(self).drive(raft.clone()));
        }
        rx.await
            .unwrap_or_else(|_| Err("the read confirmation stopped".into()))
    }

    /// Runs rounds while reads wait for one.
    async fn drive(self: Arc<Self>, raft: InboxRaft) {
        loop {
            let taken = {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                if q.waiting.is_empty() {
                    q.running = false;
                    return;
                }
                std::mem::take(&mut q.waiting)
            };
            self.rounds
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let outcome = match tokio::time::timeout(
                CONFIRM_WITHIN,
                raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex),
            )
            .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("not the leader: {e}")),
                Err(_) => {
                    Err("not the leader: leadership not confirmed by a quorum in time".to_string())
                }
            };
            for tx in taken {
                let _ = tx.send(outcome.clone());
            }
        }
    }

    /// Rounds run since start.
    pub(crate) fn rounds(&self) -> u64 {
        self.rounds.load(std::sync::atomic::Ordering::Relaxed)
    }
}
