//! `inboxd`: the daemon (`serve`) and its offline tools.
//!
//! `serve` prints one line to stdout once it listens,
//! `listening on ADDR metrics on ADDR`, so scripts and tests can use port
//! 0; everything else goes to the log on stderr.

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use inbox_server::config::{Config, ServeArgs};

/// The daemon allocates on every request from several threads at once
/// (tokio's workers, the blocking pool, the engine's threads). glibc's
/// malloc spent a fifth of a sync page's CPU in its arena locks and
/// consolidation; `docs/OPERATIONS.md` ("The allocator") has the figures.
/// mimalloc, counting what it hands out, so that the memory breakdown
/// can say how much of the heap lies outside the engine's structures
/// (`inbox_server::heap`).
#[global_allocator]
static ALLOCATOR: inbox_server::heap::Counting = inbox_server::heap::Counting;

#[derive(Parser)]
#[command(
    name = "inboxd",
    version,
    about = "The inboxd offline-message inbox and multi-device sync store"
)]
struct Cli {
    /// Log format on stderr: `text` (coloured only on a terminal) or
    /// `json` (one object per line).
    #[arg(long, env = "INBOXD_LOG_FORMAT", default_value = "text", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the binary protocol and the metrics endpoint.
    Serve(Box<ServeArgs>),
    /// Check every record of a data directory offline. Takes the
    /// directory's lock, so it refuses while a daemon serves it. Reads the
    /// same configuration as `serve` (only the data directory matters).
    Verify(Box<ServeArgs>),
    /// Print every record of the logs in readable form (bodies as lengths
    /// only). Takes the directory's lock, like `verify`.
    Dump {
        #[command(flatten)]
        args: Box<ServeArgs>,
        /// Only this log.
        #[arg(long)]
        stream: Option<inbox_server::dump::Stream>,
        /// Only this segment id.
        #[arg(long)]
        segment: Option<u32>,
        /// Go on past a batch that does not verify: at the next offset
        /// where a whole batch does, so the intact batches after it are
        /// shown. Exit 1 still, as damage was met.
        #[arg(long)]
        skip_damaged: bool,
    },
    /// Copy every record of a damaged data directory that still verifies
    /// into a new one and report exactly what was lost. Never writes to
    /// the source; takes its lock like `verify`. The new directory's logs
    /// are written with the source's segment size unless `--segment-bytes`
    /// says otherwise. Exit 0:
    /// nothing lost; 3: salvaged with losses (listed); 1: nothing written.
    Salvage {
        /// The damaged data directory (read only).
        #[arg(long)]
        from: std::path::PathBuf,
        /// The new data directory: must not exist, or be empty.
        #[arg(long)]
        to: std::path::PathBuf,
        /// Print the report as one JSON object instead of lines.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        args: Box<ServeArgs>,
    },
    /// Open the store offline with `serve`'s configuration, write an index
    /// checkpoint, and exit.
    Checkpoint(Box<ServeArgs>),
    /// Open the store offline with `serve`'s configuration, run one
    /// compaction pass, and exit.
    Compact(Box<ServeArgs>),
    /// Open the store offline and print the SHA-256 of its state with
    /// what is each node's own left out (log locations, LSN): the members
    /// of a group that applied the same entries print the same digest.
    Digest(Box<ServeArgs>),
}

/// Whether stderr carries JSON log records only (`--log-format json`).
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says on stderr why a command failed: a plain `inboxd: ...` line, or,
/// under `--log-format json`, an ERROR record instead, so that every line
/// a log collector reads there is JSON.
fn say_error(message: impl std::fmt::Display) {
    if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
        tracing::error!("{message}");
    } else {
        eprintln!("inboxd: {message}");
    }
}

fn init_logs(format: LogFormat) {
    JSON_LOGS.store(
        matches!(format, LogFormat::Json),
        std::sync::atomic::Ordering::Relaxed,
    );
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("INBOXD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        // Colour codes only help a human at a terminal; in journald or a
        // file they are noise that breaks grep.
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
}

/// Threads whose panic leaves the engine unable to go on: the sequencer's
/// state may be half-applied, or a round may never be written. The engine
/// names them; see `Inbox::open` and `Log::open`.
fn is_engine_thread(name: &str) -> bool {
    name.starts_with("inbox-") || name == "log-writer"
}

/// Makes a panic on an engine thread fatal, after saying why.
///
/// Why a hook that aborts rather than `panic = "abort"` or a poison:
/// a panic on a connection's task is contained by tokio (that client's
/// connection drops, the rest are served), and the profile setting would
/// turn every such bug into an outage. A panic on an engine thread is
/// different: the thread is gone, requests queued to it would wait
/// forever, and state it was applying may be half-changed in memory, so
/// no reply could be trusted. Recovery from the log on disk is the only
/// safe way on, and a restart is that recovery. Aborting (SIGABRT, a
/// non-zero exit that a supervisor restarts) is simpler and safer than a
/// poison flag that every caller would have to check.
fn install_engine_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        // Engine threads are pooled: the job's name says which one this is.
        let name = inbox_engine::threads::current_name()
            .or_else(|| std::thread::current().name().map(str::to_string))
            .unwrap_or_default();
        let name = name.as_str();
        if !is_engine_thread(name) {
            return;
        }
        let reason = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".to_string());
        let location = info
            .location()
            .map_or_else(String::new, |l| format!(" at {}:{}", l.file(), l.line()));
        tracing::error!(thread = name, reason = %reason, location = %location, "engine thread panicked: exiting; a restart recovers from the log");
        if !JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!(
                "inboxd: engine thread {name:?} panicked{location}: {reason}; \
             the in-memory state can no longer be trusted, so inboxd exits now. \
             Everything acknowledged is in the log; a restart recovers it."
            );
        }
        std::process::abort();
    }));
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    install_engine_panic_hook();
    match cli.command {
        Command::Serve(args) => serve(&args),
        Command::Verify(args) => match resolve(&args) {
            Ok(config) => verify(&config.data_dir),
            Err(code) => code,
        },
        Command::Dump {
            args,
            stream,
            segment,
            skip_damaged,
        } => match resolve(&args) {
            Ok(config) => dump(
                &config.data_dir,
                stream,
                inbox_server::dump::DumpOptions {
                    segment,
                    skip_damaged,
                },
            ),
            Err(code) => code,
        },
        Command::Salvage {
            from,
            to,
            json,
            args,
        } => match resolve(&args) {
            Ok(config) => salvage(&config, from, &to, json),
            Err(code) => code,
        },
        Command::Checkpoint(args) => offline(&args, |inbox| {
            inbox.checkpoint()?;
            println!("checkpoint written");
            Ok(())
        }),
        Command::Digest(args) => offline(&args, |inbox| {
            let digest = inbox.replica_digest();
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            println!("{hex} replica index {}", inbox.replica_index());
            Ok(())
        }),
        Command::Compact(args) => offline(&args, |inbox| {
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

fn resolve(args: &ServeArgs) -> Result<Config, ExitCode> {
    Config::resolve(args).map_err(|err| {
        say_error(format_args!("{err}"));
        ExitCode::from(2)
    })
}

/// Arenas the C allocator may use unless `MALLOC_ARENA_MAX` says
/// otherwise.
const MALLOC_ARENAS: i32 = 2;

/// Rust's allocations go to mimalloc (above); glibc's malloc still serves
/// the C libraries (zstd's contexts). glibc gives each thread that
/// allocates under contention an arena of its own, up to eight per core,
/// and memory freed into one is not reused by another; two arenas bound
/// that slack (figures in `docs/OPERATIONS.md`, "The allocator"). An
/// operator's `MALLOC_ARENA_MAX` wins.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; it is called
        // before the runtime starts any thread.
        let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) };
        if ok != 1 {
            tracing::warn!("mallopt(M_ARENA_MAX, {MALLOC_ARENAS}) failed; the allocator keeps its default arenas");
        }
    }
}

/// mimalloc's `mi_option_purge_delay`: its place in `mi_option_e`
/// (`mimalloc.h`), the same in the 2.x and 3.x lines. The test below
/// checks it against the linked library.
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// How long memory mimalloc no longer uses stays committed before it goes
/// back to the OS: mimalloc 2's default. mimalloc 3, the one linked,
/// waits a second, and ten for its arenas, which after the harness's
/// `sync` preload left RssAnon 11 to 30 MiB higher, at no CPU this one
/// saves (`docs/OPERATIONS.md`, "The allocator").
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// mimalloc's `mi_option_arena_eager_commit`, likewise.
const MI_OPTION_ARENA_EAGER_COMMIT: std::ffi::c_int = 4;

/// Whether mimalloc commits a whole arena when it reserves it: no. On
/// Linux it does by default (overcommit makes it free), and after the
/// harness's `sync` preload RssAnon was then about 4 MiB higher, at no
/// CPU that committing on demand was seen to cost (`docs/OPERATIONS.md`,
/// "Arenas committed on demand").
const ARENA_EAGER_COMMIT: std::ffi::c_long = 0;

/// mimalloc's `mi_option_allow_thp`: 43 in the 3.x line, the one linked
/// (37 in 2.x); the test below checks it.
const MI_OPTION_ALLOW_THP: std::ffi::c_int = 43;

/// Whether mimalloc may use transparent huge pages: no. It asks for them
/// (`MADV_HUGEPAGE`) on what it reserves, so the first touch of any 2 MiB
/// maps all 2 MiB: an idle daemon held 12 MiB of heap where it used under
/// 2, and a loaded one holds part-filled huge pages per thread and size
/// class. With the option off, mimalloc turns them off for the whole
/// process (`PR_SET_THP_DISABLE`) as it starts, before it maps anything
/// (`docs/OPERATIONS.md`, "Transparent huge pages").
const ALLOW_THP: std::ffi::c_long = 0;

extern "C" {
    fn mi_option_set_default(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// Sets mimalloc's purge delay unless the environment did
/// (`MIMALLOC_PURGE_DELAY` then wins, as mimalloc documents). mimalloc
/// reads an option when it first needs it, and it needs this one only
/// once it purges, so setting it here is in time.
fn tune_mimalloc() {
    // SAFETY: sets an integer in mimalloc's option table; any value is
    // valid for this option.
    unsafe { mi_option_set_default(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
}

/// Sets mimalloc's arena commit and huge pages unless the environment
/// did (`MIMALLOC_ARENA_EAGER_COMMIT` and `MIMALLOC_ALLOW_THP` then win).
/// mimalloc reads both as it starts, at the program's first allocation,
/// before `main`; so this runs as the binary is loaded (an `.init_array`
/// entry, as C constructors are), before the Rust runtime allocates
/// anything.
extern "C" fn tune_mimalloc_before_main() {
    // SAFETY: each sets an integer in mimalloc's option table, to a value
    // valid for that option; nothing else runs yet.
    unsafe {
        mi_option_set_default(MI_OPTION_ARENA_EAGER_COMMIT, ARENA_EAGER_COMMIT);
        mi_option_set_default(MI_OPTION_ALLOW_THP, ALLOW_THP);
    }
}

#[used]
#[link_section = ".init_array"]
static TUNE_MIMALLOC_BEFORE_MAIN: extern "C" fn() = tune_mimalloc_before_main;

fn serve(args: &ServeArgs) -> ExitCode {
    let config = match resolve(args) {
        Ok(config) => config,
        Err(code) => return code,
    };
    limit_malloc_arenas();
    tune_mimalloc();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(config.worker_threads).enable_all();
    if config.colocate_when_light {
        // Only the connection workers park: the read pool's threads are
        // never gathered.
        builder
            .on_thread_park(inbox_engine::placement::join)
            .on_thread_stop(inbox_engine::placement::leave);
    }
    let runtime = match builder.build() {
        Ok(runtime) => runtime,
        Err(err) => {
            say_error(format_args!("cannot start the runtime: {err}"));
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
                if !JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
                    eprintln!("inboxd: {err}");
                }
                ExitCode::FAILURE
            }
        }
    })
}

fn offline(
    args: &ServeArgs,
    f: impl FnOnce(&inbox_engine::Inbox) -> inbox_engine::Result<()>,
) -> ExitCode {
    let config = match resolve(args) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let config = match inbox_server::config::load_batch_token_key(&config.data_dir) {
        Ok(key) => config.engine_config(key),
        Err(err) => {
            say_error(format_args!("{err}"));
            return ExitCode::FAILURE;
        }
    };
    let result = inbox_engine::Inbox::open(config).and_then(|inbox| {
        f(&inbox)?;
        inbox.shutdown()
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            say_error(format_args!("{err}"));
            ExitCode::FAILURE
        }
    }
}

/// Checks every record of both logs offline. A torn tail is reported but
/// is not a failure: `serve` cuts it at startup and it never held an
/// acknowledged write. Corruption is a failure (exit 1).
fn verify(data_dir: &std::path::Path) -> ExitCode {
    let mut corrupt = false;
    // Both locks are held until the end, so no daemon starts halfway.
    let _locks = match lock_logs(data_dir, "verify") {
        Ok(locks) => locks,
        Err(code) => return code,
    };
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
                match &segment.problem {
                    Some(problem) => problem.to_string(),
                    None if segment.prepared => "ok (prepared, not begun)".to_string(),
                    None => "ok".to_string(),
                },
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
                say_error(format_args!("{stream}: {err}"));
                corrupt = true;
            }
        }
    }
    if !corrupt {
        // The checks `serve` runs at open, read-only and by the same code:
        // the checkpoint against the evt log's end, and every index
        // location against the log it points into.
        match inbox_engine::inbox::verify_data_dir(&inbox_engine::InboxConfig::new(data_dir)) {
            Ok(recovery) => println!(
                "state: recovered from checkpoint at LSN {} + {} records; every message and event location resolves",
                recovery.checkpoint_lsn, recovery.records_replayed
            ),
            Err(err) => {
                say_error(format_args!("state: {err}"));
                corrupt = true;
            }
        }
    }
    if corrupt {
        say_error(format_args!(
            "verify found corruption; serve would refuse to start"
        ));
        ExitCode::FAILURE
    } else {
        println!("verify: ok");
        ExitCode::SUCCESS
    }
}

/// Salvages `from` into `to` and prints the report (see `Command::Salvage`).
fn salvage(
    config: &Config,
    from: std::path::PathBuf,
    to: &std::path::Path,
    json: bool,
) -> ExitCode {
    // The token key does not matter offline; the key file is copied as is.
    let mut engine = config.engine_config([0; 32]);
    // Unless configured, the new logs take the source's segment size, as
    // `serve` keeps an existing store's.
    if config.segment_bytes.is_none() {
        if let Ok(Some(bytes)) = inbox_server::disk_space::existing_segment_bytes(&from) {
            engine.segment_bytes = bytes;
        }
    }
    engine.data_dir = from;
    match inbox_engine::inbox::salvage(&engine, to) {
        Ok(report) => {
            if json {
                println!("{}", inbox_server::salvage::to_json(&report));
            } else {
                print!("{}", inbox_server::salvage::render_text(&report));
            }
            if report.is_lossless() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            }
        }
        Err(err) => {
            say_error(format_args!("salvage: {err}"));
            ExitCode::FAILURE
        }
    }
}

/// Takes the lock of each log directory that exists, or says why not.
fn lock_logs(data_dir: &std::path::Path, what: &str) -> Result<Vec<std::fs::File>, ExitCode> {
    let mut locks = Vec::new();
    for stream in ["msg", "evt"] {
        let dir = data_dir.join(stream);
        if !dir.exists() {
            continue;
        }
        match inbox_engine::log::lock_dir(&dir) {
            Ok(lock) => locks.push(lock),
            Err(err) => {
                say_error(format_args!(
                    "{err}\ninboxd: {what} reads the segments a running daemon writes; stop the daemon, or {what} a copy taken as docs/OPERATIONS.md describes"
                ));
                return Err(ExitCode::from(2));
            }
        }
    }
    Ok(locks)
}

fn dump(
    data_dir: &std::path::Path,
    only: Option<inbox_server::dump::Stream>,
    options: inbox_server::dump::DumpOptions,
) -> ExitCode {
    use inbox_server::dump::{dump_stream_with, Stream};
    let _locks = match lock_logs(data_dir, "dump") {
        Ok(locks) => locks,
        Err(code) => return code,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut damaged = false;
    for stream in [Stream::Msg, Stream::Evt] {
        if only.is_some_and(|o| o != stream) {
            continue;
        }
        let dir = data_dir.join(stream.name());
        if !dir.exists() {
            let _ = writeln!(out, "{}: no log at {}", stream.name(), dir.display());
            continue;
        }
        match dump_stream_with(&dir, stream, options, &mut out) {
            Ok(summary) => {
                damaged |= summary.damaged > 0;
                let _ = writeln!(
                    out,
                    "{}: {} segments, {} batches, {} records, {} segments stop early",
                    stream.name(),
                    summary.segments,
                    summary.batches,
                    summary.records,
                    summary.damaged
                );
            }
            // A closed pipe (`| head`) ends the dump quietly.
            Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
            Err(err) => {
                let _ = out.flush();
                say_error(format_args!("{}: {err}", stream.name()));
                return ExitCode::FAILURE;
            }
        }
    }
    let _ = out.flush();
    if damaged {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
    }

    /// The options the daemon sets: index, environment variable, a probe
    /// value that neither mimalloc's default nor ours nor a neighbouring
    /// option holds, and ours.
    const OPTIONS: [(std::ffi::c_int, &str, std::ffi::c_long, std::ffi::c_long); 3] = [
        (
            MI_OPTION_PURGE_DELAY,
            "MIMALLOC_PURGE_DELAY",
            1234,
            PURGE_DELAY_MS,
        ),
        (
            MI_OPTION_ARENA_EAGER_COMMIT,
            "MIMALLOC_ARENA_EAGER_COMMIT",
            7,
            ARENA_EAGER_COMMIT,
        ),
        (MI_OPTION_ALLOW_THP, "MIMALLOC_ALLOW_THP", 7, ALLOW_THP),
    ];

    fn option(index: std::ffi::c_int) -> std::ffi::c_long {
        // SAFETY: reads an integer option.
        unsafe { mi_option_get(index) }
    }

    /// The child half of the test below: prints the options at the
    /// indexes the daemon sets.
    #[test]
    #[ignore = "run by mimallocs_options_are_the_ones_the_daemon_sets"]
    fn print_the_options_the_daemon_sets() {
        for (index, _, _, _) in OPTIONS {
            println!("option {index} = {}", option(index));
        }
    }

    #[test]
    fn mimallocs_options_are_the_ones_the_daemon_sets() {
        // mimalloc reads its options from the environment as the process
        // starts, so ask a child started with the probe values set.
        let mut child =
            std::process::Command::new(std::env::current_exe().expect("the test binary"));
        child.args([
            "--exact",
            "tests::print_the_options_the_daemon_sets",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        for (_, var, probe, _) in OPTIONS {
            child.env(var, probe.to_string());
        }
        let out = child.output().expect("run the child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        for (index, var, probe, _) in OPTIONS {
            assert!(
                stdout.contains(&format!("option {index} = {probe}\n")),
                "index {index} is not {var} in the linked mimalloc: {stdout}"
            );
        }
        // And with the environment silent, the defaults are ours: the
        // purge delay's set in `serve`, the others as this binary loaded.
        tune_mimalloc();
        for (index, var, _, ours) in OPTIONS {
            if std::env::var_os(var).is_none() {
                assert_eq!(option(index), ours, "{var}");
            }
        }
    }
}
