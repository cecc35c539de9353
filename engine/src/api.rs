//! Request and reply types of the embedded [`crate::Inbox`] API.
//!
//! The vocabulary is that of `docs/SEMANTICS.md`: `msg_seq` orders a conversation, `sync_seq`
//! orders a user's event stream, a device has a `generation` and an
//! `acked_sync_seq`. The daemon translates wire frames into exactly these
//! types and nothing more.

use bytes::Bytes;

/// Declares an identifier or sequence newtype over `u64`.
///
/// The types exist so that one kind of number cannot be passed where
/// another is expected (a user id where a conversation id belongs, a
/// `msg_seq` where a `sync_seq` belongs); the compiler catches the swap.
/// They are `#[repr(transparent)]`, encode as the bare `u64` and offer no
/// arithmetic beyond what sequences need ([`MsgSeq::next`] and friends).
macro_rules! id_type {
    ($($(#[$doc:meta])* $name:ident;)+) => {
        $(
            $(#[$doc])*
            #[repr(transparent)]
            #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
            pub struct $name(pub u64);

            impl $name {
                /// The raw number, as it goes on the wire and on disk.
                #[inline]
                pub const fn get(self) -> u64 {
                    self.0
                }
            }

            impl From<u64> for $name {
                #[inline]
                fn from(v: u64) -> Self {
                    $name(v)
                }
            }

            impl From<$name> for u64 {
                #[inline]
                fn from(v: $name) -> u64 {
                    v.0
                }
            }

            impl std::fmt::Display for $name {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    std::fmt::Display::fmt(&self.0, f)
                }
            }
        )+
    };
}

/// Declares the helpers of a position in a sequence.
macro_rules! seq_type {
    ($($name:ident),+) => {
        $(
            impl $name {
                /// The position after this one.
                #[inline]
                pub const fn next(self) -> Self {
                    $name(self.0 + 1)
                }
                /// The position before this one (saturating at 0).
                #[inline]
                pub const fn prev(self) -> Self {
                    $name(self.0.saturating_sub(1))
                }
                /// How many positions `self` is past `earlier`, or `None`
                /// if it is not.
                #[inline]
                pub const fn checked_since(self, earlier: Self) -> Option<u64> {
                    self.0.checked_sub(earlier.0)
                }
                /// How many positions `self` is past `earlier`, 0 if it is not.
                #[inline]
                pub const fn saturating_since(self, earlier: Self) -> u64 {
                    self.0.saturating_sub(earlier.0)
                }
                /// Every position from `self` to `last`, both included
                /// (empty if `last` is before `self`).
                #[inline]
                pub fn through(self, last: Self) -> impl DoubleEndedIterator<Item = Self> {
                    (self.0..=last.0).map($name)
                }
                /// The position `n` after this one.
                #[inline]
                pub const fn plus(self, n: u64) -> Self {
                    $name(self.0 + n)
                }
            }
        )+
    };
}

id_type! {
    /// A user.
    Uid;
    /// A conversation.
    ConvId;
    /// A device of a user.
    DeviceId;
    /// Server-assigned, unique across the store. The top
    /// [`MSG_ID_SHARD_BITS`] bits are reserved for a shard id (R3).
    MsgId;
    /// A position in a conversation.
    MsgSeq;
    /// A position in a user's event stream.
    SyncSeq;
    /// A device's generation: bumped when the device is put into recovery.
    Generation;
}

seq_type!(MsgSeq, SyncSeq, Generation);

/// Client-chosen idempotency key, unique per sender (a UUID fits).
pub type ClientMsgId = u128;
/// Milliseconds since the Unix epoch, as stamped by the sequencer.
pub type TimestampMs = u64;

pub const MSG_ID_SHARD_BITS: u32 = 10;

/// Application message type; opaque to the store except for the control
/// kinds the store itself writes (join, leave, recall, edit).
pub type MsgType = u16;

/// What a message in a conversation log is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// An ordinary message with a payload.
    Normal,
    /// A member joined; `target` is unused.
    Join,
    /// A member left; `target` is unused.
    Leave,
    /// Recall of `target`; the target becomes a tombstone.
    Recall,
    /// Edit of `target`; the payload is the new body.
    Edit,
}

/// One message as served by pull and history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub conv: ConvId,
    pub msg_seq: MsgSeq,
    pub msg_id: MsgId,
    pub sender: Uid,
    pub kind: MessageKind,
    pub msg_type: MsgType,
    /// For recall and edit: the message they refer to.
    pub target: Option<MsgId>,
    pub sent_at_ms: TimestampMs,
    /// True when this message was recalled: `payload` is then empty and the
    /// original body is never served again (R6, R13).
    pub tombstone: bool,
    pub payload: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendRequest {
    pub sender: Uid,
    pub conv: ConvId,
    pub client_msg_id: ClientMsgId,
    pub msg_type: MsgType,
    pub payload: Bytes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendReply {
    pub msg_id: MsgId,
    pub msg_seq: MsgSeq,
    /// True when `(sender, client_msg_id)` was seen before: the ids are the
    /// original message's and nothing new was written.
    pub duplicate: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallRequest {
    pub sender: Uid,
    pub conv: ConvId,
    pub client_msg_id: ClientMsgId,
    pub target: MsgId,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EditRequest {
    pub sender: Uid,
    pub conv: ConvId,
    pub client_msg_id: ClientMsgId,
    pub target: MsgId,
    pub payload: Bytes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MembershipReply {
    /// The `msg_seq` of the join or leave record in the conversation.
    pub msg_seq: MsgSeq,
    pub period_id: u32,
}

/// Kind of a user sync event. The space is open: a client must skip a kind
/// it does not know (`Unknown` carries the raw code).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Msg,
    Read,
    Recall,
    Edit,
    Conv,
    Member,
    Dirty,
    Unknown(u8),
}

/// One event of a user's sync stream: a reference plus a small summary,
/// never a message body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncEvent {
    pub sync_seq: SyncSeq,
    pub kind: EventKind,
    pub conv: ConvId,
    /// The conversation position the event refers to (the message, the read
    /// cursor, the join/leave record…).
    pub msg_seq: MsgSeq,
    pub msg_id: MsgId,
    pub at_ms: TimestampMs,
    /// A short inline summary (at most [`SUMMARY_BYTES_MAX`] bytes).
    pub summary: Bytes,
}

pub const SUMMARY_BYTES_MAX: usize = 64;

/// What a device may ask of a sync besides the request itself (on the
/// wire, `SYNC`'s optional fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncOptions {
    /// When a batch starts (no batch token) with more events than this
    /// between the device's cursor and the high-water mark, the answer is
    /// `RESET_REQUIRED` (the device installs a snapshot instead of
    /// replaying). `None`: no limit. 0 is refused: a limit is at least 1.
    pub max_replay: Option<u64>,
    /// The events carry no message summaries (`summary` empty): a device
    /// that fetches bodies with `PULL` anyway saves the bytes.
    pub without_summaries: bool,
    /// ACK through this `sync_seq` as [`crate::Inbox::ack`] would, with the
    /// request's generation and batch token (so only on a page after the
    /// first of a batch), without a request of its own: a device catching
    /// up ACKs each page as it asks for the next one. The page does not
    /// wait for the ACK: it is checked as the request arrives (an ACK
    /// `ACK` would refuse fails the sync with that error), made only if
    /// the page is served (a sync refused for a reason of its own makes
    /// none) and written with the next round, and the reply does not say
    /// it is durable. A device that needs that sends its last ACK on its
    /// own.
    pub ack_through: Option<SyncSeq>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncRequest {
    pub uid: Uid,
    pub device: DeviceId,
    /// The generation the device believes it is in; `None` after a
    /// reinstall.
    pub generation: Option<Generation>,
    /// The highest `sync_seq` the device has applied locally.
    pub local_applied_seq: SyncSeq,
    /// Page size; default 100, hard cap 500.
    pub limit: u32,
    /// Present on every page after the first of a batch.
    pub batch_token: Option<Bytes>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncPage {
    pub events: Vec<SyncEvent>,
    /// Where the next page starts (the last event's seq).
    pub next_cursor: SyncSeq,
    /// More events up to `batch_hwm` remain.
    pub has_more: bool,
    pub acked_sync_seq: SyncSeq,
    /// Fixed on the first page of a batch (R9).
    pub batch_hwm: SyncSeq,
    pub batch_token: Bytes,
    /// The device's generation; differs from the request when the device was
    /// put into recovery (R10).
    pub generation: Generation,
    /// Set when this batch is a recovery lease; finish it with
    /// `finish_lease`.
    pub lease: Option<LeaseInfo>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    pub lease_id: u64,
    pub resume_from: SyncSeq,
    pub hwm: SyncSeq,
    pub expires_at_ms: TimestampMs,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckRequest {
    pub uid: Uid,
    pub device: DeviceId,
    pub generation: Generation,
    pub seq: SyncSeq,
    pub batch_token: Bytes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckReply {
    /// The device's ACK after this call; an older ACK is a no-op that
    /// returns the current value (R11).
    pub acked_sync_seq: SyncSeq,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceState {
    Active,
    Recovering,
    Resetting,
    Revoked,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub device: DeviceId,
    pub generation: Generation,
    pub acked_sync_seq: SyncSeq,
    pub state: DeviceState,
    pub last_seen_ms: TimestampMs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterReply {
    pub device: DeviceInfo,
    /// The least recently seen device evicted by the device cap (R17).
    pub evicted: Option<DeviceId>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvPull {
    pub conv: ConvId,
    pub messages: Vec<Message>,
    pub has_more: bool,
    /// The conversation's current committed max `msg_seq`.
    pub max_seq: MsgSeq,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryPage {
    /// Newest first.
    pub messages: Vec<Message>,
    pub has_more: bool,
}

/// A member's dirty marker of a large group (R7): the group has entries
/// up to `target_msg_seq` inside the member's periods that the member has
/// not cleared. Clear it with `clear_dirty(version)` after pulling up to
/// the target; the version moves with every new entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirtyMarker {
    pub conv: ConvId,
    pub target_msg_seq: MsgSeq,
    pub version: u64,
}

/// A conversation's mode and head, for operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvMode {
    pub conv: ConvId,
    /// A large group: no per-member events above `switch_seq`.
    pub large: bool,
    pub switch_seq: Option<MsgSeq>,
    /// The durable head.
    pub head: MsgSeq,
    /// Current members.
    pub members: u64,
    pub marker: Option<MemberMarker>,
}

/// One member's marker as an operator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberMarker {
    pub uid: Uid,
    pub target_msg_seq: MsgSeq,
    pub version: u64,
    /// Where the member's position stands: its clear, or the last entry
    /// fanned out to it.
    pub cleared_seq: MsgSeq,
    pub dirty: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadReply {
    pub read_seq: MsgSeq,
    pub unread: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvSummary {
    pub conv: ConvId,
    pub last_msg_seq: MsgSeq,
    pub last_msg_id: MsgId,
    pub last_sender: Uid,
    pub last_summary: Bytes,
    pub unread: u32,
    pub read_seq: MsgSeq,
    pub last_activity_ms: TimestampMs,
    pub muted: bool,
    pub pinned: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvListPage {
    /// Ordered by last activity, newest first.
    pub convs: Vec<ConvSummary>,
    /// Pass back to get the next page; `None` at the end.
    pub next_cursor: Option<Bytes>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvFlags {
    pub muted: bool,
    pub pinned: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotState {
    Building,
    Ready,
    Installed,
    Expired,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub snapshot_id: u64,
    pub base_sync_seq: SyncSeq,
    pub generation: Generation,
    pub state: SnapshotState,
    pub pages: u32,
    /// SHA-256 over the snapshot's pages, set once READY.
    pub manifest_digest: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotPage {
    pub snapshot_id: u64,
    pub page: u32,
    pub pages: u32,
    pub convs: Vec<ConvSummary>,
    /// The last N messages of the conversations on this page (tombstones
    /// included, bodies of recalled messages never).
    pub messages: Vec<Message>,
    /// Messages of `messages` too large for any reply on their own
    /// (`conv`, `msg_seq`): their payload is cut to its summary.
    pub elided: Vec<(ConvId, MsgSeq)>,
}

/// What holds a user's events back from compaction (R19).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fence {
    DeviceAck {
        device: DeviceId,
        acked_sync_seq: SyncSeq,
    },
    RecoveryLease {
        device: DeviceId,
        lease_id: u64,
        resume_from: SyncSeq,
    },
    Snapshot {
        snapshot_id: u64,
        base_sync_seq: SyncSeq,
    },
    SafetyWindow {
        oldest_kept: SyncSeq,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserExplain {
    pub uid: Uid,
    pub oldest_retained: SyncSeq,
    pub committed_sync_seq: SyncSeq,
    pub floor: SyncSeq,
    /// Every fence, lowest first; the first is what holds the floor.
    pub fences: Vec<Fence>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentExplain {
    pub stream: String,
    pub segment: u32,
    pub bytes: u64,
    pub live_bytes: u64,
    pub live_records: u64,
    /// Human-readable reasons the live records are still held.
    pub held_by: Vec<String>,
}

/// Bytes one in-memory structure holds: its entries (`live`) and what is
/// allocated for them (capacity, allocation overhead; estimated from the
/// collections' layouts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    pub structure: String,
    pub live: u64,
    pub allocated: u64,
}

/// The engine's memory by structure ([`crate::Inbox::memory`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    pub structures: Vec<MemoryUse>,
    /// How long the walk took, and its longest hold of the state lock.
    pub walk_us: u64,
    pub longest_hold_us: u64,
}

impl MemoryReport {
    /// The figures of one structure, if reported.
    pub fn get(&self, structure: &str) -> Option<&MemoryUse> {
        self.structures.iter().find(|m| m.structure == structure)
    }
}

/// The structures of a [`MemoryReport`] kept in file pages, mapped: the
/// logs' sealed segments, and the message index's and the idempotency
/// table's pages in the scratch file. Page cache that the kernel may
/// drop, not anonymous memory: every other structure is on the heap.
pub const FILE_BACKED_STRUCTURES: [&str; 3] =
    ["log_mmaps", "message_metadata_file", "idempotency_file"];

/// True for a structure of [`FILE_BACKED_STRUCTURES`].
pub fn file_backed(structure: &str) -> bool {
    FILE_BACKED_STRUCTURES.contains(&structure)
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactionReport {
    pub events_reclaimed: u64,
    /// Messages reclaimed by history retention.
    pub messages_reclaimed: u64,
    pub bytes_reclaimed: u64,
    pub bytes_rewritten: u64,
    pub segments_dropped: u64,
    pub segments_rewritten: u64,
}

/// Counters and gauges for `stats` and the metrics endpoint (R26).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub users: u64,
    pub conversations: u64,
    pub devices: u64,
    /// Messages retained (history retention reclaims the oldest).
    pub messages: u64,
    pub events_live: u64,
    pub write_batches: u64,
    pub fsyncs: u64,
    pub fsync_latency_us_sum: u64,
    pub bytes_on_disk: u64,
    pub index_bytes: u64,
    pub compaction: CompactionReport,
    /// Rounds refused before any change because the disk had no room for
    /// the next segment (each failed its writes with `NoSpace`, or answered
    /// commands that wrote nothing).
    pub rounds_refused_for_space: u64,
    /// Times the state was reloaded from disk after the log refused a
    /// round for space that had already been applied. The room check
    /// before each round keeps this at zero unless another writer of the
    /// log took the prepared segment first.
    pub state_reloads_for_space: u64,
    /// Whether the write pipeline is held on one CPU now (light load;
    /// `crate::placement`).
    pub pipeline_on_one_cpu: bool,
}
