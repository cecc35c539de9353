//! Snapshots for reset devices (R18).
//!
//! `begin_snapshot` is one sequencer step: it bumps the device's
//! generation, sets it RESETTING, and logs a snapshot row with a frozen
//! `base_sync_seq = S`, the user's sync head at that step. In the same step
//! the sequencer captures the *plan*: the conversation list (unread, read
//! cursor, flags, last message) and, per conversation, the positions of the
//! last N messages inside the user's membership periods, all read from the
//! in-memory state as it stands at S. Nothing later can leak in: events
//! after S are applied after the capture.
//!
//! Once the step is durable the completion stage hands the plan to the
//! snapshot-builder thread ([`run_builder`]), which builds the content
//! (reading message bodies, which never change), encodes it in pages, takes
//! the SHA-256 of the pages (the manifest digest), and writes it to
//! `snap/<uid>-<snapshot_id>.snap` (tmp, fsync, rename, fsync dir). The
//! snapshot is READY from then on and immutable; it is served from that file,
//! so an interrupted install can fetch the same pages again, also after a
//! restart. The caller's reply is sent after the build if it still waits;
//! a caller that went away does not stop the build, so the snapshot becomes
//! READY (and can be fetched and acknowledged) all the same.
//!
//! A snapshot whose build was cut short never becomes READY: by a crash, or
//! by shutdown, which lets the builder finish the build in hand and abandons
//! the queued ones (their callers get an error). It fences until it
//! expires, and the device begins a new one.
//!
//! Bodies: a message that is recalled or edited (at S, or by the time the
//! content is built) is a tombstone and its body is never written (R6).
//!
//! ## Snapshot file
//! ```text
//! 0   [8]  magic "INBXSNP1"
//! 8   u64  uid
//! 16  u64  snapshot_id
//! 24  u64  base_sync_seq
//! 32  u64  generation
//! 40  [32] manifest digest: SHA-256 over every page as (u32 len, bytes)
//! 72  u32  page count P
//! 76  P x (u32 len, page bytes)
//! ..  u32  CRC32 of everything before
//! ```
//! A page: u32 conv count, each conversation summary (conv u64,
//! last_msg_seq u64, last_msg_id u64, last_sender u64, last_summary u8 len +
//! bytes, unread u32, read_seq u64, last_activity_ms u64, muted u8, pinned
//! u8); then u32 message count, each message (conv u64, msg_seq u64,
//! msg_id u64, sender u64, kind u8, msg_type u16, target u64 (0 = none),
//! sent_at_ms u64, tombstone u8, payload u32 len + bytes).

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use bytes::Bytes;
use parking_lot::Mutex;
use sha2::Digest;

use super::codec::{DecodeError, DecodeResult, Reader, Writer};
use super::command::{decode_msg_record, kind_code, kind_from_code, unpack, DeviceRow, Effect};
use super::fence::{ms, SnapshotPhase, SnapshotRow};
use super::sequencer::Tx;
use super::state::{MsgMeta, State};
use super::sync::{device_row, device_row_at, info};
use super::{InboxConfig, Reply, Shared};
use crate::api::*;
use crate::error::{Error, Result};
use crate::log::LogError;

const MAGIC: &[u8; 8] = b"INBXSNP1";
/// Conversations per snapshot page.
pub(crate) const CONVS_PER_PAGE: usize = 64;

/// What the sequencer captured at S.
pub(crate) struct Plan {
    pub uid: Uid,
    pub snapshot_id: u64,
    pub generation: Generation,
    pub base_sync_seq: SyncSeq,
    /// Newest activity first.
    pub convs: Vec<ConvSummary>,
    /// Per conversation of `convs`, the last N messages (oldest first) as
    /// they were at S.
    pub messages: Vec<Vec<(MsgSeq, MsgMeta)>>,
}

/// A built snapshot.
pub(crate) struct Content {
    pub digest: [u8; 32],
    pub pages: Vec<Vec<u8>>,
}

/// Built snapshots, cached from their files.
#[derive(Default)]
pub(crate) struct Store {
    cache: Mutex<HashMap<(Uid, u64), Arc<Content>>>,
    /// Set at shutdown: the builder abandons the builds still queued.
    stopping: AtomicBool,
}

/// A snapshot to build: the plan captured at S, and the caller's reply
/// (sent only if the caller still listens).
pub(crate) struct Job {
    pub plan: Plan,
    pub tx: Tx<SnapshotInfo>,
}

/// The snapshot-builder thread: builds each snapshot whose begin step is
/// durable, in the order received, until every sender is gone (the
/// sequencer and the completion stage have stopped).
pub(crate) fn run_builder(shared: Arc<Shared>, rx: mpsc::Receiver<Job>) {
    while let Ok(Job { plan, tx }) = rx.recv() {
        let result = if shared.snapshots.stopping.load(Ordering::Acquire) {
            // The crash case: the row stays BUILDING until it expires.
            Err(Error::Internal(format!(
                "engine shut down before snapshot {} of uid {} was built; begin a new one",
                plan.snapshot_id, plan.uid
            )))
        } else {
            build(&shared, &plan)
        };
        if let Err(e) = &result {
            tracing::warn!(uid = plan.uid, snapshot_id = plan.snapshot_id, error = %e, "snapshot not built; it fences until it expires");
        }
        // A caller that went away needs no answer: the snapshot is READY
        // (or not) on disk either way.
        let _ = tx.send(Reply::Done(result));
    }
}

pub(crate) fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("snap")
}

pub(crate) fn file_path(data_dir: &Path, uid: Uid, id: u64) -> PathBuf {
    dir(data_dir).join(format!("{uid}-{id}.snap"))
}

fn io_err(e: std::io::Error) -> Error {
    Error::Log(LogError::Io(e))
}

impl Store {
    /// Makes the builder abandon every build it has not started yet.
    pub fn stop_builder(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// The content of a built snapshot, from the cache or its file.
    pub fn get(&self, data_dir: &Path, uid: Uid, id: u64) -> Result<Option<Arc<Content>>> {
        if let Some(c) = self.cache.lock().get(&(uid, id)) {
            return Ok(Some(Arc::clone(c)));
        }
        let path = file_path(data_dir, uid, id);
        let buf = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(e)),
        };
        let content = decode_file(&buf, uid, id).map_err(|e| {
            Error::Internal(format!(
                "snapshot file {} is corrupt: {}",
                path.display(),
                e.0
            ))
        })?;
        let content = Arc::new(content);
        self.cache.lock().insert((uid, id), Arc::clone(&content));
        Ok(Some(content))
    }

    pub fn is_ready(&self, data_dir: &Path, uid: Uid, id: u64) -> bool {
        self.cache.lock().contains_key(&(uid, id)) || file_path(data_dir, uid, id).exists()
    }

    /// Forgets a snapshot and removes its file (compaction, once the row is
    /// dropped or installed and expired).
    pub fn remove(&self, data_dir: &Path, uid: Uid, id: u64) -> Result<bool> {
        self.cache.lock().remove(&(uid, id));
        match fs::remove_file(file_path(data_dir, uid, id)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err(e)),
        }
    }

    /// Snapshot files present on disk, as (uid, id).
    pub fn files(&self, data_dir: &Path) -> Result<Vec<(Uid, u64)>> {
        let entries = match fs::read_dir(dir(data_dir)) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let name = entry.map_err(io_err)?.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(stem) = name.strip_suffix(".snap") else {
                continue;
            };
            let mut parts = stem.splitn(2, '-');
            if let (Some(Ok(uid)), Some(Ok(id))) = (
                parts.next().map(str::parse::<u64>),
                parts.next().map(str::parse::<u64>),
            ) {
                out.push((uid, id));
            }
        }
        Ok(out)
    }
}

/// The begin step: effects to log and the plan, captured from `st` at S.
pub(crate) fn decide_begin(
    st: &State,
    cfg: &InboxConfig,
    now: TimestampMs,
    uid: Uid,
    device: DeviceId,
) -> Result<(Vec<Effect>, Plan)> {
    let row = device_row(st, uid, device)?;
    if row.state == DeviceState::Revoked {
        return Err(Error::DeviceRevoked);
    }
    let user = st
        .users
        .get(&uid)
        .ok_or_else(|| Error::Internal("user vanished".into()))?;
    let base_sync_seq = user.head();
    let snapshot_id = user.next_snapshot_id.max(1);
    let row = DeviceRow {
        generation: row.generation + 1,
        state: DeviceState::Resetting,
        lease: None,
        last_seen_ms: now.max(row.last_seen_ms),
        ..row
    };
    let mut effects = vec![Effect::Device { uid, row }];
    // An earlier snapshot of this device is superseded: its generation is
    // dead, so it can never be acknowledged.
    for slot in user.snapshots.values() {
        if slot.row.device == device && slot.row.phase == SnapshotPhase::Live {
            effects.push(Effect::Snapshot {
                uid,
                row: SnapshotRow {
                    phase: SnapshotPhase::Dropped,
                    ..slot.row
                },
            });
        }
    }
    effects.push(Effect::Snapshot {
        uid,
        row: SnapshotRow {
            snapshot_id,
            device,
            generation: row.generation,
            base_sync_seq,
            created_at_ms: now,
            expires_at_ms: now.saturating_add(ms(cfg.snapshot_ttl)),
            phase: SnapshotPhase::Live,
        },
    });

    let n = cfg.snapshot_messages_per_conv as usize;
    let mut convs = Vec::with_capacity(user.convs.len());
    let mut messages = Vec::with_capacity(user.convs.len());
    for key in user.order.iter().rev() {
        let conv = key.2;
        let Some(uc) = user.convs.get(&conv) else {
            continue;
        };
        let c = st.convs.get(&conv);
        let last_tomb = c
            .and_then(|c| c.meta(uc.last_msg_seq))
            .is_some_and(MsgMeta::hides_summary);
        convs.push(uc.summary(conv, last_tomb));
        let mut last = Vec::new();
        if let Some(c) = c {
            let head = c.head();
            if let Some(periods) = c.members.get(&uid) {
                'periods: for p in periods.iter().rev() {
                    let hi = p.leave_seq.min(head);
                    let mut seq = hi;
                    while seq >= p.join_seq && seq > 0 {
                        if last.len() == n {
                            break 'periods;
                        }
                        if let Some(m) = c.meta(seq) {
                            last.push((seq, *m));
                        }
                        seq -= 1;
                    }
                }
            }
        }
        last.reverse();
        messages.push(last);
    }
    Ok((
        effects,
        Plan {
            uid,
            snapshot_id,
            generation: row.generation,
            base_sync_seq,
            convs,
            messages,
        },
    ))
}

fn put_conv(w: &mut Writer, c: &ConvSummary) {
    w.u64(c.conv);
    w.u64(c.last_msg_seq);
    w.u64(c.last_msg_id);
    w.u64(c.last_sender);
    w.short_bytes(&c.last_summary);
    w.u32(c.unread);
    w.u64(c.read_seq);
    w.u64(c.last_activity_ms);
    w.bool(c.muted);
    w.bool(c.pinned);
}

fn get_conv(r: &mut Reader<'_>) -> DecodeResult<ConvSummary> {
    Ok(ConvSummary {
        conv: r.u64()?,
        last_msg_seq: r.u64()?,
        last_msg_id: r.u64()?,
        last_sender: r.u64()?,
        last_summary: r.short_bytes()?,
        unread: r.u32()?,
        read_seq: r.u64()?,
        last_activity_ms: r.u64()?,
        muted: r.bool()?,
        pinned: r.bool()?,
    })
}

fn put_message(w: &mut Writer, m: &Message) {
    w.u64(m.conv);
    w.u64(m.msg_seq);
    w.u64(m.msg_id);
    w.u64(m.sender);
    w.u8(kind_code(m.kind));
    w.u16(m.msg_type);
    w.u64(m.target.unwrap_or(0));
    w.u64(m.sent_at_ms);
    w.bool(m.tombstone);
    w.bytes(&m.payload);
}

fn get_message(r: &mut Reader<'_>) -> DecodeResult<Message> {
    let conv = r.u64()?;
    let msg_seq = r.u64()?;
    let msg_id = r.u64()?;
    let sender = r.u64()?;
    let kind = kind_from_code(r.u8()?)?;
    let msg_type = r.u16()?;
    let target = r.u64()?;
    Ok(Message {
        conv,
        msg_seq,
        msg_id,
        sender,
        kind,
        msg_type,
        target: (target != 0).then_some(target),
        sent_at_ms: r.u64()?,
        tombstone: r.bool()?,
        payload: Bytes::copy_from_slice(r.bytes()?),
    })
}

fn encode_page(convs: &[ConvSummary], messages: &[Message]) -> Vec<u8> {
    let mut w = Writer::with_capacity(4096);
    w.u32(u32::try_from(convs.len()).unwrap_or(u32::MAX));
    for c in convs {
        put_conv(&mut w, c);
    }
    w.u32(u32::try_from(messages.len()).unwrap_or(u32::MAX));
    for m in messages {
        put_message(&mut w, m);
    }
    w.buf
}

fn decode_page(buf: &[u8]) -> DecodeResult<(Vec<ConvSummary>, Vec<Message>)> {
    let mut r = Reader::new(buf);
    let n = r.u32()? as usize;
    let mut convs = Vec::with_capacity(n.min(buf.len() / 50));
    for _ in 0..n {
        convs.push(get_conv(&mut r)?);
    }
    let n = r.u32()? as usize;
    let mut messages = Vec::with_capacity(n.min(buf.len() / 60));
    for _ in 0..n {
        messages.push(get_message(&mut r)?);
    }
    if !r.is_empty() {
        return Err(DecodeError("trailing bytes in snapshot page"));
    }
    Ok((convs, messages))
}

fn digest_of(pages: &[Vec<u8>]) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    for p in pages {
        h.update(u32::try_from(p.len()).unwrap_or(u32::MAX).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

fn encode_file(plan: &Plan, content: &Content) -> Vec<u8> {
    let mut w = Writer::with_capacity(4096);
    w.buf.extend_from_slice(MAGIC);
    w.u64(plan.uid);
    w.u64(plan.snapshot_id);
    w.u64(plan.base_sync_seq);
    w.u64(plan.generation);
    w.buf.extend_from_slice(&content.digest);
    w.u32(u32::try_from(content.pages.len()).unwrap_or(u32::MAX));
    for p in &content.pages {
        w.bytes(p);
    }
    let crc = crc32fast::hash(&w.buf);
    w.u32(crc);
    w.buf
}

fn decode_file(buf: &[u8], uid: Uid, id: u64) -> DecodeResult<Content> {
    if buf.len() < 80 || &buf[..8] != MAGIC {
        return Err(DecodeError("bad magic or too short"));
    }
    let (data, crc) = buf.split_at(buf.len() - 4);
    let mut crc_bytes = [0u8; 4];
    crc_bytes.copy_from_slice(crc);
    if crc32fast::hash(data) != u32::from_le_bytes(crc_bytes) {
        return Err(DecodeError("checksum mismatch"));
    }
    let mut r = Reader::new(&data[8..]);
    if r.u64()? != uid || r.u64()? != id {
        return Err(DecodeError("file names another snapshot"));
    }
    let _base = r.u64()?;
    let _generation = r.u64()?;
    let mut digest = [0u8; 32];
    digest.copy_from_slice(r.take(32)?);
    let n = r.u32()? as usize;
    let mut pages = Vec::with_capacity(n.min(data.len() / 4));
    for _ in 0..n {
        pages.push(r.bytes()?.to_vec());
    }
    if !r.is_empty() {
        return Err(DecodeError("trailing bytes in snapshot file"));
    }
    if digest_of(&pages) != digest {
        return Err(DecodeError("manifest digest does not match the pages"));
    }
    Ok(Content { digest, pages })
}

/// Builds the snapshot content from the plan (builder thread, after the
/// begin step is durable), writes it durably and returns its info.
pub(crate) fn build(shared: &Shared, plan: &Plan) -> Result<SnapshotInfo> {
    let max = shared.config.payload_bytes_max;
    let mut pages = Vec::new();
    let mut i = 0;
    loop {
        let end = (i + CONVS_PER_PAGE).min(plan.convs.len());
        let mut messages = Vec::new();
        for (c, metas) in plan.convs[i..end].iter().zip(&plan.messages[i..end]) {
            for (seq, meta) in metas {
                messages.push(read_message(shared, c.conv, *seq, meta, max)?);
            }
        }
        let conv_slice = &plan.convs[i..end];
        pages.push(encode_page(conv_slice, &messages));
        i = end;
        if i >= plan.convs.len() {
            break;
        }
    }
    let content = Content {
        digest: digest_of(&pages),
        pages,
    };
    let data_dir = &shared.config.data_dir;
    let d = dir(data_dir);
    fs::create_dir_all(&d).map_err(io_err)?;
    let path = file_path(data_dir, plan.uid, plan.snapshot_id);
    let tmp = path.with_extension("tmp");
    {
        let mut f = fs::File::create(&tmp).map_err(io_err)?;
        f.write_all(&encode_file(plan, &content)).map_err(io_err)?;
        f.sync_all().map_err(io_err)?;
    }
    fs::rename(&tmp, &path).map_err(io_err)?;
    fs::File::open(&d)
        .and_then(|f| f.sync_all())
        .map_err(io_err)?;
    let info = SnapshotInfo {
        snapshot_id: plan.snapshot_id,
        base_sync_seq: plan.base_sync_seq,
        generation: plan.generation,
        state: SnapshotState::Ready,
        pages: u32::try_from(content.pages.len()).unwrap_or(u32::MAX),
        manifest_digest: content.digest,
    };
    shared
        .snapshots
        .cache
        .lock()
        .insert((plan.uid, plan.snapshot_id), Arc::new(content));
    Ok(info)
}

/// Reads one message of the plan. The location comes from the current
/// index (a message of the begin step's own round had no location yet at
/// capture); the tombstone flag is the one at S, or a later one, which
/// hides the body too (R6).
fn read_message(
    shared: &Shared,
    conv: ConvId,
    seq: MsgSeq,
    at_s: &MsgMeta,
    max: u32,
) -> Result<Message> {
    let (loc, now_tomb) = {
        let st = shared.state.read();
        match st.convs.get(&conv).and_then(|c| c.meta(seq)) {
            Some(m) if m.msg_id == at_s.msg_id => (m.loc, m.tombstone()),
            _ => return Err(Error::Internal("snapshot message vanished".into())),
        }
    };
    let rec = shared.msg_log.read(unpack(loc))?;
    let (h, payload) = decode_msg_record(&rec.payload, max)
        .map_err(|e| Error::Internal(format!("corrupt msg record: {}", e.0)))?;
    if h.msg_id != at_s.msg_id || h.conv != conv {
        return Err(Error::Internal(
            "snapshot message index points at another record".into(),
        ));
    }
    let tombstone = at_s.tombstone() || now_tomb;
    Ok(Message {
        conv,
        msg_seq: h.msg_seq,
        msg_id: h.msg_id,
        sender: h.sender,
        kind: h.kind,
        msg_type: h.msg_type,
        target: (h.target != 0).then_some(h.target),
        sent_at_ms: h.sent_at_ms,
        tombstone,
        payload: if tombstone { Bytes::new() } else { payload },
    })
}

/// The logged row of a snapshot, once the change that made it is durable.
fn settled_row(shared: &Shared, uid: Uid, id: u64) -> Result<SnapshotRow> {
    loop {
        let (row, stamp) = {
            let st = shared.state.read();
            let slot = st
                .users
                .get(&uid)
                .and_then(|u| u.snapshots.get(&id))
                .copied()
                .ok_or_else(|| Error::NotFound(format!("snapshot {id} of uid {uid}")))?;
            (slot.row, slot.stamp)
        };
        if shared.is_settled(stamp)? {
            return Ok(row);
        }
        shared.wait_settled(stamp);
    }
}

pub(crate) fn info_of(shared: &Shared, uid: Uid, id: u64) -> Result<SnapshotInfo> {
    let row = settled_row(shared, uid, id)?;
    let now = shared.config.clock.now_ms();
    let content = shared.snapshots.get(&shared.config.data_dir, uid, id)?;
    let state = match (row.phase, &content) {
        (SnapshotPhase::Installed, _) => SnapshotState::Installed,
        _ if now > row.expires_at_ms => SnapshotState::Expired,
        (_, Some(_)) => SnapshotState::Ready,
        (_, None) => SnapshotState::Building,
    };
    Ok(SnapshotInfo {
        snapshot_id: id,
        base_sync_seq: row.base_sync_seq,
        generation: row.generation,
        state,
        pages: content
            .as_ref()
            .map_or(0, |c| u32::try_from(c.pages.len()).unwrap_or(u32::MAX)),
        manifest_digest: content.as_ref().map_or([0; 32], |c| c.digest),
    })
}

pub(crate) fn page_of(shared: &Shared, uid: Uid, id: u64, page: u32) -> Result<SnapshotPage> {
    let row = settled_row(shared, uid, id)?;
    let now = shared.config.clock.now_ms();
    if row.phase == SnapshotPhase::Live && now > row.expires_at_ms {
        return Err(Error::Conflict(format!(
            "snapshot {id} has expired; begin a new one"
        )));
    }
    let content = shared
        .snapshots
        .get(&shared.config.data_dir, uid, id)?
        .ok_or_else(|| {
            Error::NotFound(format!(
                "snapshot {id} is not built (yet); wait for begin_snapshot or begin a new one"
            ))
        })?;
    let pages = u32::try_from(content.pages.len()).unwrap_or(u32::MAX);
    let bytes = content.pages.get(page as usize).ok_or_else(|| {
        Error::BadRequest(format!("snapshot {id} has {pages} pages, no page {page}"))
    })?;
    let (mut convs, mut messages) = decode_page(bytes)
        .map_err(|e| Error::Internal(format!("corrupt snapshot page: {}", e.0)))?;
    hide_recalled(shared, &mut convs, &mut messages);
    Ok(SnapshotPage {
        snapshot_id: id,
        page,
        pages,
        convs,
        messages,
    })
}

/// `ack_snapshot`: the device becomes ACTIVE at `acked = S`, only in the
/// snapshot's generation and while RESETTING.
/// Pages are built once, at `BEGIN_SNAPSHOT`; a message recalled (or
/// edited) since then is served as a tombstone, and a summary whose last
/// message it was loses its body summary, so no page carries a body whose
/// recall is already applied (R6).
fn hide_recalled(shared: &Shared, convs: &mut [ConvSummary], messages: &mut [Message]) {
    let st = shared.state.read();
    let tombstoned = |conv: ConvId, seq: MsgSeq| {
        st.convs
            .get(&conv)
            .and_then(|c| c.meta(seq))
            .is_some_and(MsgMeta::tombstone)
    };
    for m in messages.iter_mut() {
        if m.tombstone || tombstoned(m.conv, m.msg_seq) {
            m.tombstone = true;
            m.payload = Bytes::new();
        }
    }
    for c in convs.iter_mut() {
        if tombstoned(c.conv, c.last_msg_seq) {
            c.last_summary = Bytes::new();
        }
    }
}

pub(crate) fn decide_ack(
    shared: &Shared,
    st: &State,
    now: TimestampMs,
    uid: Uid,
    device: DeviceId,
    id: u64,
    generation: Generation,
) -> Result<(Vec<Effect>, DeviceInfo)> {
    let row = device_row_at(st, uid, device, generation)?;
    if row.state != DeviceState::Resetting {
        return Err(Error::Conflict(format!(
            "device {device} is not resetting; nothing to acknowledge"
        )));
    }
    let snap = st
        .users
        .get(&uid)
        .and_then(|u| u.snapshots.get(&id))
        .map(|s| s.row)
        .ok_or_else(|| Error::NotFound(format!("snapshot {id} of uid {uid}")))?;
    if snap.device != device || snap.generation != generation {
        return Err(Error::Conflict(format!(
            "snapshot {id} belongs to another device or generation"
        )));
    }
    if snap.phase != SnapshotPhase::Live {
        return Err(Error::Conflict(format!("snapshot {id} is not live")));
    }
    if now > snap.expires_at_ms {
        return Err(Error::Conflict(format!(
            "snapshot {id} has expired; begin a new one"
        )));
    }
    if !shared.snapshots.is_ready(&shared.config.data_dir, uid, id) {
        return Err(Error::Conflict(format!("snapshot {id} is still building")));
    }
    let row = DeviceRow {
        state: DeviceState::Active,
        acked_sync_seq: snap.base_sync_seq,
        lease: None,
        last_seen_ms: now.max(row.last_seen_ms),
        ..row
    };
    Ok((
        vec![
            Effect::Device { uid, row },
            Effect::Snapshot {
                uid,
                row: SnapshotRow {
                    phase: SnapshotPhase::Installed,
                    ..snap
                },
            },
        ],
        info(&row),
    ))
}
