package inboxd

// A device's catch-up (PROTOCOL.md, "Pipelined catch-up"): SYNC pages
// until has_more is false, the next page asked for before this page's
// ACK is awaited, and a reset through a snapshot when the server says
// the gap cannot be synced.

import (
	"context"
	"errors"
)

// CatchUpAckEvery is how many pages CatchUp applies between two ACKs
// unless told otherwise. A SYNC written after an ACK waits until that
// ACK is durable, so an ACK with every page would pace the reads by the
// disk's flushes; a device that disconnects mid-batch is sent again at
// most this many pages, which it skips by sync_seq.
const CatchUpAckEvery = 8

// resetsMax bounds how many RESET_REQUIRED one CatchUp hands to Reset.
const resetsMax = 3

// Cursor is what a device keeps durably between catch-ups: its
// generation (0 when it has none, e.g. after a reinstall) and the
// highest sync_seq it applied.
type Cursor struct {
	Generation uint64
	AppliedSeq uint64
}

// CatchUp says how a device catches up.
type CatchUp struct {
	UID    uint64
	Device uint64
	// Limit is the page size; 0 is the server's default.
	Limit uint32
	// AckEvery: ACK after every this many pages and after the last; 0 is
	// CatchUpAckEvery.
	AckEvery int
	// MaxReplay, when set, asks for RESET_REQUIRED rather than a longer
	// backlog than this many events.
	MaxReplay uint64
	// WithoutSummaries leaves every event's summary empty.
	WithoutSummaries bool

	// Apply stores a page's events on the device, in order. It is called
	// once per page, before that page is acknowledged; an error stops the
	// catch-up with nothing past the previous ACK acknowledged.
	Apply func(ctx context.Context, events []Event) error
	// Reset is called on RESET_REQUIRED with the device's new generation:
	// it replaces the device's store (InstallSnapshot does the protocol's
	// part) and returns the cursor to sync on from. Without it,
	// CatchUp returns the ErrResetRequired error.
	Reset func(ctx context.Context, generation uint64) (Cursor, error)
}

// CatchUpResult is where a catch-up left the device.
type CatchUpResult struct {
	// Cursor is the device's new generation and the last sync_seq applied.
	Cursor Cursor
	// AckedSyncSeq is the server's ACK for the device after the run.
	AckedSyncSeq uint64
	Pages        int
	Events       int
	Resets       int
}

// CatchUp runs a device's sync loop from `from` to the committed head on
// one connection, pipelined: once a page with more to come is applied,
// the next page's SYNC and (when due) this page's ACK are written back to
// back, and at most one ACK is in flight. After the last page its ACK is
// awaited, then FINISH_LEASE if the batch was a recovery lease. The
// first error stops the run.
func (cl *Client) CatchUp(ctx context.Context, from Cursor, cu CatchUp) (CatchUpResult, error) {
	return catchUp(ctx, cl.c, from, cu)
}

// CatchUp runs Client.CatchUp on one of the pool's connections. It does
// not move to another member midway: on an error, call it again from the
// cursor Apply last stored.
func (p *Pool) CatchUp(ctx context.Context, from Cursor, cu CatchUp) (CatchUpResult, error) {
	c, _, err := p.pick(ctx)
	if err != nil {
		return CatchUpResult{}, err
	}
	return catchUp(ctx, c, from, cu)
}

func catchUp(ctx context.Context, c *conn, from Cursor, cu CatchUp) (CatchUpResult, error) {
	if cu.Apply == nil {
		return CatchUpResult{}, errors.New("inboxd: CatchUp.Apply is nil")
	}
	res := CatchUpResult{Cursor: from}
	for {
		err := catchUpBatch(ctx, c, &res, cu)
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeResetRequired || cu.Reset == nil || res.Resets >= resetsMax {
			return res, err
		}
		res.Resets++
		if res.Cursor, err = cu.Reset(ctx, e.Detail); err != nil {
			return res, err
		}
	}
}

// catchUpBatch runs one batch, from its first SYNC to its last ACK.
func catchUpBatch(ctx context.Context, c *conn, res *CatchUpResult, cu CatchUp) error {
	ackEvery := cu.AckEvery
	if ackEvery <= 0 {
		ackEvery = CatchUpAckEvery
	}
	req := SyncRequest{
		UID: cu.UID, Device: cu.Device, Generation: res.Cursor.Generation,
		LocalAppliedSeq: res.Cursor.AppliedSeq, Limit: cu.Limit,
		MaxReplay: cu.MaxReplay, WithoutSummaries: cu.WithoutSummaries,
	}
	// The first page decides the batch (generation, lease, reset):
	// nothing is written after it until it has come.
	page, err := syncPage(ctx, c, nil, req)
	if err != nil {
		return err
	}
	var lease *LeaseInfo
	var ackInFlight *call
	pages := 0
	for {
		pages++
		res.Pages++
		res.Events += len(page.Events)
		if page.AckedSyncSeq > res.AckedSyncSeq {
			res.AckedSyncSeq = page.AckedSyncSeq
		}
		if page.Lease != nil {
			lease = page.Lease
		}
		if err := cu.Apply(ctx, page.Events); err != nil {
			return err
		}
		res.Cursor = Cursor{Generation: page.Generation, AppliedSeq: page.NextCursor}
		var next *call
		if page.HasMore {
			req.Generation, req.LocalAppliedSeq, req.BatchToken = page.Generation, page.NextCursor, page.BatchToken
			if next, err = c.start(ctx, opSync, req.encode); err != nil {
				return err
			}
		}
		if (!page.HasMore || pages%ackEvery == 0) && page.NextCursor > res.AckedSyncSeq {
			ack := AckRequest{UID: cu.UID, Device: cu.Device, Generation: page.Generation, Seq: page.NextCursor, BatchToken: page.BatchToken}
			acked, err := c.start(ctx, opAck, ack.encode)
			if err != nil {
				return err
			}
			if ackInFlight != nil {
				if err := awaitAck(ctx, ackInFlight, res); err != nil {
					return err
				}
			}
			ackInFlight = acked
		}
		if next == nil {
			break
		}
		if page, err = syncPage(ctx, c, next, req); err != nil {
			return err
		}
	}
	if ackInFlight != nil {
		if err := awaitAck(ctx, ackInFlight, res); err != nil {
			return err
		}
	}
	if lease != nil {
		_, err := requests{c}.FinishLease(ctx, cu.UID, cu.Device, lease.LeaseID, res.Cursor.Generation)
		return err
	}
	return nil
}

// syncPage waits for a SYNC already started, or sends req when started is nil.
func syncPage(ctx context.Context, c *conn, started *call, req SyncRequest) (SyncPage, error) {
	if started == nil {
		return requests{c}.Sync(ctx, req)
	}
	body, err := started.wait(ctx)
	if err != nil {
		return SyncPage{}, err
	}
	d := decoder{b: body}
	page := decodeSyncPage(&d)
	if err := d.end(); err != nil {
		return SyncPage{}, &ProtocolError{Op: opSync, Reason: err.Error()}
	}
	return page, nil
}

func awaitAck(ctx context.Context, cl *call, res *CatchUpResult) error {
	body, err := cl.wait(ctx)
	if err != nil {
		return err
	}
	d := decoder{b: body}
	acked := d.u64()
	if err := d.end(); err != nil {
		return &ProtocolError{Op: opAck, Reason: err.Error()}
	}
	if acked > res.AckedSyncSeq {
		res.AckedSyncSeq = acked
	}
	return nil
}

// InstallSnapshot replaces a device's store from a snapshot: BEGIN_SNAPSHOT,
// every page handed to apply in order, then ACK_SNAPSHOT. It returns the
// cursor to sync on from (the snapshot's generation and base_sync_seq);
// it is what a CatchUp.Reset usually calls. A page's Elided messages
// come with their payload cut to the summary. ErrNotFound from a page
// or ErrConflict from the ACK_SNAPSHOT means another BeginSnapshot of
// the device superseded this one: install again (once; two installs of
// one device at once supersede each other).
func (cl *Client) InstallSnapshot(ctx context.Context, uid, device uint64, apply func(SnapshotPage) error) (Cursor, error) {
	return installSnapshot(ctx, cl.requests, uid, device, apply)
}

// InstallSnapshot is Client.InstallSnapshot over the pool.
func (p *Pool) InstallSnapshot(ctx context.Context, uid, device uint64, apply func(SnapshotPage) error) (Cursor, error) {
	return installSnapshot(ctx, p.requests, uid, device, apply)
}

func installSnapshot(ctx context.Context, r requests, uid, device uint64, apply func(SnapshotPage) error) (Cursor, error) {
	info, err := r.BeginSnapshot(ctx, uid, device)
	if err != nil {
		return Cursor{}, err
	}
	for i := uint32(0); i < info.Pages; i++ {
		page, err := r.SnapshotPage(ctx, uid, info.SnapshotID, i)
		if err != nil {
			return Cursor{}, err
		}
		if err := apply(page); err != nil {
			return Cursor{}, err
		}
	}
	if _, err := r.AckSnapshot(ctx, uid, device, info.SnapshotID, info.Generation); err != nil {
		return Cursor{}, err
	}
	return Cursor{Generation: info.Generation, AppliedSeq: info.BaseSyncSeq}, nil
}
