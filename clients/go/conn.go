package inboxd

// One connection: the handshake (and the protocol version it settles
// on), and what makes it pipelined. A caller takes a request id and
// writes its frame under one lock, so the order on the wire is the
// order of the calls; the last of the callers queued on that lock
// flushes for all of them, so that many goroutines share one write. A
// reader goroutine hands each reply to the call waiting on its request
// id, and pushes hints (request id 0) to channels.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Options say how to connect. Token is required.
type Options struct {
	// Token is the daemon's client token, or its admin token for the
	// admin requests (ReadTokenFile reads either file).
	Token []byte
	// ClientName is sent in HELLO, for the server's logs.
	ClientName string
	// TLS, when set, speaks TLS (see TLSConfig). The server name is taken
	// from the address when the config has none.
	TLS *tls.Config
	// DialTimeout bounds connecting and the handshake when ctx has no
	// earlier deadline; default 5 s.
	DialTimeout time.Duration
	// ProtocolVersion pins the version asked for in HELLO (2 or 3). Zero
	// asks for ProtocolVersion and, when the server answers UNSUPPORTED
	// naming an older version this client speaks, connects again with
	// that one.
	ProtocolVersion uint16

	// PoolSize is the most connections a Pool opens to the member it
	// talks to; default 4.
	PoolSize int
	// Patience is how long a Pool keeps retrying a request on other
	// members while none serves (a leader died, an election runs);
	// default 15 s.
	Patience time.Duration
}

// hintBuffer is how many hints a connection holds for a slow reader;
// past it, new hints are dropped (hints may be dropped by design).
const hintBuffer = 1024

const (
	defaultDialTimeout = 5 * time.Second
	// defaultReplyFrameBytesMax bounds replies before HELLO_OK names the
	// server's limit.
	defaultReplyFrameBytesMax = 64 << 20
	ioBufferBytes             = 64 << 10
)

// ReadTokenFile reads a token file, without surrounding whitespace (a
// trailing newline is not part of the token).
func ReadTokenFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return bytes.TrimSpace(b), nil
}

// TLSConfig is a client TLS configuration that trusts the CA in
// caFile (PEM) and, when certFile and keyFile are set, presents that
// client certificate (for a daemon started with --tls-client-ca).
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("inboxd: no certificate in %s", caFile)
	}
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// conn is one authenticated connection.
type conn struct {
	nc     net.Conn
	addr   string
	server ServerInfo

	// orderMu makes taking a request id and writing the frame one step.
	orderMu sync.Mutex
	nextID  uint64
	w       *bufio.Writer
	// writers counts the callers holding or waiting for orderMu: the one
	// that brings it to zero flushes.
	writers atomic.Int32

	// mu guards pending and err. The reader takes only this lock, so it
	// never waits behind a writer stuck on a full socket.
	mu      sync.Mutex
	pending map[uint64]chan reply
	err     error
	// inFlight is len(pending), read without the lock by a Pool choosing
	// the least busy connection.
	inFlight atomic.Int32

	done      chan struct{}
	closeOnce sync.Once
	hints     chan Hint
	dirty     chan DirtyHint
}

// reply is a frame answering a request, or the reason none will come.
type reply struct {
	op   byte
	body []byte
	err  error
}

// dialConn connects and says HELLO with the newest version allowed,
// then with each older one an UNSUPPORTED names (PROTOCOL.md section 3:
// the refusal's detail is the server's newest version, and it closes the
// connection). The version only goes down, so this ends.
func dialConn(ctx context.Context, addr string, opts *Options) (*conn, error) {
	if len(opts.Token) == 0 {
		return nil, errors.New("inboxd: Options.Token is empty")
	}
	version := opts.ProtocolVersion
	if version == 0 {
		version = ProtocolVersion
	}
	if version < protocolVersionMin || version > ProtocolVersion {
		return nil, fmt.Errorf("inboxd: Options.ProtocolVersion %d: this client speaks %d to %d",
			version, protocolVersionMin, ProtocolVersion)
	}
	timeout := opts.DialTimeout
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		c, err := dialVersion(ctx, addr, opts, version)
		var refusal *Error
		if opts.ProtocolVersion == 0 && errors.As(err, &refusal) && refusal.Code == CodeUnsupported &&
			refusal.Detail >= protocolVersionMin && refusal.Detail < uint64(version) {
			version = uint16(refusal.Detail)
			continue
		}
		return c, err
	}
}

// dialVersion opens one connection that asks for version in HELLO.
func dialVersion(ctx context.Context, addr string, opts *Options, version uint16) (*conn, error) {
	var nc net.Conn
	var err error
	if opts.TLS != nil {
		d := tls.Dialer{Config: opts.TLS}
		nc, err = d.DialContext(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	if tcp, ok := nc.(*net.TCPConn); ok {
		_ = tcp.SetNoDelay(true)
	}
	c := &conn{
		nc: nc, addr: addr, nextID: 2, w: bufio.NewWriterSize(nc, ioBufferBytes),
		pending: make(map[uint64]chan reply), done: make(chan struct{}),
		hints: make(chan Hint, hintBuffer), dirty: make(chan DirtyHint, hintBuffer),
	}
	r := bufio.NewReaderSize(nc, ioBufferBytes)
	if err := c.hello(ctx, r, opts, version); err != nil {
		nc.Close()
		return nil, err
	}
	go c.readLoop(r)
	return c, nil
}

// hello sends HELLO (request id 1) asking for version, and reads
// HELLO_OK, which names the version the connection speaks, before
// anything else runs on the connection.
func (c *conn) hello(ctx context.Context, r *bufio.Reader, opts *Options, version uint16) error {
	if deadline, ok := ctx.Deadline(); ok {
		_ = c.nc.SetDeadline(deadline)
		defer c.nc.SetDeadline(time.Time{})
	}
	name := opts.ClientName
	if name == "" {
		name = "inboxd-go"
	}
	if _, err := c.nc.Write(helloFrame(version, name, opts.Token)); err != nil {
		return err
	}
	op, id, body, err := readFrame(r, defaultReplyFrameBytesMax)
	if err != nil {
		return fmt.Errorf("inboxd: handshake with %s: %w", c.addr, err)
	}
	if op == opError {
		// Not yet known which layout a refusal of HELLO has: a server
		// that does not speak version 3 answers in its own.
		return decodeError(body, 0)
	}
	if op != opHello|0x80 || id != 1 {
		return &ProtocolError{Op: opHello, Reason: fmt.Sprintf("handshake answered with opcode %#02x, request id %d", op, id)}
	}
	d := decoder{b: body}
	c.server = decodeServerInfo(&d)
	if err := d.end(); err != nil {
		return &ProtocolError{Op: opHello, Reason: err.Error()}
	}
	if c.server.Version < protocolVersionMin || c.server.Version > version {
		return &ProtocolError{Op: opHello, Reason: fmt.Sprintf("asked for version %d, the server answered %d",
			version, c.server.Version)}
	}
	return nil
}

// helloFrame is the HELLO a connection opens with, request id 1.
func helloFrame(version uint16, clientName string, token []byte) []byte {
	e := newFrame(opHello, 10+len(clientName)+len(token))
	e.u16(version)
	e.str(clientName)
	e.bytes(token)
	return e.finish(1)
}

// readFrame reads one frame, refusing a declared length over max before
// reading the body.
func readFrame(r *bufio.Reader, max uint32) (op byte, id uint64, body []byte, err error) {
	var head [4 + frameHeaderLen]byte
	if _, err = io.ReadFull(r, head[:]); err != nil {
		return 0, 0, nil, err
	}
	n := binary.LittleEndian.Uint32(head[0:4])
	if n < frameHeaderLen || n > max {
		return 0, 0, nil, fmt.Errorf("frame_len %d outside 9..=%d", n, max)
	}
	body = make([]byte, n-frameHeaderLen)
	if _, err = io.ReadFull(r, body); err != nil {
		return 0, 0, nil, err
	}
	return head[4], binary.LittleEndian.Uint64(head[5:13]), body, nil
}

// decodeError reads an ERROR body laid out in version: from 3 on it ends
// with leader_addr, before it does not. Below 3 (and 0, the handshake's
// unknown version) it takes either: a version 3 server sends the errors
// of its connection handling (a refusal of HELLO, a connection's last
// error, and an unknown opcode, RATE_LIMITED, FORBIDDEN or a refused
// SUBSCRIBE on a version 2 connection) in its own layout, with the field.
func decodeError(body []byte, version uint16) error {
	d := decoder{b: body}
	e := &Error{Code: Code(d.u16()), Detail: d.u64(), Message: d.str()}
	if version >= 3 || (d.err == nil && len(d.b) > 0) {
		e.hasLeaderAddr = true
		e.leaderAddr, _ = d.optStr()
	}
	if err := d.end(); err != nil {
		return &ProtocolError{Op: opError, Reason: err.Error()}
	}
	return e
}

// fail closes the connection once, failing every call waiting on it.
func (c *conn) fail(cause error) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.err = &closedError{cause: cause}
		for id, ch := range c.pending {
			ch <- reply{err: c.err}
			delete(c.pending, id)
		}
		c.inFlight.Store(0)
		c.mu.Unlock()
		close(c.done)
		c.nc.Close()
	})
}

func (c *conn) closed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *conn) readLoop(r *bufio.Reader) {
	limit := c.server.ReplyFrameBytesMax
	if limit == 0 {
		limit = defaultReplyFrameBytesMax
	}
	for {
		op, id, body, err := readFrame(r, limit)
		if err != nil {
			c.fail(err)
			return
		}
		if id == 0 {
			c.push(op, body)
			continue
		}
		c.mu.Lock()
		ch, ok := c.pending[id]
		if ok {
			delete(c.pending, id)
			c.inFlight.Add(-1)
		}
		c.mu.Unlock()
		if ok { // not ok: its caller gave up (ctx), the reply is dropped
			ch <- reply{op: op, body: body}
		}
	}
}

// push handles a frame with request id 0: a hint, or an error the server
// sends just before it closes the connection.
func (c *conn) push(op byte, body []byte) {
	d := decoder{b: body}
	switch op {
	case opHint:
		n := d.count(16)
		for i := 0; i < n && d.err == nil; i++ {
			h := Hint{UID: d.u64(), CommittedSyncSeq: d.u64()}
			select {
			case c.hints <- h:
			default:
			}
		}
	case opDirtyHint:
		n := d.count(32)
		for i := 0; i < n && d.err == nil; i++ {
			h := DirtyHint{UID: d.u64(), Conv: d.u64(), TargetMsgSeq: d.u64(), Version: d.u64()}
			select {
			case c.dirty <- h:
			default:
			}
		}
	case opError:
		c.fail(decodeError(body, 0))
	}
	// An unknown push, or a malformed one, is skipped: hints are advisory.
}

// call is one request and its reply body.
type call struct {
	c  *conn
	op byte
	ch chan reply
	id uint64
}

// start writes a request without waiting for its reply. Requests started
// one after another by one goroutine reach the server in that order.
func (c *conn) start(ctx context.Context, op byte, encode func(*encoder)) (*call, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e := newFrame(op, 64)
	if encode != nil {
		encode(e)
	}
	if n := len(e.b) - 4; c.server.FrameBytesMax != 0 && n > int(c.server.FrameBytesMax) {
		// The server would answer TOO_LARGE and close the connection.
		return nil, &Error{Code: CodeTooLarge, Detail: uint64(c.server.FrameBytesMax),
			Message: fmt.Sprintf("request frame of %d bytes is over the server's frame_bytes_max; not sent", n)}
	}
	cl := &call{c: c, op: op, ch: make(chan reply, 1)}
	c.writers.Add(1)
	c.orderMu.Lock()
	defer c.orderMu.Unlock()
	last := c.writers.Add(-1) == 0
	cl.id = c.nextID
	c.nextID++
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.pending[cl.id] = cl.ch
	c.inFlight.Add(1)
	c.mu.Unlock()
	_, err := c.w.Write(e.finish(cl.id))
	if last && err == nil {
		// Nobody is queued behind this call to flush it.
		err = c.w.Flush()
	}
	if err != nil {
		c.fail(err)
		return nil, c.closedErr()
	}
	return cl, nil
}

func (c *conn) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *conn) forget(id uint64) {
	c.mu.Lock()
	if _, ok := c.pending[id]; ok {
		delete(c.pending, id)
		c.inFlight.Add(-1)
	}
	c.mu.Unlock()
}

// wait returns the reply's body, or the server's *Error. When ctx ends
// first the request may still take effect; its reply is dropped.
func (cl *call) wait(ctx context.Context) ([]byte, error) {
	select {
	case r := <-cl.ch:
		if r.err != nil {
			return nil, r.err
		}
		switch r.op {
		case cl.op | 0x80:
			return r.body, nil
		case opError:
			return nil, decodeError(r.body, cl.c.server.Version)
		default:
			return nil, &ProtocolError{Op: cl.op, Reason: fmt.Sprintf("answered with opcode %#02x", r.op)}
		}
	case <-ctx.Done():
		cl.c.forget(cl.id)
		return nil, ctx.Err()
	}
}

func (c *conn) roundTrip(ctx context.Context, op byte, encode func(*encoder)) (decoder, error) {
	cl, err := c.start(ctx, op, encode)
	if err != nil {
		return decoder{}, err
	}
	body, err := cl.wait(ctx)
	return decoder{b: body, version: c.server.Version}, err
}

// Client is one pipelined connection to a daemon, safe for use by many
// goroutines at once: their requests share the connection and each waits
// for its own reply. It does not reconnect; see Pool for a client that
// does and that follows a group's leader.
type Client struct {
	requests
	c *conn
}

// Dial connects to addr ("host:port"), over TLS when opts.TLS is set, and
// says HELLO. The version the connection speaks and the server's limits
// are then in Server.
func Dial(ctx context.Context, addr string, opts Options) (*Client, error) {
	c, err := dialConn(ctx, addr, &opts)
	if err != nil {
		return nil, err
	}
	return &Client{requests: requests{c}, c: c}, nil
}

// Server is the HELLO_OK of the connection: its version and limits.
func (cl *Client) Server() ServerInfo { return cl.c.server }

// Addr is the address the client dialled.
func (cl *Client) Addr() string { return cl.c.addr }

// Hints delivers the HINT pushes of the users this connection
// subscribed to (Subscribe). The channel buffers 1024 entries; past that,
// hints are dropped, as the server may drop them too: a hint only says
// "sync now". It is never closed; select on Done as well.
func (cl *Client) Hints() <-chan Hint { return cl.c.hints }

// DirtyHints delivers DIRTY_HINT pushes (SubscribeDirty), like Hints.
func (cl *Client) DirtyHints() <-chan DirtyHint { return cl.c.dirty }

// Done is closed when the connection is closed or broke; Err then says
// why.
func (cl *Client) Done() <-chan struct{} { return cl.c.done }

// Err is nil while the connection is open, else an error matching
// ErrClosed that wraps the cause.
func (cl *Client) Err() error {
	if !cl.c.closed() {
		return nil
	}
	return cl.c.closedErr()
}

// Close closes the connection; calls waiting on it return ErrClosed.
func (cl *Client) Close() error {
	cl.c.fail(nil)
	return nil
}
