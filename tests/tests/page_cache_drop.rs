//! A reclaim the daemon sees sends old reads back to the read pool. The
//! test drops the machine's page cache (`/proc/sys/vm/drop_caches`, which
//! needs root: without it the test says it skipped, and under CI,
//! `CI=true`, it fails instead) after the daemon
//! has served a page of old history in place: the daemon's next look
//! counts the drop (`inboxd_page_cache_reclaims_seen_total`), and the same
//! page is then read on the pool, since its records may have to come from
//! the disk. In a file of its own: no other test of this binary runs
//! while the cache is dropped.

use std::time::Duration;

use inbox_tests::page_cache::{first_page_attempts, old_page_served_in_place, SEGMENT_BYTES};
use inbox_tests::Daemon;

#[tokio::test]
async fn a_page_cache_drop_the_daemon_sees_sends_old_pages_to_the_pool() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), &["--segment-bytes", SEGMENT_BYTES]);
    let client = daemon.client().await;
    let (reader, generation) = old_page_served_in_place(&daemon, &client).await;

    let seen = daemon
        .metric("inboxd_page_cache_reclaims_seen_total")
        .await
        .expect("the counter is exported");
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", "1") {
        let why = format!("cannot drop the page cache ({e}): this check needs root");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{why}; under CI it must run"
        );
        eprintln!("skipped: {why}");
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
        first_page_attempts(&daemon, &client, reader, generation)
            .await
            .1,
        (0, 1),
        "written before the drop: read on the pool"
    );
}
