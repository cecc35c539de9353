//! Steps 3 and 4 of a salvage: every retained body and event of the
//! salvaged state is read back from the source (its CRC checked), copied
//! into fresh logs through the log's own writer, and its location
//! remapped; what does not read back is lost, and the floors are raised
//! past it. Then a checkpoint of the remapped state, so the new directory
//! opens on it.
//!
//! The copies take the forms compaction writes: a body goes to `msg` as
//! a record of log kind 1 (what compaction's body move writes), an event's
//! record to `evt` as a copy (kind | 0x80; a message effect without its
//! body, as a segment rewrite copies it, `without_body`). Copies are never
//! applied on replay, so the checkpoint, which covers the new `evt` log's
//! last batch, is the whole state.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::report::{runs, Damage, LostEvents, LostMessages, RaisedFloor, SalvageReport};
use super::source::LogFiles;
use super::FLAG_LOST;
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::checkpoint;
use crate::inbox::effect::COPY_FLAG;
use crate::inbox::messaging::body::{body_of_effect, without_body};
use crate::inbox::messaging::idem::{IdemSlot, IdemTable};
use crate::inbox::messaging::record::{
    decode_msg_record, encode_msg_record, MsgHeader, StoredPayload, MSG_RECORD,
};
use crate::inbox::state::{
    body_at, pack, unpack, BodyLog, PackedLoc, SnapshotPhase, State, PENDING_LOC,
};
use crate::log::{
    segment_file_name, Batch, Log, LogOptions, PwriteIo, RecordLoc, SegmentPrep, SyncPolicy,
};

/// Where the records the state points at are read from: a damaged
/// directory's mapped files (salvage), or a running engine's own logs (a
/// replica image). A record is returned only once its CRC verified.
pub(crate) trait Source {
    fn read_record(&self, loc: RecordLoc) -> std::result::Result<(u8, Cow<'_, [u8]>), String>;
}

impl Source for LogFiles {
    fn read_record(&self, loc: RecordLoc) -> std::result::Result<(u8, Cow<'_, [u8]>), String> {
        self.read(loc)
            .map(|(kind, payload)| (kind, Cow::Borrowed(payload)))
    }
}

impl Source for Log {
    fn read_record(&self, loc: RecordLoc) -> std::result::Result<(u8, Cow<'_, [u8]>), String> {
        self.read(loc)
            .map(|r| (r.kind, Cow::Owned(r.payload)))
            .map_err(|e| e.to_string())
    }
}

/// What the new logs are written with.
pub(crate) struct Target<'a> {
    pub dir: &'a Path,
    pub segment_bytes: u64,
    pub payload_max: u32,
    /// How the new segments are prepared: written in full for a directory
    /// that will take commits (salvage), fallocated only for one that is
    /// read once and removed (a replica image), where writing zeros over
    /// every segment would cost more than the data.
    pub prep: SegmentPrep,
}

/// The new directory's state, and where each new segment's data ends
/// (past it the file holds zeros).
pub(crate) struct Written {
    pub state: State,
    pub data_ends: Vec<(std::path::PathBuf, u64)>,
}

/// Writes the new directory's logs and checkpoint from `st` (whose
/// locations point into the source), recording what is lost.
pub(crate) fn write(
    target: &Target<'_>,
    evt: &dyn Source,
    msg: &dyn Source,
    mut st: State,
    report: &mut SalvageReport,
) -> Result<Written> {
    let opts = |name: &str| LogOptions {
        segment_bytes: target.segment_bytes,
        sync: SyncPolicy::Always,
        spare_segments: 0,
        prepare: target.prep,
        ..LogOptions::new(target.dir.join(name))
    };
    let new_msg = Log::open(opts("msg"))?;
    let new_evt = Log::open(opts("evt"))?;
    copy_bodies(target, evt, msg, &new_msg, &mut st, report)?;
    copy_events(evt, &new_evt, &mut st, report)?;
    if report.uncertain.is_some() {
        reset_everyone(&mut st, report);
    }
    recount_unread(&mut st);
    st.evt_lsn = new_evt.durable_lsn();
    (st.evt_refs, st.body_refs, st.msg_refs) = st.recount_seg_refs();
    st.totals = st.recount_totals();
    st.commit_all();
    st.check_invariants()
        .map_err(|e| Error::Invariant(format!("salvaged state: {e}")))?;
    new_msg.flush()?;
    new_evt.flush()?;
    let data_ends = [&new_msg, &new_evt]
        .iter()
        .flat_map(|log| {
            log.segments()
                .into_iter()
                .map(|s| (log.dir().join(segment_file_name(s.id)), s.bytes))
        })
        .collect();
    drop(new_msg);
    drop(new_evt);
    let io: std::sync::Arc<dyn crate::log::LogIo> = std::sync::Arc::new(PwriteIo);
    checkpoint::write_state(&io, target.dir, &st)?;
    Ok(Written {
        state: st,
        data_ends,
    })
}

/// The most record bytes an [`Appender`] holds before it appends them. A
/// batch used to be as large as a segment takes (about 128 MiB by
/// default), so every replica image built on a large store held that much
/// of it in memory, beside the daemon's own.
const APPEND_BYTES_MAX: u64 = 4 << 20;

/// Appends records to a new log in batches of at most
/// [`APPEND_BYTES_MAX`] (a larger record goes alone), each record tagged
/// with what its location is for: only one batch is held in memory,
/// however large the store.
struct Appender<'l, T> {
    log: &'l Log,
    max: u64,
    batch: Batch,
    bytes: u64,
    tags: Vec<T>,
    placed: Vec<(T, PackedLoc)>,
}

impl<'l, T> Appender<'l, T> {
    fn new(log: &'l Log) -> Self {
        Appender {
            log,
            max: log.batch_records_bytes_max().min(APPEND_BYTES_MAX),
            batch: Batch::new(),
            bytes: 0,
            tags: Vec::new(),
            placed: Vec::new(),
        }
    }

    fn push(&mut self, kind: u8, payload: Vec<u8>, tag: T) -> Result<()> {
        let size = payload.len() as u64 + Log::RECORD_OVERHEAD_BYTES;
        if !self.batch.is_empty() && self.bytes + size > self.max {
            self.flush()?;
        }
        self.batch.push(kind, &payload);
        self.tags.push(tag);
        self.bytes += size;
        Ok(())
    }

    /// Appends what is queued (durably: the log syncs every append).
    fn flush(&mut self) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let done = self.log.append(std::mem::take(&mut self.batch))?;
        self.bytes = 0;
        let locs = done.locs.into_iter().map(pack);
        self.placed
            .extend(std::mem::take(&mut self.tags).into_iter().zip(locs));
        Ok(())
    }

    /// Every record's new location, by tag.
    fn finish(mut self) -> Result<Vec<(T, PackedLoc)>> {
        self.flush()?;
        Ok(self.placed)
    }
}

/// The body record of a retained message, read at its location in the
/// source and checked against its index entry.
fn read_body(
    evt: &dyn Source,
    msg: &dyn Source,
    loc: PackedLoc,
    conv: ConvId,
    seq: MsgSeq,
    msg_id: MsgId,
    payload_max: u32,
) -> std::result::Result<Bytes, String> {
    if loc == PENDING_LOC {
        return Err("in a lost record".into());
    }
    let body = match body_at(loc) {
        (BodyLog::Msg, at) => Bytes::copy_from_slice(&msg.read_record(unpack(at))?.1),
        (BodyLog::Evt, at) => {
            let (kind, payload) = evt.read_record(unpack(at))?;
            body_of_effect(kind, &payload)?
        }
    };
    let (h, _) = decode_msg_record(&body, payload_max).map_err(|e| e.0.to_string())?;
    if h.conv != conv || h.msg_seq != seq || h.msg_id != msg_id {
        return Err("the record is another message's".into());
    }
    Ok(body)
}

fn copy_bodies(
    target: &Target<'_>,
    evt: &dyn Source,
    msg: &dyn Source,
    new_msg: &Log,
    st: &mut State,
    report: &mut SalvageReport,
) -> Result<()> {
    let mut convs: Vec<ConvId> = st.convs.keys().copied().collect();
    convs.sort_unstable();
    let mut out = Appender::new(new_msg);
    let mut lost: Vec<(ConvId, usize)> = Vec::new();
    for &conv_id in &convs {
        let conv = &st.convs[&conv_id];
        let mut lost_seqs = Vec::new();
        for (i, meta) in conv.msgs.iter().enumerate() {
            let seq = conv.msgs_base.plus(i as u64 + 1);
            let read = (meta.flags & FLAG_LOST == 0)
                .then(|| {
                    read_body(
                        evt,
                        msg,
                        meta.loc,
                        conv_id,
                        seq,
                        meta.msg_id,
                        target.payload_max,
                    )
                })
                .and_then(|r| {
                    r.map_err(|reason| note_unreadable(report, meta.loc, reason))
                        .ok()
                });
            let body = match read {
                Some(body) => {
                    report.messages_copied += 1;
                    body.to_vec()
                }
                None => {
                    // Lost: served as a tombstone, from a body that
                    // carries only what the index knows.
                    lost.push((conv_id, i));
                    lost_seqs.push(seq.0);
                    encode_msg_record(
                        &MsgHeader {
                            kind: meta.kind,
                            msg_type: 0,
                            conv: conv_id,
                            msg_seq: seq,
                            msg_id: meta.msg_id,
                            sender: meta.sender,
                            target: MsgId(0),
                            sent_at_ms: 0,
                        },
                        &StoredPayload::new(&Bytes::new()),
                    )
                }
            };
            out.push(MSG_RECORD, body, (conv_id, i))?;
        }
        for (first, last) in runs(lost_seqs) {
            report.lost_messages.push(LostMessages {
                conv: conv_id,
                first: MsgSeq(first),
                last: MsgSeq(last),
            });
        }
    }
    for ((conv, i), loc) in out.finish()? {
        let c = Arc::make_mut(st.convs.get_mut(&conv).expect("listed above"));
        let placed = c.msgs.update(i, |m| m.loc = loc);
        assert!(placed, "placed where it was read");
    }
    let mut forgotten = HashSet::new();
    for (conv, i) in lost {
        let c = Arc::make_mut(st.convs.get_mut(&conv).expect("listed above"));
        let marked = c.msgs.update(i, |m| m.flags |= FLAG_LOST);
        assert!(marked, "read above");
        let meta = c.msgs.get(i).expect("read above");
        forgotten.insert((conv, c.msgs_base.plus(i as u64 + 1).0 as u32, meta.msg_id));
    }
    forget_keys(&mut st.idem, &forgotten);
    Ok(())
}

/// Drops the idempotency keys of lost messages: a lost message is served
/// as a tombstone with no body to compare a retry with, so a retry of that
/// very send is accepted as a new message (which is what the client wanted
/// to send) instead of being refused as another request under the key.
fn forget_keys(idem: &mut IdemTable, lost: &HashSet<(ConvId, u32, MsgId)>) {
    if lost.is_empty() {
        return;
    }
    let mut kept = IdemTable::default();
    for b in idem.buckets() {
        let entries: Vec<IdemSlot> = b
            .sorted_shards()
            .flat_map(|s| s.into_owned())
            .filter(|e| {
                let msg_id = MsgId(b.base_id.0 + u64::from(e.id_delta));
                !lost.contains(&(e.conv, e.seq_lo, msg_id))
            })
            .collect();
        kept.push_decoded(b.start_ms, b.end_ms, b.base_id, entries);
    }
    *idem = kept;
}

/// Writes down, once per segment, the place of a record the state points
/// at that does not read back, unless the scan already named damage in
/// that segment (a segment gone, or damage the scan took for a torn tail).
fn note_unreadable(report: &mut SalvageReport, loc: PackedLoc, reason: String) {
    if loc == PENDING_LOC {
        return;
    }
    let (log, at) = match body_at(loc) {
        (BodyLog::Msg, at) => ("msg", unpack(at)),
        (BodyLog::Evt, at) => ("evt", unpack(at)),
    };
    note_place(report, log, at, reason);
}

fn note_place(report: &mut SalvageReport, log: &'static str, at: RecordLoc, reason: String) {
    let known = report
        .damage
        .iter()
        .any(|d| d.log == log && d.segment == at.segment);
    if !known {
        report.damage.push(Damage::new(
            log,
            at.segment,
            at.offset.into(),
            format!("a record the state points at does not read back: {reason}"),
        ));
    }
}

fn copy_events(
    evt: &dyn Source,
    new_evt: &Log,
    st: &mut State,
    report: &mut SalvageReport,
) -> Result<()> {
    let mut uids: Vec<Uid> = st.users.keys().copied().collect();
    uids.sort_unstable();
    // One copy per source record, however many events point at it; `None`
    // for a record that does not read back.
    let mut index: HashMap<PackedLoc, Option<PackedLoc>> = HashMap::new();
    let mut out = Appender::new(new_evt);
    for uid in &uids {
        for loc in st.users[uid].events.iter() {
            if index.contains_key(&loc) {
                continue;
            }
            let (kind, payload) = match evt.read_record(unpack(loc)) {
                Ok(read) => read,
                Err(reason) => {
                    if loc != PENDING_LOC {
                        note_place(report, "evt", unpack(loc), reason);
                    }
                    index.insert(loc, None);
                    continue;
                }
            };
            let (kind, payload) =
                without_body(kind, &payload).unwrap_or_else(|| (kind, payload.to_vec()));
            index.insert(loc, Some(PENDING_LOC));
            out.push(kind | COPY_FLAG, payload, loc)?;
        }
    }
    for (old, new) in out.finish()? {
        index.insert(old, Some(new));
    }
    let mut lost_by_user: BTreeMap<Uid, Vec<u64>> = BTreeMap::new();
    for uid in uids {
        let user = Arc::make_mut(st.users.get_mut(&uid).expect("listed above"));
        let base = user.events_base;
        let mut lost = Vec::new();
        user.events.map_in_place(|i, loc| match index[&loc] {
            Some(new) => new,
            None => {
                lost.push(base.0 + i as u64 + 1);
                loc
            }
        });
        if let Some(&last) = lost.last() {
            // The floor goes past the last lost event, as compaction's
            // trim does: a device behind it resets, one past it syncs on.
            let drop = (last - base.0) as usize;
            user.events.remove_front(drop);
            user.events_base = SyncSeq(last);
            report.raised_floors.push(RaisedFloor {
                uid,
                floor: SyncSeq(last),
            });
            lost_by_user.insert(uid, lost);
        }
        report.events_copied += user.events.len() as u64;
    }
    for (uid, lost) in lost_by_user {
        for (first, last) in runs(lost) {
            report.lost_events.push(LostEvents {
                uid,
                first: SyncSeq(first),
                last: SyncSeq(last),
            });
        }
    }
    Ok(())
}

/// Recounts unread where lost entries filled a gap: the records that
/// would have counted them are lost, and a lost entry counts like any
/// message (it was received; only its body is gone).
fn recount_unread(st: &mut State) {
    let mut convs: Vec<ConvId> = st
        .convs
        .iter()
        .filter(|(_, c)| c.msgs.iter().any(|m| m.flags & FLAG_LOST != 0))
        .map(|(id, _)| *id)
        .collect();
    convs.sort_unstable();
    for conv in convs {
        let head = st.convs[&conv].head();
        let members: Vec<Uid> = st.convs[&conv].members.keys().copied().collect();
        for uid in members {
            let unread = st.countable_between(uid, conv, head);
            if let Some(user) = st.users.get_mut(&uid) {
                if let Some(uc) = Arc::make_mut(user).convs.get_mut(&conv) {
                    uc.unread = unread;
                }
            }
        }
    }
}

/// An uncertain salvage: no user's `sync_seq` numbering after the loss
/// can be trusted, so every user's events are dropped (the floor goes to
/// the head) and every device is put where a sync puts a device that must
/// reset (generation bumped, `RESETTING`, no lease): its next sync answers
/// `RESET_REQUIRED` and it installs a snapshot begun afresh. An ACK the log recorded
/// above the salvaged head (numbered before events were lost) is brought
/// down to the head.
fn reset_everyone(st: &mut State, report: &mut SalvageReport) {
    let mut uids: Vec<Uid> = st.users.keys().copied().collect();
    uids.sort_unstable();
    for uid in uids {
        let user = Arc::make_mut(st.users.get_mut(&uid).expect("listed above"));
        let head = user.head();
        if !user.events.is_empty() {
            let first = user.events_base.next();
            report.lost_events.push(LostEvents {
                uid,
                first,
                last: head,
            });
            report.events_copied -= user.events.len() as u64;
            user.events.clear();
            user.events_base = head;
            report.raised_floors.retain(|f| f.uid != uid);
            report.raised_floors.push(RaisedFloor { uid, floor: head });
        }
        // A snapshot frozen at a base numbered before the loss would set
        // its device's ACK there: it is forgotten, and the device begins
        // a new one.
        if let Some(recovery) = user.recovery.written() {
            recovery
                .snapshots
                .retain(|_, s| s.row.phase != SnapshotPhase::Live);
        }
        for d in &mut user.devices {
            let row = &mut d.row;
            row.acked_sync_seq = row.acked_sync_seq.min(head);
            if row.state == DeviceState::Revoked {
                continue;
            }
            row.generation = row.generation.next();
            row.state = DeviceState::Resetting;
            row.lease = None;
            report.devices_reset += 1;
        }
    }
    report.lost_events.sort_by_key(|l| (l.uid, l.first));
    report.raised_floors.sort_by_key(|f| f.uid);
}
