//! The idempotency table keeps a tag per key, not the key (R4, R29): a
//! retried send still answers with the original ids after a checkpoint, a
//! restart, a recall, a body move and history retention, and a key is
//! forgotten once its bucket is past the TTL. Keys that share a tag are
//! pinned in the table's and the state's unit tests (`state::idem`).

mod inbox_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::inbox::CompactionStep;
use inbox_engine::*;

const CONV: ConvId = ConvId(10);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn send(h: &Harness, sender: Uid, cmid: u128, body: &str) -> Result<SendReply> {
    h.ib()
        .send(SendRequest {
            conv: CONV,
            sender,
            client_msg_id: cmid,
            msg_type: 1,
            payload: Bytes::copy_from_slice(body.as_bytes()),
        })
        .wait()
}

fn assert_duplicate_of(h: &Harness, sender: Uid, cmid: u128, body: &str, first: &SendReply) {
    let again = send(h, sender, cmid, body).unwrap();
    assert!(again.duplicate, "key {cmid} of {sender} is remembered");
    assert_eq!((again.msg_id, again.msg_seq), (first.msg_id, first.msg_seq));
}

#[test]
fn a_retry_answers_the_original_after_a_checkpoint_a_replay_and_a_full_replay() {
    let mut h = Harness::new();
    h.join(Uid(1), CONV);
    let before = send(&h, Uid(1), 1, "in the checkpoint").unwrap();
    h.ib().checkpoint().unwrap();
    let after = send(&h, Uid(1), 2, "replayed after it").unwrap();
    h.kill_restart(|_| {});
    assert_duplicate_of(&h, Uid(1), 1, "in the checkpoint", &before);
    assert_duplicate_of(&h, Uid(1), 2, "replayed after it", &after);
    h.ib().checkpoint().unwrap();
    h.restart(true, |_| {});
    assert_duplicate_of(&h, Uid(1), 1, "in the checkpoint", &before);
    assert_duplicate_of(&h, Uid(1), 2, "replayed after it", &after);
    assert!(matches!(
        send(&h, Uid(1), 2, "something else"),
        Err(Error::Conflict(_))
    ));
    h.restart(false, |_| {});
    assert_duplicate_of(&h, Uid(1), 1, "in the checkpoint", &before);
    let next = send(&h, Uid(1), 3, "new").unwrap();
    assert!(!next.duplicate);
    assert_eq!(next.msg_seq, after.msg_seq.next());
}

#[test]
fn the_same_key_of_two_senders_names_two_sends() {
    let mut h = Harness::new();
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    let one = send(&h, Uid(1), 7, "from one").unwrap();
    let two = send(&h, Uid(2), 7, "from two").unwrap();
    assert!(!two.duplicate);
    assert_ne!(one.msg_id, two.msg_id);
    h.ib().checkpoint().unwrap();
    h.restart(true, |_| {});
    assert_duplicate_of(&h, Uid(1), 7, "from one", &one);
    assert_duplicate_of(&h, Uid(2), 7, "from two", &two);
}

#[test]
fn a_key_is_remembered_for_the_ttl_and_forgotten_within_a_sixteenth_more() {
    let h = Harness::with(|c| c.idempotency_ttl = 16 * HOUR);
    h.join(Uid(1), CONV);
    let first = send(&h, Uid(1), 1, "once").unwrap();
    h.advance(16 * HOUR);
    assert_duplicate_of(&h, Uid(1), 1, "once", &first);
    // Buckets are an hour wide here: past the TTL plus one, the key is
    // gone and the same request is a new message.
    h.advance(HOUR + Duration::from_millis(1));
    let again = send(&h, Uid(1), 1, "once").unwrap();
    assert!(!again.duplicate);
    assert_eq!(again.msg_seq, first.msg_seq.next());
}

#[test]
fn a_key_whose_message_was_recalled_still_answers_the_original() {
    let h = Harness::new();
    h.join(Uid(1), CONV);
    let first = send(&h, Uid(1), 1, "regretted").unwrap();
    h.ib()
        .recall(RecallRequest {
            conv: CONV,
            sender: Uid(1),
            client_msg_id: 2,
            target: first.msg_id,
        })
        .wait()
        .unwrap();
    assert_duplicate_of(&h, Uid(1), 1, "regretted", &first);
}

#[test]
fn a_key_whose_body_moved_to_the_msg_log_is_still_compared() {
    let h = Harness::with(|c| {
        c.segment_bytes = 4096;
        c.safety_window = Duration::ZERO;
    });
    h.join(Uid(1), CONV);
    let first = send(&h, Uid(1), 1, "moved by compaction").unwrap();
    // Fill a few more evt segments, sync and ACK everything: the first
    // segments' events are dead, so their bodies are moved to `msg`.
    h.send_many(CONV, Uid(1), 100, 200);
    let reg = h.register(Uid(1), DeviceId(1));
    h.catch_up(Uid(1), DeviceId(1), reg.device.generation, SyncSeq(0));
    let moved = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&moved);
    h.ib().set_compaction_hook(Some(Arc::new(move |step| {
        if step == CompactionStep::BodiesMoved {
            seen.store(true, Ordering::SeqCst);
        }
    })));
    h.ib().compact().unwrap();
    assert!(moved.load(Ordering::SeqCst), "compaction moved bodies");
    assert_duplicate_of(&h, Uid(1), 1, "moved by compaction", &first);
    assert!(matches!(
        send(&h, Uid(1), 1, "another body"),
        Err(Error::Conflict(_))
    ));
}

#[test]
fn a_key_whose_message_was_reclaimed_by_retention_answers_the_original_ids() {
    let h = Harness::with(|c| c.history_retention = Some(DAY));
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    let old = send(&h, Uid(1), 1, "old").unwrap();
    h.advance(2 * DAY);
    send(&h, Uid(1), 2, "young").unwrap();
    let report = h.ib().compact().unwrap();
    assert!(report.messages_reclaimed >= 1, "{report:?}");
    // The message cannot be read any more: the retry counts as the same
    // request (SEMANTICS.md, R4), and the other member's same key is not it.
    assert_duplicate_of(&h, Uid(1), 1, "old", &old);
    let other = send(&h, Uid(2), 1, "old").unwrap();
    assert!(!other.duplicate);
}
