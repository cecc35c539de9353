//! Fault injection at the daemon level (R20, R21, R22 in docs/SEMANTICS.md): the real
//! inboxd, built with the engine's `failpoints` feature, under injected
//! fsync failures, a full disk and torn writes, and restarted on a data
//! directory whose newest index checkpoint is corrupt.
//!
//! Run with `cargo test -p inbox-tests --features failpoints --test
//! fault_injection` (that builds `inboxd-failpoints`). The failpoints are
//! named in `INBOXD_FAILPOINTS` (see the engine's `failpoints` module);
//! every restart after a fault runs without them.
//!
//! What every test pins: a send that was answered with success is present
//! exactly once, with the `msg_seq` it was given, after every restart; a
//! send answered with an error is present at most once (and not at all
//! where the error says nothing was written); the logs verify clean once
//! recovery has run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_server::client::{Client, ClientError};
use inbox_tests::{all_history, Daemon};
use inbox_wire::*;

const SENDER: u64 = 1;
const READER: u64 = 2;
const DEVICE: u64 = 1;
const CONV_BASE: u64 = 100;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_inboxd-failpoints"))
}

/// Starts inboxd-failpoints, with `failpoints` in `INBOXD_FAILPOINTS`.
/// Segments are 1 MiB unless `extra` says otherwise: preallocating and
/// verifying the default 128 MiB ones would dominate these tests' time.
fn start(dir: &Path, failpoints: Option<&str>, extra: &[&str]) -> Daemon {
    let env: Vec<(&str, &str)> = failpoints
        .map(|spec| vec![("INBOXD_FAILPOINTS", spec)])
        .unwrap_or_default();
    let mut args = extra.to_vec();
    if !args.contains(&"--segment-bytes") {
        args.extend(["--segment-bytes", "1048576"]);
    }
    Daemon::start_binary(&binary(), dir, &args, &env)
}

/// One send and what the daemon answered.
#[derive(Clone, Debug)]
struct Sent {
    conv: u64,
    payload: Bytes,
    reply: Result<SendReply, ErrorCode>,
}

/// Joins the sender and the reader to `convs` conversations and registers
/// the reader's device; returns its generation.
async fn setup(client: &Client, convs: u64) -> u64 {
    for conv in CONV_BASE..CONV_BASE + convs {
        for uid in [SENDER, READER] {
            client.join(ConvMember { conv, uid }).await.expect("join");
        }
    }
    inbox_tests::register(client, READER, DEVICE).await
}

/// A unique payload, with `pad` incompressible bytes (payloads are stored
/// zstd-compressed when that helps, and these must take real space).
fn payload(conv: u64, n: u64, pad: usize) -> Bytes {
    let mut bytes = format!("conv {conv} message {n} ").into_bytes();
    let mut x = (conv << 32 | n) | 1;
    for _ in 0..pad {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.push(x.to_le_bytes()[0]);
    }
    Bytes::from(bytes)
}

async fn send(client: &Client, conv: u64, n: u64, pad: usize) -> Sent {
    let payload = payload(conv, n, pad);
    let reply = client
        .send(SendReq {
            conv,
            sender: SENDER,
            client_msg_id: (u128::from(conv) << 64) | u128::from(n),
            msg_type: 1,
            payload: payload.clone(),
        })
        .await
        .map_err(|e| code_of(&e));
    Sent {
        conv,
        payload,
        reply,
    }
}

fn code_of(err: &ClientError) -> ErrorCode {
    err.code()
        .unwrap_or_else(|| panic!("expected an error reply from the server, got {err}"))
}

/// What concurrent senders saw while a fault struck.
struct Load {
    sends: Vec<Sent>,
    /// Sends issued after some client had already seen an error, that
    /// still got a success: a writer that went on after a failure.
    successes_after_a_failure: usize,
}

/// `workers` senders, one conversation each, one send at a time, until
/// each has seen `failures_each` errors (or sent `sends_max`).
async fn load_through_fault(
    client: Arc<Client>,
    workers: u64,
    failures_each: usize,
    sends_max: u64,
    pad: usize,
) -> Load {
    let failed = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let client = Arc::clone(&client);
        let failed = Arc::clone(&failed);
        tasks.spawn(async move {
            let conv = CONV_BASE + worker;
            let (mut sends, mut late_successes, mut failures) = (Vec::new(), 0, 0);
            for n in 0..sends_max {
                let failure_seen_before = failed.load(Ordering::SeqCst);
                let sent = send(&client, conv, n, pad).await;
                match sent.reply {
                    Ok(_) if failure_seen_before => late_successes += 1,
                    Ok(_) => {}
                    Err(_) => {
                        failed.store(true, Ordering::SeqCst);
                        failures += 1;
                    }
                }
                sends.push(sent);
                if failures >= failures_each {
                    break;
                }
            }
            (sends, late_successes)
        });
    }
    let mut load = Load {
        sends: Vec::new(),
        successes_after_a_failure: 0,
    };
    for (sends, late) in tasks.join_all().await {
        load.sends.extend(sends);
        load.successes_after_a_failure += late;
    }
    load
}

/// Checks every send against the history after a restart: acknowledged
/// ones exactly once at their `msg_seq`; failed ones at most once, or
/// never when `failed_wrote_nothing`. Returns how many were checked.
async fn check_sends(client: &Client, sends: &[Sent], failed_wrote_nothing: bool) -> usize {
    let mut stored: HashMap<(u64, Bytes), Vec<u64>> = HashMap::new();
    let mut convs: Vec<u64> = sends.iter().map(|s| s.conv).collect();
    convs.sort_unstable();
    convs.dedup();
    for conv in convs {
        for m in all_history(client, SENDER, conv).await {
            if m.kind == MessageKind::Normal {
                stored.entry((conv, m.payload)).or_default().push(m.msg_seq);
            }
        }
    }
    for sent in sends {
        let found = stored
            .get(&(sent.conv, sent.payload.clone()))
            .cloned()
            .unwrap_or_default();
        match &sent.reply {
            Ok(reply) => assert_eq!(
                found,
                [reply.msg_seq],
                "acknowledged send {:?} must be stored exactly once at msg_seq {}",
                sent.payload,
                reply.msg_seq
            ),
            Err(code) if failed_wrote_nothing => assert!(
                found.is_empty(),
                "send {:?} failed with {code} yet is stored at {found:?}",
                sent.payload
            ),
            Err(_) => assert!(found.len() <= 1, "failed send stored twice: {found:?}"),
        }
    }
    sends.len()
}

/// Offline check of both logs (`inboxd verify`'s check).
fn verify_logs(dir: &Path) -> Vec<inbox_engine::log::Problem> {
    let mut problems = Vec::new();
    for log in ["msg", "evt"] {
        let report = inbox_engine::log::verify(&dir.join(log))
            .unwrap_or_else(|e| panic!("verify {log}: {e}"));
        problems.extend(report.problems);
    }
    problems
}

/// Both the library check (no problem at all, not even a torn tail) and
/// `inboxd verify` (exit status) pass.
fn assert_verify_clean(dir: &Path) {
    let problems = verify_logs(dir);
    assert!(problems.is_empty(), "verify found {problems:?}");
    let out = std::process::Command::new(binary())
        .arg("verify")
        .arg("--data-dir")
        .arg(dir)
        .output()
        .expect("run inboxd verify");
    assert!(
        out.status.success(),
        "inboxd verify failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn acked(sends: &[Sent]) -> usize {
    sends.iter().filter(|s| s.reply.is_ok()).count()
}

fn error_codes(sends: &[Sent]) -> HashMap<String, usize> {
    let mut codes = HashMap::new();
    for s in sends {
        if let Err(code) = s.reply {
            *codes.entry(code.name().to_string()).or_default() += 1;
        }
    }
    codes
}

// ---------------------------------------------------------------------------
// (i) fsync EIO

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_eio_stops_the_writer_for_good_and_every_acknowledged_send_survives_a_restart() {
    const WORKERS: u64 = 8;
    let started = Instant::now();
    let dir = inbox_tests::data_dir();
    // Syncs 1..=60 succeed (startup and the first rounds), sync 61 fails,
    // and later syncs would succeed again: only the engine can keep the
    // writer stopped.
    let daemon = start(dir.path(), Some("fsync_eio_after=60"), &[]);
    let client = Arc::new(daemon.client().await);
    setup(&client, WORKERS).await;
    let load = load_through_fault(Arc::clone(&client), WORKERS, 3, 2_000, 0).await;
    let failed = load.sends.len() - acked(&load.sends);
    assert!(
        acked(&load.sends) > 0,
        "some sends succeed before the fault"
    );
    assert!(
        failed >= WORKERS as usize * 3,
        "every worker sees errors once fsync failed: is this inboxd built with the failpoints feature?"
    );
    assert_eq!(
        load.successes_after_a_failure, 0,
        "a send issued after an fsync failure was reported got a success"
    );
    for s in &load.sends {
        if let Err(code) = s.reply {
            assert!(
                matches!(code, ErrorCode::Unavailable | ErrorCode::Internal),
                "fsync failure answered with {code}"
            );
        }
    }
    // The disk "works" again (the failpoint fired once), but the writer
    // must stay stopped until a restart: no retry as if the data were safe.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for n in 0..10 {
        let later = send(&client, CONV_BASE, 1_000_000 + n, 0).await;
        assert_eq!(
            later.reply.as_ref().err(),
            Some(&ErrorCode::Unavailable),
            "sends after the failure keep failing with UNAVAILABLE"
        );
    }
    // Reads of durable data go on.
    let history = all_history(&client, SENDER, CONV_BASE).await;
    assert!(!history.is_empty(), "durable history is still served");

    drop(client);
    daemon.crash();
    let daemon = start(dir.path(), None, &[]);
    let client = daemon.client().await;
    let checked = check_sends(&client, &load.sends, false).await;
    // The restarted writer works, and allocates after what is stored.
    let after = send(&client, CONV_BASE, 2_000_000, 0).await;
    assert!(
        after.reply.is_ok(),
        "writes work after a restart: {:?}",
        after.reply
    );
    drop(client);
    assert!(daemon.stop().success());
    assert_verify_clean(dir.path());
    println!(
        "fsync EIO: {} sends from {WORKERS} clients, {} acknowledged, {failed} failed {:?}, \
         0 successes after the failure; {checked} checked after restart in {:.1} s",
        load.sends.len(),
        acked(&load.sends),
        error_codes(&load.sends),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// (ii) ENOSPC

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_fails_sends_with_no_space_keeps_reads_and_syncs_working_and_writes_resume_once_freed(
) {
    const PAD: usize = 2048;
    const SENDS_MAX: u64 = 400;
    let started = Instant::now();
    let dir = inbox_tests::data_dir();
    let marker = dir.path().join("NOSPACE");
    // Small segments, so the disk "fills" after a few dozen sends.
    let extra = ["--segment-bytes", "65536"];
    let daemon = start(dir.path(), Some("enospc_marker=NOSPACE"), &extra);
    let client = daemon.client().await;
    let generation = setup(&client, 1).await;
    let mut sends = Vec::new();
    for n in 0..5 {
        sends.push(send(&client, CONV_BASE, n, PAD).await);
    }
    assert_eq!(acked(&sends), 5, "writes work while there is space");

    std::fs::write(&marker, b"").expect("create the marker");
    let mut n = 5;
    let no_space = loop {
        assert!(n < SENDS_MAX, "no NO_SPACE within {SENDS_MAX} sends of {PAD} bytes: is this inboxd built with the failpoints feature?");
        let sent = send(&client, CONV_BASE, n, PAD).await;
        n += 1;
        let failed = sent.reply.is_err();
        sends.push(sent);
        if failed {
            break sends.last().expect("just pushed").clone();
        }
    };
    assert_eq!(no_space.reply.as_ref().err(), Some(&ErrorCode::NoSpace));
    let acked_before_full = acked(&sends);
    // While the disk is full every send fails the same way, and changes
    // nothing.
    for _ in 0..10 {
        let sent = send(&client, CONV_BASE, n, PAD).await;
        n += 1;
        assert_eq!(sent.reply.as_ref().err(), Some(&ErrorCode::NoSpace));
        sends.push(sent);
    }
    // A sync that lands in the same round as a refused send is served.
    for _ in 0..20 {
        let (sent, synced) = tokio::join!(
            send(&client, CONV_BASE, n, PAD),
            client.sync(SyncReq {
                uid: READER,
                device: DEVICE,
                generation: Some(generation),
                local_applied_seq: 0,
                limit: 0,
                batch_token: None,
                ..SyncReq::default()
            })
        );
        n += 1;
        assert_eq!(sent.reply.as_ref().err(), Some(&ErrorCode::NoSpace));
        sends.push(sent);
        synced.expect("a sync beside a refused send is served");
    }
    // Reads and syncs still work and show every acknowledged send.
    let run = client
        .sync_to_end(READER, DEVICE, Some(generation), 0, false)
        .await
        .expect("sync while the disk is full");
    let synced = inbox_tests::msg_refs(&run.events).len();
    assert_eq!(
        synced, acked_before_full,
        "the reader syncs every acknowledged send"
    );
    let history = all_history(&client, SENDER, CONV_BASE).await;
    assert!(history.len() > acked_before_full, "history is served");

    // Space is freed: writes resume at once, without a restart, and the
    // refused sends burnt no msg_seq.
    std::fs::remove_file(&marker).expect("remove the marker");
    let last_seq = sends
        .iter()
        .filter_map(|s| s.reply.as_ref().ok())
        .map(|r| r.msg_seq)
        .max()
        .expect("some sends were acknowledged");
    let resumed = send(&client, CONV_BASE, n, PAD).await;
    n += 1;
    let resumed_seq = resumed
        .reply
        .as_ref()
        .expect("writes resume once space is freed")
        .msg_seq;
    assert_eq!(
        resumed_seq,
        last_seq + 1,
        "the refused sends allocated no msg_seq"
    );
    sends.push(resumed);
    for _ in 0..40 {
        let sent = send(&client, CONV_BASE, n, PAD).await;
        n += 1;
        assert!(sent.reply.is_ok(), "writes go on: {:?}", sent.reply);
        sends.push(sent);
    }
    let failed_while_full = sends.len() - acked(&sends);
    let checked_live = check_sends(&client, &sends, true).await;
    drop(client);
    assert!(daemon.stop().success());
    assert_verify_clean(dir.path());

    // And all of it survives a restart.
    let daemon = start(dir.path(), None, &extra);
    let client = daemon.client().await;
    check_sends(&client, &sends, true).await;
    drop(client);
    assert!(daemon.stop().success());
    println!(
        "ENOSPC: {acked_before_full} sends acknowledged before the disk filled, {failed_while_full} refused with NO_SPACE, \
         reads and syncs served meanwhile, {} acknowledged in all; {checked_live} checked live and after restart, \
         verify clean, {:.1} s",
        acked(&sends),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// (iii) torn writes, short files, corrupt checkpoints

/// Runs concurrent sends until a torn write poisons the daemon, then
/// kills it. Returns the sends and the torn-tail problem verify sees.
///
/// The writer sends a run of contiguous batches in one write, and the
/// failpoint keeps the first half of its bytes. When that half ends exactly
/// on a batch boundary (two equal batches in the torn write), no torn bytes
/// remain: the log is clean and merely shorter, which recovery must accept.
/// That attempt is checked (verify clean, every acknowledged send present
/// after a restart) and the load is run again on a fresh directory, tearing
/// a later write, until a tear lands inside a batch.
async fn load_until_torn(dir: &Path) -> (Vec<Sent>, inbox_engine::log::Problem, &'static str) {
    const WORKERS: u64 = 8;
    const ATTEMPTS: u64 = 6;
    for attempt in 0..ATTEMPTS {
        for entry in std::fs::read_dir(dir).expect("data dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path).expect("clear the data dir");
            } else {
                std::fs::remove_file(&path).expect("clear the data dir");
            }
        }
        let plan = format!("torn_write_after={}", 40 + 7 * attempt);
        let daemon = start(dir, Some(&plan), &[]);
        let client = Arc::new(daemon.client().await);
        setup(&client, WORKERS).await;
        let load = load_through_fault(Arc::clone(&client), WORKERS, 2, 2_000, 200).await;
        assert!(
            acked(&load.sends) > 0,
            "some sends succeed before the torn write"
        );
        assert!(
            load.sends.len() > acked(&load.sends),
            "the torn write fails sends: is this inboxd built with the failpoints feature?"
        );
        assert_eq!(
            load.successes_after_a_failure, 0,
            "no success after a failed write"
        );
        drop(client);
        daemon.crash();
        let mut torn = None;
        for log in ["msg", "evt"] {
            let report = inbox_engine::log::verify(&dir.join(log)).expect("verify");
            for problem in report.problems {
                assert_eq!(
                    problem.kind,
                    inbox_engine::log::ProblemKind::TornTail,
                    "a torn write is a torn tail, never corruption: {problem}"
                );
                torn = Some((problem, log));
            }
        }
        if let Some((problem, log)) = torn {
            return (load.sends, problem, log);
        }
        // The tear fell on a batch boundary: a clean log that lost only
        // unacknowledged sends.
        let daemon = start(dir, None, &[]);
        let client = daemon.client().await;
        let checked = check_sends(&client, &load.sends, false).await;
        drop(client);
        assert!(daemon.stop().success());
        assert_verify_clean(dir);
        println!(
            "attempt {attempt}: {plan} tore its write on a batch boundary; the log is clean, \
             {checked} acknowledged sends checked after a restart; tearing a later write"
        );
    }
    panic!("{ATTEMPTS} torn writes all fell on batch boundaries: the failpoint no longer tears batches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_write_in_the_middle_of_a_batch_is_cut_at_recovery_and_every_acknowledged_send_survives(
) {
    let started = Instant::now();
    let dir = inbox_tests::data_dir();
    let (sends, torn, log) = load_until_torn(dir.path()).await;
    let daemon = start(dir.path(), None, &[]);
    let client = daemon.client().await;
    let checked = check_sends(&client, &sends, false).await;
    let after = send(&client, CONV_BASE, 1_000_000, 0).await;
    assert!(after.reply.is_ok(), "writes work after recovery");
    drop(client);
    assert!(daemon.stop().success());
    assert_verify_clean(dir.path());
    println!(
        "torn write: {} sends, {} acknowledged, {:?}; torn tail in {log}: {torn}; \
         {checked} checked after recovery, verify clean, {:.1} s",
        sends.len(),
        acked(&sends),
        error_codes(&sends),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_file_cut_short_inside_a_batch_is_refused_and_left_as_it_was() {
    let dir = inbox_tests::data_dir();
    let (_, torn, log) = load_until_torn(dir.path()).await;
    // Cut the file inside the torn bytes: a preallocated segment shorter
    // than its recorded size is outside damage, never a torn write, so
    // serve refuses it, naming the log, the file and the size expected,
    // and changes nothing.
    let name = format!("{:010}.seg", torn.segment);
    let path = dir.path().join(log).join(&name);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open the torn segment");
    let cut = torn.offset + 7;
    file.set_len(cut).expect("truncate");
    drop(file);
    let before = std::fs::read(&path).expect("read the cut segment");
    let serve = inbox_tests::serve_command(&binary(), dir.path(), &["--segment-bytes", "1048576"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run serve");
    assert!(
        !serve.status.success(),
        "a cut segment was served: {serve:?}"
    );
    let said = String::from_utf8_lossy(&serve.stderr);
    for part in [
        format!("log {log}"),
        name.clone(),
        "1048576 bytes long".to_string(),
    ] {
        assert!(said.contains(&part), "the refusal names {part}: {said}");
    }
    assert_eq!(
        std::fs::read(&path).expect("read the segment again"),
        before,
        "the refused start changed the segment"
    );
}

fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("checkpoint"))
        .expect("checkpoint dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    files.sort();
    files
}

/// Flips one byte in the middle of `path`.
fn corrupt(path: &Path) {
    let mut bytes = std::fs::read(path).expect("read checkpoint");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5a;
    std::fs::write(path, bytes).expect("write checkpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_newest_checkpoint_falls_back_to_replaying_the_log_and_every_acknowledged_send_survives(
) {
    const CONVS: u64 = 3;
    let started = Instant::now();
    let dir = inbox_tests::data_dir();
    let daemon = start(dir.path(), None, &[]);
    let client = daemon.client().await;
    let generation = setup(&client, CONVS).await;
    let mut sends = Vec::new();
    let mut n = 0;
    for phase in 0..3 {
        for conv in CONV_BASE..CONV_BASE + CONVS {
            for _ in 0..10 {
                sends.push(send(&client, conv, n, 0).await);
                n += 1;
            }
        }
        if phase < 2 {
            client.checkpoint(Empty {}).await.expect("checkpoint");
        }
    }
    // The reader's device ACKs half way, so its cursor is in the state too.
    let run = client
        .sync_to_end(READER, DEVICE, Some(generation), 0, true)
        .await
        .expect("sync");
    let acked_seq = run.acked_sync_seq;
    assert!(acked_seq > 0);
    assert_eq!(acked(&sends), sends.len());
    drop(client);
    // Shutdown writes one more checkpoint; the newest two are kept.
    assert!(daemon.stop().success());
    let files = checkpoints(dir.path());
    assert_eq!(files.len(), 2, "two checkpoints kept: {files:?}");

    // 1. The newest checkpoint is corrupt: recovery uses the older one and
    //    replays the log after it.
    corrupt(files.last().expect("newest"));
    let daemon = start(dir.path(), None, &[]);
    let client = daemon.client().await;
    check_sends(&client, &sends, false).await;
    let again = client
        .sync_to_end(READER, DEVICE, Some(generation), acked_seq, false)
        .await
        .expect("the device cursor survived");
    assert_eq!(again.acked_sync_seq, acked_seq, "the ACK is not lost");
    // The next msg_seq follows what is stored: no seq is handed out twice.
    let next = send(&client, CONV_BASE, n, 0).await;
    n += 1;
    let head = sends
        .iter()
        .filter(|s| s.conv == CONV_BASE)
        .filter_map(|s| s.reply.as_ref().ok())
        .map(|r| r.msg_seq)
        .max()
        .expect("sends in the conversation");
    assert_eq!(
        next.reply.as_ref().expect("send after recovery").msg_seq,
        head + 1
    );
    sends.push(next);
    drop(client);
    assert!(daemon.stop().success());

    // 2. Every checkpoint is corrupt: recovery replays the whole log.
    let files = checkpoints(dir.path());
    for file in &files {
        corrupt(file);
    }
    let daemon = start(dir.path(), None, &[]);
    let client = daemon.client().await;
    let checked = check_sends(&client, &sends, false).await;
    let again = client
        .sync_to_end(READER, DEVICE, Some(generation), acked_seq, false)
        .await
        .expect("the device cursor survived a full replay");
    assert_eq!(again.acked_sync_seq, acked_seq);
    let next = send(&client, CONV_BASE, n, 0).await;
    assert_eq!(
        next.reply.as_ref().expect("send after replay").msg_seq,
        head + 2
    );
    drop(client);
    assert!(daemon.stop().success());
    assert_verify_clean(dir.path());
    println!(
        "corrupt checkpoint: newest of 2 corrupted, then all {} corrupted; {checked} acknowledged sends and the \
         device ACK at {acked_seq} survived both recoveries, {:.1} s",
        files.len(),
        started.elapsed().as_secs_f64()
    );
}
