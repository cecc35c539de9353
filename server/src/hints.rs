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

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use inbox_engine::inbox::LargeGroupHint;
use inbox_engine::{ConvId, Inbox, Uid};
use inbox_wire::{DirtyHint, DirtyHints, Frame, Hint, Hints, Response};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc, watch};

use crate::metrics::Metrics;

/// What a push loop keeps between broadcast rounds: the entries not yet
/// sent, merged per key to the newest.
trait Coalesced {
    type Round: Clone;
    /// Folds one commit round's news into the entries to send.
    fn merge(&mut self, round: Self::Round);
    /// The push frame of the entries, and how many there are; `None` when
    /// there is nothing to send.
    fn frame(&self) -> Option<(Frame, u64)>;
    fn clear(&mut self);
}

/// Forwards `rounds` to the connection's writer as pushes. When the
/// writer is backed up, entries wait, merged, and go with the next round;
/// a lagging receiver loses rounds (counted as dropped), which hints allow.
async fn push_loop<C: Coalesced>(
    mut rounds: broadcast::Receiver<C::Round>,
    mut pending: C,
    tx: mpsc::Sender<Frame>,
    metrics: Arc<Metrics>,
    mut closed: watch::Receiver<bool>,
) {
    loop {
        let round = tokio::select! {
            round = rounds.recv() => round,
            _ = closed.changed() => return,
        };
        match round {
            Ok(round) => pending.merge(round),
            Err(RecvError::Lagged(_)) => {
                metrics.hints_dropped.inc();
                continue;
            }
            Err(RecvError::Closed) => return,
        }
        let Some((frame, count)) = pending.frame() else {
            continue;
        };
        match tx.try_send(frame) {
            Ok(()) => {
                pending.clear();
                metrics.hints_sent.inc_by(count);
            }
            Err(mpsc::error::TrySendError::Full(_)) => {}
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}

/// `HINT` entries: the highest committed watermark per subscribed uid.
struct Watermarks {
    subscribed: Arc<Mutex<HashSet<u64>>>,
    pending: HashMap<u64, u64>,
}

impl Coalesced for Watermarks {
    type Round = Vec<inbox_engine::inbox::Hint>;

    fn merge(&mut self, round: Self::Round) {
        let subscribed = self.subscribed.lock().unwrap_or_else(|p| p.into_inner());
        for hint in round.iter().filter(|h| subscribed.contains(&h.uid.get())) {
            let seq = self.pending.entry(hint.uid.get()).or_insert(0);
            *seq = (*seq).max(hint.committed_sync_seq.get());
        }
    }

    fn frame(&self) -> Option<(Frame, u64)> {
        if self.pending.is_empty() {
            return None;
        }
        let mut hints: Vec<Hint> = self
            .pending
            .iter()
            .map(|(&uid, &committed_sync_seq)| Hint {
                uid,
                committed_sync_seq,
            })
            .collect();
        hints.sort_by_key(|h| h.uid);
        let count = hints.len() as u64;
        Some((Response::Hint(Hints { hints }).to_frame(0), count))
    }

    fn clear(&mut self) {
        self.pending.clear();
    }
}

/// Pushes `HINT` for the subscribed uids.
pub(crate) async fn hint_loop(
    hints: broadcast::Receiver<Vec<inbox_engine::inbox::Hint>>,
    subscribed: Arc<Mutex<HashSet<u64>>>,
    tx: mpsc::Sender<Frame>,
    metrics: Arc<Metrics>,
    closed: watch::Receiver<bool>,
) {
    let pending = Watermarks {
        subscribed,
        pending: HashMap::new(),
    };
    push_loop(hints, pending, tx, metrics, closed).await;
}

/// `DIRTY_HINT` entries: the newest marker per (subscribed uid, large
/// group), found when the group's head moves. Per hinted group it costs
/// one lookup per subscribed uid, on this task (memory only, under the
/// engine's state read lock).
struct Markers {
    inbox: Arc<Inbox>,
    subscribed: Arc<Mutex<HashSet<u64>>>,
    pending: HashMap<(u64, u64), DirtyHint>,
}

impl Coalesced for Markers {
    type Round = Vec<LargeGroupHint>;

    fn merge(&mut self, round: Self::Round) {
        let uids: Vec<Uid> = self
            .subscribed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|&uid| Uid(uid))
            .collect();
        let convs: HashSet<ConvId> = round.iter().map(|h| h.conv).collect();
        for conv in convs {
            for (uid, m) in self.inbox.dirty_markers_among(conv, &uids) {
                let hint = DirtyHint {
                    uid: uid.get(),
                    conv: conv.get(),
                    target_msg_seq: m.target_msg_seq.get(),
                    version: m.version,
                };
                match self.pending.entry((hint.uid, hint.conv)) {
                    Entry::Occupied(mut e) if e.get().version <= hint.version => {
                        e.insert(hint);
                    }
                    Entry::Occupied(_) => {}
                    Entry::Vacant(e) => {
                        e.insert(hint);
                    }
                }
            }
        }
    }

    fn frame(&self) -> Option<(Frame, u64)> {
        if self.pending.is_empty() {
            return None;
        }
        let mut hints: Vec<DirtyHint> = self.pending.values().cloned().collect();
        hints.sort_by_key(|h| (h.uid, h.conv));
        let count = hints.len() as u64;
        Some((Response::DirtyHint(DirtyHints { hints }).to_frame(0), count))
    }

    fn clear(&mut self) {
        self.pending.clear();
    }
}

/// Pushes `DIRTY_HINT` for the subscribed uids that are members of a large
/// group whose head moved: the markers `DIRTY` would list for that group
/// now.
pub(crate) async fn dirty_hint_loop(
    inbox: Arc<Inbox>,
    heads: broadcast::Receiver<Vec<LargeGroupHint>>,
    subscribed: Arc<Mutex<HashSet<u64>>>,
    tx: mpsc::Sender<Frame>,
    metrics: Arc<Metrics>,
    closed: watch::Receiver<bool>,
) {
    let pending = Markers {
        inbox,
        subscribed,
        pending: HashMap::new(),
    };
    push_loop(heads, pending, tx, metrics, closed).await;
}
