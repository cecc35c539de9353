//! The segment-size manifest: `segments.size` in a log directory records
//! how long each segment file was made, so a file shorter than that is
//! known to have been cut (by a tool, a bad copy, a file system repair)
//! rather than guessed to be whole from its own length.
//!
//! Segments are preallocated and only ever overwritten, so no write of the
//! log, torn or not, makes a file shorter than its size. Recovery and
//! `verify` refuse a begun segment shorter than the size recorded for it,
//! and the daemon takes an existing store's segment size from here.
//!
//! The size may change between runs (`--segment-bytes`), so the manifest is
//! a list of entries "from segment id `first`, files are `bytes` long",
//! in increasing `first`. A segment below the first entry predates the
//! manifest (a store written before it existed): its size is unknown and
//! only its contents are checked, as before.
//!
//! File (little endian): magic `INBXSSZ1`, u32 entry count, then per entry
//! u32 first segment id and u64 bytes, then a u32 CRC32 of everything
//! before it. It is written whole (tmp, fsync, rename, directory fsync)
//! when a log is opened with a size its newest entry does not have, after
//! recovery has decided to serve and before any new segment is prepared.
//! A manifest that fails its checks refuses the open: the sizes it
//! guarded cannot be known.

use std::path::{Path, PathBuf};

use super::io::{write_file_durably, LogIo};
use super::{LogError, SegmentId};

const MAGIC: &[u8; 8] = b"INBXSSZ1";
/// Name of the manifest in a log directory.
pub const FILE_NAME: &str = "segments.size";
/// A limit on entries, so a damaged count never allocates much.
const ENTRIES_MAX: usize = 4096;

/// The recorded sizes of one log's segments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentSizes {
    /// (first segment id, bytes), increasing ids.
    entries: Vec<(SegmentId, u64)>,
}

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

impl SegmentSizes {
    /// Reads the manifest of `dir`; an empty one if there is none (a new
    /// log, or one written before the manifest existed).
    pub fn read(dir: &Path) -> Result<Self, LogError> {
        match std::fs::read(path(dir)) {
            Ok(buf) => Self::decode(&buf).map_err(|reason| LogError::Corruption {
                segment: 0,
                offset: 0,
                reason: format!("{}: {reason}", path(dir).display()),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e.into()),
        }
    }

    /// The size segment `id` was made with, if recorded.
    pub fn size_of(&self, id: SegmentId) -> Option<u64> {
        self.entries
            .iter()
            .rev()
            .find(|(first, _)| *first <= id)
            .map(|(_, bytes)| *bytes)
    }

    /// The newest recorded size: what new segments are made with.
    pub fn newest(&self) -> Option<u64> {
        self.entries.last().map(|(_, bytes)| *bytes)
    }

    /// Records that segments from `first` on are `bytes` long, durably,
    /// unless the newest entry says so already. `first` must be above
    /// every id recorded so far (ids never repeat).
    pub(crate) fn record(
        &mut self,
        io: &dyn LogIo,
        dir: &Path,
        first: SegmentId,
        bytes: u64,
    ) -> Result<(), LogError> {
        if self.newest() == Some(bytes) {
            return Ok(());
        }
        let mut next = self.clone();
        next.entries.retain(|(f, _)| *f < first);
        next.entries.push((first, bytes));
        write_file_durably(
            io,
            &dir.join(format!("{FILE_NAME}.tmp")),
            &path(dir),
            &next.encode(),
        )?;
        *self = next;
        Ok(())
    }

    fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(16 + 12 * self.entries.len());
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (first, bytes) in &self.entries {
            buf.extend_from_slice(&first.to_le_bytes());
            buf.extend_from_slice(&bytes.to_le_bytes());
        }
        let crc = crc32fast::hash(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        buf
    }

    fn decode(buf: &[u8]) -> Result<Self, String> {
        if buf.len() < 16 || &buf[..8] != MAGIC {
            return Err("not a segment-size manifest".into());
        }
        let (body, crc) = buf.split_at(buf.len() - 4);
        if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err("segment-size manifest fails its CRC".into());
        }
        let count = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes")) as usize;
        if count > ENTRIES_MAX || body.len() != 12 + 12 * count {
            return Err(format!(
                "segment-size manifest of {count} entries has a bad length"
            ));
        }
        let mut entries = Vec::with_capacity(count);
        for e in body[12..].chunks_exact(12) {
            let first = u32::from_le_bytes(e[0..4].try_into().expect("4 bytes"));
            let bytes = u64::from_le_bytes(e[4..12].try_into().expect("8 bytes"));
            if entries.last().is_some_and(|(f, _)| *f >= first) {
                return Err("segment-size manifest entries are out of order".into());
            }
            if !(super::SEGMENT_BYTES_MIN..=super::SEGMENT_BYTES_MAX).contains(&bytes) {
                return Err(format!("segment-size manifest records {bytes} bytes"));
            }
            entries.push((first, bytes));
        }
        Ok(Self { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_and_a_flipped_bit_is_refused() {
        let s = SegmentSizes {
            entries: vec![(1, 65536), (9, 1 << 20)],
        };
        let mut buf = s.encode();
        assert_eq!(SegmentSizes::decode(&buf), Ok(s.clone()));
        assert_eq!(s.size_of(0), None);
        assert_eq!(s.size_of(8), Some(65536));
        assert_eq!(s.size_of(9), Some(1 << 20));
        buf[13] ^= 1;
        assert!(SegmentSizes::decode(&buf).is_err());
    }
}
