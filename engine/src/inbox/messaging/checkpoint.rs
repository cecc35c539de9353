//! The messaging tables in a checkpoint: conversations (messages and
//! membership periods), each user's conversation state, the idempotency
//! keys and the edit links. Layout in `docs/FORMAT.md`, "Checkpoint
//! file"; the order of sections is `checkpoint.rs`'s.

use std::sync::Arc;

use super::record::{kind_code, kind_from_code};
use crate::api::{ConvId, MsgSeq, Uid};
use crate::inbox::codec::{sorted, DecodeError, DecodeResult, Reader, Writer};
use crate::inbox::state::{
    Conv, IdemEntry, LargeMode, LastEntry, MsgMeta, Period, State, User, UserConv,
};

/// Conversations by id: messages, then membership periods.
pub(crate) fn put_convs(w: &mut Writer, st: &State) {
    let convs = sorted(&st.convs);
    w.u64(convs.len() as u64);
    for (id, c) in convs {
        w.u64(id);
        w.u64(c.msgs.len() as u64);
        for m in &c.msgs {
            w.u64(m.loc);
            w.u64(m.msg_id);
            w.u64(m.sender);
            w.u8(kind_code(m.kind));
            w.u8(m.flags);
        }
        w.u64(c.members.len() as u64);
        for (uid, periods) in &c.members {
            w.u64(*uid);
            w.u64(periods.len() as u64);
            for p in periods {
                w.u32(p.period_id);
                w.u64(p.join_seq);
                w.u64(p.leave_seq);
            }
        }
    }
}

pub(crate) fn get_convs(r: &mut Reader<'_>, st: &mut State) -> DecodeResult<()> {
    for _ in 0..r.count(16)? {
        let id: ConvId = r.id()?;
        let mut c = Conv::default();
        let n = r.count(26)?;
        c.msgs.reserve_exact(n);
        for _ in 0..n {
            c.msgs.push(MsgMeta {
                loc: r.u64()?,
                msg_id: r.id()?,
                sender: r.id()?,
                kind: kind_from_code(r.u8()?)?,
                flags: r.u8()?,
            });
        }
        for _ in 0..r.count(16)? {
            let uid: Uid = r.id()?;
            let mut periods = Vec::new();
            for _ in 0..r.count(20)? {
                periods.push(Period {
                    period_id: r.u32()?,
                    join_seq: r.id()?,
                    leave_seq: r.id()?,
                });
            }
            c.members.insert(uid, periods);
        }
        st.convs.insert(id, Arc::new(c));
    }
    Ok(())
}

/// One user's conversation state, by conversation id.
pub(crate) fn put_user_convs(w: &mut Writer, u: &User) {
    let convs = sorted(&u.convs);
    w.u64(convs.len() as u64);
    for (conv, uc) in convs {
        w.u64(conv);
        w.u64(uc.read_seq);
        w.u32(uc.unread);
        w.u64(uc.last_msg_seq);
        w.u64(uc.last_msg_id);
        w.u64(uc.last_sender);
        w.short_bytes(&uc.last_summary);
        w.u64(uc.last_activity_ms);
        w.bool(uc.muted);
        w.bool(uc.pinned);
    }
}

pub(crate) fn get_user_convs(r: &mut Reader<'_>, u: &mut User) -> DecodeResult<()> {
    for _ in 0..r.count(60)? {
        let conv: ConvId = r.id()?;
        let uc = UserConv {
            read_seq: r.id()?,
            unread: r.u32()?,
            last_msg_seq: r.id()?,
            last_msg_id: r.id()?,
            last_sender: r.id()?,
            last_summary: r.short_bytes()?,
            last_activity_ms: r.u64()?,
            muted: r.bool()?,
            pinned: r.bool()?,
            cleared_seq: MsgSeq(0),
            stamp: 0,
        };
        u.order.insert(uc.key(conv));
        u.convs.insert(conv, uc);
    }
    Ok(())
}

/// The idempotency keys by key, then their insertion order (for expiry).
pub(crate) fn put_idempotency(w: &mut Writer, st: &State) {
    let idem = sorted(&st.idem);
    w.u64(idem.len() as u64);
    for ((uid, cmid), e) in idem {
        w.u64(uid);
        w.u128(cmid);
        w.u64(e.conv);
        w.u64(e.msg_id);
        w.u64(e.msg_seq);
        w.u64(e.at_ms);
    }
    w.u64(st.idem_order.len() as u64);
    for (at, uid, cmid) in &st.idem_order {
        w.u64(*at);
        w.u64(*uid);
        w.u128(*cmid);
    }
}

pub(crate) fn get_idempotency(r: &mut Reader<'_>, st: &mut State) -> DecodeResult<()> {
    for _ in 0..r.count(56)? {
        let key = (r.id()?, r.u128()?);
        st.idem.insert(
            key,
            IdemEntry {
                conv: r.id()?,
                msg_id: r.id()?,
                msg_seq: r.id()?,
                at_ms: r.u64()?,
            },
        );
    }
    for _ in 0..r.count(32)? {
        st.idem_order.push_back((r.u64()?, r.id()?, r.u128()?));
    }
    Ok(())
}

/// Edit links (optional, after the message bases): by conv id, the
/// conversations with any, each as conv u64, then a u64 count of
/// (target_seq u64, edit count u64, each edit's msg_seq u64). A checkpoint
/// written before links existed has none: edits made before it are not
/// recalled with their original.
pub(crate) fn put_edit_links(w: &mut Writer, st: &State) {
    let convs: Vec<_> = sorted(&st.convs)
        .into_iter()
        .filter(|(_, c)| !c.edits.is_empty())
        .collect();
    w.u64(convs.len() as u64);
    for (id, c) in convs {
        w.u64(id);
        w.u64(c.edits.len() as u64);
        for (target, edits) in &c.edits {
            w.u64(*target);
            w.u64(edits.len() as u64);
            for seq in edits {
                w.u64(*seq);
            }
        }
    }
}

pub(crate) fn get_edit_links(r: &mut Reader<'_>, st: &mut State) -> DecodeResult<()> {
    for _ in 0..r.count(16)? {
        let conv: ConvId = r.id()?;
        let c = st
            .convs
            .get_mut(&conv)
            .map(Arc::make_mut)
            .ok_or(DecodeError("edit links of an unknown conv"))?;
        for _ in 0..r.count(16)? {
            let target: MsgSeq = r.id()?;
            let mut edits = Vec::new();
            for _ in 0..r.count(8)? {
                edits.push(r.id()?);
            }
            c.edits.insert(target, edits);
        }
    }
    Ok(())
}

/// Large groups (optional, after the edit links): by conv id, the large
/// groups, each as conv u64, switch_seq u64, then its newest entry
/// (msg_seq u64, msg_id u64, sender u64, summary short bytes, at_ms u64);
/// then the marker clears by (uid, conv): a u64 count of (uid u64, conv
/// u64, cleared_seq u64). A checkpoint written before large groups existed
/// has none.
pub(crate) fn put_large_groups(w: &mut Writer, st: &State) {
    let convs: Vec<_> = sorted(&st.convs)
        .into_iter()
        .filter_map(|(id, c)| c.large.as_ref().map(|l| (id, l)))
        .collect();
    w.u64(convs.len() as u64);
    for (id, l) in convs {
        w.u64(id);
        w.u64(l.switch_seq);
        w.u64(l.last.msg_seq);
        w.u64(l.last.msg_id);
        w.u64(l.last.sender);
        w.short_bytes(&l.last.summary);
        w.u64(l.last.at_ms);
    }
    let mut clears = Vec::new();
    for (uid, u) in sorted(&st.users) {
        for (conv, uc) in sorted(&u.convs) {
            if uc.cleared_seq > MsgSeq(0) {
                clears.push((uid, conv, uc.cleared_seq));
            }
        }
    }
    w.u64(clears.len() as u64);
    for (uid, conv, seq) in clears {
        w.u64(uid);
        w.u64(conv);
        w.u64(seq);
    }
}

pub(crate) fn get_large_groups(r: &mut Reader<'_>, st: &mut State) -> DecodeResult<()> {
    for _ in 0..r.count(49)? {
        let conv: ConvId = r.id()?;
        let c = st
            .convs
            .get_mut(&conv)
            .map(Arc::make_mut)
            .ok_or(DecodeError("large group of an unknown conv"))?;
        let switch_seq = r.id()?;
        c.large = Some(LargeMode {
            switch_seq,
            last: LastEntry {
                msg_seq: r.id()?,
                msg_id: r.id()?,
                sender: r.id()?,
                summary: r.short_bytes()?,
                at_ms: r.u64()?,
            },
            stamp: 0,
        });
    }
    for _ in 0..r.count(24)? {
        let uid: Uid = r.id()?;
        let conv: ConvId = r.id()?;
        let seq: MsgSeq = r.id()?;
        let uc = st
            .users
            .get_mut(&uid)
            .map(Arc::make_mut)
            .and_then(|u| u.convs.get_mut(&conv))
            .ok_or(DecodeError("marker clear of an unknown conversation state"))?;
        uc.cleared_seq = seq;
    }
    Ok(())
}
