//! Followers fed a leader's entries end with the leader's state: the same
//! rounds applied through the same effect application, each placed in the
//! follower's own log. A follower restarted mid-stream resumes from the
//! index its own log holds.

mod replica_common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use inbox_engine::*;
use replica_common::*;

const SEG: u64 = 256 << 10;

/// About 2 KB that do not compress.
fn noise(seed: u128) -> String {
    let mut x = (seed as u64) | 1;
    (0..250)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{:08x}", x as u32)
        })
        .collect()
}

/// Joins, sends (enough to roll the leader's segments), devices with
/// syncs and ACKs, a recall, an edit, read cursors, flags and a leave.
fn workload(ib: &Inbox, round: u128) {
    let base = round * 10_000;
    for (uid, conv) in [
        (1, 10),
        (2, 10),
        (3, 10),
        (1, 11),
        (4, 11),
        (5, 12),
        (2, 12),
    ] {
        ib.join(Uid(uid), ConvId(conv)).wait().unwrap();
    }
    for (uid, dev) in [(2, 1), (2, 2), (4, 1)] {
        ib.register_device(Uid(uid), DeviceId(dev)).wait().unwrap();
    }
    // Pipelined sends: several per round.
    let req = |i: u128| SendRequest {
        conv: ConvId(10 + (i % 3) as u64),
        sender: Uid([1, 4, 5][(i % 3) as usize]),
        client_msg_id: base + i,
        msg_type: 1,
        payload: Bytes::from(noise(round * 1000 + i)),
    };
    let pending: Vec<_> = (0..120u128).map(|i| ib.send(req(i))).collect();
    let sent: Vec<SendReply> = pending.into_iter().map(|p| p.wait().unwrap()).collect();
    catch_up(ib, 2, 1);
    catch_up(ib, 4, 1);
    ib.recall(RecallRequest {
        conv: ConvId(10),
        sender: Uid(1),
        client_msg_id: base + 900,
        target: sent[0].msg_id,
    })
    .wait()
    .unwrap();
    ib.edit(EditRequest {
        sender: Uid(4),
        conv: ConvId(11),
        client_msg_id: base + 901,
        target: sent[1].msg_id,
        payload: Bytes::from_static(b"edited"),
    })
    .wait()
    .unwrap();
    ib.mark_read(Uid(3), ConvId(10), MsgSeq(20)).wait().unwrap();
    ib.set_conv_flags(
        Uid(1),
        ConvId(11),
        ConvFlags {
            muted: true,
            pinned: true,
        },
    )
    .wait()
    .unwrap();
    ib.leave(Uid(3), ConvId(10)).wait().unwrap();
    // A retried send is answered from its idempotency key: no new round
    // state, but the same answer everywhere.
    assert_eq!(ib.send(req(15)).wait().unwrap().msg_id, sent[15].msg_id);
}

#[test]
fn followers_fed_the_leaders_entries_converge_to_its_state_under_a_mixed_workload() {
    let leader = Node::new(SEG);
    // One follower lays its log out like the leader, one with segments
    // four times larger: its records sit at other places.
    let same = Node::follower(SEG);
    let larger = Node::follower(SEG * 4);
    let lead = leader.ib().lead().unwrap();
    let pump = Pump::start(lead, vec![Arc::clone(same.ib()), Arc::clone(larger.ib())]);
    let ib = leader.ib();
    workload(ib, 1);
    // Compaction on the leader: past the safety window every ACKed event
    // is trimmed; the trims are rounds like any other.
    leader.clock.advance(Duration::from_secs(8 * 24 * 3600));
    let report = ib.compact().unwrap();
    assert!(report.events_reclaimed > 0, "{report:?}");
    workload(ib, 2);
    let index = ib.replica_index();
    wait_index(same.ib(), index);
    wait_index(larger.ib(), index);
    pump.stop();
    assert!(index > 20, "{index} rounds");
    for f in [&same, &larger] {
        assert_eq!(f.ib().replica_index(), index);
        assert_eq!(f.ib().replica_digest(), ib.replica_digest());
        assert_eq!(answers(f.ib()), answers(ib));
        f.ib().check_invariants().unwrap();
        f.ib().check_segment_refs().unwrap();
    }
    // The larger segments put records elsewhere: the follower patched its
    // own locations rather than copying the leader's.
    assert_ne!(larger.ib().state_digest(), same.ib().state_digest());
    // A follower refuses client writes.
    let err = send(same.ib(), 10, 1, 1, "to a follower").unwrap_err();
    assert!(matches!(err, Error::NotLeader(_)), "{err}");
}

#[test]
fn a_follower_restarted_mid_stream_resumes_from_its_durable_index() {
    let leader = Node::new(SEG);
    let mut follower = Node::follower(SEG);
    let pump = Pump::start(leader.ib().lead().unwrap(), vec![Arc::clone(follower.ib())]);
    workload(leader.ib(), 1);
    let entries = pump.stop();
    let applied = follower.ib().replica_index();
    assert!(applied > 0);
    // The leader goes on alone for a while (the follower is down).
    let lead = leader.ib().lead().unwrap();
    let pump = Pump::start_with_log(lead, vec![], Arc::clone(&entries));
    workload(leader.ib(), 2);
    pump.stop();
    let digest = follower.ib().state_digest();
    follower.restart_as_follower();
    assert_eq!(follower.ib().replica_index(), applied);
    assert_eq!(follower.ib().state_digest(), digest);
    let all = entries.lock().unwrap().clone();
    // An entry it already holds is refused and changes nothing.
    let old = all[(applied - 1) as usize].clone();
    let err = follower.ib().apply_entry(old).wait().unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err}");
    assert_eq!(follower.ib().state_digest(), digest);
    // It resumes from its own index.
    for e in all.iter().filter(|e| e.index() > applied) {
        follower.ib().apply_entry(e.clone()).wait().unwrap();
    }
    assert_eq!(follower.ib().replica_index(), leader.ib().replica_index());
    assert_eq!(follower.ib().replica_digest(), leader.ib().replica_digest());
    assert_eq!(answers(follower.ib()), answers(leader.ib()));
}

#[test]
fn a_killed_follower_recovers_its_index_from_its_log_alone() {
    let leader = Node::new(SEG);
    let mut follower = Node::follower(SEG);
    let pump = Pump::start(leader.ib().lead().unwrap(), vec![Arc::clone(follower.ib())]);
    workload(leader.ib(), 1);
    let entries = pump.stop();
    let applied = follower.ib().replica_index();
    // No final checkpoint: the index comes from replaying round marks.
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(follower.dir.path(), image.path());
    let _ = std::fs::remove_dir_all(image.path().join("checkpoint"));
    drop(follower.inbox.take());
    follower.dir = image;
    follower.open_again();
    assert_eq!(follower.ib().replica_index(), applied);
    assert_eq!(follower.ib().replica_digest(), leader.ib().replica_digest());
    // An entry from the wire is decoded first; damaged bytes are refused.
    let last = entries.lock().unwrap().last().unwrap().clone();
    let mut bytes = last.encode();
    assert_eq!(inbox_engine::inbox::Entry::decode(&bytes).unwrap(), last);
    bytes[20] ^= 1;
    assert!(inbox_engine::inbox::Entry::decode(&bytes).is_err());
}
