//! `wire_decode`: arbitrary bytes into the frame decoder and the typed body
//! decoders.
//!
//! The decoder must never panic and never reserve more than the frame limit
//! allows. Every frame it accepts re-encodes to exactly the bytes it came
//! from, and every body that parses as a request or a response re-encodes
//! to the same body bytes.

use bytes::BytesMut;
use inbox_wire::{Frame, FrameCodec, Request, Response};

/// A small limit so that the fuzzer reaches the "too large" path often.
const FRAME_BYTES_MAX: u32 = 64 << 10;

pub fn check(data: &[u8]) {
    let codec = FrameCodec::new(FRAME_BYTES_MAX);
    let mut buf = BytesMut::from(data);
    let mut consumed = 0usize;
    loop {
        let before = buf.len();
        match codec.decode(&mut buf) {
            Ok(Some(frame)) => {
                let used = before - buf.len();
                let original = &data[consumed..consumed + used];
                consumed += used;
                check_frame(&codec, &frame, original);
            }
            Ok(None) => {
                assert_eq!(buf.len(), before, "need-more-bytes must not consume");
                assert!(
                    buf.capacity() <= data.len() + FRAME_BYTES_MAX as usize + 4,
                    "decoder reserved {} bytes past the frame limit",
                    buf.capacity()
                );
                break;
            }
            Err(error) => {
                assert!(
                    error.is_stream_fatal(),
                    "framing errors must be stream-fatal, got {error}"
                );
                break;
            }
        }
    }
}

fn check_frame(codec: &FrameCodec, frame: &Frame, original: &[u8]) {
    let mut reencoded = BytesMut::new();
    codec
        .encode(frame, &mut reencoded)
        .expect("a decoded frame fits the limit it was decoded under");
    assert_eq!(
        &reencoded[..],
        original,
        "frame did not re-encode to its bytes"
    );

    if let Ok(request) = Request::decode(frame.opcode, frame.body.clone()) {
        assert_eq!(
            request.encode_body(),
            frame.body,
            "request {request:?} did not re-encode to its body"
        );
    }
    if let Ok(response) = Response::decode(frame.opcode, frame.body.clone()) {
        assert_eq!(
            response.encode_body(),
            frame.body,
            "response {response:?} did not re-encode to its body"
        );
    }
}
