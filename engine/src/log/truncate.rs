//! Suffix truncation: `Log::truncate_after(lsn)` drops every batch after
//! `lsn`, for a replicated log whose uncommitted tail was overruled (a
//! leader that lost its leadership, a follower whose tail conflicts with
//! the new leader's).
//!
//! Crash safety rests on an *intent* file written before any byte of the
//! log changes: `truncate.intent` (written tmp + fsync + rename + directory
//! fsync) names the segment, the cut offset and the end of the data to
//! clear. Then the bytes `[cut, end)` of that segment are overwritten with
//! zeros and synced, and the intent is removed (directory fsync). A power
//! cut before the intent is durable leaves the log as it was; from the
//! moment it is durable, recovery reads the cut range as zeros and
//! `Log::open` finishes the truncation once it has decided to serve
//! (zeroing again is harmless), so recovery sees the log either before
//! the truncation or after it, never in between.
//!
//! Only a cut inside the active segment is done on an open log: a sealed
//! segment is immutable (mapped by readers, counted by compaction), so a
//! cut that reaches one is refused with `InvalidArgument`.
//!
//! The caller makes sure nothing reads the dropped batches while they are
//! cleared (the inbox never lets a read reach a round that was not
//! committed, and rebuilds its state from the prefix right after): a read
//! of a dropped record after the cut fails its CRC or finds zeros.
//!
//! File (little endian): magic `INBXTRN1`, u64 segment id, u64 lsn (the
//! last batch kept), u64 cut, u64 end, u32 CRC32 of the bytes before it.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::append::Log;
use super::format::{BATCH_HEADER_LEN, SEGMENT_HEADER_LEN};
use super::io::{write_file_durably, LogIo};
use super::segment::{list_dir, segment_file_name};
use super::{LogError, Lsn, SegmentId};

const MAGIC: &[u8; 8] = b"INBXTRN1";
const INTENT_LEN: usize = 8 + 8 * 4 + 4;
/// Zeros are written in pieces of at most this many bytes.
const ZERO_CHUNK: u64 = 1 << 20;

/// A truncation that has been decided and made durable, not yet done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Intent {
    segment: SegmentId,
    lsn: Lsn,
    cut: u64,
    end: u64,
}

fn intent_path(dir: &Path) -> PathBuf {
    dir.join("truncate.intent")
}

fn encode(i: &Intent) -> Vec<u8> {
    let mut buf = Vec::with_capacity(INTENT_LEN);
    buf.extend_from_slice(MAGIC);
    for v in [u64::from(i.segment), i.lsn, i.cut, i.end] {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    let crc = crc32fast::hash(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
    buf
}

fn decode(buf: &[u8]) -> Result<Intent, String> {
    if buf.len() != INTENT_LEN || &buf[..8] != MAGIC {
        return Err("not a truncation intent".into());
    }
    let crc = u32::from_le_bytes(buf[INTENT_LEN - 4..].try_into().expect("4 bytes"));
    if crc32fast::hash(&buf[..INTENT_LEN - 4]) != crc {
        return Err("truncation intent fails its CRC".into());
    }
    let u = |i: usize| u64::from_le_bytes(buf[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"));
    let segment = SegmentId::try_from(u(0)).map_err(|_| "truncation intent names no segment")?;
    let intent = Intent {
        segment,
        lsn: u(1),
        cut: u(2),
        end: u(3),
    };
    if intent.cut < SEGMENT_HEADER_LEN as u64 || intent.end < intent.cut {
        return Err(format!("truncation intent has a bad range: {intent:?}"));
    }
    Ok(intent)
}

/// Overwrites `[cut, end)` of the file with zeros and syncs it.
fn zero_range(io: &dyn LogIo, file: &std::fs::File, cut: u64, end: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; (end - cut).min(ZERO_CHUNK) as usize];
    let mut at = cut;
    while at < end {
        let n = (end - at).min(ZERO_CHUNK);
        io.write_at(file, at, &zeros[..n as usize], false)?;
        at += n;
    }
    io.sync_data(file)
}

fn remove_intent(io: &dyn LogIo, dir: &Path) -> std::io::Result<()> {
    io.remove(&intent_path(dir))?;
    io.sync_dir(dir)
}

/// The truncation whose intent is durable in `dir`, checked, without
/// doing it: recovery plans with its range read as zeros, and
/// [`finish_pending`] does it once the log is to be served.
pub(super) fn read_pending(dir: &Path) -> Result<Option<PendingCut>, LogError> {
    let path = intent_path(dir);
    let buf = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let corrupt = |reason: String| LogError::Corruption {
        segment: 0,
        offset: 0,
        reason,
    };
    let intent = decode(&buf).map_err(corrupt)?;
    let (segs, _) = list_dir(dir)?;
    if !segs.iter().any(|(id, _)| *id == intent.segment) {
        return Err(corrupt(format!(
            "truncation intent names segment {} ({}), which is missing",
            intent.segment,
            segment_file_name(intent.segment)
        )));
    }
    for (later, later_path) in segs.iter().filter(|(id, _)| *id > intent.segment) {
        // Only the active segment is ever cut, so nothing begun can follow
        // it; a later begun segment would be cut off from the LSN chain.
        let file = std::fs::File::open(later_path)?;
        let mut head = [0u8; SEGMENT_HEADER_LEN];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0)?;
        let prepared = super::format::decode_segment_header(*later, &head)
            .map(|h| h.flags & super::format::SEGMENT_FLAG_PREPARED != 0)
            .unwrap_or(true);
        if !prepared {
            return Err(corrupt(format!(
                "truncation intent for segment {} but segment {later} follows it",
                intent.segment
            )));
        }
    }
    Ok(Some(PendingCut {
        segment: intent.segment,
        cut: intent.cut,
        end: intent.end,
        lsn: intent.lsn,
    }))
}

/// A truncation decided before a crash and not yet done (see
/// [`read_pending`]): bytes `[cut, end)` of `segment` are to be zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingCut {
    pub segment: SegmentId,
    pub cut: u64,
    pub end: u64,
    lsn: Lsn,
}

impl PendingCut {
    /// `data` (the segment's bytes) as they read once the cut is done.
    pub fn applied_to(&self, data: &[u8]) -> Vec<u8> {
        let mut data = data.to_vec();
        let len = data.len() as u64;
        let (cut, end) = (self.cut.min(len) as usize, self.end.min(len) as usize);
        data[cut..end].fill(0);
        data
    }
}

/// Finishes the truncation `pending` (from [`read_pending`]); called by
/// `Log::open` once recovery has decided to serve.
pub(super) fn finish_pending(
    dir: &Path,
    io: &dyn LogIo,
    pending: &PendingCut,
) -> Result<(), LogError> {
    let seg_path = dir.join(segment_file_name(pending.segment));
    let file = io.open_existing(&seg_path)?;
    zero_range(io, &file, pending.cut, pending.end)?;
    remove_intent(io, dir)?;
    tracing::warn!(
        dir = %dir.display(),
        segment = pending.segment,
        lsn = pending.lsn,
        "finished a log truncation interrupted by a crash"
    );
    Ok(())
}

impl Log {
    /// Drops every batch after `lsn`, durably (see the module docs): on
    /// return the log ends at `lsn` and the next batch gets `lsn + 1`.
    /// Everything submitted is flushed first. `lsn` at or past the end
    /// changes nothing. A cut that reaches a sealed segment is refused
    /// with `InvalidArgument` and changes nothing; an IO error on the way
    /// poisons the log (the intent, once durable, is finished at the next
    /// open).
    pub fn truncate_after(&self, lsn: Lsn) -> Result<(), LogError> {
        self.flush()?;
        let shared = &self.shared;
        let mut st = shared.state.lock();
        if shared.is_poisoned() {
            return Err(shared.poison_error());
        }
        let end_lsn = st.next_lsn - 1;
        if lsn >= end_lsn {
            return Ok(());
        }
        if !st.queue.is_empty() || shared.durable_lsn.load(Ordering::Acquire) != end_lsn {
            return Err(LogError::InvalidArgument(
                "truncation needs every submitted batch durable".into(),
            ));
        }
        let Some(active) = st.active.as_mut() else {
            return Err(LogError::InvalidArgument(
                "the log has no active segment".into(),
            ));
        };
        let seg = std::sync::Arc::clone(&active.seg);
        if lsn + 1 < seg.first_lsn {
            return Err(LogError::InvalidArgument(format!(
                "truncation after LSN {lsn} reaches before segment {} (first LSN {}), which is \
                 sealed",
                seg.id, seg.first_lsn
            )));
        }
        let end = active.write_offset;
        // Walk the frames of the active segment to the end of batch `lsn`.
        let reader = seg.reader()?;
        let mut cut = SEGMENT_HEADER_LEN as u64;
        let mut next = seg.first_lsn;
        while next <= lsn {
            let head = reader.get(cut, cut + BATCH_HEADER_LEN as u64)?;
            let frame_len = u64::from(u32::from_le_bytes(head[..4].try_into().expect("4 bytes")));
            let frame_lsn = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
            if frame_lsn != next || frame_len < BATCH_HEADER_LEN as u64 || cut + frame_len > end {
                return Err(LogError::Corruption {
                    segment: seg.id,
                    offset: cut,
                    reason: format!("expected batch {next} while truncating"),
                });
            }
            cut += frame_len;
            next += 1;
        }
        drop(reader);
        let intent = Intent {
            segment: seg.id,
            lsn,
            cut,
            end,
        };
        let io = shared.io.as_ref();
        let dir = &shared.dir;
        let done = write_file_durably(
            io,
            &dir.join("truncate.intent.tmp"),
            &intent_path(dir),
            &encode(&intent),
        )
        .and_then(|()| zero_range(io, &seg.file, cut, end))
        .and_then(|()| remove_intent(io, dir));
        if let Err(e) = done {
            // The bytes past `cut` may be half cleared: stop here; the
            // next open finishes the truncation if its intent is durable.
            shared.poison(format!("log truncation failed: {e}"));
            return Err(e.into());
        }
        active.write_offset = cut;
        st.next_lsn = lsn + 1;
        seg.set_truncated(cut, lsn);
        {
            let _g = shared.durable.lock();
            shared.durable_lsn.store(lsn, Ordering::Release);
        }
        tracing::info!(dir = %dir.display(), lsn, dropped = end_lsn - lsn, "log truncated");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_intent_round_trips_and_a_damaged_one_is_refused() {
        let i = Intent {
            segment: 3,
            lsn: 17,
            cut: 4096,
            end: 8192,
        };
        let mut buf = encode(&i);
        assert_eq!(decode(&buf), Ok(i));
        buf[12] ^= 1;
        assert!(decode(&buf).is_err());
        let bad = Intent { cut: 10, ..i };
        assert!(decode(&encode(&bad)).is_err());
    }
}
