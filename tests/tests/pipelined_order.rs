//! Requests pipelined on one connection take effect in the order they
//! arrived, while their replies still come back as each completes.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use inbox_tests::{all_history, send_text, Daemon, RawConn};
use inbox_wire::*;

const CONV: u64 = 7;
const SENDER: u64 = 1;
const READER: u64 = 2;

/// What request `i` of the pipelined run is.
#[derive(Clone, Copy, Debug)]
enum Step {
    Send,
    Recall { target: u64 },
    MarkRead,
}

#[tokio::test]
async fn thousand_pipelined_sends_recalls_and_read_marks_take_effect_in_wire_order() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    client
        .join(ConvMember {
            conv: CONV,
            uid: SENDER,
        })
        .await
        .unwrap();
    client
        .join(ConvMember {
            conv: CONV,
            uid: READER,
        })
        .await
        .unwrap();
    // Messages to recall later, sent one at a time so their ids are known.
    let mut targets = Vec::new();
    for i in 0..100 {
        targets.push(send_text(&client, CONV, SENDER, &format!("old{i}")).await);
    }
    let head_before = targets.last().unwrap().msg_seq;

    // 1,000 requests: every tenth a read mark up to the entry just before
    // it, every tenth (offset 4) a recall, the rest sends. Each log entry
    // should get the next msg_seq in wire order.
    let mut steps = Vec::new();
    let mut expected_seq = HashMap::new();
    let mut head = head_before;
    let mut out = BytesMut::new();
    let codec = FrameCodec::new(u32::MAX);
    for i in 0..1000u64 {
        let id = i + 100;
        let (step, request) = match i % 10 {
            9 => (
                Step::MarkRead,
                Request::MarkRead(MarkReadReq {
                    uid: READER,
                    conv: CONV,
                    read_to_seq: head,
                }),
            ),
            4 => {
                let target = targets[(i / 10) as usize].msg_id;
                (
                    Step::Recall { target },
                    Request::Recall(RecallReq {
                        conv: CONV,
                        sender: SENDER,
                        client_msg_id: u128::from(id) << 64,
                        target,
                    }),
                )
            }
            _ => (
                Step::Send,
                Request::Send(SendReq {
                    conv: CONV,
                    sender: SENDER,
                    client_msg_id: u128::from(id) << 64,
                    msg_type: 1,
                    payload: Bytes::from(format!("w{i}").into_bytes()),
                }),
            ),
        };
        if !matches!(step, Step::MarkRead) {
            head += 1;
        }
        expected_seq.insert(id, head);
        steps.push(step);
        codec.encode(&request.to_frame(id), &mut out).unwrap();
    }

    // One write: the server reads them back to back.
    let mut conn = RawConn::authenticated(daemon.addr).await;
    conn.write_raw(&out).await;
    let mut replies = HashMap::new();
    while replies.len() < steps.len() {
        let (id, reply) = conn.recv().await.expect("a reply for every request");
        assert!(replies.insert(id, reply).is_none(), "one reply per request");
    }

    for (i, step) in steps.iter().enumerate() {
        let id = i as u64 + 100;
        let want = expected_seq[&id];
        match (step, &replies[&id]) {
            (Step::Send | Step::Recall { .. }, Response::Send(r) | Response::Recall(r)) => {
                assert_eq!(
                    r.msg_seq, want,
                    "request {i} ({step:?}) took effect in wire order"
                );
            }
            (Step::MarkRead, Response::MarkRead(r)) => {
                assert_eq!(
                    r.read_seq, want,
                    "read mark {i} saw exactly the entries before it"
                );
            }
            (step, other) => panic!("request {i} ({step:?}) got {other:?}"),
        }
    }

    // The log holds the entries in wire order.
    let log: Vec<Message> = all_history(&client, READER, CONV)
        .await
        .into_iter()
        .filter(|m| m.msg_seq > head_before)
        .collect();
    let wire: Vec<Step> = steps
        .iter()
        .copied()
        .filter(|s| !matches!(s, Step::MarkRead))
        .collect();
    assert_eq!(log.len(), wire.len());
    let mut sends = (0..1000u64).filter(|i| i % 10 != 9 && i % 10 != 4);
    for (entry, step) in log.iter().zip(&wire) {
        match step {
            Step::Send => {
                let i = sends.next().unwrap();
                assert_eq!(entry.kind, MessageKind::Normal);
                assert_eq!(entry.payload, Bytes::from(format!("w{i}").into_bytes()));
            }
            Step::Recall { target } => {
                assert_eq!(entry.kind, MessageKind::Recall);
                assert_eq!(entry.target, Some(*target));
            }
            Step::MarkRead => unreachable!(),
        }
    }
}

#[tokio::test]
async fn a_read_pipelined_after_a_send_sees_the_send() {
    let dir = inbox_tests::data_dir();
    let daemon = Daemon::start(dir.path());
    let client = daemon.client().await;
    client
        .join(ConvMember {
            conv: CONV,
            uid: SENDER,
        })
        .await
        .unwrap();
    let mut conn = RawConn::authenticated(daemon.addr).await;
    let mut out = BytesMut::new();
    let codec = FrameCodec::new(u32::MAX);
    for round in 0..50u64 {
        let send = Request::Send(SendReq {
            conv: CONV,
            sender: SENDER,
            client_msg_id: u128::from(round + 1),
            msg_type: 1,
            payload: Bytes::from_static(b"x"),
        });
        let history = Request::History(HistoryReq {
            uid: SENDER,
            conv: CONV,
            before_seq: None,
            limit: 1,
        });
        codec
            .encode(&send.to_frame(2 * round + 10), &mut out)
            .unwrap();
        codec
            .encode(&history.to_frame(2 * round + 11), &mut out)
            .unwrap();
    }
    conn.write_raw(&out).await;
    let mut sent = HashMap::new();
    let mut seen = HashMap::new();
    for _ in 0..100 {
        match conn.recv().await.expect("reply") {
            (id, Response::Send(r)) => {
                sent.insert(id, r.msg_seq);
            }
            (id, Response::History(page)) => {
                seen.insert(id, page.messages[0].msg_seq);
            }
            other => panic!("{other:?}"),
        }
    }
    for round in 0..50u64 {
        assert_eq!(
            seen[&(2 * round + 11)],
            sent[&(2 * round + 10)],
            "the history read right after send {round} shows that send as the newest"
        );
    }
}
