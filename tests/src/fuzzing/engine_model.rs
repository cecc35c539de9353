//! `engine_model`: arbitrary operation sequences against the embedded
//! engine, with storage behind a fault-injecting IO layer, checked against
//! a ledger of everything the engine acknowledged.
//!
//! The input is read 4 bytes per operation: join, leave, send (with small
//! idempotency keys, so retries happen; with an odd size byte through
//! `Inbox::send_here`, which decides and commits it on this thread when
//! nothing is queued ahead), recall, mark-read, a large
//! group's marker clear (three of the four users make a large group), register,
//! sync-and-ACK (pages of 1 to 8 events), restart, an fsync failure after a
//! countdown, compaction (with no safety window, so it reclaims whatever
//! the fences allow) and checkpoint. A restart is one of three:
//!
//! - a clean shutdown (the engine writes its final checkpoint);
//! - a process kill: the data directory as it stands, copied while the
//!   engine runs, is opened by a new engine and the old one is halted
//!   without a final checkpoint, so recovery replays the `evt`
//!   log after the last periodic or requested checkpoint;
//! - a power cut: the logs as `FaultyIo::crash_image_tree` models them
//!   (what was synced, plus a seeded prefix of the unsynced writes with the
//!   last one torn) and the checkpoint files that were renamed into place
//!   (the checkpoint writer fsyncs each file and its directory before the
//!   rename is reported, so a renamed file is durable).
//!
//! While no fault is armed, runs of operations whose arguments do not
//! depend on an earlier answer (joins, leaves, sends, recalls, read marks,
//! registrations) are submitted together and checked in order once
//! answered, so the engine decides them in shared rounds as it does under
//! concurrent clients, and a power cut can tear a round of several
//! commands. It also saves a thread hand-off per operation.
//!
//! Segments are 4 KiB and a checkpoint is written every 8 KiB of log, so a
//! few dozen operations seal segments, compaction drops and rewrites them,
//! and restarts replay after a checkpoint.
//!
//! The model keeps what was acknowledged and the rules every answer must
//! follow:
//!
//! - no operation fails with an IO error unless a fault was injected, and
//!   once an injected failure has fired nothing is acknowledged any more
//!   (fail-stop; read from the IO layer, so checking costs no write);
//! - a retried `(sender, client_msg_id)` returns the original ids with
//!   `duplicate`, and a new message gets exactly the next `msg_seq` of its
//!   conversation (one above the last acknowledged, unless an operation on
//!   that conversation failed under a fault and may have reached the disk);
//! - an acknowledged marker clear takes the conversation off the user's
//!   dirty list, and its cleared position survives every restart;
//! - after every restart, every acknowledged send is served at its seq
//!   with its body (a tombstone once its recall was acknowledged), every
//!   acknowledged read cursor and device ACK is still in place, and each
//!   conversation's history holds `msg_seq` 1, 2, 3… with no gap;
//! - after every operation, the per-segment reference counts compaction
//!   decides by equal a recount of the index.
//!
//! Every case adds what it reached to process-wide [`Coverage`] counters;
//! the corpus replay and `engine_model_reach` fail when a case these rules
//! are about never happened.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use inbox_engine::inbox::Pending;
use inbox_engine::log::{FaultyIo, SyncPolicy};
use inbox_engine::*;

const CONVS: u64 = 3;
const USERS: u64 = 4;
const DEVICES: u64 = 2;
/// 1,024 operations: `fuzz/run.sh` caps inputs at 4,096 bytes.
const OPS_MAX: usize = 1024;
const SEGMENT_BYTES: u64 = 4 << 10;
const CHECKPOINT_EVERY_BYTES: u64 = 8 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Restart {
    Clean,
    Kill,
    /// A power cut; the seed picks how much of the unsynced tail survives.
    PowerCut(u64),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Join(ConvId, Uid),
    Leave(ConvId, Uid),
    Send(ConvId, Uid, ClientMsgId, usize),
    Recall(ConvId, Uid, usize),
    MarkRead(Uid, ConvId),
    ClearDirty(Uid, ConvId),
    Register(Uid, DeviceId),
    SyncAck(Uid, DeviceId, u32),
    Restart(Restart),
    FailSyncAfter(u64),
    Compact,
    Checkpoint,
}

fn decode(data: &[u8]) -> Vec<Op> {
    data.chunks_exact(4)
        .take(OPS_MAX)
        .map(|c| {
            let conv = 1 + u64::from(c[1]) % CONVS;
            let uid = 1 + u64::from(c[2]) % USERS;
            let device = 1 + u64::from(c[3]) % DEVICES;
            match c[0] % 16 {
                0 | 1 => Op::Join(ConvId(conv), Uid(uid)),
                2 => Op::Leave(ConvId(conv), Uid(uid)),
                3..=6 => Op::Send(
                    ConvId(conv),
                    Uid(uid),
                    ClientMsgId::from(c[3] % 8),
                    usize::from(c[3] >> 3),
                ),
                7 => Op::Recall(ConvId(conv), Uid(uid), usize::from(c[3])),
                8 if c[3] % 2 == 1 => Op::ClearDirty(Uid(uid), ConvId(conv)),
                8 => Op::MarkRead(Uid(uid), ConvId(conv)),
                9 => Op::Register(Uid(uid), DeviceId(device)),
                10 | 11 => Op::SyncAck(Uid(uid), DeviceId(device), 1 + u32::from(c[1] >> 5)),
                12 => Op::Restart(match c[1] % 3 {
                    0 => Restart::Clean,
                    1 => Restart::Kill,
                    _ => Restart::PowerCut(u64::from(u16::from_le_bytes([c[2], c[3]]))),
                }),
                13 => Op::FailSyncAfter(1 + u64::from(c[1] % 4)),
                14 => Op::Compact,
                _ => Op::Checkpoint,
            }
        })
        .collect()
}

/// What the cases run so far in this process reached. A rule checked only
/// on paths no case took proves nothing, so the tests that drive
/// [`check`] fail when one of these stays at zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    pub cases: u64,
    pub operations: u64,
    pub acknowledged_sends: u64,
    pub clean_restarts: u64,
    pub kill_restarts: u64,
    pub power_cut_restarts: u64,
    /// Restarts that loaded a checkpoint and then replayed records after it.
    pub replays_after_checkpoint: u64,
    /// `evt` and `msg` segments sealed (filled and followed by another).
    pub segments_sealed: u64,
    pub segments_dropped: u64,
    pub segments_rewritten: u64,
    pub events_reclaimed: u64,
    /// Sync batches of more than one page.
    pub multi_page_syncs: u64,
    pub acks: u64,
    /// ACKs carried by the next page's `SYNC` (nobody waits for them).
    pub carried_acks: u64,
    pub recalls: u64,
    pub retries_answered_duplicate: u64,
    pub injected_failures_fired: u64,
    /// Operations attempted after an injected failure fired, each of
    /// which had to be refused if it wrote.
    pub operations_after_failure: u64,
    /// Large-group marker clears acknowledged.
    pub marker_clears: u64,
    /// Operations submitted beside others before any was answered, so
    /// that the engine decided them in shared rounds.
    pub operations_submitted_together: u64,
    /// Sends decided and committed on the caller's thread
    /// (`Inbox::send_here`, asked for by an odd size byte): released
    /// when the call returned.
    pub sends_run_here: u64,
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cases {} operations {} sends {} restarts clean/kill/power-cut {}/{}/{} \
             replays-after-checkpoint {} segments sealed {} dropped {} rewritten {} \
             events reclaimed {} multi-page syncs {} acks {} carried acks {} recalls {} \
             duplicate retries {} \
             injected failures fired {} operations after a failure {} marker clears {} \
             submitted together {} sends run here {}",
            self.cases,
            self.operations,
            self.acknowledged_sends,
            self.clean_restarts,
            self.kill_restarts,
            self.power_cut_restarts,
            self.replays_after_checkpoint,
            self.segments_sealed,
            self.segments_dropped,
            self.segments_rewritten,
            self.events_reclaimed,
            self.multi_page_syncs,
            self.acks,
            self.carried_acks,
            self.recalls,
            self.retries_answered_duplicate,
            self.injected_failures_fired,
            self.operations_after_failure,
            self.marker_clears,
            self.operations_submitted_together,
            self.sends_run_here,
        )
    }
}

impl Coverage {
    fn fields(&self) -> [(&'static str, u64); 21] {
        [
            ("cases", self.cases),
            ("operations", self.operations),
            ("acknowledged sends", self.acknowledged_sends),
            ("clean restarts", self.clean_restarts),
            ("kill restarts", self.kill_restarts),
            ("power-cut restarts", self.power_cut_restarts),
            ("replays after a checkpoint", self.replays_after_checkpoint),
            ("segments sealed", self.segments_sealed),
            ("segments dropped", self.segments_dropped),
            ("segments rewritten", self.segments_rewritten),
            ("events reclaimed", self.events_reclaimed),
            ("multi-page syncs", self.multi_page_syncs),
            ("acks", self.acks),
            ("carried acks", self.carried_acks),
            ("recalls", self.recalls),
            (
                "retries answered duplicate",
                self.retries_answered_duplicate,
            ),
            ("injected failures fired", self.injected_failures_fired),
            ("operations after a failure", self.operations_after_failure),
            ("marker clears", self.marker_clears),
            (
                "operations submitted together",
                self.operations_submitted_together,
            ),
            ("sends run here", self.sends_run_here),
        ]
    }

    /// Panics naming every case that never happened.
    pub fn assert_reached_everything(&self) {
        let missing: Vec<&str> = self
            .fields()
            .iter()
            .filter(|(_, n)| *n == 0)
            .map(|(name, _)| *name)
            .collect();
        assert!(
            missing.is_empty(),
            "engine_model never reached: {} (in {} cases: {self})",
            missing.join(", "),
            self.cases
        );
    }

    fn add_to_totals(&self) {
        for (total, (_, n)) in TOTALS.iter().zip(self.fields()) {
            total.fetch_add(n, Ordering::Relaxed);
        }
    }
}

static TOTALS: [AtomicU64; 21] = [const { AtomicU64::new(0) }; 21];

/// The coverage summed over every case run in this process.
pub fn coverage() -> Coverage {
    let n: Vec<u64> = TOTALS.iter().map(|t| t.load(Ordering::Relaxed)).collect();
    Coverage {
        cases: n[0],
        operations: n[1],
        acknowledged_sends: n[2],
        clean_restarts: n[3],
        kill_restarts: n[4],
        power_cut_restarts: n[5],
        replays_after_checkpoint: n[6],
        segments_sealed: n[7],
        segments_dropped: n[8],
        segments_rewritten: n[9],
        events_reclaimed: n[10],
        multi_page_syncs: n[11],
        acks: n[12],
        carried_acks: n[13],
        recalls: n[14],
        retries_answered_duplicate: n[15],
        injected_failures_fired: n[16],
        operations_after_failure: n[17],
        marker_clears: n[18],
        operations_submitted_together: n[19],
        sends_run_here: n[20],
    }
}

#[derive(Clone, Debug)]
struct AckedSend {
    conv: ConvId,
    sender: Uid,
    msg_id: MsgId,
    msg_seq: MsgSeq,
    payload: Bytes,
}

#[derive(Default)]
struct Ledger {
    sends: Vec<AckedSend>,
    by_key: HashMap<(Uid, ClientMsgId), (MsgId, MsgSeq)>,
    /// Sends that failed under an injected fault: they may or may not
    /// have reached the disk.
    uncertain: HashSet<(Uid, ClientMsgId)>,
    /// Highest acknowledged `msg_seq` per conversation (sends, joins,
    /// leaves and recalls all take one).
    head: BTreeMap<ConvId, MsgSeq>,
    /// Conversations where an operation failed under a fault: it may have
    /// reached the disk and taken a seq nobody acknowledged.
    head_unsure: HashSet<ConvId>,
    recalled: HashSet<MsgId>,
    reads: HashMap<(Uid, ConvId), MsgSeq>,
    /// Read marks that failed under a fault: they may have reached the
    /// disk and moved the cursor past what `reads` holds.
    reads_unsure: HashSet<(Uid, ConvId)>,
    /// Acknowledged marker clears of large groups.
    clears: HashMap<(Uid, ConvId), MsgSeq>,
    acks: HashMap<(Uid, DeviceId), SyncSeq>,
    /// The highest ACK asked for, carried or awaited: no page may report
    /// more.
    asked: HashMap<(Uid, DeviceId), SyncSeq>,
    generations: HashMap<(Uid, DeviceId), Generation>,
    /// The body size each key was first sent with.
    body_size: HashMap<(Uid, ClientMsgId), usize>,
}

impl Ledger {
    /// Notes an ACK asked for, carried or awaited.
    fn ask(&mut self, key: (Uid, DeviceId), seq: SyncSeq) {
        let asked = self.asked.entry(key).or_default();
        *asked = (*asked).max(seq);
    }

    fn acknowledge_send(
        &mut self,
        conv: ConvId,
        sender: Uid,
        client_msg_id: ClientMsgId,
        reply: SendReply,
        payload: Bytes,
    ) {
        self.by_key
            .insert((sender, client_msg_id), (reply.msg_id, reply.msg_seq));
        self.sends.push(AckedSend {
            conv,
            sender,
            msg_id: reply.msg_id,
            msg_seq: reply.msg_seq,
            payload,
        });
    }

    /// A new record of `conv` was acknowledged at `seq`: exactly the next
    /// one, unless an unacknowledged one may have landed in between.
    fn took_seq(&mut self, conv: ConvId, seq: MsgSeq) {
        let head = self.head.entry(conv).or_default();
        if self.head_unsure.remove(&conv) {
            assert!(
                seq > *head,
                "conv {conv}: acknowledged msg_seq {seq} is not above the previous {head}"
            );
        } else {
            assert_eq!(
                seq,
                head.next(),
                "conv {conv}: acknowledged msg_seq {seq} does not follow {head}"
            );
        }
        *head = seq;
    }

    /// An operation on `conv` failed under a fault.
    fn may_have_landed(&mut self, conv: ConvId) {
        self.head_unsure.insert(conv);
    }
}

fn config(dir: &Path) -> InboxConfig {
    let mut config = InboxConfig::new(dir);
    config.segment_bytes = SEGMENT_BYTES;
    config.checkpoint_every_bytes = CHECKPOINT_EVERY_BYTES;
    config.checkpoint_every_state_percent = 0;
    // Events go as soon as every fence allows, so compaction trims, drops
    // and rewrites segments within a short input; compaction runs only
    // when an operation asks, so each case is reproducible.
    config.safety_window = std::time::Duration::ZERO;
    config.compaction_interval = None;
    config.sync = SyncPolicy::Always;
    config.token_key = [7; 32];
    // Three of the four users make a large group.
    config.large_group_members = 2;
    config
}

fn open(dir: &Path, after: &str) -> (Inbox, Arc<FaultyIo>) {
    let io = Arc::new(FaultyIo::new());
    let inbox = Inbox::open_with_io(config(dir), io.clone())
        .unwrap_or_else(|e| panic!("opening after {after} failed: {e}\n{}", describe_dir(dir)));
    (inbox, io)
}

/// Copies the files under `from` as a killed process leaves them: every
/// write made so far, synced or not. A file that a background thread
/// renames or removes while the copy runs is skipped, as a kill at that
/// moment could see it either way.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create an image directory");
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_tree(&path, &target);
        } else if let Err(e) = std::fs::copy(&path, &target) {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::NotFound,
                "copy {}: {e}",
                path.display()
            );
        }
    }
}

/// The checkpoint files in place (not a writer's tmp file) under `from`.
fn copy_renamed_checkpoints(from: &Path, to: &Path) {
    let (from, to) = (from.join("checkpoint"), to.join("checkpoint"));
    let Ok(entries) = std::fs::read_dir(&from) else {
        return;
    };
    std::fs::create_dir_all(&to).expect("create the image's checkpoint directory");
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().ends_with(".bin") {
            let copied = std::fs::copy(entry.path(), to.join(&name));
            if let Err(e) = copied {
                assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "copy {name:?}: {e}");
            }
        }
    }
}

/// The files of a data directory, for a failure message.
fn describe_dir(dir: &Path) -> String {
    let mut names = Vec::new();
    for sub in ["checkpoint", "evt", "msg"] {
        if let Ok(entries) = std::fs::read_dir(dir.join(sub)) {
            let mut here: Vec<String> = entries
                .flatten()
                .map(|e| format!("{sub}/{}", e.file_name().to_string_lossy()))
                .collect();
            here.sort();
            names.extend(here);
        }
    }
    names.join(" ")
}

/// Segment files of both logs, relative to the data directory.
fn segment_paths(dir: &Path) -> Vec<PathBuf> {
    ["evt", "msg"]
        .iter()
        .filter_map(|log| Some((log, std::fs::read_dir(dir.join(log)).ok()?)))
        .flat_map(|(log, entries)| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
                .map(move |e| Path::new(log).join(e.file_name()))
        })
        .collect()
}

/// Segment files across both logs.
fn segment_files(dir: &Path) -> u64 {
    ["evt", "msg"]
        .iter()
        .filter_map(|log| std::fs::read_dir(dir.join(log)).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.path().is_file())
        .count() as u64
}

/// An error a healthy engine may answer with: the request was refused by
/// the rules, not by storage.
fn refused_by_rules(error: &Error) -> bool {
    !matches!(
        error,
        Error::Log(_)
            | Error::Internal(_)
            | Error::NoSpace(_)
            | Error::Corruption { .. }
            | Error::Invariant(_)
            | Error::ShuttingDown
    )
}

/// The state of the armed fault around one operation.
#[derive(Clone, Copy)]
struct Faults {
    /// A failure is armed (or has fired) since the last restart.
    armed: bool,
    /// A failure had fired before this operation began.
    fired_before: bool,
}

/// Checks a result: with no fault armed, only rule refusals are allowed.
fn allowed<T>(result: &Result<T>, faults: Faults, what: &str) {
    if let Err(error) = result {
        if std::env::var_os("ENGINE_MODEL_TRACE").is_some() {
            eprintln!("  {what}: {error}");
        }
        assert!(
            faults.armed || refused_by_rules(error),
            "{what} failed with a storage error while no fault was injected: {error}"
        );
    }
}

/// Fields drop in order: the engine (and its final checkpoint) before its
/// directory.
struct Run {
    /// `None` only while a restart swaps engines.
    inbox: Option<Inbox>,
    root: tempfile::TempDir,
    /// The data directory of the current engine (each crash restart opens
    /// its image in a fresh directory under `root`).
    dir: PathBuf,
    images: u32,
    io: Arc<FaultyIo>,
    ledger: Ledger,
    armed: bool,
    coverage: Coverage,
    /// Segment files created since the last restart, to count seals.
    segments_at_open: u64,
    /// Segment files (relative to the data directory) present when the
    /// engine opened: every one but each log's last is sealed.
    sealed_at_open: Vec<PathBuf>,
}

impl Run {
    fn new() -> Self {
        let root = super::scratch_dir();
        let dir = root.path().join("data-0");
        let (inbox, io) = open(&dir, "nothing");
        Run {
            root,
            dir,
            images: 0,
            inbox: Some(inbox),
            io,
            ledger: Ledger::default(),
            armed: false,
            coverage: Coverage {
                cases: 1,
                ..Coverage::default()
            },
            segments_at_open: 0,
            sealed_at_open: Vec::new(),
        }
    }

    fn faults(&self) -> Faults {
        Faults {
            armed: self.armed,
            fired_before: self.io.failures_fired() > 0,
        }
    }

    /// A write was acknowledged: no injected failure may have fired before
    /// or while it was made.
    fn acknowledged(&self, what: &str) {
        assert!(
            self.io.segment_failures_fired() == 0,
            "{what} acknowledged after an injected IO failure fired on a log segment"
        );
    }

    fn count_seals(&mut self) {
        let files = segment_files(&self.dir);
        // Each log starts with one active segment; every one after it
        // sealed the one before (compaction's drops only lower the count,
        // so this undercounts, never overcounts).
        self.coverage.segments_sealed += files.saturating_sub(self.segments_at_open.max(2));
        self.segments_at_open = files.max(2);
    }

    fn restart(&mut self, how: Restart) {
        self.count_seals();
        self.coverage.injected_failures_fired += self.io.failures_fired();
        let next = match how {
            Restart::Clean => None,
            Restart::Kill | Restart::PowerCut(_) => {
                self.images += 1;
                Some(self.root.path().join(format!("data-{}", self.images)))
            }
        };
        match (how, &next) {
            (Restart::Clean, _) | (_, None) => self.coverage.clean_restarts += 1,
            (Restart::Kill, Some(image)) => {
                copy_tree(&self.dir, image);
                self.coverage.kill_restarts += 1;
            }
            (Restart::PowerCut(seed), Some(image)) => {
                std::fs::create_dir_all(image).expect("create an image directory");
                // Segments sealed before this engine opened are read
                // without the IO layer, which therefore does not track
                // them; they were durable then and are never written again.
                for relative in &self.sealed_at_open {
                    let from = self.dir.join(relative);
                    if from.exists() {
                        let to = image.join(relative);
                        std::fs::create_dir_all(to.parent().expect("a log directory"))
                            .expect("create an image log directory");
                        std::fs::copy(&from, &to).expect("copy a sealed segment");
                    }
                }
                self.io
                    .crash_image_tree(&self.dir, image, Some(seed))
                    .expect("write a power-cut image");
                copy_renamed_checkpoints(&self.dir, image);
                self.coverage.power_cut_restarts += 1;
            }
        }
        // After a crash the old engine stops as a killed process would,
        // with no final checkpoint (nothing reads its directory again);
        // a clean restart shuts it down, checkpoint and all.
        let old = self.inbox.take().expect("an open engine");
        if next.is_some() {
            old.halt();
        }
        drop(old);
        if let Some(image) = next {
            let _ = std::fs::remove_dir_all(&self.dir);
            self.dir = image;
        }
        let (inbox, io) = open(&self.dir, &format!("a {how:?} restart"));
        self.inbox = Some(inbox);
        self.io = io;
        self.armed = false;
        let report = self.inbox().recovery_report();
        if report.checkpoint_lsn > 0 && report.records_replayed > 0 {
            self.coverage.replays_after_checkpoint += 1;
        }
        self.segments_at_open = segment_files(&self.dir);
        self.sealed_at_open = segment_paths(&self.dir);
        check_durable(self.inbox(), &self.ledger);
    }

    fn inbox(&self) -> &Inbox {
        self.inbox.as_ref().expect("an open engine")
    }

    /// Ends a case with a kill, so every case checks recovery without a
    /// shutdown checkpoint at least once (clean restarts come from the
    /// input).
    fn finish(mut self) -> Coverage {
        self.restart(Restart::Kill);
        self.coverage.acknowledged_sends = self.ledger.sends.len() as u64;
        self.coverage.recalls = self.ledger.recalled.len() as u64;
        self.coverage
    }
}

/// Clears `uid`'s marker of `conv` at the version it shows, if dirty: the
/// clear must succeed (nothing else runs meanwhile) and the marker go.
fn clear_dirty(run: &mut Run, uid: Uid, conv: ConvId) {
    let faults = run.faults();
    let markers = run.inbox().dirty_markers(uid);
    allowed(&markers, faults, "dirty_markers");
    let Some(marker) = markers
        .ok()
        .and_then(|ms| ms.into_iter().find(|m| m.conv == conv))
    else {
        return;
    };
    let reply = run.inbox().clear_dirty(uid, conv, marker.version).wait();
    allowed(&reply, faults, "clear_dirty");
    let Ok(cleared) = reply else {
        return;
    };
    run.acknowledged("clear_dirty");
    assert_eq!(
        cleared, marker.target_msg_seq,
        "cleared elsewhere than the target"
    );
    let after = run.inbox().dirty_markers(uid).expect("dirty_markers");
    assert!(
        after.iter().all(|m| m.conv != conv),
        "marker ({uid}, {conv}) is still dirty after its clear: {after:?}"
    );
    run.ledger.clears.insert((uid, conv), cleared);
    run.coverage.marker_clears += 1;
}

/// Syncs `device` to the end of a batch in pages of `limit` and ACKs it.
/// With an odd `limit` each later page's `SYNC` carries the ACK of the
/// page before ([`SyncOptions::ack_through`]), which nobody waits for;
/// the last page's ACK is awaited either way.
fn sync_and_ack(run: &mut Run, uid: Uid, device: DeviceId, limit: u32) {
    let key = (uid, device);
    let Some(&generation) = run.ledger.generations.get(&key) else {
        return;
    };
    let faults = run.faults();
    let acked = run.ledger.acks.get(&key).copied().unwrap_or(SyncSeq(0));
    let carry = limit % 2 == 1;
    let mut request = SyncRequest {
        uid,
        device,
        generation: Some(generation),
        local_applied_seq: acked,
        limit,
        batch_token: None,
    };
    let mut carried = None;
    let mut pages = 0;
    loop {
        let options = SyncOptions {
            ack_through: carried,
            ..SyncOptions::default()
        };
        let page = run.inbox().sync_with(request.clone(), options).wait();
        allowed(&page, faults, "sync");
        let Ok(page) = page else {
            return;
        };
        if carried.is_some() {
            run.coverage.carried_acks += 1;
        }
        check_reported_ack(&run.ledger, key, &page);
        pages += 1;
        run.ledger.generations.insert(key, page.generation);
        if page.has_more {
            request.generation = Some(page.generation);
            request.local_applied_seq = page.next_cursor;
            request.batch_token = Some(page.batch_token);
            carried = carry.then_some(page.next_cursor);
            if let Some(seq) = carried {
                run.ledger.ask(key, seq);
            }
            continue;
        }
        if pages > 1 {
            run.coverage.multi_page_syncs += 1;
        }
        if page.next_cursor > page.acked_sync_seq {
            let reply = run
                .inbox()
                .ack(AckRequest {
                    uid,
                    device,
                    generation: page.generation,
                    seq: page.next_cursor,
                    batch_token: page.batch_token.clone(),
                })
                .wait();
            run.ledger.ask(key, page.next_cursor);
            allowed(&reply, faults, "ack");
            if let Ok(reply) = reply {
                assert!(
                    reply.acked_sync_seq >= acked,
                    "ack moved device {key:?} back from {acked} to {}",
                    reply.acked_sync_seq
                );
                if reply.acked_sync_seq > acked {
                    run.acknowledged("ack");
                    run.coverage.acks += 1;
                }
                run.ledger.acks.insert(key, reply.acked_sync_seq);
            }
        }
        if let Some(lease) = page.lease {
            let finished = run
                .inbox()
                .finish_lease(uid, device, lease.lease_id, page.generation)
                .wait();
            allowed(&finished, faults, "finish_lease");
        }
        return;
    }
}

/// A page reports an ACK the device asked for and that is durable: never
/// below one it was told is durable, never above the highest it asked
/// for (an ACK still in its round may be reported as the one before it).
fn check_reported_ack(ledger: &Ledger, key: (Uid, DeviceId), page: &SyncPage) {
    let durable = ledger.acks.get(&key).copied().unwrap_or(SyncSeq(0));
    let asked = ledger.asked.get(&key).copied().unwrap_or(SyncSeq(0));
    assert!(
        page.acked_sync_seq >= durable && page.acked_sync_seq <= asked.max(durable),
        "device {key:?}: a page reports ACK {} with {durable} acknowledged and {asked} asked for",
        page.acked_sync_seq
    );
}

/// Every `msg_seq` of `conv` that `uid` may read (its membership periods),
/// paging back to the start; empty when `uid` was never a member.
fn history_seqs(inbox: &Inbox, uid: Uid, conv: ConvId) -> Vec<MsgSeq> {
    let mut seqs = Vec::new();
    let mut before = None;
    loop {
        let Ok(page) = inbox.history(uid, conv, before, 100) else {
            return seqs;
        };
        seqs.extend(page.messages.iter().map(|m| m.msg_seq));
        match page.messages.last() {
            Some(last) if page.has_more => before = Some(last.msg_seq),
            _ => return seqs,
        }
    }
}

/// Everything acknowledged is served after a restart.
fn check_durable(inbox: &Inbox, ledger: &Ledger) {
    for send in &ledger.sends {
        let page = inbox
            .history(send.sender, send.conv, Some(send.msg_seq.next()), 1)
            .unwrap_or_else(|e| panic!("history for acknowledged {send:?}: {e}"));
        let Some(message) = page.messages.first() else {
            panic!("acknowledged send {send:?} is missing");
        };
        assert_eq!(
            (message.msg_seq, message.msg_id),
            (send.msg_seq, send.msg_id),
            "acknowledged send is not at its seq"
        );
        if ledger.recalled.contains(&send.msg_id) {
            assert!(
                message.tombstone && message.payload.is_empty(),
                "recalled {send:?} is served with a body"
            );
        } else if !message.tombstone && !send.payload.is_empty() {
            assert_eq!(message.payload, send.payload, "body of {send:?} changed");
        }
    }
    // Each member reads only its own periods; together they cover every
    // record from the first join on.
    for (&conv, &head) in &ledger.head {
        let seqs: std::collections::BTreeSet<MsgSeq> = (1..=USERS)
            .flat_map(|uid| history_seqs(inbox, Uid(uid), conv))
            .collect();
        let top = seqs.last().copied().unwrap_or(MsgSeq(0));
        assert!(
            top >= head,
            "conv {conv}: history ends at {top}, below the acknowledged {head}"
        );
        let seqs: Vec<MsgSeq> = seqs.into_iter().collect();
        let expected: Vec<MsgSeq> = MsgSeq(1).through(top).collect();
        assert_eq!(seqs, expected, "conv {conv}: msg_seqs are not 1..={top}");
    }
    for (&(uid, conv), &read_seq) in &ledger.reads {
        let list = inbox.conv_list(uid, 100, None).expect("conv_list");
        let row = list.convs.iter().find(|c| c.conv == conv);
        assert!(
            row.is_some_and(|c| c.read_seq >= read_seq),
            "read cursor ({uid}, {conv}) was acknowledged at {read_seq}, now {row:?}"
        );
    }
    for (&(uid, conv), &cleared) in &ledger.clears {
        let marker = inbox.conv_mode(conv, Some(uid)).expect("conv_mode").marker;
        assert!(
            marker.is_some_and(|m| m.cleared_seq >= cleared),
            "marker ({uid}, {conv}) was cleared at {cleared}, now {marker:?}"
        );
    }
    for (&(uid, device), &acked) in &ledger.acks {
        let devices = inbox.devices(uid).expect("devices");
        let row = devices.iter().find(|d| d.device == device);
        // A device evicted by the cap keeps no cursor to compare.
        if let Some(row) = row.filter(|d| d.state != DeviceState::Revoked) {
            assert!(
                row.acked_sync_seq >= acked,
                "device ({uid}, {device}) ACK was acknowledged at {acked}, now {}",
                row.acked_sync_seq
            );
        }
    }
}

/// An operation handed to the engine and not yet answered. Runs of
/// operations that need no answer to be chosen are submitted together
/// (see [`pipelines`]), so the engine decides them in one round as it
/// does under concurrent clients; each is then checked in order.
enum InFlight {
    Membership {
        conv: ConvId,
        faults: Faults,
        /// The conversation's head before, read from the engine when the
        /// ledger's is unsure.
        head_before: Option<MsgSeq>,
        reply: Pending<MembershipReply>,
    },
    Send {
        conv: ConvId,
        sender: Uid,
        client_msg_id: ClientMsgId,
        payload: Bytes,
        faults: Faults,
        reply: Pending<SendReply>,
    },
    Recall {
        conv: ConvId,
        target: MsgId,
        faults: Faults,
        reply: Pending<SendReply>,
    },
    MarkRead {
        uid: Uid,
        conv: ConvId,
        faults: Faults,
        /// The cursor before, read from the engine when a failed mark
        /// may have moved it past the ledger's.
        cursor_before: Option<MsgSeq>,
        reply: Pending<ReadReply>,
    },
    Register {
        uid: Uid,
        device: DeviceId,
        faults: Faults,
        reply: Pending<RegisterReply>,
    },
}

/// Whether `op` may join the operations in flight. Only while no fault is
/// armed: a failure's effect on the ledger depends on which operation it
/// hit. A join or leave of a conversation whose head is unsure needs its
/// own count of syncs to tell an answer from a write.
fn pipelines(run: &Run, op: &Op) -> bool {
    if run.armed {
        return false;
    }
    match *op {
        Op::Join(conv, _) | Op::Leave(conv, _) => !run.ledger.head_unsure.contains(&conv),
        Op::Send(..) | Op::Recall(..) | Op::MarkRead(..) | Op::Register(..) => true,
        _ => false,
    }
}

/// Hands `op` to the engine; `None` when it has nothing to do.
fn submit(run: &mut Run, i: usize, op: Op) -> Option<InFlight> {
    let faults = run.faults();
    let inbox = run.inbox.as_ref().expect("an open engine");
    Some(match op {
        Op::Join(conv, uid) | Op::Leave(conv, uid) => InFlight::Membership {
            conv,
            faults,
            head_before: run
                .ledger
                .head_unsure
                .contains(&conv)
                .then(|| engine_head(inbox, conv)),
            reply: if matches!(op, Op::Join(..)) {
                inbox.join(uid, conv)
            } else {
                inbox.leave(uid, conv)
            },
        },
        Op::Send(conv, sender, client_msg_id, size) => {
            // Run on this thread when nothing is queued ahead (else
            // queued all the same): the path a daemon takes for a
            // connection alone.
            let here = size % 2 == 1;
            // Bodies of 12 to 400 bytes: enough to seal 4 KiB segments
            // within a few dozen operations. The first send of a key fixes
            // its body, so that a retry is the same request (a different
            // body under a used key is CONFLICT).
            let size = *run
                .ledger
                .body_size
                .entry((sender, client_msg_id))
                .or_insert(size);
            let payload = Bytes::from(format!("m-{sender}-{client_msg_id}-").repeat(1 + size % 32));
            let request = SendRequest {
                conv,
                sender,
                client_msg_id,
                msg_type: 1,
                payload: payload.clone(),
            };
            let reply = if here {
                inbox.send_here(request)
            } else {
                inbox.send(request)
            };
            if here && reply.is_released() {
                run.coverage.sends_run_here += 1;
            }
            InFlight::Send {
                conv,
                sender,
                client_msg_id,
                payload,
                faults,
                reply,
            }
        }
        Op::Recall(conv, sender, pick) => {
            // A target among the sends acknowledged so far (not those
            // still in flight beside it).
            let own: Vec<MsgId> = run
                .ledger
                .sends
                .iter()
                .filter(|s| s.conv == conv && s.sender == sender)
                .map(|s| s.msg_id)
                .collect();
            if own.is_empty() {
                return None;
            }
            let target = own[pick % own.len()];
            InFlight::Recall {
                conv,
                target,
                faults,
                reply: inbox.recall(RecallRequest {
                    conv,
                    sender,
                    client_msg_id: 1_000_000 + i as u128,
                    target,
                }),
            }
        }
        Op::MarkRead(uid, conv) => {
            let head = run.ledger.head.get(&conv).copied().unwrap_or(MsgSeq(0));
            InFlight::MarkRead {
                uid,
                conv,
                faults,
                cursor_before: run
                    .ledger
                    .reads_unsure
                    .contains(&(uid, conv))
                    .then(|| engine_cursor(inbox, uid, conv)),
                reply: inbox.mark_read(uid, conv, head),
            }
        }
        Op::Register(uid, device) => InFlight::Register {
            uid,
            device,
            faults,
            reply: inbox.register_device(uid, device),
        },
        _ => unreachable!("{op:?} is not submitted"),
    })
}

/// Waits for an operation's answer and checks it against the ledger.
fn settle(run: &mut Run, in_flight: InFlight) {
    match in_flight {
        InFlight::Membership {
            conv,
            faults,
            head_before,
            reply,
        } => membership(run, conv, faults, head_before, reply.wait()),
        InFlight::Send {
            conv,
            sender,
            client_msg_id,
            payload,
            faults,
            reply,
        } => send(
            run,
            conv,
            sender,
            client_msg_id,
            payload,
            faults,
            reply.wait(),
        ),
        InFlight::Recall {
            conv,
            target,
            faults,
            reply,
        } => recall(run, conv, target, faults, reply.wait()),
        InFlight::MarkRead {
            uid,
            conv,
            faults,
            cursor_before,
            reply,
        } => mark_read(run, (uid, conv), faults, cursor_before, reply.wait()),
        InFlight::Register {
            uid,
            device,
            faults,
            reply,
        } => {
            let reply = reply.wait();
            allowed(&reply, faults, "register");
            if let Ok(reply) = reply {
                run.ledger
                    .generations
                    .insert((uid, device), reply.device.generation);
                if let Some(evicted) = reply.evicted {
                    run.ledger.generations.remove(&(uid, evicted));
                }
            }
        }
    }
}

fn membership(
    run: &mut Run,
    conv: ConvId,
    faults: Faults,
    head_before: Option<MsgSeq>,
    reply: Result<MembershipReply>,
) {
    allowed(&reply, faults, "join/leave");
    match reply {
        Ok(reply) => {
            // Joining as a member answers with the open period's join seq
            // (idempotent); only a new record takes a seq.
            let head = run.ledger.head.get(&conv).copied().unwrap_or(MsgSeq(0));
            match head_before {
                // The ledger's head is unsure: operations failed under a
                // fault may have landed. The engine's head before says
                // whether this answer made a record (exactly the next
                // seq) or came from the open period of a join that
                // landed, without a write, which a stopped engine may do.
                Some(before) if reply.msg_seq > before => {
                    run.acknowledged("join/leave");
                    assert_eq!(
                        reply.msg_seq,
                        before.next(),
                        "conv {conv}: a new membership record does not follow the head {before}"
                    );
                    run.ledger.head_unsure.remove(&conv);
                    run.ledger.head.insert(conv, reply.msg_seq);
                }
                Some(_) => {
                    let h = run.ledger.head.entry(conv).or_default();
                    *h = (*h).max(reply.msg_seq);
                }
                None if reply.msg_seq > head => {
                    run.acknowledged("join/leave");
                    run.ledger.took_seq(conv, reply.msg_seq);
                }
                None => {}
            }
        }
        Err(_) if faults.armed => run.ledger.may_have_landed(conv),
        Err(_) => {}
    }
}

/// The newest `msg_seq` of `conv` any user can read: its head, as the
/// engine holds it (each record is readable by the member who made it).
fn engine_head(inbox: &Inbox, conv: ConvId) -> MsgSeq {
    (1..=USERS)
        .filter_map(|uid| inbox.history(Uid(uid), conv, None, 1).ok())
        .filter_map(|page| page.messages.first().map(|m| m.msg_seq))
        .max()
        .unwrap_or(MsgSeq(0))
}

/// `uid`'s read cursor of `conv`, as the engine holds it.
fn engine_cursor(inbox: &Inbox, uid: Uid, conv: ConvId) -> MsgSeq {
    inbox
        .conv_list(uid, 100, None)
        .ok()
        .and_then(|list| list.convs.into_iter().find(|c| c.conv == conv))
        .map_or(MsgSeq(0), |c| c.read_seq)
}

/// A read mark moves the cursor only forward. A mark that failed under a
/// fault may still have reached the disk; a later mark at or below that
/// cursor is answered from it without a write, which a stopped engine may
/// do. For such a cursor the engine's cursor before the mark says whether
/// this one moved it.
fn mark_read(
    run: &mut Run,
    key: (Uid, ConvId),
    faults: Faults,
    cursor_before: Option<MsgSeq>,
    reply: Result<ReadReply>,
) {
    allowed(&reply, faults, "mark_read");
    match reply {
        Ok(reply) => {
            let before = run.ledger.reads.get(&key).copied().unwrap_or(MsgSeq(0));
            assert!(reply.read_seq >= before, "read cursor moved back");
            if reply.read_seq > cursor_before.unwrap_or(before) {
                run.acknowledged("mark_read");
            }
            run.ledger.reads.insert(key, reply.read_seq);
        }
        Err(_) if faults.armed => {
            run.ledger.reads_unsure.insert(key);
        }
        Err(_) => {}
    }
}

#[allow(clippy::too_many_arguments)] // one operation's fields, as submitted
fn send(
    run: &mut Run,
    conv: ConvId,
    sender: Uid,
    client_msg_id: ClientMsgId,
    payload: Bytes,
    faults: Faults,
    reply: Result<SendReply>,
) {
    allowed(&reply, faults, "send");
    let reply = match reply {
        Ok(reply) => reply,
        Err(_) => {
            if faults.armed {
                run.ledger.uncertain.insert((sender, client_msg_id));
                run.ledger.may_have_landed(conv);
            }
            return;
        }
    };
    let earlier = run.ledger.by_key.get(&(sender, client_msg_id)).copied();
    match earlier {
        Some(ids) => {
            assert!(reply.duplicate, "a retried send made a second message");
            assert_eq!((reply.msg_id, reply.msg_seq), ids, "retry changed ids");
            run.coverage.retries_answered_duplicate += 1;
        }
        None if reply.duplicate => {
            // Only a first attempt that failed under a fault may have
            // reached the disk unacknowledged; this reply acknowledges it.
            assert!(
                run.ledger.uncertain.contains(&(sender, client_msg_id)),
                "duplicate reported for a key never sent"
            );
            let head = run.ledger.head.entry(conv).or_default();
            *head = (*head).max(reply.msg_seq);
            // Its body is unknown to the ledger: empty means "any".
            run.ledger
                .acknowledge_send(conv, sender, client_msg_id, reply, Bytes::new());
        }
        None => {
            run.acknowledged("send");
            run.ledger.took_seq(conv, reply.msg_seq);
            run.ledger
                .acknowledge_send(conv, sender, client_msg_id, reply, payload);
        }
    }
}

fn recall(run: &mut Run, conv: ConvId, target: MsgId, faults: Faults, reply: Result<SendReply>) {
    allowed(&reply, faults, "recall");
    match reply {
        Ok(reply) => {
            run.acknowledged("recall");
            run.ledger.took_seq(conv, reply.msg_seq);
            run.ledger.recalled.insert(target);
        }
        Err(_) if faults.armed => run.ledger.may_have_landed(conv),
        Err(_) => {}
    }
}

/// Runs one fuzz case; panics on any disagreement.
pub fn check(data: &[u8]) {
    let ops = decode(data);
    // `ENGINE_MODEL_TRACE=1` prints each operation, to read a finding.
    let trace = std::env::var_os("ENGINE_MODEL_TRACE").is_some();
    let mut run = Run::new();
    let mut in_flight = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if trace {
            eprintln!(
                "op {i}: {op:?} (failures fired {}, in flight {})",
                run.io.failures_fired(),
                in_flight.len()
            );
        }
        if pipelines(&run, op) {
            in_flight.extend(submit(&mut run, i, *op));
            run.coverage.operations += 1;
            if in_flight.len() >= IN_FLIGHT_MAX {
                settle_all(&mut run, &mut in_flight);
            }
            continue;
        }
        settle_all(&mut run, &mut in_flight);
        let faults = run.faults();
        match *op {
            Op::Join(..)
            | Op::Leave(..)
            | Op::Send(..)
            | Op::Recall(..)
            | Op::MarkRead(..)
            | Op::Register(..) => {
                if let Some(one) = submit(&mut run, i, *op) {
                    settle(&mut run, one);
                }
            }
            Op::ClearDirty(uid, conv) => clear_dirty(&mut run, uid, conv),
            Op::SyncAck(uid, device, limit) => sync_and_ack(&mut run, uid, device, limit),
            Op::FailSyncAfter(n) => {
                run.io.fail_nth_sync(n);
                run.armed = true;
            }
            Op::Compact => {
                let report = run.inbox().compact();
                allowed(&report, faults, "compact");
                if let Ok(report) = report {
                    run.coverage.segments_dropped += report.segments_dropped;
                    run.coverage.segments_rewritten += report.segments_rewritten;
                    run.coverage.events_reclaimed += report.events_reclaimed;
                }
            }
            Op::Checkpoint => {
                let done = run.inbox().checkpoint();
                allowed(&done, faults, "checkpoint");
            }
            Op::Restart(how) => run.restart(how),
        }
        run.coverage.operations += 1;
        // Once an injected failure has fired, the engine stays stopped: an
        // acknowledged write after it already failed `Run::acknowledged`.
        if faults.fired_before && !matches!(op, Op::Restart(_)) {
            run.coverage.operations_after_failure += 1;
        }
        check_segment_refs(&run);
    }
    settle_all(&mut run, &mut in_flight);
    run.finish().add_to_totals();
}

/// Operations submitted together at most: enough for several rounds.
const IN_FLIGHT_MAX: usize = 32;

/// Checks every operation in flight, in the order it was submitted.
fn settle_all(run: &mut Run, in_flight: &mut Vec<InFlight>) {
    if in_flight.len() > 1 {
        run.coverage.operations_submitted_together += in_flight.len() as u64;
    }
    if in_flight.is_empty() {
        return;
    }
    for one in in_flight.drain(..) {
        settle(run, one);
    }
    check_segment_refs(run);
}

/// The per-segment counts compaction decides by match the index.
fn check_segment_refs(run: &Run) {
    if let Err(e) = run.inbox().check_segment_refs() {
        panic!("segment reference counts drifted: {e}");
    }
}
