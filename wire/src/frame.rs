//! Framing: turning a byte stream into frames and back.
//!
//! ```text
//! offset  size  field
//! 0       4     frame_len   u32 LE: bytes after this field (9 + body)
//! 4       1     opcode      u8
//! 5       8     request_id  u64 LE (0 in server-push frames)
//! 13      n     body        n = frame_len - 9, layout set by the opcode
//! ```
//!
//! Invariants:
//! - `frame_len` is checked against the codec's maximum before a single
//!   byte of the frame is buffered for it, so a peer declaring 4 GiB costs
//!   nothing;
//! - a `frame_len` below 9 cannot hold a header: the stream is corrupt;
//! - the body is never interpreted here, so a frame with an unknown opcode
//!   decodes fine and the connection can answer it and go on;
//! - decoding a frame and encoding it again gives the same bytes.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::WireError;

/// Bytes of `frame_len` itself.
pub const LEN_BYTES: usize = 4;
/// Bytes after `frame_len` that every frame has: opcode + request id.
pub const HEADER_AFTER_LEN_BYTES: u32 = 9;
/// Default ceiling on `frame_len` for frames a server accepts.
pub const FRAME_BYTES_MAX_DEFAULT: u32 = 1 << 20;
/// Default ceiling on `frame_len` for frames a client accepts (replies can
/// carry many messages).
pub const REPLY_FRAME_BYTES_MAX_DEFAULT: u32 = 64 << 20;

/// One frame, body still raw. Parse the body with
/// [`crate::Request::decode`] or [`crate::Response::decode`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub opcode: u8,
    pub request_id: u64,
    pub body: Bytes,
}

impl Frame {
    /// The value of `frame_len` this frame encodes with, or `None` when the
    /// body is too large for any frame.
    pub fn frame_len(&self) -> Option<u32> {
        u32::try_from(self.body.len())
            .ok()
            .and_then(|body| body.checked_add(HEADER_AFTER_LEN_BYTES))
    }
}

/// A framing codec with a size limit.
#[derive(Clone, Copy, Debug)]
pub struct FrameCodec {
    pub frame_bytes_max: u32,
}

impl Default for FrameCodec {
    fn default() -> Self {
        Self {
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        }
    }
}

impl FrameCodec {
    pub fn new(frame_bytes_max: u32) -> Self {
        Self { frame_bytes_max }
    }

    /// Takes one whole frame off the front of `buf`.
    ///
    /// `Ok(None)`: not enough bytes yet, `buf` untouched (capacity for the
    /// rest of the frame may be reserved, but only after the length check).
    /// `Err`: the stream is corrupt or the frame is over the limit; the
    /// caller cannot find the next frame boundary and must close.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        let Some(len_bytes) = buf.get(..LEN_BYTES) else {
            return Ok(None);
        };
        let mut len_le = [0u8; LEN_BYTES];
        len_le.copy_from_slice(len_bytes);
        let frame_len = u32::from_le_bytes(len_le);
        if frame_len > self.frame_bytes_max {
            return Err(WireError::FrameTooLarge {
                declared: frame_len,
                max: self.frame_bytes_max,
            });
        }
        if frame_len < HEADER_AFTER_LEN_BYTES {
            return Err(WireError::FrameTooShort {
                declared: frame_len,
            });
        }
        let total = LEN_BYTES + frame_len as usize;
        if buf.len() < total {
            buf.reserve(total - buf.len());
            return Ok(None);
        }
        let mut frame = buf.split_to(total).freeze();
        frame.advance(LEN_BYTES);
        let opcode = frame.get_u8();
        let request_id = frame.get_u64_le();
        Ok(Some(Frame {
            opcode,
            request_id,
            body: frame,
        }))
    }

    /// Appends `frame` to `out`. Fails, writing nothing, when the frame is
    /// over this codec's limit (the peer would refuse it).
    pub fn encode(&self, frame: &Frame, out: &mut BytesMut) -> Result<(), WireError> {
        let frame_len = frame.frame_len().unwrap_or(u32::MAX);
        if frame.frame_len().is_none() || frame_len > self.frame_bytes_max {
            return Err(WireError::FrameTooLarge {
                declared: frame_len,
                max: self.frame_bytes_max,
            });
        }
        out.reserve(LEN_BYTES + frame_len as usize);
        out.put_u32_le(frame_len);
        out.put_u8(frame.opcode);
        out.put_u64_le(frame.request_id);
        out.put_slice(&frame.body);
        Ok(())
    }
}

/// [`FrameCodec::decode`] with the default server-side limit.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, WireError> {
    FrameCodec::default().decode(buf)
}

/// Appends `frame` to `out` with no limit other than the `u32` length
/// field itself.
pub fn encode(frame: &Frame, out: &mut BytesMut) -> Result<(), WireError> {
    FrameCodec::new(u32::MAX).encode(frame, out)
}
