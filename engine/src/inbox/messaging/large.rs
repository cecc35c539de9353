//! Large groups (R7): above a member threshold a conversation stops
//! fanning out. Its messages are stored once, as always, but no member
//! gets an event for them and no member's conversation state changes.
//!
//! The dirty marker is *derived*, not written. A member's marker target is
//! the conversation's newest `msg_seq` inside the member's periods; the
//! member's `(uid, conv)` state keeps only the cleared position
//! (`UserConv::cleared_seq`). The marker is dirty while the target is
//! above both the cleared position and the last entry fanned out to the
//! member (`last_msg_seq`: the switch itself, or the member's own join or
//! leave). The version is the target: every entry raises it by one and it
//! never goes down, so a compare-and-set on the observed target is a
//! compare-and-set on the version. A message therefore writes nothing per
//! member, and a marker cannot be lost: it is computed each time it is
//! read (`docs/SEMANTICS.md`, R7, says why this beats a row per member).
//!
//! The switch ([`ModeEffect`], `large_record.rs`) is one `evt` record at one `msg_seq`: the
//! entry that made the group large (the join that crossed the threshold)
//! is the last one fanned out; everything above it is not. The record is
//! in the same batch as that join, so a crash leaves the group in one mode
//! or the other. Groups never switch back (R7 in `docs/SEMANTICS.md`).
//! Above the switch a message reaches only a joining or leaving member
//! (`apply.rs`, `recipients`).
//!
//! Unread above the switch is an approximation, computed on read: the
//! entries between the read cursor and the target (joins, leaves, recalls,
//! edits and the member's own messages included). Below the switch the
//! stored count stays exact, and the two never overlap.

use super::large_record::{ClearEffect, ModeEffect};
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::containers::sorted::SortedSet;
use crate::inbox::round::{reply_with, Sink, Tx};
use crate::inbox::shared::{blocking, Miss, Shared};
use crate::inbox::state::{ActivityKey, Conv, MsgMeta, State, Summary, User, UserConv, OPEN};

/// The conversation's newest `msg_seq` up to `head` inside `uid`'s
/// periods: the marker's target and version (0 if none).
pub(crate) fn target(c: &Conv, uid: Uid, head: MsgSeq) -> MsgSeq {
    c.members
        .get(&uid)
        .and_then(|ps| ps.iter().rev().find(|p| p.join_seq <= head))
        .map_or(MsgSeq(0), |p| p.leave_seq.min(head))
}

/// The member's marker as of `head`, if it is dirty.
fn marker(c: &Conv, uid: Uid, uc: &UserConv, head: MsgSeq) -> Option<DirtyMarker> {
    c.large.as_ref()?;
    let target = target(c, uid, head);
    (target > uc.cleared_seq.max(uc.last_msg_seq)).then_some(DirtyMarker {
        conv: ConvId(0),
        target_msg_seq: target,
        version: target.0,
    })
}

/// `uc.unread` (exact, at or below the switch) plus the approximation
/// above it, up to `head`: entries after the read cursor inside the
/// member's periods.
pub(crate) fn unread(c: &Conv, uid: Uid, uc: &UserConv, head: MsgSeq) -> u32 {
    let Some(large) = c.large.as_ref() else {
        return uc.unread;
    };
    let mut extra = 0u64;
    for p in c.members.get(&uid).into_iter().flatten() {
        let lo = p
            .join_seq
            .max(uc.read_seq)
            .max(large.switch_seq)
            .max(c.msgs_base);
        let hi = p.leave_seq.min(head);
        extra += hi.0.saturating_sub(lo.0);
    }
    uc.unread
        .saturating_add(u32::try_from(extra).unwrap_or(u32::MAX))
}

/// A user's conversation list order when any of its conversations is a
/// large group (`None`: the stored order is right): the large groups'
/// keys are replaced by those of their rows as [`list_row`] shows them.
pub(crate) fn list_order(st: &State, uid: Uid, user: &User) -> Option<SortedSet<ActivityKey>> {
    let mut order: Option<SortedSet<ActivityKey>> = None;
    for (&conv, uc) in &user.convs {
        let Some((row, _)) = st.convs.get(&conv).and_then(|c| list_row(c, uid, conv, uc)) else {
            continue;
        };
        let key = (row.last_activity_ms, row.last_msg_id, conv);
        if key != uc.key(conv) {
            let o = order.get_or_insert_with(|| user.order.clone());
            o.replace(&uc.key(conv), key);
        }
    }
    order
}

/// The conversation list row of `uid` in a large group `c`, and the stamp
/// to wait for; `None` for other conversations.
pub(crate) fn list_row(
    c: &Conv,
    uid: Uid,
    conv: ConvId,
    uc: &UserConv,
) -> Option<(ConvSummary, u64)> {
    row_at(c, uid, conv, uc, c.committed_seq)
}

/// [`list_row`] as of `upto`: the durable head for reads, the sequencer's
/// head for a snapshot (decided in the sequencer, served once durable).
pub(crate) fn row_at(
    c: &Conv,
    uid: Uid,
    conv: ConvId,
    uc: &UserConv,
    upto: MsgSeq,
) -> Option<(ConvSummary, u64)> {
    let large = c.large.as_ref()?;
    let head = target(c, uid, upto);
    let mut row = uc.clone();
    if large.last.msg_seq == head && head > uc.last_msg_seq {
        row.last_msg_seq = head;
        row.last_msg_id = large.last.msg_id;
        row.last_sender = large.last.sender;
        row.last_summary = large.last.summary.clone();
        row.last_activity_ms = large.last.at_ms;
    } else if head > uc.last_msg_seq {
        // The newest entry is not the member's to see (it left) or not
        // durable yet: name the authoritative head without a summary.
        if let Some(m) = c.meta(head) {
            row.last_msg_seq = head;
            row.last_msg_id = m.msg_id;
            row.last_sender = m.sender;
            row.last_summary = Summary::default();
        }
    }
    row.unread = unread(c, uid, uc, upto);
    let hide = c.meta(row.last_msg_seq).is_some_and(MsgMeta::hides_summary);
    Some((row.summary(conv, hide), large.stamp.max(uc.stamp)))
}

/// The dirty large groups of `uid`, by conversation id, as of the durable
/// heads (R7). Waits for the rows it reads to be durable, like every read.
pub(crate) fn dirty_markers(shared: &Shared, uid: Uid) -> Result<Vec<DirtyMarker>> {
    blocking(shared, || dirty_markers_once(shared, uid))
}

/// One look at `uid`'s markers: memory only.
pub(crate) fn dirty_markers_once(
    shared: &Shared,
    uid: Uid,
) -> std::result::Result<Vec<DirtyMarker>, Miss> {
    let st = shared.state.read();
    let Some(user) = st.users.get(&uid) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut stamp = 0;
    for (&conv, uc) in &user.convs {
        let Some(c) = st.convs.get(&conv) else {
            continue;
        };
        if let Some(m) = marker(c, uid, uc, c.committed_seq) {
            stamp = stamp.max(uc.stamp);
            out.push(DirtyMarker { conv, ..m });
        }
    }
    drop(st);
    shared.check_settled(stamp)?;
    out.sort_by_key(|m| m.conv);
    Ok(out)
}

/// The dirty markers of large group `conv` for those of `uids` that are
/// its members, as of its durable head. A hint, not a read: a member's
/// cleared position may be a round ahead of durable, which can only hide
/// a marker that a `DIRTY` would then show.
pub(crate) fn markers_among(
    shared: &Shared,
    conv: ConvId,
    uids: &[Uid],
) -> Vec<(Uid, DirtyMarker)> {
    let st = shared.state.read();
    let Some(c) = st.convs.get(&conv) else {
        return Vec::new();
    };
    uids.iter()
        .filter_map(|&uid| {
            let uc = st.users.get(&uid)?.convs.get(&conv)?;
            let m = marker(c, uid, uc, c.committed_seq)?;
            Some((uid, DirtyMarker { conv, ..m }))
        })
        .collect()
}

/// A conversation's mode, head and (optionally) one member's marker, for
/// operators (`inboxctl conv`, `explain`).
pub(crate) fn conv_mode(shared: &Shared, conv: ConvId, uid: Option<Uid>) -> Result<ConvMode> {
    let st = shared.state.read();
    let c = st
        .convs
        .get(&conv)
        .ok_or_else(|| Error::NotFound(format!("conv {conv}")))?;
    let members = c
        .members
        .values()
        .filter(|ps| ps.last().is_some_and(|p| p.leave_seq == OPEN));
    let marker = uid.and_then(|uid| {
        let uc = st.users.get(&uid)?.convs.get(&conv)?;
        let target = target(c, uid, c.committed_seq);
        Some(MemberMarker {
            uid,
            target_msg_seq: target,
            version: target.0,
            cleared_seq: uc.cleared_seq.max(uc.last_msg_seq),
            dirty: marker(c, uid, uc, c.committed_seq).is_some(),
        })
    });
    Ok(ConvMode {
        conv,
        large: c.large.is_some(),
        switch_seq: c.large.as_ref().map(|l| l.switch_seq),
        head: c.committed_seq,
        members: members.count() as u64,
        marker,
    })
}

/// After a join: the switch to a large group, when the join took the
/// member count above `threshold` (0: never).
pub(crate) fn maybe_switch(st: &mut State, sink: &mut dyn Sink, conv: ConvId, threshold: u32) {
    let Some(c) = st.convs.get(&conv) else {
        return;
    };
    if threshold == 0 || c.large.is_some() {
        return;
    }
    let members = c
        .members
        .values()
        .filter(|ps| ps.last().is_some_and(|p| p.leave_seq == OPEN))
        .count();
    if members as u64 > u64::from(threshold) {
        let switch_seq = c.head();
        sink.effect(st, ModeEffect { conv, switch_seq }.into());
    }
}

/// Clears `uid`'s marker of `conv` if its version is still `version`: the
/// client has pulled up to it and stored its position (R7). A newer entry
/// makes it `MarkerMoved` with the current version, and nothing changes.
pub(crate) fn exec_clear(
    st: &mut State,
    sink: &mut dyn Sink,
    uid: Uid,
    conv: ConvId,
    version: u64,
    tx: Tx<MsgSeq>,
) {
    let decided = (|| {
        let c = st
            .convs
            .get(&conv)
            .ok_or_else(|| Error::NotFound(format!("conv {conv}")))?;
        let uc = st
            .users
            .get(&uid)
            .and_then(|u| u.convs.get(&conv))
            .ok_or_else(|| Error::Forbidden(format!("uid {uid} was never in conv {conv}")))?;
        if c.large.is_none() {
            return Err(Error::BadRequest(format!(
                "conv {conv} is not a large group: it has no markers"
            )));
        }
        let current = target(c, uid, c.head());
        if version > current.0 {
            return Err(Error::BadRequest(format!(
                "version {version} is beyond the marker's target {current}"
            )));
        }
        if version < current.0 {
            return Err(Error::MarkerMoved { version: current.0 });
        }
        Ok((current, current > uc.cleared_seq))
    })();
    match decided {
        Err(e) => sink.reply(reply_with(tx, Err(e))),
        Ok((current, changes)) => {
            if changes {
                let effect = ClearEffect {
                    uid,
                    conv,
                    cleared_seq: current,
                };
                sink.effect(st, effect.into());
            }
            sink.reply(reply_with(tx, Ok(current)));
        }
    }
}
