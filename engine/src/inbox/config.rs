//! The engine's configuration and its clock.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::fanout::slot::Placement;
use crate::api::TimestampMs;
use crate::log::{IoBackend, SyncPolicy};

/// A source of wall-clock time. The sequencer stamps every command with it,
/// and the stamp is logged, so replay never reads the clock.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> TimestampMs;
}

#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> TimestampMs {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock tests move by hand.
#[derive(Debug, Default)]
pub struct ManualClock(std::sync::atomic::AtomicU64);

impl ManualClock {
    pub fn new(now_ms: TimestampMs) -> Self {
        Self(std::sync::atomic::AtomicU64::new(now_ms))
    }
    pub fn advance(&self, by: Duration) {
        let by_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.0.fetch_add(by_ms, std::sync::atomic::Ordering::SeqCst);
    }
    pub fn set(&self, now_ms: TimestampMs) {
        self.0.store(now_ms, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> TimestampMs {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The default large-group threshold; `docs/BENCHMARKS.md` ("Large
/// groups") has the measurement it comes from.
pub const LARGE_GROUP_MEMBERS_DEFAULT: u32 = 500;

/// Everything the engine can be configured with. [`InboxConfig::new`] gives
/// the defaults named in `docs/SEMANTICS.md`.
#[derive(Clone, Debug)]
pub struct InboxConfig {
    pub data_dir: PathBuf,
    pub segment_bytes: u64,
    pub sync: SyncPolicy,
    pub io: IoBackend,
    /// Server key for `batch_token` HMACs.
    pub token_key: [u8; 32],
    pub batch_token_ttl: Duration,
    pub payload_bytes_max: u32,
    pub devices_per_user_max: u32,
    pub device_ttl: Duration,
    pub recovery_lease_ttl: Duration,
    /// A gap (server ACK minus local position) up to this many events gets a
    /// recovery lease; a larger one gets `RESET_REQUIRED`.
    pub recovery_lease_events_max: u64,
    pub sync_page_default: u32,
    pub sync_page_max: u32,
    pub pull_per_conv_default: u32,
    pub pull_per_conv_max: u32,
    pub snapshot_messages_per_conv: u32,
    pub snapshot_ttl: Duration,
    /// Largest reply frame (`frame_len`) a `SNAPSHOT_PAGE` may take: pages
    /// are cut to fit it when a snapshot is built (`snapshots::paging`).
    /// The server sets it to its `reply_frame_bytes_max`.
    pub snapshot_page_bytes_max: u32,
    /// Bytes of built snapshot pages kept in memory; beyond it the least
    /// recently used snapshots are dropped from memory (their files stay,
    /// and the next page read loads them again).
    pub snapshot_cache_bytes: u64,
    pub safety_window: Duration,
    pub hard_ttl: Duration,
    /// `None` keeps messages forever (the default).
    pub history_retention: Option<Duration>,
    /// A sealed segment whose live fraction falls below this is rewritten.
    /// Dead bytes in sealed segments are then at most `1 / fraction - 1` of
    /// the live ones: 0.7 keeps space amplification under 1.5x.
    pub rewrite_live_fraction: f64,
    /// Compaction rewrite budget, bytes per second.
    pub compaction_bytes_per_s: u64,
    /// How often the background compaction pass runs; `None` runs none
    /// (then only [`Inbox::compact`] compacts).
    pub compaction_interval: Option<Duration>,
    /// Write an index checkpoint after this many log bytes (R22), or
    /// after [`InboxConfig::checkpoint_every_state_percent`] of the newest
    /// checkpoint's size if that is more.
    pub checkpoint_every_bytes: u64,
    /// A periodic checkpoint also waits for this percent of the newest
    /// checkpoint's size in log written since the last one (0: only
    /// `checkpoint_every_bytes`). Writing a checkpoint costs in
    /// proportion to the state, and so does loading it after a crash;
    /// with this, checkpoints write at most `100 / percent` bytes per byte
    /// of log, and the replay after a crash stays in proportion to the
    /// load, whatever the state's size.
    pub checkpoint_every_state_percent: u32,
    pub idempotency_ttl: Duration,
    /// Keep the message index's full pages and the idempotency table's
    /// sorted runs in a scratch file, mapped (`containers/spill.rs`), not on
    /// the heap.
    pub index_in_file: bool,
    /// A conversation with more current members than this becomes a large
    /// group (R7): no per-member events from then on. 0 never switches.
    pub large_group_members: u32,
    /// Hold the sequencer and the threads that joined the write pipeline
    /// (`crate::placement::join`) on one CPU while rounds hold about one
    /// command and the process uses little CPU (`crate::placement`).
    pub colocate_when_light: bool,
    /// Which slots this store owns and which group owns the others
    /// (`fanout::slot`). `None`, or a placement that owns every slot:
    /// the store owns every user and conversation and writes no outbox.
    pub placement: Option<Arc<Placement>>,
    pub clock: Arc<dyn Clock>,
}

impl InboxConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        const DAY: Duration = Duration::from_secs(24 * 3600);
        Self {
            data_dir: data_dir.into(),
            segment_bytes: 128 << 20,
            sync: SyncPolicy::Always,
            io: IoBackend::default(),
            token_key: [0; 32],
            batch_token_ttl: Duration::from_secs(600),
            payload_bytes_max: 64 << 10,
            devices_per_user_max: 5,
            device_ttl: 30 * DAY,
            recovery_lease_ttl: Duration::from_secs(600),
            recovery_lease_events_max: 10_000,
            sync_page_default: 100,
            sync_page_max: 500,
            pull_per_conv_default: 50,
            pull_per_conv_max: 500,
            snapshot_messages_per_conv: 20,
            snapshot_ttl: Duration::from_secs(3600),
            snapshot_page_bytes_max: 64 << 20,
            snapshot_cache_bytes: 64 << 20,
            safety_window: 7 * DAY,
            hard_ttl: 30 * DAY,
            history_retention: None,
            rewrite_live_fraction: 0.7,
            compaction_bytes_per_s: 64 << 20,
            compaction_interval: Some(Duration::from_secs(60)),
            checkpoint_every_bytes: 64 << 20,
            checkpoint_every_state_percent: 25,
            idempotency_ttl: 7 * DAY,
            index_in_file: true,
            large_group_members: LARGE_GROUP_MEMBERS_DEFAULT,
            colocate_when_light: false,
            placement: None,
            clock: Arc::new(SystemClock),
        }
    }
}

/// A configured duration in whole milliseconds, saturating: what the
/// stamped times (`TimestampMs`) are compared with.
pub(crate) fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
