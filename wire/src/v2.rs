//! Protocol version 2 layouts that version 3 changed, so that a server can
//! still answer a version 2 client and a test can speak version 2.
//!
//! Three bodies differ: `HELLO_OK` stopped after `snapshot_ttl_ms`, an
//! `ERROR` had no `leader_addr` (a version 2 client finds the leader's
//! address at the end of the message, `leader_addr=HOST:PORT`), and a
//! `SNAPSHOT_PAGE` reply had no `elided` list. Everything else is the same.

use bytes::{Bytes, BytesMut};

use crate::body::{ConvSummary, ErrorReply, HelloOk, Message, SnapshotPage};
use crate::error_code::ErrorCode;
use crate::field::{wire_struct, Field, Reader};
use crate::op::{Op, OP_ERROR, REPLY_BIT};
use crate::{Frame, Response, WireError};

/// The version number.
pub const VERSION: u16 = 2;

wire_struct! {
    /// `HELLO_OK` in version 2.
    pub struct HelloOk2 {
        pub version: u16,
        pub server_name: String,
        pub frame_bytes_max: u32,
        pub in_flight_max: u32,
        pub reply_frame_bytes_max: u32,
        pub payload_bytes_max: u32,
        pub summary_bytes_max: u32,
        pub sync_page_default: u32,
        pub sync_page_max: u32,
        pub pull_per_conv_default: u32,
        pub pull_per_conv_max: u32,
        pub history_limit_max: u32,
        pub conv_list_limit_max: u32,
        pub devices_per_user_max: u32,
        pub rate_per_s: u32,
        pub rate_burst: u32,
        pub idle_timeout_ms: u64,
        pub batch_token_ttl_ms: u64,
        pub recovery_lease_ttl_ms: u64,
        pub snapshot_ttl_ms: u64,
    }
}

impl From<&HelloOk> for HelloOk2 {
    fn from(ok: &HelloOk) -> Self {
        Self {
            version: VERSION,
            server_name: ok.server_name.clone(),
            frame_bytes_max: ok.frame_bytes_max,
            in_flight_max: ok.in_flight_max,
            reply_frame_bytes_max: ok.reply_frame_bytes_max,
            payload_bytes_max: ok.payload_bytes_max,
            summary_bytes_max: ok.summary_bytes_max,
            sync_page_default: ok.sync_page_default,
            sync_page_max: ok.sync_page_max,
            pull_per_conv_default: ok.pull_per_conv_default,
            pull_per_conv_max: ok.pull_per_conv_max,
            history_limit_max: ok.history_limit_max,
            conv_list_limit_max: ok.conv_list_limit_max,
            devices_per_user_max: ok.devices_per_user_max,
            rate_per_s: ok.rate_per_s,
            rate_burst: ok.rate_burst,
            idle_timeout_ms: ok.idle_timeout_ms,
            batch_token_ttl_ms: ok.batch_token_ttl_ms,
            recovery_lease_ttl_ms: ok.recovery_lease_ttl_ms,
            snapshot_ttl_ms: ok.snapshot_ttl_ms,
        }
    }
}

wire_struct! {
    /// `ERROR` in versions 1 and 2.
    pub struct ErrorReply2 {
        pub code: ErrorCode,
        pub detail: u64,
        pub message: String,
    }
}

impl From<&ErrorReply> for ErrorReply2 {
    fn from(e: &ErrorReply) -> Self {
        Self {
            code: e.code,
            detail: e.detail,
            message: e.message.clone(),
        }
    }
}

wire_struct! {
    /// `SNAPSHOT_PAGE` reply in versions 1 and 2.
    pub struct SnapshotPage2 {
        pub snapshot_id: u64,
        pub page: u32,
        pub pages: u32,
        pub convs: Vec<ConvSummary>,
        pub messages: Vec<Message>,
    }
}

impl From<&SnapshotPage> for SnapshotPage2 {
    fn from(p: &SnapshotPage) -> Self {
        Self {
            snapshot_id: p.snapshot_id,
            page: p.page,
            pages: p.pages,
            convs: p.convs.clone(),
            messages: p.messages.clone(),
        }
    }
}

pub(crate) fn body_of<T: Field>(value: &T) -> Bytes {
    let mut out = BytesMut::new();
    value.put(&mut out);
    out.freeze()
}

/// The frame a version 2 client gets for `response`: the version 2 layout
/// where one exists, else the same frame as version 3.
pub fn reply_frame(response: &Response, request_id: u64) -> Frame {
    let body = match response {
        Response::Hello(ok) => body_of(&HelloOk2::from(ok)),
        other => match older_layout(other) {
            Some(body) => body,
            None => return other.to_frame(request_id),
        },
    };
    Frame {
        opcode: response.opcode(),
        request_id,
        body,
    }
}

/// The body of `response` in the layout versions 1 and 2 share, where it
/// differs from version 3's (`HELLO_OK` aside, which differs in each).
pub(crate) fn older_layout(response: &Response) -> Option<Bytes> {
    match response {
        Response::Error(e) => Some(body_of(&ErrorReply2::from(e))),
        Response::SnapshotPage(p) => Some(body_of(&SnapshotPage2::from(p))),
        _ => None,
    }
}

/// Parses a `HELLO_OK` body as a version 2 client would.
pub fn decode_hello_ok(body: Bytes) -> Result<HelloOk2, WireError> {
    decode(body)
}

/// Parses an `ERROR` body as a version 1 or 2 client would.
pub fn decode_error(body: Bytes) -> Result<ErrorReply2, WireError> {
    decode(body)
}

/// Parses a `SNAPSHOT_PAGE` reply body as a version 1 or 2 client would.
pub fn decode_snapshot_page(body: Bytes) -> Result<SnapshotPage2, WireError> {
    decode(body)
}

fn decode<T: Field>(body: Bytes) -> Result<T, WireError> {
    let mut r = Reader::new(body);
    let value = T::get(&mut r)?;
    r.finish()?;
    Ok(value)
}

/// The reply opcodes of the bodies this module knows.
pub const HELLO_OK: u8 = Op::Hello as u8 | REPLY_BIT;
pub const ERROR: u8 = OP_ERROR;
pub const SNAPSHOT_PAGE_OK: u8 = Op::SnapshotPage as u8 | REPLY_BIT;

/// `response` as a frame in the layout of protocol `version` (1 to
/// [`crate::PROTOCOL_VERSION`]).
pub fn reply_frame_for(version: u16, response: &Response, request_id: u64) -> Frame {
    match version {
        crate::v1::VERSION => crate::v1::reply_frame(response, request_id),
        VERSION => reply_frame(response, request_id),
        _ => response.to_frame(request_id),
    }
}
