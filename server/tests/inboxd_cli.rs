//! The `inboxd` binary's command line: the embedded default, the generated
//! token, and the logs. (Also makes `cargo test` build the binaries the
//! end-to-end suite runs.)

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

#[test]
fn serve_without_a_token_generates_a_private_token_file_and_logs_only_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_inboxd"))
        .current_dir(dir.path())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .env_remove("INBOXD_TOKEN")
        .env_remove("INBOXD_TOKEN_FILE")
        .env_remove("INBOXD_DATA_DIR")
        .env_remove("INBOXD_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("listening on 127.0.0.1:"), "{line:?}");

    let token_path = dir.path().join("data/token");
    let mode = std::fs::metadata(&token_path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "token file is owner-only");
    let token = std::fs::read_to_string(&token_path).unwrap();
    assert_eq!(token.trim().len(), 64);

    // SAFETY: kill(2) on the child we spawned and have not reaped.
    let rc = unsafe { libc::kill(i32::try_from(child.id()).unwrap(), libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "SIGTERM exits 0: {status:?}");
    let mut logs = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .unwrap();
    assert!(
        logs.contains("data/token"),
        "the log names the token file: {logs}"
    );
    assert!(
        !logs.contains(token.trim()),
        "the log never contains the token"
    );
}

#[test]
fn bad_config_value_exits_2_with_the_key_named() {
    let output = Command::new(env!("CARGO_BIN_EXE_inboxd"))
        .args(["serve", "--sync", "sometimes"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("sync"), "{stderr}");
}
