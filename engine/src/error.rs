//! The engine's error type. Every variant maps to one protocol error code
//! (R24); see [`Error::code`].

use crate::api::{Generation, SyncSeq};
use crate::log::LogError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors returned by the [`crate::Inbox`] API.
///
/// A request that fails with any of these changed nothing, except
/// [`Error::ResetRequired`] from `sync`, which has bumped the device's
/// generation as R10 requires (the new generation is carried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("forbidden: {0}")]
    Forbidden(String),
    #[error("stale generation: device is at generation {current}")]
    StaleGeneration { current: Generation },
    #[error("reset required: install a snapshot (device generation is now {generation})")]
    ResetRequired { generation: Generation },
    #[error("device revoked")]
    DeviceRevoked,
    #[error("device is resetting: finish the snapshot install first")]
    DeviceResetting,
    #[error("not found: {0}")]
    NotFound(String),
    #[error("too large: {size} bytes exceeds the limit of {limit}")]
    TooLarge { size: u64, limit: u64 },
    #[error("batch token is invalid or expired")]
    BadToken,
    #[error("ack {seq} is beyond the batch high watermark {batch_hwm}")]
    AckBeyondHwm { seq: SyncSeq, batch_hwm: SyncSeq },
    #[error("version conflict: {0}")]
    Conflict(String),
    /// A large group's marker moved past the version a clear observed: a
    /// newer entry landed; pull again, then clear the new version (R7).
    #[error("marker moved: the marker is at version {version}")]
    MarkerMoved { version: u64 },
    #[error("storage is full: {0}")]
    NoSpace(String),
    /// This node does not lead its replication group, or lost the lead
    /// before the request's round was committed (the round may or may not
    /// be kept by the next leader): retry at the leader with the same
    /// idempotency key.
    #[error("not the leader: {0}")]
    NotLeader(String),
    /// The engine is shutting down or has shut down: nothing was done.
    /// Clients may retry elsewhere or later (`UNAVAILABLE`).
    #[error("the engine is shut down")]
    ShuttingDown,
    /// Stored data that passed its CRC does not decode: a bug or a disk
    /// that lies. `what` names the record or file.
    #[error("corrupt {what}: {reason}")]
    Corruption { what: &'static str, reason: String },
    /// The state machine found one of its own invariants broken; the
    /// message says which. Never an expected condition.
    #[error("broken invariant: {0}")]
    Invariant(String),
    #[error(transparent)]
    Log(#[from] LogError),
    /// Anything else unexpected (a panicked task, a thread that died).
    #[error("internal error: {0}")]
    Internal(String),
}
