//! Reading a message's body wherever it is: inside its message effect in
//! the `evt` log (every send since the single commit log), or in the `msg`
//! log (moved there by compaction, or written by an older version). Every
//! reader of a body goes through [`read_message`], which follows the
//! index's location and, if the record moved while it was being read,
//! the new one.

use bytes::Bytes;

use super::record::{decode_msg_record, MsgHeader, Records};
use crate::api::*;
use crate::error::{Error, Result};
use crate::inbox::effect::Effect;
use crate::inbox::shared::Shared;
use crate::inbox::state::{body_at, unpack, BodyLog, PackedLoc, PENDING_LOC};

/// Moves of one body a reader follows before it gives up: each needs a
/// compaction step to land between two reads.
const MOVES_FOLLOWED_MAX: usize = 4;

/// The message record (header and stored payload, undecoded) at the
/// message location `loc`.
pub(crate) fn read_body_record(shared: &Shared, loc: PackedLoc) -> Result<Bytes> {
    if loc == PENDING_LOC {
        return Err(Error::Invariant(
            "message location is not placed yet".into(),
        ));
    }
    match body_at(loc) {
        (BodyLog::Msg, at) => Ok(Bytes::from(shared.msg_log.read(unpack(at))?.payload)),
        (BodyLog::Evt, at) => {
            let rec = shared.evt_log.read(unpack(at))?;
            body_of_effect(rec.kind, &rec.payload).map_err(|reason| Error::Corruption {
                what: "evt",
                reason: format!("message location {at:#x}: {reason}"),
            })
        }
    }
}

/// The body carried by an encoded message effect (or a copy of one).
/// A reserved `msg_seq` (kind 20) reads as its tombstone.
pub(crate) fn body_of_effect(kind: u8, payload: &[u8]) -> std::result::Result<Bytes, String> {
    let effect = match Effect::decode(kind, payload).map_err(|e| e.0.to_string())? {
        Effect::Copied(inner) => *inner,
        effect => effect,
    };
    match effect {
        Effect::Messaging(Records::MsgBody(m)) => Ok(m.body),
        Effect::Messaging(Records::Reserved(m)) => Ok(m.body()),
        _ => Err("record carries no message body".into()),
    }
}

/// Reads and decodes message `seq` of `conv`, starting at `loc` (what
/// the caller copied from the index). A read that fails while the index
/// has moved the message (compaction moved its body to `msg`) is retried
/// at the new location; any other failure is the caller's to judge.
pub(crate) fn read_message(
    shared: &Shared,
    conv: ConvId,
    seq: MsgSeq,
    mut loc: PackedLoc,
) -> Result<(MsgHeader, Bytes)> {
    let max = shared.config.payload_bytes_max;
    let mut moves = 0;
    loop {
        let err = match read_body_record(shared, loc) {
            Ok(rec) => {
                return decode_msg_record(&rec, max).map_err(|e| Error::Corruption {
                    what: "msg",
                    reason: e.0.to_string(),
                })
            }
            Err(e) => e,
        };
        let now = shared
            .state
            .read()
            .convs
            .get(&conv)
            .and_then(|c| c.meta(seq))
            .map(|m| m.loc);
        match now {
            Some(moved) if moved != loc && moves < MOVES_FOLLOWED_MAX => {
                loc = moved;
                moves += 1;
            }
            _ => return Err(err),
        }
    }
}

/// Asks the logs to start reading the bodies at `locs` together, before
/// they are read one by one ([`crate::log::Log::read_ahead`]: only records
/// found on disk when the log opened are asked for).
pub(crate) fn read_ahead_bodies(shared: &Shared, locs: impl Iterator<Item = PackedLoc> + Clone) {
    let in_log = move |log: BodyLog| {
        locs.clone()
            .filter(|&loc| loc != PENDING_LOC)
            .map(body_at)
            .filter(move |&(l, _)| l == log)
            .map(|(_, at)| unpack(at))
    };
    shared.msg_log.read_ahead(in_log(BodyLog::Msg));
    shared.evt_log.read_ahead(in_log(BodyLog::Evt));
}

/// Whether the page cache holds every record behind `locs` as far as the
/// logs can tell ([`crate::log::Log::cached_floor`]): a read of them then
/// copies memory and may run where IO is not allowed.
pub(crate) fn bodies_cached(shared: &Shared, mut locs: impl Iterator<Item = PackedLoc>) -> bool {
    let (msg, evt) = (shared.msg_log.cached_floor(), shared.evt_log.cached_floor());
    locs.all(|loc| match body_at(loc) {
        (BodyLog::Msg, at) => unpack(at) >= msg,
        (BodyLog::Evt, at) => unpack(at) >= evt,
    })
}

/// What a segment rewrite copies forward for the events of a message
/// effect that carries its body: the same effect without the body (kind 1,
/// its `msg_loc` left at [`PENDING_LOC`]: the index, not the copy, says
/// where the body is). Events need only the header and the summary, and
/// the body is moved to `msg` before the rewrite. `None`: copy the record
/// as it is.
pub(crate) fn without_body(kind: u8, payload: &[u8]) -> Option<(u8, Vec<u8>)> {
    use crate::inbox::state::record::Record;
    if kind & !crate::inbox::effect::COPY_FLAG != super::record::MsgBodyEffect::KIND {
        return None;
    }
    let effect = match Effect::decode(kind, payload).ok()? {
        Effect::Messaging(Records::MsgBody(m)) => m,
        Effect::Copied(inner) => match *inner {
            Effect::Messaging(Records::MsgBody(m)) => m,
            _ => return None,
        },
        _ => return None,
    };
    let stripped = Effect::from(super::record::MsgEffect {
        msg_loc: PENDING_LOC,
        ..effect.msg
    });
    Some((stripped.record_kind(), stripped.encode()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::record::{encode_msg_record, MsgEffect, MsgHeader, StoredPayload};
    use crate::api::*;
    use crate::inbox::effect::Effect;
    use crate::inbox::state::pack;
    use crate::inbox::{Inbox, InboxConfig, ManualClock};
    use crate::log::{Batch, Log, LogOptions, SyncPolicy};

    /// A data directory as versions before the single commit log wrote
    /// it: each body in `msg` (log kind 1), its message effect (kind 1) in
    /// `evt` pointing at it.
    fn write_old_directory(dir: &std::path::Path, segment_bytes: u64) {
        let opts = |name: &str| LogOptions {
            segment_bytes,
            sync: SyncPolicy::Always,
            ..LogOptions::new(dir.join(name))
        };
        let msg = Log::open(opts("msg")).unwrap();
        let evt = Log::open(opts("evt")).unwrap();
        let messages = [
            (MessageKind::Join, Uid(1), b"".as_slice(), 0u128),
            (MessageKind::Join, Uid(2), b"", 0),
            (
                MessageKind::Normal,
                Uid(1),
                b"written by an older version",
                7,
            ),
        ];
        for (i, (kind, sender, payload, cmid)) in messages.into_iter().enumerate() {
            let seq = MsgSeq(i as u64 + 1);
            let id = MsgId(i as u64 + 1);
            let stored = StoredPayload::new(&bytes::Bytes::copy_from_slice(payload));
            let header = MsgHeader {
                kind,
                msg_type: 1,
                conv: ConvId(10),
                msg_seq: seq,
                msg_id: id,
                sender,
                target: MsgId(0),
                sent_at_ms: 1_000,
            };
            let mut body = Batch::new();
            body.push(1, &encode_msg_record(&header, &stored));
            let at = msg.append(body).unwrap().locs[0];
            let effect = Effect::from(MsgEffect {
                conv: ConvId(10),
                msg_seq: seq,
                msg_id: id,
                sender,
                kind,
                msg_type: 1,
                target_seq: MsgSeq(0),
                at_ms: 1_000,
                msg_loc: pack(at),
                client_msg_id: cmid,
                summary: super::super::record::summary_for(kind, payload, MsgId(0), sender),
            });
            let mut batch = Batch::new();
            batch.push_with(effect.record_kind(), |out| effect.encode_into(out));
            evt.append(batch).unwrap();
        }
    }

    fn history(ib: &Inbox) -> Vec<(MsgSeq, bytes::Bytes)> {
        let page = ib.history(Uid(2), ConvId(10), None, 10).unwrap();
        page.messages
            .into_iter()
            .map(|m| (m.msg_seq, m.payload))
            .collect()
    }

    #[test]
    fn a_directory_with_bodies_in_msg_from_an_older_version_opens_and_reads() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = InboxConfig::new(dir.path());
        c.segment_bytes = 64 << 10;
        c.compaction_interval = None;
        c.clock = Arc::new(ManualClock::new(2_000));
        write_old_directory(dir.path(), c.segment_bytes);
        let ib = Inbox::open(c.clone()).unwrap();
        assert_eq!(
            history(&ib)[0],
            (
                MsgSeq(3),
                bytes::Bytes::from_static(b"written by an older version")
            )
        );
        // New sends commit in `evt`; both forms are read side by side,
        // also after a restart from the checkpoint and from a full replay.
        ib.send(SendRequest {
            conv: ConvId(10),
            sender: Uid(2),
            client_msg_id: 8,
            msg_type: 1,
            payload: bytes::Bytes::from_static(b"written now"),
        })
        .wait()
        .unwrap();
        let before = history(&ib);
        assert_eq!(before.len(), 3, "from uid 2's join on: {before:?}");
        assert_eq!(before[0].1, bytes::Bytes::from_static(b"written now"));
        ib.shutdown().unwrap();
        drop(ib);
        let ib = Inbox::open(c.clone()).unwrap();
        assert_eq!(history(&ib), before);
        ib.shutdown().unwrap();
        drop(ib);
        std::fs::remove_dir_all(dir.path().join("checkpoint")).unwrap();
        let ib = Inbox::open(c).unwrap();
        assert_eq!(history(&ib), before);
    }
}
