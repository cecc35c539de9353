package inboxd

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// need is a call's result; an error fails the test (by a panic, which
// the test runner reports with the call's line, after the cleanups).
func need[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("unexpected error: %v", err))
	}
	return v
}

func wantCode(t *testing.T, err error, sentinel *Error) *Error {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("got %v, want %s", err, sentinel.Code)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("errors.As of %v", err)
	}
	return e
}

func TestHelloOkCarriesTheLimitsTheServerEnforces(t *testing.T) {
	d := newDaemon(t)
	c := dial(t, d.addr, testToken)
	s := c.Server()
	if s.Version != ProtocolVersion || s.PayloadBytesMax != 65536 || s.SyncPageMax != 500 || s.IdleTimeout != 300*time.Second {
		t.Fatalf("server info %+v", s)
	}
	ctx := testCtx(t)
	need(c.Join(ctx, 1, 1))
	_, err := c.Send(ctx, SendRequest{Conv: 1, Sender: 1, Payload: make([]byte, s.PayloadBytesMax+1)})
	if e := wantCode(t, err, ErrTooLarge); e.Detail != uint64(s.PayloadBytesMax) {
		t.Fatalf("detail %d", e.Detail)
	}
	_, err = c.Sync(ctx, SyncRequest{UID: 1, Device: 1, Limit: s.SyncPageMax + 1})
	wantCode(t, err, ErrBadRequest)
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("the connection goes on after a refused request: %v", err)
	}
}

func TestMessagesRecallEditHistoryPullAndReadState(t *testing.T) {
	d := newDaemon(t)
	c := dial(t, d.addr, testToken)
	ctx := testCtx(t)
	_, err := c.Send(ctx, SendRequest{Conv: 100, Sender: 1, Payload: []byte("nobody joined")})
	wantCode(t, err, ErrNotFound)
	need(c.Join(ctx, 100, 1))
	need(c.Join(ctx, 100, 2))
	_, err = c.Send(ctx, SendRequest{Conv: 100, Sender: 3, Payload: []byte("not a member")})
	wantCode(t, err, ErrForbidden)

	key := ClientMsgID{Lo: 0x1122}
	hi := need(c.Send(ctx, SendRequest{Conv: 100, Sender: 1, ClientMsgID: key, MsgType: 1, Payload: []byte("hi")}))
	again := need(c.Send(ctx, SendRequest{Conv: 100, Sender: 1, ClientMsgID: key, MsgType: 1, Payload: []byte("hi")}))
	if hi.Duplicate || !again.Duplicate || again.MsgID != hi.MsgID || again.MsgSeq != hi.MsgSeq {
		t.Fatalf("first %+v, retry %+v", hi, again)
	}
	_, err = c.Send(ctx, SendRequest{Conv: 100, Sender: 1, ClientMsgID: key, MsgType: 1, Payload: []byte("bye")})
	wantCode(t, err, ErrConflict)

	hello := need(c.Send(ctx, SendRequest{Conv: 100, Sender: 1, MsgType: 1, Payload: []byte("hello")}))
	edit := need(c.Edit(ctx, EditRequest{Conv: 100, Sender: 1, Target: hello.MsgID, Payload: []byte("hello, edited")}))
	_, err = c.Edit(ctx, EditRequest{Conv: 100, Sender: 2, Target: hello.MsgID, Payload: []byte("not yours")})
	wantCode(t, err, ErrForbidden)
	recall := need(c.Recall(ctx, RecallRequest{Conv: 100, Sender: 1, Target: hi.MsgID}))
	_, err = c.Recall(ctx, RecallRequest{Conv: 100, Sender: 1, Target: hi.MsgID})
	wantCode(t, err, ErrConflict)

	page := need(c.History(ctx, HistoryRequest{UID: 2, Conv: 100}))
	// User 2 sees from its own join on: five entries.
	if page.HasMore || len(page.Messages) != 5 {
		t.Fatalf("history %+v", page)
	}
	newest := page.Messages[0]
	if newest.MsgSeq != recall.MsgSeq || newest.Kind != KindRecall || newest.Target != hi.MsgID {
		t.Fatalf("newest %+v", newest)
	}
	byID := map[uint64]Message{}
	for _, m := range page.Messages {
		byID[m.MsgID] = m
	}
	if m := byID[edit.MsgID]; m.Kind != KindEdit || m.Target != hello.MsgID || string(m.Payload) != "hello, edited" {
		t.Fatalf("edit %+v", m)
	}
	if m := byID[hello.MsgID]; !m.Tombstone || len(m.Payload) != 0 {
		t.Fatalf("edited original %+v", m)
	}
	older := need(c.History(ctx, HistoryRequest{UID: 2, Conv: 100, BeforeSeq: hello.MsgSeq, Limit: 1}))
	if len(older.Messages) != 1 || older.Messages[0].MsgSeq != hi.MsgSeq || !older.HasMore {
		t.Fatalf("older page %+v", older)
	}

	pulled := need(c.Pull(ctx, 2, 2, []PullCursor{{Conv: 100, AfterSeq: hi.MsgSeq}}))
	if len(pulled) != 1 || len(pulled[0].Messages) != 2 || !pulled[0].HasMore || pulled[0].MaxSeq != recall.MsgSeq {
		t.Fatalf("pull %+v", pulled)
	}
	if pulled[0].Messages[0].MsgSeq != hello.MsgSeq {
		t.Fatalf("pull is oldest first: %+v", pulled[0].Messages)
	}

	read := need(c.MarkRead(ctx, 2, 100, hello.MsgSeq))
	if read.ReadSeq != hello.MsgSeq {
		t.Fatalf("read %+v", read)
	}
	if err := c.SetConvFlags(ctx, 2, 100, true, false); err != nil {
		t.Fatal(err)
	}
	list := need(c.ConvList(ctx, 2, 0, nil))
	if len(list.Convs) != 1 || list.NextCursor != nil {
		t.Fatalf("conv list %+v", list)
	}
	if s := list.Convs[0]; s.Conv != 100 || !s.Muted || s.Pinned || s.ReadSeq != hello.MsgSeq || s.LastMsgSeq != recall.MsgSeq {
		t.Fatalf("summary %+v", s)
	}

	left := need(c.Leave(ctx, 100, 2))
	if left.MsgSeq != recall.MsgSeq+1 {
		t.Fatalf("leave %+v", left)
	}
	_, err = c.Send(ctx, SendRequest{Conv: 100, Sender: 2, Payload: []byte("gone")})
	wantCode(t, err, ErrForbidden)
}

func TestDevicesSyncAckLeaseRevokeAndTheirErrors(t *testing.T) {
	d := newDaemon(t)
	c := dial(t, d.addr, testToken)
	ctx := testCtx(t)
	need(c.Join(ctx, 40, 40))
	reg := need(c.RegisterDevice(ctx, 40, 1))
	if reg.Device.Generation != 1 || reg.Device.State != DeviceActive || reg.Evicted != nil {
		t.Fatalf("registration %+v", reg)
	}
	for i := 0; i < 5; i++ {
		need(c.Send(ctx, SendRequest{Conv: 40, Sender: 40, Payload: []byte{byte(i)}}))
	}
	gen := reg.Device.Generation
	page := need(c.Sync(ctx, SyncRequest{UID: 40, Device: 1, Generation: gen, Limit: 2}))
	if len(page.Events) != 2 || !page.HasMore || page.Events[0].Kind != EventMember {
		t.Fatalf("first page %+v", page)
	}
	_, err := c.Ack(ctx, AckRequest{UID: 40, Device: 1, Generation: gen, Seq: page.BatchHWM + 1, BatchToken: page.BatchToken})
	if e := wantCode(t, err, ErrAckBeyondHWM); e.Detail != page.BatchHWM {
		t.Fatalf("detail %d, hwm %d", e.Detail, page.BatchHWM)
	}
	_, err = c.Ack(ctx, AckRequest{UID: 40, Device: 1, Generation: gen, Seq: 1, BatchToken: []byte("forged")})
	wantCode(t, err, ErrBadToken)
	_, err = c.Ack(ctx, AckRequest{UID: 40, Device: 1, Generation: gen + 7, Seq: 1, BatchToken: page.BatchToken})
	if e := wantCode(t, err, ErrStaleGeneration); e.Detail != gen {
		t.Fatalf("detail %d", e.Detail)
	}
	acked := need(c.Ack(ctx, AckRequest{UID: 40, Device: 1, Generation: gen, Seq: page.BatchHWM, BatchToken: page.BatchToken}))
	if acked != page.BatchHWM {
		t.Fatalf("acked %d", acked)
	}

	// The device lost its store: a recovery lease from where it is.
	lost := need(c.Sync(ctx, SyncRequest{UID: 40, Device: 1, Generation: gen, LocalAppliedSeq: 2}))
	if lost.Lease == nil || lost.Lease.ResumeFrom != 2 || lost.Generation != gen+1 || lost.Events[0].SyncSeq != 3 {
		t.Fatalf("recovery page %+v", lost)
	}
	need(c.Ack(ctx, AckRequest{UID: 40, Device: 1, Generation: lost.Generation, Seq: lost.NextCursor, BatchToken: lost.BatchToken}))
	_, err = c.FinishLease(ctx, 40, 1, lost.Lease.LeaseID+1, lost.Generation)
	wantCode(t, err, ErrConflict)
	info := need(c.FinishLease(ctx, 40, 1, lost.Lease.LeaseID, lost.Generation))
	if info.State != DeviceActive {
		t.Fatalf("after the lease %+v", info)
	}

	devices := need(c.Devices(ctx, 40))
	if len(devices) != 1 || devices[0].Device != 1 || devices[0].AckedSyncSeq != lost.NextCursor {
		t.Fatalf("devices %+v", devices)
	}
	revoked := need(c.RevokeDevice(ctx, 40, 1))
	if revoked.State != DeviceRevoked {
		t.Fatalf("revoked %+v", revoked)
	}
	_, err = c.Sync(ctx, SyncRequest{UID: 40, Device: 1, Generation: lost.Generation, LocalAppliedSeq: lost.NextCursor})
	wantCode(t, err, ErrDeviceRevoked)

	cap := int(c.Server().DevicesPerUserMax)
	for dev := 1; dev <= cap; dev++ {
		need(c.RegisterDevice(ctx, 45, uint64(dev)))
	}
	extra := need(c.RegisterDevice(ctx, 45, uint64(cap+1)))
	if extra.Evicted == nil || *extra.Evicted != 1 {
		t.Fatalf("the least recently seen is evicted: %+v", extra)
	}
}

func TestASnapshotInstallAndTheErrorsOfAResettingDevice(t *testing.T) {
	d := newDaemon(t)
	c := dial(t, d.addr, testToken)
	ctx := testCtx(t)
	reg := need(c.RegisterDevice(ctx, 50, 1))
	need(c.Join(ctx, 50, 50))
	need(c.Send(ctx, SendRequest{Conv: 50, Sender: 50, Payload: []byte("in the snapshot")}))

	info := need(c.BeginSnapshot(ctx, 50, 1))
	if info.State != SnapshotReady || info.Generation != reg.Device.Generation+1 || info.Pages == 0 {
		t.Fatalf("snapshot %+v", info)
	}
	if again := need(c.SnapshotInfo(ctx, 50, info.SnapshotID)); again != info {
		t.Fatalf("snapshot info %+v, begun %+v", again, info)
	}
	_, err := c.SnapshotInfo(ctx, 50, info.SnapshotID+100)
	wantCode(t, err, ErrNotFound)
	_, err = c.Sync(ctx, SyncRequest{UID: 50, Device: 1, Generation: info.Generation})
	if e := wantCode(t, err, ErrResetRequired); e.Detail != info.Generation {
		t.Fatalf("detail %d", e.Detail)
	}
	found := false
	for i := uint32(0); i < info.Pages; i++ {
		page := need(c.SnapshotPage(ctx, 50, info.SnapshotID, i))
		for _, m := range page.Messages {
			found = found || string(m.Payload) == "in the snapshot"
		}
	}
	if !found {
		t.Fatal("the message is not in the snapshot")
	}
	_, err = c.SnapshotPage(ctx, 50, info.SnapshotID, info.Pages)
	wantCode(t, err, ErrBadRequest)
	_, err = c.AckSnapshot(ctx, 50, 1, info.SnapshotID, info.Generation+1)
	if err == nil {
		t.Fatal("an ACK_SNAPSHOT of another generation was taken")
	}
	device := need(c.AckSnapshot(ctx, 50, 1, info.SnapshotID, info.Generation))
	if device.State != DeviceActive || device.AckedSyncSeq != info.BaseSyncSeq {
		t.Fatalf("after the install %+v", device)
	}
	_, err = c.AckSnapshot(ctx, 50, 1, info.SnapshotID, info.Generation)
	wantCode(t, err, ErrConflict)
}

func TestTheAdminRequestsNeedTheAdminToken(t *testing.T) {
	d := newDaemon(t)
	ctx := testCtx(t)
	user := dial(t, d.addr, testToken)
	_, err := user.Stats(ctx)
	wantCode(t, err, ErrForbidden)
	if err := user.Ping(ctx); err != nil {
		t.Fatalf("FORBIDDEN leaves the connection open: %v", err)
	}
	need(user.Join(ctx, 9, 9))
	need(user.RegisterDevice(ctx, 9, 1))

	admin := dial(t, d.addr, testAdminToken)
	stats := need(admin.Stats(ctx))
	if stats.Users != 1 || stats.Devices != 1 || stats.Conversations != 1 {
		t.Fatalf("stats %+v", stats)
	}
	explain := need(admin.Explain(ctx, 9))
	if explain.UID != 9 || explain.CommittedSyncSeq != 1 || len(explain.Fences) == 0 || explain.Fences[0].Kind != FenceDeviceAck {
		t.Fatalf("explain %+v", explain)
	}
	segment := need(admin.ExplainSegment(ctx, "evt", 1))
	if segment.Stream != "evt" || segment.Segment != 1 {
		t.Fatalf("segment %+v", segment)
	}
	_, err = admin.ExplainSegment(ctx, "evt", 0)
	wantCode(t, err, ErrNotFound)
	need(admin.Compact(ctx))
	if err := admin.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	memory := need(admin.Memory(ctx))
	var idem *MemoryUse
	for i := range memory.Structures {
		if memory.Structures[i].Structure == "idempotency" {
			idem = &memory.Structures[i]
		}
	}
	if idem == nil || idem.Allocated < idem.Live {
		t.Fatalf("memory %+v", memory)
	}
	status := need(admin.ClusterStatus(ctx))
	if status.Role != "single" || status.NodeID != 0 || len(status.Members) != 0 || status.Leader != nil {
		t.Fatalf("status %+v", status)
	}
	_, err = admin.ClusterAddNode(ctx, 2, "127.0.0.1:9", "127.0.0.1:10")
	wantCode(t, err, ErrBadRequest)
	_, err = admin.ClusterRemoveNode(ctx, 1)
	wantCode(t, err, ErrBadRequest)
}

func TestHintsArriveOnTheChannelOfTheSubscribedConnection(t *testing.T) {
	d := newDaemon(t)
	ctx := testCtx(t)
	watcher, writer := dial(t, d.addr, testToken), dial(t, d.addr, testToken)
	if err := watcher.Subscribe(ctx, 60); err != nil {
		t.Fatal(err)
	}
	need(writer.Join(ctx, 60, 60))
	need(writer.Send(ctx, SendRequest{Conv: 60, Sender: 60, Payload: []byte("ping")}))
	select {
	case h := <-watcher.Hints():
		if h.UID != 60 || h.CommittedSyncSeq < 1 {
			t.Fatalf("hint %+v", h)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no hint within 10 s")
	}
	if err := watcher.Unsubscribe(ctx, 60); err != nil {
		t.Fatal(err)
	}
}

func TestALargeGroupsMarkerIsPulledThenClearedAndMovesWithDirtyHints(t *testing.T) {
	d := newDaemon(t, "--large-group-members", "2")
	ctx := testCtx(t)
	c, watcher := dial(t, d.addr, testToken), dial(t, d.addr, testToken)
	for _, uid := range []uint64{1, 2, 3} {
		need(c.Join(ctx, 7, uid))
	}
	two := uint64(2)
	mode := need(c.ConvMode(ctx, 7, &two))
	if !mode.Large || mode.SwitchSeq == nil || *mode.SwitchSeq != 3 || mode.Marker == nil || mode.Marker.UID != 2 {
		t.Fatalf("mode %+v", mode)
	}
	if err := watcher.SubscribeDirty(ctx, 2); err != nil {
		t.Fatal(err)
	}
	first := need(c.Send(ctx, SendRequest{Conv: 7, Sender: 1, Payload: []byte("one")}))
	select {
	case h := <-watcher.DirtyHints():
		if h != (DirtyHint{UID: 2, Conv: 7, TargetMsgSeq: first.MsgSeq, Version: first.MsgSeq}) {
			t.Fatalf("dirty hint %+v", h)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no dirty hint within 10 s")
	}
	markers := need(c.Dirty(ctx, 2))
	if len(markers) != 1 || markers[0] != (DirtyMarker{Conv: 7, TargetMsgSeq: first.MsgSeq, Version: first.MsgSeq}) {
		t.Fatalf("markers %+v", markers)
	}
	second := need(c.Send(ctx, SendRequest{Conv: 7, Sender: 1, Payload: []byte("two")}))
	_, err := c.ClearDirty(ctx, 2, 7, markers[0].Version)
	if e := wantCode(t, err, ErrMarkerMoved); e.Detail != second.MsgSeq {
		t.Fatalf("detail %d", e.Detail)
	}
	cleared := need(c.ClearDirty(ctx, 2, 7, second.MsgSeq))
	if cleared != second.MsgSeq || len(need(c.Dirty(ctx, 2))) != 0 {
		t.Fatalf("cleared %d", cleared)
	}
}

func TestConnectionLevelRefusals(t *testing.T) {
	d := newDaemon(t, "--max-connections", "1")
	ctx := testCtx(t)
	_, err := Dial(ctx, d.addr, Options{Token: []byte("wrong")})
	wantCode(t, err, ErrUnauthenticated)
	first := dial(t, d.addr, testToken)
	_, err = Dial(ctx, d.addr, Options{Token: []byte(testToken)})
	if !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrClosed) {
		// The refusal is sent on accept; the handshake may read it or
		// only see the connection close.
		t.Fatalf("a connection over max_connections: %v", err)
	}
	_, err = first.roundTripRaw(ctx, 0x7e, nil)
	wantCode(t, err, ErrUnsupported)
	_, err = first.Send(ctx, SendRequest{Conv: 1, Sender: 1, Payload: make([]byte, first.Server().FrameBytesMax)})
	if e := wantCode(t, err, ErrTooLarge); e.Detail != uint64(first.Server().FrameBytesMax) {
		t.Fatalf("detail %d", e.Detail)
	}
	if err := first.Ping(ctx); err != nil {
		t.Fatalf("a frame over the limit is refused before it is sent: %v", err)
	}
	first.Close()
	if err := first.Ping(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("a call on a closed client: %v", err)
	}
}

// roundTripRaw sends any opcode, for the tests of what the server
// refuses.
func (cl *Client) roundTripRaw(ctx context.Context, op byte, body []byte) ([]byte, error) {
	d, err := cl.c.roundTrip(ctx, op, func(e *encoder) { e.b = append(e.b, body...) })
	return d.b, err
}

func TestRateLimitedSaysWhenToRetry(t *testing.T) {
	d := newDaemon(t, "--rate-per-s", "1", "--rate-burst", "2")
	ctx := testCtx(t)
	c := dial(t, d.addr, testToken)
	var err error
	for i := 0; i < 5 && err == nil; i++ {
		err = c.Ping(ctx)
	}
	e := wantCode(t, err, ErrRateLimited)
	if e.RetryAfter() <= 0 || e.RetryAfter() > 2*time.Second {
		t.Fatalf("retry after %v", e.RetryAfter())
	}
	time.Sleep(e.RetryAfter())
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("after the retry-after: %v", err)
	}
}

func TestEveryErrorCodeMatchesItsSentinelAndNoOther(t *testing.T) {
	sentinels := []*Error{ErrBadRequest, ErrUnauthenticated, ErrForbidden, ErrStaleGeneration, ErrResetRequired,
		ErrDeviceRevoked, ErrRateLimited, ErrTooLarge, ErrUnsupported, ErrInternal, ErrDeviceResetting, ErrNotFound,
		ErrBadToken, ErrAckBeyondHWM, ErrConflict, ErrNoSpace, ErrUnavailable, ErrMarkerMoved, ErrNotLeader}
	for i, s := range sentinels {
		if s.Code != Code(i+1) {
			t.Fatalf("sentinel %d has code %d", i, s.Code)
		}
		e := newFrame(0, 0)
		e.u16(uint16(s.Code))
		e.u64(42)
		e.str("why")
		err := fmt.Errorf("wrapped: %w", decodeError(e.b[13:], 2))
		for _, other := range sentinels {
			if errors.Is(err, other) != (other == s) {
				t.Fatalf("%v matches %s", err, other.Code)
			}
		}
		var got *Error
		if !errors.As(err, &got) || got.Detail != 42 || got.Message != "why" {
			t.Fatalf("errors.As: %+v", got)
		}
	}
	if unknown := (&Error{Code: 99}); unknown.Code.String() != "CODE_99" || errors.Is(unknown, ErrInternal) {
		t.Fatalf("an unknown code %v", unknown)
	}
}

func TestTheLeaderAddressIsReadOnlyFromNotLeader(t *testing.T) {
	// A version 2 server's NOT_LEADER: the address ends the message.
	cases := []struct {
		err  *Error
		want string
	}{
		{&Error{Code: CodeNotLeader, Message: "not the leader; leader node 2; leader_addr=127.0.0.1:7072"}, "127.0.0.1:7072"},
		{&Error{Code: CodeNotLeader, Message: "not the leader; no leader known yet"}, ""},
		{&Error{Code: CodeUnavailable, Message: "leader_addr=127.0.0.1:7072"}, ""},
		{&Error{Code: CodeNotLeader, Message: "leader_addr=nohost"}, ""},
	}
	// From version 3 on the field is the only source: a message that
	// mentions an address names none when the field is absent.
	for _, field := range []string{"", "127.0.0.1:7073"} {
		e := newFrame(0, 0)
		e.u16(uint16(CodeNotLeader))
		e.u64(0)
		e.str("not the leader; leader_addr=127.0.0.1:7072")
		e.boolean(field != "")
		if field != "" {
			e.str(field)
		}
		err := decodeError(e.b[13:], 3)
		if got := wantCode(t, err, ErrNotLeader).LeaderAddr(); got != field {
			t.Errorf("leader_addr field %q: leader %q", field, got)
		}
	}
	for _, c := range cases {
		if got := c.err.LeaderAddr(); got != c.want {
			t.Errorf("%v: leader %q, want %q", c.err, got, c.want)
		}
	}
	if step, addr := route(cases[0].err); step != toLeader || addr != "127.0.0.1:7072" {
		t.Fatalf("route %v %q", step, addr)
	}
	if step, _ := route(ErrConflict); step != giveUp {
		t.Fatal("a CONFLICT is retried")
	}
	if step, _ := route(&closedError{}); step != nextMember {
		t.Fatal("a broken connection is not retried on another member")
	}
}
