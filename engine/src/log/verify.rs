//! Offline check of a log directory (`inboxd verify`): every batch and
//! every record of every segment, read-only. Nothing is repaired; a torn
//! tail that recovery would cut is reported as such.
//!
//! Invariant: verify never writes to the directory and never takes the
//! log's lock, so it can inspect a copy or a stopped daemon's directory.

use std::path::Path;

use memmap2::Mmap;

use super::segment::{self, FileKind, Tail};
use super::{LogError, Lsn, ReplayFn, SegmentId};

/// What kind of problem was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// A torn write at the end of the last segment. [`super::Log::open`]
    /// cuts it; no acknowledged data is lost.
    TornTail,
    /// Damage that makes [`super::Log::open`] refuse to start.
    Corruption,
}

/// One problem and its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    pub segment: SegmentId,
    pub offset: u64,
    pub reason: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            ProblemKind::TornTail => "torn tail",
            ProblemKind::Corruption => "corruption",
        };
        write!(
            f,
            "{kind} in segment {} at offset {}: {}",
            self.segment, self.offset, self.reason
        )
    }
}

/// What verify found in one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentReport {
    pub id: SegmentId,
    /// Bytes of valid data, segment header included.
    pub bytes: u64,
    pub file_bytes: u64,
    pub batches: u64,
    pub records: u64,
    /// `None` when the segment header is unreadable, or for a prepared
    /// segment (not begun, no LSN yet).
    pub first_lsn: Option<Lsn>,
    /// A segment prepared ahead of need and not begun: no records.
    pub prepared: bool,
    pub last_lsn: Lsn,
    pub problem: Option<Problem>,
}

/// What verify found in a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    pub segments: Vec<SegmentReport>,
    pub batches: u64,
    pub records: u64,
    pub bytes: u64,
    /// LSN range of the valid batches (`None` when there are none).
    pub first_lsn: Option<Lsn>,
    pub last_lsn: Option<Lsn>,
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// True when `Log::open` would start without refusing.
    pub fn opens(&self) -> bool {
        self.problems
            .iter()
            .all(|p| p.kind != ProblemKind::Corruption)
    }

    /// True when nothing at all was found.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks every record of every segment in `dir`.
pub fn verify(dir: &Path) -> Result<VerifyReport, LogError> {
    verify_with_progress(dir, &mut |_| {})
}

/// [`verify`], calling `progress` after each segment (in id order).
pub fn verify_with_progress(
    dir: &Path,
    progress: &mut dyn FnMut(&SegmentReport),
) -> Result<VerifyReport, LogError> {
    let (segs, _tmps) = segment::list_dir(dir)?;
    let sizes = super::sizes::SegmentSizes::read(dir)?;
    let mut report = VerifyReport::default();
    let mut prev: Option<(SegmentId, Lsn)> = None;
    // Only the last begun segment may have a torn tail; prepared segments
    // (written ahead, never begun) hold no records and are not damage.
    let kinds = segment::classify(&segs)?;
    let last_begun = last_begun(&segs, &kinds);
    for ((id, path), kind) in segs.iter().zip(&kinds) {
        if *kind == FileKind::InterruptedBegin {
            let problem = Problem {
                kind: ProblemKind::TornTail,
                segment: *id,
                offset: 0,
                reason: "segment header rewrite cut by a power cut, no batch in it; \
                         the segment would be removed at open"
                    .into(),
            };
            let seg = SegmentReport {
                id: *id,
                bytes: 0,
                file_bytes: std::fs::metadata(path)?.len(),
                batches: 0,
                records: 0,
                first_lsn: None,
                prepared: false,
                last_lsn: 0,
                problem: Some(problem.clone()),
            };
            report.problems.push(problem);
            progress(&seg);
            report.segments.push(seg);
            continue;
        }
        let file = std::fs::File::open(path)?;
        let file_bytes = file.metadata()?.len();
        let scan = {
            let map;
            let data: &[u8] = if file_bytes == 0 {
                &[]
            } else {
                // SAFETY: read-only private mapping of the file's current
                // length; verify is meant for a directory no process is
                // writing, and the mapping is dropped at the end of the
                // block.
                map = unsafe { Mmap::map(&file)? };
                &map
            };
            segment::scan(*id, data, Some(*id) == last_begun)
        };
        let short = (*kind == FileKind::Begun)
            .then(|| segment::short_file(file_bytes, sizes.size_of(*id)))
            .flatten()
            .map(|reason| Problem {
                kind: ProblemKind::Corruption,
                segment: *id,
                offset: file_bytes,
                reason,
            });
        let mut problem = match &scan.tail {
            _ if short.is_some() => short,
            Tail::Clean => None,
            Tail::Torn { start, end, reason } => Some(Problem {
                kind: ProblemKind::TornTail,
                segment: *id,
                offset: *start,
                reason: format!("{reason}; {} bytes would be cut at open", end - start),
            }),
            Tail::Corrupt { offset, reason } => Some(Problem {
                kind: ProblemKind::Corruption,
                segment: *id,
                offset: *offset,
                reason: reason.clone(),
            }),
        };
        if let Some(first) = scan.first_lsn.filter(|_| !scan.prepared) {
            if let Err(reason) = segment::check_sequence(prev, *id, first) {
                problem.get_or_insert(Problem {
                    kind: ProblemKind::Corruption,
                    segment: *id,
                    offset: 0,
                    reason,
                });
            }
            if scan.batches > 0 {
                report.first_lsn.get_or_insert(first);
                report.last_lsn = Some(scan.last_lsn);
            }
            prev = Some((*id, scan.last_lsn));
        }
        let seg = SegmentReport {
            id: *id,
            bytes: scan.end,
            file_bytes,
            batches: scan.batches,
            records: scan.records,
            first_lsn: scan.first_lsn.filter(|_| !scan.prepared),
            prepared: scan.prepared,
            last_lsn: if scan.prepared { 0 } else { scan.last_lsn },
            problem: problem.clone(),
        };
        report.batches += scan.batches;
        report.records += scan.records;
        report.bytes += scan.end;
        report.problems.extend(problem);
        progress(&seg);
        report.segments.push(seg);
    }
    Ok(report)
}

/// Calls `f` for every record of every valid batch with LSN > `after`, in
/// log order, read-only: what [`super::Log::open`] followed by
/// [`super::Log::replay`] would see (a torn tail is left out, as open cuts
/// it). A directory that open would refuse is refused the same way.
pub fn replay_dir(dir: &Path, after: Lsn, f: &mut ReplayFn<'_>) -> Result<(), LogError> {
    let (segs, _tmps) = segment::list_dir(dir)?;
    // As in `verify_with_progress`: prepared segments hold no records, an
    // interrupted begin is removed at open, and only the last begun
    // segment may end in a torn tail.
    let kinds = segment::classify(&segs)?;
    let last_begun = last_begun(&segs, &kinds);
    for ((id, path), kind) in segs.iter().zip(&kinds) {
        if *kind != FileKind::Begun {
            continue;
        }
        let file = std::fs::File::open(path)?;
        if file.metadata()?.len() == 0 {
            continue;
        }
        // SAFETY: read-only private mapping, as in `verify_with_progress`.
        let data = unsafe { Mmap::map(&file)? };
        let scan = segment::scan(*id, &data, Some(*id) == last_begun);
        if let Tail::Corrupt { offset, reason } = scan.tail {
            return Err(LogError::Corruption {
                segment: *id,
                offset,
                reason,
            });
        }
        if scan.prepared {
            continue;
        }
        let end = usize::try_from(scan.end)
            .unwrap_or(usize::MAX)
            .min(data.len());
        super::read::replay_bytes(*id, &data[..end], after, f)?;
    }
    Ok(())
}

/// The newest segment that holds records (or began to): the only one whose
/// tail may be torn.
fn last_begun(segs: &[(SegmentId, std::path::PathBuf)], kinds: &[FileKind]) -> Option<SegmentId> {
    segs.iter()
        .zip(kinds)
        .filter(|(_, k)| **k == FileKind::Begun)
        .map(|((id, _), _)| *id)
        .next_back()
}
