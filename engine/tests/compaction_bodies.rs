//! Compaction moves every retained body out of the `evt` segments whose
//! events are gone, however many there are: a pass collects them a few
//! thousand at a time (`compaction/bodies.rs`), and none may be skipped
//! or moved twice between two collections.

mod inbox_common;

use std::time::Duration;

use inbox_common::*;
use inbox_engine::*;

const CONV: ConvId = ConvId(3);

/// The sealed `evt` segments that still hold bodies of retained messages.
fn segments_held_by_bodies(h: &Harness) -> Vec<(u32, Vec<String>)> {
    (0..4096)
        .filter_map(|id| h.ib().explain_segment("evt", id).ok())
        .filter(|s| {
            s.held_by
                .iter()
                .any(|why| why.contains("bodies of retained messages"))
        })
        .filter(|s| !s.held_by.iter().any(|why| why.contains("active segment")))
        .map(|s| (s.segment, s.held_by))
        .collect()
}

#[test]
fn a_pass_moves_every_body_of_many_thousands_out_of_evt_and_each_reads_back() {
    let mut h = Harness::with(|c| {
        c.segment_bytes = 64 << 10;
        c.safety_window = Duration::ZERO;
    });
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    let sent = h.send_many(CONV, Uid(1), 1, 10_000);
    for uid in [Uid(1), Uid(2)] {
        let reg = h.register(uid, DeviceId(1));
        h.catch_up(uid, DeviceId(1), reg.device.generation, SyncSeq(0));
    }
    assert!(
        !segments_held_by_bodies(&h).is_empty(),
        "before the pass, sealed segments hold only bodies"
    );
    let before = segments_held_by_bodies(&h).len();
    h.ib().compact().unwrap();
    // The pass's own records may seal the segment that was active when it
    // began, whose bodies the next pass moves.
    let left = segments_held_by_bodies(&h);
    assert!(
        left.len() <= 1,
        "of {before}, still held by bodies: {left:?}"
    );
    h.ib().compact().unwrap();
    assert_eq!(segments_held_by_bodies(&h), [], "no body was left behind");

    let check = |h: &Harness, when: &str| {
        let all = h.whole_history(Uid(2), CONV);
        // The joins are entries too, before the sends.
        let sends: Vec<_> = all.iter().filter(|m| m.msg_seq > MsgSeq(2)).collect();
        assert_eq!(sends.len(), sent.len(), "{when}");
        for (i, (m, reply)) in sends.into_iter().zip(&sent).enumerate() {
            assert_eq!(m.msg_seq, reply.msg_seq, "{when}");
            let seq = m.msg_seq;
            assert_eq!(
                &m.payload[..],
                format!("m{i}").as_bytes(),
                "{when}: message {seq}"
            );
        }
    };
    check(&h, "after the pass");
    h.ib().checkpoint().unwrap();
    h.kill_restart(|c| {
        c.segment_bytes = 64 << 10;
        c.safety_window = Duration::ZERO;
    });
    check(&h, "after a kill");
}
