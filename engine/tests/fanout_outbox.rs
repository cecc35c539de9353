//! The fan-out outbox between two groups, step by step: what survives a
//! crash of either side, what a delivery refuses, what a store that owns
//! every slot does not write.

mod inbox_common;

use std::sync::Arc;

use bytes::Bytes;
use inbox_common::{config, copy_running_dir, T0};
use inbox_engine::inbox::{
    slot, FanoutMessage, FanoutStatus, GroupId, ManualClock, OutboxEntry, Placement, Recipient,
    Slot, SlotRange, SLOTS,
};
use inbox_engine::*;

const HALF: u16 = SLOTS / 2;

fn two_groups(here: u32) -> Arc<Placement> {
    let r = |first: u16, last: u16, g: u32| SlotRange {
        first: Slot(first),
        last: Slot(last),
        group: GroupId(g),
    };
    let ranges = vec![r(0, HALF - 1, 1), r(HALF, SLOTS - 1, 2)];
    Arc::new(Placement::new(1, GroupId(here), ranges).unwrap())
}

/// The `n`th id (from 1) whose slot group `g` owns.
fn id_in(g: u32, n: usize) -> u64 {
    let p = two_groups(1);
    (1..)
        .filter(|&id| p.owner(slot(id)) == GroupId(g))
        .nth(n)
        .unwrap()
}

struct Node {
    placement: Option<Arc<Placement>>,
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    inbox: Option<Inbox>,
}

impl Node {
    fn new(placement: Option<Arc<Placement>>) -> Node {
        let mut n = Node {
            placement,
            dir: tempfile::tempdir().unwrap(),
            clock: Arc::new(ManualClock::new(T0)),
            inbox: None,
        };
        n.open();
        n
    }

    fn open(&mut self) {
        let mut c = config(self.dir.path(), &self.clock);
        c.placement = self.placement.clone();
        self.inbox = Some(Inbox::open(c).unwrap());
    }

    fn ib(&self) -> &Inbox {
        self.inbox.as_ref().unwrap()
    }

    /// Reopens from an image of the running directory, as a kill -9
    /// leaves it; without its checkpoints, recovery replays every record.
    fn crash(&mut self, keep_checkpoints: bool) {
        let image = tempfile::tempdir().unwrap();
        copy_running_dir(self.dir.path(), image.path());
        self.inbox.take().unwrap().halt();
        if !keep_checkpoints {
            let _ = std::fs::remove_dir_all(image.path().join("checkpoint"));
        }
        self.dir = image;
        self.open();
    }

    fn send(&self, conv: ConvId, sender: Uid, cmid: u128) -> SendReply {
        let req = SendRequest {
            conv,
            sender,
            client_msg_id: cmid,
            msg_type: 1,
            payload: Bytes::from(format!("m{cmid}")),
        };
        self.ib().send(req).wait().unwrap()
    }

    fn events(&self, uid: Uid) -> Vec<SyncEvent> {
        let device = DeviceId(9);
        let gen = (self.ib().register_device(uid, device).wait().unwrap())
            .device
            .generation;
        let page = self
            .ib()
            .sync(SyncRequest {
                uid,
                device,
                generation: Some(gen),
                local_applied_seq: SyncSeq(0),
                limit: 500,
                batch_token: None,
            })
            .wait()
            .unwrap();
        assert!(!page.has_more);
        page.events
    }

    fn status(&self) -> FanoutStatus {
        self.ib().fanout_status()
    }
}

fn message(conv: ConvId, msg_seq: u64, sender: Uid) -> FanoutMessage {
    FanoutMessage {
        conv,
        msg_seq: MsgSeq(msg_seq),
        msg_id: MsgId(msg_seq),
        sender,
        kind: MessageKind::Normal,
        msg_type: 1,
        target_seq: MsgSeq(0),
        at_ms: T0,
        client_msg_id: 0,
        summary: Bytes::from_static(b"hi"),
    }
}

fn recipient(uid: u64) -> Recipient {
    Recipient {
        uid: Uid(uid),
        period_id: 0,
    }
}

#[test]
fn the_outbox_and_the_dedup_records_survive_crashes_of_either_side_and_the_forwarder_resumes() {
    let mut source = Node::new(Some(two_groups(1)));
    let mut dest = Node::new(Some(two_groups(2)));
    let conv = ConvId(id_in(1, 0));
    let (a, b, c) = (Uid(id_in(1, 1)), Uid(id_in(2, 0)), Uid(id_in(2, 1)));
    for uid in [a, b, c] {
        source.ib().join(uid, conv).wait().unwrap();
    }
    for cmid in 1..=3 {
        source.send(conv, a, cmid);
    }
    // Two joins reached group 2 (b's and c's, which b also sees), then
    // three messages: one entry each, with b and c in one entry.
    let depth = |n: &Node| n.status().outboxes.first().map_or(0, |o| o.depth);
    assert_eq!(depth(&source), 5);
    assert_eq!(source.events(a).len(), 6, "a's own events stay local");
    source.crash(false);
    assert_eq!(depth(&source), 5, "the outbox is replayed from the log");
    source.ib().checkpoint().unwrap();
    source.crash(true);
    assert_eq!(depth(&source), 5, "and loaded from the checkpoint");

    let batch = source.ib().fanout_outbox(GroupId(2), 0, 0).wait().unwrap();
    assert_eq!(batch.entries.len(), 5, "a limit of 0 means the most");
    let two = source.ib().fanout_outbox(GroupId(2), 1, 2).wait().unwrap();
    let seqs: Vec<u64> = two.entries.iter().map(|e| e.seq).collect();
    assert_eq!((seqs, two.last_seq), (vec![2, 3], 5));
    let entries = batch.entries.clone();
    let first = dest
        .ib()
        .fanout_deliver(GroupId(1), entries.clone(), 0)
        .wait()
        .unwrap();
    assert_eq!(first.applied_through, 5);
    // b: its join, c's join, three messages; c: its join and three.
    assert_eq!(first.events_appended, 9);

    dest.crash(false);
    let again = dest
        .ib()
        .fanout_deliver(GroupId(1), entries.clone(), 0)
        .wait()
        .unwrap();
    assert_eq!((again.applied_through, again.events_appended), (5, 0));
    assert_eq!(again.duplicates, 9);
    let b_events = dest.events(b);
    let seqs: Vec<u64> = b_events.iter().map(|e| e.sync_seq.0).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(dest.events(c).len(), 4);
    let row = &dest.ib().conv_list(b, 10, None).unwrap().convs[0];
    assert_eq!(
        (row.conv, row.unread, row.last_msg_seq),
        (conv, 3, MsgSeq(6))
    );

    // The source trims what the destination committed; the next delivery
    // carries the trim, and the destination drops its dedup records.
    assert_eq!(source.ib().fanout_trim(GroupId(2), 5).wait().unwrap(), 5);
    source.crash(false);
    assert_eq!(depth(&source), 0);
    let trimmed = source
        .ib()
        .fanout_outbox(GroupId(2), 0, 100)
        .wait()
        .unwrap();
    assert_eq!(trimmed.trimmed_through, 5);
    assert_eq!(dest.status().inbound[0].dedup_keys, 9);
    dest.ib()
        .fanout_deliver(GroupId(1), vec![], trimmed.trimmed_through)
        .wait()
        .unwrap();
    dest.crash(false);
    let inbound = dest.status().inbound[0];
    assert_eq!((inbound.dedup_entries, inbound.dedup_keys), (0, 0));
    assert_eq!(inbound.source_trimmed, 5);
    // A late copy of a trimmed entry is dropped whole.
    let late = dest
        .ib()
        .fanout_deliver(GroupId(1), entries, 0)
        .wait()
        .unwrap();
    assert_eq!(late.events_appended, 0);
    assert_eq!(dest.events(b).len(), 5);
}

#[test]
fn a_recipient_applied_under_another_entry_is_not_applied_again() {
    let dest = Node::new(Some(two_groups(2)));
    let conv = ConvId(id_in(1, 0));
    let sender = Uid(id_in(1, 1));
    let (b, c) = (id_in(2, 0), id_in(2, 1));
    let m = message(conv, 1, sender);
    let entries = vec![
        OutboxEntry {
            seq: 1,
            message: m.clone(),
            recipients: vec![recipient(b)],
            uncount: vec![],
        },
        // The same message routed again (as after a move), with one more
        // recipient: only that one is new.
        OutboxEntry {
            seq: 2,
            message: m,
            recipients: vec![recipient(b), recipient(c)],
            uncount: vec![],
        },
    ];
    let r = dest
        .ib()
        .fanout_deliver(GroupId(1), entries, 0)
        .wait()
        .unwrap();
    assert_eq!(
        (r.applied_through, r.events_appended, r.duplicates),
        (2, 2, 1)
    );
    assert_eq!(dest.events(Uid(b)).len(), 1);
    assert_eq!(dest.events(Uid(c)).len(), 1);
}

#[test]
fn an_entry_after_a_gap_is_held_back_until_the_gap_is_filled() {
    let dest = Node::new(Some(two_groups(2)));
    let conv = ConvId(id_in(1, 0));
    let sender = Uid(id_in(1, 1));
    let b = id_in(2, 0);
    let entry = |seq: u64| OutboxEntry {
        seq,
        message: message(conv, seq, sender),
        recipients: vec![recipient(b)],
        uncount: vec![],
    };
    let r = dest
        .ib()
        .fanout_deliver(GroupId(1), vec![entry(2), entry(3)], 0)
        .wait()
        .unwrap();
    assert_eq!((r.applied_through, r.held_back), (0, 2));
    assert!(dest.events(Uid(b)).is_empty());
    let r = dest
        .ib()
        .fanout_deliver(GroupId(1), vec![entry(3), entry(1), entry(2)], 0)
        .wait()
        .unwrap();
    assert_eq!((r.applied_through, r.held_back), (3, 0));
    let seqs: Vec<MsgSeq> = dest.events(Uid(b)).iter().map(|e| e.msg_seq).collect();
    assert_eq!(seqs, [MsgSeq(1), MsgSeq(2), MsgSeq(3)]);
}

#[test]
fn a_delivery_or_trim_that_does_not_fit_is_refused_and_changes_nothing() {
    let dest = Node::new(Some(two_groups(2)));
    let conv = ConvId(id_in(1, 0));
    let sender = Uid(id_in(1, 1));
    let entry = |uid: u64, seq: u64| OutboxEntry {
        seq,
        message: message(conv, 1, sender),
        recipients: vec![recipient(uid)],
        uncount: vec![],
    };
    let before = dest.status();
    // A recipient that lives in group 1, not here.
    let err = dest
        .ib()
        .fanout_deliver(
            GroupId(1),
            vec![entry(id_in(2, 0), 1), entry(id_in(1, 2), 2)],
            0,
        )
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err:?}");
    // From itself, and entry 0.
    let err = dest
        .ib()
        .fanout_deliver(GroupId(2), vec![entry(id_in(2, 0), 1)], 0)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err:?}");
    let err = dest
        .ib()
        .fanout_deliver(GroupId(1), vec![entry(id_in(2, 0), 0)], 0)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err:?}");
    // A summary longer than any the engine writes.
    let mut long = entry(id_in(2, 0), 1);
    long.message.summary = Bytes::from(vec![b'x'; SUMMARY_BYTES_MAX + 1]);
    let err = dest
        .ib()
        .fanout_deliver(GroupId(1), vec![long], 0)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err:?}");
    assert_eq!(dest.status(), before);
    assert!(dest.events(Uid(id_in(2, 0))).is_empty());
    // A trim past what was ever written.
    let err = dest.ib().fanout_trim(GroupId(1), 1).wait().unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    // A store with no placement takes no delivery.
    let single = Node::new(None);
    let err = single
        .ib()
        .fanout_deliver(GroupId(1), vec![entry(id_in(2, 0), 1)], 0)
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err:?}");
}

#[test]
fn a_store_that_owns_every_slot_writes_no_outbox_and_keeps_every_event() {
    for placement in [None, Some(Arc::new(Placement::single(GroupId(1))))] {
        let node = Node::new(placement);
        let conv = ConvId(id_in(1, 0));
        let (a, b) = (Uid(id_in(1, 1)), Uid(id_in(2, 0)));
        node.ib().join(a, conv).wait().unwrap();
        node.ib().join(b, conv).wait().unwrap();
        node.send(conv, a, 1);
        assert_eq!(node.status(), FanoutStatus::default());
        assert_eq!(node.events(a).len(), 3);
        assert_eq!(node.events(b).len(), 2);
    }
}
