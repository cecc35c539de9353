//! The offline tools keep off a live daemon's files, and the logs suit a
//! machine reader when stderr is not a terminal.

use std::process::{Command, Stdio};

use inbox_tests::{inboxd_binary, Daemon};

fn inboxd(args: &[&str]) -> std::process::Output {
    Command::new(inboxd_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run inboxd")
}

#[tokio::test]
async fn verify_refuses_a_live_daemon_and_runs_once_it_stopped() {
    let data = inbox_tests::data_dir();
    let dir = data.path().display().to_string();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    inbox_tests::register(&client, 1, 1).await;
    drop(client);

    let live = inboxd(&["verify", "--data-dir", &dir]);
    assert_eq!(live.status.code(), Some(2), "{live:?}");
    let stderr = String::from_utf8_lossy(&live.stderr);
    assert!(stderr.contains("in use by another process"), "{stderr}");
    assert!(stderr.contains("stop the daemon"), "{stderr}");

    // The offline writers refuse too: they open the store, which locks it.
    let compact = inboxd(&["compact", "--data-dir", &dir]);
    assert!(!compact.status.success(), "{compact:?}");

    assert!(daemon.stop().success());
    let stopped = inboxd(&["verify", "--data-dir", &dir]);
    assert!(stopped.status.success(), "{stopped:?}");
    assert!(String::from_utf8_lossy(&stopped.stdout).contains("verify: ok"));
}

#[test]
fn logs_have_no_colour_codes_off_a_terminal_and_json_is_one_object_per_line() {
    let data = inbox_tests::data_dir();
    let dir = data.path().display().to_string();
    // `checkpoint` on a fresh directory logs at info while it opens the store.
    let text = inboxd(&["checkpoint", "--data-dir", &dir]);
    assert!(text.status.success(), "{text:?}");
    let stderr = String::from_utf8_lossy(&text.stderr);
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escape in piped logs: {stderr:?}"
    );

    let json = inboxd(&["--log-format", "json", "checkpoint", "--data-dir", &dir]);
    assert!(json.status.success(), "{json:?}");
    let stderr = String::from_utf8_lossy(&json.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(!lines.is_empty(), "the store logs while it opens");
    for line in lines {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        assert!(value.get("level").is_some(), "{line}");
    }
}

#[tokio::test]
async fn dump_prints_records_and_where_a_damaged_segment_stops() {
    let data = inbox_tests::data_dir();
    let dir = data.path().display().to_string();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    client
        .join(inbox_wire::ConvMember { conv: 100, uid: 1 })
        .await
        .unwrap();
    inbox_tests::send_text(&client, 100, 1, "a body dump never prints").await;
    drop(client);

    let live = inboxd(&["dump", "--data-dir", &dir]);
    assert_eq!(
        live.status.code(),
        Some(2),
        "refuses a live daemon: {live:?}"
    );
    assert!(daemon.stop().success());

    let clean = inboxd(&["dump", "--data-dir", &dir]);
    assert!(clean.status.success(), "{clean:?}");
    let text = String::from_utf8_lossy(&clean.stdout);
    assert!(text.contains("message conv 100 msg_seq 2"), "{text}");
    assert!(text.contains("effect message conv 100 msg_seq 2"), "{text}");
    assert!(!text.contains("never prints"), "bodies stay out: {text}");

    // Flip one byte inside the evt log's second batch (the send: its
    // body travels inside its message effect).
    let evt_only = inboxd(&["dump", "--data-dir", &dir, "--stream", "evt"]);
    let listing = String::from_utf8_lossy(&evt_only.stdout).into_owned();
    assert!(!listing.contains("msg segment"), "{listing}");
    let second_batch: usize = listing
        .lines()
        .filter_map(|l| l.trim().strip_prefix("batch lsn 2 at "))
        .find_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("a second evt batch");
    let segment = data.path().join("evt").join(format!("{:010}.seg", 1));
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[second_batch + 40] ^= 0xff;
    std::fs::write(&segment, bytes).unwrap();

    let damaged = inboxd(&[
        "dump",
        "--data-dir",
        &dir,
        "--stream",
        "evt",
        "--segment",
        "1",
    ]);
    assert_eq!(damaged.status.code(), Some(1), "{damaged:?}");
    let text = String::from_utf8_lossy(&damaged.stdout);
    assert!(text.contains(&format!("stops at {second_batch}")), "{text}");
    assert!(
        text.contains("message conv 100 msg_seq 1"),
        "what precedes survives: {text}"
    );
}
