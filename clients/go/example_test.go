package inboxd_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	inboxd "github.com/inboxd/inboxd/clients/go"
)

// The examples talk to a daemon TestMain starts; a service would use
// its own address and token (inboxd.ReadTokenFile).
var (
	addr  string
	token []byte
)

func TestMain(m *testing.M) {
	var stop func()
	var err error
	addr, token, stop, err = inboxd.StartTestDaemon()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

func Example_send() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := inboxd.Dial(ctx, addr, inboxd.Options{Token: token})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	for _, uid := range []uint64{1, 2} {
		if _, err := client.Join(ctx, 100, uid); err != nil {
			log.Fatal(err)
		}
	}
	sent, err := client.Send(ctx, inboxd.SendRequest{Conv: 100, Sender: 1, MsgType: 1, Payload: []byte("hello bob")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("msg_seq", sent.MsgSeq, "duplicate", sent.Duplicate)

	_, err = client.Send(ctx, inboxd.SendRequest{Conv: 100, Sender: 3, Payload: []byte("not a member")})
	var refused *inboxd.Error
	if errors.As(err, &refused) && errors.Is(err, inboxd.ErrForbidden) {
		fmt.Println("refused:", refused.Code)
	}
	// Output:
	// msg_seq 3 duplicate false
	// refused: FORBIDDEN
}

func ExampleClient_CatchUp() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := inboxd.Dial(ctx, addr, inboxd.Options{Token: token})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	// User 20 keeps notes to self in conversation 200.
	if _, err := client.Join(ctx, 200, 20); err != nil {
		log.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		note := inboxd.SendRequest{Conv: 200, Sender: 20, MsgType: 1, Payload: []byte(fmt.Sprint("note ", i))}
		if _, err := client.Send(ctx, note); err != nil {
			log.Fatal(err)
		}
	}
	reg, err := client.RegisterDevice(ctx, 20, 1)
	if err != nil {
		log.Fatal(err)
	}

	// The device's durable state: its generation and last applied sync_seq.
	cursor := inboxd.Cursor{Generation: reg.Device.Generation}
	result, err := client.CatchUp(ctx, cursor, inboxd.CatchUp{
		UID: 20, Device: 1,
		Apply: func(ctx context.Context, events []inboxd.Event) error {
			for _, e := range events {
				if e.Kind == inboxd.EventMsg {
					fmt.Printf("sync_seq %d: %s\n", e.SyncSeq, e.Summary)
				}
			}
			return nil // store the events durably before returning
		},
		Reset: func(ctx context.Context, generation uint64) (inboxd.Cursor, error) {
			// The gap cannot be synced: replace the local store.
			return client.InstallSnapshot(ctx, 20, 1, func(page inboxd.SnapshotPage) error {
				return nil // store page.Convs and page.Messages
			})
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	cursor = result.Cursor // keep it for the next catch-up
	fmt.Println("applied through", cursor.AppliedSeq, "acked", result.AckedSyncSeq)
	// Output:
	// sync_seq 2: note 0
	// sync_seq 3: note 1
	// sync_seq 4: note 2
	// applied through 4 acked 4
}
