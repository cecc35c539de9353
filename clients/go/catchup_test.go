package inboxd

import (
	"context"
	"testing"
)

func TestCatchUpAppliesEveryEventOnceInOrderAndAcksTheEnd(t *testing.T) {
	d := newDaemon(t)
	c := dial(t, d.addr, testToken)
	ctx := testCtx(t)
	need(c.Join(ctx, 1, 1))
	reg := need(c.RegisterDevice(ctx, 1, 1))
	for i := 0; i < 95; i++ {
		need(c.Send(ctx, SendRequest{Conv: 1, Sender: 1, Payload: []byte{byte(i)}}))
	}
	var seqs []uint64
	apply := func(_ context.Context, events []Event) error {
		for _, e := range events {
			seqs = append(seqs, e.SyncSeq)
		}
		return nil
	}
	res := need(c.CatchUp(ctx, Cursor{Generation: reg.Device.Generation},
		CatchUp{UID: 1, Device: 1, Limit: 10, AckEvery: 3, Apply: apply}))
	if len(seqs) != 96 || res.Events != 96 || res.Pages != 10 {
		t.Fatalf("%d events in %d pages: %+v", len(seqs), res.Pages, res)
	}
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("event %d has sync_seq %d", i, s)
		}
	}
	if res.AckedSyncSeq != 96 || res.Cursor != (Cursor{Generation: reg.Device.Generation, AppliedSeq: 96}) {
		t.Fatalf("result %+v", res)
	}
	if dev := need(c.Devices(ctx, 1))[0]; dev.AckedSyncSeq != 96 {
		t.Fatalf("the server holds the device at %d", dev.AckedSyncSeq)
	}
	seqs = nil
	again := need(c.CatchUp(ctx, res.Cursor, CatchUp{UID: 1, Device: 1, Apply: apply}))
	if len(seqs) != 0 || again.Cursor != res.Cursor {
		t.Fatalf("a caught-up device got %v: %+v", seqs, again)
	}
}

func TestCatchUpHandsResetRequiredToTheResetHandlerThenSyncsOn(t *testing.T) {
	d := newDaemon(t)
	c := dial(t, d.addr, testToken)
	ctx := testCtx(t)
	need(c.Join(ctx, 5, 5))
	reg := need(c.RegisterDevice(ctx, 5, 1))
	for i := 0; i < 20; i++ {
		need(c.Send(ctx, SendRequest{Conv: 5, Sender: 5, Payload: []byte("backlog")}))
	}
	cu := CatchUp{UID: 5, Device: 1, MaxReplay: 5, Apply: func(context.Context, []Event) error { return nil }}
	_, err := c.CatchUp(ctx, Cursor{Generation: reg.Device.Generation}, cu)
	wantCode(t, err, ErrResetRequired)

	var snapshotMessages int
	var resetTo uint64
	cu.Reset = func(ctx context.Context, generation uint64) (Cursor, error) {
		resetTo = generation
		return c.InstallSnapshot(ctx, 5, 1, func(p SnapshotPage) error {
			snapshotMessages += len(p.Messages)
			return nil
		})
	}
	res := need(c.CatchUp(ctx, Cursor{Generation: resetTo}, cu))
	if res.Resets != 1 || snapshotMessages == 0 || resetTo == 0 {
		t.Fatalf("resets %d, %d messages, generation %d", res.Resets, snapshotMessages, resetTo)
	}
	dev := need(c.Devices(ctx, 5))[0]
	if dev.State != DeviceActive || res.Cursor.Generation != dev.Generation || res.Cursor.AppliedSeq != dev.AckedSyncSeq {
		t.Fatalf("device %+v after %+v", dev, res)
	}
	// An ACK (with a genuine token) while the device is RESETTING is
	// DEVICE_RESETTING.
	page := need(c.Sync(ctx, SyncRequest{UID: 5, Device: 1, Generation: dev.Generation, LocalAppliedSeq: dev.AckedSyncSeq}))
	info := need(c.BeginSnapshot(ctx, 5, 1))
	_, err = c.Ack(ctx, AckRequest{UID: 5, Device: 1, Generation: info.Generation, Seq: 1, BatchToken: page.BatchToken})
	wantCode(t, err, ErrDeviceResetting)
}
