//! Server pushes to subscribed connections (R16): `HINT` when a user's
//! committed sync watermark moves, and `DIRTY_HINT` when a large group's
//! head moves for a subscribed member (only on connections that asked with
//! `SUBSCRIBE_DIRTY`: older clients never see an opcode they do not know).
//!
//! Both are routed by uid. The daemon has one listener to each of the
//! engine's two broadcasts ([`dispatch`]): for each commit round it finds
//! the entries of the uids someone subscribed to, and hands each to the
//! mailboxes of the connections subscribed to its uid ([`Routes`]), waking
//! each such connection once. A round therefore costs a lookup per hint
//! (per subscribed uid of a large group whose head moved, for
//! `DIRTY_HINT`), however many connections are open; no connection does
//! anything for a round that is not about its uids.
//!
//! Both are best effort. Entries wait in a connection's mailbox, merged
//! per key to the newest, while its writer is backed up, and go once the
//! next round for it arrives. A dispatcher that falls too far behind its
//! broadcast counts the rounds lost in `inboxd_hints_dropped` and offers
//! what the engine holds then for every subscribed uid. A device still
//! catches up by `SYNC`, `DIRTY` or opening the conversation.
//!
//! A member of a replicated group replaces its engine when it installs a
//! snapshot. The dispatchers follow: when the engine they listen to is
//! gone, they listen to the current one and then offer what its state says
//! now (each subscribed uid's watermark, each dirty marker), so the rounds
//! the snapshot carried, and any committed while they moved over, are
//! hinted once, coalesced. They never hold a replaced engine alive.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
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

/// An entry of a push frame: what a mailbox merges, per key, to the
/// newest.
pub(crate) trait Pushed: Clone + Send + 'static {
    type Key: Copy + Eq + Hash + Ord + Send;
    fn key(&self) -> Self::Key;
    /// The subscribed uid the entry is about.
    fn uid(&self) -> u64;
    /// Whether this entry replaces `pending`, of the same key.
    fn replaces(&self, pending: &Self) -> bool;
    /// The push frame of `entries`, sorted by key.
    fn frame(entries: Vec<Self>) -> Frame;
}

impl Pushed for Hint {
    type Key = u64;
    fn key(&self) -> u64 {
        self.uid
    }
    fn uid(&self) -> u64 {
        self.uid
    }
    fn replaces(&self, pending: &Self) -> bool {
        self.committed_sync_seq > pending.committed_sync_seq
    }
    fn frame(hints: Vec<Self>) -> Frame {
        Response::Hint(Hints { hints }).to_frame(0)
    }
}

impl Pushed for DirtyHint {
    type Key = (u64, u64);
    fn key(&self) -> (u64, u64) {
        (self.uid, self.conv)
    }
    fn uid(&self) -> u64 {
        self.uid
    }
    fn replaces(&self, pending: &Self) -> bool {
        self.version >= pending.version
    }
    fn frame(hints: Vec<Self>) -> Frame {
        Response::DirtyHint(DirtyHints { hints }).to_frame(0)
    }
}

/// One connection's entries not yet sent, merged per key to the newest,
/// and the wake-up of its [`push_loop`]. A dispatcher fills it.
pub(crate) struct Mailbox<P: Pushed> {
    pending: Mutex<HashMap<P::Key, P>>,
    ready: tokio::sync::Notify,
}

impl<P: Pushed> Default for Mailbox<P> {
    fn default() -> Self {
        Mailbox {
            pending: Mutex::new(HashMap::new()),
            ready: tokio::sync::Notify::new(),
        }
    }
}

impl<P: Pushed> Mailbox<P> {
    /// Keeps `entry` unless a newer one of its key is pending.
    fn offer(&self, entry: P) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        match pending.entry(entry.key()) {
            Entry::Occupied(mut e) => {
                if entry.replaces(e.get()) {
                    e.insert(entry);
                }
            }
            Entry::Vacant(e) => {
                e.insert(entry);
            }
        }
    }

    /// The pending entries, sorted by key, leaving none.
    fn take(&self) -> Vec<P> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mut entries: Vec<P> = pending.drain().map(|(_, e)| e).collect();
        entries.sort_by_key(P::key);
        entries
    }
}

/// Which connections listen for which uid. Kept by `SUBSCRIBE`,
/// `SUBSCRIBE_DIRTY`, `UNSUBSCRIBE` and the connection's end. A uid nearly
/// always has one listener (a user's connected device): it is kept in
/// `first`, a pointer per uid, and any others in `more`, so that a
/// subscription costs one small table entry.
pub(crate) struct Routes<P: Pushed> {
    lists: Mutex<RouteLists<P>>,
}

struct RouteLists<P: Pushed> {
    first: HashMap<u64, Arc<Mailbox<P>>>,
    more: HashMap<u64, Vec<Arc<Mailbox<P>>>>,
}

impl<P: Pushed> Default for Routes<P> {
    fn default() -> Self {
        Routes {
            lists: Mutex::new(RouteLists {
                first: HashMap::new(),
                more: HashMap::new(),
            }),
        }
    }
}

impl<P: Pushed> Routes<P> {
    fn lists(&self) -> std::sync::MutexGuard<'_, RouteLists<P>> {
        self.lists.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `mailbox` listens for `uids` from now on (the caller passes only
    /// uids it does not listen for yet).
    pub(crate) fn add(&self, uids: &[u64], mailbox: &Arc<Mailbox<P>>) {
        let mut lists = self.lists();
        let RouteLists { first, more } = &mut *lists;
        for &uid in uids {
            match first.entry(uid) {
                Entry::Vacant(e) => {
                    e.insert(Arc::clone(mailbox));
                }
                Entry::Occupied(_) => more.entry(uid).or_default().push(Arc::clone(mailbox)),
            }
        }
    }

    /// `mailbox` no longer listens for `uids`.
    pub(crate) fn remove(&self, uids: &[u64], mailbox: &Arc<Mailbox<P>>) {
        let mut lists = self.lists();
        let RouteLists { first, more } = &mut *lists;
        for uid in uids {
            let Entry::Occupied(mut head) = first.entry(*uid) else {
                continue;
            };
            let Entry::Occupied(mut rest) = more.entry(*uid) else {
                if Arc::ptr_eq(head.get(), mailbox) {
                    head.remove();
                }
                continue;
            };
            if Arc::ptr_eq(head.get(), mailbox) {
                // The next listener moves up.
                let next = rest.get_mut().pop().expect("`more` holds no empty list");
                head.insert(next);
            } else {
                rest.get_mut().retain(|m| !Arc::ptr_eq(m, mailbox));
            }
            if rest.get().is_empty() {
                rest.remove();
            }
        }
    }

    /// Uids with at least one listener.
    fn uids(&self) -> Vec<Uid> {
        self.lists().first.keys().map(|&uid| Uid(uid)).collect()
    }

    fn is_empty(&self) -> bool {
        self.lists().first.is_empty()
    }

    /// Offers each entry to its uid's listeners and wakes each listener
    /// that got one.
    fn deliver(&self, entries: Vec<P>) {
        let lists = self.lists();
        for entry in entries {
            let uid = entry.uid();
            let head = lists.first.get(&uid);
            let rest = lists.more.get(&uid).map(Vec::as_slice).unwrap_or_default();
            for mailbox in head.into_iter().chain(rest) {
                mailbox.offer(entry.clone());
                // Holds one wake-up at most, however many entries came.
                mailbox.ready.notify_one();
            }
        }
    }
}

/// One of the engine's two broadcasts, and how its rounds become entries.
pub(crate) trait Source: Send + 'static {
    type Round: Clone + Send + 'static;
    type Entry: Pushed;
    fn subscribe(inbox: &Inbox) -> broadcast::Receiver<Self::Round>;
    /// The entries of `round` for the uids `routes` has listeners for.
    fn entries(inbox: &Inbox, round: Self::Round, routes: &Routes<Self::Entry>)
        -> Vec<Self::Entry>;
    /// What `inbox` holds now for `uids`.
    fn now(inbox: &Inbox, uids: &[Uid]) -> Vec<Self::Entry>;
}

/// `HINT`: a round's watermarks, as the engine publishes them.
pub(crate) struct Watermarks;

impl Source for Watermarks {
    type Round = Vec<inbox_engine::inbox::Hint>;
    type Entry = Hint;

    fn subscribe(inbox: &Inbox) -> broadcast::Receiver<Self::Round> {
        inbox.subscribe_hints()
    }

    fn entries(_: &Inbox, round: Self::Round, _: &Routes<Hint>) -> Vec<Hint> {
        round.into_iter().map(wire_hint).collect()
    }

    fn now(inbox: &Inbox, uids: &[Uid]) -> Vec<Hint> {
        inbox
            .committed_sync_seqs(uids)
            .into_iter()
            .map(|(uid, committed_sync_seq)| {
                wire_hint(inbox_engine::inbox::Hint {
                    uid,
                    committed_sync_seq,
                })
            })
            .collect()
    }
}

fn wire_hint(h: inbox_engine::inbox::Hint) -> Hint {
    Hint {
        uid: h.uid.get(),
        committed_sync_seq: h.committed_sync_seq.get(),
    }
}

/// `DIRTY_HINT`: the markers `DIRTY` would list now for the subscribed
/// members of each large group whose head moved (memory only, under the
/// engine's state read lock: a lookup per subscribed uid and group).
pub(crate) struct Markers;

impl Source for Markers {
    type Round = Vec<LargeGroupHint>;
    type Entry = DirtyHint;

    fn subscribe(inbox: &Inbox) -> broadcast::Receiver<Self::Round> {
        inbox.subscribe_large_group_hints()
    }

    fn entries(inbox: &Inbox, round: Self::Round, routes: &Routes<DirtyHint>) -> Vec<DirtyHint> {
        if routes.is_empty() {
            return Vec::new();
        }
        let uids = routes.uids();
        let convs: HashSet<ConvId> = round.iter().map(|h| h.conv).collect();
        let mut entries = Vec::new();
        for conv in convs {
            for (uid, m) in inbox.dirty_markers_among(conv, &uids) {
                entries.push(DirtyHint {
                    uid: uid.get(),
                    conv: conv.get(),
                    target_msg_seq: m.target_msg_seq.get(),
                    version: m.version,
                });
            }
        }
        entries
    }

    fn now(inbox: &Inbox, uids: &[Uid]) -> Vec<DirtyHint> {
        let mut entries = Vec::new();
        for &uid in uids {
            for m in inbox.dirty_markers(uid).unwrap_or_default() {
                entries.push(DirtyHint {
                    uid: uid.get(),
                    conv: m.conv.get(),
                    target_msg_seq: m.target_msg_seq.get(),
                    version: m.version,
                });
            }
        }
        entries
    }
}

/// The daemon's one listener to `S`'s rounds: routes their entries to the
/// connections subscribed to their uids. It listens from the moment it is
/// called, before the future first runs. A round it falls too far behind
/// to receive is counted in `inboxd_hints_dropped`, and what the engine
/// holds then is offered instead; when the engine is replaced (a snapshot
/// install), it listens to the new one and offers what that one holds.
pub(crate) fn dispatch<S: Source>(
    engine: CurrentEngine,
    routes: Arc<Routes<S::Entry>>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> {
    let mut rounds = S::subscribe(&engine());
    async move {
        loop {
            let round = tokio::select! {
                round = rounds.recv() => round,
                _ = shutdown.changed() => return,
            };
            match round {
                Ok(round) => {
                    let inbox = engine();
                    routes.deliver(S::entries(&inbox, round, &routes));
                }
                Err(RecvError::Lagged(_)) => {
                    metrics.hints_dropped.inc();
                    let inbox = engine();
                    routes.deliver(S::now(&inbox, &routes.uids()));
                }
                // Every sender is gone only once its engine is dropped: it
                // was replaced. Listen to the one requests go to now before
                // reading its state, so nothing falls in between.
                Err(RecvError::Closed) => {
                    let inbox = engine();
                    rounds = S::subscribe(&inbox);
                    routes.deliver(S::now(&inbox, &routes.uids()));
                }
            }
        }
    }
}

/// Pushes one connection's frames as a dispatcher fills its mailbox. When
/// the connection's writer is backed up, the entries wait in the mailbox,
/// merged, and go once the next round for the connection arrives.
pub(crate) async fn push_loop<P: Pushed>(
    mailbox: Arc<Mailbox<P>>,
    tx: mpsc::Sender<Frame>,
    metrics: Arc<Metrics>,
    mut closed: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = mailbox.ready.notified() => {}
            _ = closed.changed() => return,
        }
        // Room first: with the writer backed up, the entries stay in the
        // mailbox, merged, until the next round for the connection.
        let permit = match tx.try_reserve() {
            Ok(permit) => permit,
            Err(mpsc::error::TrySendError::Full(())) => continue,
            Err(mpsc::error::TrySendError::Closed(())) => return,
        };
        let entries = mailbox.take();
        if entries.is_empty() {
            continue;
        }
        let count = entries.len() as u64;
        permit.send(P::frame(entries));
        metrics.hints_sent.inc_by(count);
    }
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

    fn pending(mailbox: &Mailbox<Hint>) -> Vec<(u64, u64)> {
        let mut v: Vec<_> = mailbox
            .pending
            .lock()
            .unwrap()
            .values()
            .map(|h| (h.uid, h.committed_sync_seq))
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn a_round_reaches_only_the_mailboxes_of_its_uids_merged_to_the_newest() {
        let hint = |uid, committed_sync_seq| Hint {
            uid,
            committed_sync_seq,
        };
        let routes = Routes::<Hint>::default();
        let (a, b, idle) = (
            Arc::new(Mailbox::default()),
            Arc::new(Mailbox::default()),
            Arc::new(Mailbox::default()),
        );
        routes.add(&[1, 2], &a);
        routes.add(&[2], &b);
        routes.add(&[9], &idle);
        routes.deliver(vec![hint(1, 5), hint(2, 7), hint(1, 6), hint(3, 1)]);
        assert_eq!(pending(&a), vec![(1, 6), (2, 7)]);
        assert_eq!(pending(&b), vec![(2, 7)]);
        assert!(
            pending(&idle).is_empty(),
            "a mailbox of no hinted uid got {:?}",
            pending(&idle)
        );
        // An older watermark never replaces a newer one still pending.
        routes.deliver(vec![hint(2, 4)]);
        assert_eq!(pending(&b), vec![(2, 7)]);
        // Taken off the routes, a uid's hints no longer reach the mailbox.
        routes.remove(&[2], &a);
        routes.deliver(vec![hint(2, 8)]);
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
        let (tx, mut rx) = mpsc::channel(64);
        let (_closed_tx, closed) = watch::channel(false);
        let metrics = Arc::new(Metrics::default());
        // One connection subscribed to user 1 with `SUBSCRIBE_DIRTY`.
        let (routes, dirty_routes) = (
            Arc::new(Routes::<Hint>::default()),
            Arc::new(Routes::<DirtyHint>::default()),
        );
        let (mailbox, dirty_mailbox) = (Arc::new(Mailbox::default()), Arc::new(Mailbox::default()));
        routes.add(&[1], &mailbox);
        dirty_routes.add(&[1], &dirty_mailbox);
        let loops = [
            tokio::spawn(dispatch::<Watermarks>(
                Arc::clone(&engine_now),
                routes,
                Arc::clone(&metrics),
                closed.clone(),
            )),
            tokio::spawn(dispatch::<Markers>(
                Arc::clone(&engine_now),
                dirty_routes,
                Arc::clone(&metrics),
                closed.clone(),
            )),
            tokio::spawn(push_loop(
                mailbox,
                tx.clone(),
                Arc::clone(&metrics),
                closed.clone(),
            )),
            tokio::spawn(push_loop(dirty_mailbox, tx, metrics, closed)),
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
