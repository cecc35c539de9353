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
fn an_event_without_its_summary_field_is_45_bytes_and_one_with_an_empty_summary_is_not_read_as_it()
{
    let ids = EventIds {
        conv: 1,
        msg_seq: 2,
        msg_id: 3,
        at_ms: 4,
    };
    let bare = Event::Bare {
        sync_seq: 9,
        kind: EventKind::Msg,
        body: ids.clone(),
    };
    let mut out = BytesMut::new();
    bare.put(&mut out);
    assert_eq!(out.len(), 45);
    assert_eq!(Event::get(&mut Reader::new(out.freeze())).unwrap(), bare);
    // The same ids with an empty summary field: 4 bytes more, and read
    // back as the full form.
    let known = Event::Known {
        sync_seq: 9,
        kind: EventKind::Msg,
        body: EventRef {
            conv: ids.conv,
            msg_seq: ids.msg_seq,
            msg_id: ids.msg_id,
            at_ms: ids.at_ms,
            summary: Bytes::new(),
        },
    };
    let mut out = BytesMut::new();
    known.put(&mut out);
    assert_eq!(out.len(), 49);
    assert_eq!(Event::get(&mut Reader::new(out.freeze())).unwrap(), known);
}

#[test]
fn a_body_written_in_place_behind_its_length_is_the_byte_string_of_that_body() {
    let body = EventRef {
        conv: 1,
        msg_seq: 2,
        msg_id: 3,
        at_ms: 4,
        summary: Bytes::from_static(b"hello"),
    };
    // Behind bytes already in the buffer, as every event but a page's first.
    let mut out = BytesMut::from(&b"head"[..]);
    Event::Known {
        sync_seq: 9,
        kind: EventKind::Msg,
        body: body.clone(),
    }
    .put(&mut out);
    let mut alone = BytesMut::new();
    body.put(&mut alone);
    let mut expected = BytesMut::from(&b"head"[..]);
    expected.put_u64_le(9);
    expected.put_u8(EventKind::Msg as u8);
    alone.freeze().put(&mut expected);
    assert_eq!(hex(&out), hex(&expected));
    assert_eq!(&out[4 + 9..4 + 9 + 4], &(32u32 + 4 + 5).to_le_bytes());
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
    let reply = Response::Error(ErrorReply::new(
        ErrorCode::Other(4242),
        1,
        "from the future",
    ));
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

// The worked examples of docs/PROTOCOL.md, read from the document itself
// and pinned byte for byte: each must be exactly what this codec encodes,
// and decode back to the same value.

const PROTOCOL_MD: &str = include_str!("../../docs/PROTOCOL.md");

/// The bytes of the example marked `<!-- example: NAME -->` in
/// PROTOCOL.md: the code block after the marker, each line read up to its
/// first word that is not a two-digit hex byte.
fn doc_example(name: &str) -> Vec<u8> {
    let marker = format!("<!-- example: {name} -->");
    let at = PROTOCOL_MD
        .find(&marker)
        .unwrap_or_else(|| panic!("PROTOCOL.md has no example {name}"));
    let block = PROTOCOL_MD[at..]
        .split("```")
        .nth(1)
        .expect("a code block follows the marker");
    let mut bytes = Vec::new();
    for line in block.lines().skip(1) {
        for word in line.split_whitespace() {
            if word.len() != 2 {
                break;
            }
            match u8::from_str_radix(word, 16) {
                Ok(byte) => bytes.push(byte),
                Err(_) => break,
            }
        }
    }
    bytes
}

/// `frame` encodes to example `name`, and the example decodes to `frame`.
fn assert_doc_frame(name: &str, frame: &Frame) {
    let doc = doc_example(name);
    assert_eq!(
        hex(&frame_bytes(frame)),
        hex(&doc),
        "example {name} in PROTOCOL.md"
    );
    let mut buf = BytesMut::from(&doc[..]);
    let decoded = decode(&mut buf).unwrap().expect("a whole frame");
    assert!(buf.is_empty(), "example {name} is one frame");
    assert_eq!(&decoded, frame);
}

fn assert_doc_request(name: &str, request: &Request, request_id: u64) {
    let frame = request.to_frame(request_id);
    assert_doc_frame(name, &frame);
    assert_eq!(&Request::decode(frame.opcode, frame.body).unwrap(), request);
}

fn assert_doc_response(name: &str, response: &Response, request_id: u64) {
    let frame = response.to_frame(request_id);
    assert_doc_frame(name, &frame);
    assert_eq!(
        &Response::decode(frame.opcode, frame.body).unwrap(),
        response
    );
}

#[test]
fn protocol_doc_example_hello() {
    let hello = Request::Hello(Hello {
        version: 3,
        client_name: "ctl".into(),
        token: Bytes::from_static(b"s3cr3t"),
    });
    assert_doc_request("hello", &hello, 1);
}

/// The limits of a server started with the defaults.
fn default_hello_ok() -> HelloOk {
    HelloOk {
        version: 3,
        server_name: "inboxd".into(),
        frame_bytes_max: 1 << 20,
        in_flight_max: 256,
        reply_frame_bytes_max: 64 << 20,
        payload_bytes_max: 65_536,
        summary_bytes_max: 64,
        sync_page_default: 100,
        sync_page_max: 500,
        pull_per_conv_default: 50,
        pull_per_conv_max: 500,
        history_limit_max: 500,
        conv_list_limit_max: 500,
        devices_per_user_max: 5,
        rate_per_s: 20_000,
        rate_burst: 2_000,
        idle_timeout_ms: 300_000,
        batch_token_ttl_ms: 600_000,
        recovery_lease_ttl_ms: 600_000,
        snapshot_ttl_ms: 3_600_000,
        max_connections: 1024,
        subscribe_uids_max: 100_000,
        subscriptions_max: 1_000_000,
        large_group_members: 500,
        idempotency_ttl_ms: 7 * 24 * 3600 * 1000,
    }
}

#[test]
fn protocol_doc_example_hello_ok_announces_every_limit() {
    assert_doc_response("hello-ok", &Response::Hello(default_hello_ok()), 1);
}

#[test]
fn protocol_doc_example_hello_ok_for_a_version_1_client_stops_after_in_flight_max() {
    let frame = v1::reply_frame(&Response::Hello(default_hello_ok()), 1);
    assert_doc_frame("hello-ok-v1", &frame);
    let ok = v1::decode_hello_ok(frame.body).unwrap();
    assert_eq!(ok.version, 1);
    assert_eq!(ok.in_flight_max, 256);
}

#[test]
fn protocol_doc_example_hello_ok_for_a_version_2_client_stops_after_snapshot_ttl() {
    let frame = v2::reply_frame(&Response::Hello(default_hello_ok()), 1);
    assert_doc_frame("hello-ok-v2", &frame);
    let ok = v2::decode_hello_ok(frame.body).unwrap();
    assert_eq!(ok.version, 2);
    assert_eq!(ok.snapshot_ttl_ms, 3_600_000);
}

#[test]
fn protocol_doc_example_not_leader_names_the_leader_in_a_field() {
    let refusal = Response::Error(ErrorReply {
        code: ErrorCode::NotLeader,
        detail: 0,
        message: "not the leader".into(),
        leader_addr: Some("10.0.0.2:7070".into()),
    });
    assert_doc_response("not-leader", &refusal, 7);
}

#[test]
fn an_error_for_an_older_client_has_no_leader_field() {
    let refusal = Response::Error(ErrorReply {
        code: ErrorCode::NotLeader,
        detail: 0,
        message: "not the leader; leader_addr=10.0.0.2:7070".into(),
        leader_addr: Some("10.0.0.2:7070".into()),
    });
    for version in [1, 2] {
        let frame = v2::reply_frame_for(version, &refusal, 7);
        let old = v2::decode_error(frame.body.clone()).unwrap();
        assert_eq!(old.code, ErrorCode::NotLeader);
        assert!(old.message.ends_with("leader_addr=10.0.0.2:7070"));
        // A version 3 reader sees bytes missing: the layouts differ.
        assert!(Response::decode(frame.opcode, frame.body).is_err());
    }
    let frame = v2::reply_frame_for(3, &refusal, 7);
    assert_eq!(Response::decode(frame.opcode, frame.body).unwrap(), refusal);
}

#[test]
fn a_snapshot_page_for_an_older_client_has_no_elided_list() {
    let page = SnapshotPage {
        snapshot_id: 4,
        page: 0,
        pages: 1,
        convs: vec![],
        messages: vec![],
        elided: vec![MsgRef {
            conv: 1,
            msg_seq: 2,
        }],
    };
    let reply = Response::SnapshotPage(page.clone());
    let old = v2::decode_snapshot_page(v2::reply_frame_for(2, &reply, 1).body).unwrap();
    assert_eq!((old.snapshot_id, old.pages), (4, 1));
    let old = v2::decode_snapshot_page(v2::reply_frame_for(1, &reply, 1).body).unwrap();
    assert_eq!(old.snapshot_id, 4);
    let new = v2::reply_frame_for(3, &reply, 1);
    assert_eq!(Response::decode(new.opcode, new.body).unwrap(), reply);
}

#[test]
fn protocol_doc_example_send_and_reply() {
    let send = Request::Send(SendReq {
        conv: 100,
        sender: 1,
        client_msg_id: 0x1122,
        msg_type: 1,
        payload: Bytes::from_static(b"hi"),
    });
    assert_doc_request("send", &send, 2);
    let reply = Response::Send(SendReply {
        msg_id: 0x0400,
        msg_seq: 3,
        duplicate: false,
    });
    assert_doc_response("send-reply", &reply, 2);
}

#[test]
fn protocol_doc_example_rate_limited_error() {
    let reply = Response::Error(ErrorReply::new(ErrorCode::RateLimited, 250, "slow down"));
    assert_doc_response("rate-limited", &reply, 9);
}

#[test]
fn protocol_doc_example_hint_push() {
    let push = Response::Hint(Hints {
        hints: vec![Hint {
            uid: 1,
            committed_sync_seq: 12,
        }],
    });
    assert_doc_response("hint", &push, 0);
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
    });
    assert_doc_response("sync-reply", &page, 4);
}

#[test]
fn protocol_doc_example_explain_with_a_fence_of_an_unknown_kind_skips_it() {
    let explain = Response::Explain(UserExplain {
        uid: 1,
        oldest_retained: 5,
        committed_sync_seq: 9,
        floor: 4,
        fences: vec![
            Fence::DeviceAck {
                device: 7,
                acked_sync_seq: 4,
            },
            Fence::Unknown {
                tag: 9,
                body: Bytes::from_static(&[0xee, 0xee]),
            },
        ],
    });
    assert_doc_response("explain-reply", &explain, 5);
}

#[test]
fn version_1_explain_keeps_the_untagged_fence_layout_and_drops_unknown_fences() {
    let explain = UserExplain {
        uid: 1,
        oldest_retained: 5,
        committed_sync_seq: 9,
        floor: 5,
        fences: vec![
            Fence::SafetyWindow { oldest_kept: 5 },
            Fence::Unknown {
                tag: 9,
                body: Bytes::new(),
            },
        ],
    };
    let frame = v1::reply_frame(&Response::Explain(explain), 5);
    assert_eq!(frame.opcode, v1::EXPLAIN_OK);
    // uid, oldest, committed, floor, one fence: tag 4 then oldest_kept.
    assert_eq!(
        hex(&frame.body[32..]),
        "01 00 00 00 04 05 00 00 00 00 00 00 00"
    );
    let decoded = v1::decode_explain(frame.body).unwrap();
    assert_eq!(
        decoded.fences,
        vec![v1::Fence1(Fence::SafetyWindow { oldest_kept: 5 })]
    );
}

#[test]
fn a_known_fence_whose_length_does_not_match_its_fields_is_refused() {
    let mut body = BytesMut::new();
    body.put_u64_le(1);
    body.put_u64_le(0);
    body.put_u64_le(0);
    body.put_u64_le(0);
    body.put_u32_le(1);
    body.put_u8(4);
    body.put_u32_le(9);
    body.put_slice(&[0; 9]);
    assert!(Response::decode(v1::EXPLAIN_OK, body.freeze()).is_err());
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

#[test]
fn protocol_doc_example_clear_dirty() {
    let clear = Request::ClearDirty(ClearDirtyReq {
        uid: 2,
        conv: 7,
        version: 9,
    });
    assert_doc_request("clear-dirty", &clear, 3);
}

#[test]
fn protocol_doc_example_marker_moved_carries_the_current_version() {
    let moved = Response::Error(ErrorReply::new(ErrorCode::MarkerMoved, 10, "marker moved"));
    assert_doc_response("marker-moved", &moved, 3);
}

#[test]
fn protocol_doc_example_dirty_reply() {
    let dirty = Response::Dirty(DirtyList {
        markers: vec![DirtyMarker {
            conv: 7,
            target_msg_seq: 10,
            version: 10,
        }],
    });
    assert_doc_response("dirty-reply", &dirty, 4);
}

#[test]
fn protocol_doc_example_memory_reply() {
    let memory = Response::Memory(MemoryReport {
        walk_us: 120,
        longest_hold_us: 35,
        structures: vec![MemoryUse {
            structure: "idempotency".into(),
            live: 4000,
            allocated: 5120,
        }],
    });
    assert_doc_response("memory-reply", &memory, 5);
}

fn sync_body(req: &SyncReq) -> BytesMut {
    let mut out = BytesMut::new();
    req.put(&mut out);
    out
}

fn base_sync() -> SyncReq {
    SyncReq {
        uid: 7,
        device: 1,
        generation: Some(3),
        local_applied_seq: 40,
        limit: 100,
        batch_token: None,
        ..SyncReq::default()
    }
}

#[test]
fn sync_without_optional_fields_keeps_the_fixed_layout() {
    // uid, device, option<generation>, local_applied_seq, limit, option<token>
    assert_eq!(sync_body(&base_sync()).len(), 8 + 8 + 9 + 8 + 4 + 1);
}

#[test]
fn sync_optional_fields_round_trip_and_follow_the_fixed_fields() {
    let req = SyncReq {
        max_replay: Some(5_000),
        without_summaries: true,
        ..base_sync()
    };
    let body = sync_body(&req);
    let fixed = sync_body(&base_sync()).len();
    assert_eq!(
        hex(&body[fixed..]),
        "01 08 00 00 00 88 13 00 00 00 00 00 00 02 00 00 00 00"
    );
    let back = Request::decode(Op::Sync as u8, body.freeze()).expect("decodes");
    assert_eq!(back, Request::Sync(req));
    let ids = SyncReq {
        ids_only: true,
        ..base_sync()
    };
    let body = sync_body(&ids);
    assert_eq!(hex(&body[fixed..]), "03 00 00 00 00");
    let back = Request::decode(Op::Sync as u8, body.freeze()).expect("decodes");
    assert_eq!(back, Request::Sync(ids));
    let acking = SyncReq {
        ids_only: true,
        ack_through: Some(300),
        ..base_sync()
    };
    let body = sync_body(&acking);
    assert_eq!(
        hex(&body[fixed..]),
        "03 00 00 00 00 04 08 00 00 00 2c 01 00 00 00 00 00 00"
    );
    let back = Request::decode(Op::Sync as u8, body.freeze()).expect("decodes");
    assert_eq!(back, Request::Sync(acking));
}

#[test]
fn sync_optional_fields_that_are_unknown_repeated_or_malformed_are_refused() {
    let fixed = sync_body(&base_sync());
    let with = |tail: &[u8]| {
        let mut b = fixed.clone();
        b.put_slice(tail);
        Request::decode(Op::Sync as u8, b.freeze())
    };
    let unknown = with(&[9, 0, 0, 0, 0]).expect_err("unknown tag");
    assert!(unknown.to_string().contains("unknown"), "{unknown}");
    let repeated = with(&[2, 0, 0, 0, 0, 2, 0, 0, 0, 0]).expect_err("repeated");
    assert!(repeated.to_string().contains("ascend"), "{repeated}");
    let descending = with(&[2, 0, 0, 0, 0, 1, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    assert!(descending.is_err());
    let short = with(&[1, 4, 0, 0, 0, 1, 0, 0, 0]).expect_err("short max_replay");
    assert!(short.to_string().contains("max_replay"), "{short}");
    let valued = with(&[2, 1, 0, 0, 0, 1]).expect_err("without_summaries with a value");
    assert!(valued.to_string().contains("without_summaries"), "{valued}");
    let valued = with(&[3, 1, 0, 0, 0, 1]).expect_err("ids_only with a value");
    assert!(valued.to_string().contains("ids_only"), "{valued}");
    let short = with(&[4, 2, 0, 0, 0, 1, 0]).expect_err("short ack_through");
    assert!(short.to_string().contains("ack_through"), "{short}");
    assert!(with(&[1]).is_err(), "a tag without its value");
}

#[test]
fn protocol_doc_example_cluster_status_reply() {
    let status = Response::ClusterStatus(ClusterStatus {
        node_id: 1,
        role: "leader".into(),
        term: 3,
        leader: Some(1),
        last_log_index: 42,
        last_applied_index: 42,
        millis_since_quorum_ack: Some(12),
        members: vec![
            ClusterMember {
                node_id: 1,
                raft_addr: "10.0.0.1:7080".into(),
                client_addr: "10.0.0.1:7070".into(),
                matched_index: Some(42),
            },
            ClusterMember {
                node_id: 2,
                raft_addr: "10.0.0.2:7080".into(),
                client_addr: "10.0.0.2:7070".into(),
                matched_index: Some(40),
            },
        ],
    });
    assert_doc_response("cluster-status-reply", &status, 6);
}

#[test]
fn protocol_doc_example_cluster_add_node() {
    let add = Request::ClusterAddNode(AddNodeReq {
        node_id: 4,
        raft_addr: "10.0.0.4:7080".into(),
        client_addr: "10.0.0.4:7070".into(),
    });
    assert_doc_request("cluster-add-node", &add, 7);
}

#[test]
fn protocol_doc_example_cluster_remove_node() {
    let remove = Request::ClusterRemoveNode(RemoveNodeReq { node_id: 3 });
    assert_doc_request("cluster-remove-node", &remove, 8);
}

#[test]
fn membership_requests_answer_with_the_cluster_status_layout() {
    for op in [Op::ClusterAddNode, Op::ClusterRemoveNode] {
        let status = ClusterStatus {
            node_id: 1,
            role: "leader".into(),
            ..ClusterStatus::default()
        };
        let frame = Response::ClusterStatus(status.clone()).to_frame(9);
        let reply = Response::decode(op as u8 | REPLY_BIT, frame.body).expect("decodes");
        assert_eq!(reply.opcode(), op as u8 | REPLY_BIT);
        assert!(
            matches!(&reply, Response::ClusterAddNode(s) | Response::ClusterRemoveNode(s) if *s == status),
            "{reply:?}"
        );
    }
}
