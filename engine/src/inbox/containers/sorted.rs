//! A map and a set kept in sorted vectors: the shape of a user's
//! conversation rows and of their order by activity.
//!
//! Most users are in a handful of conversations, and every one of them is
//! a row in memory for as long as the user is in it. A `HashMap` of two
//! rows allocates four slots and a control group, and a `BTreeSet` of two
//! keys a whole node of eleven: about 415 bytes per row together, against
//! the row's 104. Here a row costs its own bytes, and a vector grows by an
//! eighth (at least one) when it is full, so the slack is at most an
//! eighth once a user has eight or more.
//!
//! Lookups are binary searches. An insert moves the entries after its
//! place. Rows are inserted when a user joins a conversation, which is
//! rare next to messages. The order's keys move on every message, but a
//! message mostly goes to a conversation that was active not long ago, so
//! its old key is near the end and few keys move. A message to a quiet
//! conversation moves every key after it, so the order becomes a B-tree
//! above 1,024 keys, where that would cost more than the tree's slack.

use std::collections::BTreeSet;

use crate::prefetch::prefetch;

/// Grows `v` to hold one more entry: by an eighth of its length, at least
/// one.
fn reserve_one<T>(v: &mut Vec<T>) {
    super::grow_for_one(v, 8, 1);
}

/// A map as a sorted vector of keys and a vector of their values, in the
/// same order. The keys are apart from the values so that a search reads
/// a line or two of keys, not one value's line per step: a user's rows
/// are rarely in the cache, and each step of a search through 104-byte
/// rows was a cache miss.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SortedMap<K, V> {
    keys: Vec<K>,
    values: Vec<V>,
}

impl<K, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        SortedMap {
            keys: Vec::new(),
            values: Vec::new(),
        }
    }
}

impl<K: Ord + Copy, V> SortedMap<K, V> {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Starts loading what a lookup reads first: the keys' first and
    /// middle lines, and the values' first line ([`prefetch`]).
    pub fn prefetch(&self) {
        prefetch(self.keys.as_ptr());
        prefetch(self.keys.as_ptr().wrapping_add(self.keys.len() / 2));
        prefetch(self.values.as_ptr());
    }

    /// Starts loading `key`'s value, found by a search of the keys (which
    /// [`Self::prefetch`] has started loading): its first and last line.
    pub fn prefetch_value(&self, key: &K) {
        if let Ok(i) = self.keys.binary_search(key) {
            let value = self.values.as_ptr().wrapping_add(i);
            prefetch(value);
            prefetch(value.cast::<u8>().wrapping_add(size_of::<V>() - 1));
        }
    }

    /// Entries the vectors hold room for.
    pub fn capacity(&self) -> usize {
        self.keys.capacity().min(self.values.capacity())
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.keys.binary_search(key).ok().map(|i| &self.values[i])
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        match self.keys.binary_search(key) {
            Ok(i) => Some(&mut self.values[i]),
            Err(_) => None,
        }
    }

    fn insert_at(&mut self, i: usize, key: K, value: V) {
        reserve_one(&mut self.keys);
        reserve_one(&mut self.values);
        self.keys.insert(i, key);
        self.values.insert(i, value);
    }

    /// Sets `key` to `value`; the value it replaced, if any.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.keys.binary_search(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.values[i], value)),
            Err(i) => {
                self.insert_at(i, key, value);
                None
            }
        }
    }

    /// The value of `key`, inserted as its default when missing.
    pub fn get_or_default(&mut self, key: K) -> &mut V
    where
        V: Default,
    {
        let i = match self.keys.binary_search(&key) {
            Ok(i) => i,
            Err(i) => {
                self.insert_at(i, key, V::default());
                i
            }
        };
        &mut self.values[i]
    }

    pub fn values(&self) -> std::slice::Iter<'_, V> {
        self.values.iter()
    }
}

impl<'a, K: Ord + Copy, V> IntoIterator for &'a SortedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Zip<std::slice::Iter<'a, K>, std::slice::Iter<'a, V>>;

    fn into_iter(self) -> Self::IntoIter {
        self.keys.iter().zip(self.values.iter())
    }
}

/// Above this many keys a set is a B-tree: re-keying a quiet entry of a
/// vector moves every key after it, which at 1,024 keys of 24 bytes is
/// 24 KiB, about a microsecond; a user in many more conversations than
/// that (a service account, say) would pay it on every message.
const VECTOR_KEYS_MAX: usize = 1024;

/// A set as one sorted vector, or a B-tree once it holds more than
/// [`VECTOR_KEYS_MAX`] keys. The tree is boxed, as few sets become one:
/// the set is then a vector's 24 bytes (the box fits the vector's unused
/// capacity values), not 32, in every user.
#[derive(Clone, Debug)]
pub(crate) enum SortedSet<K> {
    Vector(Vec<K>),
    // The box is the point: the set's size, not the tree's storage.
    #[allow(clippy::box_collection)]
    Tree(Box<BTreeSet<K>>),
}

impl<K> Default for SortedSet<K> {
    fn default() -> Self {
        SortedSet::Vector(Vec::new())
    }
}

/// Equal when they hold the same keys, whatever their shape.
impl<K: Ord + Copy> PartialEq for SortedSet<K> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<K: Ord + Copy> Eq for SortedSet<K> {}

impl<K: Ord + Copy> SortedSet<K> {
    /// Starts loading what a [`Self::replace`] of a recent key reads: the
    /// middle of the vector, where its search starts, and its end, where
    /// the newest keys are ([`prefetch`]). A tree is left alone.
    pub fn prefetch(&self) {
        if let SortedSet::Vector(keys) = self {
            prefetch(keys.as_ptr().wrapping_add(keys.len() / 2));
            prefetch(keys.as_ptr().wrapping_add(keys.len().saturating_sub(1)));
        }
    }

    pub fn len(&self) -> usize {
        match self {
            SortedSet::Vector(keys) => keys.len(),
            SortedSet::Tree(keys) => keys.len(),
        }
    }

    /// Keys the vector holds room for; `None` once the set is a tree.
    pub fn vector_capacity(&self) -> Option<usize> {
        match self {
            SortedSet::Vector(keys) => Some(keys.capacity()),
            SortedSet::Tree(_) => None,
        }
    }

    /// Adds `key`; false if it was there already.
    pub fn insert(&mut self, key: K) -> bool {
        let keys = match self {
            SortedSet::Tree(keys) => return keys.insert(key),
            SortedSet::Vector(keys) => keys,
        };
        // New keys are mostly the greatest (the newest activity), so look
        // at the end before searching.
        let at = match keys.last() {
            None => 0,
            Some(last) if *last < key => keys.len(),
            Some(_) => match keys.binary_search(&key) {
                Ok(_) => return false,
                Err(i) => i,
            },
        };
        if keys.len() == VECTOR_KEYS_MAX {
            let mut tree: BTreeSet<K> = keys.drain(..).collect();
            tree.insert(key);
            *self = SortedSet::Tree(Box::new(tree));
            return true;
        }
        reserve_one(keys);
        keys.insert(at, key);
        true
    }

    /// Replaces `old` by `new` (`new` alone is inserted when `old` is
    /// missing). In a vector only the keys between their places move. No
    /// other key may equal `new`.
    pub fn replace(&mut self, old: &K, new: K) {
        let keys = match self {
            SortedSet::Tree(keys) => {
                keys.remove(old);
                keys.insert(new);
                return;
            }
            SortedSet::Vector(keys) => keys,
        };
        let Ok(i) = keys.binary_search(old) else {
            self.insert(new);
            return;
        };
        let j = keys.partition_point(|k| k < &new);
        debug_assert!(j == i || keys.get(j) != Some(&new), "a key twice");
        if j > i {
            keys[i..j].rotate_left(1);
            keys[j - 1] = new;
        } else {
            keys[j..=i].rotate_right(1);
            keys[j] = new;
        }
    }

    /// The keys below `end` (every key when `None`), in order.
    pub fn below(&self, end: Option<&K>) -> Keys<'_, K> {
        match (self, end) {
            (SortedSet::Vector(keys), None) => Keys::Vector(keys.iter()),
            (SortedSet::Vector(keys), Some(end)) => {
                Keys::Vector(keys[..keys.partition_point(|k| k < end)].iter())
            }
            (SortedSet::Tree(keys), None) => Keys::Tree(keys.range(..)),
            (SortedSet::Tree(keys), Some(end)) => Keys::Tree(keys.range(..*end)),
        }
    }

    /// Every key, in order.
    pub fn iter(&self) -> Keys<'_, K> {
        self.below(None)
    }
}

/// Keys of a [`SortedSet`] in order, from either end.
pub(crate) enum Keys<'a, K> {
    Vector(std::slice::Iter<'a, K>),
    Tree(std::collections::btree_set::Range<'a, K>),
}

impl<'a, K> Iterator for Keys<'a, K> {
    type Item = &'a K;

    fn next(&mut self) -> Option<&'a K> {
        match self {
            Keys::Vector(it) => it.next(),
            Keys::Tree(it) => it.next(),
        }
    }
}

impl<K> DoubleEndedIterator for Keys<'_, K> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Keys::Vector(it) => it.next_back(),
            Keys::Tree(it) => it.next_back(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn a_sorted_map_answers_as_a_btree_map_does_through_inserts_and_updates() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut map: SortedMap<u64, u64> = SortedMap::default();
        let mut model = BTreeMap::new();
        for step in 0..20_000u64 {
            let key = rng.gen_range(0..300);
            match rng.gen_range(0..5) {
                0 => assert_eq!(map.get(&key), model.get(&key)),
                1 => {
                    *map.get_or_default(key) += step;
                    *model.entry(key).or_default() += step;
                }
                2 => {
                    if let Some(v) = map.get_mut(&key) {
                        *v += 1;
                    }
                    if let Some(v) = model.get_mut(&key) {
                        *v += 1;
                    }
                }
                _ => assert_eq!(map.insert(key, step), model.insert(key, step)),
            }
            assert_eq!(map.len(), model.len());
            assert_eq!(map.get(&key), model.get(&key));
        }
        assert!((&map).into_iter().eq(model.iter()));
        assert!(map.values().eq(model.values()));
    }

    #[test]
    fn a_sorted_set_answers_as_a_btree_set_does_through_inserts_and_replacements() {
        let mut rng = StdRng::seed_from_u64(11);
        let mut set: SortedSet<(u64, u64)> = SortedSet::default();
        let mut model = BTreeSet::new();
        let mut clock = 0;
        for _ in 0..6_000 {
            // Mostly the newest key, as a conversation list's order sees.
            let key = if rng.gen_range(0..4) == 0 {
                (rng.gen_range(0..1_000), rng.gen_range(0..3))
            } else {
                clock += 1;
                (clock, 0)
            };
            match rng.gen_range(0..2) {
                0 if !model.contains(&key) => {
                    // Re-key an existing entry, as a new message does.
                    let old = model
                        .iter()
                        .nth(rng.gen_range(0..model.len() as u64 + 1) as usize)
                        .copied();
                    if let Some(old) = old {
                        set.replace(&old, key);
                        model.remove(&old);
                    } else {
                        set.replace(&key, key);
                    }
                    model.insert(key);
                }
                _ => assert_eq!(set.insert(key), model.insert(key)),
            }
            assert_eq!(set.len(), model.len());
            let bound = (rng.gen_range(0..clock + 1), rng.gen_range(0..3));
            let below: Vec<_> = set.below(Some(&bound)).copied().collect();
            let expected: Vec<_> = model.range(..bound).copied().collect();
            assert_eq!(below, expected);
        }
        assert!(set.iter().copied().eq(model.iter().copied()));
        assert!(set.below(None).eq(model.iter()));
        assert!(
            set.vector_capacity().is_none(),
            "the steps above also ran on the tree: {} keys",
            set.len()
        );
    }

    #[test]
    fn a_sorted_set_past_its_vector_limit_is_a_tree_with_the_same_keys() {
        let mut set = SortedSet::default();
        let mut model = BTreeSet::new();
        for k in (0..3 * VECTOR_KEYS_MAX as u64).rev() {
            set.insert((k * 2, 0));
            model.insert((k * 2, 0));
            assert_eq!(
                set.vector_capacity().is_some(),
                set.len() <= VECTOR_KEYS_MAX
            );
        }
        set.replace(&(10, 0), (11, 0));
        model.remove(&(10, 0));
        model.insert((11, 0));
        assert!(set.iter().eq(model.iter()));
        assert!(set
            .below(Some(&(100, 0)))
            .rev()
            .eq(model.range(..(100, 0)).rev()));
        let vector = SortedSet::Vector(model.iter().copied().collect());
        assert_eq!(set, vector, "equal by keys, whatever the shape");
    }

    #[test]
    fn a_few_rows_cost_their_own_bytes_and_many_grow_by_an_eighth_fitted_to_a_size_class() {
        let mut map: SortedMap<u64, [u64; 12]> = SortedMap::default();
        map.insert(1, [0; 12]);
        map.insert(2, [0; 12]);
        assert_eq!(map.capacity(), 2, "two rows take room for two");
        for k in 3..=1_000 {
            map.insert(k, [0; 12]);
            // An eighth more rows, fitted to the allocator's size class:
            // never a larger block than an eighth more would take.
            let eighth_more = (map.len() + map.len() / 8 + 1) * 96;
            assert!(map.capacity() * 96 <= crate::inbox::containers::size_class_of(eighth_more));
        }
        let mut set = SortedSet::default();
        for k in 0..3u64 {
            set.insert(k);
        }
        assert_eq!(set.vector_capacity(), Some(3));
    }
}
