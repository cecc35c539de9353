//! The power-cut model and the repair at open agree. Segments are
//! preallocated and overwrite-only, so a power cut loses unsynced bytes
//! as zeros inside a file of full length: such a crash image, cut at any
//! batch boundary or inside any batch, opens and serves exactly the
//! batches whole before the cut. A file shortened at the same places was
//! cut from outside: open refuses it, naming the segment and the size
//! expected, and never serves it short.

mod log_common;

use std::path::Path;

use inbox_engine::log::{Log, Lsn};
use log_common::*;

/// A log whose one segment holds `n` batches; each batch's (LSN, start,
/// end) offsets in the segment.
fn log_of_batches(dir: &Path, n: u64) -> (std::path::PathBuf, Vec<(Lsn, u64, u64)>) {
    let log = Log::open(opts(dir)).unwrap();
    let mut batches = Vec::new();
    // The first batch follows the segment header, written and synced when
    // the segment was begun.
    let mut end = inbox_engine::log::format::SEGMENT_HEADER_LEN as u64;
    for tag in 0..n {
        let a = log.append(batch(tag, 1 + (tag as usize % 4))).unwrap();
        let seg = log.segments();
        let now = seg.last().unwrap();
        assert_eq!(seg.len(), 1, "one segment holds every batch");
        batches.push((a.lsn, end, now.bytes));
        end = now.bytes;
    }
    let path = segment_files(dir).pop().unwrap();
    drop(log);
    (path, batches)
}

/// Copies every file of the log directory (segments and the segment-size
/// manifest beside them).
fn copy_log(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn a_crash_image_cut_anywhere_opens_and_a_file_cut_at_the_same_place_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, batches) = log_of_batches(dir.path(), 12);
    let name = path.file_name().unwrap().to_owned();
    let whole = std::fs::read(&path).unwrap();
    let mut cuts = Vec::new();
    for &(_, start, end) in &batches {
        cuts.extend([start, start + 1, (start + end) / 2, end - 1, end]);
    }
    let mut checked = 0;
    for cut in cuts {
        let kept: Vec<Lsn> = batches
            .iter()
            .filter(|&&(_, _, end)| end <= cut)
            .map(|&(lsn, _, _)| lsn)
            .collect();

        // Lost unsynced bytes: zeros from the cut on, the file's length
        // as it was.
        let image = tempfile::tempdir().unwrap();
        copy_log(dir.path(), image.path());
        let mut bytes = whole.clone();
        bytes[cut as usize..].fill(0);
        std::fs::write(image.path().join(&name), &bytes).unwrap();
        let log = Log::open(opts(image.path()))
            .unwrap_or_else(|e| panic!("a crash image cut at {cut} is refused: {e}"));
        assert_eq!(replayed_lsns(&log), kept, "crash image cut at {cut}");
        drop(log);

        // The same place, the file shortened.
        let image = tempfile::tempdir().unwrap();
        copy_log(dir.path(), image.path());
        std::fs::File::options()
            .write(true)
            .open(image.path().join(&name))
            .unwrap()
            .set_len(cut)
            .unwrap();
        let before = std::fs::read(image.path().join(&name)).unwrap();
        let err = match Log::open(opts(image.path())) {
            Ok(log) => panic!(
                "a file cut to {cut} bytes was served with LSNs {:?}",
                replayed_lsns(&log)
            ),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(&format!("{SMALL_SEGMENT} bytes long")),
            "cut to {cut}: {err}"
        );
        assert_eq!(
            std::fs::read(image.path().join(&name)).unwrap(),
            before,
            "the refusal left the file as it was"
        );
        checked += 1;
    }
    assert_eq!(checked, batches.len() * 5);
}
