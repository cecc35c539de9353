//! Field-for-field translation between the engine's API types and the
//! wire bodies. Nothing here decides anything: every rule lives in the
//! engine, and this module only renames.

use inbox_engine as engine;
use inbox_engine::{ConvId, DeviceId, Error, Generation, MsgId, SyncSeq, Uid};
use inbox_wire as wire;
use inbox_wire::ErrorCode;

/// The protocol error an engine error is answered with. `detail` carries
/// the one number a client needs to act (see `docs/PROTOCOL.md`). Every
/// variant is named, with no catch-all arm: an engine error added later
/// does not compile until it is given its protocol code here.
pub fn error_reply(err: &Error) -> wire::ErrorReply {
    use engine::log::LogError;
    let (code, detail) = match err {
        Error::BadRequest(_) => (ErrorCode::BadRequest, 0),
        Error::Forbidden(_) => (ErrorCode::Forbidden, 0),
        Error::StaleGeneration { current } => (ErrorCode::StaleGeneration, current.get()),
        Error::ResetRequired { generation } => (ErrorCode::ResetRequired, generation.get()),
        Error::DeviceRevoked => (ErrorCode::DeviceRevoked, 0),
        Error::DeviceResetting => (ErrorCode::DeviceResetting, 0),
        Error::NotFound(_) => (ErrorCode::NotFound, 0),
        Error::TooLarge { limit, .. } => (ErrorCode::TooLarge, *limit),
        Error::BadToken => (ErrorCode::BadToken, 0),
        Error::AckBeyondHwm { batch_hwm, .. } => (ErrorCode::AckBeyondHwm, batch_hwm.get()),
        Error::Conflict(_) => (ErrorCode::Conflict, 0),
        Error::MarkerMoved { version } => (ErrorCode::MarkerMoved, *version),
        Error::NoSpace(_) | Error::Log(LogError::NoSpace(_)) => (ErrorCode::NoSpace, 0),
        Error::Log(LogError::Poisoned(_)) | Error::ShuttingDown => (ErrorCode::Unavailable, 0),
        Error::NotLeader(_) => (ErrorCode::NotLeader, 0),
        Error::Corruption { .. }
        | Error::Invariant(_)
        | Error::Internal(_)
        | Error::Log(
            LogError::Io(_)
            | LogError::Corruption { .. }
            | LogError::TooLarge(_)
            | LogError::BadLocation { .. }
            | LogError::InvalidArgument(_),
        ) => (ErrorCode::Internal, 0),
    };
    wire::ErrorReply::new(code, detail, err.to_string())
}

pub fn membership(reply: engine::MembershipReply) -> wire::MembershipReply {
    wire::MembershipReply {
        msg_seq: reply.msg_seq.get(),
        period_id: reply.period_id,
    }
}

pub fn send_reply(reply: engine::SendReply) -> wire::SendReply {
    wire::SendReply {
        msg_id: reply.msg_id.get(),
        msg_seq: reply.msg_seq.get(),
        duplicate: reply.duplicate,
    }
}

pub fn send_req(req: wire::SendReq) -> engine::SendRequest {
    engine::SendRequest {
        conv: ConvId(req.conv),
        sender: Uid(req.sender),
        client_msg_id: req.client_msg_id,
        msg_type: req.msg_type,
        payload: req.payload,
    }
}

pub fn recall_req(req: wire::RecallReq) -> engine::RecallRequest {
    engine::RecallRequest {
        conv: ConvId(req.conv),
        sender: Uid(req.sender),
        client_msg_id: req.client_msg_id,
        target: MsgId(req.target),
    }
}

pub fn edit_req(req: wire::EditReq) -> engine::EditRequest {
    engine::EditRequest {
        conv: ConvId(req.conv),
        sender: Uid(req.sender),
        client_msg_id: req.client_msg_id,
        target: MsgId(req.target),
        payload: req.payload,
    }
}

pub fn device_state(state: engine::DeviceState) -> wire::DeviceState {
    match state {
        engine::DeviceState::Active => wire::DeviceState::Active,
        engine::DeviceState::Recovering => wire::DeviceState::Recovering,
        engine::DeviceState::Resetting => wire::DeviceState::Resetting,
        engine::DeviceState::Revoked => wire::DeviceState::Revoked,
    }
}

pub fn device_info(info: engine::DeviceInfo) -> wire::DeviceInfo {
    wire::DeviceInfo {
        device: info.device.get(),
        generation: info.generation.get(),
        acked_sync_seq: info.acked_sync_seq.get(),
        state: device_state(info.state),
        last_seen_ms: info.last_seen_ms,
    }
}

pub fn register_reply(reply: engine::RegisterReply) -> wire::RegisterReply {
    wire::RegisterReply {
        device: device_info(reply.device),
        evicted: reply.evicted.map(DeviceId::get),
    }
}

pub fn sync_req(req: wire::SyncReq) -> engine::SyncRequest {
    engine::SyncRequest {
        uid: Uid(req.uid),
        device: DeviceId(req.device),
        generation: req.generation.map(Generation),
        local_applied_seq: SyncSeq(req.local_applied_seq),
        limit: req.limit,
        batch_token: req.batch_token,
    }
}

/// The device's options of a `SYNC` (its optional fields).
pub fn sync_options(req: &wire::SyncReq) -> engine::SyncOptions {
    engine::SyncOptions {
        max_replay: req.max_replay,
        without_summaries: req.without_summaries || req.ids_only,
        ack_through: req.ack_through.map(engine::SyncSeq),
    }
}

/// An engine event as it goes on the wire. A kind the engine marks as
/// unknown keeps its code and carries the standard fields as its raw body,
/// so a newer client can still read it. In a page asked for `ids_only`
/// (`bare`) a known kind's body has no summary field.
pub fn event(event: engine::SyncEvent, bare: bool) -> wire::Event {
    let body = wire::EventRef {
        conv: event.conv.get(),
        msg_seq: event.msg_seq.get(),
        msg_id: event.msg_id.get(),
        at_ms: event.at_ms,
        summary: event.summary,
    };
    let kind = match event.kind {
        engine::EventKind::Msg => wire::EventKind::Msg,
        engine::EventKind::Read => wire::EventKind::Read,
        engine::EventKind::Recall => wire::EventKind::Recall,
        engine::EventKind::Edit => wire::EventKind::Edit,
        engine::EventKind::Conv => wire::EventKind::Conv,
        engine::EventKind::Member => wire::EventKind::Member,
        engine::EventKind::Dirty => wire::EventKind::Dirty,
        engine::EventKind::Unknown(code) => match wire::EventKind::from_code(code) {
            Some(kind) => kind,
            None => {
                let mut raw = bytes::BytesMut::new();
                wire::field::Field::put(&body, &mut raw);
                return wire::Event::Unknown {
                    sync_seq: event.sync_seq.get(),
                    kind: code,
                    body: raw.freeze(),
                };
            }
        },
    };
    if bare {
        return wire::Event::Bare {
            sync_seq: event.sync_seq.get(),
            kind,
            body: wire::EventIds {
                conv: body.conv,
                msg_seq: body.msg_seq,
                msg_id: body.msg_id,
                at_ms: body.at_ms,
            },
        };
    }
    wire::Event::Known {
        sync_seq: event.sync_seq.get(),
        kind,
        body,
    }
}

/// A sync page as it goes on the wire; `bare`: the device asked for its
/// events' ids only (`ids_only`).
pub fn sync_page(page: engine::SyncPage, bare: bool) -> wire::SyncPage {
    wire::SyncPage {
        events: page.events.into_iter().map(|e| event(e, bare)).collect(),
        next_cursor: page.next_cursor.get(),
        has_more: page.has_more,
        acked_sync_seq: page.acked_sync_seq.get(),
        batch_hwm: page.batch_hwm.get(),
        batch_token: page.batch_token,
        generation: page.generation.get(),
        lease: page.lease.map(|lease| wire::LeaseInfo {
            lease_id: lease.lease_id,
            resume_from: lease.resume_from.get(),
            hwm: lease.hwm.get(),
            expires_at_ms: lease.expires_at_ms,
        }),
    }
}

pub fn ack_req(req: wire::AckReq) -> engine::AckRequest {
    engine::AckRequest {
        uid: Uid(req.uid),
        device: DeviceId(req.device),
        generation: Generation(req.generation),
        seq: SyncSeq(req.seq),
        batch_token: req.batch_token,
    }
}

pub fn message(msg: engine::Message) -> wire::Message {
    wire::Message {
        conv: msg.conv.get(),
        msg_seq: msg.msg_seq.get(),
        msg_id: msg.msg_id.get(),
        sender: msg.sender.get(),
        kind: match msg.kind {
            engine::MessageKind::Normal => wire::MessageKind::Normal,
            engine::MessageKind::Join => wire::MessageKind::Join,
            engine::MessageKind::Leave => wire::MessageKind::Leave,
            engine::MessageKind::Recall => wire::MessageKind::Recall,
            engine::MessageKind::Edit => wire::MessageKind::Edit,
        },
        msg_type: msg.msg_type,
        target: msg.target.map(MsgId::get),
        sent_at_ms: msg.sent_at_ms,
        tombstone: msg.tombstone,
        payload: msg.payload,
    }
}

pub fn conv_pull(pull: engine::ConvPull) -> wire::ConvPull {
    wire::ConvPull {
        conv: pull.conv.get(),
        messages: pull.messages.into_iter().map(message).collect(),
        has_more: pull.has_more,
        max_seq: pull.max_seq.get(),
    }
}

pub fn history_page(page: engine::HistoryPage) -> wire::HistoryPage {
    wire::HistoryPage {
        messages: page.messages.into_iter().map(message).collect(),
        has_more: page.has_more,
    }
}

pub fn read_reply(reply: engine::ReadReply) -> wire::ReadReply {
    wire::ReadReply {
        read_seq: reply.read_seq.get(),
        unread: reply.unread,
    }
}

pub fn conv_summary(conv: engine::ConvSummary) -> wire::ConvSummary {
    wire::ConvSummary {
        conv: conv.conv.get(),
        last_msg_seq: conv.last_msg_seq.get(),
        last_msg_id: conv.last_msg_id.get(),
        last_sender: conv.last_sender.get(),
        last_summary: conv.last_summary,
        unread: conv.unread,
        read_seq: conv.read_seq.get(),
        last_activity_ms: conv.last_activity_ms,
        muted: conv.muted,
        pinned: conv.pinned,
    }
}

pub fn conv_list_page(page: engine::ConvListPage) -> wire::ConvListPage {
    wire::ConvListPage {
        convs: page.convs.into_iter().map(conv_summary).collect(),
        next_cursor: page.next_cursor,
    }
}

pub fn dirty_list(markers: Vec<engine::DirtyMarker>) -> wire::DirtyList {
    wire::DirtyList {
        markers: markers
            .into_iter()
            .map(|m| wire::DirtyMarker {
                conv: m.conv.0,
                target_msg_seq: m.target_msg_seq.0,
                version: m.version,
            })
            .collect(),
    }
}

pub fn conv_mode(m: engine::ConvMode) -> wire::ConvMode {
    wire::ConvMode {
        conv: m.conv.0,
        large: m.large,
        switch_seq: m.switch_seq.map(|s| s.0),
        head: m.head.0,
        members: m.members,
        marker: m.marker.map(|k| wire::MemberMarker {
            uid: k.uid.0,
            target_msg_seq: k.target_msg_seq.0,
            version: k.version,
            cleared_seq: k.cleared_seq.0,
            dirty: k.dirty,
        }),
    }
}

pub fn snapshot_info(info: engine::SnapshotInfo) -> wire::SnapshotInfo {
    wire::SnapshotInfo {
        snapshot_id: info.snapshot_id,
        base_sync_seq: info.base_sync_seq.get(),
        generation: info.generation.get(),
        state: match info.state {
            engine::SnapshotState::Building => wire::SnapshotState::Building,
            engine::SnapshotState::Ready => wire::SnapshotState::Ready,
            engine::SnapshotState::Installed => wire::SnapshotState::Installed,
            engine::SnapshotState::Expired => wire::SnapshotState::Expired,
        },
        pages: info.pages,
        manifest_digest: info.manifest_digest,
    }
}

pub fn snapshot_page(page: engine::SnapshotPage) -> wire::SnapshotPage {
    wire::SnapshotPage {
        snapshot_id: page.snapshot_id,
        page: page.page,
        pages: page.pages,
        convs: page.convs.into_iter().map(conv_summary).collect(),
        messages: page.messages.into_iter().map(message).collect(),
        elided: page
            .elided
            .into_iter()
            .map(|(conv, seq)| wire::MsgRef {
                conv: conv.0,
                msg_seq: seq.get(),
            })
            .collect(),
    }
}

pub fn compaction(report: engine::CompactionReport) -> wire::CompactionReport {
    wire::CompactionReport {
        events_reclaimed: report.events_reclaimed,
        bytes_reclaimed: report.bytes_reclaimed,
        bytes_rewritten: report.bytes_rewritten,
        segments_dropped: report.segments_dropped,
        segments_rewritten: report.segments_rewritten,
    }
}

pub fn stats(stats: &engine::Stats) -> wire::Stats {
    wire::Stats {
        users: stats.users,
        conversations: stats.conversations,
        devices: stats.devices,
        messages: stats.messages,
        events_live: stats.events_live,
        write_batches: stats.write_batches,
        fsyncs: stats.fsyncs,
        fsync_latency_us_sum: stats.fsync_latency_us_sum,
        bytes_on_disk: stats.bytes_on_disk,
        index_bytes: stats.index_bytes,
        compaction: compaction(stats.compaction),
    }
}

pub fn memory(report: engine::MemoryReport) -> wire::MemoryReport {
    wire::MemoryReport {
        walk_us: report.walk_us,
        longest_hold_us: report.longest_hold_us,
        structures: report
            .structures
            .into_iter()
            .map(|m| wire::MemoryUse {
                structure: m.structure,
                live: m.live,
                allocated: m.allocated,
            })
            .collect(),
    }
}

pub fn user_explain(explain: engine::UserExplain) -> wire::UserExplain {
    wire::UserExplain {
        uid: explain.uid.get(),
        oldest_retained: explain.oldest_retained.get(),
        committed_sync_seq: explain.committed_sync_seq.get(),
        floor: explain.floor.get(),
        fences: explain
            .fences
            .into_iter()
            .map(|fence| match fence {
                engine::Fence::DeviceAck {
                    device,
                    acked_sync_seq,
                } => wire::Fence::DeviceAck {
                    device: device.get(),
                    acked_sync_seq: acked_sync_seq.get(),
                },
                engine::Fence::RecoveryLease {
                    device,
                    lease_id,
                    resume_from,
                } => wire::Fence::RecoveryLease {
                    device: device.get(),
                    lease_id,
                    resume_from: resume_from.get(),
                },
                engine::Fence::Snapshot {
                    snapshot_id,
                    base_sync_seq,
                } => wire::Fence::Snapshot {
                    snapshot_id,
                    base_sync_seq: base_sync_seq.get(),
                },
                engine::Fence::SafetyWindow { oldest_kept } => wire::Fence::SafetyWindow {
                    oldest_kept: oldest_kept.get(),
                },
            })
            .collect(),
    }
}

pub fn segment_explain(explain: engine::SegmentExplain) -> wire::SegmentExplain {
    wire::SegmentExplain {
        stream: explain.stream,
        segment: explain.segment,
        bytes: explain.bytes,
        live_bytes: explain.live_bytes,
        live_records: explain.live_records,
        held_by: explain.held_by,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use engine::inbox::snapshot_paging as paging;
    use engine::{MessageKind, MsgSeq, SnapshotPage};
    use inbox_wire::Response;

    fn reply_frame_len(page: SnapshotPage) -> u64 {
        let frame = Response::SnapshotPage(snapshot_page(page)).to_frame(1);
        u64::from(frame.frame_len().expect("fits a u32"))
    }

    fn engine_message(target: Option<MsgId>, payload: &'static [u8]) -> engine::Message {
        engine::Message {
            conv: ConvId(3),
            msg_seq: MsgSeq(4),
            msg_id: MsgId(5),
            sender: Uid(6),
            kind: MessageKind::Normal,
            msg_type: 1,
            target,
            sent_at_ms: 7,
            tombstone: false,
            payload: Bytes::from_static(payload),
        }
    }

    #[test]
    fn the_engines_snapshot_page_sizes_match_the_codec() {
        let empty = SnapshotPage {
            snapshot_id: 1,
            page: 0,
            pages: 1,
            convs: vec![],
            messages: vec![],
            elided: vec![],
        };
        assert_eq!(
            reply_frame_len(empty.clone()),
            paging::PAGE_REPLY_FIXED_BYTES
        );

        let conv = engine::ConvSummary {
            conv: ConvId(3),
            last_msg_seq: MsgSeq(4),
            last_msg_id: MsgId(5),
            last_sender: Uid(6),
            last_summary: Bytes::from_static(b"hello"),
            unread: 1,
            read_seq: MsgSeq(2),
            last_activity_ms: 9,
            muted: false,
            pinned: true,
        };
        let messages = [
            engine_message(None, b"hello"),
            engine_message(Some(MsgId(2)), b"an edit"),
        ];
        let page = SnapshotPage {
            convs: vec![conv.clone()],
            messages: messages.to_vec(),
            elided: vec![(ConvId(3), MsgSeq(4))],
            ..empty
        };
        let expected = paging::PAGE_REPLY_FIXED_BYTES
            + paging::conv_wire_bytes(&conv)
            + messages.iter().map(paging::message_wire_bytes).sum::<u64>()
            + paging::ELIDED_ENTRY_BYTES;
        assert_eq!(reply_frame_len(page), expected);
    }
}
