//! A list kept in shared chunks, for a conversation's message metadata.
//!
//! A checkpoint shares the state with the thread that writes its file
//! (`Arc`s all the way down), and the first change to a conversation while
//! the file is written copies what it shares. A conversation's message
//! list grows for as long as its history is kept: with one `Vec`, a send to
//! a group with 500,000 retained messages copied 16 MB on the sequencer
//! thread, stalling every command of its round. Here a copy is one pointer
//! per [`CHUNK`] elements, and a write copies only the chunk it touches.

use std::sync::Arc;

/// Elements per chunk: a copy of a full chunk of message metadata is
/// 32 KiB, and the list of chunks is 1/1024 of the elements.
pub(crate) const CHUNK: usize = 1024;

#[derive(Clone)]
pub(crate) struct ChunkedVec<T> {
    /// Full chunks of [`CHUNK`] elements each (the first counting those
    /// dropped from its front), shared with every clone.
    full: Vec<Arc<Vec<T>>>,
    /// The newest elements, fewer than [`CHUNK`], the list's own: a clone
    /// copies them. A short list is this alone, as compact as a `Vec`.
    tail: Vec<T>,
    /// Elements dropped from the front of the first full chunk.
    head: usize,
}

impl<T> Default for ChunkedVec<T> {
    fn default() -> Self {
        Self {
            full: Vec::new(),
            tail: Vec::new(),
            head: 0,
        }
    }
}

impl<T: Clone> ChunkedVec<T> {
    pub fn len(&self) -> usize {
        self.full.len() * CHUNK - self.head + self.tail.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<&T> {
        let j = self.head + i;
        match self.full.get(j / CHUNK) {
            Some(chunk) => chunk.get(j % CHUNK),
            None => self.tail.get(j - self.full.len() * CHUNK),
        }
    }

    /// Copies the element's chunk first if a clone of the list shares it.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        let j = self.head + i;
        let full = self.full.len() * CHUNK;
        if j < full {
            Arc::make_mut(&mut self.full[j / CHUNK]).get_mut(j % CHUNK)
        } else {
            self.tail.get_mut(j - full)
        }
    }

    /// Appends, growing the tail by a quarter at a time (as the state's
    /// other lists do); a full tail becomes a shared chunk.
    pub fn push(&mut self, item: T) {
        if self.tail.len() == self.tail.capacity() {
            let room = CHUNK - self.tail.len();
            self.tail
                .reserve_exact((self.tail.len() / 4).max(4).min(room));
        }
        self.tail.push(item);
        if self.tail.len() == CHUNK {
            self.full.push(Arc::new(std::mem::take(&mut self.tail)));
        }
    }

    /// Drops the first `n` elements (all, if fewer) and returns them.
    /// Whole chunks are released; the first keeps its dropped front until
    /// it goes too.
    pub fn remove_front(&mut self, n: usize) -> Vec<T> {
        let n = n.min(self.len());
        let gone: Vec<T> = self.iter().take(n).cloned().collect();
        self.head += n;
        let whole = (self.head / CHUNK).min(self.full.len());
        self.full.drain(..whole);
        self.head -= whole * CHUNK;
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

    /// Changes every element (copying every shared chunk).
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&mut T)) {
        let head = self.head;
        for (i, chunk) in self.full.iter_mut().enumerate() {
            let skip = if i == 0 { head } else { 0 };
            Arc::make_mut(chunk).iter_mut().skip(skip).for_each(&mut f);
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

    /// Elements the list has room for, a first chunk's dropped front
    /// included.
    pub fn capacity(&self) -> usize {
        self.full.len() * CHUNK + self.tail.capacity()
    }

    /// Bytes of the list besides its elements: a pointer and a count
    /// block per full chunk.
    pub fn overhead_bytes(&self) -> usize {
        self.full.capacity() * size_of::<Arc<Vec<T>>>()
            + self.full.len() * (size_of::<Vec<T>>() + 2 * size_of::<usize>())
    }
}

impl<T: Clone + PartialEq> PartialEq for ChunkedVec<T> {
    /// Equal elements, however they are chunked.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: Clone + Eq> Eq for ChunkedVec<T> {}

impl<T: Clone + std::fmt::Debug> std::fmt::Debug for ChunkedVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            .filter(|(a, b)| Arc::ptr_eq(a, b))
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
        assert_eq!(v.full[0].capacity(), CHUNK);
        let tail = v.tail.capacity();
        assert!((100..=125).contains(&tail), "tail capacity {tail}");
        assert_eq!(filled(3).overhead_bytes(), 0, "a short list is a Vec");
    }
}
