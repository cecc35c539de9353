//! A leader applies its rounds before they commit. An answer that rests
//! on such a round without being its reply (an idempotent retry found in
//! the table, a read of the state) must not go out before the round
//! commits, and must fail with `NotLeader` if it never does.
//!
//! Found by pausing a leader of a group of three: a retried send was
//! answered "duplicate" from a round the group discarded, with a
//! `msg_seq` that the group gave another message
//! (`tests/tests/group_paused_leader.rs` is the process-level test).

mod replica_common;

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use inbox_engine::*;
use replica_common::*;

const SEG: u64 = 256 << 10;

fn key_100() -> SendRequest {
    SendRequest {
        conv: ConvId(10),
        sender: Uid(1),
        client_msg_id: 100,
        msg_type: 1,
        payload: "K".into(),
    }
}

/// Wakes the thread that polls.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `f` to its end on this thread (the engine's futures need no
/// runtime).
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

/// A leader with one committed member, and its handle.
fn leading() -> (Node, inbox_engine::inbox::Leader) {
    let leader = Node::new(SEG);
    let lead = leader.ib().lead().unwrap();
    let join = leader.ib().join(Uid(1), ConvId(10));
    let taken = lead.wait_entries(Duration::from_secs(5));
    lead.commit(taken.last().expect("the join's entry").index());
    join.wait().unwrap();
    (leader, lead)
}

#[test]
fn a_retry_of_a_send_whose_round_is_not_committed_waits_and_fails_with_it() {
    let (leader, lead) = leading();
    let first = leader.ib().send(key_100());
    assert!(!lead.wait_entries(Duration::from_secs(5)).is_empty());
    let retry = leader.ib().send(key_100());
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !retry.is_released(),
        "a retry was answered before the round it found was committed"
    );
    lead.end("another node leads");
    let err = first.wait().unwrap_err();
    assert!(matches!(err, Error::NotLeader(_)), "{err}");
    let err = retry.wait().unwrap_err();
    assert!(
        matches!(err, Error::NotLeader(_)),
        "the retry of a discarded round: {err}"
    );
}

#[test]
fn a_retry_of_a_send_whose_round_commits_is_answered_as_a_duplicate_once_it_does() {
    let (leader, lead) = leading();
    let first = leader.ib().send(key_100());
    let taken = lead.wait_entries(Duration::from_secs(5));
    let retry = leader.ib().send(key_100());
    lead.commit(taken.last().expect("the send's entry").index());
    let sent = first.wait().unwrap();
    let again = retry.wait().unwrap();
    assert!(again.duplicate);
    assert_eq!((again.msg_id, again.msg_seq), (sent.msg_id, sent.msg_seq));
}

#[test]
fn a_read_waits_until_every_round_it_can_have_seen_is_committed() {
    let (leader, lead) = leading();
    let register = leader.ib().register_device(Uid(7), DeviceId(3));
    let taken = lead.wait_entries(Duration::from_secs(5));
    // The state already holds the device: a read of it must not answer yet.
    let mut settled = std::pin::pin!(lead.settled());
    let mut cx = Context::from_waker(Waker::noop());
    assert!(
        settled.as_mut().poll(&mut cx).is_pending(),
        "settled before the round was committed"
    );
    lead.commit(taken.last().expect("the entry").index());
    block_on(settled).unwrap();
    register.wait().unwrap();
}

#[test]
fn a_read_that_saw_a_round_of_an_ended_leadership_fails_with_not_leader() {
    let (leader, lead) = leading();
    let _register = leader.ib().register_device(Uid(7), DeviceId(3));
    assert!(!lead.wait_entries(Duration::from_secs(5)).is_empty());
    lead.end("another node leads");
    let err = block_on(lead.settled()).unwrap_err();
    assert!(matches!(err, Error::NotLeader(_)), "{err}");
}

#[test]
fn a_new_leader_counts_only_what_was_committed_and_holds_answers_on_its_tail() {
    // A follower applies two rounds, only the first of which is known to
    // be committed when it takes over.
    let leader = Node::new(SEG);
    let follower = Node::follower(SEG);
    let lead = leader.ib().lead().unwrap();
    let join = leader.ib().join(Uid(1), ConvId(10));
    let mut entries = lead.wait_entries(Duration::from_secs(5));
    let first = leader.ib().send(key_100());
    entries.extend(lead.wait_entries(Duration::from_secs(5)));
    for e in &entries {
        follower.ib().apply_entry(e.clone()).wait().unwrap();
    }
    drop((join, first));
    let committed = entries[0].index();
    let new = follower.ib().lead_after(committed).unwrap();
    // A retry of the send on the new leader rests on its uncommitted tail.
    let retry = follower.ib().send(key_100());
    std::thread::sleep(Duration::from_millis(100));
    assert!(!retry.is_released(), "answered from an uncommitted tail");
    new.commit(entries.last().unwrap().index());
    let again = retry.wait().unwrap();
    assert!(again.duplicate, "{again:?}");
}
