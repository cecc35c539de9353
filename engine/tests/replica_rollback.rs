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
    let taken = lead.wait_entries(Duration::from_secs(10));
    let second = leader.ib().join(Uid(3), ConvId(10));
    let mut taken: Vec<_> = taken
        .into_iter()
        .chain(lead.wait_entries(Duration::from_secs(10)))
        .collect();
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
