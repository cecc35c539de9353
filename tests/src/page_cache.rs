//! What the page-cache tests share: a daemon with 64 KiB segments, a
//! history of old events it wrote itself, and where the reads of its first
//! page ran (`inboxd_reads_in_place_total`, `inboxd_reads_pooled_total`).

use inbox_server::client::Client;
use inbox_wire::{ConvMember, SyncPage};

use crate::{first_sync_page, register, send_text, Daemon};

/// Segments small enough that a history of [`MESSAGES`] spans several.
pub const SEGMENT_BYTES: &str = "65536";
pub const SENDER: u64 = 1;
pub const DEVICE: u64 = 1;
/// About 300 KiB of records: four or more segments.
pub const MESSAGES: usize = 1500;

/// The conversation of `reader`'s history.
pub fn conv_of(reader: u64) -> u64 {
    100 + reader
}

/// Writes [`MESSAGES`] from [`SENDER`] to `reader`'s conversation and
/// returns the generation of its [`DEVICE`].
pub async fn write_history(client: &Client, reader: u64) -> u64 {
    let conv = conv_of(reader);
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
    generation
}

/// The first 20 events of `reader`'s device, and the read attempts they
/// cost: (in place, on the pool).
pub async fn first_page_attempts(
    daemon: &Daemon,
    client: &Client,
    reader: u64,
    generation: u64,
) -> (SyncPage, (u64, u64)) {
    let before = daemon.read_attempts().await;
    let page = first_sync_page(client, reader, DEVICE, generation, 20).await;
    assert_eq!(page.events.len(), 20);
    let after = daemon.read_attempts().await;
    (page, (after.0 - before.0, after.1 - before.1))
}

/// Writes histories for readers 11, 12, … until one's first page is read
/// in place, and returns that reader and its generation. The daemon's
/// first look at the page cache may come after the first writes, which
/// then count as uncached; on an unloaded machine the first try does.
pub async fn old_page_served_in_place(daemon: &Daemon, client: &Client) -> (u64, u64) {
    for reader in 11..16 {
        let generation = write_history(client, reader).await;
        let (_, attempts) = first_page_attempts(daemon, client, reader, generation).await;
        assert!(
            attempts == (1, 0) || attempts == (0, 1),
            "one sync page, one read: {attempts:?}"
        );
        if attempts == (1, 0) {
            return (reader, generation);
        }
    }
    panic!("no old page the daemon wrote was read in place in 5 tries")
}
