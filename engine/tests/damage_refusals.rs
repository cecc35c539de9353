//! Damage is never made worse and never silent, at open: a start that
//! refuses leaves every file of the data directory byte for byte as it
//! was; a segment shorter than the size it was made with is damage (named
//! by log, segment and size), never a torn tail to cut; a segment missing
//! between two that remain refuses; and a torn tail that is cut keeps its
//! bytes in a side file until a newer checkpoint covers the log's end.
//! `verify_data_dir` (what `inboxd verify` runs) gives the same verdict as
//! the open, from the same function.

mod inbox_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use inbox_common::*;
use inbox_engine::*;

const SEGMENT: u64 = 65536;
/// Acknowledged sends in the store: enough for several `evt` segments.
const SENDS: usize = 2000;

fn tune(c: &mut InboxConfig) {
    c.segment_bytes = SEGMENT;
}

/// Every file under `dir` and its bytes.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// A store of acknowledged sends across several `evt` segments, with a
/// checkpoint at its end when `checkpoint` says so, copied as a crash
/// image into a new directory (the engine keeps running on the original).
fn image(checkpoint: bool) -> (Harness, tempfile::TempDir) {
    let h = Harness::with(tune);
    for uid in 1..=3 {
        h.join(Uid(uid), ConvId(7));
    }
    h.send_many(ConvId(7), Uid(1), 1, SENDS);
    if checkpoint {
        h.ib().checkpoint().unwrap();
    }
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    (h, image)
}

fn open(h: &Harness, dir: &Path) -> Result<Inbox> {
    let mut c = config(dir, &h.clock);
    tune(&mut c);
    Inbox::open(c)
}

fn verdict(h: &Harness, dir: &Path) -> Result<inbox_engine::inbox::RecoveryReport> {
    let mut c = config(dir, &h.clock);
    tune(&mut c);
    inbox_engine::inbox::verify_data_dir(&c)
}

/// Begun `evt` segments (id, end of data), oldest first.
fn evt_segments(dir: &Path) -> Vec<(u32, u64)> {
    let report = inbox_engine::log::verify(&dir.join("evt")).unwrap();
    report
        .segments
        .iter()
        .filter(|s| !s.prepared)
        .map(|s| (s.id, s.bytes))
        .collect()
}

fn segment_path(dir: &Path, id: u32) -> PathBuf {
    dir.join("evt").join(format!("{id:010}.seg"))
}

/// Opens `dir`, which must be refused; checks that verify refuses too and
/// that no file changed. Returns the refusal.
fn refused_and_unchanged(h: &Harness, dir: &Path) -> String {
    let before = contents(dir);
    let verify = verdict(h, dir).expect_err("verify refuses the damaged directory");
    let err = match open(h, dir) {
        Ok(_) => panic!("open served a damaged directory; verify said: {verify}"),
        Err(e) => e.to_string(),
    };
    let after = contents(dir);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "a refused open created or removed files ({err})"
    );
    for (path, bytes) in &before {
        assert!(
            after[path] == *bytes,
            "a refused open changed {} ({err})",
            path.display()
        );
    }
    assert_eq!(verify.to_string(), err, "verify and open give one verdict");
    err
}

#[test]
fn a_refused_start_after_a_flip_in_the_active_segment_leaves_every_file_as_it_was() {
    let (h, image) = image(true);
    let (newest, end) = *evt_segments(image.path()).last().unwrap();
    // Inside the last batch, which the checkpoint covers: cutting it would
    // leave the log short of the checkpoint, so open must refuse, and the
    // refusal must not have cut (zeroed) it first.
    let path = segment_path(image.path(), newest);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[end as usize - 5] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
    let err = refused_and_unchanged(&h, image.path());
    assert!(err.contains("checkpoint"), "{err}");
}

#[test]
fn a_newest_segment_cut_short_is_refused_naming_the_log_segment_and_size() {
    let (h, image) = image(false);
    let (newest, end) = *evt_segments(image.path()).last().unwrap();
    assert!(end > 10_000, "the newest segment holds data past the cut");
    let path = segment_path(image.path(), newest);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(10_000)
        .unwrap();
    let err = refused_and_unchanged(&h, image.path());
    for part in [
        "log evt".to_string(),
        format!("{newest:010}.seg"),
        format!("{SEGMENT} bytes long"),
    ] {
        assert!(err.contains(&part), "the refusal names {part}: {err}");
    }
}

#[test]
fn an_older_segment_cut_short_is_refused() {
    let (h, image) = image(false);
    let segments = evt_segments(image.path());
    assert!(segments.len() >= 3, "several evt segments: {segments:?}");
    let (older, _) = segments[segments.len() - 2];
    std::fs::File::options()
        .write(true)
        .open(segment_path(image.path(), older))
        .unwrap()
        .set_len(SEGMENT / 2)
        .unwrap();
    let err = refused_and_unchanged(&h, image.path());
    assert!(err.contains(&format!("{older:010}.seg")), "{err}");
}

#[test]
fn a_segment_missing_between_two_that_remain_is_refused() {
    let (h, image) = image(false);
    let segments = evt_segments(image.path());
    assert!(segments.len() >= 3, "several evt segments: {segments:?}");
    let (middle, _) = segments[segments.len() / 2];
    std::fs::remove_file(segment_path(image.path(), middle)).unwrap();
    let err = refused_and_unchanged(&h, image.path());
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn a_torn_tail_is_cut_and_its_bytes_are_kept_until_a_newer_checkpoint() {
    let (h, image) = image(false);
    let (newest, end) = *evt_segments(image.path()).last().unwrap();
    // A write torn by a crash: garbage after the last whole batch.
    let path = segment_path(image.path(), newest);
    let mut bytes = std::fs::read(&path).unwrap();
    let torn = [0xA5u8; 40];
    bytes[end as usize..end as usize + torn.len()].copy_from_slice(&torn);
    std::fs::write(&path, bytes).unwrap();
    verdict(&h, image.path()).expect("verify serves a torn tail");
    let ib = open(&h, image.path()).expect("open cuts a torn tail");
    let side = image
        .path()
        .join("evt")
        .join(inbox_engine::log::cut_file_name(newest, end));
    assert_eq!(
        std::fs::read(&side).expect("the cut bytes are kept"),
        torn,
        "the side file holds exactly the bytes cut"
    );
    let after = std::fs::read(&path).unwrap();
    assert!(
        after[end as usize..end as usize + torn.len()]
            .iter()
            .all(|&b| b == 0),
        "the torn bytes are zeros in the segment"
    );
    ib.send(SendRequest {
        conv: ConvId(7),
        sender: Uid(2),
        client_msg_id: 99_999,
        msg_type: 1,
        payload: bytes::Bytes::from_static(b"after the cut"),
    })
    .wait()
    .unwrap();
    assert!(side.exists(), "kept until a checkpoint covers the new end");
    ib.checkpoint().unwrap();
    assert!(
        !side.exists(),
        "a newer checkpoint covers the log's end: the kept bytes go"
    );
}

#[test]
fn the_segment_size_is_recorded_beside_the_segments() {
    let (_h, image) = image(false);
    let sizes = inbox_engine::log::sizes::SegmentSizes::read(&image.path().join("evt")).unwrap();
    assert_eq!(sizes.newest(), Some(SEGMENT));
    assert_eq!(sizes.size_of(1), Some(SEGMENT));
}

#[test]
fn a_flip_in_a_sealed_segment_is_refused() {
    let (h, image) = image(false);
    let segments = evt_segments(image.path());
    let (sealed, end) = segments[0];
    let path = segment_path(image.path(), sealed);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[end as usize / 2] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let err = refused_and_unchanged(&h, image.path());
    assert!(err.contains(&format!("{sealed:010}.seg")), "{err}");
}

#[test]
fn a_prepared_segment_cut_to_zero_bytes_is_refused_naming_it() {
    let (h, image) = image(false);
    let report = inbox_engine::log::verify(&image.path().join("evt")).unwrap();
    let spare = report
        .segments
        .iter()
        .rfind(|s| s.prepared)
        .expect("a prepared spare")
        .id;
    std::fs::File::options()
        .write(true)
        .open(segment_path(image.path(), spare))
        .unwrap()
        .set_len(0)
        .unwrap();
    let err = refused_and_unchanged(&h, image.path());
    assert!(err.contains(&format!("{spare:010}.seg")), "{err}");
}

#[test]
fn a_lost_checkpoint_is_a_full_replay_that_serves_everything() {
    let (h, image) = image(true);
    std::fs::remove_dir_all(image.path().join("checkpoint")).unwrap();
    let report = verdict(&h, image.path()).expect("verify serves it");
    assert_eq!(report.checkpoint_lsn, 0, "a full replay");
    let ib = open(&h, image.path()).expect("open serves it");
    let mut seen = 0;
    let mut before = None;
    loop {
        let page = ib.history(Uid(2), ConvId(7), before, 500).unwrap();
        before = page.messages.last().map(|m| m.msg_seq);
        seen += page.messages.len();
        if !page.has_more {
            break;
        }
    }
    assert_eq!(
        seen,
        h.whole_history(Uid(2), ConvId(7)).len(),
        "every join and send is served"
    );
}

#[test]
fn a_checkpoint_from_the_future_is_refused() {
    let (h, image) = image(false);
    h.send_many(ConvId(7), Uid(2), 10_000, 50);
    h.ib().checkpoint().unwrap();
    let later = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), later.path());
    copy_running_dir(
        &later.path().join("checkpoint"),
        &image.path().join("checkpoint"),
    );
    let err = refused_and_unchanged(&h, image.path());
    assert!(err.contains("checkpoint"), "{err}");
}

/// The records of the log's last batch (LSN, offset of each record).
fn last_batch(dir: &Path) -> (u64, Vec<u32>) {
    let mut last = (0, Vec::new());
    inbox_engine::log::replay_dir(&dir.join("evt"), 0, &mut |lsn, loc, _, _| {
        if lsn != last.0 {
            last = (lsn, Vec::new());
        }
        last.1.push(loc.offset);
        Ok(())
    })
    .unwrap();
    last
}

#[test]
fn a_torn_last_batch_gives_none_of_its_msg_ids_again() {
    let h = Harness::with(tune);
    for uid in 1..=3 {
        h.join(Uid(uid), ConvId(7));
    }
    h.send_many(ConvId(7), Uid(1), 1, 300);
    // The last batch as it was acknowledged (under `SyncPolicy::Interval`
    // before its fdatasync): several sends, pipelined into one round.
    let burst = h.send_many(ConvId(7), Uid(2), 10_000, 64);
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(h.dir.path(), image.path());
    let (_, records) = last_batch(image.path());
    assert!(records.len() >= 2, "the last batch holds several records");
    // A power cut lost the page holding its end: its last record no longer
    // verifies, so the whole batch is a torn tail, cut at open.
    let (newest, end) = *evt_segments(image.path()).last().unwrap();
    let path = segment_path(image.path(), newest);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[end as usize - 8..end as usize].fill(0);
    std::fs::write(&path, bytes).unwrap();

    let ib = open(&h, image.path()).expect("a torn tail is cut and served");
    let history = {
        let mut all = Vec::new();
        let mut before = None;
        loop {
            let page = ib.history(Uid(3), ConvId(7), before, 500).unwrap();
            before = page.messages.last().map(|m| m.msg_seq);
            all.extend(page.messages.into_iter().map(|m| m.msg_id));
            if !page.has_more {
                break;
            }
        }
        all
    };
    let lost: Vec<MsgId> = burst
        .iter()
        .map(|r| r.msg_id)
        .filter(|id| !history.contains(id))
        .collect();
    assert!(lost.len() >= 2, "the cut took sends of the last batch");
    // The last of them sat in the record the power cut damaged; every
    // other one verifies in the kept bytes.
    let readable = &lost[..lost.len() - 1];
    let next = ib
        .send(SendRequest {
            conv: ConvId(7),
            sender: Uid(3),
            client_msg_id: 77_777,
            msg_type: 1,
            payload: bytes::Bytes::from_static(b"after the cut"),
        })
        .wait()
        .unwrap();
    assert!(
        readable.iter().all(|id| next.msg_id > *id),
        "{:?} gives again a msg_id of a message the cut took: {readable:?}",
        next.msg_id
    );
}
