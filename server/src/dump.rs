//! `inboxd dump`: every record of a data directory's logs in readable
//! form, one line per batch and one per record, for the day a disk goes
//! bad (what is there, where it stops, what a damaged segment held).
//!
//! The framing (segment header, batch frames, record headers, checksums)
//! is checked by the engine's own decoder, [`inbox_engine::log::format`],
//! and each record is decoded and described by the engine too
//! ([`inbox_engine::inbox::kinds`]): the text comes from the record kind's
//! own definition, so a new kind is described here without a change. The
//! fields that locate a record (conversation and `msg_seq`, user and
//! `sync_seq`, device) are printed; a message body never is, only its
//! length. A payload that does not decode is printed as its kind, its
//! length, its first bytes in hex and why.
//!
//! Where a segment's data stops at a frame that does not verify, the dump
//! says where and why and, by default, goes on with the next segment.
//! With `skip_damaged` ([`DumpOptions`]) it looks, byte by byte, for the
//! next offset where a whole batch verifies (a batch's checksum is bound
//! to its segment id, so stale or shifted bytes never pass) and goes on
//! there, so the intact batches after a bad one are shown too.
//!
//! Read-only: the caller holds the directory's lock so no daemon writes
//! while it reads.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

use inbox_engine::inbox::kinds;
use inbox_engine::log::format::{self, FrameError, SEGMENT_HEADER_LEN};

/// Which log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stream {
    Msg,
    Evt,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Self::Msg => "msg",
            Self::Evt => "evt",
        }
    }
}

/// What a dump found, for its closing line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DumpSummary {
    pub segments: u64,
    pub batches: u64,
    pub records: u64,
    /// Segments whose data stopped at an invalid frame (torn or corrupt).
    pub damaged: u64,
}

/// Segment ids in `dir`, ascending (files named `<id, 10 digits>.seg`).
fn segment_ids(dir: &Path) -> std::io::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".seg")) else {
            continue;
        };
        if stem.len() == 10 && stem.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(id) = stem.parse() {
                ids.push(id);
            }
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// What to dump, and how.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DumpOptions {
    /// Only this segment id.
    pub segment: Option<u32>,
    /// Go on past a frame that does not verify, at the next batch that
    /// does (see the module docs).
    pub skip_damaged: bool,
}

/// Dumps one stream's segments (only `segment` when given) to `out`,
/// stopping each segment at its first frame that does not verify.
pub fn dump_stream(
    dir: &Path,
    stream: Stream,
    segment: Option<u32>,
    out: &mut impl Write,
) -> std::io::Result<DumpSummary> {
    let options = DumpOptions {
        segment,
        skip_damaged: false,
    };
    dump_stream_with(dir, stream, options, out)
}

/// Dumps one stream's segments to `out`, as `options` say.
pub fn dump_stream_with(
    dir: &Path,
    stream: Stream,
    options: DumpOptions,
    out: &mut impl Write,
) -> std::io::Result<DumpSummary> {
    let mut summary = DumpSummary::default();
    for id in segment_ids(dir)? {
        if options.segment.is_some_and(|wanted| wanted != id) {
            continue;
        }
        summary.segments += 1;
        let data = std::fs::read(dir.join(format!("{id:010}.seg")))?;
        let stream_name = stream.name();
        let header = match format::decode_segment_header(id, &data) {
            Ok(header) => header,
            Err(reason) => {
                writeln!(out, "{stream_name} segment {id}: bad header: {reason}")?;
                summary.damaged += 1;
                continue;
            }
        };
        if header.is_prepared() {
            writeln!(
                out,
                "{stream_name} segment {id}: prepared, not begun (no records) file_bytes {}",
                data.len()
            )?;
            continue;
        }
        writeln!(
            out,
            "{stream_name} segment {id}: first_lsn {}{} file_bytes {}",
            header.first_lsn,
            if header.is_recycled() {
                " recycled"
            } else {
                ""
            },
            data.len()
        )?;
        let mut pos = SEGMENT_HEADER_LEN;
        let mut last_lsn = 0;
        loop {
            match format::decode_batch(id, &data, pos, 0) {
                Ok(batch) => {
                    summary.batches += 1;
                    last_lsn = batch.lsn;
                    writeln!(
                        out,
                        "  batch lsn {} at {} bytes {} records {}",
                        batch.lsn, batch.offset, batch.frame_len, batch.count
                    )?;
                    for (loc, kind, payload) in batch.records() {
                        summary.records += 1;
                        writeln!(
                            out,
                            "    {}:{} {}",
                            loc.segment,
                            loc.offset,
                            describe(stream, kind, payload)
                        )?;
                    }
                    pos += batch.frame_len;
                }
                Err(FrameError::End) => {
                    writeln!(out, "  end of data at {pos}")?;
                    break;
                }
                Err(FrameError::Invalid(reason)) if options.skip_damaged => {
                    summary.damaged += 1;
                    match next_valid_batch(id, &data, pos, last_lsn) {
                        Some(next) => {
                            writeln!(
                                out,
                                "  damaged at {pos}: {reason}; skips {} bytes to the next batch \
                                 that verifies, at {next}",
                                next - pos
                            )?;
                            pos = next;
                        }
                        None => {
                            writeln!(
                                out,
                                "  damaged at {pos}: {reason}; no batch verifies after it"
                            )?;
                            break;
                        }
                    }
                }
                Err(FrameError::Invalid(reason)) => {
                    writeln!(out, "  stops at {pos}: {reason}")?;
                    summary.damaged += 1;
                    break;
                }
            }
        }
    }
    Ok(summary)
}

/// The first offset after `pos` where a whole batch with an LSN above
/// `after_lsn` verifies.
fn next_valid_batch(id: u32, data: &[u8], pos: usize, after_lsn: u64) -> Option<usize> {
    (pos + 1..data.len()).find(|&q| format::valid_batch_at(id, data, q, 0, after_lsn).is_some())
}

fn raw(kind: u8, payload: &[u8], why: &str) -> String {
    let mut text = format!("kind {kind} bytes {} ", payload.len());
    for b in payload.iter().take(16) {
        let _ = write!(text, "{b:02x}");
    }
    if payload.len() > 16 {
        text.push('…');
    }
    let _ = write!(text, " ({why})");
    text
}

/// One record, in words: as the engine describes its kind, or raw.
pub fn describe(stream: Stream, kind: u8, payload: &[u8]) -> String {
    let decoded = match stream {
        Stream::Msg => kinds::describe_msg(kind, payload),
        Stream::Evt => kinds::describe_evt(kind, payload),
    };
    decoded.unwrap_or_else(|why| raw(kind, payload, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_or_unknown_payload_is_shown_raw_with_the_reason() {
        assert_eq!(
            describe(Stream::Evt, 2, &[1, 2, 3]),
            "kind 2 bytes 3 010203 (truncated)"
        );
        assert_eq!(
            describe(Stream::Evt, 99, &[1]),
            "kind 99 bytes 1 01 (unknown effect record kind)"
        );
        let trim = [&[1u8][..], &7u64.to_le_bytes(), &40u64.to_le_bytes()].concat();
        assert_eq!(
            describe(Stream::Evt, 6, &trim),
            "effect trim uid 7 events_base 40"
        );
        assert_eq!(
            describe(Stream::Evt, 6 | 0x80, &trim),
            "effect copy of trim uid 7 events_base 40"
        );
        let switch = [&[1u8][..], &9u64.to_le_bytes(), &501u64.to_le_bytes()].concat();
        assert_eq!(
            describe(Stream::Evt, 12, &switch),
            "effect large-group conv 9 switch_seq 501"
        );
        let mark = [&[1u8][..], &3u64.to_le_bytes()].concat();
        assert_eq!(
            describe(Stream::Evt, 14, &mark),
            "effect round-mark index 3"
        );
    }
}
