//! A list kept in shared chunks, for a conversation's message metadata.
//!
//! A checkpoint shares the state with the thread that writes its file
//! (`Arc`s all the way down), and the first change to a conversation while
//! the file is written copies what it shares. A conversation's message
//! list grows for as long as its history is kept: with one `Vec`, a send to
//! a group with 500,000 retained messages copied 16 MB on the sequencer
//! thread, stalling every command of its round. Here a copy is one pointer
//! per [`ChunkedVec::CHUNK`] elements, and a write copies only the chunk it
//! touches.
//!
//! A list given the state's scratch file ([`ChunkedVec::use_file`]) keeps
//! its full chunks there, a page each, and only its tail on the heap: the
//! history of a conversation then costs the heap a handle per 157
//! messages, and its pages stay in memory only while they are read.
//!
//! The tail, which every list has and most lists are, keeps its elements
//! packed ([`Pack`]): a message's 26-byte metadata in 10 bytes, against a
//! base the tail keeps once. An element that does not pack (see
//! [`Pack::narrow`]) turns the tail to the elements' full width until the
//! tail becomes a chunk. Elements are read and written by value.

use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

use super::spill::{Arena, Block, Plain, PAGE};

/// An element a list's tail can keep in fewer bytes than its own size,
/// relative to a base the tail keeps once (set from its first element).
pub(crate) trait Pack: Plain {
    /// Bytes of a packed element.
    const NARROW: usize;
    /// Bytes of an element at full width.
    const WIDE: usize;
    /// Bytes of the base.
    const BASE: usize;
    /// The base of a tail whose first element is `self`.
    fn start_base(&self, base: &mut [u8]);
    /// Packs `self` against `base` into `out` ([`Self::NARROW`] bytes), or
    /// says it does not fit. It may fill a part of the base that no packed
    /// element depends on yet.
    fn narrow(&self, base: &mut [u8], out: &mut [u8]) -> bool;
    fn from_narrow(base: &[u8], bytes: &[u8]) -> Self;
    /// The element at full width ([`Self::WIDE`] bytes).
    fn wide(&self, out: &mut [u8]);
    fn from_wide(bytes: &[u8]) -> Self;
}

/// For the tests of the list itself, whose elements are plain numbers.
#[cfg(test)]
impl Pack for u64 {
    const NARROW: usize = 4;
    const WIDE: usize = 8;
    const BASE: usize = 8;
    fn start_base(&self, base: &mut [u8]) {
        base.copy_from_slice(&self.to_le_bytes());
    }
    fn narrow(&self, base: &mut [u8], out: &mut [u8]) -> bool {
        let base = u64::from_le_bytes(base.try_into().expect("8 bytes"));
        match self.checked_sub(base).map(u32::try_from) {
            Some(Ok(d)) => {
                out.copy_from_slice(&d.to_le_bytes());
                true
            }
            _ => false,
        }
    }
    fn from_narrow(base: &[u8], bytes: &[u8]) -> Self {
        u64::from_le_bytes(base.try_into().expect("8 bytes"))
            + u64::from(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }
    fn wide(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
    fn from_wide(bytes: &[u8]) -> Self {
        u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    }
}

/// A list's tail: empty, or a form byte ([`Tail::NARROW`] or
/// [`Tail::WIDE`]), the base ([`Pack::BASE`] bytes), then the elements.
#[derive(Clone)]
struct Tail<T: Pack> {
    bytes: Vec<u8>,
    _elements: PhantomData<T>,
}

impl<T: Pack> Default for Tail<T> {
    fn default() -> Self {
        Tail {
            bytes: Vec::new(),
            _elements: PhantomData,
        }
    }
}

impl<T: Pack> Tail<T> {
    const NARROW: u8 = 0;
    const WIDE: u8 = 1;
    const HEADER: usize = 1 + T::BASE;

    fn width(&self) -> usize {
        match self.bytes.first() {
            Some(&Self::WIDE) => T::WIDE,
            _ => T::NARROW,
        }
    }

    fn len(&self) -> usize {
        self.bytes.len().saturating_sub(Self::HEADER) / self.width()
    }

    fn get(&self, i: usize) -> Option<T> {
        (i < self.len()).then(|| self.at(i))
    }

    fn at(&self, i: usize) -> T {
        let w = self.width();
        let at = Self::HEADER + i * w;
        let bytes = &self.bytes[at..at + w];
        if self.bytes[0] == Self::WIDE {
            T::from_wide(bytes)
        } else {
            T::from_narrow(&self.bytes[1..Self::HEADER], bytes)
        }
    }

    fn iter(&self) -> impl Iterator<Item = T> + '_ {
        (0..self.len()).map(|i| self.at(i))
    }

    /// Writes `item` at entry `i` (`i == len` appends, with room made
    /// first); turns the tail wide when it does not pack.
    fn put(&mut self, i: usize, item: T) {
        if self.bytes.is_empty() {
            self.bytes.resize(Self::HEADER, 0);
            self.bytes[0] = Self::NARROW;
            item.start_base(&mut self.bytes[1..Self::HEADER]);
        }
        let mut scratch = [0u8; 64];
        let w = self.width();
        let code = &mut scratch[..w];
        if self.bytes[0] == Self::WIDE {
            item.wide(code);
        } else if !item.narrow(&mut self.bytes[1..Self::HEADER], code) {
            self.widen();
            return self.put(i, item);
        }
        let at = Self::HEADER + i * w;
        if at == self.bytes.len() {
            if self.bytes.len() + w > self.bytes.capacity() {
                let len = self.len();
                let want = len + (len / 4).max(4);
                let most = Self::HEADER + ChunkedVec::<T>::CHUNK * w;
                let block = super::fitted_block(Self::HEADER, self.bytes.len(), want, w);
                self.bytes.reserve_exact(block.min(most) - self.bytes.len());
            }
            self.bytes.extend_from_slice(code);
        } else {
            self.bytes[at..at + w].copy_from_slice(code);
        }
    }

    /// Every element at full width, in a block fitted to them.
    fn widen(&mut self) {
        let items: Vec<T> = self.iter().collect();
        let len = items.len();
        let used = Self::HEADER + len * T::WIDE;
        let block = super::fitted_block(Self::HEADER, used, len + (len / 4).max(4), T::WIDE);
        let mut bytes = Vec::with_capacity(block);
        bytes.resize(Self::HEADER, 0);
        bytes[0] = Self::WIDE;
        let mut code = [0u8; 64];
        for item in items {
            item.wide(&mut code[..T::WIDE]);
            bytes.extend_from_slice(&code[..T::WIDE]);
        }
        self.bytes = bytes;
    }

    fn drain_front(&mut self, n: usize) {
        let n = n.min(self.len());
        if n == self.len() {
            self.bytes = Vec::new();
        } else {
            let w = self.width();
            self.bytes.drain(Self::HEADER..Self::HEADER + n * w);
        }
    }

    fn take_all(&mut self) -> Vec<T> {
        let items = self.iter().collect();
        self.bytes = Vec::new();
        items
    }

    fn for_each_mut(&mut self, mut f: impl FnMut(&mut T)) {
        for i in 0..self.len() {
            let mut item = self.at(i);
            f(&mut item);
            self.put(i, item);
        }
    }
}

/// A list's full chunks, on the heap or in pages of the state's scratch
/// file ([`super::spill`]).
#[derive(Clone)]
enum Chunk<T: Plain> {
    Heap(Arc<Vec<T>>),
    File(Arc<Block<T>>),
}

impl<T: Plain> Deref for Chunk<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Chunk::Heap(v) => v,
            Chunk::File(b) => b.as_slice(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct ChunkedVec<T: Pack> {
    /// Full chunks of [`Self::CHUNK`] elements each (the first counting
    /// those dropped from its front), shared with every clone.
    full: Vec<Chunk<T>>,
    /// The newest elements, fewer than a chunk, the list's own and packed:
    /// a clone copies them. A short list is this alone.
    tail: Tail<T>,
    /// Elements dropped from the front of the first full chunk.
    head: usize,
    /// Where full chunks go; on the heap without one.
    file: Option<Arc<Arena>>,
}

impl<T: Pack> Default for ChunkedVec<T> {
    fn default() -> Self {
        Self {
            full: Vec::new(),
            tail: Tail::default(),
            head: 0,
            file: None,
        }
    }
}

impl<T: Pack> ChunkedVec<T> {
    /// Elements per chunk: as many as one page holds (157 of a message's
    /// 26-byte metadata), so a chunk in the file is one page, and the list
    /// of chunks is about 1/150 of the elements.
    pub const CHUNK: usize = PAGE / size_of::<T>();

    pub fn len(&self) -> usize {
        self.full.len() * Self::CHUNK - self.head + self.tail.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<T> {
        let j = self.head + i;
        match self.full.get(j / Self::CHUNK) {
            Some(chunk) => chunk.get(j % Self::CHUNK).copied(),
            None => self.tail.get(j - self.full.len() * Self::CHUNK),
        }
    }

    /// Changes element `i` with `f`; false when there is none. Copies the
    /// element's chunk first if a clone of the list shares it.
    pub fn update(&mut self, i: usize, f: impl FnOnce(&mut T)) -> bool {
        let j = self.head + i;
        let full = self.full.len() * Self::CHUNK;
        if j < full {
            f(&mut self.chunk_mut(j / Self::CHUNK)[j % Self::CHUNK]);
            return true;
        }
        let Some(mut item) = self.tail.get(j - full) else {
            return false;
        };
        f(&mut item);
        self.tail.put(j - full, item);
        true
    }

    /// Chunk `k`, the list's own: copied first (into the file if it has
    /// one) when a clone shares it.
    fn chunk_mut(&mut self, k: usize) -> &mut [T] {
        let shared = match &mut self.full[k] {
            Chunk::Heap(v) => Arc::get_mut(v).is_none(),
            Chunk::File(b) => Arc::get_mut(b).is_none(),
        };
        if shared {
            let items: Vec<T> = self.full[k].to_vec();
            self.full[k] = self.chunk_of(items);
        }
        match &mut self.full[k] {
            Chunk::Heap(v) => Arc::get_mut(v).expect("unshared above"),
            Chunk::File(b) => Arc::get_mut(b).expect("unshared above").as_mut_slice(),
        }
    }

    /// A full chunk holding `items`: in the file when the list has one
    /// and it has room, else on the heap.
    fn chunk_of(&self, items: Vec<T>) -> Chunk<T> {
        match self.file.as_ref().and_then(|f| f.store(&items)) {
            Some(block) => Chunk::File(Arc::new(block)),
            None => Chunk::Heap(Arc::new(items)),
        }
    }

    /// The file full chunks go to, if any.
    pub fn file(&self) -> Option<&Arc<Arena>> {
        self.file.as_ref()
    }

    /// Keeps full chunks in `file` from now on, and moves those on the
    /// heap there now (each that it has room for).
    pub fn use_file(&mut self, file: &Arc<Arena>) {
        self.file = Some(file.clone());
        for k in 0..self.full.len() {
            if let Chunk::Heap(v) = &self.full[k] {
                if let Some(block) = file.store(v) {
                    self.full[k] = Chunk::File(Arc::new(block));
                }
            }
        }
    }

    /// Appends, growing the tail by a quarter at a time (as the state's
    /// other lists do); a full tail becomes a shared chunk.
    pub fn push(&mut self, item: T) {
        self.tail.put(self.tail.len(), item);
        if self.tail.len() == Self::CHUNK {
            let items = self.tail.take_all();
            let chunk = self.chunk_of(items);
            self.full.push(chunk);
        }
    }

    /// Drops the first `n` elements (all, if fewer) and returns them.
    /// Whole chunks are released; the first keeps its dropped front until
    /// it goes too.
    pub fn remove_front(&mut self, n: usize) -> Vec<T> {
        let n = n.min(self.len());
        let gone: Vec<T> = self.iter().take(n).collect();
        self.head += n;
        let whole = (self.head / Self::CHUNK).min(self.full.len());
        self.full.drain(..whole);
        self.head -= whole * Self::CHUNK;
        if self.full.is_empty() {
            // What is left of the front is in the tail.
            self.tail.drain_front(self.head);
            self.head = 0;
        }
        gone
    }

    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        self.full
            .iter()
            .flat_map(|c| c.iter().copied())
            .skip(self.head)
            .chain(self.tail.iter())
    }

    /// The elements from the `i`th on, reaching the `i`th without walking
    /// those before it.
    pub fn iter_from(&self, i: usize) -> impl Iterator<Item = T> + '_ {
        let j = self.head + i;
        let k = (j / Self::CHUNK).min(self.full.len());
        self.full[k..]
            .iter()
            .flat_map(|c| c.iter().copied())
            .chain(self.tail.iter())
            .skip(j - k * Self::CHUNK)
    }

    /// Changes every element (copying every shared chunk).
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&mut T)) {
        let head = self.head;
        for k in 0..self.full.len() {
            let skip = if k == 0 { head } else { 0 };
            self.chunk_mut(k).iter_mut().skip(skip).for_each(&mut f);
        }
        self.tail.for_each_mut(f);
    }

    /// Binary search over elements sorted by `key`, as
    /// [`slice::binary_search_by_key`].
    pub fn binary_search_by_key<K: Ord>(
        &self,
        key: &K,
        f: impl Fn(&T) -> K,
    ) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let here = f(&self.get(mid).expect("mid is below len"));
            match here.cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// Bytes of elements on the heap, in use and allocated: the heap
    /// chunks' (a first chunk's dropped front counted in both) and the
    /// tail's (its header included).
    pub fn heap_bytes(&self) -> (usize, usize) {
        let chunks = self.heap_chunks() * Self::CHUNK * size_of::<T>();
        (
            chunks + self.tail.bytes.len(),
            chunks + self.tail.bytes.capacity(),
        )
    }

    fn heap_chunks(&self) -> usize {
        self.full
            .iter()
            .filter(|c| matches!(c, Chunk::Heap(_)))
            .count()
    }

    /// Elements in chunks in the file (a first chunk's dropped front left
    /// out), and the bytes of file pages those chunks hold.
    pub fn in_file(&self) -> (usize, usize) {
        let mut out = (0, 0);
        for (k, c) in self.full.iter().enumerate() {
            if let Chunk::File(b) = c {
                out.0 += Self::CHUNK - if k == 0 { self.head } else { 0 };
                out.1 += b.page_bytes();
            }
        }
        out
    }

    /// Bytes of the list besides its elements on the heap: a pointer per
    /// full chunk, a count block per heap chunk and a block handle per
    /// file chunk.
    pub fn overhead_bytes(&self) -> usize {
        let heap = self.heap_chunks();
        self.full.capacity() * size_of::<Chunk<T>>()
            + heap * (size_of::<Vec<T>>() + 2 * size_of::<usize>())
            + (self.full.len() - heap) * (size_of::<Block<T>>() + 2 * size_of::<usize>())
    }
}

impl<T: Pack + PartialEq> PartialEq for ChunkedVec<T> {
    /// Equal elements, however they are chunked.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: Pack + Eq> Eq for ChunkedVec<T> {}

impl<T: Pack + std::fmt::Debug> std::fmt::Debug for ChunkedVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: usize = ChunkedVec::<u64>::CHUNK;

    fn filled(n: usize) -> ChunkedVec<u64> {
        let mut v = ChunkedVec::default();
        for i in 0..n {
            v.push(i as u64);
        }
        v
    }

    #[test]
    fn a_chunked_list_answers_as_a_vec_does_across_chunk_edges_and_front_removals() {
        let mut v = filled(3 * CHUNK + 17);
        let mut model: Vec<u64> = (0..(3 * CHUNK + 17) as u64).collect();
        for cut in [0, 1, CHUNK - 1, 2, CHUNK, 5] {
            let gone = v.remove_front(cut);
            let expected: Vec<u64> = model.drain(..cut).collect();
            assert_eq!(gone, expected);
            assert_eq!(v.len(), model.len());
            assert!(v.iter().eq(model.iter().copied()));
            for (i, x) in model.iter().enumerate() {
                assert_eq!(v.get(i), Some(*x));
            }
            assert_eq!(v.get(model.len()), None);
            for from in [
                0,
                1,
                CHUNK - 1,
                CHUNK,
                model.len() / 2,
                model.len(),
                model.len() + 3,
            ] {
                assert!(
                    v.iter_from(from).eq(model.iter().skip(from).copied()),
                    "from {from}"
                );
            }
            for probe in [0, 7, CHUNK as u64 + 3, 4 * CHUNK as u64] {
                assert_eq!(
                    v.binary_search_by_key(&probe, |x| *x),
                    model.binary_search(&probe)
                );
            }
            v.push(10_000 + cut as u64);
            model.push(10_000 + cut as u64);
        }
        let gone = v.remove_front(usize::MAX);
        assert_eq!(gone, model);
        assert!(v.is_empty() && v.iter().next().is_none());
        v.push(1);
        assert_eq!(v.get(0), Some(1));
    }

    #[test]
    fn a_clone_shares_its_chunks_and_a_write_copies_only_the_chunk_it_touches() {
        let v = filled(4 * CHUNK);
        let mut w = v.clone();
        assert!(w.update(CHUNK + 5, |x| *x = 99));
        w.push(7);
        let shared = v
            .full
            .iter()
            .zip(&w.full)
            .filter(|(a, b)| std::ptr::eq(a.as_ptr(), b.as_ptr()))
            .count();
        assert_eq!(shared, 3, "only the written chunk was copied");
        assert_eq!(
            v.get(CHUNK + 5),
            Some(CHUNK as u64 + 5),
            "the clone kept its own"
        );
        assert_eq!(w.get(CHUNK + 5), Some(99));
        assert_ne!(v, w);
        let mut plus_one = v.clone();
        plus_one.for_each_mut(|x| *x += 1);
        assert!(plus_one.iter().zip(v.iter()).all(|(a, b)| a == b + 1));
        let mut rebuilt = filled(4 * CHUNK + 1);
        rebuilt.remove_front(1);
        let mut shifted = ChunkedVec::default();
        for i in 1..=4 * CHUNK as u64 {
            shifted.push(i);
        }
        assert_eq!(rebuilt, shifted, "equality is by elements, not chunks");
    }

    #[test]
    fn the_tail_grows_by_a_quarter_and_a_full_tail_becomes_an_exact_chunk() {
        let v = filled(CHUNK + 100);
        assert_eq!(v.full.len(), 1);
        assert!(matches!(&v.full[0], Chunk::Heap(c) if c.capacity() == CHUNK));
        let tail = (v.tail.bytes.capacity() - Tail::<u64>::HEADER) / 4;
        assert!((100..=125).contains(&tail), "tail capacity {tail}");
        assert_eq!(filled(3).overhead_bytes(), 0, "a short list is a Vec");
    }

    #[test]
    fn a_tail_packs_until_an_element_does_not_fit_then_holds_every_element_at_full_width() {
        let mut v = ChunkedVec::<u64>::default();
        for x in [1_000, 1_007, 2_000] {
            v.push(x);
        }
        assert_eq!(v.tail.width(), 4, "within 2^32 of the first");
        assert!(v.update(1, |x| *x = 999), "below the base");
        assert_eq!(v.tail.width(), 8);
        v.push(u64::MAX);
        assert!(v.iter().eq([1_000, 999, 2_000, u64::MAX]));
        // A full tail becomes a chunk and the next tail packs again.
        for i in 4..CHUNK as u64 {
            v.push(i);
        }
        assert_eq!(v.full.len(), 1);
        v.push(5);
        assert_eq!(v.tail.width(), 4);
        assert_eq!(v.get(CHUNK), Some(5));
        assert_eq!(v.get(1), Some(999));
        // Dropping the front of a tail keeps its base.
        let mut short = ChunkedVec::<u64>::default();
        for x in [10, 20, 30] {
            short.push(x);
        }
        assert_eq!(short.remove_front(2), vec![10, 20]);
        assert!(short.iter().eq([30]));
        short.push(11);
        assert!(short.iter().eq([30, 11]));
    }

    #[test]
    fn a_list_in_the_file_answers_as_on_the_heap_and_shares_and_copies_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let arena = Arena::open(dir.path()).unwrap();
        let mut v = filled(2 * CHUNK + 5);
        v.use_file(&arena);
        assert_eq!(v.in_file(), (2 * CHUNK, 2 * PAGE), "the heap chunks moved");
        for i in 2 * CHUNK as u64 + 5..4 * CHUNK as u64 + 9 {
            v.push(i);
        }
        assert_eq!(
            v.in_file(),
            (4 * CHUNK, 4 * PAGE),
            "new full chunks go there too"
        );
        assert_eq!(
            v.heap_bytes().1,
            v.tail.bytes.capacity(),
            "only the tail is on the heap"
        );
        assert_eq!(v, filled(4 * CHUNK + 9));
        assert_eq!(arena.block_bytes(), 4 * PAGE as u64);

        // Written in place while the list owns the chunk.
        assert!(v.update(3, |x| *x = 1_000_003));
        assert_eq!(arena.block_bytes(), 4 * PAGE as u64, "no copy");
        // Copied, into the file, while a clone shares it.
        let kept = v.clone();
        assert!(v.update(CHUNK + 1, |x| *x = 77));
        assert_eq!(kept.get(CHUNK + 1), Some(CHUNK as u64 + 1));
        assert_eq!(v.get(CHUNK + 1), Some(77));
        assert_eq!(arena.block_bytes(), 5 * PAGE as u64, "one chunk copied");
        drop(kept);
        assert_eq!(
            arena.block_bytes(),
            4 * PAGE as u64,
            "the clone's copy went with it"
        );
        v.remove_front(CHUNK + 2);
        assert_eq!(
            arena.block_bytes(),
            3 * PAGE as u64,
            "a dropped chunk's page goes"
        );
        assert_eq!(
            v.in_file(),
            (3 * CHUNK - 2, 3 * PAGE),
            "the dropped front is not counted"
        );
        let mut model: Vec<u64> = (0..4 * CHUNK as u64 + 9).collect();
        model[3] = 1_000_003;
        model[CHUNK + 1] = 77;
        model.drain(..CHUNK + 2);
        assert!(v.iter().eq(model.iter().copied()));
        assert_eq!(
            v.binary_search_by_key(&(3 * CHUNK as u64), |x| *x),
            model.binary_search(&(3 * CHUNK as u64))
        );
        drop(v);
        assert_eq!(arena.block_bytes(), 0);
    }
}
