//! The inbox: a deterministic state machine over two segment logs, and the
//! embedded [`Inbox`] API.
//!
//! Mutations are commands applied by one sequencer thread in order; a reply
//! is released only once the batch holding the command is durable. Reads go
//! straight to the in-memory indexes and the segment files and never serve
//! anything above the committed high watermark.
//!
//! Threads besides the logs' writers: the sequencer, the completion stage,
//! the checkpoint writer (files are written off the sequencer, in LSN
//! order), the snapshot builder (content is built whether or not the caller
//! still waits) and, if configured, the compaction pass. [`Inbox::shutdown`]
//! stops taking commands, lets the sequencer hand off the final checkpoint
//! and joins them all once it is durable.
//!
//! Submodules:
//! - [`command`]: the records written to the `msg` and `evt` logs;
//! - [`state`]: the tables and the one deterministic `apply`;
//! - [`sequencer`]: rounds, group commit across both logs, completion;
//! - [`sync`]: devices, sync batches, ACKs, recovery leases;
//! - [`token`]: HMAC batch tokens;
//! - [`read`]: sync pages, pull, history, conversation list;
//! - [`checkpoint`], [`recover`]: R22;
//! - [`fence`], [`snapshot`], [`compaction`]: fences and the reclaim
//!   floor, snapshots for reset devices, compaction (R18, R19).

mod checkpoint;
mod codec;
mod command;
mod compaction;
mod fence;
mod read;
mod recover;
pub use recover::RecoveryReport;
mod seg_refs;
mod sequencer;
mod snapshot;
mod state;
mod sync;
mod token;

pub use compaction::{CompactionStep, SpaceUsage};

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, RwLock};

use crate::api::*;
use crate::error::{Error, Result};
use crate::log::{IoBackend, Log, LogError, LogOptions, SyncPolicy};
use command::{summary_for, StoredPayload};
use sequencer::Command;
use state::State;

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
    /// Dead bytes in sealed segments are then at most `1 / fraction - 1` of
    /// the live ones: 0.7 keeps space amplification under 1.5x.
    pub rewrite_live_fraction: f64,
    /// Compaction rewrite budget, bytes per second.
    pub compaction_bytes_per_s: u64,
    /// How often the background compaction pass runs; `None` runs none
    /// (then only [`Inbox::compact`] compacts).
    pub compaction_interval: Option<Duration>,
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
            rewrite_live_fraction: 0.7,
            compaction_bytes_per_s: 64 << 20,
            compaction_interval: Some(Duration::from_secs(60)),
            checkpoint_every_bytes: 256 << 20,
            idempotency_ttl: 7 * DAY,
            clock: Arc::new(SystemClock),
        }
    }
}

/// How a reply is delivered: a finished result, or a closure that builds
/// it on the caller's thread (sync pages read their events there, so the
/// sequencer never reads the log).
pub(crate) enum Reply<T> {
    Done(Result<T>),
    Later(Box<dyn FnOnce() -> Result<T> + Send>),
}

impl<T> Reply<T> {
    fn finish(self) -> Result<T> {
        match self {
            Reply::Done(r) => r,
            Reply::Later(f) => f(),
        }
    }
}

/// A reply that is released once the command behind it is durable.
///
/// Await it from async code, or call [`Pending::wait`] from a plain thread.
pub struct Pending<T>(tokio::sync::oneshot::Receiver<Reply<T>>);

impl<T> Pending<T> {
    /// A pending reply and the sender that completes it.
    pub(crate) fn channel() -> (tokio::sync::oneshot::Sender<Reply<T>>, Self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (tx, Self(rx))
    }

    pub(crate) fn ready(result: Result<T>) -> Self {
        let (tx, pending) = Self::channel();
        // The receiver is alive in `pending`, so the send cannot fail.
        let _ = tx.send(Reply::Done(result));
        pending
    }

    /// Blocks until the reply is ready. Must not be called from inside an
    /// async runtime; await the `Pending` there instead.
    pub fn wait(self) -> Result<T> {
        match self.0.blocking_recv() {
            Ok(reply) => reply.finish(),
            Err(_) => Err(stopped()),
        }
    }
}

fn stopped() -> Error {
    Error::Internal("engine stopped before replying".into())
}

impl<T> Future for Pending<T> {
    type Output = Result<T>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|received| match received {
                Ok(reply) => reply.finish(),
                Err(_) => Err(stopped()),
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

#[derive(Default)]
struct Progress {
    /// Every round up to this one is finished (durable or failed).
    settled: u64,
    /// Set on the first write/fsync failure: the first round that may not
    /// be durable, and why.
    poisoned: Option<(u64, String)>,
}

/// What the sequencer, the completion stage and readers share.
pub(crate) struct Shared {
    config: InboxConfig,
    state: RwLock<State>,
    msg_log: Log,
    evt_log: Log,
    progress: Mutex<Progress>,
    progress_cv: Condvar,
    hints: tokio::sync::broadcast::Sender<Vec<Hint>>,
    rounds_written: AtomicU64,
    recovery: RecoveryReport,
    snapshots: snapshot::Store,
    compaction: compaction::Runtime,
    checkpoint_hook: Mutex<Option<checkpoint::Hook>>,
    /// LSNs of the retained checkpoints known to be durable (renamed and
    /// the directory fsynced), newest first: compaction counts coverage by
    /// these, never by a file that a crash could still take back.
    checkpoints: Mutex<Vec<u64>>,
}

impl Shared {
    fn settle(&self, round: u64) {
        let mut p = self.progress.lock();
        p.settled = p.settled.max(round);
        self.progress_cv.notify_all();
    }

    fn wait_settled(&self, round: u64) {
        let mut p = self.progress.lock();
        while p.settled < round {
            self.progress_cv.wait(&mut p);
        }
    }

    /// Whether a change made in `round` may be revealed; an error if it
    /// never will be because the engine is poisoned.
    fn is_settled(&self, round: u64) -> Result<bool> {
        let p = self.progress.lock();
        if let Some((first_bad, why)) = &p.poisoned {
            if round >= *first_bad {
                return Err(Error::Log(LogError::Poisoned(why.clone())));
            }
        }
        Ok(p.settled >= round)
    }

    fn poison(&self, why: String) {
        let mut p = self.progress.lock();
        if p.poisoned.is_none() {
            tracing::error!(reason = %why, "inbox engine poisoned: refusing every mutation until restart");
            let first_bad = p.settled + 1;
            p.poisoned = Some((first_bad, why));
        }
        self.progress_cv.notify_all();
    }

    fn poisoned(&self) -> Option<String> {
        self.progress
            .lock()
            .poisoned
            .as_ref()
            .map(|(_, why)| why.clone())
    }
}

/// The embedded inbox. Cheap to share: wrap it in an `Arc`.
pub struct Inbox {
    shared: Arc<Shared>,
    tx: Mutex<Option<mpsc::Sender<Command>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Inbox {
    /// Opens (recovering if needed) the store in `config.data_dir`.
    pub fn open(config: InboxConfig) -> Result<Inbox> {
        #[cfg(feature = "failpoints")]
        if let Some(io) = crate::failpoints::io_from_env(&config.data_dir, config.io)? {
            return Self::open_inner(config, Some(io));
        }
        Self::open_inner(config, None)
    }

    /// Opens with both logs' IO going through `io`: fault injection
    /// (`crate::log::FaultyIo`) in tests.
    #[doc(hidden)]
    pub fn open_with_io(config: InboxConfig, io: Arc<dyn crate::log::LogIo>) -> Result<Inbox> {
        Self::open_inner(config, Some(io))
    }

    fn open_inner(config: InboxConfig, io: Option<Arc<dyn crate::log::LogIo>>) -> Result<Inbox> {
        let data = &config.data_dir;
        std::fs::create_dir_all(data).map_err(LogError::Io)?;
        let log_opts = |name: &str| LogOptions {
            segment_bytes: config.segment_bytes,
            sync: config.sync,
            io: config.io,
            ..LogOptions::new(data.join(name))
        };
        let open_log = |name: &str| match &io {
            Some(io) => Log::open_with_io(log_opts(name), Arc::clone(io)),
            None => Log::open(log_opts(name)),
        };
        let msg_log = open_log("msg")?;
        let evt_log = open_log("evt")?;
        let (state, recovery) = recover::load_state_reporting(&config, &evt_log)?;
        let checkpoints = checkpoint::durable_lsns(data)?;
        let (hints, _) = tokio::sync::broadcast::channel(1024);
        let shared = Arc::new(Shared {
            config,
            state: RwLock::new(state),
            msg_log,
            evt_log,
            progress: Mutex::new(Progress::default()),
            progress_cv: Condvar::new(),
            hints,
            rounds_written: AtomicU64::new(0),
            recovery,
            snapshots: snapshot::Store::default(),
            compaction: compaction::Runtime::default(),
            checkpoint_hook: Mutex::new(None),
            checkpoints: Mutex::new(checkpoints),
        });
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let (ckpt_tx, ckpt_rx) = mpsc::channel();
        let (snap_tx, snap_rx) = mpsc::channel();
        let seq = sequencer::Sequencer::new(Arc::clone(&shared), rx, done_tx, ckpt_tx, snap_tx);
        let completion_shared = Arc::clone(&shared);
        let writer_shared = Arc::clone(&shared);
        let builder_shared = Arc::clone(&shared);
        let compaction = shared
            .config
            .compaction_interval
            .map(|every| (Arc::clone(&shared), tx.clone(), every));
        let mut threads = vec![
            // Exits once the sequencer (its only sender) has stopped and
            // the final checkpoint is written.
            std::thread::Builder::new()
                .name("inbox-checkpoint".into())
                .spawn(move || checkpoint::run_writer(writer_shared, ckpt_rx))
                .map_err(LogError::Io)?,
            // Exits once the sequencer and the completion stage (whose
            // begin-snapshot replies hold its queue) have stopped.
            std::thread::Builder::new()
                .name("inbox-snapshot".into())
                .spawn(move || snapshot::run_builder(builder_shared, snap_rx))
                .map_err(LogError::Io)?,
            std::thread::Builder::new()
                .name("inbox-sequencer".into())
                .spawn(move || seq.run())
                .map_err(LogError::Io)?,
            std::thread::Builder::new()
                .name("inbox-completion".into())
                .spawn(move || sequencer::run_completion(completion_shared, done_rx))
                .map_err(LogError::Io)?,
        ];
        if let Some((shared, tx, every)) = compaction {
            threads.push(
                std::thread::Builder::new()
                    .name("inbox-compaction".into())
                    .spawn(move || compaction::run_background(shared, tx, every))
                    .map_err(LogError::Io)?,
            );
        }
        Ok(Inbox {
            shared,
            tx: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
        })
    }

    fn submit<T>(&self, make: impl FnOnce(sequencer::Tx<T>) -> Command) -> Pending<T> {
        let (tx, pending) = Pending::channel();
        let sent = match &*self.tx.lock() {
            Some(s) => s.send(make(tx)).is_ok(),
            None => false,
        };
        if sent {
            pending
        } else {
            Pending::ready(Err(Error::Internal("engine is shut down".into())))
        }
    }

    fn now_ms(&self) -> TimestampMs {
        self.shared.config.clock.now_ms()
    }

    /// The configuration this store was opened with (the daemon announces
    /// its limits to clients).
    pub fn config(&self) -> &InboxConfig {
        &self.shared.config
    }

    /// The largest payload a send may carry: `payload_bytes_max`, or less
    /// when segments are so small that one message's records (its `msg`
    /// record and its `evt` record, at most [`MESSAGE_OVERHEAD_MAX`] besides
    /// the payload) would not fit the bytes one round may gather.
    pub fn payload_limit(&self) -> u64 {
        let round = sequencer::round_bytes_max(self.shared.config.segment_bytes);
        u64::from(self.shared.config.payload_bytes_max)
            .min(round.saturating_sub(command::MESSAGE_OVERHEAD_MAX))
    }

    /// Joins `uid` to `conv` (creating the conversation on its first
    /// join). Joining while already a member returns the open period.
    pub fn join(&self, conv: ConvId, uid: Uid) -> Pending<MembershipReply> {
        self.submit(|tx| Command::Join { conv, uid, tx })
    }
    pub fn leave(&self, conv: ConvId, uid: Uid) -> Pending<MembershipReply> {
        self.submit(|tx| Command::Leave { conv, uid, tx })
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the three send flavours share one path"
    )]
    fn send_kind(
        &self,
        kind: MessageKind,
        conv: ConvId,
        sender: Uid,
        client_msg_id: ClientMsgId,
        msg_type: MsgType,
        target: MsgId,
        payload: &Bytes,
    ) -> Pending<SendReply> {
        let limit = self.payload_limit();
        if payload.len() as u64 > limit {
            return Pending::ready(Err(Error::TooLarge {
                size: payload.len() as u64,
                limit,
            }));
        }
        // Compression and the summary are built here, on the caller's
        // thread, so the sequencer only copies bytes.
        let stored = StoredPayload::new(payload);
        let summary = summary_for(kind, payload, target, sender);
        self.submit(|tx| Command::Send {
            kind,
            conv,
            sender,
            client_msg_id,
            msg_type,
            target,
            payload: stored,
            summary,
            tx,
        })
    }

    pub fn send(&self, req: SendRequest) -> Pending<SendReply> {
        self.send_kind(
            MessageKind::Normal,
            req.conv,
            req.sender,
            req.client_msg_id,
            req.msg_type,
            0,
            &req.payload,
        )
    }
    pub fn recall(&self, req: RecallRequest) -> Pending<SendReply> {
        self.send_kind(
            MessageKind::Recall,
            req.conv,
            req.sender,
            req.client_msg_id,
            0,
            req.target,
            &Bytes::new(),
        )
    }
    pub fn edit(&self, req: EditRequest) -> Pending<SendReply> {
        self.send_kind(
            MessageKind::Edit,
            req.conv,
            req.sender,
            req.client_msg_id,
            0,
            req.target,
            &req.payload,
        )
    }
    pub fn register_device(&self, uid: Uid, device: DeviceId) -> Pending<RegisterReply> {
        self.submit(|tx| Command::Register { uid, device, tx })
    }
    pub fn revoke_device(&self, uid: Uid, device: DeviceId) -> Pending<DeviceInfo> {
        self.submit(|tx| Command::Revoke { uid, device, tx })
    }
    /// Every registered device of `uid`, revoked ones included.
    pub fn devices(&self, uid: Uid) -> Result<Vec<DeviceInfo>> {
        read::devices(&self.shared, uid)
    }
    /// R9/R10. A `limit` of 0 means the default page size.
    ///
    /// A sync that may bump the device's generation (recovery lease or
    /// `RESET_REQUIRED`) or refresh its `last_seen` goes through the
    /// sequencer; one that changes nothing is answered from durable state
    /// on the caller's thread, without waiting for any round's fsync.
    pub fn sync(&self, req: SyncRequest) -> Pending<SyncPage> {
        let now = self.now_ms();
        let claims = match &req.batch_token {
            None => None,
            Some(t) => match token::verify(&self.shared.config.token_key, t, now) {
                Ok(c) => Some(c),
                Err(e) => return Pending::ready(Err(e)),
            },
        };
        // After shutdown every sync gets the sequencer's "shut down" answer.
        if self.tx.lock().is_some() {
            match read::sync_unchanged(&self.shared, now, &req, claims.as_ref()) {
                Some(Err(e)) => return Pending::ready(Err(e)),
                Some(Ok(plan)) => {
                    let (tx, pending) = Pending::channel();
                    let shared = Arc::clone(&self.shared);
                    // The receiver is alive in `pending`, so this cannot fail.
                    let _ = tx.send(Reply::Later(Box::new(move || {
                        read::sync_page(&shared, &plan)
                    })));
                    return pending;
                }
                None => {}
            }
        }
        self.submit(|tx| Command::Sync { req, claims, tx })
    }
    pub fn ack(&self, req: AckRequest) -> Pending<AckReply> {
        let claims = match token::verify(
            &self.shared.config.token_key,
            &req.batch_token,
            self.now_ms(),
        ) {
            Ok(c) => c,
            Err(e) => return Pending::ready(Err(e)),
        };
        self.submit(|tx| Command::Ack { req, claims, tx })
    }
    pub fn finish_lease(
        &self,
        uid: Uid,
        device: DeviceId,
        lease_id: u64,
        generation: Generation,
    ) -> Pending<DeviceInfo> {
        self.submit(|tx| Command::FinishLease {
            uid,
            device,
            lease_id,
            generation,
            tx,
        })
    }
    /// R12. A `per_conv_limit` of 0 means the default (50).
    pub fn pull(
        &self,
        uid: Uid,
        cursors: &[(ConvId, MsgSeq)],
        per_conv_limit: u32,
    ) -> Result<Vec<ConvPull>> {
        read::pull(&self.shared, uid, cursors, per_conv_limit)
    }
    /// Pages backwards from `before_seq` (exclusive; `None` = from the head).
    pub fn history(
        &self,
        uid: Uid,
        conv: ConvId,
        before_seq: Option<MsgSeq>,
        limit: u32,
    ) -> Result<HistoryPage> {
        read::history(&self.shared, uid, conv, before_seq, limit)
    }
    pub fn mark_read(&self, uid: Uid, conv: ConvId, read_to_seq: MsgSeq) -> Pending<ReadReply> {
        self.submit(|tx| Command::MarkRead {
            uid,
            conv,
            read_to_seq,
            tx,
        })
    }
    pub fn set_conv_flags(&self, uid: Uid, conv: ConvId, flags: ConvFlags) -> Pending<()> {
        self.submit(|tx| Command::Flags {
            uid,
            conv,
            flags,
            tx,
        })
    }
    pub fn conv_list(&self, uid: Uid, limit: u32, cursor: Option<Bytes>) -> Result<ConvListPage> {
        read::conv_list(&self.shared, uid, limit, cursor)
    }
    /// R18: in one step, bumps the device's generation, sets it RESETTING
    /// and freezes `base_sync_seq` at the user's sync head; the reply comes
    /// once the snapshot is built and READY. The build runs on the
    /// snapshot-builder thread: dropping the `Pending` does not stop it.
    pub fn begin_snapshot(&self, uid: Uid, device: DeviceId) -> Pending<SnapshotInfo> {
        self.submit(|tx| Command::BeginSnapshot { uid, device, tx })
    }
    pub fn snapshot_info(&self, uid: Uid, snapshot_id: u64) -> Result<SnapshotInfo> {
        snapshot::info_of(&self.shared, uid, snapshot_id)
    }
    /// One page of a READY snapshot; pages never change, so an interrupted
    /// install fetches the same bytes again.
    pub fn snapshot_page(&self, uid: Uid, snapshot_id: u64, page: u32) -> Result<SnapshotPage> {
        snapshot::page_of(&self.shared, uid, snapshot_id, page)
    }
    /// Finishes an install: the device becomes ACTIVE at `acked = S`, only
    /// if it is still RESETTING in the snapshot's generation.
    pub fn ack_snapshot(
        &self,
        uid: Uid,
        device: DeviceId,
        snapshot_id: u64,
        generation: Generation,
    ) -> Pending<DeviceInfo> {
        self.submit(|tx| Command::AckSnapshot {
            uid,
            device,
            snapshot_id,
            generation,
            tx,
        })
    }
    /// Runs one compaction pass now (the background task calls the same).
    /// Blocks; call it from a plain thread, not from inside an async
    /// runtime.
    pub fn compact(&self) -> Result<CompactionReport> {
        let submit = |c: Command| match &*self.tx.lock() {
            Some(s) => s.send(c).is_ok(),
            None => false,
        };
        compaction::pass(&self.shared, &submit)
    }
    /// What holds `uid`'s events back from compaction (R19).
    pub fn explain(&self, uid: Uid) -> Result<UserExplain> {
        compaction::explain(&self.shared, uid)
    }
    /// What holds a segment (`"evt"` or `"msg"`) back from being dropped.
    pub fn explain_segment(&self, stream: &str, segment: u32) -> Result<SegmentExplain> {
        compaction::explain_segment(&self.shared, stream, segment)
    }
    /// Bytes on disk and bytes still needed per stream.
    #[doc(hidden)]
    pub fn space_usage(&self) -> Result<SpaceUsage> {
        compaction::space_usage(&self.shared)
    }
    /// Calls `hook` between the steps of every compaction pass (crash
    /// tests take an image of the data directory there).
    #[doc(hidden)]
    pub fn set_compaction_hook(&self, hook: Option<Arc<dyn Fn(CompactionStep) + Send + Sync>>) {
        self.shared.compaction.set_hook(hook);
    }
    /// Calls `hook` with the LSN of every checkpoint on the writer thread,
    /// just before its file is written (tests hold the writer there).
    #[doc(hidden)]
    pub fn set_checkpoint_hook(&self, hook: Option<Arc<dyn Fn(u64) + Send + Sync>>) {
        *self.shared.checkpoint_hook.lock() = hook;
    }
    /// Writes an index checkpoint now (R22); returns once its file is
    /// durable. The sequencer only drains and copies the state; the copy is
    /// encoded and written by the checkpoint-writer thread while commands
    /// go on.
    pub fn checkpoint(&self) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        let sent = match &*self.tx.lock() {
            Some(s) => s.send(Command::Checkpoint { tx }).is_ok(),
            None => false,
        };
        if !sent {
            return Err(Error::Internal("engine is shut down".into()));
        }
        rx.recv().unwrap_or_else(|_| Err(stopped()))
    }
    pub fn stats(&self) -> Stats {
        let st = self.shared.state.read();
        let (event_index, msg_index) = st.index_bytes();
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
            users: st.users.len() as u64,
            conversations: st.convs.len() as u64,
            devices: st.users.values().map(|u| u.devices.len() as u64).sum(),
            messages: st.convs.values().map(|c| c.msgs.len() as u64).sum(),
            events_live: st.users.values().map(|u| u.events.len() as u64).sum(),
            write_batches: self.shared.rounds_written.load(Ordering::Relaxed),
            bytes_on_disk: segs.map(|s| s.bytes).sum(),
            index_bytes: event_index + msg_index,
            compaction: self.shared.compaction.report(),
        }
    }
    /// Hints are coalesced per commit round and may be dropped by a slow
    /// receiver; correctness never depends on them (R16).
    pub fn subscribe_hints(&self) -> tokio::sync::broadcast::Receiver<Vec<Hint>> {
        self.shared.hints.subscribe()
    }
    /// Stops taking commands, finishes the ones in flight, syncs, and
    /// writes a checkpoint.
    pub fn shutdown(&self) -> Result<()> {
        self.shared.compaction.stop();
        self.shared.snapshots.stop_builder();
        let Some(sender) = self.tx.lock().take() else {
            return Ok(());
        };
        let (tx, rx) = mpsc::channel();
        let result = if sender.send(Command::Shutdown { tx }).is_ok() {
            rx.recv().unwrap_or_else(|_| Err(stopped()))
        } else {
            Err(stopped())
        };
        drop(sender);
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        result
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
    /// Bytes of the event index (packed locations) and of the message
    /// index (per-message metadata), for BENCHMARKS.md.
    #[doc(hidden)]
    pub fn index_bytes(&self) -> (u64, u64) {
        self.shared.state.read().index_bytes()
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "inbox shutdown on drop failed");
        }
    }
}
