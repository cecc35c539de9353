//! `salvage`: what still verifies is copied into a fresh directory that
//! opens and serves, and the report names exactly what was lost.

mod inbox_common;
mod salvage_common;

use std::time::Duration;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::inbox::{LostEvents, LostMessages};
use inbox_engine::*;
use salvage_common::*;

const U1: Uid = Uid(1);
const U2: Uid = Uid(2);
const U3: Uid = Uid(3);
const C10: ConvId = ConvId(10);
const C20: ConvId = ConvId(20);
const C30: ConvId = ConvId(30);

/// Joins, sends, a recall, an edit, read cursors and flags: one of each
/// kind of fact.
fn activity(h: &Harness, round: u128) {
    if round == 0 {
        for (uid, conv) in [
            (U1, C10),
            (U2, C10),
            (U2, C20),
            (U3, C20),
            (U1, C30),
            (U3, C30),
        ] {
            h.join(uid, conv);
        }
    }
    let base = round * 100;
    h.send(C10, U1, base + 1, "hello two");
    h.send(C20, U2, base + 2, "hello three");
    let sent = h.send(C30, U3, base + 3, "hello one");
    h.ib()
        .edit(EditRequest {
            sender: U3,
            conv: C30,
            client_msg_id: base + 4,
            target: sent.msg_id,
            payload: Bytes::from_static(b"hello one, edited"),
        })
        .wait()
        .unwrap();
    let oops = h.send(C10, U2, base + 5, "oops");
    h.ib()
        .recall(RecallRequest {
            sender: U2,
            conv: C10,
            client_msg_id: base + 6,
            target: oops.msg_id,
        })
        .wait()
        .unwrap();
    h.ib()
        .mark_read(U1, C10, sent.msg_seq.min(MsgSeq(2)))
        .wait()
        .unwrap();
    h.ib()
        .set_conv_flags(
            U3,
            C20,
            ConvFlags {
                muted: true,
                pinned: round % 2 == 0,
            },
        )
        .wait()
        .unwrap();
}

fn history(ib: &Inbox, uid: Uid, conv: ConvId) -> Vec<Message> {
    ib.history(uid, conv, None, 500).unwrap().messages
}

/// The events a device gets from `local` on, without acknowledging them.
fn pending_events(
    ib: &Inbox,
    uid: Uid,
    device: DeviceId,
    gen: Generation,
    local: SyncSeq,
) -> Result<Vec<SyncEvent>> {
    let page = ib
        .sync(SyncRequest {
            uid,
            device,
            generation: Some(gen),
            local_applied_seq: local,
            limit: 500,
            batch_token: None,
        })
        .wait()?;
    Ok(page.events)
}

#[test]
fn an_undamaged_directory_salvages_to_the_same_state_and_an_empty_report() {
    let mut h = Harness::new();
    let dev = h.register(U2, DeviceId(1)).device;
    activity(&h, 0);
    h.catch_up(U2, DeviceId(1), dev.generation, SyncSeq(0));
    h.ib().checkpoint().unwrap();
    activity(&h, 1);
    let digest = h.ib().location_free_digest();
    let before = history(h.ib(), U2, C10);
    drop(h.inbox.take());

    let (_keep, to, report) = salvage_checked(h.dir.path(), &h.clock);
    assert!(report.is_lossless(), "{report:#?}");
    assert!(
        report.damage.is_empty() && report.lost_messages.is_empty(),
        "{report:#?}"
    );
    assert!(report.checkpoint_lsn.is_some(), "{report:#?}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&to).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "private, as a data directory is");
    let d2 = open_salvaged(&to, &h.clock);
    assert_eq!(
        d2.location_free_digest(),
        digest,
        "the same state, in new files"
    );
    assert_eq!(history(&d2, U2, C10), before);
}

#[test]
fn a_damaged_message_batch_loses_exactly_that_message_and_its_events() {
    let h = Harness::new();
    let a = h.register(U2, DeviceId(1)).device; // stays behind the loss
    let b = h.register(U2, DeviceId(2)).device; // gets past it
    let d1 = h.register(U1, DeviceId(3)).device;
    let c = h.register(U3, DeviceId(4)).device; // never had the message
    activity(&h, 0);
    let (_, a_gen, a_ack) = h.catch_up(U2, DeviceId(1), a.generation, SyncSeq(0));
    let (_, c_gen, c_ack) = h.catch_up(U3, DeviceId(4), c.generation, SyncSeq(0));
    h.ib().checkpoint().unwrap();
    h.send(C20, U3, 900, "before the loss");
    let lost = h.send(
        C10,
        U1,
        901,
        "LOSE-ME the body of the message that is damaged",
    );
    h.send(C10, U2, 902, "right after the loss");
    let (b_events, b_gen, b_ack) = h.catch_up(U2, DeviceId(2), b.generation, SyncSeq(0));
    let (d1_events, d1_gen, d1_ack) = h.catch_up(U1, DeviceId(3), d1.generation, SyncSeq(0));
    activity(&h, 1);
    let event_of = |events: &[SyncEvent]| {
        events
            .iter()
            .find(|e| e.conv == C10 && e.msg_seq == lost.msg_seq)
            .unwrap()
            .sync_seq
    };
    let (e1, e2) = (event_of(&d1_events), event_of(&b_events));
    assert!(a_ack < e2 && e2 <= b_ack && e1 <= d1_ack);
    let ib = h.ib();
    let want_b = pending_events(ib, U2, DeviceId(2), b_gen, b_ack).unwrap();
    let want_d1 = pending_events(ib, U1, DeviceId(3), d1_gen, d1_ack).unwrap();
    let want_c = pending_events(ib, U3, DeviceId(4), c_gen, c_ack).unwrap();
    assert!(!want_b.is_empty() && !want_d1.is_empty() && !want_c.is_empty());
    let histories: Vec<_> = [(U2, C10), (U2, C20), (U3, C30)]
        .into_iter()
        .map(|(u, conv)| history(ib, u, conv))
        .collect();

    // A killed daemon's directory: the log after the checkpoint is
    // replayed, damaged batch included.
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    let evt = image.path().join("evt");
    let (loc, at) = find_record(&evt, b"LOSE-ME");
    damage_payload(&evt, loc, at + 3);

    let (_keep, to, report) = salvage_checked(image.path(), &h.clock);
    assert_eq!(report.uncertain, None, "{report:#?}");
    assert_eq!(report.records_lost, 1, "{report:#?}");
    assert_eq!(
        report.lost_messages,
        vec![LostMessages {
            conv: C10,
            first: lost.msg_seq,
            last: lost.msg_seq
        }]
    );
    assert_eq!(
        report.lost_events,
        vec![
            LostEvents {
                uid: U1,
                first: e1,
                last: e1
            },
            LostEvents {
                uid: U2,
                first: e2,
                last: e2
            },
        ]
    );

    let d2 = open_salvaged(&to, &h.clock);
    // Everything else is served at its msg_seq; the lost one is a
    // tombstone in its place, never its damaged body.
    for (i, (u, conv)) in [(U2, C10), (U2, C20), (U3, C30)].into_iter().enumerate() {
        let got = history(&d2, u, conv);
        assert_eq!(got.len(), histories[i].len());
        for (g, w) in got.iter().zip(&histories[i]) {
            if conv == C10 && g.msg_seq == lost.msg_seq {
                assert!(g.tombstone && g.payload.is_empty(), "{g:?}");
                assert_eq!((g.msg_id, g.sender), (w.msg_id, w.sender));
            } else {
                assert_eq!(g, w);
            }
        }
    }
    // Behind the loss: a reset, never a silent gap.
    let behind = pending_events(&d2, U2, DeviceId(1), a_gen, a_ack);
    assert!(
        matches!(behind, Err(Error::ResetRequired { .. })),
        "{behind:?}"
    );
    // Past it, or never concerned: the same events as before the damage.
    assert_eq!(
        pending_events(&d2, U2, DeviceId(2), b_gen, b_ack).unwrap(),
        want_b
    );
    assert_eq!(
        pending_events(&d2, U1, DeviceId(3), d1_gen, d1_ack).unwrap(),
        want_d1
    );
    assert_eq!(
        pending_events(&d2, U3, DeviceId(4), c_gen, c_ack).unwrap(),
        want_c
    );
}

#[test]
fn a_message_whose_kind_byte_is_damaged_still_keeps_its_place() {
    let h = Harness::new();
    activity(&h, 0);
    let lost = h.send(C20, U2, 901, "LOSE-ME a message whose header is damaged");
    activity(&h, 1);
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    let evt = image.path().join("evt");
    let (loc, _) = find_record(&evt, b"LOSE-ME");
    flip_byte(&evt, loc.segment, u64::from(loc.offset) + 4); // the kind

    let (_keep, to, report) = salvage_checked(image.path(), &h.clock);
    assert_eq!(report.uncertain, None, "{report:#?}");
    assert_eq!(
        report.lost_messages,
        vec![LostMessages {
            conv: C20,
            first: lost.msg_seq,
            last: lost.msg_seq
        }]
    );
    let users: Vec<Uid> = report.lost_events.iter().map(|l| l.uid).collect();
    assert_eq!(users, [U2, U3]);
    open_salvaged(&to, &h.clock);
}

#[test]
fn a_batch_whose_records_cannot_be_told_apart_makes_every_device_reset() {
    let h = Harness::new();
    let dev = h.register(U3, DeviceId(4)).device;
    activity(&h, 0);
    h.send(C10, U1, 901, "LOSE-ME in a batch whose frame is damaged");
    activity(&h, 1);
    let (_, gen, ack) = h.catch_up(U3, DeviceId(4), dev.generation, SyncSeq(0));
    let before = history(h.ib(), U2, C20);
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    let evt = image.path().join("evt");
    let (loc, _) = find_record(&evt, b"LOSE-ME");
    // The record's header (length, kind, back pointer): neither it nor
    // anything after it in its batch can be told apart any more.
    for i in 0..12 {
        flip_byte(&evt, loc.segment, u64::from(loc.offset) + i);
    }

    let (_keep, to, report) = salvage_checked(image.path(), &h.clock);
    assert!(report.uncertain.is_some(), "{report:#?}");
    assert!(report.devices_reset >= 1, "{report:#?}");
    let d2 = open_salvaged(&to, &h.clock);
    // The message's place is kept: the next one of its conversation
    // landed at its own msg_seq behind a lost entry.
    let c10 = history(&d2, U2, C10);
    assert!(c10.iter().any(|m| m.tombstone && m.payload.is_empty()));
    assert_eq!(
        history(&d2, U2, C20),
        before,
        "other conversations are whole"
    );
    let synced = pending_events(&d2, U3, DeviceId(4), gen, ack);
    assert!(
        matches!(synced, Err(Error::ResetRequired { .. })),
        "{synced:?}"
    );
}

#[test]
fn a_damaged_last_batch_that_a_checkpoint_covers_is_a_loss_not_a_torn_tail() {
    let mut h = Harness::new();
    activity(&h, 0);
    let lost = h.send(C20, U3, 901, "LOSE-ME the last write before the shutdown");
    drop(h.inbox.take()); // its final checkpoint covers the last batch
    let evt = h.dir.path().join("evt");
    let (loc, at) = find_record(&evt, b"LOSE-ME");
    damage_payload(&evt, loc, at + 3);

    let (_keep, to, report) = salvage_checked(h.dir.path(), &h.clock);
    assert_eq!(
        report.lost_messages,
        vec![LostMessages {
            conv: C20,
            first: lost.msg_seq,
            last: lost.msg_seq
        }],
        "{report:#?}"
    );
    assert_eq!(report.torn_tail, None, "{report:#?}");
    let users: Vec<Uid> = report.lost_events.iter().map(|l| l.uid).collect();
    assert_eq!(users, [U2, U3], "both members lost the message's event");
    let d2 = open_salvaged(&to, &h.clock);
    let last = history(&d2, U3, C20).into_iter().next().unwrap();
    assert_eq!(last.msg_seq, lost.msg_seq);
    assert!(last.tombstone && last.payload.is_empty(), "{last:?}");
}

#[test]
fn a_record_that_depends_on_a_lost_one_is_skipped_and_leaves_no_trace() {
    const C40: ConvId = ConvId(40);
    let h = Harness::new();
    h.join(U1, C40);
    h.join(U3, C40); // msg_seq 2: its record is damaged below
    let evt = h.dir.path().join("evt");
    let join = last_record_of_kind(&evt, 9);
    h.ib().leave(U3, C40).wait().unwrap(); // 3: needs the lost join
    let last = h.send(C40, U1, 1, "after the leave");
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    let evt = image.path().join("evt");
    for i in 0..12 {
        flip_byte(&evt, join.segment, u64::from(join.offset) + i);
    }

    let (_keep, to, report) = salvage_checked(image.path(), &h.clock);
    assert_eq!(report.records_skipped.len(), 1, "the leave: {report:#?}");
    assert!(report.uncertain.is_some());
    assert_eq!(
        report.lost_messages,
        vec![LostMessages {
            conv: C40,
            first: MsgSeq(2),
            last: MsgSeq(3)
        }]
    );
    let d2 = open_salvaged(&to, &h.clock);
    let seqs: Vec<(MsgSeq, bool)> = history(&d2, U1, C40)
        .iter()
        .rev()
        .map(|m| (m.msg_seq, m.tombstone))
        .collect();
    assert_eq!(
        seqs,
        [
            (MsgSeq(1), false),
            (MsgSeq(2), true),
            (MsgSeq(3), true),
            (last.msg_seq, false)
        ]
    );
    assert!(
        d2.history(U3, C40, None, 10).is_err(),
        "the lost join left no membership behind"
    );
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_and_loses_nothing_the_log_holds() {
    let h = Harness::new();
    activity(&h, 0);
    h.ib().checkpoint().unwrap();
    activity(&h, 1);
    h.ib().checkpoint().unwrap();
    activity(&h, 2);
    let digest = h.ib().location_free_digest();
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    let ckpt = image.path().join("checkpoint");
    let mut files: Vec<_> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    let damage = |path: &std::path::Path| {
        let mut bytes = std::fs::read(path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(path, bytes).unwrap();
    };

    damage(&files[1]);
    let (_keep, to, report) = salvage_checked(image.path(), &h.clock);
    assert!(report.is_lossless(), "{report:#?}");
    assert_eq!(report.checkpoints_skipped.len(), 1, "{report:#?}");
    assert!(report.checkpoint_lsn.is_some());
    assert_eq!(open_salvaged(&to, &h.clock).location_free_digest(), digest);

    // Both damaged: the whole log is replayed.
    damage(&files[0]);
    let (_keep, to, report) = salvage_checked(image.path(), &h.clock);
    assert!(report.is_lossless(), "{report:#?}");
    assert_eq!(report.checkpoint_lsn, None);
    assert_eq!(open_salvaged(&to, &h.clock).location_free_digest(), digest);
}

#[test]
fn a_damaged_body_in_the_message_store_is_reported_lost_and_never_served() {
    const HOUR: Duration = Duration::from_secs(3600);
    let tune = |c: &mut InboxConfig| {
        c.segment_bytes = 4096;
        c.safety_window = HOUR;
    };
    let mut h = Harness::with(tune);
    h.join(U1, C10);
    h.join(U2, C10);
    let mut lost = None;
    for i in 0..40u64 {
        let text = format!(
            "{}{}",
            if i == 20 { "LOSE-ME " } else { "" },
            "x".repeat(200 + i as usize)
        );
        let sent = h.send(C10, U1, 1000 + u128::from(i), &format!("{text}{i}"));
        if i == 20 {
            lost = Some(sent.msg_seq);
        }
    }
    let lost = lost.unwrap();
    // Past the safety window, a pass moves the retained bodies to `msg`.
    h.advance(2 * HOUR);
    h.ib().compact().unwrap();
    let before = history(h.ib(), U2, C10);
    drop(h.inbox.take());
    let msg = h.dir.path().join("msg");
    let (loc, at) = find_record(&msg, b"LOSE-ME");
    damage_payload(&msg, loc, at + 10);
    let evt = inbox_engine::log::verify(&h.dir.path().join("evt")).unwrap();
    assert!(evt.segments[0].id > 1, "compaction deleted evt segments");

    let (_keep, to, report) = salvage_checked(h.dir.path(), &h.clock);
    assert_eq!(
        report.lost_messages,
        vec![LostMessages {
            conv: C10,
            first: lost,
            last: lost
        }],
        "{report:#?}"
    );
    assert_eq!(report.uncertain, None);
    let places: Vec<_> = report
        .damage
        .iter()
        .map(|d| (d.log, d.segment, d.offset))
        .collect();
    assert_eq!(
        places,
        [("msg", loc.segment, u64::from(loc.offset))],
        "the damaged body is named, deleted segments are not damage: {report:#?}"
    );
    let d2 = open_salvaged(&to, &h.clock);
    let got = history(&d2, U2, C10);
    assert_eq!(got.len(), before.len());
    for (g, w) in got.iter().zip(&before) {
        if g.msg_seq == lost {
            assert!(g.tombstone && g.payload.is_empty(), "{g:?}");
        } else {
            assert_eq!(g, w);
        }
    }
}

#[test]
fn a_record_of_a_kind_this_version_does_not_know_is_refused_not_skipped() {
    let mut h = Harness::new();
    activity(&h, 0);
    drop(h.inbox.take());
    // A newer version's record: it verifies, and this version cannot
    // apply it.
    let evt = inbox_engine::log::Log::open(inbox_engine::log::LogOptions {
        segment_bytes: 1 << 20,
        spare_segments: 0,
        ..inbox_engine::log::LogOptions::new(h.dir.path().join("evt"))
    })
    .unwrap();
    let mut batch = inbox_engine::log::Batch::new();
    batch.push(77, &[1, 2, 3]);
    evt.append(batch).unwrap();
    drop(evt);
    let before = hash_tree(h.dir.path());
    let parent = tempfile::tempdir().unwrap();
    let to = parent.path().join("new");
    let err = inbox_engine::inbox::salvage(&config_for(h.dir.path(), &h.clock), &to).unwrap_err();
    assert!(err.to_string().contains("newer inboxd"), "{err}");
    assert!(!to.exists() && std::fs::read_dir(parent.path()).unwrap().next().is_none());
    assert_eq!(hash_tree(h.dir.path()), before);
}

#[test]
fn salvage_refuses_a_live_directory_a_non_empty_target_and_a_non_data_directory() {
    let mut h = Harness::new();
    activity(&h, 0);
    let parent = tempfile::tempdir().unwrap();
    let to = parent.path().join("new");
    let cfg = config_for(h.dir.path(), &h.clock);

    let live = inbox_engine::inbox::salvage(&cfg, &to).unwrap_err();
    assert!(live.to_string().contains("in use"), "{live}");
    assert!(!to.exists(), "nothing was written");

    drop(h.inbox.take());
    let before = hash_tree(h.dir.path());
    std::fs::create_dir(&to).unwrap();
    std::fs::write(to.join("keep-me"), b"x").unwrap();
    let full = inbox_engine::inbox::salvage(&cfg, &to).unwrap_err();
    assert!(full.to_string().contains("not empty"), "{full}");
    assert_eq!(std::fs::read(to.join("keep-me")).unwrap(), b"x");
    assert_eq!(
        hash_tree(h.dir.path()),
        before,
        "a refused salvage changes nothing"
    );

    let not_data = tempfile::tempdir().unwrap();
    std::fs::write(not_data.path().join("notes.txt"), b"hello").unwrap();
    let other = parent.path().join("other");
    let err =
        inbox_engine::inbox::salvage(&config_for(not_data.path(), &h.clock), &other).unwrap_err();
    assert!(
        err.to_string().contains("not an inboxd data directory"),
        "{err}"
    );
    assert!(!other.exists());

    // And one that succeeds leaves its source byte for byte as it was
    // (`salvage_checked` hashes every file before and after).
    let (_keep, _to, report) = salvage_checked(h.dir.path(), &h.clock);
    assert!(report.is_lossless(), "{report:#?}");
}

#[test]
fn a_flip_in_a_sealed_segment_that_a_checkpoint_covers_is_in_the_report_and_the_lost_send_can_be_retried(
) {
    let tune = |c: &mut InboxConfig| c.segment_bytes = 4096;
    let mut h = Harness::with(tune);
    h.join(U1, C10);
    h.join(U2, C10);
    let text = |i: u64| {
        format!(
            "{}{}",
            if i == 3 { "LOSE-ME " } else { "" },
            "y".repeat(300)
        )
    };
    let mut lost = None;
    for i in 0..40u64 {
        let sent = h.send(C10, U1, 2000 + u128::from(i), &text(i));
        if i == 3 {
            lost = Some(sent);
        }
    }
    let lost = lost.unwrap();
    h.ib().checkpoint().unwrap();
    drop(h.inbox.take());
    let evt = h.dir.path().join("evt");
    let (loc, at) = find_record(&evt, b"LOSE-ME");
    let newest = inbox_engine::log::verify(&evt)
        .unwrap()
        .segments
        .iter()
        .filter(|s| !s.prepared)
        .map(|s| s.id)
        .max()
        .unwrap();
    assert!(
        loc.segment < newest,
        "the damaged record is in a sealed segment"
    );
    damage_payload(&evt, loc, at + 10);

    let (_keep, to, report) = salvage_checked(h.dir.path(), &h.clock);
    assert!(
        report.damage.iter().any(|d| d.log == "evt"
            && d.segment == loc.segment
            && d.offset == u64::from(loc.offset)),
        "the damaged record is named: {report:#?}"
    );
    assert_eq!(
        report.lost_messages,
        vec![LostMessages {
            conv: C10,
            first: lost.msg_seq,
            last: lost.msg_seq
        }],
        "{report:#?}"
    );
    // The lost message's key went with it (OPERATIONS.md): the very same
    // send again is accepted, as a new message.
    let d2 = open_salvaged(&to, &h.clock);
    let retried = d2
        .send(SendRequest {
            conv: C10,
            sender: U1,
            client_msg_id: 2003,
            msg_type: 1,
            payload: Bytes::from(text(3)),
        })
        .wait()
        .expect("a retry of the lost send is accepted");
    assert!(retried.msg_seq > lost.msg_seq, "{retried:?} after {lost:?}");
    assert_ne!(retried.msg_id, lost.msg_id);
    // A key whose message is still there is still a duplicate.
    let again = d2
        .send(SendRequest {
            conv: C10,
            sender: U1,
            client_msg_id: 2004,
            msg_type: 1,
            payload: Bytes::from(text(4)),
        })
        .wait()
        .unwrap();
    assert_eq!(again.msg_seq, lost.msg_seq.next(), "the original reply");
}
