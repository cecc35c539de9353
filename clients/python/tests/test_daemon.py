"""The client against a real inboxd: the whole protocol, flow by flow."""

from __future__ import annotations

import socket
import struct
import unittest

from inboxd_client import (
    BadRequestError,
    Client,
    ConflictError,
    ConnectionClosed,
    DeviceRevokedError,
    DeviceState,
    EventKind,
    ForbiddenError,
    MessageKind,
    NotFoundError,
    ResetRequiredError,
    SnapshotState,
    TooLargeError,
    UnauthenticatedError,
    UnsupportedError,
    codec as c,
    read_token_file,
)

from .daemon import Daemon


class AgainstTheDaemon(unittest.TestCase):
    daemon: Daemon

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon()
        cls.token = read_token_file(cls.daemon.token_file)
        cls.admin_token = read_token_file(cls.daemon.admin_token_file)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()

    def connect(self, **kwargs: object) -> Client:
        return Client(self.daemon.host, self.daemon.port, self.token, **kwargs)  # type: ignore[arg-type]

    def connect_admin(self) -> Client:
        """STATS, EXPLAIN*, COMPACT and CHECKPOINT need the admin token."""
        return Client(self.daemon.host, self.daemon.port, self.admin_token)

    def test_the_token_file_newline_is_not_part_of_the_token(self) -> None:
        self.assertEqual(self.token, b"py-test-token")
        with self.connect() as inbox:
            inbox.ping()
        with self.assertRaises(UnauthenticatedError):
            Client(self.daemon.host, self.daemon.port, self.token + b"\n")

    def test_hello_ok_announces_the_limits_that_are_enforced(self) -> None:
        with self.connect() as inbox:
            limits = inbox.server
            self.assertEqual(limits.version, c.PROTOCOL_VERSION)
            self.assertEqual(limits.payload_bytes_max, 65536)
            inbox.join(conv=10, uid=1)
            inbox.send(10, 1, 1, b"x" * limits.payload_bytes_max)
            with self.assertRaises(TooLargeError) as caught:
                inbox.send(10, 1, 2, b"x" * (limits.payload_bytes_max + 1))
            self.assertEqual(caught.exception.detail, limits.payload_bytes_max)
            self.assertEqual(len(inbox.history(1, 10, limit=0).messages), 2, "0 = the default")
            with self.assertRaises(BadRequestError):
                inbox.history(1, 10, limit=limits.history_limit_max + 1)
            with self.assertRaises(BadRequestError):
                inbox.sync(1, 1, None, 0, limit=limits.sync_page_max + 1)

    def test_hello_ok_announces_the_subscription_and_group_limits(self) -> None:
        with self.connect() as inbox:
            limits = inbox.server
            self.assertEqual(limits.max_connections, 1024)
            self.assertEqual(limits.subscribe_uids_max, 100_000)
            self.assertEqual(limits.subscriptions_max, 1_000_000)
            self.assertEqual(limits.large_group_members, 500)
            self.assertEqual(limits.idempotency_ttl_ms, 7 * 24 * 3600 * 1000)

    def test_an_unsupported_version_is_refused_with_the_newest_spoken(self) -> None:
        with self.assertRaises(UnsupportedError) as caught:
            self.connect(version=99)
        self.assertEqual(caught.exception.detail, c.PROTOCOL_VERSION)

    def test_messages_recall_and_edit(self) -> None:
        with self.connect() as inbox:
            inbox.join(conv=20, uid=1)
            inbox.join(conv=20, uid=2)
            first = inbox.send(20, 1, 100, b"hello")
            again = inbox.send(20, 1, 100, b"hello")
            self.assertTrue(again.duplicate)
            self.assertEqual((again.msg_id, again.msg_seq), (first.msg_id, first.msg_seq))
            with self.assertRaises(ConflictError):
                inbox.send(20, 1, 100, b"a different body")
            second = inbox.send(20, 1, 101, b"to be recalled")
            edit = inbox.edit(20, 1, 102, first.msg_id, b"hello, edited")
            with self.assertRaises(ForbiddenError):
                inbox.recall(20, 2, 103, second.msg_id)
            recall = inbox.recall(20, 1, 104, second.msg_id)
            with self.assertRaises(ConflictError):
                inbox.recall(20, 1, 105, second.msg_id)

            page = inbox.history(2, 20, limit=50)
            by_seq = {m.msg_seq: m for m in page.messages}
            original = by_seq[first.msg_seq]
            self.assertEqual(original.kind, MessageKind.NORMAL)
            self.assertTrue(original.tombstone, "an edited original reads as a tombstone")
            self.assertEqual(original.payload, b"")
            self.assertEqual(by_seq[edit.msg_seq].kind, MessageKind.EDIT)
            self.assertEqual(by_seq[edit.msg_seq].target, first.msg_id)
            self.assertEqual(by_seq[edit.msg_seq].payload, b"hello, edited")
            self.assertTrue(by_seq[second.msg_seq].tombstone)
            self.assertEqual(by_seq[second.msg_seq].payload, b"")
            self.assertEqual(by_seq[recall.msg_seq].kind, MessageKind.RECALL)

            pulled = inbox.pull(2, [(20, 0)])
            self.assertEqual(pulled[0].conv, 20)
            self.assertFalse(any(m.payload == b"to be recalled" for m in pulled[0].messages))

            convs = inbox.conv_list(2, limit=10).convs
            summary = next(s for s in convs if s.conv == 20)
            self.assertEqual(summary.last_msg_seq, recall.msg_seq)
            self.assertEqual(summary.last_summary, b"", "a recall has no body to show")

            read = inbox.mark_read(2, 20, recall.msg_seq)
            self.assertEqual((read.read_seq, read.unread), (recall.msg_seq, 0))
            inbox.join(conv=20, uid=3)
            left = inbox.leave(conv=20, uid=3)
            self.assertGreater(left.msg_seq, recall.msg_seq)
            with self.assertRaises(ForbiddenError):
                inbox.send(20, 3, 106, b"not a member any more")
            inbox.set_conv_flags(2, 20, muted=True, pinned=False)
            summary = next(s for s in inbox.conv_list(2, limit=10).convs if s.conv == 20)
            self.assertTrue(summary.muted)

    def test_pipelined_sends_take_effect_in_the_order_written(self) -> None:
        with self.connect() as inbox:
            inbox.join(conv=30, uid=1)
            ids = [
                inbox.submit(c.Op.SEND, c.SendReq(30, 1, 1000 + i, 1, f"p{i}".encode()))
                for i in range(200)
            ]
            seqs = [inbox.result(i).msg_seq for i in reversed(ids)][::-1]
            self.assertEqual(seqs, sorted(seqs))
            self.assertEqual(len(set(seqs)), 200)

    def test_an_ack_carried_by_sync_holds_the_device_s_place_before_the_last_ack(self) -> None:
        with self.connect() as inbox:
            reg = inbox.register_device(uid=41, device=1)
            inbox.join(conv=41, uid=41)
            for i in range(6):
                inbox.send(41, 41, 4100 + i, f"t{i}".encode())
            first = inbox.sync(41, 1, reg.device.generation, 0, limit=2)
            self.assertTrue(first.has_more)
            second = inbox.sync(
                41,
                1,
                first.generation,
                first.next_cursor,
                2,
                first.batch_token,
                ack_through=first.next_cursor,
            )
            self.assertEqual(second.events[0].sync_seq, first.next_cursor + 1)
            # A write queued behind the carried ACK: once it is answered,
            # the ACK has been applied.
            inbox.register_device(uid=41, device=2)
            acked = {d.device: d.acked_sync_seq for d in inbox.devices(41)}
            self.assertEqual(acked[1], first.next_cursor)
            run = inbox.sync_to_end(
                41, 1, second.generation, second.next_cursor, limit=2, ack_in_sync=True
            )
            self.assertEqual(run.acked_sync_seq, run.events[-1].sync_seq)

    def test_devices_sync_ack_and_explain(self) -> None:
        with self.connect() as inbox:
            reg = inbox.register_device(uid=40, device=1)
            self.assertEqual(reg.device.state, DeviceState.ACTIVE)
            inbox.join(conv=40, uid=40)
            sent = [inbox.send(40, 40, 4000 + i, f"s{i}".encode()) for i in range(5)]
            run = inbox.sync_to_end(40, 1, reg.device.generation, 0, limit=2)
            self.assertGreaterEqual(run.pages, 3)
            msgs = [e for e in run.events if e.kind == EventKind.MSG]
            self.assertEqual([e.msg_seq for e in msgs], [s.msg_seq for s in sent])
            self.assertEqual(msgs[0].summary, b"s0")
            self.assertEqual(run.acked_sync_seq, run.events[-1].sync_seq)

            # Local store lost: a lease from the local position.
            lost = inbox.sync(40, 1, run.generation, 1)
            self.assertEqual(lost.generation, run.generation + 1)
            self.assertIsNotNone(lost.lease)
            assert lost.lease is not None
            self.assertEqual(lost.lease.resume_from, 1)
            recovered = inbox.sync_to_end(40, 1, lost.generation, 1)
            self.assertEqual(recovered.generation, lost.generation)
            devices = {d.device: d for d in inbox.devices(40)}
            self.assertEqual(devices[1].state, DeviceState.ACTIVE)

        with self.connect_admin() as admin:
            explain = admin.explain(40)
            self.assertTrue(
                any(f.tag == 1 and f.as_dict()["device"] == 1 for f in explain.fences), explain
            )
            self.assertLessEqual(explain.oldest_retained, explain.committed_sync_seq)

        with self.connect() as inbox:
            inbox.revoke_device(40, 1)
            with self.assertRaises(DeviceRevokedError):
                inbox.sync(40, 1, recovered.generation, recovered.acked_sync_seq)

    def test_the_device_cap_evicts_the_least_recently_seen(self) -> None:
        with self.connect() as inbox:
            cap = inbox.server.devices_per_user_max
            for device in range(1, cap + 1):
                inbox.register_device(uid=45, device=device)
            reg = inbox.register_device(uid=45, device=cap + 1)
            self.assertEqual(reg.evicted, 1)
            states = {d.device: d.state for d in inbox.devices(45)}
            self.assertEqual(states[1], DeviceState.REVOKED)
            again = inbox.register_device(uid=45, device=1)
            self.assertEqual(again.device.state, DeviceState.ACTIVE)

    def test_snapshot_install(self) -> None:
        with self.connect() as inbox:
            reg = inbox.register_device(uid=50, device=1)
            inbox.join(conv=50, uid=50)
            inbox.send(50, 50, 5000, b"in the snapshot")
            info, pages, device = inbox.install_snapshot(50, 1)
            self.assertEqual(info.state, SnapshotState.READY)
            self.assertEqual(info.generation, reg.device.generation + 1)
            self.assertEqual(len(pages), info.pages)
            self.assertTrue(
                any(m.payload == b"in the snapshot" for p in pages for m in p.messages)
            )
            self.assertEqual(device.state, DeviceState.ACTIVE)
            self.assertEqual(device.acked_sync_seq, info.base_sync_seq)
            run = inbox.sync_to_end(50, 1, info.generation, info.base_sync_seq)
            self.assertEqual(run.events, [])

    def test_a_resetting_device_gets_reset_required_from_sync(self) -> None:
        with self.connect() as inbox:
            inbox.register_device(uid=55, device=1)
            info = inbox.begin_snapshot(55, 1)
            with self.assertRaises(ResetRequiredError) as caught:
                inbox.sync(55, 1, info.generation, 0)
            self.assertEqual(caught.exception.detail, info.generation)

    def test_sync_options_a_replay_limit_and_no_summaries(self) -> None:
        with self.connect() as inbox:
            inbox.join(conv=70, uid=70)
            inbox.join(conv=70, uid=71)
            gen = inbox.register_device(uid=71, device=1).device.generation
            for i in range(5):
                inbox.send(70, 70, 100 + i, b"hello %d" % i)
            with self.assertRaises(BadRequestError):
                inbox.sync(71, 1, gen, 0, max_replay=0)
            self.assertEqual(inbox.devices(71)[0].generation, gen, "a refused sync changes nothing")
            page = inbox.sync(71, 1, gen, 0, without_summaries=True)
            self.assertTrue(page.events)
            self.assertTrue(all(e.summary == b"" and not e.bare for e in page.events))
            bare = inbox.sync(71, 1, gen, 0, ids_only=True)
            self.assertEqual([e.sync_seq for e in bare.events], [e.sync_seq for e in page.events])
            self.assertTrue(all(e.summary == b"" and e.bare for e in bare.events))
            self.assertEqual(page.generation, gen)
            with self.assertRaises(ResetRequiredError) as caught:
                inbox.sync(71, 1, gen, 0, max_replay=page.batch_hwm - 1)
            self.assertEqual(caught.exception.detail, gen + 1)

    def test_hints_after_subscribe(self) -> None:
        with self.connect() as watcher, self.connect() as writer:
            watcher.subscribe([60])
            writer.join(conv=60, uid=60)
            writer.send(60, 60, 6000, b"ping")
            hints = watcher.hints(wait_s=5.0)
            self.assertTrue(any(h.uid == 60 and h.committed_sync_seq >= 1 for h in hints), hints)
            watcher.unsubscribe([60])

    def test_operations(self) -> None:
        with self.connect_admin() as inbox:
            stats = inbox.stats()
            self.assertGreaterEqual(stats.users, 0)
            inbox.compact()
            inbox.checkpoint()
            memory = inbox.memory()
            idem = memory.get("idempotency")
            self.assertIsNotNone(idem)
            self.assertGreaterEqual(idem.allocated, idem.live)
            segment = inbox.explain_segment("evt", 1)
            self.assertEqual((segment.stream, segment.segment), ("evt", 1))
            with self.assertRaises(NotFoundError):
                inbox.explain_segment("evt", 0)
            status = inbox.cluster_status()
            self.assertEqual((status.role, status.node_id, status.members), ("single", 0, []))
            with self.assertRaisesRegex(BadRequestError, "not in a replicated group"):
                inbox.cluster_add_node(2, "127.0.0.1:9", "127.0.0.1:10")
            with self.assertRaisesRegex(BadRequestError, "not in a replicated group"):
                inbox.cluster_remove_node(1)

    def test_request_id_0_is_refused_and_the_connection_closes(self) -> None:
        inbox = self.connect()
        inbox.send_frame(c.request_frame(c.Op.PING, 0, c.Empty()))
        with self.assertRaises(BadRequestError):
            inbox.result(inbox.submit(c.Op.PING, c.Empty()))
        inbox.close()

    def test_a_request_before_hello_is_unauthenticated(self) -> None:
        with socket.create_connection((self.daemon.host, self.daemon.port), timeout=10) as s:
            s.sendall(c.request_frame(c.Op.PING, 1, c.Empty()).encode())
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        buf = bytearray(data)
        frame = c.decode_frame(buf)
        assert frame is not None
        reply = c.decode_reply(frame)
        self.assertEqual(reply.code, UnauthenticatedError.code)

    def test_a_frame_over_the_limit_is_too_large_and_closes(self) -> None:
        inbox = self.connect()
        inbox._sock.sendall(struct.pack("<IBQ", 0xFFFFFFFF, 0x12, 5))
        with self.assertRaises(TooLargeError) as caught:
            inbox.result(5)
        self.assertEqual(caught.exception.detail, inbox.server.frame_bytes_max)
        with self.assertRaises((ConnectionClosed, TooLargeError)):
            inbox.ping()
        inbox.close()


if __name__ == "__main__":
    unittest.main()


class LargeGroupAgainstTheDaemon(unittest.TestCase):
    """A large group (three members above a threshold of 2): the marker,
    the clear's compare-and-set and the mode."""

    def test_marker_pull_and_clear(self) -> None:
        from inboxd_client import MarkerMovedError

        with Daemon("--large-group-members", "2") as daemon:
            token = read_token_file(daemon.token_file)
            with Client(daemon.host, daemon.port, token) as client:
                for uid in (1, 2, 3):
                    client.join(7, uid)
                mode = client.conv_mode(7, 2)
                self.assertTrue(mode.large)
                self.assertEqual(mode.switch_seq, 3)
                first = client.send(7, 1, 1, b"one")
                observed = client.dirty(2).markers
                self.assertEqual(observed, [c.DirtyMarker(7, first.msg_seq, first.msg_seq)])
                second = client.send(7, 1, 2, b"two")
                with self.assertRaises(MarkerMovedError) as moved:
                    client.clear_dirty(2, 7, observed[0].version)
                self.assertEqual(moved.exception.detail, second.msg_seq)
                self.assertEqual(client.dirty(2).markers[0].target_msg_seq, second.msg_seq)
                cleared = client.clear_dirty(2, 7, second.msg_seq)
                self.assertEqual(cleared.cleared_seq, second.msg_seq)
                self.assertEqual(client.dirty(2).markers, [])

    def test_dirty_hints_after_subscribe_dirty(self) -> None:
        with Daemon("--large-group-members", "2") as daemon:
            token = read_token_file(daemon.token_file)
            with Client(daemon.host, daemon.port, token) as writer, Client(
                daemon.host, daemon.port, token
            ) as watcher:
                for uid in (1, 2, 3):
                    writer.join(8, uid)
                watcher.subscribe_dirty([2])
                sent = writer.send(8, 1, 1, b"one")
                hints = watcher.dirty_hints(wait_s=5.0)
                self.assertEqual(hints, [c.DirtyHint(2, 8, sent.msg_seq, sent.msg_seq)])
