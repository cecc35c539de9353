//! Messaging reads: pull, history and the conversation list (R12, R13,
//! R15). None of them goes through the sequencer.
//!
//! Invariant: a read never reveals a change that is not durable. Event and
//! message ranges are clamped to the committed watermarks (which the
//! completion stage advances only after fsync); rows that carry a `stamp`
//! (conversation state, devices) are served only once the round that last
//! changed them has settled, re-reading after the wait.
//!
//! Tombstones: the tombstone flag is set in memory when a recall/edit is
//! applied, before it is durable, and is checked again after the record is
//! read, so once any reader has seen a recall the original body is never
//! served again (R6).

use std::ops::RangeInclusive;

use bytes::Bytes;

use super::body::{bodies_cached, read_ahead_bodies, read_message};
use super::record::StoredPayload;
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::codec::DecodeError;
use crate::inbox::shared::{blocking, Miss, Shared};
use crate::inbox::state::{ActivityKey, Conv, MsgMeta, Period, State, OPEN};

/// At most this many conversations per pull.
pub(crate) const PULL_CONVS_MAX: usize = 1024;

/// A record that fails to decode although its CRC verified.
pub(crate) fn corrupt(what: &'static str, e: &DecodeError) -> Error {
    Error::Corruption {
        what,
        reason: e.0.to_string(),
    }
}

/// The user's periods in `conv` whose join is durable, clipped to the
/// committed head.
fn visible_periods(conv: &Conv, uid: Uid) -> Vec<RangeInclusive<MsgSeq>> {
    let committed = conv.committed_seq;
    conv.members
        .get(&uid)
        .map(|ps| {
            ps.iter()
                .filter(|p: &&Period| p.join_seq <= committed)
                .map(|p| p.join_seq..=p.leave_seq.min(committed))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether history retention has reclaimed message `seq` of `conv`.
fn reclaimed(shared: &Shared, conv: ConvId, seq: MsgSeq) -> bool {
    shared
        .state
        .read()
        .convs
        .get(&conv)
        .is_some_and(|c| seq <= c.msgs_base)
}

/// What a retried send asked for, to compare with what the key first sent.
pub(crate) struct Retry {
    pub kind: MessageKind,
    pub msg_type: MsgType,
    pub target: MsgId,
    pub payload: StoredPayload,
}

/// The reply to a send whose idempotency key was seen before: the original
/// ids if the retry asks for the same message, else `CONFLICT`. Runs on
/// the caller's thread once the round is durable (the sequencer never reads
/// the log). An original no longer readable (reclaimed by history
/// retention) cannot be compared and counts as the same.
pub(crate) fn duplicate_reply(
    shared: &Shared,
    conv: ConvId,
    original: SendReply,
    retry: &Retry,
) -> Result<SendReply> {
    let loc = {
        let st = shared.state.read();
        st.convs
            .get(&conv)
            .and_then(|c| c.meta(original.msg_seq))
            .map(|m| m.loc)
    };
    let Some(loc) = loc else {
        return Ok(original);
    };
    let (h, payload) = match read_message(shared, conv, original.msg_seq, loc) {
        Ok(m) => m,
        Err(_) if reclaimed(shared, conv, original.msg_seq) => return Ok(original),
        Err(e) => return Err(e),
    };
    let same = h.msg_id == original.msg_id
        && h.kind == retry.kind
        && h.msg_type == retry.msg_type
        && h.target == retry.target
        && StoredPayload::new(&payload) == retry.payload;
    if !same {
        return Err(Error::Conflict(format!(
            "client_msg_id was already used for message {} with a different request",
            original.msg_id
        )));
    }
    Ok(original)
}

fn authorize(st: &State, uid: Uid, conv: ConvId) -> Result<(&Conv, Vec<RangeInclusive<MsgSeq>>)> {
    let forbidden = || Error::Forbidden(format!("uid {uid} was never a member of conv {conv}"));
    let c = st.convs.get(&conv).ok_or_else(forbidden)?;
    let periods = visible_periods(c, uid);
    if periods.is_empty() {
        return Err(forbidden());
    }
    Ok((c, periods))
}

/// Reads the message records behind `metas` and builds the replies.
fn materialize(
    shared: &Shared,
    conv: ConvId,
    metas: Vec<(MsgSeq, MsgMeta)>,
) -> Result<Vec<Message>> {
    let mut out = Vec::with_capacity(metas.len());
    for (seq, meta) in &metas {
        let (h, payload) = match read_message(shared, conv, *seq, meta.loc) {
            Ok(m) => m,
            // History retention reclaimed it (and maybe its segment) since
            // the plan was taken: it is not served, like any message below
            // the retained base.
            Err(_) if reclaimed(shared, conv, *seq) => continue,
            Err(e) => return Err(e),
        };
        if h.conv != conv || h.msg_seq != *seq || h.msg_id != { meta.msg_id } {
            return Err(Error::Invariant(format!(
                "message index of conv {conv} seq {seq} points at another record"
            )));
        }
        out.push(Message {
            conv,
            msg_seq: h.msg_seq,
            msg_id: h.msg_id,
            sender: h.sender,
            kind: h.kind,
            msg_type: h.msg_type,
            target: (h.target != MsgId(0)).then_some(h.target),
            sent_at_ms: h.sent_at_ms,
            tombstone: meta.tombstone(),
            payload,
        });
    }
    // Re-check after reading: a recall applied meanwhile hides the body.
    let st = shared.state.read();
    if let Some(c) = st.convs.get(&conv) {
        for m in &mut out {
            if c.meta(m.msg_seq).is_some_and(MsgMeta::tombstone) {
                m.tombstone = true;
            }
        }
    }
    for m in &mut out {
        if m.tombstone {
            m.payload = Bytes::new();
        }
    }
    Ok(out)
}

pub(crate) fn pull(
    shared: &Shared,
    uid: Uid,
    cursors: &[(ConvId, MsgSeq)],
    limit: u32,
) -> Result<Vec<ConvPull>> {
    let plan = plan_pull(shared, uid, cursors, limit)?;
    read_pull(shared, plan)
}

/// A pull's answer before its records are read: per conversation, the
/// entries to read, whether more follow, and the head.
pub(crate) struct PullPlan(Vec<ConvPlan>);

/// One conversation of a [`PullPlan`].
struct ConvPlan {
    conv: ConvId,
    metas: Vec<(MsgSeq, MsgMeta)>,
    has_more: bool,
    head: MsgSeq,
}

impl PullPlan {
    /// Whether every record it would read is in the page cache
    /// ([`bodies_cached`]).
    pub(crate) fn cached(&self, shared: &Shared) -> bool {
        bodies_cached(
            shared,
            self.0
                .iter()
                .flat_map(|p| p.metas.iter().map(|(_, m)| m.loc)),
        )
    }
}

/// Checks a pull and picks its entries under the state lock; reads
/// nothing.
pub(crate) fn plan_pull(
    shared: &Shared,
    uid: Uid,
    cursors: &[(ConvId, MsgSeq)],
    limit: u32,
) -> Result<PullPlan> {
    let cfg = &shared.config;
    let limit = if limit == 0 {
        cfg.pull_per_conv_default
    } else {
        limit
    };
    if limit > cfg.pull_per_conv_max {
        return Err(Error::BadRequest(format!(
            "per-conversation limit {limit} is above the cap of {}",
            cfg.pull_per_conv_max
        )));
    }
    if cursors.len() > PULL_CONVS_MAX {
        return Err(Error::BadRequest(format!(
            "{} conversations in one pull; at most {PULL_CONVS_MAX}",
            cursors.len()
        )));
    }
    // Plan every conversation first, so a forbidden one fails the whole
    // call before any record is read.
    let mut plans = Vec::with_capacity(cursors.len());
    {
        let st = shared.state.read();
        for &(conv, after) in cursors {
            let (c, periods) = authorize(&st, uid, conv)?;
            let mut metas = Vec::new();
            let mut has_more = false;
            'periods: for p in &periods {
                // A cursor below the retained base (history retention)
                // resumes at the base: reclaimed messages are skipped.
                let lo = (*p.start())
                    .max(MsgSeq(after.0.saturating_add(1)))
                    .max(c.msgs_base.next());
                for seq in lo.through(*p.end()) {
                    if metas.len() == limit as usize {
                        has_more = true;
                        break 'periods;
                    }
                    if let Some(m) = c.meta(seq) {
                        metas.push((seq, m));
                    }
                }
            }
            // The head inside the user's periods (R7: a device whose
            // large-group marker was lost still sees how far to read).
            let head = periods.last().map_or(c.committed_seq, |p| *p.end());
            plans.push(ConvPlan {
                conv,
                metas,
                has_more,
                head,
            });
        }
    }
    Ok(PullPlan(plans))
}

/// Reads the records of `plan` (IO unless [`PullPlan::cached`]).
pub(crate) fn read_pull(shared: &Shared, PullPlan(plans): PullPlan) -> Result<Vec<ConvPull>> {
    read_ahead_bodies(
        shared,
        plans
            .iter()
            .flat_map(|p| p.metas.iter().map(|(_, m)| m.loc)),
    );
    plans
        .into_iter()
        .map(
            |ConvPlan {
                 conv,
                 metas,
                 has_more,
                 head: max_seq,
             }| {
                Ok(ConvPull {
                    conv,
                    messages: materialize(shared, conv, metas)?,
                    has_more,
                    max_seq,
                })
            },
        )
        .collect()
}

pub(crate) fn history(
    shared: &Shared,
    uid: Uid,
    conv: ConvId,
    before_seq: Option<MsgSeq>,
    limit: u32,
) -> Result<HistoryPage> {
    let plan = plan_history(shared, uid, conv, before_seq, limit)?;
    read_history(shared, plan)
}

/// A history page before its records are read.
pub(crate) struct HistoryPlan {
    conv: ConvId,
    metas: Vec<(MsgSeq, MsgMeta)>,
    has_more: bool,
}

impl HistoryPlan {
    /// Whether every record it would read is in the page cache.
    pub(crate) fn cached(&self, shared: &Shared) -> bool {
        bodies_cached(shared, self.metas.iter().map(|(_, m)| m.loc))
    }
}

/// Checks a history request and picks its entries; reads nothing.
pub(crate) fn plan_history(
    shared: &Shared,
    uid: Uid,
    conv: ConvId,
    before_seq: Option<MsgSeq>,
    limit: u32,
) -> Result<HistoryPlan> {
    // As everywhere: 0 means the default, above the cap is refused.
    let cap = shared.config.pull_per_conv_max;
    let limit = if limit == 0 {
        shared.config.pull_per_conv_default
    } else {
        limit
    };
    if limit > cap {
        return Err(Error::BadRequest(format!(
            "history limit {limit} is above the cap of {cap}"
        )));
    }
    let (metas, has_more) = {
        let st = shared.state.read();
        let (c, periods) = authorize(&st, uid, conv)?;
        let below = before_seq.unwrap_or(OPEN);
        let mut metas = Vec::new();
        let mut has_more = false;
        'periods: for p in periods.iter().rev() {
            if *p.start() >= below {
                continue;
            }
            let hi = (*p.end()).min(below.prev());
            // History stops at the retained base (has_more = false there).
            let lo = (*p.start()).max(c.msgs_base.next());
            for seq in lo.through(hi).rev() {
                if metas.len() == limit as usize {
                    has_more = true;
                    break 'periods;
                }
                if let Some(m) = c.meta(seq) {
                    metas.push((seq, m));
                }
            }
        }
        (metas, has_more)
    };
    Ok(HistoryPlan {
        conv,
        metas,
        has_more,
    })
}

/// Reads the records of `plan` (IO unless [`HistoryPlan::cached`]).
pub(crate) fn read_history(shared: &Shared, plan: HistoryPlan) -> Result<HistoryPage> {
    let HistoryPlan {
        conv,
        metas,
        has_more,
    } = plan;
    read_ahead_bodies(shared, metas.iter().map(|(_, m)| m.loc));
    Ok(HistoryPage {
        messages: materialize(shared, conv, metas)?,
        has_more,
    })
}

const CURSOR_BYTES: usize = 24;

fn encode_cursor(key: &ActivityKey) -> Bytes {
    let mut b = Vec::with_capacity(CURSOR_BYTES);
    b.extend_from_slice(&key.0.to_le_bytes());
    b.extend_from_slice(&key.1 .0.to_le_bytes());
    b.extend_from_slice(&key.2 .0.to_le_bytes());
    Bytes::from(b)
}

fn decode_cursor(b: &[u8]) -> Result<ActivityKey> {
    let bad = || Error::BadRequest("conversation list cursor is malformed".into());
    if b.len() != CURSOR_BYTES {
        return Err(bad());
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    Ok((word(0), MsgId(word(1)), ConvId(word(2))))
}

pub(crate) fn conv_list(
    shared: &Shared,
    uid: Uid,
    limit: u32,
    cursor: Option<Bytes>,
) -> Result<ConvListPage> {
    blocking(shared, || {
        conv_list_once(shared, uid, limit, cursor.as_deref())
    })
}

/// One look at `uid`'s conversation list: memory only, no log record read.
pub(crate) fn conv_list_once(
    shared: &Shared,
    uid: Uid,
    limit: u32,
    cursor: Option<&[u8]>,
) -> std::result::Result<ConvListPage, Miss> {
    // As everywhere: 0 means the default, above the cap is refused.
    let cap = shared.config.sync_page_max;
    let limit = if limit == 0 {
        shared.config.sync_page_default
    } else {
        limit
    };
    if limit > cap {
        return Err(Error::BadRequest(format!(
            "conversation list limit {limit} is above the cap of {cap}"
        ))
        .into());
    }
    let after = cursor.map(decode_cursor).transpose()?;
    {
        let st = shared.state.read();
        let Some(user) = st.users.get(&uid) else {
            return Ok(ConvListPage {
                convs: Vec::new(),
                next_cursor: None,
            });
        };
        let merged = super::large::list_order(&st, uid, user);
        let order = merged.as_ref().unwrap_or(&user.order);
        let mut keys = order.below(after.as_ref()).rev();
        let mut convs = Vec::new();
        let mut stamp = 0;
        let mut last = None;
        for key in keys.by_ref().take(limit as usize) {
            let conv = key.2;
            let Some(uc) = user.convs.get(&conv) else {
                continue;
            };
            if let Some((row, s)) = st
                .convs
                .get(&conv)
                .and_then(|c| super::large::list_row(c, uid, conv, uc))
            {
                stamp = stamp.max(s);
                convs.push(row);
                last = Some(*key);
                continue;
            }
            stamp = stamp.max(uc.stamp);
            let tombstoned = st
                .convs
                .get(&conv)
                .and_then(|c| c.meta(uc.last_msg_seq))
                .is_some_and(MsgMeta::hides_summary);
            convs.push(uc.summary(conv, tombstoned));
            last = Some(*key);
        }
        let more = keys.next().is_some();
        drop(st);
        shared.check_settled(stamp)?;
        Ok(ConvListPage {
            convs,
            next_cursor: if more {
                last.as_ref().map(encode_cursor)
            } else {
                None
            },
        })
    }
}
