//! Typed request and reply bodies. Each struct encodes as its fields in
//! declaration order using the primitive encodings of [`crate::field`];
//! `docs/PROTOCOL.md` lists every layout.
//!
//! These mirror the engine's API types field for field, but this crate
//! does not depend on the engine: a client needs only the protocol.

use bytes::{BufMut, Bytes, BytesMut};

use crate::field::{put_prefixed, wire_enum, wire_struct, Field, Reader};
use crate::{ErrorCode, WireError};

/// The protocol version this build speaks. Version 2 added the limits to
/// `HELLO_OK` and a length to each `Fence`; version 3 added the remaining
/// limits to `HELLO_OK`, the leader's address to `ERROR` and the elided
/// messages to `SNAPSHOT_PAGE`. A server still serves older clients in
/// their layouts (see [`crate::v2`] and [`crate::v1`]).
pub const PROTOCOL_VERSION: u16 = 3;
/// The oldest protocol version a server of this build still serves.
pub const PROTOCOL_VERSION_MIN: u16 = 1;

wire_struct! {
    /// `HELLO`: the first frame on a connection. Combines the version
    /// handshake and authentication.
    pub struct Hello {
        pub version: u16,
        /// Free text for logs, e.g. "chat-api/2.3".
        pub client_name: String,
        /// The shared secret of the client service.
        #[cfg_attr(feature = "serde", serde(skip))]
        pub token: Bytes,
    }
}

wire_struct! {
    /// Reply to `HELLO`: the version the connection speaks and every limit
    /// a client must respect. A request over a limit is refused, never
    /// clamped.
    pub struct HelloOk {
        pub version: u16,
        pub server_name: String,
        /// Largest `frame_len` the server accepts.
        pub frame_bytes_max: u32,
        /// Requests the server reads ahead on one connection before it
        /// stops reading (backpressure).
        pub in_flight_max: u32,
        /// Largest `frame_len` of a reply; a larger reply is `TOO_LARGE`.
        pub reply_frame_bytes_max: u32,
        /// Largest `payload` of `SEND` and `EDIT`.
        pub payload_bytes_max: u32,
        /// Longest `summary` of an event or a conversation summary.
        pub summary_bytes_max: u32,
        /// `SYNC` page size when `limit` is 0, and the largest allowed.
        pub sync_page_default: u32,
        pub sync_page_max: u32,
        /// `PULL` messages per conversation when `per_conv_limit` is 0, and
        /// the largest allowed.
        pub pull_per_conv_default: u32,
        pub pull_per_conv_max: u32,
        /// Largest `limit` of `HISTORY` (0 means `pull_per_conv_default`).
        pub history_limit_max: u32,
        /// Largest `limit` of `CONV_LIST` (0 means `sync_page_default`).
        pub conv_list_limit_max: u32,
        /// Devices per user; registering one more evicts the least recently
        /// seen.
        pub devices_per_user_max: u32,
        /// Sustained requests per second on one connection, and the burst.
        pub rate_per_s: u32,
        pub rate_burst: u32,
        /// A connection idle this long is closed.
        pub idle_timeout_ms: u64,
        /// Lifetime of a `batch_token`, a recovery lease and a READY
        /// snapshot.
        pub batch_token_ttl_ms: u64,
        pub recovery_lease_ttl_ms: u64,
        pub snapshot_ttl_ms: u64,
        /// Connections the server holds at once; one more is refused with
        /// `UNAVAILABLE` on accept.
        pub max_connections: u32,
        /// Uids one connection may be subscribed to (`TOO_LARGE` past it),
        /// and subscriptions of all connections together (`RATE_LIMITED`
        /// past it).
        pub subscribe_uids_max: u32,
        pub subscriptions_max: u64,
        /// A conversation with more current members becomes a large group
        /// (0: never).
        pub large_group_members: u32,
        /// How long `(sender, client_msg_id)` names one request.
        pub idempotency_ttl_ms: u64,
    }
}

wire_struct! {
    /// A body with no fields.
    pub struct Empty {}
}

wire_struct! {
    /// `JOIN`, `LEAVE`.
    pub struct ConvMember {
        pub conv: u64,
        pub uid: u64,
    }
}

wire_struct! {
    pub struct MembershipReply {
        pub msg_seq: u64,
        pub period_id: u32,
    }
}

wire_struct! {
    pub struct SendReq {
        pub conv: u64,
        pub sender: u64,
        pub client_msg_id: u128,
        pub msg_type: u16,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::text_or_hex"))]
        pub payload: Bytes,
    }
}

wire_struct! {
    /// Reply to `SEND`, `RECALL` and `EDIT`.
    pub struct SendReply {
        pub msg_id: u64,
        pub msg_seq: u64,
        pub duplicate: bool,
    }
}

wire_struct! {
    pub struct RecallReq {
        pub conv: u64,
        pub sender: u64,
        pub client_msg_id: u128,
        pub target: u64,
    }
}

wire_struct! {
    pub struct EditReq {
        pub conv: u64,
        pub sender: u64,
        pub client_msg_id: u128,
        pub target: u64,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::text_or_hex"))]
        pub payload: Bytes,
    }
}

wire_struct! {
    /// `REGISTER_DEVICE`, `REVOKE_DEVICE`, `BEGIN_SNAPSHOT`.
    pub struct UserDevice {
        pub uid: u64,
        pub device: u64,
    }
}

wire_enum! {
    pub enum DeviceState {
        Active = 1,
        Recovering = 2,
        Resetting = 3,
        Revoked = 4,
    }
}

wire_struct! {
    pub struct DeviceInfo {
        pub device: u64,
        pub generation: u64,
        pub acked_sync_seq: u64,
        pub state: DeviceState,
        pub last_seen_ms: u64,
    }
}

wire_struct! {
    pub struct RegisterReply {
        pub device: DeviceInfo,
        pub evicted: Option<u64>,
    }
}

wire_struct! {
    /// `DEVICES`, `EXPLAIN`.
    pub struct UserReq {
        pub uid: u64,
    }
}

wire_struct! {
    pub struct DeviceList {
        pub devices: Vec<DeviceInfo>,
    }
}

/// `SYNC`. The six fixed fields, then the optional fields (PROTOCOL.md,
/// "Optional fields"): each `u8 tag` + `bytes value`, in ascending tag
/// order, each at most once, only those that are set. A request with none
/// is byte for byte the layout without them, so older clients are
/// unaffected; an unknown tag is refused, never skipped, so an option a
/// client relies on is never silently ignored.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SyncReq {
    pub uid: u64,
    pub device: u64,
    /// `None` after a reinstall.
    pub generation: Option<u64>,
    pub local_applied_seq: u64,
    /// 0 asks for the server's default page size.
    pub limit: u32,
    /// Present on every page after the first of a batch.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "crate::serde_text::opt_hex")
    )]
    pub batch_token: Option<Bytes>,
    /// Optional field 1 (value: `u64`): when a batch starts with more
    /// events than this to replay, answer `RESET_REQUIRED`. At least 1.
    pub max_replay: Option<u64>,
    /// Optional field 2 (value: empty; present = on): events without
    /// their summaries.
    pub without_summaries: bool,
    /// Optional field 3 (value: empty; present = on): events without a
    /// summary field at all, a known kind's body being its four ids
    /// ([`Event::Bare`]). Implies `without_summaries`.
    pub ids_only: bool,
    /// Optional field 4 (value: `u64`): ACK through this `sync_seq` with
    /// this request's generation and batch token, as `ACK` would, before
    /// the page is served; the page does not wait for it to be durable.
    pub ack_through: Option<u64>,
}

/// Tags of `SYNC`'s optional fields.
pub const SYNC_OPT_MAX_REPLAY: u8 = 1;
pub const SYNC_OPT_WITHOUT_SUMMARIES: u8 = 2;
pub const SYNC_OPT_IDS_ONLY: u8 = 3;
pub const SYNC_OPT_ACK_THROUGH: u8 = 4;

/// Appends a `u64` optional field: its tag, then its value.
fn put_opt_u64(out: &mut BytesMut, tag: u8, value: u64) {
    out.put_u8(tag);
    Bytes::copy_from_slice(&value.to_le_bytes()).put(out);
}

/// A `u64` optional field's value.
fn opt_u64(name: &str, value: &Bytes) -> Result<u64, WireError> {
    let bytes: [u8; 8] = value.as_ref().try_into().map_err(|_| {
        WireError::Malformed(format!("SYNC {name} is {} bytes, not a u64", value.len()))
    })?;
    Ok(u64::from_le_bytes(bytes))
}

impl Field for SyncReq {
    const MIN_BYTES: usize = 8 + 8 + 1 + 8 + 4 + 1;
    fn put(&self, out: &mut BytesMut) {
        self.uid.put(out);
        self.device.put(out);
        self.generation.put(out);
        self.local_applied_seq.put(out);
        self.limit.put(out);
        self.batch_token.put(out);
        if let Some(max) = self.max_replay {
            put_opt_u64(out, SYNC_OPT_MAX_REPLAY, max);
        }
        if self.without_summaries {
            out.put_u8(SYNC_OPT_WITHOUT_SUMMARIES);
            Bytes::new().put(out);
        }
        if self.ids_only {
            out.put_u8(SYNC_OPT_IDS_ONLY);
            Bytes::new().put(out);
        }
        if let Some(seq) = self.ack_through {
            put_opt_u64(out, SYNC_OPT_ACK_THROUGH, seq);
        }
    }
    fn get(r: &mut Reader) -> Result<Self, WireError> {
        let mut req = SyncReq {
            uid: u64::get(r)?,
            device: u64::get(r)?,
            generation: Option::<u64>::get(r)?,
            local_applied_seq: u64::get(r)?,
            limit: u32::get(r)?,
            batch_token: Option::<Bytes>::get(r)?,
            max_replay: None,
            without_summaries: false,
            ids_only: false,
            ack_through: None,
        };
        let mut last = 0u8;
        while r.remaining() > 0 {
            let tag = r.u8()?;
            if tag <= last {
                return Err(WireError::Malformed(format!(
                    "SYNC optional field {tag} after field {last}: tags must ascend, each once"
                )));
            }
            last = tag;
            let value = Bytes::get(r)?;
            match tag {
                SYNC_OPT_MAX_REPLAY => req.max_replay = Some(opt_u64("max_replay", &value)?),
                SYNC_OPT_WITHOUT_SUMMARIES if value.is_empty() => req.without_summaries = true,
                SYNC_OPT_WITHOUT_SUMMARIES => {
                    return Err(WireError::Malformed(
                        "SYNC without_summaries carries no value".into(),
                    ))
                }
                SYNC_OPT_IDS_ONLY if value.is_empty() => req.ids_only = true,
                SYNC_OPT_IDS_ONLY => {
                    return Err(WireError::Malformed(
                        "SYNC ids_only carries no value".into(),
                    ))
                }
                SYNC_OPT_ACK_THROUGH => req.ack_through = Some(opt_u64("ack_through", &value)?),
                other => {
                    return Err(WireError::Malformed(format!(
                        "SYNC optional field {other} is unknown to this server"
                    )))
                }
            }
        }
        Ok(req)
    }
}

#[cfg(test)]
impl crate::field::sample::Sample for SyncReq {
    fn sample(g: &mut crate::field::sample::Gen) -> Self {
        use crate::field::sample::Sample;
        Self {
            uid: Sample::sample(g),
            device: Sample::sample(g),
            generation: Sample::sample(g),
            local_applied_seq: Sample::sample(g),
            limit: Sample::sample(g),
            batch_token: Sample::sample(g),
            max_replay: Sample::sample(g),
            without_summaries: Sample::sample(g),
            ids_only: Sample::sample(g),
            ack_through: Sample::sample(g),
        }
    }
}

wire_enum! {
    /// The event kinds this build knows. Kinds are open: see [`Event`].
    pub enum EventKind {
        Msg = 1,
        Read = 2,
        Recall = 3,
        Edit = 4,
        Conv = 5,
        Member = 6,
        Dirty = 7,
    }
}

impl EventKind {
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::Msg,
            2 => Self::Read,
            3 => Self::Recall,
            4 => Self::Edit,
            5 => Self::Conv,
            6 => Self::Member,
            7 => Self::Dirty,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Msg => "msg",
            Self::Read => "read",
            Self::Recall => "recall",
            Self::Edit => "edit",
            Self::Conv => "conv",
            Self::Member => "member",
            Self::Dirty => "dirty",
        }
    }
}

wire_struct! {
    /// The body of an event of a known kind.
    pub struct EventRef {
        pub conv: u64,
        pub msg_seq: u64,
        pub msg_id: u64,
        pub at_ms: u64,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::text_or_hex"))]
        pub summary: Bytes,
    }
}

wire_struct! {
    /// The body of an event of a known kind in a page a device asked for
    /// `ids_only`: [`EventRef`] without its `summary` field.
    pub struct EventIds {
        pub conv: u64,
        pub msg_seq: u64,
        pub msg_id: u64,
        pub at_ms: u64,
    }
}

/// Bytes of an [`EventIds`] body: a known kind's body of exactly this
/// length has no summary field.
pub const EVENT_IDS_BYTES: usize = 32;

/// One user sync event, encoded type-length-value so that a client can
/// skip a kind it does not know and still ACK past it:
///
/// ```text
/// sync_seq u64 | kind u8 | body_len u32 | body (body_len bytes)
/// ```
///
/// For a known kind the body is an [`EventRef`] and must fill `body_len`
/// exactly, or, in a page asked for `ids_only`, an [`EventIds`]
/// (`body_len` = 32, no summary field); any other kind keeps its body as
/// raw bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(untagged))]
pub enum Event {
    Known {
        sync_seq: u64,
        kind: EventKind,
        #[cfg_attr(feature = "serde", serde(flatten))]
        body: EventRef,
    },
    /// A known kind without a summary field (a page asked for
    /// `ids_only`).
    Bare {
        sync_seq: u64,
        kind: EventKind,
        #[cfg_attr(feature = "serde", serde(flatten))]
        body: EventIds,
    },
    /// A kind this build does not know (never 1..=7).
    Unknown {
        sync_seq: u64,
        kind: u8,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::hex"))]
        body: Bytes,
    },
}

impl Event {
    pub fn sync_seq(&self) -> u64 {
        match self {
            Self::Known { sync_seq, .. }
            | Self::Bare { sync_seq, .. }
            | Self::Unknown { sync_seq, .. } => *sync_seq,
        }
    }
}

/// A known kind's event: its head, then its body as a length-prefixed
/// field.
fn put_known(out: &mut BytesMut, sync_seq: u64, kind: EventKind, body: &impl Field) {
    out.put_u64_le(sync_seq);
    out.put_u8(kind as u8);
    put_prefixed(out, |out| body.put(out));
}

/// A known kind's body, which must fill its `body_len` exactly.
fn whole_body<T: Field>(body: Bytes) -> Result<T, WireError> {
    let mut inner = Reader::new(body);
    let value = T::get(&mut inner)?;
    inner.finish()?;
    Ok(value)
}

impl Field for Event {
    const MIN_BYTES: usize = 8 + 1 + 4;
    fn put(&self, out: &mut BytesMut) {
        match self {
            Self::Known {
                sync_seq,
                kind,
                body,
            } => put_known(out, *sync_seq, *kind, body),
            Self::Bare {
                sync_seq,
                kind,
                body,
            } => put_known(out, *sync_seq, *kind, body),
            Self::Unknown {
                sync_seq,
                kind,
                body,
            } => {
                out.put_u64_le(*sync_seq);
                out.put_u8(*kind);
                body.put(out);
            }
        }
    }
    fn get(r: &mut Reader) -> Result<Self, WireError> {
        let sync_seq = r.u64()?;
        let code = r.u8()?;
        let body = Bytes::get(r)?;
        match EventKind::from_code(code) {
            Some(kind) if body.len() == EVENT_IDS_BYTES => Ok(Self::Bare {
                sync_seq,
                kind,
                body: whole_body(body)?,
            }),
            Some(kind) => Ok(Self::Known {
                sync_seq,
                kind,
                body: whole_body(body)?,
            }),
            None => Ok(Self::Unknown {
                sync_seq,
                kind: code,
                body,
            }),
        }
    }
}

wire_struct! {
    pub struct LeaseInfo {
        pub lease_id: u64,
        pub resume_from: u64,
        pub hwm: u64,
        pub expires_at_ms: u64,
    }
}

wire_struct! {
    pub struct SyncPage {
        pub events: Vec<Event>,
        pub next_cursor: u64,
        pub has_more: bool,
        pub acked_sync_seq: u64,
        pub batch_hwm: u64,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::hex"))]
        pub batch_token: Bytes,
        pub generation: u64,
        pub lease: Option<LeaseInfo>,
    }
}

wire_struct! {
    pub struct AckReq {
        pub uid: u64,
        pub device: u64,
        pub generation: u64,
        pub seq: u64,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::hex"))]
        pub batch_token: Bytes,
    }
}

wire_struct! {
    pub struct AckReply {
        pub acked_sync_seq: u64,
    }
}

wire_struct! {
    pub struct FinishLeaseReq {
        pub uid: u64,
        pub device: u64,
        pub lease_id: u64,
        pub generation: u64,
    }
}

wire_struct! {
    pub struct PullCursor {
        pub conv: u64,
        pub after_seq: u64,
    }
}

wire_struct! {
    pub struct PullReq {
        pub uid: u64,
        /// 0 asks for the server's default (50); the hard cap is 500.
        pub per_conv_limit: u32,
        pub cursors: Vec<PullCursor>,
    }
}

wire_enum! {
    pub enum MessageKind {
        Normal = 1,
        Join = 2,
        Leave = 3,
        Recall = 4,
        Edit = 5,
    }
}

wire_struct! {
    pub struct Message {
        pub conv: u64,
        pub msg_seq: u64,
        pub msg_id: u64,
        pub sender: u64,
        pub kind: MessageKind,
        pub msg_type: u16,
        pub target: Option<u64>,
        pub sent_at_ms: u64,
        /// Recalled: `payload` is empty and never served again.
        pub tombstone: bool,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::text_or_hex"))]
        pub payload: Bytes,
    }
}

wire_struct! {
    pub struct ConvPull {
        pub conv: u64,
        pub messages: Vec<Message>,
        pub has_more: bool,
        pub max_seq: u64,
    }
}

wire_struct! {
    pub struct PullReply {
        pub convs: Vec<ConvPull>,
    }
}

wire_struct! {
    pub struct HistoryReq {
        pub uid: u64,
        pub conv: u64,
        /// Exclusive; `None` pages from the head.
        pub before_seq: Option<u64>,
        pub limit: u32,
    }
}

wire_struct! {
    pub struct HistoryPage {
        /// Newest first.
        pub messages: Vec<Message>,
        pub has_more: bool,
    }
}

wire_struct! {
    pub struct MarkReadReq {
        pub uid: u64,
        pub conv: u64,
        pub read_to_seq: u64,
    }
}

wire_struct! {
    pub struct ReadReply {
        pub read_seq: u64,
        pub unread: u32,
    }
}

wire_struct! {
    pub struct ConvFlagsReq {
        pub uid: u64,
        pub conv: u64,
        pub muted: bool,
        pub pinned: bool,
    }
}

wire_struct! {
    pub struct ConvListReq {
        pub uid: u64,
        pub limit: u32,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::opt_hex"))]
        pub cursor: Option<Bytes>,
    }
}

wire_struct! {
    pub struct ConvSummary {
        pub conv: u64,
        pub last_msg_seq: u64,
        pub last_msg_id: u64,
        pub last_sender: u64,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::text_or_hex"))]
        pub last_summary: Bytes,
        pub unread: u32,
        pub read_seq: u64,
        pub last_activity_ms: u64,
        pub muted: bool,
        pub pinned: bool,
    }
}

wire_struct! {
    /// A large group's dirty marker (R7).
    pub struct DirtyMarker {
        pub conv: u64,
        pub target_msg_seq: u64,
        pub version: u64,
    }
}

wire_struct! {
    pub struct DirtyList {
        /// By conversation id.
        pub markers: Vec<DirtyMarker>,
    }
}

wire_struct! {
    pub struct ClearDirtyReq {
        pub uid: u64,
        pub conv: u64,
        /// The marker's version as the client observed it.
        pub version: u64,
    }
}

wire_struct! {
    pub struct ClearDirtyReply {
        pub cleared_seq: u64,
    }
}

wire_struct! {
    pub struct ConvModeReq {
        pub conv: u64,
        pub uid: Option<u64>,
    }
}

wire_struct! {
    pub struct MemberMarker {
        pub uid: u64,
        pub target_msg_seq: u64,
        pub version: u64,
        pub cleared_seq: u64,
        pub dirty: bool,
    }
}

wire_struct! {
    pub struct ConvMode {
        pub conv: u64,
        pub large: bool,
        pub switch_seq: Option<u64>,
        pub head: u64,
        pub members: u64,
        pub marker: Option<MemberMarker>,
    }
}

wire_struct! {
    pub struct ConvListPage {
        pub convs: Vec<ConvSummary>,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::opt_hex"))]
        pub next_cursor: Option<Bytes>,
    }
}

wire_enum! {
    pub enum SnapshotState {
        Building = 1,
        Ready = 2,
        Installed = 3,
        Expired = 4,
    }
}

wire_struct! {
    pub struct SnapshotInfo {
        pub snapshot_id: u64,
        pub base_sync_seq: u64,
        pub generation: u64,
        pub state: SnapshotState,
        pub pages: u32,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::hex"))]
        pub manifest_digest: [u8; 32],
    }
}

wire_struct! {
    pub struct SnapshotRef {
        pub uid: u64,
        pub snapshot_id: u64,
    }
}

wire_struct! {
    pub struct SnapshotPageReq {
        pub uid: u64,
        pub snapshot_id: u64,
        pub page: u32,
    }
}

wire_struct! {
    /// `SNAPSHOT_PAGE` reply: always fits `reply_frame_bytes_max`.
    pub struct SnapshotPage {
        pub snapshot_id: u64,
        pub page: u32,
        pub pages: u32,
        pub convs: Vec<ConvSummary>,
        pub messages: Vec<Message>,
        /// Messages of `messages` too large for any reply: their payload is
        /// cut to its summary (version 3).
        pub elided: Vec<MsgRef>,
    }
}

wire_struct! {
    /// A message named by its conversation and position.
    pub struct MsgRef {
        pub conv: u64,
        pub msg_seq: u64,
    }
}

wire_struct! {
    pub struct AckSnapshotReq {
        pub uid: u64,
        pub device: u64,
        pub snapshot_id: u64,
        pub generation: u64,
    }
}

wire_struct! {
    /// `SUBSCRIBE`, `UNSUBSCRIBE`.
    pub struct UidList {
        pub uids: Vec<u64>,
    }
}

wire_struct! {
    pub struct CompactionReport {
        pub events_reclaimed: u64,
        pub bytes_reclaimed: u64,
        pub bytes_rewritten: u64,
        pub segments_dropped: u64,
        pub segments_rewritten: u64,
    }
}

wire_struct! {
    pub struct Stats {
        pub users: u64,
        pub conversations: u64,
        pub devices: u64,
        pub messages: u64,
        pub events_live: u64,
        pub write_batches: u64,
        pub fsyncs: u64,
        pub fsync_latency_us_sum: u64,
        pub bytes_on_disk: u64,
        pub index_bytes: u64,
        pub compaction: CompactionReport,
    }
}

/// What holds a user's events back from compaction (R19). Like an
/// [`Event`], tag-length-value so that a client can skip a kind it does not
/// know:
///
/// ```text
/// tag u8 | body_len u32 | body (body_len bytes)
/// ```
///
/// For a known tag the body is exactly the variant's fields. (Protocol
/// version 1 had no `body_len`; see [`crate::v1`].)
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(tag = "fence", rename_all = "snake_case")
)]
pub enum Fence {
    /// Tag 1.
    DeviceAck { device: u64, acked_sync_seq: u64 },
    /// Tag 2.
    RecoveryLease {
        device: u64,
        lease_id: u64,
        resume_from: u64,
    },
    /// Tag 3.
    Snapshot {
        snapshot_id: u64,
        base_sync_seq: u64,
    },
    /// Tag 4.
    SafetyWindow { oldest_kept: u64 },
    /// A tag this build does not know (never 1..=4); its body is kept raw.
    Unknown {
        tag: u8,
        #[cfg_attr(feature = "serde", serde(serialize_with = "crate::serde_text::hex"))]
        body: Bytes,
    },
}

impl Fence {
    /// The tag byte.
    pub fn tag(&self) -> u8 {
        match self {
            Self::DeviceAck { .. } => 1,
            Self::RecoveryLease { .. } => 2,
            Self::Snapshot { .. } => 3,
            Self::SafetyWindow { .. } => 4,
            Self::Unknown { tag, .. } => *tag,
        }
    }

    /// The fields of the fence, without tag or length.
    pub(crate) fn put_fields(&self, out: &mut BytesMut) {
        match self {
            Self::DeviceAck {
                device,
                acked_sync_seq,
            } => {
                out.put_u64_le(*device);
                out.put_u64_le(*acked_sync_seq);
            }
            Self::RecoveryLease {
                device,
                lease_id,
                resume_from,
            } => {
                out.put_u64_le(*device);
                out.put_u64_le(*lease_id);
                out.put_u64_le(*resume_from);
            }
            Self::Snapshot {
                snapshot_id,
                base_sync_seq,
            } => {
                out.put_u64_le(*snapshot_id);
                out.put_u64_le(*base_sync_seq);
            }
            Self::SafetyWindow { oldest_kept } => out.put_u64_le(*oldest_kept),
            Self::Unknown { body, .. } => out.put_slice(body),
        }
    }

    /// The fields of a known tag, or `None` for a tag this build does not
    /// know.
    pub(crate) fn get_fields(tag: u8, r: &mut Reader) -> Result<Option<Self>, WireError> {
        Ok(Some(match tag {
            1 => Self::DeviceAck {
                device: r.u64()?,
                acked_sync_seq: r.u64()?,
            },
            2 => Self::RecoveryLease {
                device: r.u64()?,
                lease_id: r.u64()?,
                resume_from: r.u64()?,
            },
            3 => Self::Snapshot {
                snapshot_id: r.u64()?,
                base_sync_seq: r.u64()?,
            },
            4 => Self::SafetyWindow {
                oldest_kept: r.u64()?,
            },
            _ => return Ok(None),
        }))
    }
}

impl Field for Fence {
    const MIN_BYTES: usize = 1 + 4;
    fn put(&self, out: &mut BytesMut) {
        out.put_u8(self.tag());
        put_prefixed(out, |out| self.put_fields(out));
    }
    fn get(r: &mut Reader) -> Result<Self, WireError> {
        let tag = r.u8()?;
        let body = Bytes::get(r)?;
        let mut inner = Reader::new(body.clone());
        match Self::get_fields(tag, &mut inner)? {
            Some(fence) => {
                inner.finish()?;
                Ok(fence)
            }
            None => Ok(Self::Unknown { tag, body }),
        }
    }
}

wire_struct! {
    pub struct UserExplain {
        pub uid: u64,
        pub oldest_retained: u64,
        pub committed_sync_seq: u64,
        pub floor: u64,
        /// Lowest first; the first holds the floor.
        pub fences: Vec<Fence>,
    }
}

wire_struct! {
    /// One structure of `MEMORY`: its entries' bytes and what is allocated
    /// for them.
    pub struct MemoryUse {
        pub structure: String,
        pub live: u64,
        pub allocated: u64,
    }
}

wire_struct! {
    /// `MEMORY`: the daemon's memory by structure, with how long the walk
    /// took and its longest hold of the state lock.
    pub struct MemoryReport {
        pub walk_us: u64,
        pub longest_hold_us: u64,
        pub structures: Vec<MemoryUse>,
    }
}

wire_struct! {
    /// One member of a replicated group, as `CLUSTER_STATUS` reports it.
    pub struct ClusterMember {
        pub node_id: u64,
        pub raft_addr: String,
        pub client_addr: String,
        /// On the leader: the highest index this member is known to hold
        /// (its lag is `last_log_index` minus this); elsewhere absent.
        pub matched_index: Option<u64>,
    }
}

wire_struct! {
    /// `CLUSTER_STATUS`: this node's view of its replicated group. A single
    /// node (no group) answers `role` "single" with `node_id` 0 and no
    /// members.
    pub struct ClusterStatus {
        pub node_id: u64,
        /// "single", "leader", "follower", "candidate", "learner" or
        /// "shutdown".
        pub role: String,
        pub term: u64,
        pub leader: Option<u64>,
        pub last_log_index: u64,
        pub last_applied_index: u64,
        /// On the leader: milliseconds since a quorum last acknowledged it.
        pub millis_since_quorum_ack: Option<u64>,
        pub members: Vec<ClusterMember>,
    }
}

wire_struct! {
    /// `CLUSTER_ADD_NODE`: the node to make a voter of the group, and
    /// where it is reached: its raft port (by the other members) and its
    /// client port (what `NOT_LEADER` names when it leads).
    pub struct AddNodeReq {
        pub node_id: u64,
        pub raft_addr: String,
        pub client_addr: String,
    }
}

wire_struct! {
    /// `CLUSTER_REMOVE_NODE`: the member to take out of the group.
    pub struct RemoveNodeReq {
        pub node_id: u64,
    }
}

wire_struct! {
    pub struct SegmentReq {
        pub stream: String,
        pub segment: u32,
    }
}

wire_struct! {
    pub struct SegmentExplain {
        pub stream: String,
        pub segment: u32,
        pub bytes: u64,
        pub live_bytes: u64,
        pub live_records: u64,
        pub held_by: Vec<String>,
    }
}

wire_struct! {
    /// `ERROR`: the reply to any request that failed.
    pub struct ErrorReply {
        pub code: ErrorCode,
        /// Code-specific: retry-after in ms for `RATE_LIMITED`, the current
        /// generation for `STALE_GENERATION` and `RESET_REQUIRED`, the limit
        /// for `TOO_LARGE`, the batch hwm for `ACK_BEYOND_HWM`; else 0.
        pub detail: u64,
        /// For humans; never parse it.
        pub message: String,
        /// `NOT_LEADER`: the leader's client address (`HOST:PORT`) when it
        /// is known; absent for every other code (version 3).
        pub leader_addr: Option<String>,
    }
}

impl ErrorReply {
    /// An error without a leader address.
    pub fn new(code: ErrorCode, detail: u64, message: impl Into<String>) -> Self {
        Self {
            code,
            detail,
            message: message.into(),
            leader_addr: None,
        }
    }
}

wire_struct! {
    pub struct Hint {
        pub uid: u64,
        pub committed_sync_seq: u64,
    }
}

wire_struct! {
    /// `HINT` (server push, request id 0).
    pub struct Hints {
        pub hints: Vec<Hint>,
    }
}

wire_struct! {
    /// A large group's marker moved for a member: what `DIRTY` would list
    /// for that conversation now.
    pub struct DirtyHint {
        pub uid: u64,
        pub conv: u64,
        pub target_msg_seq: u64,
        pub version: u64,
    }
}

wire_struct! {
    /// `DIRTY_HINT` (server push, request id 0), after `SUBSCRIBE_DIRTY`.
    pub struct DirtyHints {
        pub hints: Vec<DirtyHint>,
    }
}

#[cfg(test)]
mod sample_impls {
    use super::*;
    use crate::field::sample::{Gen, Sample};

    impl Sample for Event {
        fn sample(g: &mut Gen) -> Self {
            let sync_seq = u64::sample(g);
            if g.below(4) == 0 {
                Event::Unknown {
                    sync_seq,
                    kind: 8 + (g.next() % 248) as u8,
                    body: Bytes::sample(g),
                }
            } else if g.below(3) == 0 {
                Event::Bare {
                    sync_seq,
                    kind: EventKind::sample(g),
                    body: EventIds::sample(g),
                }
            } else {
                Event::Known {
                    sync_seq,
                    kind: EventKind::sample(g),
                    body: EventRef::sample(g),
                }
            }
        }
    }

    impl Sample for Fence {
        fn sample(g: &mut Gen) -> Self {
            match g.below(5) {
                4 => Fence::Unknown {
                    tag: 5 + (g.next() % 251) as u8,
                    body: Bytes::sample(g),
                },
                0 => Fence::DeviceAck {
                    device: g.next(),
                    acked_sync_seq: g.next(),
                },
                1 => Fence::RecoveryLease {
                    device: g.next(),
                    lease_id: g.next(),
                    resume_from: g.next(),
                },
                2 => Fence::Snapshot {
                    snapshot_id: g.next(),
                    base_sync_seq: g.next(),
                },
                _ => Fence::SafetyWindow {
                    oldest_kept: g.next(),
                },
            }
        }
    }

    impl Sample for ErrorCode {
        fn sample(g: &mut Gen) -> Self {
            // Known codes, and unknown ones above the known range.
            ErrorCode::from_u16((g.next() % 40) as u16)
        }
    }
}
