"""The worked examples of docs/PROTOCOL.md, read out of the document and
checked byte for byte in both directions, and codec edge cases."""

from __future__ import annotations

import re
import unittest

from inboxd_client import codec as c
from inboxd_client.errors import ProtocolError

from .daemon import REPO

PROTOCOL_MD = (REPO / "docs" / "PROTOCOL.md").read_text()


def doc_example(name: str) -> bytes:
    """The bytes of the block after ``<!-- example: NAME -->``: each line
    up to its first word that is not two hex digits."""
    at = PROTOCOL_MD.index(f"<!-- example: {name} -->")
    block = PROTOCOL_MD[at:].split("```")[1]
    out = bytearray()
    for line in block.splitlines()[1:]:
        for word in line.split():
            if not re.fullmatch(r"[0-9a-f]{2}", word):
                break
            out.append(int(word, 16))
    return bytes(out)


def one_frame(data: bytes) -> c.Frame:
    buf = bytearray(data)
    frame = c.decode_frame(buf)
    assert frame is not None and not buf, "one whole frame"
    return frame


DEFAULT_HELLO_OK = c.HelloOk(
    version=3,
    server_name="inboxd",
    frame_bytes_max=1 << 20,
    in_flight_max=256,
    reply_frame_bytes_max=64 << 20,
    payload_bytes_max=65536,
    summary_bytes_max=64,
    sync_page_default=100,
    sync_page_max=500,
    pull_per_conv_default=50,
    pull_per_conv_max=500,
    history_limit_max=500,
    conv_list_limit_max=500,
    devices_per_user_max=5,
    rate_per_s=20000,
    rate_burst=2000,
    idle_timeout_ms=300_000,
    batch_token_ttl_ms=600_000,
    recovery_lease_ttl_ms=600_000,
    snapshot_ttl_ms=3_600_000,
    max_connections=1024,
    subscribe_uids_max=100_000,
    subscriptions_max=1_000_000,
    large_group_members=500,
    idempotency_ttl_ms=7 * 24 * 3600 * 1000,
)


class ProtocolDocExamples(unittest.TestCase):
    def check_request(self, name: str, op: c.Op, request_id: int, body: object) -> None:
        frame = c.request_frame(op, request_id, body)
        self.assertEqual(frame.encode().hex(" "), doc_example(name).hex(" "), name)
        decoded = one_frame(doc_example(name))
        self.assertEqual(decoded, frame)
        self.assertEqual(c.decode_request(decoded), body)

    def check_reply(self, name: str, frame: c.Frame, body: object) -> None:
        self.assertEqual(frame.encode().hex(" "), doc_example(name).hex(" "), name)
        self.assertEqual(c.decode_reply(one_frame(doc_example(name))), body)

    def test_hello(self) -> None:
        self.check_request("hello", c.Op.HELLO, 1, c.Hello(3, "ctl", b"s3cr3t"))

    def test_hello_ok_announces_every_limit(self) -> None:
        self.check_reply("hello-ok", c.reply_frame(c.Op.HELLO, 1, DEFAULT_HELLO_OK), DEFAULT_HELLO_OK)

    def test_hello_ok_for_a_version_1_client_is_a_prefix_of_fewer_fields(self) -> None:
        v1 = one_frame(doc_example("hello-ok-v1"))
        r = c.Reader(v1.body)
        self.assertEqual(r.unpack("H"), 1)
        self.assertEqual(c.STRING.get(r), "inboxd")
        self.assertEqual((r.unpack("I"), r.unpack("I")), (1 << 20, 256))
        r.finish()

    def test_hello_ok_for_a_version_2_client_stops_after_snapshot_ttl(self) -> None:
        v2 = one_frame(doc_example("hello-ok-v2"))
        self.assertEqual(v2.body, c.encode_body(DEFAULT_HELLO_OK)[: len(v2.body)].replace(b"\x03\x00", b"\x02\x00", 1))
        r = c.Reader(v2.body)
        self.assertEqual(r.unpack("H"), 2)

    def test_not_leader_names_the_leader_in_a_field(self) -> None:
        err = c.ErrorReply(19, 0, "not the leader", "10.0.0.2:7070")
        self.check_reply("not-leader", c.Frame(c.OP_ERROR, 7, c.encode_body(err)), err)

    def test_send_and_reply(self) -> None:
        self.check_request("send", c.Op.SEND, 2, c.SendReq(100, 1, 0x1122, 1, b"hi"))
        reply = c.SendReply(0x400, 3, False)
        self.check_reply("send-reply", c.reply_frame(c.Op.SEND, 2, reply), reply)

    def test_rate_limited_error(self) -> None:
        err = c.ErrorReply(7, 250, "slow down")
        self.check_reply("rate-limited", c.Frame(c.OP_ERROR, 9, c.encode_body(err)), err)

    def test_clear_dirty_and_marker_moved(self) -> None:
        self.check_request("clear-dirty", c.Op.CLEAR_DIRTY, 3, c.ClearDirtyReq(2, 7, 9))
        err = c.ErrorReply(18, 10, "marker moved")
        self.check_reply("marker-moved", c.Frame(c.OP_ERROR, 3, c.encode_body(err)), err)

    def test_cluster_status_reply(self) -> None:
        reply = c.ClusterStatus(
            1,
            "leader",
            3,
            1,
            42,
            42,
            12,
            [
                c.ClusterMember(1, "10.0.0.1:7080", "10.0.0.1:7070", 42),
                c.ClusterMember(2, "10.0.0.2:7080", "10.0.0.2:7070", 40),
            ],
        )
        self.check_reply("cluster-status-reply", c.reply_frame(c.Op.CLUSTER_STATUS, 6, reply), reply)
        self.assertEqual(reply.lag(reply.members[1]), 2)

    def test_cluster_add_node(self) -> None:
        request = c.AddNodeReq(4, "10.0.0.4:7080", "10.0.0.4:7070")
        self.check_request("cluster-add-node", c.Op.CLUSTER_ADD_NODE, 7, request)

    def test_cluster_remove_node(self) -> None:
        self.check_request("cluster-remove-node", c.Op.CLUSTER_REMOVE_NODE, 8, c.RemoveNodeReq(3))

    def test_memory_reply(self) -> None:
        reply = c.MemoryReport(120, 35, [c.MemoryUse("idempotency", 4000, 5120)])
        self.check_reply("memory-reply", c.reply_frame(c.Op.MEMORY, 5, reply), reply)
        self.assertEqual(reply.get("idempotency"), c.MemoryUse("idempotency", 4000, 5120))

    def test_dirty_reply(self) -> None:
        reply = c.DirtyList([c.DirtyMarker(7, 10, 10)])
        self.check_reply("dirty-reply", c.reply_frame(c.Op.DIRTY, 4, reply), reply)

    def test_hint_push(self) -> None:
        hints = c.Hints([c.Hint(1, 12)])
        self.check_reply("hint", c.Frame(c.OP_HINT, 0, c.encode_body(hints)), hints)

    def test_sync_optional_fields_follow_the_fixed_fields(self) -> None:
        base = c.SyncReq(7, 1, 3, 40, 100, None)
        full = c.SyncReq(7, 1, 3, 40, 100, None, max_replay=5000, without_summaries=True)
        tail = c.encode_body(full)[len(c.encode_body(base)) :]
        self.assertEqual(
            tail.hex(" "), "01 08 00 00 00 88 13 00 00 00 00 00 00 02 00 00 00 00"
        )
        self.assertEqual(c.decode_body(c.SyncReq, c.encode_body(full)), full)
        self.assertEqual(c.decode_body(c.SyncReq, c.encode_body(base)), base)
        with self.assertRaises(c.ProtocolError):
            c.decode_body(c.SyncReq, c.encode_body(base) + b"\x09\x00\x00\x00\x00")
        ids = c.SyncReq(7, 1, 3, 40, 100, None, ids_only=True)
        self.assertEqual(c.encode_body(ids)[len(c.encode_body(base)) :].hex(" "), "03 00 00 00 00")
        self.assertEqual(c.decode_body(c.SyncReq, c.encode_body(ids)), ids)
        acking = c.SyncReq(7, 1, 3, 40, 100, None, ids_only=True, ack_through=300)
        self.assertEqual(
            c.encode_body(acking)[len(c.encode_body(base)) :].hex(" "),
            "03 00 00 00 00 04 08 00 00 00 2c 01 00 00 00 00 00 00",
        )
        self.assertEqual(c.decode_body(c.SyncReq, c.encode_body(acking)), acking)

    def test_sync_page_with_one_event(self) -> None:
        page = c.SyncPage(
            events=[c.Event(1, c.EventKind.MSG, 100, 3, 0x400, 0, b"hi")],
            next_cursor=1,
            has_more=False,
            acked_sync_seq=0,
            batch_hwm=1,
            batch_token=b"\xaa\xbb",
            generation=1,
            lease=None,
        )
        self.check_reply("sync-reply", c.reply_frame(c.Op.SYNC, 4, page), page)

    def test_explain_skips_a_fence_of_an_unknown_kind(self) -> None:
        explain = c.UserExplain(
            uid=1,
            oldest_retained=5,
            committed_sync_seq=9,
            floor=4,
            fences=[c.Fence(1, (7, 4)), c.Fence(9, known=False, raw=b"\xee\xee")],
        )
        self.check_reply("explain-reply", c.reply_frame(c.Op.EXPLAIN, 5, explain), explain)
        self.assertEqual(explain.fences[0].as_dict(), {"device": 7, "acked_sync_seq": 4})


class Codec(unittest.TestCase):
    def test_an_event_of_an_unknown_kind_is_kept_raw_and_re_encodes(self) -> None:
        event = c.Event(sync_seq=5, kind=42, known=False, raw=b"\x01\x02\x03")
        data = c.EVENT.put(event)
        self.assertEqual(c.EVENT.get(c.Reader(data)), event)

    def test_an_event_without_its_summary_field_is_45_bytes_and_re_encodes(self) -> None:
        event = c.Event(5, c.EventKind.MSG, conv=1, msg_seq=2, msg_id=3, at_ms=4, bare=True)
        data = c.EVENT.put(event)
        self.assertEqual(len(data), 8 + 1 + 4 + 32)
        self.assertEqual(c.EVENT.get(c.Reader(data)), event)
        full = c.Event(5, c.EventKind.MSG, conv=1, msg_seq=2, msg_id=3, at_ms=4)
        self.assertEqual(len(c.EVENT.put(full)), 8 + 1 + 4 + 32 + 4)
        self.assertFalse(c.EVENT.get(c.Reader(c.EVENT.put(full))).bare)

    def test_trailing_bytes_and_bad_bools_are_refused(self) -> None:
        body = c.encode_body(c.SendReply(1, 2, True))
        with self.assertRaises(ProtocolError):
            c.decode_body(c.SendReply, body + b"\x00")
        with self.assertRaises(ProtocolError):
            c.decode_body(c.SendReply, body[:-1] + b"\x02")

    def test_a_frame_shorter_than_a_header_is_a_corrupt_stream(self) -> None:
        with self.assertRaises(ProtocolError):
            c.decode_frame(bytearray(b"\x03\x00\x00\x00\xde\xad\xbe"))

    def test_a_partial_frame_waits_for_more_bytes(self) -> None:
        data = c.request_frame(c.Op.PING, 7, c.Empty()).encode()
        buf = bytearray(data[:-1])
        self.assertIsNone(c.decode_frame(buf))
        buf += data[-1:]
        self.assertEqual(c.decode_frame(buf), c.Frame(c.Op.PING, 7, b""))


if __name__ == "__main__":
    unittest.main()
