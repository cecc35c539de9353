//! Once a recall is durable, no read serves the recalled body: not pull,
//! history, snapshot pages, conversation summaries or sync event
//! summaries. A snapshot page used to serve it when the recall came after
//! `BEGIN_SNAPSHOT`, because pages are built once, at the start.

mod inbox_common;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::*;

const CONV: ConvId = ConvId(10);
const ALICE: Uid = Uid(1);
const BOB: Uid = Uid(2);
const PHONE: DeviceId = DeviceId(1);
const SECRET: &str = "the recalled body";

fn recall(h: &Harness, target: MsgId) -> SendReply {
    h.ib()
        .recall(RecallRequest {
            conv: CONV,
            sender: ALICE,
            client_msg_id: 9_999,
            target,
        })
        .wait()
        .unwrap()
}

/// Bob's conversation with one message from Alice, not yet recalled.
fn setup() -> (Harness, SendReply) {
    let h = Harness::new();
    h.join(ALICE, CONV);
    h.join(BOB, CONV);
    h.register(BOB, PHONE);
    h.send(CONV, ALICE, 1, "before");
    let secret = h.send(CONV, ALICE, 2, SECRET);
    (h, secret)
}

fn assert_tombstone(messages: &[Message], target: &SendReply, path: &str) {
    let m = messages
        .iter()
        .find(|m| m.msg_seq == target.msg_seq)
        .unwrap_or_else(|| panic!("{path} lists the recalled message"));
    assert!(m.tombstone, "{path}: the recalled message is a tombstone");
    assert_eq!(m.payload, Bytes::new(), "{path}: no body");
    assert!(
        !messages.iter().any(|m| m.payload == SECRET.as_bytes()),
        "{path}: the body appears nowhere"
    );
}

#[test]
fn pull_after_a_recall_serves_a_tombstone() {
    let (h, secret) = setup();
    recall(&h, secret.msg_id);
    let pulled = h.ib().pull(BOB, &[(CONV, MsgSeq(0))], 0).unwrap();
    assert_tombstone(&pulled[0].messages, &secret, "pull");
}

#[test]
fn history_after_a_recall_serves_a_tombstone() {
    let (h, secret) = setup();
    recall(&h, secret.msg_id);
    let page = h.ib().history(BOB, CONV, None, 50).unwrap();
    assert_tombstone(&page.messages, &secret, "history");
}

#[test]
fn sync_event_summaries_after_a_recall_are_empty() {
    let (h, secret) = setup();
    recall(&h, secret.msg_id);
    let page = h.sync(BOB, PHONE, None, SyncSeq(0), 100, None).unwrap();
    let event = page
        .events
        .iter()
        .find(|e| e.kind == EventKind::Msg && e.msg_seq == secret.msg_seq)
        .expect("the msg event is still there");
    assert_eq!(event.summary, Bytes::new());
}

#[test]
fn a_snapshot_page_fetched_after_a_recall_serves_a_tombstone_even_if_begun_before_it() {
    let (h, secret) = setup();
    let info = h.ib().begin_snapshot(BOB, PHONE).wait().unwrap();
    assert_eq!(info.state, SnapshotState::Ready);
    let before = h.ib().snapshot_page(BOB, info.snapshot_id, 0).unwrap();
    assert!(
        before
            .messages
            .iter()
            .any(|m| m.payload == SECRET.as_bytes()),
        "the page was built with the body"
    );
    let summary = before.convs.iter().find(|c| c.conv == CONV).unwrap();
    assert_eq!(summary.last_summary, Bytes::from_static(SECRET.as_bytes()));

    recall(&h, secret.msg_id);

    for page in 0..info.pages {
        let page = h.ib().snapshot_page(BOB, info.snapshot_id, page).unwrap();
        if page.messages.iter().any(|m| m.msg_seq == secret.msg_seq) {
            assert_tombstone(&page.messages, &secret, "snapshot page");
        }
        for c in page.convs.iter().filter(|c| c.conv == CONV) {
            assert_eq!(
                c.last_summary,
                Bytes::new(),
                "the page's summary of the recalled last message has no body"
            );
        }
    }
}

#[test]
fn the_conversation_list_after_a_recall_shows_no_body() {
    let (h, secret) = setup();
    recall(&h, secret.msg_id);
    let list = h.ib().conv_list(BOB, 10, None).unwrap();
    let summary = list.convs.iter().find(|c| c.conv == CONV).unwrap();
    assert_ne!(summary.last_summary, Bytes::from_static(SECRET.as_bytes()));
}
