//! Runs engine reads without ever blocking an async worker.
//!
//! An engine [`Read`] waits for a round to settle by awaiting
//! ([`Read::settled`]), and says whether an attempt may do disk IO (log
//! records, snapshot files, [`Read::may_do_io`]). Those attempts run here,
//! on tokio's blocking threads, at most `limit` at a time: a burst of
//! history reads on a cold disk queues here instead of taking every worker
//! (or every blocking thread) of the daemon. Attempts that only copy from
//! memory run inline.

use std::sync::Arc;

use inbox_engine::inbox::Read;
use inbox_engine::Error;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Semaphore;

use crate::metrics::Metrics;

/// A bounded pool for reads that may touch the disk.
#[derive(Clone)]
pub struct ReadPool {
    permits: Arc<Semaphore>,
    /// Attempts run in place and on the pool (`inboxd_reads_in_place`,
    /// `inboxd_reads_pooled`).
    in_place: Counter,
    pooled: Counter,
}

impl ReadPool {
    /// At most `limit` reads on blocking threads at once (at least one),
    /// counted in `metrics`.
    pub fn new(limit: usize, metrics: &Metrics) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit.max(1))),
            in_place: metrics.reads_in_place.clone(),
            pooled: metrics.reads_pooled.clone(),
        }
    }

    /// The default bound: twice the cores, enough to keep a disk busy
    /// without letting reads crowd out compaction and checkpoints.
    pub fn with_default_limit(metrics: &Metrics) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self::new(cores * 2, metrics)
    }

    /// Runs `read` to its answer.
    pub async fn run<T: Send + 'static>(&self, mut read: Read<T>) -> Result<T, Error> {
        loop {
            let answer = if read.may_do_io() {
                self.pooled.inc();
                let Ok(permit) = Arc::clone(&self.permits).acquire_owned().await else {
                    return Err(Error::ShuttingDown);
                };
                let task = tokio::task::spawn_blocking(move || {
                    let answer = read.attempt();
                    drop(permit);
                    (read, answer)
                });
                match task.await {
                    Ok((back, answer)) => {
                        read = back;
                        answer
                    }
                    Err(join) => return Err(Error::Internal(format!("read failed: {join}"))),
                }
            } else {
                self.in_place.inc();
                read.attempt()
            };
            match answer {
                Some(result) => return result,
                None => read.settled().await,
            }
        }
    }
}
