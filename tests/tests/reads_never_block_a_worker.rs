//! While one round's fsync is held (a stalled disk), the daemon keeps
//! answering every read that does not depend on that round, on other
//! connections, even when more reads wait for the held round than the
//! runtime has workers; and the held writer and those waiting readers are
//! answered once the fsync goes through.
//!
//! The daemon runs on a 2-worker runtime (`TOKIO_WORKER_THREADS=2`) and the
//! test parks six reads behind the held round: if a read waited by blocking
//! its worker, both workers would be stuck and the other users' reads
//! would never be answered (the test then fails on its deadline).
//!
//! Run with `cargo test -p inbox-tests --features failpoints --test
//! reads_never_block_a_worker` (the `fsync_hold_marker` failpoint).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inbox_tests::{register, send_text, Daemon};
use inbox_wire::*;

const WRITER: u64 = 1;
const OTHER: u64 = 2;
const HELD: u64 = 3;
const CONV: u64 = 100;
const HELD_CONV: u64 = 200;
/// More than the daemon's workers.
const PARKED_READS: usize = 6;
/// Far beyond any scheduling delay: reaching it means a read is stuck.
const DEADLINE: Duration = Duration::from_secs(30);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_inboxd-failpoints"))
}

async fn answered<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, call)
        .await
        .unwrap_or_else(|_| panic!("{what} was not answered while another user's fsync is held"))
}

fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + DEADLINE;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "no fsync reached the hold marker: the held write never got to its fsync"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_other_users_are_answered_while_a_round_fsync_is_held() {
    let dir = inbox_tests::data_dir();
    let marker = dir.path().join("HOLD");
    let held_marker = dir.path().join("HOLD.held");
    let daemon = Daemon::start_binary(
        &binary(),
        dir.path(),
        &["--segment-bytes", "1048576"],
        &[
            ("INBOXD_FAILPOINTS", "fsync_hold_marker=HOLD"),
            ("TOKIO_WORKER_THREADS", "2"),
        ],
    );
    let admin = daemon.client().await;
    for uid in [WRITER, OTHER] {
        admin.join(ConvMember { conv: CONV, uid }).await.unwrap();
    }
    admin
        .join(ConvMember {
            conv: HELD_CONV,
            uid: HELD,
        })
        .await
        .unwrap();
    register(&admin, HELD, 1).await;
    let generation = register(&admin, OTHER, 1).await;
    for n in 0..5 {
        send_text(&admin, CONV, WRITER, &format!("message {n}")).await;
    }
    // A second device of OTHER, reset to a snapshot to read during the hold.
    register(&admin, OTHER, 2).await;
    let snapshot = admin
        .begin_snapshot(UserDevice {
            uid: OTHER,
            device: 2,
        })
        .await
        .unwrap();
    // Connections are opened before the hold: one per parked read, and
    // one for each of OTHER's reads.
    let mut parked_clients = Vec::new();
    for _ in 0..PARKED_READS {
        parked_clients.push(daemon.user_client().await);
    }
    let held_writer = daemon.user_client().await;
    let reader = daemon.user_client().await;
    let reader_admin = daemon.client().await;
    // A sync refreshes the device's `last_seen` (a write) at most once a
    // second: wait that out and sync now, so the sync during the hold
    // changes nothing and is answered from durable state.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let first = reader
        .sync_to_end(OTHER, 1, Some(generation), 0, true)
        .await
        .unwrap();
    assert!(first.events.len() >= 5, "the five messages and the join");

    std::fs::write(&marker, b"").unwrap();
    let held_write = tokio::spawn(async move {
        held_writer
            .set_conv_flags(ConvFlagsReq {
                uid: HELD,
                conv: HELD_CONV,
                muted: true,
                pinned: false,
            })
            .await
    });
    tokio::task::spawn_blocking(move || wait_for_file(&held_marker))
        .await
        .unwrap();
    // These read a row the held round changed: each waits for it.
    let parked: Vec<_> = parked_clients
        .into_iter()
        .map(|client| {
            tokio::spawn(async move {
                client
                    .conv_list(ConvListReq {
                        uid: HELD,
                        limit: 0,
                        cursor: None,
                    })
                    .await
            })
        })
        .collect();

    let page = answered(
        "sync",
        reader.sync(SyncReq {
            uid: OTHER,
            device: 1,
            generation: Some(generation),
            local_applied_seq: first.acked_sync_seq,
            limit: 0,
            batch_token: None,
            ..SyncReq::default()
        }),
    )
    .await
    .unwrap();
    assert!(page.events.is_empty() && !page.has_more);
    let pulled = answered(
        "pull",
        reader.pull(PullReq {
            uid: OTHER,
            per_conv_limit: 0,
            cursors: vec![PullCursor {
                conv: CONV,
                after_seq: 0,
            }],
        }),
    )
    .await
    .unwrap();
    assert!(pulled.convs[0].messages.len() >= 5);
    let history = answered(
        "history",
        reader.history(HistoryReq {
            uid: OTHER,
            conv: CONV,
            before_seq: None,
            limit: 0,
        }),
    )
    .await
    .unwrap();
    assert!(history.messages.len() >= 5);
    let convs = answered(
        "conv_list",
        reader.conv_list(ConvListReq {
            uid: OTHER,
            limit: 0,
            cursor: None,
        }),
    )
    .await
    .unwrap();
    assert_eq!(convs.convs.len(), 1);
    let devices = answered("devices", reader.devices(UserReq { uid: OTHER }))
        .await
        .unwrap();
    assert_eq!(devices.devices.len(), 2);
    let info = answered(
        "snapshot_info",
        reader.snapshot_info(SnapshotRef {
            uid: OTHER,
            snapshot_id: snapshot.snapshot_id,
        }),
    )
    .await
    .unwrap();
    assert!(info.pages >= 1);
    let snapshot_page = answered(
        "snapshot_page",
        reader.snapshot_page(SnapshotPageReq {
            uid: OTHER,
            snapshot_id: snapshot.snapshot_id,
            page: 0,
        }),
    )
    .await
    .unwrap();
    assert_eq!(snapshot_page.snapshot_id, snapshot.snapshot_id);
    let stats = answered("stats", reader_admin.stats(Empty {}))
        .await
        .unwrap();
    assert_eq!(stats.users, 3);

    // The held round cannot have settled: its writer and the reads parked
    // behind it are still waiting.
    assert!(!held_write.is_finished(), "the held write was answered");
    assert!(
        parked.iter().all(|p| !p.is_finished()),
        "a read of the held user's conversations was answered before its round was durable"
    );

    std::fs::remove_file(&marker).unwrap();
    answered("the held write", held_write)
        .await
        .unwrap()
        .expect("the held write succeeds once its fsync goes through");
    for read in parked {
        let page = answered("a parked read", read).await.unwrap().unwrap();
        assert_eq!(page.convs.len(), 1);
        assert!(
            page.convs[0].muted,
            "the read sees the change it waited for"
        );
    }
    daemon.stop();
}
