//! Recovery at open, in two steps: [`plan`] scans every segment in id
//! order, checks every batch and decides what open would cut or remove and
//! whether the log can be served at all, from reads alone;
//! [`LogPlan::apply`] then does it. A refused open (here, or by the log's
//! owner looking at the plan, as the inbox does with its checkpoints)
//! leaves every file byte for byte as it was.
//!
//! What counts as damage, refused and never cut:
//! - a begun segment shorter than the size recorded for it
//!   ([`super::sizes`]): segments are preallocated and overwrite-only, so
//!   no torn write makes one shorter; it was cut from outside;
//! - invalid bytes anywhere but at the end of the last begun segment, or
//!   followed by a valid batch there;
//! - LSNs that do not continue across consecutive segment ids.
//!
//! A torn tail of the last begun segment (invalid bytes with nothing valid
//! after them, never acknowledged under `SyncPolicy::Always`) is cut: its
//! bytes are first kept in a side file `cut-<segment>-<offset>.bytes` in
//! the log directory (named in the log), overwritten with zeros, and the
//! side file stays until its owner says a newer checkpoint covers the new
//! end ([`super::Log::release_cut_bytes`]), so an operator can still
//! salvage from them.
//!
//! Invariants established for the writer:
//! - every segment but the last is sealed and valid to its end;
//! - the last segment is valid up to `end`, and zeros after it (torn bytes
//!   are overwritten with zeros and synced before the log accepts writes,
//!   so a later, shorter batch can never be followed by stale bytes that
//!   line up as a frame);
//! - LSNs are contiguous inside a segment and across segments with
//!   consecutive ids; across a gap in ids (deleted segments) they only grow;
//! - prepared segments (written ahead, never begun: no records) after the
//!   last begun segment are the spares, in id order; a prepared segment
//!   below a begun one was refused or left over and is removed. Neither is
//!   damage. The last *begun* segment is the one whose tail may be torn;
//! - the next segment id is above every segment file found, so ids never
//!   repeat (a recycled file's stale frames carry an older id).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::format::decode_segment_header;
use super::format::SEGMENT_HEADER_LEN;
use super::io::{is_no_space, write_file_durably, LogIo};
use super::prepare::Spare;
use super::segment::{self, FileKind, Segment, Tail};
use super::sizes::SegmentSizes;
use super::truncate::PendingCut;
use super::{LogError, Lsn, ReplayFn, SegmentId, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN};

/// What recovery cut from the tail of the last segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruncatedTail {
    pub segment: SegmentId,
    pub offset: u64,
    pub bytes: u64,
    pub reason: String,
}

/// What recovery found, for the log's owner to report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments: usize,
    pub batches: u64,
    pub records: u64,
    /// The last durable LSN (0 for an empty log).
    pub last_lsn: Lsn,
    pub truncated: Option<TruncatedTail>,
}

pub(crate) struct Active {
    pub seg: Arc<Segment>,
    pub write_offset: u64,
    pub capacity: u64,
}

pub(crate) struct Recovered {
    /// The directory's lock, if the plan held it.
    pub lock: Option<std::fs::File>,
    /// Side files of torn-tail cuts, this one's and earlier ones'.
    pub cut_files: Vec<PathBuf>,
    pub segments: Vec<Arc<Segment>>,
    pub active: Option<Active>,
    pub next_lsn: Lsn,
    pub next_segment_id: SegmentId,
    /// Prepared segments after the last begun one, lowest id first.
    pub spares: Vec<Spare>,
    pub report: RecoveryReport,
}

/// One begun segment as the plan found it.
#[derive(Debug, Clone)]
struct Planned {
    id: SegmentId,
    path: PathBuf,
    first_lsn: Lsn,
    last_lsn: Lsn,
    /// Where its valid data ends (after any cut).
    end: u64,
    file_len: u64,
    recycled: bool,
}

/// What open would do to a log directory, decided from reads alone. Holds
/// nothing open; [`LogPlan::apply`] (through `Log::open_planned`) does it
/// while the directory is locked, as planning did.
#[derive(Debug)]
pub struct LogPlan {
    dir: PathBuf,
    /// The directory's lock, when [`plan_locked`] took it.
    lock: Option<std::fs::File>,
    segment_bytes: u64,
    pending: Option<PendingCut>,
    /// Files that never held acknowledged data, and why they go.
    removals: Vec<(PathBuf, &'static str)>,
    begun: Vec<Planned>,
    /// Prepared segments after the last begun one: (id, path, recycled).
    spares: Vec<(SegmentId, PathBuf, bool)>,
    /// The torn tail to cut from the last begun segment.
    cut: Option<TruncatedTail>,
    next_segment_id: SegmentId,
    sizes: SegmentSizes,
    report: RecoveryReport,
    /// LSNs absent between begun segments whose ids do not follow each
    /// other (segments deleted, or lost): (first missing, last missing).
    gaps: Vec<(Lsn, Lsn)>,
}

impl LogPlan {
    /// The last LSN open would serve (0: empty).
    pub fn last_lsn(&self) -> Lsn {
        self.report.last_lsn
    }

    /// The first LSN of the oldest begun segment.
    pub fn first_lsn(&self) -> Option<Lsn> {
        self.begun.first().map(|p| p.first_lsn)
    }

    /// Each begun segment and where its valid data ends.
    pub fn ends(&self) -> Vec<(SegmentId, u64)> {
        self.begun.iter().map(|p| (p.id, p.end)).collect()
    }

    /// LSN ranges missing between begun segments.
    pub fn gaps(&self) -> &[(Lsn, Lsn)] {
        &self.gaps
    }

    /// What open would report: counts, and the torn tail it would cut.
    pub fn report(&self) -> &RecoveryReport {
        &self.report
    }

    /// The torn tail open would cut from the last begun segment.
    pub fn cut(&self) -> Option<&TruncatedTail> {
        self.cut.as_ref()
    }

    /// The directory planned.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The segment size planned for.
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// Whether the plan holds the directory's lock ([`plan_locked`]).
    pub fn is_locked(&self) -> bool {
        self.lock.is_some()
    }

    /// Calls `f` for every record of every batch with LSN > `after` that
    /// open would serve, read-only (what `Log::replay` would give after
    /// [`LogPlan::apply`]).
    pub fn replay(&self, after: Lsn, f: &mut ReplayFn<'_>) -> Result<(), LogError> {
        for p in &self.begun {
            if p.last_lsn <= after || p.end <= SEGMENT_HEADER_LEN as u64 {
                continue;
            }
            let file = std::fs::File::open(&p.path)?;
            // SAFETY: a read-only private mapping; the directory is locked
            // by whoever planned (or is a copy nobody writes), and the
            // mapping is dropped at the end of the iteration.
            let data = unsafe { Mmap::map(&file)? };
            let end = usize::try_from(p.end).unwrap_or(usize::MAX).min(data.len());
            super::read::replay_bytes(p.id, &data[..end], after, f)?;
        }
        Ok(())
    }

    /// Does what the plan decided: finishes a pending truncation, removes
    /// the files that never held data, keeps a torn tail's bytes in a side
    /// file and then zeros them, re-allocates a shortened last segment,
    /// records the segment size, and opens every segment.
    pub(crate) fn apply(self, io: &dyn LogIo) -> Result<Recovered, LogError> {
        let LogPlan {
            dir,
            lock,
            segment_bytes,
            pending,
            removals,
            begun,
            spares: planned_spares,
            cut,
            next_segment_id,
            mut sizes,
            mut report,
            gaps: _,
        } = self;
        if let Some(p) = &pending {
            super::truncate::finish_pending(&dir, io, p)?;
        }
        for (path, why) in &removals {
            tracing::info!(path = %path.display(), "removing {why}");
            io.remove(path)?;
        }
        let mut spares = Vec::with_capacity(planned_spares.len());
        for (id, path, recycled) in planned_spares {
            let file = io.open_existing(&path)?;
            spares.push(Spare {
                id,
                path,
                file,
                recycled,
            });
        }
        let first_new = spares.first().map_or(next_segment_id, |s| s.id);
        let n = begun.len();
        let mut out = Vec::with_capacity(n);
        let mut active = None;
        for (i, p) in begun.into_iter().enumerate() {
            let is_last = i + 1 == n;
            let file = if is_last {
                io.open_existing(&p.path)?
            } else {
                std::fs::File::open(&p.path)?
            };
            let mut capacity = p.file_len.max(sizes.size_of(p.id).unwrap_or(segment_bytes));
            if is_last {
                if let Some(c) = cut.as_ref().filter(|c| c.segment == p.id) {
                    cut_torn_tail(io, &dir, &file, c)?;
                }
                if p.file_len < capacity {
                    // A segment written before its size was recorded and
                    // shortened since: allocate it again so appends cannot
                    // hit ENOSPC mid-write. If the disk is full, leave it
                    // and let the next append roll to a new segment, which
                    // reports NoSpace cleanly.
                    match io.allocate(&file, capacity) {
                        Ok(()) => {}
                        Err(e) if is_no_space(&e) => {
                            tracing::warn!(
                                segment = p.id,
                                "no space to re-allocate the last segment; next append rolls"
                            );
                            capacity = p.end;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            let mut seg = Segment::new(
                p.id,
                p.path,
                file,
                p.first_lsn,
                p.last_lsn,
                p.end.max(SEGMENT_HEADER_LEN as u64),
                !is_last,
            );
            if p.recycled {
                seg = seg.with_end_marker(capacity);
            }
            let seg = Arc::new(seg);
            if is_last {
                active = Some(Active {
                    seg: Arc::clone(&seg),
                    write_offset: p.end,
                    capacity,
                });
            }
            out.push(seg);
        }
        match sizes.record(io, &dir, first_new, segment_bytes) {
            Ok(()) => {}
            // A log with no manifest yet (new, or older than manifests)
            // starts on a full disk as before: what it makes now is
            // recorded by the next open with room, and until then is
            // checked by its contents, like any segment before the
            // manifest. A size change must be recorded first.
            Err(LogError::Io(e)) if is_no_space(&e) && sizes.newest().is_none() => {
                tracing::warn!(dir = %dir.display(), "no space to record the segment size; the next start records it");
            }
            Err(e) => return Err(e),
        }
        if let Some(c) = &cut {
            report.truncated.get_or_insert(c.clone());
        }
        Ok(Recovered {
            lock,
            cut_files: cut_files(&dir)?,
            next_lsn: report.last_lsn + 1,
            segments: out,
            active,
            next_segment_id,
            spares,
            report,
        })
    }
}

/// Name of the side file that keeps the bytes a torn-tail cut removed.
pub fn cut_file_name(segment: SegmentId, offset: u64) -> String {
    format!("cut-{segment:010}-{offset}.bytes")
}

/// Keeps `[c.offset, c.offset + c.bytes)` of `file` in a side file, then
/// overwrites it with zeros (not shrinking: the preallocated space stays).
fn cut_torn_tail(
    io: &dyn LogIo,
    dir: &Path,
    file: &std::fs::File,
    c: &TruncatedTail,
) -> Result<(), LogError> {
    let mut kept = vec![0u8; c.bytes as usize];
    std::os::unix::fs::FileExt::read_exact_at(file, &mut kept, c.offset)?;
    let name = cut_file_name(c.segment, c.offset);
    let side = dir.join(&name);
    write_file_durably(io, &dir.join(format!("{name}.tmp")), &side, &kept)?;
    tracing::warn!(
        segment = c.segment,
        offset = c.offset,
        bytes = c.bytes,
        reason = %c.reason,
        kept_in = %side.display(),
        "truncating torn tail of the last segment: cut {} bytes at segment {} offset {}; \
         the cut bytes are kept in {} until a newer checkpoint covers the log's end",
        c.bytes,
        c.segment,
        c.offset,
        side.display()
    );
    io.write_at(file, c.offset, &vec![0u8; c.bytes as usize], true)?;
    Ok(())
}

/// Side files of earlier cuts in `dir` (see [`cut_file_name`]).
pub(crate) fn cut_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("cut-") && name.ends_with(".bytes") {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// [`plan`] under the directory's lock, which the plan holds until it is
/// applied or dropped. Creates the directory (and its `LOCK` file) if
/// missing: a new log.
pub fn plan_locked(dir: &Path, segment_bytes: u64) -> Result<LogPlan, LogError> {
    check_segment_bytes(segment_bytes)?;
    std::fs::create_dir_all(dir)?;
    let lock = super::lock_dir(dir)?;
    let mut plan = plan(dir, segment_bytes)?;
    plan.lock = Some(lock);
    Ok(plan)
}

/// Refuses a segment size outside what the log supports.
pub(crate) fn check_segment_bytes(segment_bytes: u64) -> Result<(), LogError> {
    if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&segment_bytes) {
        return Err(LogError::InvalidArgument(format!(
            "segment_bytes {segment_bytes} is outside {SEGMENT_BYTES_MIN}..={SEGMENT_BYTES_MAX}"
        )));
    }
    Ok(())
}

/// Plans the recovery of the log in `dir` for `segment_bytes` segments,
/// reading only (see the module docs). `Err` is the refusal: damage that
/// open must not cut or paper over, named by segment and offset.
pub fn plan(dir: &Path, segment_bytes: u64) -> Result<LogPlan, LogError> {
    if !dir.exists() {
        // A log not yet created: open makes it empty.
        return Ok(LogPlan {
            dir: dir.to_path_buf(),
            lock: None,
            segment_bytes,
            pending: None,
            removals: Vec::new(),
            begun: Vec::new(),
            spares: Vec::new(),
            cut: None,
            next_segment_id: 1,
            sizes: SegmentSizes::default(),
            report: RecoveryReport::default(),
            gaps: Vec::new(),
        });
    }
    let sizes = SegmentSizes::read(dir)?;
    let pending = super::truncate::read_pending(dir)?;
    let (segs, tmps) = segment::list_dir(dir)?;
    // Unused preallocations (or a roll cut short before its rename): they
    // never held acknowledged data.
    let mut removals: Vec<(PathBuf, &'static str)> = tmps
        .into_iter()
        .map(|t| (t, "an unused preallocation"))
        .collect();
    let next_segment_id = match segs.last() {
        Some((id, _)) => id
            .checked_add(1)
            .ok_or_else(|| LogError::InvalidArgument("segment ids exhausted".into()))?,
        None => 1,
    };
    let kinds = segment::classify(&segs)?;
    let mut begun = Vec::with_capacity(segs.len());
    let mut prepared = Vec::new();
    let mut interrupted = None;
    for ((id, path), kind) in segs.into_iter().zip(kinds) {
        match kind {
            FileKind::Begun => begun.push((id, path)),
            FileKind::Prepared => prepared.push((id, path)),
            FileKind::InterruptedBegin => {
                // No batch goes into a segment before its header is synced,
                // and the segment before it is sealed only after: nothing
                // was acknowledged in it, nothing before it is missing.
                removals.push((
                    path,
                    "a segment whose begin was cut by a power cut (no batch in it)",
                ));
                interrupted = Some(TruncatedTail {
                    segment: id,
                    offset: 0,
                    bytes: SEGMENT_HEADER_LEN as u64,
                    reason: "segment header rewrite cut by a power cut; the empty segment \
                             was removed"
                        .into(),
                });
            }
        }
    }
    let last_begun = begun.last().map(|(id, _)| *id);
    let mut spares = Vec::new();
    for (id, path) in prepared {
        if last_begun.is_some_and(|last| id < last) {
            removals.push((path, "a prepared segment that was never begun"));
            continue;
        }
        let mut head = [0u8; SEGMENT_HEADER_LEN];
        let file = std::fs::File::open(&path)?;
        if file.metadata()?.len() != segment_bytes {
            // Prepared for another segment size (or cut short): it never
            // held data.
            removals.push((path, "a prepared segment of another size"));
            continue;
        }
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0)?;
        let recycled = decode_segment_header(id, &head).is_ok_and(|h| h.is_recycled());
        spares.push((id, path, recycled));
    }
    let mut report = RecoveryReport {
        segments: begun.len(),
        truncated: interrupted,
        ..Default::default()
    };
    let mut planned = Vec::with_capacity(begun.len());
    let mut cut = None;
    let mut gaps = Vec::new();
    let mut prev: Option<(SegmentId, Lsn)> = None;
    let n = begun.len();
    for (i, (id, path)) in begun.into_iter().enumerate() {
        let is_last = i + 1 == n;
        let corrupt = |offset: u64, reason: String| LogError::Corruption {
            segment: id,
            offset,
            reason,
        };
        let file = std::fs::File::open(&path)?;
        let file_len = file.metadata()?.len();
        if let Some(reason) = segment::short_file(file_len, sizes.size_of(id)) {
            return Err(corrupt(file_len, reason));
        }
        let scan = {
            let map;
            let data: &[u8] = if file_len == 0 {
                &[]
            } else {
                // SAFETY: a read-only private mapping of the file's current
                // length; the directory is locked (or a copy nobody
                // writes), and the mapping is dropped at the end of the
                // block.
                map = unsafe { Mmap::map(&file)? };
                &map
            };
            match pending.filter(|p| p.segment == id) {
                Some(p) => segment::scan(id, &p.applied_to(data), is_last),
                None => segment::scan(id, data, is_last),
            }
        };
        let mut end = scan.end;
        match &scan.tail {
            Tail::Clean => {}
            Tail::Corrupt { offset, reason } => return Err(corrupt(*offset, reason.clone())),
            Tail::Torn {
                start,
                end: gend,
                reason,
            } => {
                debug_assert!(is_last);
                cut = Some(TruncatedTail {
                    segment: id,
                    offset: *start,
                    bytes: gend - start,
                    reason: reason.clone(),
                });
                end = *start;
            }
        }
        let first_lsn = scan.first_lsn.expect("a clean or torn scan has a header");
        segment::check_sequence(prev, id, first_lsn).map_err(|r| corrupt(0, r))?;
        if let Some((_, prev_last)) = prev {
            if first_lsn > prev_last + 1 {
                gaps.push((prev_last + 1, first_lsn - 1));
            }
        }
        prev = Some((id, scan.last_lsn));
        report.batches += scan.batches;
        report.records += scan.records;
        report.last_lsn = scan.last_lsn;
        planned.push(Planned {
            id,
            path,
            first_lsn,
            last_lsn: scan.last_lsn,
            end,
            file_len,
            recycled: scan.recycled,
        });
    }
    Ok(LogPlan {
        dir: dir.to_path_buf(),
        lock: None,
        segment_bytes,
        pending,
        removals,
        begun: planned,
        spares,
        cut,
        next_segment_id,
        sizes,
        report,
        gaps,
    })
}
