//! raft snapshots over the engine, three nodes in one process over an
//! in-memory network: a follower cut off while the leader's log is purged
//! catches up by snapshot; a node whose data directory was wiped rejoins
//! and catches up by snapshot; a node stopped between a snapshot and the
//! purge after it starts again; a damaged snapshot is refused and leaves the
//! follower as it was, and the one sent again is installed.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{join, send_req, seqs, submit, Group, DEADLINE};
use inbox_engine::inbox::ManualClock;
use inbox_engine::*;
use inbox_server::cluster::default_config;
use openraft::async_runtime::WatchReceiver as _;

/// A snapshot every 20 rounds, the log purged up to it at once.
fn config() -> openraft::Config {
    openraft::Config {
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(20),
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..default_config()
    }
}

fn engine_config(dir: &std::path::Path, clock: &Arc<ManualClock>) -> InboxConfig {
    let mut c = common::engine_config(dir);
    c.clock = clock.clone();
    c.segment_bytes = 64 << 10;
    // Only the compaction test moves the clock past it.
    c.history_retention = Some(Duration::from_secs(24 * 3600));
    c
}

/// Three nodes with snapshots every 20 rounds.
async fn start() -> Group {
    start_with(config()).await.0
}

/// Three nodes with `raft_config`, and the clock their engines read.
async fn start_with(raft_config: openraft::Config) -> (Group, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let theirs = Arc::clone(&clock);
    let g = Group::three_with(raft_config, move |dir| engine_config(dir, &theirs)).await;
    (g, clock)
}

impl Group {
    /// Waits until the leader's raft has purged its log past `index`.
    async fn purged_past(&self, leader: u64, index: u64) {
        let start = Instant::now();
        let mut m = self.nodes[&leader].raft().metrics();
        loop {
            let purged = m.borrow_and_update().purged.map_or(0, |p| p.index);
            if purged > index {
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the leader's log was not purged past {index} (purged up to {purged})"
            );
            let _ = tokio::time::timeout(Duration::from_millis(50), m.changed()).await;
        }
    }

    /// Waits until node `id` has built or installed a snapshot past
    /// `index`; returns its index.
    async fn snapshot_past(&self, id: u64, index: u64) -> u64 {
        let start = Instant::now();
        let mut m = self.nodes[&id].raft().metrics();
        loop {
            let at = m.borrow_and_update().snapshot.map_or(0, |s| s.index);
            if at > index {
                return at;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "node {id} has no snapshot past {index} (at {at})"
            );
            let _ = tokio::time::timeout(Duration::from_millis(50), m.changed()).await;
        }
    }

    /// Waits until two more calls to node `id`, cut off, have been
    /// refused: the second was made after the first failed, so anything
    /// raft read for it was read after this call began.
    async fn two_more_calls_refused(&self, id: u64) {
        let refused = || {
            self.router
                .refused_while_cut
                .lock()
                .unwrap()
                .get(&id)
                .copied()
                .unwrap_or(0)
        };
        let start = Instant::now();
        let before = refused();
        while refused() < before + 2 {
            assert!(
                start.elapsed() < DEADLINE,
                "raft stopped calling node {id} while it was cut off"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until node `id` has taken a snapshot in whole. The router
    /// counts one once the node's install has returned, a moment after
    /// its engine already serves the installed state, so a node found
    /// converged may not be counted yet; one that caught up without a
    /// snapshot never is, and this fails at the deadline.
    async fn took_a_snapshot(&self, id: u64) {
        let start = Instant::now();
        while self.installed(id) == 0 {
            assert!(
                start.elapsed() < DEADLINE,
                "node {id} caught up without a snapshot"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// How many snapshots node `id` took in whole.
    fn installed(&self, id: u64) -> usize {
        self.router
            .installed
            .lock()
            .unwrap()
            .get(&id)
            .copied()
            .unwrap_or(0)
    }
}

/// The leader, once users 1 to 3 have joined the conversation on it.
async fn joined(g: &Group) -> u64 {
    let l = g.leader().await;
    for uid in 1..=3 {
        join(g.ib(l), uid).await;
    }
    l
}

/// A send with a payload of some 600 bytes.
async fn send(ib: Arc<Inbox>, sender: u64, cmid: u128) -> Result<SendReply> {
    let req = SendRequest {
        payload: Bytes::from(format!("message {cmid} {}", "x".repeat(600))),
        ..send_req(sender, cmid)
    };
    submit(ib, req).await
}

/// `n` sends on the leader. On a loaded machine an election may move the
/// leadership meanwhile: a send the old leader gave up (`NOT_LEADER`) is
/// retried on the new one by its key, as a client would.
async fn writes(g: &Group, leader: u64, from: u128, n: u128) -> u64 {
    let mut last = 0;
    for i in from..from + n {
        let mut at = leader;
        last = loop {
            match send(g.ib(at), 1 + (i % 3) as u64, i).await {
                Ok(reply) => break reply.msg_seq.0,
                Err(Error::NotLeader(_)) => at = g.leader().await,
                Err(e) => panic!("send {i}: {e}"),
            }
        };
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_cut_off_while_the_leaders_log_is_purged_catches_up_by_snapshot() {
    let g = start().await;
    let l = joined(&g).await;
    writes(&g, l, 0, 5).await;
    g.converged().await;
    let f = (1..=3).find(|&id| id != l).unwrap();
    g.router.cut.lock().unwrap().insert(f);
    let behind = g.ib(f).replica_index();
    let last = writes(&g, l, 100, 60).await;
    g.purged_past(l, behind).await;
    assert_eq!(
        g.ib(f).replica_index(),
        behind,
        "a cut-off node received rounds"
    );
    assert_eq!(g.installed(f), 0);

    g.router.cut.lock().unwrap().clear();
    g.converged().await;
    g.took_a_snapshot(f).await;
    assert_eq!(seqs(&g.ib(f)), (1..=last).collect::<Vec<u64>>());
    // It goes on from the snapshot with entries, and serves as leader
    // material: its engine is the installed one.
    let last = writes(&g, l, 200, 5).await;
    g.converged().await;
    assert_eq!(seqs(&g.ib(f)), (1..=last).collect::<Vec<u64>>());
    g.ib(f).check_invariants().unwrap();
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_data_directory_was_wiped_rejoins_and_catches_up_by_snapshot() {
    let mut g = start().await;
    let l = joined(&g).await;
    writes(&g, l, 0, 30).await;
    g.converged().await;
    let w = (1..=3).find(|&id| id != l).unwrap();
    g.stop(w).await;
    // Its data directory is emptied: no log, no checkpoint, no vote.
    for e in std::fs::read_dir(g.dirs[&w].path()).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
    let last = writes(&g, l, 100, 30).await;
    g.purged_past(l, 1).await;
    g.run(w).await;
    g.converged().await;
    g.took_a_snapshot(w).await;
    assert_eq!(seqs(&g.ib(w)), (1..=last).collect::<Vec<u64>>());
    // Restarted again, it opens on the installed directory and its raft
    // state (the snapshot's log id, the purge) and keeps up. What a crash
    // in the middle of an install or a build leaves (beside the data
    // directory, a staged directory never swapped in or the old one
    // swapped out; inside it, a scratch image and a partial image file)
    // is removed at start, unread.
    g.stop(w).await;
    let dir = g.dirs[&w].path().canonicalize().unwrap();
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let leftovers = [
        dir.with_file_name(format!(".{name}.install")),
        dir.with_file_name(format!(".{name}.image")),
        dir.join("image.tmp"),
    ];
    for d in &leftovers {
        std::fs::create_dir_all(d.join("evt")).unwrap();
        std::fs::write(d.join("evt").join("0000000001.seg"), b"not a segment").unwrap();
    }
    // An image file being built or received, cut short.
    let partial = [
        dir.join("raft-snapshot.build.tmp"),
        dir.join("raft-snapshot.recv.tmp"),
    ];
    for f in &partial {
        std::fs::write(f, b"IXIMAGE1 cut short").unwrap();
    }
    g.run(w).await;
    for d in leftovers.iter().chain(&partial) {
        assert!(!d.exists(), "{} left in place", d.display());
    }
    // It knows itself a voter of the group again: the membership came
    // back from the raft metadata the install wrote (raft publishes its
    // metrics a moment after it starts).
    let mut m = g.nodes[&w].raft().metrics();
    let start = Instant::now();
    loop {
        let voters: Vec<u64> = m
            .borrow_and_update()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        if !voters.is_empty() || start.elapsed() > Duration::from_secs(5) {
            assert_eq!(
                voters,
                vec![1, 2, 3],
                "node {w}'s membership after a restart; raft-meta.json: {}",
                std::fs::read_to_string(dir.join("raft-meta.json")).unwrap_or_default()
            );
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(50), m.changed()).await;
    }
    let last = writes(&g, l, 200, 5).await;
    g.converged().await;
    assert_eq!(seqs(&g.ib(w)), (1..=last).collect::<Vec<u64>>());
    g.shutdown().await;
}

/// raft purges its log some time after a snapshot, and the snapshot file
/// is durable before: a node stopped in between holds a snapshot past its
/// purge point. raft refused to start on it (its snapshot past its applied
/// point, which was the purge's), and the node never came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_stopped_between_a_snapshot_and_the_purge_after_it_starts_again() {
    // Snapshots every 20 rounds, the log kept far behind them: no purge.
    let (mut g, _clock) = start_with(openraft::Config {
        max_in_snapshot_log_to_keep: 1_000,
        ..config()
    })
    .await;
    let l = joined(&g).await;
    writes(&g, l, 0, 30).await;
    g.converged().await;
    let f = (1..=3).find(|&id| id != l).unwrap();
    let snapshot = g.snapshot_past(f, 1).await;
    let purged = g.nodes[&f].raft().metrics().borrow_watched().purged;
    assert!(
        purged.is_none_or(|p| p.index < snapshot),
        "node {f} purged up to its snapshot at {snapshot}: {purged:?}"
    );
    g.stop(f).await;
    g.run(f).await;
    // raft started on the kept snapshot (it publishes its metrics a
    // moment after it starts).
    assert_eq!(g.snapshot_past(f, snapshot - 1).await, snapshot);
    let last = writes(&g, l, 100, 5).await;
    g.converged().await;
    assert_eq!(seqs(&g.ib(f)), (1..=last).collect::<Vec<u64>>());
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_damaged_snapshot_is_refused_and_leaves_the_follower_as_it_was() {
    let g = start().await;
    let l = joined(&g).await;
    writes(&g, l, 0, 5).await;
    g.converged().await;
    let f = (1..=3).find(|&id| id != l).unwrap();
    g.router.cut.lock().unwrap().insert(f);
    let (index, digest) = (g.ib(f).replica_index(), g.ib(f).replica_digest());
    writes(&g, l, 100, 60).await;
    g.purged_past(l, index).await;

    g.router.damage_next_snapshot_to.lock().unwrap().insert(f);
    g.router.cut.lock().unwrap().clear();
    g.converged().await;
    let refused = g.router.refused.lock().unwrap().clone();
    // The damaged one was refused with the follower unchanged; the one
    // sent again was installed.
    assert_eq!(refused, vec![(f, index, digest)]);
    g.took_a_snapshot(f).await;
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rounds_the_leaders_compaction_deleted_reach_a_follower_as_a_snapshot() {
    // No snapshot by the policy: only the compaction makes raft purge.
    let (g, clock) = start_with(openraft::Config {
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1_000_000),
        ..config()
    })
    .await;
    let l = joined(&g).await;
    g.converged().await;
    let f = (1..=3).find(|&id| id != l).unwrap();
    g.router.cut.lock().unwrap().insert(f);
    let behind = g.ib(f).replica_index();
    let last = writes(&g, l, 100, 400).await;
    // Past the safety window every event is trimmed (nothing fences it),
    // past the retention every message, and the segments that held the
    // early rounds are deleted: on both nodes that can lead, since on a
    // loaded machine an election may move the leadership, and a leader
    // that still held the rounds would send them as entries.
    clock.advance(Duration::from_secs(8 * 24 * 3600));
    // The leader's pass trims the state on every node (its trim is a
    // round); the other node's pass then deletes its own segments.
    let other = (1..=3).find(|&n| n != f && n != l).unwrap();
    for n in [l, other] {
        let ib = g.ib(n);
        let report = tokio::task::spawn_blocking(move || {
            let first = ib.compact().unwrap();
            ib.checkpoint().unwrap();
            ib.checkpoint().unwrap();
            (first, ib.compact().unwrap())
        })
        .await
        .unwrap();
        assert!(
            n != l || report.0.events_reclaimed > 0,
            "node {n}: {report:?}"
        );
        assert!(
            g.ib(n)
                .read_entries(behind + 1, behind + 1)
                .unwrap()
                .is_empty(),
            "node {n} still holds round {}: {:?} {:?}",
            behind + 1,
            g.ib(n).explain_segment("evt", 1),
            std::fs::read_dir(g.dirs[&n].path().join("evt"))
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (e.file_name(), e.metadata().unwrap().len())
                })
                .collect::<Vec<_>>()
        );
    }

    // Replication reads the log, as a leader restarted since would. A
    // call raft built from the cache just before may still be on its way:
    // the follower comes back only once two more calls were refused, the
    // second built after the first failed, from the log.
    for n in (1..=3).filter(|&n| n != f) {
        g.nodes[&n].forget_recent_entries();
    }
    g.two_more_calls_refused(f).await;
    g.router.cut.lock().unwrap().clear();
    g.converged().await;
    g.took_a_snapshot(f).await;
    assert_eq!(seqs(&g.ib(f)), seqs(&g.ib(l)));
    // The sends go on, on every node.
    let more = writes(&g, l, 1000, 3).await;
    assert!(more > last);
    g.converged().await;
    assert_eq!(seqs(&g.ib(f)), seqs(&g.ib(l)));
    g.shutdown().await;
}
