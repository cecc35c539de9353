package inboxd

// BenchmarkSend: sends from 16 goroutines, over one pipelined connection
// and over a pool of 16, against a real daemon, on a population shaped
// like inbox-bench's quick ingest: 2,000 users, each with 8 friends
// (one-to-one conversations), 10 groups of 200 members that take 5% of
// the sends, 200-byte payloads. The daemon runs with inbox-bench's rate
// limits (none in effect); set INBOXD_BIN to a release build to compare
// with `inbox-bench --scenarios ingest`.
//
//	INBOXD_BIN=target/release/inboxd go test -bench Send -run '^$' -benchtime 5s

import (
	"context"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const (
	benchUsers        = 2000
	benchFriendsSteps = 4 // user i writes with i±1..4: 8 friends each
	benchGroups       = 10
	benchGroupMembers = 200
	benchGroupShare   = 0.05
	benchPayloadBytes = 200
	benchGoroutines   = 16
	directConvBase    = 1 << 40
	groupConvBase     = 2 << 40
)

// benchSender picks sends as inbox-bench's workload does.
type benchSender struct {
	rng     *rand.Rand
	payload []byte
}

func (s *benchSender) next() SendRequest {
	if s.rng.Float64() < benchGroupShare {
		g := uint64(s.rng.Intn(benchGroups))
		sender := g*benchGroupMembers + uint64(s.rng.Intn(benchGroupMembers)) + 1
		return SendRequest{Conv: groupConvBase + g, Sender: sender, MsgType: 1, Payload: s.payload}
	}
	user := uint64(s.rng.Intn(benchUsers))
	step := uint64(s.rng.Intn(benchFriendsSteps)) + 1
	sender := user + 1
	if s.rng.Intn(2) == 0 {
		sender = (user+step)%benchUsers + 1
	}
	return SendRequest{Conv: directConvBase + user*benchFriendsSteps + step - 1, Sender: sender, MsgType: 1, Payload: s.payload}
}

// benchPopulation joins every member of every conversation.
func benchPopulation(b *testing.B, r requests) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type join struct{ conv, uid uint64 }
	joins := make(chan join, 1024)
	go func() {
		defer close(joins)
		for u := uint64(0); u < benchUsers; u++ {
			for step := uint64(1); step <= benchFriendsSteps; step++ {
				conv := directConvBase + u*benchFriendsSteps + step - 1
				joins <- join{conv, u + 1}
				joins <- join{conv, (u+step)%benchUsers + 1}
			}
		}
		for g := uint64(0); g < benchGroups; g++ {
			for m := uint64(1); m <= benchGroupMembers; m++ {
				joins <- join{groupConvBase + g, g*benchGroupMembers + m}
			}
		}
	}()
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range joins {
				if _, err := r.Join(ctx, j.conv, j.uid); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// runSends makes b.N sends from benchGoroutines goroutines and reports
// sends/s.
func runSends(b *testing.B, r requests) {
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := 0; g < benchGoroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(g) + 1))
			payload := make([]byte, benchPayloadBytes)
			rng.Read(payload)
			s := benchSender{rng: rng, payload: payload}
			for left.Add(-1) >= 0 {
				if _, err := r.Send(ctx, s.next()); err != nil {
					b.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "sends/s")
}

// BenchmarkSend runs each client shape on a daemon of its own, started
// and populated before its first timed run.
func BenchmarkSend(b *testing.B) {
	opts := Options{Token: []byte(testToken), PoolSize: benchGoroutines}
	populated := func(b *testing.B) string {
		d := newDaemon(b, "--rate-per-s", "100000000", "--rate-burst", "100000000")
		setup, err := NewPool(context.Background(), []string{d.addr}, opts)
		if err != nil {
			b.Fatal(err)
		}
		defer setup.Close()
		benchPopulation(b, setup.requests)
		return d.addr
	}
	b.Run("conn", func(b *testing.B) {
		c, err := Dial(context.Background(), populated(b), opts)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		runSends(b, c.requests)
	})
	b.Run("pool", func(b *testing.B) {
		p, err := NewPool(context.Background(), []string{populated(b)}, opts)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		runSends(b, p.requests)
	})
}
