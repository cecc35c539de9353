//! The messaging tables in a checkpoint: conversations (messages and
//! membership periods), each user's conversation state, the idempotency
//! table (and the keys' old section, read from older checkpoints), the
//! edit links and the large groups. Each function writes or reads the
//! bytes of one section; the section's tag, its length and the order of
//! sections are `checkpoint.rs`'s. Layout in `docs/FORMAT.md`,
//! "Checkpoint file".

use std::collections::HashMap;
use std::sync::Arc;

use super::rows::{kind_code, kind_from_code};
use crate::api::{ClientMsgId, ConvId, MsgId, MsgSeq, TimestampMs, Uid};
use crate::inbox::codec::{sorted, DecodeError, DecodeResult, Reader, Writer};
use crate::inbox::messaging::idem::{IdemSlot, Sent, Whole};
use crate::inbox::state::{
    Conv, LargeMode, LastEntry, MsgMeta, Period, State, Summary, User, UserConv,
};

/// Conversations by id: messages, then membership periods.
pub(crate) fn put_convs(w: &mut Writer, st: &State) {
    let convs = sorted(&st.convs);
    w.u64(convs.len() as u64);
    for (id, c) in convs {
        w.u64(id);
        w.u64(c.msgs.len() as u64);
        for m in c.msgs.iter() {
            w.u64(m.loc);
            w.u64(m.msg_id);
            w.u64(m.sender);
            w.u8(kind_code(m.kind));
            w.u8(m.flags);
        }
        w.u64(c.members.len() as u64);
        for (uid, periods) in c.members.iter() {
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
        if let Some(file) = &st.scratch.0 {
            c.msgs.use_file(file);
        }
        let n = r.count(26)?;
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
            Arc::make_mut(&mut c.members).insert(uid, periods);
        }
        st.convs.insert(id, Arc::new(c));
    }
    Ok(())
}

/// One user's conversation state, by conversation id.
pub(crate) fn put_user_convs(w: &mut Writer, u: &User) {
    w.u64(u.convs.len() as u64);
    for (&conv, uc) in &u.convs {
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
    // 55 bytes: the row above with an empty summary.
    for _ in 0..r.count(55)? {
        let conv: ConvId = r.id()?;
        let uc = UserConv {
            read_seq: r.id()?,
            unread: r.u32()?,
            last_msg_seq: r.id()?,
            last_msg_id: r.id()?,
            last_sender: r.id()?,
            last_summary: Summary::new(&r.short_bytes()?),
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

/// Reads the idempotency keys' old section into the table: whole keys by
/// key then in insertion order, in checkpoints of format 1 and 2 (format 2
/// wrote it empty, the table in [`put_idempotency_table`]); each key
/// once, at the time its map entry has.
pub(crate) fn get_idempotency(r: &mut Reader<'_>, st: &mut State) -> DecodeResult<()> {
    let mut keys = HashMap::new();
    for _ in 0..r.count(56)? {
        let key: (Uid, ClientMsgId) = (r.id()?, r.u128()?);
        let e: (ConvId, MsgId, MsgSeq, TimestampMs) = (r.id()?, r.id()?, r.id()?, r.u64()?);
        keys.insert(key, e);
    }
    for _ in 0..r.count(32)? {
        let (at, uid, cmid): (TimestampMs, Uid, ClientMsgId) = (r.u64()?, r.id()?, r.u128()?);
        if let Some(&(conv, msg_id, msg_seq, at_ms)) = keys.get(&(uid, cmid)) {
            if at_ms == at {
                let ttl = st.idem_ttl_ms;
                let sent = Sent {
                    sender: uid,
                    cmid,
                    conv,
                    msg_seq,
                    msg_id,
                };
                st.idem.insert(sent, at_ms, ttl);
            }
        }
    }
    Ok(())
}

/// The idempotency table (optional, after the large groups): the mark
/// [`COMPACT_KEYS`], then its buckets oldest first, each as start_ms u64,
/// end_ms u64, base_id u64, count u64, then its entries sorted: fp u64,
/// conv u64, seq_lo u32, id_delta u32.
///
/// A checkpoint written before keys were compact has no mark: its buckets
/// start with their count, then start_ms u64, end_ms u64, count u64 and
/// the entries as tag (low u64, high u64), conv u64, msg_seq u64, msg_id
/// u64. It is read into compact entries, oldest bucket first.
pub(crate) fn put_idempotency_table(w: &mut Writer, st: &State) {
    w.u64(COMPACT_KEYS);
    w.u64(st.idem.buckets().count() as u64);
    for b in st.idem.buckets() {
        w.u64(b.start_ms);
        w.u64(b.end_ms);
        w.u64(b.base_id);
        w.u64(b.len() as u64);
        for shard in b.sorted_shards() {
            for e in shard.iter() {
                w.u64(e.fp);
                w.u64(e.conv);
                w.u32(e.seq_lo);
                w.u32(e.id_delta);
            }
        }
    }
}

/// Starts the idempotency section of a checkpoint with compact keys: no
/// bucket count of the older layout comes near it.
const COMPACT_KEYS: u64 = u64::MAX;

pub(crate) fn get_idempotency_table(r: &mut Reader<'_>, st: &mut State) -> DecodeResult<()> {
    if st.idem.len() > 0 {
        return Err(DecodeError(
            "checkpoint has idempotency keys in both the old and the new section",
        ));
    }
    let compact = r.peek_u64()? == COMPACT_KEYS;
    if compact {
        r.u64()?;
    }
    let mut prev: Option<(TimestampMs, TimestampMs)> = None;
    for _ in 0..r.count(24)? {
        let (start_ms, end_ms): (TimestampMs, TimestampMs) = (r.u64()?, r.u64()?);
        // Disjoint and in order, or a span again (ids ran past 2^32).
        let in_order = prev.is_none_or(|(s, e)| start_ms >= e || (start_ms, end_ms) == (s, e));
        if start_ms >= end_ms || !in_order {
            return Err(DecodeError("idempotency buckets out of order"));
        }
        prev = Some((start_ms, end_ms));
        if compact {
            let base_id: MsgId = r.id()?;
            if base_id.0.checked_add(u64::from(u32::MAX)).is_none() {
                return Err(DecodeError("idempotency bucket base past the last msg_id"));
            }
            let n = r.count(24)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                let e = IdemSlot {
                    fp: r.u64()?,
                    conv: r.id()?,
                    seq_lo: r.u32()?,
                    id_delta: r.u32()?,
                };
                if e.fp == 0 {
                    return Err(DecodeError("idempotency entry without a fingerprint"));
                }
                entries.push(e);
            }
            st.idem.push_decoded(start_ms, end_ms, base_id, entries);
        } else {
            let n = r.count(40)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                let tag = [r.u64()?, r.u64()?];
                let (conv, msg_seq, msg_id) = (r.id()?, r.id()?, r.id()?);
                if msg_id == MsgId(0) {
                    return Err(DecodeError("idempotency entry without a message"));
                }
                entries.push(Whole {
                    msg_id,
                    tag,
                    conv,
                    msg_seq,
                });
            }
            st.idem.push_whole(start_ms, end_ms, entries);
        }
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
        for (target, edits) in c.edits.iter() {
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
            c.edits.make_mut().insert(target, edits);
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
        for (&conv, uc) in &u.convs {
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
        c.large = Some(Box::new(LargeMode {
            switch_seq,
            last: LastEntry {
                msg_seq: r.id()?,
                msg_id: r.id()?,
                sender: r.id()?,
                summary: Summary::new(&r.short_bytes()?),
                at_ms: r.u64()?,
            },
            stamp: 0,
        }));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_in_the_old_section_are_read_into_the_table_each_at_its_last_use() {
        let mut w = Writer::with_capacity(256);
        // By key: uid 1 key 5 (reused at 900, after a first use at 100),
        // uid 2 key 6.
        w.u64(2u64);
        for (uid, cmid, conv, msg_id, seq, at) in [
            (1u64, 5u128, 10u64, 11u64, 3u64, 900u64),
            (2, 6, 10, 7, 2, 100),
        ] {
            w.u64(uid);
            w.u128(cmid);
            w.u64(conv);
            w.u64(msg_id);
            w.u64(seq);
            w.u64(at);
        }
        // Insertion order, the stale use included.
        w.u64(3u64);
        for (at, uid, cmid) in [(100u64, 1u64, 5u128), (100, 2, 6), (900, 1, 5)] {
            w.u64(at);
            w.u64(uid);
            w.u128(cmid);
        }
        let mut st = State::new(1_600);
        get_idempotency(&mut Reader::new(&w.buf), &mut st).unwrap();
        assert_eq!(st.idem.len(), 2);
        let c = st.idem.candidates(Uid(1), 5, 1_000, 1_600);
        assert_eq!(
            (c[0].conv, c[0].seq_lo, c[0].msg_id),
            (ConvId(10), 3, MsgId(11))
        );
        assert_eq!(st.idem.candidates(Uid(2), 6, 1_000, 1_600).len(), 1);

        // Written again, it is the new section and reads back equal.
        assert_eq!(idempotency_round_trip(&st).idem, st.idem);
    }

    /// A state holding only the idempotency table of `st`, written and
    /// read back.
    fn idempotency_round_trip(st: &State) -> State {
        let mut w = Writer::with_capacity(256);
        put_idempotency_table(&mut w, st);
        let mut back = State::new(st.idem_ttl_ms);
        get_idempotency_table(&mut Reader::new(&w.buf), &mut back).unwrap();
        back
    }

    #[test]
    fn a_table_of_whole_entries_reads_into_the_compact_table_the_same_sends_build() {
        use crate::inbox::messaging::idem::{default_spread, tag_of};
        // Sends at 10 and 20 ms (one bucket of 100 ms), the second with an
        // id 2^32 past the first's, then one at 250 ms.
        let far = (1u64 << 32) + 9;
        let sends = [
            (Uid(1), 1u128, ConvId(10), MsgSeq(1), MsgId(7), 10u64),
            (Uid(2), 2, ConvId(11), MsgSeq(1), MsgId(far), 20),
            (Uid(1), 3, ConvId(10), MsgSeq(2), MsgId(far + 1), 250),
        ];
        let mut built = State::new(1_600);
        for (sender, cmid, conv, msg_seq, msg_id, at) in sends {
            let sent = Sent {
                sender,
                cmid,
                conv,
                msg_seq,
                msg_id,
            };
            built.idem.insert(sent, at, 1_600);
        }
        // The older layout: start, end, count, then tag, conv, seq, id.
        let mut w = Writer::with_capacity(256);
        w.u64(2u64);
        for (start, end, of) in [(0u64, 100u64, &sends[..2]), (200, 300, &sends[2..])] {
            w.u64(start);
            w.u64(end);
            w.u64(of.len() as u64);
            for &(sender, cmid, conv, msg_seq, msg_id, _) in of.iter().rev() {
                let tag = tag_of(default_spread, sender, cmid);
                w.u64(tag[0]);
                w.u64(tag[1]);
                w.u64(conv);
                w.u64(msg_seq);
                w.u64(msg_id);
            }
        }
        let mut read = State::new(1_600);
        get_idempotency_table(&mut Reader::new(&w.buf), &mut read).unwrap();
        assert_eq!(read.idem, built.idem);
        assert_eq!(read.idem.buckets().count(), 3);
        let c = read.idem.candidates(Uid(2), 2, 300, 1_600);
        assert_eq!((c[0].conv, c[0].msg_id), (ConvId(11), MsgId(far)));
        // The compact layout keeps two buckets of one span.
        assert_eq!(idempotency_round_trip(&read).idem, built.idem);
    }

    #[test]
    fn a_compact_bucket_whose_base_leaves_no_room_for_its_ids_is_refused() {
        let mut w = Writer::with_capacity(64);
        w.u64(COMPACT_KEYS);
        w.u64(1u64);
        for v in [0u64, 100, u64::MAX - 5, 0] {
            w.u64(v);
        }
        let mut st = State::new(1_600);
        assert!(get_idempotency_table(&mut Reader::new(&w.buf), &mut st).is_err());
    }

    #[test]
    fn idempotency_buckets_out_of_order_are_refused() {
        let mut w = Writer::with_capacity(64);
        w.u64(2u64);
        for (start, end) in [(100u64, 200u64), (50, 150)] {
            w.u64(start);
            w.u64(end);
            w.u64(0u64);
        }
        let mut st = State::new(1_600);
        assert!(get_idempotency_table(&mut Reader::new(&w.buf), &mut st).is_err());
    }
}
