//! What a scrape of the metrics port costs on a store with many users and
//! devices: 2,000 users register a device each on a daemon (`--sync
//! none`), then `/metrics` is fetched 200 times, one connection each; the
//! time per scrape (connect included) and its size are printed. Scrapes
//! read counters and gauges the engine keeps, never walk the store, so the
//! figure should not grow with the users (`docs/OPERATIONS.md`).
//!
//! ```text
//! cargo build --release -p inbox-server --bins
//! cargo run --release -p inbox-tests --example scrape_cost
//! ```
//!
//! `INBOXD_BINARY=<path>` runs another build of the daemon.

use std::sync::Arc;
use std::time::Instant;

use inbox_tests::Daemon;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const USERS: u64 = 2_000;
const SCRAPES: u32 = 200;

/// One HTTP/1.1 GET of `path` on the metrics port; returns the body.
async fn get(daemon: &Daemon, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(daemon.metrics_addr)
        .await
        .expect("metrics port");
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    let (_, body) = text.split_once("\r\n\r\n").expect("a full response");
    body.to_string()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), &["--sync", "none"]);
    let client = Arc::new(daemon.client().await);
    let mut tasks = tokio::task::JoinSet::new();
    for uid in 1..=USERS {
        let client = Arc::clone(&client);
        tasks.spawn(async move { inbox_tests::register(&client, uid, 1).await });
    }
    while tasks.join_next().await.is_some() {}
    let started = Instant::now();
    let mut bytes = 0;
    for _ in 0..SCRAPES {
        bytes += get(&daemon, "/metrics").await.len();
    }
    let per_scrape = started.elapsed() / SCRAPES;
    println!(
        "scrape: {USERS} users, {SCRAPES} scrapes, {per_scrape:?} each (connect included), {} bytes each",
        bytes / SCRAPES as usize
    );
}
