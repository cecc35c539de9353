package inboxd

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

func TestPipelinedSendsOfManyGoroutinesTakeEffectInTheOrderEachMadeThem(t *testing.T) {
	d := newDaemon(t)
	c := dial(t, d.addr, testToken)
	ctx := testCtx(t)
	const goroutines, sends = 16, 50
	need(c.Join(ctx, 1, 1))
	replies := make([][]SendReply, goroutines)
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < sends; i++ {
				r, err := c.Send(ctx, SendRequest{Conv: 1, Sender: 1, Payload: []byte(fmt.Sprintf("%d/%d", g, i))})
				if err != nil {
					t.Error(err)
					return
				}
				replies[g] = append(replies[g], r)
			}
		}(g)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	payloads := map[uint64]string{} // msg_seq -> payload, from the log
	for before := uint64(0); ; {
		page := need(c.History(ctx, HistoryRequest{UID: 1, Conv: 1, BeforeSeq: before, Limit: 500}))
		for _, m := range page.Messages {
			payloads[m.MsgSeq] = string(m.Payload)
			before = m.MsgSeq
		}
		if !page.HasMore {
			break
		}
	}
	for g, rs := range replies {
		for i, r := range rs {
			if i > 0 && r.MsgSeq <= rs[i-1].MsgSeq {
				t.Fatalf("goroutine %d: send %d got msg_seq %d after %d", g, i, r.MsgSeq, rs[i-1].MsgSeq)
			}
			if want := fmt.Sprintf("%d/%d", g, i); payloads[r.MsgSeq] != want {
				t.Fatalf("msg_seq %d holds %q, its reply went to %q", r.MsgSeq, payloads[r.MsgSeq], want)
			}
		}
	}
	if len(payloads) != goroutines*sends+1 {
		t.Fatalf("%d entries in the log", len(payloads))
	}
}

func TestRequestsStartedOneAfterAnotherReachTheServerInThatOrder(t *testing.T) {
	d := newDaemon(t)
	c := dial(t, d.addr, testToken)
	ctx := testCtx(t)
	need(c.Join(ctx, 2, 2))
	// SEND, SEND, HISTORY written without waiting: the history sees both.
	var calls []*call
	for _, text := range []string{"a", "b"} {
		req := SendRequest{Conv: 2, Sender: 2, ClientMsgID: NewClientMsgID(), Payload: []byte(text)}
		calls = append(calls, need(c.c.start(ctx, opSend, func(e *encoder) {
			e.u64(req.Conv)
			e.u64(req.Sender)
			e.u128(req.ClientMsgID)
			e.u16(req.MsgType)
			e.bytes(req.Payload)
		})))
	}
	history := need(c.c.start(ctx, opHistory, func(e *encoder) { e.u64(2); e.u64(2); e.optU64(0, false); e.u32(0) }))
	body := need(history.wait(ctx))
	d2 := decoder{b: body}
	page := HistoryPage{Messages: decodeMessages(&d2), HasMore: d2.boolean()}
	if len(page.Messages) != 3 || string(page.Messages[0].Payload) != "b" || string(page.Messages[1].Payload) != "a" {
		t.Fatalf("history %+v", page.Messages)
	}
	for _, cl := range calls {
		need(cl.wait(ctx))
	}
}

func TestACancelledCallReturnsAndTheConnectionGoesOn(t *testing.T) {
	d := newDaemon(t)
	c := dial(t, d.addr, testToken)
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	if err := c.Ping(ctx); err != context.Canceled {
		t.Fatalf("a cancelled ping: %v", err)
	}
	if err := c.Ping(testCtx(t)); err != nil {
		t.Fatalf("the next call: %v", err)
	}
}
