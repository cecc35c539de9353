//! The metrics port: OpenMetrics text from `prometheus-client` over HTTP,
//! `/healthz` and `/readyz`, and scrapes that do not walk the store.

use inbox_tests::Daemon;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 GET; returns the status line and the body.
async fn get(daemon: &Daemon, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(daemon.metrics_addr)
        .await
        .expect("metrics port");
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    let (head, body) = text.split_once("\r\n\r\n").expect("a full response");
    let status = head.lines().next().unwrap_or_default().to_string();
    (status, body.to_string())
}

#[tokio::test]
async fn health_readiness_and_not_found() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    assert!(get(&daemon, "/healthz").await.0.contains("200"));
    let (status, body) = get(&daemon, "/readyz").await;
    assert!(status.contains("200"), "{status}");
    assert_eq!(body, "ready\n");
    assert!(get(&daemon, "/nothing").await.0.contains("404"));
}

#[tokio::test]
async fn engine_figures_and_the_memory_breakdown_are_exported_from_the_first_scrape() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let (status, text) = get(&daemon, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    for line in [
        "# TYPE inboxd_users gauge",
        "# TYPE inboxd_write_batches counter",
        "inboxd_write_batches_total ",
        "inboxd_fsync_seconds_count ",
        "inboxd_memory_age_seconds ",
        "inboxd_memory_bytes{",
        "inboxd_connections_open 0",
        "# EOF",
    ] {
        assert!(text.contains(line), "{line:?} missing from {text}");
    }
}

async fn users_1_and_2_join_conversation_7(client: &inbox_server::client::Client) {
    for uid in [1, 2] {
        client
            .join(inbox_wire::ConvMember { conv: 7, uid })
            .await
            .expect("join");
    }
}

/// A scrape answers with the engine's counts as they are, not as some
/// refresh last saw them: every send acknowledged before the scrape is
/// counted in it.
#[tokio::test]
async fn engine_figures_count_every_send_acknowledged_before_the_scrape() {
    const SENDS: u64 = 25;
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    users_1_and_2_join_conversation_7(&client).await;
    // The joins are counted at once too (each leaves a system message).
    let before = daemon.scrape().await;
    assert_eq!(inbox_tests::metric(&before, "inboxd_users"), Some(2));
    assert_eq!(
        inbox_tests::metric(&before, "inboxd_conversations"),
        Some(1)
    );
    let messages = inbox_tests::metric(&before, "inboxd_messages").expect("messages");
    let batches = inbox_tests::metric(&before, "inboxd_write_batches_total").expect("batches");
    for i in 0..SENDS {
        inbox_tests::send_text(&client, 7, 1, &format!("m{i}")).await;
    }
    let after = daemon.scrape().await;
    assert_eq!(
        inbox_tests::metric(&after, "inboxd_messages"),
        Some(messages + SENDS)
    );
    let rounds = inbox_tests::metric(&after, "inboxd_write_batches_total").expect("batches");
    assert!(
        rounds - batches >= SENDS,
        "{SENDS} sends one at a time took {} rounds",
        rounds - batches
    );
}

/// A connection alone has its sends committed on its worker
/// (`inboxd_sends_on_worker`) once no other has made a request for 20 ms;
/// two connections taking turns never do, nor one alone with
/// `--send-inline-when-alone false`.
#[tokio::test]
async fn a_lone_connections_sends_run_on_its_worker_unless_another_interleaves_or_turned_off() {
    const SENT: &str = "inboxd_sends_on_worker_total";
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    users_1_and_2_join_conversation_7(&client).await;
    for i in 0..200 {
        inbox_tests::send_text(&client, 7, 1, &format!("alone {i}")).await;
    }
    let alone = daemon.metric(SENT).await.expect("the counter is exposed");
    // Only the sends of the first 20 ms went to the sequencer.
    assert!(alone >= 100, "{alone} of 200 lone sends ran on the worker");

    let other = daemon.client().await;
    for i in 0..100 {
        inbox_tests::send_text(&other, 7, 2, &format!("turns {i}")).await;
        inbox_tests::send_text(&client, 7, 1, &format!("turns {i}")).await;
    }
    assert_eq!(
        daemon.metric(SENT).await,
        Some(alone),
        "a send of two connections taking turns ran on the worker"
    );
    drop(daemon);

    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), &["--send-inline-when-alone", "false"]);
    let client = daemon.client().await;
    users_1_and_2_join_conversation_7(&client).await;
    for i in 0..200 {
        inbox_tests::send_text(&client, 7, 1, &format!("off {i}")).await;
    }
    assert_eq!(daemon.metric(SENT).await, Some(0), "turned off");
}

/// Sends one at a time, each after the last was answered, until the
/// gauge reads `want` or `sends` have gone; returns what it read last.
async fn sends_one_by_one_until(daemon: &Daemon, sends: u32, want: u64) -> Option<u64> {
    let client = daemon.client().await;
    users_1_and_2_join_conversation_7(&client).await;
    let mut seen = None;
    for i in 0..sends {
        inbox_tests::send_text(&client, 7, 1, &format!("m{i}")).await;
        // Paced, so the daemon stays light whatever else the machine runs.
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        if i % 100 == 99 {
            seen = daemon.metric("inboxd_pipeline_on_one_cpu").await;
            if seen == Some(want) {
                break;
            }
        }
    }
    seen
}

/// One connection sending one message at a time is the light load the
/// daemon gathers its connection worker and its sequencer on one CPU
/// for; with `--colocate-when-light false` it never does. (Its sends go
/// through the sequencer: a connection alone would have them committed on
/// its worker, which leaves the sequencer no rounds to count.)
#[tokio::test]
async fn one_send_at_a_time_gathers_the_write_pipeline_on_one_cpu_unless_turned_off() {
    if inbox_engine::placement::cpus_of(0) < 2 {
        return; // One CPU: nothing to gather.
    }
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), &["--send-inline-when-alone", "false"]);
    assert_eq!(
        daemon.metric("inboxd_pipeline_on_one_cpu").await,
        Some(0),
        "spread at the start"
    );
    assert_eq!(
        sends_one_by_one_until(&daemon, 20_000, 1).await,
        Some(1),
        "20,000 sends one at a time never gathered the pipeline"
    );
    drop(daemon);

    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(
        data.path(),
        &[
            "--colocate-when-light",
            "false",
            "--send-inline-when-alone",
            "false",
        ],
    );
    // 1,000 sends at about one a millisecond span ten of the sequencer's
    // windows at the least.
    assert_eq!(
        sends_one_by_one_until(&daemon, 1_000, 1).await,
        Some(0),
        "turned off, the pipeline stays spread"
    );
}
