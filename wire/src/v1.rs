//! Protocol version 1 layouts that version 2 changed, so that a server can
//! still answer a version 1 client and a test can speak version 1.
//!
//! Two bodies differ from version 2: `HELLO_OK` had no limits after
//! `in_flight_max`, and a `Fence` in `EXPLAIN` was its tag then its fields,
//! with no length. The bodies version 3 changed besides (`ERROR`,
//! `SNAPSHOT_PAGE`) are as in version 2 ([`crate::v2`]).

use bytes::{BufMut, Bytes, BytesMut};

use crate::body::{Fence, HelloOk, UserExplain};
use crate::field::{wire_struct, Field, Reader};
use crate::op::{Op, REPLY_BIT};
use crate::{Frame, Response, WireError};

/// The version number.
pub const VERSION: u16 = 1;

wire_struct! {
    /// `HELLO_OK` in version 1.
    pub struct HelloOk1 {
        pub version: u16,
        pub server_name: String,
        pub frame_bytes_max: u32,
        pub in_flight_max: u32,
    }
}

impl From<&HelloOk> for HelloOk1 {
    fn from(ok: &HelloOk) -> Self {
        Self {
            version: VERSION,
            server_name: ok.server_name.clone(),
            frame_bytes_max: ok.frame_bytes_max,
            in_flight_max: ok.in_flight_max,
        }
    }
}

/// A `Fence` in version 1: tag byte, then the fields. A tag a version 1
/// client does not know cannot be skipped, so none is ever sent to one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Fence1(pub Fence);

impl Field for Fence1 {
    const MIN_BYTES: usize = 9;
    fn put(&self, out: &mut BytesMut) {
        out.put_u8(self.0.tag());
        self.0.put_fields(out);
    }
    fn get(r: &mut Reader) -> Result<Self, WireError> {
        let tag = r.u8()?;
        match Fence::get_fields(tag, r)? {
            Some(fence) => Ok(Self(fence)),
            None => Err(WireError::Malformed(format!("fence tag {tag} is unknown"))),
        }
    }
}

wire_struct! {
    /// `EXPLAIN` reply in version 1.
    pub struct UserExplain1 {
        pub uid: u64,
        pub oldest_retained: u64,
        pub committed_sync_seq: u64,
        pub floor: u64,
        pub fences: Vec<Fence1>,
    }
}

impl From<&UserExplain> for UserExplain1 {
    fn from(e: &UserExplain) -> Self {
        Self {
            uid: e.uid,
            oldest_retained: e.oldest_retained,
            committed_sync_seq: e.committed_sync_seq,
            floor: e.floor,
            fences: e
                .fences
                .iter()
                .filter(|f| !matches!(f, Fence::Unknown { .. }))
                .cloned()
                .map(Fence1)
                .collect(),
        }
    }
}

fn body_of<T: Field>(value: &T) -> Bytes {
    let mut out = BytesMut::new();
    value.put(&mut out);
    out.freeze()
}

/// The frame a version 1 client gets for `response`: the version 1 layout
/// where one exists, else the version 2 one.
pub fn reply_frame(response: &Response, request_id: u64) -> Frame {
    let body = match response {
        Response::Hello(ok) => body_of(&HelloOk1::from(ok)),
        Response::Explain(explain) => body_of(&UserExplain1::from(explain)),
        other => match crate::v2::older_layout(other) {
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

/// Parses a reply body as a version 1 client would.
pub fn decode_hello_ok(body: Bytes) -> Result<HelloOk1, WireError> {
    decode(body)
}

/// Parses an `EXPLAIN` reply body as a version 1 client would.
pub fn decode_explain(body: Bytes) -> Result<UserExplain1, WireError> {
    decode(body)
}

fn decode<T: Field>(body: Bytes) -> Result<T, WireError> {
    let mut r = Reader::new(body);
    let value = T::get(&mut r)?;
    r.finish()?;
    Ok(value)
}

/// The reply opcode of `HELLO` and `EXPLAIN` (the same in both versions).
pub const HELLO_OK: u8 = Op::Hello as u8 | REPLY_BIT;
pub const EXPLAIN_OK: u8 = Op::Explain as u8 | REPLY_BIT;

#[cfg(test)]
impl crate::field::sample::Sample for Fence1 {
    fn sample(g: &mut crate::field::sample::Gen) -> Self {
        loop {
            let fence = <Fence as crate::field::sample::Sample>::sample(g);
            if !matches!(fence, Fence::Unknown { .. }) {
                return Self(fence);
            }
        }
    }
}
