//! The opcode table: which body each request opcode carries and which body
//! its reply carries.
//!
//! Invariants:
//! - a request opcode is in `0x01..=0x7f`; its success reply is the same
//!   opcode with the top bit set (`op | 0x80`);
//! - `0xff` is `ERROR`, the reply to any failed request; `0xf0` is
//!   `HINT` and `0xf1` is `DIRTY_HINT`, server pushes with request id 0;
//!   none is ever a request;
//! - a reply carries the request id of its request; replies may come in
//!   any order (pipelining).

use bytes::{Bytes, BytesMut};

use crate::body::*;
use crate::field::{Field, Reader};
use crate::{Frame, WireError};

/// Set on a request opcode to make its success reply opcode.
pub const REPLY_BIT: u8 = 0x80;
/// `ERROR` reply opcode.
pub const OP_ERROR: u8 = 0xff;
/// `HINT` push opcode.
pub const OP_HINT: u8 = 0xf0;
/// `DIRTY_HINT` push opcode (large groups; only after `SUBSCRIBE_DIRTY`).
pub const OP_DIRTY_HINT: u8 = 0xf1;

fn decode_body<T: Field>(body: Bytes) -> Result<T, WireError> {
    let mut reader = Reader::new(body);
    let value = T::get(&mut reader)?;
    reader.finish()?;
    Ok(value)
}

fn encode_body<T: Field>(value: &T) -> Bytes {
    let mut out = BytesMut::new();
    value.put(&mut out);
    out.freeze()
}

macro_rules! ops {
    ($( $(#[$meta:meta])* $name:ident = $code:expr, $req:ty => $rep:ty, $text:expr; )*) => {
        /// A request opcode this build knows.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Op {
            $( $(#[$meta])* $name = $code, )*
        }

        impl Op {
            pub fn from_u8(code: u8) -> Option<Op> {
                match code {
                    $( $code => Some(Op::$name), )*
                    _ => None,
                }
            }
            /// The upper-case name used in docs, logs and metrics.
            pub fn name(self) -> &'static str {
                match self {
                    $( Op::$name => $text, )*
                }
            }
            pub const ALL: &'static [Op] = &[ $( Op::$name ),* ];
        }

        /// A decoded request body.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Request {
            $( $name($req), )*
        }

        impl Request {
            pub fn op(&self) -> Op {
                match self {
                    $( Request::$name(_) => Op::$name, )*
                }
            }

            /// Parses the body of a request frame. An opcode this build
            /// does not know is [`WireError::UnknownOpcode`]: the frame was
            /// well delimited, so the connection can answer and go on.
            pub fn decode(opcode: u8, body: Bytes) -> Result<Request, WireError> {
                match Op::from_u8(opcode) {
                    $( Some(Op::$name) => Ok(Request::$name(decode_body(body)?)), )*
                    None => Err(WireError::UnknownOpcode(opcode)),
                }
            }

            pub fn encode_body(&self) -> Bytes {
                match self {
                    $( Request::$name(body) => encode_body(body), )*
                }
            }

            pub fn to_frame(&self, request_id: u64) -> Frame {
                Frame { opcode: self.op() as u8, request_id, body: self.encode_body() }
            }
        }

        /// A decoded reply or push body.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Response {
            $( $name($rep), )*
            Error(ErrorReply),
            Hint(Hints),
            DirtyHint(DirtyHints),
        }

        impl Response {
            pub fn opcode(&self) -> u8 {
                match self {
                    $( Response::$name(_) => $code | REPLY_BIT, )*
                    Response::Error(_) => OP_ERROR,
                    Response::Hint(_) => OP_HINT,
                    Response::DirtyHint(_) => OP_DIRTY_HINT,
                }
            }

            /// Parses the body of a frame sent by a server.
            pub fn decode(opcode: u8, body: Bytes) -> Result<Response, WireError> {
                match opcode {
                    OP_ERROR => Ok(Response::Error(decode_body(body)?)),
                    OP_HINT => Ok(Response::Hint(decode_body(body)?)),
                    OP_DIRTY_HINT => Ok(Response::DirtyHint(decode_body(body)?)),
                    code if code & REPLY_BIT != 0 => match Op::from_u8(code & !REPLY_BIT) {
                        $( Some(Op::$name) => Ok(Response::$name(decode_body(body)?)), )*
                        None => Err(WireError::UnknownOpcode(opcode)),
                    },
                    _ => Err(WireError::UnknownOpcode(opcode)),
                }
            }

            pub fn encode_body(&self) -> Bytes {
                match self {
                    $( Response::$name(body) => encode_body(body), )*
                    Response::Error(body) => encode_body(body),
                    Response::Hint(body) => encode_body(body),
                    Response::DirtyHint(body) => encode_body(body),
                }
            }

            pub fn to_frame(&self, request_id: u64) -> Frame {
                Frame { opcode: self.opcode(), request_id, body: self.encode_body() }
            }
        }

        /// One random request and one random reply per opcode.
        #[cfg(test)]
        pub(crate) fn sample_all(
            g: &mut crate::field::sample::Gen,
        ) -> (Vec<Request>, Vec<Response>) {
            use crate::field::sample::Sample;
            let requests = vec![ $( Request::$name(<$req>::sample(g)), )* ];
            let responses = vec![
                $( Response::$name(<$rep>::sample(g)), )*
                Response::Error(ErrorReply::sample(g)),
                Response::Hint(Hints::sample(g)),
                Response::DirtyHint(DirtyHints::sample(g)),
            ];
            (requests, responses)
        }
    };
}

ops! {
    /// Version handshake and authentication; must be the first frame.
    Hello = 0x01, Hello => HelloOk, "HELLO";
    Ping = 0x02, Empty => Empty, "PING";
    Join = 0x10, ConvMember => MembershipReply, "JOIN";
    Leave = 0x11, ConvMember => MembershipReply, "LEAVE";
    Send = 0x12, SendReq => SendReply, "SEND";
    Recall = 0x13, RecallReq => SendReply, "RECALL";
    Edit = 0x14, EditReq => SendReply, "EDIT";
    RegisterDevice = 0x20, UserDevice => RegisterReply, "REGISTER_DEVICE";
    RevokeDevice = 0x21, UserDevice => DeviceInfo, "REVOKE_DEVICE";
    Devices = 0x22, UserReq => DeviceList, "DEVICES";
    Sync = 0x23, SyncReq => SyncPage, "SYNC";
    Ack = 0x24, AckReq => AckReply, "ACK";
    FinishLease = 0x25, FinishLeaseReq => DeviceInfo, "FINISH_LEASE";
    Pull = 0x30, PullReq => PullReply, "PULL";
    History = 0x31, HistoryReq => HistoryPage, "HISTORY";
    MarkRead = 0x32, MarkReadReq => ReadReply, "MARK_READ";
    SetConvFlags = 0x33, ConvFlagsReq => Empty, "SET_CONV_FLAGS";
    ConvList = 0x34, ConvListReq => ConvListPage, "CONV_LIST";
    /// A user's dirty large groups (R7).
    Dirty = 0x35, UserReq => DirtyList, "DIRTY";
    /// Clears a large group's marker if it is still at the observed version.
    ClearDirty = 0x36, ClearDirtyReq => ClearDirtyReply, "CLEAR_DIRTY";
    /// A conversation's mode, head and (optionally) one member's marker.
    ConvMode = 0x37, ConvModeReq => ConvMode, "CONV_MODE";
    BeginSnapshot = 0x40, UserDevice => SnapshotInfo, "BEGIN_SNAPSHOT";
    SnapshotInfo = 0x41, SnapshotRef => SnapshotInfo, "SNAPSHOT_INFO";
    SnapshotPage = 0x42, SnapshotPageReq => SnapshotPage, "SNAPSHOT_PAGE";
    AckSnapshot = 0x43, AckSnapshotReq => DeviceInfo, "ACK_SNAPSHOT";
    Subscribe = 0x50, UidList => Empty, "SUBSCRIBE";
    Unsubscribe = 0x51, UidList => Empty, "UNSUBSCRIBE";
    /// Also push `DIRTY_HINT` for these uids' large groups.
    SubscribeDirty = 0x52, UidList => Empty, "SUBSCRIBE_DIRTY";
    Stats = 0x60, Empty => Stats, "STATS";
    Explain = 0x61, UserReq => UserExplain, "EXPLAIN";
    ExplainSegment = 0x62, SegmentReq => SegmentExplain, "EXPLAIN_SEGMENT";
    Compact = 0x63, Empty => CompactionReport, "COMPACT";
    Checkpoint = 0x64, Empty => Empty, "CHECKPOINT";
    /// Bytes per in-memory structure, live and allocated.
    Memory = 0x65, Empty => MemoryReport, "MEMORY";
    /// This node's view of its replicated group; answered by every member.
    ClusterStatus = 0x66, Empty => ClusterStatus, "CLUSTER_STATUS";
    /// Makes a node a voter of the group (learner, catch-up, joint
    /// consensus); the leader answers with its view once it is done.
    ClusterAddNode = 0x67, AddNodeReq => ClusterStatus, "CLUSTER_ADD_NODE";
    /// Takes a member out of the group; the leader answers with its view
    /// once it is done.
    ClusterRemoveNode = 0x68, RemoveNodeReq => ClusterStatus, "CLUSTER_REMOVE_NODE";
}
