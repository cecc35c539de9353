//! The inbox: a deterministic state machine over two segment logs, and the
//! embedded [`Inbox`] API.
//!
//! Mutations are commands applied by one sequencer thread in order; a reply
//! is released only once the batch holding the command is durable. Reads go
//! straight to the in-memory indexes and the segment files and never serve
//! anything above the committed high watermark.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use crate::api::*;
use crate::error::{Error, Result};
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

/// Everything the engine can be configured with. [`InboxConfig::new`] gives
/// the SPEC.md defaults.
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
    pub safety_window: Duration,
    pub hard_ttl: Duration,
    /// `None` keeps messages forever (the default).
    pub history_retention: Option<Duration>,
    /// A sealed segment whose live fraction falls below this is rewritten.
    pub rewrite_live_fraction: f64,
    /// Compaction rewrite budget, bytes per second.
    pub compaction_bytes_per_s: u64,
    /// Write an index checkpoint after this many log bytes (R22).
    pub checkpoint_every_bytes: u64,
    pub idempotency_ttl: Duration,
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
            safety_window: 7 * DAY,
            hard_ttl: 30 * DAY,
            history_retention: None,
            rewrite_live_fraction: 0.5,
            compaction_bytes_per_s: 64 << 20,
            checkpoint_every_bytes: 256 << 20,
            idempotency_ttl: 7 * DAY,
            clock: Arc::new(SystemClock),
        }
    }
}

/// A reply that is released once the command behind it is durable.
///
/// Await it from async code, or call [`Pending::wait`] from a plain thread.
pub struct Pending<T>(tokio::sync::oneshot::Receiver<Result<T>>);

impl<T> Pending<T> {
    /// A pending reply and the sender that completes it.
    pub(crate) fn channel() -> (tokio::sync::oneshot::Sender<Result<T>>, Self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (tx, Self(rx))
    }

    pub(crate) fn ready(result: Result<T>) -> Self {
        let (tx, pending) = Self::channel();
        // The receiver is alive in `pending`, so the send cannot fail.
        let _ = tx.send(result);
        pending
    }

    /// Blocks until the reply is ready. Must not be called from inside an
    /// async runtime; await the `Pending` there instead.
    pub fn wait(self) -> Result<T> {
        self.0
            .blocking_recv()
            .unwrap_or_else(|_| Err(Error::Internal("engine stopped before replying".into())))
    }
}

impl<T> Future for Pending<T> {
    type Output = Result<T>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|received| {
            received
                .unwrap_or_else(|_| Err(Error::Internal("engine stopped before replying".into())))
        })
    }
}

/// A committed-high-watermark hint for push subscribers (R16): the user's
/// events up to `committed_sync_seq` are durable and can be synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hint {
    pub uid: Uid,
    pub committed_sync_seq: SyncSeq,
}

/// The embedded inbox. Cheap to share: wrap it in an `Arc`.
pub struct Inbox {
    _config: InboxConfig,
}

fn not_built<T>() -> Result<T> {
    Err(Error::Internal("not built yet".into()))
}

impl Inbox {
    /// Opens (recovering if needed) the store in `config.data_dir`.
    pub fn open(config: InboxConfig) -> Result<Inbox> {
        Ok(Inbox { _config: config })
    }

    pub fn join(&self, _conv: ConvId, _uid: Uid) -> Pending<MembershipReply> {
        Pending::ready(not_built())
    }
    pub fn leave(&self, _conv: ConvId, _uid: Uid) -> Pending<MembershipReply> {
        Pending::ready(not_built())
    }
    pub fn send(&self, _req: SendRequest) -> Pending<SendReply> {
        Pending::ready(not_built())
    }
    pub fn recall(&self, _req: RecallRequest) -> Pending<SendReply> {
        Pending::ready(not_built())
    }
    pub fn edit(&self, _req: EditRequest) -> Pending<SendReply> {
        Pending::ready(not_built())
    }
    pub fn register_device(&self, _uid: Uid, _device: DeviceId) -> Pending<RegisterReply> {
        Pending::ready(not_built())
    }
    pub fn revoke_device(&self, _uid: Uid, _device: DeviceId) -> Pending<DeviceInfo> {
        Pending::ready(not_built())
    }
    pub fn devices(&self, _uid: Uid) -> Result<Vec<DeviceInfo>> {
        not_built()
    }
    /// R9/R10. May bump the device's generation (recovery lease or
    /// `RESET_REQUIRED`), so it goes through the sequencer.
    pub fn sync(&self, _req: SyncRequest) -> Pending<SyncPage> {
        Pending::ready(not_built())
    }
    pub fn ack(&self, _req: AckRequest) -> Pending<AckReply> {
        Pending::ready(not_built())
    }
    pub fn finish_lease(
        &self,
        _uid: Uid,
        _device: DeviceId,
        _lease_id: u64,
        _generation: Generation,
    ) -> Pending<DeviceInfo> {
        Pending::ready(not_built())
    }
    pub fn pull(
        &self,
        _uid: Uid,
        _cursors: &[(ConvId, MsgSeq)],
        _per_conv_limit: u32,
    ) -> Result<Vec<ConvPull>> {
        not_built()
    }
    /// Pages backwards from `before_seq` (exclusive; `None` = from the head).
    pub fn history(
        &self,
        _uid: Uid,
        _conv: ConvId,
        _before_seq: Option<MsgSeq>,
        _limit: u32,
    ) -> Result<HistoryPage> {
        not_built()
    }
    pub fn mark_read(&self, _uid: Uid, _conv: ConvId, _read_to_seq: MsgSeq) -> Pending<ReadReply> {
        Pending::ready(not_built())
    }
    pub fn set_conv_flags(&self, _uid: Uid, _conv: ConvId, _flags: ConvFlags) -> Pending<()> {
        Pending::ready(not_built())
    }
    pub fn conv_list(
        &self,
        _uid: Uid,
        _limit: u32,
        _cursor: Option<Bytes>,
    ) -> Result<ConvListPage> {
        not_built()
    }
    pub fn begin_snapshot(&self, _uid: Uid, _device: DeviceId) -> Pending<SnapshotInfo> {
        Pending::ready(not_built())
    }
    pub fn snapshot_info(&self, _uid: Uid, _snapshot_id: u64) -> Result<SnapshotInfo> {
        not_built()
    }
    pub fn snapshot_page(&self, _uid: Uid, _snapshot_id: u64, _page: u32) -> Result<SnapshotPage> {
        not_built()
    }
    pub fn ack_snapshot(
        &self,
        _uid: Uid,
        _device: DeviceId,
        _snapshot_id: u64,
        _generation: Generation,
    ) -> Pending<DeviceInfo> {
        Pending::ready(not_built())
    }
    /// Runs one compaction pass now (the background task calls the same).
    pub fn compact(&self) -> Result<CompactionReport> {
        not_built()
    }
    pub fn explain(&self, _uid: Uid) -> Result<UserExplain> {
        not_built()
    }
    pub fn explain_segment(&self, _stream: &str, _segment: u32) -> Result<SegmentExplain> {
        not_built()
    }
    /// Writes an index checkpoint now (R22).
    pub fn checkpoint(&self) -> Result<()> {
        not_built()
    }
    pub fn stats(&self) -> Stats {
        Stats::default()
    }
    /// Hints are coalesced per commit round and may be dropped by a slow
    /// receiver; correctness never depends on them (R16).
    pub fn subscribe_hints(&self) -> tokio::sync::broadcast::Receiver<Vec<Hint>> {
        tokio::sync::broadcast::channel(1).1
    }
    /// Stops taking commands, finishes the ones in flight, syncs, and
    /// writes a checkpoint.
    pub fn shutdown(&self) -> Result<()> {
        Ok(())
    }
}
