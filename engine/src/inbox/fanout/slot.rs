//! Slots and placement: where a user or a conversation lives.
//!
//! Both key spaces hash into one space of [`SLOTS`] slots with one
//! function, [`slot`], over the id's eight bytes. A [`Placement`] says
//! which group owns each slot range, which group this store is, and the
//! version of that map (it only grows). Data is placed by [`slot`]
//! forever: its values are pinned by a test and must never change.
//!
//! This unit sits below the configuration, which holds a placement, and
//! uses nothing of the inbox.

use std::fmt;

use crate::api::{ConvId, Uid};

/// How many slots the ids hash into (as Redis Cluster has): small enough
/// that a map of them is a few ranges and an ownership bitmap is 2 KiB,
/// large enough that a move of one slot is a small part of a group.
pub const SLOTS: u16 = 16_384;

/// A slot, in `0..SLOTS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(pub u16);

/// A raft group that owns slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId(pub u32);

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}", self.0)
    }
}

/// The slot of an id: the top 14 bits of the id's eight bytes run through
/// a fixed 64-bit finalizer (the one of SplitMix64), so that ids that
/// differ in any bit, sequential ones included, spread over every slot.
pub const fn slot(id: u64) -> Slot {
    let mut z = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    Slot((z >> 50) as u16)
}

/// The slot of a user.
pub const fn slot_of_uid(uid: Uid) -> Slot {
    slot(uid.0)
}

/// The slot of a conversation.
pub const fn slot_of_conv(conv: ConvId) -> Slot {
    slot(conv.0)
}

/// Why a placement was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementError(pub String);

impl fmt::Display for PlacementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlacementError {}

/// One range of slots and the group that owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRange {
    pub first: Slot,
    pub last: Slot,
    pub group: GroupId,
}

/// Which group owns every slot, and which of them this store owns.
#[derive(Clone, PartialEq, Eq)]
pub struct Placement {
    version: u64,
    here: GroupId,
    /// Sorted by `first`, covering `0..SLOTS` without gap or overlap.
    ranges: Vec<SlotRange>,
    /// Bit `s` set: this store owns slot `s`.
    owned: Box<[u64; SLOTS as usize / 64]>,
    owns_all: bool,
}

impl fmt::Debug for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Placement")
            .field("version", &self.version)
            .field("here", &self.here)
            .field("ranges", &self.ranges)
            .finish()
    }
}

impl Placement {
    /// A map at `version`, for the store of group `here`. `ranges` must
    /// cover every slot exactly once (in any order).
    pub fn new(
        version: u64,
        here: GroupId,
        mut ranges: Vec<SlotRange>,
    ) -> Result<Placement, PlacementError> {
        ranges.sort_by_key(|r| r.first);
        let mut next = 0u32;
        for r in &ranges {
            if r.first > r.last || r.last.0 >= SLOTS {
                return Err(PlacementError(format!(
                    "slot range {}-{} is empty or past slot {}",
                    r.first.0,
                    r.last.0,
                    SLOTS - 1
                )));
            }
            if u32::from(r.first.0) != next {
                return Err(PlacementError(format!(
                    "slot {next} is owned by no range or by two"
                )));
            }
            next = u32::from(r.last.0) + 1;
        }
        if next != u32::from(SLOTS) {
            return Err(PlacementError(format!("slot {next} is owned by no range")));
        }
        let mut owned = Box::new([0u64; SLOTS as usize / 64]);
        for r in ranges.iter().filter(|r| r.group == here) {
            for s in r.first.0..=r.last.0 {
                owned[usize::from(s / 64)] |= 1 << (s % 64);
            }
        }
        let owns_all = owned.iter().all(|w| *w == u64::MAX);
        Ok(Placement {
            version,
            here,
            ranges,
            owned,
            owns_all,
        })
    }

    /// The map of a store that owns every slot.
    pub fn single(here: GroupId) -> Placement {
        let all = SlotRange {
            first: Slot(0),
            last: Slot(SLOTS - 1),
            group: here,
        };
        Placement::new(1, here, vec![all]).expect("one range covers every slot")
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// The group this store is.
    pub fn here(&self) -> GroupId {
        self.here
    }

    pub fn ranges(&self) -> &[SlotRange] {
        &self.ranges
    }

    /// Whether this store owns every slot (then it behaves as a store
    /// with no placement: no outbox, no per-recipient check).
    pub fn owns_all(&self) -> bool {
        self.owns_all
    }

    pub fn owns(&self, s: Slot) -> bool {
        self.owned[usize::from(s.0 / 64)] & (1 << (s.0 % 64)) != 0
    }

    pub fn owns_uid(&self, uid: Uid) -> bool {
        self.owns(slot_of_uid(uid))
    }

    /// The group that owns slot `s`.
    pub fn owner(&self, s: Slot) -> GroupId {
        let i = self.ranges.partition_point(|r| r.first <= s);
        // `ranges` covers every slot from slot 0, so `i >= 1`.
        self.ranges[i - 1].group
    }

    pub fn owner_of_uid(&self, uid: Uid) -> GroupId {
        self.owner(slot_of_uid(uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slot_of_an_id_never_changes() {
        // Data is placed by these values: a change of `slot` moves every
        // key of every deployment.
        let pinned: Vec<(u64, u16)> = [0u64, 1, 2, 42, 1_000_000, u64::MAX]
            .iter()
            .map(|&id| (id, slot(id).0))
            .collect();
        assert_eq!(
            pinned,
            [
                (0, PINNED[0]),
                (1, PINNED[1]),
                (2, PINNED[2]),
                (42, PINNED[3]),
                (1_000_000, PINNED[4]),
                (u64::MAX, PINNED[5]),
            ]
        );
    }

    const PINNED: [u16; 6] = [14472, 9282, 9686, 12149, 6659, 14646];

    #[test]
    fn sequential_ids_spread_over_every_slot_evenly() {
        let mut counts = vec![0u32; usize::from(SLOTS)];
        let n = u64::from(SLOTS) * 64;
        for id in 0..n {
            counts[usize::from(slot(id).0)] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        // 64 expected per slot; a fair hash stays well inside 2x either way.
        assert!(*min >= 32 && *max <= 128, "min {min} max {max}");
    }

    #[test]
    fn a_placement_must_cover_every_slot_exactly_once() {
        let r = |a, b, g| SlotRange {
            first: Slot(a),
            last: Slot(b),
            group: GroupId(g),
        };
        assert!(Placement::new(1, GroupId(1), vec![r(0, 100, 1)]).is_err());
        assert!(Placement::new(1, GroupId(1), vec![r(0, 100, 1), r(100, SLOTS - 1, 2)]).is_err());
        assert!(Placement::new(1, GroupId(1), vec![r(0, 99, 1), r(101, SLOTS - 1, 2)]).is_err());
        assert!(Placement::new(1, GroupId(1), vec![r(0, SLOTS, 1)]).is_err());
        let p = Placement::new(3, GroupId(2), vec![r(8000, SLOTS - 1, 2), r(0, 7999, 1)]).unwrap();
        assert_eq!(p.version(), 3);
        assert!(!p.owns_all());
        assert!(!p.owns(Slot(7999)) && p.owns(Slot(8000)) && p.owns(Slot(SLOTS - 1)));
        assert_eq!(p.owner(Slot(0)), GroupId(1));
        assert_eq!(p.owner(Slot(7999)), GroupId(1));
        assert_eq!(p.owner(Slot(8000)), GroupId(2));
        assert!(Placement::single(GroupId(5)).owns_all());
    }
}
