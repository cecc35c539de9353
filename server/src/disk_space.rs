//! Sizing a store's log segments to the disk it lives on.
//!
//! Each log preallocates whole segments: the active one and a spare that a
//! background preparer writes ahead of need. A new store therefore needs
//! room for [`SEGMENTS_NEEDED`] segments before it can take its first
//! write: two for each of the `evt` and `msg` logs, and one segment's worth
//! for checkpoints and compaction's copies, plus the index scratch file's
//! first reservation ([`SCRATCH_BYTES_AT_START`]; it grows with the index
//! from there). On a disk with less room than
//! that, a daemon that started anyway would answer every write `NO_SPACE`
//! for good. So at start:
//!
//! - a **new** store whose segment size was left to the default gets the
//!   largest power of two between [`MIN_SEGMENT_BYTES`] and the default
//!   that fits, and the daemon logs the choice;
//! - a new store whose segment size was set explicitly, or one that fits
//!   nothing, is refused, with the space needed and the flag to change;
//! - an **existing** store keeps the segment size it was created with
//!   (recorded in its `evt` log's segment-size manifest) unless a flag
//!   sets one: a full disk
//!   later in its life is the engine's `NO_SPACE` path, not a reason to
//!   refuse to start, and compaction may be what frees space.

use std::path::Path;

/// The smallest segment the daemon sizes a store to (a payload must fit
/// half a segment, so this still takes the largest payload allowed).
pub const MIN_SEGMENT_BYTES: u64 = 4 << 20;

/// Segments' worth of free space a new store needs (see the module doc).
pub const SEGMENTS_NEEDED: u64 = 5;

/// What the index scratch file reserves at first: the engine reserves a
/// region of it from 64 KiB, doubling as the index fills it.
pub const SCRATCH_BYTES_AT_START: u64 = 64 << 10;

/// Bytes a new store with segments of `segment` bytes preallocates before
/// its first write.
fn needed(segment: u64) -> u64 {
    segment
        .saturating_mul(SEGMENTS_NEEDED)
        .saturating_add(SCRATCH_BYTES_AT_START)
}

/// The segment size to open the store with, and a line to log when it
/// differs from the configured one.
#[derive(Debug, PartialEq, Eq)]
pub struct Choice {
    pub segment_bytes: u64,
    pub note: Option<String>,
}

/// Chooses the segment size. `configured` is the flag's value or the
/// default (`explicit` says which), `existing` the size of the store's
/// newest `evt` segment (`None` for a new store), `available` the bytes
/// free to this process on the store's filesystem. `Err` explains the
/// refusal.
pub fn choose_segment_bytes(
    configured: u64,
    explicit: bool,
    existing: Option<u64>,
    available: u64,
) -> Result<Choice, String> {
    let keep = |segment_bytes| Choice {
        segment_bytes,
        note: None,
    };
    if let Some(size) = existing {
        if explicit || size >= configured {
            return Ok(keep(configured));
        }
        return Ok(Choice {
            segment_bytes: size,
            note: Some(format!(
                "the store was created with {} segments: keeping that size (--segment-bytes sets another)",
                mib(size)
            )),
        });
    }
    if available >= needed(configured) {
        return Ok(keep(configured));
    }
    if explicit {
        return Err(format!(
            "the data directory's filesystem has {} available, and a new store with \
             --segment-bytes {configured} needs at least {} ({SEGMENTS_NEEDED} segments: two \
             for each log and room for a checkpoint; and the index scratch file); free space, or lower --segment-bytes \
             (at least {MIN_SEGMENT_BYTES})",
            mib(available),
            mib(needed(configured)),
        ));
    }
    let mut segment = configured.min(1 << 62).next_power_of_two();
    while segment > configured || (needed(segment) > available && segment > MIN_SEGMENT_BYTES) {
        segment /= 2;
    }
    if segment < MIN_SEGMENT_BYTES || needed(segment) > available {
        return Err(format!(
            "the data directory's filesystem has {} available, and a new store needs at \
             least {} ({SEGMENTS_NEEDED} segments of at least {}, and the index scratch file); \
             free space or choose \
             another --data-dir",
            mib(available),
            mib(needed(MIN_SEGMENT_BYTES)),
            mib(MIN_SEGMENT_BYTES),
        ));
    }
    Ok(Choice {
        segment_bytes: segment,
        note: Some(format!(
            "the data directory's filesystem has {} available: segments sized {} instead of {} \
             (--segment-bytes sets the size)",
            mib(available),
            mib(segment),
            mib(configured),
        )),
    })
}

/// The segment size the store in `data_dir` was made with, or `None` if
/// it has no `evt` segment yet (a new store). Read from the `evt` log's
/// segment-size manifest (`inbox_engine::log::sizes`), never from a
/// file's length, which damage can change. A store written before the
/// manifest existed has none until its first start: for it, the longest
/// `evt` segment file, so that one file cut short does not decide.
pub fn existing_segment_bytes(data_dir: &Path) -> std::io::Result<Option<u64>> {
    let dir = data_dir.join("evt");
    let recorded = inbox_engine::log::sizes::SegmentSizes::read(&dir)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    if let Some(bytes) = recorded.newest() {
        return Ok(Some(bytes));
    }
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut longest: Option<u64> = None;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let is_segment = name
            .to_str()
            .and_then(|n| n.strip_suffix(".seg"))
            .is_some_and(|n| n.parse::<u64>().is_ok());
        let len = entry.metadata()?.len();
        if is_segment && len >= inbox_engine::log::SEGMENT_BYTES_MIN {
            longest = Some(longest.map_or(len, |l| l.max(len)));
        }
    }
    Ok(longest)
}

/// Bytes available to an unprivileged writer on the filesystem of `path`.
pub fn available_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs is a plain C struct of integers, for which all
    // zeros is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs only writes into `st`, which lives for the call, and
    // reads the NUL-terminated path.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::useless_conversion)] // the field types differ by target
    let (blocks, block_size) = (u64::from(st.f_bavail), u64::from(st.f_frsize));
    Ok(blocks.saturating_mul(block_size))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: u64 = 128 << 20;
    const MIB: u64 = 1 << 20;

    #[test]
    fn a_new_store_on_a_roomy_disk_keeps_the_configured_size() {
        let c = choose_segment_bytes(DEFAULT, false, None, 10 << 30).unwrap();
        assert_eq!(
            c,
            Choice {
                segment_bytes: DEFAULT,
                note: None
            }
        );
    }

    #[test]
    fn a_new_store_on_a_48_mib_disk_gets_8_mib_segments_and_says_so() {
        let c = choose_segment_bytes(DEFAULT, false, None, 48 * MIB).unwrap();
        assert_eq!(c.segment_bytes, 8 * MIB);
        let note = c.note.unwrap();
        assert!(note.contains("8.0 MiB instead of 128.0 MiB"), "{note}");
    }

    #[test]
    fn a_disk_too_small_for_the_smallest_segments_is_refused_with_the_space_needed() {
        let e = choose_segment_bytes(DEFAULT, false, None, 19 * MIB).unwrap_err();
        assert!(e.contains("needs at least 20.1 MiB"), "{e}");
        // Five of the smallest and the scratch file's start fit; five
        // segments alone leave no room for the scratch file.
        let c =
            choose_segment_bytes(DEFAULT, false, None, 20 * MIB + SCRATCH_BYTES_AT_START).unwrap();
        assert_eq!(c.segment_bytes, MIN_SEGMENT_BYTES);
        choose_segment_bytes(DEFAULT, false, None, 20 * MIB)
            .expect_err("the scratch file is counted too");
    }

    #[test]
    fn an_explicit_size_that_does_not_fit_a_new_store_is_refused_naming_the_flag() {
        let e = choose_segment_bytes(DEFAULT, true, None, 48 * MIB).unwrap_err();
        assert!(e.contains("--segment-bytes 134217728"), "{e}");
        assert!(e.contains("640.1 MiB"), "{e}");
        let c = choose_segment_bytes(8 * MIB, true, None, 48 * MIB).unwrap();
        assert_eq!(
            c,
            Choice {
                segment_bytes: 8 * MIB,
                note: None
            }
        );
    }

    #[test]
    fn an_existing_store_keeps_its_smaller_segments_and_is_never_refused() {
        let c = choose_segment_bytes(DEFAULT, false, Some(8 * MIB), 0).unwrap();
        assert_eq!(c.segment_bytes, 8 * MIB);
        assert!(c.note.is_some());
        let c = choose_segment_bytes(DEFAULT, false, Some(DEFAULT), 0).unwrap();
        assert_eq!(
            c,
            Choice {
                segment_bytes: DEFAULT,
                note: None
            }
        );
        let c = choose_segment_bytes(16 * MIB, true, Some(8 * MIB), 0).unwrap();
        assert_eq!(
            c,
            Choice {
                segment_bytes: 16 * MIB,
                note: None
            }
        );
    }

    #[test]
    fn a_configured_size_that_is_not_a_power_of_two_shrinks_below_itself() {
        let c = choose_segment_bytes(100 * MIB, false, None, 48 * MIB).unwrap();
        assert_eq!(c.segment_bytes, 8 * MIB);
        let c = choose_segment_bytes(6 * MIB, false, None, 25 * MIB).unwrap();
        assert_eq!(c.segment_bytes, MIN_SEGMENT_BYTES);
    }

    #[test]
    fn an_existing_store_keeps_its_recorded_size_whatever_its_files_were_cut_to() {
        use inbox_engine::log::{Log, LogOptions};
        let data = tempfile::tempdir().unwrap();
        let evt = data.path().join("evt");
        drop(
            Log::open(LogOptions {
                segment_bytes: 65536,
                ..LogOptions::new(&evt)
            })
            .unwrap(),
        );
        // Every segment file, the prepared spare included, cut short.
        for entry in std::fs::read_dir(&evt).unwrap().flatten() {
            if entry.path().extension().is_some_and(|e| e == "seg") {
                let f = std::fs::File::options()
                    .write(true)
                    .open(entry.path())
                    .unwrap();
                f.set_len(20).unwrap();
            }
        }
        assert_eq!(existing_segment_bytes(data.path()).unwrap(), Some(65536));
    }
}
