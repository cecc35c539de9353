//! The idempotency table (R4): every `(sender, client_msg_id)` seen in the
//! last `idempotency_ttl`, at a small fixed cost per key.
//!
//! A key is not kept whole. Each entry holds a 16-byte *tag*,
//! `client_msg_id XOR spread(sender)`, and where its send is: `conv`,
//! `msg_seq`, `msg_id` (40 bytes in all, no pointer, no per-entry time).
//! The tag alone does not name a key: two keys of different senders may
//! share one. But given the sender of the original send, which the message
//! index holds (and the message record on disk too), the tag gives back the
//! original `client_msg_id` exactly (`tag XOR spread(sender)`). So a lookup
//! takes the entries whose tag matches and keeps only the one whose
//! message was sent by the asking sender ([`State::idem_lookup`]): a tag
//! shared by two keys never answers one with the other's message, nor
//! refuses a new send.
//!
//! Entries live in time buckets of `ttl / BUCKETS_PER_TTL` by the time of
//! their send; a bucket is dropped whole once its newest possible key is
//! older than the TTL, so a key is remembered at least the TTL and at most
//! the TTL plus one bucket width. The newest bucket is an open-addressing
//! table (linear probing) that takes inserts; an older one is a sorted
//! array of exactly its entries, searched by binary search, and shared
//! between the state and the copies checkpoints take of it.
//!
//! Like the rest of the state, the table changes only in `apply`, judged
//! by the time stamped in the record being applied, so replay builds the
//! same table.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::api::*;

/// Buckets per TTL: the expiry granularity (a key lives up to 1/16 longer
/// than the TTL), and how many tables a lookup probes.
pub(crate) const BUCKETS_PER_TTL: u64 = 16;

/// Maps a sender to the bits its keys' tags are XORed with. Any function
/// keeps lookups exact; a well-mixed one keeps tags of different senders
/// apart, so a lookup rarely looks at a message of another sender.
pub(crate) type Spread = fn(Uid) -> [u64; 2];

fn mix64(mut x: u64) -> u64 {
    // splitmix64's finalizer.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The spread the engine uses (fixed: checkpoints store tags).
pub(crate) fn default_spread(sender: Uid) -> [u64; 2] {
    let s = sender.0;
    [mix64(s), mix64(s ^ 0x9e37_79b9_7f4a_7c15)]
}

/// One remembered key: its tag and where its send is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct IdemSlot {
    /// `client_msg_id XOR spread(sender)`, low word first.
    pub tag: [u64; 2],
    pub conv: ConvId,
    pub msg_seq: MsgSeq,
    /// Never 0 for a message; 0 marks a free slot of an open table.
    pub msg_id: MsgId,
}

const FREE: IdemSlot = IdemSlot {
    tag: [0, 0],
    conv: ConvId(0),
    msg_seq: MsgSeq(0),
    msg_id: MsgId(0),
};

/// Bytes per entry, live.
pub(crate) const SLOT_BYTES: u64 = std::mem::size_of::<IdemSlot>() as u64;

/// The keys sent in `[start_ms, end_ms)`.
#[derive(Clone, Debug)]
pub(crate) struct Bucket {
    pub start_ms: TimestampMs,
    pub end_ms: TimestampMs,
    body: Body,
}

#[derive(Clone, Debug)]
enum Body {
    /// Slots (any number), at most 7/8 used, [`FREE`] where empty; grows
    /// by a quarter, so at most about 30% of it is unused after a growth.
    Open { slots: Vec<IdemSlot>, len: usize },
    /// Sorted, exactly sized; shared, so the state copy a checkpoint
    /// takes copies only the open bucket.
    Sealed(Arc<[IdemSlot]>),
}

fn tag_of(spread: Spread, sender: Uid, cmid: ClientMsgId) -> [u64; 2] {
    let s = spread(sender);
    [(cmid as u64) ^ s[0], ((cmid >> 64) as u64) ^ s[1]]
}

/// The first slot to probe among `n`: the mixed tag scaled to `n`
/// (multiply-shift), so `n` need not be a power of two.
fn home(tag: [u64; 2], n: usize) -> usize {
    let h = mix64(tag[0] ^ tag[1].rotate_left(32));
    ((u128::from(h) * n as u128) >> 64) as usize
}

impl Bucket {
    fn open(start_ms: TimestampMs, end_ms: TimestampMs) -> Self {
        Bucket {
            start_ms,
            end_ms,
            body: Body::Open {
                slots: Vec::new(),
                len: 0,
            },
        }
    }

    pub fn len(&self) -> usize {
        match &self.body {
            Body::Open { len, .. } => *len,
            Body::Sealed(s) => s.len(),
        }
    }

    /// Slots allocated (an open table's capacity).
    fn capacity(&self) -> usize {
        match &self.body {
            Body::Open { slots, .. } => slots.capacity(),
            Body::Sealed(s) => s.len(),
        }
    }

    /// The entries, sorted (what a checkpoint stores).
    pub fn entries(&self) -> Vec<IdemSlot> {
        match &self.body {
            Body::Open { slots, .. } => {
                let mut v: Vec<IdemSlot> = slots.iter().filter(|s| **s != FREE).copied().collect();
                v.sort_unstable();
                v
            }
            Body::Sealed(s) => s.to_vec(),
        }
    }

    fn insert(&mut self, slot: IdemSlot) {
        if let Body::Sealed(s) = &self.body {
            // Inserts go to the newest bucket, which stays open; should a
            // sealed one ever be asked, it is reopened rather than refused
            // (apply must not fail on a valid record).
            let entries = s.to_vec();
            self.body = Body::Open {
                slots: Vec::new(),
                len: 0,
            };
            for e in entries {
                self.insert(e);
            }
        }
        let Body::Open { slots, len } = &mut self.body else {
            unreachable!("reopened above");
        };
        if (*len + 1) * 8 > slots.len() * 7 {
            let cap = (slots.len() + slots.len() / 4).max(16);
            let old = std::mem::replace(slots, vec![FREE; cap]);
            for e in old.into_iter().filter(|e| *e != FREE) {
                put(slots, e);
            }
        }
        put(slots, slot);
        *len += 1;
    }

    fn seal(&mut self) {
        if matches!(self.body, Body::Open { .. }) {
            self.body = Body::Sealed(self.entries().into());
        }
    }

    /// The entries whose tag is `tag`.
    fn matching(&self, tag: [u64; 2], out: &mut Vec<IdemSlot>) {
        match &self.body {
            Body::Open { slots, .. } => {
                if slots.is_empty() {
                    return;
                }
                let n = slots.len();
                let mut i = home(tag, n);
                while slots[i] != FREE {
                    if slots[i].tag == tag {
                        out.push(slots[i]);
                    }
                    i = if i + 1 == n { 0 } else { i + 1 };
                }
            }
            Body::Sealed(s) => {
                let from = s.partition_point(|e| e.tag < tag);
                out.extend(s[from..].iter().take_while(|e| e.tag == tag));
            }
        }
    }
}

fn put(slots: &mut [IdemSlot], e: IdemSlot) {
    let n = slots.len();
    let mut i = home(e.tag, n);
    while slots[i] != FREE {
        i = if i + 1 == n { 0 } else { i + 1 };
    }
    slots[i] = e;
}

/// The table: buckets oldest first.
#[derive(Clone, Debug)]
pub(crate) struct IdemTable {
    buckets: VecDeque<Bucket>,
    spread: Spread,
}

impl Default for IdemTable {
    fn default() -> Self {
        Self::with_spread(default_spread)
    }
}

/// Equal when they hold the same entries in the same buckets, however the
/// newest bucket is laid out (a decoded table inserts in another order).
impl PartialEq for IdemTable {
    fn eq(&self, other: &Self) -> bool {
        self.buckets.len() == other.buckets.len()
            && self.buckets.iter().zip(&other.buckets).all(|(a, b)| {
                a.start_ms == b.start_ms && a.end_ms == b.end_ms && a.entries() == b.entries()
            })
    }
}
impl Eq for IdemTable {}

/// Bytes of the table: its entries, and what is allocated for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TableBytes {
    pub live: u64,
    pub allocated: u64,
}

impl IdemTable {
    /// A table whose tags use `spread` (tests force shared tags with it).
    pub fn with_spread(spread: Spread) -> Self {
        IdemTable {
            buckets: VecDeque::new(),
            spread,
        }
    }

    pub fn len(&self) -> usize {
        self.buckets.iter().map(Bucket::len).sum()
    }

    pub fn buckets(&self) -> impl Iterator<Item = &Bucket> {
        self.buckets.iter()
    }

    pub fn bytes(&self) -> TableBytes {
        let bucket = std::mem::size_of::<Bucket>() as u64;
        TableBytes {
            live: self.len() as u64 * SLOT_BYTES,
            allocated: self
                .buckets
                .iter()
                .map(|b| b.capacity() as u64 * SLOT_BYTES + bucket)
                .sum::<u64>()
                + (self.buckets.capacity() - self.buckets.len()) as u64 * bucket,
        }
    }

    /// The entries that may be `(sender, cmid)`'s at `now`, newest bucket
    /// first: their tag matches and their bucket is not past the TTL. The
    /// caller keeps the one whose message `sender` sent.
    pub fn candidates(
        &self,
        sender: Uid,
        cmid: ClientMsgId,
        now: TimestampMs,
        ttl_ms: u64,
    ) -> Vec<IdemSlot> {
        let tag = tag_of(self.spread, sender, cmid);
        let horizon = now.saturating_sub(ttl_ms);
        let mut out = Vec::new();
        for b in self.buckets.iter().rev() {
            if b.end_ms <= horizon {
                break;
            }
            b.matching(tag, &mut out);
        }
        out
    }

    /// Remembers a send made at `at_ms`, dropping the buckets wholly past
    /// the TTL by then.
    #[expect(clippy::too_many_arguments, reason = "one key and where it went")]
    pub fn insert(
        &mut self,
        sender: Uid,
        cmid: ClientMsgId,
        conv: ConvId,
        msg_seq: MsgSeq,
        msg_id: MsgId,
        at_ms: TimestampMs,
        ttl_ms: u64,
    ) {
        let horizon = at_ms.saturating_sub(ttl_ms);
        while self.buckets.front().is_some_and(|b| b.end_ms <= horizon) {
            self.buckets.pop_front();
        }
        if self.buckets.back().is_none_or(|b| at_ms >= b.end_ms) {
            if let Some(b) = self.buckets.back_mut() {
                b.seal();
            }
            let width = (ttl_ms / BUCKETS_PER_TTL).max(1);
            // Aligned to the width, but never before the previous bucket's
            // end: the TTL (so the width) may have changed since a restart.
            let prev_end = self.buckets.back().map_or(0, |b| b.end_ms);
            let start = (at_ms - at_ms % width).max(prev_end);
            let end = (at_ms - at_ms % width).saturating_add(width).max(at_ms + 1);
            self.buckets.push_back(Bucket::open(start, end));
        }
        let tag = tag_of(self.spread, sender, cmid);
        let b = self.buckets.back_mut().expect("pushed above");
        b.insert(IdemSlot {
            tag,
            conv,
            msg_seq,
            msg_id,
        });
    }

    /// Appends a decoded bucket (oldest first); the newest stays open.
    pub fn push_decoded(
        &mut self,
        start_ms: TimestampMs,
        end_ms: TimestampMs,
        entries: Vec<IdemSlot>,
    ) {
        if let Some(b) = self.buckets.back_mut() {
            b.seal();
        }
        let mut b = Bucket::open(start_ms, end_ms);
        for e in entries {
            b.insert(e);
        }
        self.buckets.push_back(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_spread(_: Uid) -> [u64; 2] {
        [0, 0]
    }

    fn ids(v: &[IdemSlot]) -> Vec<u64> {
        v.iter().map(|s| s.msg_id.0).collect()
    }

    #[test]
    fn keys_with_the_same_tag_are_all_candidates_in_open_and_sealed_buckets() {
        // Without a spread the tag is the client_msg_id: two senders'
        // key 7 share it.
        let mut t = IdemTable::with_spread(no_spread);
        let ttl = 1_600;
        t.insert(Uid(1), 7, ConvId(10), MsgSeq(1), MsgId(101), 0, ttl);
        t.insert(Uid(2), 7, ConvId(10), MsgSeq(2), MsgId(102), 1, ttl);
        t.insert(Uid(2), 8, ConvId(10), MsgSeq(3), MsgId(103), 2, ttl);
        assert_eq!(ids(&t.candidates(Uid(1), 7, 3, ttl)), [101, 102]);
        // A later bucket seals the first one: same answers.
        t.insert(Uid(3), 7, ConvId(10), MsgSeq(4), MsgId(104), 150, ttl);
        assert_eq!(t.buckets().count(), 2);
        assert_eq!(ids(&t.candidates(Uid(1), 7, 151, ttl)), [104, 101, 102]);
        assert_eq!(ids(&t.candidates(Uid(1), 9, 151, ttl)), Vec::<u64>::new());
    }

    #[test]
    fn a_bucket_is_dropped_once_all_its_keys_are_past_the_ttl() {
        let mut t = IdemTable::default();
        let ttl = 1_600; // buckets of 100 ms
        t.insert(Uid(1), 1, ConvId(1), MsgSeq(1), MsgId(1), 50, ttl);
        // At 1,650 the key is exactly the TTL old: still remembered.
        assert_eq!(t.candidates(Uid(1), 1, 1_650, ttl).len(), 1);
        // Its bucket ends at 100: from 1,700 on it is answered no more...
        assert_eq!(t.candidates(Uid(1), 1, 1_700, ttl).len(), 0);
        // ...and the next insert drops it.
        t.insert(Uid(1), 2, ConvId(1), MsgSeq(2), MsgId(2), 1_700, ttl);
        assert_eq!(t.len(), 1);
        assert_eq!(t.buckets().count(), 1);
    }

    #[test]
    fn buckets_stay_ordered_and_disjoint_when_the_ttl_changes() {
        let mut t = IdemTable::default();
        // Buckets of 100 ms, then (after a restart with another TTL) of 1 s.
        t.insert(Uid(1), 1, ConvId(1), MsgSeq(1), MsgId(1), 950, 1_600);
        t.insert(Uid(1), 2, ConvId(1), MsgSeq(2), MsgId(2), 1_010, 16_000);
        t.insert(Uid(1), 3, ConvId(1), MsgSeq(3), MsgId(3), 2_500, 16_000);
        let spans: Vec<(u64, u64)> = t.buckets().map(|b| (b.start_ms, b.end_ms)).collect();
        assert_eq!(spans, [(900, 1_000), (1_000, 2_000), (2_000, 3_000)]);
        t.insert(Uid(1), 4, ConvId(1), MsgSeq(4), MsgId(4), 3_050, 1_600);
        let last = t.buckets().last().map(|b| (b.start_ms, b.end_ms));
        assert_eq!(last, Some((3_000, 3_100)));
        assert_eq!(t.candidates(Uid(1), 2, 3_050, 16_000).len(), 1);
    }

    #[test]
    fn the_open_bucket_grows_and_finds_every_key() {
        let mut t = IdemTable::default();
        for i in 0..10_000u64 {
            t.insert(
                Uid(i % 7),
                i as u128,
                ConvId(1),
                MsgSeq(i + 1),
                MsgId(i + 1),
                0,
                1_000,
            );
        }
        for i in 0..10_000u64 {
            let c = t.candidates(Uid(i % 7), i as u128, 0, 1_000);
            assert_eq!(ids(&c), [i + 1]);
        }
        let b = t.bytes();
        assert_eq!(b.live, 10_000 * SLOT_BYTES);
        assert!(b.allocated >= b.live);
    }

    #[test]
    fn a_decoded_table_equals_the_one_it_was_encoded_from() {
        let mut t = IdemTable::default();
        for i in 0..100u64 {
            t.insert(
                Uid(1),
                i as u128,
                ConvId(1),
                MsgSeq(i + 1),
                MsgId(i + 1),
                i * 30,
                1_600,
            );
        }
        let mut d = IdemTable::default();
        for b in t.buckets() {
            d.push_decoded(b.start_ms, b.end_ms, b.entries());
        }
        assert_eq!(d, t);
        assert_eq!(ids(&d.candidates(Uid(1), 99, 3_000, 1_600)), [100]);
    }

    /// A state whose conv 10 holds messages 1..=3 sent by uid 1, 2, 1,
    /// with both uids members from seq 1 on.
    fn state_with_shared_tags() -> crate::inbox::state::State {
        use crate::inbox::state::{Conv, MsgMeta, Period, State, OPEN};
        let mut st = State::new(1_000);
        st.idem = IdemTable::with_spread(no_spread);
        let mut c = Conv::default();
        for (i, sender) in [1u64, 2, 1].into_iter().enumerate() {
            c.msgs.push(MsgMeta {
                loc: 0,
                msg_id: MsgId(101 + i as u64),
                sender: Uid(sender),
                kind: MessageKind::Normal,
                flags: 0,
            });
        }
        for uid in [1, 2] {
            let p = Period {
                period_id: 0,
                join_seq: MsgSeq(1),
                leave_seq: OPEN,
            };
            Arc::make_mut(&mut c.members).insert(Uid(uid), vec![p]);
        }
        st.convs.insert(ConvId(10), std::sync::Arc::new(c));
        // Key 7 of uid 1 went to seq 1, key 7 of uid 2 to seq 2: one tag.
        st.idem
            .insert(Uid(1), 7, ConvId(10), MsgSeq(1), MsgId(101), 0, 1_000);
        st.idem
            .insert(Uid(2), 7, ConvId(10), MsgSeq(2), MsgId(102), 0, 1_000);
        st
    }

    #[test]
    fn keys_sharing_a_tag_each_find_their_own_send_and_no_other() {
        let st = state_with_shared_tags();
        let one = st.idem_lookup(Uid(1), 7, 0).unwrap();
        let two = st.idem_lookup(Uid(2), 7, 0).unwrap();
        assert_eq!((one.msg_seq, one.msg_id), (MsgSeq(1), MsgId(101)));
        assert_eq!((two.msg_seq, two.msg_id), (MsgSeq(2), MsgId(102)));
        // Uid 3 shares the tag too but sent neither: a new send.
        assert_eq!(st.idem_lookup(Uid(3), 7, 0), None);
    }

    #[test]
    fn a_reclaimed_send_is_taken_only_for_a_member_at_its_seq() {
        let mut st = state_with_shared_tags();
        let c = std::sync::Arc::make_mut(st.convs.get_mut(&ConvId(10)).unwrap());
        c.msgs.remove_front(2);
        c.msgs_base = MsgSeq(2);
        Arc::make_mut(&mut c.members).get_mut(&Uid(2)).unwrap()[0].join_seq = MsgSeq(2);
        // Uid 1 was a member at seq 1 (its send) but not uid 2, which
        // joined at seq 2: only uid 1's key still answers seq 1.
        let one = st.idem_lookup(Uid(1), 7, 0).unwrap();
        assert_eq!(one.msg_seq, MsgSeq(1));
        let two = st.idem_lookup(Uid(2), 7, 0).unwrap();
        assert_eq!(two.msg_seq, MsgSeq(2));
        assert_eq!(st.idem_lookup(Uid(3), 7, 0), None);
    }
}
