//! inbox-wire: the inboxd binary protocol. Pure codec: no sockets, no
//! async runtime. The byte-by-byte spec is `docs/PROTOCOL.md`.
//!
//! Two layers:
//! - [`frame`]: length-prefixed frames (`frame_len u32 LE | opcode u8 |
//!   request_id u64 LE | body`). [`FrameCodec::decode`] returns `Ok(None)`
//!   for "need more bytes" and `Err` for a stream that cannot be trusted.
//! - [`op`] and [`body`]: typed bodies per opcode. A well-framed body that
//!   does not parse is a per-request error ([`WireError::Malformed`] or
//!   [`WireError::UnknownOpcode`]); the stream stays usable.
//!
//! Every frame and body this crate accepts re-encodes to the same bytes.

pub mod body;
mod error_code;
pub mod field;
pub mod frame;
pub mod op;
pub mod v1;
pub mod v2;

pub use body::*;
pub use error_code::ErrorCode;
#[cfg(feature = "serde")]
pub mod serde_text;
pub use frame::{decode, encode, Frame, FrameCodec};
pub use op::{Op, Request, Response, OP_ERROR, OP_HINT, REPLY_BIT};

/// Everything that can go wrong decoding. The first two are stream-level
/// (close the connection); the last two concern one frame only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    #[error("frame declares {declared} bytes, over the limit of {max}")]
    FrameTooLarge { declared: u32, max: u32 },
    #[error("frame declares {declared} bytes, too short for a header")]
    FrameTooShort { declared: u32 },
    #[error("unknown opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    #[error("malformed body: {0}")]
    Malformed(String),
}

impl WireError {
    /// True when the byte stream can no longer be split into frames.
    pub fn is_stream_fatal(&self) -> bool {
        matches!(
            self,
            Self::FrameTooLarge { .. } | Self::FrameTooShort { .. }
        )
    }

    /// The protocol error code a server answers this with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::FrameTooLarge { .. } => ErrorCode::TooLarge,
            Self::FrameTooShort { .. } | Self::Malformed(_) => ErrorCode::BadRequest,
            Self::UnknownOpcode(_) => ErrorCode::Unsupported,
        }
    }
}

#[cfg(test)]
mod tests;
