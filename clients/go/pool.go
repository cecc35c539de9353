package inboxd

// Pool: connections to one member of a group at a time, moved to the
// leader a NOT_LEADER names and to another member when this one cannot
// serve. Where a failed request goes next is decided in one place,
// route.

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	defaultPoolSize = 4
	defaultPatience = 15 * time.Second
	// leaderHopsMax bounds the NOT_LEADER redirects one request follows.
	leaderHopsMax = 3
	backoffFirst  = 50 * time.Millisecond
	backoffMax    = 500 * time.Millisecond
	// memberDialTimeout bounds one connection attempt to a member.
	memberDialTimeout = 2 * time.Second
)

// Pool is a client of a replicated group (or of one daemon) that
// survives a member's death. It keeps up to PoolSize pipelined
// connections to the member it talks to, opened as they are needed, and
// sends each request on the least busy one.
//
//   - A request answered NOT_LEADER that names the leader is sent again
//     to that leader, which then serves the later requests (at most three
//     redirects per request).
//   - When the connection breaks, no leader is known (an election runs),
//     the leader named cannot be reached, or a member is UNAVAILABLE, the
//     request is sent again to the next member that accepts a
//     connection, backing off from 50 ms to 500 ms, for up to
//     Options.Patience.
//
// Sending again follows PROTOCOL.md's "Retrying a write": a write whose
// first attempt was kept (a NOT_LEADER may say the round may or may not
// be kept) is answered as if it had not been, except as that table says.
// A SEND, RECALL or EDIT is sent again with the same ClientMsgID and
// answered as a duplicate with the original ids; joins, ACKs and read
// marks are idempotent by value; reads are always safe. A LEAVE that was
// kept answers NOT_FOUND (already left), a FINISH_LEASE or ACK_SNAPSHOT
// CONFLICT (check with Devices), and a BEGIN_SNAPSHOT sent again begins a
// newer snapshot, the one its reply names.
//
// Requests of different goroutines may go over different connections,
// so only the requests of one goroutine, one after another, keep their
// order. Hint subscriptions live on one connection: use a Client for
// them.
type Pool struct {
	requests
	opts Options

	mu      sync.Mutex
	members []string // given at NewPool, and leaders learned since
	at      string   // the member conns go to
	conns   []*conn  // nil or broken slots are dialled on use
	next    atomic.Uint32
}

// NewPool connects to the first of members that accepts a connection,
// and keeps all of them to fall back on; more are learned from
// NOT_LEADER.
func NewPool(ctx context.Context, members []string, opts Options) (*Pool, error) {
	if len(members) == 0 {
		return nil, errors.New("inboxd: NewPool needs at least one member")
	}
	if opts.PoolSize <= 0 {
		opts.PoolSize = defaultPoolSize
	}
	if opts.Patience <= 0 {
		opts.Patience = defaultPatience
	}
	p := &Pool{opts: opts, members: append([]string{}, members...), conns: make([]*conn, opts.PoolSize)}
	p.requests = requests{p}
	var err error
	for _, m := range members {
		var c *conn
		if c, err = p.dial(ctx, m); err == nil {
			p.at, p.conns[0] = m, c
			return p, nil
		}
	}
	return nil, err
}

// Addr is the member the pool talks to now.
func (p *Pool) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.at
}

// Close closes every connection.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, c := range p.conns {
		if c != nil {
			c.fail(nil)
			p.conns[i] = nil
		}
	}
	return nil
}

func (p *Pool) dial(ctx context.Context, addr string) (*conn, error) {
	o := p.opts
	if o.DialTimeout <= 0 || o.DialTimeout > memberDialTimeout {
		o.DialTimeout = memberDialTimeout
	}
	return dialConn(ctx, addr, &o)
}

// pick is the least busy live connection to the current member: an
// idle one if there is one, else a new one while the pool has room, else
// the one with the fewest requests in flight. Starting the scan at a
// rotating slot spreads ties.
func (p *Pool) pick(ctx context.Context) (*conn, string, error) {
	start := int(p.next.Add(1))
	p.mu.Lock()
	defer p.mu.Unlock()
	best, empty := -1, -1
	for k := range p.conns {
		i := (start + k) % len(p.conns)
		c := p.conns[i]
		switch {
		case c == nil || c.closed():
			if empty < 0 {
				empty = i
			}
		case c.inFlight.Load() == 0:
			return c, p.at, nil
		case best < 0 || c.inFlight.Load() < p.conns[best].inFlight.Load():
			best = i
		}
	}
	if empty < 0 {
		return p.conns[best], p.at, nil
	}
	c, err := p.dial(ctx, p.at)
	if err != nil {
		return nil, p.at, err
	}
	p.conns[empty] = c
	return c, p.at, nil
}

// moveTo makes addr the member to talk to, unless another request has
// already moved the pool away from the member `from` where it failed.
func (p *Pool) moveTo(from, addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at != from {
		return
	}
	known := false
	for _, m := range p.members {
		known = known || m == addr
	}
	if !known {
		p.members = append(p.members, addr)
	}
	p.at = addr
	for i, c := range p.conns {
		if c != nil {
			c.fail(errors.New("the pool moved to another member"))
			p.conns[i] = nil
		}
	}
}

// after is the member that follows m in the known order, wrapping round.
func (p *Pool) after(m string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.members {
		if x == m {
			return p.members[(i+1)%len(p.members)]
		}
	}
	return p.members[0]
}

// next step of a request that failed at a member.
type step int

const (
	giveUp     step = iota // return the error
	toLeader               // redirect to the address named
	nextMember             // back off, then try the next member
)

// route decides where a request that failed with err goes next: the one
// place that reads redirects (NOT_LEADER today; WRONG_SHARD joins it
// here) and the failures another member may serve.
func route(err error) (step, string) {
	var e *Error
	if errors.As(err, &e) {
		switch e.Code {
		case CodeNotLeader:
			if addr := e.LeaderAddr(); addr != "" {
				return toLeader, addr
			}
			return nextMember, ""
		case CodeUnavailable:
			return nextMember, ""
		}
		return giveUp, ""
	}
	var ne net.Error
	if errors.Is(err, ErrClosed) || errors.As(err, &ne) || errors.Is(err, errDial) {
		return nextMember, ""
	}
	return giveUp, ""
}

// errDial marks a failure to reach a member.
var errDial = errors.New("inboxd: member not reachable")

type dialError struct{ cause error }

func (e *dialError) Error() string        { return errDial.Error() + ": " + e.cause.Error() }
func (e *dialError) Is(target error) bool { return target == errDial }
func (e *dialError) Unwrap() error        { return e.cause }

func (p *Pool) roundTrip(ctx context.Context, op byte, encode func(*encoder)) (decoder, error) {
	deadline := time.Now().Add(p.opts.Patience)
	backoff := backoffFirst
	hops := 0
	for {
		c, at, err := p.pick(ctx)
		var reply decoder
		if err != nil {
			err = &dialError{cause: err}
		} else if reply, err = c.roundTrip(ctx, op, encode); err == nil {
			return reply, nil
		}
		if ctx.Err() != nil {
			return decoder{}, err
		}
		next, addr := route(err)
		if next == toLeader && hops < leaderHopsMax {
			hops++
			p.moveTo(at, addr)
			continue
		}
		if next == giveUp || time.Now().Add(backoff).After(deadline) {
			return decoder{}, err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return decoder{}, err
		}
		if backoff *= 2; backoff > backoffMax {
			backoff = backoffMax
		}
		p.moveTo(at, p.after(at))
	}
}
