//! A panic on an engine thread is fatal and says why: the daemon prints
//! the thread and the reason and aborts, instead of leaving requests
//! waiting on a thread that is gone. A restart recovers every
//! acknowledged write from the log.
//!
//! Run with `cargo test -p inbox-tests --features failpoints --test
//! engine_thread_panic`. The panic is injected with the engine's
//! `panic_on_write_after` failpoint, on the thread that writes the log:
//! the sequencer, which writes its rounds itself while the log's writer
//! thread is idle, or that writer thread.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use inbox_server::client::Client;
use inbox_tests::{Daemon, ADMIN_TOKEN};
use inbox_wire::ConvMember;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_inboxd-failpoints"))
}

#[tokio::test]
async fn a_panic_while_writing_the_log_aborts_the_daemon_with_the_thread_and_the_reason() {
    let data = inbox_tests::data_dir();
    // Enough writes for the store to open and a few rounds to commit.
    let mut child = Command::new(binary())
        .arg("serve")
        .arg("--data-dir")
        .arg(data.path())
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--token", "t", "--admin-token", ADMIN_TOKEN])
        .args(["--segment-bytes", "1048576"])
        .env("INBOXD_LOG", "error")
        .env("INBOXD_FAILPOINTS", "panic_on_write_after=12")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn inboxd-failpoints");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("did not start: {line:?}"));
    let client = Client::connect(addr, ADMIN_TOKEN).await.expect("connect");

    let mut acknowledged = Vec::new();
    for conv in 1..=64u64 {
        let call = client.join(ConvMember { conv, uid: 1 });
        match tokio::time::timeout(Duration::from_secs(10), call).await {
            Ok(Ok(reply)) => acknowledged.push((conv, reply.msg_seq)),
            Ok(Err(_)) => break,
            Err(_) => panic!("a request hung after an engine thread died"),
        }
    }
    assert!(
        !acknowledged.is_empty(),
        "the failpoint fired before any write"
    );
    assert!(acknowledged.len() < 64, "the failpoint never fired");

    let status = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .expect("wait");
    assert_eq!(status.status.signal(), Some(libc::SIGABRT), "{status:?}");
    let mut stderr = String::new();
    status
        .stderr
        .as_slice()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        stderr.contains("engine thread \"inbox-sequencer\" panicked")
            || stderr.contains("engine thread \"log-writer\" panicked"),
        "the thread that wrote: {stderr}"
    );
    assert!(
        stderr.contains("panic_on_write_after"),
        "the reason: {stderr}"
    );

    // Restarted without the failpoint, every acknowledged join is there.
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    for (conv, msg_seq) in acknowledged {
        let history = inbox_tests::all_history(&client, 1, conv).await;
        assert!(
            history.iter().any(|m| m.msg_seq == msg_seq),
            "conv {conv}: acknowledged join at {msg_seq} lost: {history:?}"
        );
    }
}
