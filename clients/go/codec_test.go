package inboxd

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// protocolExamples reads the worked examples out of docs/PROTOCOL.md:
// each block after `<!-- example: NAME -->`, the bytes of a line ending
// at its first word that is not two hex digits.
func protocolExamples(t *testing.T) map[string][]byte {
	text, err := os.ReadFile(filepath.Join("..", "..", "docs", "PROTOCOL.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	name, inBlock := "", false
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "<!-- example: "):
			name = strings.TrimSuffix(strings.TrimPrefix(line, "<!-- example: "), " -->")
		case line == "```" && name != "" && !inBlock:
			inBlock = true
		case line == "```" && inBlock:
			name, inBlock = "", false
		case inBlock:
			for _, word := range strings.Fields(line) {
				b, err := hex.DecodeString(word)
				if err != nil || len(word) != 2 {
					break
				}
				out[name] = append(out[name], b...)
			}
		}
	}
	return out
}

// exampleBody checks an example's header and returns its body.
func exampleBody(t *testing.T, frame []byte, op byte, id uint64) []byte {
	t.Helper()
	r := bufio.NewReader(bytes.NewReader(frame))
	gotOp, gotID, body, err := readFrame(r, 1<<20)
	if err != nil || gotOp != op || gotID != id || r.Buffered() != 0 {
		t.Fatalf("frame %x: op %#x id %d err %v", frame, gotOp, gotID, err)
	}
	return body
}

func decodeAll[T any](t *testing.T, body []byte, decode func(*decoder) T) T {
	t.Helper()
	d := decoder{b: body}
	v := decode(&d)
	if err := d.end(); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestTheRequestsOfProtocolMdAreEncodedByteForByte(t *testing.T) {
	ex := protocolExamples(t)
	cases := map[string][]byte{}
	cases["hello"] = helloFrame(ProtocolVersion, "ctl", []byte("s3cr3t"))
	e := newFrame(opSend, 0)
	e.u64(100)
	e.u64(1)
	e.u128(ClientMsgID{Lo: 0x1122})
	e.u16(1)
	e.bytes([]byte("hi"))
	cases["send"] = e.finish(2)
	e = newFrame(opClearDirty, 0)
	e.u64(2)
	e.u64(7)
	e.u64(9)
	cases["clear-dirty"] = e.finish(3)
	e = newFrame(opClusterAddNode, 0)
	e.u64(4)
	e.str("10.0.0.4:7080")
	e.str("10.0.0.4:7070")
	cases["cluster-add-node"] = e.finish(7)
	e = newFrame(opClusterRemoveNode, 0)
	e.u64(3)
	cases["cluster-remove-node"] = e.finish(8)
	for name, got := range cases {
		if want, ok := ex[name]; !ok || !bytes.Equal(got, want) {
			t.Errorf("%s: encoded %x, PROTOCOL.md has %x", name, got, want)
		}
	}
}

func TestTheRepliesOfProtocolMdAreDecoded(t *testing.T) {
	ex := protocolExamples(t)
	u64 := func(v uint64) *uint64 { return &v }

	v2 := ServerInfo{2, "inboxd", 1048576, 256, 67108864, 65536, 64, 100, 500, 50, 500, 500, 500, 5, 20000, 2000,
		300 * time.Second, 600 * time.Second, 600 * time.Second, time.Hour, 0, 0, 0, 0, 0}
	v3 := v2
	v3.Version, v3.MaxConnections, v3.SubscribeUIDsMax, v3.SubscriptionsMax = 3, 1024, 100000, 1000000
	v3.LargeGroupMembers, v3.IdempotencyTTL = 500, 7*24*time.Hour
	if hello := decodeAll(t, exampleBody(t, ex["hello-ok"], 0x81, 1), decodeServerInfo); hello != v3 {
		t.Errorf("hello-ok %+v", hello)
	}
	if hello := decodeAll(t, exampleBody(t, ex["hello-ok-v2"], 0x81, 1), decodeServerInfo); hello != v2 {
		t.Errorf("hello-ok-v2 %+v", hello)
	}
	v1 := decodeAll(t, exampleBody(t, ex["hello-ok-v1"], 0x81, 1), decodeServerInfo)
	if v1 != (ServerInfo{Version: 1, ServerName: "inboxd", FrameBytesMax: 1048576, InFlightMax: 256}) {
		t.Errorf("hello-ok-v1 %+v", v1)
	}
	if r := decodeAll(t, exampleBody(t, ex["send-reply"], 0x92, 2), decodeSendReply); r != (SendReply{1024, 3, false}) {
		t.Errorf("send-reply %+v", r)
	}
	err := decodeError(exampleBody(t, ex["rate-limited"], opError, 9), 3)
	if e, ok := err.(*Error); !ok || e.Code != CodeRateLimited || e.RetryAfter() != 250*time.Millisecond || e.Message != "slow down" {
		t.Errorf("rate-limited %v", err)
	}
	err = decodeError(exampleBody(t, ex["marker-moved"], opError, 3), 3)
	if e, ok := err.(*Error); !ok || e.Code != CodeMarkerMoved || e.Detail != 10 {
		t.Errorf("marker-moved %v", err)
	}
	notLeader := exampleBody(t, ex["not-leader"], opError, 7)
	for _, version := range []uint16{3, 0} {
		err = decodeError(notLeader, version)
		if e, ok := err.(*Error); !ok || e.Code != CodeNotLeader || e.LeaderAddr() != "10.0.0.2:7070" || e.Message != "not the leader" {
			t.Errorf("not-leader read as version %d: %#v", version, err)
		}
	}
	if _, ok := decodeError(notLeader[:len(notLeader)-1], 3).(*ProtocolError); !ok {
		t.Error("a version 3 ERROR without a whole leader_addr is taken")
	}
	c := &conn{hints: make(chan Hint, 4), dirty: make(chan DirtyHint, 4)}
	c.push(opHint, exampleBody(t, ex["hint"], opHint, 0))
	if h := <-c.hints; h != (Hint{UID: 1, CommittedSyncSeq: 12}) {
		t.Errorf("hint %+v", h)
	}
	page := decodeAll(t, exampleBody(t, ex["sync-reply"], 0xa3, 4), decodeSyncPage)
	want := SyncPage{
		Events:     []Event{{SyncSeq: 1, Kind: EventMsg, Conv: 100, MsgSeq: 3, MsgID: 1024, Summary: []byte("hi")}},
		NextCursor: 1, BatchHWM: 1, BatchToken: []byte{0xaa, 0xbb}, Generation: 1,
	}
	if !reflect.DeepEqual(page, want) {
		t.Errorf("sync-reply %+v", page)
	}
	explain := decodeAll(t, exampleBody(t, ex["explain-reply"], 0xe1, 5), decodeUserExplain)
	if !reflect.DeepEqual(explain, UserExplain{UID: 1, OldestRetained: 5, CommittedSyncSeq: 9, Floor: 4,
		Fences: []Fence{{Kind: FenceDeviceAck, Device: 7, AckedSyncSeq: 4}, {Kind: 9, Body: []byte{0xee, 0xee}}}}) {
		t.Errorf("explain-reply %+v", explain)
	}
	dirty := decodeAll(t, exampleBody(t, ex["dirty-reply"], 0xb5, 4), decodeDirtyMarkers)
	if !reflect.DeepEqual(dirty, []DirtyMarker{{Conv: 7, TargetMsgSeq: 10, Version: 10}}) {
		t.Errorf("dirty-reply %+v", dirty)
	}
	memory := decodeAll(t, exampleBody(t, ex["memory-reply"], 0xe5, 5), decodeMemoryReport)
	if !reflect.DeepEqual(memory, MemoryReport{WalkUS: 120, LongestHoldUS: 35, Structures: []MemoryUse{{"idempotency", 4000, 5120}}}) {
		t.Errorf("memory-reply %+v", memory)
	}
	status := decodeAll(t, exampleBody(t, ex["cluster-status-reply"], 0xe6, 6), decodeClusterStatus)
	if !reflect.DeepEqual(status, ClusterStatus{NodeID: 1, Role: "leader", Term: 3, Leader: u64(1), LastLogIndex: 42,
		LastAppliedIndex: 42, MillisSinceQuorumAck: u64(12), Members: []ClusterMember{
			{1, "10.0.0.1:7080", "10.0.0.1:7070", u64(42)}, {2, "10.0.0.2:7080", "10.0.0.2:7070", u64(40)}}}) {
		t.Errorf("cluster-status-reply %+v", status)
	}
}

func TestAReplyWithTrailingBytesOrABadTagIsAProtocolError(t *testing.T) {
	for name, body := range map[string][]byte{
		"trailing": {0, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0xff},
		"bad bool": {0, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 2},
		"short":    {0, 4, 0},
	} {
		d := decoder{b: body}
		decodeSendReply(&d)
		if d.end() == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	d := decoder{b: []byte{0xff, 0xff, 0xff, 0x7f}}
	if n := d.count(1); n != 0 || d.err == nil {
		t.Error("a list count past the body is taken")
	}
}
