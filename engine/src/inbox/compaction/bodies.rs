//! Moving message bodies out of the `evt` log. A send writes its body
//! inside its message effect, so a round commits with one write and one
//! fdatasync of one log; but events die long before messages do (history
//! is kept for the retention, events only until every device has them),
//! so an `evt` segment whose events are gone may still hold bodies of
//! retained messages. Before such a segment is deleted or rewritten, the
//! bodies are copied into a `msg` batch, which is made durable, and only
//! then is a `MoveBodies` record logged in `evt` (durable too) that points
//! each message at its copy, if it still points at the original. Only
//! after that does the segment's count (`State::evt_refs`, which counts
//! bodies like events) reach zero, so it can go.
//!
//! A crash after the copy leaves orphan `msg` records, reclaimed with
//! their segment once nothing points there; after the move, the old
//! bodies are dead and their segment is reclaimed by a later pass.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::record::{BodyMove, RELOCATIONS_PER_RECORD_MAX};
use super::runtime::CompactionStep;
use super::submit::*;
use super::Command;
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::messaging::body::body_of_effect;
use crate::inbox::messaging::record::MSG_RECORD;
use crate::inbox::shared::Shared;
use crate::inbox::state::{body_at, pack, unpack, BodyLog, PackedLoc};
use crate::log::{Batch, SegmentId};

/// Bodies a scan collects before they are moved: what a move holds in
/// memory is this many entries, not a whole segment's bodies.
const BODIES_PER_SCAN: usize = 4096;

/// Where a scan for bodies stopped: the index of a conversation in the
/// pass's list, and the seq to go on after in it.
#[derive(Default)]
struct Cursor {
    conv: usize,
    after: MsgSeq,
}

/// The next retained messages, up to `limit`, whose bodies are in one of
/// the `evt` segments `segs`, as (conv, msg_seq, message location), from
/// `cursor` on (which it moves past them). Walks each conversation's
/// index above its [`Conv::bodies_in_msg_to`] (the messages whose bodies
/// may still be in `evt`: not the whole history, which lives mostly in
/// file pages), a chunk of conversations per hold of the lock; a pass
/// calls it only when some segment is held by bodies alone or is about to
/// be rewritten.
fn bodies_in(
    shared: &Shared,
    segs: &HashSet<SegmentId>,
    convs: &[ConvId],
    cursor: &mut Cursor,
    limit: usize,
) -> Vec<(ConvId, MsgSeq, PackedLoc)> {
    let mut out = Vec::new();
    while cursor.conv < convs.len() {
        let st = shared.state.read();
        let chunk_end = (cursor.conv + CONVS_PER_CHUNK).min(convs.len());
        while cursor.conv < chunk_end {
            let conv = convs[cursor.conv];
            if let Some(c) = st.convs.get(&conv) {
                // Below the hint every body is in `msg` already.
                let from = c.bodies_in_msg_to.0.max(c.msgs_base).max(cursor.after);
                let skip = from.0 - c.msgs_base.0;
                for (i, m) in (skip..).zip(c.msgs.iter_from(skip as usize)) {
                    let (log, at) = body_at(m.loc);
                    if log == BodyLog::Evt && segs.contains(&unpack(at).segment) {
                        let seq = c.msgs_base.plus(i + 1);
                        out.push((conv, seq, m.loc));
                        if out.len() >= limit {
                            cursor.after = seq;
                            return out;
                        }
                    }
                }
            }
            cursor.conv += 1;
            cursor.after = MsgSeq(0);
        }
    }
    out
}

/// Moves every retained body held in the `evt` segments `segs` into the
/// `msg` log (see the module doc), [`BODIES_PER_SCAN`] at a time; returns
/// how many moved.
pub(crate) fn move_bodies_out(
    shared: &Shared,
    submit: Submit<'_>,
    segs: &HashSet<SegmentId>,
) -> Result<u64> {
    let convs: Vec<ConvId> = shared.state.read().convs.keys().copied().collect();
    let mut cursor = Cursor::default();
    let mut total = 0u64;
    let rate = shared.config.compaction_bytes_per_s.max(1);
    let started = Instant::now();
    let mut copied = 0u64;
    loop {
        let todo = bodies_in(shared, segs, &convs, &mut cursor, BODIES_PER_SCAN);
        if todo.is_empty() {
            return Ok(total);
        }
        total += todo.len() as u64;
        copied += move_bodies(shared, submit, todo, copied, started, rate)?;
    }
}

/// Copies the bodies `todo` into `msg` batches and points their messages
/// at the copies (see the module doc); returns the bytes copied. The copy
/// keeps to `rate` bytes a second counted from `started`, with `before`
/// bytes already copied.
fn move_bodies(
    shared: &Shared,
    submit: Submit<'_>,
    mut todo: Vec<(ConvId, MsgSeq, PackedLoc)>,
    before: u64,
    started: Instant,
    rate: u64,
) -> Result<u64> {
    let room = REWRITE_BATCH_BYTES.min(shared.config.segment_bytes / 2);
    let mut copied = 0u64;
    todo.reverse();
    while !todo.is_empty() {
        let mut batch = Batch::new();
        let mut olds = Vec::new();
        let mut size = 0u64;
        while let Some(&(conv, seq, from)) = todo.last() {
            let at = body_at(from).1;
            let rec = shared.evt_log.read(unpack(at))?;
            let body =
                body_of_effect(rec.kind, &rec.payload).map_err(|reason| Error::Corruption {
                    what: "evt",
                    reason: format!("body of conv {conv} message {seq}: {reason}"),
                })?;
            let len = (RECORD_HEADER_LEN + body.len()) as u64;
            if !batch.is_empty() && size + len > room {
                break;
            }
            batch.push(MSG_RECORD, &body);
            size += len;
            olds.push((conv, seq, from));
            todo.pop();
        }
        // Durable before any message points at it.
        let appended = shared.msg_log.append(batch)?;
        copied += size;
        let due = Duration::from_secs_f64((before + copied) as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        shared.compaction.step(CompactionStep::BodiesCopied);
        let moves: Vec<BodyMove> = olds
            .iter()
            .zip(&appended.locs)
            .map(|(&(conv, msg_seq, from), to)| BodyMove {
                conv,
                msg_seq,
                from,
                to: pack(*to),
            })
            .collect();
        for chunk in moves.chunks(per_command(shared, 32, RELOCATIONS_PER_RECORD_MAX)) {
            call(submit, |tx| Command::MoveBodies {
                moves: chunk.to_vec(),
                tx,
            })?;
        }
        super::rewrite::suspect_active(shared);
        shared.compaction.step(CompactionStep::BodiesMoved);
    }
    Ok(copied)
}
