//! A file the state keeps its history-sized arrays in, read and written
//! through the page cache instead of living on the heap.
//!
//! A conversation's message index grows for as long as its history is
//! kept, yet only its newest entries are read often. On the heap, every
//! entry ever retained is resident for good. Here, full chunks of the
//! index are pages of one file, mapped shared: the kernel keeps the pages
//! that are read and drops the rest under memory pressure (after writing
//! them back), as it does for the log's own mapped segments.
//!
//! The file is the process's own scratch space, not part of the store:
//! - it is opened with `O_TMPFILE` (or created and unlinked at once), so
//!   it has no name and vanishes with the process, crashed or not;
//! - it is never fsynced and never read after a restart: the state it
//!   holds is rebuilt from checkpoints and the log, like the heap's;
//! - its space is reserved with `fallocate` before any page of it is
//!   written, so a full disk refuses the reservation (the data stays on
//!   the heap) instead of failing a page fault; a [`REGION_BYTES`] region
//!   is mapped at a time but reserved from [`REGION_START_BYTES`], doubling
//!   as blocks fill it, so a small store's file stays small;
//! - a dropped block's pages are kept for the next block of the same size,
//!   up to [`SPARE_BYTES_MAX`] of them, newest first; beyond that, and
//!   once the arena is gone, a block's pages are punched out of the file
//!   when its last user drops it, which frees its disk space and its page
//!   cache at once; a region whose blocks are all gone is unmapped and its
//!   range reused.
//!
//! Why keep some: the idempotency table merges a shard's keys into a new
//! run and drops the old one many times a second, a run a little larger
//! each time, and its 1,024 shards grow in step. Punching each old run
//! cost a `fallocate` on the sequencer's thread, and writing the new one
//! a page fault per fresh page; a kept run of the same size is written in
//! place, its pages still mapped.
//!
//! A block is written in place while one list owns it. A list that shares
//! it with a checkpoint's copy of the state copies it first (copy on
//! write, as the heap chunks do).

use std::fs::{File, OpenOptions};
use std::marker::PhantomData;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use parking_lot::Mutex;

/// Blocks start on a page.
pub(crate) const PAGE: usize = 4096;

/// Bytes of file mapped at a time.
pub(crate) const REGION_BYTES: usize = 16 << 20;

/// Bytes of a new region reserved at first; the reservation doubles as
/// blocks fill it, up to [`REGION_BYTES`].
pub(crate) const REGION_START_BYTES: usize = 64 << 10;

/// Bytes of dropped blocks' pages kept for reuse, at most: page cache and
/// disk that no structure's row of the memory breakdown counts.
pub(crate) const SPARE_BYTES_MAX: usize = 1 << 20;

/// A type whose values may be kept as raw bytes in the file.
///
/// # Safety
/// `Copy`, without pointers or references, and every value's bytes read
/// back as that value. The file is read back only by the process that
/// wrote it, so only patterns it wrote are read, as with swap.
pub(crate) unsafe trait Plain: Copy + 'static {}

// SAFETY: an integer has no pointers and no invalid patterns.
unsafe impl Plain for u64 {}

/// The scratch file and the region new blocks go to. Blocks and regions
/// hold the file ([`ScratchFile`]), not the arena, so the arena and its current
/// region never hold each other: once the arena and its blocks are gone,
/// so are the regions, the mappings and the file.
pub(crate) struct Arena {
    file: Arc<ScratchFile>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The region new blocks go to, and its first free byte.
    current: Option<(Arc<Region>, usize)>,
    /// File offset of the next region never used.
    next_offset: u64,
    /// Bytes of the current region reserved on disk, from its start.
    reserved: usize,
}

/// The file itself, shared by the arena and every region.
struct ScratchFile {
    file: File,
    /// Offsets of regions whose blocks all went.
    free: Mutex<Vec<u64>>,
    /// Bytes of pages held by live blocks.
    block_bytes: AtomicU64,
    /// Dropped blocks' pages kept for the next block of their size.
    spare: Mutex<Spare>,
}

/// Page ranges of dropped blocks, oldest first. They hold their regions,
/// so the arena empties this when it goes (`open` false): a range kept
/// after that would hold the file open for good.
struct Spare {
    open: bool,
    limit: usize,
    ranges: std::collections::VecDeque<(Arc<Region>, usize, usize)>,
    bytes: usize,
}

/// [`REGION_BYTES`] of the file, reserved and mapped.
struct Region {
    file: Arc<ScratchFile>,
    offset: u64,
    map: MmapRaw,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Arena({} block bytes)", self.block_bytes())
    }
}

impl Arena {
    /// A new scratch file in `dir` (the data directory: a file system with
    /// room, unlike a `tmpfs`, whose pages would stay in memory).
    pub fn open(dir: &Path) -> std::io::Result<Arc<Self>> {
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)
        {
            Ok(f) => f,
            Err(_) => {
                // No O_TMPFILE on this file system: a name, gone at once.
                let path = dir.join(format!("index-scratch-{}", std::process::id()));
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)?;
                std::fs::remove_file(&path)?;
                f
            }
        };
        Ok(Arc::new(Self {
            file: Arc::new(ScratchFile {
                file,
                free: Mutex::new(Vec::new()),
                block_bytes: AtomicU64::new(0),
                spare: Mutex::new(Spare {
                    open: true,
                    limit: SPARE_BYTES_MAX,
                    ranges: Default::default(),
                    bytes: 0,
                }),
            }),
            inner: Mutex::new(Inner::default()),
        }))
    }

    /// Keeps at most `bytes` of dropped blocks' pages for reuse (the
    /// tests of punching set none).
    #[cfg(test)]
    fn keep_spare(&self, bytes: usize) {
        self.file.spare.lock().limit = bytes;
    }

    /// Bytes of dropped blocks' pages kept for reuse.
    #[cfg(test)]
    pub fn spare_bytes(&self) -> u64 {
        self.file.spare.lock().bytes as u64
    }

    /// Bytes of pages live blocks hold.
    pub fn block_bytes(&self) -> u64 {
        self.file.block_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of disk the file holds: reserved regions, less punched pages.
    #[cfg(test)]
    pub fn disk_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.file.file.metadata().map_or(0, |m| m.blocks() * 512)
    }

    /// A block holding a copy of `items`; `None` if it cannot have one (no
    /// room on the disk, or larger than a region): the caller keeps the
    /// items on the heap.
    pub fn store<T: Plain>(self: &Arc<Self>, items: &[T]) -> Option<Block<T>> {
        let bytes = std::mem::size_of_val(items);
        let pages = bytes.div_ceil(PAGE).max(1) * PAGE;
        if pages > REGION_BYTES {
            return None;
        }
        let (region, at) = match self.file.take_spare(pages) {
            Some(kept) => kept,
            None => self.room(pages)?,
        };
        // SAFETY: `at..at + pages` of the region was just given to this
        // block alone, and `items` is `bytes` long.
        unsafe {
            std::ptr::copy_nonoverlapping(
                items.as_ptr().cast::<u8>(),
                region.map.as_mut_ptr().add(at),
                bytes,
            );
        }
        self.file
            .block_bytes
            .fetch_add(pages as u64, Ordering::Relaxed);
        Some(Block {
            region,
            at,
            pages,
            len: items.len(),
            _items: PhantomData,
        })
    }

    /// `pages` bytes of a region, from the current one or a new one.
    fn room(self: &Arc<Self>, pages: usize) -> Option<(Arc<Region>, usize)> {
        let mut inner = self.inner.lock();
        let Inner {
            current, reserved, ..
        } = &mut *inner;
        if let Some((region, used)) = current {
            if *used + pages <= REGION_BYTES {
                if *used + pages > *reserved {
                    let want = (*used + pages).max(*reserved * 2).min(REGION_BYTES);
                    let at = region.offset + *reserved as u64;
                    if let Err(e) = self.reserve(at, want - *reserved) {
                        tracing::debug!(error = %e, "no room to grow an index region; kept on the heap");
                        return None;
                    }
                    *reserved = want;
                }
                let at = *used;
                *used += pages;
                return Some((region.clone(), at));
            }
        }
        let reused = self.file.free.lock().pop();
        let offset = reused.unwrap_or_else(|| {
            let o = inner.next_offset;
            inner.next_offset += REGION_BYTES as u64;
            o
        });
        let first = pages.clamp(REGION_START_BYTES, REGION_BYTES);
        let region = match self.map_region(offset, first) {
            Ok(r) => Arc::new(r),
            Err(e) => {
                self.file.free.lock().push(offset);
                tracing::debug!(error = %e, "no room for an index region; kept on the heap");
                return None;
            }
        };
        inner.reserved = first;
        let old = inner.current.replace((region.clone(), pages));
        drop(inner);
        // Dropped without the lock, which a region's drop need not wait
        // for.
        drop(old);
        Some((region, 0))
    }

    /// Reserves `len` bytes of the file at `offset` (extending it).
    fn reserve(&self, offset: u64, len: usize) -> std::io::Result<()> {
        let fd = self.file.file.as_raw_fd();
        // SAFETY: plain syscall on a descriptor the scratch file owns.
        if unsafe { libc::fallocate(fd, 0, offset as libc::off_t, len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Maps a region at `offset`, its first `reserved` bytes reserved; no
    /// page past them is touched before they are reserved too.
    fn map_region(&self, offset: u64, reserved: usize) -> std::io::Result<Region> {
        self.reserve(offset, reserved)?;
        let map = MmapOptions::new()
            .offset(offset)
            .len(REGION_BYTES)
            .map_raw(&self.file.file)?;
        Ok(Region {
            file: self.file.clone(),
            offset,
            map,
        })
    }
}

impl ScratchFile {
    /// The newest kept range of exactly `pages` bytes, taken.
    fn take_spare(&self, pages: usize) -> Option<(Arc<Region>, usize)> {
        let mut spare = self.spare.lock();
        let i = spare.ranges.iter().rposition(|&(_, _, p)| p == pages)?;
        let (region, at, _) = spare.ranges.remove(i)?;
        spare.bytes -= pages;
        Some((region, at))
    }

    /// Keeps a dropped block's `pages` bytes at `at` of `region` for reuse,
    /// punching the oldest kept ranges out beyond the limit, or this one if
    /// nothing may be kept.
    fn give_back(&self, region: &Arc<Region>, at: usize, pages: usize) {
        let mut spare = self.spare.lock();
        if !spare.open || pages > spare.limit {
            drop(spare);
            self.punch(region.offset + at as u64, pages);
            return;
        }
        spare.ranges.push_back((region.clone(), at, pages));
        spare.bytes += pages;
        let mut over = Vec::new();
        while spare.bytes > spare.limit {
            let Some(oldest) = spare.ranges.pop_front() else {
                break;
            };
            spare.bytes -= oldest.2;
            over.push(oldest);
        }
        drop(spare);
        // Punched, and their regions released, without the lock.
        for (region, at, pages) in over {
            self.punch(region.offset + at as u64, pages);
        }
    }

    /// Gives `len` bytes at `offset` back to the file system.
    fn punch(&self, offset: u64, len: usize) {
        // SAFETY: plain syscall on a descriptor this arena owns.
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r != 0 {
            // The space stays taken until the region is reused; nothing
            // reads it.
            tracing::debug!(error = %std::io::Error::last_os_error(), "punching index pages failed");
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.file.punch(self.offset, REGION_BYTES);
        self.file.free.lock().push(self.offset);
    }
}

/// `len` values of `T` in pages of the file.
pub(crate) struct Block<T: Plain> {
    region: Arc<Region>,
    /// Byte offset in the region (page aligned) and bytes of pages.
    at: usize,
    pages: usize,
    len: usize,
    _items: PhantomData<T>,
}

// SAFETY: a block is read through `&self` and written only through
// `&mut self`, like a `Vec<T>`; the mapping lives as long as its region.
unsafe impl<T: Plain + Send> Send for Block<T> {}
// SAFETY: as above.
unsafe impl<T: Plain + Sync> Sync for Block<T> {}

impl<T: Plain> Block<T> {
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: the block's pages hold `len` values written by `store`
        // (page aligned, so aligned for `T`), and change only through
        // `as_mut_slice`, which needs `&mut self`.
        unsafe {
            std::slice::from_raw_parts(self.region.map.as_ptr().add(self.at).cast::<T>(), self.len)
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only
        // reference to the block's values.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.region.map.as_mut_ptr().add(self.at).cast::<T>(),
                self.len,
            )
        }
    }

    /// Bytes of file pages the block holds.
    pub fn page_bytes(&self) -> usize {
        self.pages
    }
}

impl<T: Plain> std::fmt::Debug for Block<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block({} items, {} page bytes)", self.len, self.pages)
    }
}

impl<T: Plain> Drop for Block<T> {
    fn drop(&mut self) {
        let file = &self.region.file;
        file.block_bytes
            .fetch_sub(self.pages as u64, Ordering::Relaxed);
        file.give_back(&self.region, self.at, self.pages);
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let kept = {
            let mut spare = self.file.spare.lock();
            spare.open = false;
            spare.bytes = 0;
            std::mem::take(&mut spare.ranges)
        };
        for (region, at, pages) in kept {
            self.file.punch(region.offset + at as u64, pages);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_reads_back_what_was_stored_and_takes_changes_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let arena = Arena::open(dir.path()).unwrap();
        let items: Vec<u64> = (0..1000).collect();
        let mut b = arena.store(&items).unwrap();
        assert_eq!(b.as_slice(), &items[..]);
        b.as_mut_slice()[7] = 99;
        assert_eq!(b.as_slice()[7], 99);
        assert_eq!(b.page_bytes(), 8192, "8,000 bytes take two pages");
        assert_eq!(arena.block_bytes(), 8192);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the scratch file has no name"
        );
    }

    #[test]
    fn a_dropped_block_gives_its_pages_back_and_an_emptied_region_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let arena = Arena::open(dir.path()).unwrap();
        arena.keep_spare(0);
        let page = vec![1u64; PAGE / 8];
        let per_region = REGION_BYTES / PAGE;
        let mut first: Vec<Block<u64>> = (0..64).map(|_| arena.store(&page).unwrap()).collect();
        let reserved = arena.disk_bytes();
        assert_eq!(
            reserved,
            64 * PAGE as u64,
            "a region is reserved as its blocks fill it, not whole"
        );
        first.truncate(32);
        assert_eq!(arena.block_bytes(), 32 * PAGE as u64);
        assert_eq!(
            arena.disk_bytes(),
            reserved - 32 * PAGE as u64,
            "the dropped blocks' pages are punched out"
        );
        // The rest of the first region, then one block in a second.
        let mut rest: Vec<Block<u64>> = (0..per_region - 63)
            .map(|_| arena.store(&page).unwrap())
            .collect();
        assert_eq!(arena.inner.lock().next_offset, 2 * REGION_BYTES as u64);
        assert!(
            arena.file.free.lock().is_empty(),
            "the first region still has blocks"
        );
        let in_second = rest.pop().unwrap();
        drop(rest);
        drop(first);
        assert_eq!(
            *arena.file.free.lock(),
            vec![0],
            "the first region went with its last block"
        );
        // Filling the second region makes the next one at the freed offset.
        let fill: Vec<Block<u64>> = (0..per_region)
            .map(|_| arena.store(&page).unwrap())
            .collect();
        let inner = arena.inner.lock();
        assert_eq!(
            inner.next_offset,
            2 * REGION_BYTES as u64,
            "no third offset taken"
        );
        assert_eq!(inner.current.as_ref().map(|(r, _)| r.offset), Some(0));
        drop(inner);
        drop(fill);
        drop(in_second);
        assert_eq!(arena.block_bytes(), 0);
    }

    #[test]
    fn the_scratch_file_starts_small_and_grows() {
        let dir = tempfile::tempdir().unwrap();
        let arena = Arena::open(dir.path()).unwrap();
        let page = vec![1u64; PAGE / 8];
        let _one = arena.store(&page).unwrap();
        assert_eq!(arena.disk_bytes(), REGION_START_BYTES as u64);
        let more: Vec<Block<u64>> = (0..REGION_START_BYTES / PAGE)
            .map(|_| arena.store(&page).unwrap())
            .collect();
        assert_eq!(
            arena.disk_bytes(),
            2 * REGION_START_BYTES as u64,
            "doubled once the first reservation is full"
        );
        drop(more);
    }

    #[test]
    fn a_dropped_block_is_written_again_in_place_by_the_next_of_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let arena = Arena::open(dir.path()).unwrap();
        let two_pages: Vec<u64> = (0..1000).collect();
        let first = arena.store(&two_pages).unwrap();
        let (offset, at) = (first.region.offset, first.at);
        let reserved = arena.disk_bytes();
        drop(first);
        assert_eq!(arena.block_bytes(), 0);
        assert_eq!(arena.spare_bytes(), 8192, "its two pages are kept");
        assert_eq!(arena.disk_bytes(), reserved, "and not punched out");
        // A block of another size does not take them.
        let one_page = arena.store(&[7u64; 10]).unwrap();
        assert_ne!((one_page.region.offset, one_page.at), (offset, at));
        let again: Vec<u64> = (5000..6000).collect();
        let second = arena.store(&again).unwrap();
        assert_eq!(
            (second.region.offset, second.at),
            (offset, at),
            "the next two-page block is written where the dropped one was"
        );
        assert_eq!(second.as_slice(), &again[..]);
        assert_eq!(arena.spare_bytes(), 0);
        assert_eq!(arena.block_bytes(), 8192 + 4096);
    }

    #[test]
    fn kept_pages_stay_under_their_limit_by_punching_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let arena = Arena::open(dir.path()).unwrap();
        let page = vec![1u64; PAGE / 8];
        let n = SPARE_BYTES_MAX / PAGE + 40;
        let blocks: Vec<Block<u64>> = (0..n).map(|_| arena.store(&page).unwrap()).collect();
        let oldest = (blocks[0].region.offset, blocks[0].at);
        let newest = (blocks[n - 1].region.offset, blocks[n - 1].at);
        let reserved = arena.disk_bytes();
        drop(blocks);
        assert_eq!(arena.spare_bytes(), SPARE_BYTES_MAX as u64);
        // A region reserved in several steps is several extents: punching
        // may cost the file system one block of extent tree.
        let freed = reserved - arena.disk_bytes();
        assert!(
            (39 * PAGE as u64..=40 * PAGE as u64).contains(&freed),
            "the 40 pages over the limit are punched out: {freed} bytes freed"
        );
        let taken = arena.store(&page).unwrap();
        assert_eq!(
            (taken.region.offset, taken.at),
            newest,
            "the newest kept page is reused first"
        );
        assert_ne!((taken.region.offset, taken.at), oldest);
    }

    #[test]
    fn an_arena_that_goes_punches_what_it_kept_and_later_drops_are_punched() {
        let dir = tempfile::tempdir().unwrap();
        let arena = Arena::open(dir.path()).unwrap();
        let page = vec![1u64; PAGE / 8];
        let kept = arena.store(&page).unwrap();
        let outliving = arena.store(&page).unwrap();
        let file = Arc::clone(&arena.file);
        drop(kept);
        assert_eq!(arena.spare_bytes(), PAGE as u64);
        drop(arena);
        assert_eq!(
            file.spare.lock().bytes,
            0,
            "nothing kept once the arena went"
        );
        assert!(file.spare.lock().ranges.is_empty());
        drop(outliving);
        assert!(
            file.spare.lock().ranges.is_empty(),
            "a block dropped after its arena is punched, not kept"
        );
    }

    #[test]
    fn the_file_closes_once_the_arena_and_its_last_block_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let arena = Arena::open(dir.path()).unwrap();
        let file = Arc::downgrade(&arena.file);
        let block = arena.store(&[1u64, 2, 3]).unwrap();
        drop(arena);
        assert_eq!(block.as_slice(), [1, 2, 3], "a block outlives its arena");
        assert!(file.upgrade().is_some());
        drop(block);
        assert!(
            file.upgrade().is_none(),
            "no region or arena holds the file"
        );
    }

    #[test]
    fn items_larger_than_a_region_stay_on_the_heap() {
        let dir = tempfile::tempdir().unwrap();
        let arena = Arena::open(dir.path()).unwrap();
        let big = vec![0u64; REGION_BYTES / 8 + 1];
        assert!(arena.store(&big).is_none());
        assert_eq!(arena.block_bytes(), 0);
    }
}
