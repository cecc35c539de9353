//! History retention (R19): messages older than `history_retention` are
//! reclaimed by compaction and never served again, also after a restart;
//! younger ones stay; the default keeps everything; recall tombstones
//! outlive the originals they hide.

mod inbox_common;

use std::time::Duration;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::*;

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);
const CONV: ConvId = ConvId(10);

fn keep_one_day(c: &mut InboxConfig) {
    c.history_retention = Some(DAY);
}

fn small_segments(c: &mut InboxConfig) {
    keep_one_day(c);
    c.segment_bytes = 4096;
}

fn history_seqs(h: &Harness, uid: Uid) -> (Vec<MsgSeq>, bool) {
    let page = h.ib().history(uid, CONV, None, 500).unwrap();
    let mut seqs: Vec<MsgSeq> = page.messages.iter().map(|m| m.msg_seq).collect();
    seqs.reverse();
    (seqs, page.has_more)
}

fn pull_seqs(h: &Harness, uid: Uid, after: MsgSeq) -> Vec<MsgSeq> {
    let pulls = h.ib().pull(uid, &[(CONV, after)], 500).unwrap();
    pulls[0].messages.iter().map(|m| m.msg_seq).collect()
}

fn unread(h: &Harness, uid: Uid) -> u32 {
    let page = h.ib().conv_list(uid, 10, None).unwrap();
    page.convs.iter().find(|c| c.conv == CONV).unwrap().unread
}

/// The msg log's begun segment files (prepared spares left out).
fn msg_segment_files(h: &Harness) -> Vec<String> {
    let dir = h.dir.path().join("msg");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".seg"))
        .filter(|n| {
            let id = n.trim_end_matches(".seg").parse().unwrap();
            let bytes = std::fs::read(dir.join(n)).unwrap();
            !inbox_engine::log::format::decode_segment_header(id, &bytes)
                .is_ok_and(|h| h.is_prepared())
        })
        .collect();
    names.sort();
    names
}

/// A body that does not compress, so a few messages fill a segment.
fn noise(seed: u64, len: usize) -> String {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            char::from(b'a' + ((x >> 33) % 26) as u8)
        })
        .collect()
}

/// Old: joins (seqs 1, 2) and 30 messages (3..=32); two days later, young:
/// 5 messages (33..=37).
fn old_and_young(h: &Harness) {
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    h.send_many(CONV, Uid(1), 1000, 30);
    h.advance(2 * DAY);
    h.send_many(CONV, Uid(1), 2000, 5);
}

fn assert_only_young_served(h: &Harness) {
    let young: Vec<MsgSeq> = MsgSeq(33).through(MsgSeq(37)).collect();
    assert_eq!(history_seqs(h, Uid(2)), (young.clone(), false));
    assert_eq!(
        pull_seqs(h, Uid(2), MsgSeq(0)),
        young,
        "a cursor below the base resumes at it"
    );
    assert_eq!(
        pull_seqs(h, Uid(2), MsgSeq(34)),
        vec![MsgSeq(35), MsgSeq(36), MsgSeq(37)]
    );
    let below_base = h.ib().history(Uid(2), CONV, Some(MsgSeq(20)), 10).unwrap();
    assert!(below_base.messages.is_empty() && !below_base.has_more);
    assert_eq!(
        unread(h, Uid(2)),
        5,
        "only retained messages count as unread"
    );
}

#[test]
fn messages_older_than_the_retention_are_reclaimed_and_never_served_again() {
    let mut h = Harness::with(keep_one_day);
    old_and_young(&h);
    assert_eq!(unread(&h, Uid(2)), 35);
    let first_old_id = h
        .ib()
        .history(Uid(2), CONV, Some(MsgSeq(4)), 1)
        .unwrap()
        .messages[0]
        .msg_id;
    assert_eq!(h.ib().stats().messages, 37);
    let report = h.ib().compact().unwrap();
    assert_eq!(report.messages_reclaimed, 32, "{report:?}");
    assert_eq!(h.ib().stats().messages, 5, "stats count retained messages");
    assert_only_young_served(&h);
    // A reclaimed message cannot be recalled any more.
    let err = h
        .ib()
        .recall(RecallRequest {
            conv: CONV,
            sender: Uid(1),
            client_msg_id: 9000,
            target: first_old_id,
        })
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    // Nothing comes back: from a checkpoint, then from a full replay.
    h.ib().checkpoint().unwrap();
    h.restart(true, keep_one_day);
    assert_only_young_served(&h);
    h.restart(false, keep_one_day);
    assert_only_young_served(&h);
    assert_eq!(h.ib().compact().unwrap().messages_reclaimed, 0);
    // The conversation goes on after the base; reading keeps the count
    // consistent.
    assert_eq!(h.send(CONV, Uid(1), 3000, "after").msg_seq, MsgSeq(38));
    assert_eq!(unread(&h, Uid(2)), 6);
    let read = h.ib().mark_read(Uid(2), CONV, MsgSeq(36)).wait().unwrap();
    assert_eq!(read.unread, 2);
}

#[test]
fn messages_younger_than_the_retention_are_kept() {
    let h = Harness::with(keep_one_day);
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    h.send_many(CONV, Uid(1), 1000, 20);
    h.advance(12 * HOUR);
    let report = h.ib().compact().unwrap();
    assert_eq!(report.messages_reclaimed, 0, "{report:?}");
    assert_eq!(
        history_seqs(&h, Uid(2)),
        (MsgSeq(2).through(MsgSeq(22)).collect(), false)
    );
    assert_eq!(unread(&h, Uid(2)), 20);
}

#[test]
fn default_retention_keeps_every_message_forever() {
    let mut h = Harness::with(|c| c.segment_bytes = 4096);
    old_and_young(&h);
    h.advance(400 * DAY);
    let report = h.ib().compact().unwrap();
    assert_eq!(report.messages_reclaimed, 0, "{report:?}");
    assert_eq!(
        history_seqs(&h, Uid(2)),
        (MsgSeq(2).through(MsgSeq(37)).collect(), false)
    );
    let first = msg_segment_files(&h)[0].clone();
    let id: u32 = first.trim_end_matches(".seg").parse().unwrap();
    let x = h.ib().explain_segment("msg", id).unwrap();
    assert!(x.live_records > 0, "{x:?}");
    assert!(
        x.held_by.iter().any(|r| r.contains("kept forever")),
        "{x:?}"
    );
    h.restart(false, |c| c.segment_bytes = 4096);
    assert_eq!(
        history_seqs(&h, Uid(2)),
        (MsgSeq(2).through(MsgSeq(37)).collect(), false)
    );
}

#[test]
fn a_msg_segment_whose_messages_are_all_reclaimed_is_deleted_whole() {
    let mut h = Harness::with(small_segments);
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    for i in 0..60 {
        h.send(CONV, Uid(1), 1000 + i, &noise(i as u64, 300));
    }
    let before = msg_segment_files(&h);
    assert!(before.len() >= 3, "{before:?}");
    let old_first: u32 = before[0].trim_end_matches(".seg").parse().unwrap();
    let x = h.ib().explain_segment("msg", old_first).unwrap();
    assert!(
        x.held_by.iter().any(|r| r.contains("retention window")),
        "{x:?}"
    );
    h.advance(2 * DAY);
    for i in 0..3 {
        h.send(CONV, Uid(1), 5000 + i, "young");
    }
    let report = h.ib().compact().unwrap();
    assert_eq!(report.messages_reclaimed, 62, "{report:?}");
    assert!(
        report.segments_dropped >= before.len() as u64 - 1,
        "{report:?}"
    );
    let after = msg_segment_files(&h);
    assert!(!after.contains(&before[0]), "{after:?}");
    assert!(after.len() < before.len(), "{before:?} -> {after:?}");
    let young: Vec<MsgSeq> = MsgSeq(63).through(MsgSeq(65)).collect();
    assert_eq!(history_seqs(&h, Uid(2)), (young.clone(), false));
    // Replay still finds every retained message (and none of the rest),
    // with and without a checkpoint.
    h.restart(false, small_segments);
    assert_eq!(history_seqs(&h, Uid(2)), (young.clone(), false));
    h.ib().checkpoint().unwrap();
    h.restart(true, small_segments);
    assert_eq!(history_seqs(&h, Uid(2)), (young, false));
    assert_eq!(unread(&h, Uid(2)), 3);
}

#[test]
fn a_recall_tombstone_outlives_the_original_it_hides() {
    let mut h = Harness::with(keep_one_day);
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    h.send(CONV, Uid(1), 1, "old"); // seq 3, at T0
    h.advance(12 * HOUR);
    let hidden = h.send(CONV, Uid(1), 2, "secret"); // seq 4, at T0 + 12h
    h.advance(HOUR);
    let recall = h
        .ib()
        .recall(RecallRequest {
            conv: CONV,
            sender: Uid(1),
            client_msg_id: 3,
            target: hidden.msg_id,
        })
        .wait()
        .unwrap(); // seq 5, at T0 + 13h
                   // Now T0 + 1 day + 1 h: seqs 1..=3 are past the retention, the
                   // recalled original (4) and its recall (5) are not.
    h.advance(12 * HOUR);
    let report = h.ib().compact().unwrap();
    assert_eq!(report.messages_reclaimed, 3, "{report:?}");
    let check = |h: &Harness| {
        let page = h.ib().history(Uid(2), CONV, None, 10).unwrap();
        let seqs: Vec<MsgSeq> = page.messages.iter().map(|m| m.msg_seq).collect();
        assert_eq!(seqs, vec![recall.msg_seq, hidden.msg_seq]);
        let original = &page.messages[1];
        assert!(original.tombstone, "{original:?}");
        assert_eq!(original.payload, Bytes::new());
        assert_eq!(page.messages[0].kind, MessageKind::Recall);
        assert_eq!(page.messages[0].target, Some(hidden.msg_id));
    };
    check(&h);
    h.restart(false, keep_one_day);
    check(&h);
    h.ib().checkpoint().unwrap();
    h.restart(true, keep_one_day);
    check(&h);
    // Once the original is past the retention it goes; the recall, younger,
    // stays (a trim only ever takes a prefix, so never the recall first).
    h.advance(11 * HOUR + 30 * Duration::from_secs(60));
    let report = h.ib().compact().unwrap();
    assert_eq!(report.messages_reclaimed, 1, "{report:?}");
    let page = h.ib().history(Uid(2), CONV, None, 10).unwrap();
    let seqs: Vec<MsgSeq> = page.messages.iter().map(|m| m.msg_seq).collect();
    assert_eq!(seqs, vec![recall.msg_seq]);
    assert!(!page.has_more);
}
