//! Crash loop: kill -9 the daemon at random moments under mixed load from
//! several clients, restart it, and check after every restart that nothing
//! acknowledged was lost (R20):
//!
//! - every send that got a reply is present exactly once, at its `msg_seq`,
//!   and each conversation's `msg_seq`s run 1, 2, 3… with no gap;
//! - a recall that got a reply left a tombstone;
//! - no device's `acked_sync_seq` is below an ACK the daemon confirmed;
//! - no read cursor is below a `mark_read` the daemon confirmed;
//! - no event that compaction reclaimed is retained again;
//! - conversation 1 (every user; the threshold is 4) stays a large group,
//!   switched at the same `msg_seq`, across every kill;
//! - `inboxd verify` passes on the data directory the kill left behind.
//!
//! Every 25th check, and the one after the last kill, reads everything back
//! from `msg_seq` 1. The checks between read what was acknowledged since
//! the previous check and each conversation's history above the part it
//! checked, so a kill cycle costs the same at kill 1,000 as at kill 10
//! (device ACKs, read cursors and reclaim fences are all checked every
//! time; they are small).
//!
//! `CRASH_LOOP_KILLS` sets the number of kills (default 20) and
//! `CRASH_LOOP_SEED` the seed. It prints the figures (kills, acknowledged
//! sends, recalls, ACK advances, events reclaimed, devices pushed into
//! reset, operations checked, violations) and fails when the load never
//! got a send, a recall, an ACK or a reclaim acknowledged: a loop that
//! exercised none of them proves nothing about them.

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inbox_server::client::{Client, ClientError};
use inbox_tests::{data_dir, history_above, inboxd_binary, Daemon};
use inbox_wire::{
    ConvListReq, ConvMember, ConvModeReq, Empty, ErrorCode, MarkReadReq, RecallReq, SendReq,
    UserDevice, UserReq,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const WORKERS: u64 = 4;
const USERS: u64 = 6;
const DEVICES_PER_USER: u64 = 2;
/// Events are reclaimable as soon as every device has ACKed them, and the
/// clients drive compaction themselves.
const RECLAIM_AT_ONCE: &[&str] = &[
    "--safety-window-s",
    "0",
    "--compaction-interval-s",
    "0",
    "--large-group-members",
    "4",
];
/// Conversation 1 (six members) becomes a large group at its fifth join.
const LARGE_GROUP: &[&str] = &["--large-group-members", "4"];

/// Conversation 1 is a group of every user (a large group: see
/// [`LARGE_GROUP`]); 2, 3 and 4 are one-to-one.
fn conversations() -> Vec<(u64, Vec<u64>)> {
    vec![
        (1, (1..=USERS).collect()),
        (2, vec![1, 2]),
        (3, vec![3, 4]),
        (4, vec![5, 6]),
    ]
}

#[derive(Clone, Copy, Debug)]
struct AckedSend {
    conv: u64,
    sender: u64,
    msg_id: u64,
    msg_seq: u64,
}

/// Everything the daemon confirmed, which must survive every crash.
#[derive(Clone, Default)]
struct Ledger {
    sends: Vec<AckedSend>,
    /// conv -> the highest `msg_seq` acknowledged in it.
    heads: HashMap<u64, u64>,
    /// (conv, sender) -> the acknowledged sends not yet recalled, which
    /// the sender may recall.
    recallable: HashMap<(u64, u64), Vec<u64>>,
    /// Acknowledged recalls, in order.
    recall_log: Vec<u64>,
    /// (uid, device) -> the highest ACK the daemon confirmed, and the
    /// generation the device is in.
    device_acks: HashMap<(u64, u64), (u64, u64)>,
    /// (uid, conv) -> the highest read cursor the daemon confirmed.
    reads: HashMap<(u64, u64), u64>,
    /// uid -> the highest `oldest_retained` the daemon reported after a
    /// compaction: every event below it was reclaimed and must never be
    /// served again.
    reclaimed_below: HashMap<u64, u64>,
    events_reclaimed: u64,
    /// Sync runs whose confirmed ACK moved a device's cursor forward.
    ack_advances: u64,
    /// Devices told RESET_REQUIRED: they keep the ACK they had confirmed,
    /// which the checks still hold the daemon to.
    resets: u64,
}

fn kills() -> usize {
    std::env::var("CRASH_LOOP_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

fn seed() -> u64 {
    std::env::var("CRASH_LOOP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// True for errors a client sees because the daemon died under it.
fn died(error: &ClientError) -> bool {
    matches!(error, ClientError::Io(_) | ClientError::Closed(_))
}

async fn worker(worker_id: u64, client: Client, ledger: Arc<Mutex<Ledger>>, mut rng: StdRng) {
    let convs = conversations();
    // A device syncs from one place at a time: each worker owns some
    // devices, so no two syncs of one device race (a race would rightly
    // end in STALE_GENERATION for the loser).
    let own_devices: Vec<(u64, u64)> = (1..=USERS)
        .flat_map(|uid| (1..=DEVICES_PER_USER).map(move |device| (uid, device)))
        .filter(|(uid, device)| (uid * DEVICES_PER_USER + device) % WORKERS == worker_id)
        .collect();
    loop {
        let (conv, members) = &convs[rng.gen_range(0..convs.len())];
        let uid = members[rng.gen_range(0..members.len())];
        let roll: u32 = rng.gen_range(0..100);
        let result: Result<(), ClientError> = async {
            if roll < 65 {
                let reply = client
                    .send(SendReq {
                        conv: *conv,
                        sender: uid,
                        client_msg_id: rng.gen(),
                        msg_type: 1,
                        payload: vec![b'm'; rng.gen_range(1..400)].into(),
                    })
                    .await?;
                let mut ledger = ledger.lock().expect("ledger");
                ledger.sends.push(AckedSend {
                    conv: *conv,
                    sender: uid,
                    msg_id: reply.msg_id,
                    msg_seq: reply.msg_seq,
                });
                let head = ledger.heads.entry(*conv).or_default();
                *head = (*head).max(reply.msg_seq);
                ledger
                    .recallable
                    .entry((*conv, uid))
                    .or_default()
                    .push(reply.msg_id);
            } else if roll < 85 {
                let (uid, device) = own_devices[rng.gen_range(0..own_devices.len())];
                let known = ledger
                    .lock()
                    .expect("ledger")
                    .device_acks
                    .get(&(uid, device))
                    .copied();
                let (acked, generation) = known.unwrap_or((0, 0));
                let generation = (generation > 0).then_some(generation);
                match client
                    .sync_to_end(uid, device, generation, acked, true)
                    .await
                {
                    Ok(run) => {
                        let mut ledger = ledger.lock().expect("ledger");
                        let entry = ledger.device_acks.entry((uid, device)).or_default();
                        let advanced = run.acked_sync_seq > entry.0;
                        *entry = (entry.0.max(run.acked_sync_seq), run.generation);
                        if advanced {
                            ledger.ack_advances += 1;
                        }
                    }
                    // A device pushed into reset by a lost ACK reply is not
                    // a loss; it would install a snapshot. It is counted,
                    // and its confirmed ACK stays in the checks.
                    Err(e) if e.code() == Some(ErrorCode::ResetRequired) => {
                        ledger.lock().expect("ledger").resets += 1;
                    }
                    Err(e) => return Err(e),
                }
            } else if roll < 88 {
                let report = client.compact(Empty {}).await?;
                let explain = client.explain(UserReq { uid }).await?;
                let mut ledger = ledger.lock().expect("ledger");
                ledger.events_reclaimed += report.events_reclaimed;
                let entry = ledger.reclaimed_below.entry(uid).or_default();
                *entry = (*entry).max(explain.oldest_retained);
            } else if roll < 95 {
                let head = ledger.lock().expect("ledger").heads.get(conv).copied();
                if let Some(read_to_seq) = head {
                    let reply = client
                        .mark_read(MarkReadReq {
                            uid,
                            conv: *conv,
                            read_to_seq,
                        })
                        .await?;
                    let mut ledger = ledger.lock().expect("ledger");
                    let entry = ledger.reads.entry((uid, *conv)).or_default();
                    *entry = (*entry).max(reply.read_seq);
                }
            } else {
                let target = {
                    let ledger = ledger.lock().expect("ledger");
                    ledger
                        .recallable
                        .get(&(*conv, uid))
                        .filter(|own| !own.is_empty())
                        .map(|own| own[rng.gen_range(0..own.len())])
                };
                if let Some(target) = target {
                    // The only refusal expected is CONFLICT: a recall that
                    // was applied but whose reply a kill cut off, tried
                    // again. Any other refusal fails the test.
                    match client
                        .recall(RecallReq {
                            conv: *conv,
                            sender: uid,
                            client_msg_id: rng.gen(),
                            target,
                        })
                        .await
                    {
                        Ok(_) => {
                            let mut ledger = ledger.lock().expect("ledger");
                            ledger.recall_log.push(target);
                            if let Some(own) = ledger.recallable.get_mut(&(*conv, uid)) {
                                own.retain(|&id| id != target);
                            }
                        }
                        Err(e) if e.code() == Some(ErrorCode::Conflict) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => {}
            Err(e) if died(&e) => return,
            Err(e) => panic!("unexpected error under load: {e}"),
        }
    }
}

/// How much of the ledger the last check covered, so the next one can
/// look only at what came after it.
#[derive(Clone, Default)]
struct Checked {
    sends: usize,
    recalls: usize,
    /// conv -> the highest `msg_seq` whose history, from 1, was checked.
    heads: HashMap<u64, u64>,
}

/// A full check after this many kills (and after the last one); the kills
/// between check only what was acknowledged since the last check, and
/// each conversation's history above what was checked before.
const FULL_CHECK_EVERY: usize = 25;

/// Checks the restarted daemon against the ledger; returns the number of
/// acknowledged operations checked and the violations found. With
/// `since`, only what the ledger gained after that check is read back
/// (every send and recall acknowledged since, each conversation's history
/// above the part checked then, every device ACK and read cursor);
/// without it, everything.
async fn check(
    daemon: &Daemon,
    ledger: &Ledger,
    since: Option<&Checked>,
) -> (usize, Vec<String>, Checked) {
    let client = daemon.client().await;
    let mut checked = 0;
    let mut violations = Vec::new();
    let from = since.cloned().unwrap_or_default();
    let new_sends = &ledger.sends[from.sends..];

    let mut stored: BTreeMap<u64, Vec<inbox_wire::Message>> = BTreeMap::new();
    let mut heads = HashMap::new();
    let mut floors = HashMap::new();
    for (conv, members) in conversations() {
        // The part checked before stays unread, unless a send acknowledged
        // since landed in it (a seq the last check had not seen yet).
        let lowest_new = new_sends
            .iter()
            .filter(|s| s.conv == conv)
            .map(|s| s.msg_seq)
            .min();
        let floor = from
            .heads
            .get(&conv)
            .copied()
            .unwrap_or(0)
            .min(lowest_new.map_or(u64::MAX, |s| s - 1));
        let history = history_above(&client, members[0], conv, floor).await;
        let seqs: Vec<u64> = history.iter().map(|m| m.msg_seq).collect();
        let expected: Vec<u64> = (floor + 1..=floor + seqs.len() as u64).collect();
        if seqs != expected {
            violations.push(format!(
                "conv {conv}: msg_seqs above {floor} are not {}..: {seqs:?}",
                floor + 1
            ));
        }
        heads.insert(conv, seqs.last().copied().unwrap_or(floor));
        floors.insert(conv, floor);
        stored.insert(conv, history);
    }
    // A recall acknowledged since may target an older message: read each
    // such target where it must be.
    let seq_of: HashMap<u64, (u64, u64)> = ledger
        .sends
        .iter()
        .map(|s| (s.msg_id, (s.conv, s.msg_seq)))
        .collect();
    for msg_id in &ledger.recall_log[from.recalls..] {
        let Some(&(conv, seq)) = seq_of.get(msg_id) else {
            continue;
        };
        if seq > floors[&conv] {
            continue; // read above
        }
        let uid = conversations()
            .into_iter()
            .find(|(c, _)| *c == conv)
            .map(|(_, members)| members[0])
            .expect("a conversation of the loop");
        let page = client
            .history(inbox_wire::HistoryReq {
                uid,
                conv,
                before_seq: Some(seq + 1),
                limit: 1,
            })
            .await
            .expect("history");
        stored
            .get_mut(&conv)
            .expect("read above")
            .extend(page.messages);
    }
    match client.conv_mode(ConvModeReq { conv: 1, uid: None }).await {
        Ok(mode) if mode.switch_seq == Some(5) => {}
        other => violations.push(format!(
            "conv 1 is not a large group since seq 5: {other:?}"
        )),
    }
    // Every stored copy of each message, by `msg_id`: the checks below
    // stay linear in the history, however long the run.
    let mut by_id: HashMap<u64, Vec<&inbox_wire::Message>> = HashMap::new();
    for (&conv, history) in &stored {
        for m in history {
            by_id.entry(m.msg_id).or_default().push(m);
            if m.conv != conv {
                violations.push(format!("conv {conv}'s history holds {m:?}"));
            }
        }
    }
    for send in new_sends {
        checked += 1;
        let copies = by_id.get(&send.msg_id).map(Vec::as_slice).unwrap_or(&[]);
        match copies {
            [one]
                if one.conv == send.conv
                    && one.msg_seq == send.msg_seq
                    && one.sender == send.sender => {}
            [] => violations.push(format!("acknowledged send {send:?} is missing")),
            other => violations.push(format!("send {send:?} stored as {other:?}")),
        }
    }
    for msg_id in &ledger.recall_log[from.recalls..] {
        checked += 1;
        let tombstoned = by_id
            .get(msg_id)
            .is_some_and(|copies| copies.iter().all(|m| m.tombstone && m.payload.is_empty()));
        if !tombstoned {
            violations.push(format!("recalled message {msg_id} is not a tombstone"));
        }
    }
    for (&uid, &reclaimed_below) in &ledger.reclaimed_below {
        checked += 1;
        let explain = client.explain(UserReq { uid }).await.expect("explain");
        if explain.oldest_retained < reclaimed_below {
            violations.push(format!(
                "user {uid}: events below {reclaimed_below} were reclaimed, \
                 but the oldest retained is now {}",
                explain.oldest_retained
            ));
        }
    }
    for uid in 1..=USERS {
        let devices = client
            .devices(UserReq { uid })
            .await
            .expect("devices")
            .devices;
        for device in 1..=DEVICES_PER_USER {
            let Some((acked, _)) = ledger.device_acks.get(&(uid, device)) else {
                continue;
            };
            checked += 1;
            let server = devices.iter().find(|d| d.device == device);
            match server {
                Some(d) if d.acked_sync_seq >= *acked => {}
                other => violations.push(format!(
                    "device ({uid}, {device}) confirmed ACK {acked}, now {other:?}"
                )),
            }
        }
        let list = client
            .conv_list(ConvListReq {
                uid,
                limit: 100,
                cursor: None,
            })
            .await
            .expect("conv list");
        for ((read_uid, conv), read_seq) in &ledger.reads {
            if *read_uid != uid {
                continue;
            }
            checked += 1;
            match list.convs.iter().find(|c| c.conv == *conv) {
                Some(c) if c.read_seq >= *read_seq => {}
                other => violations.push(format!(
                    "read cursor ({uid}, {conv}) confirmed {read_seq}, now {other:?}"
                )),
            }
        }
    }
    let done = Checked {
        sends: ledger.sends.len(),
        recalls: ledger.recall_log.len(),
        heads,
    };
    (checked, violations, done)
}

fn verify_offline(dir: &std::path::Path) -> Result<(), String> {
    let output = Command::new(inboxd_binary())
        .arg("verify")
        .arg("--data-dir")
        .arg(dir)
        .output()
        .expect("run inboxd verify");
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "inboxd verify failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_under_mixed_load_loses_no_acknowledged_operation() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = data_dir();
    let ledger = Arc::new(Mutex::new(Ledger::default()));

    {
        let daemon = Daemon::start_with(dir.path(), LARGE_GROUP);
        let client = daemon.client().await;
        for (conv, members) in conversations() {
            for uid in members {
                client.join(ConvMember { conv, uid }).await.expect("join");
            }
        }
        for uid in 1..=USERS {
            for device in 1..=DEVICES_PER_USER {
                client
                    .register_device(UserDevice { uid, device })
                    .await
                    .expect("register device");
            }
        }
        daemon.stop();
    }

    let kills = kills();
    let started = std::time::Instant::now();
    let mut checked_total = 0;
    let mut full_checks = 0;
    let mut last_check = Checked::default();
    let mut violations_total = Vec::new();
    for kill in 0..kills {
        let daemon = Daemon::start_with(dir.path(), RECLAIM_AT_ONCE);
        let mut workers = Vec::new();
        for w in 0..WORKERS {
            let client = daemon.client().await;
            let rng = StdRng::seed_from_u64(seed ^ (kill as u64 * 100 + w + 1));
            workers.push(tokio::spawn(worker(w, client, ledger.clone(), rng)));
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..500))).await;
        daemon.crash();
        for worker in workers {
            worker.await.expect("worker task");
        }

        if let Err(e) = verify_offline(dir.path()) {
            violations_total.push(format!("after kill {kill}: {e}"));
        }
        let daemon = Daemon::start_with(dir.path(), RECLAIM_AT_ONCE);
        let snapshot = ledger.lock().expect("ledger").clone();
        let full = (kill + 1) % FULL_CHECK_EVERY == 0 || kill + 1 == kills;
        let (checked, violations, done) =
            check(&daemon, &snapshot, (!full).then_some(&last_check)).await;
        last_check = done;
        checked_total += checked;
        full_checks += usize::from(full);
        // A long run reports as it goes, so a stopped one still says how
        // far it got.
        if (kill + 1) % 10 == 0 {
            println!(
                "crash loop (seed {seed}): {} kills done in {:.0} s, this check read back {checked} \
                 operations, violations so far {}",
                kill + 1,
                started.elapsed().as_secs_f64(),
                violations_total.len() + violations.len()
            );
        }
        violations_total.extend(
            violations
                .into_iter()
                .map(|v| format!("after kill {kill}: {v}")),
        );
        daemon.stop();
    }

    let ledger = ledger.lock().expect("ledger").clone();
    let (sends, recalls) = (ledger.sends.len(), ledger.recall_log.len());
    let (acks, reclaimed, resets) = (ledger.ack_advances, ledger.events_reclaimed, ledger.resets);
    println!(
        "crash loop (seed {seed}): kills {kills}, acknowledged sends {sends}, recalls {recalls}, \
         ACK advances {acks}, events reclaimed {reclaimed}, devices told to reset {resets}, \
         acknowledged operations checked {checked_total} ({full_checks} full checks), violations {}",
        violations_total.len()
    );
    let missing: Vec<&str> = [
        ("sends", sends as u64),
        ("recalls", recalls as u64),
        ("ACK advances", acks),
        ("reclaimed events", reclaimed),
    ]
    .iter()
    .filter(|(_, n)| *n == 0)
    .map(|(what, _)| *what)
    .collect();
    assert!(
        missing.is_empty(),
        "the load never got these acknowledged (seed {seed}): {}",
        missing.join(", ")
    );
    assert!(
        violations_total.is_empty(),
        "violations (seed {seed}):\n{}",
        violations_total.join("\n")
    );
}
