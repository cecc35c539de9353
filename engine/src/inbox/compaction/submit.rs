//! How a pass talks to the sequencer, the sizes it works in, and small
//! helpers its steps share.

use crate::error::{Error, Result};
use crate::inbox::pending::Pending;
use crate::inbox::round::{round_bytes_max, Tx};
use crate::inbox::shared::Shared;
use crate::log::Log;

/// Bytes a record costs on disk besides its payload.
pub(crate) const RECORD_HEADER_LEN: usize = Log::RECORD_OVERHEAD_BYTES as usize;

/// Users per chunk of work done under one state lock.
pub(crate) const USERS_PER_CHUNK: usize = 256;

/// Event locations copied per hold of the state lock.
pub(crate) const EVENTS_PER_LOCK: usize = 16 << 10;

/// Bytes of live records copied per append of a rewrite: small batches
/// keep the foreground's group commits short.
pub(crate) const REWRITE_BATCH_BYTES: u64 = 64 << 10;

/// Trim proposals per command.
pub(crate) const TRIMS_PER_COMMAND: usize = 1024;

/// Conversations per chunk of work done under one state lock.
pub(crate) const CONVS_PER_CHUNK: usize = 256;

/// Items per command, so that one command's records (`bytes_each` per
/// item, record headers included, plus one effect header) stay within what
/// one round may gather ([`round_bytes_max`]): a round
/// larger than a segment could not be written.
pub(crate) fn per_command(shared: &Shared, bytes_each: u64, cap: usize) -> usize {
    let room = round_bytes_max(shared.config.segment_bytes).saturating_sub(64);
    usize::try_from(room / bytes_each)
        .unwrap_or(usize::MAX)
        .clamp(1, cap)
}

/// What a pass asks of the sequencer: to run one of compaction's
/// commands, or to write a checkpoint now (answered once it is durable).
/// The caller, which holds the sequencer, turns it into the sequencer's
/// command; the pass names nothing of the sequencer.
pub(crate) enum Request {
    Run(super::Command),
    Checkpoint {
        tx: std::sync::mpsc::Sender<Result<()>>,
    },
}

/// How a pass hands its requests to the sequencer: false once the engine
/// takes no more commands.
pub(crate) type Submit<'a> = &'a dyn Fn(Request) -> bool;

/// A [`Submit`] the background thread owns.
pub(crate) type OwnedSubmit = Box<dyn Fn(Request) -> bool + Send>;

/// Submits one compaction command and waits for its reply.
pub(crate) fn call<T>(submit: Submit<'_>, make: impl FnOnce(Tx<T>) -> super::Command) -> Result<T> {
    let (tx, pending) = Pending::channel();
    if !submit(Request::Run(make(tx))) {
        return Err(Error::ShuttingDown);
    }
    pending.wait()
}

pub(crate) fn checkpoint_now(submit: Submit<'_>) -> Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    if !submit(Request::Checkpoint { tx }) {
        return Err(Error::ShuttingDown);
    }
    rx.recv().unwrap_or(Err(Error::ShuttingDown))
}
