//! `--cluster N`: inboxd as a replicated group of N members against the
//! single node, side by side in one run, then the group's fail-over.
//!
//! 1. ingest at each client count (16 unless `--clients` says otherwise)
//!    on a single `inboxd`, then on a group of N on the same machine, each
//!    on a fresh data directory with the same population; then, when the
//!    scenarios include `sync`, the sync scenario on each (its reads go
//!    through the leader's read-index);
//!    Between the single node and the group, when etcd is wanted and built
//!    in (`--features etcd`), the same phases on an etcd group of N on
//!    loopback (see `systems::etcd` for how a send is modelled);
//! 2. `kills` times: the leader is killed with SIGKILL and the time until
//!    another member serves a write and then a read is recorded; the killed
//!    member is restarted on its data and must catch up before the next kill.
//!
//! Figures: throughput and p99 of the group against the single node and
//! against etcd's group, the CPU per send of each member, the commit path,
//! the term changes of each phase (elections) and the distribution of
//! fail-over times with how many were within [`FAIL_OVER_GOAL`]. All of
//! them land in the report's `cluster` part as well as on stdout.

use std::path::Path;
use std::time::Duration;

use crate::hist::Latency;
use crate::report::{Report, ResultRow, TermChanges};
use crate::run::Plan;
use crate::systems::group::Group;
use crate::systems::inboxd::Inboxd;
use crate::systems::{Result, System};
use crate::workload::{Setup, Workload};

/// Reads and writes served again within this long of a leader's kill.
pub const FAIL_OVER_GOAL: Duration = Duration::from_secs(3);

#[derive(Clone, Debug)]
pub struct GroupPlan {
    pub members: usize,
    pub kills: usize,
}

/// What the group is measured on, beside the single node.
#[derive(Clone, Copy)]
enum Phase {
    /// The workload's conversations prepared, then the ingest scenario.
    Ingest,
    /// The sync scenario, when the plan has one.
    Sync,
}

/// Runs `phase` on `system` and returns its rows.
fn phase_rows(
    phase: Phase,
    system: &dyn System,
    plan: &Plan,
    workload: &Workload,
    seed: u64,
    report: &mut Report,
) -> Result<Vec<ResultRow>> {
    let scenarios: &[&str] = match phase {
        Phase::Ingest => {
            system.prepare(&Setup {
                convs: workload.conversations(),
                devices: Vec::new(),
            })?;
            crate::run::ingest_scenario(plan, workload, system, report, seed)?;
            &["ingest"]
        }
        Phase::Sync => {
            let Some(cp) = &plan.sync else {
                return Ok(Vec::new());
            };
            crate::run::catch_up_scenario("sync", 1, cp, plan, workload, system, report, seed)?;
            &["sync", "sync-read"]
        }
    };
    Ok(report
        .results
        .iter()
        .filter(|r| scenarios.contains(&r.scenario.as_str()) && r.system == system.name())
        .cloned()
        .collect())
}

/// Runs `phase` on a replicated `system`, recording its term before and
/// after.
fn replicated_phase_rows(
    phase: Phase,
    system: &dyn System,
    plan: &Plan,
    workload: &Workload,
    seed: u64,
    report: &mut Report,
) -> Result<Vec<ResultRow>> {
    let before = system.term();
    let rows = phase_rows(phase, system, plan, workload, seed, report)?;
    let label = match phase {
        Phase::Ingest => "ingest",
        Phase::Sync => "sync",
    };
    if rows.is_empty() {
        return Ok(rows);
    }
    let terms = TermChanges::new(system.name(), label, before, system.term());
    println!("{}: {label}: {}", system.name(), terms_line(&terms));
    report.cluster_mut().term_changes.push(terms);
    Ok(rows)
}

fn terms_line(terms: &TermChanges) -> String {
    match (terms.term_before, terms.term_after, terms.changes) {
        (Some(b), Some(a), Some(n)) => format!("term {b} -> {a}: {n} elections"),
        _ => "term not read".to_string(),
    }
}

/// How a baseline group is started, when one is wanted: its result, or
/// why it cannot run here.
pub type StartBaseline<'a> = &'a dyn Fn(usize) -> Result<Box<dyn System>>;

#[expect(
    clippy::too_many_arguments,
    reason = "the run's plan, inputs and report, as the other scenario runners take them"
)]
pub fn run(
    gp: &GroupPlan,
    plan: &Plan,
    workload: &Workload,
    base: &Path,
    explicit: Option<&Path>,
    etcd: Option<StartBaseline<'_>>,
    seed: u64,
    report: &mut Report,
) -> Result<()> {
    report.cluster_mut().members = u32::try_from(gp.members).unwrap_or(u32::MAX);
    println!("== group: a single inboxd");
    let single = Inboxd::start(base, explicit, &[])?;
    report.machine.versions.push(single.describe());
    let single_rows = phase_rows(Phase::Ingest, &*single, plan, workload, seed, report)?;
    let single_sync = phase_rows(Phase::Sync, &*single, plan, workload, seed, report)?;
    drop(single);

    let mut etcd_rows = Vec::new();
    let mut etcd_sync = Vec::new();
    if let Some(start) = etcd {
        match start(gp.members) {
            Ok(etcd) => {
                println!("== group: {}", etcd.describe());
                report.machine.versions.push(etcd.describe());
                etcd_rows =
                    replicated_phase_rows(Phase::Ingest, &*etcd, plan, workload, seed, report)?;
                etcd_sync =
                    replicated_phase_rows(Phase::Sync, &*etcd, plan, workload, seed, report)?;
            }
            Err(why) => println!("group: skip etcd: {why}"),
        }
    }

    println!("== group: {} members", gp.members);
    let mut group = Group::start(base, explicit, gp.members)?;
    println!("{}", group.describe());
    report.machine.versions.push(group.describe());
    let group_rows = replicated_phase_rows(Phase::Ingest, &group, plan, workload, seed, report)?;
    let group_sync = replicated_phase_rows(Phase::Sync, &group, plan, workload, seed, report)?;

    let mut times = Vec::with_capacity(gp.kills);
    for kill in 0..gp.kills {
        let term_before = group.term();
        let took = group.fail_over()?;
        let terms = TermChanges::new(
            group.name(),
            &format!("kill {}", kill + 1),
            term_before,
            group.term(),
        );
        println!(
            "{}: kill {}: {}",
            group.name(),
            kill + 1,
            terms_line(&terms)
        );
        report.cluster_mut().term_changes.push(terms);
        println!(
            "{}: kill {} of {}: a write and then a read served after {} ms",
            group.name(),
            kill + 1,
            gp.kills,
            took.as_millis(),
        );
        times.push(took);
    }
    let cluster = report.cluster_mut();
    cluster.fail_over_ms = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    cluster.fail_over_goal_ms = FAIL_OVER_GOAL.as_secs_f64() * 1e3;
    cluster.fail_over_within_goal =
        u32::try_from(times.iter().filter(|t| **t <= FAIL_OVER_GOAL).count()).unwrap_or(u32::MAX);
    println!();
    let size = group.size();
    print!(
        "{}",
        table(Phase::Ingest, &single_rows, &group_rows, &etcd_rows, size)
    );
    if !single_sync.is_empty() {
        println!();
        print!(
            "{}",
            table(Phase::Sync, &single_sync, &group_sync, &etcd_sync, size)
        );
    }
    if !times.is_empty() {
        println!("\n{}", fail_over_line(&times));
    }
    Ok(())
}

/// The distribution of the fail-over times, and how many met the goal.
fn fail_over_line(times: &[Duration]) -> String {
    let mut hist = Latency::new();
    for t in times {
        hist.record(*t);
    }
    let within = times.iter().filter(|t| **t <= FAIL_OVER_GOAL).count();
    format!(
        "fail-over after kill -9 of the leader, until a member served a write and then a read \
         ({} kills): min {} ms, p50 {} ms, p90 {} ms, max {} ms; within {} s: {within} of {}",
        times.len(),
        times.iter().min().copied().unwrap_or_default().as_millis(),
        hist.quantile_us(0.5) / 1000,
        hist.quantile_us(0.9) / 1000,
        times.iter().max().copied().unwrap_or_default().as_millis(),
        FAIL_OVER_GOAL.as_secs(),
        times.len()
    )
}

/// `phase`'s rows of the group against the single node's: ingest by
/// client count, then the goals; sync by row (a page of 100 events read
/// and ACKed, and its read part; every read on the group's leader
/// confirms its leadership first).
fn table(
    phase: Phase,
    single: &[ResultRow],
    group: &[ResultRow],
    etcd: &[ResultRow],
    members: usize,
) -> String {
    let (key, ops, per) = match phase {
        Phase::Ingest => ("clients", "sends/s", "send"),
        Phase::Sync => ("row", "pages/s", "page"),
    };
    let key_of = |r: &ResultRow| match phase {
        Phase::Ingest => r.clients.to_string(),
        Phase::Sync => r.scenario.clone(),
    };
    let mut out = format!(
        "| system | {key} | {ops} | p50 (µs) | p99 (µs) | server CPU µs/{per} | {ops} vs single | p99 vs single |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let cpu = |r: &ResultRow| {
        r.server_cpu_us_per_op
            .map_or("-".to_string(), |us| format!("{us:.1}"))
    };
    let ratio = |a: f64, b: Option<f64>| match b {
        Some(b) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    let mut rows: Vec<(&ResultRow, String)> =
        single.iter().map(|r| (r, r.system.clone())).collect();
    rows.extend(
        etcd.iter()
            .chain(group)
            .map(|r| (r, format!("{} ({members} members, leader)", r.system))),
    );
    for (r, label) in rows {
        let base = single.iter().find(|s| key_of(s) == key_of(r));
        out.push_str(&format!(
            "| {label} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} |\n",
            key_of(r),
            r.ops_per_s,
            r.p50_us,
            r.p99_us,
            cpu(r),
            ratio(r.ops_per_s, base.map(|s| s.ops_per_s)),
            ratio(r.p99_us, base.map(|s| s.p99_us)),
        ));
    }
    for r in group {
        if let Some(e) = etcd.iter().find(|e| key_of(e) == key_of(r)) {
            out.push_str(&format!(
                "\n{} vs {} at {key} {}: {ops} {}x, p99 {}x",
                r.system,
                e.system,
                key_of(r),
                ratio(r.ops_per_s, Some(e.ops_per_s)),
                ratio(r.p99_us, Some(e.p99_us)),
            ));
        }
    }
    if !etcd.is_empty() {
        out.push('\n');
    }
    if matches!(phase, Phase::Ingest) {
        out.push_str(&format!(
            "\ngoals: the group's sends/s >= 0.7x the single node's, its p99 <= 2x, fail-over within {} s\n",
            FAIL_OVER_GOAL.as_secs()
        ));
    }
    out
}
