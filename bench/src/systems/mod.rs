//! The systems under test, behind one interface so every scenario drives
//! them the same way.
//!
//! A [`System`] is started (and stopped, on drop) by the harness on loopback
//! in a temporary directory. Each client thread opens its own [`Conn`], as a
//! service would hold one connection per worker. Every system acknowledges a
//! send or an ACK only once it is durable (fsynced), except the one labelled
//! `redis-everysec`, which is measured to show what weaker durability buys.

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod group;
pub mod inboxd;
pub mod limit;
#[cfg(feature = "mariadb")]
pub mod mariadb;
pub mod process;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "rocksdb")]
pub mod rocksdb;

use std::time::Duration;

use crate::procfs::Measured;
use crate::workload::{DeviceId, Outgoing, Setup, Uid};

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, Error>;

/// Where a device is in its user's event stream, as the device keeps it.
#[derive(Clone, Debug, Default)]
pub struct DeviceCursor {
    pub uid: Uid,
    pub device: DeviceId,
    /// The last event ACKed durably, in the system's own numbering.
    pub acked: u64,
    /// The last event applied: where the next page starts. Ahead of
    /// `acked` while ACKs are spaced out ([`DeviceCursor::ack_every`]).
    pub applied: u64,
    /// ACK after every this many pages and after a batch's last (0 and 1:
    /// every page).
    pub ack_every: u32,
    /// Pages applied since the last ACK.
    pub unacked_pages: u32,
    /// A system-specific position (a Redis stream id, a batch token).
    pub position: Vec<u8>,
    pub generation: Option<u64>,
    /// The first page reads the server-side cursor; later ones do not.
    pub started: bool,
    /// Ask for the events' ids only, with no summaries, where the system
    /// sends any (inboxd's `ids_only`: no summary field on the wire); the
    /// others send none anyway.
    pub ids_only: bool,
}

impl DeviceCursor {
    pub fn new(uid: Uid, device: DeviceId) -> Self {
        Self {
            uid,
            device,
            ..Self::default()
        }
    }

    /// Counts a page applied and says whether to ACK it: every
    /// `ack_every`-th page since the last ACK, and the last page.
    pub fn ack_due(&mut self, has_more: bool) -> bool {
        self.unacked_pages += 1;
        let due = !has_more || self.unacked_pages >= self.ack_every.max(1);
        if due {
            self.unacked_pages = 0;
        }
        due
    }
}

/// One page of a device's catch-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Page {
    pub events: u32,
    /// Bytes of event data returned.
    pub bytes: u64,
    pub has_more: bool,
    /// Time to read the page, before its ACK.
    pub read: std::time::Duration,
}

/// What `long-offline`'s first screen fetched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Screen {
    pub convs: u32,
    pub messages: u32,
    pub bytes: u64,
}

/// Cumulative write counters of a system (inboxd's `stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteCounters {
    pub write_batches: u64,
    pub fsyncs: u64,
    pub fsync_latency_us_sum: u64,
}

/// A replicated group's commit path, from its members' metrics
/// (`inboxd_raft_append*`, `inboxd_raft_round_commit*`): sums and counts,
/// so that a window's means are ratios of differences.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommitPath {
    /// The leader's rounds committed, and the seconds from their proposal
    /// to their commit, summed.
    pub rounds_committed: f64,
    pub round_commit_s: f64,
    /// The leader's appends of its own rounds, and the seconds until each
    /// was durable in its log, summed.
    pub leader_appends: f64,
    pub leader_append_s: f64,
    /// The followers' appends (one per append request from the leader),
    /// the entries they carried, and the seconds until each was durable.
    pub follower_appends: f64,
    pub follower_entries: f64,
    pub follower_append_s: f64,
}

impl CommitPath {
    /// The means of what happened between `before` and `self`, as the
    /// report's row for `system` at `clients`.
    pub fn window(
        &self,
        before: &CommitPath,
        system: &str,
        clients: u32,
    ) -> crate::report::CommitPathRow {
        let mean_us = |s: f64, n: f64| if n > 0.0 { s / n * 1e6 } else { 0.0 };
        let rounds = self.rounds_committed - before.rounds_committed;
        let f_appends = self.follower_appends - before.follower_appends;
        let f_entries = self.follower_entries - before.follower_entries;
        let l_appends = self.leader_appends - before.leader_appends;
        crate::report::CommitPathRow {
            system: system.to_string(),
            clients,
            rounds_committed: rounds,
            proposal_to_commit_us: mean_us(self.round_commit_s - before.round_commit_s, rounds),
            follower_appends: f_appends,
            entries_per_append: if f_appends > 0.0 {
                f_entries / f_appends
            } else {
                0.0
            },
            follower_append_to_durable_us: mean_us(
                self.follower_append_s - before.follower_append_s,
                f_appends,
            ),
            leader_append_to_durable_us: mean_us(
                self.leader_append_s - before.leader_append_s,
                l_appends,
            ),
        }
    }
}

impl crate::report::CommitPathRow {
    /// The row as one line.
    pub fn line(&self) -> String {
        format!(
            "{:.0} rounds committed, {:.0} µs from proposal to commit; followers: {:.0} appends of {:.2} entries, {:.0} µs from append to durable; the leader's own appends: {:.0} µs to durable",
            self.rounds_committed,
            self.proposal_to_commit_us,
            self.follower_appends,
            self.entries_per_append,
            self.follower_append_to_durable_us,
            self.leader_append_to_durable_us,
        )
    }
}

/// One member of a replicated system: its number in the group, whether
/// it led when asked, and its process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberPid {
    pub member: u32,
    pub leader: bool,
    pub pid: u32,
}

/// What a system says it holds (inboxd's `stats`), for the soak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holdings {
    pub messages: u64,
    pub events_live: u64,
}

/// One client connection.
pub trait Conn {
    /// One send, acknowledged once durable: the message stored once, the
    /// conversation seq allocated, one sync event per recipient.
    fn send(&mut self, send: &Outgoing<'_>) -> Result<()>;

    /// Many sends at once, to build a backlog before a measurement. May
    /// commit them together; only the result is used, not the timing.
    fn send_batch(&mut self, sends: &[Outgoing<'_>]) -> Result<()> {
        for send in sends {
            self.send(send)?;
        }
        Ok(())
    }

    /// Reads the next page of at most `limit` events after the last one
    /// the device applied, then, if [`DeviceCursor::ack_due`], ACKs it
    /// durably, moving the server's cursor.
    fn sync_page(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<Page>;

    /// The device's whole catch-up in pages of at most `limit`, ACKed as
    /// [`DeviceCursor::ack_every`] says: (events, pages, bytes of event
    /// data). By default page after page; a system whose protocol
    /// pipelines does it as its clients do.
    fn catch_up(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<(u64, u64, u64)> {
        let (mut events, mut pages, mut bytes) = (0, 0, 0);
        loop {
            let page = self.sync_page(device, limit)?;
            pages += 1;
            events += u64::from(page.events);
            bytes += page.bytes;
            if !page.has_more {
                return Ok((events, pages, bytes));
            }
        }
    }

    /// The first screen of a returning user: the conversation list and the
    /// newest `per_conv` messages of every conversation in it.
    fn first_screen(&mut self, _uid: Uid, _per_conv: u32) -> Result<Screen> {
        Err("no conversation list in this system's layout".into())
    }

    /// The other way back for a long-offline user: a fresh `device` asks
    /// for at most one event of replay, is told to reset, and installs a
    /// snapshot instead of replaying the backlog.
    fn catch_up_by_snapshot(&mut self, _uid: Uid, _device: u64) -> Result<SnapshotCatchUp> {
        Err("no snapshots in this system".into())
    }
}

/// What [`Conn::catch_up_by_snapshot`] measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct SnapshotCatchUp {
    /// From the first `SYNC` until the first snapshot page (conversation
    /// list and newest messages) is in hand.
    pub first_screen: std::time::Duration,
    /// Until every page is fetched and the install acknowledged.
    pub total: std::time::Duration,
    pub pages: u32,
    pub convs: u32,
    pub messages: u32,
    /// Bytes of conversation summaries and messages in the pages.
    pub bytes: u64,
    pub first_page_bytes: u64,
}

pub trait System: Sync {
    /// The label in the report: `inboxd`, `mariadb`, `redis`, ...
    fn name(&self) -> &str;

    /// Opens one client connection.
    fn connect(&self) -> Result<Box<dyn Conn + '_>>;

    /// Creates what a scenario needs before it starts: conversations with
    /// their members, registered devices.
    fn prepare(&self, setup: &Setup) -> Result<()>;

    /// Kills the system with SIGKILL and starts it again on the same data;
    /// returns the time from the restart until it serves a request.
    fn crash_and_restart(&mut self) -> Result<Duration> {
        Err(format!("{} has no crash-recovery driver", self.name()).into())
    }

    /// Stops the system cleanly, drops its data files from the page cache,
    /// starts it again on the same data and drops them once more after
    /// its recovery read them; returns the time from the restart until it
    /// serves a request. For the first screen after a restart with cold
    /// caches.
    fn restart_cold(&mut self) -> Result<Duration> {
        Err(format!("{} has no cold-restart driver", self.name()).into())
    }

    /// Opens `n` connections, each subscribed to push notifications for
    /// one uid from `first_uid` on, and holds them until the returned guard
    /// is dropped: the connected devices a server keeps while it works.
    /// `None` for a system without subscriptions, or when `n` is 0.
    fn hold_subscribers(&self, _n: u32, _first_uid: u64) -> Result<Option<Box<dyn std::any::Any>>> {
        Ok(None)
    }

    /// Runs one compaction pass now (for `mixed`).
    fn compact_now(&self) -> Result<()> {
        Err(format!("{} has no compaction driver", self.name()).into())
    }

    /// The system's own write counters, where it has them, to tell how
    /// many fsyncs a measured run paid.
    fn write_counters(&self) -> Option<WriteCounters> {
        None
    }

    /// A replicated system's commit path so far (see [`CommitPath`]).
    fn commit_path(&self) -> Option<CommitPath> {
        None
    }

    /// A replicated system's members, for the CPU each spends; empty for a
    /// single process.
    fn member_pids(&self) -> Vec<MemberPid> {
        Vec::new()
    }

    /// Transactions a system's clients had to try again because another
    /// got to the same keys first (etcd's lost compares), so far.
    fn conflicts(&self) -> Option<u64> {
        None
    }

    /// A replicated system's raft term now (the highest a member reports),
    /// to count the elections a phase saw.
    fn term(&self) -> Option<u64> {
        None
    }

    /// The process whose CPU time and memory are this system's: its server,
    /// or the harness itself for an embedded system.
    fn measured(&self) -> Option<Measured> {
        None
    }

    /// Messages and live sync events the system holds, where it counts them.
    fn holdings(&self) -> Option<Holdings> {
        None
    }

    /// The server's own memory breakdown by structure, where it has one,
    /// with what taking it cost: (structures, walk µs, longest lock hold
    /// µs).
    fn memory(&self) -> Option<(Vec<crate::report::StructureBytes>, u64, u64)> {
        None
    }

    /// Bytes its data directory takes on disk.
    fn data_bytes(&self) -> u64 {
        0
    }

    /// A line for the report on what this system was (version, settings).
    fn describe(&self) -> String {
        self.name().to_string()
    }
}

/// Asks the kernel to drop every file under `path` from the page cache
/// (`POSIX_FADV_DONTNEED`). Only clean pages go, so the files must have
/// been written back: a cleanly stopped server has synced them. Returns
/// the bytes of the files it was asked about.
pub fn evict_from_page_cache(path: &std::path::Path) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let mut bytes = 0;
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            bytes += evict_from_page_cache(&entry.path())?;
        } else if meta.is_file() {
            let file = std::fs::File::open(entry.path())?;
            // SAFETY: the descriptor is open for the duration of the call;
            // the advice only concerns cached pages of this file.
            let rc =
                unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            if rc != 0 {
                return Err(std::io::Error::from_raw_os_error(rc));
            }
            bytes += meta.len();
        }
    }
    Ok(bytes)
}

/// Bytes a directory tree takes, following no symlink.
pub fn dir_bytes(path: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => dir_bytes(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_acks_every_nth_page_and_the_last_page_of_a_batch() {
        let due = |every: u32, pages: &[bool]| -> Vec<bool> {
            let mut device = DeviceCursor {
                ack_every: every,
                ..DeviceCursor::default()
            };
            pages.iter().map(|&more| device.ack_due(more)).collect()
        };
        // Seven pages, the last without more.
        let batch = [true, true, true, true, true, true, false];
        assert_eq!(due(0, &batch), [true; 7], "0 is every page");
        assert_eq!(due(1, &batch), [true; 7]);
        assert_eq!(
            due(3, &batch),
            [false, false, true, false, false, true, true]
        );
        assert_eq!(
            due(8, &batch),
            [false, false, false, false, false, false, true]
        );
        // The count starts again after the last page of a batch.
        assert_eq!(
            due(2, &[true, false, true, true]),
            [false, true, false, true]
        );
    }
}
