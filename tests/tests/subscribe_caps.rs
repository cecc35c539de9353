//! SUBSCRIBE cannot inflate the daemon's memory: one connection holds at
//! most `subscribe_uids_max` uids (TOO_LARGE past it), all connections
//! together at most `subscriptions_max` (RATE_LIMITED past it), a refused
//! SUBSCRIBE adds nothing, and a connection's subscriptions go back to the
//! budget when it unsubscribes or closes.

use std::time::{Duration, Instant};

use inbox_server::client::Client;
use inbox_tests::{Daemon, TOKEN};
use inbox_wire::{ErrorCode, UidList};

fn uids(from: u64, count: u64) -> UidList {
    UidList {
        uids: (from..from + count).collect(),
    }
}

/// The `inboxd_subscriptions` gauge.
async fn subscriptions(daemon: &Daemon) -> u64 {
    let text = daemon.scrape().await;
    inbox_tests::metric(&text, "inboxd_subscriptions")
        .unwrap_or_else(|| panic!("no inboxd_subscriptions in {text}"))
}

#[tokio::test]
async fn subscriptions_are_capped_per_connection_and_in_total() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(
        data.path(),
        &[
            "--subscribe-uids-max",
            "1000",
            "--subscriptions-max",
            "2500",
        ],
    );
    let a = Client::connect(daemon.addr, TOKEN).await.unwrap();
    let b = Client::connect(daemon.addr, TOKEN).await.unwrap();
    let c = Client::connect(daemon.addr, TOKEN).await.unwrap();

    a.subscribe(uids(0, 600)).await.expect("under the cap");
    // Already-held uids and duplicates in the frame count once.
    let mut again = uids(0, 600);
    again.uids.extend(600..1000);
    again.uids.extend(600..1000);
    a.subscribe(again).await.expect("exactly at the cap");
    let err = a
        .subscribe(uids(5000, 1))
        .await
        .expect_err("one past the cap");
    assert_eq!(err.code(), Some(ErrorCode::TooLarge), "{err}");
    if let inbox_server::client::ClientError::Server { detail, .. } = err {
        assert_eq!(detail, 1000, "detail is the per-connection cap");
    }

    b.subscribe(uids(10_000, 1000))
        .await
        .expect("second connection");
    // 2,000 held; 501 more would pass the total of 2,500: nothing is added.
    let err = c
        .subscribe(uids(20_000, 501))
        .await
        .expect_err("over the total");
    assert_eq!(err.code(), Some(ErrorCode::RateLimited), "{err}");
    assert_eq!(subscriptions(&daemon).await, 2000, "a refusal adds nothing");
    c.subscribe(uids(20_000, 500))
        .await
        .expect("up to the total");

    // Unsubscribing and closing give the budget back.
    a.unsubscribe(uids(0, 400)).await.unwrap();
    assert_eq!(subscriptions(&daemon).await, 2100);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(10);
    while subscriptions(&daemon).await != 1100 {
        assert!(
            Instant::now() < deadline,
            "closed connection kept its subscriptions"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 1,100 held: c may take its last 500, and a fresh connection 900.
    c.subscribe(uids(30_000, 500)).await.expect("room again");
    let d = Client::connect(daemon.addr, TOKEN).await.unwrap();
    d.subscribe(uids(40_000, 900))
        .await
        .expect("room for a new connection");
    assert_eq!(subscriptions(&daemon).await, 2500);
}

/// Peak resident set (VmHWM) of a process, in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmHWM")
}

/// Sixteen connections send SUBSCRIBE frames of fresh uids as fast as they
/// can: frames of 50,000 uids, which fill the per-connection cap after two
/// and the total after twenty, and every fourth frame as large as the frame
/// limit allows (131,000 uids). Without caps this grows by megabytes per
/// frame; with the defaults (100,000 per connection, 1,000,000 in total)
/// the daemon's peak RSS stays within a fixed budget, and the abuse is
/// answered, not absorbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_abuse_leaves_memory_bounded() {
    const CONNECTIONS: u64 = 16;
    const UIDS_PER_FRAME: u64 = 50_000;
    const UIDS_PER_LARGEST_FRAME: u64 = 131_000;
    const ABUSE: Duration = Duration::from_secs(4);
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let baseline_kib = peak_rss_kib(daemon.pid());

    let mut tasks = tokio::task::JoinSet::new();
    for conn in 0..CONNECTIONS {
        let addr = daemon.addr;
        tasks.spawn(async move {
            let client = Client::connect(addr, TOKEN).await.expect("connect");
            let (mut accepted, mut refused) = (0u64, 0u64);
            let started = Instant::now();
            let mut next = conn << 40;
            let mut frames = 0u64;
            while started.elapsed() < ABUSE {
                frames += 1;
                let count = if frames % 4 == 0 {
                    UIDS_PER_LARGEST_FRAME
                } else {
                    UIDS_PER_FRAME
                };
                match client.subscribe(uids(next, count)).await {
                    Ok(_) => accepted += 1,
                    Err(e)
                        if matches!(
                            e.code(),
                            Some(ErrorCode::TooLarge | ErrorCode::RateLimited)
                        ) =>
                    {
                        refused += 1;
                    }
                    Err(e) => panic!("unexpected error: {e}"),
                }
                next += count;
            }
            (client, accepted, refused)
        });
    }
    let mut clients = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let (client, a, r) = done.expect("abuser");
        accepted += a;
        refused += r;
        clients.push(client);
    }
    let held = subscriptions(&daemon).await;
    let peak_kib = peak_rss_kib(daemon.pid());
    let growth_mib = peak_kib.saturating_sub(baseline_kib) / 1024;
    eprintln!(
        "subscribe abuse: {CONNECTIONS} connections, {} frames ({accepted} accepted, {refused} refused), \
         {held} subscriptions held, peak RSS {} MiB (baseline {} MiB, growth {growth_mib} MiB)",
        accepted + refused,
        peak_kib / 1024,
        baseline_kib / 1024,
    );
    assert!(refused > 0, "the caps were never reached");
    assert_eq!(held, 1_000_000, "the total cap was reached and held");
    // Budget: the subscription sets (about 40 bytes per uid at worst) plus
    // the frames in flight (16 × 1 MiB read buffers and decoded lists) and
    // allocator slack.
    assert!(
        growth_mib < 256,
        "peak RSS grew by {growth_mib} MiB under subscribe abuse"
    );
    drop(clients);
}
