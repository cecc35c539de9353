//! Whether one connection alone is making requests.
//!
//! A send is normally queued for the engine's sequencer thread, and its
//! reply comes back once the round is durable: a hand-off to that thread
//! and one back, each the wake-up of a sleeping thread. For one client
//! waiting for each reply they are about a sixth of a send's latency
//! (`docs/BENCHMARKS.md`, "A lone connection's sends on its worker"). A
//! worker could instead decide and commit the send itself
//! ([`inbox_engine::Inbox::send_here`]), but it then waits for the disk,
//! and every other connection it serves waits with it.
//!
//! So it does so only while one connection alone has been making
//! requests: [`Alone::note`] is told of every request, and answers
//! whether the connection making it is the only one that made any in the
//! last [`QUIET`]. Nobody else is waiting then, and a request from
//! another connection that arrives during such a commit waits at most
//! for that one fdatasync, as it would behind a round already being
//! written. Many clients at once keep interleaving, so their sends stay
//! on the sequencer, where a round takes all of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long after another connection's request sends are queued again.
pub const QUIET: Duration = Duration::from_millis(20);
const QUIET_US: u64 = QUIET.as_micros() as u64;

/// The connections' requests as [`Alone::note`] sees them.
pub struct Alone {
    enabled: bool,
    epoch: Instant,
    /// The connection of the last request (0: none yet).
    last: AtomicU64,
    /// When a request last came from a connection other than the one
    /// before it, microseconds since `epoch`.
    switched_us: AtomicU64,
}

impl Alone {
    /// `enabled` false: [`Alone::note`] always answers false.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            switched_us: AtomicU64::new(0),
        }
    }

    /// Records a request of connection `conn` (never 0) and answers
    /// whether `conn` is the only connection that made one in the last
    /// [`QUIET`]: whether its send may be committed on its worker.
    pub fn note(&self, conn: u64) -> bool {
        self.note_at(conn, self.micros())
    }

    /// [`Alone::note`] at `now_us`, microseconds since the epoch.
    fn note_at(&self, conn: u64, now_us: u64) -> bool {
        if !self.enabled {
            return false;
        }
        if self.last.swap(conn, Ordering::Relaxed) != conn {
            self.switched_us.store(now_us, Ordering::Relaxed);
            return false;
        }
        now_us.saturating_sub(self.switched_us.load(Ordering::Relaxed)) >= QUIET_US
    }

    fn micros(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;

    #[test]
    fn a_connection_is_alone_once_no_other_has_made_a_request_for_the_quiet_period() {
        let alone = Alone::new(true);
        assert!(
            !alone.note_at(1, 5 * MS),
            "the first request switches from nobody"
        );
        assert!(!alone.note_at(1, 24 * MS), "still within the quiet period");
        assert!(alone.note_at(1, 25 * MS));
        assert!(!alone.note_at(2, 26 * MS), "another connection's request");
        assert!(
            !alone.note_at(1, 27 * MS),
            "and the first one's right after it"
        );
        assert!(!alone.note_at(1, 46 * MS));
        assert!(alone.note_at(1, 47 * MS));
    }

    #[test]
    fn interleaved_connections_are_never_alone() {
        let alone = Alone::new(true);
        let mut now = 0;
        for round in 0..10 {
            for conn in 1..=16 {
                now += 5 * MS;
                assert!(
                    !alone.note_at(conn, now),
                    "round {round}, connection {conn}"
                );
            }
        }
    }

    #[test]
    fn a_disabled_gate_never_lets_a_send_run_on_its_worker() {
        let alone = Alone::new(false);
        alone.note_at(1, 0);
        assert!(!alone.note_at(1, 100 * MS));
    }
}
