//! Regression: while the disk was full, a sync failed with `NoSpace`
//! whenever its round could not be written, even though all it wrote was
//! its once-a-second `last_seen` refresh (or nothing at all, when it shared
//! a round with a refused send). Devices could not sync on a full disk,
//! which must keep serving reads and syncs.

mod inbox_common;

use std::sync::Arc;
use std::time::Duration;

use inbox_common::*;
use inbox_engine::inbox::ManualClock;
use inbox_engine::log::FaultyIo;
use inbox_engine::*;

#[test]
fn sync_is_served_on_a_full_disk_when_only_its_last_seen_refresh_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let io = Arc::new(FaultyIo::new());
    let clock = Arc::new(ManualClock::new(T0));
    let mut c = config(dir.path(), &clock);
    c.segment_bytes = 4096;
    let ib = Inbox::open_with_io(c, io.clone()).unwrap();
    ib.join(Uid(1), ConvId(10)).wait().unwrap();
    ib.join(Uid(2), ConvId(10)).wait().unwrap();
    let generation = ib
        .register_device(Uid(2), DeviceId(1))
        .wait()
        .unwrap()
        .device
        .generation;
    for cmid in 0..3 {
        ib.send(SendRequest {
            conv: ConvId(10),
            sender: Uid(1),
            client_msg_id: cmid,
            msg_type: 1,
            payload: bytes::Bytes::from_static(b"hello"),
        })
        .wait()
        .unwrap();
    }
    let request = |local_applied_seq| SyncRequest {
        uid: Uid(2),
        device: DeviceId(1),
        generation: Some(generation),
        local_applied_seq,
        limit: 100,
        batch_token: None,
    };
    let before = ib.sync(request(SyncSeq(0))).wait().unwrap();
    assert_eq!(before.events.len(), 4, "the join and three messages");

    // Fill the disk: flag changes write to the evt log only, until it
    // needs a segment it cannot get.
    io.set_no_space(true);
    let mut filled = false;
    for i in 0..10_000 {
        let flags = ConvFlags {
            muted: i % 2 == 0,
            pinned: false,
        };
        match ib.set_conv_flags(Uid(2), ConvId(10), flags).wait() {
            Ok(()) => {}
            Err(Error::NoSpace(_)) => {
                filled = true;
                break;
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert!(filled, "the evt log never ran out of space");

    // A second later the sync carries a last_seen refresh, which cannot
    // be written: the page is served all the same.
    clock.advance(Duration::from_secs(2));
    let page = ib
        .sync(request(SyncSeq(0)))
        .wait()
        .expect("sync while the disk is full");
    assert_eq!(page.generation, generation);
    // Every durable event is there: the messages and the flag changes.
    assert!(page.batch_hwm > before.batch_hwm);
    assert_eq!(
        page.events.len() as u64,
        page.batch_hwm.min(SyncSeq(100)).get()
    );

    // A sync that bumps the generation must still fail: that change
    // cannot be made durable.
    let reinstall = ib.sync(SyncRequest {
        generation: None,
        ..request(SyncSeq(0))
    });
    assert!(
        matches!(reinstall.wait(), Err(Error::NoSpace(_))),
        "a generation bump on a full disk is refused"
    );

    io.set_no_space(false);
    let page = ib.sync(request(SyncSeq(0))).wait().unwrap();
    assert_eq!(
        page.generation, generation,
        "the refused bump left no trace"
    );
}
