//! raft snapshots over the engine's replica images
//! (`inbox_engine::inbox::stage_image` and `Inbox::export_image`).
//!
//! - **Build**: an image of the engine once its rounds in hand have
//!   settled, with raft's log id and membership for its index inside (under
//!   the image's checksum). A follower's engine applies entries before raft
//!   commits them, so the build waits until raft has applied the image's
//!   index; an image whose rounds were discarded meanwhile is built again.
//! - **Receive**: the chunks of an incoming snapshot are kept beside
//!   raft's copy, and the last one is passed on only once the whole image
//!   verifies (checksum, and the metadata inside equal to the request's):
//!   a damaged image is answered with a mismatch (the leader sends it
//!   again from the start) before raft sees it, so nothing changes.
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
//! The last snapshot built or installed is kept in memory for raft to
//! send; after a restart raft builds a new one when its log was purged.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inbox_engine::inbox::{copy_top_files, exchange_dirs, image_info, stage_image};
use inbox_engine::Inbox;
use openraft::error::{InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{InstallSnapshotRequest, InstallSnapshotResponse};
use openraft::{
    AnyError, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta, SnapshotSegmentId, StorageError,
    StorageIOError, StoredMembership,
};

use super::{meta, Glue, InboxRaft, Peer, TypeConfig};

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
const FILE_TMP: &str = "raft-snapshot.img.tmp";

/// A snapshot's metadata and image.
type Held = (SnapshotMeta<u64, Peer>, Arc<Vec<u8>>);

/// The snapshots a node holds in memory.
#[derive(Default)]
pub(crate) struct Snapshots {
    /// The last one built or installed.
    current: Option<Held>,
    /// The chunks of the one being received: its id and bytes so far.
    receiving: Option<(String, Vec<u8>)>,
    /// Images described so far (kept or not), for unique snapshot ids.
    ids: u64,
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
    pub(crate) fn last_log_id(&self) -> Option<LogId<u64>> {
        self.current.as_ref().and_then(|(m, _)| m.last_log_id)
    }

    /// The snapshot file in `dir`, if there is one that verifies.
    pub(crate) fn load(dir: &Path) -> Snapshots {
        let mut s = Snapshots::default();
        let Ok(data) = std::fs::read(dir.join(FILE)) else {
            return s;
        };
        match image_info(&data)
            .map_err(|e| e.to_string())
            .and_then(|i| serde_json::from_slice(&i.meta).map_err(|e| e.to_string()))
        {
            Ok(meta) => s.current = Some((meta, Arc::new(data))),
            Err(e) => {
                tracing::warn!(error = %e, "the kept snapshot does not verify; a new one is built")
            }
        }
        s
    }
}

/// Writes the snapshot file into `dir`, durably.
fn keep(dir: &Path, data: &[u8]) -> std::io::Result<()> {
    inbox_engine::log::write_file_durably(
        &inbox_engine::log::PwriteIo,
        &dir.join(FILE_TMP),
        &dir.join(FILE),
        data,
    )
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
/// scratch image, a staged directory never swapped in, or the old
/// directory an install swapped out.
pub(crate) fn remove_leftovers(dir: &Path) -> std::io::Result<()> {
    for d in [scratch(dir), beside(dir, "image"), beside(dir, "install")] {
        match std::fs::remove_dir_all(d) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

fn snap_err(e: impl ToString) -> StorageError<u64> {
    StorageIOError::write_snapshot(None, AnyError::error(e.to_string())).into()
}

impl Glue {
    /// raft's metadata for the image of index `index`: its log id, the
    /// last membership at or before it, and a new snapshot id.
    fn image_meta(&self, index: u64) -> SnapshotMeta<u64, Peer> {
        let id = {
            let mut snaps = self.snapshots();
            snaps.ids += 1;
            snaps.ids
        };
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
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        SnapshotMeta {
            last_log_id: Some(last),
            last_membership,
            snapshot_id: format!("{}-{}-{stamp}-{id}", last.leader_id.term, index),
        }
    }

    /// The last log id raft applied.
    pub(crate) fn applied(&self) -> Option<LogId<u64>> {
        *self.applied.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_applied(&self, id: Option<LogId<u64>>) {
        *self.applied.lock().unwrap_or_else(|p| p.into_inner()) = id;
    }

    pub(crate) fn snapshots(&self) -> std::sync::MutexGuard<'_, Snapshots> {
        self.snapshots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last snapshot built or installed.
    pub(crate) fn current_snapshot(&self) -> Option<Snapshot<TypeConfig>> {
        self.snapshots()
            .current
            .as_ref()
            .map(|(meta, data)| Snapshot {
                meta: meta.clone(),
                snapshot: Box::new(Cursor::new(data.to_vec())),
            })
    }

    /// Builds a snapshot (blocking): see the module documentation.
    pub(crate) fn build_snapshot(&self) -> Result<Snapshot<TypeConfig>, String> {
        let _building = self.building.lock().unwrap_or_else(|p| p.into_inner());
        if self.role().raft.is_none() {
            return Err("the node is shutting down".into());
        }
        for _ in 0..BUILD_ATTEMPTS {
            let epoch = self.epoch.load(Ordering::Acquire);
            let inbox = self.inbox();
            let mut described = None;
            let exported = inbox.export_image(&scratch(&self.dir), &mut |index| {
                let m = self.image_meta(index);
                let buf = serde_json::to_vec(&m).expect("metadata serializes");
                described = Some(m);
                buf
            });
            let (info, data) = match exported {
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
            keep(&self.dir, &data).map_err(|e| format!("keeping the snapshot: {e}"))?;
            drop(role);
            tracing::info!(
                node = self.id,
                index = info.index,
                bytes = data.len(),
                "snapshot built"
            );
            let data = Arc::new(data);
            let mut snaps = self.snapshots();
            snaps.current = Some((meta.clone(), Arc::clone(&data)));
            snaps.counts.built += 1;
            drop(snaps);
            return Ok(Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(data.to_vec())),
            });
        }
        Err(format!(
            "no snapshot after {BUILD_ATTEMPTS} copies: rounds kept being discarded or raft did not apply them"
        ))
    }

    /// Installs a received snapshot (blocking): see the module
    /// documentation.
    pub(crate) fn install_snapshot(
        &self,
        meta: &SnapshotMeta<u64, Peer>,
        data: Vec<u8>,
    ) -> Result<(), String> {
        check(meta, &data)?;
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
            keep(&self.dir, &data).map_err(|e| format!("keeping the snapshot: {e}"))?;
            tracing::info!(
                node = self.id,
                index = last.index,
                "snapshot covered by this node's log"
            );
        } else {
            let new_meta = self.swap_in(&inbox, meta, last, &data, role.meta.vote)?;
            role.meta = new_meta;
            role.raft_last = Some(last.index);
            role.cache.clear();
            tracing::info!(
                node = self.id,
                index = last.index,
                bytes = data.len(),
                "snapshot installed"
            );
        }
        self.epoch.fetch_add(1, Ordering::AcqRel);
        drop(role);
        self.set_applied(Some(last));
        let mut snaps = self.snapshots();
        snaps.current = Some((meta.clone(), Arc::new(data)));
        snaps.counts.installed += installs;
        Ok(())
    }

    /// Stages the image, adds raft's metadata and the node's own files,
    /// exchanges the directories and opens the engine on the new one.
    fn swap_in(
        &self,
        inbox: &Arc<Inbox>,
        meta: &SnapshotMeta<u64, Peer>,
        last: LogId<u64>,
        data: &[u8],
        vote: Option<openraft::Vote<u64>>,
    ) -> Result<meta::Meta, String> {
        let config = inbox.config().clone();
        let staged = beside(&self.dir, "install");
        // Not the scratch image: a build may be writing it.
        match std::fs::remove_dir_all(&staged) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.to_string()),
            _ => {}
        }
        stage_image(data, &staged, &config).map_err(|e| e.to_string())?;
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
            .store(&staged)
            .and_then(|()| keep(&staged, data))
            .map_err(|e| e.to_string())
            .and_then(|()| {
                copy_top_files(&self.dir, &staged, &["raft-meta.json", FILE])
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = prepared {
            let _ = std::fs::remove_dir_all(&staged);
            return Err(e);
        }
        // From here the engine is replaced; a failure stops this node
        // (raft stops on a storage error), its directory old or new whole.
        inbox
            .shutdown()
            .map_err(|e| format!("shutting the engine down for a snapshot: {e}"))?;
        exchange_dirs(&staged, &self.dir).map_err(|e| e.to_string())?;
        if let Err(e) = std::fs::remove_dir_all(&staged) {
            tracing::warn!(error = %e, "removing the data directory a snapshot replaced");
        }
        let fresh =
            Inbox::open(config).map_err(|e| format!("opening the installed snapshot: {e}"))?;
        fresh.follow().map_err(|e| e.to_string())?;
        *self.inbox.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
        Ok(new_meta)
    }
}

/// An image's checksum, layout and the raft metadata inside it, against
/// the request's.
fn check(meta: &SnapshotMeta<u64, Peer>, data: &[u8]) -> Result<(), String> {
    let info = image_info(data).map_err(|e| e.to_string())?;
    let inside: SnapshotMeta<u64, Peer> = serde_json::from_slice(&info.meta)
        .map_err(|e| format!("replica image: its raft metadata: {e}"))?;
    if inside != *meta || info.index != meta.last_log_id.map_or(0, |l| l.index) {
        return Err(format!(
            "replica image: it holds snapshot {} at {:?}, the request names {} at {:?}",
            inside.snapshot_id, inside.last_log_id, meta.snapshot_id, meta.last_log_id
        ));
    }
    Ok(())
}

/// raft's snapshot builder.
pub struct Builder {
    pub(crate) glue: Arc<Glue>,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let glue = Arc::clone(&self.glue);
        tokio::task::spawn_blocking(move || glue.build_snapshot())
            .await
            .map_err(snap_err)?
            .map_err(snap_err)
    }
}

/// Where a node's raft port hands incoming snapshot chunks: they go on to
/// raft, and the last one only once the whole image verifies.
#[derive(Clone)]
pub struct SnapshotReceiver {
    pub(crate) glue: Arc<Glue>,
    pub(crate) raft: InboxRaft,
}

impl SnapshotReceiver {
    /// `Raft::install_snapshot` behind the check of the whole image. A
    /// damaged image is answered with a mismatch at offset 0, which makes
    /// the leader send it again from the start; raft never sees it.
    pub async fn install_snapshot(
        &self,
        rpc: InstallSnapshotRequest<TypeConfig>,
    ) -> Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>> {
        let refused = {
            let mut snaps = self.glue.snapshots();
            let id = &rpc.meta.snapshot_id;
            if rpc.offset == 0 {
                snaps.receiving = Some((id.clone(), Vec::new()));
            }
            let in_order = snaps
                .receiving
                .as_ref()
                .is_some_and(|(i, buf)| i == id && buf.len() as u64 == rpc.offset);
            if in_order {
                let (_, buf) = snaps.receiving.as_mut().expect("checked");
                buf.extend_from_slice(&rpc.data);
            } else {
                // raft answers an out-of-order chunk itself.
                snaps.receiving = None;
            }
            match (rpc.done, in_order) {
                (true, true) => {
                    let (_, whole) = snaps.receiving.take().expect("checked");
                    check(&rpc.meta, &whole).err()
                }
                _ => None,
            }
        };
        if let Some(why) = refused {
            tracing::warn!(node = self.glue.id, snapshot = %rpc.meta.snapshot_id, error = %why, "snapshot refused");
            return Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(
                SnapshotMismatch {
                    expect: SnapshotSegmentId {
                        id: rpc.meta.snapshot_id.clone(),
                        offset: 0,
                    },
                    got: SnapshotSegmentId {
                        id: rpc.meta.snapshot_id.clone(),
                        offset: rpc.offset,
                    },
                },
            )));
        }
        self.raft.install_snapshot(rpc).await
    }
}
