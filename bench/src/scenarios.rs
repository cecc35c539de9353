//! The scenario drivers. Each runs one scenario against one [`System`] and
//! returns what it measured; `main` turns that into report rows.
//!
//! Every client is a thread with its own connection (closed loop: one
//! request outstanding per connection), started together behind a barrier so
//! that the measured window has every client running. A short warm-up at the
//! start of each run is not recorded.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::hist::Latency;
use crate::procfs::{self, Measured};
use crate::run::CatchUpPlan;
use crate::systems::{Conn, DeviceCursor, Result, Screen, System};
use crate::workload::{DeviceId, OpGen, Outgoing, PreSend, SoakSet, Uid, Workload};

/// What one run of a scenario measured.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Operations in the measured window (sends, pages).
    pub ops: u64,
    /// Sync events written (ingest: the fan-out) or read (sync).
    pub events: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    pub latency: Latency,
    /// `sync`: the read part of each page, before its ACK.
    pub read_latency: Latency,
    /// CPU clock ticks the measured process spent in the window, where
    /// there is a process to measure.
    pub cpu_ticks: Option<u64>,
    /// CPU clock ticks the harness itself (its client threads, and an
    /// embedded system's work) spent in the same window.
    pub harness_ticks: Option<u64>,
    /// A replicated system's members' ticks in the same window, in the
    /// order of [`Meter::member_ticks`].
    pub member_ticks: Vec<Option<u64>>,
}

impl Outcome {
    pub fn ops_per_s(&self) -> f64 {
        per_second(self.ops, self.elapsed)
    }
    pub fn events_per_s(&self) -> f64 {
        per_second(self.events, self.elapsed)
    }
}

pub fn per_second(count: u64, elapsed: Duration) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "counts are far below 2^52")]
    let count = count as f64;
    count / elapsed.as_secs_f64().max(1e-9)
}

/// Reads the CPU counter of the process that does a system's work, at the
/// edges of a measured window.
pub trait Meter: Sync {
    /// Cumulative CPU clock ticks, user + system.
    fn cpu_ticks(&self) -> Option<u64>;

    /// Cumulative ticks of each member of a replicated system, in a fixed
    /// order; empty for a single process.
    fn member_ticks(&self) -> Vec<Option<u64>> {
        Vec::new()
    }
}

impl Meter for Measured {
    fn cpu_ticks(&self) -> Option<u64> {
        Measured::cpu_ticks(*self)
    }
}

impl Meter for Option<Measured> {
    fn cpu_ticks(&self) -> Option<u64> {
        self.and_then(Measured::cpu_ticks)
    }
}

/// The measured process and every member of a replicated system.
pub struct MembersMeter {
    pub measured: Option<Measured>,
    pub pids: Vec<u32>,
}

impl Meter for MembersMeter {
    fn cpu_ticks(&self) -> Option<u64> {
        self.measured.cpu_ticks()
    }

    fn member_ticks(&self) -> Vec<Option<u64>> {
        self.pids
            .iter()
            .map(|&pid| procfs::cpu_ticks(pid))
            .collect()
    }
}

/// The measured window of a timed run, shared by its client threads and
/// its meter: it opens `warmup` after the first client starts and closes
/// `duration` later, or earlier once [`Window::close_now`] is called.
struct Window {
    began: OnceLock<Instant>,
    warmup: Duration,
    duration: Duration,
    /// Nanoseconds from `began` to an early close; `u64::MAX` if none.
    closed_ns: AtomicU64,
}

impl Window {
    fn new(warmup: Duration, duration: Duration) -> Self {
        Self {
            began: OnceLock::new(),
            warmup,
            duration,
            closed_ns: AtomicU64::new(u64::MAX),
        }
    }

    /// Starts the run's clock if no client has yet; the start.
    fn start(&self) -> Instant {
        *self.began.get_or_init(Instant::now)
    }

    fn opens(&self, began: Instant) -> Instant {
        began + self.warmup
    }

    fn closes(&self, began: Instant) -> Instant {
        let planned = began + self.warmup + self.duration;
        match self.closed_ns.load(Ordering::SeqCst) {
            u64::MAX => planned,
            ns => planned.min(began + Duration::from_nanos(ns)),
        }
    }

    fn close_now(&self) {
        let began = self.start();
        let ns = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.closed_ns.fetch_min(ns, Ordering::SeqCst);
    }

    /// How long the window was open, once it has closed.
    fn length(&self) -> Duration {
        let began = self.start();
        self.closes(began)
            .saturating_duration_since(self.opens(began))
    }
}

/// The harness's own CPU counter, user + system over all its threads.
fn harness_ticks() -> Option<u64> {
    procfs::cpu_ticks(std::process::id())
}

/// The ticks a counter moved from `open` to `now`, if it was read both
/// times (and did not go back).
fn ticks_since(open: Option<u64>, now: Option<u64>) -> Option<u64> {
    now?.checked_sub(open?)
}

/// Ticks of the measured process and of the harness over one window.
#[derive(Clone, Debug, Default)]
struct Ticks {
    measured: Option<u64>,
    harness: Option<u64>,
    members: Vec<Option<u64>>,
}

/// The meter's side of a window: one sample as it opens, one as it closes.
/// `stop` says the clients are done (or failed): waiting ends, and a window
/// already open is sampled at once.
fn meter_window(meter: &dyn Meter, window: &Window, stop: &AtomicBool) -> Ticks {
    const POLL: Duration = Duration::from_millis(1);
    let began = loop {
        if let Some(&began) = window.began.get() {
            break began;
        }
        if stop.load(Ordering::SeqCst) {
            return Ticks::default();
        }
        std::thread::sleep(POLL);
    };
    while Instant::now() < window.opens(began) {
        if stop.load(Ordering::SeqCst) {
            return Ticks::default();
        }
        std::thread::sleep(POLL);
    }
    let at_open = (meter.cpu_ticks(), harness_ticks(), meter.member_ticks());
    while Instant::now() < window.closes(began) && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(POLL);
    }
    Ticks {
        measured: ticks_since(at_open.0, meter.cpu_ticks()),
        harness: ticks_since(at_open.1, harness_ticks()),
        members: at_open
            .2
            .into_iter()
            .zip(meter.member_ticks())
            .map(|(open, now)| ticks_since(open, now))
            .collect(),
    }
}

/// Runs `clients` as [`with_clients`] does, with a meter thread that takes
/// the CPU counter as `window` opens and closes.
fn with_metered_clients<T: std::marker::Send>(
    system: &dyn System,
    clients: usize,
    meter: &dyn Meter,
    window: &Window,
    per_client: impl Fn(usize, &mut dyn Conn) -> Result<T> + Sync,
) -> Result<(Vec<T>, Ticks)> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let metering = scope.spawn(|| meter_window(meter, window, &stop));
        let results = with_clients(system, clients, per_client);
        stop.store(true, Ordering::SeqCst);
        let ticks = metering.join().unwrap_or_default();
        results.map(|r| (r, ticks))
    })
}

/// A unique idempotency key per (run, client, send).
fn client_msg_id(run: u64, client: u64, n: u64) -> u128 {
    (u128::from(run) << 64) | (u128::from(client) << 40) | u128::from(n)
}

/// Runs `per_client` on `clients` threads, each with its own connection,
/// all released together once every connection is open. Errors of any
/// client fail the run (after every thread has stopped).
fn with_clients<T: std::marker::Send>(
    system: &dyn System,
    clients: usize,
    per_client: impl Fn(usize, &mut dyn Conn) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let barrier = Barrier::new(clients);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let results: Vec<Result<T>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|client| {
                let (barrier, failed, per_client) = (&barrier, &failed, &per_client);
                scope.spawn(move || {
                    let conn = system.connect();
                    if conn.is_err() {
                        failed.store(true, Ordering::SeqCst);
                    }
                    barrier.wait();
                    if failed.load(Ordering::SeqCst) {
                        return conn.and(Err("another client could not connect".into()));
                    }
                    let mut conn = conn?;
                    per_client(client, &mut *conn)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("client thread panicked".into()))
            })
            .collect()
    });
    results.into_iter().collect()
}

/// `ingest`: every client sends generated messages back to back for
/// `duration` (after `warmup`), recording each reply's latency.
pub fn ingest(
    system: &dyn System,
    workload: &Workload,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    run: u64,
    meter: &dyn Meter,
) -> Result<Outcome> {
    let window = Window::new(warmup, duration);
    let (per_client, ticks) =
        with_metered_clients(system, clients, meter, &window, |client, conn| {
            ingest_client(conn, workload, &window, run, client as u64)
        })?;
    let mut total = Outcome {
        elapsed: duration,
        cpu_ticks: ticks.measured,
        harness_ticks: ticks.harness,
        member_ticks: ticks.members,
        ..Outcome::default()
    };
    for out in per_client {
        total.add(&out);
    }
    Ok(total)
}

impl Outcome {
    /// Adds one client's counts and latencies to the run's.
    fn add(&mut self, out: &Outcome) {
        self.ops += out.ops;
        self.events += out.events;
        self.bytes += out.bytes;
        self.latency.merge(&out.latency);
        self.read_latency.merge(&out.read_latency);
    }
}

/// One ingest client: sends until the window closes, recording the sends
/// made inside it.
fn ingest_client(
    conn: &mut dyn Conn,
    workload: &Workload,
    window: &Window,
    run: u64,
    client: u64,
) -> Result<Outcome> {
    let began = window.start();
    let measure_from = window.opens(began);
    let mut gen = OpGen::new(run.wrapping_mul(1_000_003) ^ client);
    let mut out = Outcome::default();
    let mut n = 0u64;
    loop {
        let op = gen.next_op(workload);
        let mut pair = [0; 2];
        let recipients = workload.recipients(&op, &mut pair);
        let send = Outgoing {
            conv: op.conv,
            sender: op.sender,
            recipients,
            payload: workload.payload(&op),
            client_msg_id: client_msg_id(run, client, n),
        };
        n += 1;
        let t = Instant::now();
        if t >= window.closes(began) {
            break;
        }
        conn.send(&send)?;
        let done = Instant::now();
        if t >= measure_from {
            out.latency.record(done - t);
            out.ops += 1;
            out.events += recipients.len() as u64;
            out.bytes += send.payload.len() as u64;
        }
    }
    Ok(out)
}

/// Writes `sends` through `threads` connections in batches of `batch`:
/// the backlog a scenario reads. Sends are split by conversation, so one
/// thread owns a conversation and its seqs are written in order. Payloads
/// come from `payload(n)`.
pub fn preload<'p>(
    system: &dyn System,
    sends: &[PreSend],
    payload: &(dyn Fn(u64) -> &'p [u8] + Sync),
    threads: usize,
    batch: usize,
    run: u64,
) -> Result<Duration> {
    let start = Instant::now();
    let min_conv = sends.iter().map(|s| s.conv).min().unwrap_or(0);
    let convs = sends
        .iter()
        .map(|s| s.conv - min_conv + 1)
        .max()
        .unwrap_or(1);
    let threads = threads.max(1);
    with_clients(system, threads, |client, conn| {
        let mine: Vec<&PreSend> = sends
            .iter()
            .filter(|s| ((s.conv - min_conv) * threads as u64 / convs) as usize == client)
            .collect();
        let mut n = 0u64;
        for chunk in mine.chunks(batch.max(1)) {
            let batch: Vec<Outgoing<'_>> = chunk
                .iter()
                .map(|s| {
                    n += 1;
                    Outgoing {
                        conv: s.conv,
                        sender: s.sender,
                        recipients: &s.members[..],
                        payload: payload(n),
                        client_msg_id: client_msg_id(run, client as u64, n),
                    }
                })
                .collect();
            conn.send_batch(&batch)?;
        }
        Ok(())
    })?;
    Ok(start.elapsed())
}

/// `sync`, `sync-pipelined` and `reconnect-storm`: `plan.clients`
/// connections take devices off a shared queue and catch each one up until
/// its backlog is empty: page by page (each page read and then ACKed, and
/// timed), or, when `plan.pipelined`, as the system's clients do
/// ([`Conn::catch_up`]), each device's whole catch-up timed. `elapsed` is
/// the time until the last device is caught up.
pub fn catch_up(
    system: &dyn System,
    devices: &[(Uid, DeviceId)],
    plan: &CatchUpPlan,
    meter: &dyn Meter,
) -> Result<Outcome> {
    let page_limit = plan.page;
    // The window is the whole run: connecting the clients is included,
    // which is a few requests next to the pages.
    let ticks_before = meter.cpu_ticks();
    let harness_before = harness_ticks();
    let next = AtomicUsize::new(0);
    let started = Mutex::new(None::<Instant>);
    let finished_ns = AtomicU64::new(0);
    let per_client = with_clients(system, plan.clients, |_, conn| {
        let began = *started
            .lock()
            .expect("no panics while held")
            .get_or_insert_with(Instant::now);
        let mut out = Outcome::default();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(uid, device)) = devices.get(i) else {
                break;
            };
            let mut cursor = DeviceCursor::new(uid, device);
            if plan.pipelined {
                let t = Instant::now();
                let (events, pages, bytes) = conn.catch_up(&mut cursor, page_limit)?;
                out.latency.record(t.elapsed());
                out.ops += pages;
                out.events += events;
                out.bytes += bytes;
                continue;
            }
            loop {
                let t = Instant::now();
                let page = conn.sync_page(&mut cursor, page_limit)?;
                out.latency.record(t.elapsed());
                out.read_latency.record(page.read);
                out.ops += 1;
                out.events += u64::from(page.events);
                out.bytes += page.bytes;
                if !page.has_more {
                    break;
                }
            }
        }
        let ns = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
        finished_ns.fetch_max(ns, Ordering::Relaxed);
        Ok(out)
    })?;
    let mut total = Outcome {
        elapsed: Duration::from_nanos(finished_ns.load(Ordering::Relaxed)),
        cpu_ticks: ticks_since(ticks_before, meter.cpu_ticks()),
        harness_ticks: ticks_since(harness_before, harness_ticks()),
        ..Outcome::default()
    };
    for out in per_client {
        total.add(&out);
    }
    Ok(total)
}

/// What `sync-under-ingest` measured: the sync side and the ingest side of
/// one window, and the CPU of both together.
#[derive(Debug, Default)]
pub struct UnderIngest {
    pub sync: Outcome,
    pub ingest: Outcome,
    /// The devices' backlog ran out before the planned end, which closed
    /// the window early for both sides.
    pub backlog_ran_out: bool,
}

/// `sync-under-ingest`: `sync_clients` connections catch devices up (each
/// page read, then ACKed) while `ingest_clients` other connections run the
/// ingest load, for the same window. Pages are those of `devices`' backlog,
/// so every page is full until a device is caught up; if the backlog runs
/// out, the window closes there for both sides.
#[expect(
    clippy::too_many_arguments,
    reason = "the two loads' sizes and the window; a struct would only rename them"
)]
pub fn sync_under_ingest(
    system: &dyn System,
    workload: &Workload,
    devices: &[(Uid, DeviceId)],
    sync_clients: usize,
    ingest_clients: usize,
    page_limit: u32,
    warmup: Duration,
    duration: Duration,
    run: u64,
    meter: &dyn Meter,
) -> Result<UnderIngest> {
    let window = Window::new(warmup, duration);
    let next = AtomicUsize::new(0);
    let ran_out = AtomicBool::new(false);
    let syncing = AtomicUsize::new(sync_clients);
    let (per_client, ticks) = with_metered_clients(
        system,
        sync_clients + ingest_clients,
        meter,
        &window,
        |client, conn| {
            if client < ingest_clients {
                return ingest_client(conn, workload, &window, run, client as u64)
                    .map(|out| (false, out));
            }
            let began = window.start();
            let mut out = Outcome::default();
            'devices: loop {
                let Some(&(uid, device)) = devices.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    // The last sync client out of devices closes the window:
                    // past it, ingest would run alone.
                    let last = syncing.fetch_sub(1, Ordering::SeqCst) == 1;
                    if last && Instant::now() < window.closes(began) {
                        ran_out.store(true, Ordering::SeqCst);
                        window.close_now();
                    }
                    break;
                };
                let mut cursor = DeviceCursor::new(uid, device);
                loop {
                    let t = Instant::now();
                    if t >= window.closes(began) {
                        break 'devices;
                    }
                    let page = conn.sync_page(&mut cursor, page_limit)?;
                    if t >= window.opens(began) {
                        out.latency.record(t.elapsed());
                        out.read_latency.record(page.read);
                        out.ops += 1;
                        out.events += u64::from(page.events);
                        out.bytes += page.bytes;
                    }
                    if !page.has_more {
                        break;
                    }
                }
            }
            Ok((true, out))
        },
    )?;
    let length = window.length();
    let mut result = UnderIngest {
        backlog_ran_out: ran_out.load(Ordering::SeqCst),
        ..UnderIngest::default()
    };
    result.sync.elapsed = length;
    result.ingest.elapsed = length;
    result.sync.cpu_ticks = ticks.measured;
    result.ingest.cpu_ticks = ticks.measured;
    result.sync.harness_ticks = ticks.harness;
    result.ingest.harness_ticks = ticks.harness;
    for (syncing, out) in per_client {
        if syncing {
            result.sync.add(&out);
        } else {
            result.ingest.add(&out);
        }
    }
    Ok(result)
}

/// What `long-offline` measured.
#[derive(Debug, Default)]
pub struct LongOfflineOutcome {
    pub first_screen: Duration,
    pub total: Duration,
    pub screen: Screen,
    pub events: u64,
    pub pages: u64,
    pub bytes: u64,
    /// The same backlog replayed by the user's other device, without
    /// summaries: events and their bytes.
    pub bare_events: u64,
    pub bare_bytes: u64,
}

/// `long-offline`: the returning user's device fetches its first screen
/// (conversation list and the newest `per_conv` messages of each), then
/// catches its sync stream up to the end, ACKing after every `ack_every`
/// pages and after the last.
pub fn long_offline(
    system: &dyn System,
    user: Uid,
    per_conv: u32,
    page_limit: u32,
    ack_every: u32,
) -> Result<LongOfflineOutcome> {
    let mut conn = system.connect()?;
    let start = Instant::now();
    let screen = conn.first_screen(user, per_conv)?;
    let first_screen = start.elapsed();
    let mut out = LongOfflineOutcome {
        first_screen,
        screen,
        bytes: screen.bytes,
        ..LongOfflineOutcome::default()
    };
    let mut device = DeviceCursor::new(user, 1);
    device.ack_every = ack_every;
    let (events, pages, bytes) = conn.catch_up(&mut device, page_limit)?;
    out.total = start.elapsed();
    out.events = events;
    out.pages = pages;
    out.bytes += bytes;
    let mut bare = DeviceCursor::new(user, crate::workload::LONG_OFFLINE_BARE_DEVICE);
    bare.ids_only = true;
    bare.ack_every = ack_every;
    (out.bare_events, _, out.bare_bytes) = conn.catch_up(&mut bare, page_limit)?;
    Ok(out)
}

/// Writes one-to-one sends with `payload_bytes` payloads until the system
/// holds `target_bytes` on disk (for `recovery` at a given size).
pub fn fill(
    system: &dyn System,
    workload: &Workload,
    target_bytes: u64,
    payload_bytes: usize,
    threads: usize,
) -> Result<Duration> {
    let start = Instant::now();
    let pool: Vec<u8> = (0..payload_bytes * 4)
        .map(|_| rand::random::<u8>())
        .collect();
    let span = (pool.len() - payload_bytes) as u64;
    let payload = |n: u64| {
        let at = (n.wrapping_mul(4099) % span) as usize;
        &pool[at..at + payload_bytes]
    };
    let direct: Vec<PreSend> = workload
        .conversations()
        .into_iter()
        .filter(|c| c.members.len() == 2)
        .take(4096)
        .map(|c| PreSend {
            conv: c.conv,
            sender: c.members[0],
            members: c.members.into(),
        })
        .collect();
    let per_round = (64usize << 20) / payload_bytes.max(1);
    let mut round = 0u64;
    while system.data_bytes() < target_bytes {
        let sends: Vec<PreSend> = direct.iter().cycle().take(per_round).cloned().collect();
        round += 1;
        preload(system, &sends, &payload, threads, 16, 0xf111 + round)?;
        if round > 100_000 {
            return Err("fill: the data directory does not grow".into());
        }
    }
    Ok(start.elapsed())
}

/// `mixed`: the ingest load at `clients`, first alone, then while another
/// thread runs compaction passes back to back. Returns both outcomes and
/// the passes run.
pub fn mixed(
    system: &dyn System,
    workload: &Workload,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    run: u64,
    meter: &dyn Meter,
) -> Result<(Outcome, Outcome, u64)> {
    system.compact_now()?;
    let quiet = ingest(system, workload, clients, warmup, duration, run, meter)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let passes = AtomicU64::new(0);
    let compacting = std::thread::scope(|scope| {
        let compactor = scope.spawn(|| -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                system.compact_now()?;
                passes.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        });
        let out = ingest(system, workload, clients, warmup, duration, run + 1, meter);
        stop.store(true, Ordering::Relaxed);
        let compacted = compactor
            .join()
            .unwrap_or_else(|_| Err("compaction thread panicked".into()));
        compacted.and(out)
    })?;
    Ok((quiet, compacting, passes.load(Ordering::Relaxed)))
}

/// Sizes of a soak.
#[derive(Clone, Debug)]
pub struct SoakPlan {
    /// Messages to send in all.
    pub messages: u64,
    pub clients: usize,
    /// Messages each client sends to each of its conversations per batch,
    /// before every device of those conversations syncs.
    pub per_conv_batch: u32,
    pub page: u32,
    /// Sample memory each time this many more messages have been sent.
    pub sample_every: u64,
    /// Ask for a compaction pass this often.
    pub compact_every: Duration,
}

/// What a soak measured, besides its samples.
#[derive(Debug, Default)]
pub struct SoakOutcome {
    /// Send batches: ops and latency per batch; `events` the messages.
    pub sends: Outcome,
    /// Sync pages, read and ACKed.
    pub pages: Outcome,
    pub elapsed: Duration,
    /// Compaction passes run; `None` when the system has no compaction
    /// driver (the first request said so).
    pub compaction_passes: Option<u64>,
    pub cpu_ticks: Option<u64>,
}

/// `soak`: sustained one-to-one sends, every device syncing and ACKing
/// after each batch, compaction requested every `compact_every`. Each
/// client owns every `clients`-th conversation of `set` (and so both its
/// users and all their devices). `sample(messages_sent)` is called from
/// the driving thread at the start, every `sample_every` messages (as
/// close as it can poll) and at the end.
pub fn soak<'p>(
    system: &dyn System,
    set: &SoakSet,
    plan: &SoakPlan,
    payload: &(dyn Fn(u64) -> &'p [u8] + Sync),
    meter: &dyn Meter,
    sample: &mut dyn FnMut(u64) -> Result<()>,
) -> Result<SoakOutcome> {
    let clients = plan.clients.clamp(1, set.convs.len().max(1));
    let claimed = AtomicU64::new(0);
    let sent = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let passes = AtomicU64::new(0);
    let no_compaction = AtomicBool::new(false);
    let ticks_before = meter.cpu_ticks();
    sample(0)?;
    let start = Instant::now();
    let (per_client, sampled) = std::thread::scope(|scope| {
        // The first pass runs whatever the driver has done by then, so a
        // soak that finishes before this thread is scheduled still compacts.
        let compactor = scope.spawn(|| loop {
            if system.compact_now().is_err() {
                no_compaction.store(true, Ordering::SeqCst);
                return;
            }
            passes.fetch_add(1, Ordering::Relaxed);
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let next = Instant::now() + plan.compact_every;
            while Instant::now() < next && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let driving = scope.spawn(|| {
            let out = with_clients(system, clients, |client, conn| {
                soak_client(conn, set, plan, payload, client, clients, &claimed, &sent)
            });
            stop.store(true, Ordering::SeqCst);
            out
        });
        let mut next_sample = plan.sample_every.max(1);
        // The messages sent at the last sample, or the sampling error.
        let mut sampled: Result<Option<u64>> = Ok(Some(0));
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
            let now = sent.load(Ordering::SeqCst);
            if now >= next_sample && sampled.is_ok() {
                sampled = sample(now).map(|()| Some(now));
                while next_sample <= now {
                    next_sample += plan.sample_every.max(1);
                }
            }
        }
        let per_client = driving
            .join()
            .unwrap_or_else(|_| Err("soak driver panicked".into()));
        let _ = compactor.join();
        (per_client, sampled)
    });
    let elapsed = start.elapsed();
    let per_client = per_client?;
    let last_sampled = sampled?;
    let total = sent.load(Ordering::SeqCst);
    if last_sampled != Some(total) {
        sample(total)?;
    }
    let mut out = SoakOutcome {
        elapsed,
        compaction_passes: (!no_compaction.load(Ordering::SeqCst))
            .then(|| passes.load(Ordering::Relaxed)),
        cpu_ticks: ticks_since(ticks_before, meter.cpu_ticks()),
        ..SoakOutcome::default()
    };
    for (sends, pages) in per_client {
        out.sends.add(&sends);
        out.pages.add(&pages);
    }
    out.sends.elapsed = elapsed;
    out.pages.elapsed = elapsed;
    Ok(out)
}

/// One soak client: batches to its conversations, then every device of
/// their users caught up, until the plan's messages are all claimed.
#[expect(
    clippy::too_many_arguments,
    reason = "the shared counters of one scenario; a struct would only rename them"
)]
fn soak_client<'p>(
    conn: &mut dyn Conn,
    set: &SoakSet,
    plan: &SoakPlan,
    payload: &(dyn Fn(u64) -> &'p [u8] + Sync),
    client: usize,
    clients: usize,
    claimed: &AtomicU64,
    sent: &AtomicU64,
) -> Result<(Outcome, Outcome)> {
    let mine: Vec<_> = set.convs.iter().skip(client).step_by(clients).collect();
    let mut cursors: Vec<DeviceCursor> = mine
        .iter()
        .flat_map(|c| c.members.iter().copied())
        .flat_map(|uid| (1..=u64::from(set.devices_per_user)).map(move |d| (uid, d)))
        .map(|(uid, device)| DeviceCursor::new(uid, device))
        .collect();
    let (mut sends, mut pages) = (Outcome::default(), Outcome::default());
    let per_batch = mine.len() as u64 * u64::from(plan.per_conv_batch.max(1));
    let mut n = 0u64;
    loop {
        let from = claimed.fetch_add(per_batch, Ordering::SeqCst);
        if from >= plan.messages {
            break;
        }
        let count = per_batch.min(plan.messages - from);
        let batch: Vec<Outgoing<'_>> = (0..count)
            .map(|i| {
                let conv = mine[(i % mine.len() as u64) as usize];
                n += 1;
                Outgoing {
                    conv: conv.conv,
                    // The two sides take turns.
                    sender: conv.members[((i / mine.len() as u64) % 2) as usize],
                    recipients: &conv.members,
                    payload: payload(from + i),
                    client_msg_id: client_msg_id(0x50a6, client as u64, n),
                }
            })
            .collect();
        let t = Instant::now();
        conn.send_batch(&batch)?;
        sends.latency.record(t.elapsed());
        sends.ops += 1;
        sends.events += count;
        sends.bytes += batch.iter().map(|s| s.payload.len() as u64).sum::<u64>();
        sent.fetch_add(count, Ordering::SeqCst);
        for cursor in &mut cursors {
            loop {
                let t = Instant::now();
                let page = conn.sync_page(cursor, plan.page)?;
                pages.latency.record(t.elapsed());
                pages.read_latency.record(page.read);
                pages.ops += 1;
                pages.events += u64::from(page.events);
                pages.bytes += page.bytes;
                if !page.has_more {
                    break;
                }
            }
        }
    }
    Ok((sends, pages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systems::Page;
    use crate::workload::{Setup, SoakSet, SyncSet, WorkloadConfig};
    use std::collections::HashMap;

    /// An in-memory system: a model of the semantics the drivers rely on,
    /// so the drivers' bookkeeping can be checked without a server.
    #[derive(Default)]
    struct Model {
        streams: Mutex<HashMap<Uid, u64>>,
        /// Per user, the conversations they have messages in.
        convs: Mutex<HashMap<Uid, std::collections::BTreeSet<u64>>>,
        sends: AtomicU64,
        compactions: AtomicU64,
        /// Time each page takes, so that a run can outlast its backlog.
        page_delay: Duration,
    }

    struct ModelConn<'a>(&'a Model);

    impl Conn for ModelConn<'_> {
        fn send(&mut self, send: &Outgoing<'_>) -> Result<()> {
            let mut streams = self.0.streams.lock().expect("lock");
            let mut convs = self.0.convs.lock().expect("lock");
            for uid in send.recipients {
                *streams.entry(*uid).or_default() += 1;
                convs.entry(*uid).or_default().insert(send.conv);
            }
            self.0.sends.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn sync_page(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<Page> {
            std::thread::sleep(self.0.page_delay);
            let len = self
                .0
                .streams
                .lock()
                .expect("lock")
                .get(&device.uid)
                .copied()
                .unwrap_or(0);
            let n = (len - device.acked).min(u64::from(limit));
            device.acked += n;
            Ok(Page {
                events: n as u32,
                bytes: n * 10,
                has_more: device.acked < len,
                read: Duration::from_micros(3),
            })
        }
        fn first_screen(&mut self, uid: Uid, per_conv: u32) -> Result<Screen> {
            let convs = self
                .0
                .convs
                .lock()
                .expect("lock")
                .get(&uid)
                .map_or(0, |c| c.len() as u32);
            Ok(Screen {
                convs,
                messages: convs * per_conv,
                bytes: u64::from(convs),
            })
        }
    }

    impl System for Model {
        fn name(&self) -> &str {
            "model"
        }
        fn connect(&self) -> Result<Box<dyn Conn + '_>> {
            Ok(Box::new(ModelConn(self)))
        }
        fn prepare(&self, _: &Setup) -> Result<()> {
            Ok(())
        }
        fn compact_now(&self) -> Result<()> {
            self.compactions.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1));
            Ok(())
        }
    }

    #[test]
    fn long_offline_fetches_the_first_screen_then_every_event_of_the_returning_user() {
        let model = Model::default();
        let lo = crate::workload::LongOffline::new(3, 10, 600, 5, 40);
        let workload = Workload::new(
            WorkloadConfig {
                users: 1_000,
                ..WorkloadConfig::default()
            },
            1,
        )
        .expect("workload");
        let payload = |n: u64| workload.payload_at(n);
        preload(&model, &lo.sends(3), &payload, 2, 50, 1).expect("preload");
        let out = long_offline(&model, lo.user, 20, 100, 1).expect("long offline");
        assert_eq!(
            out.screen.convs, 8,
            "3 groups and 5 one-to-one conversations"
        );
        assert_eq!(out.events, 640);
        assert_eq!(out.pages, 7);
        assert!(out.first_screen <= out.total);
        assert_eq!(out.bytes, 8 + 640 * 10);
    }

    #[test]
    fn mixed_measures_the_load_alone_and_with_compaction_passes_running() {
        let model = Model::default();
        let workload = Workload::new(
            WorkloadConfig {
                users: 1_000,
                ..WorkloadConfig::default()
            },
            1,
        )
        .expect("workload");
        let (quiet, busy, passes) = mixed(
            &model,
            &workload,
            2,
            Duration::ZERO,
            Duration::from_millis(50),
            1,
            &None,
        )
        .expect("mixed");
        assert!(quiet.ops > 0 && busy.ops > 0);
        assert!(passes > 0);
        // One pass before the quiet run, the rest during the busy one.
        assert_eq!(model.compactions.load(Ordering::Relaxed), passes + 1);
    }

    #[test]
    fn ingest_counts_every_recorded_send_and_its_fan_out() {
        let model = Model::default();
        let config = WorkloadConfig {
            users: 1_000,
            ..WorkloadConfig::default()
        };
        let workload = Workload::new(config, 1).expect("workload");
        let out = ingest(
            &model,
            &workload,
            4,
            Duration::ZERO,
            Duration::from_millis(100),
            1,
            &None,
        )
        .expect("ingest");
        assert_eq!(out.cpu_ticks, None, "nothing to measure");
        assert!(out.ops > 0);
        assert_eq!(out.latency.count(), out.ops);
        assert!(out.ops <= model.sends.load(Ordering::Relaxed));
        assert_eq!(out.bytes, out.ops * 200);
        // Two events per one-to-one send, 200 per group send.
        assert!(out.events >= 2 * out.ops && out.events <= 200 * out.ops);
    }

    /// A model holding a backlog of 250 events for each of 20 users, and
    /// their 3 devices each.
    fn backlogged() -> (Model, Vec<(Uid, DeviceId)>) {
        let model = Model::default();
        let workload = Workload::new(
            WorkloadConfig {
                users: 1_000,
                ..WorkloadConfig::default()
            },
            1,
        )
        .expect("workload");
        let set = SyncSet::new(0, 20, 3, 250);
        let payload = |n: u64| workload.payload_at(n);
        preload(&model, &set.backlog_sends(), &payload, 3, 16, 2).expect("preload");
        (model, set.devices().collect())
    }

    #[test]
    fn catch_up_reads_every_backlogged_event_of_every_device_once() {
        let (model, devices) = backlogged();
        let out = catch_up(&model, &devices, &plan(5, false), &None).expect("catch up");
        assert_eq!(out.events, 20 * 3 * 250);
        // 250 events in pages of 100: 3 pages per device.
        assert_eq!(out.ops, 60 * 3);
        assert_eq!(out.latency.count(), out.ops);
        assert_eq!(out.read_latency.count(), out.ops);
        assert_eq!(
            out.read_latency.quantile_us(0.5),
            3,
            "the read part is kept apart"
        );
        assert_eq!(out.bytes, out.events * 10);
    }

    /// A catch-up plan of `clients` connections and pages of 100.
    fn plan(clients: usize, pipelined: bool) -> CatchUpPlan {
        CatchUpPlan {
            users: 0,
            devices_per_user: 0,
            backlog: 0,
            clients,
            page: 100,
            pipelined,
        }
    }

    #[test]
    fn a_pipelined_catch_up_counts_every_page_and_times_each_device_once() {
        let (model, devices) = backlogged();
        let out = catch_up(&model, &devices, &plan(5, true), &None).expect("catch up");
        assert_eq!(out.events, 20 * 3 * 250);
        assert_eq!(out.ops, 60 * 3, "pages, as page after page counts them");
        assert_eq!(out.latency.count(), 60, "one timing per device");
        assert_eq!(out.read_latency.count(), 0, "no page is timed alone");
        assert_eq!(out.bytes, out.events * 10);
    }

    #[test]
    fn a_client_that_cannot_connect_fails_the_run_without_hanging_the_others() {
        struct Refusing;
        impl System for Refusing {
            fn name(&self) -> &str {
                "refusing"
            }
            fn connect(&self) -> Result<Box<dyn Conn + '_>> {
                Err("connection refused".into())
            }
            fn prepare(&self, _: &Setup) -> Result<()> {
                Ok(())
            }
        }
        let err = catch_up(&Refusing, &[(1, 1)], &plan(3, false), &None).expect_err("must fail");
        assert!(err.to_string().contains("refused") || err.to_string().contains("connect"));
    }

    fn small_workload() -> Workload {
        Workload::new(
            WorkloadConfig {
                users: 1_000,
                ..WorkloadConfig::default()
            },
            1,
        )
        .expect("workload")
    }

    /// A CPU counter that ticks with wall time, 1 tick per millisecond
    /// since `0`, and remembers when it was read.
    struct Clock(Instant, Mutex<Vec<u64>>);

    impl Clock {
        fn new() -> Self {
            Clock(Instant::now(), Mutex::new(Vec::new()))
        }
    }

    impl Meter for Clock {
        fn cpu_ticks(&self) -> Option<u64> {
            let ms = u64::try_from(self.0.elapsed().as_millis()).ok()?;
            self.1.lock().expect("samples").push(ms);
            Some(ms)
        }
    }

    #[test]
    fn the_meter_samples_the_cpu_counter_at_the_edges_of_the_measured_window() {
        let model = Model::default();
        let clock = Clock::new();
        let out = ingest(
            &model,
            &small_workload(),
            2,
            Duration::from_millis(100),
            Duration::from_millis(200),
            1,
            &clock,
        )
        .expect("ingest");
        // Two samples: the first once the 100 ms warm-up is over (so it is
        // left out), the second once the 200 ms window after it closed.
        // Only lower bounds: a loaded machine may sample later, never
        // earlier.
        let samples = clock.1.lock().expect("samples").clone();
        let [opened, closed] = samples[..] else {
            panic!("sampled {samples:?}, not once at each edge");
        };
        assert!(opened >= 100, "sampled at {opened} ms, inside the warm-up");
        assert!(
            closed >= 300,
            "sampled at {closed} ms, before the window closed"
        );
        assert_eq!(out.cpu_ticks, Some(closed - opened));
    }

    #[test]
    fn the_meter_gives_up_without_a_figure_when_the_clients_cannot_start() {
        struct Refusing;
        impl System for Refusing {
            fn name(&self) -> &str {
                "refusing"
            }
            fn connect(&self) -> Result<Box<dyn Conn + '_>> {
                Err("connection refused".into())
            }
            fn prepare(&self, _: &Setup) -> Result<()> {
                Ok(())
            }
        }
        let started = Instant::now();
        let err = ingest(
            &Refusing,
            &small_workload(),
            2,
            Duration::from_secs(30),
            Duration::from_secs(30),
            1,
            &Clock::new(),
        );
        assert!(err.is_err());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no wait for the window"
        );
    }

    #[test]
    fn sync_under_ingest_reads_full_pages_beside_sends_until_the_window_closes() {
        let model = Model {
            page_delay: Duration::from_millis(1),
            ..Model::default()
        };
        let workload = small_workload();
        let set = SyncSet::new(4, 50, 4, 1_000);
        let payload = |n: u64| workload.payload_at(n);
        preload(&model, &set.backlog_sends(), &payload, 2, 50, 4).expect("preload");
        let devices: Vec<_> = set.devices().collect();
        let out = sync_under_ingest(
            &model,
            &workload,
            &devices,
            3,
            3,
            100,
            Duration::ZERO,
            Duration::from_millis(150),
            9,
            &Clock::new(),
        )
        .expect("sync under ingest");
        assert!(
            out.sync.ops > 0 && out.ingest.ops > 0,
            "{} pages, {} sends, ran out {}",
            out.sync.ops,
            out.ingest.ops,
            out.backlog_ran_out
        );
        assert_eq!(out.sync.read_latency.count(), out.sync.ops);
        assert_eq!(out.ingest.latency.count(), out.ingest.ops);
        assert!(out.sync.events <= out.sync.ops * 100);
        assert_eq!(out.sync.elapsed, out.ingest.elapsed, "one window");
        assert!(out.sync.cpu_ticks.is_some());
        if !out.backlog_ran_out {
            assert_eq!(out.sync.elapsed, Duration::from_millis(150));
        }
    }

    #[test]
    fn sync_under_ingest_closes_the_window_for_both_sides_when_the_backlog_runs_out() {
        let model = Model::default();
        let workload = small_workload();
        let set = SyncSet::new(4, 4, 1, 200);
        let payload = |n: u64| workload.payload_at(n);
        preload(&model, &set.backlog_sends(), &payload, 1, 50, 4).expect("preload");
        let devices: Vec<_> = set.devices().collect();
        let started = Instant::now();
        let out = sync_under_ingest(
            &model,
            &workload,
            &devices,
            2,
            2,
            100,
            Duration::ZERO,
            Duration::from_secs(30),
            9,
            &None,
        )
        .expect("sync under ingest");
        assert!(out.backlog_ran_out);
        assert!(started.elapsed() < Duration::from_secs(10), "closed early");
        assert!(out.sync.elapsed < Duration::from_secs(10));
        assert_eq!(out.sync.events, 4 * 200, "every backlogged event read once");
    }

    #[test]
    fn soak_sends_exactly_the_planned_messages_and_leaves_every_device_caught_up() {
        let model = Model::default();
        let workload = small_workload();
        let set = SoakSet::new(5, 12, 2);
        let plan = SoakPlan {
            messages: 1_001,
            clients: 4,
            per_conv_batch: 3,
            page: 100,
            sample_every: 200,
            compact_every: Duration::from_millis(1),
        };
        let payload = |n: u64| workload.payload_at(n);
        let mut sampled = Vec::new();
        let out = soak(&model, &set, &plan, &payload, &None, &mut |sent| {
            sampled.push(sent);
            Ok(())
        })
        .expect("soak");
        assert_eq!(out.sends.events, 1_001);
        assert_eq!(model.sends.load(Ordering::Relaxed), 1_001);
        // Each message is one event for each of the two users, read by
        // each of their two devices.
        assert_eq!(out.pages.events, 1_001 * 2 * 2);
        // How many samples fall inside the run depends on how the sampler
        // is scheduled against the senders; the first and last do not.
        assert_eq!(sampled.first(), Some(&0));
        assert_eq!(sampled.last(), Some(&1_001));
        assert!(
            sampled.windows(2).all(|w| w[0] < w[1]),
            "no message count sampled twice: {sampled:?}"
        );
        assert!(out.compaction_passes.expect("the model compacts") > 0);
    }

    #[test]
    fn soak_says_when_a_system_has_no_compaction() {
        struct NoCompaction(Model);
        impl System for NoCompaction {
            fn name(&self) -> &str {
                "plain"
            }
            fn connect(&self) -> Result<Box<dyn Conn + '_>> {
                self.0.connect()
            }
            fn prepare(&self, setup: &Setup) -> Result<()> {
                self.0.prepare(setup)
            }
        }
        let system = NoCompaction(Model::default());
        let workload = small_workload();
        let plan = SoakPlan {
            messages: 50,
            clients: 2,
            per_conv_batch: 1,
            page: 10,
            sample_every: 10,
            compact_every: Duration::from_millis(1),
        };
        let payload = |n: u64| workload.payload_at(n);
        let out = soak(
            &system,
            &SoakSet::new(5, 4, 1),
            &plan,
            &payload,
            &None,
            &mut |_| Ok(()),
        )
        .expect("soak");
        assert_eq!(out.compaction_passes, None);
        assert_eq!(out.pages.events, 50 * 2);
    }
}
