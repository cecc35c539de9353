//! `--cluster N`: inboxd as a replicated group of N members against the
//! single node, side by side in one run, then the group's fail-over.
//!
//! 1. ingest at each client count (16 unless `--clients` says otherwise)
//!    on a single `inboxd`, then on a group of N on the same machine, each
//!    on a fresh data directory with the same population;
//! 2. `kills` times: the leader is killed with SIGKILL and the time until
//!    another member serves a write and then a read is recorded; the killed
//!    member is restarted on its data and must catch up before the next kill.
//!
//! Figures: throughput and p99 of the group against the single node, the
//! leader's CPU per send, and the distribution of fail-over times with how
//! many were within [`FAIL_OVER_GOAL`].

use std::path::Path;
use std::time::Duration;

use crate::hist::Latency;
use crate::run::{outcome_cpu, Plan};
use crate::scenarios::{self, Outcome};
use crate::systems::group::{FailOver, Group};
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

struct Row {
    label: String,
    clients: usize,
    out: Outcome,
    cpu_us: Option<f64>,
}

fn ingest_rows(
    system: &dyn System,
    plan: &Plan,
    workload: &Workload,
    seed: u64,
) -> Result<Vec<Row>> {
    system.prepare(&Setup {
        convs: workload.conversations(),
        devices: Vec::new(),
    })?;
    let measured = system.measured();
    let mut rows = Vec::new();
    for (i, &clients) in plan.clients.iter().enumerate() {
        let run = seed.wrapping_mul(31).wrapping_add(i as u64 + 1);
        let out = scenarios::ingest(
            system,
            workload,
            clients,
            plan.warmup,
            plan.measure,
            run,
            &measured,
        )?;
        let cpu_us = outcome_cpu(&out, measured).map(|(us, _)| us);
        println!(
            "{}: ingest c={clients}: {:.0} sends/s, p50 {} µs, p99 {} µs",
            system.name(),
            out.ops_per_s(),
            out.latency.quantile_us(0.5),
            out.latency.quantile_us(0.99)
        );
        rows.push(Row {
            label: system.name().to_string(),
            clients,
            out,
            cpu_us,
        });
    }
    Ok(rows)
}

pub fn run(
    gp: &GroupPlan,
    plan: &Plan,
    workload: &Workload,
    base: &Path,
    explicit: Option<&Path>,
    seed: u64,
) -> Result<()> {
    println!("== group: a single inboxd");
    let single = Inboxd::start(base, explicit, &[])?;
    let single_rows = ingest_rows(&*single, plan, workload, seed)?;
    drop(single);

    println!("== group: {} members", gp.members);
    let mut group = Group::start(base, explicit, gp.members)?;
    println!("{}", group.describe());
    let group_rows = ingest_rows(&group, plan, workload, seed)?;

    let mut times = Vec::with_capacity(gp.kills);
    for kill in 0..gp.kills {
        let took = group.fail_over()?;
        println!(
            "{}: kill {} of {}: a new leader named after {} ms, a write served after {} ms, \
             write and read after {} ms",
            group.name(),
            kill + 1,
            gp.kills,
            took.elected.as_millis(),
            took.write.as_millis(),
            took.served.as_millis(),
        );
        times.push(took);
    }
    println!();
    print!("{}", table(&single_rows, &group_rows, group.size()));
    if !times.is_empty() {
        println!(
            "\nfail-over after kill -9 of the leader, {} kills (ms):",
            times.len()
        );
        println!(
            "| from the kill until | min | p50 | p90 | max | within {} s |",
            FAIL_OVER_GOAL.as_secs()
        );
        println!("|---|---|---|---|---|---|");
        for (what, pick) in [
            (
                "a member names the new leader",
                (|f: &FailOver| f.elected) as fn(&FailOver) -> Duration,
            ),
            ("a write is served", |f| f.write),
            ("a write and a read are served", |f| f.served),
        ] {
            println!("{}", distribution(what, &times, pick));
        }
    }
    Ok(())
}

/// One row of the fail-over table: the distribution of one of the times.
fn distribution(what: &str, times: &[FailOver], pick: fn(&FailOver) -> Duration) -> String {
    let mut hist = Latency::new();
    for t in times {
        hist.record(pick(t));
    }
    let ms = |d: Duration| d.as_millis();
    let min = times.iter().map(pick).min().unwrap_or_default();
    let max = times.iter().map(pick).max().unwrap_or_default();
    let within = times.iter().filter(|t| pick(t) <= FAIL_OVER_GOAL).count();
    format!(
        "| {what} | {} | {} | {} | {} | {within} of {} |",
        ms(min),
        hist.quantile_us(0.5) / 1000,
        hist.quantile_us(0.9) / 1000,
        ms(max),
        times.len()
    )
}

fn table(single: &[Row], group: &[Row], members: usize) -> String {
    let mut out = String::from(
        "| system | clients | sends/s | p50 (µs) | p99 (µs) | server CPU µs/send | sends/s vs single | p99 vs single |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let cpu = |r: &Row| r.cpu_us.map_or("-".to_string(), |us| format!("{us:.1}"));
    for r in single {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | 1.00 | 1.00 |\n",
            r.label,
            r.clients,
            r.out.ops_per_s(),
            r.out.latency.quantile_us(0.5),
            r.out.latency.quantile_us(0.99),
            cpu(r)
        ));
    }
    for r in group {
        let base = single.iter().find(|s| s.clients == r.clients);
        let ratio = |a: f64, b: Option<f64>| match b {
            Some(b) if b > 0.0 => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        out.push_str(&format!(
            "| {} ({members} members, leader) | {} | {:.0} | {} | {} | {} | {} | {} |\n",
            r.label,
            r.clients,
            r.out.ops_per_s(),
            r.out.latency.quantile_us(0.5),
            r.out.latency.quantile_us(0.99),
            cpu(r),
            ratio(r.out.ops_per_s(), base.map(|s| s.out.ops_per_s())),
            ratio(
                r.out.latency.quantile_us(0.99) as f64,
                base.map(|s| s.out.latency.quantile_us(0.99) as f64)
            ),
        ));
    }
    out.push_str(&format!(
        "\ngoals: the group's sends/s >= 0.7x the single node's, its p99 <= 2x, fail-over within {} s\n",
        FAIL_OVER_GOAL.as_secs()
    ));
    out
}
