//! After a start that cuts a torn `evt` tail, no `msg_seq` and no
//! `sync_seq` a client may have seen is given again. Under
//! `SyncPolicy::Interval` a send is acknowledged before its fdatasync, so
//! the sends of the batch a power cut tore may have reached clients: the
//! next message of that conversation takes a `msg_seq` past every one the
//! cut records that still verify hold (those read as tombstones), and each
//! recipient's next event a `sync_seq` past theirs (a device syncs over
//! the gap). The reservation is in the log and then in the checkpoints,
//! so it holds after a checkpoint removed the cut's side file and the
//! store opened again.

mod inbox_common;

use std::path::Path;
use std::time::Duration;

use inbox_common::*;
use inbox_engine::log::SyncPolicy;
use inbox_engine::*;

const CONV: ConvId = ConvId(7);
/// The recipient whose device watches its `sync_seq`s.
const READER: Uid = Uid(3);
const PHONE: DeviceId = DeviceId(1);

fn tune(c: &mut InboxConfig) {
    c.segment_bytes = 1 << 20;
    c.sync = SyncPolicy::Interval(Duration::from_secs(3600));
}

fn open(h: &Harness, dir: &Path) -> Inbox {
    let mut c = config(dir, &h.clock);
    tune(&mut c);
    Inbox::open(c).expect("a torn tail is cut and served")
}

/// A crash image and what clients saw before the power cut.
struct Cut {
    image: tempfile::TempDir,
    /// The last batch's sends, acknowledged.
    burst: Vec<SendReply>,
    /// The reader's `sync_seq` of each of them.
    burst_sync: Vec<(MsgId, SyncSeq)>,
    generation: Generation,
    /// The reader's device ACK before the burst.
    acked: SyncSeq,
}

/// A store under `SyncPolicy::Interval` whose last batch (64 pipelined,
/// acknowledged sends) lost its last page to a power cut: its last record
/// fails its CRC, so the whole batch is a torn tail, while every other
/// record of it still verifies in the cut bytes.
fn cut_after_acknowledged_sends(h: &Harness) -> Cut {
    for uid in 1..=3 {
        h.join(Uid(uid), CONV);
    }
    let generation = h.register(READER, PHONE).device.generation;
    h.send_many(CONV, Uid(1), 1, 100);
    let (_, generation, acked) = h.catch_up(READER, PHONE, generation, SyncSeq(0));
    let burst = h.send_many(CONV, Uid(2), 10_000, 64);
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    // What the reader's device saw of the burst before the power cut.
    let page = h
        .sync(READER, PHONE, Some(generation), acked, 500, None)
        .unwrap();
    let burst_sync: Vec<(MsgId, SyncSeq)> = page
        .events
        .iter()
        .filter(|e| burst.iter().any(|b| b.msg_id == e.msg_id))
        .map(|e| (e.msg_id, e.sync_seq))
        .collect();
    assert_eq!(burst_sync.len(), burst.len(), "the reader saw the burst");

    let (newest, end) = last_evt_segment(image.path());
    let path = image.path().join("evt").join(format!("{newest:010}.seg"));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[end as usize - 8..end as usize].fill(0);
    std::fs::write(&path, bytes).unwrap();

    Cut {
        image,
        burst,
        burst_sync,
        generation,
        acked,
    }
}

/// The sends the cut took that a client may have seen, found by what the
/// opened image serves: (msg_seq, msg_id) and the reader's `sync_seq` of
/// each. The last lost send sat in the record the power cut damaged.
fn seen(ib: &Inbox, cut: &Cut) -> (Vec<(MsgSeq, MsgId)>, Vec<SyncSeq>) {
    let kept: Vec<MsgId> = ib
        .history(READER, CONV, None, 500)
        .unwrap()
        .messages
        .iter()
        .filter(|m| !m.tombstone)
        .map(|m| m.msg_id)
        .collect();
    let lost: Vec<&SendReply> = (cut.burst.iter())
        .filter(|b| !kept.contains(&b.msg_id))
        .collect();
    assert!(lost.len() >= 2, "the cut took sends of the last batch");
    let seen: Vec<(MsgSeq, MsgId)> = lost[..lost.len() - 1]
        .iter()
        .map(|b| (b.msg_seq, b.msg_id))
        .collect();
    let seen_sync = seen
        .iter()
        .map(|(_, id)| cut.burst_sync.iter().find(|(m, _)| m == id).unwrap().1)
        .collect();
    (seen, seen_sync)
}

/// The last begun `evt` segment and where its data ends.
fn last_evt_segment(dir: &Path) -> (u32, u64) {
    let report = inbox_engine::log::verify(&dir.join("evt")).unwrap();
    let s = report.segments.iter().rfind(|s| !s.prepared).unwrap();
    (s.id, s.bytes)
}

/// The next send and the reader's next event come after every number
/// the cut took, and the reserved `msg_seq`s read as tombstones.
fn assert_nothing_given_again(
    ib: &Inbox,
    cut: &Cut,
    seen: &[(MsgSeq, MsgId)],
    seen_sync: &[SyncSeq],
) {
    let next = ib
        .send(SendRequest {
            conv: CONV,
            sender: Uid(1),
            client_msg_id: 77_777,
            msg_type: 1,
            payload: bytes::Bytes::from_static(b"after the cut"),
        })
        .wait()
        .unwrap();
    for (seq, id) in seen {
        assert!(
            next.msg_seq > *seq,
            "msg_seq {:?} is given again: the cut took {seq:?}",
            next.msg_seq
        );
        assert!(next.msg_id > *id, "msg_id {:?} given again", next.msg_id);
    }
    let history = ib.history(READER, CONV, None, 500).unwrap().messages;
    for (seq, id) in seen {
        let m = history.iter().find(|m| m.msg_seq == *seq).unwrap();
        assert!(m.tombstone && m.payload.is_empty(), "{m:?}");
        assert_ne!(m.msg_id, *id, "the tombstone takes a fresh msg_id");
    }
    // The device syncs over the reserved `sync_seq`s to the new message.
    let mut events = Vec::new();
    let mut cursor = cut.acked;
    let mut token = None;
    loop {
        let page = ib
            .sync(SyncRequest {
                uid: READER,
                device: PHONE,
                generation: Some(cut.generation),
                local_applied_seq: cursor,
                limit: 16,
                batch_token: token.clone(),
            })
            .wait()
            .unwrap();
        events.extend(page.events);
        cursor = page.next_cursor;
        token = Some(page.batch_token);
        if !page.has_more {
            break;
        }
    }
    let event = events
        .iter()
        .find(|e| e.msg_id == next.msg_id)
        .expect("the device syncs to the new message");
    for seq in seen_sync {
        assert!(
            event.sync_seq > *seq,
            "sync_seq {:?} is given again: the cut took {seq:?}",
            event.sync_seq
        );
        assert!(
            events.iter().all(|e| e.sync_seq != *seq),
            "a gap is no event"
        );
    }
}

fn side_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("evt"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("cut-"))
        .count()
}

#[test]
fn after_a_cut_the_next_send_and_event_take_numbers_past_every_cut_one() {
    let h = Harness::with(tune);
    let cut = cut_after_acknowledged_sends(&h);
    let ib = open(&h, cut.image.path());
    let (seen, seen_sync) = seen(&ib, &cut);
    assert_nothing_given_again(&ib, &cut, &seen, &seen_sync);
}

#[test]
fn the_reservation_holds_after_a_checkpoint_removed_the_side_files_and_a_reopen() {
    let h = Harness::with(tune);
    let cut = cut_after_acknowledged_sends(&h);
    let ib = open(&h, cut.image.path());
    let (seen, seen_sync) = seen(&ib, &cut);
    assert_eq!(side_files(cut.image.path()), 1, "the cut kept its bytes");
    // A write elsewhere, so that the checkpoint is newer than the start.
    ib.join(Uid(9), ConvId(8)).wait().unwrap();
    ib.checkpoint().unwrap();
    drop(ib);
    assert_eq!(
        side_files(cut.image.path()),
        0,
        "the checkpoint covers the cut"
    );
    let ib = open(&h, cut.image.path());
    assert_nothing_given_again(&ib, &cut, &seen, &seen_sync);
}
