//! The damage matrix of both logs: for each log (`evt`, `msg`) and each
//! kind of damage to its segment files, `verify_data_dir` and
//! `Inbox::open` give the same verdict; a refused open leaves every file
//! byte for byte as it was; and `salvage` then reports exactly the
//! messages an undamaged copy had and the salvaged store lacks (served as
//! tombstones), every other message as it was. A damaged directory that
//! is served serves every message the undamaged copy had.
//!
//! The store: bodies moved to `msg` by compaction (past the safety
//! window), then more sends whose bodies are still in `evt`, with 16 KiB
//! segments so that each log has several.

mod inbox_common;
mod salvage_common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inbox_common::*;
use inbox_engine::*;
use salvage_common::*;

const SEGMENT: u64 = 16 << 10;
const HOUR: Duration = Duration::from_secs(3600);
const CONV: ConvId = ConvId(7);

fn tune(c: &mut InboxConfig) {
    c.segment_bytes = SEGMENT;
    c.safety_window = HOUR;
}

/// The store and its history as served before any damage.
fn store() -> (Harness, Vec<Message>) {
    let h = Harness::with(tune);
    for uid in 1..=2 {
        h.join(Uid(uid), CONV);
    }
    // Bodies that do not compress, so that each log spans segments.
    let body = |i: u128| -> String {
        let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..40)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                format!("{:08x}", x as u32)
            })
            .collect()
    };
    for i in 0..200u128 {
        h.send(CONV, Uid(1), 1 + i, &body(i));
    }
    h.advance(2 * HOUR);
    h.ib().compact().unwrap();
    for i in 0..120u128 {
        h.send(CONV, Uid(2), 10_000 + i, &body(1000 + i));
    }
    let history = h.whole_history(Uid(2), CONV);
    (h, history)
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    FlipSealed,
    FlipActive,
    TruncateNewest,
    TruncateOlder,
    MissingMiddle,
    ZeroLengthPrepared,
}

const KINDS: [Kind; 6] = [
    Kind::FlipSealed,
    Kind::FlipActive,
    Kind::TruncateNewest,
    Kind::TruncateOlder,
    Kind::MissingMiddle,
    Kind::ZeroLengthPrepared,
];

fn segment_path(log: &Path, id: u32) -> PathBuf {
    log.join(format!("{id:010}.seg"))
}

fn set_len(path: &Path, len: u64) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Damages `log` of the directory as `kind` says.
fn damage(log: &Path, kind: Kind) {
    let report = inbox_engine::log::verify(log).unwrap();
    let begun: Vec<(u32, u64)> = report
        .segments
        .iter()
        .filter(|s| !s.prepared)
        .map(|s| (s.id, s.bytes))
        .collect();
    assert!(
        begun.len() >= 3,
        "several segments in {}: {begun:?}",
        log.display()
    );
    let flip = |id: u32, at: u64| {
        let path = segment_path(log, id);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[at as usize] ^= 0x01;
        std::fs::write(&path, bytes).unwrap();
    };
    let (newest, end) = *begun.last().unwrap();
    match kind {
        Kind::FlipSealed => flip(begun[0].0, begun[0].1 / 2),
        Kind::FlipActive => flip(newest, end - 5),
        Kind::TruncateNewest => set_len(&segment_path(log, newest), end / 2),
        Kind::TruncateOlder => set_len(&segment_path(log, begun[begun.len() - 2].0), SEGMENT / 2),
        Kind::MissingMiddle => {
            std::fs::remove_file(segment_path(log, begun[begun.len() / 2].0)).unwrap()
        }
        Kind::ZeroLengthPrepared => {
            let spare = report
                .segments
                .iter()
                .rfind(|s| s.prepared)
                .expect("a prepared spare")
                .id;
            set_len(&segment_path(log, spare), 0);
        }
    }
}

fn config_of(h: &Harness, dir: &Path) -> InboxConfig {
    let mut c = config(dir, &h.clock);
    tune(&mut c);
    c
}

fn history_of(ib: &Inbox) -> Vec<Message> {
    let mut out = Vec::new();
    let mut before = None;
    loop {
        let page = ib.history(Uid(2), CONV, before, 500).unwrap();
        before = page.messages.last().map(|m| m.msg_seq);
        out.extend(page.messages);
        if !page.has_more {
            break;
        }
    }
    out.reverse();
    out
}

/// One cell of the matrix; returns the verdict, for the summary.
fn check(h: &Harness, want: &[Message], log: &str, kind: Kind) -> String {
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    damage(&image.path().join(log), kind);
    let before = hash_tree(image.path());
    let verify = inbox_engine::inbox::verify_data_dir(&config_of(h, image.path()));
    let opened = Inbox::open(config_of(h, image.path()));
    match (verify, opened) {
        (Ok(_), Ok(ib)) => {
            // Served: a flip in the last batch of the active segment reads
            // as a torn write and is cut like one (the sends here are one
            // a batch): at most that batch's message is missing, named in
            // the WARN of the cut; everything before it is served as it
            // was.
            let served = history_of(&ib);
            assert!(
                served.len() + 1 >= want.len() && served[..] == want[..served.len()],
                "{log} {kind:?}: served {} of {} messages, or changed one",
                served.len(),
                want.len()
            );
            format!("served, the last {} cut", want.len() - served.len())
        }
        (Err(v), Err(o)) => {
            assert_eq!(v.to_string(), o.to_string(), "{log} {kind:?}: one verdict");
            assert_eq!(
                hash_tree(image.path()),
                before,
                "{log} {kind:?}: a refused open changed no file ({o})"
            );
            let (_keep, to, report) = salvage_checked(image.path(), &h.clock);
            let salvaged = history_of(&open_salvaged(&to, &h.clock));
            // Messages lost past the end of everything that remains leave
            // no later message to show the gap: salvage cannot list them,
            // but it names the segment cut short.
            let mut want = want;
            if salvaged.len() < want.len() {
                assert!(
                    matches!(kind, Kind::TruncateNewest)
                        && report
                            .damage
                            .iter()
                            .any(|d| d.log == log && d.reason.contains("cut short from outside")),
                    "{log} {kind:?}: the salvaged store ends {} messages early, unreported",
                    want.len() - salvaged.len()
                );
                want = &want[..salvaged.len()];
            }
            let reported: BTreeSet<MsgSeq> = report
                .lost_messages
                .iter()
                .flat_map(|l| (l.first.0..=l.last.0).map(MsgSeq))
                .collect();
            let mut lacks = BTreeSet::new();
            for (got, had) in salvaged.iter().zip(want) {
                if got != had {
                    assert!(
                        got.tombstone && got.payload.is_empty() && got.msg_seq == had.msg_seq,
                        "{log} {kind:?}: msg_seq {} changed, not lost",
                        had.msg_seq
                    );
                    lacks.insert(got.msg_seq);
                }
            }
            assert_eq!(
                reported, lacks,
                "{log} {kind:?}: the report lists exactly what the salvaged store lacks ({o})"
            );
            assert!(
                !report.damage.is_empty() || !report.lost_messages.is_empty(),
                "{log} {kind:?}: salvage names the damage it met"
            );
            format!("refused, salvage lost {}", lacks.len())
        }
        (v, o) => panic!(
            "{log} {kind:?}: verify {:?} but open {:?}",
            v.map(|_| ()),
            o.map(|_| ())
        ),
    }
}

#[test]
fn every_kind_of_damage_to_either_log_gets_one_verdict_changes_nothing_and_salvage_reports_exactly_the_loss(
) {
    let (h, want) = store();
    for log in ["evt", "msg"] {
        for kind in KINDS {
            let verdict = check(&h, &want, log, kind);
            println!("{log} {kind:?}: {verdict}");
        }
    }
}
