//! Reusing an idempotency key for a different request used to answer
//! `duplicate` with the first message's ids, silently dropping the new
//! message. Only the same request is a duplicate; anything else is
//! `CONFLICT` and writes nothing.

mod inbox_common;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::*;

const CONV: ConvId = ConvId(10);

fn send(h: &Harness, cmid: u128, msg_type: MsgType, body: &[u8]) -> Result<SendReply> {
    h.ib()
        .send(SendRequest {
            conv: CONV,
            sender: Uid(1),
            client_msg_id: cmid,
            msg_type,
            payload: Bytes::copy_from_slice(body),
        })
        .wait()
}

#[test]
fn the_same_key_with_a_different_payload_is_a_conflict() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    let first = send(&h, 7, 1, b"first").unwrap();
    let err = send(&h, 7, 1, b"second").expect_err("a different payload");
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    let history = h.ib().history(Uid(1), CONV, None, 50).unwrap();
    assert_eq!(
        history.messages[0].msg_seq, first.msg_seq,
        "nothing was written"
    );
}

#[test]
fn the_same_key_with_a_different_type_is_a_conflict() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    send(&h, 7, 1, b"same").unwrap();
    assert!(matches!(send(&h, 7, 2, b"same"), Err(Error::Conflict(_))));
}

#[test]
fn the_same_key_for_a_recall_of_a_sent_message_is_a_conflict() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    let first = send(&h, 7, 1, b"body").unwrap();
    let err = h
        .ib()
        .recall(RecallRequest {
            conv: CONV,
            sender: Uid(1),
            client_msg_id: 7,
            target: first.msg_id,
        })
        .wait()
        .expect_err("a recall is not the send that used the key");
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
}

#[test]
fn the_same_request_again_is_a_duplicate_with_the_original_ids() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    // Large enough to be stored compressed.
    let body = vec![b'a'; 4096];
    let first = send(&h, 7, 1, &body).unwrap();
    let again = send(&h, 7, 1, &body).unwrap();
    assert!(again.duplicate);
    assert_eq!((again.msg_id, again.msg_seq), (first.msg_id, first.msg_seq));
}

#[test]
fn a_retry_pipelined_in_the_same_round_is_still_compared() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    let a = h.ib().send(SendRequest {
        conv: CONV,
        sender: Uid(1),
        client_msg_id: 9,
        msg_type: 1,
        payload: Bytes::from_static(b"one"),
    });
    let b = h.ib().send(SendRequest {
        conv: CONV,
        sender: Uid(1),
        client_msg_id: 9,
        msg_type: 1,
        payload: Bytes::from_static(b"two"),
    });
    let c = h.ib().send(SendRequest {
        conv: CONV,
        sender: Uid(1),
        client_msg_id: 9,
        msg_type: 1,
        payload: Bytes::from_static(b"one"),
    });
    let a = a.wait().unwrap();
    assert!(matches!(b.wait(), Err(Error::Conflict(_))));
    let c = c.wait().unwrap();
    assert!(c.duplicate);
    assert_eq!(c.msg_id, a.msg_id);
}

#[test]
fn the_comparison_survives_a_restart() {
    let mut h = Harness::new();
    h.join(Uid(1), CONV);
    send(&h, 7, 1, b"before restart").unwrap();
    h.restart(true, |_| {});
    assert!(send(&h, 7, 1, b"before restart").unwrap().duplicate);
    assert!(matches!(send(&h, 7, 1, b"other"), Err(Error::Conflict(_))));
}
