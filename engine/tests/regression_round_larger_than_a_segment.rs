//! Regression: a round gathered every command waiting for the sequencer
//! (up to 4,096) into one `msg` batch and one `evt` batch, whatever their
//! size. When a batch came out larger than a segment the log refused it
//! with `TooLarge`, after the round's effects had been applied, and the
//! engine poisoned itself: enough concurrent sends (or large payloads)
//! stopped every write. Rounds now close at half a segment, payloads are
//! capped so one message fits that, and compaction sizes its commands to
//! it.

mod inbox_common;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::*;

fn small_segments(c: &mut InboxConfig) {
    c.segment_bytes = 16 << 10;
}

#[test]
fn concurrent_sends_larger_than_a_segment_together_are_split_into_rounds() {
    let mut h = Harness::with(small_segments);
    h.join(Uid(1), ConvId(10));
    h.join(Uid(2), ConvId(10));
    // 800 sends queued at once: about 75 KiB of `evt` records, more than
    // four 16 KiB segments.
    let replies = h.send_many(ConvId(10), Uid(1), 1000, 800);
    let seqs: Vec<MsgSeq> = replies.iter().map(|r| r.msg_seq).collect();
    assert_eq!(
        seqs,
        MsgSeq(3).through(MsgSeq(802)).collect::<Vec<_>>(),
        "one seq each, in order"
    );
    // The engine still writes, and everything is there after a restart.
    assert_eq!(
        h.send(ConvId(10), Uid(2), 5000, "after").msg_seq,
        MsgSeq(803)
    );
    h.restart(false, small_segments);
    assert_eq!(h.ib().stats().messages, 803);
    let newest = h.ib().history(Uid(2), ConvId(10), None, 1).unwrap();
    assert_eq!(newest.messages[0].msg_seq, MsgSeq(803));
    assert_eq!(&newest.messages[0].payload[..], b"after");
}

#[test]
fn a_payload_that_cannot_fit_half_a_segment_is_refused_and_changes_nothing() {
    let h = Harness::with(small_segments);
    h.join(Uid(1), ConvId(10));
    let limit = h.ib().payload_limit();
    assert!(limit < 64 << 10, "capped below payload_bytes_max: {limit}");
    let send = |len: u64, cmid: u128| {
        h.ib()
            .send(SendRequest {
                conv: ConvId(10),
                sender: Uid(1),
                client_msg_id: cmid,
                msg_type: 1,
                payload: Bytes::from(vec![b'x'; len as usize]),
            })
            .wait()
    };
    let err = send(limit + 1, 1).unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { size, limit: l } if size == limit + 1 && l == limit),
        "{err:?}"
    );
    // Refused before anything was decided: the next send takes seq 2
    // (after the join), and the largest payload allowed is written.
    assert_eq!(send(limit, 2).unwrap().msg_seq, MsgSeq(2));
    assert_eq!(send(10, 3).unwrap().msg_seq, MsgSeq(3));
}
