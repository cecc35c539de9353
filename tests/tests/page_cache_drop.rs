//! A reclaim the daemon sees sends old reads back to the read pool. The
//! test drops the machine's page cache (`/proc/sys/vm/drop_caches`, which
//! needs root; elsewhere it says so and checks nothing) after the daemon
//! has served a page of old history in place: the daemon's next look
//! counts the drop (`inboxd_page_cache_reclaims_seen_total`), and the same
//! page is then read on the pool, since its records may have to come from
//! the disk. In a file of its own: no other test of this binary runs
//! while the cache is dropped.

use std::time::Duration;

use inbox_server::client::Client;
use inbox_tests::{first_sync_page, register, send_text, Daemon};
use inbox_wire::*;

const SENDER: u64 = 1;
const DEVICE: u64 = 1;
const MESSAGES: usize = 1500;

/// Where the reader's first page was built: (in place, on the pool).
async fn first_page_reads(
    daemon: &Daemon,
    client: &Client,
    reader: u64,
    generation: u64,
) -> (u64, u64) {
    let before = daemon.read_attempts().await;
    let page = first_sync_page(client, reader, DEVICE, generation, 20).await;
    assert_eq!(page.events.len(), 20);
    let after = daemon.read_attempts().await;
    (after.0 - before.0, after.1 - before.1)
}

#[tokio::test]
async fn a_page_cache_drop_the_daemon_sees_sends_old_pages_to_the_pool() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), &["--segment-bytes", "65536"]);
    let client = daemon.client().await;
    // History written after the daemon's first look (tries as in
    // `sync_pages_in_place`), then served in place.
    let mut served = None;
    for reader in 11..16 {
        let conv = 100 + reader;
        for uid in [SENDER, reader] {
            client.join(ConvMember { conv, uid }).await.unwrap();
        }
        let generation = register(&client, reader, DEVICE).await;
        for n in 0..MESSAGES {
            send_text(
                &client,
                conv,
                SENDER,
                &format!("message {n} {}", "x".repeat(100)),
            )
            .await;
        }
        if first_page_reads(&daemon, &client, reader, generation).await == (1, 0) {
            served = Some((reader, generation));
            break;
        }
    }
    let (reader, generation) = served.expect("an old page the daemon wrote was served in place");

    let seen = daemon
        .metric("inboxd_page_cache_reclaims_seen_total")
        .await
        .expect("the counter is exported");
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", "1") {
        eprintln!("cannot drop the page cache ({e}); this check needs root and is skipped");
        return;
    }
    daemon
        .wait_metric_above(
            "inboxd_page_cache_reclaims_seen_total",
            seen,
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(
        first_page_reads(&daemon, &client, reader, generation).await,
        (0, 1),
        "written before the drop: read on the pool"
    );
}
