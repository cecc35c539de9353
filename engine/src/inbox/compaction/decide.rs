//! The compaction steps the sequencer decides, against the fences as they
//! are at that instant: trims of events and messages, and dropping
//! expired snapshots.

use super::fences as fence;
use super::record::{TrimEffect, TrimMsgsEffect};
use crate::api::*;
use crate::inbox::config::InboxConfig;
use crate::inbox::effect::Effect;
use crate::inbox::snapshots::record::SnapshotEffect;
use crate::inbox::state::{SnapshotPhase, SnapshotRow, State};

/// One trim proposal: the newest event older than the safety window and
/// the newest older than the hard TTL.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrimProposal {
    pub uid: Uid,
    pub safe_seq: SyncSeq,
    pub hard_seq: SyncSeq,
}

pub(crate) fn decide_drop_snapshots(
    st: &State,
    now: TimestampMs,
    candidates: &[(Uid, u64)],
) -> Vec<Effect> {
    let mut out = Vec::new();
    for &(uid, id) in candidates {
        let Some(slot) = st.users.get(&uid).and_then(|u| u.snapshots().get(&id)) else {
            continue;
        };
        if now > slot.row.expires_at_ms && slot.row.phase != SnapshotPhase::Dropped {
            out.push(Effect::from(SnapshotEffect {
                uid,
                row: SnapshotRow {
                    phase: SnapshotPhase::Dropped,
                    ..slot.row
                },
            }));
        }
    }
    out
}

/// The sequencer's decision on trim proposals: effects, and per trimmed
/// user (uid, old base, new base).
pub(crate) fn decide_trim(
    st: &State,
    cfg: &InboxConfig,
    now: TimestampMs,
    proposals: &[TrimProposal],
) -> (Vec<Effect>, Vec<(Uid, SyncSeq, SyncSeq)>) {
    let mut effects = Vec::new();
    let mut trimmed = Vec::new();
    for p in proposals {
        let Some(user) = st.users.get(&p.uid) else {
            continue;
        };
        let target = fence::trim_target(user, cfg, now, p.safe_seq, p.hard_seq);
        if target > user.events_base {
            effects.push(Effect::from(TrimEffect {
                uid: p.uid,
                events_base: target,
            }));
            trimmed.push((p.uid, user.events_base, target));
        }
    }
    (effects, trimmed)
}

/// The sequencer's decision on message trim proposals: never above what
/// is durable, never down. Returns the effects and (conv, old, new).
pub(crate) fn decide_trim_msgs(
    st: &State,
    proposals: &[(ConvId, MsgSeq)],
) -> (Vec<Effect>, Vec<(ConvId, MsgSeq, MsgSeq)>) {
    let mut effects = Vec::new();
    let mut trimmed = Vec::new();
    for &(conv, base) in proposals {
        let Some(c) = st.convs.get(&conv) else {
            continue;
        };
        let target = base.min(c.committed_seq).min(c.head());
        if target > c.msgs_base {
            effects.push(Effect::from(TrimMsgsEffect {
                conv,
                msgs_base: target,
            }));
            trimmed.push((conv, c.msgs_base, target));
        }
    }
    (effects, trimmed)
}
