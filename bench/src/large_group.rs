//! `large-group`: one conversation of `members` members, then `messages`
//! sends of 200 bytes to it from one connection while `ingest_clients`
//! connections send one-to-one messages as fast as they can.
//!
//! Figures, per system: the join rate (the system's `prepare` of the
//! group: inboxd's pipelined joins), events written per join and per
//! group message (inboxd's live event count), the send latency to the
//! group under ingest (p50, p99), the ingest rate beside it, and the bytes
//! the server process handed to `write` per group message, measured alone
//! (`wchar` of `/proc/PID/io`, or of inboxd's log writer threads alone;
//! what the log writes, before page rounding).
//!
//! inboxd runs twice: as a large group (the default threshold) and with
//! `--large-group-members 0` (every group fans out), so the two modes are
//! compared at the same size; a baseline runs its own layout (MariaDB with
//! the seeds' schema fans out one row per recipient).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::hist::Latency;
use crate::systems::{Result, System};
use crate::workload::{Conversation, Outgoing, Setup};

/// The group's conversation id; its members are uids `1..=members`.
const GROUP: u64 = 1;
/// Ingest pairs use uids from here on and conversations from 1,000,000.
const INGEST_UID_BASE: u64 = 10_000_000;
const INGEST_CONV_BASE: u64 = 1_000_000;
const PAYLOAD_BYTES: usize = 200;
/// Group messages sent alone to measure the bytes written per message.
const PROBE_MESSAGES: u32 = 100;

#[derive(Clone, Debug)]
pub struct LargeGroupPlan {
    pub members: u32,
    pub messages: u32,
    pub ingest_clients: usize,
}

/// One row of the scenario's table, as printed and as written to the JSON
/// report's `large_group` list (`null` where not measured).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LargeGroupResult {
    pub label: String,
    pub members: u32,
    pub joins_per_s: f64,
    pub events_per_join: Option<f64>,
    pub events_per_message: Option<f64>,
    pub bytes_per_message: Option<f64>,
    pub send_p50_ms: f64,
    pub send_p99_ms: f64,
    pub ingest_per_s: f64,
}

fn events(system: &dyn System) -> Option<u64> {
    system.holdings().map(|h| h.events_live)
}

/// Bytes the process handed to write calls so far. When the process has
/// threads named `log-writer` (inboxd), only theirs count: a checkpoint
/// that happens to fall inside the probe is written by another thread, and
/// it is not a cost of the group's mode.
fn wchar(pid: Option<u32>) -> Option<u64> {
    let pid = pid?;
    let log_writers: Option<u64> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(|task| task.ok())
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.trim() == "log-writer")
        })
        .map(|task| io_wchar(&task.path().join("io")))
        .sum();
    match log_writers {
        Some(bytes) if bytes > 0 => Some(bytes),
        _ => io_wchar(std::path::Path::new(&format!("/proc/{pid}/io"))),
    }
}

fn io_wchar(path: &std::path::Path) -> Option<u64> {
    let io = std::fs::read_to_string(path).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
}

pub fn run(system: &dyn System, label: &str, plan: &LargeGroupPlan) -> Result<LargeGroupResult> {
    let pid = system.measured().map(|m| m.pid());
    let members: Vec<u64> = (1..=u64::from(plan.members)).collect();
    let events_before = events(system);
    let started = Instant::now();
    system.prepare(&Setup {
        convs: vec![Conversation {
            conv: GROUP,
            members: members.clone(),
        }],
        devices: Vec::new(),
    })?;
    let join_s = started.elapsed().as_secs_f64();
    let events_after_joins = events(system);
    let pairs: Vec<Conversation> = (0..plan.ingest_clients as u64)
        .map(|i| Conversation {
            conv: INGEST_CONV_BASE + i,
            members: vec![INGEST_UID_BASE + 2 * i, INGEST_UID_BASE + 2 * i + 1],
        })
        .collect();
    system.prepare(&Setup {
        convs: pairs.clone(),
        devices: Vec::new(),
    })?;

    let payload = vec![b'x'; PAYLOAD_BYTES];
    let run_id = u128::from(started.elapsed().as_nanos() as u64) << 64;
    let group_send = |n: u64| Outgoing {
        conv: GROUP,
        sender: 1 + n % u64::from(plan.members),
        recipients: &members,
        payload: &payload,
        client_msg_id: run_id | u128::from(n),
    };

    // Bytes and events per group message, measured alone.
    let mut conn = system.connect()?;
    let (events0, bytes0) = (events(system), wchar(pid));
    for n in 0..u64::from(PROBE_MESSAGES) {
        conn.send(&group_send(n))?;
    }
    let per_msg = |a: Option<u64>, b: Option<u64>| {
        Some(b?.saturating_sub(a?) as f64 / f64::from(PROBE_MESSAGES))
    };
    let events_per_message = per_msg(events0, events(system));
    let bytes_per_message = per_msg(bytes0, wchar(pid));

    // Group sends under ingest.
    let stop = AtomicBool::new(false);
    let ingested = AtomicU64::new(0);
    let mut latency = Latency::new();
    let mut window = Duration::ZERO;
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = pairs
            .iter()
            .enumerate()
            .map(|(i, pair)| {
                let (stop, ingested, payload) = (&stop, &ingested, &payload);
                s.spawn(move || -> Result<()> {
                    let mut conn = system.connect()?;
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        conn.send(&Outgoing {
                            conv: pair.conv,
                            sender: pair.members[(n % 2) as usize],
                            recipients: &pair.members,
                            payload,
                            client_msg_id: run_id | (1 << 62) | (i as u128) << 32 | u128::from(n),
                        })?;
                        n += 1;
                        ingested.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        // Let the ingest connections get going first.
        std::thread::sleep(Duration::from_millis(200));
        let before = ingested.load(Ordering::Relaxed);
        let began = Instant::now();
        let mut result = Ok(());
        for n in 0..u64::from(plan.messages) {
            let t = Instant::now();
            if let Err(e) = conn.send(&group_send(u64::from(PROBE_MESSAGES) + n)) {
                result = Err(e);
                break;
            }
            latency.record(t.elapsed());
        }
        window = began.elapsed();
        let during = ingested.load(Ordering::Relaxed) - before;
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().map_err(|_| "an ingest thread panicked")??;
        }
        ingested.store(during, Ordering::Relaxed);
        result
    })?;
    let p = latency.percentiles();
    let joins = f64::from(plan.members);
    Ok(LargeGroupResult {
        label: label.to_string(),
        members: plan.members,
        joins_per_s: joins / join_s.max(1e-9),
        events_per_join: per_join(events_before, events_after_joins, joins),
        events_per_message,
        bytes_per_message,
        send_p50_ms: p.p50_us / 1000.0,
        send_p99_ms: p.p99_us / 1000.0,
        ingest_per_s: ingested.load(Ordering::Relaxed) as f64 / window.as_secs_f64().max(1e-9),
    })
}

fn per_join(before: Option<u64>, after: Option<u64>, joins: f64) -> Option<f64> {
    Some(after?.saturating_sub(before?) as f64 / joins)
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.digits$}"))
}

/// The scenario's table, one row per system and mode.
pub fn table(results: &[LargeGroupResult]) -> String {
    let mut out = String::from(
        "| system | members | joins/s | events/join | events/msg | bytes written/msg | group send p50 / p99 (ms) | ingest/s beside it |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {:.2} / {:.2} | {:.0} |\n",
            r.label,
            r.members,
            r.joins_per_s,
            opt(r.events_per_join, 1),
            opt(r.events_per_message, 1),
            opt(r.bytes_per_message, 0),
            r.send_p50_ms,
            r.send_p99_ms,
            r.ingest_per_s,
        ));
    }
    out
}
