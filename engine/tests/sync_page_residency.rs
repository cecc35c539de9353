//! Where a sync page is built. A page whose event records all lie in the
//! `evt` log's recent segments (the active one and the one sealed before
//! it) comes back as a read that does no disk IO, so an async server
//! builds it in place; a page reaching into older segments is marked as
//! one that may read the disk, for the server's blocking pool. Both give
//! the same events as a plain wait.
//!
//! A pull and a history page are attempted in place first, and go to the
//! pool only when a record they would read may not be cached.
//!
//! With a look at the kernel's reclaim counters (`observe_page_cache`,
//! which the server takes every 100 ms), an older page counts as cached
//! too when this process wrote its records after a look and the count has
//! not moved since; a reclaim, a stale look or a record found on disk at
//! open sends it to the pool again.

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
    let evt_segments = h.evt_segment_files();
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

/// User 2's first 20 events, five or more `evt` segments behind the
/// active one, and the request for them.
struct OldPage {
    h: Harness,
    generation: Generation,
}

impl OldPage {
    /// Writes the history, calling `first` on the open engine before
    /// anything is written.
    fn write<T>(first: impl FnOnce(&Harness) -> T) -> Self {
        let h = Harness::with(|c| c.segment_bytes = 64 << 10);
        first(&h);
        h.join(Uid(1), ConvId(1));
        h.join(Uid(2), ConvId(1));
        let generation = h.register(Uid(2), PHONE).device.generation;
        h.send_many(ConvId(1), Uid(1), 1, 1500);
        Self { h, generation }
    }

    fn may_do_io(&self) -> bool {
        let req = SyncRequest {
            uid: Uid(2),
            device: PHONE,
            generation: Some(self.generation),
            local_applied_seq: SyncSeq(0),
            limit: 20,
            batch_token: None,
        };
        let mut read = block_on(self.h.ib().sync(req.clone()).released());
        let io = read.may_do_io();
        let page = read.attempt().expect("a page needs no settling").unwrap();
        assert_eq!(page, self.h.ib().sync(req).wait().unwrap());
        assert_eq!(page.events.len(), 20);
        io
    }

    /// Pulls and reads history from the start of the conversation, as
    /// an async server would: whether the read was answered in place (on
    /// its first attempt, without IO), checked against the blocking calls.
    fn pull_and_history_in_place(&self) -> (bool, bool) {
        fn run<T>(mut read: inbox_engine::inbox::Read<T>) -> (T, bool) {
            assert!(!read.may_do_io(), "attempted in place first");
            match read.attempt() {
                Some(answer) => (answer.unwrap(), true),
                None => {
                    assert!(read.may_do_io(), "a record may not be cached");
                    let answer = read.attempt().expect("nothing to settle");
                    (answer.unwrap(), false)
                }
            }
        }
        let cursors = vec![(ConvId(1), MsgSeq(0))];
        let (pull, pull_in_place) = run(self.h.ib().read_pull(Uid(2), cursors.clone(), 20));
        assert_eq!(pull, self.h.ib().pull(Uid(2), &cursors, 20).unwrap());
        assert_eq!(pull[0].messages.len(), 20);
        let before = Some(MsgSeq(40));
        let (history, history_in_place) =
            run(self.h.ib().read_history(Uid(2), ConvId(1), before, 20));
        assert_eq!(
            history,
            self.h.ib().history(Uid(2), ConvId(1), before, 20).unwrap()
        );
        assert_eq!(history.messages.len(), 20);
        (pull_in_place, history_in_place)
    }

    /// Whether the page is built in place right after a look that finds
    /// the count at `reclaims`. A look is good for 250 ms, which a loaded
    /// machine may spend between the look and the page, so a few tries.
    fn in_place_after_look(&self, reclaims: u64) -> bool {
        (0..5).any(|_| {
            self.h.ib().observe_page_cache(reclaims);
            !self.may_do_io()
        })
    }
}

#[test]
fn an_old_page_written_since_a_look_that_saw_no_reclaim_is_built_in_place() {
    let page = OldPage::write(|h| h.ib().observe_page_cache(7));
    assert!(
        page.in_place_after_look(7),
        "written after a look, nothing reclaimed since"
    );
}

#[test]
fn an_old_page_goes_to_the_pool_once_a_reclaim_is_seen_or_without_a_look() {
    let unwatched = OldPage::write(|_| {});
    assert!(unwatched.may_do_io(), "no look at the page cache was taken");

    let page = OldPage::write(|h| h.ib().observe_page_cache(7));
    assert!(page.h.ib().observe_page_cache(8), "the look sees the move");
    assert!(
        page.may_do_io(),
        "the kernel reclaimed pages since the writes"
    );
    // The count stays put from here on, but nothing written before the
    // reclaim was seen is taken as cached again.
    assert!(!page.in_place_after_look(8));
}

#[test]
fn a_stale_look_at_the_page_cache_makes_nothing_cached() {
    let page = OldPage::write(|h| h.ib().observe_page_cache(7));
    assert!(page.in_place_after_look(7));
    std::thread::sleep(inbox_engine::log::LOOK_VALID_FOR + std::time::Duration::from_millis(50));
    assert!(page.may_do_io(), "the last look is older than it may be");
}

#[test]
fn records_found_on_disk_at_open_never_count_as_cached() {
    let mut page = OldPage::write(|_| {});
    page.h.kill_restart(|c| c.segment_bytes = 64 << 10);
    page.h.ib().observe_page_cache(7);
    assert!(
        !page.in_place_after_look(7),
        "written before this process opened the log"
    );
}

#[test]
fn old_messages_written_since_a_look_are_pulled_in_place_and_after_a_restart_on_the_pool() {
    let mut page = OldPage::write(|h| h.ib().observe_page_cache(7));
    let in_place = (0..5).any(|_| {
        page.h.ib().observe_page_cache(7);
        page.pull_and_history_in_place() == (true, true)
    });
    assert!(in_place, "written after a look, nothing reclaimed since");
    page.h.kill_restart(|c| c.segment_bytes = 64 << 10);
    page.h.ib().observe_page_cache(7);
    assert_eq!(
        page.pull_and_history_in_place(),
        (false, false),
        "written before this process opened the log"
    );
}
