//! Building snapshots (the builder thread) and serving them.
//!
//! Once the begin step is durable the completion stage hands the plan to
//! the snapshot-builder thread ([`run_builder`]), which builds the content
//! (reading message bodies, which never change), encodes it in pages,
//! takes the SHA-256 of the pages (the manifest digest), and writes it to
//! `snap/<uid>-<snapshot_id>.snap` (tmp, fsync, rename, fsync dir).
//! Pages are cut so that each fits one reply frame ([`super::paging`]).

use std::fs;

use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use super::paging::{elide, must_elide, Pager};
use super::store::*;
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::messaging::body;
use crate::inbox::pending::{Reply, Tx};
use crate::inbox::shared::{blocking, Miss, Shared};
use crate::inbox::state::{MsgMeta, SnapshotPhase, SnapshotRow};
use crate::log::write_file_durably;

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

/// A snapshot to build: the plan captured at S, and the caller's reply
/// (sent only if the caller still listens).
pub(crate) struct Job {
    pub plan: Plan,
    pub tx: Tx<SnapshotInfo>,
}

/// The snapshot-builder thread: builds each snapshot whose begin step is
/// durable, in the order received, until every sender is gone (the
/// sequencer has stopped and every round is finished).
pub(crate) fn run_builder(shared: Arc<Shared>, rx: mpsc::Receiver<Job>) {
    while let Ok(Job { plan, tx }) = rx.recv() {
        let result = if shared.snapshots.stopping.load(Ordering::Acquire) {
            // The crash case: the row stays BUILDING until it expires.
            Err(Error::ShuttingDown)
        } else {
            build(&shared, &plan)
        };
        if let Err(e) = &result {
            tracing::warn!(uid = plan.uid.0, snapshot_id = plan.snapshot_id, error = %e, "snapshot not built; it fences until it expires");
        }
        // A caller that went away needs no answer: the snapshot is READY
        // (or not) on disk either way.
        let _ = tx.send(Reply::Done(result));
    }
}

/// Builds the snapshot content from the plan (builder thread, after the
/// begin step is durable), writes it durably and returns its info.
pub(crate) fn build(shared: &Shared, plan: &Plan) -> Result<SnapshotInfo> {
    let mut pager = Pager::new(
        u64::from(shared.config.snapshot_page_bytes_max),
        CONVS_PER_PAGE,
    );
    for (c, metas) in plan.convs.iter().zip(&plan.messages) {
        pager.push_conv(c.clone());
        for (seq, meta) in metas {
            pager.push_message(read_message(shared, c.conv, *seq, meta)?);
        }
    }
    let pages: Vec<Vec<u8>> = pager
        .finish()
        .iter()
        .map(|p| encode_page(&p.convs, &p.messages))
        .collect();
    let content = Content {
        digest: digest_of(&pages),
        pages,
    };
    let data_dir = &shared.config.data_dir;
    let d = dir(data_dir);
    fs::create_dir_all(&d).map_err(io_err)?;
    let path = file_path(data_dir, plan.uid, plan.snapshot_id);
    let tmp = path.with_extension("tmp");
    let file = encode_file(
        plan.uid,
        plan.snapshot_id,
        plan.base_sync_seq,
        plan.generation,
        &content,
    );
    write_file_durably(shared.evt_log.io().as_ref(), &tmp, &path, &file).map_err(io_err)?;
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
        .insert(plan.uid, plan.snapshot_id, Arc::new(content));
    Ok(info)
}

/// Reads one message of the plan. The location comes from the current
/// index (a message of the begin step's own round had no location yet at
/// capture); the tombstone flag is the one at S, or a later one, which
/// hides the body too (R6).
fn read_message(shared: &Shared, conv: ConvId, seq: MsgSeq, at_s: &MsgMeta) -> Result<Message> {
    let (loc, now_tomb) = {
        let st = shared.state.read();
        match st.convs.get(&conv).and_then(|c| c.meta(seq)) {
            Some(m) if { m.msg_id } == { at_s.msg_id } => (m.loc, m.tombstone()),
            // History retention reclaimed it after the plan was taken.
            _ => {
                return Err(Error::Conflict(format!(
                    "message {seq} of conv {conv} was reclaimed while the snapshot was built; \
                     begin a new one"
                )))
            }
        }
    };
    let (h, payload) = body::read_message(shared, conv, seq, loc)?;
    if h.msg_id != { at_s.msg_id } || h.conv != conv {
        return Err(Error::Invariant(format!(
            "message index of conv {conv} seq {seq} points at another record"
        )));
    }
    let tombstone = at_s.tombstone() || now_tomb;
    Ok(Message {
        conv,
        msg_seq: h.msg_seq,
        msg_id: h.msg_id,
        sender: h.sender,
        kind: h.kind,
        msg_type: h.msg_type,
        target: (h.target != MsgId(0)).then_some(h.target),
        sent_at_ms: h.sent_at_ms,
        tombstone,
        payload: if tombstone { Bytes::new() } else { payload },
    })
}

/// The logged row of a snapshot, once the change that made it is durable.
fn settled_row(shared: &Shared, uid: Uid, id: u64) -> std::result::Result<SnapshotRow, Miss> {
    {
        let (row, stamp) = {
            let st = shared.state.read();
            let slot = st
                .users
                .get(&uid)
                .and_then(|u| u.snapshots().get(&id))
                .copied()
                .ok_or_else(|| Error::NotFound(format!("snapshot {id} of uid {uid}")))?;
            (slot.row, slot.stamp)
        };
        shared.check_settled(stamp)?;
        Ok(row)
    }
}

pub(crate) fn info_of(shared: &Shared, uid: Uid, id: u64) -> Result<SnapshotInfo> {
    blocking(shared, || info_once(shared, uid, id))
}

/// One look at a snapshot's row and its content (a file read the first
/// time the content is loaded).
pub(crate) fn info_once(
    shared: &Shared,
    uid: Uid,
    id: u64,
) -> std::result::Result<SnapshotInfo, Miss> {
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
    blocking(shared, || page_once(shared, uid, id, page))
}

/// One look at a snapshot page (a file read the first time the content is
/// loaded).
pub(crate) fn page_once(
    shared: &Shared,
    uid: Uid,
    id: u64,
    page: u32,
) -> std::result::Result<SnapshotPage, Miss> {
    let row = settled_row(shared, uid, id)?;
    let now = shared.config.clock.now_ms();
    if row.phase == SnapshotPhase::Live && now > row.expires_at_ms {
        return Err(Error::Conflict(format!("snapshot {id} has expired; begin a new one")).into());
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
    let (mut convs, mut messages) = decode_page(bytes).map_err(|e| Error::Corruption {
        what: "snapshot page",
        reason: e.0.to_string(),
    })?;
    hide_recalled(shared, &mut convs, &mut messages);
    let limit = u64::from(shared.config.snapshot_page_bytes_max);
    let mut elided = Vec::new();
    for m in messages.iter_mut().filter(|m| must_elide(m, limit)) {
        elide(m);
        elided.push((m.conv, m.msg_seq));
    }
    Ok(SnapshotPage {
        snapshot_id: id,
        page,
        pages,
        convs,
        messages,
        elided,
    })
}

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
