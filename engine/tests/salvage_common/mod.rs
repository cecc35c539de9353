//! Helpers of the salvage tests: find a record by what its payload holds,
//! damage it in place, hash a directory tree, salvage into a new one.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use inbox_engine::inbox::{salvage, ManualClock, SalvageReport};
use inbox_engine::log::RecordLoc;
use inbox_engine::{Inbox, InboxConfig};
use sha2::Digest;

/// The newest record of the log in `dir` whose payload contains `marker`,
/// and where the last occurrence of the marker starts in its payload.
pub fn find_record(dir: &Path, marker: &[u8]) -> (RecordLoc, usize) {
    let mut found = None;
    inbox_engine::log::replay_dir(dir, 0, &mut |_, loc, _, payload| {
        if let Some(at) = payload.windows(marker.len()).rposition(|w| w == marker) {
            found = Some((loc, at));
        }
        Ok(())
    })
    .unwrap();
    found.unwrap_or_else(|| panic!("no record in {} holds the marker", dir.display()))
}

/// The newest record of log kind `kind` in the log in `dir`.
pub fn last_record_of_kind(dir: &Path, kind: u8) -> RecordLoc {
    let mut found = None;
    inbox_engine::log::replay_dir(dir, 0, &mut |_, loc, k, _| {
        if k == kind {
            found = Some(loc);
        }
        Ok(())
    })
    .unwrap();
    found.expect("a record of that kind")
}

fn segment_path(dir: &Path, segment: u32) -> PathBuf {
    dir.join(format!("{segment:010}.seg"))
}

/// Flips one byte of the segment file at `offset`.
pub fn flip_byte(dir: &Path, segment: u32, offset: u64) {
    let path = segment_path(dir, segment);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[offset as usize] ^= 0x5a;
    std::fs::write(&path, bytes).unwrap();
}

/// Flips a byte `at` bytes into the payload of the record at `loc`.
pub fn damage_payload(dir: &Path, loc: RecordLoc, at: usize) {
    flip_byte(dir, loc.segment, u64::from(loc.offset) + 16 + at as u64);
}

/// SHA-256 of every file under `dir`, by relative path.
pub fn hash_tree(dir: &Path) -> BTreeMap<PathBuf, [u8; 32]> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.insert(
                    path.strip_prefix(dir).unwrap().to_path_buf(),
                    sha2::Sha256::digest(&bytes).into(),
                );
            }
        }
    }
    out
}

/// The configuration the salvaged directory is opened with: the
/// harness's (same token key and clock).
pub fn config_for(dir: &Path, clock: &Arc<ManualClock>) -> InboxConfig {
    crate::inbox_common::config(dir, clock)
}

/// Salvages `from` into a new directory (checking that the source did not
/// change by a byte) and returns it with the report.
pub fn salvage_checked(
    from: &Path,
    clock: &Arc<ManualClock>,
) -> (tempfile::TempDir, PathBuf, SalvageReport) {
    let before = hash_tree(from);
    let parent = tempfile::tempdir().unwrap();
    let to = parent.path().join("salvaged");
    let report = salvage(&config_for(from, clock), &to).unwrap();
    assert_eq!(hash_tree(from), before, "salvage wrote to its source");
    (parent, to, report)
}

/// Opens a salvaged directory after checking it as `inboxd verify` does.
pub fn open_salvaged(to: &Path, clock: &Arc<ManualClock>) -> Inbox {
    inbox_engine::inbox::verify_data_dir(&config_for(to, clock)).unwrap();
    let inbox = Inbox::open(config_for(to, clock)).unwrap();
    inbox.check_invariants().unwrap();
    inbox
}
