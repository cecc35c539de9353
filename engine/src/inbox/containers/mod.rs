//! Compact containers the state's tables are built from: sorted vectors
//! that stand in for small maps and sets, chunked and spilled lists, the
//! packed record locations and the per-user event index, rarely-set
//! fields kept out of line, and a conversation's member periods.
//!
//! They know nothing of the inbox's rules: no record kind, no subsystem,
//! no state. What they share is in this file: the id-keyed hash map and
//! the growth policy that fits a list to the allocator's size classes.

use std::collections::HashMap;

pub(crate) mod chunked;
pub(crate) mod event_locs;
pub(crate) mod loc;
pub(crate) mod members;
pub(crate) mod rare;
pub(crate) mod sorted;
pub(crate) mod spill;

/// A hash map keyed by one of the store's integer ids (a user, a
/// conversation, a segment), hashed with foldhash rather than std's
/// SipHash-1-3: a send looks up every recipient, and the completion stage
/// every user a round touched, so the hash is on every event's path, and
/// foldhash does an integer key in a few multiplications. It is seeded per
/// process, like std's, so which keys collide is not known in advance;
/// ids come from the services in front of the store, not from end users.
pub(crate) type IdMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The set form of [`IdMap`].
pub(crate) type IdSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// Makes room for one more entry when `v` is full: about a `1/divisor` of
/// its length, at least `min`, instead of doubling, fitted to an
/// allocator size class ([`fitted_capacity`]).
pub(crate) fn grow_for_one<T>(v: &mut Vec<T>, divisor: usize, min: usize) {
    if v.len() == v.capacity() {
        let want = v.len() + (v.len() / divisor).max(min);
        let capacity = fitted_capacity(v.len(), want, std::mem::size_of::<T>());
        v.reserve_exact(capacity - v.len());
    }
}

/// The capacity to grow a full list of `len` entries of `size` bytes to,
/// near `want`, such that the list's bytes fill the block the allocator
/// hands out.
///
/// mimalloc (the daemon's allocator) and jemalloc serve a small request
/// from a size class: a multiple of 8 bytes up to 64, then four classes
/// per doubling (80, 96, 112, 128, 160, …, 768, 896, 1024, 1280, …). A
/// list of 58 events (464 bytes) took a 512-byte block, and 31 message
/// entries (806 bytes) an 896-byte one. So the capacity is the most
/// entries that fit the largest class at or below `want`'s bytes, or, when
/// that has no room for another entry, the class above it. Never less than
/// `len + 1`.
pub(crate) fn fitted_capacity(len: usize, want: usize, size: usize) -> usize {
    let want = want.max(len + 1);
    if size == 0 {
        return want;
    }
    let bytes = want.saturating_mul(size);
    let below = class_at_or_below(bytes) / size;
    if below > len {
        return below;
    }
    (class_at_or_below(bytes) + class_step(bytes)) / size
}

/// The bytes to allocate for a list of `used` bytes (a `header`, then
/// entries of `width` bytes) that needs room for one more entry, grown
/// towards `want` entries: the block of the size class those bytes fall
/// in, cut to whole entries, so the list fills it ([`fitted_capacity`]).
pub(crate) fn fitted_block(header: usize, used: usize, want: usize, width: usize) -> usize {
    let need = used + width;
    let class = fitted_capacity(need - 1, (header + want * width).max(need), 1);
    header + (class - header) / width * width
}

/// The spacing of the size classes around `bytes`: 8 up to 64 bytes, then
/// a quarter of the power of two at or below `bytes`.
fn class_step(bytes: usize) -> usize {
    if bytes <= 64 {
        8
    } else {
        1 << (usize::BITS - 1 - bytes.leading_zeros() - 2)
    }
}

/// The size class a request of `bytes` is served from: the block it takes.
#[cfg(test)]
pub(crate) fn size_class_of(bytes: usize) -> usize {
    let below = class_at_or_below(bytes);
    if below >= bytes {
        below
    } else {
        below + class_step(bytes)
    }
}

/// The largest size class at or below `bytes` (at least 8).
fn class_at_or_below(bytes: usize) -> usize {
    let step = class_step(bytes);
    (bytes / step * step).max(8)
}
