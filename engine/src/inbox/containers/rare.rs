//! [`Rare`]: a field most rows leave empty, kept out of line.
//!
//! Every user and every conversation is an allocation of its own for as
//! long as it exists, and the allocator rounds each up to a size class. A
//! user's snapshots and a conversation's edits are empty in almost every
//! row, yet inline each cost a `BTreeMap`'s 24 bytes in all of them. Here
//! an empty one costs a pointer, and reading it sees a shared empty value:
//! nothing is allocated until the first write.
//!
//! A write says which it is. [`Rare::make_mut`] allocates (an insert);
//! [`Rare::written`] does not, and finds nothing on a field never written
//! (a removal). There is no `DerefMut`, so no write allocates unasked.

use std::fmt;
use std::ops::Deref;

/// A value that is empty (`T::default()`) in most rows: no allocation
/// until written. Reads, equality and `Debug` see the value it stands
/// for, so a row with an empty box equals one without.
#[derive(Clone, Default)]
pub(crate) struct Rare<T: Empty>(Option<Box<T>>);

/// A type with a shared, immutable empty value for [`Rare`] to show.
pub(crate) trait Empty: Default + PartialEq + 'static {
    fn empty() -> &'static Self;
}

impl<T: Empty> Rare<T> {
    /// Whether a value is allocated.
    pub fn is_allocated(&self) -> bool {
        self.0.is_some()
    }

    /// The bytes of the box, if there is one (for the memory report; what
    /// the value holds besides is its own to count).
    pub fn boxed_bytes(&self) -> u64 {
        if self.is_allocated() {
            std::mem::size_of::<T>() as u64
        } else {
            0
        }
    }

    /// The value to change, allocated on the first call: for a write that
    /// adds. A value written back to empty keeps its box until the field is
    /// set anew from a value ([`From`] stores an empty one as nothing).
    pub fn make_mut(&mut self) -> &mut T {
        self.0.get_or_insert_with(Box::default)
    }

    /// The value to change, if one was ever written: for a change that
    /// has nothing to do on an empty value (a removal), so that it does
    /// not allocate one.
    pub fn written(&mut self) -> Option<&mut T> {
        self.0.as_deref_mut()
    }
}

/// An empty value allocates nothing.
impl<T: Empty> From<T> for Rare<T> {
    fn from(value: T) -> Self {
        if value == *T::empty() {
            Self(None)
        } else {
            Self(Some(Box::new(value)))
        }
    }
}

impl<T: Empty> Deref for Rare<T> {
    type Target = T;
    fn deref(&self) -> &T {
        match &self.0 {
            Some(value) => value,
            None => T::empty(),
        }
    }
}

impl<T: Empty> PartialEq for Rare<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Empty + Eq> Eq for Rare<T> {}

impl<T: Empty + fmt::Debug> fmt::Debug for Rare<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::MsgSeq;

    type Edits = BTreeMap<MsgSeq, Vec<MsgSeq>>;

    #[test]
    fn an_unwritten_value_reads_empty_allocates_nothing_and_equals_an_empty_one() {
        let mut none: Rare<Edits> = Rare::default();
        assert!(none.is_empty());
        assert!(!none.is_allocated());
        assert!(
            none.written().is_none(),
            "a removal finds nothing to change"
        );
        assert!(!none.is_allocated());
        assert!(!Rare::from(Edits::new()).is_allocated());
        assert_eq!(none.boxed_bytes(), 0);
        let mut emptied: Rare<Edits> = Rare::default();
        emptied.make_mut().insert(MsgSeq(1), vec![MsgSeq(2)]);
        emptied.written().expect("written").remove(&MsgSeq(1));
        assert!(emptied.is_allocated(), "a box emptied by a write stays");
        assert_eq!(emptied.boxed_bytes(), 24);
        assert_eq!(none, emptied);
        assert_eq!(format!("{none:?}"), "{}");
        none.make_mut().insert(MsgSeq(1), vec![MsgSeq(2)]);
        assert!(none.is_allocated());
        assert_ne!(none, emptied);
        assert_eq!(none.get(&MsgSeq(1)), Some(&vec![MsgSeq(2)]));
    }

    #[test]
    fn a_rare_field_is_one_pointer() {
        assert_eq!(std::mem::size_of::<Rare<Edits>>(), 8);
    }
}
