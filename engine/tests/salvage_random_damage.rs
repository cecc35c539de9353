//! Salvage under damage anywhere in the `evt` log: one flipped byte at a
//! random place of the data, many times over. Each salvage must succeed,
//! leave a directory that verifies and keeps every invariant, serve
//! nothing but what the intact store served (a lost message only as a
//! tombstone at its own `msg_seq`), name in its report exactly what it
//! lost unless it says it is uncertain, and never let a device sync over
//! a gap: a device is either told to reset or gets the very events it
//! would have got before the damage.

mod inbox_common;
mod salvage_common;

use std::collections::BTreeMap;

use inbox_common::*;
use inbox_engine::inbox::SalvageReport;
use inbox_engine::*;
use salvage_common::*;

const CONVS: [ConvId; 3] = [ConvId(10), ConvId(20), ConvId(30)];
const USERS: [Uid; 3] = [Uid(1), Uid(2), Uid(3)];
const ROUNDS: u64 = 40;

/// A device and where it stands: (uid, device, generation, acked).
type Device = (Uid, DeviceId, Generation, SyncSeq);

/// A store with several segments, a checkpoint in the middle, and one
/// device per user left at a different point of its stream.
fn build() -> (Harness, Vec<Device>) {
    let h = Harness::with(|c| c.segment_bytes = 4096);
    for (i, conv) in CONVS.iter().enumerate() {
        h.join(USERS[i], *conv);
        h.join(USERS[(i + 1) % 3], *conv);
    }
    let mut devices = Vec::new();
    for (i, uid) in USERS.iter().enumerate() {
        let gen = h.register(*uid, DeviceId(i as u64 + 1)).device.generation;
        devices.push((*uid, DeviceId(i as u64 + 1), gen, SyncSeq(0)));
    }
    for round in 0..30u64 {
        let conv = CONVS[(round % 3) as usize];
        let sender = USERS[(round % 3) as usize];
        h.send(
            conv,
            sender,
            u128::from(round) + 1,
            &format!("message {round} {}", "z".repeat(round as usize * 15)),
        );
        if round % 4 == 3 {
            h.ib()
                .mark_read(USERS[((round + 1) % 3) as usize], conv, MsgSeq(2))
                .wait()
                .unwrap();
        }
        if round == 12 {
            h.ib().checkpoint().unwrap();
        }
        if round % 10 == 9 {
            let d = &mut devices[(round / 10) as usize];
            let (_, gen, acked) = h.catch_up(d.0, d.1, d.2, d.3);
            (d.2, d.3) = (gen, acked);
        }
    }
    (h, devices)
}

/// Each conversation's two members.
fn members() -> impl Iterator<Item = (Uid, ConvId)> {
    CONVS
        .iter()
        .enumerate()
        .flat_map(|(i, c)| [(USERS[i], *c), (USERS[(i + 1) % 3], *c)])
}

fn history(ib: &Inbox, uid: Uid, conv: ConvId) -> Result<Vec<Message>> {
    ib.history(uid, conv, None, 500).map(|p| p.messages)
}

fn pending(ib: &Inbox, d: &Device) -> Result<Vec<SyncEvent>> {
    ib.sync(SyncRequest {
        uid: d.0,
        device: d.1,
        generation: Some(d.2),
        local_applied_seq: d.3,
        limit: 500,
        batch_token: None,
    })
    .wait()
    .map(|p| p.events)
}

/// Every begun segment's data: (segment, end of its valid data).
fn data_extents(evt: &std::path::Path) -> Vec<(u32, u64)> {
    inbox_engine::log::verify(evt)
        .unwrap()
        .segments
        .iter()
        .filter(|s| s.first_lsn.is_some() && s.bytes > 32)
        .map(|s| (s.id, s.bytes))
        .collect()
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn one_flipped_byte_anywhere_in_the_log_never_serves_a_gap_or_garbage() {
    let (h, devices) = build();
    let ib = h.ib();
    let want_history: BTreeMap<(Uid, ConvId), Vec<Message>> = members()
        .map(|(u, c)| ((u, c), history(ib, u, c).unwrap()))
        .collect();
    let want_events: Vec<Vec<SyncEvent>> =
        devices.iter().map(|d| pending(ib, d).unwrap()).collect();
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    let extents = data_extents(&image.path().join("evt"));
    assert!(extents.len() >= 3, "several segments: {extents:?}");

    let (mut exact, mut uncertain, mut skipped) = (0, 0, 0);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..ROUNDS {
        let damaged = tempfile::tempdir().unwrap();
        copy_running_dir(image.path(), damaged.path());
        let (segment, end) = extents[(next(&mut seed) % extents.len() as u64) as usize];
        let offset = 32 + next(&mut seed) % (end - 32);
        flip_byte(&damaged.path().join("evt"), segment, offset);

        let (_keep, to, report) = salvage_checked(damaged.path(), &h.clock);
        let d2 = open_salvaged(&to, &h.clock);
        let place = format!("segment {segment} offset {offset}: {report:#?}");
        check_history(&d2, &want_history, &report, &place);
        for (d, want) in devices.iter().zip(&want_events) {
            let got = pending(&d2, d);
            let floor = report
                .raised_floors
                .iter()
                .find(|f| f.uid == d.0)
                .map(|f| f.floor);
            match got {
                Err(Error::ResetRequired { .. }) => assert!(
                    report.uncertain.is_some() || floor.is_some_and(|f| d.3 < f),
                    "a reset with nothing lost behind the device; {place}"
                ),
                Ok(events) => {
                    assert!(report.uncertain.is_none(), "{place}");
                    // The same events; or, when a torn tail took the
                    // device's last ACK (as `serve` would cut it), some
                    // it had already, then the same: never a gap.
                    let contiguous = events
                        .windows(2)
                        .all(|w| w[1].sync_seq == w[0].sync_seq.next());
                    assert!(contiguous && events.ends_with(want), "{place}");
                    if report.torn_tail.is_none() {
                        assert_eq!(&events, want, "{place}");
                    }
                }
                Err(e) => panic!("{e}; {place}"),
            }
        }
        skipped += report.records_skipped.len();
        if report.uncertain.is_some() {
            uncertain += 1;
        } else {
            exact += 1;
        }
    }
    println!(
        "{ROUNDS} damaged copies: {exact} salvaged exactly, {uncertain} uncertain, \
         {skipped} records skipped in all"
    );
    assert!(exact > 0, "no flip was salvaged exactly");
}

/// Every message is served as before or as a tombstone in its own place;
/// without uncertainty, the tombstones are exactly the reported losses.
fn check_history(
    d2: &Inbox,
    want: &BTreeMap<(Uid, ConvId), Vec<Message>>,
    report: &SalvageReport,
    place: &str,
) {
    for ((uid, conv), want) in want {
        let got = match history(d2, *uid, *conv) {
            Ok(got) => got,
            // A lost join: nothing of the conversation is served to it.
            Err(Error::Forbidden(_)) if report.uncertain.is_some() => continue,
            Err(e) => panic!("{e}; {place}"),
        };
        if report.uncertain.is_none() {
            assert_eq!(got.len(), want.len(), "{place}");
        }
        let by_seq: BTreeMap<MsgSeq, &Message> = want.iter().map(|m| (m.msg_seq, m)).collect();
        for m in &got {
            let lost = report
                .lost_messages
                .iter()
                .any(|l| l.conv == *conv && l.first <= m.msg_seq && m.msg_seq <= l.last);
            let w = by_seq
                .get(&m.msg_seq)
                .unwrap_or_else(|| panic!("seq {} was never sent; {place}", m.msg_seq));
            if lost {
                assert!(m.tombstone && m.payload.is_empty(), "{m:?}; {place}");
            } else {
                assert_eq!(&m, w, "{place}");
            }
        }
    }
}
