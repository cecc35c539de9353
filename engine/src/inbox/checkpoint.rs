//! Index checkpoints (R22): every state table and index, written whole so
//! that recovery replays only the `evt` log written after it.
//!
//! File `checkpoint/ckpt-<evt lsn, 20 digits>.bin` (`...-2.bin` for a
//! second checkpoint at the same LSN, so that two retained files can both
//! cover it):
//! ```text
//! 0   [8]  magic "INBXCKP2" ("INBXCKP1": written before message
//!          locations could point into `evt`; read the same way)
//! 8   u64  evt LSN the state covers (everything up to it is applied)
//! 16  u64  body length N
//! 24  [N]  body: the canonical state encoding (see `encode_state`)
//! 24+N u32 CRC32 of bytes 0..24+N
//! ```
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
//! thread (`run_writer`) and goes on at once; the writer encodes it
//! straight into the file image ([`Image`]: header and body in one buffer
//! sized from the previous checkpoint), drops it, and writes the file. Invariants:
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

use super::codec::{sorted, DecodeError, DecodeResult, Reader, Writer};
use super::compaction::record as compaction;
use super::devices::record as devices;
use super::messaging::checkpoint as messaging;
use super::snapshots::record as snapshots;
use super::state::*;
use crate::api::Uid;
use crate::error::{Error, Result};
use crate::log::{write_file_durably, LogIo};

/// Version 2: a message location may carry the `evt` mark (`state::loc`);
/// an older binary, which would take it for a `msg` location, skips the
/// file as unknown and replays instead (and then refuses the new record
/// kinds rather than misread them).
const MAGIC: &[u8; 8] = b"INBXCKP2";
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

/// The canonical state encoding alone (the checkpoint body).
pub(crate) fn encode_state(st: &State) -> Vec<u8> {
    let mut w = Writer::with_capacity(1 << 16);
    encode_body(&mut w, st);
    w.buf
}

/// A checkpoint file without its CRC: header and body, encoded in one
/// buffer so the body is never copied; the writer appends the CRC.
pub(crate) struct Image {
    pub lsn: u64,
    buf: Vec<u8>,
}

impl Image {
    /// Bytes of the whole file (header, body, CRC).
    pub fn file_len(&self) -> usize {
        self.buf.len() + 4
    }
}

/// Encodes `st` as a checkpoint image into a buffer of `capacity` bytes
/// (the previous checkpoint's size plus some slack avoids regrowing a
/// buffer of hundreds of MB).
pub(crate) fn encode_image(st: &State, capacity: usize) -> Image {
    let mut w = Writer::with_capacity(capacity.max(1 << 16));
    w.buf.extend_from_slice(MAGIC);
    w.u64(st.evt_lsn);
    w.u64(0); // body length, patched below
    encode_body(&mut w, st);
    let body_len = (w.buf.len() - HEADER) as u64;
    w.buf[16..HEADER].copy_from_slice(&body_len.to_le_bytes());
    Image {
        lsn: st.evt_lsn,
        buf: w.buf,
    }
}

/// The body, section by section in a fixed order; each subsystem encodes
/// the tables it owns (layout in `docs/FORMAT.md`, "Checkpoint file").
fn encode_body(w: &mut Writer, st: &State) {
    w.u64(st.idem_ttl_ms);
    w.u64(st.next_msg_counter);
    w.u64(st.evt_lsn);
    messaging::put_convs(w, st);
    let users = sorted(&st.users);
    w.u64(users.len() as u64);
    for (uid, u) in users {
        w.u64(uid);
        // The user's event index: shared by every subsystem that appends
        // events, so it stays here.
        w.u64(u.events_base);
        w.u64(u.events.len() as u64);
        for loc in &u.events {
            w.u64(*loc);
        }
        devices::put_user_devices(w, u);
        messaging::put_user_convs(w, u);
    }
    messaging::put_idempotency(w, st);
    snapshots::encode_checkpoint_section(w, st);
    // Last and optional, so that a checkpoint written before history
    // retention existed still decodes.
    compaction::put_msg_bases(w, st);
    // Optional too, after the bases: links of edits to their targets.
    messaging::put_edit_links(w, st);
    // Optional too, after the links: large groups and marker clears.
    messaging::put_large_groups(w, st);
    // Optional too, after the large groups: the idempotency table (the
    // old section above is written empty).
    messaging::put_idempotency_table(w, st);
    // Optional too, after the idempotency table, and only on a store that
    // replicates: the replication index of the last round applied.
    if st.replica_index != 0 {
        w.u64(st.replica_index);
    }
}

#[cfg(test)]
pub(crate) fn decode_state(body: &[u8]) -> DecodeResult<State> {
    decode_state_in(body, Scratch::default())
}

/// Decodes a state whose message index goes straight to `scratch`.
pub(crate) fn decode_state_in(body: &[u8], scratch: Scratch) -> DecodeResult<State> {
    let mut r = Reader::new(body);
    let mut st = State::new(r.u64()?);
    st.use_scratch(scratch);
    st.next_msg_counter = r.u64()?;
    st.evt_lsn = r.u64()?;
    messaging::get_convs(&mut r, &mut st)?;
    for _ in 0..r.count(40)? {
        let uid: Uid = r.id()?;
        let mut u = User {
            events_base: r.id()?,
            ..User::default()
        };
        let n = r.count(8)?;
        u.events.reserve_exact(n);
        for _ in 0..n {
            u.events.push(r.u64()?);
        }
        devices::get_user_devices(&mut r, &mut u)?;
        messaging::get_user_convs(&mut r, &mut u)?;
        st.users.insert(uid, Arc::new(u));
    }
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
    (st.evt_refs, st.body_refs, st.msg_refs) = st.recount_seg_refs();
    st.totals = st.recount_totals();
    Ok(st)
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

/// The LSNs of the checkpoints on disk, newest first, made durable first
/// (a rename a crash left unsynced is synced here), for
/// [`Shared::checkpoints`] at open.
pub(crate) fn durable_lsns(data_dir: &Path) -> Result<Vec<u64>> {
    let d = dir(data_dir);
    if d.is_dir() {
        fsync_dir(&d)?;
    }
    Ok(list(data_dir)?.into_iter().map(|(lsn, _)| lsn).collect())
}

fn fsync_dir(d: &Path) -> Result<()> {
    fs::File::open(d).and_then(|f| f.sync_all()).map_err(io_err)
}

/// Writes a checkpoint image durably through `io` (the logs' IO layer, so
/// fault injection and the power-cut model cover it), then prunes all but
/// the newest [`KEEP`]. On error the tmp file is removed (best effort; a
/// leftover one is never listed) and older checkpoints are untouched.
pub(crate) fn write(io: &dyn LogIo, data_dir: &Path, image: Image) -> Result<()> {
    let Image { lsn, mut buf } = image;
    let crc = crc32fast::hash(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
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
    let name = file_name(lsn, d.join(file_name(lsn, false)).exists());
    let tmp = d.join(format!("{name}.tmp"));
    write_file_durably(io, &tmp, &d.join(&name), &buf).map_err(io_err)?;
    for (_, path) in list(data_dir)?.into_iter().skip(KEEP) {
        io.remove(&path).map_err(io_err)?;
    }
    remove_stale_tmp(io, &d);
    io.sync_dir(&d).map_err(io_err)
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
pub(crate) fn read_in(path: &Path, scratch: Scratch) -> std::result::Result<(u64, State), String> {
    let buf = fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    if buf.len() < 28 || (&buf[..8] != MAGIC && &buf[..8] != MAGIC_V1) {
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
    let st = decode_state_in(body, scratch).map_err(|e| e.0.to_string())?;
    if st.evt_lsn != lsn {
        return Err("header and body LSN differ".into());
    }
    Ok((lsn, st))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ConvId, MsgSeq};
    use crate::log::PwriteIo;

    #[test]
    fn a_second_checkpoint_at_the_same_lsn_is_kept_as_a_separate_copy() {
        let tmp = tempfile::tempdir().unwrap();
        let image = |lsn| {
            let mut st = State::new(0);
            st.evt_lsn = lsn;
            encode_image(&st, 0)
        };
        write(&PwriteIo, tmp.path(), image(5)).unwrap();
        write(&PwriteIo, tmp.path(), image(5)).unwrap();
        let lsns: Vec<u64> = list(tmp.path()).unwrap().iter().map(|(l, _)| *l).collect();
        assert_eq!(lsns, [5, 5], "both retained checkpoints cover LSN 5");
        for (_, path) in list(tmp.path()).unwrap() {
            assert_eq!(read(&path).unwrap().0, 5);
        }
        write(&PwriteIo, tmp.path(), image(5)).unwrap();
        assert_eq!(
            list(tmp.path()).unwrap().len(),
            2,
            "a third copy replaces the second"
        );
        write(&PwriteIo, tmp.path(), image(7)).unwrap();
        let lsns: Vec<u64> = list(tmp.path()).unwrap().iter().map(|(l, _)| *l).collect();
        assert_eq!(lsns, [7, 5], "the newest two are kept");
    }

    #[test]
    fn a_checkpoint_written_before_edit_links_decodes_with_none() {
        let mut st = State::new(0);
        let conv = Arc::make_mut(st.convs.entry(ConvId(7)).or_default());
        conv.edits.insert(MsgSeq(1), vec![MsgSeq(2)]);
        let body = encode_state(&st);
        assert_eq!(decode_state(&body).unwrap(), st, "links round-trip");
        // The same state as an older writer encoded it: no links section.
        let mut old = st.clone();
        Arc::make_mut(old.convs.get_mut(&ConvId(7)).unwrap())
            .edits
            .clear();
        let mut older = encode_state(&old);
        // No idempotency table (one zero count), no large-group section
        // (two) and no links (one).
        older.truncate(older.len() - 8 - 16 - 8);
        assert_eq!(decode_state(&older).unwrap(), old);
    }

    #[test]
    fn large_groups_and_marker_clears_round_trip_and_an_older_checkpoint_has_none() {
        use crate::inbox::state::{LargeMode, LastEntry, UserConv};
        let mut st = State::new(0);
        let conv = Arc::make_mut(st.convs.entry(ConvId(7)).or_default());
        conv.large = Some(LargeMode {
            switch_seq: MsgSeq(4),
            last: LastEntry {
                msg_seq: MsgSeq(9),
                msg_id: crate::api::MsgId(12),
                sender: crate::api::Uid(3),
                summary: bytes::Bytes::from_static(b"hi"),
                at_ms: 77,
            },
            stamp: 0,
        });
        let user = Arc::make_mut(st.users.entry(crate::api::Uid(3)).or_default());
        let uc = UserConv {
            cleared_seq: MsgSeq(8),
            ..UserConv::default()
        };
        user.order.insert(uc.key(ConvId(7)));
        user.convs.insert(ConvId(7), uc);
        let body = encode_state(&st);
        assert_eq!(decode_state(&body).unwrap(), st, "large groups round-trip");
        let mut plain = State::new(0);
        plain.convs.entry(ConvId(7)).or_default();
        let mut older = encode_state(&plain);
        // No idempotency table (its mark and a zero count), no large
        // groups (two zero counts).
        older.truncate(older.len() - 16 - 16);
        assert_eq!(decode_state(&older).unwrap(), plain);
    }

    #[test]
    fn checkpoint_names_other_than_the_two_forms_are_ignored() {
        assert_eq!(
            parse_name("ckpt-00000000000000000005.bin"),
            Some((5, false))
        );
        assert_eq!(
            parse_name("ckpt-00000000000000000005-2.bin"),
            Some((5, true))
        );
        assert_eq!(parse_name("ckpt-00000000000000000005.bin.tmp"), None);
        assert_eq!(parse_name("ckpt-5.bin"), None);
        assert_eq!(parse_name("ckpt-0000000000000000000x.bin"), None);
    }
}
