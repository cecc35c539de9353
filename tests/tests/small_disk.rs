//! A daemon on a small disk. Each test mounts its own tmpfs of a given
//! size, which needs root: run as another user, the tests say they were
//! skipped (and fail under `CI`, which runs as root). As root a failed
//! mount fails the test.
//!
//! - a new store on 48 MiB starts with 8 MiB segments instead of 128 MiB,
//!   takes writes, and keeps that size after a restart;
//! - a new store on 48 MiB with an explicit 128 MiB segment size, and a new
//!   store on 16 MiB, are refused at start, naming the space needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use inbox_tests::{all_history, inboxd_binary, serve_command, Daemon};
use inbox_wire::*;

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` only when not running as root; as root a failed mount
    /// fails the test, so it cannot pass there without running.
    fn mount(mib: u64) -> Option<Tmpfs> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            // CI runs as root: a skip there would pass without testing.
            assert!(
                std::env::var_os("CI").is_none(),
                "mounting a {mib} MiB tmpfs needs root, and CI runs as root"
            );
            eprintln!("SKIPPED: mounting a {mib} MiB tmpfs needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a {mib} MiB tmpfs failed ({status})"
        );
        Some(Tmpfs { dir })
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

fn evt_segment_lengths(data_dir: &Path) -> Vec<u64> {
    let mut lens: Vec<(String, u64)> = std::fs::read_dir(data_dir.join("evt"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, e.metadata().unwrap().len())
        })
        .collect();
    lens.sort();
    lens.into_iter().map(|(_, len)| len).collect()
}

/// Runs `inboxd serve` expecting it to refuse; returns its stderr.
fn refused_start(data_dir: &Path, extra: &[&str]) -> String {
    let out = serve_command(&inboxd_binary(), data_dir, extra)
        .output()
        .expect("run inboxd");
    assert!(!out.status.success(), "inboxd started on a disk too small");
    assert!(out.stdout.is_empty(), "it never said it was listening");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_store_on_a_48_mib_disk_gets_8_mib_segments_serves_and_keeps_them() {
    let Some(fs) = Tmpfs::mount(48) else { return };
    let data_dir = fs.data_dir();
    let mut acked = Vec::new();
    {
        let daemon = Daemon::start(&data_dir);
        let client = daemon.client().await;
        client.join(ConvMember { conv: 1, uid: 1 }).await.unwrap();
        for i in 0..200u128 {
            let reply = client
                .send(SendReq {
                    conv: 1,
                    sender: 1,
                    client_msg_id: i + 1,
                    msg_type: 1,
                    payload: Bytes::from(vec![b'x'; 1000]),
                })
                .await
                .unwrap();
            acked.push(reply.msg_seq);
        }
        daemon.stop();
    }
    let lens = evt_segment_lengths(&data_dir);
    assert!(
        lens.len() >= 2,
        "the next segment was prepared ahead of need: the scratch file left room ({lens:?})"
    );
    assert!(lens.iter().all(|&l| l == 8 << 20), "{lens:?}");

    // Restarted without a flag: the store keeps its size, and every send
    // is there.
    let daemon = Daemon::start(&data_dir);
    let client = daemon.client().await;
    let history = all_history(&client, 1, 1).await;
    let seqs: Vec<u64> = history.iter().map(|m| m.msg_seq).collect();
    let sends: Vec<u64> = history
        .iter()
        .filter(|m| m.payload.len() == 1000)
        .map(|m| m.msg_seq)
        .collect();
    assert_eq!(
        sends, acked,
        "every acknowledged send, once, in order ({seqs:?})"
    );
    daemon.stop();
    let lens = evt_segment_lengths(&data_dir);
    assert!(lens.iter().all(|&l| l == 8 << 20), "{lens:?}");
}

#[test]
fn an_explicit_segment_size_that_does_not_fit_a_new_store_is_refused_naming_the_flag() {
    let Some(fs) = Tmpfs::mount(48) else { return };
    let stderr = refused_start(&fs.data_dir(), &["--segment-bytes", "134217728"]);
    assert!(
        stderr.contains("--segment-bytes 134217728 needs at least 640.1 MiB"),
        "{stderr}"
    );
    assert!(
        evt_segment_lengths_if_any(&fs.data_dir()).is_empty(),
        "a refused start writes no segment"
    );
}

#[test]
fn a_disk_too_small_for_the_smallest_segments_is_refused_with_the_space_needed() {
    let Some(fs) = Tmpfs::mount(16) else { return };
    let stderr = refused_start(&fs.data_dir(), &[]);
    assert!(stderr.contains("needs at least 20.1 MiB"), "{stderr}");
    assert!(evt_segment_lengths_if_any(&fs.data_dir()).is_empty());
}

fn evt_segment_lengths_if_any(data_dir: &Path) -> Vec<u64> {
    if data_dir.join("evt").exists() {
        evt_segment_lengths(data_dir)
    } else {
        Vec::new()
    }
}
