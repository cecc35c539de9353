//! Regression: a `DEVICES` written after a `SYNC` on the same connection
//! could show the `last_seen_ms` from before that `SYNC`. A sync that
//! changes nothing else logs its `last_seen` refresh on its own, after its
//! page is answered, and the device list was read before the refresh had
//! reached the state (1 to 2 trials in 6). Requests of one connection take
//! effect in arrival order, so the list now waits for the refreshes its
//! user's earlier syncs queued.

use std::time::Duration;

use inbox_tests::{register, Daemon};
use inbox_wire::{SyncReq, UserReq};

#[tokio::test]
async fn devices_after_a_sync_shows_the_last_seen_that_sync_moved() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    for trial in 0..8u64 {
        let uid = 100 + trial;
        let generation = register(&client, uid, 1).await;
        let registered = client.devices(UserReq { uid }).await.unwrap().devices[0].last_seen_ms;
        // A sync refreshes `last_seen` at most once a second.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let sync = client.sync(SyncReq {
            uid,
            device: 1,
            generation: Some(generation),
            ..SyncReq::default()
        });
        let devices = client.devices(UserReq { uid });
        // Both are written before either reply is read (pipelined).
        let (page, list) = tokio::join!(sync, devices);
        page.expect("sync");
        let seen = list.expect("devices").devices[0].last_seen_ms;
        assert!(
            seen >= registered + 1_000,
            "trial {trial}: DEVICES shows last_seen_ms {seen}, the registration's {registered}: \
             the SYNC before it is not seen"
        );
    }
}
