//! Recovery at open: scan every segment in id order, check every batch,
//! truncate a torn tail of the last segment, refuse anything else.
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

use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use super::format::decode_segment_header;
use super::format::SEGMENT_HEADER_LEN;
use super::io::{is_no_space, LogIo};
use super::prepare::Spare;
use super::segment::{self, FileKind, Segment, Tail};
use super::{LogError, Lsn, RecoveryMode, SegmentId};

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
    pub segments: Vec<Arc<Segment>>,
    pub active: Option<Active>,
    pub next_lsn: Lsn,
    pub next_segment_id: SegmentId,
    /// Prepared segments after the last begun one, lowest id first.
    pub spares: Vec<Spare>,
    pub report: RecoveryReport,
}

pub(crate) fn recover(
    dir: &Path,
    io: &dyn LogIo,
    segment_bytes: u64,
    mode: RecoveryMode,
) -> Result<Recovered, LogError> {
    let RecoveryMode::TruncateTornTail = mode;
    let (segs, tmps) = segment::list_dir(dir)?;
    for tmp in tmps {
        // Unused preallocations (or a roll cut short before its rename):
        // they never held acknowledged data.
        io.remove(&tmp)?;
    }
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
                tracing::warn!(
                    segment = id,
                    "removing a segment whose begin was cut by a power cut (no batch in it)"
                );
                io.remove(&path)?;
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
            tracing::info!(
                segment = id,
                "removing a prepared segment that was never begun"
            );
            io.remove(&path)?;
            continue;
        }
        let file = io.open_existing(&path)?;
        if file.metadata()?.len() != segment_bytes {
            // Prepared for another segment size: never held data.
            drop(file);
            io.remove(&path)?;
            continue;
        }
        let recycled = {
            let mut head = [0u8; SEGMENT_HEADER_LEN];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0)?;
            decode_segment_header(id, &head).is_ok_and(|h| h.is_recycled())
        };
        spares.push(Spare {
            id,
            path,
            file,
            recycled,
        });
    }
    let segs = begun;
    let mut report = RecoveryReport {
        segments: segs.len(),
        truncated: interrupted,
        ..Default::default()
    };
    let mut out = Vec::with_capacity(segs.len());
    let mut active = None;
    let mut prev: Option<(SegmentId, Lsn)> = None;
    let mut next_lsn = 1;
    let n = segs.len();
    for (i, (id, path)) in segs.iter().enumerate() {
        let is_last = i + 1 == n;
        let file = if is_last {
            io.open_existing(path)?
        } else {
            std::fs::File::open(path)?
        };
        let file_len = file.metadata()?.len();
        let scan = {
            let map;
            let data: &[u8] = if file_len == 0 {
                &[]
            } else {
                // SAFETY: recovery runs before the log accepts writes and
                // the directory is locked, so nothing changes the file
                // while this private read-only mapping of its current
                // length is alive (it is dropped at the end of the block).
                map = unsafe { Mmap::map(&file)? };
                &map
            };
            segment::scan(*id, data, is_last)
        };
        let corrupt = |offset: u64, reason: String| LogError::Corruption {
            segment: *id,
            offset,
            reason,
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
                let bytes = gend - start;
                tracing::warn!(
                    segment = id,
                    offset = start,
                    bytes,
                    reason = %reason,
                    "truncating torn tail of the last segment: cut {bytes} bytes at segment {id} offset {start}"
                );
                // Zero (not shrink) so the preallocated space stays.
                let zeros = vec![0u8; bytes as usize];
                io.write_at(&file, *start, &zeros, true)?;
                report.truncated = Some(TruncatedTail {
                    segment: *id,
                    offset: *start,
                    bytes,
                    reason: reason.clone(),
                });
                end = *start;
            }
        }
        let first_lsn = scan.first_lsn.expect("a clean or torn scan has a header");
        segment::check_sequence(prev, *id, first_lsn).map_err(|r| corrupt(0, r))?;
        prev = Some((*id, scan.last_lsn));
        next_lsn = scan.last_lsn + 1;
        report.batches += scan.batches;
        report.records += scan.records;
        let mut capacity = file_len.max(segment_bytes);
        if is_last && file_len < capacity {
            // A shortened file (copied, or cut by a tool): allocate it again
            // so appends cannot hit ENOSPC mid-write. If the disk is full,
            // leave it as it is and let the next append roll to a new
            // segment, which reports NoSpace cleanly.
            match io.allocate(&file, capacity) {
                Ok(()) => {}
                Err(e) if is_no_space(&e) => {
                    tracing::warn!(
                        segment = id,
                        "no space to re-allocate the last segment; next append rolls"
                    );
                    capacity = end;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut seg = Segment::new(
            *id,
            path.clone(),
            file,
            first_lsn,
            scan.last_lsn,
            end.max(SEGMENT_HEADER_LEN as u64),
            !is_last,
        );
        if scan.recycled {
            seg = seg.with_end_marker(capacity);
        }
        let seg = Arc::new(seg);
        if is_last {
            active = Some(Active {
                seg: Arc::clone(&seg),
                write_offset: end,
                capacity,
            });
        }
        out.push(seg);
    }
    report.last_lsn = next_lsn - 1;
    Ok(Recovered {
        segments: out,
        active,
        next_lsn,
        next_segment_id,
        spares,
        report,
    })
}
