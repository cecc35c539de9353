//! `inboxd`: the daemon (`serve`) and its offline tools.
//!
//! `serve` prints one line to stdout once it listens,
//! `listening on ADDR metrics on ADDR`, so scripts and tests can use port
//! 0; everything else goes to the log on stderr.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use inbox_server::config::{Config, ServeArgs};

#[derive(Parser)]
#[command(
    name = "inboxd",
    version,
    about = "The inboxd offline-message inbox and multi-device sync store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the binary protocol and the metrics endpoint.
    Serve(Box<ServeArgs>),
    /// Check every record of a data directory offline (the daemon must not
    /// be running on it).
    Verify {
        #[arg(long, env = "INBOXD_DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
    },
    /// Open a data directory offline, write an index checkpoint, and exit.
    Checkpoint {
        #[arg(long, env = "INBOXD_DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
    },
    /// Open a data directory offline, run one compaction pass, and exit.
    Compact {
        #[arg(long, env = "INBOXD_DATA_DIR", default_value = "./data")]
        data_dir: PathBuf,
    },
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("INBOXD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs();
    match cli.command {
        Command::Serve(args) => serve(&args),
        Command::Verify { data_dir } => verify(&data_dir),
        Command::Checkpoint { data_dir } => offline(&data_dir, |inbox| {
            inbox.checkpoint()?;
            println!("checkpoint written");
            Ok(())
        }),
        Command::Compact { data_dir } => offline(&data_dir, |inbox| {
            let report = inbox.compact()?;
            println!(
                "events reclaimed {}, bytes reclaimed {}, bytes rewritten {}, segments dropped {}, segments rewritten {}",
                report.events_reclaimed,
                report.bytes_reclaimed,
                report.bytes_rewritten,
                report.segments_dropped,
                report.segments_rewritten
            );
            Ok(())
        }),
    }
}

fn serve(args: &ServeArgs) -> ExitCode {
    let config = match Config::resolve(args) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("inboxd: {err}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("inboxd: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                tracing::error!("cannot install signal handlers");
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("signal received: shutting down (send it again to exit at once)");
            let _ = shutdown_tx.send(true);
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::warn!("second signal: exiting at once");
            std::process::exit(130);
        });
        let result = inbox_server::server::run(config, shutdown_rx, |bound| {
            let mut stdout = std::io::stdout();
            let _ = writeln!(
                stdout,
                "listening on {} metrics on {}",
                bound.listen, bound.metrics
            );
            let _ = stdout.flush();
        })
        .await;
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                tracing::error!(error = %err, "inboxd stopped");
                eprintln!("inboxd: {err}");
                ExitCode::FAILURE
            }
        }
    })
}

fn offline(
    data_dir: &std::path::Path,
    f: impl FnOnce(&inbox_engine::Inbox) -> inbox_engine::Result<()>,
) -> ExitCode {
    let mut config = inbox_engine::InboxConfig::new(data_dir);
    match inbox_server::config::load_batch_token_key(data_dir) {
        Ok(key) => config.token_key = key,
        Err(err) => {
            eprintln!("inboxd: {err}");
            return ExitCode::FAILURE;
        }
    }
    let result = inbox_engine::Inbox::open(config).and_then(|inbox| {
        f(&inbox)?;
        inbox.shutdown()
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("inboxd: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Checks every record of both logs offline. A torn tail is reported but
/// is not a failure: `serve` cuts it at startup and it never held an
/// acknowledged write. Corruption is a failure (exit 1).
fn verify(data_dir: &std::path::Path) -> ExitCode {
    let mut corrupt = false;
    for stream in ["msg", "evt"] {
        let dir = data_dir.join(stream);
        if !dir.exists() {
            println!("{stream}: no log at {}", dir.display());
            continue;
        }
        let mut on_segment = |segment: &inbox_engine::log::SegmentReport| {
            println!(
                "{stream}: segment {:>6}  {:>12} bytes  {:>8} batches  {:>9} records  {}",
                segment.id,
                segment.bytes,
                segment.batches,
                segment.records,
                segment
                    .problem
                    .as_ref()
                    .map_or_else(|| "ok".to_string(), ToString::to_string),
            );
        };
        match inbox_engine::log::verify_with_progress(&dir, &mut on_segment) {
            Ok(report) => {
                println!(
                    "{stream}: {} segments, {} batches, {} records, {} bytes, lsn {:?}..={:?}, {} problems",
                    report.segments.len(),
                    report.batches,
                    report.records,
                    report.bytes,
                    report.first_lsn,
                    report.last_lsn,
                    report.problems.len(),
                );
                corrupt |= !report.opens();
            }
            Err(err) => {
                eprintln!("inboxd: {stream}: {err}");
                corrupt = true;
            }
        }
    }
    if corrupt {
        eprintln!("inboxd: verify found corruption; serve would refuse to start");
        ExitCode::FAILURE
    } else {
        println!("verify: ok");
        ExitCode::SUCCESS
    }
}
