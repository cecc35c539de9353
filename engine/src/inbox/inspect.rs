//! What the [`Inbox`] tells about itself: counters and gauges, the
//! recovery report, and the digest and invariant checks tests use. Only
//! reads; nothing here goes through the sequencer.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::handle::Inbox;
use super::recover::RecoveryReport;
use super::state::memory::Tally;
use super::{checkpoint, state};
use crate::api::{ConvId, MemoryReport, MemoryUse, Stats, Uid};
use crate::log::SyncPolicy;

/// Users or conversations walked per hold of the state lock.
const MEMORY_CHUNK: usize = 1024;

impl Inbox {
    /// The engine's memory by structure (`inboxctl stats --memory`,
    /// `inboxd_memory_bytes`): the state's tables (`state::memory`), the
    /// snapshot cache and the mapped log segments. O(state), but a chunk
    /// of users or conversations per hold of the state lock, so the
    /// sequencer waits at most one chunk; the report says how long the
    /// longest hold was.
    pub fn memory(&self) -> MemoryReport {
        let started = Instant::now();
        let mut longest = Duration::ZERO;
        let mut tally = Tally::default();
        let mut hold = |f: &mut dyn FnMut(&state::State)| {
            let st = self.shared.state.read();
            let t = Instant::now();
            f(&st);
            longest = longest.max(t.elapsed());
        };
        let (mut uids, mut convs): (Vec<Uid>, Vec<ConvId>) = (Vec::new(), Vec::new());
        hold(&mut |st| {
            tally.tables(st);
            uids = st.users.keys().copied().collect();
            convs = st.convs.keys().copied().collect();
        });
        for chunk in uids.chunks(MEMORY_CHUNK) {
            hold(&mut |st| tally.users(st, chunk));
        }
        for chunk in convs.chunks(MEMORY_CHUNK) {
            hold(&mut |st| tally.convs(st, chunk));
        }
        let mut structures: Vec<MemoryUse> = tally
            .named()
            .map(|(name, live, allocated)| MemoryUse {
                structure: name.to_string(),
                live,
                allocated,
            })
            .collect();
        let (cached, _) = self.shared.snapshots.cache.lock().usage();
        structures.push(MemoryUse {
            structure: "snapshot_cache".to_string(),
            live: cached,
            allocated: cached,
        });
        // Sealed segments are mapped whole: address space backed by the
        // files, resident only as far as the page cache holds them.
        let mapped: u64 = self
            .shared
            .msg_log
            .segments()
            .into_iter()
            .chain(self.shared.evt_log.segments())
            .filter(|s| s.sealed)
            .map(|s| s.bytes)
            .sum();
        structures.push(MemoryUse {
            structure: "log_mmaps".to_string(),
            live: mapped,
            allocated: mapped,
        });
        MemoryReport {
            structures,
            walk_us: micros(started.elapsed()),
            longest_hold_us: micros(longest),
        }
    }

    /// O(segments): the entry counts are kept on apply, and the index
    /// sizes are estimated from them, so no user or conversation is
    /// walked under the state lock.
    pub fn stats(&self) -> Stats {
        let (users, conversations, totals) = {
            let st = self.shared.state.read();
            (st.users.len() as u64, st.convs.len() as u64, st.totals)
        };
        let (event_index, msg_index) = state::index_bytes_estimate(&totals);
        let segs = self
            .shared
            .msg_log
            .segments()
            .into_iter()
            .chain(self.shared.evt_log.segments());
        let msg_log = self.shared.msg_log.stats();
        let evt_log = self.shared.evt_log.stats();
        // Each group commit is one write and, unless the sync policy is
        // `None`, one fdatasync; its time covers both.
        let fsyncs = if self.shared.config.sync == SyncPolicy::None {
            0
        } else {
            msg_log.commits + evt_log.commits
        };
        let commit_us = msg_log.commit_time + evt_log.commit_time;
        Stats {
            fsyncs,
            fsync_latency_us_sum: u64::try_from(commit_us.as_micros()).unwrap_or(u64::MAX),
            users,
            conversations,
            devices: totals.devices,
            messages: totals.messages,
            events_live: totals.events,
            write_batches: self.shared.rounds_written.load(Ordering::Relaxed),
            bytes_on_disk: segs.map(|s| s.bytes).sum(),
            index_bytes: event_index + msg_index,
            compaction: self.shared.compaction.report(),
            rounds_refused_for_space: self.shared.rounds_refused_for_space.load(Ordering::Relaxed),
            state_reloads_for_space: self.shared.state_reloads_for_space.load(Ordering::Relaxed),
            pipeline_on_one_cpu: self.shared.pipeline_on_one_cpu.load(Ordering::Relaxed),
        }
    }

    /// SHA-256 of the canonical encoding of the whole state (the checkpoint
    /// body). Two engines that answer everything alike have equal digests;
    /// tests use it to prove a restart rebuilds exactly the same state.
    #[doc(hidden)]
    pub fn state_digest(&self) -> [u8; 32] {
        use sha2::Digest;
        let body = checkpoint::encode_state(&self.shared.state.read());
        sha2::Sha256::digest(&body).into()
    }

    /// What the last open recovered from (R22).
    pub fn recovery_report(&self) -> RecoveryReport {
        self.shared.recovery
    }

    /// Checks the per-segment reference counts compaction relies on
    /// against a recount of the whole index; says what differs.
    #[doc(hidden)]
    pub fn check_segment_refs(&self) -> std::result::Result<(), String> {
        self.shared.state.read().check_seg_refs()
    }

    /// Checks every invariant of the state machine (watermark order,
    /// cursors, membership periods, unread recounts, segment reference
    /// counts); says which one is broken. O(state): for tests.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.shared.state.read().check_invariants()
    }
    /// Bytes of the event index (packed locations) and of the message
    /// index (per-message metadata), for BENCHMARKS.md.
    #[doc(hidden)]
    pub fn index_bytes(&self) -> (u64, u64) {
        self.shared.state.read().index_bytes()
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
