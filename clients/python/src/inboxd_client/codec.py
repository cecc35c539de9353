"""The inboxd wire format (docs/PROTOCOL.md), with no IO.

Frames are ``frame_len u32 LE | opcode u8 | request_id u64 LE | body``.
Bodies are fields in order, little-endian, no padding; decoding is strict
(a short body, a bad tag or trailing bytes raise :class:`ProtocolError`).

Each body is a frozen dataclass; ``encode_body`` / ``decode_body`` turn one
into bytes and back using the layout registered for its class.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, fields
from typing import Any, Callable, Generic, TypeVar

from .errors import ProtocolError

PROTOCOL_VERSION = 3
HEADER_BYTES = 9  # opcode + request_id, counted in frame_len
REPLY_BIT = 0x80
OP_ERROR = 0xFF
OP_HINT = 0xF0
OP_DIRTY_HINT = 0xF1

T = TypeVar("T")


class Reader:
    """A cursor over one body; every read checks the bytes left first."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._at = 0

    def take(self, n: int) -> bytes:
        if len(self._data) - self._at < n:
            raise ProtocolError(f"body ends early: need {n} bytes, {len(self._data) - self._at} left")
        out = bytes(self._data[self._at : self._at + n])
        self._at += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def remaining(self) -> int:
        return len(self._data) - self._at

    def peek(self) -> int:
        return self._data[self._at]

    def finish(self) -> None:
        if self._at != len(self._data):
            raise ProtocolError(f"{len(self._data) - self._at} trailing bytes after the body")


# --- field types: each is (put(value) -> bytes, get(Reader) -> value) -----


class Codec(Generic[T]):
    def __init__(self, put: Callable[[T], bytes], get: Callable[[Reader], T]) -> None:
        self.put = put
        self.get = get


def _int(fmt: str) -> Codec[int]:
    return Codec(lambda v: struct.pack("<" + fmt, v), lambda r: r.unpack(fmt))


U8, U16, U32, U64 = _int("B"), _int("H"), _int("I"), _int("Q")
U128: Codec[int] = Codec(
    lambda v: struct.pack("<QQ", v & (2**64 - 1), v >> 64),
    lambda r: r.unpack("Q") | (r.unpack("Q") << 64),
)


def _get_bool(r: Reader) -> bool:
    b = r.unpack("B")
    if b > 1:
        raise ProtocolError(f"bool byte {b}")
    return b == 1


BOOL: Codec[bool] = Codec(lambda v: b"\x01" if v else b"\x00", _get_bool)


def _get_bytes(r: Reader) -> bytes:
    return r.take(r.unpack("I"))


BYTES: Codec[bytes] = Codec(lambda v: struct.pack("<I", len(v)) + bytes(v), _get_bytes)


def _get_str(r: Reader) -> str:
    try:
        return _get_bytes(r).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"string is not UTF-8: {e}") from None


STRING: Codec[str] = Codec(lambda v: BYTES.put(v.encode("utf-8")), _get_str)
DIGEST32: Codec[bytes] = Codec(lambda v: bytes(v), lambda r: r.take(32))


def option(inner: Codec[T]) -> Codec[T | None]:
    def get(r: Reader) -> T | None:
        tag = r.unpack("B")
        if tag == 0:
            return None
        if tag == 1:
            return inner.get(r)
        raise ProtocolError(f"option tag {tag}")

    return Codec(lambda v: b"\x00" if v is None else b"\x01" + inner.put(v), get)


def optional_field(tag: int, inner: Codec[T]) -> Codec[T | None]:
    """One of a request's optional fields (PROTOCOL.md, "Optional
    fields"): ``u8 tag`` + ``bytes value`` when set, nothing when ``None``.
    Declare them last, in ascending tag order."""

    def put(v: T | None) -> bytes:
        return b"" if v is None else struct.pack("<B", tag) + BYTES.put(inner.put(v))

    def get(r: Reader) -> T | None:
        if r.remaining() == 0 or r.peek() != tag:
            return None
        r.take(1)
        value = Reader(_get_bytes(r))
        out = inner.get(value)
        value.finish()
        return out

    return Codec(put, get)


def optional_flag(tag: int) -> Codec[bool]:
    """An optional field with no value: present means on."""
    empty: Codec[bool] = Codec(lambda v: b"", lambda r: True)
    field = optional_field(tag, empty)
    return Codec(lambda v: field.put(True if v else None), lambda r: field.get(r) is True)


def list_of(inner: Codec[T]) -> Codec[list[T]]:
    def get(r: Reader) -> list[T]:
        return [inner.get(r) for _ in range(r.unpack("I"))]

    return Codec(lambda v: struct.pack("<I", len(v)) + b"".join(inner.put(x) for x in v), get)


E = TypeVar("E", bound=enum.IntEnum)


def enum_of(cls: type[E]) -> Codec[E]:
    def get(r: Reader) -> E:
        code = r.unpack("B")
        try:
            return cls(code)
        except ValueError:
            raise ProtocolError(f"{cls.__name__} code {code} is unknown") from None

    return Codec(lambda v: struct.pack("<B", int(v)), get)


_LAYOUTS: dict[type, list[tuple[str, Codec[Any]]]] = {}


def layout(*codecs: Codec[Any]) -> Callable[[type[T]], type[T]]:
    """Class decorator: the wire layout of a dataclass, one codec per field
    in declaration order."""

    def register(cls: type[T]) -> type[T]:
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        assert len(names) == len(codecs), cls
        _LAYOUTS[cls] = list(zip(names, codecs))
        return cls

    return register


def struct_of(cls: type[T]) -> Codec[T]:
    def put(v: T) -> bytes:
        return b"".join(c.put(getattr(v, n)) for n, c in _LAYOUTS[cls])

    def get(r: Reader) -> T:
        return cls(**{n: c.get(r) for n, c in _LAYOUTS[cls]})

    return Codec(put, get)


def encode_body(value: Any) -> bytes:
    return struct_of(type(value)).put(value)


def decode_body(cls: type[T], body: bytes) -> T:
    r = Reader(body)
    value = struct_of(cls).get(r)
    r.finish()
    return value


# --- enums -------------------------------------------------------------------


class DeviceState(enum.IntEnum):
    ACTIVE = 1
    RECOVERING = 2
    RESETTING = 3
    REVOKED = 4


class MessageKind(enum.IntEnum):
    NORMAL = 1
    JOIN = 2
    LEAVE = 3
    RECALL = 4
    EDIT = 5


class SnapshotState(enum.IntEnum):
    BUILDING = 1
    READY = 2
    INSTALLED = 3
    EXPIRED = 4


class EventKind(enum.IntEnum):
    MSG = 1
    READ = 2
    RECALL = 3
    EDIT = 4
    CONV = 5
    MEMBER = 6
    DIRTY = 7


# --- bodies (PROTOCOL.md section 4) ------------------------------------------


@layout(U16, STRING, BYTES)
@dataclass(frozen=True)
class Hello:
    version: int
    client_name: str
    token: bytes


@layout(
    U16, STRING, U32, U32, U32, U32, U32, U32, U32, U32, U32, U32, U32, U32, U32, U32,
    U64, U64, U64, U64, U32, U32, U64, U32, U64,
)
@dataclass(frozen=True)
class HelloOk:
    version: int
    server_name: str
    frame_bytes_max: int
    in_flight_max: int
    reply_frame_bytes_max: int
    payload_bytes_max: int
    summary_bytes_max: int
    sync_page_default: int
    sync_page_max: int
    pull_per_conv_default: int
    pull_per_conv_max: int
    history_limit_max: int
    conv_list_limit_max: int
    devices_per_user_max: int
    rate_per_s: int
    rate_burst: int
    idle_timeout_ms: int
    batch_token_ttl_ms: int
    recovery_lease_ttl_ms: int
    snapshot_ttl_ms: int
    max_connections: int
    subscribe_uids_max: int
    subscriptions_max: int
    large_group_members: int
    idempotency_ttl_ms: int


@layout()
@dataclass(frozen=True)
class Empty:
    pass


@layout(U64, U64)
@dataclass(frozen=True)
class ConvMember:
    conv: int
    uid: int


@layout(U64, U32)
@dataclass(frozen=True)
class MembershipReply:
    msg_seq: int
    period_id: int


@layout(U64, U64, U128, U16, BYTES)
@dataclass(frozen=True)
class SendReq:
    conv: int
    sender: int
    client_msg_id: int
    msg_type: int
    payload: bytes


@layout(U64, U64, BOOL)
@dataclass(frozen=True)
class SendReply:
    msg_id: int
    msg_seq: int
    duplicate: bool


@layout(U64, U64, U128, U64)
@dataclass(frozen=True)
class RecallReq:
    conv: int
    sender: int
    client_msg_id: int
    target: int


@layout(U64, U64, U128, U64, BYTES)
@dataclass(frozen=True)
class EditReq:
    conv: int
    sender: int
    client_msg_id: int
    target: int
    payload: bytes


@layout(U64, U64)
@dataclass(frozen=True)
class UserDevice:
    uid: int
    device: int


@layout(U64, U64, U64, enum_of(DeviceState), U64)
@dataclass(frozen=True)
class DeviceInfo:
    device: int
    generation: int
    acked_sync_seq: int
    state: DeviceState
    last_seen_ms: int


@layout(struct_of(DeviceInfo), option(U64))
@dataclass(frozen=True)
class RegisterReply:
    device: DeviceInfo
    evicted: int | None


@layout(U64)
@dataclass(frozen=True)
class UserReq:
    uid: int


@layout(list_of(struct_of(DeviceInfo)))
@dataclass(frozen=True)
class DeviceList:
    devices: list[DeviceInfo]


SYNC_OPT_MAX_REPLAY = 1
SYNC_OPT_WITHOUT_SUMMARIES = 2
SYNC_OPT_IDS_ONLY = 3
SYNC_OPT_ACK_THROUGH = 4


@layout(
    U64,
    U64,
    option(U64),
    U64,
    U32,
    option(BYTES),
    optional_field(SYNC_OPT_MAX_REPLAY, U64),
    optional_flag(SYNC_OPT_WITHOUT_SUMMARIES),
    optional_flag(SYNC_OPT_IDS_ONLY),
    optional_field(SYNC_OPT_ACK_THROUGH, U64),
)
@dataclass(frozen=True)
class SyncReq:
    """``max_replay``: when a batch starts with more events than this to
    replay, the server answers RESET_REQUIRED (at least 1; ``None`` = no
    limit). ``without_summaries``: events come with empty summaries.
    ``ids_only``: events come without a summary field at all (``Event.bare``).
    ``ack_through``: ACK through this sync_seq with this request's generation
    and batch token, not waited for (a page after the first of a batch)."""

    uid: int
    device: int
    generation: int | None
    local_applied_seq: int
    limit: int
    batch_token: bytes | None
    max_replay: int | None = None
    without_summaries: bool = False
    ids_only: bool = False
    ack_through: int | None = None


@dataclass(frozen=True)
class Event:
    """A sync event. ``known`` is False for a kind this client does not know:
    then only ``sync_seq``, ``kind`` and ``raw`` are meaningful. ``bare`` is
    True for a known kind sent without its summary field (a page asked for
    ``ids_only``): its body is the four ids only."""

    sync_seq: int
    kind: int
    conv: int = 0
    msg_seq: int = 0
    msg_id: int = 0
    at_ms: int = 0
    summary: bytes = b""
    known: bool = True
    raw: bytes = b""
    bare: bool = False


# A known kind's body of exactly this many bytes has no summary field.
EVENT_IDS_BYTES = 32


def _put_event(e: Event) -> bytes:
    if e.known and e.bare:
        body = struct.pack("<QQQQ", e.conv, e.msg_seq, e.msg_id, e.at_ms)
    elif e.known:
        body = struct.pack("<QQQQ", e.conv, e.msg_seq, e.msg_id, e.at_ms) + BYTES.put(e.summary)
    else:
        body = e.raw
    return struct.pack("<QB", e.sync_seq, e.kind) + BYTES.put(body)


def _get_event(r: Reader) -> Event:
    sync_seq = r.unpack("Q")
    kind = r.unpack("B")
    body = _get_bytes(r)
    if kind not in EventKind._value2member_map_:
        return Event(sync_seq=sync_seq, kind=kind, known=False, raw=body)
    inner = Reader(body)
    conv, msg_seq, msg_id, at_ms = (inner.unpack("Q") for _ in range(4))
    bare = len(body) == EVENT_IDS_BYTES
    summary = b"" if bare else _get_bytes(inner)
    inner.finish()
    return Event(sync_seq, EventKind(kind), conv, msg_seq, msg_id, at_ms, summary, bare=bare)


EVENT: Codec[Event] = Codec(_put_event, _get_event)


@layout(U64, U64, U64, U64)
@dataclass(frozen=True)
class LeaseInfo:
    lease_id: int
    resume_from: int
    hwm: int
    expires_at_ms: int


@layout(list_of(EVENT), U64, BOOL, U64, U64, BYTES, U64, option(struct_of(LeaseInfo)))
@dataclass(frozen=True)
class SyncPage:
    events: list[Event]
    next_cursor: int
    has_more: bool
    acked_sync_seq: int
    batch_hwm: int
    batch_token: bytes
    generation: int
    lease: LeaseInfo | None


@layout(U64, U64, U64, U64, BYTES)
@dataclass(frozen=True)
class AckReq:
    uid: int
    device: int
    generation: int
    seq: int
    batch_token: bytes


@layout(U64)
@dataclass(frozen=True)
class AckReply:
    acked_sync_seq: int


@layout(U64, U64, U64, U64)
@dataclass(frozen=True)
class FinishLeaseReq:
    uid: int
    device: int
    lease_id: int
    generation: int


@layout(U64, U64)
@dataclass(frozen=True)
class Cursor:
    conv: int
    after_seq: int


@layout(U64, U32, list_of(struct_of(Cursor)))
@dataclass(frozen=True)
class PullReq:
    uid: int
    per_conv_limit: int
    cursors: list[Cursor]


@layout(U64, U64, U64, U64, enum_of(MessageKind), U16, option(U64), U64, BOOL, BYTES)
@dataclass(frozen=True)
class Message:
    conv: int
    msg_seq: int
    msg_id: int
    sender: int
    kind: MessageKind
    msg_type: int
    target: int | None
    sent_at_ms: int
    tombstone: bool
    payload: bytes


@layout(U64, list_of(struct_of(Message)), BOOL, U64)
@dataclass(frozen=True)
class ConvPull:
    conv: int
    messages: list[Message]
    has_more: bool
    max_seq: int


@layout(list_of(struct_of(ConvPull)))
@dataclass(frozen=True)
class PullReply:
    convs: list[ConvPull]


@layout(U64, U64, option(U64), U32)
@dataclass(frozen=True)
class HistoryReq:
    uid: int
    conv: int
    before_seq: int | None
    limit: int


@layout(list_of(struct_of(Message)), BOOL)
@dataclass(frozen=True)
class HistoryPage:
    messages: list[Message]
    has_more: bool


@layout(U64, U64, U64)
@dataclass(frozen=True)
class MarkReadReq:
    uid: int
    conv: int
    read_to_seq: int


@layout(U64, U32)
@dataclass(frozen=True)
class ReadReply:
    read_seq: int
    unread: int


@layout(U64, U64, BOOL, BOOL)
@dataclass(frozen=True)
class ConvFlagsReq:
    uid: int
    conv: int
    muted: bool
    pinned: bool


@layout(U64, U32, option(BYTES))
@dataclass(frozen=True)
class ConvListReq:
    uid: int
    limit: int
    cursor: bytes | None


@layout(U64, U64, U64, U64, BYTES, U32, U64, U64, BOOL, BOOL)
@dataclass(frozen=True)
class ConvSummary:
    conv: int
    last_msg_seq: int
    last_msg_id: int
    last_sender: int
    last_summary: bytes
    unread: int
    read_seq: int
    last_activity_ms: int
    muted: bool
    pinned: bool


@layout(list_of(struct_of(ConvSummary)), option(BYTES))
@dataclass(frozen=True)
class ConvListPage:
    convs: list[ConvSummary]
    next_cursor: bytes | None


@layout(U64, U64, U64)
@dataclass(frozen=True)
class DirtyMarker:
    """A large group's dirty marker: pull up to ``target_msg_seq``, then
    clear ``version``."""

    conv: int
    target_msg_seq: int
    version: int


@layout(list_of(struct_of(DirtyMarker)))
@dataclass(frozen=True)
class DirtyList:
    markers: list[DirtyMarker]


@layout(U64, U64, U64)
@dataclass(frozen=True)
class ClearDirtyReq:
    uid: int
    conv: int
    version: int


@layout(U64)
@dataclass(frozen=True)
class ClearDirtyReply:
    cleared_seq: int


@layout(U64, option(U64))
@dataclass(frozen=True)
class ConvModeReq:
    conv: int
    uid: int | None


@layout(U64, U64, U64, U64, BOOL)
@dataclass(frozen=True)
class MemberMarker:
    uid: int
    target_msg_seq: int
    version: int
    cleared_seq: int
    dirty: bool


@layout(U64, BOOL, option(U64), U64, U64, option(struct_of(MemberMarker)))
@dataclass(frozen=True)
class ConvMode:
    conv: int
    large: bool
    switch_seq: int | None
    head: int
    members: int
    marker: MemberMarker | None


@layout(U64, U64, U64, enum_of(SnapshotState), U32, DIGEST32)
@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: int
    base_sync_seq: int
    generation: int
    state: SnapshotState
    pages: int
    manifest_digest: bytes


@layout(U64, U64)
@dataclass(frozen=True)
class SnapshotRef:
    uid: int
    snapshot_id: int


@layout(U64, U64, U32)
@dataclass(frozen=True)
class SnapshotPageReq:
    uid: int
    snapshot_id: int
    page: int


@layout(U64, U64)
@dataclass(frozen=True)
class MsgRef:
    conv: int
    msg_seq: int


@layout(
    U64, U32, U32, list_of(struct_of(ConvSummary)), list_of(struct_of(Message)), list_of(struct_of(MsgRef))
)
@dataclass(frozen=True)
class SnapshotPage:
    """A snapshot page; ``elided`` names the messages too large for any
    reply, carried with their payload cut to the summary."""

    snapshot_id: int
    page: int
    pages: int
    convs: list[ConvSummary]
    messages: list[Message]
    elided: list[MsgRef]


@layout(U64, U64, U64, U64)
@dataclass(frozen=True)
class AckSnapshotReq:
    uid: int
    device: int
    snapshot_id: int
    generation: int


@layout(list_of(U64))
@dataclass(frozen=True)
class UidList:
    uids: list[int]


@layout(U64, U64, U64, U64, U64)
@dataclass(frozen=True)
class CompactionReport:
    events_reclaimed: int
    bytes_reclaimed: int
    bytes_rewritten: int
    segments_dropped: int
    segments_rewritten: int


@layout(*([U64] * 10), struct_of(CompactionReport))
@dataclass(frozen=True)
class Stats:
    users: int
    conversations: int
    devices: int
    messages: int
    events_live: int
    write_batches: int
    fsyncs: int
    fsync_latency_us_sum: int
    bytes_on_disk: int
    index_bytes: int
    compaction: CompactionReport


@dataclass(frozen=True)
class Fence:
    """What holds a user's events back (PROTOCOL.md 4.5). ``tag``: 1 device
    ACK, 2 recovery lease, 3 snapshot, 4 safety window; ``values`` are the
    fields in wire order. A tag this client does not know keeps its body in
    ``raw`` (``known`` False)."""

    tag: int
    values: tuple[int, ...] = ()
    known: bool = True
    raw: bytes = b""

    FIELDS = {
        1: ("device", "acked_sync_seq"),
        2: ("device", "lease_id", "resume_from"),
        3: ("snapshot_id", "base_sync_seq"),
        4: ("oldest_kept",),
    }

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.FIELDS.get(self.tag, ()), self.values))


def _put_fence(f: Fence) -> bytes:
    body = f.raw if not f.known else b"".join(struct.pack("<Q", v) for v in f.values)
    return struct.pack("<B", f.tag) + BYTES.put(body)


def _get_fence(r: Reader) -> Fence:
    tag = r.unpack("B")
    body = _get_bytes(r)
    names = Fence.FIELDS.get(tag)
    if names is None:
        return Fence(tag=tag, known=False, raw=body)
    inner = Reader(body)
    values = tuple(inner.unpack("Q") for _ in names)
    inner.finish()
    return Fence(tag=tag, values=values)


FENCE: Codec[Fence] = Codec(_put_fence, _get_fence)


@layout(U64, U64, U64, U64, list_of(FENCE))
@dataclass(frozen=True)
class UserExplain:
    uid: int
    oldest_retained: int
    committed_sync_seq: int
    floor: int
    fences: list[Fence]


@layout(STRING, U32)
@dataclass(frozen=True)
class SegmentReq:
    stream: str
    segment: int


@layout(STRING, U32, U64, U64, U64, list_of(STRING))
@dataclass(frozen=True)
class SegmentExplain:
    stream: str
    segment: int
    bytes: int
    live_bytes: int
    live_records: int
    held_by: list[str]


@layout(STRING, U64, U64)
@dataclass(frozen=True)
class MemoryUse:
    """One structure's bytes: its entries (``live``) and what is allocated
    for them (capacity and overhead)."""

    structure: str
    live: int
    allocated: int


@layout(U64, U64, list_of(struct_of(MemoryUse)))
@dataclass(frozen=True)
class MemoryReport:
    walk_us: int
    longest_hold_us: int
    structures: list[MemoryUse]

    def get(self, structure: str) -> MemoryUse | None:
        return next((m for m in self.structures if m.structure == structure), None)


@layout(U64, STRING, STRING, option(U64))
@dataclass(frozen=True)
class ClusterMember:
    """One member of a replicated group. ``matched_index`` is set on the
    leader only: the highest index the member is known to hold."""

    node_id: int
    raft_addr: str
    client_addr: str
    matched_index: int | None


@layout(U64, STRING, U64, option(U64), U64, U64, option(U64), list_of(struct_of(ClusterMember)))
@dataclass(frozen=True)
class ClusterStatus:
    """A node's view of its group; a daemon without one answers role
    ``single``."""

    node_id: int
    role: str
    term: int
    leader: int | None
    last_log_index: int
    last_applied_index: int
    millis_since_quorum_ack: int | None
    members: list[ClusterMember]

    def lag(self, member: ClusterMember) -> int | None:
        """How far ``member`` is behind this leader's log, on the leader."""
        if member.matched_index is None:
            return None
        return max(self.last_log_index - member.matched_index, 0)


@layout(U64, STRING, STRING)
@dataclass(frozen=True)
class AddNodeReq:
    """``CLUSTER_ADD_NODE``: the node to make a voter, its raft port (as
    the other members reach it) and its client port."""

    node_id: int
    raft_addr: str
    client_addr: str


@layout(U64)
@dataclass(frozen=True)
class RemoveNodeReq:
    """``CLUSTER_REMOVE_NODE``: the member to take out of the group."""

    node_id: int


@layout(U16, U64, STRING, option(STRING))
@dataclass(frozen=True)
class ErrorReply:
    code: int
    detail: int
    message: str
    leader_addr: str | None = None


@layout(U64, U64)
@dataclass(frozen=True)
class Hint:
    uid: int
    committed_sync_seq: int


@layout(list_of(struct_of(Hint)))
@dataclass(frozen=True)
class Hints:
    hints: list[Hint]


@layout(U64, U64, U64, U64)
@dataclass(frozen=True)
class DirtyHint:
    uid: int
    conv: int
    target_msg_seq: int
    version: int


@layout(list_of(struct_of(DirtyHint)))
@dataclass(frozen=True)
class DirtyHints:
    hints: list[DirtyHint]


# --- opcodes -----------------------------------------------------------------


class Op(enum.IntEnum):
    HELLO = 0x01
    PING = 0x02
    JOIN = 0x10
    LEAVE = 0x11
    SEND = 0x12
    RECALL = 0x13
    EDIT = 0x14
    REGISTER_DEVICE = 0x20
    REVOKE_DEVICE = 0x21
    DEVICES = 0x22
    SYNC = 0x23
    ACK = 0x24
    FINISH_LEASE = 0x25
    PULL = 0x30
    HISTORY = 0x31
    MARK_READ = 0x32
    SET_CONV_FLAGS = 0x33
    CONV_LIST = 0x34
    DIRTY = 0x35
    CLEAR_DIRTY = 0x36
    CONV_MODE = 0x37
    BEGIN_SNAPSHOT = 0x40
    SNAPSHOT_INFO = 0x41
    SNAPSHOT_PAGE = 0x42
    ACK_SNAPSHOT = 0x43
    SUBSCRIBE = 0x50
    UNSUBSCRIBE = 0x51
    SUBSCRIBE_DIRTY = 0x52
    STATS = 0x60
    EXPLAIN = 0x61
    EXPLAIN_SEGMENT = 0x62
    COMPACT = 0x63
    CHECKPOINT = 0x64
    MEMORY = 0x65
    CLUSTER_STATUS = 0x66
    CLUSTER_ADD_NODE = 0x67
    CLUSTER_REMOVE_NODE = 0x68


#: request body class and reply body class of every opcode
OPS: dict[Op, tuple[type, type]] = {
    Op.HELLO: (Hello, HelloOk),
    Op.PING: (Empty, Empty),
    Op.JOIN: (ConvMember, MembershipReply),
    Op.LEAVE: (ConvMember, MembershipReply),
    Op.SEND: (SendReq, SendReply),
    Op.RECALL: (RecallReq, SendReply),
    Op.EDIT: (EditReq, SendReply),
    Op.REGISTER_DEVICE: (UserDevice, RegisterReply),
    Op.REVOKE_DEVICE: (UserDevice, DeviceInfo),
    Op.DEVICES: (UserReq, DeviceList),
    Op.SYNC: (SyncReq, SyncPage),
    Op.ACK: (AckReq, AckReply),
    Op.FINISH_LEASE: (FinishLeaseReq, DeviceInfo),
    Op.PULL: (PullReq, PullReply),
    Op.HISTORY: (HistoryReq, HistoryPage),
    Op.MARK_READ: (MarkReadReq, ReadReply),
    Op.SET_CONV_FLAGS: (ConvFlagsReq, Empty),
    Op.CONV_LIST: (ConvListReq, ConvListPage),
    Op.DIRTY: (UserReq, DirtyList),
    Op.CLEAR_DIRTY: (ClearDirtyReq, ClearDirtyReply),
    Op.CONV_MODE: (ConvModeReq, ConvMode),
    Op.BEGIN_SNAPSHOT: (UserDevice, SnapshotInfo),
    Op.SNAPSHOT_INFO: (SnapshotRef, SnapshotInfo),
    Op.SNAPSHOT_PAGE: (SnapshotPageReq, SnapshotPage),
    Op.ACK_SNAPSHOT: (AckSnapshotReq, DeviceInfo),
    Op.SUBSCRIBE: (UidList, Empty),
    Op.UNSUBSCRIBE: (UidList, Empty),
    Op.SUBSCRIBE_DIRTY: (UidList, Empty),
    Op.STATS: (Empty, Stats),
    Op.EXPLAIN: (UserReq, UserExplain),
    Op.EXPLAIN_SEGMENT: (SegmentReq, SegmentExplain),
    Op.COMPACT: (Empty, CompactionReport),
    Op.CHECKPOINT: (Empty, Empty),
    Op.MEMORY: (Empty, MemoryReport),
    Op.CLUSTER_STATUS: (Empty, ClusterStatus),
    Op.CLUSTER_ADD_NODE: (AddNodeReq, ClusterStatus),
    Op.CLUSTER_REMOVE_NODE: (RemoveNodeReq, ClusterStatus),
}



# --- frames ------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    opcode: int
    request_id: int
    body: bytes

    def encode(self) -> bytes:
        return struct.pack("<IBQ", HEADER_BYTES + len(self.body), self.opcode, self.request_id) + self.body


def request_frame(op: Op, request_id: int, body: Any) -> Frame:
    expected = OPS[op][0]
    if type(body) is not expected:
        raise TypeError(f"{op.name} takes a {expected.__name__}, not {type(body).__name__}")
    return Frame(int(op), request_id, encode_body(body))


def reply_frame(op: Op, request_id: int, body: Any) -> Frame:
    return Frame(int(op) | REPLY_BIT, request_id, encode_body(body))


def decode_frame(buf: bytearray, frame_bytes_max: int = 2**32 - 1) -> Frame | None:
    """Takes one whole frame off the front of ``buf``; ``None`` when more
    bytes are needed. A ``frame_len`` under 9 or over ``frame_bytes_max`` is
    a corrupt stream."""
    if len(buf) < 4:
        return None
    (frame_len,) = struct.unpack_from("<I", buf)
    if frame_len < HEADER_BYTES:
        raise ProtocolError(f"frame_len {frame_len} is too short for a header")
    if frame_len > frame_bytes_max:
        raise ProtocolError(f"frame_len {frame_len} is over the limit of {frame_bytes_max}")
    if len(buf) < 4 + frame_len:
        return None
    opcode, request_id = struct.unpack_from("<BQ", buf, 4)
    body = bytes(buf[13 : 4 + frame_len])
    del buf[: 4 + frame_len]
    return Frame(opcode, request_id, body)


def decode_reply(frame: Frame) -> Any:
    """The body of a server frame: a reply body, an :class:`ErrorReply` or
    :class:`Hints` or :class:`DirtyHints`."""
    if frame.opcode == OP_ERROR:
        return decode_body(ErrorReply, frame.body)
    if frame.opcode == OP_HINT:
        return decode_body(Hints, frame.body)
    if frame.opcode == OP_DIRTY_HINT:
        return decode_body(DirtyHints, frame.body)
    try:
        op = Op(frame.opcode & ~REPLY_BIT)
    except ValueError:
        raise ProtocolError(f"unknown reply opcode 0x{frame.opcode:02x}") from None
    return decode_body(OPS[op][1], frame.body)


def decode_request(frame: Frame) -> Any:
    return decode_body(OPS[Op(frame.opcode)][0], frame.body)
