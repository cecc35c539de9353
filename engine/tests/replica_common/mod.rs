//! Helpers for the replication tests: engines in one process, one of them
//! leading, and a pump that stands in for the consensus layer (it takes
//! the leader's entries, applies them on the followers, then commits).
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use inbox_engine::inbox::{Entry, Leader, ManualClock};
use inbox_engine::*;

// The single-node tests' configuration, clock origin and directory copy.
#[path = "../inbox_common/mod.rs"]
mod inbox_common;
#[allow(unused_imports, reason = "each test binary uses a different subset")]
pub use inbox_common::{copy_running_dir, T0};

/// The single-node tests' configuration with `segment_bytes` segments.
pub fn config(dir: &std::path::Path, clock: &Arc<ManualClock>, segment_bytes: u64) -> InboxConfig {
    let mut c = inbox_common::config(dir, clock);
    c.segment_bytes = segment_bytes;
    c
}

/// One engine with its own data directory and clock. Fields drop in
/// order: the engine (and its final checkpoint) before its directory.
pub struct Node {
    pub inbox: Option<Arc<Inbox>>,
    pub dir: tempfile::TempDir,
    pub clock: Arc<ManualClock>,
    pub segment_bytes: u64,
}

impl Node {
    pub fn new(segment_bytes: u64) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(T0));
        let inbox = Inbox::open(config(dir.path(), &clock, segment_bytes)).unwrap();
        Node {
            dir,
            clock,
            segment_bytes,
            inbox: Some(Arc::new(inbox)),
        }
    }

    pub fn ib(&self) -> &Arc<Inbox> {
        self.inbox.as_ref().unwrap()
    }

    /// A follower from the start.
    pub fn follower(segment_bytes: u64) -> Node {
        let n = Node::new(segment_bytes);
        n.ib().follow().unwrap();
        n
    }

    /// Shuts the engine down (final checkpoint) and opens it again, as a
    /// follower.
    pub fn restart_as_follower(&mut self) {
        let ib = self.inbox.take().unwrap();
        Arc::try_unwrap(ib)
            .unwrap_or_else(|_| panic!("engine still shared"))
            .shutdown()
            .unwrap();
        self.open_again();
    }

    pub fn open_again(&mut self) {
        let ib = Inbox::open(config(self.dir.path(), &self.clock, self.segment_bytes)).unwrap();
        ib.follow().unwrap();
        self.inbox = Some(Arc::new(ib));
    }
}

/// Stands in for raft: applies each entry of the leader on every follower
/// (waiting until durable there), then commits it on the leader. Keeps
/// every entry, in order, for followers that rejoin.
pub struct Pump {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub log: Arc<Mutex<Vec<Entry>>>,
}

impl Pump {
    pub fn start(leader: Leader, followers: Vec<Arc<Inbox>>) -> Pump {
        Self::start_with_log(leader, followers, Arc::new(Mutex::new(Vec::new())))
    }

    pub fn start_with_log(
        leader: Leader,
        followers: Vec<Arc<Inbox>>,
        log: Arc<Mutex<Vec<Entry>>>,
    ) -> Pump {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, l) = (Arc::clone(&stop), Arc::clone(&log));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                for e in leader.wait_entries(Duration::from_millis(5)) {
                    for f in &followers {
                        f.apply_entry(e.clone()).wait().unwrap();
                    }
                    let index = e.index();
                    l.lock().unwrap().push(e);
                    leader.commit(index);
                }
            }
        });
        Pump {
            stop,
            thread: Some(thread),
            log,
        }
    }

    pub fn stop(mut self) -> Arc<Mutex<Vec<Entry>>> {
        self.stop.store(true, Ordering::Release);
        self.thread.take().unwrap().join().unwrap();
        Arc::clone(&self.log)
    }
}

pub fn send(ib: &Inbox, conv: u64, sender: u64, cmid: u128, body: &str) -> Result<SendReply> {
    ib.send(SendRequest {
        conv: ConvId(conv),
        sender: Uid(sender),
        client_msg_id: cmid,
        msg_type: 1,
        payload: Bytes::copy_from_slice(body.as_bytes()),
    })
    .wait()
}

/// A device's catch-up from what it ACKed: pages until the batch ends,
/// then an ACK of it.
pub fn catch_up(ib: &Inbox, uid: u64, device: u64) -> SyncSeq {
    let info = ib
        .devices(Uid(uid))
        .unwrap()
        .into_iter()
        .find(|d| d.device == DeviceId(device))
        .unwrap();
    let gen = info.generation;
    let req = |gen, local, token| SyncRequest {
        uid: Uid(uid),
        device: DeviceId(device),
        generation: Some(gen),
        local_applied_seq: local,
        limit: 50,
        batch_token: token,
    };
    let first = ib.sync(req(gen, info.acked_sync_seq, None)).wait().unwrap();
    let token = first.batch_token.clone();
    let (mut cursor, mut more) = (first.next_cursor, first.has_more);
    while more {
        let p = ib
            .sync(req(first.generation, cursor, Some(token.clone())))
            .wait()
            .unwrap();
        cursor = p.next_cursor;
        more = p.has_more;
    }
    ib.ack(AckRequest {
        uid: Uid(uid),
        device: DeviceId(device),
        generation: first.generation,
        seq: cursor,
        batch_token: token,
    })
    .wait()
    .unwrap()
    .acked_sync_seq
}

/// Everything a client can read from a node without writing.
pub fn answers(ib: &Inbox) -> Vec<String> {
    let mut out = Vec::new();
    for uid in 1..=5u64 {
        out.push(format!(
            "{:?}",
            ib.devices(Uid(uid)).map_err(|e| e.to_string())
        ));
        out.push(format!(
            "{:?}",
            ib.conv_list(Uid(uid), 50, None).map_err(|e| e.to_string())
        ));
        for conv in [10u64, 11, 12] {
            out.push(format!(
                "{:?}",
                ib.pull(Uid(uid), &[(ConvId(conv), MsgSeq(0))], 1000)
                    .map_err(|e| e.to_string())
            ));
            out.push(format!(
                "{:?}",
                ib.history(Uid(uid), ConvId(conv), None, 9)
                    .map_err(|e| e.to_string())
            ));
        }
    }
    out
}

/// Waits until `ib` has applied every round up to `index`.
pub fn wait_index(ib: &Inbox, index: u64) {
    let start = std::time::Instant::now();
    while ib.replica_index() < index {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "index {} never reached {index}",
            ib.replica_index()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
