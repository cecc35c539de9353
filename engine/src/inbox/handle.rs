//! The engine's handle: the [`Inbox`] struct, what opening a store
//! builds (the shared parts, the sequencer and the threads around it),
//! how a call hands its command to the sequencer, and how the engine
//! stops; and [`verify_data_dir`], what opening would conclude, read-only.
//!
//! The API's methods are `impl Inbox` blocks above this file: the
//! commands and reads in `mod.rs` and `read_api.rs`, the counters in
//! `inspect.rs`, replication in `replica/` and the salvaged copy in
//! `salvage/`. They reach the engine through the fields and the submit
//! functions here, so this file sits below all of them and uses none.

use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc};

use parking_lot::{Condvar, Mutex, RwLock};

use super::command::{self, Command};
use super::config::InboxConfig;
use super::pending::Pending;
use super::recover::{self, RecoveryReport};
use super::round::Tx;
use super::shared::{Progress, Shared};
use super::{checkpoint, compaction, devices, sequencer, snapshots};
use crate::api::*;
use crate::error::{Error, Result};
use crate::log::{Log, LogError, LogOptions};

/// The embedded inbox. Cheap to share: wrap it in an `Arc`.
pub struct Inbox {
    pub(super) shared: Arc<Shared>,
    pub(super) tx: Mutex<Option<sequencer::Queue<Command>>>,
    /// The sequencer, for a send run on its caller's thread
    /// ([`Inbox::send_here`]).
    pub(super) core: Arc<sequencer::Core<Command>>,
    threads: Mutex<Vec<crate::threads::Handle>>,
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
        let started = std::time::Instant::now();
        // The verdict first, from reads alone: a refusal changes nothing.
        let verdict = recover::decide(&config, true)?;
        let logs_opened = started.elapsed();
        let io = match io {
            Some(io) => io,
            None => crate::log::default_io(config.io)?,
        };
        let open_log = |name: &str, plan| Log::open_planned(log_opts(name), Arc::clone(&io), plan);
        let msg_log = open_log("msg", verdict.msg)?;
        let evt_log = open_log("evt", verdict.evt)?;
        let (mut state, recovery) = (verdict.state, verdict.report);
        // After the cut, before anything is served.
        recover::commit_reservation(&evt_log, &mut state, verdict.reservation)?;
        let state_loaded = started.elapsed();
        tracing::info!(
            logs_ms = logs_opened.as_millis() as u64,
            state_ms = (state_loaded - logs_opened).as_millis() as u64,
            checks_ms = (started.elapsed() - state_loaded).as_millis() as u64,
            "inbox store opened"
        );
        let checkpoints = checkpoint::durable_list(data)?;
        let (hints, _) = tokio::sync::broadcast::channel(1024);
        let (large_group_hints, _) = tokio::sync::broadcast::channel(1024);
        let snapshots = snapshots::store::Store::new(config.snapshot_cache_bytes);
        let shared = Arc::new(Shared {
            config,
            state: RwLock::new(state),
            msg_log,
            evt_log,
            progress: Mutex::new(Progress::default()),
            completions: Default::default(),
            progress_cv: Condvar::new(),
            settled_watch: tokio::sync::watch::Sender::new((0, false)),
            hints,
            large_group_hints,
            rounds_written: AtomicU64::new(0),
            pipeline_on_one_cpu: std::sync::atomic::AtomicBool::new(false),
            rounds_refused_for_space: AtomicU64::new(0),
            state_reloads_for_space: AtomicU64::new(0),
            recovery,
            snapshots,
            compaction: compaction::runtime::Runtime::default(),
            checkpoint_hook: Mutex::new(None),
            checkpoints: Mutex::default(),
            newest_checkpoint_bytes: AtomicU64::new(0),
            ack_views: devices::ack_view::AckViews::default(),
            touches: Arc::default(),
            round_bases: Mutex::default(),
        });
        shared.note_round_base(
            shared.recovery.checkpoint_replica_index,
            shared.recovery.checkpoint_lsn,
        );
        shared.know_checkpoints(&checkpoints);
        let (ckpt_tx, ckpt_rx) = mpsc::channel();
        let (snap_tx, snap_rx) = mpsc::channel();
        let services = command::Services {
            snapshot_jobs: snap_tx,
        };
        let seq = sequencer::Sequencer::new(Arc::clone(&shared), ckpt_tx, services);
        let (tx, core, run_sequencer) = sequencer::start(seq);
        let writer_shared = Arc::clone(&shared);
        let builder_shared = Arc::clone(&shared);
        let compaction = shared
            .config
            .compaction_interval
            .map(|every| (Arc::clone(&shared), tx.clone(), every));
        // The sequencer takes the compaction pass's commands as the
        // engine's.
        let compaction = compaction.map(|(shared, tx, every)| {
            let submit: compaction::submit::OwnedSubmit =
                Box::new(move |r| tx.send(compaction_request(r)).is_ok());
            (shared, submit, every)
        });
        let mut threads = vec![
            // First: `join_threads` joins it before the others.
            crate::threads::spawn("inbox-sequencer", run_sequencer).map_err(LogError::Io)?,
            // Exits once the sequencer (its only sender) has stopped and
            // the final checkpoint is written.
            crate::threads::spawn("inbox-checkpoint", move || {
                sequencer::checkpoints::run_writer(writer_shared, ckpt_rx)
            })
            .map_err(LogError::Io)?,
            // Exits once the sequencer has stopped and every round is
            // finished (begin-snapshot replies hold its queue).
            crate::threads::spawn("inbox-snapshot", move || {
                snapshots::build::run_builder(builder_shared, snap_rx)
            })
            .map_err(LogError::Io)?,
        ];
        if let Some((shared, submit, every)) = compaction {
            threads.push(
                crate::threads::spawn("inbox-compaction", move || {
                    compaction::pass::run_background(shared, submit, every)
                })
                .map_err(LogError::Io)?,
            );
        }
        // Rounds are finished by the `evt` pass that made them durable,
        // on whichever thread ran it (see `sequencer/completion.rs`). The hook holds the engine
        // weakly and is removed before the engine lets go of it, so the
        // writer never drops the last handle (which would join itself).
        let weak = Arc::downgrade(&shared);
        shared.evt_log.set_durable_hook(Some(Box::new(move || {
            if let Some(shared) = weak.upgrade() {
                sequencer::completion::pump(&shared);
            }
        })));
        Ok(Inbox {
            shared,
            tx: Mutex::new(Some(tx)),
            core,
            threads: Mutex::new(threads),
        })
    }

    pub(super) fn submit<T, C: Into<Command>>(&self, make: impl FnOnce(Tx<T>) -> C) -> Pending<T> {
        self.submit_or_run_here(make, false)
    }

    /// Queues the command for the sequencer; with `here`, runs it on the
    /// calling thread instead when nothing is queued ahead of it
    /// ([`sequencer::Core::run_here`]).
    pub(super) fn submit_or_run_here<T, C: Into<Command>>(
        &self,
        make: impl FnOnce(Tx<T>) -> C,
        here: bool,
    ) -> Pending<T> {
        let (tx, pending) = Pending::channel();
        let mut cmd = make(tx).into();
        if here {
            let Some(queue) = self.tx.lock().clone() else {
                return Pending::ready(Err(Error::ShuttingDown));
            };
            match self.core.run_here(cmd, &queue) {
                None => return pending,
                Some(given_back) => cmd = given_back,
            }
        }
        let sent = match &*self.tx.lock() {
            Some(s) => s.send(sequencer::Command::Run(cmd)).is_ok(),
            None => false,
        };
        if sent {
            pending
        } else {
            Pending::ready(Err(Error::ShuttingDown))
        }
    }

    pub(super) fn now_ms(&self) -> TimestampMs {
        self.shared.config.clock.now_ms()
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
        let result = if sender.send(sequencer::Command::Shutdown { tx }).is_ok() {
            rx.recv().unwrap_or(Err(Error::ShuttingDown))
        } else {
            Err(Error::ShuttingDown)
        };
        drop(sender);
        self.join_threads();
        result
    }

    /// Stops the engine's threads the way a killed process stops: no
    /// final checkpoint, and commands still queued fail with
    /// `ShuttingDown`. What is on disk stays as the last round left it.
    /// For crash tests that image the files first and then need the old
    /// engine gone quickly.
    #[doc(hidden)]
    pub fn halt(&self) {
        self.shared.compaction.stop();
        self.shared.snapshots.stop_builder();
        // Dropping the only sender ends the sequencer's loop at its next
        // receive, without the shutdown command's drain and checkpoint.
        drop(self.tx.lock().take());
        self.join_threads();
    }

    fn join_threads(&self) {
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        let mut threads = threads.into_iter();
        // The sequencer (spawned first) goes first: once it is gone no
        // round is queued. The writer then stops finishing rounds, and
        // those left are finished here once their outcome is known, which
        // lets the threads that wait on their replies exit.
        if let Some(sequencer) = threads.next() {
            let _ = sequencer.join();
        }
        self.shared.evt_log.set_durable_hook(None);
        sequencer::completion::finish_all(&self.shared);
        for t in threads {
            let _ = t.join();
        }
    }
}

/// The sequencer's command for a compaction pass's request.
pub(super) fn compaction_request(r: compaction::submit::Request) -> sequencer::Command<Command> {
    match r {
        compaction::submit::Request::Run(c) => sequencer::Command::Run(Command::Compaction(c)),
        compaction::submit::Request::Checkpoint { tx } => sequencer::Command::Checkpoint { tx },
    }
}

/// What `Inbox::open` would conclude about `config.data_dir`, read-only:
/// both logs scanned as recovery scans them (a torn tail left out, as
/// open cuts it), the state recovered from the newest usable checkpoint
/// and the `evt` log after it (a checkpoint beyond the log's end refuses),
/// then every index location checked against both logs
/// (`consistency.rs`). Never writes.
pub fn verify_data_dir(config: &InboxConfig) -> Result<RecoveryReport> {
    // The verdict `Inbox::open` acts on; the caller holds the locks.
    recover::decide(config, false).map(|v| v.report)
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "inbox shutdown on drop failed");
        }
    }
}
