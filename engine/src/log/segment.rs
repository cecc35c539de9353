//! One segment file: its in-memory handle (durable length, LSN range,
//! sealed flag, read mapping) and the scan that checks a segment's bytes.
//!
//! Invariants:
//! - bytes below `durable_len` never change again; everything a reader
//!   touches lies below it (reads check it first);
//! - a sealed segment is immutable: it is read through one `Arc<Mmap>` of
//!   exactly its durable length, made on first read. The active segment is
//!   read through one mapping of its whole preallocated file, made on first
//!   read (and made again only if the file was extended past it): reads
//!   still stop at the durable length, and only ever form references to
//!   bytes below it, which never change again; the bytes above it may be
//!   written meanwhile, but nothing looks at them through the mapping. So a
//!   read of the hot tail costs no syscall (see `docs/ARCHITECTURE.md`,
//!   "Reading the hot tail");
//! - deleting a segment only unlinks the file: readers holding the `Arc`
//!   keep a valid descriptor and mapping until they drop it.

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions, MmapRaw};
use parking_lot::Mutex;

use super::format::{self, FrameError, SEGMENT_HEADER_LEN};
use super::{Lsn, SegmentId};

/// File name of a segment: its id, zero-padded so names sort by id.
pub fn segment_file_name(id: SegmentId) -> String {
    format!("{id:010}.seg")
}

/// Parses a segment file name back into its id.
pub fn parse_segment_file_name(name: &str) -> Option<SegmentId> {
    let stem = name.strip_suffix(".seg")?;
    if stem.len() != 10 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// In-memory handle of one segment.
#[derive(Debug)]
pub struct Segment {
    pub id: SegmentId,
    pub path: PathBuf,
    pub file: File,
    pub first_lsn: Lsn,
    /// Last durable LSN in this segment (`first_lsn - 1` while empty).
    last_lsn: AtomicU64,
    /// Bytes from the start of the file that are durable.
    durable_len: AtomicU64,
    sealed: AtomicBool,
    map: Mutex<Option<Arc<Mmap>>>,
    /// While active: a mapping of the whole file as preallocated.
    /// (Raw: its bytes above the durable length change under it.)
    active_map: Mutex<Option<Arc<MmapRaw>>>,
    /// For a recycled file (stale bytes past the data): its capacity. Every
    /// write is followed by an all-zero batch header, the end of the data.
    end_marker: Option<u64>,
}

impl Segment {
    pub fn new(
        id: SegmentId,
        path: PathBuf,
        file: File,
        first_lsn: Lsn,
        last_lsn: Lsn,
        durable_len: u64,
        sealed: bool,
    ) -> Self {
        assert!(last_lsn + 1 >= first_lsn);
        assert!(durable_len >= SEGMENT_HEADER_LEN as u64);
        Self {
            id,
            path,
            file,
            first_lsn,
            last_lsn: AtomicU64::new(last_lsn),
            durable_len: AtomicU64::new(durable_len),
            sealed: AtomicBool::new(sealed),
            map: Mutex::new(None),
            active_map: Mutex::new(None),
            end_marker: None,
        }
    }

    /// Marks the segment as a recycled file of `capacity` bytes: the
    /// writer ends every write with an all-zero batch header (when it
    /// fits), because what follows the data is not zeros.
    pub fn with_end_marker(mut self, capacity: u64) -> Self {
        self.end_marker = Some(capacity);
        self
    }

    /// Zero bytes to write after data ending at `end` (see
    /// [`Segment::with_end_marker`]).
    pub fn end_marker_len(&self, end: u64) -> usize {
        match self.end_marker {
            Some(cap) => cap.saturating_sub(end).min(format::BATCH_HEADER_LEN as u64) as usize,
            None => 0,
        }
    }

    /// Whether nothing but this handle uses the segment: no reader holds
    /// it or its mapping, so its file may be reused.
    pub fn is_idle(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1
            && self
                .map
                .lock()
                .as_ref()
                .is_none_or(|m| Arc::strong_count(m) == 1)
            && self
                .active_map
                .lock()
                .as_ref()
                .is_none_or(|m| Arc::strong_count(m) == 1)
    }

    pub fn durable_len(&self) -> u64 {
        self.durable_len.load(Ordering::Acquire)
    }

    pub fn last_lsn(&self) -> Lsn {
        self.last_lsn.load(Ordering::Acquire)
    }

    pub fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }

    /// Publishes newly durable bytes. Called by the writer only, after the
    /// bytes are durable under the sync policy.
    pub fn set_durable(&self, len: u64, last_lsn: Lsn) {
        debug_assert!(len >= self.durable_len());
        self.last_lsn.store(last_lsn, Ordering::Release);
        self.durable_len.store(len, Ordering::Release);
    }

    /// Moves the durable end back to `len` after a suffix truncation
    /// (`Log::truncate_after`), which has zeroed and synced the bytes
    /// past it.
    pub fn set_truncated(&self, len: u64, last_lsn: Lsn) {
        debug_assert!(len <= self.durable_len() && len >= SEGMENT_HEADER_LEN as u64);
        self.durable_len.store(len, Ordering::Release);
        self.last_lsn.store(last_lsn, Ordering::Release);
    }

    /// Marks the segment immutable. Called by the writer once every byte
    /// of it is synced.
    pub fn seal(&self) {
        self.sealed.store(true, Ordering::Release);
        // Readers that still hold the active mapping keep it alive.
        self.active_map.lock().take();
    }

    /// Asks the kernel to start reading `len` bytes from `start` into the
    /// page cache (`POSIX_FADV_WILLNEED`), without waiting for them. A
    /// hint: a failure only means a later read waits for the disk.
    pub fn advise_will_need(&self, start: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let (Ok(start), Ok(len)) = (libc::off_t::try_from(start), libc::off_t::try_from(len))
        else {
            return;
        };
        // SAFETY: a valid descriptor; the call reads no memory of ours.
        unsafe {
            libc::posix_fadvise(self.file.as_raw_fd(), start, len, libc::POSIX_FADV_WILLNEED)
        };
    }

    /// A reader of the bytes durable right now.
    pub fn reader(&self) -> std::io::Result<Reader<'_>> {
        let limit = self.durable_len();
        if self.is_sealed() {
            return Ok(Reader::Mapped(self.mapping()?));
        }
        match self.active_mapping(limit)? {
            Some(map) => Ok(Reader::Active { map, limit }),
            None => Ok(Reader::File {
                file: &self.file,
                limit,
            }),
        }
    }

    /// The mapping of the active segment's whole file, if it covers
    /// `limit` bytes (it does unless the file is shorter than its durable
    /// length claims, which only a foreign truncation could cause: then
    /// reads fall back to pread and fail there, with an IO error).
    fn active_mapping(&self, limit: u64) -> std::io::Result<Option<Arc<MmapRaw>>> {
        let mut slot = self.active_map.lock();
        if let Some(m) = slot.as_ref() {
            if m.len() as u64 >= limit {
                return Ok(Some(Arc::clone(m)));
            }
        }
        let file_len = self.file.metadata()?.len();
        if file_len < limit {
            return Ok(None);
        }
        // The file is preallocated to `file_len` and the log never shrinks
        // a segment file, so no page of the mapping is beyond the end of
        // the file. A raw mapping: readers form references only to bytes
        // below the durable length ([`Reader::get`]), which are never
        // written again; the bytes above it are written through the file
        // meanwhile and nothing reads them through this mapping.
        let map = MmapOptions::new()
            .len(file_len as usize)
            .map_raw_read_only(&self.file)?;
        let map = Arc::new(map);
        *slot = Some(Arc::clone(&map));
        Ok(Some(map))
    }

    /// The whole durable region, for scans: the sealed segment's mapping,
    /// or for the active one a fresh mapping of exactly the bytes durable
    /// now (they never change again, so the mapping stays valid).
    pub fn durable_view(&self) -> std::io::Result<Arc<Mmap>> {
        if self.is_sealed() {
            return self.mapping();
        }
        let len = self.durable_len() as usize;
        // SAFETY: bytes [0, len) are durable and never written again; the
        // file is preallocated past them, so the mapping cannot fault.
        let map = unsafe { MmapOptions::new().len(len).map(&self.file)? };
        Ok(Arc::new(map))
    }

    /// The read mapping of a sealed segment, made on first use.
    pub fn mapping(&self) -> std::io::Result<Arc<Mmap>> {
        debug_assert!(self.is_sealed());
        let mut slot = self.map.lock();
        if let Some(m) = slot.as_ref() {
            return Ok(Arc::clone(m));
        }
        let len = self.durable_len() as usize;
        // SAFETY: the segment is sealed, so bytes [0, len) of the file are
        // never written again by this process; the file was preallocated
        // to at least that length, and the log never truncates a sealed
        // file, so the mapping cannot fault (barring another process
        // truncating the data directory, which nothing supports).
        let map = unsafe { MmapOptions::new().len(len).map(&self.file)? };
        let map = Arc::new(map);
        *slot = Some(Arc::clone(&map));
        Ok(map)
    }
}

/// Reads byte ranges below the durable length seen when it was made.
pub enum Reader<'a> {
    /// A sealed segment's mapping, of exactly its bytes.
    Mapped(Arc<Mmap>),
    /// The whole active file, read below `limit` only.
    Active {
        map: Arc<MmapRaw>,
        limit: u64,
    },
    File {
        file: &'a File,
        limit: u64,
    },
}

impl Reader<'_> {
    /// Bytes durable when the reader was made.
    pub fn limit(&self) -> u64 {
        match self {
            Reader::Mapped(m) => m.len() as u64,
            Reader::Active { limit, .. } | Reader::File { limit, .. } => *limit,
        }
    }

    /// The bytes `[start, end)`; `end` must be within [`Reader::limit`].
    pub fn get(&self, start: u64, end: u64) -> std::io::Result<Cow<'_, [u8]>> {
        assert!(
            start <= end && end <= self.limit(),
            "read past the durable length"
        );
        match self {
            Reader::Mapped(m) => Ok(Cow::Borrowed(&m[start as usize..end as usize])),
            Reader::Active { map, .. } => {
                // Only the bytes below the durable length are referenced:
                // the rest of an active mapping may be being written.
                let len = (end - start) as usize;
                // SAFETY: `start..end` is within the mapping (`limit` is at
                // most its length) and below the durable length, so those
                // bytes stay mapped while `map` lives and never change.
                let bytes =
                    unsafe { std::slice::from_raw_parts(map.as_ptr().add(start as usize), len) };
                Ok(Cow::Borrowed(bytes))
            }
            Reader::File { file, .. } => {
                let mut buf = vec![0u8; (end - start) as usize];
                file.read_exact_at(&mut buf, start)?;
                Ok(Cow::Owned(buf))
            }
        }
    }
}

/// How the data of a scanned segment ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// Valid batches, then zeros (or the end of the file).
    Clean,
    /// Invalid bytes after the last valid batch with nothing valid after
    /// them, in the last segment: a write torn by a crash. `[start, end)`
    /// holds every non-zero byte past the valid data.
    Torn {
        start: u64,
        end: u64,
        reason: String,
    },
    /// Damage that truncation must not paper over.
    Corrupt { offset: u64, reason: String },
}

/// What a scan of one segment found.
#[derive(Debug, Clone)]
pub struct Scan {
    /// `None` when the header itself is bad (then `tail` is `Corrupt`).
    pub first_lsn: Option<Lsn>,
    /// A prepared segment, not yet begun: no records, `first_lsn` means
    /// nothing, the bytes after the header are not looked at.
    pub prepared: bool,
    /// A recycled file: stale bytes may follow the end of the data.
    pub recycled: bool,
    /// Last LSN of the valid batches (`first_lsn - 1` when none).
    pub last_lsn: Lsn,
    /// Offset just past the last valid batch.
    pub end: u64,
    pub batches: u64,
    pub records: u64,
    pub tail: Tail,
}

/// Checks every batch and record of a segment's bytes. `is_last` says
/// whether invalid bytes at the end may be a torn write (only the last
/// segment can have one: a segment is synced in full before the next one
/// is created).
pub fn scan(id: SegmentId, data: &[u8], is_last: bool) -> Scan {
    let mut s = Scan {
        first_lsn: None,
        prepared: false,
        recycled: false,
        last_lsn: 0,
        end: 0,
        batches: 0,
        records: 0,
        tail: Tail::Clean,
    };
    let header = match format::decode_segment_header(id, data) {
        Ok(h) => h,
        Err(reason) => {
            s.tail = Tail::Corrupt { offset: 0, reason };
            return s;
        }
    };
    s.first_lsn = Some(header.first_lsn);
    s.last_lsn = header.first_lsn - 1;
    s.end = SEGMENT_HEADER_LEN as u64;
    s.prepared = header.is_prepared();
    s.recycled = header.is_recycled();
    if s.prepared {
        return s;
    }
    let mut pos = SEGMENT_HEADER_LEN;
    let reason = loop {
        match format::decode_batch(id, data, pos, 0) {
            Ok(b) => {
                if b.lsn != s.last_lsn + 1 {
                    s.end = pos as u64;
                    s.tail = Tail::Corrupt {
                        offset: pos as u64,
                        reason: format!(
                            "batch LSN {} where {} was expected",
                            b.lsn,
                            s.last_lsn + 1
                        ),
                    };
                    return s;
                }
                s.last_lsn = b.lsn;
                s.batches += 1;
                s.records += u64::from(b.count);
                pos += b.frame_len;
            }
            Err(FrameError::End) => break None,
            Err(FrameError::Invalid(r)) => break Some(r),
        }
    };
    s.end = pos as u64;
    if s.recycled {
        return scan_recycled_tail(id, data, pos, reason, is_last, s);
    }
    // Whatever follows the valid data must be zeros, or a torn write.
    let rest = &data[pos..];
    let Some(last_nonzero) = rest.iter().rposition(|&b| b != 0) else {
        return s;
    };
    let garbage_end = pos + last_nonzero + 1;
    let reason = reason.unwrap_or_else(|| "non-zero bytes after the end of the data".into());
    if !is_last {
        s.tail = Tail::Corrupt {
            offset: pos as u64,
            reason: format!("{reason} (in a sealed segment)"),
        };
        return s;
    }
    // A torn write leaves only garbage. A valid batch beyond the damage
    // means the damage sits inside data that was once complete.
    for p in pos + 1..garbage_end {
        if let Some(lsn) = format::valid_batch_at(id, data, p, 0, s.last_lsn) {
            s.tail = Tail::Corrupt {
                offset: pos as u64,
                reason: format!("{reason}, followed by a valid batch (LSN {lsn}) at offset {p}"),
            };
            return s;
        }
    }
    s.tail = Tail::Torn {
        start: pos as u64,
        end: garbage_end as u64,
        reason,
    };
    s
}

/// The end of a recycled segment's data. Every write into it ends with an
/// all-zero batch header, so a clean end is that marker (or the end of the
/// file) and what lies past it is stale. An invalid frame instead is a
/// torn write in the last begun segment (cut by zeroing its header: the
/// stale bytes after it never verify under this id), and damage anywhere
/// else; so is a valid batch of this segment past the invalid frame.
fn scan_recycled_tail(
    id: SegmentId,
    data: &[u8],
    pos: usize,
    reason: Option<String>,
    is_last: bool,
    mut s: Scan,
) -> Scan {
    let Some(reason) = reason else {
        return s;
    };
    if !is_last {
        s.tail = Tail::Corrupt {
            offset: pos as u64,
            reason: format!("{reason} (in a sealed segment)"),
        };
        return s;
    }
    for p in pos + 1..data.len() {
        if let Some(lsn) = format::valid_batch_at(id, data, p, 0, s.last_lsn) {
            s.tail = Tail::Corrupt {
                offset: pos as u64,
                reason: format!("{reason}, followed by a valid batch (LSN {lsn}) at offset {p}"),
            };
            return s;
        }
    }
    s.tail = Tail::Torn {
        start: pos as u64,
        end: (pos + format::BATCH_HEADER_LEN).min(data.len()) as u64,
        reason,
    };
    s
}

/// Why a begun segment file of `file_len` bytes is damage when it was made
/// `recorded` bytes long ([`super::sizes`]): segments are preallocated and
/// only ever overwritten, so no write of the log (torn or not) leaves one
/// shorter. `None` when it is whole or its size was never recorded.
pub fn short_file(file_len: u64, recorded: Option<u64>) -> Option<String> {
    let size = recorded?;
    (file_len < size).then(|| {
        format!(
            "the file is {file_len} bytes but the segment was made {size} bytes long: it was \
             cut short from outside (truncated, or copied incompletely), not torn by a write; \
             whatever it held past byte {file_len} is missing"
        )
    })
}

/// What a segment file is, as far as its header tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A begun segment (or a damaged one: the scan decides).
    Begun,
    /// Prepared ahead of need, never begun: no records.
    Prepared,
    /// The newest non-prepared file, whose begin (the in-place rewrite of
    /// its prepared header, synced before any batch goes in) was cut by a
    /// power cut: magic, version and id are intact, the checksum fails,
    /// and no batch of this segment is anywhere in it. It holds nothing.
    InterruptedBegin,
}

fn read_header(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(SEGMENT_HEADER_LEN);
    File::open(path)?
        .take(SEGMENT_HEADER_LEN as u64)
        .read_to_end(&mut head)?;
    Ok(head)
}

/// Classifies the segment files of a directory, sorted by id.
pub fn classify(segs: &[(SegmentId, PathBuf)]) -> std::io::Result<Vec<FileKind>> {
    let mut kinds = Vec::with_capacity(segs.len());
    let mut torn_candidate = Vec::with_capacity(segs.len());
    for (id, path) in segs {
        let head = read_header(path)?;
        let prepared = format::decode_segment_header(*id, &head).is_ok_and(|h| h.is_prepared());
        kinds.push(if prepared {
            FileKind::Prepared
        } else {
            FileKind::Begun
        });
        let intact_prefix = head.len() == SEGMENT_HEADER_LEN
            && head[0..8] == format::SEGMENT_MAGIC
            && head[8..12] == format::FORMAT_VERSION.to_le_bytes()
            && head[12..16] == id.to_le_bytes();
        torn_candidate.push(intact_prefix && format::decode_segment_header(*id, &head).is_err());
    }
    if let Some(i) = kinds.iter().rposition(|k| *k == FileKind::Begun) {
        if torn_candidate[i] {
            let (id, path) = &segs[i];
            let data = std::fs::read(path)?;
            let any_batch = (SEGMENT_HEADER_LEN..data.len())
                .any(|p| format::valid_batch_at(*id, &data, p, 0, 0).is_some());
            if !any_batch {
                kinds[i] = FileKind::InterruptedBegin;
            }
        }
    }
    Ok(kinds)
}

/// Segment files by id, and leftover preallocation files.
pub type DirListing = (Vec<(SegmentId, PathBuf)>, Vec<PathBuf>);

/// Lists the segment files in `dir`, sorted by id, and the leftover
/// preallocation files (`*.tmp`).
pub fn list_dir(dir: &Path) -> std::io::Result<DirListing> {
    let mut segs = Vec::new();
    let mut tmps = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(id) = parse_segment_file_name(name) {
            segs.push((id, entry.path()));
        } else if name.ends_with(".tmp") {
            tmps.push(entry.path());
        }
    }
    segs.sort();
    Ok((segs, tmps))
}

/// The LSN rule between two neighbouring segments: contiguous ids must
/// continue the LSNs exactly; a gap in ids (segments deleted) only needs
/// LSNs to keep growing.
pub fn check_sequence(
    prev: Option<(SegmentId, Lsn)>,
    id: SegmentId,
    first_lsn: Lsn,
) -> Result<(), String> {
    let Some((prev_id, prev_last)) = prev else {
        return Ok(());
    };
    if id == prev_id + 1 && first_lsn != prev_last + 1 {
        return Err(format!(
            "segment starts at LSN {first_lsn} but segment {prev_id} ends at LSN {prev_last}"
        ));
    }
    if first_lsn <= prev_last {
        return Err(format!(
            "segment starts at LSN {first_lsn}, not after segment {prev_id} (ends at LSN {prev_last})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_file_names_round_trip_and_sort_by_id() {
        assert_eq!(segment_file_name(42), "0000000042.seg");
        assert_eq!(parse_segment_file_name("0000000042.seg"), Some(42));
        assert_eq!(parse_segment_file_name("42.seg"), None);
        assert_eq!(parse_segment_file_name("0000000042.tmp"), None);
        assert!(segment_file_name(9) < segment_file_name(10));
    }
}
