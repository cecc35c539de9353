//! Which records the page cache still holds, as far as the log can tell
//! without asking the kernel page by page.
//!
//! A record this process wrote went through the page cache, and stays
//! there until the kernel reclaims it. The kernel reclaims file pages only
//! under memory pressure (or when told to drop its caches), and counts
//! each time it does in `/proc/vmstat`. So a watcher that reads those
//! counters every so often ([`reclaims_so_far`], then
//! [`super::Log::observe_page_cache`]) lets the log say of a record: it
//! was written by this process after the last reclaim the watcher saw, and
//! the watcher looked recently, so its page is cached. A reader may then
//! copy it from memory on a thread that must never wait for the disk.
//!
//! The rule errs one way only. A reclaim between two looks makes every
//! record written before the second look cold, and only records written
//! after it are warm again: pages read back since are not tracked, so they
//! count as cold. What it cannot see: a page reclaimed in the interval
//! since the last look (at most the watcher's period; a stale look makes
//! nothing warm), and another process dropping the log's pages with
//! `posix_fadvise(DONTNEED)`, which the kernel does not count.
//!
//! Without a watcher nothing is warm, and readers fall back to the log's
//! recent segments ([`super::Log::recent_floor`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::RecordLoc;

/// How old the last look may be for its answer to count.
pub const LOOK_VALID_FOR: Duration = Duration::from_millis(250);

/// No look yet.
const NEVER: u64 = u64::MAX;

/// What the last look at the kernel's reclaim counters found.
pub(super) struct CacheWatch {
    /// The first byte written after the last reclaim seen ([`encode`]d);
    /// only grows, and means nothing until the first look.
    warm_from: AtomicU64,
    /// The counters' sum at the last look.
    reclaims: AtomicU64,
    /// When the last look was, in microseconds since `epoch`.
    looked_us: AtomicU64,
    epoch: Instant,
}

impl CacheWatch {
    pub(super) fn new() -> Self {
        Self {
            warm_from: AtomicU64::new(0),
            reclaims: AtomicU64::new(NEVER),
            looked_us: AtomicU64::new(NEVER),
            epoch: Instant::now(),
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Records a look: `reclaims` is the kernel's count so far, and
    /// `append_at` where the log appends now. The first look, and any look
    /// whose count moved, make only what is written from `append_at` on
    /// warm (a page written before the first look may have been reclaimed
    /// before it). True when the count moved since an earlier look.
    ///
    /// Safe for callers on several threads: the warm position moves first
    /// and only forward (any position taken after reading a count is past
    /// the reclaims that count includes), then the count, then the time
    /// of the look, so a reader that sees a look sees its position.
    pub(super) fn observe(&self, reclaims: u64, append_at: impl FnOnce() -> RecordLoc) -> bool {
        let before = self.reclaims.load(Ordering::Acquire);
        if before != reclaims {
            self.warm_from
                .fetch_max(encode(append_at()), Ordering::AcqRel);
            self.reclaims.store(reclaims, Ordering::Release);
        }
        self.looked_us.store(self.now_us(), Ordering::Release);
        before != NEVER && before != reclaims
    }

    /// Records at or after the returned location are cached, if the last
    /// look is recent enough to say so; `None` when it is not.
    pub(super) fn warm_from(&self) -> Option<RecordLoc> {
        self.warm_from_at(self.now_us())
    }

    fn warm_from_at(&self, now_us: u64) -> Option<RecordLoc> {
        let looked = self.looked_us.load(Ordering::Acquire);
        if looked == NEVER {
            return None;
        }
        let age = now_us.saturating_sub(looked);
        if age > LOOK_VALID_FOR.as_micros() as u64 {
            return None;
        }
        Some(decode(self.warm_from.load(Ordering::Acquire)))
    }
}

/// A location as one ordered word, for an atomic.
fn encode(loc: RecordLoc) -> u64 {
    (u64::from(loc.segment) << 32) | u64::from(loc.offset)
}

fn decode(word: u64) -> RecordLoc {
    RecordLoc {
        segment: (word >> 32) as u32,
        offset: word as u32,
    }
}

/// The kernel's count of pages reclaimed so far, and of page cache drops:
/// the sum of `/proc/vmstat`'s `pgsteal_*` and `drop_pagecache` lines.
/// Only whether it moved matters. `None` where there is no such file.
pub fn reclaims_so_far() -> Option<u64> {
    parse_reclaims(&std::fs::read_to_string("/proc/vmstat").ok()?)
}

fn parse_reclaims(vmstat: &str) -> Option<u64> {
    let mut sum: Option<u64> = None;
    for line in vmstat.lines() {
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        if key.starts_with("pgsteal_") || key == "drop_pagecache" {
            let v: u64 = value.trim().parse().ok()?;
            sum = Some(sum.unwrap_or(0).wrapping_add(v));
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclaim_counters_sum_the_steal_lines_and_cache_drops_only() {
        let text = "nr_free_pages 100\npgsteal_kswapd 3\npgsteal_direct 4\n\
                    pgscan_file 99\ndrop_pagecache 1\nworkingset_refault_file 7\n";
        assert_eq!(parse_reclaims(text), Some(8));
        assert_eq!(parse_reclaims("nr_free_pages 100\n"), None);
        assert_eq!(parse_reclaims("pgsteal_kswapd x\n"), None);
    }

    fn at(segment: u32, offset: u32) -> RecordLoc {
        RecordLoc { segment, offset }
    }

    #[test]
    fn nothing_is_warm_before_the_first_look_and_only_what_follows_it_after() {
        let watch = CacheWatch::new();
        assert_eq!(watch.warm_from(), None);
        assert!(!watch.observe(5, || at(1, 40)), "a first look sees no move");
        assert_eq!(watch.warm_from(), Some(at(1, 40)));
        // The count did not move: what was warm stays warm.
        assert!(!watch.observe(5, || at(2, 90)));
        assert_eq!(watch.warm_from(), Some(at(1, 40)));
        // It moved: only what is written from here on is warm.
        assert!(watch.observe(6, || at(2, 90)));
        assert_eq!(watch.warm_from(), Some(at(2, 90)));
        // A look that read the count earlier and the position later never
        // takes the position back.
        assert!(watch.observe(7, || at(2, 60)));
        assert_eq!(watch.warm_from(), Some(at(2, 90)));
    }

    #[test]
    fn a_stale_look_makes_nothing_warm() {
        let watch = CacheWatch::new();
        watch.observe(1, || at(3, 7));
        let looked = watch.looked_us.load(Ordering::Acquire);
        let valid = LOOK_VALID_FOR.as_micros() as u64;
        assert_eq!(watch.warm_from_at(looked + valid), Some(at(3, 7)));
        assert_eq!(watch.warm_from_at(looked + valid + 1), None);
    }
}
