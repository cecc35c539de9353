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
//! ([`crate::inbox::containers::spill`]), a run goes there, in pages mapped shared, instead
//! of the heap: what stays on the heap is the tables (the newest keys,
//! the ones retries find) and a handle per shard.
//!
//! Like the rest of the state, the table changes only in `apply`, judged
//! by the time stamped in the record being applied, so replay builds the
//! same table.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

use crate::api::*;
use crate::inbox::containers::spill::{Arena, Block, Plain};

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
const FILED_SHARD_MIN: usize =
    crate::inbox::containers::spill::PAGE / 2 / std::mem::size_of::<IdemSlot>();

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
const MERGE_MIN: usize =
    crate::inbox::containers::spill::PAGE / 4 / std::mem::size_of::<IdemSlot>();

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
mod tests;
