//! Reads: sync pages, pull, history, the conversation list and devices.
//! None of them goes through the sequencer.
//!
//! A sync that changes nothing (see [`sync_unchanged`]) is decided here
//! too, by the sequencer's own `decide_sync`, so it never waits behind a
//! round's fsync; one that needs a change still goes through the sequencer.
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

use super::command::{decode_msg_record, unpack, Effect, PackedLoc, StoredPayload};
use super::state::{Conv, MsgMeta, Period, OPEN};
use super::sync::{self, info, SyncOutcome, SyncPlan};
use super::token::TokenClaims;
use super::Shared;
use crate::api::*;
use crate::error::{Error, Result};

/// At most this many conversations per pull.
pub(crate) const PULL_CONVS_MAX: usize = 1024;

fn corrupt(what: &str, e: &super::codec::DecodeError) -> Error {
    Error::Internal(format!("corrupt {what} record: {}", e.0))
}

/// Decides a sync without the sequencer when it changes nothing: the
/// sequencer's `decide_sync` on the current state yields no effect, the
/// device row it was decided on is durable (its round has settled), and
/// the batch ends at or below the user's committed watermark. The answer
/// is then the one the sequencer would give, only earlier: no command of
/// a later round can have been acknowledged to anyone yet.
///
/// `None` means the sync needs a state change (generation bump, lease,
/// reset, `last_seen` refresh), depends on a change that is not durable
/// yet, or the engine is poisoned: send it to the sequencer.
pub(crate) fn sync_unchanged(
    shared: &Shared,
    now: TimestampMs,
    req: &SyncRequest,
    claims: Option<&TokenClaims>,
) -> Option<Result<SyncPlan>> {
    if shared.poisoned().is_some() {
        return None;
    }
    let (stamp, decided) = {
        let st = shared.state.read();
        let user = st.users.get(&req.uid);
        let stamp = user
            .and_then(|u| u.device(req.device))
            .map_or(0, |d| d.stamp);
        let decided = match sync::decide_sync(&st, &shared.config, now, req, claims) {
            Err(e) => Err(e),
            Ok((effects, SyncOutcome::Page(plan))) if effects.is_empty() => {
                let committed = user.map_or(0, |u| u.committed_seq);
                if plan.hwm > committed {
                    return None;
                }
                Ok(plan)
            }
            Ok(_) => return None,
        };
        (stamp, decided)
    };
    // Checked after the state lock is released, as the other reads do: the
    // stamp only grows, so a settled stamp means the row decided on is
    // durable.
    match shared.is_settled(stamp) {
        Ok(true) => Some(decided),
        Ok(false) | Err(_) => None,
    }
}

pub(crate) fn sync_page(shared: &Shared, plan: &SyncPlan) -> Result<SyncPage> {
    // Compaction may move records (rewrite) or drop them (trim) between
    // copying the locations and reading them: then look again, which
    // either finds the moved records or answers RESET_REQUIRED.
    let mut attempt = 0;
    loop {
        attempt += 1;
        match sync_page_once(shared, plan) {
            Err(Error::Log(crate::log::LogError::BadLocation { .. })) if attempt < 3 => continue,
            other => return other,
        }
    }
}

fn sync_page_once(shared: &Shared, plan: &SyncPlan) -> Result<SyncPage> {
    let locs: Vec<PackedLoc> = {
        let st = shared.state.read();
        let user = st
            .users
            .get(&plan.uid)
            .ok_or_else(|| Error::Internal("user vanished".into()))?;
        if plan.start < user.events_base {
            return Err(Error::ResetRequired {
                generation: plan.generation,
            });
        }
        let lo = (plan.start - user.events_base) as usize;
        let hi = (plan.end - user.events_base) as usize;
        user.events
            .get(lo..hi)
            .ok_or_else(|| Error::Internal("sync range beyond the event index".into()))?
            .to_vec()
    };
    let mut events = Vec::with_capacity(locs.len());
    for (i, loc) in locs.iter().enumerate() {
        let rec = shared.evt_log.read(unpack(*loc))?;
        let effect = Effect::decode(rec.kind, &rec.payload).map_err(|e| corrupt("evt", &e))?;
        let ev = effect
            .to_event(plan.start + 1 + i as SyncSeq)
            .ok_or_else(|| Error::Internal("event index points at a device record".into()))?;
        events.push(ev);
    }
    // A tombstoned message's event never carries its body's summary.
    {
        let st = shared.state.read();
        for ev in &mut events {
            if matches!(ev.kind, EventKind::Msg | EventKind::Edit)
                && st
                    .convs
                    .get(&ev.conv)
                    .and_then(|c| c.meta(ev.msg_seq))
                    .is_some_and(MsgMeta::tombstone)
            {
                ev.summary = Bytes::new();
            }
        }
    }
    Ok(SyncPage {
        events,
        next_cursor: plan.end,
        has_more: plan.end < plan.hwm,
        acked_sync_seq: plan.acked,
        batch_hwm: plan.hwm,
        batch_token: plan.token.clone(),
        generation: plan.generation,
        lease: plan.lease,
    })
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
    let rec = match shared.msg_log.read(unpack(loc)) {
        Ok(rec) => rec,
        Err(_) if reclaimed(shared, conv, original.msg_seq) => return Ok(original),
        Err(e) => return Err(e.into()),
    };
    let (h, payload) = decode_msg_record(&rec.payload, shared.config.payload_bytes_max)
        .map_err(|e| corrupt("msg", &e))?;
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

fn authorize(
    st: &super::state::State,
    uid: Uid,
    conv: ConvId,
) -> Result<(&Conv, Vec<RangeInclusive<MsgSeq>>)> {
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
    let max = shared.config.payload_bytes_max;
    let mut out = Vec::with_capacity(metas.len());
    for (seq, meta) in &metas {
        let rec = match shared.msg_log.read(unpack(meta.loc)) {
            Ok(rec) => rec,
            // History retention reclaimed it (and maybe its segment) since
            // the plan was taken: it is not served, like any message below
            // the retained base.
            Err(_) if reclaimed(shared, conv, *seq) => continue,
            Err(e) => return Err(e.into()),
        };
        let (h, payload) = decode_msg_record(&rec.payload, max).map_err(|e| corrupt("msg", &e))?;
        if h.conv != conv || h.msg_seq != *seq || h.msg_id != meta.msg_id {
            return Err(Error::Internal(format!(
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
            target: (h.target != 0).then_some(h.target),
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
                    .max(after.saturating_add(1))
                    .max(c.msgs_base + 1);
                for seq in lo..=*p.end() {
                    if metas.len() == limit as usize {
                        has_more = true;
                        break 'periods;
                    }
                    if let Some(m) = c.meta(seq) {
                        metas.push((seq, *m));
                    }
                }
            }
            plans.push((conv, metas, has_more, c.committed_seq));
        }
    }
    plans
        .into_iter()
        .map(|(conv, metas, has_more, max_seq)| {
            Ok(ConvPull {
                conv,
                messages: materialize(shared, conv, metas)?,
                has_more,
                max_seq,
            })
        })
        .collect()
}

pub(crate) fn history(
    shared: &Shared,
    uid: Uid,
    conv: ConvId,
    before_seq: Option<MsgSeq>,
    limit: u32,
) -> Result<HistoryPage> {
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
            let hi = (*p.end()).min(below - 1);
            // History stops at the retained base (has_more = false there).
            let lo = (*p.start()).max(c.msgs_base + 1);
            for seq in (lo..=hi).rev() {
                if metas.len() == limit as usize {
                    has_more = true;
                    break 'periods;
                }
                if let Some(m) = c.meta(seq) {
                    metas.push((seq, *m));
                }
            }
        }
        (metas, has_more)
    };
    Ok(HistoryPage {
        messages: materialize(shared, conv, metas)?,
        has_more,
    })
}

const CURSOR_BYTES: usize = 24;

fn encode_cursor(key: &super::state::ActivityKey) -> Bytes {
    let mut b = Vec::with_capacity(CURSOR_BYTES);
    b.extend_from_slice(&key.0.to_le_bytes());
    b.extend_from_slice(&key.1.to_le_bytes());
    b.extend_from_slice(&key.2.to_le_bytes());
    Bytes::from(b)
}

fn decode_cursor(b: &[u8]) -> Result<super::state::ActivityKey> {
    let bad = || Error::BadRequest("conversation list cursor is malformed".into());
    if b.len() != CURSOR_BYTES {
        return Err(bad());
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    Ok((word(0), word(1), word(2)))
}

pub(crate) fn conv_list(
    shared: &Shared,
    uid: Uid,
    limit: u32,
    cursor: Option<Bytes>,
) -> Result<ConvListPage> {
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
        )));
    }
    let after = cursor.as_deref().map(decode_cursor).transpose()?;
    loop {
        let st = shared.state.read();
        let Some(user) = st.users.get(&uid) else {
            return Ok(ConvListPage {
                convs: Vec::new(),
                next_cursor: None,
            });
        };
        let mut keys = match after {
            Some(k) => user.order.range(..k),
            None => user.order.range(..),
        }
        .rev();
        let mut convs = Vec::new();
        let mut stamp = 0;
        let mut last = None;
        for key in keys.by_ref().take(limit as usize) {
            let conv = key.2;
            let Some(uc) = user.convs.get(&conv) else {
                continue;
            };
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
        if !shared.is_settled(stamp)? {
            shared.wait_settled(stamp);
            continue;
        }
        return Ok(ConvListPage {
            convs,
            next_cursor: if more {
                last.as_ref().map(encode_cursor)
            } else {
                None
            },
        });
    }
}

pub(crate) fn devices(shared: &Shared, uid: Uid) -> Result<Vec<DeviceInfo>> {
    loop {
        let st = shared.state.read();
        let Some(user) = st.users.get(&uid) else {
            return Ok(Vec::new());
        };
        let stamp = user.devices.iter().map(|d| d.stamp).max().unwrap_or(0);
        let out: Vec<DeviceInfo> = user.devices.iter().map(|d| info(&d.row)).collect();
        drop(st);
        if !shared.is_settled(stamp)? {
            shared.wait_settled(stamp);
            continue;
        }
        return Ok(out);
    }
}
