//! kill -9: a child process appends with acks and prints each acked LSN;
//! the parent SIGKILLs it at a random moment, reopens the log and finds
//! every acked record. The child is this same test binary, re-executed to
//! run the ignored `kill9_child_appender` with the directory in an
//! environment variable.

mod log_common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use inbox_engine::log::Log;
use log_common::*;
use rand::Rng;

const DIR_ENV: &str = "INBOX_LOG_KILL9_DIR";
const THREADS: u64 = 4;

#[test]
#[ignore = "child process of every_acked_append_survives_kill_9; run by it"]
fn kill9_child_appender() {
    let dir = std::env::var(DIR_ENV).expect("run by the kill -9 test");
    let round: u64 = std::env::var("INBOX_LOG_KILL9_ROUND")
        .unwrap()
        .parse()
        .unwrap();
    let log = Arc::new(Log::open(opts(dir.as_ref())).unwrap());
    let out = Arc::new(parking_lot::Mutex::new(std::io::stdout()));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (log, out) = (Arc::clone(&log), Arc::clone(&out));
            std::thread::spawn(move || {
                for i in 0.. {
                    let tag = round * 10_000_000 + t * 1_000_000 + i;
                    let a = log.append(batch(tag, records_of(tag))).unwrap();
                    let mut o = out.lock();
                    writeln!(o, "ACK {} {}", a.lsn, tag).unwrap();
                    o.flush().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Records in the batch with `tag` (the child's append counter is its low
/// six digits).
fn records_of(tag: u64) -> usize {
    1 + (tag % 1_000_000 % 3) as usize
}

#[test]
fn every_acked_append_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::thread_rng();
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
    for round in 0..4u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "kill9_child_appender",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_ENV, dir.path())
            .env("INBOX_LOG_KILL9_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (first_ack_tx, first_ack) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut parts = line.split_whitespace();
                if parts.next() == Some("ACK") {
                    let lsn: u64 = parts.next().unwrap().parse().unwrap();
                    let tag: u64 = parts.next().unwrap().parse().unwrap();
                    if acks.is_empty() {
                        let _ = first_ack_tx.send(());
                    }
                    acks.push((lsn, tag));
                }
            }
            acks
        });
        // The random moment is counted from the child's first ACK, so a
        // slow start on a loaded machine cannot make the kill land before
        // any append.
        let _ = first_ack.recv_timeout(Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..500)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let acks = reader.join().unwrap();
        assert!(!acks.is_empty(), "round {round}: the child acked nothing");
        for (lsn, tag) in acks {
            assert!(acked.insert(lsn, tag).is_none(), "LSN {lsn} acked twice");
        }

        let log = Log::open(opts(dir.path())).unwrap();
        let mut got: BTreeMap<u64, Vec<(u8, Vec<u8>)>> = BTreeMap::new();
        for (lsn, _, kind, p) in replay_all(&log) {
            got.entry(lsn).or_default().push((kind, p));
        }
        let lsns: Vec<u64> = got.keys().copied().collect();
        assert_eq!(
            lsns,
            (1..=lsns.len() as u64).collect::<Vec<_>>(),
            "round {round}"
        );
        for (lsn, tag) in &acked {
            let p = got
                .get(lsn)
                .unwrap_or_else(|| panic!("round {round}: acked LSN {lsn} lost"));
            let want: Vec<(u8, Vec<u8>)> = (0..records_of(*tag))
                .map(|i| ((i % 5) as u8 + 1, payload(*tag, i)))
                .collect();
            assert_eq!(*p, want, "round {round}: every record of LSN {lsn}");
        }
    }
}
