//! `inboxd dump`: every record of a data directory's logs in readable
//! form, one line per batch and one per record, for the day a disk goes
//! bad (what is there, where it stops, what a damaged segment held).
//!
//! The framing (segment header, batch frames, record headers, checksums)
//! is checked by the engine's own decoder, [`inbox_engine::log::format`].
//! Record payloads are decoded here from the layouts in `docs/FORMAT.md`
//! (format version 1): the fields that locate a record (conversation and
//! `msg_seq`, user and `sync_seq`, device) are printed; a message body
//! never is, only its length. A payload this code does not know is printed
//! as its kind, its length and its first bytes in hex.
//!
//! Read-only: the caller holds the directory's lock so no daemon writes
//! while it reads.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

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

/// Dumps one stream's segments (only `segment` when given) to `out`.
pub fn dump_stream(
    dir: &Path,
    stream: Stream,
    segment: Option<u32>,
    out: &mut impl Write,
) -> std::io::Result<DumpSummary> {
    let mut summary = DumpSummary::default();
    for id in segment_ids(dir)? {
        if segment.is_some_and(|wanted| wanted != id) {
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
        loop {
            match format::decode_batch(id, &data, pos, 0) {
                Ok(batch) => {
                    summary.batches += 1;
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

/// A little-endian reader that gives `None` past the end.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.0 = self.0.get(n..)?;
        Some(())
    }
}

fn raw(kind: u8, payload: &[u8]) -> String {
    let mut text = format!("kind {kind} bytes {} ", payload.len());
    for b in payload.iter().take(16) {
        let _ = write!(text, "{b:02x}");
    }
    if payload.len() > 16 {
        text.push('…');
    }
    text
}

fn message_kind(kind: u8) -> &'static str {
    match kind {
        0 => "normal",
        1 => "join",
        2 => "leave",
        3 => "recall",
        4 => "edit",
        _ => "unknown",
    }
}

/// One record, in words.
pub fn describe(stream: Stream, kind: u8, payload: &[u8]) -> String {
    let decoded = match stream {
        Stream::Msg => describe_msg(kind, payload),
        Stream::Evt if kind & 0x80 != 0 => {
            describe_evt(kind & 0x7f, payload).map(|text| format!("copy of {text}"))
        }
        Stream::Evt => describe_evt(kind, payload),
    };
    decoded.unwrap_or_else(|| raw(kind, payload))
}

fn describe_msg(kind: u8, payload: &[u8]) -> Option<String> {
    let mut f = Fields(payload);
    if kind != 1 || f.u8()? != 1 {
        return None;
    }
    let flags = f.u8()?;
    let msg_kind = message_kind(f.u8()?);
    let msg_type = f.u16()?;
    let (conv, msg_seq, msg_id, sender, target, at_ms) =
        (f.u64()?, f.u64()?, f.u64()?, f.u64()?, f.u64()?, f.u64()?);
    let (raw_len, stored_len) = (f.u32()?, f.u32()?);
    let zstd = if flags & 1 != 0 { " zstd" } else { "" };
    Some(format!(
        "message conv {conv} msg_seq {msg_seq} msg_id {msg_id} sender {sender} {msg_kind} type {msg_type} target {target} at_ms {at_ms} body {raw_len} bytes (stored {stored_len}{zstd})"
    ))
}

fn describe_evt(kind: u8, payload: &[u8]) -> Option<String> {
    let mut f = Fields(payload);
    if f.u8()? != 1 {
        return None;
    }
    Some(match kind {
        1 => {
            let (conv, msg_seq, msg_id, sender) = (f.u64()?, f.u64()?, f.u64()?, f.u64()?);
            let msg_kind = message_kind(f.u8()?);
            let msg_type = f.u16()?;
            let (target_seq, at_ms, loc) = (f.u64()?, f.u64()?, f.u64()?);
            format!(
                "effect message conv {conv} msg_seq {msg_seq} msg_id {msg_id} sender {sender} {msg_kind} type {msg_type} target_seq {target_seq} at_ms {at_ms} at msg {}:{}",
                loc >> 32,
                loc & 0xffff_ffff
            )
        }
        // A message with its body inside: the header fields, then the
        // body described like a `msg` record (never its bytes).
        9 => {
            let (conv, msg_seq, msg_id, sender) = (f.u64()?, f.u64()?, f.u64()?, f.u64()?);
            let msg_kind = message_kind(f.u8()?);
            let msg_type = f.u16()?;
            let (target_seq, at_ms) = (f.u64()?, f.u64()?);
            f.skip(16)?; // client_msg_id
            let summary = usize::from(f.u8()?);
            f.skip(summary)?;
            let len = f.u32()? as usize;
            let body = f.0.get(..len)?;
            format!(
                "effect message conv {conv} msg_seq {msg_seq} msg_id {msg_id} sender {sender} {msg_kind} type {msg_type} target_seq {target_seq} at_ms {at_ms} with its body: {}",
                describe_msg(1, body)?
            )
        }
        10 => format!("effect move-bodies {} messages to msg", f.u32()?),
        2 => format!(
            "effect read uid {} conv {} read_seq {} at_ms {}",
            f.u64()?,
            f.u64()?,
            f.u64()?,
            f.u64()?
        ),
        3 => format!(
            "effect flags uid {} conv {} muted {} pinned {} at_ms {}",
            f.u64()?,
            f.u64()?,
            f.u8()?,
            f.u8()?,
            f.u64()?
        ),
        4 => format!(
            "effect device uid {} (row {} bytes)",
            f.u64()?,
            f.0.len()
        ),
        5 => format!(
            "effect snapshot uid {} snapshot_id {} device {} generation {} base_sync_seq {} created_at_ms {} expires_at_ms {} phase {}",
            f.u64()?,
            f.u64()?,
            f.u64()?,
            f.u64()?,
            f.u64()?,
            f.u64()?,
            f.u64()?,
            match f.u8()? {
                0 => "live",
                1 => "installed",
                2 => "dropped",
                _ => "unknown",
            }
        ),
        6 => format!("effect trim uid {} events_base {}", f.u64()?, f.u64()?),
        7 => format!("effect relocate {} events", f.u32()?),
        8 => format!("effect trim-messages conv {} msgs_base {}", f.u64()?, f.u64()?),
        12 => format!("effect large-group conv {} switch_seq {}", f.u64()?, f.u64()?),
        13 => format!(
            "effect clear-marker uid {} conv {} cleared_seq {}",
            f.u64()?,
            f.u64()?,
            f.u64()?
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_or_unknown_payload_is_shown_raw() {
        assert_eq!(
            describe(Stream::Evt, 2, &[1, 2, 3]),
            "kind 2 bytes 3 010203"
        );
        assert_eq!(describe(Stream::Evt, 99, &[1]), "kind 99 bytes 1 01");
        let trim = [&[1u8][..], &7u64.to_le_bytes(), &40u64.to_le_bytes()].concat();
        assert_eq!(
            describe(Stream::Evt, 6, &trim),
            "effect trim uid 7 events_base 40"
        );
        assert_eq!(
            describe(Stream::Evt, 6 | 0x80, &trim),
            "copy of effect trim uid 7 events_base 40"
        );
        let switch = [&[1u8][..], &9u64.to_le_bytes(), &501u64.to_le_bytes()].concat();
        assert_eq!(
            describe(Stream::Evt, 12, &switch),
            "effect large-group conv 9 switch_seq 501"
        );
    }
}
