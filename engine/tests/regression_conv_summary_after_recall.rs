//! The conversation summary after a recall used to carry the recall's
//! 8-byte target id as `last_summary`, which a UI would show as garbage.
//! A summary whose last entry is a recall, join or leave shows no body;
//! its `last_msg_seq` / `last_msg_id` still name that entry.

mod inbox_common;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::*;

const CONV: ConvId = ConvId(10);
const PHONE: DeviceId = DeviceId(1);

fn summary(h: &Harness, uid: Uid) -> ConvSummary {
    let list = h.ib().conv_list(uid, 10, None).unwrap();
    list.convs.into_iter().find(|c| c.conv == CONV).unwrap()
}

#[test]
fn the_summary_after_a_recall_names_the_recall_and_carries_no_body() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    let sent = h.send(CONV, Uid(1), 1, "soon gone");
    let recall = h
        .ib()
        .recall(RecallRequest {
            conv: CONV,
            sender: Uid(1),
            client_msg_id: 2,
            target: sent.msg_id,
        })
        .wait()
        .unwrap();
    let s = summary(&h, Uid(2));
    assert_eq!(s.last_msg_seq, recall.msg_seq);
    assert_eq!(s.last_msg_id, recall.msg_id);
    assert_eq!(s.last_summary, Bytes::new(), "no target id, no body");
    assert_eq!(s.unread, 0, "a recalled message is not unread");

    // The same in a snapshot.
    h.register(Uid(2), PHONE);
    let info = h.ib().begin_snapshot(Uid(2), PHONE).wait().unwrap();
    let page = h.ib().snapshot_page(Uid(2), info.snapshot_id, 0).unwrap();
    let s = page.convs.iter().find(|c| c.conv == CONV).unwrap();
    assert_eq!(s.last_summary, Bytes::new());
}

#[test]
fn the_summary_after_a_join_carries_no_uid_bytes() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    h.send(CONV, Uid(1), 1, "hello");
    h.join(Uid(2), CONV);
    let s = summary(&h, Uid(1));
    assert_eq!(s.last_summary, Bytes::new());
}

#[test]
fn the_summary_after_a_message_or_an_edit_shows_its_text() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    let sent = h.send(CONV, Uid(1), 1, "hello");
    assert_eq!(
        summary(&h, Uid(1)).last_summary,
        Bytes::from_static(b"hello")
    );
    h.ib()
        .edit(EditRequest {
            conv: CONV,
            sender: Uid(1),
            client_msg_id: 2,
            target: sent.msg_id,
            payload: Bytes::from_static(b"hello, edited"),
        })
        .wait()
        .unwrap();
    assert_eq!(
        summary(&h, Uid(1)).last_summary,
        Bytes::from_static(b"hello, edited")
    );
}
