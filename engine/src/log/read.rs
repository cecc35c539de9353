//! The read side of [`Log`]: single records by location, replay of whole
//! segments, and the segment list. Reads never see bytes that are not
//! durable (see [`super::segment`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::batch::Record;
use super::format::{self, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use super::segment::{self, Segment};
use super::{Log, LogError, Lsn, RecordLoc, ReplayFn, SegmentId, SegmentInfo};

impl Log {
    /// Reads one durable record, checking its CRC.
    pub fn read(&self, loc: RecordLoc) -> Result<Record, LogError> {
        self.read_with(loc, |kind, payload| Record {
            kind,
            payload: payload.to_vec(),
        })
    }

    /// Reads one durable record, checking its CRC, and hands its kind and
    /// payload to `f` in place: from the segment's mapping, without a
    /// copy, for readers that keep only part of a record (a sync page
    /// keeps a message's event fields, not its body).
    pub fn read_with<T>(
        &self,
        loc: RecordLoc,
        f: impl FnOnce(u8, &[u8]) -> T,
    ) -> Result<T, LogError> {
        let seg = self.segment_at(loc)?;
        let r = seg.reader()?;
        read_at(&seg, &r, loc, f)
    }

    /// [`Log::read_with`] for each of `locs`, in order, handing each
    /// record to `f`. A run of locations in one segment looks the segment
    /// and its mapping up once: per record, those lookups (a lock of the
    /// segment list, a lock of the mapping's slot and two reference counts)
    /// were about 30% of a sync page. Stops at the first location that
    /// does not read.
    pub fn read_each(
        &self,
        locs: impl IntoIterator<Item = RecordLoc>,
        mut f: impl FnMut(u8, &[u8]),
    ) -> Result<(), LogError> {
        let mut locs = locs.into_iter().peekable();
        while let Some(first) = locs.next() {
            let seg = self.segment_at(first)?;
            let r = seg.reader()?;
            read_at(&seg, &r, first, &mut f)?;
            while let Some(loc) = locs.next_if(|l| l.segment == first.segment) {
                read_at(&seg, &r, loc, &mut f)?;
            }
        }
        Ok(())
    }

    /// Asks the kernel to start reading, all at once, the pages behind
    /// `locs` in segments found on disk at open, before the caller reads
    /// the records one by one. Reads go through mappings, so each record
    /// whose page is not cached costs a page fault that waits for its own
    /// disk read; after a restart, a pull of 56 conversations' newest
    /// messages waited for dozens of them in series. Asked for together,
    /// the disk serves them side by side, and the faults find the pages
    /// cached or in flight.
    ///
    /// Only records found on disk at open are asked for: one this process
    /// wrote went through the page cache, and a hint for a cached page is
    /// a wasted system call on the hot path. This process appends after
    /// the active segment's offset at open, in it or in newer segments,
    /// so that is one comparison per location. The hint covers
    /// [`READ_AHEAD_RECORD`] bytes from each location (a longer record
    /// faults its tail in); locations less than [`READ_AHEAD_GAP`] apart
    /// are asked for as one range. It reads nothing itself and is never an
    /// error: the reads that follow report what fails.
    pub fn read_ahead(&self, locs: impl IntoIterator<Item = RecordLoc>) {
        let Some((seg, end)) = self.shared.found_end else {
            return;
        };
        let found =
            |l: &RecordLoc| l.segment < seg || (l.segment == seg && u64::from(l.offset) < end);
        let mut locs: Vec<RecordLoc> = locs.into_iter().filter(found).collect();
        if locs.is_empty() {
            return;
        }
        locs.sort_unstable_by_key(|l| (l.segment, l.offset));
        for group in locs.chunk_by(|a, b| a.segment == b.segment) {
            let Some(seg) = self.shared.segments.read().get(&group[0].segment).cloned() else {
                continue;
            };
            for (start, len) in read_ahead_ranges(group.iter().map(|l| u64::from(l.offset))) {
                seg.advise_will_need(start, len);
            }
        }
    }

    /// The segment `loc` names; `BadLocation` if there is none.
    fn segment_at(&self, loc: RecordLoc) -> Result<Arc<Segment>, LogError> {
        self.shared
            .segments
            .read()
            .get(&loc.segment)
            .cloned()
            .ok_or(LogError::BadLocation {
                segment: loc.segment,
                offset: loc.offset,
            })
    }

    /// Calls `f` for every durable record of every batch with LSN > `after`,
    /// in log order.
    pub fn replay(&self, after: Lsn, f: &mut ReplayFn<'_>) -> Result<(), LogError> {
        let segs: Vec<Arc<Segment>> = self.shared.segments.read().values().cloned().collect();
        for seg in segs {
            if seg.last_lsn() <= after {
                continue;
            }
            replay_segment(&seg, after, f)?;
        }
        Ok(())
    }

    /// [`Log::replay`] restricted to one segment (for compaction, which
    /// looks at one segment at a time). Unknown segment: `InvalidArgument`.
    pub fn replay_segment(&self, id: SegmentId, f: &mut ReplayFn<'_>) -> Result<(), LogError> {
        let seg = self
            .shared
            .segments
            .read()
            .get(&id)
            .cloned()
            .ok_or_else(|| LogError::InvalidArgument(format!("no segment {id}")))?;
        replay_segment(&seg, 0, f)
    }

    /// The highest LSN known durable.
    pub fn durable_lsn(&self) -> Lsn {
        self.shared.durable_lsn.load(Ordering::Acquire)
    }

    /// The segments, oldest first. The newest one, if any, is the active
    /// (unsealed) one.
    /// The oldest segment whose records count as recent: the active
    /// segment and the one sealed before it, that is the last one to two
    /// segments' worth of writes. They went through the page cache moments
    /// ago, so reading them does not wait for the disk unless memory is so
    /// short that the kernel dropped what it just wrote.
    pub fn recent_floor(&self) -> SegmentId {
        let segments = self.shared.segments.read();
        segments
            .keys()
            .rev()
            .nth(1)
            .or(segments.keys().next_back())
            .copied()
            .unwrap_or(0)
    }

    /// Takes a look at the page cache: `reclaims` is the kernel's count of
    /// reclaimed pages so far ([`super::reclaims_so_far`]). Once it has
    /// stayed put since a look, records this process wrote after that look
    /// are cached (`log/cache.rs`); call it every
    /// [`super::LOOK_VALID_FOR`] or more often. True when the count moved
    /// since an earlier look: what was written before counts as uncached.
    pub fn observe_page_cache(&self, reclaims: u64) -> bool {
        self.shared.cache.observe(reclaims, || {
            let active = self.shared.state.lock().active.as_ref().map(|a| RecordLoc {
                segment: a.seg.id,
                offset: u32::try_from(a.write_offset).unwrap_or(u32::MAX),
            });
            // No active segment: the next one is newer than any now. (The
            // two locks are taken one after the other, never nested.)
            active.unwrap_or_else(|| {
                let newest = self.shared.segments.read().keys().next_back().copied();
                RecordLoc {
                    segment: newest.map_or(0, |id| id + 1),
                    offset: 0,
                }
            })
        })
    }

    /// Records at or after the returned location are in the page cache as
    /// far as the log can tell: those of its recent segments
    /// ([`Log::recent_floor`]), and those a look at the page cache no
    /// older than [`super::LOOK_VALID_FOR`] vouches for
    /// ([`Log::observe_page_cache`]).
    pub fn cached_floor(&self) -> RecordLoc {
        let recent = RecordLoc {
            segment: self.recent_floor(),
            offset: 0,
        };
        self.shared
            .cache
            .warm_from()
            .map_or(recent, |warm| warm.min(recent))
    }

    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.shared
            .segments
            .read()
            .values()
            .map(|s| SegmentInfo {
                id: s.id,
                bytes: s.durable_len(),
                sealed: s.is_sealed(),
                first_lsn: s.first_lsn,
                last_lsn: s.last_lsn(),
            })
            .collect()
    }
}

fn replay_segment(seg: &Segment, after: Lsn, f: &mut ReplayFn<'_>) -> Result<(), LogError> {
    let data = seg.durable_view()?;
    replay_bytes(seg.id, &data, after, f)
}

/// Hands `f` every record of the batches in `data` (segment `id`'s bytes
/// up to its durable end) whose LSN is over `after`. Any batch that does
/// not verify is corruption: below the durable end nothing may be torn.
pub(super) fn replay_bytes(
    id: SegmentId,
    data: &[u8],
    after: Lsn,
    f: &mut ReplayFn<'_>,
) -> Result<(), LogError> {
    let mut pos = SEGMENT_HEADER_LEN;
    while pos < data.len() {
        let b = format::decode_batch(id, data, pos, 0).map_err(|e| LogError::Corruption {
            segment: id,
            offset: pos as u64,
            reason: format!("durable batch does not verify: {e:?}"),
        })?;
        if b.lsn > after {
            for (loc, kind, payload) in b.records() {
                f(b.lsn, loc, kind, payload)?;
            }
        }
        pos += b.frame_len;
    }
    Ok(())
}

/// The record at `loc` in `seg`, read through `r`, handed to `f` once its
/// CRC checks ([`Log::read_with`]).
fn read_at<T>(
    seg: &Segment,
    r: &segment::Reader<'_>,
    loc: RecordLoc,
    f: impl FnOnce(u8, &[u8]) -> T,
) -> Result<T, LogError> {
    let bad = || LogError::BadLocation {
        segment: loc.segment,
        offset: loc.offset,
    };
    let off = u64::from(loc.offset);
    let hdr_end = off + RECORD_HEADER_LEN as u64;
    if off < (SEGMENT_HEADER_LEN + format::BATCH_HEADER_LEN) as u64 || hdr_end > r.limit() {
        return Err(bad());
    }
    let header = r.get(off, hdr_end)?;
    let h = format::decode_record_header(&header);
    let end = hdr_end + u64::from(h.len);
    if end <= r.limit() {
        let payload = r.get(hdr_end, end)?;
        if format::record_crc_ok(seg.id, loc.offset, &header, &payload) {
            return Ok(f(h.kind, &payload));
        }
    }
    // Not a valid record here: a damaged record, or not a record start
    // at all. Walk the batch the header points back to to tell which.
    if is_record_start(r, off, h.back)? {
        Err(LogError::Corruption {
            segment: seg.id,
            offset: off,
            reason: "record checksum mismatch".into(),
        })
    } else {
        Err(bad())
    }
}

/// Whether `off` is the start of a record of the batch `back` bytes before
/// it, judged by walking that batch's record headers.
fn is_record_start(r: &segment::Reader<'_>, off: u64, back: u32) -> Result<bool, LogError> {
    let Some(batch_off) = off.checked_sub(u64::from(back)) else {
        return Ok(false);
    };
    let bh_end = batch_off + format::BATCH_HEADER_LEN as u64;
    if batch_off < SEGMENT_HEADER_LEN as u64 || bh_end > r.limit() {
        return Ok(false);
    }
    let bh = r.get(batch_off, bh_end)?;
    let Some((len, kind, count)) = format::peek_batch_header(&bh) else {
        return Ok(false);
    };
    let frame_end = batch_off + u64::from(len);
    if kind != format::FRAME_TYPE_BATCH || frame_end > r.limit() || off >= frame_end {
        return Ok(false);
    }
    let mut pos = bh_end;
    for _ in 0..count {
        if pos == off {
            return Ok(true);
        }
        if pos > off || pos + RECORD_HEADER_LEN as u64 > frame_end {
            return Ok(false);
        }
        let h = r.get(pos, pos + RECORD_HEADER_LEN as u64)?;
        pos += RECORD_HEADER_LEN as u64 + u64::from(format::decode_record_header(&h).len);
    }
    Ok(false)
}

/// Bytes from a record's location that [`Log::read_ahead`] asks for: a
/// message record with a body of a few hundred bytes, and its header.
pub const READ_AHEAD_RECORD: u64 = 1024;

/// Locations closer than this are asked for as one range: reading the
/// pages between them costs the disk less than one more request.
pub const READ_AHEAD_GAP: u64 = 32 << 10;

const PAGE: u64 = 4096;

/// The page-aligned ranges `(start, len)` that cover [`READ_AHEAD_RECORD`]
/// bytes from each of `offsets` (ascending), merged where they are less
/// than [`READ_AHEAD_GAP`] apart.
fn read_ahead_ranges(offsets: impl IntoIterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut current: Option<(u64, u64)> = None;
    for off in offsets {
        let start = off / PAGE * PAGE;
        let end = (off + READ_AHEAD_RECORD).div_ceil(PAGE) * PAGE;
        current = match current {
            Some((s, e)) if start <= e + READ_AHEAD_GAP => Some((s, e.max(end))),
            Some((s, e)) => {
                out.push((s, e - s));
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    out.extend(current.map(|(s, e)| (s, e - s)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_ahead_covers_each_record_in_whole_pages_and_merges_locations_closer_than_the_gap() {
        assert!(read_ahead_ranges([]).is_empty());
        // One record inside a page, and one that crosses into the next.
        assert_eq!(read_ahead_ranges([100]), vec![(0, PAGE)]);
        assert_eq!(read_ahead_ranges([PAGE - 10]), vec![(0, 2 * PAGE)]);
        // Within the gap: one range from the first page to the last.
        let near = PAGE + READ_AHEAD_GAP;
        assert_eq!(read_ahead_ranges([100, 200, near]), vec![(0, near + PAGE)]);
        // Beyond it: two ranges.
        let far = 2 * PAGE + READ_AHEAD_GAP;
        assert_eq!(
            read_ahead_ranges([100, far, far + 50]),
            vec![(0, PAGE), (far, PAGE)]
        );
    }
}
