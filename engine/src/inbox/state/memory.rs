//! What the state's tables hold in memory, structure by structure: the
//! bytes of their entries (live) and what is allocated for them (capacity
//! and per-allocation overhead, estimated from the collections' layouts).
//!
//! Walking every user and conversation is O(state), so the caller walks a
//! chunk of keys per hold of the state lock ([`Tally::users`],
//! [`Tally::convs`]) and never stalls the sequencer for long. Figures are
//! estimates from lengths and capacities, not allocator statistics: a hash
//! map's slot is its key and value plus a control byte, at its capacity's
//! buckets; a B-tree node holds up to 11 entries; an `Arc` adds two
//! counters.

use std::mem::size_of;

use super::{ActivityKey, Conv, Device, LargeMode, MsgMeta, SnapshotSlot, State, User, UserConv};
use crate::api::*;
use crate::inbox::messaging::idem;

/// The structures reported, in report order.
pub(crate) const STRUCTURES: [&str; 11] = [
    "users",
    "devices",
    "user_conversations",
    "conversations",
    "message_metadata",
    "event_index",
    "idempotency",
    "snapshot_rows",
    "segment_counts",
    "message_metadata_file",
    "idempotency_file",
];

/// Bytes (live, allocated) per structure of [`STRUCTURES`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub bytes: [(u64, u64); STRUCTURES.len()],
}

const ARC: u64 = 16;

/// A hash map of `len` entries of `entry` bytes with `capacity` usable
/// slots (7/8 of its buckets).
fn hash_map(len: usize, capacity: usize, entry: usize) -> (u64, u64) {
    let buckets = if capacity == 0 {
        0
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    ((len * entry) as u64, (buckets * (entry + 1)) as u64)
}

/// A B-tree of `len` entries of `entry` bytes: nodes of up to 11 entries,
/// about two thirds full, with a parent pointer and lengths.
fn b_tree(len: usize, entry: usize) -> (u64, u64) {
    let nodes = len.div_ceil(7);
    ((len * entry) as u64, (nodes * (11 * entry + 16)) as u64)
}

/// A vector of `len` entries of `entry` bytes with room for `capacity`.
fn vec_of(len: usize, capacity: usize, entry: usize) -> (u64, u64) {
    ((len * entry) as u64, (capacity * entry) as u64)
}

fn vec<T>(v: &Vec<T>) -> (u64, u64) {
    vec_of(v.len(), v.capacity(), size_of::<T>())
}

impl Tally {
    fn add(&mut self, i: usize, (live, allocated): (u64, u64)) {
        self.bytes[i].0 += live;
        self.bytes[i].1 += allocated;
    }

    /// The top-level maps and the small tables.
    pub fn tables(&mut self, st: &State) {
        self.add(
            0,
            hash_map(
                st.users.len(),
                st.users.capacity(),
                size_of::<(Uid, std::sync::Arc<User>)>(),
            ),
        );
        self.add(
            3,
            hash_map(
                st.convs.len(),
                st.convs.capacity(),
                size_of::<(ConvId, std::sync::Arc<Conv>)>(),
            ),
        );
        let idem = st.idem.bytes();
        self.add(6, (idem.live, idem.allocated));
        let (in_file, pages) = st.idem.in_file();
        self.add(10, (in_file * idem::SLOT_BYTES, pages));
        for refs in [&st.evt_refs, &st.body_refs, &st.msg_refs] {
            let (len, cap, dirty, dirty_cap) = refs.sizes();
            self.add(8, hash_map(len, cap, 12));
            self.add(8, hash_map(dirty, dirty_cap, 4));
        }
    }

    /// The users `uids` (those still there) and what hangs off them.
    pub fn users(&mut self, st: &State, uids: &[Uid]) {
        for u in uids.iter().filter_map(|uid| st.users.get(uid)) {
            let own = size_of::<User>() as u64 + ARC;
            self.add(0, (own, own));
            self.add(1, vec::<Device>(&u.devices));
            let leases = u.devices.iter().filter(|d| d.row.lease.is_some()).count();
            let leases = (leases * size_of::<LeaseInfo>()) as u64;
            self.add(1, (leases, leases));
            self.add(
                2,
                vec_of(
                    u.convs.len(),
                    u.convs.capacity(),
                    size_of::<(ConvId, UserConv)>(),
                ),
            );
            let order = match u.order.vector_capacity() {
                Some(capacity) => vec_of(u.order.len(), capacity, size_of::<ActivityKey>()),
                None => b_tree(u.order.len(), size_of::<ActivityKey>()),
            };
            self.add(2, order);
            let summaries: u64 = u
                .convs
                .values()
                .map(|c| c.last_summary.shared_bytes())
                .sum();
            self.add(2, (summaries, summaries));
            self.add(
                5,
                (
                    u.events.live_bytes() as u64,
                    u.events.allocated_bytes() as u64,
                ),
            );
            self.add(
                7,
                b_tree(u.snapshots().len(), size_of::<(u64, SnapshotSlot)>()),
            );
            let boxed = u.recovery.boxed_bytes();
            self.add(7, (boxed, boxed));
        }
    }

    /// The conversations `convs` (those still there) and their messages.
    pub fn convs(&mut self, st: &State, convs: &[ConvId]) {
        for c in convs.iter().filter_map(|id| st.convs.get(id)) {
            let own = size_of::<Conv>() as u64
                + ARC
                + c.large
                    .as_ref()
                    .map_or(0, |_| size_of::<LargeMode>() as u64);
            self.add(3, (own, own));
            self.add(3, c.members.bytes());
            self.add(3, b_tree(c.edits.len(), size_of::<(MsgSeq, Vec<MsgSeq>)>()));
            let boxed = c.edits.boxed_bytes();
            self.add(3, (boxed, boxed));
            for edits in c.edits.values() {
                self.add(3, vec::<MsgSeq>(edits));
            }
            let (in_file, pages) = c.msgs.in_file();
            let (live, allocated) = c.msgs.heap_bytes();
            self.add(
                4,
                (live as u64, (allocated + c.msgs.overhead_bytes()) as u64),
            );
            self.add(9, ((in_file * size_of::<MsgMeta>()) as u64, pages as u64));
        }
    }

    /// By structure name, in report order.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, u64, u64)> + '_ {
        STRUCTURES
            .iter()
            .zip(self.bytes.iter())
            .map(|(name, (live, allocated))| (*name, *live, *allocated))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_tallied_from_file_pages_are_the_ones_named_file_backed() {
        let in_files: Vec<&str> = STRUCTURES
            .iter()
            .copied()
            .filter(|s| file_backed(s))
            .collect();
        assert_eq!(in_files, ["message_metadata_file", "idempotency_file"]);
        // The sealed segments' row is added beside the tally
        // (`Inbox::memory`).
        assert!(file_backed("log_mmaps"));
        assert!(!file_backed("message_metadata") && !file_backed("idempotency"));
    }
}
