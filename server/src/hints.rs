//! Server pushes to subscribed connections (R16): `HINT` when a user's
//! committed sync watermark moves, and `DIRTY_HINT` when a large group's
//! head moves for a subscribed member (only on connections that asked with
//! `SUBSCRIBE_DIRTY`: older clients never see an opcode they do not know).
//!
//! Both are best effort. The engine coalesces per commit round; when the
//! connection's writer is backed up, hints wait here, merged per key to the
//! newest, and go with the next round. `HINT`s are routed by uid: the
//! daemon has one listener to the engine's rounds ([`dispatch_hints`]),
//! which hands each hint to the mailboxes of the connections subscribed to
//! its uid ([`HintRoutes`]), so a round costs a lookup per hint however
//! many connections are open; if it falls behind the broadcast it counts
//! the lost rounds in `inboxd_hints_dropped` and offers the watermarks the
//! engine holds then. `DIRTY_HINT`s are found per connection: each
//! connection that asked for them listens to the large groups' rounds and
//! looks its own uids up. A device still catches up by `SYNC`, `DIRTY` or
//! opening the conversation.
//!
//! A member of a replicated group replaces its engine when it installs a
//! snapshot. The dispatcher and the `DIRTY_HINT` loops follow: when the engine they listen to is gone,
//! they listen to the current one and then push what its state says now
//! (each subscribed uid's watermark, each dirty marker), so the rounds the
//! snapshot carried, and any committed while the loop moved over, are
//! hinted once, coalesced. The `DIRTY_HINT` loop reads markers from the
//! current engine and never holds a replaced one alive.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use inbox_engine::inbox::LargeGroupHint;
use inbox_engine::{ConvId, Inbox, Uid};
use inbox_wire::{DirtyHint, DirtyHints, Frame, Hint, Hints, Response};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc, watch};

use crate::metrics::Metrics;

/// The engine requests go to now (a group member's changes when it
/// installs a snapshot).
pub(crate) type CurrentEngine = Arc<dyn Fn() -> Arc<Inbox> + Send + Sync>;

/// What a push loop keeps between broadcast rounds: the entries not yet
/// sent, merged per key to the newest.
trait Coalesced {
    type Round: Clone;
    /// The engine's broadcast of these rounds.
    fn subscribe(inbox: &Inbox) -> broadcast::Receiver<Self::Round>;
    /// Folds one commit round's news into the entries to send.
    fn merge(&mut self, round: Self::Round);
    /// Folds in everything `inbox` holds now for the subscribed uids: for
    /// a loop that has just moved to a new engine.
    fn catch_up(&mut self, inbox: &Inbox);
    /// The push frame of the entries, and how many there are; `None` when
    /// there is nothing to send.
    fn frame(&self) -> Option<(Frame, u64)>;
    fn clear(&mut self);
}

/// Forwards `rounds` to the connection's writer as pushes. When the
/// writer is backed up, entries wait, merged, and go with the next round;
/// a lagging receiver loses rounds (counted as dropped), which hints allow.
async fn push_loop<C: Coalesced>(
    engine: CurrentEngine,
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
            // Every sender is gone only once its engine is dropped: it
            // was replaced. Follow the one requests go to now, listening
            // before reading its state, so nothing falls in between.
            Err(RecvError::Closed) => {
                let inbox = engine();
                rounds = C::subscribe(&inbox);
                pending.catch_up(&inbox);
            }
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

/// One connection's `HINT` entries not yet sent, merged per uid to the
/// highest committed watermark, and the wake-up of its push loop. The
/// dispatcher fills it; the connection's [`hint_push_loop`] empties it.
#[derive(Default)]
pub(crate) struct Mailbox {
    pending: Mutex<HashMap<u64, u64>>,
    ready: tokio::sync::Notify,
}

impl Mailbox {
    fn offer(&self, uid: u64, committed_sync_seq: u64) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let seq = pending.entry(uid).or_insert(0);
        *seq = (*seq).max(committed_sync_seq);
    }
}

/// Which connections listen for which uid: each round's hints go to the
/// mailboxes of their uids' subscribers only, so a round costs a lookup
/// per hint, however many connections are open. (Every connection used to
/// take every round from the engine's broadcast and filter it: a thousand
/// idle subscribed connections took an ingest at 16 connections from
/// 10,151 to 1,400 sends a second.)
#[derive(Default)]
pub(crate) struct HintRoutes {
    by_uid: Mutex<HashMap<u64, Vec<Arc<Mailbox>>>>,
}

impl HintRoutes {
    /// `mailbox` listens for `uids` from now on (uids it already listens
    /// for are not repeated by the caller).
    pub(crate) fn add(&self, uids: &[u64], mailbox: &Arc<Mailbox>) {
        let mut by_uid = self.by_uid.lock().unwrap_or_else(|p| p.into_inner());
        for &uid in uids {
            by_uid.entry(uid).or_default().push(Arc::clone(mailbox));
        }
    }

    /// `mailbox` no longer listens for `uids`.
    pub(crate) fn remove(&self, uids: &[u64], mailbox: &Arc<Mailbox>) {
        let mut by_uid = self.by_uid.lock().unwrap_or_else(|p| p.into_inner());
        for uid in uids {
            if let Entry::Occupied(mut e) = by_uid.entry(*uid) {
                e.get_mut().retain(|m| !Arc::ptr_eq(m, mailbox));
                if e.get().is_empty() {
                    e.remove();
                }
            }
        }
    }

    /// Uids with at least one listener.
    fn uids(&self) -> Vec<Uid> {
        let by_uid = self.by_uid.lock().unwrap_or_else(|p| p.into_inner());
        by_uid.keys().map(|&uid| Uid(uid)).collect()
    }

    /// Offers each hint to its uid's listeners and wakes each listener
    /// that got one, once.
    fn deliver(&self, round: &[inbox_engine::inbox::Hint]) {
        let mut woken: Vec<Arc<Mailbox>> = Vec::new();
        {
            let by_uid = self.by_uid.lock().unwrap_or_else(|p| p.into_inner());
            for hint in round {
                for mailbox in by_uid.get(&hint.uid.get()).into_iter().flatten() {
                    mailbox.offer(hint.uid.get(), hint.committed_sync_seq.get());
                    if !woken.iter().any(|m| Arc::ptr_eq(m, mailbox)) {
                        woken.push(Arc::clone(mailbox));
                    }
                }
            }
        }
        for mailbox in woken {
            mailbox.ready.notify_one();
        }
    }

    /// Offers every listened-for uid's watermark as `inbox` holds it now:
    /// after rounds were missed, or when requests moved to a new engine.
    fn catch_up(&self, inbox: &Inbox) {
        let round: Vec<_> = inbox
            .committed_sync_seqs(&self.uids())
            .into_iter()
            .map(|(uid, committed_sync_seq)| inbox_engine::inbox::Hint {
                uid,
                committed_sync_seq,
            })
            .collect();
        self.deliver(&round);
    }
}

/// The daemon's one listener to the engine's hint rounds: routes each to
/// the connections subscribed to its uids ([`HintRoutes`]). It listens from
/// the moment it is called, before the future first runs. A round it falls
/// too far behind to receive is counted in `inboxd_hints_dropped`, and the
/// watermarks the engine holds then are offered instead; when the engine is
/// replaced (a snapshot install), it listens to the new one and offers what
/// that one holds.
pub(crate) fn dispatch_hints(
    engine: CurrentEngine,
    routes: Arc<HintRoutes>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> {
    let mut rounds = engine().subscribe_hints();
    async move {
        loop {
            let round = tokio::select! {
                round = rounds.recv() => round,
                _ = shutdown.changed() => return,
            };
            match round {
                Ok(round) => routes.deliver(&round),
                Err(RecvError::Lagged(_)) => {
                    metrics.hints_dropped.inc();
                    routes.catch_up(&engine());
                }
                // Every sender is gone only once its engine is dropped: it
                // was replaced. Listen to the one requests go to now before
                // reading its state, so nothing falls in between.
                Err(RecvError::Closed) => {
                    let inbox = engine();
                    rounds = inbox.subscribe_hints();
                    routes.catch_up(&inbox);
                }
            }
        }
    }
}

/// Pushes `HINT` frames for one connection as the dispatcher fills its
/// mailbox. When the connection's writer is backed up, the entries stay
/// in the mailbox, merged, and go once the next round for the connection
/// arrives.
pub(crate) async fn hint_push_loop(
    mailbox: Arc<Mailbox>,
    tx: mpsc::Sender<Frame>,
    metrics: Arc<Metrics>,
    mut closed: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = mailbox.ready.notified() => {}
            _ = closed.changed() => return,
        }
        let mut hints: Vec<Hint> = {
            let mut pending = mailbox.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending
                .drain()
                .map(|(uid, committed_sync_seq)| Hint {
                    uid,
                    committed_sync_seq,
                })
                .collect()
        };
        if hints.is_empty() {
            continue;
        }
        hints.sort_by_key(|h| h.uid);
        let count = hints.len() as u64;
        let frame = Response::Hint(Hints {
            hints: hints.clone(),
        })
        .to_frame(0);
        match tx.try_send(frame) {
            Ok(()) => {
                metrics.hints_sent.inc_by(count);
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                for h in hints {
                    mailbox.offer(h.uid, h.committed_sync_seq);
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}

/// The subscribed uids, copied out of their lock.
fn subscribed_uids(subscribed: &Mutex<HashSet<u64>>) -> Vec<Uid> {
    let set = subscribed.lock().unwrap_or_else(|p| p.into_inner());
    set.iter().map(|&uid| Uid(uid)).collect()
}

/// `DIRTY_HINT` entries: the newest marker per (subscribed uid, large
/// group), found when the group's head moves. Per hinted group it costs
/// one lookup per subscribed uid, on this task (memory only, under the
/// engine's state read lock).
struct Markers {
    engine: CurrentEngine,
    subscribed: Arc<Mutex<HashSet<u64>>>,
    pending: HashMap<(u64, u64), DirtyHint>,
}

impl Markers {
    /// Keeps `hint` unless a newer version of its marker is pending.
    fn offer(&mut self, hint: DirtyHint) {
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

impl Coalesced for Markers {
    type Round = Vec<LargeGroupHint>;

    fn subscribe(inbox: &Inbox) -> broadcast::Receiver<Self::Round> {
        inbox.subscribe_large_group_hints()
    }

    fn merge(&mut self, round: Self::Round) {
        let uids = subscribed_uids(&self.subscribed);
        let convs: HashSet<ConvId> = round.iter().map(|h| h.conv).collect();
        let inbox = (self.engine)();
        for conv in convs {
            for (uid, m) in inbox.dirty_markers_among(conv, &uids) {
                let hint = DirtyHint {
                    uid: uid.get(),
                    conv: conv.get(),
                    target_msg_seq: m.target_msg_seq.get(),
                    version: m.version,
                };
                self.offer(hint);
            }
        }
    }

    fn catch_up(&mut self, inbox: &Inbox) {
        for uid in subscribed_uids(&self.subscribed) {
            for m in inbox.dirty_markers(uid).unwrap_or_default() {
                self.offer(DirtyHint {
                    uid: uid.get(),
                    conv: m.conv.get(),
                    target_msg_seq: m.target_msg_seq.get(),
                    version: m.version,
                });
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
/// now. Listens from the moment it is called, as [`hint_loop`].
pub(crate) fn dirty_hint_loop(
    engine: CurrentEngine,
    subscribed: Arc<Mutex<HashSet<u64>>>,
    tx: mpsc::Sender<Frame>,
    metrics: Arc<Metrics>,
    closed: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> {
    let heads = Markers::subscribe(&engine());
    let pending = Markers {
        engine: Arc::clone(&engine),
        subscribed,
        pending: HashMap::new(),
    };
    push_loop(engine, heads, pending, tx, metrics, closed)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use inbox_engine::{InboxConfig, SendRequest};

    use super::*;

    /// User 1, with a device, and user 2 in conversation 8, and 1, 2 and 3 in conversation 9:
    /// with a threshold of two members, 9 is a large group, where a send
    /// moves its head and sets markers instead of writing events.
    /// (The engine's calls block: they run off the async workers.)
    fn engine(dir: &std::path::Path) -> Arc<Inbox> {
        tokio::task::block_in_place(|| open(dir))
    }

    fn open(dir: &std::path::Path) -> Arc<Inbox> {
        let mut config = InboxConfig::new(dir);
        config.segment_bytes = 1 << 20;
        config.compaction_interval = None;
        config.large_group_members = 2;
        let inbox = Inbox::open(config).expect("open");
        for (uid, conv) in [(1, 8), (2, 8), (1, 9), (2, 9), (3, 9)] {
            inbox.join(Uid(uid), ConvId(conv)).wait().expect("join");
        }
        // User 1 syncs: its events are kept, and hinted.
        inbox
            .register_device(Uid(1), inbox_engine::DeviceId(1))
            .wait()
            .expect("register");
        Arc::new(inbox)
    }

    /// A send to each conversation: an event for user 1 (a `HINT`) and a
    /// large group's head moving (a `DIRTY_HINT`).
    fn send(inbox: &Inbox, round: u128) {
        tokio::task::block_in_place(|| {
            for conv in [8u64, 9] {
                inbox
                    .send(SendRequest {
                        conv: ConvId(conv),
                        sender: Uid(2),
                        client_msg_id: round * 10 + u128::from(conv),
                        msg_type: 1,
                        payload: Bytes::from_static(b"hi"),
                    })
                    .wait()
                    .expect("send");
            }
        });
    }

    /// The next `HINT` and the next `DIRTY_HINT`, decoded, in whichever
    /// order the two loops send them.
    async fn next_pushes(rx: &mut mpsc::Receiver<Frame>, what: &str) -> (Hints, DirtyHints) {
        let (mut hint, mut dirty) = (None, None);
        let wait = async {
            while hint.is_none() || dirty.is_none() {
                let Some(f) = rx.recv().await else {
                    panic!("{what}: a push loop ended")
                };
                match Response::decode(f.opcode, f.body) {
                    Ok(Response::Hint(h)) if hint.is_none() => hint = Some(h),
                    Ok(Response::DirtyHint(d)) if dirty.is_none() => dirty = Some(d),
                    other => panic!("{what}: unexpected push {other:?}"),
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .is_err()
        {
            panic!("{what}: within 10 s, HINT {hint:?} and DIRTY_HINT {dirty:?}");
        }
        (hint.expect("a HINT"), dirty.expect("a DIRTY_HINT"))
    }

    fn pending(mailbox: &Mailbox) -> Vec<(u64, u64)> {
        let mut v: Vec<_> = mailbox
            .pending
            .lock()
            .unwrap()
            .clone()
            .into_iter()
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn a_round_reaches_only_the_mailboxes_of_its_uids_merged_to_the_newest() {
        let hint = |uid, seq| inbox_engine::inbox::Hint {
            uid: Uid(uid),
            committed_sync_seq: inbox_engine::SyncSeq(seq),
        };
        let routes = HintRoutes::default();
        let (a, b, idle) = (
            Arc::new(Mailbox::default()),
            Arc::new(Mailbox::default()),
            Arc::new(Mailbox::default()),
        );
        routes.add(&[1, 2], &a);
        routes.add(&[2], &b);
        routes.add(&[9], &idle);
        routes.deliver(&[hint(1, 5), hint(2, 7), hint(1, 6), hint(3, 1)]);
        assert_eq!(pending(&a), vec![(1, 6), (2, 7)]);
        assert_eq!(pending(&b), vec![(2, 7)]);
        assert!(
            pending(&idle).is_empty(),
            "a mailbox of no hinted uid got {:?}",
            pending(&idle)
        );
        // An older watermark never replaces a newer one still pending.
        routes.deliver(&[hint(2, 4)]);
        assert_eq!(pending(&b), vec![(2, 7)]);
        // Taken off the routes, a uid's hints no longer reach the mailbox.
        routes.remove(&[2], &a);
        routes.deliver(&[hint(2, 8)]);
        assert_eq!(pending(&a), vec![(1, 6), (2, 7)]);
        assert_eq!(pending(&b), vec![(2, 8)]);
        routes.remove(&[2], &b);
        assert!(
            routes.uids().iter().all(|u| u.get() != 2),
            "uid 2 left listed"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hints_follow_an_engine_replaced_by_a_snapshot_install() {
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let current = Arc::new(Mutex::new(engine(dir_a.path())));
        let c = Arc::clone(&current);
        let engine_now: CurrentEngine = Arc::new(move || Arc::clone(&c.lock().unwrap()));
        let subscribed = Arc::new(Mutex::new(HashSet::from([1u64])));
        let (tx, mut rx) = mpsc::channel(64);
        let (_closed_tx, closed) = watch::channel(false);
        let metrics = Arc::new(Metrics::default());
        let routes = Arc::new(HintRoutes::default());
        let mailbox = Arc::new(Mailbox::default());
        routes.add(&[1], &mailbox);
        let loops = [
            tokio::spawn(dispatch_hints(
                Arc::clone(&engine_now),
                Arc::clone(&routes),
                Arc::clone(&metrics),
                closed.clone(),
            )),
            tokio::spawn(hint_push_loop(
                mailbox,
                tx.clone(),
                Arc::clone(&metrics),
                closed.clone(),
            )),
            tokio::spawn(dirty_hint_loop(
                Arc::clone(&engine_now),
                subscribed,
                tx,
                metrics,
                closed,
            )),
        ];
        // What engine `inbox` holds for user 1 now: its watermark and its
        // marker of the large group, as pushes would carry them.
        let now = |inbox: &Inbox| {
            tokio::task::block_in_place(|| {
                let watermark = inbox.committed_sync_seqs(&[Uid(1)])[0].1;
                let m = inbox.dirty_markers(Uid(1)).expect("markers")[0];
                (
                    vec![inbox_wire::Hint {
                        uid: 1,
                        committed_sync_seq: watermark.get(),
                    }],
                    vec![DirtyHint {
                        uid: 1,
                        conv: 9,
                        target_msg_seq: m.target_msg_seq.get(),
                        version: m.version,
                    }],
                )
            })
        };

        send(&current.lock().unwrap(), 1);
        let (hint, dirty) = next_pushes(&mut rx, "first engine").await;
        assert_eq!((hint.hints, dirty.hints), now(&current.lock().unwrap()));

        // The install: requests go to a new engine, and the old one is
        // shut down and dropped, which closes its broadcasts. The
        // snapshot's state already holds rounds no loop heard.
        let installed = engine(dir_b.path());
        send(&installed, 5);
        let old = std::mem::replace(&mut *current.lock().unwrap(), installed);
        assert_eq!(
            Arc::strong_count(&old),
            1,
            "the dispatcher or a push loop holds the replaced engine alive"
        );
        tokio::task::block_in_place(|| drop(old));
        // Moved over, the loops push what the new engine holds now,
        // without waiting for its next round.
        let b = Arc::clone(&current.lock().unwrap());
        let expected = now(&b);
        let (hint, dirty) = next_pushes(&mut rx, "after the install").await;
        assert_eq!((hint.hints, dirty.hints), expected);

        // And the new engine's rounds are hinted as they commit.
        send(&b, 2);
        let expected_after = now(&b);
        assert_ne!(expected_after, expected, "the round moved nothing");
        let (hint, dirty) = next_pushes(&mut rx, "a round of the new engine").await;
        assert_eq!((hint.hints, dirty.hints), expected_after);
        for l in loops {
            l.abort();
        }
    }
}
