//! A recall of a message also recalls its edits: an edit carries the
//! message's new body, so once the original's recall is durable no read
//! serves an edit's body either (pull, history, sync event summaries,
//! snapshot pages, conversation summaries). The edits used to keep their
//! bodies, because the recall only tombstoned the message it named.

mod inbox_common;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::*;

const CONV: ConvId = ConvId(10);
const ALICE: Uid = Uid(1);
const BOB: Uid = Uid(2);
const PHONE: DeviceId = DeviceId(1);
const ORIGINAL: &str = "the original body";
const EDITED: &str = "the edited body";
const EDITED_AGAIN: &str = "the body edited twice";

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

fn edit(h: &Harness, cmid: ClientMsgId, target: MsgId, body: &str) -> SendReply {
    h.ib()
        .edit(EditRequest {
            conv: CONV,
            sender: ALICE,
            client_msg_id: cmid,
            target,
            payload: Bytes::copy_from_slice(body.as_bytes()),
        })
        .wait()
        .unwrap()
}

/// Bob's conversation with a message from Alice and one edit of it.
fn setup() -> (Harness, SendReply, SendReply) {
    let h = Harness::new();
    h.join(ALICE, CONV);
    h.join(BOB, CONV);
    h.register(BOB, PHONE);
    h.send(CONV, ALICE, 1, "before");
    let original = h.send(CONV, ALICE, 2, ORIGINAL);
    let edited = edit(&h, 3, original.msg_id, EDITED);
    (h, original, edited)
}

fn assert_no_body(messages: &[Message], path: &str) {
    for body in [ORIGINAL, EDITED, EDITED_AGAIN] {
        assert!(
            !messages.iter().any(|m| m.payload == body.as_bytes()),
            "{path} serves {body:?} after the recall"
        );
    }
}

fn assert_tombstone(messages: &[Message], target: &SendReply, path: &str) {
    let m = messages
        .iter()
        .find(|m| m.msg_seq == target.msg_seq)
        .unwrap_or_else(|| panic!("{path} lists the edit"));
    assert!(m.tombstone, "{path}: the edit is a tombstone");
    assert_eq!(m.payload, Bytes::new(), "{path}: the edit has no body");
}

#[test]
fn pull_after_a_recall_of_an_edited_message_serves_its_edit_as_a_tombstone() {
    let (h, original, edited) = setup();
    recall(&h, original.msg_id);
    let pulled = h.ib().pull(BOB, &[(CONV, MsgSeq(0))], 0).unwrap();
    assert_tombstone(&pulled[0].messages, &edited, "pull");
    assert_no_body(&pulled[0].messages, "pull");
}

#[test]
fn history_after_a_recall_of_an_edited_message_serves_its_edit_as_a_tombstone() {
    let (h, original, edited) = setup();
    recall(&h, original.msg_id);
    let page = h.ib().history(BOB, CONV, None, 50).unwrap();
    assert_tombstone(&page.messages, &edited, "history");
    assert_no_body(&page.messages, "history");
}

#[test]
fn sync_event_summaries_of_the_edit_are_empty_after_a_recall_of_the_original() {
    let (h, original, edited) = setup();
    recall(&h, original.msg_id);
    let page = h.sync(BOB, PHONE, None, SyncSeq(0), 100, None).unwrap();
    let event = page
        .events
        .iter()
        .find(|e| e.msg_seq == edited.msg_seq)
        .expect("the edit's event is still there");
    assert_eq!(event.summary, Bytes::new());
}

#[test]
fn a_snapshot_summary_whose_last_message_is_an_edit_loses_its_body_on_a_recall_of_the_original() {
    let (h, original, edited) = setup();
    let info = h.ib().begin_snapshot(BOB, PHONE).wait().unwrap();
    assert_eq!(info.state, SnapshotState::Ready);
    let before = h.ib().snapshot_page(BOB, info.snapshot_id, 0).unwrap();
    let summary = before.convs.iter().find(|c| c.conv == CONV).unwrap();
    assert_eq!(summary.last_msg_seq, edited.msg_seq);
    assert_eq!(summary.last_summary, Bytes::from_static(EDITED.as_bytes()));

    recall(&h, original.msg_id);

    for page in 0..info.pages {
        let page = h.ib().snapshot_page(BOB, info.snapshot_id, page).unwrap();
        if page.messages.iter().any(|m| m.msg_seq == edited.msg_seq) {
            assert_tombstone(&page.messages, &edited, "snapshot page");
        }
        assert_no_body(&page.messages, "snapshot page");
        for c in page.convs.iter().filter(|c| c.conv == CONV) {
            assert_eq!(c.last_summary, Bytes::new(), "snapshot summary");
        }
    }
}

#[test]
fn the_conversation_list_after_a_recall_of_an_edited_message_shows_no_body() {
    let (h, original, _) = setup();
    recall(&h, original.msg_id);
    let list = h.ib().conv_list(BOB, 10, None).unwrap();
    let summary = list.convs.iter().find(|c| c.conv == CONV).unwrap();
    assert_eq!(summary.last_summary, Bytes::new());
}

#[test]
fn a_recall_of_the_original_also_hides_an_edit_of_its_edit() {
    let (h, original, edited) = setup();
    let again = edit(&h, 4, edited.msg_id, EDITED_AGAIN);
    recall(&h, original.msg_id);
    let page = h.ib().history(BOB, CONV, None, 50).unwrap();
    assert_tombstone(&page.messages, &edited, "history");
    assert_tombstone(&page.messages, &again, "history");
    assert_no_body(&page.messages, "history");
}

#[test]
fn a_recall_of_an_edit_hides_its_own_edits_and_a_later_recall_of_the_original_still_works() {
    let (mut h, original, edited) = setup();
    let again = edit(&h, 4, edited.msg_id, EDITED_AGAIN);
    recall(&h, edited.msg_id);
    let page = h.ib().history(BOB, CONV, None, 50).unwrap();
    assert_tombstone(&page.messages, &edited, "history");
    assert_tombstone(&page.messages, &again, "history");
    h.ib().checkpoint().unwrap();
    h.restart(true, |_| {});
    let recalled = h
        .ib()
        .recall(RecallRequest {
            conv: CONV,
            sender: ALICE,
            client_msg_id: 10_000,
            target: original.msg_id,
        })
        .wait();
    assert!(recalled.is_ok(), "{recalled:?}");
    let page = h.ib().history(BOB, CONV, None, 50).unwrap();
    assert_no_body(&page.messages, "history");
}

#[test]
fn an_edit_of_a_recalled_message_is_recalled_too_so_it_cannot_be_edited_or_recalled() {
    let (h, original, edited) = setup();
    recall(&h, original.msg_id);
    let again = h
        .ib()
        .edit(EditRequest {
            conv: CONV,
            sender: ALICE,
            client_msg_id: 5,
            target: edited.msg_id,
            payload: Bytes::from_static(b"late"),
        })
        .wait();
    assert!(matches!(again, Err(Error::Conflict(_))), "{again:?}");
}

#[test]
fn a_recall_after_a_restart_still_hides_the_edits_made_before_it() {
    for keep_checkpoints in [true, false] {
        let (mut h, original, edited) = setup();
        h.ib().checkpoint().unwrap();
        h.restart(keep_checkpoints, |_| {});
        recall(&h, original.msg_id);
        let page = h.ib().history(BOB, CONV, None, 50).unwrap();
        assert_tombstone(&page.messages, &edited, "history");
        let digest = h.ib().state_digest();
        h.ib().checkpoint().unwrap();
        h.restart(keep_checkpoints, |_| {});
        assert_eq!(
            h.ib().state_digest(),
            digest,
            "replay rebuilds the same state"
        );
        let page = h.ib().history(BOB, CONV, None, 50).unwrap();
        assert_tombstone(&page.messages, &edited, "history after restart");
    }
}
