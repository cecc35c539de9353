//! The checkpoint-writer thread: the sequencer hands it copies of the
//! state (see `checkpoint.rs` for the file and who writes when), and it
//! encodes and writes them one at a time, in LSN order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use crate::error::Result;
use crate::inbox::checkpoint::{encode_to_file, finish, list};
use crate::inbox::shared::Shared;
use crate::inbox::state::State;

/// Who is told when a checkpoint job is done.
pub(crate) enum Done {
    /// A `Checkpoint` command or shutdown: gets the write's result.
    Caller(mpsc::Sender<Result<()>>),
    /// A periodic checkpoint: an error is logged; the flag is cleared so
    /// the sequencer may hand off the next one.
    Periodic(Arc<AtomicBool>),
}

impl Done {
    pub fn finish(self, lsn: u64, result: Result<()>) {
        match self {
            // A caller that stopped listening needs no answer.
            Done::Caller(tx) => drop(tx.send(result)),
            Done::Periodic(busy) => {
                if let Err(e) = result {
                    tracing::warn!(lsn, error = %e, "periodic checkpoint failed; recovery uses the previous one or replays, and another is taken later");
                }
                busy.store(false, Ordering::Release);
            }
        }
    }
}

pub(crate) enum Job {
    /// A copy of the state at one LSN (taken in O(users + conversations):
    /// see [`State`]), encoded and written by the writer thread.
    Write { state: Box<State>, done: Done },
    /// Answered once every job queued before it is finished.
    Barrier(mpsc::Sender<()>),
}

/// The checkpoint-writer thread: writes images in the order received until
/// every sender is gone (the sequencer's, dropped when it stops after the
/// final checkpoint).
pub(crate) fn run_writer(shared: Arc<Shared>, rx: mpsc::Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let (state, done) = match job {
            Job::Write { state, done } => (state, done),
            Job::Barrier(tx) => {
                let _ = tx.send(());
                continue;
            }
        };
        let hook = shared.checkpoint_hook.lock().clone();
        if let Some(h) = hook {
            h(state.evt_lsn);
        }
        let lsn = state.evt_lsn;
        let started = std::time::Instant::now();
        let io = shared.evt_log.io();
        let encoded = encode_to_file(io, &shared.config.data_dir, &state);
        // The copy shares entries with the live state: drop it before the
        // sync, so that changes made from now on no longer clone what they
        // touch.
        drop(state);
        let result = encoded.and_then(|e| finish(io.as_ref(), &shared.config.data_dir, e));
        if result.is_ok() {
            // Every file listed now is durable: the new one's rename was
            // fsynced, and the others were before.
            if let Ok(files) = list(&shared.config.data_dir) {
                shared.know_checkpoints(&files);
            }
            tracing::info!(
                lsn,
                bytes = shared.newest_checkpoint_bytes.load(Ordering::Relaxed),
                ms = started.elapsed().as_millis() as u64,
                periodic = matches!(done, Done::Periodic(_)),
                "checkpoint written"
            );
        }
        done.finish(lsn, result);
    }
}
