// Package inboxd is a client of inboxd, the offline-message inbox and
// multi-device sync store, written from its wire protocol
// (docs/PROTOCOL.md in the inboxd repository) with the standard library
// only.
//
// Dial opens one connection and says HELLO, asking for protocol version
// 3 and connecting again with version 2 when the server speaks only
// that; the version settled on and the server's limits are then in
// Client.Server. A Client is safe for many goroutines: their requests
// are pipelined on the connection and matched to their replies by
// request id, and requests reach the server in the order they were
// made. Every call takes a context.Context for its deadline and
// cancellation.
//
//	client, err := inboxd.Dial(ctx, "127.0.0.1:7070", inboxd.Options{Token: token})
//	sent, err := client.Send(ctx, inboxd.SendRequest{Conv: 100, Sender: 1, Payload: []byte("hi")})
//
// A refused request returns an *Error with the server's Code, Detail and
// Message; errors.Is matches it against the sentinels (ErrConflict,
// ErrResetRequired, ...) and errors.As gives its detail (the generation
// to use, RetryAfter for ErrRateLimited, the leader for ErrNotLeader).
// A broken connection is ErrClosed.
//
// A Pool keeps connections to one member of a replicated group, follows
// NOT_LEADER to the leader and moves to another member when one dies,
// sending a write again with the same idempotency key. Client.CatchUp
// runs a device's sync loop with pipelined ACKs and hands RESET_REQUIRED
// to the caller's reset (InstallSnapshot). Client.Hints delivers the
// pushes of Subscribe.
package inboxd
