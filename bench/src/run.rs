//! One harness run: the plan for the chosen mode, the limit probes, each
//! system started, driven through the scenarios and stopped, then the
//! table, the ratios, the plot and the JSON.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::hist::Latency;
use crate::procfs::{self, Measured};
use crate::report::{Report, ResultRow, SoakReport, SoakSample};
use crate::scenarios::{self, per_second, Outcome, SoakPlan};
use crate::systems::{self, limit, Result, System};
use crate::workload::{LongOffline, SoakSet, SyncSet, Workload, WorkloadConfig};
use crate::{fit, machine, svg, Args, Mode};

/// Sizes of one run; `--quick` and `--full` differ only here.
#[derive(Clone, Debug)]
pub struct Plan {
    pub mode: Mode,
    /// The scenarios to run, by name (see [`SCENARIOS`]).
    pub scenarios: Vec<String>,
    pub users: u64,
    pub clients: Vec<usize>,
    pub warmup: Duration,
    pub measure: Duration,
    pub sync: Option<CatchUpPlan>,
    /// `sync-pipelined`: the same load as `sync`, on users of its own, each
    /// device caught up as its clients do.
    pub sync_pipelined: Option<CatchUpPlan>,
    /// `sync-under-ingest`: the devices' backlog; `clients` sync, as many
    /// more connections ingest.
    pub under_ingest: Option<CatchUpPlan>,
    pub soak: Option<SoakPlan>,
    pub storm: Option<CatchUpPlan>,
    pub long_offline: Option<LongOfflinePlan>,
    pub mixed: bool,
    /// `recovery`: fill the system to this many bytes, then kill -9.
    pub recovery_bytes: Option<u64>,
    pub limit_measure: Duration,
    /// `ingest`: idle connections subscribed to hints, held while it runs
    /// (see [`System::hold_subscribers`]).
    pub idle_subscribers: u32,
    pub preload_threads: usize,
    pub large_group: Option<crate::large_group::LargeGroupPlan>,
}

/// Every scenario the harness has, in the order a run goes through them.
pub const SCENARIOS: [&str; 10] = [
    "ingest",
    "sync",
    "sync-pipelined",
    "sync-under-ingest",
    "reconnect-storm",
    "long-offline",
    "mixed",
    "recovery",
    "large-group",
    "soak",
];

/// The scenarios of a run: those named (checked against [`SCENARIOS`]),
/// else the mode's: `quick` ingest and the two syncs, `full` all but the soak.
pub fn chosen_scenarios(mode: Mode, named: &[String]) -> Result<Vec<String>> {
    if let Some(unknown) = named.iter().find(|n| !SCENARIOS.contains(&n.as_str())) {
        return Err(format!(
            "unknown scenario {unknown:?}; known: {}",
            SCENARIOS.join(", ")
        )
        .into());
    }
    let chosen: Vec<String> = if named.is_empty() {
        match mode {
            Mode::Quick => vec!["ingest".into(), "sync".into(), "sync-pipelined".into()],
            Mode::Full => SCENARIOS
                .iter()
                .filter(|s| **s != "soak")
                .map(|s| (*s).to_string())
                .collect(),
        }
    } else {
        // In the harness's order, each once.
        SCENARIOS
            .iter()
            .filter(|s| named.iter().any(|n| n == *s))
            .map(|s| (*s).to_string())
            .collect()
    };
    Ok(chosen)
}

#[derive(Clone, Debug)]
pub struct LongOfflinePlan {
    pub groups: u32,
    pub group_members: u32,
    pub group_msgs: u32,
    pub direct_convs: u32,
    pub direct_msgs: u32,
    pub per_conv: u32,
    /// The devices' ACK cadence ([`crate::systems::DeviceCursor::ack_every`]).
    pub ack_every: u32,
}

#[derive(Clone, Debug)]
pub struct CatchUpPlan {
    pub users: u32,
    pub devices_per_user: u32,
    pub backlog: u32,
    pub clients: usize,
    pub page: u32,
    /// Each device catches up as its clients do (`Conn::catch_up`), not
    /// page after page; pages are then counted, not timed one by one.
    pub pipelined: bool,
}

impl Plan {
    pub fn new(args: &Args) -> Result<Self> {
        let mode = if args.full { Mode::Full } else { Mode::Quick };
        let quick = mode == Mode::Quick;
        let scenarios = chosen_scenarios(mode, &args.scenarios)?;
        let runs = |name: &str| scenarios.iter().any(|s| s == name);
        let clients = if args.clients.is_empty() {
            vec![1, 16, 128]
        } else {
            args.clients.clone()
        };
        let measure = args.seconds.unwrap_or(if quick { 1.0 } else { 10.0 });
        let sync_plan = |pipelined| CatchUpPlan {
            users: args.sync_users.unwrap_or(if quick { 64 } else { 400 }),
            devices_per_user: 4,
            backlog: args
                .sync_backlog
                .unwrap_or(if quick { 3_000 } else { 1_000 }),
            clients: 16,
            page: 100,
            pipelined,
        };
        Ok(Self {
            mode,
            users: args.users.unwrap_or(if quick { 2_000 } else { 20_000 }),
            clients,
            warmup: Duration::from_millis(if quick { 250 } else { 1_000 }),
            measure: Duration::from_secs_f64(measure.max(0.1)),
            sync: runs("sync").then_some(sync_plan(false)),
            sync_pipelined: runs("sync-pipelined").then_some(sync_plan(true)),
            // Full pages for a window of a few seconds at a few thousand
            // pages a second: users x 4 devices x 10 pages.
            under_ingest: runs("sync-under-ingest").then_some(CatchUpPlan {
                users: if quick { 200 } else { 400 },
                devices_per_user: 4,
                backlog: 1_000,
                clients: 16,
                page: 100,
                pipelined: false,
            }),
            soak: runs("soak").then_some(SoakPlan {
                messages: args.soak_messages,
                clients: 16,
                per_conv_batch: 10,
                page: 100,
                sample_every: args.soak_sample_every.max(1),
                compact_every: Duration::from_secs(1),
            }),
            storm: runs("reconnect-storm").then_some(CatchUpPlan {
                users: 2_500,
                devices_per_user: 4,
                backlog: 50,
                clients: 128,
                page: 100,
                pipelined: false,
            }),
            long_offline: runs("long-offline").then_some(LongOfflinePlan {
                groups: 16,
                group_members: 20,
                group_msgs: 32_000,
                direct_convs: 40,
                direct_msgs: 800,
                per_conv: 20,
                ack_every: args.catch_up_ack_every,
            }),
            mixed: runs("mixed"),
            recovery_bytes: runs("recovery")
                .then(|| (args.recovery_gib * f64::from(1u32 << 30)) as u64),
            limit_measure: Duration::from_millis(if quick { 1_000 } else { 5_000 }),
            idle_subscribers: args.idle_subscribers,
            preload_threads: 4,
            // The goals' sizes: 10,000 members (full), 2,000 (quick).
            large_group: runs("large-group").then_some(crate::large_group::LargeGroupPlan {
                members: args
                    .group_size
                    .unwrap_or(if quick { 2_000 } else { 10_000 }),
                messages: 1_000,
                ingest_clients: 16,
            }),
            scenarios,
        })
    }

    pub fn runs(&self, scenario: &str) -> bool {
        self.scenarios.iter().any(|s| s == scenario)
    }
}

/// Soak conversations (each between two users of their own) and devices
/// per user.
const SOAK_PAIRS: u32 = 400;
const SOAK_DEVICES_PER_USER: u32 = 2;

/// inboxd's flags for the soak: events ACKed by every device are
/// reclaimable at once, so compaction has work from the first pass.
const INBOXD_SOAK_ARGS: [&str; 2] = ["--safety-window-s", "0"];

/// CPU per operation of a window, from the ticks it took, and whose.
fn cpu_per_op(ticks: Option<u64>, ops: u64, measured: Option<Measured>) -> Option<(f64, Measured)> {
    let us = procfs::cpu_us_per_op(0, ticks?, procfs::clock_ticks_per_s(), ops)?;
    Some((us, measured?))
}

fn outcome_cpu(out: &Outcome, measured: Option<Measured>) -> Option<(f64, Measured)> {
    cpu_per_op(out.cpu_ticks, out.ops, measured)
}

/// The harness's own CPU per operation over the window, for a system
/// with a server of its own: what its client threads cost the machine
/// beside the server (an embedded system's figure already is the
/// harness's).
fn harness_cpu(out: &Outcome, measured: Option<Measured>) -> Option<f64> {
    match measured? {
        Measured::Server(_) => {
            procfs::cpu_us_per_op(0, out.harness_ticks?, procfs::clock_ticks_per_s(), out.ops)
        }
        Measured::Harness => None,
    }
}

/// The harness's CPU as printed after the server's.
fn harness_note(us: Option<f64>) -> String {
    us.map_or_else(String::new, |us| format!(", harness CPU {us:.1} µs/op"))
}

/// The CPU column as printed beside a scenario's line.
fn cpu_note(cpu: Option<(f64, Measured)>) -> String {
    match cpu {
        Some((us, Measured::Server(_))) => format!(", server CPU {us:.1} µs/op"),
        Some((us, Measured::Harness)) => format!(", harness CPU {us:.1} µs/op"),
        None => String::new(),
    }
}

const SYSTEMS: [&str; 7] = [
    "limit",
    "inboxd",
    "mariadb",
    "redis",
    "redis-everysec",
    "rocksdb",
    "etcd",
];

/// Starts etcd as a group of `members` on loopback, for `--cluster`.
#[cfg(feature = "etcd")]
fn start_etcd_group(base: &Path, members: usize) -> Result<Box<dyn System>> {
    let Some(binary) = systems::etcd::installed() else {
        return Err("not installed (bench/scripts/install-etcd.sh installs it)".into());
    };
    Ok(Box::new(systems::etcd::EtcdGroup::start(
        base, &binary, members,
    )?))
}

#[cfg(not(feature = "etcd"))]
fn start_etcd_group(_base: &Path, _members: usize) -> Result<Box<dyn System>> {
    Err("not built in (build with --features etcd, see docs/BENCHMARKS.md)".into())
}

/// Writes the JSON report where `--json` says, if it does.
fn write_json_report(args: &Args, report: &Report) -> Result<()> {
    if let Some(json) = &args.json {
        if let Some(parent) = json.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        report.write_json(json)?;
        println!("json: {}", json.display());
    }
    Ok(())
}

pub fn run(args: &Args) -> Result<()> {
    if let Some(json) = &args.replot {
        let report: Report = serde_json::from_str(&std::fs::read_to_string(json)?)?;
        let svg_path = args
            .svg
            .clone()
            .unwrap_or_else(|| json.with_extension("svg"));
        write_file(
            &svg_path,
            &svg::plot(&report, &format!("inbox-bench --{}", report.machine.mode)),
        )?;
        println!("plot: {}", svg_path.display());
        return Ok(());
    }
    let plan = Plan::new(args)?;
    for name in &args.systems {
        if !SYSTEMS.contains(&name.as_str()) {
            return Err(format!("unknown system {name:?}; known: {}", SYSTEMS.join(", ")).into());
        }
    }
    let wanted = |name: &str| args.systems.is_empty() || args.systems.iter().any(|s| s == name);
    let base = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir(),
    };
    std::fs::create_dir_all(&base)?;
    let mode_name = match plan.mode {
        Mode::Quick => "quick",
        Mode::Full => "full",
    };
    let started = Instant::now();
    let config = WorkloadConfig {
        users: plan.users,
        ..WorkloadConfig::default()
    };
    let workload = Workload::new(config.clone(), args.seed)?;
    let mut report = Report {
        soak: Vec::new(),
        cluster: None,
        large_group: Vec::new(),
        machine: machine::describe(&base),
        results: Vec::new(),
    };
    report.machine.mode = mode_name.into();
    report.machine.users = config.users;
    report.machine.group_members = config.group_members;
    report.machine.group_send_fraction = config.group_send_fraction;
    report.machine.payload_bytes = config.payload_bytes;
    println!("scenarios: {}", plan.scenarios.join(", "));
    println!(
        "inbox-bench --{mode_name}: {} users, {} groups of {}, {:.0}% group sends, {} B payloads; data in {}",
        config.users,
        workload.groups().len(),
        config.group_members,
        config.group_send_fraction * 100.0,
        config.payload_bytes,
        base.display()
    );
    println!(
        "machine: {} x{} cores, {} GiB, {}",
        report.machine.cpu,
        report.machine.cores,
        report.machine.memory_bytes >> 30,
        report.machine.data_fs
    );

    if let Some(members) = args.cluster {
        let quick = plan.mode == Mode::Quick;
        let group_plan = crate::group::GroupPlan {
            members: usize::from(members),
            kills: args.cluster_kills.unwrap_or(if quick { 5 } else { 20 }),
        };
        let mut plan = plan;
        if args.clients.is_empty() {
            plan.clients = vec![16];
        }
        let start_etcd = |members: usize| start_etcd_group(&base, members);
        // etcd runs when named, or by default when it is built in.
        let etcd_wanted = if args.systems.is_empty() {
            cfg!(feature = "etcd")
        } else {
            wanted("etcd")
        };
        crate::group::run(
            &group_plan,
            &plan,
            &workload,
            &base,
            args.inboxd.as_deref(),
            etcd_wanted.then_some(&start_etcd as crate::group::StartBaseline<'_>),
            args.seed,
            &mut report,
        )?;
        write_json_report(args, &report)?;
        println!("total {:.1} s", started.elapsed().as_secs_f64());
        return Ok(());
    }
    if wanted("limit") {
        run_limit(&plan, &base, &mut report)?;
    }
    if let Some(lg) = &plan.large_group {
        report.large_group = run_large_group(lg, args, &base, &wanted);
        if plan.scenarios.iter().all(|s| s == "large-group") {
            write_json_report(args, &report)?;
            println!("total {:.1} s", started.elapsed().as_secs_f64());
            return Ok(());
        }
    }
    // etcd runs only as a group (`--cluster`); named here, it says so.
    let in_loop = |n: &str| n != "limit" && (n != "etcd" || !args.systems.is_empty()) && wanted(n);
    for name in SYSTEMS.iter().filter(|n| in_loop(n)) {
        if plan.scenarios.iter().all(|s| s == "soak") {
            run_soak(name, &plan, args, &base, &mut report);
            continue;
        }
        let system = match start(name, args, &base, &[]) {
            Ok(system) => system,
            Err(why) => {
                println!("skip {name}: {why}");
                continue;
            }
        };
        println!("== {}", system.describe());
        report.machine.versions.push(system.describe());
        let mut system = system;
        if let Err(e) = run_system(&plan, &workload, &mut *system, &mut report, args.seed) {
            println!("{name}: stopped by an error: {e}");
        }
        if let Some(bytes) = plan.recovery_bytes {
            run_recovery(
                &mut *system,
                &workload,
                bytes,
                plan.preload_threads,
                &mut report,
            );
        }
        drop(system);
        if plan.soak.is_some() {
            run_soak(name, &plan, args, &base, &mut report);
        }
    }

    println!();
    print!("{}", report.table());
    let ratios = report.ratio_table();
    if !ratios.is_empty() {
        println!();
        print!("{ratios}");
    }
    // The goals are about ingest, sync, long-offline and recovery: a soak
    // alone would print a table of "not run".
    if report
        .results
        .iter()
        .any(|r| r.system == "inboxd" && r.scenario != "soak")
    {
        println!();
        print!("{}", report.goal_table());
        println!();
        print!("{}", report.floor_table());
    }
    if !report.soak.is_empty() {
        println!();
        print!("{}", report.soak_table());
    }
    let svg_path = args
        .svg
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench/results/inbox-bench-{mode_name}.svg")));
    write_file(
        &svg_path,
        &svg::plot(&report, &format!("inbox-bench --{mode_name}")),
    )?;
    println!("\nplot: {}", svg_path.display());
    write_json_report(args, &report)?;
    println!("total {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)?;
    Ok(())
}

/// Starts `name` on a fresh data directory; `inboxd_args` are added to
/// inboxd's command line.
fn start(name: &str, args: &Args, base: &Path, inboxd_args: &[&str]) -> Result<Box<dyn System>> {
    match name {
        "inboxd" => systems::inboxd::Inboxd::start(base, args.inboxd.as_deref(), inboxd_args),
        #[cfg(feature = "mariadb")]
        "mariadb" => {
            let Some((server, install_db)) = systems::mariadb::installed() else {
                return Err("not installed (bench/scripts/install-mariadb.sh installs it)".into());
            };
            Ok(Box::new(systems::mariadb::MariaDb::start(
                base,
                &server,
                &install_db,
            )?))
        }
        #[cfg(feature = "redis")]
        "redis" | "redis-everysec" => {
            let Some(binary) = systems::redis::installed() else {
                return Err("not installed (bench/scripts/install-redis.sh installs it)".into());
            };
            let fsync = if name == "redis" {
                systems::redis::Fsync::Always
            } else {
                systems::redis::Fsync::EverySec
            };
            Ok(Box::new(systems::redis::Redis::start(
                base, &binary, fsync,
            )?))
        }
        #[cfg(feature = "rocksdb")]
        "rocksdb" => Ok(Box::new(systems::rocksdb::RocksDb::open(base)?)),
        #[cfg(not(feature = "rocksdb"))]
        "rocksdb" => {
            Err("not built in (build with --features rocksdb, see docs/BENCHMARKS.md)".into())
        }
        "etcd" => Err("runs only as a group, beside inboxd's: --cluster N".into()),
        other => Err(format!("not built in (feature {other:?} is off)").into()),
    }
}

/// Write fan-out costs O(members²) to join and O(members) per message, so
/// inboxd in fan-out mode is compared at the quick size at most.
const FAN_OUT_MEMBERS_MAX: u32 = 2_000;

/// `large-group` for inboxd as a large group, inboxd with every group
/// fanned out, and each wanted baseline; prints its table and returns its
/// rows.
fn run_large_group(
    lg: &crate::large_group::LargeGroupPlan,
    args: &Args,
    base: &Path,
    wanted: &dyn Fn(&str) -> bool,
) -> Vec<crate::large_group::LargeGroupResult> {
    let fan_out = crate::large_group::LargeGroupPlan {
        members: lg.members.min(FAN_OUT_MEMBERS_MAX),
        ..lg.clone()
    };
    let mut runs: Vec<(&str, &str, &[&str], &crate::large_group::LargeGroupPlan)> = vec![
        ("inboxd", "inboxd large group", &[], lg),
        (
            "inboxd",
            "inboxd fan-out",
            &["--large-group-members", "0"],
            &fan_out,
        ),
    ];
    runs.push(("mariadb", "mariadb (fan-out rows)", &[], &fan_out));
    let mut results = Vec::new();
    for (name, label, extra, plan) in runs {
        if !wanted(name) {
            continue;
        }
        let system = match start(name, args, base, extra) {
            Ok(system) => system,
            Err(why) => {
                println!("large-group: skip {label}: {why}");
                continue;
            }
        };
        println!("== large-group: {label}, {} members", plan.members);
        match crate::large_group::run(&*system, label, plan) {
            Ok(r) => results.push(r),
            Err(e) => println!("large-group: {label} stopped by an error: {e}"),
        }
    }
    println!();
    print!("{}", crate::large_group::table(&results));
    results
}

fn run_limit(plan: &Plan, base: &Path, report: &mut Report) -> Result<()> {
    let dir = tempfile::Builder::new().prefix("limit-").tempdir_in(base)?;
    // The last probe runs on three files at once, one thread each: what
    // the disk does when three members of a replicated group on it each
    // make a round durable.
    for (scenario, prepare, what, files) in [
        ("fdatasync-4k", limit::Prepare::Overwrite, "overwrite", 1),
        (
            "fdatasync-4k-prealloc",
            limit::Prepare::Fallocate,
            "fallocated",
            1,
        ),
        (
            "fdatasync-4k-x3",
            limit::Prepare::Overwrite,
            "on three files at once, overwrite; writes of all three",
            3,
        ),
    ] {
        let fsync = limit::synced_writes_parallel(
            dir.path(),
            prepare,
            4096,
            64 << 20,
            plan.limit_measure,
            files,
        )?;
        println!(
            "limit: 4 KiB pwrite+fdatasync ({what}): {:.0}/s, p50 {} µs, p99 {} µs",
            fsync.ops_per_s(),
            fsync.latency.quantile_us(0.5),
            fsync.latency.quantile_us(0.99)
        );
        report.results.push(ResultRow::new(
            scenario,
            "limit",
            files as u32,
            fsync.ops_per_s(),
            &fsync.latency,
            fsync.bytes,
        ));
    }
    // A request about the size of a send of 200 payload bytes, and its
    // reply.
    for (scenario, durable, what) in [
        ("tcp-round-trip", None, "answered at once"),
        (
            "tcp-durable",
            Some(dir.path()),
            "answered after a 4 KiB overwrite + fdatasync",
        ),
    ] {
        let trips = limit::loopback_round_trips(durable, 256, 40, plan.limit_measure)?;
        println!(
            "limit: loopback TCP round trip, one client ({what}): {:.0}/s, p50 {} µs, p99 {} µs, server thread CPU {:.1} µs per request",
            trips.ops_per_s(),
            trips.latency.quantile_us(0.5),
            trips.latency.quantile_us(0.99),
            trips.server_cpu_us_per_op().unwrap_or(f64::NAN)
        );
        let cpu = trips
            .server_cpu_us_per_op()
            .map(|us| (us, Measured::Server(std::process::id())));
        report.results.push(
            ResultRow::new(
                scenario,
                "limit",
                1,
                trips.ops_per_s(),
                &trips.latency,
                trips.bytes,
            )
            .with_cpu(cpu),
        );
    }
    let seq = limit::synced_writes(
        dir.path(),
        limit::Prepare::Fallocate,
        1 << 20,
        2 << 30,
        plan.limit_measure,
    )?;
    println!(
        "limit: 1 MiB pwrite+fdatasync: {:.0} MiB/s, p50 {} µs",
        seq.ops_per_s(),
        seq.latency.quantile_us(0.5)
    );
    report.results.push(ResultRow::new(
        "seq-write-1m",
        "limit",
        1,
        seq.ops_per_s(),
        &seq.latency,
        seq.bytes,
    ));
    Ok(())
}

fn run_system(
    plan: &Plan,
    workload: &Workload,
    system: &mut dyn System,
    report: &mut Report,
    seed: u64,
) -> Result<()> {
    let name = system.name().to_string();
    let measured = system.measured();
    match measured {
        Some(Measured::Server(pid)) => println!("{name}: CPU measured on server pid {pid}"),
        Some(Measured::Harness) => {
            println!(
                "{name}: embedded: CPU measured on the harness process (load generator included)"
            );
        }
        None => println!("{name}: no process to measure CPU on"),
    }
    let needs_population = ["ingest", "sync-under-ingest", "mixed", "recovery"]
        .iter()
        .any(|s| plan.runs(s));
    if needs_population {
        let t = Instant::now();
        let setup = crate::workload::Setup {
            convs: workload.conversations(),
            devices: Vec::new(),
        };
        system.prepare(&setup)?;
        println!(
            "{name}: prepared {} conversations in {:.1} s",
            setup.convs.len(),
            t.elapsed().as_secs_f64()
        );
    }

    if plan.runs("ingest") {
        ingest_scenario(plan, workload, system, report, seed)?;
    }
    // Each on users of its own (set 1, set 3).
    for (scenario, set, sync) in [
        ("sync", 1, &plan.sync),
        ("sync-pipelined", 3, &plan.sync_pipelined),
    ] {
        if let Some(sync) = sync {
            catch_up_scenario(scenario, set, sync, plan, workload, system, report, seed)?;
        }
    }
    if let Some(under) = &plan.under_ingest {
        if let Err(e) = under_ingest_scenario(under, plan, workload, system, report, seed) {
            println!("{name}: sync-under-ingest: skipped: {e}");
        }
    }
    if let Some(storm) = &plan.storm {
        catch_up_scenario(
            "reconnect-storm",
            2,
            storm,
            plan,
            workload,
            system,
            report,
            seed,
        )?;
    }
    if let Some(lo) = &plan.long_offline {
        if let Err(e) = long_offline_scenario(lo, plan, system, report, seed) {
            println!("{name}: long-offline: skipped: {e}");
        }
    }
    if plan.mixed {
        match scenarios::mixed(
            system,
            workload,
            16,
            plan.warmup,
            plan.measure,
            seed ^ 0x3131,
            &measured,
        ) {
            Ok((quiet, busy, passes)) => {
                println!(
                    "{name}: mixed c=16: p99 {} µs without compaction, {} µs with {passes} passes running ({:.0} vs {:.0} sends/s)",
                    quiet.latency.quantile_us(0.99),
                    busy.latency.quantile_us(0.99),
                    quiet.ops_per_s(),
                    busy.ops_per_s()
                );
                report.results.push(
                    ResultRow::new(
                        "mixed",
                        &name,
                        16,
                        quiet.ops_per_s(),
                        &quiet.latency,
                        quiet.bytes,
                    )
                    .with_cpu(outcome_cpu(&quiet, measured)),
                );
                report.results.push(
                    ResultRow::new(
                        "mixed-compacting",
                        &name,
                        16,
                        busy.ops_per_s(),
                        &busy.latency,
                        busy.bytes,
                    )
                    .with_cpu(outcome_cpu(&busy, measured)),
                );
            }
            Err(e) => println!("{name}: mixed: skipped: {e}"),
        }
    }
    println!(
        "{name}: data on disk {:.1} MiB",
        system.data_bytes() as f64 / f64::from(1u32 << 20)
    );
    Ok(())
}

/// Each member's CPU per operation over `out`'s window.
fn member_cpu(
    members: &[systems::MemberPid],
    out: &Outcome,
    scenario: &str,
    system: &str,
    clients: u32,
) -> Vec<crate::report::MemberCpu> {
    members
        .iter()
        .zip(&out.member_ticks)
        .map(|(m, ticks)| crate::report::MemberCpu {
            system: system.to_string(),
            scenario: scenario.to_string(),
            clients,
            member: m.member,
            role: if m.leader { "leader" } else { "follower" }.to_string(),
            cpu_us_per_op: ticks
                .and_then(|t| procfs::cpu_us_per_op(0, t, procfs::clock_ticks_per_s(), out.ops)),
        })
        .collect()
}

pub(crate) fn ingest_scenario(
    plan: &Plan,
    workload: &Workload,
    system: &dyn System,
    report: &mut Report,
    seed: u64,
) -> Result<()> {
    let name = system.name().to_string();
    let measured = system.measured();
    let members = system.member_pids();
    let meter = scenarios::MembersMeter {
        measured,
        pids: members.iter().map(|m| m.pid).collect(),
    };
    // Above every uid of the population, so no send reaches them.
    let idle = system.hold_subscribers(plan.idle_subscribers, 1 << 40)?;
    if idle.is_some() {
        println!(
            "{name}: ingest: {} idle connections subscribed to hints held open",
            plan.idle_subscribers
        );
    }
    for (i, &clients) in plan.clients.iter().enumerate() {
        let run = seed.wrapping_mul(31).wrapping_add(i as u64 + 1);
        let before = system.write_counters();
        let path_before = system.commit_path();
        let conflicts_before = system.conflicts();
        let out = scenarios::ingest(
            system,
            workload,
            clients,
            plan.warmup,
            plan.measure,
            run,
            &meter,
        )?;
        let clients_u32 = u32::try_from(clients).unwrap_or(u32::MAX);
        if let Some((a, b)) = before.zip(system.write_counters()) {
            // Includes the warm-up, so divide by everything that was sent.
            let fsyncs = b.fsyncs - a.fsyncs;
            let batches = b.write_batches - a.write_batches;
            match (b.fsync_latency_us_sum - a.fsync_latency_us_sum).checked_div(fsyncs) {
                Some(mean_us) => println!(
                    "{name}: ingest c={clients}: {batches} write batches, {fsyncs} fsyncs, mean fsync {mean_us} µs"
                ),
                None => println!("{name}: ingest c={clients}: {batches} write batches"),
            }
        }
        if let Some((a, b)) = path_before.zip(system.commit_path()) {
            // Includes the warm-up, as the write counters do.
            let row = b.window(&a, &name, clients_u32);
            println!("{name}: ingest c={clients}: commit path: {}", row.line());
            report.cluster_mut().commit_path.push(row);
        }
        if let Some((a, b)) = conflicts_before.zip(system.conflicts()) {
            // Includes the warm-up, as the write counters do.
            println!(
                "{name}: ingest c={clients}: {} transactions tried again after a lost compare",
                b - a
            );
            report
                .cluster_mut()
                .retried_transactions
                .push(crate::report::RetriedTransactions {
                    system: name.clone(),
                    clients: clients_u32,
                    retried: b - a,
                });
        }
        if !members.is_empty() {
            let cpu = member_cpu(&members, &out, "ingest", &name, clients_u32);
            println!(
                "{name}: ingest c={clients}: server CPU per send by member: {}",
                cpu.iter()
                    .map(|m| format!(
                        "{} ({}) {}",
                        m.member,
                        m.role,
                        m.cpu_us_per_op
                            .map_or_else(|| "n/a".to_string(), |us| format!("{us:.1} µs"))
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            report.cluster_mut().member_cpu.extend(cpu);
        }
        let cpu = outcome_cpu(&out, measured);
        let harness = harness_cpu(&out, measured);
        println!(
            "{name}: ingest c={clients}: {} sends, {:.0} sends/s, {:.0} events/s, p50 {} µs, p99 {} µs{}{}",
            out.latency.count(),
            out.ops_per_s(),
            out.events_per_s(),
            out.latency.quantile_us(0.5),
            out.latency.quantile_us(0.99),
            cpu_note(cpu),
            harness_note(harness)
        );
        let clients = clients_u32;
        report.results.push(
            ResultRow::new(
                "ingest",
                &name,
                clients,
                out.ops_per_s(),
                &out.latency,
                out.bytes,
            )
            .with_cpu(cpu)
            .with_harness_cpu(harness),
        );
        // The same window per fan-out event.
        report.results.push(
            ResultRow::new(
                "ingest-events",
                &name,
                clients,
                out.events_per_s(),
                &out.latency,
                out.bytes,
            )
            .with_cpu(cpu_per_op(out.cpu_ticks, out.events, measured)),
        );
    }
    if system.data_bytes() == 0 {
        // Nothing reached the disk: whatever acknowledged those sends, it
        // was not an fsync. Say so loudly rather than print fast figures.
        let warning = format!(
            "WARNING: {name}'s data directory is still empty after ingest: it does not write to disk, so its figures are NOT durable"
        );
        println!("{warning}");
        report.machine.versions.push(warning);
    }
    Ok(())
}

/// `sync-under-ingest`: the backlog of set 4 caught up by `cp.clients`
/// connections while as many others run `ingest`.
fn under_ingest_scenario(
    cp: &CatchUpPlan,
    plan: &Plan,
    workload: &Workload,
    system: &dyn System,
    report: &mut Report,
    seed: u64,
) -> Result<()> {
    let name = system.name().to_string();
    let measured = system.measured();
    let sync_set = SyncSet::new(4, cp.users, cp.devices_per_user, cp.backlog);
    system.prepare(&sync_set.setup())?;
    let sends = sync_set.backlog_sends();
    let payload = |n: u64| workload.payload_at(n.wrapping_mul(7919));
    let took = scenarios::preload(system, &sends, &payload, plan.preload_threads, 50, seed ^ 4)?;
    println!(
        "{name}: sync-under-ingest: preloaded {} sends ({} events per user) in {:.1} s",
        sends.len(),
        cp.backlog,
        took.as_secs_f64()
    );
    let devices: Vec<_> = sync_set.devices().collect();
    let ingest_clients = cp.clients;
    let out = scenarios::sync_under_ingest(
        system,
        workload,
        &devices,
        cp.clients,
        ingest_clients,
        cp.page,
        plan.warmup,
        plan.measure,
        seed ^ 0x5151,
        &measured,
    )?;
    let (sync, ingest) = (&out.sync, &out.ingest);
    // One window, two loads: CPU per operation counts pages and sends.
    let cpu = cpu_per_op(sync.cpu_ticks, sync.ops + ingest.ops, measured);
    println!(
        "{name}: sync-under-ingest: {} sync + {ingest_clients} ingest connections for {:.2} s{}: {:.0} pages/s ({:.0} events/s), page read p99 {} µs (read + ACK p99 {} µs), beside {:.0} sends/s (send p99 {} µs){}",
        cp.clients,
        sync.elapsed.as_secs_f64(),
        if out.backlog_ran_out { " (backlog ran out: window closed early)" } else { "" },
        sync.ops_per_s(),
        sync.events_per_s(),
        sync.read_latency.quantile_us(0.99),
        sync.latency.quantile_us(0.99),
        ingest.ops_per_s(),
        ingest.latency.quantile_us(0.99),
        cpu_note(cpu).replace("µs/op", "µs per page or send")
    );
    let clients = u32::try_from(cp.clients).unwrap_or(u32::MAX);
    for (row, outcome, latency) in [
        ("sync-under-ingest", sync, &sync.latency),
        ("sync-under-ingest-read", sync, &sync.read_latency),
        ("sync-under-ingest-sends", ingest, &ingest.latency),
    ] {
        report.results.push(
            ResultRow::new(
                row,
                &name,
                clients,
                outcome.ops_per_s(),
                latency,
                outcome.bytes,
            )
            .with_cpu(cpu),
        );
    }
    Ok(())
}

/// `soak`: a fresh instance of `name`, sent `plan.soak.messages` messages
/// with every device syncing after each batch, its memory sampled.
fn run_soak(name: &str, plan: &Plan, args: &Args, base: &Path, report: &mut Report) {
    let Some(sp) = &plan.soak else {
        return;
    };
    let system = match start(name, args, base, &INBOXD_SOAK_ARGS) {
        Ok(system) => system,
        Err(why) => {
            println!("skip soak on {name}: {why}");
            return;
        }
    };
    println!("== soak: {}", system.describe());
    match soak_scenario(sp, &*system, args.seed) {
        Ok((soak, row)) => {
            report.soak.push(soak);
            report.results.push(row);
        }
        Err(e) => println!("{name}: soak: stopped by an error: {e}"),
    }
}

fn soak_scenario(sp: &SoakPlan, system: &dyn System, seed: u64) -> Result<(SoakReport, ResultRow)> {
    let name = system.name().to_string();
    let Some(measured) = system.measured() else {
        return Err("no process to sample memory on".into());
    };
    let set = SoakSet::new(5, SOAK_PAIRS, SOAK_DEVICES_PER_USER);
    system.prepare(&set.setup())?;
    let workload = Workload::new(
        WorkloadConfig {
            users: 1_000,
            ..WorkloadConfig::default()
        },
        seed,
    )?;
    let payload = |n: u64| workload.payload_at(n.wrapping_mul(7919));
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut sample = |sent: u64| -> Result<()> {
        let holdings = system.holdings();
        let rss = measured
            .rss_anon_bytes()
            .ok_or("cannot read RssAnon of the measured process")?;
        let mut s = SoakSample {
            messages_sent: sent,
            messages_retained: holdings.map_or(sent, |h| h.messages),
            events_live: holdings.map(|h| h.events_live),
            rss_anon_bytes: rss,
            seconds: started.elapsed().as_secs_f64(),
            memory: Vec::new(),
            memory_walk_us: None,
            memory_longest_hold_us: None,
        };
        if let Some((structures, walk, hold)) = system.memory() {
            s.memory = structures;
            s.memory_walk_us = Some(walk);
            s.memory_longest_hold_us = Some(hold);
        }
        let top: Vec<String> = s
            .memory
            .iter()
            .filter(|m| inbox_server::heap::on_heap(&m.structure) && m.allocated >= 1 << 20)
            .map(|m| {
                format!(
                    "{} {:.1}",
                    m.structure,
                    m.allocated as f64 / f64::from(1u32 << 20)
                )
            })
            .collect();
        if !top.is_empty() {
            println!(
                "{name}: soak: allocated MiB: {} (walk {} µs, longest lock hold {} µs)",
                top.join(", "),
                s.memory_walk_us.unwrap_or_default(),
                s.memory_longest_hold_us.unwrap_or_default()
            );
        }
        println!(
            "{name}: soak: {} sent, {} retained, {} live events, RssAnon {:.1} MiB, {:.0} s",
            s.messages_sent,
            s.messages_retained,
            s.events_live.map_or_else(|| "-".into(), |e| e.to_string()),
            rss as f64 / f64::from(1u32 << 20),
            s.seconds
        );
        samples.push(s);
        Ok(())
    };
    let out = scenarios::soak(system, &set, sp, &payload, &measured, &mut sample)?;
    let compaction = match (out.compaction_passes, name.as_str()) {
        (Some(passes), _) => format!(
            "COMPACT requested every {:.0} s ({passes} passes), safety window 0 s",
            sp.compact_every.as_secs_f64()
        ),
        (None, "rocksdb") => {
            "none that reclaims ACKed events (RocksDB's own LSM compaction runs)".into()
        }
        (None, _) => "none: ACKed events are kept".into(),
    };
    // The sample taken before the first message is the empty server: its
    // connections, buffers and pools are not there yet, so it would bend
    // the line. It stays in the report, out of the fit.
    let fitted: Vec<&SoakSample> = samples.iter().filter(|s| s.messages_sent > 0).collect();
    let (messages, rss): (Vec<f64>, Vec<f64>) = fitted
        .iter()
        .map(|s| (s.messages_retained as f64, s.rss_anon_bytes as f64))
        .unzip();
    let per_message = fit::slope(&messages, &rss);
    let live: Option<Vec<f64>> = fitted
        .iter()
        .map(|s| s.events_live.map(|e| e as f64))
        .collect();
    let per_live = live.as_deref().and_then(|l| fit::slope(l, &rss));
    let both = live
        .as_deref()
        .and_then(|l| fit::slopes_of_two(&messages, l, &rss));
    let sent = out.sends.events;
    let soak = SoakReport {
        system: name.clone(),
        rss_of: measured.label().into(),
        compaction,
        messages: sent,
        seconds: out.elapsed.as_secs_f64(),
        samples,
        rss_bytes_per_message: per_message,
        rss_bytes_per_million_messages: per_message.map(|b| b * 1e6),
        rss_bytes_per_live_event: per_live,
        fit_bytes_per_message: both.map(|(b, _)| b),
        fit_bytes_per_live_event: both.map(|(_, c)| c),
    };
    let cpu = cpu_per_op(out.cpu_ticks, sent, Some(measured));
    println!(
        "{name}: soak: {sent} messages in {:.1} s ({:.0}/s), {} pages (p99 {} µs){}",
        out.elapsed.as_secs_f64(),
        per_second(sent, out.elapsed),
        out.pages.ops,
        out.pages.latency.quantile_us(0.99),
        cpu_note(cpu).replace("µs/op", "µs per message")
    );
    // Rate and CPU per message; the latency is a whole batch's send.
    let row = ResultRow::new(
        "soak",
        &name,
        u32::try_from(sp.clients).unwrap_or(u32::MAX),
        per_second(sent, out.elapsed),
        &out.sends.latency,
        out.sends.bytes,
    )
    .with_cpu(cpu);
    Ok((soak, row))
}

fn long_offline_scenario(
    lo: &LongOfflinePlan,
    plan: &Plan,
    system: &mut dyn System,
    report: &mut Report,
    seed: u64,
) -> Result<()> {
    let name = system.name().to_string();
    let scenario = LongOffline::new(
        lo.groups,
        lo.group_members,
        lo.group_msgs,
        lo.direct_convs,
        lo.direct_msgs,
    );
    system.prepare(&scenario.setup())?;
    let sends = scenario.sends(seed);
    let workload_payload = Workload::new(
        WorkloadConfig {
            users: 1_000,
            ..WorkloadConfig::default()
        },
        seed,
    )?;
    let payload = |n: u64| workload_payload.payload_at(n.wrapping_mul(7919));
    let took = scenarios::preload(
        system,
        &sends,
        &payload,
        plan.preload_threads,
        50,
        seed ^ 0x10,
    )?;
    println!(
        "{name}: long-offline: preloaded {} group + {} one-to-one messages in {:.1} s",
        lo.group_msgs,
        lo.direct_msgs,
        took.as_secs_f64()
    );
    let out = scenarios::long_offline(system, scenario.user, lo.per_conv, 100, lo.ack_every)?;
    println!(
        "{name}: long-offline: first screen ({} convs, {} messages, {} B) in {:.1} ms; caught up {} events in {} pages, total {:.1} ms, {} B",
        out.screen.convs,
        out.screen.messages,
        out.screen.bytes,
        out.first_screen.as_secs_f64() * 1e3,
        out.events,
        out.pages,
        out.total.as_secs_f64() * 1e3,
        out.bytes
    );
    let per_event = |bytes: u64, events: u64| bytes as f64 / events.max(1) as f64;
    println!(
        "{name}: long-offline: events on the wire: {:.1} B per event with summaries; {:.1} B per event without ({} events replayed by a second device asking for ids only)",
        per_event(out.bytes - out.screen.bytes, out.events),
        per_event(out.bare_bytes, out.bare_events),
        out.bare_events
    );
    for (row, took, bytes) in [
        (
            "long-offline-first-screen",
            out.first_screen,
            out.screen.bytes,
        ),
        ("long-offline-total", out.total, out.bytes),
    ] {
        let mut latency = Latency::new();
        latency.record(took);
        report.results.push(ResultRow::new(
            row,
            &name,
            1,
            per_second(1, took),
            &latency,
            bytes,
        ));
    }
    // The other way back: a device that asks for at most one event of
    // replay is told to reset and installs a snapshot instead.
    let by_snapshot = system
        .connect()
        .and_then(|mut conn| conn.catch_up_by_snapshot(scenario.user, 2));
    match by_snapshot {
        Ok(s) => {
            println!(
                "{name}: long-offline by snapshot (max_replay 1): first page ({} B) in {:.1} ms; {} pages ({} convs, {} messages) installed in {:.1} ms, {} B",
                s.first_page_bytes,
                s.first_screen.as_secs_f64() * 1e3,
                s.pages,
                s.convs,
                s.messages,
                s.total.as_secs_f64() * 1e3,
                s.bytes
            );
            for (row, took, bytes) in [
                (
                    "long-offline-snapshot-first-screen",
                    s.first_screen,
                    s.first_page_bytes,
                ),
                ("long-offline-snapshot-total", s.total, s.bytes),
            ] {
                let mut latency = Latency::new();
                latency.record(took);
                report.results.push(ResultRow::new(
                    row,
                    &name,
                    1,
                    per_second(1, took),
                    &latency,
                    bytes,
                ));
            }
        }
        Err(e) => println!("{name}: long-offline by snapshot: skipped: {e}"),
    }
    // The same first screen right after a restart, with the data files
    // dropped from the page cache: what the first user after a deploy or
    // a failover waits for.
    match first_screen_cold(system, scenario.user, lo.per_conv) {
        Ok((restart, took, screen)) => {
            println!(
                "{name}: long-offline first screen after a restart with cold caches ({} convs, {} messages, {} B) in {:.1} ms; the restart took {:.0} ms",
                screen.convs,
                screen.messages,
                screen.bytes,
                took.as_secs_f64() * 1e3,
                restart.as_secs_f64() * 1e3
            );
            let mut latency = Latency::new();
            latency.record(took);
            report.results.push(ResultRow::new(
                "long-offline-first-screen-cold",
                &name,
                1,
                per_second(1, took),
                &latency,
                screen.bytes,
            ));
        }
        Err(e) => println!("{name}: long-offline first screen with cold caches: skipped: {e}"),
    }
    Ok(())
}

/// Restarts `system` with cold caches and times one first screen of
/// `user`: (restart, first screen, what it fetched).
fn first_screen_cold(
    system: &mut dyn System,
    user: crate::workload::Uid,
    per_conv: u32,
) -> Result<(Duration, Duration, crate::systems::Screen)> {
    let restart = system.restart_cold()?;
    let mut conn = system.connect()?;
    let start = Instant::now();
    let screen = conn.first_screen(user, per_conv)?;
    Ok((restart, start.elapsed(), screen))
}

#[expect(
    clippy::too_many_arguments,
    reason = "one call site per scenario; a struct would only rename them"
)]
pub(crate) fn catch_up_scenario(
    scenario: &str,
    set: u32,
    cp: &CatchUpPlan,
    plan: &Plan,
    workload: &Workload,
    system: &dyn System,
    report: &mut Report,
    seed: u64,
) -> Result<()> {
    let name = system.name().to_string();
    let sync_set = SyncSet::new(set, cp.users, cp.devices_per_user, cp.backlog);
    system.prepare(&sync_set.setup())?;
    let sends = sync_set.backlog_sends();
    let payload = |n: u64| workload.payload_at(n.wrapping_mul(7919));
    let rss_before = system.measured().and_then(|m| m.rss_anon_bytes());
    let took = scenarios::preload(
        system,
        &sends,
        &payload,
        plan.preload_threads,
        50,
        seed ^ u64::from(set),
    )?;
    println!(
        "{name}: {scenario}: preloaded {} sends ({} events per user) in {:.1} s",
        sends.len(),
        cp.backlog,
        took.as_secs_f64()
    );
    if scenario == "sync" {
        print_backlog_memory(&name, system, rss_before);
    }
    let devices: Vec<_> = sync_set.devices().collect();
    let measured = system.measured();
    let out = scenarios::catch_up(system, &devices, cp, &measured)?;
    let cpu = outcome_cpu(&out, measured);
    let harness = harness_cpu(&out, measured);
    let timed = if cp.pipelined {
        format!(
            "device catch-up p50 {} µs, p99 {} µs",
            out.latency.quantile_us(0.5),
            out.latency.quantile_us(0.99),
        )
    } else {
        format!(
            "page p50 {} µs, p99 {} µs (read part p99 {} µs)",
            out.latency.quantile_us(0.5),
            out.latency.quantile_us(0.99),
            out.read_latency.quantile_us(0.99),
        )
    };
    println!(
        "{name}: {scenario} c={}: {} devices caught up in {:.2} s, {:.0} pages/s, {:.0} events/s, {timed}{}{}",
        cp.clients,
        devices.len(),
        out.elapsed.as_secs_f64(),
        out.ops_per_s(),
        out.events_per_s(),
        cpu_note(cpu).replace("µs/op", "µs per page"),
        harness_note(harness).replace("µs/op", "µs per page")
    );
    let clients = u32::try_from(cp.clients).unwrap_or(u32::MAX);
    report.results.push(
        ResultRow::new(
            scenario,
            &name,
            clients,
            out.ops_per_s(),
            &out.latency,
            out.bytes,
        )
        .with_cpu(cpu)
        .with_harness_cpu(harness),
    );
    if scenario == "sync" {
        report.results.push(
            ResultRow::new(
                "sync-read",
                &name,
                clients,
                out.ops_per_s(),
                &out.read_latency,
                out.bytes,
            )
            .with_cpu(cpu),
        );
    }
    if scenario == "reconnect-storm" {
        // Devices per second: the time until all are caught up is
        // devices / ops_per_s; the latency is one page's.
        let mut whole = Latency::new();
        whole.record(out.elapsed);
        report.results.push(ResultRow::new(
            "reconnect-storm-all",
            &name,
            clients,
            per_second(devices.len() as u64, out.elapsed),
            &whole,
            out.bytes,
        ));
    }
    Ok(())
}

/// Prints what the preloaded backlog costs in memory, where the system
/// says how many live events it holds: the server's RssAnon per live
/// event, all of it and its growth over the preload, and its own
/// structures' allocated bytes per live event. The messages behind the
/// events are in it too. RssAnon is sampled every 100 ms for two seconds
/// after the preload: a checkpoint may be encoding a copy of the state
/// then, and the highest sample counts it, the lowest is the backlog
/// alone.
fn print_backlog_memory(name: &str, system: &dyn System, rss_before: Option<u64>) {
    let rss = || system.measured().and_then(|m| m.rss_anon_bytes());
    let mut samples = Vec::new();
    for _ in 0..20 {
        samples.extend(rss());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (Some(before), Some(&low), Some(&high), Some(holdings)) = (
        rss_before,
        samples.iter().min(),
        samples.iter().max(),
        system.holdings(),
    ) else {
        return;
    };
    let events = holdings.events_live.max(1) as f64;
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    let rows = system.memory().map(|(rows, _, _)| rows).unwrap_or_default();
    let structures: Vec<String> = rows
        .iter()
        .filter(|m| inbox_server::heap::on_heap(&m.structure) && m.allocated > 0)
        .map(|m| format!("{} {:.1}", m.structure, m.allocated as f64 / events))
        .collect();
    // The whole heap, as the daemon's allocator counts it: what the
    // structures above leave of it is buffers, queues and requests.
    let heap = rows
        .iter()
        .find(|m| m.structure == "heap")
        .map_or_else(String::new, |h| {
            format!(
                "; heap in use {:.1} B per live event",
                h.live as f64 / events
            )
        });
    let per_event = |bytes: u64| bytes as f64 / events;
    println!(
        "{name}: sync: RssAnon {:.1} -> {:.1} (lowest) .. {:.1} (highest of 20 samples) MiB over {} live events and {} messages: all of it {:.1} .. {:.1} B per live event, grown over the preload {:.1} .. {:.1}; allocated B per live event: {}{heap}",
        mib(before),
        mib(low),
        mib(high),
        holdings.events_live,
        holdings.messages,
        per_event(low),
        per_event(high),
        per_event(low.saturating_sub(before)),
        per_event(high.saturating_sub(before)),
        if structures.is_empty() { "-".into() } else { structures.join(", ") }
    );
}

fn run_recovery(
    system: &mut dyn System,
    workload: &Workload,
    target: u64,
    threads: usize,
    report: &mut Report,
) {
    let name = system.name().to_string();
    match scenarios::fill(system, workload, target, 16 << 10, threads) {
        Ok(took) => println!(
            "{name}: recovery: filled to {:.2} GiB in {:.1} s",
            system.data_bytes() as f64 / f64::from(1u32 << 30),
            took.as_secs_f64()
        ),
        Err(e) => {
            println!("{name}: recovery: skipped: fill failed: {e}");
            return;
        }
    }
    let bytes = system.data_bytes();
    match system.crash_and_restart() {
        Ok(took) => {
            let gib = bytes as f64 / f64::from(1u32 << 30);
            println!(
                "{name}: recovery: kill -9 at {:.2} GiB, serving again after {:.3} s ({:.2} s/GiB)",
                gib,
                took.as_secs_f64(),
                took.as_secs_f64() / gib.max(1e-9)
            );
            let mut latency = Latency::new();
            latency.record(took);
            report.results.push(ResultRow::new(
                "recovery",
                &name,
                0,
                per_second(1, took),
                &latency,
                bytes,
            ));
        }
        Err(e) => println!("{name}: recovery: skipped: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn each_mode_has_its_scenarios_and_the_soak_runs_only_when_named() {
        assert_eq!(
            chosen_scenarios(Mode::Quick, &[]).expect("quick"),
            names(&["ingest", "sync", "sync-pipelined"])
        );
        let full = chosen_scenarios(Mode::Full, &[]).expect("full");
        assert!(full.iter().any(|s| s == "sync-under-ingest"));
        assert!(!full.iter().any(|s| s == "soak"));
        assert_eq!(full.len(), SCENARIOS.len() - 1);
    }

    #[test]
    fn named_scenarios_run_alone_in_the_harness_order_once_each() {
        let chosen = chosen_scenarios(Mode::Quick, &names(&["soak", "sync-under-ingest", "soak"]))
            .expect("known names");
        assert_eq!(chosen, names(&["sync-under-ingest", "soak"]));
        let err = chosen_scenarios(Mode::Full, &names(&["sync", "warp"])).expect_err("unknown");
        assert!(err.to_string().contains("\"warp\""), "{err}");
    }

    #[test]
    fn cpu_per_op_needs_ticks_ops_and_a_process() {
        let server = Some(Measured::Server(1));
        let hz = procfs::clock_ticks_per_s() as f64;
        let (us, of) = cpu_per_op(Some(10), 1_000, server).expect("measured");
        assert!((us - 10.0 * 1e6 / hz / 1_000.0).abs() < 1e-9);
        assert_eq!(of, Measured::Server(1));
        assert_eq!(cpu_per_op(None, 1_000, server), None);
        assert_eq!(cpu_per_op(Some(10), 0, server), None);
        assert_eq!(cpu_per_op(Some(10), 1_000, None), None);
    }

    #[test]
    fn the_harness_share_is_reported_beside_a_server_and_not_for_an_embedded_system() {
        let hz = procfs::clock_ticks_per_s() as f64;
        let out = Outcome {
            ops: 1_000,
            cpu_ticks: Some(10),
            harness_ticks: Some(30),
            ..Outcome::default()
        };
        let us = harness_cpu(&out, Some(Measured::Server(1))).expect("measured");
        assert!((us - 30.0 * 1e6 / hz / 1_000.0).abs() < 1e-9);
        assert_eq!(
            harness_note(Some(us)),
            format!(", harness CPU {us:.1} µs/op")
        );
        // An embedded system's CPU already is the harness's.
        assert_eq!(harness_cpu(&out, Some(Measured::Harness)), None);
        assert_eq!(harness_cpu(&out, None), None);
        let unmeasured = Outcome {
            harness_ticks: None,
            ..out
        };
        assert_eq!(harness_cpu(&unmeasured, Some(Measured::Server(1))), None);
        assert_eq!(harness_note(None), "");
    }
}
