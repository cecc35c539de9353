//! A hand-written SVG plot of a report: throughput (top) and p99 reply
//! latency (bottom), one group of bars per (scenario, clients), one bar per
//! system, both on log scales. The machine's fdatasync latency, measured in
//! the same run, is drawn across the latency panel for reference.
//!
//! Invariants: every text is XML-escaped; a value that is not positive has
//! no bar (a log scale has no place for it) rather than a wrong one.

use std::fmt::Write as _;

use crate::report::{Report, ResultRow};

const PANEL_HEIGHT: f64 = 240.0;
const MARGIN_LEFT: f64 = 80.0;
const MARGIN_RIGHT: f64 = 20.0;
const MARGIN_TOP: f64 = 50.0;
const PANEL_GAP: f64 = 90.0;
const BAR_WIDTH: f64 = 13.0;
const GROUP_GAP: f64 = 22.0;

/// Which number of a row a panel plots.
type Metric = fn(&ResultRow) -> f64;

/// Colours by position in the legend; systems keep theirs across panels.
const PALETTE: [&str; 8] = [
    "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666",
];

/// A log10 axis from `10^lo` to `10^hi` mapped onto `[top, bottom]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogAxis {
    pub lo: i32,
    pub hi: i32,
    pub top: f64,
    pub bottom: f64,
}

impl LogAxis {
    /// An axis covering every positive value, padded to whole decades.
    pub fn covering(values: impl Iterator<Item = f64>, top: f64, bottom: f64) -> Self {
        let (mut min, mut max) = (f64::INFINITY, 0.0f64);
        for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
            min = min.min(v);
            max = max.max(v);
        }
        if max <= 0.0 {
            return Self {
                lo: 0,
                hi: 1,
                top,
                bottom,
            };
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "log10 of an f64 fits an i32"
        )]
        let (lo, hi) = (min.log10().floor() as i32, max.log10().ceil() as i32);
        Self {
            lo,
            hi: hi.max(lo + 1),
            top,
            bottom,
        }
    }

    /// The y coordinate of `value` (> 0); larger values are higher up.
    pub fn y(&self, value: f64) -> f64 {
        let t = (value.log10() - f64::from(self.lo)) / f64::from(self.hi - self.lo);
        self.bottom - t.clamp(0.0, 1.0) * (self.bottom - self.top)
    }
}

pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

fn si(value: f64) -> String {
    match value {
        v if v >= 1e6 => format!("{}M", v / 1e6),
        v if v >= 1e3 => format!("{}k", v / 1e3),
        v => format!("{v}"),
    }
}

/// A scenario name cut at its dashes into lines that fit `width` pixels
/// (about 6.5 px a character at this font size).
fn label_lines(name: &str, width: f64) -> Vec<String> {
    let max_chars = ((width / 6.5) as usize).max(6);
    let mut lines: Vec<String> = Vec::new();
    for part in name.split_inclusive('-') {
        match lines.last_mut() {
            Some(line) if line.len() + part.len() <= max_chars => line.push_str(part),
            _ => lines.push(part.to_string()),
        }
    }
    lines
}

/// The plot of `report` as a complete SVG document.
pub fn plot(report: &Report, title: &str) -> String {
    let rows: Vec<&ResultRow> = report
        .results
        .iter()
        .filter(|r| r.system != "limit")
        .collect();
    let mut systems: Vec<&str> = Vec::new();
    let mut groups: Vec<(&str, u32)> = Vec::new();
    for r in &rows {
        if !systems.contains(&r.system.as_str()) {
            systems.push(&r.system);
        }
        if !groups.contains(&(r.scenario.as_str(), r.clients)) {
            groups.push((&r.scenario, r.clients));
        }
    }
    let group_width = systems.len().max(1) as f64 * BAR_WIDTH + GROUP_GAP;
    let plot_width = (groups.len().max(1) as f64 * group_width).max(560.0);
    let width = MARGIN_LEFT + plot_width + MARGIN_RIGHT;
    let height = MARGIN_TOP + 2.0 * PANEL_HEIGHT + PANEL_GAP + 60.0;
    let fsync_p50 = report
        .results
        .iter()
        .find(|r| r.system == "limit" && r.scenario == "fdatasync-4k")
        .map(|r| r.p50_us);

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{MARGIN_LEFT}" y="20" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    // Legend.
    let mut x = MARGIN_LEFT;
    for (i, system) in systems.iter().enumerate() {
        let _ = writeln!(
            svg,
            r#"<rect x="{x:.1}" y="30" width="10" height="10" fill="{}"/><text x="{:.1}" y="39">{}</text>"#,
            PALETTE[i % PALETTE.len()],
            x + 14.0,
            escape(system)
        );
        x += 24.0 + 7.0 * system.len() as f64;
    }

    let panels: [(&str, Metric); 2] = [
        ("throughput, ops/s (log)", |r| r.ops_per_s),
        ("p99 reply latency, µs (log)", |r| r.p99_us),
    ];
    for (panel, (label, value_of)) in panels.iter().enumerate() {
        let top = MARGIN_TOP + 20.0 + panel as f64 * (PANEL_HEIGHT + PANEL_GAP);
        let bottom = top + PANEL_HEIGHT;
        let extra = if panel == 1 { fsync_p50 } else { None };
        let axis = LogAxis::covering(rows.iter().map(|r| value_of(r)).chain(extra), top, bottom);
        let _ = writeln!(
            svg,
            r#"<text x="{MARGIN_LEFT}" y="{:.1}" font-weight="bold">{}</text>"#,
            top - 6.0,
            escape(label)
        );
        for decade in axis.lo..=axis.hi {
            let v = 10f64.powi(decade);
            let y = axis.y(v);
            let _ = writeln!(
                svg,
                r##"<line x1="{MARGIN_LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                MARGIN_LEFT + plot_width,
                MARGIN_LEFT - 6.0,
                y + 4.0,
                si(v)
            );
        }
        let _ = writeln!(
            svg,
            r##"<line x1="{MARGIN_LEFT}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="#333"/>"##,
            MARGIN_LEFT + plot_width
        );
        for (g, (scenario, clients)) in groups.iter().enumerate() {
            let gx = MARGIN_LEFT + g as f64 * group_width + GROUP_GAP / 2.0;
            for (s, system) in systems.iter().enumerate() {
                let Some(r) = rows.iter().find(|r| {
                    r.scenario == *scenario && r.clients == *clients && r.system == *system
                }) else {
                    continue;
                };
                // `-events` rows repeat their scenario's latency.
                if panel == 1 && r.scenario.ends_with("-events") {
                    continue;
                }
                let v = value_of(r);
                if v <= 0.0 || !v.is_finite() {
                    continue;
                }
                let y = axis.y(v);
                let _ = writeln!(
                    svg,
                    r#"<rect class="bar" x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} {} c={}: {:.0}</title></rect>"#,
                    gx + s as f64 * BAR_WIDTH,
                    BAR_WIDTH - 1.0,
                    (bottom - y).max(0.5),
                    PALETTE[s % PALETTE.len()],
                    escape(scenario),
                    escape(system),
                    clients,
                    v
                );
            }
            let cx = gx + systems.len() as f64 * BAR_WIDTH / 2.0;
            let mut lines = label_lines(scenario, group_width);
            lines.push(format!("c={clients}"));
            for (i, line) in lines.iter().enumerate() {
                let _ = writeln!(
                    svg,
                    r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                    bottom + 14.0 + 13.0 * i as f64,
                    escape(line)
                );
            }
        }
        if let Some(fsync) = extra.filter(|v| *v > 0.0) {
            for (factor, text) in [(1.0, "1 fdatasync (p50)"), (3.0, "3× fdatasync")] {
                let y = axis.y(fsync * factor);
                let _ = writeln!(
                    svg,
                    r##"<line x1="{MARGIN_LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#c00" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#c00">{}</text>"##,
                    MARGIN_LEFT + plot_width,
                    MARGIN_LEFT + plot_width,
                    y - 3.0,
                    text
                );
            }
        }
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Machine;

    fn row(scenario: &str, system: &str, clients: u32, ops: f64, p99: f64) -> ResultRow {
        ResultRow {
            scenario: scenario.into(),
            system: system.into(),
            clients,
            ops_per_s: ops,
            p50_us: p99,
            p99_us: p99,
            p999_us: p99,
            bytes: 0,
            server_cpu_us_per_op: None,
            cpu_of: None,
            harness_cpu_us_per_op: None,
        }
    }

    #[test]
    fn log_axis_puts_larger_values_higher_and_decades_evenly() {
        let axis = LogAxis::covering([3.0, 2_500.0].into_iter(), 0.0, 300.0);
        assert_eq!((axis.lo, axis.hi), (0, 4));
        assert_eq!(axis.y(1.0), 300.0);
        assert_eq!(axis.y(10_000.0), 0.0);
        assert!((axis.y(10.0) - 225.0).abs() < 1e-9);
        assert!((axis.y(100.0) - 150.0).abs() < 1e-9);
        assert!(axis.y(500.0) < axis.y(400.0));
    }

    #[test]
    fn plot_draws_two_bars_per_measured_row_and_none_for_limit_rows() {
        let report = Report {
            cluster: None,
            large_group: Vec::new(),
            soak: Vec::new(),
            machine: Machine::default(),
            results: vec![
                row("ingest", "inboxd", 1, 5_000.0, 900.0),
                row("ingest", "mariadb", 1, 300.0, 4_000.0),
                row("ingest", "inboxd", 16, 50_000.0, 1_500.0),
                row("sync", "redis", 16, 0.0, 800.0),
                row("fdatasync-4k", "limit", 1, 1_000.0, 1_000.0),
            ],
        };
        let svg = plot(&report, "quick");
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.ends_with("</svg>\n"));
        // 4 non-limit rows x 2 panels, minus the zero-throughput bar.
        assert_eq!(svg.matches("<rect class=\"bar\"").count(), 7);
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        assert!(
            svg.contains("1 fdatasync (p50)"),
            "the fsync reference line is drawn"
        );
        assert!(svg.contains("c=16"));
    }

    #[test]
    fn long_scenario_names_wrap_at_dashes() {
        assert_eq!(label_lines("ingest", 87.0), ["ingest"]);
        assert_eq!(
            label_lines("long-offline-first-screen", 87.0),
            ["long-offline-", "first-screen"]
        );
        assert_eq!(
            label_lines("reconnect-storm-all", 60.0),
            ["reconnect-", "storm-all"]
        );
    }

    #[test]
    fn names_are_escaped_in_the_document() {
        let report = Report {
            cluster: None,
            large_group: Vec::new(),
            soak: Vec::new(),
            machine: Machine::default(),
            results: vec![row("a<b", "x&y", 1, 1.0, 1.0)],
        };
        let svg = plot(&report, "t\"<>");
        assert!(
            svg.contains("a&lt;b") && svg.contains("x&amp;y") && svg.contains("t&quot;&lt;&gt;")
        );
        assert!(!svg.contains("a<b"));
    }
}
