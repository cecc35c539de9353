//! Replica images: a node's whole state at one replication index,
//! self-contained, for a node that cannot catch up from entries (its
//! leader compacted them away, or its data directory is new). The
//! consensus layer sends one as its snapshot; see `docs/CLUSTER.md`.
//!
//! An image is *logical*, built the way salvage builds a fresh directory:
//! a copy of the state once every round in hand has settled (taken as a
//! periodic checkpoint takes it, so rounds go on meanwhile), every
//! retained body and event read back from this node's logs with its CRC
//! checked, written into fresh logs with the log's own writer (locations
//! remapped), then a checkpoint of the remapped state. That directory's
//! files, with the device snapshot files, are the image. The receiver
//! unpacks it beside its data directory, opens it, and checks the
//! replication index and [`Inbox::replica_digest`] the image names before
//! it swaps the directory in: a damaged or truncated image, or one whose
//! content is not the state it claims, changes nothing.
//!
//! A record compaction moved (and whose old file it deleted) between the
//! copy and the read does not read back: the image is then built again
//! from a new copy.
//!
//! Layout (all integers little-endian):
//! ```text
//! "IXIMAGE1" [8], index u64, digest [32], meta_len u32, meta [meta_len],
//! count u32, count × (name_len u16, name, file_len u64, data_len u64,
//! data [data_len]), SHA-256 [32] of all before
//! ```
//! A new segment's preallocated space is not carried: `data` is its start,
//! up to the end its log reports, and the file is `file_len` long, the
//! rest zeros. `meta` is the consensus layer's (its log id and
//! membership), covered by the same checksum.
//!
//! An image is written into a file and never held whole in memory: the
//! build streams it out ([`Inbox::export_image`]), a receiver checks it as
//! its chunks arrive ([`ImageCheck`]), and [`stage_image`] reads it through
//! a mapping of that file.

use std::fs::File;
use std::io::Read;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::io::AsRawFd;
use std::path::{Component, Path, PathBuf};

use sha2::Digest;

use super::Inbox;
use crate::error::{Error, Result};
use crate::inbox::config::InboxConfig;
use crate::inbox::salvage::write::{self, Target, Written};
use crate::inbox::salvage::SalvageReport;
use crate::inbox::sequencer::replica::Control;
use crate::inbox::state::State;
use crate::log::{LogError, SegmentPrep};

const MAGIC: &[u8; 8] = b"IXIMAGE1";
/// The top-level directories an image may hold.
const PARTS: [&str; 4] = ["evt", "msg", "checkpoint", "snap"];
/// Copies taken before giving up on records that keep moving.
const ATTEMPTS: usize = 5;

/// What an image says about itself (checked against its checksum).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    /// The replication index of the last round it holds.
    pub index: u64,
    /// [`Inbox::replica_digest`] of its state.
    pub digest: [u8; 32],
    /// The consensus layer's metadata, as [`Inbox::export_image`] was given it.
    pub meta: Vec<u8>,
}

/// SHA-256 of the canonical state encoding without what is a node's own
/// (locations, the LSN); see [`Inbox::replica_digest`].
pub(crate) fn digest_of(st: &State) -> [u8; 32] {
    let mut st = st.clone();
    st.evt_lsn = 0;
    for u in st.users.values_mut() {
        std::sync::Arc::make_mut(u).events.map_in_place(|_, _| 0);
    }
    for c in st.convs.values_mut() {
        std::sync::Arc::make_mut(c).msgs.for_each_mut(|m| m.loc = 0);
    }
    let body = crate::inbox::checkpoint::encode_state(&st);
    sha2::Sha256::digest(&body).into()
}

fn io(e: std::io::Error) -> Error {
    Error::Log(LogError::Io(e))
}

impl Inbox {
    /// Builds an image of this node's state once the rounds in hand have
    /// settled (on a leader: committed), writing fresh logs in `scratch`
    /// (created, and removed afterwards; it must be on the data
    /// directory's file system or any other with room for a copy), and
    /// packs it into the file `out` (created or replaced, synced; it is
    /// about the retained bodies and events plus the state). The image is
    /// streamed into the file: memory holds one file's read buffer, never
    /// the image. `meta` gives the consensus layer's metadata for the
    /// image's index, carried as is.
    pub fn export_image(
        &self,
        scratch: &Path,
        out: &Path,
        meta: &mut dyn FnMut(u64) -> Vec<u8>,
    ) -> Result<ImageInfo> {
        for _ in 0..ATTEMPTS {
            let st = self.control(|tx| Control::Copy { tx })?;
            let info = ImageInfo {
                index: st.replica_index,
                digest: digest_of(&st),
                meta: meta(st.replica_index),
            };
            remove_dir_if_exists(scratch)?;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(scratch)
                .map_err(io)?;
            let built = self.write_copy(scratch, *st).and_then(|written| {
                if digest_of(&written.state) != info.digest {
                    return Ok(false);
                }
                copy_dir_files(
                    &self.shared.config.data_dir.join("snap"),
                    &scratch.join("snap"),
                )?;
                pack(scratch, &info, &written.data_ends, out).map(|()| true)
            });
            remove_dir_if_exists(scratch)?;
            if built? {
                return Ok(info);
            }
            tracing::info!("records moved while the image was written; taking a new copy");
        }
        Err(Error::Internal(format!(
            "no image after {ATTEMPTS} copies: compaction kept moving the records they point at"
        )))
    }

    fn write_copy(&self, scratch: &Path, st: State) -> Result<Written> {
        // Fallocated only: the copy is read once and removed, and zeros
        // written over each segment would cost more than the data.
        let target = Target {
            dir: scratch,
            segment_bytes: self.shared.config.segment_bytes,
            payload_max: u32::MAX,
            prep: SegmentPrep::Fallocate,
        };
        let mut report = SalvageReport::default();
        write::write(
            &target,
            &self.shared.evt_log,
            &self.shared.msg_log,
            st,
            &mut report,
        )
    }
}

/// Packs the files under `dir`'s image parts into the file `out`
/// (created or truncated, then synced). A file named in `data_ends` (a new
/// segment) is copied up to that end only: the rest is zeros. Any other
/// file is copied whole.
fn pack(dir: &Path, info: &ImageInfo, data_ends: &[(PathBuf, u64)], out: &Path) -> Result<()> {
    let mut files = Vec::new();
    for part in PARTS {
        list_files(&dir.join(part), part, &mut files)?;
    }
    let file = File::create(out).map_err(io)?;
    let mut w = HashingWriter {
        out: std::io::BufWriter::with_capacity(1 << 20, file),
        sum: sha2::Sha256::new(),
    };
    w.put(MAGIC)?;
    w.put(&info.index.to_le_bytes())?;
    w.put(&info.digest)?;
    w.put(&(info.meta.len() as u32).to_le_bytes())?;
    w.put(&info.meta)?;
    w.put(&(files.len() as u32).to_le_bytes())?;
    for (name, path) in files {
        let mut f = File::open(&path).map_err(io)?;
        let file_len = f.metadata().map_err(io)?.len();
        let data_len = match data_ends.iter().find(|(p, _)| *p == path) {
            Some(&(_, end)) if end > file_len => {
                return Err(Error::Internal(format!(
                    "{}: data said to end at {end}, past the file's {file_len} bytes",
                    path.display()
                )))
            }
            Some(&(_, end)) => end,
            None => file_len,
        };
        w.put(&(name.len() as u16).to_le_bytes())?;
        w.put(name.as_bytes())?;
        w.put(&file_len.to_le_bytes())?;
        w.put(&data_len.to_le_bytes())?;
        let copied = std::io::copy(&mut (&mut f).take(data_len), &mut w).map_err(io)?;
        if copied != data_len {
            return Err(Error::Internal(format!(
                "{}: {copied} bytes read of {data_len}",
                path.display()
            )));
        }
    }
    let sum: [u8; 32] = w.sum.finalize_reset().into();
    let mut out_file = w.out.into_inner().map_err(|e| io(e.into_error()))?;
    out_file.write_all(&sum).map_err(io)?;
    out_file.sync_all().map_err(io)
}

/// A writer that hashes what it writes.
struct HashingWriter {
    out: std::io::BufWriter<File>,
    sum: sha2::Sha256,
}

impl HashingWriter {
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        std::io::Write::write_all(self, bytes).map_err(io)
    }
}

impl std::io::Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.sum.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// The regular files under `dir` (none if it does not exist), named
/// `prefix/...`, leaving out lock files and tmp files.
fn list_files(dir: &Path, prefix: &str, out: &mut Vec<(String, PathBuf)>) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut names = Vec::new();
    for e in entries {
        let e = e.map_err(io)?;
        let name = e.file_name().to_string_lossy().into_owned();
        let ty = e.file_type().map_err(io)?;
        if ty.is_dir() {
            list_files(&e.path(), &format!("{prefix}/{name}"), out)?;
        } else if ty.is_file() && name != "LOCK" && !name.ends_with(".tmp") {
            names.push((format!("{prefix}/{name}"), e.path()));
        }
    }
    names.sort();
    out.extend(names);
    Ok(())
}

/// One file of an image.
struct Part<'a> {
    name: &'a str,
    file_len: u64,
    data: &'a [u8],
}

fn bad(why: impl std::fmt::Display) -> Error {
    Error::BadRequest(format!("replica image: {why}"))
}

/// The header after the magic: index, digest and meta, read from `r`
/// (placed just past the magic).
fn read_header(r: &mut Reader<'_>) -> Result<ImageInfo> {
    let index = r.u64()?;
    let digest: [u8; 32] = r.take(32)?.try_into().expect("32 bytes");
    let meta_len = r.u32()? as usize;
    let meta = r.take(meta_len)?.to_vec();
    Ok(ImageInfo {
        index,
        digest,
        meta,
    })
}

/// An image whose checksum and layout are checked, read in place from
/// its bytes: what it says about itself, and its files. Parsing it is
/// the one pass over the whole image (its SHA-256); [`Image::stage`]
/// reuses it, so a caller that checks [`Image::info`] against what it
/// expected before staging does not hash the image a second time.
pub struct Image<'a> {
    info: ImageInfo,
    parts: Vec<Part<'a>>,
}

impl<'a> Image<'a> {
    /// Checks `buf`'s checksum and layout; changes nothing.
    pub fn parse(buf: &'a [u8]) -> Result<Image<'a>> {
        let (info, parts) = parse(buf)?;
        Ok(Image { info, parts })
    }

    /// What the image says about itself.
    pub fn info(&self) -> &ImageInfo {
        &self.info
    }

    /// Unpacks the image into `dir` (which must not exist), durably, then
    /// opens it with `config` (its `data_dir` set to `dir`) and checks
    /// that the state there is the one the image names (index and
    /// digest). On any failure `dir` is removed and the error returned;
    /// nothing else is touched. The staged directory holds no node-local
    /// files (a token key, the consensus layer's own): the caller adds
    /// them before [`exchange_dirs`].
    pub fn stage(&self, dir: &Path, config: &InboxConfig) -> Result<()> {
        if dir.exists() {
            return Err(bad(format!("{} exists already", dir.display())));
        }
        let staged = unpack(&self.parts, dir).and_then(|()| verify(dir, config, &self.info));
        if let Err(e) = staged {
            let _ = std::fs::remove_dir_all(dir);
            return Err(e);
        }
        Ok(())
    }
}

/// Checks an image's checksum and layout and returns what it says about
/// itself and its files; changes nothing.
fn parse(buf: &[u8]) -> Result<(ImageInfo, Vec<Part<'_>>)> {
    if buf.len() < HEAD_FIXED + 4 + 32 || &buf[..8] != MAGIC {
        return Err(bad("not an image (or cut short)"));
    }
    let (body, sum) = buf.split_at(buf.len() - 32);
    if sha2::Sha256::digest(body).as_slice() != sum {
        return Err(bad("checksum mismatch (damaged or cut short)"));
    }
    let mut r = Reader { buf: body, at: 8 };
    let info = read_header(&mut r)?;
    let count = r.u32()?;
    let mut parts = Vec::new();
    for _ in 0..count {
        let name_len = r.u16()? as usize;
        let name = std::str::from_utf8(r.take(name_len)?).map_err(|_| bad("a file name"))?;
        let file_len = r.u64()?;
        let data_len = r.u64()?;
        if data_len > file_len {
            return Err(bad(format!("{name}: more data than its length")));
        }
        let data = r.take(usize::try_from(data_len).map_err(|_| bad("a length"))?)?;
        check_name(name)?;
        parts.push(Part {
            name,
            file_len,
            data,
        });
    }
    if r.at != body.len() {
        return Err(bad("trailing bytes"));
    }
    Ok((info, parts))
}

/// A name is relative, under one of the image's parts, with no `..`.
fn check_name(name: &str) -> Result<()> {
    let path = Path::new(name);
    let mut comps = path.components();
    let first_ok =
        matches!(comps.next(), Some(Component::Normal(p)) if PARTS.iter().any(|x| p == *x));
    let rest_ok = comps.all(|c| matches!(c, Component::Normal(_)));
    if !first_ok || !rest_ok || path.components().count() < 2 {
        return Err(bad(format!("file name {name:?} is not one an image holds")));
    }
    Ok(())
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| bad("cut short"))?;
        let out = &self.buf[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

/// An image checked as it streams in, chunk by chunk, without holding
/// it: its SHA-256 is computed on the way and only its header (up to the
/// end of `meta`) is kept. [`ImageCheck::finish`] says whether the bytes
/// pushed are a whole image with a matching checksum, and what it says
/// about itself. The layout of its files is checked when it is staged
/// ([`stage_image`]), which changes nothing when it fails.
#[derive(Default)]
pub struct ImageCheck {
    sum: sha2::Sha256,
    /// The last 32 bytes pushed: the checksum, once every chunk is in.
    tail: Vec<u8>,
    /// The first bytes, up to the end of the header's `meta`.
    head: Vec<u8>,
    len: u64,
}

/// The header's fixed part: magic, index, digest, meta_len.
const HEAD_FIXED: usize = 8 + 8 + 32 + 4;
/// The longest `meta` an [`ImageCheck`] keeps (raft's metadata is a
/// small JSON document).
const META_MAX: usize = 1 << 20;

impl ImageCheck {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes pushed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The next bytes of the image.
    pub fn push(&mut self, chunk: &[u8]) {
        self.len += chunk.len() as u64;
        let mut rest = chunk;
        loop {
            let wanted = self.head_len().saturating_sub(self.head.len());
            if wanted == 0 || rest.is_empty() {
                break;
            }
            let n = wanted.min(rest.len());
            self.head.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
        }
        // Everything but the last 32 bytes is hashed; they are held back.
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > 32 {
            let spill = self.tail.len() - 32;
            self.sum.update(&self.tail[..spill]);
            self.tail.drain(..spill);
        }
    }

    /// The header's `meta_len`, once its fixed part is in.
    fn meta_len(&self) -> Option<usize> {
        let bytes = self.head.get(HEAD_FIXED - 4..HEAD_FIXED)?;
        Some(u32::from_le_bytes(bytes.try_into().expect("4")) as usize)
    }

    /// How long the header is, as far as it is known yet (the fixed part
    /// alone when `meta_len` is past [`META_MAX`], which `finish` refuses).
    fn head_len(&self) -> usize {
        match self.meta_len() {
            Some(n) if n <= META_MAX => HEAD_FIXED + n,
            _ => HEAD_FIXED,
        }
    }

    /// Whether what was pushed is a whole image whose checksum matches,
    /// and what its header says.
    pub fn finish(self) -> Result<ImageInfo> {
        if self.len < (HEAD_FIXED + 4 + 32) as u64 || !self.head.starts_with(MAGIC) {
            return Err(bad("not an image (or cut short)"));
        }
        if self.meta_len().is_some_and(|n| n > META_MAX) {
            return Err(bad(
                "its metadata is longer than any the consensus layer writes",
            ));
        }
        if self.head.len() < self.head_len() {
            return Err(bad("cut short"));
        }
        if self.sum.finalize().as_slice() != self.tail.as_slice() {
            return Err(bad("checksum mismatch (damaged or cut short)"));
        }
        read_header(&mut Reader {
            buf: &self.head,
            at: 8,
        })
    }
}

/// What an image says about itself, once its checksum and layout are
/// checked; changes nothing.
pub fn image_info(buf: &[u8]) -> Result<ImageInfo> {
    Image::parse(buf).map(|image| image.info)
}

/// [`Image::parse`], then [`Image::stage`]: what the staged image says
/// about itself.
pub fn stage_image(buf: &[u8], dir: &Path, config: &InboxConfig) -> Result<ImageInfo> {
    let image = Image::parse(buf)?;
    image.stage(dir, config)?;
    Ok(image.info)
}

fn unpack(parts: &[Part<'_>], dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    let mut dirs = vec![dir.to_path_buf()];
    let active = active_segments(parts);
    for p in parts {
        let path = dir.join(p.name);
        let parent = path.parent().expect("checked: under a part").to_path_buf();
        if !dirs.contains(&parent) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&parent)
                .map_err(io)?;
            dirs.push(parent);
        }
        let mut f = File::create(&path).map_err(io)?;
        f.write_all(p.data).map_err(io)?;
        if p.file_len > p.data.len() as u64 {
            // Allocated, as the log preallocates its segments.
            let len = i64::try_from(p.file_len).map_err(|_| bad("a file length"))?;
            // SAFETY: plain integer arguments; the fd is owned by `f`.
            let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len) };
            if rc != 0 {
                return Err(io(std::io::Error::from_raw_os_error(rc)));
            }
            if active.contains(&p.name) {
                write_zeros(&mut f, p.file_len - p.data.len() as u64)?;
            }
        }
        f.sync_all().map_err(io)?;
    }
    // Children before parents, so each new entry is durable in its parent.
    for d in dirs.iter().rev() {
        fsync_dir(d)?;
    }
    fsync_dir(parent_of(dir))
}

/// The newest segment of each log in the image: the one the next commits
/// of the installed node go into. Its free space is written with zeros,
/// as the log prepares a segment (`SegmentPrep::Write`), so that those
/// commits overwrite written blocks and their fdatasync flushes data
/// only, not the file system's extent conversions. Older segments take
/// no more commits and are only allocated.
fn active_segments<'a>(parts: &[Part<'a>]) -> Vec<&'a str> {
    let mut newest: Vec<(&Path, crate::log::SegmentId, &str)> = Vec::new();
    for p in parts {
        let path = Path::new(p.name);
        let id = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(crate::log::parse_segment_file_name);
        let (Some(id), Some(parent)) = (id, path.parent()) else {
            continue;
        };
        match newest.iter_mut().find(|(dir, _, _)| *dir == parent) {
            Some(n) if n.1 < id => *n = (parent, id, p.name),
            Some(_) => {}
            None => newest.push((parent, id, p.name)),
        }
    }
    newest.into_iter().map(|(_, _, name)| name).collect()
}

/// Appends `len` zero bytes at the file's current position.
fn write_zeros(f: &mut File, len: u64) -> Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK.min(len) as usize];
    let mut left = len;
    while left > 0 {
        let n = left.min(CHUNK) as usize;
        f.write_all(&zeros[..n]).map_err(io)?;
        left -= n as u64;
    }
    Ok(())
}

/// Opens the staged directory and compares its state with what the image
/// names; the engine is shut down again whatever the outcome.
fn verify(dir: &Path, config: &InboxConfig, info: &ImageInfo) -> Result<()> {
    let mut config = config.clone();
    config.data_dir = dir.to_path_buf();
    config.compaction_interval = None;
    let inbox = Inbox::open(config)?;
    let found = (inbox.replica_index(), inbox.replica_digest());
    inbox.shutdown()?;
    if found != (info.index, info.digest) {
        return Err(bad(format!(
            "its state is not the one it names (index {} where it says {})",
            found.0, info.index
        )));
    }
    Ok(())
}

fn parent_of(dir: &Path) -> &Path {
    dir.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|f| f.sync_all()).map_err(io)
}

fn remove_dir_if_exists(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
        _ => Ok(()),
    }
}

/// Copies the regular files of `from` (if it exists) into `to`, durably.
fn copy_dir_files(from: &Path, to: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(to)
        .map_err(io)?;
    for e in entries {
        let e = e.map_err(io)?;
        let name = e.file_name();
        if !e.file_type().map_err(io)?.is_file() || name.to_string_lossy().ends_with(".tmp") {
            continue;
        }
        std::fs::copy(e.path(), to.join(&name)).map_err(io)?;
    }
    Ok(())
}

/// Copies the regular files at the top of `from` (a data directory's own:
/// a token key, the consensus layer's metadata) into `to`, durably,
/// leaving out `skip` and tmp files.
pub fn copy_top_files(from: &Path, to: &Path, skip: &[&str]) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    for e in entries {
        let e = e.map_err(io)?;
        let name = e.file_name();
        let n = name.to_string_lossy();
        if !e.file_type().map_err(io)?.is_file() || n.ends_with(".tmp") || skip.contains(&&*n) {
            continue;
        }
        let target = to.join(&name);
        std::fs::copy(e.path(), &target).map_err(io)?;
        File::open(&target).and_then(|f| f.sync_all()).map_err(io)?;
    }
    fsync_dir(to)
}

/// Swaps two directories in one step (`renameat2` with
/// `RENAME_EXCHANGE`): a crash leaves either both as they were or both
/// swapped, never a data directory missing or half-replaced. Made durable
/// by an fsync of their parent (they must share it).
pub fn exchange_dirs(a: &Path, b: &Path) -> Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|_| bad("a path with NUL"));
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: two valid NUL-terminated paths, read only during the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    fsync_dir(parent_of(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_outside_the_image_parts_are_refused() {
        for ok in ["evt/00000001.seg", "checkpoint/ckpt-1.bin", "snap/a/b"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for no in [
            "../x",
            "/etc/passwd",
            "evt",
            "evt/../../x",
            "raft-meta.json",
            "other/x",
        ] {
            assert!(check_name(no).is_err(), "{no}");
        }
    }
}
