//! Where a sync page is built. A page whose event records all lie in the
//! `evt` log's recent segments (the active one and the one sealed before
//! it) comes back as a read that does no disk IO, so an async server
//! builds it in place; a page reaching into older segments is marked as
//! one that may read the disk, for the server's blocking pool. Both give
//! the same events as a plain wait.

mod inbox_common;

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use inbox_common::*;
use inbox_engine::*;

const PHONE: DeviceId = DeviceId(1);

/// Polls `f` on this thread until it is ready.
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[test]
fn a_page_of_recent_records_is_built_in_place_and_an_old_page_may_read_the_disk() {
    let h = Harness::with(|c| c.segment_bytes = 64 << 10);
    h.join(Uid(1), ConvId(1));
    h.join(Uid(2), ConvId(1));
    let old_gen = h.register(Uid(2), PHONE).device.generation;
    // About 300 KiB of records: user 2's first events end up several
    // segments behind the active one. User 3 joins for the last 20.
    h.send_many(ConvId(1), Uid(1), 1, 1500);
    h.join(Uid(3), ConvId(1));
    let new_gen = h.register(Uid(3), PHONE).device.generation;
    h.send_many(ConvId(1), Uid(1), 10_000, 19);
    let evt_segments = std::fs::read_dir(h.dir.path().join("evt"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().ends_with(".seg")
        })
        .count();
    assert!(evt_segments >= 4, "{evt_segments} evt segments");
    let req = |uid: Uid, generation: Generation| SyncRequest {
        uid,
        device: PHONE,
        generation: Some(generation),
        local_applied_seq: SyncSeq(0),
        limit: 20,
        batch_token: None,
    };

    let mut old = block_on(h.ib().sync(req(Uid(2), old_gen)).released());
    assert!(
        old.may_do_io(),
        "user 2's first events are segments behind the active one"
    );
    let mut recent = block_on(h.ib().sync(req(Uid(3), new_gen)).released());
    assert!(!recent.may_do_io(), "user 3's events were just written");

    let old_page = old.attempt().expect("a page needs no settling").unwrap();
    let recent_page = recent.attempt().expect("a page needs no settling").unwrap();
    assert_eq!(old_page, h.ib().sync(req(Uid(2), old_gen)).wait().unwrap());
    assert_eq!(
        recent_page,
        h.ib().sync(req(Uid(3), new_gen)).wait().unwrap()
    );
    assert_eq!(old_page.events.len(), 20);
    assert_eq!(
        recent_page.events.len(),
        20,
        "user 3's join and the 19 messages after it"
    );
    assert!(!recent_page.has_more);
}
