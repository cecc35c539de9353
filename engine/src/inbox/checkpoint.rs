//! Index checkpoints (R22): every state table and index, written whole so
//! that recovery replays only the `evt` log written after it.
//!
//! File `checkpoint/ckpt-<evt lsn, 20 digits>.bin` (`...-2.bin` for a
//! second checkpoint at the same LSN, so that two retained files can both
//! cover it):
//! ```text
//! 0   [8]  magic "INBXCKP3" (older: "INBXCKP2", "INBXCKP1", still read)
//! 8   u64  evt LSN the state covers (everything up to it is applied)
//! 16  u64  body length N
//! 24  [N]  body: the canonical state encoding (see `encode_state`)
//! 24+N u32 CRC32 of bytes 0..24+N
//! ```
//!
//! ## The body: tagged sections
//! The body is a run of sections, then their table, so that a section can
//! be added without breaking an older reader:
//! ```text
//! section bytes, back to back, in ascending tag order
//! table: per section, in the same order: tag u32, length u64
//! count u32   the number of sections (the body's last four bytes)
//! ```
//! A reader finds the table from the end, decodes each section it knows
//! from its own bytes (which it must consume exactly) and skips a tag it
//! does not know. The table is written last because a section's length is
//! known only once it is written, and the body is streamed to the file a
//! chunk at a time: the lengths are counted as the bytes go by, nothing is
//! encoded twice, and reading takes each section as a slice of the mapped
//! file. Tags are in [`tag`]; a new section takes the next free tag.
//!
//! A format 1 or 2 body is the same sections with no tags nor table, the
//! later ones optional at the end ([`decode_untagged`]).
//!
//! Writing: tmp file, fsync, rename, fsync the directory; only then are
//! older checkpoints deleted, keeping the newest two, so a corrupt newest
//! one can fall back to the previous one (or to a full replay). A tmp file
//! is never listed as a checkpoint; a failed write removes its own, and a
//! successful one removes any left by a crash.
//!
//! The body is canonical (maps in key order), so two equal states encode
//! to the same bytes: its SHA-256 is the state digest tests compare.
//!
//! ## Who writes
//! The sequencer drains the pipeline and copies the state under the read
//! lock (so the copy is exactly the state at one LSN; users and
//! conversations are `Arc`s, so the copy shares them and a later change
//! clones what it touches). It hands the copy to the one checkpoint-writer
//! thread (`run_writer`) and goes on at once; the writer encodes it into
//! the tmp file a chunk of [`WRITE_CHUNK`] bytes at a time, unsynced
//! ([`encode_to_file`]), drops it, and only then writes the header and CRC
//! and syncs ([`finish`]). So a checkpoint holds one chunk of its encoding
//! in memory, whatever the state's size, and the copy of the state is
//! released before the fsync. Invariants:
//! - one FIFO writer: checkpoints become durable strictly in LSN order, and
//!   a job's reply means that file and every earlier one are done;
//! - a `Checkpoint` caller is answered once its file is renamed and the
//!   directory fsynced, or with the write error;
//! - a write error is never fatal: a checkpoint is an optimisation, recovery
//!   uses the older one or replays, so the logs are not poisoned.
//!
//! The writer thread itself is `sequencer/checkpoints.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::codec::{sorted, DecodeError, DecodeResult, Reader, Sink, Writer};
use super::compaction::record as compaction;
use super::devices::record as devices;
use super::fanout::record as fanout;
use super::messaging::checkpoint as messaging;
use super::snapshots::record as snapshots;
use super::state::*;
use crate::api::Uid;
use crate::error::{Error, Result};
use crate::log::LogIo;

/// Version 3: the body is tagged sections. An older binary skips the
/// file as unknown and replays the log instead.
const MAGIC: &[u8; 8] = b"INBXCKP3";
/// Version 2: a message location may carry the `evt` mark (`containers::loc`);
/// an older binary, which would take it for a `msg` location, skips the
/// file as unknown and replays instead (and then refuses the new record
/// kinds rather than misread them). Read, never written.
const MAGIC_V2: &[u8; 8] = b"INBXCKP2";
/// Written by older versions: every message location is in `msg`, which
/// is what an unmarked location means here too.
const MAGIC_V1: &[u8; 8] = b"INBXCKP1";
/// Magic, LSN, body length.
const HEADER: usize = 24;
/// Checkpoints retained: a corrupt newest one falls back to the other.
pub(crate) const KEEP: usize = 2;

pub(crate) fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoint")
}

/// The tags of the body's sections, in the order they are written. A tag
/// is never reused for another content.
pub(crate) mod tag {
    /// `idem_ttl_ms` u64, `next_msg_counter` u64, `evt_lsn` u64; first.
    pub const HEAD: u32 = 1;
    /// Conversations and their message indexes (messaging).
    pub const CONVS: u32 = 2;
    /// Users: event index, device rows (devices), conversation rows
    /// (messaging).
    pub const USERS: u32 = 3;
    /// Snapshot rows (snapshots).
    pub const SNAPSHOTS: u32 = 4;
    /// Message bases below which history is reclaimed (compaction).
    pub const MSG_BASES: u32 = 5;
    /// Links of edits to their targets (messaging).
    pub const EDIT_LINKS: u32 = 6;
    /// Large groups and marker clears (messaging).
    pub const LARGE_GROUPS: u32 = 7;
    /// The idempotency table (messaging).
    pub const IDEMPOTENCY: u32 = 8;
    /// The replication index of the last round applied: u64.
    pub const REPLICA_INDEX: u32 = 9;
    /// Outboxes to other groups, applied watermarks and dedup records
    /// (fan-out); written only when there are any.
    pub const FANOUT: u32 = 10;
}

/// Bytes of one entry of the section table: tag u32, length u64.
const TABLE_ENTRY: usize = 12;

/// The canonical state encoding alone (the checkpoint body).
pub(crate) fn encode_state(st: &State) -> Vec<u8> {
    let mut w = Writer::with_capacity(1 << 16);
    encode_body(&mut w, st, &|w: &Writer| w.buf.len() as u64);
    w.buf
}

/// Bytes of encoding a checkpoint holds before writing them out.
pub(crate) const WRITE_CHUNK: usize = 1 << 20;

/// The tmp file a streaming encoding writes to (the [`Sink`] behind a
/// checkpoint's [`Writer`]): where the body has reached, its CRC so far,
/// and the first write error, after which nothing more is written.
struct BodyOut {
    io: Arc<dyn LogIo>,
    file: fs::File,
    end: u64,
    crc: crc32fast::Hasher,
    error: Option<std::io::Error>,
}

struct ToFile(std::rc::Rc<std::cell::RefCell<BodyOut>>);

impl Sink for ToFile {
    fn put(&mut self, bytes: &[u8]) {
        let out = &mut *self.0.borrow_mut();
        if out.error.is_some() {
            return;
        }
        match out.io.write_at(&out.file, out.end, bytes, false) {
            Ok(()) => {
                out.crc.update(bytes);
                out.end += bytes.len() as u64;
            }
            Err(e) => out.error = Some(e),
        }
    }
}

/// A checkpoint whose body is in its tmp file, not yet durable: its header
/// and CRC are written by [`finish`].
pub(crate) struct Encoded {
    pub lsn: u64,
    tmp: PathBuf,
    path: PathBuf,
    file: fs::File,
    end: u64,
    body_crc: crc32fast::Hasher,
}

/// Encodes `st` into a new tmp checkpoint file through `io`, a
/// [`WRITE_CHUNK`] at a time, unsynced. On error the tmp file is removed
/// (best effort; a leftover one is never listed).
pub(crate) fn encode_to_file(io: &Arc<dyn LogIo>, data_dir: &Path, st: &State) -> Result<Encoded> {
    let d = dir(data_dir);
    // Not `create_dir_all`: a data directory removed under a running
    // engine is an error, never made again with a checkpoint alone in it.
    match fs::create_dir(&d) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io_err(e)),
        _ => {}
    }
    // A second checkpoint at an LSN that already has one (nothing was
    // logged in between) is written as a separate copy: then both retained
    // checkpoints cover that LSN, which is what lets compaction delete the
    // segments below it.
    let lsn = st.evt_lsn;
    let name = file_name(lsn, d.join(file_name(lsn, false)).exists());
    let tmp = d.join(format!("{name}.tmp"));
    let path = d.join(&name);
    let encoded = (|| {
        if tmp.exists() {
            io.remove(&tmp)?;
        }
        // The header's room; the body and the CRC extend the file.
        let file = io.create_preallocated(&tmp, HEADER as u64)?;
        let out = std::rc::Rc::new(std::cell::RefCell::new(BodyOut {
            io: io.clone(),
            file,
            end: HEADER as u64,
            crc: crc32fast::Hasher::new(),
            error: None,
        }));
        let mut w = Writer::streaming(Box::new(ToFile(out.clone())), WRITE_CHUNK);
        // Where the body has reached: what the file holds past its
        // header, plus what the writer holds.
        let at = |w: &Writer| out.borrow().end - HEADER as u64 + w.buf.len() as u64;
        encode_body(&mut w, st, &at);
        w.finish();
        let out = std::rc::Rc::into_inner(out)
            .expect("the writer that shared it is gone")
            .into_inner();
        match out.error {
            Some(e) => Err(e),
            None => Ok(Encoded {
                lsn,
                tmp: tmp.clone(),
                path,
                file: out.file,
                end: out.end,
                body_crc: out.crc,
            }),
        }
    })();
    encoded.map_err(|e| {
        if tmp.exists() {
            let _ = io.remove(&tmp);
        }
        io_err(e)
    })
}

/// Makes an encoded checkpoint durable: header and CRC, one fdatasync of
/// the file, the rename and the directory fsync; then prunes all but the
/// newest [`KEEP`]. On error the tmp file is removed (best effort) and
/// older checkpoints are untouched.
pub(crate) fn finish(io: &dyn LogIo, data_dir: &Path, e: Encoded) -> Result<()> {
    let Encoded {
        lsn,
        tmp,
        path,
        file,
        end,
        body_crc,
    } = e;
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&lsn.to_le_bytes());
    header.extend_from_slice(&(end - HEADER as u64).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&header);
    crc.combine(&body_crc);
    let written = (|| {
        io.write_at(&file, 0, &header, false)?;
        io.write_at(&file, end, &crc.finalize().to_le_bytes(), true)?;
        drop(file);
        io.rename(&tmp, &path)
    })();
    if let Err(e) = written {
        if tmp.exists() {
            let _ = io.remove(&tmp);
        }
        return Err(io_err(e));
    }
    let d = dir(data_dir);
    io.sync_dir(&d).map_err(io_err)?;
    for (_, path) in list(data_dir)?.into_iter().skip(KEEP) {
        io.remove(&path).map_err(io_err)?;
    }
    remove_stale_tmp(io, &d);
    io.sync_dir(&d).map_err(io_err)
}

/// Writes `st` as a checkpoint durably through `io` (the logs' IO layer,
/// so fault injection and the power-cut model cover it): [`encode_to_file`]
/// then [`finish`].
pub(crate) fn write_state(io: &Arc<dyn LogIo>, data_dir: &Path, st: &State) -> Result<()> {
    let encoded = encode_to_file(io, data_dir, st)?;
    finish(io.as_ref(), data_dir, encoded)
}

/// The body: each section in tag order, each subsystem encoding the
/// tables it owns (layouts in `docs/FORMAT.md`, "Checkpoint file"), then
/// the section table. `at` tells how many body bytes `w` has taken so far.
fn encode_body(w: &mut Writer, st: &State, at: &dyn Fn(&Writer) -> u64) {
    let mut table: Vec<(u32, u64)> = Vec::with_capacity(16);
    let mut section = |w: &mut Writer, tag: u32, put: &dyn Fn(&mut Writer)| {
        let start = at(w);
        put(w);
        table.push((tag, at(w) - start));
    };
    section(w, tag::HEAD, &|w| {
        w.u64(st.idem_ttl_ms);
        w.u64(st.next_msg_counter);
        w.u64(st.evt_lsn);
    });
    section(w, tag::CONVS, &|w| messaging::put_convs(w, st));
    section(w, tag::USERS, &|w| put_users(w, st));
    section(w, tag::SNAPSHOTS, &|w| {
        snapshots::encode_checkpoint_section(w, st)
    });
    section(w, tag::MSG_BASES, &|w| compaction::put_msg_bases(w, st));
    section(w, tag::EDIT_LINKS, &|w| messaging::put_edit_links(w, st));
    section(w, tag::LARGE_GROUPS, &|w| {
        messaging::put_large_groups(w, st)
    });
    section(w, tag::IDEMPOTENCY, &|w| {
        messaging::put_idempotency_table(w, st)
    });
    section(w, tag::REPLICA_INDEX, &|w| w.u64(st.replica_index));
    if !st.fanout.is_empty() {
        section(w, tag::FANOUT, &|w| fanout::put_section(w, &st.fanout));
    }
    for (tag, len) in &table {
        w.u32(*tag);
        w.u64(*len);
    }
    w.u32(table.len() as u32);
}

/// The users section: per user, its event index (shared by every
/// subsystem that appends events, so it stays here), its device rows and
/// its conversation rows.
fn put_users(w: &mut Writer, st: &State) {
    let users = sorted(&st.users);
    w.u64(users.len() as u64);
    for (uid, u) in users {
        w.u64(uid);
        w.u64(u.events_base);
        w.u64(u.events.len() as u64);
        for loc in u.events.iter() {
            w.u64(loc);
        }
        devices::put_user_devices(w, u);
        messaging::put_user_convs(w, u);
    }
}

/// Reads the users section (or the users of an untagged body).
fn get_users(r: &mut Reader<'_>, st: &mut State) -> DecodeResult<()> {
    for _ in 0..r.count(40)? {
        let uid: Uid = r.id()?;
        let mut u = User {
            events_base: r.id()?,
            ..User::default()
        };
        let n = r.count(8)?;
        let locs = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        u.events = locs.into_iter().collect();
        devices::get_user_devices(r, &mut u)?;
        messaging::get_user_convs(r, &mut u)?;
        st.users.insert(uid, Arc::new(u));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) fn decode_state(body: &[u8]) -> DecodeResult<State> {
    decode_state_in(body, Scratch::default())
}

/// Decodes a format 3 body whose message index goes straight to
/// `scratch`.
pub(crate) fn decode_state_in(body: &[u8], scratch: Scratch) -> DecodeResult<State> {
    let sections = section_table(body)?;
    let Some(&(tag::HEAD, head)) = sections.first() else {
        return Err(DecodeError(
            "checkpoint does not begin with its head section",
        ));
    };
    let mut r = Reader::new(head);
    let mut st = State::new(r.u64()?);
    st.use_scratch(scratch);
    st.next_msg_counter = r.u64()?;
    st.evt_lsn = r.u64()?;
    if !r.is_empty() {
        return Err(DecodeError("trailing bytes in a checkpoint section"));
    }
    let mut last = tag::HEAD;
    for &(tag, bytes) in &sections[1..] {
        if tag <= last {
            return Err(DecodeError("checkpoint sections repeated or out of order"));
        }
        last = tag;
        let mut r = Reader::new(bytes);
        match tag {
            tag::CONVS => messaging::get_convs(&mut r, &mut st)?,
            tag::USERS => get_users(&mut r, &mut st)?,
            tag::SNAPSHOTS => snapshots::decode_checkpoint_section(&mut r, &mut st)?,
            tag::MSG_BASES => compaction::get_msg_bases(&mut r, &mut st)?,
            tag::EDIT_LINKS => messaging::get_edit_links(&mut r, &mut st)?,
            tag::LARGE_GROUPS => messaging::get_large_groups(&mut r, &mut st)?,
            tag::IDEMPOTENCY => messaging::get_idempotency_table(&mut r, &mut st)?,
            tag::REPLICA_INDEX => st.replica_index = r.u64()?,
            tag::FANOUT => fanout::get_section(&mut r, &mut st.fanout)?,
            // A section of a later version: what it holds is not this
            // version's to know.
            _ => continue,
        }
        if !r.is_empty() {
            return Err(DecodeError("trailing bytes in a checkpoint section"));
        }
    }
    Ok(finish_decode(st))
}

/// A format 3 body's sections, as (tag, bytes) in body order, from the
/// table at its end.
fn section_table(body: &[u8]) -> DecodeResult<Vec<(u32, &[u8])>> {
    let count_at = body
        .len()
        .checked_sub(4)
        .ok_or(DecodeError("checkpoint body too short"))?;
    let count = Reader::new(&body[count_at..]).u32()? as usize;
    let table_at = count
        .checked_mul(TABLE_ENTRY)
        .and_then(|len| count_at.checked_sub(len))
        .ok_or(DecodeError("checkpoint section table longer than the body"))?;
    let mut r = Reader::new(&body[table_at..count_at]);
    let mut sections = Vec::with_capacity(count);
    let mut start = 0usize;
    for _ in 0..count {
        let tag = r.u32()?;
        let end = usize::try_from(r.u64()?)
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|&end| end <= table_at)
            .ok_or(DecodeError("checkpoint section runs past its table"))?;
        sections.push((tag, &body[start..end]));
        start = end;
    }
    if start != table_at {
        return Err(DecodeError("checkpoint bytes outside every section"));
    }
    Ok(sections)
}

/// Decodes a format 1 or 2 body: the sections in a fixed order, untagged,
/// the later ones optional at the end.
fn decode_untagged(body: &[u8], scratch: Scratch) -> DecodeResult<State> {
    let mut r = Reader::new(body);
    let mut st = State::new(r.u64()?);
    st.use_scratch(scratch);
    st.next_msg_counter = r.u64()?;
    st.evt_lsn = r.u64()?;
    messaging::get_convs(&mut r, &mut st)?;
    get_users(&mut r, &mut st)?;
    messaging::get_idempotency(&mut r, &mut st)?;
    snapshots::decode_checkpoint_section(&mut r, &mut st)?;
    if !r.is_empty() {
        compaction::get_msg_bases(&mut r, &mut st)?;
    }
    if !r.is_empty() {
        messaging::get_edit_links(&mut r, &mut st)?;
    }
    if !r.is_empty() {
        messaging::get_large_groups(&mut r, &mut st)?;
    }
    if !r.is_empty() {
        messaging::get_idempotency_table(&mut r, &mut st)?;
    }
    if !r.is_empty() {
        st.replica_index = r.u64()?;
    }
    if !r.is_empty() {
        return Err(DecodeError("trailing bytes in checkpoint"));
    }
    Ok(finish_decode(st))
}

/// What a decoded state derives rather than stores: segment reference
/// counts, totals, each conversation's body hint.
fn finish_decode(mut st: State) -> State {
    (st.evt_refs, st.body_refs, st.msg_refs) = st.recount_seg_refs();
    st.totals = st.recount_totals();
    for c in st.convs.values_mut() {
        Arc::make_mut(c).advance_bodies_hint();
    }
    st
}

fn file_name(lsn: u64, copy: bool) -> String {
    if copy {
        format!("ckpt-{lsn:020}-2.bin")
    } else {
        format!("ckpt-{lsn:020}.bin")
    }
}

/// The LSN of a checkpoint file name, and whether it is the second copy.
fn parse_name(name: &str) -> Option<(u64, bool)> {
    let stem = name.strip_prefix("ckpt-")?.strip_suffix(".bin")?;
    let (digits, copy) = match stem.strip_suffix("-2") {
        Some(d) => (d, true),
        None => (stem, false),
    };
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, copy))
}

/// Checkpoint files, newest first.
pub(crate) fn list(data_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let d = dir(data_dir);
    let mut out: Vec<(u64, bool, PathBuf)> = Vec::new();
    let entries = match fs::read_dir(&d) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some((lsn, copy)) = parse_name(name) {
            out.push((lsn, copy, entry.path()));
        }
    }
    out.sort_unstable_by_key(|(lsn, copy, _)| std::cmp::Reverse((*lsn, *copy)));
    Ok(out.into_iter().map(|(lsn, _, path)| (lsn, path)).collect())
}

fn io_err(e: std::io::Error) -> Error {
    Error::Log(crate::log::LogError::Io(e))
}

/// The checkpoints on disk as [`list`] gives them, made durable first (a
/// rename a crash left unsynced is synced here), for
/// [`Shared::know_checkpoints`] at open.
pub(crate) fn durable_list(data_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let d = dir(data_dir);
    if d.is_dir() {
        fsync_dir(&d)?;
    }
    list(data_dir)
}

/// Bytes of the newest of `files` (as [`list`] gives them; 0 when there is
/// none, or it cannot be read): the state's size as a checkpoint last
/// wrote it.
pub(crate) fn newest_bytes(files: &[(u64, PathBuf)]) -> u64 {
    files
        .first()
        .and_then(|(_, path)| fs::metadata(path).ok())
        .map_or(0, |m| m.len())
}

fn fsync_dir(d: &Path) -> Result<()> {
    fs::File::open(d).and_then(|f| f.sync_all()).map_err(io_err)
}

/// Removes tmp files left by a write cut short by a crash. Only the one
/// writer thread makes tmp files, and it has none in progress here.
fn remove_stale_tmp(io: &dyn LogIo, d: &Path) {
    let Ok(entries) = fs::read_dir(d) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let stale = name
            .to_str()
            .is_some_and(|n| n.starts_with("ckpt-") && n.ends_with(".bin.tmp"));
        if stale && entry.file_type().is_ok_and(|t| t.is_file()) {
            // Best effort: a leftover tmp file is never listed anyway.
            let _ = io.remove(&entry.path());
        }
    }
}

/// Reads and checks one checkpoint file.
pub(crate) fn read(path: &Path) -> std::result::Result<(u64, State), String> {
    read_in(path, Scratch::default())
}

/// [`read`], the message index going straight to `scratch`.
///
/// The file is mapped, not read into a buffer: loading a checkpoint holds
/// its decoded state, not also a copy of its bytes. A checkpoint file is
/// never written again once renamed into place, and removing it while
/// mapped keeps the mapping valid.
pub(crate) fn read_in(path: &Path, scratch: Scratch) -> std::result::Result<(u64, State), String> {
    let file = fs::File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    // SAFETY: see above; nothing truncates or rewrites a renamed
    // checkpoint while the process runs.
    let buf =
        unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("map {}: {e}", path.display()))?;
    let tagged = match buf.get(..8) {
        Some(m) if m == MAGIC => true,
        Some(m) if m == MAGIC_V2 || m == MAGIC_V1 => false,
        _ => return Err("bad magic or too short".into()),
    };
    if buf.len() < 28 {
        return Err("bad magic or too short".into());
    }
    let (data, crc) = buf.split_at(buf.len() - 4);
    let mut crc_bytes = [0u8; 4];
    crc_bytes.copy_from_slice(crc);
    if crc32fast::hash(data) != u32::from_le_bytes(crc_bytes) {
        return Err("checksum mismatch".into());
    }
    let mut r = Reader::new(&data[8..]);
    let lsn = r.u64().map_err(|e| e.0.to_string())?;
    let len = r.u64().map_err(|e| e.0.to_string())?;
    let body = &data[24..];
    if body.len() as u64 != len {
        return Err("body length mismatch".into());
    }
    let st = if tagged {
        decode_state_in(body, scratch)
    } else {
        decode_untagged(body, scratch)
    }
    .map_err(|e| e.0.to_string())?;
    if st.evt_lsn != lsn {
        return Err("header and body LSN differ".into());
    }
    Ok((lsn, st))
}

#[cfg(test)]
mod tests;
