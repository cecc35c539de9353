//! `segment_recover`: recovery of a damaged segment directory.
//!
//! A valid log is written deterministically (several small segments, so
//! some are sealed), then the fuzz input is read as a list of damage
//! operations applied to the segment files: bit flips, byte overwrites,
//! truncations and garbage appended. Recovery must never panic. It either
//! fails with a clear error, or returns exactly the longest prefix of the
//! batches that were written whose bytes are intact, every record equal to
//! what was written: a CRC-framed log can lose a torn tail, never invent or
//! reorder a record, and never stop short at damage it did not report (a
//! log cut silently at damage in its middle loses acknowledged data).

use std::path::{Path, PathBuf};

use inbox_engine::log::format::{BatchEncoder, BATCH_HEADER_LEN, SEGMENT_HEADER_LEN};
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

/// Where one batch of the reference log lies: its segment file's name and
/// the byte range of its frame.
#[derive(Clone, Debug)]
struct Placement {
    file: std::ffi::OsString,
    start: usize,
    end: usize,
}

fn write_reference_log(dir: &Path) -> Vec<Placement> {
    let log = Log::open(options(dir)).expect("a fresh log opens");
    let mut placements = Vec::with_capacity(BATCHES);
    for i in 0..BATCHES {
        let records = reference_batch(i);
        let mut batch = Batch::new();
        for (kind, payload) in &records {
            batch.push(*kind, payload);
        }
        let appended = log
            .append(batch)
            .expect("appending to a fresh log succeeds");
        let first = appended.locs[0];
        let start = first.offset as usize - BATCH_HEADER_LEN;
        let len = BatchEncoder::frame_len(&records).expect("a small batch") as usize;
        placements.push(Placement {
            file: format!("{:010}.seg", first.segment).into(),
            start,
            end: start + len,
        });
    }
    log.flush().expect("flush succeeds");
    placements
}

/// The number of leading batches whose frames and segment headers are
/// byte-for-byte as written: the longest prefix recovery can return.
fn intact_prefix(dir: &Path) -> usize {
    let (image, placements) = reference();
    let original = |file: &std::ffi::OsString| {
        image
            .iter()
            .find(|(name, _)| name == file)
            .map(|(_, bytes)| bytes.as_slice())
            .expect("every batch lies in a reference file")
    };
    placements
        .iter()
        .take_while(|p| {
            let Ok(now) = std::fs::read(dir.join(&p.file)) else {
                return false;
            };
            let was = original(&p.file);
            now.len() >= p.end
                && now[..SEGMENT_HEADER_LEN] == was[..SEGMENT_HEADER_LEN]
                && now[p.start..p.end] == was[p.start..p.end]
        })
        .count()
}

type Image = Vec<(std::ffi::OsString, Vec<u8>)>;

/// The files of the reference log and where each batch lies, written once
/// per process: each case starts from a copy, so the fuzzer spends its
/// time in recovery.
fn reference() -> &'static (Image, Vec<Placement>) {
    static REFERENCE: std::sync::OnceLock<(Image, Vec<Placement>)> = std::sync::OnceLock::new();
    REFERENCE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temp dir");
        let placements = write_reference_log(dir.path());
        let image = files_under(dir.path())
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
            .collect();
        (image, placements)
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

/// What the cases run so far in this process ended in: the prefix rule is
/// only proved by cases that recovered a cut log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    pub cases: u64,
    /// Refused with an error.
    pub refused: u64,
    /// Recovered every batch.
    pub whole: u64,
    /// Recovered a proper, non-empty prefix (a cut tail).
    pub cut: u64,
    /// Recovered nothing of a damaged first batch.
    pub empty: u64,
}

static OUTCOMES: [std::sync::atomic::AtomicU64; 5] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 5];

fn count(which: usize) {
    OUTCOMES[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    OUTCOMES[which].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The outcomes of every case run in this process.
pub fn outcomes() -> Outcomes {
    let n = |i: usize| OUTCOMES[i].load(std::sync::atomic::Ordering::Relaxed);
    Outcomes {
        cases: n(0),
        refused: n(1),
        whole: n(2),
        cut: n(3),
        empty: n(4),
    }
}

/// Runs one fuzz case. Panics (the fuzzer's finding) when recovery panics
/// or when it returns records that are not a prefix of what was written.
pub fn check(data: &[u8]) {
    let dir = super::scratch_dir();
    for (name, bytes) in &reference().0 {
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

    let intact = intact_prefix(dir.path());
    let Ok(log) = Log::open(options(dir.path())) else {
        // A clear error is an allowed outcome for damaged data.
        count(1);
        return;
    };
    let mut recovered: Vec<(u64, u8, Vec<u8>)> = Vec::new();
    let replayed = log.replay(0, &mut |lsn, _loc, kind, payload| {
        recovered.push((lsn, kind, payload.to_vec()));
        Ok(())
    });
    if replayed.is_err() {
        count(1);
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
    // The longest intact prefix, no shorter: every batch before the first
    // damaged byte is recovered.
    let batches = recovered.last().map_or(0, |(lsn, _, _)| *lsn as usize);
    assert_eq!(
        batches, intact,
        "recovery returned {batches} batches; the first {intact} are intact"
    );
    count(match batches {
        BATCHES => 2,
        0 => 4,
        _ => 3,
    });
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
