//! Built snapshots: their files and the cache that serves pages from
//! them.
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

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use sha2::Digest;

use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::codec::{DecodeError, DecodeResult, Reader, Writer};
use crate::inbox::messaging::rows::{kind_code, kind_from_code};
use crate::log::{LogError, LogIo};

pub(crate) const MAGIC: &[u8; 8] = b"INBXSNP1";

/// Conversations per snapshot page.
pub(crate) const CONVS_PER_PAGE: usize = 64;

/// A built snapshot.
pub(crate) struct Content {
    pub digest: [u8; 32],
    pub pages: Vec<Vec<u8>>,
}

impl Content {
    /// The bytes it holds in memory, as the cache counts them.
    fn bytes(&self) -> u64 {
        self.pages.iter().map(|p| p.len() as u64 + 24).sum::<u64>() + 64
    }
}

type Key = (Uid, u64);

/// Built snapshots in memory, bounded by bytes: inserting past the cap
/// drops the least recently used ones (their files stay on disk, so a
/// dropped snapshot is only read again, never lost). A snapshot larger
/// than the whole cap is served from its file each time.
pub(crate) struct Cache {
    cap: u64,
    bytes: u64,
    tick: u64,
    entries: HashMap<Key, (Arc<Content>, u64)>,
    /// Last use -> key, oldest first.
    by_use: BTreeMap<u64, Key>,
}

impl Cache {
    pub(crate) fn new(cap: u64) -> Self {
        Self {
            cap,
            bytes: 0,
            tick: 0,
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    fn get(&mut self, key: &Key) -> Option<Arc<Content>> {
        self.tick += 1;
        let (content, used) = self.entries.get_mut(key)?;
        self.by_use.remove(used);
        *used = self.tick;
        self.by_use.insert(self.tick, *key);
        Some(Arc::clone(content))
    }

    fn insert(&mut self, key: Key, content: Arc<Content>) {
        self.remove(&key);
        let bytes = content.bytes();
        if bytes > self.cap {
            return;
        }
        while self.bytes + bytes > self.cap {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            if let Some((c, _)) = self.entries.remove(&oldest) {
                self.bytes -= c.bytes();
            }
        }
        self.tick += 1;
        self.bytes += bytes;
        self.by_use.insert(self.tick, key);
        self.entries.insert(key, (content, self.tick));
    }

    fn remove(&mut self, key: &Key) {
        if let Some((c, used)) = self.entries.remove(key) {
            self.by_use.remove(&used);
            self.bytes -= c.bytes();
        }
    }

    fn contains(&self, key: &Key) -> bool {
        self.entries.contains_key(key)
    }

    /// Bytes held and snapshots cached.
    pub(crate) fn usage(&self) -> (u64, usize) {
        (self.bytes, self.entries.len())
    }
}

/// Built snapshots: their files, and a byte-bounded cache of them.
pub(crate) struct Store {
    pub(crate) cache: Mutex<Cache>,
    /// Set at shutdown: the builder abandons the builds still queued.
    pub(crate) stopping: AtomicBool,
}

pub(crate) fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("snap")
}

pub(crate) fn file_path(data_dir: &Path, uid: Uid, id: u64) -> PathBuf {
    dir(data_dir).join(format!("{uid}-{id}.snap"))
}

pub(crate) fn io_err(e: std::io::Error) -> Error {
    Error::Log(LogError::Io(e))
}

impl Store {
    pub fn new(cache_bytes: u64) -> Self {
        Self {
            cache: Mutex::new(Cache::new(cache_bytes)),
            stopping: AtomicBool::new(false),
        }
    }

    /// Keeps a freshly built snapshot in the cache.
    pub fn insert(&self, uid: Uid, id: u64, content: Arc<Content>) {
        self.cache.lock().insert((uid, id), content);
    }

    /// Makes the builder abandon every build it has not started yet.
    pub fn stop_builder(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// The content of a built snapshot, from the cache or its file.
    pub fn get(&self, data_dir: &Path, uid: Uid, id: u64) -> Result<Option<Arc<Content>>> {
        if let Some(c) = self.cache.lock().get(&(uid, id)) {
            return Ok(Some(c));
        }
        let path = file_path(data_dir, uid, id);
        let buf = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(e)),
        };
        let content = decode_file(&buf, uid, id).map_err(|e| Error::Corruption {
            what: "snapshot file",
            reason: format!("{}: {}", path.display(), e.0),
        })?;
        let content = Arc::new(content);
        self.insert(uid, id, Arc::clone(&content));
        Ok(Some(content))
    }

    pub fn is_ready(&self, data_dir: &Path, uid: Uid, id: u64) -> bool {
        self.cache.lock().contains(&(uid, id)) || file_path(data_dir, uid, id).exists()
    }

    /// Forgets a snapshot and removes its file (compaction, once the row is
    /// dropped or installed and expired).
    pub fn remove(&self, io: &dyn LogIo, data_dir: &Path, uid: Uid, id: u64) -> Result<bool> {
        self.cache.lock().remove(&(uid, id));
        match io.remove(&file_path(data_dir, uid, id)) {
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
                out.push((Uid(uid), id));
            }
        }
        Ok(out)
    }
}

pub(crate) fn put_conv(w: &mut Writer, c: &ConvSummary) {
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

pub(crate) fn get_conv(r: &mut Reader<'_>) -> DecodeResult<ConvSummary> {
    Ok(ConvSummary {
        conv: r.id()?,
        last_msg_seq: r.id()?,
        last_msg_id: r.id()?,
        last_sender: r.id()?,
        last_summary: r.short_bytes()?,
        unread: r.u32()?,
        read_seq: r.id()?,
        last_activity_ms: r.u64()?,
        muted: r.bool()?,
        pinned: r.bool()?,
    })
}

pub(crate) fn put_message(w: &mut Writer, m: &Message) {
    w.u64(m.conv);
    w.u64(m.msg_seq);
    w.u64(m.msg_id);
    w.u64(m.sender);
    w.u8(kind_code(m.kind));
    w.u16(m.msg_type);
    w.u64(m.target.unwrap_or(MsgId(0)));
    w.u64(m.sent_at_ms);
    w.bool(m.tombstone);
    w.bytes(&m.payload);
}

pub(crate) fn get_message(r: &mut Reader<'_>) -> DecodeResult<Message> {
    let conv = r.id()?;
    let msg_seq = r.id()?;
    let msg_id = r.id()?;
    let sender = r.id()?;
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
        target: (target != 0).then_some(MsgId(target)),
        sent_at_ms: r.u64()?,
        tombstone: r.bool()?,
        payload: Bytes::copy_from_slice(r.bytes()?),
    })
}

pub(crate) fn encode_page(convs: &[ConvSummary], messages: &[Message]) -> Vec<u8> {
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

pub(crate) fn decode_page(buf: &[u8]) -> DecodeResult<(Vec<ConvSummary>, Vec<Message>)> {
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

pub(crate) fn digest_of(pages: &[Vec<u8>]) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    for p in pages {
        h.update(u32::try_from(p.len()).unwrap_or(u32::MAX).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

/// The file of a built snapshot (layout in the module doc).
pub(crate) fn encode_file(
    uid: Uid,
    snapshot_id: u64,
    base_sync_seq: SyncSeq,
    generation: Generation,
    content: &Content,
) -> Vec<u8> {
    let mut w = Writer::with_capacity(4096);
    w.buf.extend_from_slice(MAGIC);
    w.u64(uid);
    w.u64(snapshot_id);
    w.u64(base_sync_seq);
    w.u64(generation);
    w.buf.extend_from_slice(&content.digest);
    w.u32(u32::try_from(content.pages.len()).unwrap_or(u32::MAX));
    for p in &content.pages {
        w.bytes(p);
    }
    let crc = crc32fast::hash(&w.buf);
    w.u32(crc);
    w.buf
}

pub(crate) fn decode_file(buf: &[u8], uid: Uid, id: u64) -> DecodeResult<Content> {
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
    if r.u64()? != uid.get() || r.u64()? != id {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn content(page_bytes: usize) -> Arc<Content> {
        Arc::new(Content {
            digest: [0; 32],
            pages: vec![vec![0; page_bytes]],
        })
    }

    #[test]
    fn snapshot_cache_stays_under_its_byte_cap_dropping_the_least_recently_used() {
        let one = content(1000).bytes();
        let mut cache = Cache::new(one * 3);
        for id in 1..=3 {
            cache.insert((Uid(1), id), content(1000));
        }
        assert_eq!(cache.usage(), (one * 3, 3));
        // Reading 1 makes 2 the least recently used, so 4 pushes out 2.
        assert!(cache.get(&(Uid(1), 1)).is_some());
        cache.insert((Uid(1), 4), content(1000));
        assert_eq!(cache.usage(), (one * 3, 3));
        assert!(cache.contains(&(Uid(1), 1)));
        assert!(!cache.contains(&(Uid(1), 2)));
        assert!(cache.contains(&(Uid(1), 3)));
        assert!(cache.contains(&(Uid(1), 4)));
        cache.remove(&(Uid(1), 3));
        assert_eq!(cache.usage(), (one * 2, 2));
    }

    #[test]
    fn snapshot_larger_than_the_cache_is_not_kept() {
        let mut cache = Cache::new(500);
        cache.insert((Uid(1), 1), content(100));
        cache.insert((Uid(1), 2), content(1000));
        assert!(!cache.contains(&(Uid(1), 2)));
        assert!(cache.contains(&(Uid(1), 1)));
    }
}
