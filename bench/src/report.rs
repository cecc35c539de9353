//! The run's report: the machine, one row per (scenario, system, clients),
//! the JSON file, and the table printed to stdout.
//!
//! The JSON shape is fixed (tools read it):
//! `{"machine": {...}, "results": [{"scenario", "system", "clients",
//! "ops_per_s", "p50_us", "p99_us", "p999_us", "bytes",
//! "server_cpu_us_per_op", "cpu_of", "harness_cpu_us_per_op"}],
//! "soak": [...]}`.
//!
//! `server_cpu_us_per_op` is the CPU time (user + system, every thread)
//! the system's process spent in the measured window divided by the
//! operations of the row; `cpu_of` says whose: `"server"`, or `"harness"`
//! for an embedded system, whose work runs on the harness's own threads
//! together with the load generator's. Both are `null` where not measured.
//! `harness_cpu_us_per_op` is the harness's own CPU over the same window
//! per operation, for a system with a server of its own: the machine's
//! other consumer, which a server shares the cores with (`null` for an
//! embedded system, whose figure already is the harness's, and where not
//! measured). `soak` is there only when a soak ran.
//!
//! `cluster` is there only after `--cluster N` ([`ClusterReport`]: the
//! commit path of each ingest run, the CPU per send of each member, the
//! term changes of each phase and the fail-over times), and `large_group`
//! only after the `large-group` scenario (one object per row of its
//! table, [`crate::large_group::LargeGroupResult`]).

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::hist::Latency;
use crate::procfs::Measured;

/// The machine and the run's settings, so figures can be compared later.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub cpu: String,
    pub cores: u32,
    pub memory_bytes: u64,
    pub kernel: String,
    pub os: String,
    /// Filesystem and device the systems' data directories live on.
    pub data_fs: String,
    pub mode: String,
    pub users: u64,
    pub group_members: u32,
    pub group_send_fraction: f64,
    pub payload_bytes: usize,
    pub versions: Vec<String>,
    pub unix_time: u64,
}

/// One measured (scenario, system, concurrency).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResultRow {
    pub scenario: String,
    pub system: String,
    pub clients: u32,
    pub ops_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub bytes: u64,
    #[serde(default)]
    pub server_cpu_us_per_op: Option<f64>,
    #[serde(default)]
    pub cpu_of: Option<String>,
    /// The harness's own CPU per operation over the same window, for a
    /// system with a server of its own (its client threads' share of the
    /// machine).
    #[serde(default)]
    pub harness_cpu_us_per_op: Option<f64>,
}

impl ResultRow {
    pub fn new(
        scenario: &str,
        system: &str,
        clients: u32,
        ops_per_s: f64,
        latency: &Latency,
        bytes: u64,
    ) -> Self {
        let p = latency.percentiles();
        Self {
            scenario: scenario.into(),
            system: system.into(),
            clients,
            ops_per_s,
            p50_us: p.p50_us,
            p99_us: p.p99_us,
            p999_us: p.p999_us,
            bytes,
            server_cpu_us_per_op: None,
            cpu_of: None,
            harness_cpu_us_per_op: None,
        }
    }

    /// Adds the CPU per operation measured for this row, if it was.
    pub fn with_cpu(mut self, cpu: Option<(f64, Measured)>) -> Self {
        if let Some((us, of)) = cpu {
            self.server_cpu_us_per_op = Some(us);
            self.cpu_of = Some(of.label().to_string());
        }
        self
    }

    /// Adds the harness's CPU per operation, if it was measured.
    pub fn with_harness_cpu(mut self, us: Option<f64>) -> Self {
        self.harness_cpu_us_per_op = us;
        self
    }
}

/// The soak: server memory against what the system holds, sampled as
/// messages go in.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SoakReport {
    pub system: String,
    /// Whose memory: `"server"`, or `"harness"` for an embedded system.
    pub rss_of: String,
    /// What ran as compaction during the soak.
    pub compaction: String,
    pub messages: u64,
    pub seconds: f64,
    pub samples: Vec<SoakSample>,
    /// Least-squares slope of anonymous RSS over messages retained, fitted
    /// on the samples taken after the first message (the first sample is
    /// the server before any load).
    pub rss_bytes_per_message: Option<f64>,
    pub rss_bytes_per_million_messages: Option<f64>,
    /// Least-squares slope of anonymous RSS over live events (when the
    /// system counts them), alone.
    pub rss_bytes_per_live_event: Option<f64>,
    /// RSS fitted on both at once: `a + b * messages + c * live events`,
    /// which keeps apart what a retained message and a live event cost
    /// when the two grow together.
    pub fit_bytes_per_message: Option<f64>,
    pub fit_bytes_per_live_event: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SoakSample {
    pub messages_sent: u64,
    /// What the system says it holds; the messages sent when it does not say.
    pub messages_retained: u64,
    pub events_live: Option<u64>,
    pub rss_anon_bytes: u64,
    pub seconds: f64,
    /// The server's own memory breakdown (inboxd's `MEMORY`), when it has
    /// one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory: Vec<StructureBytes>,
    /// What taking the breakdown cost: the whole walk, and its longest
    /// hold of the state lock (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_walk_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_longest_hold_us: Option<u64>,
}

/// One structure of a memory breakdown.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StructureBytes {
    pub structure: String,
    pub live: u64,
    pub allocated: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub machine: Machine,
    pub results: Vec<ResultRow>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub soak: Vec<SoakReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterReport>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub large_group: Vec<crate::large_group::LargeGroupResult>,
}

/// What `--cluster N` measured beside the result rows.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ClusterReport {
    pub members: u32,
    /// One per ingest run of a replicated system with a commit path.
    pub commit_path: Vec<CommitPathRow>,
    /// One per member per ingest run of a replicated system.
    pub member_cpu: Vec<MemberCpu>,
    /// One per phase of each replicated system.
    pub term_changes: Vec<TermChanges>,
    /// One per ingest run of a system whose transactions can lose a
    /// compare (etcd): how many were tried again, warm-up included.
    #[serde(default)]
    pub retried_transactions: Vec<RetriedTransactions>,
    /// From each kill -9 of inboxd's leader until another member served a
    /// write and then a read, in milliseconds, in kill order.
    pub fail_over_ms: Vec<f64>,
    pub fail_over_goal_ms: f64,
    pub fail_over_within_goal: u32,
}

/// A replicated system's commit path over one ingest run, warm-up
/// included (the members' counters cover both): means of that window.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CommitPathRow {
    pub system: String,
    pub clients: u32,
    /// The leader's rounds committed, and the mean from proposal to commit.
    pub rounds_committed: f64,
    pub proposal_to_commit_us: f64,
    /// The followers' appends, their mean entries each, and the mean from
    /// an append's arrival to its being durable: the append cycle.
    pub follower_appends: f64,
    pub entries_per_append: f64,
    pub follower_append_to_durable_us: f64,
    /// The leader's appends of its own rounds, mean until durable.
    pub leader_append_to_durable_us: f64,
}

/// Transactions tried again in one ingest run (see [`ClusterReport`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RetriedTransactions {
    pub system: String,
    pub clients: u32,
    pub retried: u64,
}

/// The CPU one member spent per operation of a measured window.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MemberCpu {
    pub system: String,
    pub scenario: String,
    pub clients: u32,
    /// The member's number in the group, from 1.
    pub member: u32,
    /// `"leader"` or `"follower"`, as it was when the run started.
    pub role: String,
    pub cpu_us_per_op: Option<f64>,
}

/// A replicated system's raft term before and after one phase; `changes`
/// is how many terms began in it (each is an election, won or not).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TermChanges {
    pub system: String,
    /// `ingest`, `sync` or `kill N`.
    pub phase: String,
    pub term_before: Option<u64>,
    pub term_after: Option<u64>,
    pub changes: Option<u64>,
}

impl TermChanges {
    pub fn new(system: &str, phase: &str, before: Option<u64>, after: Option<u64>) -> Self {
        Self {
            system: system.to_string(),
            phase: phase.to_string(),
            term_before: before,
            term_after: after,
            changes: after.zip(before).and_then(|(a, b)| a.checked_sub(b)),
        }
    }
}

impl Report {
    /// The `--cluster` part, started on first use.
    pub fn cluster_mut(&mut self) -> &mut ClusterReport {
        self.cluster.get_or_insert_with(ClusterReport::default)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_json() + "\n")
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<26} {:<15} {:>7} {:>12} {:>9} {:>9} {:>9} {:>12} {:>12}",
            "scenario",
            "system",
            "clients",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "p999 µs",
            "bytes",
            "cpu µs/op"
        );
        for r in &self.results {
            let _ = writeln!(
                out,
                "{:<26} {:<15} {:>7} {:>12.1} {:>9.0} {:>9.0} {:>9.0} {:>12} {:>12}",
                r.scenario,
                r.system,
                r.clients,
                r.ops_per_s,
                r.p50_us,
                r.p99_us,
                r.p999_us,
                r.bytes,
                fmt_cpu(r)
            );
        }
        if self
            .results
            .iter()
            .any(|r| r.cpu_of.as_deref() == Some("harness"))
        {
            let _ = writeln!(
                out,
                "cpu µs/op: the server process's user + system CPU per operation; (h): an embedded system's, measured on the whole harness process"
            );
        }
        out
    }

    /// The soak's samples and fitted slopes.
    pub fn soak_table(&self) -> String {
        let mut out = String::new();
        for soak in &self.soak {
            let _ = writeln!(
                out,
                "soak {}: {} messages in {:.0} s, RSS of the {} process; compaction: {}",
                soak.system, soak.messages, soak.seconds, soak.rss_of, soak.compaction
            );
            let _ = writeln!(
                out,
                "{:>14} {:>16} {:>14} {:>14} {:>9}",
                "messages sent", "msgs retained", "live events", "RssAnon MiB", "seconds"
            );
            for s in &soak.samples {
                #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
                let mib = s.rss_anon_bytes as f64 / f64::from(1u32 << 20);
                let _ = writeln!(
                    out,
                    "{:>14} {:>16} {:>14} {:>14.1} {:>9.1}",
                    s.messages_sent,
                    s.messages_retained,
                    s.events_live.map_or_else(|| "-".into(), |e| e.to_string()),
                    mib,
                    s.seconds
                );
            }
            let f = |v: Option<f64>| v.map_or_else(|| "-".into(), |x| format!("{x:.1}"));
            out.push_str(&crate::memory_table::memory_table(soak));
            let _ = writeln!(
                out,
                "slope: {} B per million messages retained ({} B/message); {} B per live event; \
                 fitted on both: {} B/message + {} B/live event",
                f(soak.rss_bytes_per_million_messages),
                f(soak.rss_bytes_per_message),
                f(soak.rss_bytes_per_live_event),
                f(soak.fit_bytes_per_message),
                f(soak.fit_bytes_per_live_event)
            );
        }
        out
    }

    /// inboxd against every other system, per scenario and concurrency:
    /// throughput ratio (higher is better for inboxd) and p99 ratio (lower
    /// is better for inboxd).
    pub fn ratios(&self) -> Vec<Ratio> {
        let mut ratios = Vec::new();
        for ours in self.results.iter().filter(|r| r.system == "inboxd") {
            for theirs in self.results.iter().filter(|r| {
                r.system != "inboxd" && r.scenario == ours.scenario && r.clients == ours.clients
            }) {
                ratios.push(Ratio {
                    scenario: ours.scenario.clone(),
                    clients: ours.clients,
                    baseline: theirs.system.clone(),
                    throughput_x: divide(ours.ops_per_s, theirs.ops_per_s),
                    p99_x: divide(ours.p99_us, theirs.p99_us),
                });
            }
        }
        ratios
    }

    pub fn ratio_table(&self) -> String {
        let ratios = self.ratios();
        if ratios.is_empty() {
            return String::new();
        }
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<26} {:>7} {:<15} {:>16} {:>17}",
            "scenario", "clients", "inboxd vs", "throughput ×", "p99 (ours/theirs)"
        );
        for r in ratios {
            let _ = writeln!(
                out,
                "{:<26} {:>7} {:<15} {:>16} {:>17}",
                r.scenario,
                r.clients,
                r.baseline,
                fmt_ratio(r.throughput_x),
                fmt_ratio(r.p99_x)
            );
        }
        out
    }
}

/// One of the goals inboxd is measured against, and where it stands.
#[derive(Clone, Debug, PartialEq)]
pub struct Goal {
    pub what: String,
    pub target: String,
    /// `None` when the run did not measure both sides.
    pub measured: Option<f64>,
    pub met: Option<bool>,
}

/// What a goal holds a figure to; the target it prints is made from it.
#[derive(Clone, Copy)]
enum Bound {
    AtLeast(f64),
    AtMost(f64),
    Below(f64),
}

impl Bound {
    fn met(self, v: f64) -> bool {
        match self {
            Bound::AtLeast(b) => v >= b,
            Bound::AtMost(b) => v <= b,
            Bound::Below(b) => v < b,
        }
    }

    /// `unit` follows the number: "x" for a ratio, "" for the unit named
    /// in the goal.
    fn target(self, unit: &str) -> String {
        match self {
            Bound::AtLeast(b) => format!(">= {b}{unit}"),
            Bound::AtMost(b) => format!("<= {b}{unit}"),
            Bound::Below(b) => format!("< {b}{unit}"),
        }
    }
}

impl Report {
    fn row(&self, scenario: &str, system: &str, clients: u32) -> Option<&ResultRow> {
        self.results
            .iter()
            .find(|r| r.scenario == scenario && r.system == system && r.clients == clients)
    }

    fn value(
        &self,
        scenario: &str,
        system: &str,
        clients: u32,
        f: fn(&ResultRow) -> f64,
    ) -> Option<f64> {
        self.row(scenario, system, clients).map(f)
    }

    /// The goals, each as the project states it: ingest at 16 clients
    /// against each baseline, a send's p50 at one client and its p99 at
    /// 16 against one 4 KiB fdatasync (the overwrite row of the same run),
    /// the server's CPU per send, sync pages against RocksDB and a page's
    /// read p99 (alone and under ingest), a page with its ACK, the
    /// long-offline first screen warm and after a cold restart, and
    /// recovery seconds per GB.
    pub fn goals(&self) -> Vec<Goal> {
        let ops = |r: &ResultRow| r.ops_per_s;
        let p50 = |r: &ResultRow| r.p50_us;
        let p99 = |r: &ResultRow| r.p99_us;
        let mut goals = Vec::new();
        let mut goal = |what: &str, bound: Bound, unit: &str, measured: Option<f64>| {
            goals.push(Goal {
                what: what.into(),
                target: bound.target(unit),
                measured,
                met: measured.map(|v| bound.met(v)),
            });
        };
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).and_then(|(a, b)| divide(a, b));
        let ours = self.value("ingest", "inboxd", 16, ops);
        for (baseline, factor) in [("mariadb", 20.0), ("redis", 5.0), ("rocksdb", 3.0)] {
            let theirs = self.value("ingest", baseline, 16, ops);
            goal(
                &format!("ingest c=16 vs {baseline}"),
                Bound::AtLeast(factor),
                "x",
                ratio(ours, theirs),
            );
        }
        let fsync = self.value("fdatasync-4k", "limit", 1, p50);
        goal(
            "ingest c=1 p50 / one fdatasync",
            Bound::AtMost(1.5),
            "x",
            ratio(self.value("ingest", "inboxd", 1, p50), fsync),
        );
        goal(
            "ingest c=16 p99 / one fdatasync",
            Bound::Below(3.0),
            "x",
            ratio(self.value("ingest", "inboxd", 16, p99), fsync),
        );
        goal(
            "server CPU per send c=16, µs",
            Bound::AtMost(25.0),
            "",
            self.row("ingest", "inboxd", 16)
                .and_then(|r| r.server_cpu_us_per_op),
        );
        goal(
            "sync pages/s c=16 vs rocksdb",
            Bound::AtLeast(2.0),
            "x",
            ratio(
                self.value("sync", "inboxd", 16, ops),
                self.value("sync", "rocksdb", 16, ops),
            ),
        );
        for (what, scenario, us) in [
            ("sync page p99 (read), µs", "sync-read", 500.0),
            (
                "sync-under-ingest read p99, µs",
                "sync-under-ingest-read",
                1_000.0,
            ),
            ("sync page p99 (read + ACK), µs", "sync", 1_000.0),
        ] {
            goal(
                what,
                Bound::Below(us),
                "",
                self.value(scenario, "inboxd", 16, p99),
            );
        }
        for (what, scenario, us) in [
            (
                "long-offline first screen, µs",
                "long-offline-first-screen",
                2_000.0,
            ),
            (
                "first screen, cold restart, µs",
                "long-offline-first-screen-cold",
                20_000.0,
            ),
        ] {
            goal(
                what,
                Bound::Below(us),
                "",
                self.value(scenario, "inboxd", 1, p99),
            );
        }
        let recovery = self
            .results
            .iter()
            .find(|r| r.scenario == "recovery" && r.system == "inboxd")
            .and_then(|r| {
                #[expect(clippy::cast_precision_loss, reason = "data sizes are far below 2^52")]
                let gb = r.bytes as f64 / 1e9;
                divide(r.p50_us / 1e6, gb)
            });
        goal("recovery, s per GB", Bound::Below(1.0), "", recovery);
        goals
    }

    pub fn goal_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<34} {:>10} {:>12} {:>8}",
            "goal", "target", "measured", "met"
        );
        for g in self.goals() {
            let _ = writeln!(
                out,
                "{:<36} {:>10} {:>12} {:>8}",
                g.what,
                g.target,
                g.measured.map_or_else(|| "-".into(), |m| format!("{m:.2}")),
                match g.met {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "not run",
                }
            );
        }
        out
    }
}

/// What the machine leaves a goal, from the same run's limit rows and CPU
/// figures ([`Report::floors`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Floor {
    pub what: String,
    /// `None` when the run did not measure what it needs.
    pub value: Option<f64>,
    /// inboxd's own figure to set beside it, where there is one.
    pub inboxd: Option<f64>,
}

impl Report {
    /// The figures that bound the goals on this machine, each from rows
    /// of this run:
    /// - the one-connection send's floor: a loopback round trip to a
    ///   server that does nothing but overwrite 4 KiB and fdatasync it
    ///   before answering (`tcp-durable`), over one fdatasync, beside
    ///   inboxd's ratio, and that server thread's CPU per request beside
    ///   inboxd's per send at one connection;
    /// - what a bare loopback server spends on a request it only receives
    ///   and answers (`tcp-round-trip`'s server thread CPU);
    /// - the server CPU per operation a throughput goal leaves: the
    ///   machine's cores over the rate the goal asks for, less the
    ///   harness's own CPU per operation at inboxd's row (its clients run
    ///   on the same cores), beside what inboxd's server spent.
    pub fn floors(&self) -> Vec<Floor> {
        let p50 = |r: &ResultRow| r.p50_us;
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).and_then(|(a, b)| divide(a, b));
        let fsync = self.value("fdatasync-4k", "limit", 1, p50);
        let mut floors = vec![
            Floor {
                what: "c=1 durable round trip / one fdatasync".into(),
                value: ratio(self.value("tcp-durable", "limit", 1, p50), fsync),
                inboxd: ratio(self.value("ingest", "inboxd", 1, p50), fsync),
            },
            Floor {
                what: "c=1 durable server CPU per request, µs".into(),
                value: self
                    .row("tcp-durable", "limit", 1)
                    .and_then(|r| r.server_cpu_us_per_op),
                inboxd: self
                    .row("ingest", "inboxd", 1)
                    .and_then(|r| r.server_cpu_us_per_op),
            },
            Floor {
                what: "c=1 bare server CPU per request, µs".into(),
                value: self
                    .row("tcp-round-trip", "limit", 1)
                    .and_then(|r| r.server_cpu_us_per_op),
                inboxd: None,
            },
        ];
        let cores = f64::from(self.machine.cores.max(1));
        let left = |scenario: &str, baseline: &str, factor: f64| {
            let rate = self.value(scenario, baseline, 16, |r| r.ops_per_s)? * factor;
            let harness = self.row(scenario, "inboxd", 16)?.harness_cpu_us_per_op?;
            Some(divide(cores * 1e6, rate)? - harness)
        };
        let spent = |scenario: &str| {
            self.row(scenario, "inboxd", 16)
                .and_then(|r| r.server_cpu_us_per_op)
        };
        floors.push(Floor {
            what: "CPU per send left at 5x redis, µs".into(),
            value: left("ingest", "redis", 5.0),
            inboxd: spent("ingest"),
        });
        floors.push(Floor {
            what: "CPU per page left at 2x rocksdb, µs".into(),
            value: left("sync", "rocksdb", 2.0),
            inboxd: spent("sync"),
        });
        floors
    }

    pub fn floor_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<40} {:>12} {:>12}",
            "what the machine leaves", "this run", "inboxd"
        );
        for f in self.floors() {
            let _ = writeln!(
                out,
                "{:<40} {:>12} {:>12}",
                f.what,
                fmt_ratio(f.value),
                fmt_ratio(f.inboxd)
            );
        }
        out
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Ratio {
    pub scenario: String,
    pub clients: u32,
    pub baseline: String,
    pub throughput_x: Option<f64>,
    pub p99_x: Option<f64>,
}

fn divide(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite() && b.is_finite()).then(|| a / b)
}

fn fmt_cpu(r: &ResultRow) -> String {
    match (r.server_cpu_us_per_op, r.cpu_of.as_deref()) {
        (Some(us), Some("harness")) => format!("{us:.1} (h)"),
        (Some(us), _) => format!("{us:.1}"),
        (None, _) => "-".into(),
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |x| format!("{x:.2}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(scenario: &str, system: &str, clients: u32, ops: f64, p99: f64) -> ResultRow {
        ResultRow {
            scenario: scenario.into(),
            system: system.into(),
            clients,
            ops_per_s: ops,
            p50_us: p99 / 2.0,
            p99_us: p99,
            p999_us: p99 * 2.0,
            bytes: 200,
            server_cpu_us_per_op: None,
            cpu_of: None,
            harness_cpu_us_per_op: None,
        }
    }

    #[test]
    fn json_has_exactly_the_documented_shape() {
        let report = Report {
            cluster: None,
            large_group: Vec::new(),
            soak: Vec::new(),
            machine: Machine {
                cores: 2,
                ..Machine::default()
            },
            results: vec![row("ingest", "inboxd", 16, 1000.0, 900.0)],
        };
        let value: serde_json::Value = serde_json::from_str(&report.to_json()).expect("valid JSON");
        let top: Vec<_> = value.as_object().expect("object").keys().cloned().collect();
        assert_eq!(top, ["machine", "results"]);
        assert!(value["machine"].is_object());
        let entry = value["results"][0]
            .as_object()
            .expect("a result is an object");
        let mut keys: Vec<_> = entry.keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "bytes",
                "clients",
                "cpu_of",
                "harness_cpu_us_per_op",
                "ops_per_s",
                "p50_us",
                "p999_us",
                "p99_us",
                "scenario",
                "server_cpu_us_per_op",
                "system"
            ]
        );
        assert!(entry["server_cpu_us_per_op"].is_null(), "not measured");
        assert!(entry["cpu_of"].is_null());
        assert!(entry["harness_cpu_us_per_op"].is_null(), "not measured");
        assert_eq!(entry["scenario"], "ingest");
        assert_eq!(entry["system"], "inboxd");
        assert_eq!(entry["clients"], 16);
        assert_eq!(entry["ops_per_s"], 1000.0);
        assert_eq!(entry["p99_us"], 900.0);
        assert_eq!(entry["bytes"], 200);
        let back: Report = serde_json::from_str(&report.to_json()).expect("round trip");
        assert_eq!(back, report);
    }

    #[test]
    fn row_takes_its_percentiles_from_the_histogram() {
        let mut latency = Latency::new();
        for us in 1..=1000 {
            latency.record_us(us);
        }
        let r = ResultRow::new("sync", "redis", 16, 5.0, &latency, 7);
        assert!((r.p50_us - 500.0).abs() < 1.0);
        assert!((r.p99_us - 990.0).abs() < 1.0);
        assert!((r.p999_us - 999.0).abs() < 1.0);
    }

    #[test]
    fn ratios_compare_inboxd_with_each_baseline_at_the_same_concurrency() {
        let report = Report {
            cluster: None,
            large_group: Vec::new(),
            soak: Vec::new(),
            machine: Machine::default(),
            results: vec![
                row("ingest", "inboxd", 16, 10_000.0, 1_000.0),
                row("ingest", "mariadb", 16, 500.0, 4_000.0),
                row("ingest", "redis", 1, 100.0, 100.0),
                row("ingest", "redis", 16, 2_000.0, 0.0),
            ],
        };
        let ratios = report.ratios();
        assert_eq!(ratios.len(), 2);
        assert_eq!(ratios[0].baseline, "mariadb");
        assert_eq!(ratios[0].throughput_x, Some(20.0));
        assert_eq!(ratios[0].p99_x, Some(0.25));
        assert_eq!(
            ratios[1].p99_x, None,
            "a zero baseline gives no ratio, not infinity"
        );
        assert!(report.ratio_table().contains("20.00"));
    }

    #[test]
    fn goals_compare_inboxd_with_baselines_and_the_disk() {
        let mut fsync = row("fdatasync-4k", "limit", 1, 2_000.0, 600.0);
        fsync.p50_us = 500.0;
        let mut ingest = row("ingest", "inboxd", 16, 30_000.0, 1_400.0);
        ingest.server_cpu_us_per_op = Some(24.0);
        let report = Report {
            cluster: None,
            large_group: Vec::new(),
            soak: Vec::new(),
            machine: Machine::default(),
            results: vec![
                ingest,
                // p50 900 µs: 1.8 fdatasyncs.
                row("ingest", "inboxd", 1, 1_000.0, 1_800.0),
                row("ingest", "mariadb", 16, 1_000.0, 400_000.0),
                row("ingest", "redis", 16, 10_000.0, 3_000.0),
                row("sync", "inboxd", 16, 5_000.0, 1_200.0),
                row("sync", "rocksdb", 16, 2_000.0, 900.0),
                row("sync-read", "inboxd", 16, 5_000.0, 450.0),
                fsync,
            ],
        };
        let goals = report.goals();
        let by = |what: &str| {
            goals
                .iter()
                .find(|g| g.what.starts_with(what))
                .expect(what)
                .clone()
        };
        assert_eq!(by("ingest c=16 vs mariadb").measured, Some(30.0));
        assert_eq!(by("ingest c=16 vs mariadb").met, Some(true));
        assert_eq!(by("ingest c=16 vs mariadb").target, ">= 20x");
        assert_eq!(by("ingest c=1 p50").target, "<= 1.5x");
        assert_eq!(by("sync page p99 (read),").target, "< 500");
        assert_eq!(
            by("ingest c=16 vs redis").met,
            Some(false),
            "3x is short of 5x"
        );
        assert_eq!(by("ingest c=16 vs rocksdb").met, None, "not run");
        assert_eq!(by("ingest c=1 p50").measured, Some(1.8));
        assert_eq!(by("ingest c=1 p50").met, Some(false), "1.8x is over 1.5x");
        assert_eq!(by("ingest c=16 p99").measured, Some(2.8));
        assert_eq!(by("ingest c=16 p99").met, Some(true));
        assert_eq!(by("server CPU per send").measured, Some(24.0));
        assert_eq!(by("server CPU per send").met, Some(true));
        assert_eq!(by("sync pages/s c=16 vs rocksdb").measured, Some(2.5));
        assert_eq!(by("sync pages/s c=16 vs rocksdb").met, Some(true));
        assert_eq!(by("sync page p99 (read),").met, Some(true), "450 µs");
        assert_eq!(by("sync page p99 (read + ACK)").met, Some(false));
        assert_eq!(by("sync-under-ingest").met, None, "not run");
        assert_eq!(by("first screen, cold").met, None, "not run");
        assert_eq!(by("recovery").met, None);
        assert!(report.goal_table().contains("NO"));
    }

    #[test]
    fn floors_divide_the_cores_among_the_rate_a_goal_asks_less_the_harness_share() {
        let mut fsync = row("fdatasync-4k", "limit", 1, 2_000.0, 600.0);
        fsync.p50_us = 100.0;
        let mut durable = row("tcp-durable", "limit", 1, 6_000.0, 400.0);
        durable.p50_us = 160.0;
        durable.server_cpu_us_per_op = Some(45.0);
        let mut bare = row("tcp-round-trip", "limit", 1, 20_000.0, 100.0);
        bare.server_cpu_us_per_op = Some(9.0);
        let mut ingest = row("ingest", "inboxd", 16, 30_000.0, 1_400.0);
        ingest.server_cpu_us_per_op = Some(24.0);
        ingest.harness_cpu_us_per_op = Some(20.0);
        let mut sync = row("sync", "inboxd", 16, 10_000.0, 1_400.0);
        sync.server_cpu_us_per_op = Some(70.0);
        sync.harness_cpu_us_per_op = Some(40.0);
        let mut one = row("ingest", "inboxd", 1, 5_000.0, 400.0);
        one.p50_us = 180.0;
        one.server_cpu_us_per_op = Some(90.0);
        let report = Report {
            cluster: None,
            large_group: Vec::new(),
            soak: Vec::new(),
            machine: Machine {
                cores: 2,
                ..Machine::default()
            },
            results: vec![
                fsync,
                durable,
                bare,
                ingest,
                sync,
                one,
                row("ingest", "redis", 16, 10_000.0, 3_000.0),
                row("sync", "rocksdb", 16, 20_000.0, 900.0),
            ],
        };
        let floors = report.floors();
        let by = |what: &str| {
            floors
                .iter()
                .find(|f| f.what.starts_with(what))
                .expect(what)
                .clone()
        };
        let c1 = by("c=1 durable round trip");
        assert_eq!((c1.value, c1.inboxd), (Some(1.6), Some(1.8)));
        let durable = by("c=1 durable server CPU");
        assert_eq!((durable.value, durable.inboxd), (Some(45.0), Some(90.0)));
        let bare = by("c=1 bare server CPU");
        assert_eq!((bare.value, bare.inboxd), (Some(9.0), None));
        // 2 cores over 50,000 sends/s is 40 µs a send; the harness takes 20.
        let redis = by("CPU per send left at 5x redis");
        assert_eq!((redis.value, redis.inboxd), (Some(20.0), Some(24.0)));
        // 2 cores over 40,000 pages/s is 50 µs a page; the harness takes 40.
        let rocksdb = by("CPU per page left at 2x rocksdb");
        assert_eq!((rocksdb.value, rocksdb.inboxd), (Some(10.0), Some(70.0)));
        // Without the baseline's row there is nothing to divide.
        let mut partial = report.clone();
        partial.results.retain(|r| r.system != "redis");
        assert_eq!(
            partial
                .floors()
                .iter()
                .find(|f| f.what.starts_with("CPU per send left"))
                .expect("the row")
                .value,
            None
        );
        assert!(report.floor_table().contains("10.00"));
    }

    #[test]
    fn table_has_a_line_per_result() {
        let report = Report {
            cluster: None,
            large_group: Vec::new(),
            soak: Vec::new(),
            machine: Machine::default(),
            results: vec![
                row("ingest", "inboxd", 1, 1.0, 1.0),
                row("sync", "redis", 16, 2.0, 2.0),
            ],
        };
        let table = report.table();
        assert_eq!(table.lines().count(), 3);
        assert!(table
            .lines()
            .nth(2)
            .expect("second row")
            .starts_with("sync"));
    }

    #[test]
    fn cpu_per_op_is_in_the_json_and_the_table_with_whose_cpu_it_is() {
        let report = Report {
            cluster: None,
            large_group: Vec::new(),
            soak: Vec::new(),
            machine: Machine::default(),
            results: vec![
                row("ingest", "inboxd", 16, 1.0, 1.0).with_cpu(Some((85.25, Measured::Server(7)))),
                row("ingest", "rocksdb", 16, 1.0, 1.0).with_cpu(Some((40.0, Measured::Harness))),
                row("fdatasync-4k", "limit", 1, 1.0, 1.0).with_cpu(None),
            ],
        };
        let value: serde_json::Value = serde_json::from_str(&report.to_json()).expect("json");
        assert_eq!(value["results"][0]["server_cpu_us_per_op"], 85.25);
        assert_eq!(value["results"][0]["cpu_of"], "server");
        assert_eq!(value["results"][1]["cpu_of"], "harness");
        assert!(value["results"][2]["server_cpu_us_per_op"].is_null());
        assert!(value.get("soak").is_none(), "no soak, no soak key");
        let table = report.table();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].ends_with("cpu µs/op"));
        assert!(lines[1].ends_with(" 85.2") || lines[1].ends_with(" 85.3"));
        assert!(lines[2].ends_with("40.0 (h)"));
        assert!(lines[3].ends_with(" -"));
        assert!(lines[4].contains("(h)"), "the harness mark is explained");
    }

    #[test]
    fn a_report_written_before_the_cpu_fields_still_reads() {
        let old = r#"{"machine": {"cpu": "", "cores": 2, "memory_bytes": 0, "kernel": "",
            "os": "", "data_fs": "", "mode": "quick", "users": 1, "group_members": 2,
            "group_send_fraction": 0.05, "payload_bytes": 200, "versions": [], "unix_time": 0},
            "results": [{"scenario": "ingest", "system": "inboxd", "clients": 1,
            "ops_per_s": 1.0, "p50_us": 1.0, "p99_us": 1.0, "p999_us": 1.0, "bytes": 1}]}"#;
        let report: Report = serde_json::from_str(old).expect("old report");
        assert_eq!(report.results[0].server_cpu_us_per_op, None);
        assert!(report.soak.is_empty());
    }

    #[test]
    fn soak_table_prints_every_sample_and_the_slopes() {
        let report = Report {
            soak: vec![SoakReport {
                system: "inboxd".into(),
                rss_of: "server".into(),
                compaction: "COMPACT every 1 s".into(),
                messages: 200,
                seconds: 2.0,
                samples: vec![
                    SoakSample {
                        messages_sent: 100,
                        messages_retained: 100,
                        events_live: Some(10),
                        rss_anon_bytes: 1 << 20,
                        seconds: 1.0,
                        ..SoakSample::default()
                    },
                    SoakSample {
                        messages_sent: 200,
                        messages_retained: 200,
                        events_live: None,
                        rss_anon_bytes: 2 << 20,
                        seconds: 2.0,
                        ..SoakSample::default()
                    },
                ],
                rss_bytes_per_message: Some(10_485.76),
                rss_bytes_per_million_messages: Some(10_485_760_000.0),
                ..SoakReport::default()
            }],
            ..Report::default()
        };
        let table = report.soak_table();
        assert!(table.starts_with("soak inboxd: 200 messages"));
        assert_eq!(table.lines().count(), 5);
        assert!(table.contains("10485760000.0 B per million"));
        let value: serde_json::Value = serde_json::from_str(&report.to_json()).expect("json");
        assert_eq!(value["soak"][0]["samples"][1]["rss_anon_bytes"], 2 << 20);
    }

    #[test]
    fn the_cluster_figures_and_large_group_rows_land_in_the_json_and_read_back() {
        let mut report = Report::default();
        let plain = report.to_json();
        assert!(
            !plain.contains("\"cluster\""),
            "no cluster part without --cluster"
        );
        assert!(!plain.contains("\"large_group\""));
        let cluster = report.cluster_mut();
        cluster.members = 3;
        cluster.commit_path.push(CommitPathRow {
            system: "inboxd-group3".into(),
            clients: 16,
            rounds_committed: 1000.0,
            proposal_to_commit_us: 1222.0,
            follower_appends: 700.0,
            entries_per_append: 2.5,
            follower_append_to_durable_us: 413.0,
            leader_append_to_durable_us: 172.0,
        });
        cluster.member_cpu.push(MemberCpu {
            system: "etcd-group3".into(),
            scenario: "ingest".into(),
            clients: 16,
            member: 2,
            role: "follower".into(),
            cpu_us_per_op: Some(40.5),
        });
        cluster.term_changes.push(TermChanges::new(
            "inboxd-group3",
            "kill 1",
            Some(4),
            Some(6),
        ));
        cluster.fail_over_ms = vec![2100.0, 2300.0];
        cluster.fail_over_goal_ms = 3000.0;
        cluster.fail_over_within_goal = 2;
        report
            .large_group
            .push(crate::large_group::LargeGroupResult {
                label: "inboxd large group".into(),
                members: 2000,
                joins_per_s: 7000.0,
                bytes_per_message: Some(308.0),
                ..Default::default()
            });
        let json = report.to_json();
        for field in [
            "\"proposal_to_commit_us\": 1222.0",
            "\"entries_per_append\": 2.5",
            "\"follower_append_to_durable_us\": 413.0",
            "\"role\": \"follower\"",
            "\"changes\": 2",
            "\"fail_over_ms\": [",
            "\"events_per_join\": null",
            "\"bytes_per_message\": 308.0",
        ] {
            assert!(json.contains(field), "{field} missing from {json}");
        }
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn a_term_that_went_back_or_was_not_read_counts_no_elections() {
        assert_eq!(
            TermChanges::new("g", "ingest", Some(3), Some(3)).changes,
            Some(0)
        );
        assert_eq!(
            TermChanges::new("g", "ingest", Some(5), Some(3)).changes,
            None
        );
        assert_eq!(TermChanges::new("g", "ingest", None, Some(3)).changes, None);
    }
}
