//! The reads of the [`Inbox`] API as [`Read`]s, for async servers: the
//! same answers as the blocking methods (`pull`, `history`, `conv_list`,
//! `devices`, `snapshot_info`, `snapshot_page`), but a wait for a round to
//! settle is awaited, never a blocked thread, and a read that may touch the
//! disk says so, so the caller runs it off its async workers.

use bytes::Bytes;

use super::handle::Inbox;
use super::read::Read;
use super::shared::LargeGroupHint;
use super::shared::Miss;
use super::{devices, messaging, snapshots};
use crate::api::*;

impl Inbox {
    /// [`Inbox::devices`]; memory only.
    pub fn read_devices(&self, uid: Uid) -> Read<Vec<DeviceInfo>> {
        Read::memory(&self.shared, move |sh| devices::read::devices_once(sh, uid))
    }

    /// [`Inbox::conv_list`]; memory only.
    pub fn read_conv_list(
        &self,
        uid: Uid,
        limit: u32,
        cursor: Option<Bytes>,
    ) -> Read<ConvListPage> {
        Read::memory(&self.shared, move |sh| {
            messaging::read::conv_list_once(sh, uid, limit, cursor.as_deref())
        })
    }

    /// Hints that a large group's durable head moved, per commit round.
    /// Coalesced and droppable like [`Inbox::subscribe_hints`]; correctness
    /// never depends on them (R16).
    pub fn subscribe_large_group_hints(
        &self,
    ) -> tokio::sync::broadcast::Receiver<Vec<LargeGroupHint>> {
        self.shared.large_group_hints.subscribe()
    }

    /// The dirty markers of `conv` for those of `uids` that are its
    /// members, as `DIRTY` would list them now: what to push after a
    /// [`super::LargeGroupHint`]. Memory only; O(`uids`), so a caller with
    /// many subscribed uids pays for each hinted group.
    pub fn dirty_markers_among(&self, conv: ConvId, uids: &[Uid]) -> Vec<(Uid, DirtyMarker)> {
        messaging::large::markers_among(&self.shared, conv, uids)
    }

    /// The committed sync watermark of each of `uids` that has an event
    /// stream: what a [`super::Hint`] carries. A subscriber that starts
    /// listening to a new engine reads it after subscribing, so that no
    /// round committed in between goes unhinted. Memory only.
    pub fn committed_sync_seqs(&self, uids: &[Uid]) -> Vec<(Uid, SyncSeq)> {
        let st = self.shared.state.read();
        uids.iter()
            .filter_map(|uid| Some((*uid, st.users.get(uid)?.committed_seq)))
            .collect()
    }

    /// [`Inbox::dirty_markers`]; memory only.
    pub fn read_dirty_markers(&self, uid: Uid) -> Read<Vec<DirtyMarker>> {
        Read::memory(&self.shared, move |sh| {
            messaging::large::dirty_markers_once(sh, uid)
        })
    }

    /// [`Inbox::pull`]; reads message records: first where it is asked
    /// for, then, if a record may not be in the page cache, where IO is
    /// allowed ([`Read::may_do_io`] says which).
    pub fn read_pull(
        &self,
        uid: Uid,
        cursors: Vec<(ConvId, MsgSeq)>,
        per_conv_limit: u32,
    ) -> Read<Vec<ConvPull>> {
        Read::cached_first(&self.shared, move |sh, io| {
            let plan = messaging::read::plan_pull(sh, uid, &cursors, per_conv_limit)?;
            if !io && !plan.cached(sh) {
                return Err(Miss::NeedsIo);
            }
            Ok(messaging::read::read_pull(sh, plan)?)
        })
    }

    /// [`Inbox::history`]; reads message records, as [`Inbox::read_pull`]
    /// does.
    pub fn read_history(
        &self,
        uid: Uid,
        conv: ConvId,
        before_seq: Option<MsgSeq>,
        limit: u32,
    ) -> Read<HistoryPage> {
        Read::cached_first(&self.shared, move |sh, io| {
            let plan = messaging::read::plan_history(sh, uid, conv, before_seq, limit)?;
            if !io && !plan.cached(sh) {
                return Err(Miss::NeedsIo);
            }
            Ok(messaging::read::read_history(sh, plan)?)
        })
    }

    /// [`Inbox::snapshot_info`]; may load the snapshot's file.
    pub fn read_snapshot_info(&self, uid: Uid, snapshot_id: u64) -> Read<SnapshotInfo> {
        Read::io(&self.shared, move |sh| {
            snapshots::build::info_once(sh, uid, snapshot_id)
        })
    }

    /// [`Inbox::snapshot_page`]; may load the snapshot's file.
    pub fn read_snapshot_page(&self, uid: Uid, snapshot_id: u64, page: u32) -> Read<SnapshotPage> {
        Read::io(&self.shared, move |sh| {
            snapshots::build::page_once(sh, uid, snapshot_id, page)
        })
    }
}
