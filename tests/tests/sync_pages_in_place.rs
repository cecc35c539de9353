//! Where the daemon builds a sync page of old history. It reads the
//! kernel's page-cache counters every 100 ms, so a page whose records it
//! wrote itself since the last reclaim is built on the connection's worker
//! even when those records lie segments behind the active one; after a
//! restart, the same page goes to the read pool, since nothing found on
//! disk at open counts as cached. A pull of the same old messages is
//! answered in place too, and after the restart its first attempt finds
//! them uncached and the pool answers. `inboxd_reads_in_place_total` and
//! `inboxd_reads_pooled_total` count where each attempt ran.

use inbox_server::client::Client;
use inbox_tests::page_cache::{
    conv_of, first_page_attempts, old_page_served_in_place, SEGMENT_BYTES,
};
use inbox_tests::Daemon;
use inbox_wire::*;

/// The reader's first 20 messages of its conversation, and where the
/// attempts to read them ran: (in place, on the pool).
async fn pull_oldest(daemon: &Daemon, client: &Client, reader: u64) -> (ConvPull, (u64, u64)) {
    let before = daemon.read_attempts().await;
    let mut reply = client
        .pull(PullReq {
            uid: reader,
            per_conv_limit: 20,
            cursors: vec![PullCursor {
                conv: conv_of(reader),
                after_seq: 0,
            }],
        })
        .await
        .expect("pull");
    let after = daemon.read_attempts().await;
    let conv = reply.convs.pop().expect("one conversation");
    assert_eq!(conv.messages.len(), 20);
    (conv, (after.0 - before.0, after.1 - before.1))
}

#[tokio::test]
async fn old_history_the_daemon_wrote_is_synced_in_place_and_after_a_restart_on_the_pool() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), &["--segment-bytes", SEGMENT_BYTES]);
    let client = daemon.client().await;
    let (reader, generation) = old_page_served_in_place(&daemon, &client).await;
    let segments = std::fs::read_dir(data.path().join("evt"))
        .expect("the evt log's directory")
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".seg")
        })
        .count();
    assert!(
        segments >= 5,
        "{segments} evt segments: the page is not old"
    );
    let (before_restart, _) = first_page_attempts(&daemon, &client, reader, generation).await;
    // In place unless the daemon's last look is stale (a loaded machine
    // may hold its 100 ms tick back): a few tries.
    let mut pulled = None;
    for _ in 0..5 {
        let (conv, attempts) = pull_oldest(&daemon, &client, reader).await;
        if attempts == (1, 0) {
            pulled = Some(conv);
            break;
        }
        assert_eq!(attempts, (1, 1), "in place, or in place then the pool");
    }
    let pulled = pulled.expect("a pull of messages the daemon wrote was answered in place");
    drop(client);
    daemon.stop();

    let daemon = Daemon::start_with(data.path(), &["--segment-bytes", SEGMENT_BYTES]);
    let client = daemon.client().await;
    let (page, attempts) = first_page_attempts(&daemon, &client, reader, generation).await;
    assert_eq!(
        attempts,
        (0, 1),
        "history found on disk at start is read on the pool"
    );
    assert_eq!(page.events, before_restart.events);
    let (pulled_again, attempts) = pull_oldest(&daemon, &client, reader).await;
    assert_eq!(
        attempts,
        (1, 1),
        "found on disk at start: tried in place, then read on the pool"
    );
    assert_eq!(pulled_again, pulled);
}
