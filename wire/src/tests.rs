//! Codec tests: framing edge cases, strict body decoding, the worked
//! examples of `docs/PROTOCOL.md`, and round-trip properties.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;

use crate::field::sample::Gen;
use crate::field::{Field, Reader};
use crate::op::sample_all;
use crate::*;

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn unhex(text: &str) -> Vec<u8> {
    text.split_whitespace()
        .map(|pair| u8::from_str_radix(pair, 16).expect("test hex is valid"))
        .collect()
}

fn frame_bytes(frame: &Frame) -> BytesMut {
    let mut out = BytesMut::new();
    encode(frame, &mut out).expect("frame fits");
    out
}

#[test]
fn decode_waits_for_every_byte_of_a_frame() {
    let frame = Request::Ping(Empty {}).to_frame(7);
    let bytes = frame_bytes(&frame);
    let mut buf = BytesMut::new();
    for (i, byte) in bytes.iter().enumerate() {
        assert_eq!(
            decode(&mut buf).expect("never corrupt"),
            None,
            "after {i} bytes"
        );
        buf.put_u8(*byte);
    }
    assert_eq!(decode(&mut buf).expect("whole frame"), Some(frame));
    assert!(buf.is_empty());
}

#[test]
fn frame_declaring_4_gib_is_refused_before_any_allocation() {
    let mut buf = BytesMut::with_capacity(16);
    buf.put_u32_le(u32::MAX);
    buf.put_u8(0x12);
    let capacity_before = buf.capacity();
    let err = decode(&mut buf).expect_err("over the limit");
    assert_eq!(
        err,
        WireError::FrameTooLarge {
            declared: u32::MAX,
            max: frame::FRAME_BYTES_MAX_DEFAULT
        }
    );
    assert!(err.is_stream_fatal());
    assert_eq!(err.code(), ErrorCode::TooLarge);
    assert_eq!(
        buf.capacity(),
        capacity_before,
        "nothing reserved for the frame"
    );
}

#[test]
fn frame_too_short_for_a_header_is_corrupt() {
    let mut buf = BytesMut::from(&[8u8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8][..]);
    let err = decode(&mut buf).expect_err("8 < 9");
    assert_eq!(err, WireError::FrameTooShort { declared: 8 });
    assert!(err.is_stream_fatal());
}

#[test]
fn back_to_back_frames_decode_in_order_and_leave_the_rest() {
    let a = Request::Ping(Empty {}).to_frame(1);
    let b = Request::Devices(UserReq { uid: 9 }).to_frame(2);
    let mut buf = frame_bytes(&a);
    buf.extend_from_slice(&frame_bytes(&b));
    buf.extend_from_slice(&[5, 0]); // the start of a third frame
    assert_eq!(decode(&mut buf).unwrap(), Some(a));
    assert_eq!(decode(&mut buf).unwrap(), Some(b));
    assert_eq!(decode(&mut buf).unwrap(), None);
    assert_eq!(&buf[..], &[5, 0]);
}

#[test]
fn unknown_opcode_is_a_per_frame_error_not_a_stream_error() {
    let frame = Frame {
        opcode: 0x7e,
        request_id: 3,
        body: Bytes::from_static(b"whatever"),
    };
    let mut buf = frame_bytes(&frame);
    let decoded = decode(&mut buf).unwrap().expect("frame is complete");
    let err = Request::decode(decoded.opcode, decoded.body).expect_err("unknown");
    assert_eq!(err, WireError::UnknownOpcode(0x7e));
    assert!(!err.is_stream_fatal());
    assert_eq!(err.code(), ErrorCode::Unsupported);
}

#[test]
fn reply_and_push_opcodes_are_not_requests() {
    for opcode in [OP_ERROR, OP_HINT, Op::Send as u8 | REPLY_BIT] {
        assert_eq!(
            Request::decode(opcode, Bytes::new()),
            Err(WireError::UnknownOpcode(opcode))
        );
    }
}

#[test]
fn trailing_bytes_after_a_body_are_malformed() {
    let mut body = Request::Devices(UserReq { uid: 1 }).encode_body().to_vec();
    body.push(0);
    let err = Request::decode(Op::Devices as u8, body.into()).expect_err("trailing");
    assert!(matches!(err, WireError::Malformed(_)), "{err:?}");
}

#[test]
fn truncated_body_is_malformed() {
    let body = Request::Send(SendReq {
        conv: 1,
        sender: 2,
        client_msg_id: 3,
        msg_type: 1,
        payload: Bytes::from_static(b"hello"),
    })
    .encode_body();
    for cut in 0..body.len() {
        let err = Request::decode(Op::Send as u8, body.slice(..cut)).expect_err("cut short");
        assert!(
            matches!(err, WireError::Malformed(_)),
            "cut at {cut}: {err:?}"
        );
    }
}

#[test]
fn bool_and_option_tags_other_than_0_or_1_are_malformed() {
    let mut reader = Reader::new(Bytes::from_static(&[2]));
    assert!(bool::get(&mut reader).is_err());
    let mut reader = Reader::new(Bytes::from_static(&[7, 0, 0, 0, 0, 0, 0, 0, 0]));
    assert!(Option::<u64>::get(&mut reader).is_err());
}

#[test]
fn list_count_beyond_the_remaining_bytes_is_refused_without_allocating() {
    let mut body = BytesMut::new();
    body.put_u32_le(u32::MAX); // items claimed
    body.put_u64_le(1); // room for one
    let mut reader = Reader::new(body.freeze());
    let err = Vec::<u64>::get(&mut reader).expect_err("count too big");
    assert!(matches!(err, WireError::Malformed(_)));
}

#[test]
fn string_must_be_utf8() {
    let mut body = BytesMut::new();
    body.put_u32_le(2);
    body.put_slice(&[0xff, 0xfe]);
    assert!(String::get(&mut Reader::new(body.freeze())).is_err());
}

#[test]
fn unknown_event_kind_is_kept_raw_and_later_events_still_parse() {
    let page = SyncPage {
        events: vec![
            Event::Unknown {
                sync_seq: 5,
                kind: 200,
                body: Bytes::from_static(b"future"),
            },
            Event::Known {
                sync_seq: 6,
                kind: EventKind::Read,
                body: EventRef {
                    conv: 1,
                    msg_seq: 2,
                    msg_id: 3,
                    at_ms: 4,
                    summary: Bytes::new(),
                },
            },
        ],
        next_cursor: 6,
        ..SyncPage::default()
    };
    let body = Response::Sync(page.clone()).encode_body();
    let decoded = Response::decode(Op::Sync as u8 | REPLY_BIT, body).unwrap();
    assert_eq!(decoded, Response::Sync(page));
}

#[test]
fn known_event_kind_with_a_short_body_is_malformed() {
    let mut out = BytesMut::new();
    out.put_u64_le(1);
    out.put_u8(EventKind::Msg as u8);
    out.put_u32_le(3);
    out.put_slice(&[0, 0, 0]);
    assert!(Event::get(&mut Reader::new(out.freeze())).is_err());
}

#[test]
fn unknown_error_code_round_trips_unchanged() {
    let reply = Response::Error(ErrorReply {
        code: ErrorCode::Other(4242),
        detail: 1,
        message: "from the future".into(),
    });
    let body = reply.encode_body();
    assert_eq!(Response::decode(OP_ERROR, body.clone()).unwrap(), reply);
    assert_eq!(reply.encode_body(), body);
}

#[test]
fn encoder_refuses_a_frame_over_its_limit() {
    let codec = FrameCodec::new(16);
    let frame = Frame {
        opcode: 1,
        request_id: 1,
        body: Bytes::from(vec![0u8; 8]),
    };
    let mut out = BytesMut::new();
    assert!(codec.encode(&frame, &mut out).is_err());
    assert!(out.is_empty());
}

// The worked examples of docs/PROTOCOL.md, pinned byte for byte.

#[test]
fn protocol_doc_example_hello() {
    let frame = Request::Hello(Hello {
        version: 1,
        client_name: "ctl".into(),
        token: Bytes::from_static(b"s3cr3t"),
    })
    .to_frame(1);
    assert_eq!(
        hex(&frame_bytes(&frame)),
        "1c 00 00 00 01 01 00 00 00 00 00 00 00 01 00 03 00 00 00 63 74 6c \
         06 00 00 00 73 33 63 72 33 74"
    );
}

#[test]
fn protocol_doc_example_send_and_reply() {
    let send = Request::Send(SendReq {
        conv: 100,
        sender: 1,
        client_msg_id: 0x1122,
        msg_type: 1,
        payload: Bytes::from_static(b"hi"),
    })
    .to_frame(2);
    assert_eq!(
        hex(&frame_bytes(&send)),
        "31 00 00 00 12 02 00 00 00 00 00 00 00 \
         64 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 \
         22 11 00 00 00 00 00 00 00 00 00 00 00 00 00 00 \
         01 00 02 00 00 00 68 69"
    );
    let reply = Response::Send(SendReply {
        msg_id: 0x0400,
        msg_seq: 3,
        duplicate: false,
    })
    .to_frame(2);
    assert_eq!(
        hex(&frame_bytes(&reply)),
        "1a 00 00 00 92 02 00 00 00 00 00 00 00 \
         00 04 00 00 00 00 00 00 03 00 00 00 00 00 00 00 00"
    );
}

#[test]
fn protocol_doc_example_rate_limited_error() {
    let reply = Response::Error(ErrorReply {
        code: ErrorCode::RateLimited,
        detail: 250,
        message: "slow down".into(),
    })
    .to_frame(9);
    assert_eq!(
        hex(&frame_bytes(&reply)),
        "20 00 00 00 ff 09 00 00 00 00 00 00 00 07 00 fa 00 00 00 00 00 00 00 \
         09 00 00 00 73 6c 6f 77 20 64 6f 77 6e"
    );
}

#[test]
fn protocol_doc_example_hint_push() {
    let push = Response::Hint(Hints {
        hints: vec![Hint {
            uid: 1,
            committed_sync_seq: 12,
        }],
    })
    .to_frame(0);
    let bytes = frame_bytes(&push);
    assert_eq!(
        hex(&bytes),
        "1d 00 00 00 f0 00 00 00 00 00 00 00 00 01 00 00 00 \
         01 00 00 00 00 00 00 00 0c 00 00 00 00 00 00 00"
    );
    let mut buf = BytesMut::from(&unhex(&hex(&bytes))[..]);
    let frame = decode(&mut buf).unwrap().unwrap();
    assert_eq!(Response::decode(frame.opcode, frame.body).unwrap(), {
        Response::Hint(Hints {
            hints: vec![Hint {
                uid: 1,
                committed_sync_seq: 12,
            }],
        })
    });
}

#[test]
fn protocol_doc_example_sync_page_with_one_event() {
    let page = Response::Sync(SyncPage {
        events: vec![Event::Known {
            sync_seq: 1,
            kind: EventKind::Msg,
            body: EventRef {
                conv: 100,
                msg_seq: 3,
                msg_id: 0x0400,
                at_ms: 0,
                summary: Bytes::from_static(b"hi"),
            },
        }],
        next_cursor: 1,
        has_more: false,
        acked_sync_seq: 0,
        batch_hwm: 1,
        batch_token: Bytes::from_static(&[0xaa, 0xbb]),
        generation: 1,
        lease: None,
    })
    .to_frame(4);
    assert_eq!(
        hex(&frame_bytes(&page)),
        "68 00 00 00 a3 04 00 00 00 00 00 00 00 \
         01 00 00 00 \
         01 00 00 00 00 00 00 00 01 26 00 00 00 \
         64 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 \
         00 04 00 00 00 00 00 00 00 00 00 00 00 00 00 00 \
         02 00 00 00 68 69 \
         01 00 00 00 00 00 00 00 00 \
         00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 \
         02 00 00 00 aa bb 01 00 00 00 00 00 00 00 00"
    );
}

proptest! {
    /// Every typed body survives encode → frame → decode unchanged, and the
    /// decoded value re-encodes to the same bytes.
    #[test]
    fn every_request_and_reply_round_trips(seed in any::<u64>(), request_id in any::<u64>()) {
        let mut g = Gen(seed);
        let (requests, responses) = sample_all(&mut g);
        for request in requests {
            let bytes = frame_bytes(&request.to_frame(request_id));
            let mut buf = bytes.clone();
            let frame = decode(&mut buf).unwrap().expect("whole frame");
            prop_assert!(buf.is_empty());
            prop_assert_eq!(frame.request_id, request_id);
            let decoded = Request::decode(frame.opcode, frame.body).unwrap();
            prop_assert_eq!(&decoded, &request);
            prop_assert_eq!(frame_bytes(&decoded.to_frame(request_id)), bytes);
        }
        for response in responses {
            let frame = response.to_frame(request_id);
            let decoded = Response::decode(frame.opcode, frame.body.clone()).unwrap();
            prop_assert_eq!(&decoded, &response);
            prop_assert_eq!(decoded.encode_body(), frame.body);
        }
    }

    /// Flipping bytes of a valid body either gets an error or a value that
    /// re-encodes to exactly the mutated bytes: there is one encoding per
    /// value.
    #[test]
    fn mutated_bodies_are_refused_or_reencode_identically(
        seed in any::<u64>(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let mut g = Gen(seed);
        let (requests, responses) = sample_all(&mut g);
        for request in requests {
            let opcode = request.op() as u8;
            let mut body = request.encode_body().to_vec();
            if body.is_empty() { continue; }
            for (at, value) in &flips {
                let len = body.len();
                body[at % len] = *value;
            }
            if let Ok(decoded) = Request::decode(opcode, Bytes::from(body.clone())) {
                prop_assert_eq!(decoded.encode_body().to_vec(), body);
            }
        }
        for response in responses {
            let opcode = response.opcode();
            let mut body = response.encode_body().to_vec();
            if body.is_empty() { continue; }
            for (at, value) in &flips {
                let len = body.len();
                body[at % len] = *value;
            }
            if let Ok(decoded) = Response::decode(opcode, Bytes::from(body.clone())) {
                prop_assert_eq!(decoded.encode_body().to_vec(), body);
            }
        }
    }

    /// Arbitrary bytes never panic the decoder; whatever frames it accepts
    /// re-encode to the bytes they came from.
    #[test]
    fn arbitrary_bytes_never_panic_and_accepted_frames_reencode(
        input in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let codec = FrameCodec::new(64);
        let mut buf = BytesMut::from(&input[..]);
        let mut consumed = 0;
        while let Ok(Some(frame)) = codec.decode(&mut buf) {
            let mut out = BytesMut::new();
            codec.encode(&frame, &mut out).unwrap();
            prop_assert_eq!(&out[..], &input[consumed..consumed + out.len()]);
            consumed += out.len();
            if let Ok(request) = Request::decode(frame.opcode, frame.body.clone()) {
                prop_assert_eq!(request.encode_body(), frame.body.clone());
            }
            if let Ok(response) = Response::decode(frame.opcode, frame.body.clone()) {
                prop_assert_eq!(response.encode_body(), frame.body);
            }
        }
    }
}
