//! `apply` of the messaging records: a message's fan-out, the recipients'
//! conversation state and unread counts (R4, R5, R6, R14), and the
//! idempotency keys (R4).
//!
//! Invariants kept here:
//! - a conversation's messages are contiguous by `msg_seq` (R1);
//! - recipients are the members whose period covers the message (R5),
//!   except above a large group's switch (R7, `large.rs`);
//! - a recall tombstones its target and, through the edit links, every
//!   edit descending from it (R6);
//! - `unread` counts exactly the normal, not recalled messages from others
//!   inside the member's periods, retained and above its read cursor (R14).

use std::sync::Arc;

use super::idem;
use super::record::MsgEffect;
use crate::api::*;
use crate::inbox::messaging::rows::RecipientMessage;
use crate::inbox::state::record::{ApplyError, Touched};
use crate::inbox::state::{
    msg_counter, Conv, LastEntry, MsgMeta, PackedLoc, Period, State, Summary, User, FLAG_EDITED,
    FLAG_RECALLED, OPEN,
};

/// A recall of `target_seq` also recalls its edits, the edits of those,
/// and so on: an edit carries the recalled message's new body. Edits never
/// count as unread, so no count moves. The links of recalled messages are
/// dropped: a recalled message cannot be edited or recalled again.
fn recall_edits(conv: &mut Conv, target_seq: MsgSeq) {
    let mut pending = conv
        .edits
        .written()
        .and_then(|e| e.remove(&target_seq))
        .unwrap_or_default();
    while let Some(seq) = pending.pop() {
        conv.update_meta(seq, |meta| meta.flags |= FLAG_RECALLED);
        if let Some(more) = conv.edits.written().and_then(|e| e.remove(&seq)) {
            pending.extend(more);
        }
    }
}

impl State {
    /// Messages in `(uid's read_seq, up_to]` of `conv` that count as unread
    /// for `uid`.
    pub(crate) fn countable_between(&self, uid: Uid, conv: ConvId, up_to: MsgSeq) -> u32 {
        let (Some(c), Some(user)) = (self.convs.get(&conv), self.users.get(&uid)) else {
            return 0;
        };
        let Some(uc) = user.convs.get(&conv) else {
            return 0;
        };
        let Some(periods) = c.members.get(&uid) else {
            return 0;
        };
        let mut n = 0u32;
        for p in periods {
            let lo = p.join_seq.max(uc.read_seq.next()).max(c.msgs_base.next());
            // Above a large group's switch, unread is derived (`large`).
            let hi = p
                .leave_seq
                .min(up_to)
                .min(c.head())
                .min(c.fanned_out_until());
            for seq in lo.through(hi) {
                if let Some(m) = c.meta(seq) {
                    if m.kind == MessageKind::Normal
                        && m.flags & FLAG_RECALLED == 0
                        && uid != { m.sender }
                    {
                        n = n.saturating_add(1);
                    }
                }
            }
        }
        n
    }

    pub(crate) fn apply_msg(
        &mut self,
        m: &MsgEffect,
        evt_loc: PackedLoc,
        stamp: u64,
        touched: &mut Touched,
    ) -> Result<(), ApplyError> {
        let conv = Arc::make_mut(self.convs.entry(m.conv).or_default());
        if m.msg_seq != conv.head().next() {
            return Err(ApplyError(format!(
                "conv {} message seq {} does not follow head {}",
                m.conv,
                m.msg_seq,
                conv.head()
            )));
        }
        self.totals.messages += 1;
        if let (Some(file), None) = (&self.scratch.0, conv.msgs.file()) {
            conv.msgs.use_file(file);
        }
        conv.msgs.push(MsgMeta {
            loc: m.msg_loc,
            msg_id: m.msg_id,
            sender: m.sender,
            kind: m.kind,
            flags: 0,
        });
        crate::inbox::state::count_msg_ref(
            [&mut self.evt_refs, &mut self.body_refs, &mut self.msg_refs],
            m.msg_loc,
            true,
        );
        self.next_msg_counter = self.next_msg_counter.max(msg_counter(m.msg_id) + 1);
        match m.kind {
            MessageKind::Join => {
                let periods = Arc::make_mut(&mut conv.members).entry_or_default(m.sender);
                if periods.last().is_some_and(|p| p.leave_seq == OPEN) {
                    return Err(ApplyError(format!(
                        "uid {} joins conv {} twice",
                        m.sender, m.conv
                    )));
                }
                let period_id = u32::try_from(periods.len()).unwrap_or(u32::MAX);
                periods.push(Period {
                    period_id,
                    join_seq: m.msg_seq,
                    leave_seq: OPEN,
                });
            }
            MessageKind::Recall | MessageKind::Edit => {
                let target_seq = m.target_seq;
                let Some(target) = conv.meta(target_seq) else {
                    return Err(ApplyError(format!(
                        "recall/edit of missing seq {target_seq}"
                    )));
                };
                if m.kind == MessageKind::Recall
                    && target_seq <= conv.fanned_out_until()
                    && target.kind == MessageKind::Normal
                    && target.flags & FLAG_RECALLED == 0
                {
                    // The recalled message stops counting as unread for
                    // everyone who received it and has not read it.
                    for uid in conv.members_at(target_seq) {
                        if uid == { target.sender } {
                            continue;
                        }
                        if let Some(uc) = self
                            .users
                            .get_mut(&uid)
                            .map(Arc::make_mut)
                            .and_then(|u| u.convs.get_mut(&m.conv))
                        {
                            if uc.read_seq < target_seq {
                                uc.unread = uc.unread.saturating_sub(1);
                                uc.stamp = stamp;
                            }
                        }
                    }
                }
                let flag = if m.kind == MessageKind::Recall {
                    FLAG_RECALLED
                } else {
                    FLAG_EDITED
                };
                let conv = self
                    .convs
                    .get_mut(&m.conv)
                    .map(Arc::make_mut)
                    .ok_or_else(|| ApplyError("conv vanished".into()))?;
                conv.update_meta(target_seq, |meta| meta.flags |= flag);
                if m.kind == MessageKind::Edit {
                    conv.edits
                        .make_mut()
                        .entry(target_seq)
                        .or_default()
                        .push(m.msg_seq);
                } else {
                    recall_edits(conv, target_seq);
                }
            }
            MessageKind::Normal | MessageKind::Leave => {}
        }
        let conv = self
            .convs
            .get_mut(&m.conv)
            .map(Arc::make_mut)
            .ok_or_else(|| ApplyError("conv vanished".into()))?;
        // One summary per message: the large group's newest entry and every
        // row the message reaches share it.
        let summary = Summary::new(&m.summary);
        let mut recipients = recipients(conv, m, &summary, stamp);
        // Members that live in other groups get theirs through the
        // outbox (`fanout::route`).
        if let Some(placement) = self.fanout.routing.get() {
            recipients.retain(|&uid| placement.owns_uid(uid));
        }
        if m.kind == MessageKind::Leave {
            let closed = Arc::make_mut(&mut conv.members)
                .get_mut(&m.sender)
                .and_then(|ps| ps.last_mut())
                .filter(|p| p.leave_seq == OPEN)
                .map(|p| p.leave_seq = m.msg_seq);
            if closed.is_none() {
                return Err(ApplyError(format!(
                    "uid {} leaves conv {} without being in it",
                    m.sender, m.conv
                )));
            }
        }
        // The recipients are rarely in the cache, and each one's lookup,
        // row search and event push would wait on memory in turn. Passes
        // that only start loads let those misses overlap: first the users'
        // own lines, then the lists they point at, then each one's row of
        // this conversation, found in the keys the second pass loaded.
        // Each user is looked up once for all three.
        let found: Vec<&Arc<User>> = recipients
            .iter()
            .filter_map(|uid| self.users.get(uid))
            .collect();
        for user in &found {
            crate::inbox::state::prefetch_user(user);
        }
        for user in &found {
            user.prefetch_for_message();
        }
        for user in &found {
            user.convs.prefetch_value(&m.conv);
        }
        drop(found);
        let taken = RecipientMessage {
            conv: m.conv,
            msg_seq: m.msg_seq,
            msg_id: m.msg_id,
            sender: m.sender,
            kind: m.kind,
            at_ms: m.at_ms,
            summary: &summary,
        };
        for uid in recipients {
            let user = Arc::make_mut(self.users.entry(uid).or_default());
            let seq = user.take_message(uid, &taken, evt_loc, stamp);
            touched.events.push((uid, seq));
        }
        touched.conv = Some((m.conv, m.msg_seq));
        if m.kind != MessageKind::Join && m.kind != MessageKind::Leave {
            self.remember_idem(m);
        }
        Ok(())
    }

    fn remember_idem(&mut self, m: &MsgEffect) {
        // Expiry is judged by the stamped time of the message being
        // applied, so replay expires exactly the same keys.
        let sent = idem::Sent {
            sender: m.sender,
            cmid: m.client_msg_id,
            conv: m.conv,
            msg_seq: m.msg_seq,
            msg_id: m.msg_id,
        };
        self.idem.insert(sent, m.at_ms, self.idem_ttl_ms);
    }
}

/// Who gets an event for message `m` in `conv`, which `apply` has just
/// indexed: every member whose period covers it, except above a large
/// group's switch, where only a joining or leaving member gets its own
/// entry and the group's newest entry is remembered instead, sharing the
/// message's `summary` with the rows it reaches.
pub(crate) fn recipients(
    conv: &mut Conv,
    m: &MsgEffect,
    summary: &Summary,
    stamp: u64,
) -> Vec<Uid> {
    let Some(large) = conv.large.as_mut() else {
        return conv.members_at(m.msg_seq);
    };
    large.last = LastEntry {
        msg_seq: m.msg_seq,
        msg_id: m.msg_id,
        sender: m.sender,
        summary: summary.clone(),
        at_ms: m.at_ms,
    };
    large.stamp = stamp;
    match m.kind {
        MessageKind::Join | MessageKind::Leave => vec![m.sender],
        _ => Vec::new(),
    }
}
