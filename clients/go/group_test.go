package inboxd

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

func TestAFollowerAnswersNotLeaderNamingTheLeadersAddress(t *testing.T) {
	g := startGroup(t, 3)
	ctx := testCtx(t)
	leader := g.leader(t, ctx)
	follower := (leader + 1) % 3
	c := dial(t, g.clients[follower], testToken)
	// Until the follower has heard from the leader it names none.
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, err = c.Join(ctx, 1, 1)
		if e, ok := err.(*Error); !ok || e.LeaderAddr() != "" {
			break
		}
	}
	e := wantCode(t, err, ErrNotLeader)
	if e.LeaderAddr() != g.clients[leader] || !e.hasLeaderAddr {
		t.Fatalf("NOT_LEADER names %q (in the leader_addr field: %v), the leader is %s",
			e.LeaderAddr(), e.hasLeaderAddr, g.clients[leader])
	}
	// A version 2 connection has no such field: the message names it.
	v2, err := Dial(ctx, g.clients[follower], Options{Token: []byte(testToken), ProtocolVersion: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer v2.Close()
	_, err = v2.Join(ctx, 1, 1)
	if e := wantCode(t, err, ErrNotLeader); e.LeaderAddr() != g.clients[leader] || e.hasLeaderAddr {
		t.Fatalf("version 2 NOT_LEADER names %q (%+v), the leader is %s", e.LeaderAddr(), e, g.clients[leader])
	}
	for _, version := range []uint16{3, 2} {
		pool, err := NewPool(ctx, []string{g.clients[follower]}, Options{Token: []byte(testToken), ProtocolVersion: version})
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		need(pool.Join(ctx, 1, 1))
		if pool.Addr() != g.clients[leader] {
			t.Fatalf("version %d: the pool talks to %s, the leader is %s", version, pool.Addr(), g.clients[leader])
		}
	}
}

func TestAPoolCarriesOnThroughTheLeadersDeathWithoutLosingOrDoublingASend(t *testing.T) {
	g := startGroup(t, 3)
	ctx := testCtx(t)
	leader := g.leader(t, ctx)
	pool, err := NewPool(ctx, g.clients, Options{Token: []byte(testToken), Patience: 40 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	need(pool.Join(ctx, 1, 1))

	const writers, sends = 8, 40
	killed := make(chan struct{})
	var kill sync.Once
	var wg sync.WaitGroup
	replies := make([][]SendReply, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < sends; i++ {
				if w == 0 && i == sends/4 {
					kill.Do(func() { g.members[leader].kill(); close(killed) })
				}
				r, err := pool.Send(ctx, SendRequest{Conv: 1, Sender: 1, Payload: []byte(fmt.Sprintf("%d/%d", w, i))})
				if err != nil {
					t.Errorf("writer %d send %d: %v", w, i, err)
					return
				}
				replies[w] = append(replies[w], r)
			}
		}(w)
	}
	wg.Wait()
	<-killed
	if t.Failed() {
		return
	}
	if pool.Addr() == g.clients[leader] {
		t.Fatal("the pool still talks to the dead leader")
	}
	seen := map[string]int{}
	for before := uint64(0); ; {
		page := need(pool.History(ctx, HistoryRequest{UID: 1, Conv: 1, BeforeSeq: before, Limit: 500}))
		for _, m := range page.Messages {
			seen[string(m.Payload)]++
			before = m.MsgSeq
		}
		if !page.HasMore {
			break
		}
	}
	for w := 0; w < writers; w++ {
		for i := 0; i < sends; i++ {
			if n := seen[fmt.Sprintf("%d/%d", w, i)]; n != 1 {
				t.Fatalf("send %d/%d is in the log %d times", w, i, n)
			}
		}
	}
}

// fakeMember accepts connections, answers HELLO with the default
// HELLO_OK, and hands every later request frame to serve, which answers
// it or closes the connection.
func fakeMember(t *testing.T, serve func(conn int, frame []byte) []byte) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	helloOK := newFrame(opHello|0x80, 0)
	helloOK.u16(2)
	helloOK.str("fake")
	for _, v := range []uint32{1 << 20, 256, 64 << 20, 65536, 64, 100, 500, 50, 500, 500, 500, 5, 20000, 2000} {
		helloOK.u32(v)
	}
	for _, v := range []uint64{300000, 600000, 600000, 3600000} {
		helloOK.u64(v)
	}
	hello := helloOK.finish(1)
	go func() {
		for n := 0; ; n++ {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func(n int, nc net.Conn) {
				defer nc.Close()
				r := bufio.NewReader(nc)
				if _, _, _, err := readFrame(r, 1<<20); err != nil {
					return
				}
				nc.Write(hello)
				for {
					op, id, body, err := readFrame(r, 1<<20)
					if err != nil {
						return
					}
					frame := append([]byte{op}, body...)
					answer := serve(n, frame)
					if answer == nil {
						return
					}
					e := newFrame(op|0x80, len(answer))
					e.b = append(e.b, answer...)
					nc.Write(e.finish(id))
				}
			}(n, nc)
		}
	}()
	return l.Addr().String()
}

func TestAPoolRetriesASendWhoseConnectionBrokeWithTheSameIdempotencyKey(t *testing.T) {
	var mu sync.Mutex
	var sent [][]byte
	addr := fakeMember(t, func(conn int, frame []byte) []byte {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, frame)
		if conn == 0 {
			return nil // the reply is lost: the connection breaks
		}
		e := encoder{}
		e.u64(7)
		e.u64(3)
		e.boolean(true)
		return e.b
	})
	ctx := testCtx(t)
	pool, err := NewPool(ctx, []string{addr}, Options{Token: []byte("t"), PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r := need(pool.Send(ctx, SendRequest{Conv: 1, Sender: 1, Payload: []byte("once")}))
	if r != (SendReply{MsgID: 7, MsgSeq: 3, Duplicate: true}) {
		t.Fatalf("reply %+v", r)
	}
	if len(sent) != 2 || !bytes.Equal(sent[0], sent[1]) {
		t.Fatalf("the retry is not the same request: %x", sent)
	}
	key := sent[0][1+16 : 1+32]
	if bytes.Equal(key, make([]byte, 16)) {
		t.Fatal("the send went out without an idempotency key")
	}
}
