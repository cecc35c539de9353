//! `segment_recover`: recovery of a damaged segment directory.
//!
//! A valid log is written deterministically (several small segments, so
//! some are sealed), then the fuzz input is read as a list of damage
//! operations applied to the segment files: bit flips, byte overwrites,
//! truncations and garbage appended. Recovery must never panic. It either
//! fails with a clear error, or returns a log whose records are exactly a
//! prefix of the batches that were written, every one intact: a CRC-framed
//! log can lose a torn tail, never invent or reorder a record.

use std::path::{Path, PathBuf};

use inbox_engine::log::{Batch, Log, LogOptions, SyncPolicy};

const SEGMENT_BYTES: u64 = 16 << 10;
const BATCHES: usize = 40;

/// The records of batch `i` of the reference log.
fn reference_batch(i: usize) -> Vec<(u8, Vec<u8>)> {
    let records = 1 + i % 4;
    (0..records)
        .map(|r| {
            let kind = u8::try_from((i + r) % 7).unwrap_or(0) + 1;
            let len = (i * 37 + r * 101) % 700;
            let payload = (0..len)
                .map(|b| u8::try_from((b * 31 + i + r) % 251).unwrap_or(0))
                .collect();
            (kind, payload)
        })
        .collect()
}

fn options(dir: &Path) -> LogOptions {
    let mut options = LogOptions::new(dir);
    options.segment_bytes = SEGMENT_BYTES;
    options.sync = SyncPolicy::None;
    options
}

fn write_reference_log(dir: &Path) {
    let log = Log::open(options(dir)).expect("a fresh log opens");
    for i in 0..BATCHES {
        let mut batch = Batch::new();
        for (kind, payload) in reference_batch(i) {
            batch.push(kind, &payload);
        }
        log.append(batch)
            .expect("appending to a fresh log succeeds");
    }
    log.flush().expect("flush succeeds");
}

/// The files of the reference log, written once per process: each case
/// starts from a copy, so the fuzzer spends its time in recovery.
fn reference_image() -> &'static [(std::ffi::OsString, Vec<u8>)] {
    static IMAGE: std::sync::OnceLock<Vec<(std::ffi::OsString, Vec<u8>)>> =
        std::sync::OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temp dir");
        write_reference_log(dir.path());
        files_under(dir.path())
            .into_iter()
            .map(|path| {
                let name = path
                    .strip_prefix(dir.path())
                    .expect("under the dir")
                    .as_os_str()
                    .to_owned();
                let bytes = std::fs::read(&path).expect("read a reference file");
                (name, bytes)
            })
            .collect()
    })
}

/// Every regular file under `dir`, in a stable order.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// One damage operation, decoded from 6 input bytes:
/// `[op, file, offset u32 LE]`, with `op`'s high bits as the value.
fn apply_damage(files: &[PathBuf], op: &[u8]) {
    let [code, file, o0, o1, o2, o3] = op else {
        return;
    };
    if files.is_empty() {
        return;
    }
    let path = &files[usize::from(*file) % files.len()];
    let Ok(mut bytes) = std::fs::read(path) else {
        return;
    };
    let offset = u32::from_le_bytes([*o0, *o1, *o2, *o3]) as usize;
    match code % 4 {
        0 if !bytes.is_empty() => {
            let at = offset % bytes.len();
            bytes[at] ^= 1 << (code >> 5);
        }
        1 if !bytes.is_empty() => {
            let at = offset % bytes.len();
            bytes[at] = code.wrapping_mul(*file);
        }
        2 => {
            let keep = offset % (bytes.len() + 1);
            bytes.truncate(keep);
        }
        _ => {
            let extra = offset % 512;
            bytes.extend((0..extra).map(|i| code.wrapping_add(u8::try_from(i % 256).unwrap_or(0))));
        }
    }
    // A failed rewrite just leaves the file as it was.
    let _ = std::fs::write(path, bytes);
}

/// Runs one fuzz case. Panics (the fuzzer's finding) when recovery panics
/// or when it returns records that are not a prefix of what was written.
pub fn check(data: &[u8]) {
    let dir = super::scratch_dir();
    for (name, bytes) in reference_image() {
        let path = dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create the image's folders");
        }
        std::fs::write(path, bytes).expect("write the reference image");
    }
    let files = files_under(dir.path());
    for op in data.chunks(6).take(16) {
        apply_damage(&files, op);
    }

    let Ok(log) = Log::open(options(dir.path())) else {
        // A clear error is an allowed outcome for damaged data.
        return;
    };
    let mut recovered: Vec<(u64, u8, Vec<u8>)> = Vec::new();
    let replayed = log.replay(0, &mut |lsn, _loc, kind, payload| {
        recovered.push((lsn, kind, payload.to_vec()));
        Ok(())
    });
    if replayed.is_err() {
        return;
    }

    let mut expected = Vec::new();
    for i in 0..BATCHES {
        let lsn = u64::try_from(i).unwrap_or(u64::MAX) + 1;
        for (kind, payload) in reference_batch(i) {
            expected.push((lsn, kind, payload));
        }
    }
    assert!(
        recovered.len() <= expected.len(),
        "recovery returned {} records, more than the {} written",
        recovered.len(),
        expected.len()
    );
    for (i, (got, want)) in recovered.iter().zip(&expected).enumerate() {
        assert_eq!(
            got, want,
            "recovered record {i} differs from what was written"
        );
    }
    // Whole batches only: the last recovered record closes its batch.
    if let Some((lsn, _, _)) = recovered.last() {
        let records_of_lsn = expected.iter().filter(|(l, _, _)| l == lsn).count();
        let recovered_of_lsn = recovered.iter().filter(|(l, _, _)| l == lsn).count();
        assert_eq!(
            records_of_lsn, recovered_of_lsn,
            "batch {lsn} was recovered partially"
        );
    }
}
