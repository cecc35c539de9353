//! The state machine's own invariants, asserted the way the log asserts
//! its framing: a cheap subset after every `apply` (release builds too),
//! the full check after recovery in debug builds and from the model tests.
//!
//! - Watermark order: `events_base <= head` and `committed_seq <= head`
//!   for a user; `msgs_base <= head` and `committed_seq <= head` for a
//!   conversation; a device's ACK is never above its user's head, and a
//!   lease's `resume_from <= hwm <= head`.
//! - Cursor bounds: a read cursor never passes its conversation's head.
//! - Membership: a member's periods are ordered and do not overlap, and
//!   only the last one may be open.
//! - Edit links: each links a retained, not recalled message to edit
//!   entries above it (an edit may have been recalled on its own since;
//!   full check only).
//! - Body hint: every retained message at or below a conversation's
//!   `bodies_in_msg_to` has its body in `msg` (full check only).
//! - Reference counts: the per-segment counts equal a recount of the
//!   indexes ([`State::check_seg_refs`]); `unread` equals a recount of
//!   the messages that count for it (full check only).

use super::record::{ApplyError, Touched};
use super::{Conv, State, User, FLAG_RECALLED, OPEN};
use crate::api::{ConvId, MessageKind, Uid};

impl State {
    /// The cheap subset, on what one `apply` touched.
    pub(crate) fn check_touched(&self, touched: &Touched) -> Result<(), ApplyError> {
        // O(1) per touched user: a message to a large group touches
        // every member, so the device rows are left to the full check.
        for &(uid, _) in &touched.events {
            if let Some(u) = self.users.get(&uid) {
                check_user_watermarks(uid, u, false).map_err(ApplyError)?;
            }
        }
        if let Some((conv, _)) = touched.conv {
            if let Some(c) = self.convs.get(&conv) {
                check_conv_watermarks(conv, c).map_err(ApplyError)?;
            }
        }
        Ok(())
    }

    /// Every invariant of the module doc, in O(state).
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let recount = self.recount_totals();
        if self.totals != recount {
            return Err(format!(
                "entry totals {:?} differ from a recount {recount:?}",
                self.totals
            ));
        }
        for (&conv, c) in &self.convs {
            check_conv_watermarks(conv, c)?;
            check_edit_links(conv, c)?;
            check_bodies_hint(conv, c)?;
            for (uid, periods) in c.members.iter() {
                for pair in periods.windows(2) {
                    if pair[0].leave_seq == OPEN || pair[0].leave_seq >= pair[1].join_seq {
                        return Err(format!(
                            "conv {conv}: periods of uid {uid} overlap or are out of order"
                        ));
                    }
                }
                if periods.iter().any(|p| p.leave_seq < p.join_seq) {
                    return Err(format!(
                        "conv {conv}: a period of uid {uid} ends before it starts"
                    ));
                }
            }
        }
        for (&uid, u) in &self.users {
            check_user_watermarks(uid, u, true)?;
            for (&conv, uc) in &u.convs {
                // A conversation of another group: its rows here are fed by
                // fan-out deliveries (`fanout`).
                let elsewhere = |p: &crate::inbox::fanout::slot::Placement| {
                    !p.owns(crate::inbox::fanout::slot::slot_of_conv(conv))
                };
                if self.fanout.routing.get().is_some_and(elsewhere) {
                    continue;
                }
                let Some(c) = self.convs.get(&conv) else {
                    return Err(format!("uid {uid} has state in unknown conv {conv}"));
                };
                if uc.read_seq > c.head() {
                    return Err(format!(
                        "uid {uid}: read cursor {} of conv {conv} is beyond its head {}",
                        uc.read_seq,
                        c.head()
                    ));
                }
                let recount = self.countable_between(uid, conv, c.head());
                if recount != uc.unread {
                    return Err(format!(
                        "uid {uid}: unread of conv {conv} is {}, recounted {recount}",
                        uc.unread
                    ));
                }
            }
        }
        self.check_seg_refs()
    }
}

fn check_user_watermarks(uid: Uid, u: &User, devices: bool) -> Result<(), String> {
    let head = u.head();
    if u.committed_seq > head {
        return Err(format!(
            "uid {uid}: committed sync_seq {} is above the head {head}",
            u.committed_seq
        ));
    }
    if !devices {
        return Ok(());
    }
    for d in &u.devices {
        let row = &d.row;
        if row.acked_sync_seq > head {
            return Err(format!(
                "uid {uid}: device {} ACKed {} above the head {head}",
                row.device, row.acked_sync_seq
            ));
        }
        if let Some(l) = &row.lease {
            if l.resume_from > l.hwm || l.hwm > head {
                return Err(format!(
                    "uid {uid}: lease {} of device {} is out of order ({}..{} at head {head})",
                    l.lease_id, row.device, l.resume_from, l.hwm
                ));
            }
        }
    }
    Ok(())
}

fn check_conv_watermarks(conv: ConvId, c: &Conv) -> Result<(), String> {
    let head = c.head();
    if c.committed_seq > head || c.msgs_base > head {
        return Err(format!(
            "conv {conv}: committed {} or base {} above the head {head}",
            c.committed_seq, c.msgs_base
        ));
    }
    Ok(())
}

fn check_edit_links(conv: ConvId, c: &Conv) -> Result<(), String> {
    let live = |seq| c.meta(seq).filter(|m| m.flags & FLAG_RECALLED == 0);
    for (&target, edits) in c.edits.iter() {
        if live(target).is_none() {
            return Err(format!(
                "conv {conv}: edits link to seq {target}, which is recalled or not retained"
            ));
        }
        for &seq in edits {
            let edit = c.meta(seq).is_some_and(|m| m.kind == MessageKind::Edit);
            if seq <= target || !edit {
                return Err(format!(
                    "conv {conv}: seq {seq} is linked as an edit of seq {target}"
                ));
            }
        }
    }
    Ok(())
}

fn check_bodies_hint(conv: ConvId, c: &Conv) -> Result<(), String> {
    let to = c.bodies_in_msg_to.0;
    for (seq, m) in (c.msgs_base.0 + 1..=to.0).zip(c.msgs.iter()) {
        if m.loc == super::PENDING_LOC || super::body_at(m.loc).0 != super::BodyLog::Msg {
            return Err(format!(
                "conv {conv}: message {seq} is at or below the bodies hint {to} but its body is not in msg"
            ));
        }
    }
    Ok(())
}
