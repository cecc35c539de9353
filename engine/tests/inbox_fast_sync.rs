//! A sync that changes nothing is answered from durable state without the
//! sequencer, so it never waits behind another round's fsync; and it gives
//! exactly the page the sequencer would have given.

mod inbox_common;

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::inbox::{ManualClock, Pending};
use inbox_engine::log::{LogIo, PwriteIo, SyncPolicy};
use inbox_engine::*;
use parking_lot::{Condvar, Mutex};

const PHONE: DeviceId = DeviceId(1);

/// Real file IO whose syncs can be held: while the gate is shut, every
/// fdatasync (and every write that asks for one) waits until it opens.
#[derive(Debug, Default)]
struct GatedIo {
    inner: PwriteIo,
    /// (shut, syncs waiting at the gate)
    gate: Mutex<(bool, u32)>,
    cv: Condvar,
}

impl GatedIo {
    fn shut(&self) {
        self.gate.lock().0 = true;
    }
    fn open(&self) {
        self.gate.lock().0 = false;
        self.cv.notify_all();
    }
    /// Waits until at least one sync is held at the gate.
    /// Waits until a sync is held at the gate; fails (never hangs) when
    /// none arrives within a deadline far beyond any scheduling delay.
    fn wait_for_held_sync(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut g = self.gate.lock();
        while g.1 == 0 {
            assert!(
                !self.cv.wait_until(&mut g, deadline).timed_out() || g.1 > 0,
                "no sync reached the closed gate within 60 s: the send never got to its fsync"
            );
        }
    }
    fn pass(&self) {
        let mut g = self.gate.lock();
        if g.0 {
            g.1 += 1;
            self.cv.notify_all();
            while g.0 {
                self.cv.wait(&mut g);
            }
            g.1 -= 1;
        }
    }
}

impl LogIo for GatedIo {
    fn name(&self) -> &'static str {
        "gated"
    }
    fn create_preallocated(&self, path: &Path, len: u64) -> io::Result<File> {
        self.inner.create_preallocated(path, len)
    }
    fn open_existing(&self, path: &Path) -> io::Result<File> {
        self.inner.open_existing(path)
    }
    fn allocate(&self, file: &File, len: u64) -> io::Result<()> {
        self.inner.allocate(file, len)
    }
    fn write_at(&self, file: &File, offset: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        self.inner.write_at(file, offset, buf, false)?;
        if sync {
            self.pass();
            self.inner.sync_data(file)?;
        }
        Ok(())
    }
    fn sync_data(&self, file: &File) -> io::Result<()> {
        self.pass();
        self.inner.sync_data(file)
    }
    /// Segments prepared ahead of need are no round's commit: the gate
    /// holds only commits, so the fsync a test waits for is a round's.
    fn write_prepared(&self, file: &File, offset: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        self.inner.write_prepared(file, offset, buf, sync)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

fn send_req(conv: ConvId, sender: Uid, cmid: u128, body: &str) -> SendRequest {
    SendRequest {
        conv,
        sender,
        client_msg_id: cmid,
        msg_type: 1,
        payload: Bytes::copy_from_slice(body.as_bytes()),
    }
}

fn sync_req(
    uid: Uid,
    generation: Option<Generation>,
    local: SyncSeq,
    limit: u32,
    token: Option<Bytes>,
) -> SyncRequest {
    SyncRequest {
        uid,
        device: PHONE,
        generation,
        local_applied_seq: local,
        limit,
        batch_token: token,
    }
}

/// An engine that syncs every round through a [`GatedIo`], with uid 3's
/// phone registered after `messages` messages from uid 4 in conversation
/// 20: (engine, its IO, the phone's generation). The clock stays with the
/// caller.
fn gated_phone(
    dir: &Path,
    clock: &Arc<ManualClock>,
    messages: u128,
) -> (Arc<Inbox>, Arc<GatedIo>, Generation) {
    let mut cfg = config(dir, clock);
    cfg.sync = SyncPolicy::Always;
    let io = Arc::new(GatedIo::default());
    let ib = Arc::new(Inbox::open_with_io(cfg, io.clone()).unwrap());
    ib.join(Uid(3), ConvId(20)).wait().unwrap();
    if messages > 0 {
        ib.join(Uid(4), ConvId(20)).wait().unwrap();
    }
    for i in 0..messages {
        ib.send(send_req(ConvId(20), Uid(4), i, "for 3"))
            .wait()
            .unwrap();
    }
    let gen = ib
        .register_device(Uid(3), PHONE)
        .wait()
        .unwrap()
        .device
        .generation;
    (ib, io, gen)
}

#[test]
fn a_sync_that_changes_nothing_does_not_wait_for_a_pending_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    // uid 3 has two durable messages and a registered phone.
    let (ib, io, gen) = gated_phone(dir.path(), &clock, 2);
    ib.join(Uid(1), ConvId(10)).wait().unwrap();
    ib.join(Uid(2), ConvId(10)).wait().unwrap();

    // Another user's send is held at its fsync.
    io.shut();
    let (sent_tx, sent_rx) = mpsc::channel();
    let sender = {
        let ib = Arc::clone(&ib);
        std::thread::spawn(move || {
            let r = ib.send(send_req(ConvId(10), Uid(1), 100, "held")).wait();
            let _ = sent_tx.send(r.is_ok());
        })
    };
    io.wait_for_held_sync();

    // uid 3's unchanged phone syncs meanwhile.
    let (page_tx, page_rx) = mpsc::channel();
    let syncer = {
        let ib = Arc::clone(&ib);
        std::thread::spawn(move || {
            let _ = page_tx.send(
                ib.sync(sync_req(Uid(3), Some(gen), SyncSeq(0), 100, None))
                    .wait(),
            );
        })
    };
    let answered = page_rx.recv_timeout(Duration::from_secs(20));
    let send_done_before_release = sent_rx.try_recv().is_ok();
    io.open();
    syncer.join().unwrap();
    sender.join().unwrap();
    assert!(
        sent_rx.recv().unwrap(),
        "the held send succeeds once released"
    );

    let page = answered
        .expect("the sync was answered while the other round's fsync was held")
        .unwrap();
    assert!(
        !send_done_before_release,
        "the send was still waiting for its fsync when the sync was answered"
    );
    let seqs: Vec<MsgSeq> = page
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Msg)
        .map(|e| e.msg_seq)
        .collect();
    assert_eq!(
        seqs,
        vec![MsgSeq(3), MsgSeq(4)],
        "both of uid 3's messages (after the joins)"
    );
    assert_eq!(page.batch_hwm, page.next_cursor);
    assert!(!page.has_more);
    assert_eq!(page.generation, gen);
}

#[test]
fn a_sync_that_only_refreshes_last_seen_is_answered_while_the_refresh_waits_for_its_round() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let (ib, io, gen) = gated_phone(dir.path(), &clock, 0);

    // A second later the sync must log `last_seen`: the page does not
    // reveal it, so the page is answered while the refresh, logged on its
    // own, is held in its fsync.
    clock.advance(Duration::from_secs(1));
    io.shut();
    let (page_tx, page_rx) = mpsc::channel();
    let syncer = {
        let ib = Arc::clone(&ib);
        std::thread::spawn(move || {
            let _ = page_tx.send(
                ib.sync(sync_req(Uid(3), Some(gen), SyncSeq(0), 100, None))
                    .wait(),
            );
        })
    };
    io.wait_for_held_sync();
    let page = page_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the page is answered while the refresh's fsync is held");
    assert_eq!(page.unwrap().generation, gen);
    io.open();
    syncer.join().unwrap();
    // Nobody waits for the refresh. It was queued before the page was
    // answered, so once a command queued after the page is durable, so is
    // the refresh.
    ib.join(Uid(4), ConvId(21)).wait().unwrap();
    let devices = ib.devices(Uid(3)).unwrap();
    assert_eq!(
        devices[0].last_seen_ms,
        T0 + 1_000,
        "the refresh was logged"
    );
}

/// Rounds the sequencer has finished so far.
fn rounds(h: &Harness) -> u64 {
    h.ib().stats().write_batches
}

#[test]
fn fast_and_sequenced_syncs_give_identical_pages() {
    let h = Harness::with(|c| c.recovery_lease_events_max = 100);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    let gen = h.register(Uid(2), PHONE).device.generation;
    for i in 0..25 {
        h.send(ConvId(10), Uid(1), i, &format!("m{i}"));
    }

    // First page: one second on, the sync must refresh `last_seen`; the
    // page is answered from durable state and the refresh logged in a
    // round of its own. The same request once that round is written
    // changes nothing. Same clock, so same token.
    h.advance(Duration::from_secs(1));
    let before = rounds(&h);
    let slow = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 10, None)
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while rounds(&h) < before + 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the refresh was never logged"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let after_slow = rounds(&h);
    let fast = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(0), 10, None)
        .unwrap();
    assert_eq!(after_slow, before + 1, "the refresh went through one round");
    assert_eq!(rounds(&h), after_slow, "the unchanged sync took no round");
    assert_eq!(fast, slow);
    assert_eq!(slow.events.len(), 10);
    assert!(slow.has_more);

    // Later pages come from the token alone and take no round.
    let page2 = h
        .sync(
            Uid(2),
            PHONE,
            Some(gen),
            slow.next_cursor,
            10,
            Some(slow.batch_token.clone()),
        )
        .unwrap();
    assert_eq!(rounds(&h), after_slow);
    assert_eq!(page2.batch_hwm, slow.batch_hwm, "hwm fixed by the token");
    assert_eq!(page2.events[0].sync_seq, slow.next_cursor.next());
    // Messages sent after the first page stay out of the batch.
    h.send(ConvId(10), Uid(1), 1_000, "late");
    let page3 = h
        .sync(
            Uid(2),
            PHONE,
            Some(gen),
            page2.next_cursor,
            100,
            Some(slow.batch_token.clone()),
        )
        .unwrap();
    assert_eq!(page3.next_cursor, slow.batch_hwm);
    assert!(!page3.has_more);
    h.ack(Uid(2), PHONE, gen, page3.next_cursor, &slow.batch_token)
        .unwrap();

    // A recovery lease: opened through the sequencer, then re-served
    // unchanged from it.
    let before = rounds(&h);
    let opened = h
        .sync(Uid(2), PHONE, Some(gen), SyncSeq(5), 10, None)
        .unwrap();
    assert!(opened.lease.is_some());
    assert_eq!(rounds(&h), before + 1, "opening the lease is a change");
    let again = h
        .sync(Uid(2), PHONE, Some(opened.generation), SyncSeq(5), 10, None)
        .unwrap();
    assert_eq!(rounds(&h), before + 1, "re-serving the lease is not");
    assert_eq!(again, opened);

    // Errors answered from durable state match the sequencer's too.
    h.ib().revoke_device(Uid(2), PHONE).wait().unwrap();
    let before = rounds(&h);
    let revoked = h.sync(Uid(2), PHONE, Some(opened.generation), SyncSeq(5), 10, None);
    assert!(matches!(revoked, Err(Error::DeviceRevoked)), "{revoked:?}");
    assert_eq!(rounds(&h), before, "a revoked device's sync takes no round");
}

/// The phone of [`gated_phone`] (six messages) has read two pages of two
/// events with `limit` 2: (first page, second page).
fn two_pages(ib: &Inbox, gen: Generation) -> (SyncPage, SyncPage) {
    let first = ib
        .sync(sync_req(Uid(3), Some(gen), SyncSeq(0), 2, None))
        .wait()
        .unwrap();
    let second = ib
        .sync(sync_req(
            Uid(3),
            Some(gen),
            first.next_cursor,
            2,
            Some(first.batch_token.clone()),
        ))
        .wait()
        .unwrap();
    assert!(second.has_more);
    (first, second)
}

/// The reply if it is there now, without waiting for it.
fn ready_now<T>(pending: &mut Pending<T>) -> Option<Result<T>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::future::Future::poll(std::pin::Pin::new(pending), &mut cx) {
        std::task::Poll::Ready(reply) => Some(reply),
        std::task::Poll::Pending => None,
    }
}

/// Sends `ack` from a thread of its own: it waits for its round's fsync.
fn ack_in_background(
    ib: &Arc<Inbox>,
    gen: Generation,
    page: &SyncPage,
) -> std::thread::JoinHandle<Result<AckReply>> {
    let ib = Arc::clone(ib);
    let req = AckRequest {
        uid: Uid(3),
        device: PHONE,
        generation: gen,
        seq: page.next_cursor,
        batch_token: page.batch_token.clone(),
    };
    std::thread::spawn(move || ib.ack(req).wait())
}

/// Checks that `pending` is not answered while `io` holds every fsync
/// (`held_because`: what answering it now would reveal), then opens the
/// gate, lets `holder` (the write held there) finish and waits for it.
fn answered_once_the_gate_opens<T, U: std::fmt::Debug>(
    io: &GatedIo,
    mut pending: Pending<T>,
    holder: std::thread::JoinHandle<Result<U>>,
    held_because: &str,
) -> T {
    assert!(ready_now(&mut pending).is_none(), "{held_because}");
    io.open();
    holder.join().unwrap().unwrap();
    pending.wait().unwrap()
}

/// The phone's row once a write queued after everything before has
/// settled (a device of its own, so the phone's row is left as it is).
fn phone_after_a_later_write(ib: &Inbox) -> DeviceInfo {
    ib.register_device(Uid(3), DeviceId(9)).wait().unwrap();
    ib.devices(Uid(3))
        .unwrap()
        .into_iter()
        .find(|d| d.device == PHONE)
        .unwrap()
}

#[test]
fn a_later_page_is_answered_while_the_ack_before_it_waits_for_its_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let (ib, io, gen) = gated_phone(dir.path(), &clock, 6);
    let (first, second) = two_pages(&ib, gen);
    let durable = ib.devices(Uid(3)).unwrap()[0].acked_sync_seq;

    // The phone's ACK of the first page is held at its fsync: its row is
    // not durable when the next page is asked for, but the ACK is all that
    // is not.
    io.shut();
    let acker = ack_in_background(&ib, gen, &first);
    io.wait_for_held_sync();
    let carried = SyncOptions {
        ack_through: Some(second.next_cursor),
        ..SyncOptions::default()
    };
    let token = Some(first.batch_token.clone());
    let mut third = ib.sync_with(
        sync_req(Uid(3), Some(gen), second.next_cursor, 2, token),
        carried,
    );
    let answered = ready_now(&mut third);
    io.open();
    acker.join().unwrap().unwrap();
    let third = answered
        .expect("the page waited for the fsync of the ACK before it")
        .unwrap();
    assert_eq!(
        third.events.first().map(|e| e.sync_seq),
        Some(second.next_cursor.plus(1))
    );
    assert_eq!(
        third.acked_sync_seq, durable,
        "the page reports the ACK that was durable, not the one still in its round"
    );
    // The carried ACK is made all the same, after the one before it.
    let phone = phone_after_a_later_write(&ib);
    assert_eq!(phone.acked_sync_seq, second.next_cursor, "the carried ACK");
}

#[test]
fn a_first_page_waits_for_the_ack_it_would_start_after() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let (ib, io, gen) = gated_phone(dir.path(), &clock, 6);
    let (_, second) = two_pages(&ib, gen);

    // A new batch starts at the ACK: while the ACK is in its round, the
    // first page would reveal it, so it waits.
    io.shut();
    let acker = ack_in_background(&ib, gen, &second);
    io.wait_for_held_sync();
    let page = answered_once_the_gate_opens(
        &io,
        ib.sync(sync_req(Uid(3), Some(gen), second.next_cursor, 2, None)),
        acker,
        "the first page was answered before the ACK it starts after was durable",
    );
    assert_eq!(page.acked_sync_seq, second.next_cursor);
    assert_eq!(
        page.events.first().map(|e| e.sync_seq),
        Some(second.next_cursor.plus(1))
    );
}

#[test]
fn a_sync_decided_in_a_round_makes_the_ack_it_carries() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let (ib, io, gen) = gated_phone(dir.path(), &clock, 6);
    let (first, _) = two_pages(&ib, gen);
    ib.ack(AckRequest {
        uid: Uid(3),
        device: PHONE,
        generation: gen,
        seq: first.next_cursor,
        batch_token: first.batch_token.clone(),
    })
    .wait()
    .unwrap();
    // The phone restored a backup from before its ACK: a recovery lease
    // up to the head, under a new generation, in pages of two.
    let leased = ib
        .sync(sync_req(
            Uid(3),
            Some(gen),
            SyncSeq(first.next_cursor.0 - 1),
            2,
            None,
        ))
        .wait()
        .unwrap();
    let lease = leased.lease.expect("a recovery lease");
    let gen = leased.generation;
    assert!(leased.has_more);

    // Finishing the lease changes the row's state, not only its ACK, and
    // is held at its fsync: the next page of the lease's batch cannot be
    // answered from the state as it stands, so it is decided in a round.
    io.shut();
    let finisher = {
        let ib = Arc::clone(&ib);
        std::thread::spawn(move || ib.finish_lease(Uid(3), PHONE, lease.lease_id, gen).wait())
    };
    io.wait_for_held_sync();
    let carried = SyncOptions {
        ack_through: Some(leased.next_cursor),
        ..SyncOptions::default()
    };
    // Queued before the gate opens (`sync_with` returns once it has).
    let token = Some(leased.batch_token.clone());
    let next = answered_once_the_gate_opens(
        &io,
        ib.sync_with(
            sync_req(Uid(3), Some(gen), leased.next_cursor, 2, token),
            carried,
        ),
        finisher,
        "the page was answered from a row whose state change is not durable",
    );
    assert_eq!(
        next.events.first().map(|e| e.sync_seq),
        Some(leased.next_cursor.plus(1))
    );
    let phone = phone_after_a_later_write(&ib);
    assert_eq!(phone.state, DeviceState::Active);
    assert_eq!(phone.acked_sync_seq, leased.next_cursor, "the carried ACK");
}
