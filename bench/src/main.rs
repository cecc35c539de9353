//! `inbox-bench`: the load harness. Runs each scenario against inboxd and
//! every installed baseline (MariaDB with the seeds' schema, Redis, RocksDB)
//! at the same durability, and measures the machine's own limits in the same
//! run. Prints a table, writes an SVG plot and, on request, a JSON report.
//!
//! `--quick` (ingest and sync, small populations) finishes in under a
//! minute; `--full` runs every scenario but `soak`, which runs only when
//! named in `--scenarios`.

mod fit;
mod group;
mod hist;
mod large_group;
mod machine;
mod memory_table;
mod procfs;
mod report;
mod run;
mod scenarios;
mod svg;
mod systems;
mod workload;

use std::path::PathBuf;

use clap::Parser;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Quick,
    Full,
}

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Load harness: inboxd side by side with MariaDB, Redis, RocksDB and the disk's limits"
)]
pub struct Args {
    /// ingest and sync only, small populations, under a minute (the default).
    #[arg(long, conflicts_with = "full")]
    pub quick: bool,
    /// Every scenario but soak: ingest, sync, sync-under-ingest,
    /// reconnect-storm, long-offline, mixed, recovery.
    #[arg(long)]
    pub full: bool,
    /// Scenarios to run, comma separated, instead of the mode's set:
    /// ingest, sync, sync-under-ingest, reconnect-storm, long-offline,
    /// mixed, recovery, large-group, soak. Sizes still follow --quick or --full.
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// `soak`: messages to send in all.
    #[arg(long, default_value_t = 2_000_000)]
    pub soak_messages: u64,
    /// `soak`: sample the server's memory each time this many more
    /// messages have been sent.
    #[arg(long, default_value_t = 100_000)]
    pub soak_sample_every: u64,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the SVG plot here [default: bench/results/inbox-bench-<mode>.svg].
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Systems to run, comma separated: inboxd, mariadb, redis,
    /// redis-everysec, rocksdb, limit [default: all that are available].
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Client connections for ingest [default: 1,16,128].
    #[arg(long, value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Users in the ingest population [quick: 2000, full: 100000].
    #[arg(long)]
    pub users: Option<u64>,
    /// Measured seconds per ingest run [quick: 1, full: 10].
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Where the systems' temporary data directories go (the disk measured).
    #[arg(long, env = "INBOX_BENCH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// The inboxd binary [default: target/release/inboxd, else target/debug/inboxd].
    #[arg(long, env = "INBOX_BENCH_INBOXD")]
    pub inboxd: Option<PathBuf>,
    /// Users in the `sync` scenario [quick: 64, full: 400].
    #[arg(long)]
    pub sync_users: Option<u32>,
    /// Events waiting for each `sync` user [quick: 3000, full: 1000].
    #[arg(long)]
    pub sync_backlog: Option<u32>,
    /// `long-offline`: the returning devices ACK after every this many
    /// pages of their catch-up and after the last, in every system (1:
    /// every page, the basis of the reports before this option).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub catch_up_ack_every: u32,
    /// `ingest`: hold this many more connections open to inboxd while it
    /// runs, each subscribed to hints for one uid no send reaches, as the
    /// connected devices of an inbox are (other systems ignore it; inboxd
    /// takes 1,024 connections by default).
    #[arg(long, default_value_t = 0)]
    pub idle_subscribers: u32,
    /// `recovery` (--full): data to fill each system with before kill -9, GiB.
    #[arg(long, default_value_t = 1.0)]
    pub recovery_gib: f64,
    /// Run nothing: read a JSON report written by --json and write its plot
    /// (to --svg).
    #[arg(long)]
    pub replot: Option<PathBuf>,
    /// `large-group`: members of the group [quick: 2000, full: 10000]; the
    /// fan-out runs use at most 2000.
    #[arg(long)]
    pub group_size: Option<u32>,
    /// Run nothing else: ingest on a single inboxd, then on a replicated
    /// group of this many members on loopback (clients talk to the
    /// leader), then kill the group's leader `--cluster-kills` times and
    /// time its fail-over. Clients default to 16.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=7))]
    pub cluster: Option<u16>,
    /// `--cluster`: leader kills [quick: 5, full: 20].
    #[arg(long)]
    pub cluster_kills: Option<usize>,
    /// Seed of the workload.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

fn main() {
    let args = Args::parse();
    match run::run(&args) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("inbox-bench: {e}");
            std::process::exit(1);
        }
    }
}
