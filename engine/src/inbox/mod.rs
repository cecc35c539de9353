//! The inbox: a deterministic state machine over two segment logs, and the
//! embedded [`Inbox`] API.
//!
//! Mutations are commands applied by one sequencer thread in order; a reply
//! is released only once the batch holding the command is durable. Reads go
//! straight to the in-memory indexes and the segment files and never serve
//! anything above the committed high watermark.
//!
//! Threads besides the logs' writers: the sequencer, the checkpoint writer
//! (files are written off the sequencer, in LSN order), the snapshot builder
//! (content is built whether or not the caller still waits) and, if
//! configured, the compaction pass. [`Inbox::shutdown`] stops taking
//! commands, lets the sequencer hand off the final checkpoint and joins them
//! all once it is durable. The completion stage, which releases replies, has
//! no thread: it runs on the thread that made a round durable (the
//! sequencer, which writes its own rounds, or the `evt` writer).
//!
//! The floor plan, top down. It is written once, as `LAYERS` in
//! `engine/tests/inbox_layering.rs`, which fails on any use of a unit in
//! the same layer or above (its `EXCEPTIONS` list is empty):
//! - this file: the [`Inbox`] API's commands and reads, which it turns
//!   into commands and into the subsystems' read functions; [`read_api`],
//!   [`inspect`] hold more of its methods;
//! - [`replica`] and [`salvage`]: replication, and the offline copy of a
//!   damaged directory's intact data (with their `impl Inbox` blocks);
//! - [`handle`]: the [`Inbox`] struct itself, opening a store, handing a
//!   command to the sequencer, stopping; every `impl Inbox` block above
//!   uses it;
//! - [`sequencer`]: the generic round-and-commit engine, and its
//!   completion stage; it runs any [`round::Exec`] and names no
//!   messaging, devices, snapshots or compaction type;
//! - [`command`]: the engine's commands, one variant per subsystem, and
//!   what they need besides the state (the snapshot builder's queue);
//! - the subsystems' commands, decide functions and reads: [`compaction`]
//!   (whose pass hands its requests to whoever holds the sequencer, like
//!   this API), [`snapshots`], [`devices`], [`messaging`], and [`fanout`]
//!   below messaging, whose send path calls its hook;
//! - [`round`]: what a decision hands the sequencer; [`pending`] above
//!   [`read`]: a reply to wait for, then the read it leaves; [`shared`]:
//!   what the sequencer, the completion stage and readers share, with
//!   what it holds of the sequencer below it (the completion stage's
//!   queue, `sequencer/completion_queue.rs`, and a leader's link and
//!   entries, `replica/link.rs`);
//! - [`recover`] above [`consistency`] (the check of every location it
//!   recovered), [`checkpoint`]: replay and checkpoints (R22);
//! - [`effect`]: one `evt` record variant per subsystem and the one
//!   `apply`; below it each subsystem's `record.rs` (its record kinds);
//! - [`state`]: the tables, with their invariants; below it each
//!   subsystem's `rows.rs`, the row types the tables hold (messaging's
//!   include the user, which holds the devices' and snapshots' rows);
//! - [`containers`]: generic compact containers; [`codec`], [`token`],
//!   [`config`]: byte helpers, batch tokens, the configuration; [`frames`]:
//!   the walk of a damaged frame's records (salvage, recovery); [`reply`]:
//!   how replies travel;
//! - `crate::log`: the segment logs, which know nothing of the inbox.
//!
//! `docs/ARCHITECTURE.md` draws the same plan with the path of one send.
//!
//! One argument order holds for every method of [`Inbox`] and every
//! subsystem command: the acting user first (`uid`, or `sender` in a
//! request), then the device or the conversation it acts on, then the
//! rest (`join(uid, conv)`, `mark_read(uid, conv, seq)`,
//! `ack_snapshot(uid, device, snapshot_id, generation)`). The identifiers
//! are distinct types, so a call with two of them swapped does not compile.

mod checkpoint;
mod codec;
mod command;
mod compaction;
mod config;
mod consistency;
mod containers;
mod devices;
mod effect;
mod fanout;
mod frames;
mod handle;
mod inspect;
pub mod kinds;
mod messaging;
mod pending;
mod read;
mod read_api;
mod recover;
mod replica;
mod reply;
mod round;
mod salvage;
mod sequencer;
mod shared;
mod snapshots;
/// How snapshot pages are cut to fit a reply frame (sizes in the wire
/// layout, checked against the codec by the server's tests).
pub use snapshots::paging as snapshot_paging;
mod state;
mod token;

pub use compaction::{CompactionStep, SpaceUsage};
pub use config::{Clock, InboxConfig, ManualClock, SystemClock};
pub use fanout::rows::{FanoutMessage, OutboxEntry, Recipient};
pub use fanout::slot::{
    slot, slot_of_conv, slot_of_uid, GroupId, Placement, PlacementError, Slot, SlotRange, SLOTS,
};
pub use fanout::{
    DeliverReply, FanoutStatus, InboundStatus, OutboxBatch, OutboxStatus, OUTBOX_READ_MAX,
};
pub use handle::{verify_data_dir, Inbox};
pub use pending::Pending;
pub use read::Read;
pub use recover::RecoveryReport;
pub use replica::{
    copy_top_files, exchange_dirs, image_info, stage_image, Entry, Image, ImageCheck, ImageInfo,
    Leader,
};
pub use salvage::{salvage, Damage, LostEvents, LostMessages, RaisedFloor, SalvageReport};
pub use shared::{Hint, LargeGroupHint};

use std::sync::{mpsc, Arc};

use bytes::Bytes;

use crate::api::*;
use crate::error::{Error, Result};
use messaging::record::{summary_for, StoredPayload, MESSAGE_OVERHEAD_MAX};

impl Inbox {
    /// The configuration this store was opened with (the daemon announces
    /// its limits to clients).
    pub fn config(&self) -> &InboxConfig {
        &self.shared.config
    }

    /// The largest payload a send may carry: `payload_bytes_max`, or less
    /// when segments are so small that one message's records (its `msg`
    /// record and its `evt` record, at most [`MESSAGE_OVERHEAD_MAX`] besides
    /// the payload) would not fit the bytes one round may gather.
    pub fn payload_limit(&self) -> u64 {
        let round = round::round_bytes_max(self.shared.config.segment_bytes);
        u64::from(self.shared.config.payload_bytes_max)
            .min(round.saturating_sub(MESSAGE_OVERHEAD_MAX))
    }

    /// Joins `uid` to `conv` (creating the conversation on its first
    /// join). Joining while already a member returns the open period.
    pub fn join(&self, uid: Uid, conv: ConvId) -> Pending<MembershipReply> {
        self.submit(|tx| messaging::Command::Join { uid, conv, tx })
    }
    /// Ends `uid`'s membership period in `conv`.
    pub fn leave(&self, uid: Uid, conv: ConvId) -> Pending<MembershipReply> {
        self.submit(|tx| messaging::Command::Leave { uid, conv, tx })
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the three send flavours share one path"
    )]
    fn send_kind(
        &self,
        sender: Uid,
        conv: ConvId,
        kind: MessageKind,
        client_msg_id: ClientMsgId,
        msg_type: MsgType,
        target: MsgId,
        payload: &Bytes,
        here: bool,
    ) -> Pending<SendReply> {
        let limit = self.payload_limit();
        if payload.len() as u64 > limit {
            return Pending::ready(Err(Error::TooLarge {
                size: payload.len() as u64,
                limit,
            }));
        }
        // Compression and the summary are built here, on the caller's
        // thread, so the sequencer only copies bytes.
        let stored = StoredPayload::new(payload);
        let summary = summary_for(kind, payload, target, sender);
        let make = |tx| messaging::Command::Send {
            sender,
            conv,
            kind,
            client_msg_id,
            msg_type,
            target,
            payload: stored,
            summary,
            tx,
        };
        self.submit_or_run_here(make, here)
    }

    pub fn send(&self, req: SendRequest) -> Pending<SendReply> {
        self.send_normal(req, false)
    }
    /// [`Inbox::send`], decided and committed on the calling thread when
    /// the sequencer is between rounds and nothing is queued ahead: the
    /// caller then blocks for the round's write and fdatasync, and the
    /// returned reply is ready (unless the log's writer thread was busy
    /// and commits it). That saves the two hand-offs of a queued send
    /// (to the sequencer's thread and back), each a wake-up of a sleeping
    /// thread. Otherwise it is queued as by `send`. Meant for a caller
    /// that is the only one writing at the moment: whatever else its
    /// thread serves waits for the disk meanwhile.
    pub fn send_here(&self, req: SendRequest) -> Pending<SendReply> {
        self.send_normal(req, true)
    }
    fn send_normal(&self, req: SendRequest, here: bool) -> Pending<SendReply> {
        self.send_kind(
            req.sender,
            req.conv,
            MessageKind::Normal,
            req.client_msg_id,
            req.msg_type,
            MsgId(0),
            &req.payload,
            here,
        )
    }
    pub fn recall(&self, req: RecallRequest) -> Pending<SendReply> {
        self.send_kind(
            req.sender,
            req.conv,
            MessageKind::Recall,
            req.client_msg_id,
            0,
            req.target,
            &Bytes::new(),
            false,
        )
    }
    pub fn edit(&self, req: EditRequest) -> Pending<SendReply> {
        self.send_kind(
            req.sender,
            req.conv,
            MessageKind::Edit,
            req.client_msg_id,
            0,
            req.target,
            &req.payload,
            false,
        )
    }
    pub fn register_device(&self, uid: Uid, device: DeviceId) -> Pending<RegisterReply> {
        self.submit(|tx| devices::Command::Register { uid, device, tx })
    }
    pub fn revoke_device(&self, uid: Uid, device: DeviceId) -> Pending<DeviceInfo> {
        self.submit(|tx| devices::Command::Revoke { uid, device, tx })
    }
    /// Every registered device of `uid`, revoked ones included.
    pub fn devices(&self, uid: Uid) -> Result<Vec<DeviceInfo>> {
        devices::read::devices(&self.shared, uid)
    }
    /// R9/R10. A `limit` of 0 means the default page size.
    ///
    /// A sync that may bump the device's generation (recovery lease or
    /// `RESET_REQUIRED`) or refresh its `last_seen` goes through the
    /// sequencer; one that changes nothing is answered from durable state
    /// on the caller's thread, without waiting for any round's fsync.
    pub fn sync(&self, req: SyncRequest) -> Pending<SyncPage> {
        self.sync_with(req, SyncOptions::default())
    }
    /// [`Inbox::sync`] with the device's [`SyncOptions`] (a replay limit,
    /// events without summaries).
    pub fn sync_with(&self, req: SyncRequest, options: SyncOptions) -> Pending<SyncPage> {
        let now = self.now_ms();
        let claims = match &req.batch_token {
            None => None,
            Some(t) => match token::verify(&self.shared.config.token_key, t, now) {
                Ok(c) => Some(c),
                Err(e) => return Pending::ready(Err(e)),
            },
        };
        // Checked now, as `ACK` checks it: an ACK that `ACK` would refuse
        // fails the sync, and nothing changes. Queued only with a page the
        // sync serves.
        let ack = match self.carried_ack(&req, &options, claims.as_ref(), now) {
            Ok(ack) => ack,
            Err(e) => return Pending::ready(Err(e)),
        };
        // After shutdown every sync gets the sequencer's "shut down" answer.
        if self.tx.lock().is_some() {
            match devices::read::sync_unchanged(&self.shared, now, &req, &options, claims.as_ref())
            {
                Some(Err(e)) => return Pending::ready(Err(e)),
                Some(Ok((plan, touch))) => {
                    if let Some((req, claims)) = ack {
                        // Nobody waits for it; its round decides it again.
                        drop(self.submit(|tx| devices::Command::Ack { req, claims, tx }));
                    }
                    if touch {
                        // Logged on its own; nobody waits for it, and a
                        // failure loses only a `last_seen` refresh.
                        let pending = self.shared.touches.begin(req.uid);
                        drop(self.submit(|tx| devices::Command::Touch {
                            uid: req.uid,
                            device: req.device,
                            generation: plan.generation,
                            tx,
                            pending,
                        }));
                    }
                    let (tx, pending) = Pending::channel();
                    // The receiver is alive in `pending`, so this cannot fail.
                    let _ = tx.send(devices::read::page_reply(Arc::clone(&self.shared), plan));
                    return pending;
                }
                None => {}
            }
        }
        self.submit(|tx| devices::Command::Sync {
            req,
            options,
            claims,
            tx,
        })
    }
    /// The ACK a sync carries ([`SyncOptions::ack_through`]) with its
    /// token's claims, checked against the state as [`Inbox::ack`] checks
    /// it; `None` when there is none, or it is at or below the device's.
    fn carried_ack(
        &self,
        req: &SyncRequest,
        options: &SyncOptions,
        claims: Option<&token::TokenClaims>,
        now: TimestampMs,
    ) -> Result<Option<(AckRequest, token::TokenClaims)>> {
        let (Some(ack), Some(claims)) = (devices::carried_ack(req, options)?, claims) else {
            return Ok(None);
        };
        let (effects, _) =
            devices::decide::decide_ack(&self.shared.state.read(), now, &ack, claims)?;
        Ok((!effects.is_empty()).then_some((ack, *claims)))
    }

    pub fn ack(&self, req: AckRequest) -> Pending<AckReply> {
        let claims = match token::verify(
            &self.shared.config.token_key,
            &req.batch_token,
            self.now_ms(),
        ) {
            Ok(c) => c,
            Err(e) => return Pending::ready(Err(e)),
        };
        self.submit(|tx| devices::Command::Ack { req, claims, tx })
    }
    pub fn finish_lease(
        &self,
        uid: Uid,
        device: DeviceId,
        lease_id: u64,
        generation: Generation,
    ) -> Pending<DeviceInfo> {
        self.submit(|tx| devices::Command::FinishLease {
            uid,
            device,
            lease_id,
            generation,
            tx,
        })
    }
    /// R12. A `per_conv_limit` of 0 means the default (50).
    pub fn pull(
        &self,
        uid: Uid,
        cursors: &[(ConvId, MsgSeq)],
        per_conv_limit: u32,
    ) -> Result<Vec<ConvPull>> {
        messaging::read::pull(&self.shared, uid, cursors, per_conv_limit)
    }
    /// Pages backwards from `before_seq` (exclusive; `None` = from the head).
    pub fn history(
        &self,
        uid: Uid,
        conv: ConvId,
        before_seq: Option<MsgSeq>,
        limit: u32,
    ) -> Result<HistoryPage> {
        messaging::read::history(&self.shared, uid, conv, before_seq, limit)
    }
    pub fn mark_read(&self, uid: Uid, conv: ConvId, read_to_seq: MsgSeq) -> Pending<ReadReply> {
        self.submit(|tx| messaging::Command::MarkRead {
            uid,
            conv,
            read_to_seq,
            tx,
        })
    }
    pub fn set_conv_flags(&self, uid: Uid, conv: ConvId, flags: ConvFlags) -> Pending<()> {
        self.submit(|tx| messaging::Command::Flags {
            uid,
            conv,
            flags,
            tx,
        })
    }
    pub fn conv_list(&self, uid: Uid, limit: u32, cursor: Option<Bytes>) -> Result<ConvListPage> {
        messaging::read::conv_list(&self.shared, uid, limit, cursor)
    }
    /// R7: the user's dirty large groups, by conversation id. Level
    /// triggered: a marker shows until it is cleared.
    pub fn dirty_markers(&self, uid: Uid) -> Result<Vec<DirtyMarker>> {
        messaging::large::dirty_markers(&self.shared, uid)
    }
    /// R7: clears the user's marker of a large group if it is still at
    /// `version` (the client pulled up to the target and stored its
    /// position first); answers the cleared position. A newer entry makes
    /// it [`Error::MarkerMoved`] and the marker stays dirty.
    pub fn clear_dirty(&self, uid: Uid, conv: ConvId, version: u64) -> Pending<MsgSeq> {
        self.submit(|tx| messaging::Command::ClearDirty {
            uid,
            conv,
            version,
            tx,
        })
    }
    /// A conversation's mode (fan-out or large group), durable head and
    /// member count, and `uid`'s marker when given.
    pub fn conv_mode(&self, conv: ConvId, uid: Option<Uid>) -> Result<ConvMode> {
        messaging::large::conv_mode(&self.shared, conv, uid)
    }
    /// R18: in one step, bumps the device's generation, sets it RESETTING
    /// and freezes `base_sync_seq` at the user's sync head; the reply comes
    /// once the snapshot is built and READY. The build runs on the
    /// snapshot-builder thread: dropping the `Pending` does not stop it.
    pub fn begin_snapshot(&self, uid: Uid, device: DeviceId) -> Pending<SnapshotInfo> {
        self.submit(|tx| snapshots::Command::Begin { uid, device, tx })
    }
    pub fn snapshot_info(&self, uid: Uid, snapshot_id: u64) -> Result<SnapshotInfo> {
        snapshots::build::info_of(&self.shared, uid, snapshot_id)
    }
    /// One page of a READY snapshot; pages never change, so an interrupted
    /// install fetches the same bytes again.
    pub fn snapshot_page(&self, uid: Uid, snapshot_id: u64, page: u32) -> Result<SnapshotPage> {
        snapshots::build::page_of(&self.shared, uid, snapshot_id, page)
    }
    /// Finishes an install: the device becomes ACTIVE at `acked = S`, only
    /// if it is still RESETTING in the snapshot's generation.
    pub fn ack_snapshot(
        &self,
        uid: Uid,
        device: DeviceId,
        snapshot_id: u64,
        generation: Generation,
    ) -> Pending<DeviceInfo> {
        self.submit(|tx| snapshots::Command::Ack {
            uid,
            device,
            snapshot_id,
            generation,
            tx,
        })
    }
    /// Runs one compaction pass now (the background task calls the same).
    /// Blocks; call it from a plain thread, not from inside an async
    /// runtime.
    pub fn compact(&self) -> Result<CompactionReport> {
        let submit = |r| match &*self.tx.lock() {
            Some(s) => s.send(handle::compaction_request(r)).is_ok(),
            None => false,
        };
        compaction::pass::pass(&self.shared, &submit)
    }
    /// Tells the engine what the kernel has reclaimed so far
    /// ([`crate::log::reclaims_so_far`]). A server that calls it at least
    /// every [`crate::log::LOOK_VALID_FOR`] lets sync pages whose records
    /// this process wrote since the last reclaim be built from the page
    /// cache where they are asked for (`docs/ARCHITECTURE.md`, "Reading
    /// the hot tail"); without it only the newest segments count as cached.
    /// True when the count moved since an earlier look.
    pub fn observe_page_cache(&self, reclaims: u64) -> bool {
        let evt = self.shared.evt_log.observe_page_cache(reclaims);
        let msg = self.shared.msg_log.observe_page_cache(reclaims);
        evt || msg
    }

    /// What holds `uid`'s events back from compaction (R19).
    pub fn explain(&self, uid: Uid) -> Result<UserExplain> {
        compaction::explain::explain(&self.shared, uid)
    }
    /// What holds a segment (`"evt"` or `"msg"`) back from being dropped.
    pub fn explain_segment(&self, stream: &str, segment: u32) -> Result<SegmentExplain> {
        compaction::explain::explain_segment(&self.shared, stream, segment)
    }
    /// Bytes on disk and bytes still needed per stream.
    #[doc(hidden)]
    pub fn space_usage(&self) -> Result<SpaceUsage> {
        compaction::explain::space_usage(&self.shared)
    }
    /// Calls `hook` between the steps of every compaction pass (crash
    /// tests take an image of the data directory there).
    #[doc(hidden)]
    pub fn set_compaction_hook(&self, hook: Option<Arc<dyn Fn(CompactionStep) + Send + Sync>>) {
        self.shared.compaction.set_hook(hook);
    }
    /// Calls `hook` with the LSN of every checkpoint on the writer thread,
    /// just before its file is written (tests hold the writer there).
    #[doc(hidden)]
    pub fn set_checkpoint_hook(&self, hook: Option<Arc<dyn Fn(u64) + Send + Sync>>) {
        *self.shared.checkpoint_hook.lock() = hook;
    }
    /// Writes an index checkpoint now (R22); returns once its file is
    /// durable. The sequencer only drains and copies the state; the copy is
    /// encoded and written by the checkpoint-writer thread while commands
    /// go on.
    pub fn checkpoint(&self) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        let sent = match &*self.tx.lock() {
            Some(s) => s.send(sequencer::Command::Checkpoint { tx }).is_ok(),
            None => false,
        };
        if !sent {
            return Err(Error::ShuttingDown);
        }
        rx.recv().unwrap_or(Err(Error::ShuttingDown))
    }
    /// The outbox for `dest` after entry `after`, at most `limit` entries
    /// (up to [`OUTBOX_READ_MAX`]; 0 means that many), oldest first. Answered once the round
    /// that read it is durable, so every entry it hands out is durable:
    /// what a forwarder delivers.
    pub fn fanout_outbox(&self, dest: GroupId, after: u64, limit: usize) -> Pending<OutboxBatch> {
        self.submit(|tx| fanout::Command::Outbox {
            dest,
            after,
            limit,
            tx,
        })
    }
    /// Applies outbox entries of `source` here, each recipient exactly
    /// once, in sequence order (an entry after a gap is held back);
    /// `source_trimmed` is how far the source trimmed its outbox for this
    /// store, below which dedup records go. The reply's
    /// `applied_through` is durable when it arrives: what the source may
    /// trim through.
    pub fn fanout_deliver(
        &self,
        source: GroupId,
        entries: Vec<OutboxEntry>,
        source_trimmed: u64,
    ) -> Pending<DeliverReply> {
        self.submit(|tx| fanout::Command::Deliver {
            source,
            entries,
            source_trimmed,
            tx,
        })
    }
    /// Trims the outbox for `dest` through `through`, which `dest` has
    /// committed (its delivery reply's `applied_through`).
    pub fn fanout_trim(&self, dest: GroupId, through: u64) -> Pending<u64> {
        self.submit(|tx| fanout::Command::Trim { dest, through, tx })
    }
    /// The outboxes' and the sources' watermarks, from the state as the
    /// sequencer has it (a round not yet durable included).
    pub fn fanout_status(&self) -> FanoutStatus {
        fanout::status(&self.shared.state.read())
    }
    /// Hints are coalesced per commit round and may be dropped by a slow
    /// receiver; correctness never depends on them (R16).
    pub fn subscribe_hints(&self) -> tokio::sync::broadcast::Receiver<Vec<Hint>> {
        self.shared.hints.subscribe()
    }
}
