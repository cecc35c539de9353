//! Rounds that will never commit: a leader that lost its leadership
//! discards them (its clients hear `NotLeader`, its state and log go back
//! to the committed prefix, no follower ever sees them), and a follower
//! whose tail conflicts with a new leader's drops it the same way.

mod replica_common;

use std::sync::Arc;
use std::time::Duration;

use inbox_engine::*;
use replica_common::*;

const SEG: u64 = 256 << 10;

fn setup(leader: &Node, follower: &Node) {
    let pump = Pump::start(leader.ib().lead().unwrap(), vec![Arc::clone(follower.ib())]);
    for (uid, conv) in [(1, 10), (2, 10), (3, 11)] {
        leader.ib().join(Uid(uid), ConvId(conv)).wait().unwrap();
    }
    leader
        .ib()
        .register_device(Uid(2), DeviceId(1))
        .wait()
        .unwrap();
    for i in 0..20u128 {
        send(leader.ib(), 10, 1, i, &format!("committed {i}")).unwrap();
    }
    pump.stop();
}

#[test]
fn a_leader_whose_uncommitted_rounds_are_discarded_rebuilds_to_the_committed_prefix() {
    let mut leader = Node::new(SEG);
    let follower = Node::follower(SEG);
    setup(&leader, &follower);
    let committed = leader.ib().replica_index();
    let digest = leader.ib().state_digest();
    let answers_before = answers(leader.ib());

    // Two rounds the consensus layer never commits.
    let lead = leader.ib().lead().unwrap();
    let first = leader.ib().send(SendRequest {
        conv: ConvId(10),
        sender: Uid(2),
        client_msg_id: 500,
        msg_type: 1,
        payload: "never committed".into(),
    });
    // One round each: the second is queued once the first is handed out.
    let mut taken = Vec::new();
    while taken.is_empty() {
        taken.extend(lead.wait_entries(Duration::from_secs(1)));
    }
    let second = leader.ib().join(Uid(3), ConvId(10));
    while taken.len() < 2 {
        taken.extend(lead.wait_entries(Duration::from_secs(1)));
    }
    assert_eq!(
        taken.iter().map(|e| e.index()).collect::<Vec<_>>(),
        vec![committed + 1, committed + 2]
    );
    // Applied on the leader (the next round saw them), not answered.
    assert_eq!(leader.ib().replica_index(), committed + 2);

    leader.ib().discard_from(committed + 1).unwrap();
    let err = first.wait().unwrap_err();
    assert!(matches!(err, Error::NotLeader(_)), "{err}");
    let err = second.wait().unwrap_err();
    assert!(matches!(err, Error::NotLeader(_)), "{err}");
    assert_eq!(leader.ib().replica_index(), committed);
    assert_eq!(leader.ib().state_digest(), digest);
    assert_eq!(answers(leader.ib()), answers_before);
    leader.ib().check_invariants().unwrap();
    // The follower never saw them.
    assert_eq!(follower.ib().replica_index(), committed);
    assert_eq!(follower.ib().replica_digest(), leader.ib().replica_digest());
    // The old leader now follows: clients are sent to the leader.
    let err = send(leader.ib(), 10, 1, 600, "late").unwrap_err();
    assert!(matches!(err, Error::NotLeader(_)), "{err}");
    // The log was cut too: a restart comes back to the same prefix.
    leader.restart_as_follower();
    assert_eq!(leader.ib().replica_index(), committed);
    assert_eq!(leader.ib().state_digest(), digest);

    // The follower takes the lead; the old leader follows it and gets its
    // rounds in place of the discarded ones.
    let pump = Pump::start(follower.ib().lead().unwrap(), vec![Arc::clone(leader.ib())]);
    send(follower.ib(), 10, 2, 700, "from the new leader").unwrap();
    follower.ib().join(Uid(3), ConvId(10)).wait().unwrap();
    wait_index(leader.ib(), follower.ib().replica_index());
    pump.stop();
    assert_eq!(leader.ib().replica_digest(), follower.ib().replica_digest());
    assert_eq!(answers(leader.ib()), answers(follower.ib()));
}

#[test]
fn a_committed_round_cannot_be_discarded() {
    let leader = Node::new(SEG);
    let follower = Node::follower(SEG);
    setup(&leader, &follower);
    let committed = leader.ib().replica_index();
    let lead = leader.ib().lead().unwrap();
    let err = leader.ib().discard_from(committed).unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err}");
    assert_eq!(leader.ib().replica_index(), committed);
    // Still the leader: the next round is handed out and answered once
    // committed.
    let pending = leader.ib().join(Uid(5), ConvId(12));
    let mut entries = Vec::new();
    while entries.is_empty() {
        entries.extend(lead.wait_entries(Duration::from_secs(1)));
    }
    assert_eq!(entries[0].index(), committed + 1);
    lead.commit(committed + 1);
    pending.wait().unwrap();
}

#[test]
fn a_follower_drops_a_conflicting_tail_even_past_a_checkpoint_and_takes_the_new_leaders_rounds() {
    let old_leader = Node::new(SEG);
    let follower = Node::follower(SEG);
    let other = Node::follower(SEG);
    let pump = Pump::start(
        old_leader.ib().lead().unwrap(),
        vec![Arc::clone(follower.ib()), Arc::clone(other.ib())],
    );
    for (uid, conv) in [(1, 10), (2, 10)] {
        old_leader.ib().join(Uid(uid), ConvId(conv)).wait().unwrap();
    }
    send(old_leader.ib(), 10, 1, 1, "kept").unwrap();
    pump.stop();
    let kept = follower.ib().replica_index();
    let digest = follower.ib().state_digest();
    // The old leader's next rounds reach `follower` only, and are never
    // committed.
    let lead = old_leader.ib().lead().unwrap();
    let lost = old_leader.ib().send(SendRequest {
        conv: ConvId(10),
        sender: Uid(2),
        client_msg_id: 2,
        msg_type: 1,
        payload: "lost".into(),
    });
    let mut tail = Vec::new();
    while tail.is_empty() {
        tail.extend(lead.wait_entries(Duration::from_secs(1)));
    }
    for e in tail {
        follower.ib().apply_entry(e).wait().unwrap();
    }
    assert_eq!(follower.ib().replica_index(), kept + 1);
    // A checkpoint now covers the tail to be dropped.
    follower.ib().checkpoint().unwrap();
    old_leader.ib().follow().unwrap();
    let err = lost.wait().unwrap_err();
    assert!(matches!(err, Error::NotLeader(_)), "{err}");

    // `other` leads; `follower` drops the conflicting tail first.
    follower.ib().discard_from(kept + 1).unwrap();
    assert_eq!(follower.ib().replica_index(), kept);
    assert_eq!(follower.ib().state_digest(), digest);
    let pump = Pump::start(other.ib().lead().unwrap(), vec![Arc::clone(follower.ib())]);
    send(other.ib(), 10, 2, 3, "instead").unwrap();
    pump.stop();
    assert_eq!(follower.ib().replica_digest(), other.ib().replica_digest());
    assert_eq!(answers(follower.ib()), answers(other.ib()));
    follower.ib().check_invariants().unwrap();
}

/// A power cut at any step of a discard (checkpoints removed, the log
/// cut, the state reloaded) leaves the store either with the discarded
/// rounds (to be discarded again) or without them, never in between.
#[test]
fn a_power_cut_at_any_step_of_a_discard_recovers_before_or_after_it() {
    use inbox_engine::log::{FaultyIo, SyncPolicy};
    let root = tempfile::tempdir().unwrap();
    let images = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let clock = Arc::new(inbox_engine::inbox::ManualClock::new(T0));
    let cfg = |dir: &std::path::Path| {
        let mut c = config(dir, &clock, SEG);
        c.sync = SyncPolicy::Always;
        c
    };
    let io = Arc::new(FaultyIo::new());
    let node = Inbox::open_with_io(cfg(&data), io.clone()).unwrap();
    let lead = Arc::new(node.lead().unwrap());
    // Commit everything handed out, for the committed prefix.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let committer = {
        let (lead, stop) = (Arc::clone(&lead), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                for e in lead.wait_entries(Duration::from_millis(5)) {
                    lead.commit(e.index());
                }
            }
        })
    };
    for (uid, conv) in [(1, 10), (2, 10)] {
        node.join(Uid(uid), ConvId(conv)).wait().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    committer.join().unwrap();
    let committed = node.replica_index();
    let digest_before = node.replica_digest();
    // Two rounds never committed; once this node follows, their replies
    // fail, each after its batch is durable here.
    let first = node.send(SendRequest {
        conv: ConvId(10),
        sender: Uid(1),
        client_msg_id: 1,
        msg_type: 1,
        payload: "lost 1".into(),
    });
    // One round each: the second is queued once the first is handed out.
    let mut taken = 0;
    while taken < 1 {
        taken += lead.wait_entries(Duration::from_secs(1)).len();
    }
    let second = node.leave(Uid(2), ConvId(10));
    while taken < 2 {
        taken += lead.wait_entries(Duration::from_secs(1)).len();
    }
    node.follow().unwrap();
    assert!(matches!(first.wait(), Err(Error::NotLeader(_))));
    assert!(matches!(second.wait(), Err(Error::NotLeader(_))));
    assert_eq!(node.replica_index(), committed + 2);
    let digest_with = node.replica_digest();
    io.crash_image_at_every_step(root.path(), images.path(), false);
    node.discard_from(committed + 1).unwrap();
    let steps = io.crash_images_taken();
    io.stop_crash_images();
    assert_eq!(node.replica_digest(), digest_before);
    drop(node);
    assert!(steps >= 3, "{steps} images");
    let (mut before, mut after) = (0, 0);
    for n in 1..=steps {
        let dir = images.path().join(format!("{n:06}")).join("data");
        std::fs::create_dir_all(&dir).unwrap();
        let ib = Inbox::open(cfg(&dir)).unwrap_or_else(|e| panic!("image {n}: {e}"));
        match ib.replica_index() {
            i if i == committed + 2 => {
                assert_eq!(ib.replica_digest(), digest_with, "image {n}");
                before += 1;
            }
            i if i == committed => {
                assert_eq!(ib.replica_digest(), digest_before, "image {n}");
                after += 1;
            }
            i => panic!("image {n}: replication index {i}"),
        }
    }
    assert!(before > 0 && after > 0, "{before} before, {after} after");
}
