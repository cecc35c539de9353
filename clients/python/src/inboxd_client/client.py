"""A blocking inboxd client over one TCP connection.

Requests can be pipelined: :meth:`Client.submit` writes a request and
returns its id at once, :meth:`Client.result` waits for that id's reply
(replies come in any order; the others are kept until asked for). The
server applies one connection's requests in the order they were written.
"""

from __future__ import annotations

import collections
import itertools
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from . import codec as c
from .errors import ConnectionClosed, InboxdError, ProtocolError, error_for


def read_token_file(path: str | os.PathLike[str]) -> bytes:
    """The token in a token file: its text without surrounding whitespace
    (a file holding ``s3cr3t`` and a newline is the token ``s3cr3t``)."""
    with open(path, "rb") as f:
        token = f.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


@dataclass
class SyncRun:
    """What :meth:`Client.sync_to_end` did."""

    events: list[c.Event] = field(default_factory=list)
    generation: int = 0
    acked_sync_seq: int = 0
    lease: c.LeaseInfo | None = None
    pages: int = 0


class Client:
    """One authenticated connection. Use it as a context manager::

        with Client("127.0.0.1", 7400, token) as inbox:
            inbox.join(conv=1, uid=1)
            reply = inbox.send(conv=1, sender=1, client_msg_id=1, payload=b"hi")
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: bytes | str,
        *,
        client_name: str = "inboxd-client-python",
        timeout_s: float = 30.0,
        version: int = c.PROTOCOL_VERSION,
    ) -> None:
        self._timeout_s = timeout_s
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._ids = itertools.count(1)
        self._replies: dict[int, c.Frame] = {}
        self._hints: collections.deque[c.Hint] = collections.deque()
        self._dirty_hints: collections.deque[c.DirtyHint] = collections.deque()
        self._closed_by: InboxdError | None = None
        self._open = True
        if isinstance(token, str):
            token = token.encode("utf-8")
        try:
            ok = self.call(c.Op.HELLO, c.Hello(version, client_name, token))
        except BaseException:
            self.close()
            raise
        #: the limits the server announced (PROTOCOL.md 4.1)
        self.server: c.HelloOk = ok

    # --- connection ---------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._sock.close()
            except OSError:
                pass

    def submit(self, op: c.Op, body: Any) -> int:
        """Writes one request without waiting; returns its request id."""
        request_id = next(self._ids)
        self.send_frame(c.request_frame(op, request_id, body))
        return request_id

    def send_frame(self, frame: c.Frame) -> None:
        """Writes a raw frame (tests use it to send what a client should not)."""
        self._sock.sendall(frame.encode())

    def result(self, request_id: int) -> Any:
        """Waits for the reply to ``request_id``; raises the error's
        exception for an ``ERROR`` reply."""
        while request_id not in self._replies:
            self._read_frame()
        frame = self._replies.pop(request_id)
        body = c.decode_reply(frame)
        if isinstance(body, c.ErrorReply):
            raise error_for(body.code, body.detail, body.message, body.leader_addr)
        return body

    def call(self, op: c.Op, body: Any) -> Any:
        return self.result(self.submit(op, body))

    def hints(self, wait_s: float = 0.0) -> list[c.Hint]:
        """Hints received so far; waits up to ``wait_s`` for one if none."""
        return self._take_pushes(self._hints, wait_s)

    def dirty_hints(self, wait_s: float = 0.0) -> list[c.DirtyHint]:
        """Large groups' marker moves received so far (after
        :meth:`subscribe_dirty`); waits up to ``wait_s`` for one if none."""
        return self._take_pushes(self._dirty_hints, wait_s)

    def _take_pushes(self, queue: collections.deque[Any], wait_s: float) -> list[Any]:
        deadline = time.monotonic() + wait_s
        while not queue and time.monotonic() < deadline:
            self._sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                self._read_frame()
            except TimeoutError:
                break
            finally:
                self._sock.settimeout(self._timeout_s)
        out = list(queue)
        queue.clear()
        return out

    def _read_frame(self) -> None:
        while True:
            frame = c.decode_frame(self._buf)
            if frame is not None:
                break
            if self._closed_by is not None:
                raise self._closed_by
            chunk = self._sock.recv(64 << 10)
            if not chunk:
                raise ConnectionClosed("the server closed the connection")
            self._buf += chunk
        if frame.request_id == 0:
            body = c.decode_reply(frame)
            if isinstance(body, c.Hints):
                self._hints.extend(body.hints)
            elif isinstance(body, c.DirtyHints):
                self._dirty_hints.extend(body.hints)
            elif isinstance(body, c.ErrorReply):
                # A connection-level error: the server closes next.
                self._closed_by = error_for(body.code, body.detail, body.message, body.leader_addr)
                raise self._closed_by
            else:
                raise ProtocolError(f"unexpected frame with request id 0: {frame}")
            return
        self._replies[frame.request_id] = frame

    # --- requests (PROTOCOL.md section 4) ----------------------------------

    def ping(self) -> None:
        self.call(c.Op.PING, c.Empty())

    def join(self, conv: int, uid: int) -> c.MembershipReply:
        return self.call(c.Op.JOIN, c.ConvMember(conv, uid))

    def leave(self, conv: int, uid: int) -> c.MembershipReply:
        return self.call(c.Op.LEAVE, c.ConvMember(conv, uid))

    def send(
        self, conv: int, sender: int, client_msg_id: int, payload: bytes, msg_type: int = 1
    ) -> c.SendReply:
        return self.call(c.Op.SEND, c.SendReq(conv, sender, client_msg_id, msg_type, payload))

    def recall(self, conv: int, sender: int, client_msg_id: int, target: int) -> c.SendReply:
        return self.call(c.Op.RECALL, c.RecallReq(conv, sender, client_msg_id, target))

    def edit(
        self, conv: int, sender: int, client_msg_id: int, target: int, payload: bytes
    ) -> c.SendReply:
        return self.call(c.Op.EDIT, c.EditReq(conv, sender, client_msg_id, target, payload))

    def register_device(self, uid: int, device: int) -> c.RegisterReply:
        return self.call(c.Op.REGISTER_DEVICE, c.UserDevice(uid, device))

    def revoke_device(self, uid: int, device: int) -> c.DeviceInfo:
        return self.call(c.Op.REVOKE_DEVICE, c.UserDevice(uid, device))

    def devices(self, uid: int) -> list[c.DeviceInfo]:
        return self.call(c.Op.DEVICES, c.UserReq(uid)).devices

    def sync(
        self,
        uid: int,
        device: int,
        generation: int | None,
        local_applied_seq: int,
        limit: int = 0,
        batch_token: bytes | None = None,
        *,
        max_replay: int | None = None,
        without_summaries: bool = False,
        ids_only: bool = False,
        ack_through: int | None = None,
    ) -> c.SyncPage:
        """One SYNC page. ``max_replay``: a batch with more events than this
        to replay answers RESET_REQUIRED instead (install a snapshot);
        ``without_summaries``: events without their summaries; ``ids_only``:
        events as their ids, with no summary field on the wire;
        ``ack_through``: the previous page's ACK, carried by this SYNC and
        not waited for (needs ``batch_token``)."""
        req = c.SyncReq(
            uid,
            device,
            generation,
            local_applied_seq,
            limit,
            batch_token,
            max_replay,
            without_summaries,
            ids_only,
            ack_through,
        )
        return self.call(c.Op.SYNC, req)

    def ack(self, uid: int, device: int, generation: int, seq: int, batch_token: bytes) -> int:
        return self.call(c.Op.ACK, c.AckReq(uid, device, generation, seq, batch_token)).acked_sync_seq

    def finish_lease(self, uid: int, device: int, lease_id: int, generation: int) -> c.DeviceInfo:
        return self.call(c.Op.FINISH_LEASE, c.FinishLeaseReq(uid, device, lease_id, generation))

    def pull(
        self, uid: int, cursors: Iterable[tuple[int, int]], per_conv_limit: int = 0
    ) -> list[c.ConvPull]:
        req = c.PullReq(uid, per_conv_limit, [c.Cursor(conv, after) for conv, after in cursors])
        return self.call(c.Op.PULL, req).convs

    def history(
        self, uid: int, conv: int, limit: int, before_seq: int | None = None
    ) -> c.HistoryPage:
        return self.call(c.Op.HISTORY, c.HistoryReq(uid, conv, before_seq, limit))

    def mark_read(self, uid: int, conv: int, read_to_seq: int) -> c.ReadReply:
        return self.call(c.Op.MARK_READ, c.MarkReadReq(uid, conv, read_to_seq))

    def set_conv_flags(self, uid: int, conv: int, *, muted: bool, pinned: bool) -> None:
        self.call(c.Op.SET_CONV_FLAGS, c.ConvFlagsReq(uid, conv, muted, pinned))

    def conv_list(self, uid: int, limit: int, cursor: bytes | None = None) -> c.ConvListPage:
        return self.call(c.Op.CONV_LIST, c.ConvListReq(uid, limit, cursor))

    def dirty(self, uid: int) -> c.DirtyList:
        """The user's dirty large groups (R7)."""
        return self.call(c.Op.DIRTY, c.UserReq(uid))

    def clear_dirty(self, uid: int, conv: int, version: int) -> c.ClearDirtyReply:
        """Clears a large group's marker at the version ``dirty`` showed,
        after pulling up to its target; ``MarkerMovedError`` when a newer
        entry landed meanwhile."""
        return self.call(c.Op.CLEAR_DIRTY, c.ClearDirtyReq(uid, conv, version))

    def conv_mode(self, conv: int, uid: int | None = None) -> c.ConvMode:
        return self.call(c.Op.CONV_MODE, c.ConvModeReq(conv, uid))

    def begin_snapshot(self, uid: int, device: int) -> c.SnapshotInfo:
        return self.call(c.Op.BEGIN_SNAPSHOT, c.UserDevice(uid, device))

    def snapshot_info(self, uid: int, snapshot_id: int) -> c.SnapshotInfo:
        return self.call(c.Op.SNAPSHOT_INFO, c.SnapshotRef(uid, snapshot_id))

    def snapshot_page(self, uid: int, snapshot_id: int, page: int) -> c.SnapshotPage:
        return self.call(c.Op.SNAPSHOT_PAGE, c.SnapshotPageReq(uid, snapshot_id, page))

    def ack_snapshot(
        self, uid: int, device: int, snapshot_id: int, generation: int
    ) -> c.DeviceInfo:
        return self.call(c.Op.ACK_SNAPSHOT, c.AckSnapshotReq(uid, device, snapshot_id, generation))

    def subscribe(self, uids: Iterable[int]) -> None:
        self.call(c.Op.SUBSCRIBE, c.UidList(list(uids)))

    def subscribe_dirty(self, uids: Iterable[int]) -> None:
        """As :meth:`subscribe`, and large groups' marker moves for the
        connection's subscribed uids arrive on :meth:`dirty_hints`."""
        self.call(c.Op.SUBSCRIBE_DIRTY, c.UidList(list(uids)))

    def unsubscribe(self, uids: Iterable[int]) -> None:
        self.call(c.Op.UNSUBSCRIBE, c.UidList(list(uids)))

    def stats(self) -> c.Stats:
        return self.call(c.Op.STATS, c.Empty())

    def explain(self, uid: int) -> c.UserExplain:
        return self.call(c.Op.EXPLAIN, c.UserReq(uid))

    def explain_segment(self, stream: str, segment: int) -> c.SegmentExplain:
        return self.call(c.Op.EXPLAIN_SEGMENT, c.SegmentReq(stream, segment))

    def compact(self) -> c.CompactionReport:
        return self.call(c.Op.COMPACT, c.Empty())

    def checkpoint(self) -> None:
        self.call(c.Op.CHECKPOINT, c.Empty())

    def memory(self) -> c.MemoryReport:
        """Bytes per in-memory structure (admin)."""
        return self.call(c.Op.MEMORY, c.Empty())

    def cluster_status(self) -> c.ClusterStatus:
        """This node's view of its replicated group (admin; any member
        answers)."""
        return self.call(c.Op.CLUSTER_STATUS, c.Empty())

    def cluster_add_node(self, node_id: int, raft_addr: str, client_addr: str) -> c.ClusterStatus:
        """Make ``node_id`` a voter of the group (admin; the leader runs it,
        a follower raises :class:`NotLeaderError` naming the leader). It
        is added as a learner, caught up, then made a voter; returns the
        leader's view once done. The server waits up to 60 s: give the
        client a ``timeout_s`` above that for a node that must catch up."""
        return self.call(c.Op.CLUSTER_ADD_NODE, c.AddNodeReq(node_id, raft_addr, client_addr))

    def cluster_remove_node(self, node_id: int) -> c.ClusterStatus:
        """Take ``node_id`` out of the group (admin; the leader runs it);
        returns the leader's view once done (up to 60 s)."""
        return self.call(c.Op.CLUSTER_REMOVE_NODE, c.RemoveNodeReq(node_id))

    # --- flows ----------------------------------------------------------------

    def sync_to_end(
        self,
        uid: int,
        device: int,
        generation: int | None,
        local_applied_seq: int,
        limit: int = 0,
        *,
        ack_in_sync: bool = False,
    ) -> SyncRun:
        """The sync loop of PROTOCOL.md 4.3: pages until ``has_more`` is
        false, ACK of the last cursor, then FINISH_LEASE if a lease came.
        With ``ack_in_sync`` each page's ACK rides on the next page's SYNC
        (PROTOCOL.md, "An ACK carried by the next SYNC"), so the server
        holds the device's place while the loop runs.
        Raises :class:`ResetRequiredError` when a snapshot is needed."""
        run = SyncRun()
        page = self.sync(uid, device, generation, local_applied_seq, limit)
        while True:
            run.pages += 1
            run.events.extend(page.events)
            run.generation = page.generation
            run.lease = page.lease or run.lease
            if not page.has_more:
                break
            page = self.sync(
                uid,
                device,
                page.generation,
                page.next_cursor,
                limit,
                page.batch_token,
                ack_through=page.next_cursor if ack_in_sync else None,
            )
        run.acked_sync_seq = self.ack(uid, device, page.generation, page.next_cursor, page.batch_token)
        if run.lease is not None:
            self.finish_lease(uid, device, run.lease.lease_id, run.generation)
        return run

    def install_snapshot(
        self, uid: int, device: int, poll_s: float = 0.05
    ) -> tuple[c.SnapshotInfo, list[c.SnapshotPage], c.DeviceInfo]:
        """The snapshot flow of PROTOCOL.md 4.4: begin, wait until READY,
        fetch every page, acknowledge. Sync on from ``base_sync_seq``."""
        info = self.begin_snapshot(uid, device)
        while info.state == c.SnapshotState.BUILDING:
            time.sleep(poll_s)
            info = self.snapshot_info(uid, info.snapshot_id)
        pages = [self.snapshot_page(uid, info.snapshot_id, p) for p in range(info.pages)]
        device_info = self.ack_snapshot(uid, device, info.snapshot_id, info.generation)
        return info, pages, device_info
