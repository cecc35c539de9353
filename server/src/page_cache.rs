//! Tells the engine, every [`PERIOD`], what the kernel has reclaimed so
//! far, so that a sync page whose records this process wrote since the
//! last reclaim is copied from the page cache on the connection's worker
//! instead of hopping to the read pool (`ARCHITECTURE.md`, "Reading the
//! hot tail"). The counters are read on a blocking thread. Where the
//! kernel has no `/proc/vmstat`, the task ends and only the log's newest
//! segments count as cached.

use std::sync::Arc;
use std::time::Duration;

use inbox_engine::log::{reclaims_so_far, LOOK_VALID_FOR};

use crate::conn::Shared;

/// How often the counters are read: well inside the engine's
/// [`LOOK_VALID_FOR`], so a late tick on a busy worker still lands in time.
pub const PERIOD: Duration = Duration::from_millis(100);

const _: () = assert!(PERIOD.as_millis() * 2 <= LOOK_VALID_FOR.as_millis());

/// Runs until `shutdown` changes.
pub async fn watch(shared: Arc<Shared>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut every = tokio::time::interval(PERIOD);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Ok(Some(reclaims)) = tokio::task::spawn_blocking(reclaims_so_far).await else {
            tracing::info!("no page cache counters (/proc/vmstat): sync pages older than the newest segments go to the read pool");
            return;
        };
        if shared.engine().observe_page_cache(reclaims) {
            shared.metrics.page_cache_reclaims_seen.inc();
        }
    }
}
