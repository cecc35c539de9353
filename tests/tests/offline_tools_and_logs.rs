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
