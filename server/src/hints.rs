//! Server pushes to subscribed connections (R16): `HINT` when a user's
//! committed sync watermark moves, and `DIRTY_HINT` when a large group's
//! head moves for a subscribed member (only on connections that asked with
//! `SUBSCRIBE_DIRTY`: older clients never see an opcode they do not know).
//!
//! Both are best effort. The engine coalesces per commit round; when the
//! connection's writer is backed up, hints wait here, merged per key to the
//! newest, and go with the next round. A lagging broadcast receiver loses
//! rounds (counted in `inboxd_hints_dropped`): a device still catches up by
//! `SYNC`, `DIRTY` or opening the conversation.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use inbox_engine::inbox::LargeGroupHint;
use inbox_engine::{ConvId, Inbox, Uid};
use inbox_wire::{DirtyHint, DirtyHints, Frame, Hint, Hints, Response};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc, watch};

use crate::metrics::Metrics;

/// Pushes `HINT` for the subscribed uids, merged per uid to the highest
/// watermark.
pub(crate) async fn hint_loop(
    mut hints: broadcast::Receiver<Vec<inbox_engine::inbox::Hint>>,
    subscribed: Arc<Mutex<HashSet<u64>>>,
    tx: mpsc::Sender<Frame>,
    metrics: Arc<Metrics>,
    mut closed: watch::Receiver<bool>,
) {
    let mut pending: HashMap<u64, u64> = HashMap::new();
    loop {
        let round = tokio::select! {
            round = hints.recv() => round,
            _ = closed.changed() => return,
        };
        match round {
            Ok(round) => {
                let subscribed = subscribed.lock().unwrap_or_else(|p| p.into_inner());
                for hint in round.iter().filter(|h| subscribed.contains(&h.uid.get())) {
                    let seq = pending.entry(hint.uid.get()).or_insert(0);
                    *seq = (*seq).max(hint.committed_sync_seq.get());
                }
            }
            Err(RecvError::Lagged(_)) => {
                metrics.hints_dropped.inc();
                continue;
            }
            Err(RecvError::Closed) => return,
        }
        if pending.is_empty() {
            continue;
        }
        let mut list: Vec<Hint> = pending
            .iter()
            .map(|(uid, seq)| Hint {
                uid: *uid,
                committed_sync_seq: *seq,
            })
            .collect();
        list.sort_by_key(|h| h.uid);
        let count = list.len() as u64;
        match tx.try_send(Response::Hint(Hints { hints: list }).to_frame(0)) {
            Ok(()) => {
                pending.clear();
                metrics.hints_sent.inc_by(count);
            }
            Err(mpsc::error::TrySendError::Full(_)) => {}
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}

/// Pushes `DIRTY_HINT` for the subscribed uids that are members of a large
/// group whose head moved: the markers `DIRTY` would list for that group
/// now. Per hinted group it costs one lookup per subscribed uid, on this
/// task (memory only, under the engine's state read lock).
pub(crate) async fn dirty_hint_loop(
    inbox: Arc<Inbox>,
    mut heads: broadcast::Receiver<Vec<LargeGroupHint>>,
    subscribed: Arc<Mutex<HashSet<u64>>>,
    tx: mpsc::Sender<Frame>,
    metrics: Arc<Metrics>,
    mut closed: watch::Receiver<bool>,
) {
    let mut pending: HashMap<(u64, u64), DirtyHint> = HashMap::new();
    loop {
        let round = tokio::select! {
            round = heads.recv() => round,
            _ = closed.changed() => return,
        };
        match round {
            Ok(round) => {
                let uids: Vec<Uid> = subscribed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|&uid| Uid(uid))
                    .collect();
                let convs: HashSet<ConvId> = round.iter().map(|h| h.conv).collect();
                for conv in convs {
                    for (uid, m) in inbox.dirty_markers_among(conv, &uids) {
                        let hint = DirtyHint {
                            uid: uid.get(),
                            conv: conv.get(),
                            target_msg_seq: m.target_msg_seq.get(),
                            version: m.version,
                        };
                        let slot = pending
                            .entry((hint.uid, hint.conv))
                            .or_insert_with(|| hint.clone());
                        if hint.version >= slot.version {
                            *slot = hint;
                        }
                    }
                }
            }
            Err(RecvError::Lagged(_)) => {
                metrics.hints_dropped.inc();
                continue;
            }
            Err(RecvError::Closed) => return,
        }
        if pending.is_empty() {
            continue;
        }
        let mut list: Vec<DirtyHint> = pending.values().cloned().collect();
        list.sort_by_key(|h| (h.uid, h.conv));
        let count = list.len() as u64;
        match tx.try_send(Response::DirtyHint(DirtyHints { hints: list }).to_frame(0)) {
            Ok(()) => {
                pending.clear();
                metrics.hints_sent.inc_by(count);
            }
            Err(mpsc::error::TrySendError::Full(_)) => {}
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}
