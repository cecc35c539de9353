//! inbox-engine: the storage engine behind inboxd.
//!
//! Layers, bottom up:
//! - [`log`]: append-only segment logs with group commit, CRC-framed batches
//!   and crash recovery (R20, R21).
//! - [`inbox`]: the deterministic inbox state machine over the logs, and the
//!   embedded [`Inbox`] API (R1–R19, R22).
//!
//! The public request and reply types live in [`api`]; the daemon only
//! translates between them and the wire protocol.

pub mod api;
pub mod error;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod inbox;
pub mod log;
pub mod placement;
mod prefetch;
pub mod threads;

pub use api::*;
pub use error::{Error, Result};
pub use inbox::{Inbox, InboxConfig};
