//! `inboxd dump` on a store that has seen every `evt` record kind: each
//! kind the engine defines is described by name, and no record is left as
//! raw bytes. The kinds come from the engine's table, so a new kind fails
//! this test until a store written here holds one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use inbox_engine::inbox::{kinds, ManualClock};
use inbox_engine::log::SyncPolicy;
use inbox_engine::*;
use inbox_server::dump::{dump_stream, Stream};

const T0: u64 = 1_700_000_000_000;
const DAY: Duration = Duration::from_secs(86_400);
const SMALL: ConvId = ConvId(10);
const LARGE: ConvId = ConvId(20);
const OTHER: ConvId = ConvId(30);

fn open(dir: &std::path::Path, clock: &Arc<ManualClock>) -> Inbox {
    let mut c = InboxConfig::new(dir);
    c.sync = SyncPolicy::None;
    c.segment_bytes = 16 << 10;
    c.token_key = [42; 32];
    c.clock = clock.clone();
    c.compaction_interval = None;
    c.safety_window = Duration::ZERO;
    c.history_retention = Some(DAY);
    c.large_group_members = 4;
    c.rewrite_live_fraction = 0.9;
    Inbox::open(c).unwrap()
}

fn send(ib: &Inbox, conv: ConvId, sender: u64, cmid: u128, text: &str) -> SendReply {
    ib.send(SendRequest {
        conv,
        sender: Uid(sender),
        client_msg_id: cmid,
        msg_type: 1,
        payload: Bytes::from(text.to_owned()),
    })
    .wait()
    .unwrap()
}

/// Syncs a device from its ACK to the end of its stream and ACKs it.
fn catch_up(ib: &Inbox, uid: Uid, device: DeviceId) {
    let row = ib.devices(uid).unwrap();
    let row = row.iter().find(|d| d.device == device).unwrap();
    let mut req = SyncRequest {
        uid,
        device,
        generation: Some(row.generation),
        local_applied_seq: row.acked_sync_seq,
        limit: 500,
        batch_token: None,
    };
    loop {
        let page = ib.sync(req.clone()).wait().unwrap();
        req.generation = Some(page.generation);
        req.local_applied_seq = page.next_cursor;
        req.batch_token = Some(page.batch_token.clone());
        if !page.has_more {
            ib.ack(AckRequest {
                uid,
                device,
                generation: page.generation,
                seq: page.next_cursor,
                batch_token: page.batch_token,
            })
            .wait()
            .unwrap();
            return;
        }
    }
}

/// Old messages that compaction reclaims past the retention, and whose
/// segments it rewrites: trims of events and messages, relocations, body
/// moves, and the copies a rewrite makes.
fn compacted_rounds(ib: &Inbox, clock: &ManualClock) {
    for uid in 1..=2 {
        ib.join(Uid(uid), SMALL).wait().unwrap();
        ib.register_device(Uid(uid), DeviceId(1)).wait().unwrap();
    }
    for i in 0..200u128 {
        send(
            ib,
            SMALL,
            1,
            i,
            &format!("an old message {i} {}", "x".repeat(40)),
        );
    }
    for uid in 1..=2 {
        catch_up(ib, Uid(uid), DeviceId(1));
    }
    clock.advance(2 * DAY);
    // A message whose event stays live (its reader never syncs) among
    // young ones that are read: the segments that hold it are rewritten,
    // and its record is copied forward without its body.
    for uid in [1, 3] {
        ib.join(Uid(uid), OTHER).wait().unwrap();
    }
    ib.register_device(Uid(3), DeviceId(1)).wait().unwrap();
    send(ib, OTHER, 1, 1000, "kept for a device that never syncs");
    for i in 0..200u128 {
        send(
            ib,
            SMALL,
            1,
            1001 + i,
            &format!("a young message {i} {}", "y".repeat(40)),
        );
    }
    for uid in 1..=2 {
        catch_up(ib, Uid(uid), DeviceId(1));
    }
    // One pass: a later one would reclaim the segments that hold this
    // pass's own trims.
    ib.compact().unwrap();
}

/// The other kinds, after compaction so that they stay in the log: a
/// read, flags, devices, a snapshot, a large group and a cleared marker.
fn live_rounds(ib: &Inbox) {
    for uid in 1..=5 {
        ib.join(Uid(uid), LARGE).wait().unwrap();
    }
    send(ib, LARGE, 1, 2000, "to the large group");
    let read_to = send(ib, SMALL, 2, 2001, "a reply").msg_seq;
    ib.mark_read(Uid(2), SMALL, read_to).wait().unwrap();
    let flags = ConvFlags {
        muted: true,
        pinned: false,
    };
    ib.set_conv_flags(Uid(2), SMALL, flags).wait().unwrap();
    let marker = ib.dirty_markers(Uid(3)).unwrap();
    let marker = marker.iter().find(|m| m.conv == LARGE).expect("a marker");
    ib.clear_dirty(Uid(3), LARGE, marker.version)
        .wait()
        .unwrap();
    ib.register_device(Uid(2), DeviceId(2)).wait().unwrap();
    ib.begin_snapshot(Uid(2), DeviceId(2)).wait().unwrap();
}

/// A round under a leader, closed by a round mark: the consensus layer
/// is stood in for by a thread that commits each entry it is handed.
fn replicated_round(ib: &Inbox) {
    let leader = Arc::new(ib.lead().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let pump = {
        let (leader, stop) = (Arc::clone(&leader), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(last) = leader.wait_entries(Duration::from_millis(20)).last() {
                    leader.flush().unwrap();
                    leader.commit(last.index());
                }
            }
        })
    };
    send(ib, SMALL, 2, 3000, "a replicated message");
    stop.store(true, Ordering::Relaxed);
    pump.join().unwrap();
}

/// Tears the `evt` log's last batch as a power cut before its fdatasync
/// may (its frame's CRC no longer verifies, its records' own still do),
/// and removes the checkpoint the shutdown wrote after it.
fn tear_last_batch(dir: &std::path::Path) {
    let newest = std::fs::read_dir(dir.join("checkpoint")).unwrap();
    let newest = newest.flatten().map(|e| e.path()).max().unwrap();
    std::fs::remove_file(newest).unwrap();
    let report = inbox_engine::log::verify(&dir.join("evt")).unwrap();
    let seg = report.segments.iter().rfind(|s| !s.prepared).unwrap();
    let path = dir.join("evt").join(format!("{:010}.seg", seg.id));
    let mut bytes = std::fs::read(&path).unwrap();
    let mut at = inbox_engine::log::format::SEGMENT_HEADER_LEN;
    loop {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if at + len >= seg.bytes as usize {
            break;
        }
        at += len;
    }
    // The frame's CRC, bytes 20..24 of its header.
    bytes[at + 20] ^= 1;
    std::fs::write(&path, bytes).unwrap();
}

/// The fan-out kinds, on a store of group 1 that owns half the slots: an
/// outbox entry for group 2 and its trim, and a delivery from group 2 and
/// its dedup trim.
fn fanout_rounds(dir: &std::path::Path, clock: &Arc<ManualClock>) {
    use inbox_engine::inbox::{
        slot, FanoutMessage, GroupId, OutboxEntry, Placement, Recipient, Slot, SlotRange, SLOTS,
    };
    let half = |first: u16, last: u16, g: u32| SlotRange {
        first: Slot(first),
        last: Slot(last),
        group: GroupId(g),
    };
    let ranges = vec![half(0, SLOTS / 2 - 1, 1), half(SLOTS / 2, SLOTS - 1, 2)];
    let placement = Arc::new(Placement::new(1, GroupId(1), ranges).unwrap());
    let here = |id: &u64| placement.owns(slot(*id));
    let (conv, a) = {
        let mut ids = (1u64..).filter(here);
        (ids.next().unwrap(), ids.next().unwrap())
    };
    let b = (1u64..).find(|id| !here(id)).unwrap();
    let mut c = InboxConfig::new(dir);
    c.sync = SyncPolicy::None;
    c.token_key = [42; 32];
    c.clock = clock.clone();
    c.compaction_interval = None;
    c.placement = Some(Arc::clone(&placement));
    let ib = Inbox::open(c).unwrap();
    ib.join(Uid(a), ConvId(conv)).wait().unwrap();
    ib.join(Uid(b), ConvId(conv)).wait().unwrap();
    assert_eq!(ib.fanout_trim(GroupId(2), 1).wait().unwrap(), 1);
    let entry = OutboxEntry {
        seq: 1,
        message: FanoutMessage {
            conv: ConvId(b),
            msg_seq: MsgSeq(1),
            msg_id: MsgId(1),
            sender: Uid(b),
            kind: MessageKind::Normal,
            msg_type: 1,
            target_seq: MsgSeq(0),
            at_ms: T0,
            client_msg_id: 1,
            summary: Bytes::from_static(b"hi"),
        },
        recipients: vec![Recipient {
            uid: Uid(a),
            period_id: 0,
        }],
        uncount: vec![],
    };
    ib.fanout_deliver(GroupId(2), vec![entry], 0)
        .wait()
        .unwrap();
    ib.fanout_deliver(GroupId(2), vec![], 1).wait().unwrap();
    ib.shutdown().unwrap();
}

#[test]
fn dump_describes_every_record_kind_of_a_store_that_has_seen_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let ib = open(dir.path(), &clock);
    compacted_rounds(&ib, &clock);
    live_rounds(&ib);
    // A send whose batch a power cut tore: the open after it cuts the
    // batch and reserves its numbers (a reservation, a reserved message).
    send(&ib, SMALL, 2, 2500, "torn by a power cut");
    ib.shutdown().unwrap();
    drop(ib);
    tear_last_batch(dir.path());
    let ib = open(dir.path(), &clock);
    replicated_round(&ib);
    ib.shutdown().unwrap();

    let placed = tempfile::tempdir().unwrap();
    fanout_rounds(placed.path(), &clock);

    let mut out = Vec::new();
    for dir in [dir.path(), placed.path()] {
        for (stream, sub) in [(Stream::Evt, "evt"), (Stream::Msg, "msg")] {
            dump_stream(&dir.join(sub), stream, None, &mut out).unwrap();
        }
    }
    let text = String::from_utf8(out).unwrap();
    let undescribed: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().split(' ').nth(1) == Some("kind"))
        .collect();
    assert_eq!(undescribed, Vec::<&str>::new(), "records left raw");
    let missing: Vec<&str> = kinds::evt_kinds()
        .map(|k| k.name)
        .filter(|name| {
            !text.contains(&format!(" effect {name} "))
                && !text.contains(&format!(" effect copy of {name} "))
        })
        .collect();
    assert_eq!(
        missing,
        Vec::<&str>::new(),
        "kinds never described:\n{text}"
    );
    assert!(text.contains(" message conv 10 msg_seq "), "no msg record");
}
