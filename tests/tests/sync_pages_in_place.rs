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
use inbox_tests::{first_sync_page, register, send_text, Daemon};
use inbox_wire::*;

const SENDER: u64 = 1;
const DEVICE: u64 = 1;
/// About 300 KiB of records: four or more 64 KiB segments.
const MESSAGES: usize = 1500;
const SEGMENT_BYTES: &str = "65536";

/// The first page of `reader`'s events: its join, then the oldest messages.
async fn first_page(client: &Client, reader: u64, generation: u64) -> SyncPage {
    first_sync_page(client, reader, DEVICE, generation, 20).await
}

/// The reader's first 20 messages of its conversation, and where the
/// attempts to read them ran: (in place, on the pool).
async fn pull_oldest(daemon: &Daemon, client: &Client, reader: u64) -> (ConvPull, (u64, u64)) {
    let before = daemon.read_attempts().await;
    let mut reply = client
        .pull(PullReq {
            uid: reader,
            per_conv_limit: 20,
            cursors: vec![PullCursor {
                conv: 100 + reader,
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

/// Writes a history for a new reader in a new conversation, then asks for
/// its first page: the device's generation, and whether that page was
/// built in place.
async fn old_page_in_place(daemon: &Daemon, client: &Client, reader: u64) -> (u64, bool) {
    let conv = 100 + reader;
    for uid in [SENDER, reader] {
        client.join(ConvMember { conv, uid }).await.unwrap();
    }
    let generation = register(client, reader, DEVICE).await;
    for n in 0..MESSAGES {
        send_text(
            client,
            conv,
            SENDER,
            &format!("message {n} {}", "x".repeat(100)),
        )
        .await;
    }
    let before = daemon.read_attempts().await;
    let page = first_page(client, reader, generation).await;
    assert_eq!(page.events.len(), 20);
    let after = daemon.read_attempts().await;
    assert_eq!(
        (after.0 - before.0) + (after.1 - before.1),
        1,
        "one sync page, one read: {before:?} -> {after:?}"
    );
    (generation, after.0 > before.0)
}

#[tokio::test]
async fn old_history_the_daemon_wrote_is_synced_in_place_and_after_a_restart_on_the_pool() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), &["--segment-bytes", SEGMENT_BYTES]);
    let client = daemon.client().await;
    // The daemon's first look at the counters may come after the first
    // writes, which then count as not cached: a fresh history is written
    // until one is seen in place (on an unloaded machine, the first).
    let mut reader = 10;
    let mut generation = 0;
    let mut in_place = false;
    while !in_place && reader < 15 {
        reader += 1;
        (generation, in_place) = old_page_in_place(&daemon, &client, reader).await;
    }
    assert!(
        in_place,
        "no old page the daemon wrote was built in place in {} tries",
        reader - 10
    );
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
    let before_restart = first_page(&client, reader, generation).await;
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
    let before = daemon.read_attempts().await;
    let page = first_page(&client, reader, generation).await;
    let after = daemon.read_attempts().await;
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
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
