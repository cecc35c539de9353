//! A user's event index: the location of each retained event, packed to
//! 4 or 5 bytes where the locations allow it, 8 where they do not.
//!
//! Every event of a user points into the `evt` log, at a segment and an
//! offset. The events a user keeps were written over a stretch of that
//! log, so a location is stored as its segment's distance from a base
//! segment (the lowest the list holds) and its offset, 27 bits of it (a
//! 128 MiB segment, the default):
//!
//! | width | segments after the base | log spanned at 128 MiB segments |
//! |---|---|---|
//! | 4 bytes | 0 to 30 | about 4 GiB |
//! | 5 bytes | 0 to 8,190 | about 1 TiB |
//! | 8 bytes | any (the location as it is) | any |
//!
//! A list takes the narrowest width that holds every entry. A location
//! that does not fit (far from the base, below it, or at an offset of
//! 128 MiB or more in a larger segment) widens the whole list once, and a
//! list that sheds its front ([`EventLocs::remove_front`]) narrows again
//! when what is left allows it. Either is a pass over the list, as the
//! shedding itself is. [`PENDING_LOC`] is the all-ones entry of every
//! width.
//!
//! The list is one byte vector, as small inline as the `Vec<u64>` it
//! replaces: a 5-byte header (the width and the base segment), then the
//! entries. Two lists are equal when they hold the same locations,
//! whatever their widths.

use super::loc::{pack_near, unpack_near, PackedLoc, NO_BASE, PENDING_LOC};

/// Header: the width (1 byte), then the base segment (4 bytes, LE).
const HEADER: usize = 5;

#[derive(Clone, Default)]
pub(crate) struct EventLocs {
    /// Empty, or [`HEADER`] bytes then `len` entries of `width` bytes.
    bytes: Vec<u8>,
}

/// How a list of one width encodes a location relative to one base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Form {
    width: usize,
    base: u32,
}

impl Form {
    const WIDE: usize = 8;

    /// Bits of segment distance in an entry of a narrow width; the other
    /// 27 are the offset ([`pack_near`]).
    fn segment_bits(width: usize) -> u32 {
        8 * width as u32 - 27
    }

    /// The entry of `loc` in this form; `None` when it does not fit. A
    /// narrow form without a base ([`NO_BASE`]: its entries so far are
    /// pending, which any base holds) takes `loc`'s segment as its base
    /// ([`pack_near`]); the caller keeps the form only if `loc` fits.
    fn encode(&mut self, loc: PackedLoc) -> Option<u64> {
        if self.width == Self::WIDE {
            return Some(loc);
        }
        pack_near(loc, &mut self.base, Self::segment_bits(self.width))
    }

    fn decode(self, code: u64) -> PackedLoc {
        if self.width == Self::WIDE {
            return code;
        }
        unpack_near(code, self.base, Self::segment_bits(self.width))
    }

    /// The narrowest form that holds every location of `locs`.
    fn fitting(locs: impl Iterator<Item = PackedLoc> + Clone) -> Form {
        let real = locs.filter(|&l| l != PENDING_LOC);
        let Some(base) = real.clone().map(|l| (l >> 32) as u32).min() else {
            return Form {
                width: 4,
                base: NO_BASE,
            };
        };
        for width in [4, 5] {
            let mut form = Form { width, base };
            if real.clone().all(|l| form.encode(l).is_some()) {
                return form;
            }
        }
        Form {
            width: Self::WIDE,
            base: NO_BASE,
        }
    }
}

impl EventLocs {
    fn form(&self) -> Form {
        match self.bytes.get(..HEADER) {
            Some(h) => Form {
                width: usize::from(h[0]),
                base: u32::from_le_bytes([h[1], h[2], h[3], h[4]]),
            },
            None => Form {
                width: 4,
                base: NO_BASE,
            },
        }
    }

    fn set_form(&mut self, form: Form) {
        if self.bytes.len() < HEADER {
            self.bytes.resize(HEADER, 0);
        }
        self.bytes[0] = form.width as u8;
        self.bytes[1..HEADER].copy_from_slice(&form.base.to_le_bytes());
    }

    pub fn len(&self) -> usize {
        let width = self.form().width;
        self.bytes.len().saturating_sub(HEADER) / width
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn code_at(&self, i: usize, width: usize) -> u64 {
        let at = HEADER + i * width;
        read_code(&self.bytes[at..at + width])
    }

    fn put_code(&mut self, i: usize, width: usize, code: u64) {
        let at = HEADER + i * width;
        self.bytes[at..at + width].copy_from_slice(&code.to_le_bytes()[..width]);
    }

    pub fn get(&self, i: usize) -> Option<PackedLoc> {
        let form = self.form();
        (i < self.len()).then(|| form.decode(self.code_at(i, form.width)))
    }

    pub fn iter(&self) -> impl Iterator<Item = PackedLoc> + Clone + '_ {
        self.range(0, self.len())
            .expect("the whole list is a range of it")
    }

    /// The locations of entries `lo..hi`, or `None` when the range is not
    /// inside the list.
    pub fn range(
        &self,
        lo: usize,
        hi: usize,
    ) -> Option<impl Iterator<Item = PackedLoc> + Clone + '_> {
        if lo > hi || hi > self.len() {
            return None;
        }
        let form = self.form();
        let w = form.width;
        let codes = self
            .bytes
            .get(HEADER + lo * w..HEADER + hi * w)
            .unwrap_or_default();
        Some(
            codes
                .chunks_exact(w)
                .map(move |c| form.decode(read_code(c))),
        )
    }

    /// Appends, growing by a quarter of the list at a time into a block
    /// the allocator's size class fills (as the state's other lists do).
    pub fn push(&mut self, loc: PackedLoc) {
        let mut form = self.form();
        let Some(code) = form.encode(loc) else {
            let mut locs: Vec<PackedLoc> = self.iter().collect();
            locs.push(loc);
            self.rebuild(&locs);
            return;
        };
        self.keep_form(form);
        let width = form.width;
        if self.bytes.len() + width > self.bytes.capacity() {
            let len = self.len();
            let bytes =
                super::fitted_block(HEADER, self.bytes.len(), len + (len / 4).max(4), width);
            self.bytes.reserve_exact(bytes - self.bytes.len());
        }
        self.bytes.extend_from_slice(&code.to_le_bytes()[..width]);
    }

    /// Writes the header of `form` when the list has none yet or `form`
    /// took a base ([`Form::encode`]).
    fn keep_form(&mut self, form: Form) {
        if self.bytes.is_empty() || form != self.form() {
            self.set_form(form);
        }
    }

    /// Replaces entry `i` (a pending location made known, or a record that
    /// compaction moved) and returns what it held; `None` when there is no
    /// entry `i`.
    pub fn replace(&mut self, i: usize, loc: PackedLoc) -> Option<PackedLoc> {
        if i >= self.len() {
            return None;
        }
        let mut form = self.form();
        let old = form.decode(self.code_at(i, form.width));
        match form.encode(loc) {
            Some(code) => {
                self.keep_form(form);
                self.put_code(i, form.width, code);
            }
            None => {
                let mut locs: Vec<PackedLoc> = self.iter().collect();
                locs[i] = loc;
                self.rebuild(&locs);
            }
        }
        Some(old)
    }

    /// Changes every location with `f`.
    pub fn map_in_place(&mut self, mut f: impl FnMut(usize, PackedLoc) -> PackedLoc) {
        let locs: Vec<PackedLoc> = self.iter().enumerate().map(|(i, l)| f(i, l)).collect();
        self.rebuild(&locs);
    }

    /// Drops the first `n` entries (all, if fewer) and returns them. What is
    /// left is packed again when a narrower form now holds it.
    pub fn remove_front(&mut self, n: usize) -> Vec<PackedLoc> {
        let n = n.min(self.len());
        if n == 0 {
            return Vec::new();
        }
        let gone: Vec<PackedLoc> = self.iter().take(n).collect();
        let form = self.form();
        self.bytes.drain(HEADER..HEADER + n * form.width);
        if self.is_empty() {
            self.bytes = Vec::new();
            return gone;
        }
        // Narrower, or a higher base (more room ahead for new entries).
        let tighter = Form::fitting(self.iter());
        if tighter.width < form.width
            || (tighter.width == form.width && tighter.base > form.base && form.base != NO_BASE)
        {
            let locs: Vec<PackedLoc> = self.iter().collect();
            self.rebuild(&locs);
        }
        // Give back what a long backlog left unused, keeping room to grow.
        let used = self.bytes.len();
        if self.bytes.capacity() > 2 * used {
            self.bytes.shrink_to(2 * used);
        }
        gone
    }

    pub fn clear(&mut self) {
        self.bytes = Vec::new();
    }

    /// Bytes in use (header included).
    pub fn live_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Allocated bytes (header included).
    pub fn allocated_bytes(&self) -> usize {
        self.bytes.capacity()
    }

    /// The bytes an entry takes now.
    #[cfg(test)]
    fn width(&self) -> usize {
        self.form().width
    }

    /// Starts loading the lines a push reads and writes: the header (the
    /// width and base) and the end, where the entry goes.
    pub fn prefetch(&self) {
        crate::prefetch::prefetch(self.bytes.as_ptr());
        crate::prefetch::prefetch(self.bytes.as_ptr().wrapping_add(self.bytes.len()));
    }

    /// Holds exactly `locs`, in the narrowest form: in the block it has
    /// when that fits them without waste, else in one fitted to them with
    /// a quarter to grow.
    fn rebuild(&mut self, locs: &[PackedLoc]) {
        if locs.is_empty() {
            self.bytes = Vec::new();
            return;
        }
        let mut form = Form::fitting(locs.iter().copied());
        let len = locs.len();
        let used = HEADER + len * form.width;
        let mut bytes = std::mem::take(&mut self.bytes);
        if bytes.capacity() < used || bytes.capacity() > 2 * used {
            bytes = Vec::with_capacity(super::fitted_block(
                HEADER,
                used - form.width,
                len + (len / 4).max(4),
                form.width,
            ));
        }
        bytes.clear();
        bytes.push(form.width as u8);
        bytes.extend_from_slice(&form.base.to_le_bytes());
        for &loc in locs {
            let code = form
                .encode(loc)
                .expect("the fitting form holds every location");
            bytes.extend_from_slice(&code.to_le_bytes()[..form.width]);
        }
        self.bytes = bytes;
    }
}

/// An entry's code from its 4, 5 or 8 little-endian bytes.
fn read_code(bytes: &[u8]) -> u64 {
    match *bytes {
        [a, b, c, d] => u64::from(u32::from_le_bytes([a, b, c, d])),
        [a, b, c, d, e] => u64::from(u32::from_le_bytes([a, b, c, d])) | (u64::from(e) << 32),
        _ => u64::from_le_bytes(bytes.try_into().expect("an entry is 4, 5 or 8 bytes")),
    }
}

impl PartialEq for EventLocs {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for EventLocs {}

impl std::fmt::Debug for EventLocs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl FromIterator<PackedLoc> for EventLocs {
    fn from_iter<I: IntoIterator<Item = PackedLoc>>(iter: I) -> Self {
        let locs: Vec<PackedLoc> = iter.into_iter().collect();
        let mut list = EventLocs::default();
        list.rebuild(&locs);
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn loc(segment: u32, offset: u32) -> PackedLoc {
        u64::from(segment) << 32 | u64::from(offset)
    }

    #[test]
    fn a_burst_of_events_takes_four_bytes_each_and_reads_back() {
        let mut list = EventLocs::default();
        for i in 0..1000u32 {
            list.push(loc(7 + i / 300, i * 4000));
        }
        assert_eq!(list.width(), 4);
        assert_eq!(list.len(), 1000);
        assert_eq!(list.get(999), Some(loc(10, 999 * 4000)));
        assert!(
            list.allocated_bytes() < 1000 * 5,
            "{}",
            list.allocated_bytes()
        );
    }

    #[test]
    fn a_pending_entry_is_made_known_in_place() {
        let mut list = EventLocs::default();
        list.push(PENDING_LOC);
        list.push(PENDING_LOC);
        assert_eq!(list.get(1), Some(PENDING_LOC));
        assert_eq!(list.replace(0, loc(900, 12)), Some(PENDING_LOC));
        assert_eq!(list.replace(1, loc(900, 80)), Some(PENDING_LOC));
        assert_eq!(
            list.iter().collect::<Vec<_>>(),
            vec![loc(900, 12), loc(900, 80)]
        );
        assert_eq!(list.width(), 4);
        assert_eq!(list.replace(2, loc(900, 90)), None, "no entry 2");
    }

    #[test]
    fn a_location_far_from_the_base_widens_the_list_and_shedding_the_old_front_narrows_it() {
        let mut list = EventLocs::default();
        list.push(loc(1, 0));
        list.push(loc(40, 0));
        assert_eq!(list.width(), 5, "39 segments apart");
        list.push(loc(9_000, 100));
        assert_eq!(list.width(), 8, "8,999 segments apart");
        assert_eq!(list.remove_front(2), vec![loc(1, 0), loc(40, 0)]);
        assert_eq!(list.width(), 4);
        assert_eq!(list.iter().collect::<Vec<_>>(), vec![loc(9_000, 100)]);
    }

    #[test]
    fn a_location_below_the_base_or_past_a_narrow_offset_still_reads_back() {
        let mut list = EventLocs::default();
        list.push(loc(50, 10));
        list.push(loc(49, 10));
        assert_eq!(list.get(1), Some(loc(49, 10)));
        list.push(loc(50, 1 << 27));
        assert_eq!(list.width(), 8, "offset beyond 27 bits");
        assert_eq!(list.get(2), Some(loc(50, 1 << 27)));
    }

    /// Found by the property test below: shedding from a list with no
    /// entries indexed past its (absent) header.
    #[test]
    fn shedding_the_front_of_an_empty_list_is_a_no_op() {
        let mut list = EventLocs::default();
        assert_eq!(list.remove_front(3), Vec::<PackedLoc>::new());
        assert!(list.is_empty());
        list.push(loc(3, 3));
        assert_eq!(list.get(0), Some(loc(3, 3)));
    }

    #[test]
    fn lists_with_the_same_locations_are_equal_whatever_their_widths() {
        let mut a = EventLocs::default();
        a.push(loc(1, 0));
        a.push(loc(100, 0));
        a.remove_front(1);
        let mut b = EventLocs::default();
        b.push(loc(0, 0));
        b.push(loc(100_000, 0));
        b.push(loc(100, 0));
        b.remove_front(2);
        assert_eq!(a, b);
        let c: EventLocs = [loc(100, 0)].into_iter().collect();
        assert_eq!(a, c);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(PackedLoc),
        Set(usize, PackedLoc),
        RemoveFront(usize),
        Map(u32),
        Clear,
    }

    fn any_loc() -> impl Strategy<Value = PackedLoc> {
        prop_oneof![
            Just(PENDING_LOC),
            (0u32..40, 0u32..1 << 27).prop_map(|(s, o)| loc(1000 + s, o)),
            (0u32..20_000, 0u32..1 << 27).prop_map(|(s, o)| loc(s, o)),
            (0u32..(1 << 31), any::<u32>()).prop_map(|(s, o)| loc(s, o)),
        ]
    }

    fn any_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => any_loc().prop_map(Op::Push),
            3 => (0usize..80, any_loc()).prop_map(|(i, l)| Op::Set(i, l)),
            2 => (0usize..30).prop_map(Op::RemoveFront),
            1 => (0u32..50).prop_map(Op::Map),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        #[test]
        fn the_list_holds_what_a_plain_vector_of_locations_holds(
            ops in proptest::collection::vec(any_op(), 1..200)
        ) {
            let mut list = EventLocs::default();
            let mut model: Vec<PackedLoc> = Vec::new();
            for op in ops {
                // A list packed anew takes the narrowest width; one that
                // only grew or changed in place may be wider.
                let repacked = match op {
                    Op::RemoveFront(n) => n > 0 && !model.is_empty(),
                    Op::Map(_) => true,
                    _ => false,
                };
                match op {
                    Op::Push(l) => {
                        list.push(l);
                        model.push(l);
                    }
                    Op::Set(i, l) => {
                        let old = model.get_mut(i).map(|slot| std::mem::replace(slot, l));
                        prop_assert_eq!(list.replace(i, l), old);
                    }
                    Op::RemoveFront(n) => {
                        let n2 = n.min(model.len());
                        let gone: Vec<PackedLoc> = model.drain(..n2).collect();
                        prop_assert_eq!(list.remove_front(n), gone);
                    }
                    Op::Map(shift) => {
                        let f = |_: usize, l: PackedLoc| {
                            if l == PENDING_LOC { l } else { l.wrapping_add(u64::from(shift) << 32) & !(1 << 63) }
                        };
                        list.map_in_place(f);
                        for (i, l) in model.iter_mut().enumerate() {
                            *l = f(i, *l);
                        }
                    }
                    Op::Clear => {
                        list.clear();
                        model.clear();
                    }
                }
                prop_assert_eq!(list.len(), model.len());
                prop_assert_eq!(list.iter().collect::<Vec<_>>(), model.clone());
                let narrowest = Form::fitting(model.iter().copied()).width;
                if !list.is_empty() {
                    if repacked {
                        prop_assert_eq!(list.width(), narrowest);
                    } else {
                        prop_assert!(list.width() >= narrowest);
                    }
                }
                let used = HEADER + list.len() * list.width();
                prop_assert!(list.is_empty() || list.allocated_bytes() <= 2 * used + 64, "{} bytes for {}", list.allocated_bytes(), used);
            }
            let (lo, hi) = (model.len() / 3, model.len());
            prop_assert_eq!(list.range(lo, hi).map(|r| r.collect::<Vec<_>>()), Some(model[lo..hi].to_vec()));
            prop_assert!(list.range(0, model.len() + 1).is_none());
        }
    }
}
