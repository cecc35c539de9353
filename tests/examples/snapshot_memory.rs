//! What a snapshot costs the memory of the member that sends it and of the
//! one that installs it: a group of three `inboxd` processes (release
//! build) with a snapshot every 200 rounds is filled with about 96 MB of
//! incompressible messages while one follower is down and its data
//! directory wiped; once the leader has purged what that follower lacks,
//! the follower starts again and catches up by installing the leader's
//! snapshot. The anonymous resident memory (`RssAnon`) of the leader is
//! sampled every 20 ms through the sends, and of both through the
//! catch-up; the peaks and the leader's value before the catch-up are
//! printed with the image's size.
//!
//! ```text
//! cargo build --release -p inbox-server --bins
//! cargo run --release -p inbox-tests --example snapshot_memory
//! ```
//!
//! `INBOXD_BINARY=<path>` runs another build of the daemon (to compare two).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_server::client::GroupClient;
use inbox_tests::group::{changing_hands, until_served, Group};
use inbox_tests::ADMIN_TOKEN;
use inbox_wire::{ConvMember, Request, SendReq};

const MESSAGES: u64 = 6_000;
const PAYLOAD: usize = 16 << 10;
const DEADLINE: Duration = Duration::from_secs(300);

/// 0 once the process is gone.
fn rss_anon_kib(pid: i32) -> u64 {
    inbox_tests::proc_status_bytes(pid, "RssAnon:").unwrap_or(0) / 1024
}

/// Pseudo-random bytes (xorshift), which zstd cannot shrink.
fn payload(i: u64) -> Bytes {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(PAYLOAD);
    while out.len() < PAYLOAD {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    Bytes::from(out)
}

async fn send_range(group: &GroupClient, range: std::ops::Range<u64>) {
    for i in range {
        let request = Request::Send(SendReq {
            conv: 7,
            sender: 1 + i % 2,
            client_msg_id: 1_000_000 + u128::from(i),
            msg_type: 1,
            payload: payload(i),
        });
        until_served(group, request, DEADLINE, changing_hands).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut members = Group::start_with(3, &["--snapshot-every", "200"]);
    let leader = members.leader().await;
    let group = GroupClient::connect(
        members.client_addrs[(leader - 1) as usize],
        ADMIN_TOKEN,
        None,
    )
    .await
    .expect("connect");
    for uid in 1..=2 {
        let join = Request::Join(ConvMember { uid, conv: 7 });
        until_served(&group, join, DEADLINE, changing_hands).await;
    }
    let wiped = (1..=3).find(|n| *n != leader).expect("a follower");
    members.kill(wiped);
    for name in ["evt", "msg", "checkpoint", "snap"] {
        let _ = std::fs::remove_dir_all(members.dir(wiped).join(name));
    }
    for name in ["raft-meta.json", "raft-snapshot.img"] {
        let _ = std::fs::remove_file(members.dir(wiped).join(name));
    }
    let leader_pid = members.daemon(leader).pid();
    let ingest_stop = Arc::new(AtomicBool::new(false));
    let ingest_sampler = {
        let stop = Arc::clone(&ingest_stop);
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(rss_anon_kib(leader_pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let started = Instant::now();
    send_range(&group, 0..MESSAGES).await;
    ingest_stop.store(true, Ordering::Relaxed);
    let leader_ingest_peak = ingest_sampler.join().expect("sampler");
    println!(
        "{MESSAGES} sends of {PAYLOAD} bytes in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    members
        .daemon(leader)
        .wait_metric_above("inboxd_raft_purged_index", 0, DEADLINE)
        .await;
    let image =
        std::fs::metadata(members.dir(leader).join("raft-snapshot.img")).map_or(0, |m| m.len());
    let leader_before = rss_anon_kib(leader_pid);

    members.restart(wiped);
    let wiped_pid = members.daemon(wiped).pid();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let (mut leader_peak, mut wiped_peak) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                leader_peak = leader_peak.max(rss_anon_kib(leader_pid));
                wiped_peak = wiped_peak.max(rss_anon_kib(wiped_pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            (leader_peak, wiped_peak)
        })
    };
    let catch_up = Instant::now();
    members
        .daemon(wiped)
        .wait_metric_above("inboxd_raft_snapshots_installed_total", 0, DEADLINE)
        .await;
    let installed_after = catch_up.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (leader_peak, wiped_peak) = sampler.join().expect("sampler");
    let wiped_after = rss_anon_kib(wiped_pid);
    println!("image: {:.1} MB", image as f64 / 1e6);
    println!(
        "install done {:.1} s after the restart",
        installed_after.as_secs_f64()
    );
    println!(
        "leader (sends the snapshot): RssAnon peak {:.1} MiB during the sends, {:.1} MiB before the catch-up, peak {:.1} MiB during it",
        leader_ingest_peak as f64 / 1024.0,
        leader_before as f64 / 1024.0,
        leader_peak as f64 / 1024.0
    );
    println!(
        "wiped member (installs it): RssAnon peak {:.1} MiB during the catch-up, {:.1} MiB after",
        wiped_peak as f64 / 1024.0,
        wiped_after as f64 / 1024.0
    );
    drop(group);
    for d in members.daemons.iter_mut().filter_map(Option::take) {
        d.crash();
    }
}
