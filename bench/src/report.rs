//! The run's report: the machine, one row per (scenario, system, clients),
//! the JSON file, and the table printed to stdout.
//!
//! The JSON shape is fixed (tools read it):
//! `{"machine": {...}, "results": [{"scenario", "system", "clients",
//! "ops_per_s", "p50_us", "p99_us", "p999_us", "bytes"}]}`.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::hist::Latency;

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
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub machine: Machine,
    pub results: Vec<ResultRow>,
}

impl Report {
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
            "{:<26} {:<15} {:>7} {:>12} {:>9} {:>9} {:>9} {:>12}",
            "scenario", "system", "clients", "ops/s", "p50 µs", "p99 µs", "p999 µs", "bytes"
        );
        for r in &self.results {
            let _ = writeln!(
                out,
                "{:<26} {:<15} {:>7} {:>12.1} {:>9.0} {:>9.0} {:>9.0} {:>12}",
                r.scenario,
                r.system,
                r.clients,
                r.ops_per_s,
                r.p50_us,
                r.p99_us,
                r.p999_us,
                r.bytes
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
        }
    }

    #[test]
    fn json_has_exactly_the_documented_shape() {
        let report = Report {
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
                "ops_per_s",
                "p50_us",
                "p999_us",
                "p99_us",
                "scenario",
                "system"
            ]
        );
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
    fn table_has_a_line_per_result() {
        let report = Report {
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
}
