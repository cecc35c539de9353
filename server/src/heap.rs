//! The daemon's allocator, and what the process holds beside the
//! structures the engine accounts for.
//!
//! The engine's memory breakdown (`Inbox::memory`) estimates each
//! structure from its lengths and capacities. What the process holds
//! besides (requests in flight, connection buffers, the allocator's size
//! classes and free pages) is not in any structure, so the breakdown adds
//! two measured entries ([`with_process_memory`]):
//!
//! - `heap`: the bytes the daemon's allocations hold now, as [`Counting`]
//!   counts them (what each asked for: its size class and the allocator's
//!   pages are not in it);
//! - `anonymous`: the process's resident anonymous memory (`RssAnon`):
//!   the heap's pages, the threads' stacks and the binary's data.
//!
//! Each gives the same figure as `live` and `allocated`. So an operator
//! can tell a structure that grows from a heap that frees into pages it
//! cannot give back: `heap` minus the structures' `allocated` is what
//! lives outside them (requests in flight, buffers, queues), and
//! `anonymous` minus `heap` is the allocator's size classes and free
//! pages, the stacks and the binary's data. (mimalloc's own figure of
//! what it has committed is no help here: on Linux it counts address
//! space it made writable, most of it never touched, and an idle daemon
//! has several times its resident memory committed.)
//!
//! [`with_process_memory`] appends both to a breakdown.
//!
//! [`Counting`] is mimalloc with a count of the bytes it hands out. Each
//! thread adds to a counter of its own, on a cache line of its own, with a
//! plain load and store: no atomic read-modify-write and no line shared
//! between threads on the allocation path. Summing the counters is
//! `counted`'s job. A block freed by another thread than the one
//! that allocated it is subtracted from the freeing thread's counter;
//! only the sum means anything.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::Relaxed};

use inbox_engine::{file_backed, MemoryReport, MemoryUse};

/// Threads that get a counter of their own; the ones started after them
/// share [`SHARED`]. Tokio's blocking pool starts and ends threads as
/// load comes and goes, so a long-running daemon outlives its first
/// counters: the later threads then pay an atomic add instead.
const OWN_COUNTERS: usize = 256;

#[repr(align(64))]
struct Counter(AtomicI64);

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: Counter = Counter(AtomicI64::new(0));
static OWN: [Counter; OWN_COUNTERS] = [ZERO; OWN_COUNTERS];
static SHARED: Counter = ZERO;
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Whether [`Counting`] is the process's allocator (it has counted a
/// block): a test binary's allocator counts nothing.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Unassigned until the thread's first allocation.
const UNASSIGNED: usize = usize::MAX;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(UNASSIGNED) };
}

/// Adds `delta` to the calling thread's counter.
#[inline]
fn count(delta: i64) {
    // A thread being torn down has no thread-locals left: its last frees
    // go to the shared counter.
    let index = INDEX
        .try_with(|i| {
            let mut index = i.get();
            if index == UNASSIGNED {
                index = NEXT.fetch_add(1, Relaxed);
                i.set(index);
                INSTALLED.store(true, Relaxed);
            }
            index
        })
        .unwrap_or(UNASSIGNED);
    match OWN.get(index) {
        // Only this thread writes its counter: a load and a store, where
        // readers may see the sum a few blocks late.
        Some(own) => own.0.store(own.0.load(Relaxed) + delta, Relaxed),
        None => {
            SHARED.0.fetch_add(delta, Relaxed);
        }
    }
}

/// mimalloc, counting the bytes it hands out (what each allocation asked
/// for, not its size class). The `inboxd` binary's global allocator.
pub struct Counting;

// SAFETY: every call goes to mimalloc's own `GlobalAlloc` with the same
// arguments; the counting touches only this module's statics and a
// thread-local that allocates nothing.
unsafe impl GlobalAlloc for Counting {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as i64));
        // SAFETY: the caller's contract, passed on.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) };
        // On failure the old block stays, and so does its count.
        if !p.is_null() {
            count(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

/// The sum of every thread's counter.
fn counted() -> i64 {
    OWN.iter().map(|c| c.0.load(Relaxed)).sum::<i64>() + SHARED.0.load(Relaxed)
}

/// Bytes the process's allocations hold now, if [`Counting`] is its
/// allocator.
fn heap_in_use() -> Option<u64> {
    if !INSTALLED.load(Relaxed) {
        return None;
    }
    u64::try_from(counted()).ok()
}

/// The process's resident anonymous memory (`RssAnon` of
/// `/proc/self/status`), where the system reports it.
fn resident_anonymous() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    rss_anon_of_status(&status)
}

/// `RssAnon` of a `/proc/<pid>/status` text, in bytes.
pub fn rss_anon_of_status(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kib: u64 = line
        .trim_start_matches("RssAnon:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// `report` with the measured entries after the structures'.
pub fn with_process_memory(mut report: MemoryReport) -> MemoryReport {
    report.structures.extend(process_memory());
    report
}

/// True for a row of the breakdown that measures the whole process
/// rather than a structure: `heap` and `anonymous`.
pub fn process_total(row: &str) -> bool {
    matches!(row, "heap" | "anonymous")
}

/// True for a structure on the heap: neither file-backed
/// ([`inbox_engine::file_backed`]) nor a process total. These rows' `allocated` add up to the part of `heap` the
/// structures hold.
pub fn on_heap(row: &str) -> bool {
    !file_backed(row) && !process_total(row)
}

/// The breakdown's measured entries: `heap` (when [`Counting`] is the
/// allocator) and `anonymous` (where the system reports it).
fn process_memory() -> Vec<MemoryUse> {
    let mut entries = Vec::new();
    if let Some(live) = heap_in_use() {
        entries.push(MemoryUse {
            structure: "heap".to_string(),
            live,
            allocated: live,
        });
    }
    if let Some(rss) = resident_anonymous() {
        entries.push(MemoryUse {
            structure: "anonymous".to_string(),
            live: rss,
            allocated: rss,
        });
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_anon_is_read_in_bytes_from_the_status_line() {
        let status =
            "Name:\tinboxd\nVmRSS:\t  52000 kB\nRssAnon:\t   45464 kB\nRssFile:\t 6000 kB\n";
        assert_eq!(rss_anon_of_status(status), Some(45464 * 1024));
        assert_eq!(rss_anon_of_status("Name:\tinboxd\n"), None);
        assert_eq!(rss_anon_of_status("RssAnon:\tmany kB\n"), None);
        assert!(resident_anonymous().expect("own status") > 0);
    }

    #[test]
    fn the_breakdown_rows_are_on_the_heap_in_files_or_process_totals() {
        for row in ["idempotency", "users", "snapshot_cache"] {
            assert!(on_heap(row), "{row}");
        }
        for row in ["log_mmaps", "message_metadata_file", "idempotency_file"] {
            assert!(file_backed(row) && !on_heap(row), "{row}");
        }
        for row in ["heap", "anonymous"] {
            assert!(process_total(row) && !on_heap(row), "{row}");
        }
    }

    #[test]
    fn each_thread_counts_on_its_own_counter_and_the_sum_is_what_is_held() {
        // The test binary's allocator is the system's: count by hand, as
        // `Counting` would. Each thread takes a counter of its own.
        let before = counted();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    count(1000);
                    count(-400);
                    INDEX.with(|i| i.get())
                })
            })
            .collect();
        let mut indexes: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        indexes.sort_unstable();
        indexes.dedup();
        assert_eq!(indexes.len(), 4, "threads shared a counter: {indexes:?}");
        // One thread frees what another allocated: only the sum is kept.
        let t = std::thread::spawn(|| count(-2400));
        t.join().unwrap();
        assert_eq!(
            counted() - before,
            0,
            "4 x 600 allocated, 2,400 freed elsewhere"
        );
        assert!(
            INSTALLED.load(Relaxed),
            "a counted block marks the allocator installed"
        );
    }
}
