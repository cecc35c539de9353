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

/// Waits for `child` to exit; kills it and fails if it is still running
/// after a minute (a daemon that served instead of refusing).
fn wait_with_deadline(mut child: std::process::Child) -> std::process::Output {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("wait for inboxd").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("inboxd served a damaged store instead of refusing");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("inboxd output")
}

/// Every line of `stderr` is a JSON log record; returns the messages.
fn json_messages(stderr: &[u8]) -> Vec<String> {
    let stderr = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(!lines.is_empty(), "something is logged");
    lines
        .iter()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a line that is not JSON: {line:?}: {e}"));
            value["fields"]["message"]
                .as_str()
                .unwrap_or("")
                .to_string()
                + " "
                + value["fields"]["error"].as_str().unwrap_or("")
        })
        .collect()
}

#[tokio::test]
async fn under_json_logs_configuration_and_fatal_errors_are_json_lines_too() {
    let data = inbox_tests::data_dir();
    let dir = data.path().display().to_string();
    let missing = data.path().join("no-such.toml").display().to_string();
    let config = inboxd(&["--log-format", "json", "verify", "--config", &missing]);
    assert_eq!(config.status.code(), Some(2), "{config:?}");
    json_messages(&config.stderr);

    // A store whose newest evt segment was cut short: serve refuses,
    // naming the log, the segment file and the size it was made with.
    let daemon = Daemon::start_with(data.path(), &["--segment-bytes", "65536"]);
    let client = daemon.client().await;
    for device in 1..=5 {
        inbox_tests::register(&client, 1, device).await;
    }
    drop(client);
    assert!(daemon.stop().success());
    let seg = data.path().join("evt").join("0000000001.seg");
    std::fs::File::options()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(30_000)
        .unwrap();
    let mut serve = inbox_tests::serve_command(&inboxd_binary(), data.path(), &[]);
    let serve = serve
        .args(["--log-format", "json"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run inboxd serve");
    let serve = wait_with_deadline(serve);
    assert!(!serve.status.success(), "{serve:?}");
    let said = json_messages(&serve.stderr).join("\n");
    for part in ["log evt", "0000000001.seg", "65536 bytes long"] {
        assert!(said.contains(part), "the refusal names {part}: {said}");
    }
    let verify = inboxd(&["--log-format", "json", "verify", "--data-dir", &dir]);
    assert_eq!(verify.status.code(), Some(1), "{verify:?}");
    json_messages(&verify.stderr);
    let report = String::from_utf8_lossy(&verify.stdout);
    assert!(report.contains("65536 bytes long"), "{report}");
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
    inbox_tests::send_text(&client, 100, 1, "after the damage").await;
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
    assert!(!text.contains("msg_seq 3"), "stops at the damage: {text}");

    let skipping = inboxd(&[
        "dump",
        "--data-dir",
        &dir,
        "--stream",
        "evt",
        "--skip-damaged",
    ]);
    assert_eq!(skipping.status.code(), Some(1), "damage met: {skipping:?}");
    let text = String::from_utf8_lossy(&skipping.stdout);
    assert!(
        text.contains(&format!("damaged at {second_batch}")),
        "{text}"
    );
    assert!(
        text.contains("effect message conv 100 msg_seq 3"),
        "the intact batch after the bad one is shown: {text}"
    );
}
