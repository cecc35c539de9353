//! The idempotency table (R4): every `(sender, client_msg_id)` seen in the
//! last `idempotency_ttl`, at a small fixed cost per key: 24 bytes.
//!
//! A key is not kept whole. Its *tag*, `client_msg_id XOR spread(sender)`
//! (16 bytes), gives back the key exactly once the sender is known, and
//! the sender of a send is in the message index. An entry keeps less than
//! the tag:
//!
//! - `fp`, a 64-bit fingerprint of the tag (never 0: 0 marks a free slot);
//! - `conv`, the conversation the send went to;
//! - `seq_lo`, the low 32 bits of its `msg_seq`. The full seq is the one
//!   at or below the conversation's head with those low bits: a key lives
//!   about a TTL, and no conversation takes 2^32 messages in one;
//! - `id_delta`, its `msg_id` less the bucket's `base_id`. msg_ids only
//!   grow, and a bucket whose next id would not fit in 32 bits is closed
//!   and the next one starts at that id.
//!
//! A lookup takes the entries whose fingerprint matches and keeps only
//! one whose message the asking sender sent ([`State::idem_lookup`]). A
//! fingerprint shared by keys of two senders (or crafted: the spread is
//! public) never answers one sender with the other's message, nor refuses
//! a new send. Two keys of *one* sender share a fingerprint with
//! probability 2^-64 per pair; the later is then answered as a retry of
//! the earlier (or refused, in another conversation): about 5 x 10^-14
//! per send of a sender with a million keys in the TTL.
//!
//! Entries live in time buckets of `ttl / BUCKETS_PER_TTL` by the time of
//! their send; a bucket is dropped whole once its newest possible key is
//! older than the TTL, so a key is remembered at least the TTL and at most
//! the TTL plus one bucket width. A bucket is 1,024 shards by the top
//! bits of the fingerprint, each behind an `Arc` ([`Bucket`]).
//!
//! A shard is a sorted *run* of the keys merged so far, searched from
//! where its uniform fingerprints put a key ([`first_at_or_above`]), and
//! a *table* of the keys inserted since (open addressing, linear
//! probing): keys arrive in random fingerprint order, so only a table
//! takes them one at a time. Once a table holds an eighth of its run's
//! keys, the insert merges the two into a new run. So even the newest
//! bucket, which takes every insert and holds a sixteenth of the TTL's
//! keys (10.5 hours of them at the default 7 days), keeps at most a ninth
//! of them in tables, beyond a quarter page of keys a shard; a closed
//! bucket's tables are merged one shard per later insert. The copies of
//! the state checkpoints take share the shards and their runs.
//!
//! A run never changes once written. Given the state's scratch file
//! ([`super::spill`]), a run goes there, in pages mapped shared, instead
//! of the heap: what stays on the heap is the tables (the newest keys,
//! the ones retries find) and a handle per shard.
//!
//! Like the rest of the state, the table changes only in `apply`, judged
//! by the time stamped in the record being applied, so replay builds the
//! same table.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

use super::spill::{Arena, Block, Plain};
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

/// The spread the engine uses (fixed: checkpoints store what derives
/// from it).
pub(crate) fn default_spread(sender: Uid) -> [u64; 2] {
    let s = sender.0;
    [mix64(s), mix64(s ^ 0x9e37_79b9_7f4a_7c15)]
}

/// A key's 16-byte tag: `client_msg_id XOR spread(sender)`, low word first.
pub(crate) fn tag_of(spread: Spread, sender: Uid, cmid: ClientMsgId) -> [u64; 2] {
    let s = spread(sender);
    [(cmid as u64) ^ s[0], ((cmid >> 64) as u64) ^ s[1]]
}

/// A tag's fingerprint: never 0, which marks a free slot.
pub(crate) fn fingerprint(tag: [u64; 2]) -> u64 {
    mix64(tag[0] ^ mix64(tag[1])).max(1)
}

/// One remembered key (24 bytes): its fingerprint and where its send is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct IdemSlot {
    pub fp: u64,
    pub conv: ConvId,
    /// The low 32 bits of the send's `msg_seq`.
    pub seq_lo: u32,
    /// The send's `msg_id` less its bucket's `base_id`.
    pub id_delta: u32,
}

const FREE: IdemSlot = IdemSlot {
    fp: 0,
    conv: ConvId(0),
    seq_lo: 0,
    id_delta: 0,
};

// SAFETY: integers only, no padding (8 + 8 + 4 + 4 bytes); the scratch
// file gives back only the bytes written from an `IdemSlot`.
unsafe impl Plain for IdemSlot {}

/// Bytes per entry, live.
pub(crate) const SLOT_BYTES: u64 = std::mem::size_of::<IdemSlot>() as u64;

/// What an entry says, its ids made whole again but for the seq, which
/// only its conversation's head completes ([`seq_below`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub conv: ConvId,
    pub seq_lo: u32,
    pub msg_id: MsgId,
}

/// The seq at or below `head` whose low 32 bits are `lo`; `None` when
/// there is none (the key's conversation is younger than it).
pub(crate) fn seq_below(head: MsgSeq, lo: u32) -> Option<MsgSeq> {
    let back = (head.0 as u32).wrapping_sub(lo);
    head.0.checked_sub(u64::from(back)).map(MsgSeq)
}

/// Shards per bucket, by the top bits of a key's fingerprint.
const SHARD_BITS: u32 = 10;
const SHARDS: usize = 1 << SHARD_BITS;

/// The keys sent in `[start_ms, end_ms)` whose msg_ids are within 2^32 of
/// `base_id`. Two buckets share a span only when ids ran past that.
///
/// A bucket is [`SHARDS`] shards by the top bits of the fingerprint, each
/// behind its own `Arc`, and the list of them behind one too, so that no
/// step costs in proportion to the whole bucket, which holds hours of
/// keys (tens of millions at scale):
/// - the state copy a checkpoint takes shares every bucket; an insert
///   afterwards copies the one shard it changes (its table, not its run);
/// - a merge writes one shard's run;
/// - a closed bucket's tables are merged one shard per later insert
///   ([`IdemTable::insert`]), not all at once.
#[derive(Clone, Debug)]
pub(crate) struct Bucket {
    pub start_ms: TimestampMs,
    pub end_ms: TimestampMs,
    pub base_id: MsgId,
    /// Empty until the first insert.
    shards: Arc<Vec<Arc<Shard>>>,
    len: usize,
    /// Shards below it have no table: only in a closed bucket, one that
    /// is not the table's newest.
    merged: usize,
}

/// A shard's keys: a sorted run of those merged so far, and a table of
/// those inserted since.
#[derive(Clone, Debug, Default)]
struct Shard {
    run: Run,
    /// Open addressing (linear probing), at most 7/8 used, [`FREE`] where
    /// empty; doubles up to 256 slots, then grows by an eighth, so about 17%
    /// of a large one is unused on average.
    table: Vec<IdemSlot>,
    table_len: usize,
}

/// Sorted keys, exactly sized: on the heap, or in pages of the scratch
/// file.
#[derive(Clone, Debug, Default)]
enum Run {
    #[default]
    Empty,
    Heap(Arc<[IdemSlot]>),
    InFile(Arc<Block<IdemSlot>>),
}

/// Keys a run needs to go to the scratch file: half a page. A smaller run
/// would waste most of its page; at that size the whole bucket is small.
const FILED_SHARD_MIN: usize = super::spill::PAGE / 2 / std::mem::size_of::<IdemSlot>();

/// A shard's table is merged into its run once it holds an eighth of the
/// run's keys, and at least [`MERGE_MIN`]. The tables then hold at most a
/// ninth of a large bucket's keys, and the runs written over a bucket's
/// life add up to about nine times its keys (each a ninth larger than the
/// last). A quarter writes about half as much, merges less often and
/// nearly doubles the tables' heap.
const MERGE_FRACTION: usize = 8;

/// Keys a table takes before its first merge, and before any merge while
/// an eighth of the run is fewer: a quarter page of them (42), so a table
/// is at most 64 slots, 1.5 KiB. While a bucket is young every shard
/// merges at this size, about once per `MERGE_MIN` sends in all, and each
/// merge writes new pages and punches out the old ones; a run passes
/// `8 * MERGE_MIN` keys (344,000 in the bucket) before the eighth takes
/// over. A page (170 keys, tables of up to 256 slots) held three times
/// the tables' heap, and left holes of their size class each time a shard's
/// table was freed at a merge: at 520,000 keys, about 4 MiB more of the
/// daemon's resident memory. The quarter page's more frequent merges cost
/// sends at most about 1 µs of CPU in the ingest benchmark, within its
/// noise (`docs/BENCHMARKS.md`, "Idempotency tables of a quarter page").
const MERGE_MIN: usize = super::spill::PAGE / 4 / std::mem::size_of::<IdemSlot>();

fn shard_of(fp: u64) -> usize {
    (fp >> (64 - SHARD_BITS)) as usize
}

/// The first slot to probe among `n` of a table: the fingerprint's bits
/// below the shard's (already mixed) scaled to `n` (multiply-shift), so
/// `n` need not be a power of two.
fn home(fp: u64, n: usize) -> usize {
    ((u128::from(fp << SHARD_BITS) * n as u128) >> 64) as usize
}

impl Run {
    /// A run of `entries` (sorted): in `file` when it has room and they
    /// fill at least half a page.
    fn of(entries: Vec<IdemSlot>, file: Option<&Arc<Arena>>) -> Self {
        if entries.is_empty() {
            return Run::Empty;
        }
        let worth_a_page = entries.len() >= FILED_SHARD_MIN;
        match file
            .filter(|_| worth_a_page)
            .and_then(|f| f.store(&entries))
        {
            Some(block) => Run::InFile(Arc::new(block)),
            None => Run::Heap(entries.into()),
        }
    }

    fn as_slice(&self) -> &[IdemSlot] {
        match self {
            Run::Empty => &[],
            Run::Heap(s) => s,
            Run::InFile(b) => b.as_slice(),
        }
    }

    /// Bytes allocated on the heap: the keys and the `Arc`'s counts.
    fn heap_bytes(&self) -> u64 {
        match self {
            Run::Heap(s) => s.len() as u64 * SLOT_BYTES + 16,
            _ => 0,
        }
    }
}

impl Shard {
    /// Every key, sorted: the run as it is when there is no table.
    fn sorted_entries(&self) -> Cow<'_, [IdemSlot]> {
        let run = self.run.as_slice();
        if self.table_len == 0 {
            return Cow::Borrowed(run);
        }
        let mut table: Vec<IdemSlot> = self.table.iter().filter(|s| **s != FREE).copied().collect();
        table.sort_unstable();
        let mut out = Vec::with_capacity(run.len() + table.len());
        let (mut i, mut j) = (0, 0);
        while i < run.len() && j < table.len() {
            if run[i] <= table[j] {
                out.push(run[i]);
                i += 1;
            } else {
                out.push(table[j]);
                j += 1;
            }
        }
        out.extend_from_slice(&run[i..]);
        out.extend_from_slice(&table[j..]);
        Cow::Owned(out)
    }

    /// Takes `slot` into the table, and merges the table into a new run
    /// (in `file` if given) once it is large enough.
    fn insert(&mut self, slot: IdemSlot, file: Option<&Arc<Arena>>) {
        if (self.table_len + 1) * 8 > self.table.len() * 7 {
            // Doubling while small: a table starts empty after every merge,
            // and growing it a few slots at a time would rehash it a dozen
            // times before the next.
            let n = self.table.len();
            let cap = if n < 256 { (2 * n).max(8) } else { n + n / 8 };
            let old = std::mem::replace(&mut self.table, vec![FREE; cap]);
            for e in old.into_iter().filter(|e| *e != FREE) {
                put(&mut self.table, e);
            }
        }
        put(&mut self.table, slot);
        self.table_len += 1;
        let due = MERGE_MIN.max(self.run.as_slice().len() / MERGE_FRACTION);
        if self.table_len >= due {
            self.merge(file);
        }
    }

    /// Writes the run and the table as one run.
    fn merge(&mut self, file: Option<&Arc<Arena>>) {
        *self = Shard {
            run: Run::of(self.sorted_entries().into_owned(), file),
            table: Vec::new(),
            table_len: 0,
        };
    }

    /// Moves a run on the heap into `file` (if it has room).
    fn move_run_to(&mut self, file: &Arc<Arena>) {
        if let Run::Heap(s) = &self.run {
            if let filed @ Run::InFile(_) = Run::of(s.to_vec(), Some(file)) {
                self.run = filed;
            }
        }
    }

    fn matching(&self, fp: u64, mut found: impl FnMut(&IdemSlot)) {
        let run = self.run.as_slice();
        let from = first_at_or_above(run, fp);
        run[from..]
            .iter()
            .take_while(|e| e.fp == fp)
            .for_each(&mut found);
        let n = self.table.len();
        if n == 0 {
            return;
        }
        let mut i = home(fp, n);
        while self.table[i] != FREE {
            if self.table[i].fp == fp {
                found(&self.table[i]);
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
    }
}

/// The index of the first entry of a shard's `run` (sorted) whose
/// fingerprint is at least `fp`: `run.partition_point(|e| e.fp < fp)`.
/// Fingerprints are uniform within a shard, so that entry is near
/// `home(fp, len)`. The search gallops out from there and ends with a
/// binary search: a page or two of a filed run, where a binary search
/// from the middle touches a page per halving.
fn first_at_or_above(run: &[IdemSlot], fp: u64) -> usize {
    let n = run.len();
    if n == 0 {
        return 0;
    }
    let guess = home(fp, n).min(n - 1);
    // The answer is in lo..=hi.
    let (mut lo, mut hi);
    let mut step = 1;
    if run[guess].fp < fp {
        lo = guess + 1;
        loop {
            let probe = guess + step;
            if probe >= n {
                hi = n;
                break;
            }
            if run[probe].fp >= fp {
                hi = probe;
                break;
            }
            lo = probe + 1;
            step *= 2;
        }
    } else {
        hi = guess;
        loop {
            let Some(probe) = guess.checked_sub(step) else {
                lo = 0;
                break;
            };
            if run[probe].fp < fp {
                lo = probe + 1;
                break;
            }
            hi = probe;
            step *= 2;
        }
    }
    lo + run[lo..hi].partition_point(|e| e.fp < fp)
}

impl Bucket {
    fn open(start_ms: TimestampMs, end_ms: TimestampMs, base_id: MsgId) -> Self {
        Bucket {
            start_ms,
            end_ms,
            base_id,
            shards: Arc::new(Vec::new()),
            len: 0,
            merged: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes allocated on the heap: tables, runs there, and each shard's
    /// `Arc` and pointer.
    fn allocated(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.table.capacity() as u64 * SLOT_BYTES + s.run.heap_bytes() + SHARD_BYTES)
            .sum()
    }

    /// The offset of `msg_id` from this bucket's base, when it fits.
    fn delta(&self, msg_id: MsgId) -> Option<u32> {
        msg_id
            .0
            .checked_sub(self.base_id.0)
            .and_then(|d| u32::try_from(d).ok())
    }

    /// Each shard's entries, sorted, shards in order: all the entries
    /// sorted (what a checkpoint stores), as a shard is a range of
    /// fingerprints. One shard at a time, so that writing a bucket never
    /// holds a copy of it whole.
    pub fn sorted_shards(&self) -> impl Iterator<Item = Cow<'_, [IdemSlot]>> {
        self.shards.iter().map(|s| s.sorted_entries())
    }

    /// The entries, sorted.
    #[cfg(test)]
    pub fn entries(&self) -> Vec<IdemSlot> {
        self.sorted_shards().flat_map(|s| s.into_owned()).collect()
    }

    fn insert(&mut self, slot: IdemSlot, file: Option<&Arc<Arena>>) {
        let shards = Arc::make_mut(&mut self.shards);
        if shards.is_empty() {
            shards.resize_with(SHARDS, Default::default);
        }
        Arc::make_mut(&mut shards[shard_of(slot.fp)]).insert(slot, file);
        self.len += 1;
    }

    /// Merges the next shard's table into its run, in `file` if given;
    /// false when every shard is merged. Only for a closed bucket: the
    /// table never asks its newest.
    fn merge_one(&mut self, file: Option<&Arc<Arena>>) -> bool {
        if self.merged >= self.shards.len() {
            return false;
        }
        let i = self.merged;
        self.merged += 1;
        if self.shards[i].table_len > 0 {
            Arc::make_mut(&mut Arc::make_mut(&mut self.shards)[i]).merge(file);
        }
        true
    }

    /// Moves its runs on the heap into `file` (those it has room for).
    fn move_runs_to(&mut self, file: &Arc<Arena>) {
        for i in 0..self.shards.len() {
            if let Run::Heap(_) = self.shards[i].run {
                Arc::make_mut(&mut Arc::make_mut(&mut self.shards)[i]).move_run_to(file);
            }
        }
    }

    /// Entries and page bytes of its runs in the scratch file.
    fn in_file(&self) -> (u64, u64) {
        self.shards
            .iter()
            .fold((0, 0), |(n, bytes), s| match &s.run {
                Run::InFile(b) => (n + b.as_slice().len() as u64, bytes + b.page_bytes() as u64),
                _ => (n, bytes),
            })
    }

    /// The entries whose fingerprint is `fp`, as candidates.
    fn matching(&self, fp: u64, out: &mut Vec<Candidate>) {
        if let Some(shard) = self.shards.get(shard_of(fp)) {
            shard.matching(fp, |e| {
                out.push(Candidate {
                    conv: e.conv,
                    seq_lo: e.seq_lo,
                    msg_id: MsgId(self.base_id.0 + u64::from(e.id_delta)),
                })
            });
        }
    }
}

/// Heap bytes of a shard besides its keys: the shard, its `Arc`'s counts
/// and the bucket's pointer to it.
const SHARD_BYTES: u64 = (std::mem::size_of::<Shard>() + 16 + 8) as u64;

fn put(slots: &mut [IdemSlot], e: IdemSlot) {
    let n = slots.len();
    let mut i = home(e.fp, n);
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
    /// Where sorted shards go; the heap without one.
    file: Option<Arc<Arena>>,
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
                (a.start_ms, a.end_ms, a.base_id) == (b.start_ms, b.end_ms, b.base_id)
                    && a.len == b.len
                    && a.sorted_shards()
                        .filter(|s| !s.is_empty())
                        .eq(b.sorted_shards().filter(|s| !s.is_empty()))
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

/// An entry as a checkpoint written before keys were compact holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Whole {
    pub msg_id: MsgId,
    pub tag: [u64; 2],
    pub conv: ConvId,
    pub msg_seq: MsgSeq,
}

/// A key and where its send went, as [`IdemTable::insert`] takes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sent {
    pub sender: Uid,
    pub cmid: ClientMsgId,
    pub conv: ConvId,
    pub msg_seq: MsgSeq,
    pub msg_id: MsgId,
}

impl IdemTable {
    /// A table whose tags use `spread` (tests force shared tags with it).
    pub fn with_spread(spread: Spread) -> Self {
        IdemTable {
            buckets: VecDeque::new(),
            spread,
            file: None,
        }
    }

    /// Keeps runs in `file` from now on, and moves those on the heap there
    /// now.
    pub fn use_file(&mut self, file: &Arc<Arena>) {
        for b in &mut self.buckets {
            b.move_runs_to(file);
        }
        self.file = Some(file.clone());
    }

    /// Entries and page bytes of the runs in the scratch file.
    pub fn in_file(&self) -> (u64, u64) {
        self.buckets
            .iter()
            .map(Bucket::in_file)
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
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
            live: (self.len() as u64 - self.in_file().0) * SLOT_BYTES,
            allocated: self
                .buckets
                .iter()
                .map(|b| b.allocated() + bucket)
                .sum::<u64>()
                + (self.buckets.capacity() - self.buckets.len()) as u64 * bucket,
        }
    }

    /// The entries that may be `(sender, cmid)`'s at `now`, newest bucket
    /// first: their fingerprint matches and their bucket is not past the
    /// TTL. The caller keeps the one whose message `sender` sent.
    pub fn candidates(
        &self,
        sender: Uid,
        cmid: ClientMsgId,
        now: TimestampMs,
        ttl_ms: u64,
    ) -> Vec<Candidate> {
        let fp = fingerprint(tag_of(self.spread, sender, cmid));
        let horizon = now.saturating_sub(ttl_ms);
        let mut out = Vec::new();
        for b in self.buckets.iter().rev() {
            if b.end_ms <= horizon {
                break;
            }
            b.matching(fp, &mut out);
        }
        out
    }

    /// Remembers a send made at `at_ms`, dropping the buckets wholly past
    /// the TTL by then.
    pub fn insert(&mut self, sent: Sent, at_ms: TimestampMs, ttl_ms: u64) {
        let horizon = at_ms.saturating_sub(ttl_ms);
        while self.buckets.front().is_some_and(|b| b.end_ms <= horizon) {
            self.buckets.pop_front();
        }
        let new_span = match self.buckets.back() {
            Some(b) if at_ms < b.end_ms && b.delta(sent.msg_id).is_some() => None,
            // Ids ran 2^32 past the base within one span: the same span
            // again, from this id.
            Some(b) if at_ms < b.end_ms => Some((b.start_ms, b.end_ms)),
            _ => Some(self.span_of(at_ms, ttl_ms)),
        };
        if let Some((start, end)) = new_span {
            self.buckets
                .push_back(Bucket::open(start, end, sent.msg_id));
        }
        let b = self.buckets.back_mut().expect("pushed above");
        let id_delta = b
            .delta(sent.msg_id)
            .expect("a bucket's ids fit: checked above");
        let slot = IdemSlot {
            fp: fingerprint(tag_of(self.spread, sent.sender, sent.cmid)),
            conv: sent.conv,
            seq_lo: sent.msg_seq.0 as u32,
            id_delta,
        };
        b.insert(slot, self.file.as_ref());
        // A closed bucket's tables are merged one shard per insert: a
        // bucket closes once per span, so its merging is done long before
        // the next closes, at 1/1024 of a bucket per step.
        let closed = self.buckets.len() - 1;
        for b in self.buckets.iter_mut().take(closed) {
            if b.merge_one(self.file.as_ref()) {
                break;
            }
        }
    }

    /// The span of a new bucket for a send at `at_ms`: aligned to the
    /// width, but never before the last bucket's end, as the TTL (so the
    /// width) may have changed since a restart.
    fn span_of(&self, at_ms: TimestampMs, ttl_ms: u64) -> (TimestampMs, TimestampMs) {
        let width = (ttl_ms / BUCKETS_PER_TTL).max(1);
        let prev_end = self.buckets.back().map_or(0, |b| b.end_ms);
        let aligned = at_ms - at_ms % width;
        (
            aligned.max(prev_end),
            aligned.saturating_add(width).max(at_ms + 1),
        )
    }

    /// Appends a bucket of an older checkpoint, whose entries are whole
    /// (oldest first): by msg_id, in buckets of its span, a new one where
    /// ids run 2^32 past the last one's base.
    pub fn push_whole(
        &mut self,
        start_ms: TimestampMs,
        end_ms: TimestampMs,
        mut entries: Vec<Whole>,
    ) {
        entries.sort_unstable_by_key(|e| e.msg_id);
        let mut rest = entries.as_slice();
        while let Some(first) = rest.first() {
            let base = first.msg_id;
            let n = rest.partition_point(|e| e.msg_id.0 - base.0 <= u64::from(u32::MAX));
            let slots = rest[..n]
                .iter()
                .map(|e| IdemSlot {
                    fp: fingerprint(e.tag),
                    conv: e.conv,
                    seq_lo: e.msg_seq.0 as u32,
                    id_delta: (e.msg_id.0 - base.0) as u32,
                })
                .collect();
            self.push_decoded(start_ms, end_ms, base, slots);
            rest = &rest[n..];
        }
    }

    /// Appends a decoded bucket (oldest first). Its entries become the
    /// shards' runs, with no tables: the newest bucket takes inserts into
    /// tables from there.
    pub fn push_decoded(
        &mut self,
        start_ms: TimestampMs,
        end_ms: TimestampMs,
        base_id: MsgId,
        mut entries: Vec<IdemSlot>,
    ) {
        if let Some(b) = self.buckets.back_mut() {
            while b.merge_one(self.file.as_ref()) {}
        }
        // A checkpoint's entries are sorted already (then this is one
        // pass); an older checkpoint's converted ones are not.
        if !entries.is_sorted() {
            entries.sort_unstable();
        }
        let mut b = Bucket::open(start_ms, end_ms, base_id);
        b.len = entries.len();
        if !entries.is_empty() {
            let mut shards: Vec<Arc<Shard>> = (0..SHARDS).map(|_| Arc::default()).collect();
            for run in entries.chunk_by(|x, y| shard_of(x.fp) == shard_of(y.fp)) {
                shards[shard_of(run[0].fp)] = Arc::new(Shard {
                    run: Run::of(run.to_vec(), self.file.as_ref()),
                    ..Shard::default()
                });
            }
            b.shards = Arc::new(shards);
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

    fn sent(sender: Uid, cmid: u128, conv: ConvId, msg_seq: MsgSeq, msg_id: MsgId) -> Sent {
        Sent {
            sender,
            cmid,
            conv,
            msg_seq,
            msg_id,
        }
    }

    fn ids(v: &[Candidate]) -> Vec<u64> {
        v.iter().map(|s| s.msg_id.0).collect()
    }

    #[test]
    fn keys_with_the_same_tag_are_all_candidates_in_open_and_closed_buckets() {
        // Without a spread the tag is the client_msg_id: two senders'
        // key 7 share it.
        let mut t = IdemTable::with_spread(no_spread);
        let ttl = 1_600;
        t.insert(sent(Uid(1), 7, ConvId(10), MsgSeq(1), MsgId(101)), 0, ttl);
        t.insert(sent(Uid(2), 7, ConvId(10), MsgSeq(2), MsgId(102)), 1, ttl);
        t.insert(sent(Uid(2), 8, ConvId(10), MsgSeq(3), MsgId(103)), 2, ttl);
        assert_eq!(ids(&t.candidates(Uid(1), 7, 3, ttl)), [101, 102]);
        // A later bucket closes the first one: same answers.
        t.insert(sent(Uid(3), 7, ConvId(10), MsgSeq(4), MsgId(104)), 150, ttl);
        assert_eq!(t.buckets().count(), 2);
        assert_eq!(ids(&t.candidates(Uid(1), 7, 151, ttl)), [104, 101, 102]);
        assert_eq!(ids(&t.candidates(Uid(1), 9, 151, ttl)), Vec::<u64>::new());
    }

    #[test]
    fn a_bucket_is_dropped_once_all_its_keys_are_past_the_ttl() {
        let mut t = IdemTable::default();
        let ttl = 1_600; // buckets of 100 ms
        t.insert(sent(Uid(1), 1, ConvId(1), MsgSeq(1), MsgId(1)), 50, ttl);
        // At 1,650 the key is exactly the TTL old: still remembered.
        assert_eq!(t.candidates(Uid(1), 1, 1_650, ttl).len(), 1);
        // Its bucket ends at 100: from 1,700 on it is answered no more...
        assert_eq!(t.candidates(Uid(1), 1, 1_700, ttl).len(), 0);
        // ...and the next insert drops it.
        t.insert(sent(Uid(1), 2, ConvId(1), MsgSeq(2), MsgId(2)), 1_700, ttl);
        assert_eq!(t.len(), 1);
        assert_eq!(t.buckets().count(), 1);
    }

    #[test]
    fn buckets_stay_ordered_and_disjoint_when_the_ttl_changes() {
        let mut t = IdemTable::default();
        // Buckets of 100 ms, then (after a restart with another TTL) of 1 s.
        t.insert(sent(Uid(1), 1, ConvId(1), MsgSeq(1), MsgId(1)), 950, 1_600);
        t.insert(
            sent(Uid(1), 2, ConvId(1), MsgSeq(2), MsgId(2)),
            1_010,
            16_000,
        );
        t.insert(
            sent(Uid(1), 3, ConvId(1), MsgSeq(3), MsgId(3)),
            2_500,
            16_000,
        );
        let spans: Vec<(u64, u64)> = t.buckets().map(|b| (b.start_ms, b.end_ms)).collect();
        assert_eq!(spans, [(900, 1_000), (1_000, 2_000), (2_000, 3_000)]);
        t.insert(
            sent(Uid(1), 4, ConvId(1), MsgSeq(4), MsgId(4)),
            3_050,
            1_600,
        );
        let last = t.buckets().last().map(|b| (b.start_ms, b.end_ms));
        assert_eq!(last, Some((3_000, 3_100)));
        assert_eq!(t.candidates(Uid(1), 2, 3_050, 16_000).len(), 1);
    }

    #[test]
    fn the_open_bucket_grows_and_finds_every_key() {
        let mut t = IdemTable::default();
        for i in 0..10_000u64 {
            t.insert(
                sent(
                    Uid(i % 7),
                    i as u128,
                    ConvId(1),
                    MsgSeq(i + 1),
                    MsgId(i + 1),
                ),
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
                sent(Uid(1), i as u128, ConvId(1), MsgSeq(i + 1), MsgId(i + 1)),
                i * 30,
                1_600,
            );
        }
        let mut d = IdemTable::default();
        for b in t.buckets() {
            d.push_decoded(b.start_ms, b.end_ms, b.base_id, b.entries());
        }
        assert_eq!(d, t);
        assert_eq!(ids(&d.candidates(Uid(1), 99, 3_000, 1_600)), [100]);
    }

    #[test]
    fn ids_more_than_2_to_the_32_past_a_buckets_base_start_a_bucket_of_the_same_span() {
        let mut t = IdemTable::default();
        let far = (1u64 << 32) + 5;
        t.insert(sent(Uid(1), 1, ConvId(1), MsgSeq(1), MsgId(5)), 10, 1_600);
        t.insert(
            sent(Uid(1), 2, ConvId(1), MsgSeq(2), MsgId(far - 1)),
            20,
            1_600,
        );
        t.insert(
            sent(Uid(1), 3, ConvId(1), MsgSeq(3), MsgId(far + 1)),
            30,
            1_600,
        );
        let spans: Vec<(u64, u64, u64)> = t
            .buckets()
            .map(|b| (b.start_ms, b.end_ms, b.base_id.0))
            .collect();
        assert_eq!(spans, [(0, 100, 5), (0, 100, far + 1)]);
        for (cmid, id) in [(1, 5), (2, far - 1), (3, far + 1)] {
            assert_eq!(ids(&t.candidates(Uid(1), cmid, 40, 1_600)), [id]);
        }
        // Both go together, once past the TTL.
        t.insert(
            sent(Uid(1), 4, ConvId(1), MsgSeq(4), MsgId(far + 2)),
            1_700,
            1_600,
        );
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_copy_shares_every_shard_and_an_insert_afterwards_copies_only_its_own() {
        let mut t = IdemTable::default();
        for i in 0..5_000u64 {
            t.insert(
                sent(Uid(1), i as u128, ConvId(1), MsgSeq(i + 1), MsgId(i + 1)),
                0,
                1_600,
            );
        }
        let copy = t.clone();
        t.insert(
            sent(Uid(1), 9_999, ConvId(1), MsgSeq(5_001), MsgId(5_001)),
            0,
            1_600,
        );
        let (a, b) = (&t.buckets[0].shards, &copy.buckets[0].shards);
        let shared = a
            .iter()
            .zip(b.iter())
            .filter(|(x, y)| Arc::ptr_eq(x, y))
            .count();
        assert_eq!(shared, SHARDS - 1, "one shard copied");
        assert_eq!(copy.len(), 5_000);
        assert_eq!(ids(&t.candidates(Uid(1), 9_999, 0, 1_600)), [5_001]);
        assert!(copy.candidates(Uid(1), 9_999, 0, 1_600).is_empty());
    }

    #[test]
    fn a_closed_buckets_tables_are_merged_a_shard_per_insert_and_answer_the_same_meanwhile() {
        let mut t = IdemTable::default();
        let ttl = 16_000; // buckets of 1 s
        for i in 0..3_000u64 {
            t.insert(
                sent(Uid(2), i as u128, ConvId(1), MsgSeq(i + 1), MsgId(i + 1)),
                10,
                ttl,
            );
        }
        // About 3 keys a shard: all still in tables.
        let with_table = |t: &IdemTable, from: usize| {
            t.buckets[0].shards[from..]
                .iter()
                .filter(|s| s.table_len > 0)
                .count()
        };
        assert!(with_table(&t, 0) > SHARDS * 9 / 10, "{}", with_table(&t, 0));
        let before = t.buckets[0].entries();
        for j in 0..SHARDS as u64 + 10 {
            let k = 3_000 + j;
            t.insert(
                sent(Uid(2), k as u128, ConvId(1), MsgSeq(k + 1), MsgId(k + 1)),
                1_500,
                ttl,
            );
            let merged = (j as usize + 1).min(SHARDS);
            assert_eq!(t.buckets[0].merged, merged);
            assert_eq!(
                with_table(&t, 0),
                with_table(&t, merged),
                "none below {merged}"
            );
            for i in [0u64, 1_234, 2_999] {
                assert_eq!(ids(&t.candidates(Uid(2), i as u128, 1_500, ttl)), [i + 1]);
            }
        }
        assert_eq!(with_table(&t, 0), 0);
        assert_eq!(t.buckets[0].entries(), before);
        let runs = t.buckets[0]
            .shards
            .iter()
            .filter(|s| matches!(s.run, Run::Heap(_)))
            .count() as u64;
        assert_eq!(
            t.buckets[0].allocated(),
            before.len() as u64 * SLOT_BYTES + runs * 16 + SHARDS as u64 * SHARD_BYTES
        );
    }

    #[test]
    fn a_closed_buckets_runs_go_to_the_scratch_file_and_answer_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let file = Arena::open(dir.path()).unwrap();
        let ttl = 16_000; // buckets of 1 s
                          // Three closed buckets of 100,000 keys: about 98 per shard, so
                          // most shards fill the half page that takes them to the file.
        let per = 100_000u64;
        let fill = |t: &mut IdemTable| {
            for i in 0..3 * per {
                t.insert(
                    sent(Uid(2), i as u128, ConvId(1), MsgSeq(i + 1), MsgId(i + 1)),
                    10 + i / per * 1_000,
                    ttl,
                );
            }
            for j in 0..3 * SHARDS as u64 {
                let k = 3 * per + j;
                t.insert(
                    sent(Uid(2), k as u128, ConvId(1), MsgSeq(k + 1), MsgId(k + 1)),
                    3_500,
                    ttl,
                );
            }
        };
        let mut heap = IdemTable::default();
        fill(&mut heap);
        let mut filed = IdemTable::default();
        filed.use_file(&file);
        fill(&mut filed);
        assert_eq!(filed, heap, "the same entries in the same buckets");
        let big_enough: u64 = heap
            .buckets
            .iter()
            .take(3)
            .flat_map(|b| b.shards.iter())
            .map(|s| {
                assert_eq!(s.table_len, 0, "closed buckets are merged");
                s.run.as_slice().len()
            })
            .filter(|n| *n >= FILED_SHARD_MIN)
            .map(|n| n as u64)
            .sum();
        let (n, pages) = filed.in_file();
        assert_eq!(n, big_enough, "every closed shard of half a page or more");
        assert!(n > 2 * per, "most keys: {n}");
        assert_eq!(pages, file.block_bytes());
        assert_eq!(
            filed.bytes().live + n * SLOT_BYTES,
            heap.bytes().live,
            "what is in the file is not counted on the heap"
        );
        for i in [
            0u64,
            per - 1,
            per,
            3 * per - 1,
            3 * per,
            3 * per + 3 * SHARDS as u64 - 1,
        ] {
            assert_eq!(
                ids(&filed.candidates(Uid(2), i as u128, 3_500, ttl)),
                [i + 1],
                "key {i}"
            );
        }
        // A table moved to the file later answers the same, and frees its
        // pages when its buckets expire.
        let mut late = heap.clone();
        late.use_file(&file);
        assert_eq!(late.in_file().0, big_enough);
        assert_eq!(late, heap);
        drop(filed);
        late.insert(
            sent(Uid(2), 9, ConvId(1), MsgSeq(9_999), MsgId(9_999)),
            40_000,
            ttl,
        );
        assert_eq!(late.in_file(), (0, 0));
        assert_eq!(file.block_bytes(), 0, "the expired buckets' pages are gone");
    }

    #[test]
    fn the_newest_bucket_merges_its_tables_into_runs_in_the_file_and_keeps_them_small() {
        let dir = tempfile::tempdir().unwrap();
        let file = Arena::open(dir.path()).unwrap();
        let ttl = 16_000; // buckets of 1 s; every key here in one
        let n = 300_000u64; // about 293 a shard
        let key = |i: u64| sent(Uid(3), i as u128, ConvId(4), MsgSeq(i + 1), MsgId(i + 1));
        let mut heap = IdemTable::default();
        let mut filed = IdemTable::default();
        filed.use_file(&file);
        let mut copy = None;
        for i in 0..n {
            heap.insert(key(i), 10, ttl);
            filed.insert(key(i), 10, ttl);
            if i == n / 2 {
                // A checkpoint's copy, taken half way.
                copy = Some(filed.clone());
            }
        }
        let copy = copy.unwrap();
        assert_eq!(filed.buckets().count(), 1);
        assert_eq!(filed, heap, "the same entries wherever they are");
        let b = &filed.buckets[0];
        let in_tables: usize = b.shards.iter().map(|s| s.table_len).sum();
        let (in_runs, pages) = filed.in_file();
        assert_eq!(in_runs + in_tables as u64, n, "every run is in the file");
        // About 293 keys a shard: each merged several times, at a quarter
        // page of keys.
        assert!(
            in_runs > n / 2 && in_tables <= SHARDS * MERGE_MIN,
            "merged at a quarter page of keys a shard: {in_runs} in runs, {in_tables} in tables"
        );
        assert!(b
            .shards
            .iter()
            .all(|s| s.table_len < MERGE_MIN.max(s.run.as_slice().len() / MERGE_FRACTION)));
        let widest = b.shards.iter().map(|s| s.table.len()).max().unwrap();
        assert!(
            widest <= 64,
            "a young bucket's tables stay at 64 slots (1.5 KiB) at most: one has {widest}"
        );
        assert_eq!(
            filed.bytes().live,
            in_tables as u64 * SLOT_BYTES,
            "only the tables on the heap"
        );
        for i in (0..n).step_by(7).chain([n - 1]) {
            let c = filed.candidates(Uid(3), i as u128, 10, ttl);
            assert_eq!(ids(&c), [i + 1], "key {i}");
        }
        // The copy still answers as it was: the runs it shares were not
        // written over, and the later keys are not in it.
        assert_eq!(copy.len() as u64, n / 2 + 1);
        assert_eq!(ids(&copy.candidates(Uid(3), 77, 10, ttl)), [78]);
        assert!(copy.candidates(Uid(3), (n - 1) as u128, 10, ttl).is_empty());
        assert!(file.block_bytes() > pages, "the copy holds older runs");
        drop(copy);
        assert_eq!(file.block_bytes(), pages, "and gives them back");
        // Decoded from what a checkpoint stores, the runs go straight to
        // the file, with no tables.
        let mut decoded = IdemTable::default();
        decoded.use_file(&file);
        for b in filed.buckets() {
            decoded.push_decoded(b.start_ms, b.end_ms, b.base_id, b.entries());
        }
        assert_eq!(decoded, filed);
        assert_eq!(decoded.in_file().0, n);
        assert_eq!(decoded.bytes().live, 0);
        assert_eq!(ids(&decoded.candidates(Uid(3), 12_345, 10, ttl)), [12_346]);
    }

    #[test]
    fn the_search_from_a_runs_guessed_place_finds_what_a_binary_search_finds() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            x = mix64(x.wrapping_add(0x9e37_79b9_7f4a_7c15));
            x
        };
        let shard = 0x2a5u64 << (64 - SHARD_BITS);
        let low = |v: u64| v >> SHARD_BITS;
        for n in [0usize, 1, 2, 3, 17, 170, 1_000, 4_096] {
            // Uniform, bunched at one end, and with runs of one value.
            for shape in 0..3 {
                let mut run: Vec<IdemSlot> = (0..n)
                    .map(|i| {
                        let fp = match shape {
                            0 => shard | low(next()),
                            1 => shard | (low(next()) >> 40),
                            _ => shard | ((i as u64 / 5) << 20),
                        };
                        IdemSlot { fp, ..FREE }
                    })
                    .collect();
                run.sort_unstable();
                let mut asks: Vec<u64> = run.iter().map(|e| e.fp).collect();
                asks.extend((0..200).map(|_| shard | low(next())));
                asks.extend([shard, shard | (u64::MAX >> SHARD_BITS)]);
                asks.extend(run.iter().map(|e| e.fp.wrapping_add(1) | shard));
                for fp in asks {
                    assert_eq!(
                        first_at_or_above(&run, fp),
                        run.partition_point(|e| e.fp < fp),
                        "n {n}, shape {shape}, fp {fp:x}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_seq_is_made_whole_from_its_low_bits_and_the_head_at_or_above_it() {
        let big = (7u64 << 32) + 3;
        assert_eq!(seq_below(MsgSeq(big), 3), Some(MsgSeq(big)));
        assert_eq!(seq_below(MsgSeq(big), 2), Some(MsgSeq(big - 1)));
        // Low bits above the head's: the seq is in the previous 2^32.
        assert_eq!(
            seq_below(MsgSeq(big), 9),
            Some(MsgSeq(big - 3 - (1 << 32) + 9))
        );
        assert_eq!(seq_below(MsgSeq(5), 5), Some(MsgSeq(5)));
        // A conversation whose head is below the seq never held it.
        assert_eq!(seq_below(MsgSeq(5), 6), None);
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
            .insert(sent(Uid(1), 7, ConvId(10), MsgSeq(1), MsgId(101)), 0, 1_000);
        st.idem
            .insert(sent(Uid(2), 7, ConvId(10), MsgSeq(2), MsgId(102)), 0, 1_000);
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
