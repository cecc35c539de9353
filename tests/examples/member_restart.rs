//! What a member's restart costs: a group of three `inboxd` processes
//! (release build) takes `MESSAGES` sends (default 1,000,000) from 64
//! writers, in conversations of 8 members, then one follower is killed
//! (SIGKILL) while the writers go on, and started again on its data.
//! Printed:
//!
//! - the time from the restart's spawn to the member's first `PING`
//!   answer, against a single `inboxd` (no group flags) opening a copy of
//!   the same data directory, made while the member was down;
//! - the time from that answer until the member has applied the index the
//!   leader had committed then, with the writers still sending.
//!
//! ```text
//! cargo build --release -p inbox-server --bins
//! cargo run --release -p inbox-tests --example member_restart
//! ```
//!
//! `INBOXD_BINARY=<path>` runs another build of the daemon (to compare
//! two); `MESSAGES=<n>` sets the load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_server::client::{Client, GroupClient};
use inbox_tests::group::{changing_hands, until_served, Group};
use inbox_tests::{Daemon, ADMIN_TOKEN};
use inbox_wire::{ConvMember, Empty, Request, SendReq};

const WRITERS: u64 = 64;
const CONVS: u64 = 1_000;
const DEADLINE: Duration = Duration::from_secs(600);

/// Copies a directory tree (regular files and folders).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// The time from `start` until the daemon at `addr` answers PING.
async fn until_ping(addr: std::net::SocketAddr, start: Instant) -> Duration {
    loop {
        if let Ok(c) = Client::connect(addr, ADMIN_TOKEN).await {
            if c.ping(Empty {}).await.is_ok() {
                return start.elapsed();
            }
        }
        assert!(start.elapsed() < DEADLINE, "no PING answer");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let messages: u64 = std::env::var("MESSAGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let mut group = Group::start(3);
    let leader = group.leader().await;
    let everyone = Arc::new(
        GroupClient::connect_members(&group.client_addrs, ADMIN_TOKEN, None)
            .await
            .expect("a member accepts"),
    );
    for conv in 0..CONVS {
        for m in 0..8 {
            let join = Request::Join(ConvMember {
                uid: conv * 8 + m,
                conv,
            });
            until_served(&everyone, join, DEADLINE, changing_hands).await;
        }
    }
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (everyone, sent, stop) = (Arc::clone(&everyone), Arc::clone(&sent), Arc::clone(&stop));
        writers.push(tokio::spawn(async move {
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                let conv = i % CONVS;
                let send = Request::Send(SendReq {
                    conv,
                    sender: conv * 8 + i % 8,
                    client_msg_id: u128::from(i) + 1,
                    msg_type: 1,
                    payload: Bytes::from(format!("message {i} of the restart run")),
                });
                until_served(&everyone, send, DEADLINE, changing_hands).await;
                sent.fetch_add(1, Ordering::Relaxed);
                i += WRITERS;
            }
        }));
    }
    let started = Instant::now();
    while sent.load(Ordering::Relaxed) < messages {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "{} sends in {:.1} s",
        sent.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );

    let follower = (1..=3).find(|n| *n != leader).expect("a follower");
    group.kill(follower);
    let copy = tempfile::tempdir().expect("a directory for the copy");
    copy_dir(group.dir(follower), copy.path());
    // The single node's open of the same data, on a copy (its raft files
    // are ignored without group flags).
    let single_start = Instant::now();
    let single = Daemon::start_with(copy.path(), &[]);
    let single_open = until_ping(single.addr, single_start).await;
    drop(single);

    tokio::time::sleep(Duration::from_secs(2)).await;
    let restart = Instant::now();
    group.restart(follower);
    let addr = group.client_addrs[(follower - 1) as usize];
    let to_ping = until_ping(addr, restart).await;
    let target = {
        let all = group.statuses().await;
        let (_, s) = all.iter().find(|(n, _)| *n == leader).expect("the leader");
        s.last_applied_index
    };
    let caught_up = loop {
        let all = group.statuses().await;
        let (_, s) = all
            .iter()
            .find(|(n, _)| *n == follower)
            .expect("the member");
        if s.last_applied_index >= target {
            break restart.elapsed() - to_ping;
        }
        assert!(restart.elapsed() < DEADLINE, "the member never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    println!(
        "single node open of the same data: {:.3} s; member restart to PING: {:.3} s ({:.2}x); \
         then caught up to the leader's commit in {:.3} s under load",
        single_open.as_secs_f64(),
        to_ping.as_secs_f64(),
        to_ping.as_secs_f64() / single_open.as_secs_f64(),
        caught_up.as_secs_f64()
    );
}
