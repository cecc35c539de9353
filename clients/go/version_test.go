package inboxd

// Protocol version 3 against a real daemon: the limits HELLO_OK adds,
// SNAPSHOT_PAGE's elided list, what a version 2 connection still gets,
// and the fall back to version 2 when a server refuses version 3.

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestHelloOkCarriesEveryLimitOfVersion3(t *testing.T) {
	d := newDaemon(t, "--max-connections", "7", "--subscribe-uids-max", "3", "--subscriptions-max", "11",
		"--large-group-members", "4", "--idempotency-ttl-s", "90")
	c := dial(t, d.addr, testToken)
	s := c.Server()
	if s.Version != 3 || s.MaxConnections != 7 || s.SubscribeUIDsMax != 3 || s.SubscriptionsMax != 11 ||
		s.LargeGroupMembers != 4 || s.IdempotencyTTL != 90*time.Second {
		t.Fatalf("server info %+v", s)
	}
	if s.PayloadBytesMax != 65536 || s.SnapshotTTL != time.Hour {
		t.Fatalf("the version 2 limits moved: %+v", s)
	}
	// The limits are the ones the server holds the connection to.
	ctx := testCtx(t)
	err := c.Subscribe(ctx, 1, 2, 3, 4)
	if e := wantCode(t, err, ErrTooLarge); e.Detail != uint64(s.SubscribeUIDsMax) {
		t.Fatalf("SUBSCRIBE over the cap: detail %d", e.Detail)
	}
	need(struct{}{}, c.Subscribe(ctx, 1, 2, 3))
}

func TestAVersion2ConnectionGetsTheVersion2LayoutsOfAVersion3Server(t *testing.T) {
	d := newDaemon(t)
	ctx := testCtx(t)
	c, err := Dial(ctx, d.addr, Options{Token: []byte(testToken), ProtocolVersion: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := c.Server()
	if s.Version != 2 || s.SnapshotTTL != time.Hour || s.MaxConnections != 0 || s.IdempotencyTTL != 0 {
		t.Fatalf("server info %+v", s)
	}
	// An ERROR and a SNAPSHOT_PAGE in the version 2 layout: a reply read
	// in the wrong one fails as a ProtocolError.
	_, err = c.SnapshotInfo(ctx, 50, 99)
	wantCode(t, err, ErrNotFound)
	need(c.RegisterDevice(ctx, 50, 1))
	need(c.Join(ctx, 50, 50))
	need(c.Send(ctx, SendRequest{Conv: 50, Sender: 50, Payload: []byte("in the snapshot")}))
	var messages []Message
	need(c.InstallSnapshot(ctx, 50, 1, func(p SnapshotPage) error {
		if p.Elided != nil {
			t.Errorf("a version 2 page names elided messages: %v", p.Elided)
		}
		messages = append(messages, p.Messages...)
		return nil
	}))
	if len(messages) != 2 || string(messages[1].Payload) != "in the snapshot" {
		t.Fatalf("snapshot messages %+v", messages)
	}
}

func TestAVersion2ConnectionReadsTheRefusalsAVersion3ServerSendsInItsOwnLayout(t *testing.T) {
	d := newDaemon(t)
	ctx := testCtx(t)
	c, err := Dial(ctx, d.addr, Options{Token: []byte(testToken), ProtocolVersion: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Refused before they run, these come with leader_addr's byte.
	_, err = c.roundTripRaw(ctx, 0x7e, nil)
	wantCode(t, err, ErrUnsupported)
	_, err = c.Stats(ctx)
	wantCode(t, err, ErrForbidden)
	need(struct{}{}, c.Ping(ctx))
}

// sendBig sends count messages of size bytes from sender to conv.
func sendBig(t *testing.T, c *Client, conv, sender uint64, count, size int) {
	ctx := testCtx(t)
	for i := 0; i < count; i++ {
		need(c.Send(ctx, SendRequest{Conv: conv, Sender: sender, Payload: bytes.Repeat([]byte{'a' + byte(i%26)}, size)}))
	}
}

func TestASnapshotPageNamesTheMessagesTooLargeForAnyReply(t *testing.T) {
	d := newDaemon(t, "--reply-frame-bytes-max", "40000")
	for _, version := range []uint16{3, 2} {
		c, err := Dial(testCtx(t), d.addr, Options{Token: []byte(testToken), ProtocolVersion: version})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx := testCtx(t)
		uid := uint64(version) // one user, conversation and device per version
		need(c.Join(ctx, uid, uid))
		sendBig(t, c, uid, uid, 1, 60000) // msg_seq 2: over the 40,000-byte reply limit
		sendBig(t, c, uid, uid, 1, 100)   // msg_seq 3
		need(c.RegisterDevice(ctx, uid, 1))
		var elided []MsgRef
		sizes := map[uint64]int{}
		need(c.InstallSnapshot(ctx, uid, 1, func(p SnapshotPage) error {
			elided = append(elided, p.Elided...)
			for _, m := range p.Messages {
				sizes[m.MsgSeq] = len(m.Payload)
			}
			return nil
		}))
		if sizes[2] != int(c.Server().SummaryBytesMax) || sizes[3] != 100 {
			t.Fatalf("version %d: payload sizes by msg_seq %v", version, sizes)
		}
		want := []MsgRef{{Conv: uid, MsgSeq: 2}}
		if version == 2 {
			want = nil // the layout has no such list
		}
		if !reflect.DeepEqual(elided, want) {
			t.Fatalf("version %d: elided %v, want %v", version, elided, want)
		}
	}
}

func TestASupersededSnapshotIsNotFoundAndItsAckConflicts(t *testing.T) {
	d := newDaemon(t)
	c := dial(t, d.addr, testToken)
	ctx := testCtx(t)
	need(c.RegisterDevice(ctx, 60, 1))
	first := need(c.BeginSnapshot(ctx, 60, 1))
	second := need(c.BeginSnapshot(ctx, 60, 1))
	if second.Generation != first.Generation+1 {
		t.Fatalf("snapshots %+v then %+v", first, second)
	}
	_, err := c.AckSnapshot(ctx, 60, 1, first.SnapshotID, second.Generation)
	wantCode(t, err, ErrConflict)
	_, err = c.SnapshotInfo(ctx, 60, first.SnapshotID)
	wantCode(t, err, ErrNotFound)
	if got := need(c.AckSnapshot(ctx, 60, 1, second.SnapshotID, second.Generation)); got.State != DeviceActive {
		t.Fatalf("after installing the newer snapshot %+v", got)
	}
}

// versionedServer stands in for a server of another version: it answers
// a HELLO of a version above newest with UNSUPPORTED (detail = newest, in
// the version 2 ERROR layout) and closes, and any other with the
// version 2 HELLO_OK of PROTOCOL.md, then PONGs every PING. It records
// the versions asked for.
func versionedServer(t *testing.T, newest uint16) (addr string, asked func() []uint16) {
	helloOK := protocolExamples(t)["hello-ok-v2"]
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var mu sync.Mutex
	var versions []uint16
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func(nc net.Conn) {
				defer nc.Close()
				r := bufio.NewReader(nc)
				_, id, body, err := readFrame(r, 1<<20)
				if err != nil {
					return
				}
				d := decoder{b: body}
				version := d.u16()
				mu.Lock()
				versions = append(versions, version)
				mu.Unlock()
				if version > newest {
					e := newFrame(opError, 0)
					e.u16(uint16(CodeUnsupported))
					e.u64(uint64(newest))
					e.str("protocol version not supported")
					nc.Write(e.finish(id))
					return
				}
				nc.Write(helloOK)
				for {
					op, id, _, err := readFrame(r, 1<<20)
					if err != nil || op != opPing {
						return
					}
					nc.Write(newFrame(opPing|0x80, 0).finish(id))
				}
			}(nc)
		}
	}()
	return l.Addr().String(), func() []uint16 {
		mu.Lock()
		defer mu.Unlock()
		return append([]uint16{}, versions...)
	}
}

func TestAClientConnectsAgainWithTheVersionAnUnsupportedNames(t *testing.T) {
	ctx := testCtx(t)
	addr, asked := versionedServer(t, 2)
	c, err := Dial(ctx, addr, Options{Token: []byte("t")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Server().Version != 2 || !reflect.DeepEqual(asked(), []uint16{3, 2}) {
		t.Fatalf("version %d after asking for %v", c.Server().Version, asked())
	}
	need(struct{}{}, c.Ping(ctx))

	// A pinned version is not lowered.
	addr, asked = versionedServer(t, 2)
	_, err = Dial(ctx, addr, Options{Token: []byte("t"), ProtocolVersion: 3})
	if e := wantCode(t, err, ErrUnsupported); e.Detail != 2 || !reflect.DeepEqual(asked(), []uint16{3}) {
		t.Fatalf("detail %d after asking for %v", e.Detail, asked())
	}
	// Nor lowered below what this client speaks.
	addr, asked = versionedServer(t, 1)
	_, err = Dial(ctx, addr, Options{Token: []byte("t")})
	if e := wantCode(t, err, ErrUnsupported); e.Detail != 1 || !reflect.DeepEqual(asked(), []uint16{3}) {
		t.Fatalf("detail %d after asking for %v", e.Detail, asked())
	}
}

func TestAVersionThisClientDoesNotSpeakIsRefusedBeforeConnecting(t *testing.T) {
	addr, asked := versionedServer(t, 3)
	for _, version := range []uint16{1, 4} {
		_, err := Dial(testCtx(t), addr, Options{Token: []byte("t"), ProtocolVersion: version})
		if err == nil || !strings.Contains(err.Error(), "ProtocolVersion") {
			t.Fatalf("version %d: %v", version, err)
		}
		var e *Error
		if errors.As(err, &e) {
			t.Fatalf("version %d reached a server: %v", version, err)
		}
	}
	if got := asked(); len(got) != 0 {
		t.Fatalf("HELLOs sent: %v", got)
	}
}
