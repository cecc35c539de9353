//! raft snapshots over the engine's replica images
//! (`inbox_engine::inbox::Image` and `Inbox::export_image`).
//!
//! - **Build**: an image of the engine once its rounds in hand have
//!   settled, with raft's log id and membership for its index inside (under
//!   the image's checksum). A follower's engine applies entries before raft
//!   commits them, so the build waits until raft has applied the image's
//!   index; an image whose rounds were discarded meanwhile is built again.
//! - **Receive**: the raft port writes the chunks of an incoming snapshot
//!   into a file beside the logs, and hands the file to raft
//!   (`Raft::install_full_snapshot`) only once the whole image verifies
//!   (checksum, and the metadata inside equal to the request's): a damaged
//!   image is refused (the leader sends it again from the start, later)
//!   before raft sees it, so nothing changes.
//! - **Install**: the image is unpacked beside the data directory
//!   (`.<name>.install`), fsynced, opened and checked against the index
//!   and digest it names; raft's metadata and the node's own files (token
//!   key) are added, the engine is shut down, the two directories are
//!   exchanged in one `renameat2(RENAME_EXCHANGE)`, and the engine is
//!   opened again on the new one. A crash before the exchange leaves the
//!   old directory (the staged one is removed at the next start), after it
//!   the new one. A node whose log already holds the snapshot's last entry
//!   keeps its engine as it is.
//!
//! The last snapshot built or installed is kept in a file beside the logs
//! (`raft-snapshot.img`), and raft reads it from there in chunks to send
//! it (`network.rs` sends it in chunks): no image is ever held whole in
//! memory. A build streams its image into `raft-snapshot.build.tmp`, an
//! incoming one is written into `raft-snapshot.recv.tmp` while
//! [`ImageCheck`] hashes its chunks, and
//! either is renamed over the kept file once it is synced.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inbox_engine::inbox::{
    copy_top_files, exchange_dirs, image_info, Image, ImageCheck, ImageInfo,
};
use inbox_engine::Inbox;
use std::io::Write as _;

use openraft::raft::SnapshotResponse;
use openraft::RaftSnapshotBuilder;

use super::network::SnapshotChunk;
use super::{meta, Glue, InboxRaft, TypeConfig};
use super::{LogId, Snapshot, SnapshotMeta, StoredMembership, Vote};

/// How long a build waits for raft to apply the rounds its image holds
/// (a follower's engine runs ahead of raft's commit by about one
/// heartbeat) before it takes a new copy.
const APPLIED_WAIT: Duration = Duration::from_secs(10);
/// Copies taken before a build gives up.
const BUILD_ATTEMPTS: usize = 10;

/// The last snapshot, kept beside the logs so that a restarted node has
/// one to send without building it again (raft would build one at start,
/// before it can tell which rounds are committed).
pub(crate) const FILE: &str = "raft-snapshot.img";
/// Where a build writes its image.
const BUILD_TMP: &str = "raft-snapshot.build.tmp";
/// Where the raft port writes the chunks of an incoming snapshot.
const RECEIVE_TMP: &str = "raft-snapshot.recv.tmp";

/// The snapshots a node holds: the last one's metadata (its image is
/// [`FILE`]), and the check of the one coming in.
#[derive(Default)]
pub(crate) struct Snapshots {
    /// The last one built or installed.
    current: Option<SnapshotMeta>,
    /// The one being received: its id, the check of its bytes so far and
    /// the file they are written to.
    receiving: Option<(String, ImageCheck, std::fs::File)>,
    /// Since start: builds kept, and installs that replaced the engine.
    pub(crate) counts: SnapshotCounts,
}

/// Snapshots a node built (and kept) and installed since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    pub built: u64,
    pub installed: u64,
}

/// Where a node's raft log starts (see [`super::GroupHandle::log_bounds`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogBounds {
    /// The last index of the snapshot it holds (0 for none).
    pub snapshot_index: u64,
    /// The last index purged from its log (0 for none): a follower
    /// lacking it catches up only by a snapshot.
    pub purged_index: u64,
}

impl Snapshots {
    /// The last log id of the snapshot held, if any.
    pub(crate) fn last_log_id(&self) -> Option<LogId> {
        self.current.as_ref().and_then(|m| m.last_log_id)
    }

    /// The snapshot file in `dir`, if there is one that verifies.
    pub(crate) fn load(dir: &Path) -> Snapshots {
        let mut s = Snapshots::default();
        let Ok(file) = std::fs::File::open(dir.join(FILE)) else {
            return s;
        };
        match map(&file)
            .and_then(|data| image_info(&data).map_err(|e| e.to_string()))
            .and_then(|i| serde_json::from_slice(&i.meta).map_err(|e| e.to_string()))
        {
            Ok(meta) => s.current = Some(meta),
            Err(e) => {
                tracing::warn!(error = %e, "the kept snapshot does not verify; a new one is built")
            }
        }
        s
    }
}

/// A read-only mapping of a whole image file.
fn map(file: &std::fs::File) -> Result<memmap2::Mmap, String> {
    // SAFETY: the image files are this node's own; none is written while
    // mapped (a build and a receive each write their own tmp file, and a
    // file is only ever replaced by a rename).
    unsafe { memmap2::Mmap::map(file) }.map_err(|e| format!("mapping a snapshot image: {e}"))
}

/// Makes the synced image `tmp` (a file in `from`) the snapshot file of
/// `to` (a directory on the same file system), durably.
fn publish(from: &Path, tmp: &str, to: &Path) -> std::io::Result<()> {
    std::fs::File::open(from.join(tmp))?.sync_all()?;
    std::fs::rename(from.join(tmp), to.join(FILE))?;
    std::fs::File::open(to)?.sync_all()?;
    if from != to {
        std::fs::File::open(from)?.sync_all()?;
    }
    Ok(())
}

/// A new, empty file for an incoming snapshot's chunks (any left by an
/// earlier one is removed first, so a handle raft still holds to it writes
/// into a file no longer named).
pub(crate) fn receive_file(dir: &Path) -> std::io::Result<std::fs::File> {
    let path = dir.join(RECEIVE_TMP);
    unless_gone(std::fs::remove_file(&path))?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
}

/// `.<name>.<what>` beside the data directory `dir`.
pub(crate) fn beside(dir: &Path, what: &str) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "data".into());
    dir.with_file_name(format!(".{name}.{what}"))
}

/// Where a build writes its image before packing it: inside the data
/// directory, so that a build cut short (a crash, or a node stopped
/// mid-build) leaves nothing outside it.
pub(crate) fn scratch(dir: &Path) -> PathBuf {
    dir.join(SCRATCH)
}
const SCRATCH: &str = "image.tmp";

/// Removes what a build or an install cut short by a crash left: a
/// scratch image, an image file being built or received (or, from older
/// versions, being kept), a staged directory never swapped in, or the old
/// directory an install swapped out.
pub(crate) fn remove_leftovers(dir: &Path) -> std::io::Result<()> {
    for d in [scratch(dir), beside(dir, "image"), beside(dir, "install")] {
        unless_gone(std::fs::remove_dir_all(d))?;
    }
    for f in [BUILD_TMP, RECEIVE_TMP, "raft-snapshot.img.tmp"] {
        unless_gone(std::fs::remove_file(dir.join(f)))?;
    }
    Ok(())
}

/// A removal's outcome, with "it was not there" counted as done.
fn unless_gone(removed: std::io::Result<()>) -> std::io::Result<()> {
    match removed {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn snap_err(e: impl ToString) -> std::io::Error {
    std::io::Error::other(format!("building a snapshot: {}", e.to_string()))
}

impl Glue {
    /// raft's metadata for the image of index `index`: its log id and the
    /// last membership at or before it.
    fn image_meta(&self, index: u64) -> SnapshotMeta {
        let role = self.role();
        let last_membership = role
            .meta
            .memberships
            .range(..=index)
            .next_back()
            .map(|(&i, m)| {
                StoredMembership::new(Some(LogId::new(role.meta.leader_at(i), i)), m.clone())
            })
            .unwrap_or_default();
        let last = LogId::new(role.meta.leader_at(index), index);
        SnapshotMeta {
            last_log_id: Some(last),
            last_membership,
        }
    }

    /// The last log id raft applied.
    pub(crate) fn applied(&self) -> Option<LogId> {
        *self.applied.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_applied(&self, id: Option<LogId>) {
        *self.applied.lock().unwrap_or_else(|p| p.into_inner()) = id;
    }

    pub(crate) fn snapshots(&self) -> std::sync::MutexGuard<'_, Snapshots> {
        self.snapshots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last snapshot built or installed, read from its file.
    pub(crate) fn current_snapshot(&self) -> Option<Snapshot> {
        // Opened under the lock that a new one is published under, so the
        // metadata and the file are the same snapshot's.
        let snaps = self.snapshots();
        let meta = snaps.current.clone()?;
        match std::fs::File::open(self.dir.join(FILE)) {
            Ok(file) => Some(Snapshot {
                meta,
                snapshot: tokio::fs::File::from_std(file),
            }),
            Err(e) => {
                tracing::warn!(node = self.id, error = %e, "the snapshot file cannot be opened");
                None
            }
        }
    }

    /// Makes the synced image `tmp` (in the data directory) the current
    /// snapshot `meta`: the file renamed and its metadata set under one
    /// lock, which [`Glue::current_snapshot`] reads them under.
    fn publish_current(&self, tmp: &str, meta: &SnapshotMeta) -> Result<(), String> {
        let mut snaps = self.snapshots();
        publish(&self.dir, tmp, &self.dir).map_err(|e| format!("keeping the snapshot: {e}"))?;
        snaps.current = Some(meta.clone());
        Ok(())
    }

    /// Builds a snapshot (blocking): see the module documentation.
    pub(crate) fn build_snapshot(&self) -> Result<Snapshot, String> {
        let _building = self.building.lock().unwrap_or_else(|p| p.into_inner());
        if self.role().raft.is_none() {
            return Err("the node is shutting down".into());
        }
        for _ in 0..BUILD_ATTEMPTS {
            let epoch = self.epoch.load(Ordering::Acquire);
            let inbox = self.inbox();
            let mut described = None;
            let out = self.dir.join(BUILD_TMP);
            let exported = inbox.export_image(&scratch(&self.dir), &out, &mut |index| {
                let m = self.image_meta(index);
                let buf = serde_json::to_vec(&m).expect("metadata serializes");
                described = Some(m);
                buf
            });
            let info = match exported {
                Ok(x) => x,
                // The engine was replaced meanwhile (an install).
                Err(_) if self.epoch.load(Ordering::Acquire) != epoch => continue,
                Err(e) => return Err(format!("building a snapshot: {e}")),
            };
            let meta = described.expect("export describes its image");
            // raft must have applied every round the image holds. Before
            // raft runs (a build at start) nothing is applied yet: that
            // build is refused at once rather than waited for.
            let running = self.role().raft.is_some();
            let start = Instant::now();
            while running
                && self.applied().map_or(0, |a| a.index) < info.index
                && self.epoch.load(Ordering::Acquire) == epoch
                && start.elapsed() < APPLIED_WAIT
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            // Checked and kept under the role lock, which an install holds
            // throughout: an older image never replaces an installed one.
            let role = self.role();
            let still = self.epoch.load(Ordering::Acquire) == epoch
                && self.applied().map_or(0, |a| a.index) >= info.index
                && role.meta.leader_at(info.index) == meta.last_log_id.expect("set").leader_id;
            if !still && !running {
                return Err(format!(
                    "no snapshot to start from: the log was purged up to {:?}, the snapshot file is missing, and raft has not applied round {} yet",
                    self.applied(),
                    info.index
                ));
            }
            if !still {
                continue;
            }
            let bytes = std::fs::metadata(&out).map_or(0, |m| m.len());
            self.publish_current(BUILD_TMP, &meta)?;
            // Opened before the role lock goes: no install replaces it first.
            let snapshot = self
                .current_snapshot()
                .ok_or("the snapshot just kept cannot be opened")?;
            drop(role);
            tracing::info!(node = self.id, index = info.index, bytes, "snapshot built");
            self.snapshots().counts.built += 1;
            return Ok(snapshot);
        }
        Err(format!(
            "no snapshot after {BUILD_ATTEMPTS} copies: rounds kept being discarded or raft did not apply them"
        ))
    }

    /// Installs a received snapshot (blocking): see the module
    /// documentation.
    pub(crate) fn install_snapshot(
        &self,
        meta: &SnapshotMeta,
        file: std::fs::File,
    ) -> Result<(), String> {
        // raft hands over the file the raft port wrote the chunks into:
        // the one named RECEIVE_TMP, which is renamed into place below.
        let named = std::fs::metadata(self.dir.join(RECEIVE_TMP))
            .map_err(|e| format!("the received snapshot's file: {e}"))?;
        let held = file
            .metadata()
            .map_err(|e| format!("the received snapshot: {e}"))?;
        if (named.dev(), named.ino()) != (held.dev(), held.ino()) {
            return Err("the received snapshot is not the file last begun".into());
        }
        let data = map(&file)?;
        // Parsing checks the whole image (its one SHA-256 pass here); the
        // staging below reuses it.
        let image = Image::parse(&data).map_err(|e| e.to_string())?;
        check_info(meta, image.info())?;
        let last = meta.last_log_id.ok_or("a snapshot without a last log id")?;
        // The lock is held to the end: raft's appends wait for the engine
        // the snapshot leaves. A build under way takes a new copy.
        let mut role = self.role();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.step_down(&mut role).map_err(|e| e.to_string())?;
        let inbox = self.inbox();
        let holds = role.raft_last.is_some_and(|l| l >= last.index)
            && role.meta.leader_at(last.index) == last.leader_id
            && inbox.replica_index() >= last.index;
        let installs = u64::from(!holds);
        if holds {
            drop(image);
            drop(data);
            self.publish_current(RECEIVE_TMP, meta)?;
            tracing::info!(
                node = self.id,
                index = last.index,
                "snapshot covered by this node's log"
            );
        } else {
            let bytes = data.len();
            let staged = beside(&self.dir, "install");
            // Not the scratch image: a build may be writing it.
            unless_gone(std::fs::remove_dir_all(&staged)).map_err(|e| e.to_string())?;
            image
                .stage(&staged, inbox.config())
                .map_err(|e| e.to_string())?;
            drop(image);
            drop(data);
            let new_meta = self.swap_in(&inbox, &staged, meta, last, role.meta.vote)?;
            self.snapshots().current = Some(meta.clone());
            role.meta = new_meta;
            role.raft_last = Some(last.index);
            role.cache.clear();
            tracing::info!(
                node = self.id,
                index = last.index,
                bytes,
                "snapshot installed"
            );
        }
        self.epoch.fetch_add(1, Ordering::AcqRel);
        drop(role);
        self.set_applied(Some(last));
        self.snapshots().counts.installed += installs;
        Ok(())
    }

    /// Adds raft's metadata, the image file itself and the node's own
    /// files to the staged image `staged`, exchanges the directories and
    /// opens the engine on the new one. The new directory's snapshot is
    /// then the one installed.
    fn swap_in(
        &self,
        inbox: &Arc<Inbox>,
        staged: &Path,
        meta: &SnapshotMeta,
        last: LogId,
        vote: Option<Vote>,
    ) -> Result<meta::Meta, String> {
        let config = inbox.config().clone();
        let mut new_meta = meta::Meta {
            vote,
            purged: Some(last),
            ..meta::Meta::default()
        };
        // The leaders first: noting one forgets the memberships from its
        // index on, which once took the one just inserted with it and left
        // the node, after its next restart, with no membership at all (a
        // learner of nothing, which never stands for election).
        let membership = meta
            .last_membership
            .log_id()
            .map(|at| (at, meta.last_membership.membership()));
        if let Some((at, _)) = membership.filter(|(at, _)| at.index < last.index) {
            new_meta.note(at.index, at.leader_id);
        }
        new_meta.note(last.index, last.leader_id);
        if let Some((at, m)) = membership {
            new_meta.memberships.insert(at.index, m.clone());
        }
        let prepared = new_meta
            .store(staged)
            .and_then(|()| publish(&self.dir, RECEIVE_TMP, staged))
            .map_err(|e| e.to_string())
            .and_then(|()| {
                copy_top_files(&self.dir, staged, &["raft-meta.json", FILE])
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = prepared {
            let _ = std::fs::remove_dir_all(staged);
            return Err(e);
        }
        // From here the engine is replaced; a failure stops this node
        // (raft stops on a storage error), its directory old or new whole.
        inbox
            .shutdown()
            .map_err(|e| format!("shutting the engine down for a snapshot: {e}"))?;
        exchange_dirs(staged, &self.dir).map_err(|e| e.to_string())?;
        if let Err(e) = std::fs::remove_dir_all(staged) {
            tracing::warn!(error = %e, "removing the data directory a snapshot replaced");
        }
        let fresh =
            Inbox::open(config).map_err(|e| format!("opening the installed snapshot: {e}"))?;
        fresh.follow().map_err(|e| e.to_string())?;
        *self.inbox.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
        Ok(new_meta)
    }
}

/// What an image says about itself, against the request's metadata.
fn check_info(meta: &SnapshotMeta, info: &ImageInfo) -> Result<(), String> {
    let inside: SnapshotMeta = serde_json::from_slice(&info.meta)
        .map_err(|e| format!("replica image: its raft metadata: {e}"))?;
    if inside != *meta || info.index != meta.last_log_id.map_or(0, |l| l.index) {
        return Err(format!(
            "replica image: it holds a snapshot at {:?}, the request names one at {:?}",
            inside.last_log_id, meta.last_log_id
        ));
    }
    Ok(())
}

/// raft's snapshot builder.
pub struct Builder {
    pub(crate) glue: Arc<Glue>,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    type SnapshotData = tokio::fs::File;

    async fn build_snapshot(&mut self) -> Result<Snapshot, std::io::Error> {
        let glue = Arc::clone(&self.glue);
        tokio::task::spawn_blocking(move || glue.build_snapshot())
            .await
            .map_err(snap_err)?
            .map_err(snap_err)
    }
}

/// Where a node's raft port hands incoming snapshot chunks: they are
/// written beside the logs, and the image goes on to raft only once it
/// verifies whole.
#[derive(Clone)]
pub struct SnapshotReceiver {
    pub(crate) glue: Arc<Glue>,
    pub(crate) raft: InboxRaft,
}

/// The answer to one chunk: raft's answer after the last one, nothing
/// before it, or why the chunk or the image was refused (the leader then
/// sends the snapshot again from the start).
pub type ChunkAnswer = Result<Option<SnapshotResponse<TypeConfig>>, String>;

impl SnapshotReceiver {
    /// Takes one chunk of a snapshot: the first (offset 0) starts a new
    /// file; each must continue the one before; the last one hands the
    /// verified image to raft. A damaged image or a chunk out of order is
    /// refused; raft never sees it.
    pub async fn receive(&self, chunk: SnapshotChunk) -> ChunkAnswer {
        let id = chunk.id.clone();
        let written = {
            let mut snaps = self.glue.snapshots();
            self.write_chunk(&mut snaps, &chunk)
        };
        let file = match written {
            Ok(None) => return Ok(None),
            Ok(Some(file)) => file,
            Err(why) => {
                tracing::warn!(node = self.glue.id, snapshot = %id, error = %why, "snapshot refused");
                return Err(why);
            }
        };
        let snapshot = Snapshot {
            meta: chunk.meta,
            snapshot: tokio::fs::File::from_std(file),
        };
        self.raft
            .install_full_snapshot(chunk.vote, snapshot)
            .await
            .map(Some)
            .map_err(|e| format!("raft stopped: {e}"))
    }

    /// Writes `chunk` into the file of the snapshot being received:
    /// `Some(file)`, rewound, once the last chunk made a whole image that
    /// verifies.
    fn write_chunk(
        &self,
        snaps: &mut Snapshots,
        chunk: &SnapshotChunk,
    ) -> Result<Option<std::fs::File>, String> {
        if chunk.offset == 0 {
            let file = receive_file(&self.glue.dir)
                .map_err(|e| format!("starting the snapshot's file: {e}"))?;
            snaps.receiving = Some((chunk.id.clone(), ImageCheck::new(), file));
        }
        let in_order = snaps
            .receiving
            .as_ref()
            .is_some_and(|(i, c, _)| *i == chunk.id && c.len() == chunk.offset);
        if !in_order {
            snaps.receiving = None;
            return Err(format!(
                "snapshot chunk at offset {} of {} does not follow the chunks received",
                chunk.offset, chunk.id
            ));
        }
        let (_, check, file) = snaps.receiving.as_mut().expect("checked");
        check.push(&chunk.data);
        if let Err(e) = file.write_all(&chunk.data) {
            snaps.receiving = None;
            return Err(format!("writing the snapshot's file: {e}"));
        }
        if !chunk.done {
            return Ok(None);
        }
        let (_, check, file) = snaps.receiving.take().expect("checked");
        check
            .finish()
            .map_err(|e| e.to_string())
            .and_then(|info| check_info(&chunk.meta, &info))?;
        file.sync_all()
            .map_err(|e| format!("syncing the snapshot's file: {e}"))?;
        Ok(Some(file))
    }
}
