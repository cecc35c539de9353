//! `Log::read_ahead`: a batch of reads of records found on disk at open
//! asks the kernel for the pages behind them up front; records this
//! process wrote, in a new segment or after the write offset of the
//! segment it found active, are not asked for (their pages went through
//! the page cache).
//! Observed with `mincore` on a mapping of the file, after the file's
//! pages were dropped from the page cache.

mod log_common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use inbox_engine::log::{Log, RecordLoc};
use log_common::*;

const PAGE: u64 = 4096;

fn segment_path(dir: &Path, id: u32) -> std::path::PathBuf {
    dir.join(format!("{id:010}.seg"))
}

/// Drops the file's clean pages from the page cache.
fn evict(path: &Path) {
    let f = File::open(path).unwrap();
    // SAFETY: a valid descriptor; no memory of ours is read.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "POSIX_FADV_DONTNEED on {}", path.display());
}

/// Whether the page holding `offset` of the file is in the page cache
/// and read.
fn cached(path: &Path, offset: u64) -> bool {
    let f = File::open(path).unwrap();
    // SAFETY: a read-only mapping that nothing writes through or reads;
    // `mincore` only reports on it.
    let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
    let page = (offset / PAGE * PAGE) as usize;
    assert!(page < map.len(), "offset {offset} is past the file");
    let mut vec = [0u8; 1];
    // SAFETY: the range is one page inside the mapping; `vec` has room
    // for its one entry.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr().add(page) as *mut libc::c_void,
            PAGE as usize,
            vec.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "mincore");
    vec[0] & 1 == 1
}

/// Asks the kernel to read the page holding `offset`.
fn advise_will_need(path: &Path, offset: u64) {
    let f = File::open(path).unwrap();
    let page = (offset / PAGE * PAGE) as libc::off_t;
    // SAFETY: a valid descriptor; no memory of ours is read.
    let rc = unsafe {
        libc::posix_fadvise(
            f.as_raw_fd(),
            page,
            PAGE as libc::off_t,
            libc::POSIX_FADV_WILLNEED,
        )
    };
    assert_eq!(rc, 0);
}

/// Whether the page holding `offset` is cached within 10 s: the kernel
/// reads what it was asked for in the background, and `mincore` counts a
/// page only once its read completed.
fn wait_cached(path: &Path, offset: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cached(path, offset) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

#[test]
fn read_ahead_asks_for_the_pages_of_records_found_at_open_and_not_of_records_this_process_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(dir.path());
    let mut locs: Vec<RecordLoc> = Vec::new();
    let log = Log::open(o.clone()).unwrap();
    for tag in 0..400u64 {
        locs.extend(log.append(batch(tag, 2)).unwrap().locs);
    }
    // The first segment's first record and one more than the gap beyond
    // it, and a page between them that no location asks for.
    let seg = locs[0].segment;
    let first = locs[0];
    let far = *locs
        .iter()
        .filter(|l| l.segment == seg)
        .find(|l| u64::from(l.offset) >= 48 << 10)
        .expect("the first 64 KiB segment holds a record past 48 KiB");
    let between = 24 << 10;
    let path = segment_path(dir.path(), seg);

    // Written by this process: not asked for. A page asked for directly
    // afterwards, once it reads as cached, shows the hint had its time.
    evict(&path);
    assert!(
        !cached(&path, u64::from(first.offset)),
        "eviction works on this file system"
    );
    log.read_ahead([first, far]);
    advise_will_need(&path, between);
    assert!(
        wait_cached(&path, between),
        "a page asked for directly is read"
    );
    assert!(!cached(&path, u64::from(first.offset)));
    assert!(!cached(&path, u64::from(far.offset)));
    drop(log);

    // Found at open: both records' pages are read, the page between
    // them is not, and the reads that follow find what was asked for.
    let log = Log::open(o).unwrap();
    evict(&path);
    assert!(!cached(&path, u64::from(first.offset)));
    assert!(!cached(&path, u64::from(far.offset)));
    log.read_ahead([far, first]);
    assert!(wait_cached(&path, u64::from(first.offset)));
    assert!(wait_cached(&path, u64::from(far.offset)));
    assert!(!cached(&path, between), "the gap is not read");
    for (i, loc) in locs.iter().enumerate().take(4) {
        let tag = (i / 2) as u64;
        assert_eq!(log.read(*loc).unwrap().payload, payload(tag, i % 2));
    }

    // The segment that was active at open: its records from before are
    // asked for, those this process appends to it are not.
    let active = locs.last().copied().expect("records");
    let old = *locs
        .iter()
        .find(|l| l.segment == active.segment)
        .expect("a record in the active segment");
    let mut new = Vec::new();
    for tag in 400..440u64 {
        new.extend(log.append(batch(tag, 2)).unwrap().locs);
    }
    let new_far = *new
        .iter()
        .filter(|l| l.segment == active.segment)
        .find(|l| l.offset / PAGE as u32 > active.offset / PAGE as u32 + 1)
        .expect("appends after the open land in the active segment, pages beyond the old tail");
    assert_ne!(active.segment, seg, "the active segment is not the first");
    let path = segment_path(dir.path(), active.segment);
    let control = segment_path(dir.path(), seg);
    evict(&path);
    evict(&control);
    assert!(!cached(&path, u64::from(old.offset)));
    assert!(!cached(&path, u64::from(new_far.offset)));
    log.read_ahead([new_far, old]);
    // A page asked for directly afterwards, once read, shows the hint
    // had its time.
    advise_will_need(&control, 0);
    assert!(wait_cached(&path, u64::from(old.offset)));
    assert!(
        wait_cached(&control, 0),
        "a page asked for directly is read"
    );
    assert!(
        !cached(&path, u64::from(new_far.offset)),
        "a record appended after the open is not asked for"
    );
}
