//! A node reads its rounds back from its own `evt` log as the entries it
//! handed out or applied, for a follower that lags; empty rounds (the
//! consensus layer's own entries) take an index and change nothing a client reads.

mod replica_common;

use std::sync::Arc;

use inbox_engine::inbox::Entry;
use inbox_engine::*;
use replica_common::*;

const SEG: u64 = 256 << 10;

fn joins_and_sends(ib: &Inbox, base: u128) {
    for (uid, conv) in [(1, 10), (2, 10), (3, 11)] {
        ib.join(Uid(uid), ConvId(conv)).wait().unwrap();
    }
    for i in 0..20u128 {
        send(
            ib,
            10 + (i % 2) as u64,
            [1, 3][(i % 2) as usize],
            base + i,
            "hello",
        )
        .unwrap();
    }
}

#[test]
fn entries_read_back_from_the_log_equal_the_entries_handed_out() {
    let leader = Node::new(SEG);
    let follower = Node::follower(SEG);
    let lead = leader.ib().lead().unwrap();
    let pump = Pump::start(lead, vec![Arc::clone(follower.ib())]);
    joins_and_sends(leader.ib(), 1);
    let log = pump.stop();
    let handed: Vec<Entry> = log.lock().unwrap().clone();
    let last = handed.last().unwrap().index();
    assert_eq!(last, leader.ib().replica_index());

    assert_eq!(leader.ib().read_entries(1, last).unwrap(), handed);
    assert_eq!(follower.ib().read_entries(1, last).unwrap(), handed);
    assert_eq!(
        leader.ib().read_entries(3, 5).unwrap(),
        handed[2..5].to_vec()
    );
    assert!(leader
        .ib()
        .read_entries(last + 1, last + 9)
        .unwrap()
        .is_empty());
    assert!(leader.ib().read_entries(5, 4).unwrap().is_empty());
}

#[test]
fn an_empty_round_takes_its_index_changes_no_answer_and_reads_back() {
    let mut node = Node::follower(SEG);
    let before = answers(node.ib());
    node.ib().apply_entry(Entry::empty(1)).wait().unwrap();
    node.ib().apply_entry(Entry::empty(2)).wait().unwrap();
    assert_eq!(node.ib().replica_index(), 2);
    assert_eq!(answers(node.ib()), before);
    assert_eq!(
        node.ib().read_entries(1, 2).unwrap(),
        vec![Entry::empty(1), Entry::empty(2)]
    );
    // A gap is still refused.
    assert!(node.ib().apply_entry(Entry::empty(4)).wait().is_err());
    node.restart_as_follower();
    assert_eq!(node.ib().replica_index(), 2);
    assert_eq!(node.ib().read_entries(2, 2).unwrap(), vec![Entry::empty(2)]);
}
