//! The damaged directory, read-only: every segment file of one log mapped
//! privately and never written, records read by location with their CRC
//! checked, and a scan of the whole log that goes on past damage.
//!
//! Unlike recovery, which refuses to open at the first damaged batch, the
//! scan reports the damage and resynchronises: within a segment at the
//! next offset where a whole batch verifies (every CRC is bound to the
//! segment id, so stale or shifted bytes never pass), else at the next
//! segment. A frame whose own CRC fails but whose structure still walks
//! (header, record lengths, back pointers) is handed over record by
//! record, each marked with whether its own CRC verifies.

use std::collections::BTreeMap;
use std::path::Path;

use memmap2::Mmap;

use crate::inbox::frames::walk_frame;
use crate::log::format::{
    self, decode_batch, decode_record_header, record_crc_ok, valid_batch_at, FrameError,
    BATCH_HEADER_LEN, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};
use crate::log::{classify, list_dir, FileKind, Lsn, RecordLoc, SegmentId};

/// One log directory of the source, mapped read-only.
pub(crate) struct LogFiles {
    segs: BTreeMap<SegmentId, Seg>,
    /// Segment files shorter than the size their log recorded for them
    /// (cut from outside): id, file length, why.
    short: Vec<(SegmentId, u64, String)>,
}

struct Seg {
    kind: FileKind,
    /// `None` for an empty file.
    map: Option<Mmap>,
}

impl Seg {
    fn data(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// What the scan finds, in log order.
pub(crate) enum Item<'a> {
    /// A record whose CRC verifies, in a batch of LSN `lsn`.
    Record {
        lsn: Lsn,
        loc: RecordLoc,
        kind: u8,
        payload: &'a [u8],
        /// False when the batch around it failed its own check (the record
        /// was walked out of a damaged frame).
        batch_ok: bool,
    },
    /// A record walked out of a damaged frame whose own CRC fails: what
    /// its bytes say now, which may be wrong anywhere.
    Damaged {
        lsn: Lsn,
        loc: RecordLoc,
        kind: u8,
        payload: &'a [u8],
    },
    /// Bytes whose records cannot be told apart: every batch in
    /// `lsns` (when known) is gone, with whatever it held.
    Lost {
        segment: SegmentId,
        offset: u64,
        lsns: Option<(Lsn, Lsn)>,
        reason: String,
    },
    /// LSNs that lie in segments no longer there: deleted by compaction,
    /// which deletes only what every retained checkpoint covers (a loss
    /// only if the state salvage starts from does not cover them).
    Deleted { lsns: (Lsn, Lsn) },
    /// The end of the last segment does not verify and nothing valid
    /// follows: a write cut by a crash, never acknowledged. Recovery cuts
    /// it the same way; it is not a loss.
    TornTail {
        segment: SegmentId,
        offset: u64,
        bytes: u64,
    },
}

impl LogFiles {
    /// Maps every segment file of `dir` (none if it does not exist).
    pub(crate) fn open(dir: &Path) -> std::io::Result<LogFiles> {
        let mut segs = BTreeMap::new();
        let mut short = Vec::new();
        if !dir.exists() {
            return Ok(LogFiles { segs, short });
        }
        // A manifest that does not read leaves only the files' contents
        // to judge by, as for a log older than manifests.
        let sizes = crate::log::sizes::SegmentSizes::read(dir).ok();
        let (files, _tmps) = list_dir(dir)?;
        let kinds = classify(&files)?;
        for ((id, path), kind) in files.into_iter().zip(kinds) {
            let file = std::fs::File::open(&path)?;
            let len = file.metadata()?.len();
            let recorded = sizes.as_ref().and_then(|s| s.size_of(id));
            if let Some(why) = crate::log::short_file(len, recorded) {
                short.push((id, len, why));
            }
            let map = if len == 0 {
                None
            } else {
                // SAFETY: a read-only private mapping; the caller holds
                // the directory's lock, so no daemon writes the file
                // while it is mapped.
                Some(unsafe { Mmap::map(&file)? })
            };
            segs.insert(id, Seg { kind, map });
        }
        Ok(LogFiles { segs, short })
    }

    /// Segment files shorter than their recorded size: id, length, why.
    pub(crate) fn short_files(&self) -> &[(SegmentId, u64, String)] {
        &self.short
    }

    /// The record at `loc`, if its CRC verifies there.
    pub(crate) fn read(&self, loc: RecordLoc) -> Result<(u8, &[u8]), String> {
        let seg = self
            .segs
            .get(&loc.segment)
            .ok_or_else(|| format!("segment {} does not exist", loc.segment))?;
        let data = seg.data();
        let at = loc.offset as usize;
        let bad = |what: &str| format!("segment {} offset {}: {what}", loc.segment, loc.offset);
        if at < SEGMENT_HEADER_LEN + BATCH_HEADER_LEN {
            return Err(bad("not a record offset"));
        }
        let header = data
            .get(at..at + RECORD_HEADER_LEN)
            .ok_or_else(|| bad("beyond the end of the segment"))?;
        let h = decode_record_header(header);
        let start = at + RECORD_HEADER_LEN;
        let payload = data
            .get(start..start + h.len as usize)
            .ok_or_else(|| bad("record runs past the end of the segment"))?;
        if !record_crc_ok(loc.segment, loc.offset, header, payload) {
            return Err(bad("record checksum mismatch"));
        }
        Ok((h.kind, payload))
    }

    /// Every record of every begun segment, in log order, going on past
    /// damage (see the module doc).
    pub(crate) fn scan(&self, f: &mut dyn FnMut(Item<'_>)) {
        let last_begun = self
            .segs
            .iter()
            .filter(|(_, s)| s.kind == FileKind::Begun)
            .map(|(id, _)| *id)
            .next_back();
        // The LSN the next batch must carry (`None` before the first).
        let mut expected: Option<Lsn> = None;
        let mut prev: Option<SegmentId> = None;
        for (&id, seg) in &self.segs {
            if seg.kind != FileKind::Begun {
                continue;
            }
            let data = seg.data();
            match format::decode_segment_header(id, data.get(..SEGMENT_HEADER_LEN).unwrap_or(data))
            {
                Ok(h) if h.is_prepared() => continue,
                Ok(h) => {
                    match expected {
                        Some(want) if h.first_lsn > want && prev == id.checked_sub(1) => {
                            f(Item::Lost {
                                segment: id,
                                offset: 0,
                                lsns: Some((want, h.first_lsn - 1)),
                                reason: "batches missing between segments (the tail of the \
                                         one before is gone)"
                                    .into(),
                            })
                        }
                        // Segments in between were deleted by compaction
                        // (ids never repeat), or are missing.
                        Some(want) if h.first_lsn > want => f(Item::Deleted {
                            lsns: (want, h.first_lsn - 1),
                        }),
                        _ => {}
                    }
                    expected = Some(h.first_lsn);
                }
                Err(reason) => f(Item::Lost {
                    segment: id,
                    offset: 0,
                    lsns: None,
                    reason: format!("segment header: {reason}"),
                }),
            }
            prev = Some(id);
            scan_segment(id, data, Some(id) == last_begun, &mut expected, f);
        }
    }
}

fn scan_segment(
    id: SegmentId,
    data: &[u8],
    is_last: bool,
    expected: &mut Option<Lsn>,
    f: &mut dyn FnMut(Item<'_>),
) {
    let mut pos = SEGMENT_HEADER_LEN;
    while pos < data.len() {
        let reason = match decode_batch(id, data, pos, 0) {
            Ok(b) => {
                if let Some(want) = *expected {
                    if b.lsn > want {
                        f(Item::Lost {
                            segment: id,
                            offset: pos as u64,
                            lsns: Some((want, b.lsn - 1)),
                            reason: "batches missing before this one".into(),
                        });
                    } else if b.lsn < want {
                        f(Item::Lost {
                            segment: id,
                            offset: pos as u64,
                            lsns: None,
                            reason: format!("batch LSN {} repeats an earlier one", b.lsn),
                        });
                        pos += b.frame_len;
                        continue;
                    }
                }
                for (loc, kind, payload) in b.records() {
                    f(Item::Record {
                        lsn: b.lsn,
                        loc,
                        kind,
                        payload,
                        batch_ok: true,
                    });
                }
                *expected = Some(b.lsn + 1);
                pos += b.frame_len;
                continue;
            }
            Err(FrameError::End) => return,
            Err(FrameError::Invalid(reason)) => reason,
        };
        // Damage at `pos`. Where does a valid batch start again?
        let after = expected.map_or(0, |e| e.saturating_sub(1));
        let next = (pos + 1..data.len().saturating_sub(BATCH_HEADER_LEN - 1))
            .find(|&q| valid_batch_at(id, data, q, 0, after).is_some());
        if next.is_none() && is_last {
            let end = data.len() - data[pos..].iter().rev().take_while(|&&b| b == 0).count();
            f(Item::TornTail {
                segment: id,
                offset: pos as u64,
                bytes: (end.max(pos) - pos) as u64,
            });
            return;
        }
        let limit = next.unwrap_or(data.len());
        match walk_frame(id, data, pos, limit, *expected) {
            Some((lsn, len, records)) => {
                for (loc, kind, payload, ok) in records {
                    f(if ok {
                        Item::Record {
                            lsn,
                            loc,
                            kind,
                            payload,
                            batch_ok: false,
                        }
                    } else {
                        Item::Damaged {
                            lsn,
                            loc,
                            kind,
                            payload,
                        }
                    });
                }
                *expected = Some(lsn + 1);
                pos += len;
            }
            None => {
                f(Item::Lost {
                    segment: id,
                    offset: pos as u64,
                    lsns: None,
                    reason: format!(
                        "batch does not verify and its records cannot be told apart: {reason}"
                    ),
                });
                match next {
                    // The LSN check on the batch found there tells which
                    // batches went with the damage.
                    Some(q) => pos = q,
                    None => return,
                }
            }
        }
    }
}
