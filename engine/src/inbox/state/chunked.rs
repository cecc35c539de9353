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

use std::ops::Deref;
use std::sync::Arc;

use super::spill::{Arena, Block, Plain, PAGE};

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
pub(crate) struct ChunkedVec<T: Plain> {
    /// Full chunks of [`Self::CHUNK`] elements each (the first counting
    /// those dropped from its front), shared with every clone.
    full: Vec<Chunk<T>>,
    /// The newest elements, fewer than a chunk, the list's own: a clone
    /// copies them. A short list is this alone, as compact as a `Vec`.
    tail: Vec<T>,
    /// Elements dropped from the front of the first full chunk.
    head: usize,
    /// Where full chunks go; on the heap without one.
    file: Option<Arc<Arena>>,
}

impl<T: Plain> Default for ChunkedVec<T> {
    fn default() -> Self {
        Self {
            full: Vec::new(),
            tail: Vec::new(),
            head: 0,
            file: None,
        }
    }
}

impl<T: Plain> ChunkedVec<T> {
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

    pub fn get(&self, i: usize) -> Option<&T> {
        let j = self.head + i;
        match self.full.get(j / Self::CHUNK) {
            Some(chunk) => chunk.get(j % Self::CHUNK),
            None => self.tail.get(j - self.full.len() * Self::CHUNK),
        }
    }

    /// Copies the element's chunk first if a clone of the list shares it.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        let j = self.head + i;
        let full = self.full.len() * Self::CHUNK;
        if j < full {
            self.chunk_mut(j / Self::CHUNK).get_mut(j % Self::CHUNK)
        } else {
            self.tail.get_mut(j - full)
        }
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
        if self.tail.len() == self.tail.capacity() {
            let len = self.tail.len();
            let want = len + (len / 4).max(4);
            let capacity = super::fitted_capacity(len, want, std::mem::size_of::<T>());
            self.tail.reserve_exact(capacity.min(Self::CHUNK) - len);
        }
        self.tail.push(item);
        if self.tail.len() == Self::CHUNK {
            let items = std::mem::take(&mut self.tail);
            let chunk = self.chunk_of(items);
            self.full.push(chunk);
        }
    }

    /// Drops the first `n` elements (all, if fewer) and returns them.
    /// Whole chunks are released; the first keeps its dropped front until
    /// it goes too.
    pub fn remove_front(&mut self, n: usize) -> Vec<T> {
        let n = n.min(self.len());
        let gone: Vec<T> = self.iter().take(n).copied().collect();
        self.head += n;
        let whole = (self.head / Self::CHUNK).min(self.full.len());
        self.full.drain(..whole);
        self.head -= whole * Self::CHUNK;
        if self.full.is_empty() {
            // What is left of the front is in the tail.
            self.tail.drain(..self.head);
            self.head = 0;
        }
        gone
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.full
            .iter()
            .flat_map(|c| c.iter())
            .skip(self.head)
            .chain(self.tail.iter())
    }

    /// The elements from the `i`th on, reaching the `i`th without walking
    /// those before it.
    pub fn iter_from(&self, i: usize) -> impl Iterator<Item = &T> + '_ {
        let j = self.head + i;
        let k = (j / Self::CHUNK).min(self.full.len());
        self.full[k..]
            .iter()
            .flat_map(|c| c.iter())
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
        self.tail.iter_mut().for_each(f);
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
            let here = f(self.get(mid).expect("mid is below len"));
            match here.cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// Elements the list has room for on the heap, a first chunk's
    /// dropped front included.
    pub fn capacity(&self) -> usize {
        self.heap_chunks() * Self::CHUNK + self.tail.capacity()
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

impl<T: Plain + PartialEq> PartialEq for ChunkedVec<T> {
    /// Equal elements, however they are chunked.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: Plain + Eq> Eq for ChunkedVec<T> {}

impl<T: Plain + std::fmt::Debug> std::fmt::Debug for ChunkedVec<T> {
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
            assert!(v.iter().eq(model.iter()));
            for (i, x) in model.iter().enumerate() {
                assert_eq!(v.get(i), Some(x));
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
                assert!(v.iter_from(from).eq(model.iter().skip(from)), "from {from}");
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
        assert_eq!(v.get(0), Some(&1));
    }

    #[test]
    fn a_clone_shares_its_chunks_and_a_write_copies_only_the_chunk_it_touches() {
        let v = filled(4 * CHUNK);
        let mut w = v.clone();
        *w.get_mut(CHUNK + 5).unwrap() = 99;
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
            Some(&(CHUNK as u64 + 5)),
            "the clone kept its own"
        );
        assert_eq!(w.get(CHUNK + 5), Some(&99));
        assert_ne!(v, w);
        let mut plus_one = v.clone();
        plus_one.for_each_mut(|x| *x += 1);
        assert!(plus_one.iter().zip(v.iter()).all(|(a, b)| *a == b + 1));
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
        let tail = v.tail.capacity();
        assert!((100..=125).contains(&tail), "tail capacity {tail}");
        assert_eq!(filled(3).overhead_bytes(), 0, "a short list is a Vec");
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
            v.capacity(),
            v.tail.capacity(),
            "only the tail is on the heap"
        );
        assert_eq!(v, filled(4 * CHUNK + 9));
        assert_eq!(arena.block_bytes(), 4 * PAGE as u64);

        // Written in place while the list owns the chunk.
        *v.get_mut(3).unwrap() = 1_000_003;
        assert_eq!(arena.block_bytes(), 4 * PAGE as u64, "no copy");
        // Copied, into the file, while a clone shares it.
        let kept = v.clone();
        *v.get_mut(CHUNK + 1).unwrap() = 77;
        assert_eq!(kept.get(CHUNK + 1), Some(&(CHUNK as u64 + 1)));
        assert_eq!(v.get(CHUNK + 1), Some(&77));
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
        assert!(v.iter().eq(model.iter()));
        assert_eq!(
            v.binary_search_by_key(&(3 * CHUNK as u64), |x| *x),
            model.binary_search(&(3 * CHUNK as u64))
        );
        drop(v);
        assert_eq!(arena.block_bytes(), 0);
    }
}
