//! A conversation's members and their membership periods, by uid.
//!
//! Most conversations are small and most members have one period, so the
//! map is a vector sorted by uid with one period kept inline: a member
//! costs 40 bytes, and a two-member conversation one allocation. (A
//! `BTreeMap` of `Vec`s took a node of eleven slots and one allocation
//! per member, about 450 bytes for two.) A lookup is a binary search; a
//! join inserts in place, which moves the members after it, as copying
//! the shared map on the first change after a checkpoint already does.

use std::ops::{Deref, DerefMut};

use crate::api::{MsgSeq, Uid};

/// One member's periods, oldest first: one inline, or more in a vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Periods {
    One(Period),
    Many(Vec<Period>),
}

impl Default for Periods {
    fn default() -> Self {
        Periods::Many(Vec::new())
    }
}

impl Periods {
    pub fn push(&mut self, p: Period) {
        match self {
            Periods::Many(v) if v.is_empty() => *self = Periods::One(p),
            Periods::One(first) => *self = Periods::Many(vec![*first, p]),
            Periods::Many(v) => v.push(p),
        }
    }
}

impl From<Vec<Period>> for Periods {
    fn from(v: Vec<Period>) -> Self {
        match v.as_slice() {
            [one] => Periods::One(*one),
            _ => Periods::Many(v),
        }
    }
}

impl Deref for Periods {
    type Target = [Period];
    fn deref(&self) -> &[Period] {
        match self {
            Periods::One(p) => std::slice::from_ref(p),
            Periods::Many(v) => v,
        }
    }
}

impl DerefMut for Periods {
    fn deref_mut(&mut self) -> &mut [Period] {
        match self {
            Periods::One(p) => std::slice::from_mut(p),
            Periods::Many(v) => v,
        }
    }
}

impl<'a> IntoIterator for &'a Periods {
    type Item = &'a Period;
    type IntoIter = std::slice::Iter<'a, Period>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Members by uid, sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Members {
    entries: Vec<(Uid, Periods)>,
}

impl Members {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn find(&self, uid: &Uid) -> Result<usize, usize> {
        self.entries.binary_search_by_key(uid, |(u, _)| *u)
    }

    pub fn get(&self, uid: &Uid) -> Option<&Periods> {
        self.find(uid).ok().map(|i| &self.entries[i].1)
    }

    pub fn get_mut(&mut self, uid: &Uid) -> Option<&mut Periods> {
        self.find(uid).ok().map(|i| &mut self.entries[i].1)
    }

    /// `uid`'s periods, an empty list inserted first if it has none.
    ///
    /// The vector grows by a quarter of its length, at least one entry,
    /// not by doubling: a one-to-one conversation holds two entries, not
    /// the four a first `Vec` allocation makes room for, and a group
    /// wastes at most a fifth of its list.
    pub fn entry_or_default(&mut self, uid: Uid) -> &mut Periods {
        let i = self.find(&uid).unwrap_or_else(|i| {
            super::grow_for_one(&mut self.entries, 4, 1);
            self.entries.insert(i, (uid, Periods::default()));
            i
        });
        &mut self.entries[i].1
    }

    /// Sets `uid`'s periods.
    pub fn insert(&mut self, uid: Uid, periods: Vec<Period>) {
        *self.entry_or_default(uid) = periods.into();
    }

    /// In uid order.
    pub fn iter(&self) -> impl Iterator<Item = (&Uid, &Periods)> {
        self.entries.iter().map(|(u, p)| (u, p))
    }

    pub fn keys(&self) -> impl Iterator<Item = &Uid> {
        self.entries.iter().map(|(u, _)| u)
    }

    pub fn values(&self) -> impl Iterator<Item = &Periods> {
        self.entries.iter().map(|(_, p)| p)
    }

    /// Bytes (live, allocated): the entries, and the periods of members
    /// with more than one.
    pub fn bytes(&self) -> (u64, u64) {
        let entry = std::mem::size_of::<(Uid, Periods)>();
        let spilled = |p: &Periods| match p {
            Periods::One(_) => (0, 0),
            Periods::Many(v) => (
                v.len() * std::mem::size_of::<Period>(),
                v.capacity() * std::mem::size_of::<Period>(),
            ),
        };
        let (live, allocated) = self
            .values()
            .map(spilled)
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
        (
            (self.entries.len() * entry + live) as u64,
            (self.entries.capacity() * entry + allocated) as u64,
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Period {
    pub period_id: u32,
    pub join_seq: MsgSeq,
    /// `state::OPEN` while a member.
    pub leave_seq: MsgSeq,
}

impl Period {
    pub fn covers(&self, seq: MsgSeq) -> bool {
        self.join_seq <= seq && seq <= self.leave_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn period(id: u32, join: u64, leave: u64) -> Period {
        Period {
            period_id: id,
            join_seq: MsgSeq(join),
            leave_seq: MsgSeq(leave),
        }
    }

    #[test]
    fn members_stay_in_uid_order_and_one_period_stays_inline_until_a_second() {
        let mut m = Members::default();
        for uid in [5u64, 1, 9, 3] {
            m.entry_or_default(Uid(uid)).push(period(0, uid, u64::MAX));
        }
        let uids: Vec<u64> = m.keys().map(|u| u.0).collect();
        assert_eq!(uids, [1, 3, 5, 9]);
        assert!(matches!(m.get(&Uid(5)), Some(Periods::One(_))));
        m.get_mut(&Uid(5)).unwrap()[0].leave_seq = MsgSeq(7);
        m.entry_or_default(Uid(5)).push(period(1, 8, u64::MAX));
        let five: Vec<(u32, u64)> = m
            .get(&Uid(5))
            .unwrap()
            .iter()
            .map(|p| (p.period_id, p.leave_seq.0))
            .collect();
        assert_eq!(five, [(0, 7), (1, u64::MAX)]);
        assert_eq!(m.get(&Uid(4)), None);
        assert_eq!(m.len(), 4);
        m.insert(Uid(4), vec![period(0, 2, 3)]);
        assert_eq!(m.get(&Uid(4)).map(|p| p.len()), Some(1));
        assert_eq!(m.keys().nth(2), Some(&Uid(4)));
    }

    #[test]
    fn a_member_costs_forty_bytes_and_a_second_period_spills() {
        assert_eq!(std::mem::size_of::<(Uid, Periods)>(), 40);
        let mut m = Members::default();
        m.entry_or_default(Uid(1)).push(period(0, 1, 2));
        let (live, _) = m.bytes();
        assert_eq!(live, 40);
        m.entry_or_default(Uid(1)).push(period(1, 3, u64::MAX));
        assert_eq!(m.bytes().0, 40 + 2 * 24);
    }

    #[test]
    fn a_two_member_conversation_allocates_two_entries_and_a_group_a_fifth_more_at_most() {
        let mut m = Members::default();
        m.entry_or_default(Uid(2)).push(period(0, 1, u64::MAX));
        m.entry_or_default(Uid(1)).push(period(0, 2, u64::MAX));
        assert_eq!(
            m.bytes(),
            (80, 80),
            "a pair costs its two entries, no room for four"
        );
        for uid in 3..=1_000u64 {
            m.entry_or_default(Uid(uid)).push(period(0, uid, u64::MAX));
            let (live, allocated) = m.bytes();
            assert!(
                allocated * 4 <= live * 5 + 4 * 40,
                "{uid} members: {allocated} B allocated for {live} B"
            );
        }
        let uids: Vec<u64> = m.keys().map(|u| u.0).collect();
        assert_eq!(uids, (1..=1_000).collect::<Vec<_>>());
    }
}
