//! Prometheus metrics (R26) on `prometheus-client`, served by hyper with
//! `/healthz` and `/readyz` beside `/metrics`.
//!
//! What a scrape costs: the server's own figures (requests, latencies,
//! connections, hints, subscriptions) are counters and histograms updated
//! on the request path, so encoding them is O(number of series) and takes
//! no lock the request path waits on. The engine's figures come from
//! [`Inbox::stats`] at each scrape: the engine keeps its counts (users,
//! devices, messages, live events) as running totals, so that is three
//! numbers read under the state's read lock (held by the sequencer for
//! one command at most) and a pass over the logs' segment list, with no
//! walk of users or conversations. Only the memory breakdown walks them:
//! [`refresh_memory`] takes it every [`MEMORY_INTERVAL`] on the blocking
//! pool, scrapes encode the latest copy, and
//! `inboxd_memory_age_seconds` says how old it is.
//!
//! Nothing here ever sees a message body or a token.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use inbox_engine::{ConvPull, Inbox, MemoryReport, SyncPage};
use inbox_wire::{ErrorCode, Op};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

use crate::tls::TlsAcceptor;

/// Latency buckets, seconds: 50 µs to 5 s.
const LATENCY_BUCKETS_S: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
];
/// Count buckets for page sizes and cursor lag.
const COUNT_BUCKETS: &[f64] = &[
    0.0, 1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 10_000.0, 100_000.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    op: &'static str,
    result: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_S.iter().copied())
}

/// Every metric the daemon exports, and the registry that encodes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    request_seconds: Family<OpLabel, Histogram, fn() -> Histogram>,
    requests: Family<ResultLabels, Counter>,
    sync_page_events: Histogram,
    pull_messages_per_conv: Histogram,
    device_cursor_lag: Histogram,
    pub connections_open: Gauge,
    pub connections: Counter,
    pub connections_refused: Counter,
    pub frames_rejected: Counter,
    pub hints_sent: Counter,
    pub hints_dropped: Counter,
    /// Subscriptions held by all connections; its atomic is also what the
    /// server-wide subscription cap is checked and reserved against.
    pub subscriptions: Gauge<u64, AtomicU64>,
    /// Bytes of the engine queue's budget held by unanswered writes.
    pub engine_queue_bytes: Gauge<u64, AtomicU64>,
    pub tls_handshakes_failed: Counter,
    /// Read attempts run where they were asked for (memory only, or
    /// records the page cache holds) and on the read pool.
    pub reads_in_place: Counter,
    pub reads_pooled: Counter,
    /// Sends decided and committed on their connection's worker
    /// ([`crate::alone`]).
    pub sends_on_worker: Counter,
    /// Looks at the kernel's page-cache counters that found pages
    /// reclaimed since the look before (`page_cache.rs`).
    pub page_cache_reclaims_seen: Counter,
    engine: Arc<EngineFigures>,
    /// False once shutdown began: `/readyz` answers 503.
    ready: Arc<AtomicBool>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let request_seconds = Family::<OpLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "inboxd_request_seconds",
            "Request latency by opcode, from frame decoded to reply queued",
            request_seconds.clone(),
        );
        let requests = Family::<ResultLabels, Counter>::default();
        registry.register(
            "inboxd_requests",
            "Requests by opcode and result code",
            requests.clone(),
        );
        let histogram = |registry: &mut Registry, name: &str, help: &str| {
            let metric = Histogram::new(COUNT_BUCKETS.iter().copied());
            registry.register(name, help, metric.clone());
            metric
        };
        let sync_page_events = histogram(
            &mut registry,
            "inboxd_sync_page_events",
            "Events per sync page",
        );
        let pull_messages_per_conv = histogram(
            &mut registry,
            "inboxd_pull_messages_per_conv",
            "Messages per conversation in a pull reply",
        );
        let device_cursor_lag = histogram(
            &mut registry,
            "inboxd_device_cursor_lag_events",
            "Batch high watermark minus the device's ACK, per sync page",
        );
        let counter = |registry: &mut Registry, name: &str, help: &str| {
            let metric = Counter::default();
            registry.register(name, help, metric.clone());
            metric
        };
        let connections_open = Gauge::default();
        registry.register(
            "inboxd_connections_open",
            "Open client connections",
            connections_open.clone(),
        );
        let subscriptions = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "inboxd_subscriptions",
            "Uids subscribed to hints, over all connections",
            subscriptions.clone(),
        );
        let engine_queue_bytes = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "inboxd_engine_queue_bytes",
            "Budget held by writes queued on the engine and not yet answered \
             (engine_queue_bytes_max bounds it)",
            engine_queue_bytes.clone(),
        );
        let engine = Arc::new(EngineFigures::default());
        registry.register_collector(Box::new(EngineCollector(Arc::clone(&engine))));
        Self {
            connections: counter(
                &mut registry,
                "inboxd_connections",
                "Accepted client connections",
            ),
            connections_refused: counter(
                &mut registry,
                "inboxd_connections_refused",
                "Connections refused by the connection limit",
            ),
            frames_rejected: counter(
                &mut registry,
                "inboxd_frames_rejected",
                "Frames that closed their connection (oversized, corrupt, unauthenticated)",
            ),
            hints_sent: counter(
                &mut registry,
                "inboxd_hints_sent",
                "Hints pushed to subscribers",
            ),
            hints_dropped: counter(
                &mut registry,
                "inboxd_hints_dropped",
                "Hint rounds dropped because a subscriber was slow",
            ),
            tls_handshakes_failed: counter(
                &mut registry,
                "inboxd_tls_handshakes_failed",
                "TLS handshakes that failed or timed out (protocol and metrics ports)",
            ),
            reads_in_place: counter(
                &mut registry,
                "inboxd_reads_in_place",
                "Read attempts built on the connection's worker: memory only, or \
                 log records the page cache holds",
            ),
            reads_pooled: counter(
                &mut registry,
                "inboxd_reads_pooled",
                "Read attempts run on the read pool because they may read the disk",
            ),
            sends_on_worker: counter(
                &mut registry,
                "inboxd_sends_on_worker",
                "Sends decided and committed on their connection's worker, while \
                 that connection alone made requests, rather than on the sequencer",
            ),
            page_cache_reclaims_seen: counter(
                &mut registry,
                "inboxd_page_cache_reclaims_seen",
                "Looks at the kernel's page-cache counters (every 100 ms) that found pages \
                 reclaimed since the look before: log records written until then count as \
                 uncached, and old reads go to the read pool",
            ),
            registry,
            request_seconds,
            requests,
            sync_page_events,
            pull_messages_per_conv,
            device_cursor_lag,
            connections_open,
            subscriptions,
            engine_queue_bytes,
            engine,
            ready: Arc::new(AtomicBool::new(true)),
        }
    }
}

impl Metrics {
    /// Counts one request of `op` that ended with `code` (`None` = ok).
    pub fn observe_request(&self, op: Op, code: Option<ErrorCode>, elapsed: Duration) {
        self.request_seconds
            .get_or_create(&OpLabel { op: op.name() })
            .observe(elapsed.as_secs_f64());
        let result = code.map_or("OK", ErrorCode::name);
        self.requests
            .get_or_create(&ResultLabels {
                op: op.name(),
                result,
            })
            .inc();
    }

    /// Counts a request that was refused before it reached the engine
    /// (rate limit, bad body, unknown opcode, admin request without the
    /// admin token, subscription cap).
    pub fn observe_refused(&self, op_name: &'static str, code: ErrorCode) {
        self.requests
            .get_or_create(&ResultLabels {
                op: op_name,
                result: code.name(),
            })
            .inc();
    }

    pub fn observe_sync_page(&self, page: &SyncPage) {
        self.sync_page_events.observe(page.events.len() as f64);
        let lag = page.batch_hwm.saturating_since(page.acked_sync_seq);
        self.device_cursor_lag.observe(lag as f64);
    }

    pub fn observe_pull(&self, pulled: &[ConvPull]) {
        for conv in pulled {
            self.pull_messages_per_conv
                .observe(conv.messages.len() as f64);
        }
    }

    /// Says the daemon is draining: `/readyz` answers 503 from now on.
    pub fn set_not_ready(&self) {
        self.ready.store(false, Ordering::Relaxed);
    }

    /// Exports `group`'s raft figures (`inboxd_raft_*`) from now on, and
    /// the engine figures of the group's engine, which a snapshot's
    /// install replaces whole.
    pub fn watch_group(&self, group: crate::cluster::GroupHandle) {
        *self.engine.group.lock().unwrap_or_else(|p| p.into_inner()) = Some(group);
    }

    /// Exports `inbox`'s figures from now on (a single node's engine; a
    /// group's comes from [`Metrics::watch_group`]).
    pub fn watch_engine(&self, inbox: Arc<Inbox>) {
        *self.engine.inbox.lock().unwrap_or_else(|p| p.into_inner()) = Some(inbox);
    }

    /// The OpenMetrics text of every metric. Encodes what is already
    /// counted; never walks the engine's users or conversations.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 << 10);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Where the engine's figures come from.
#[derive(Default)]
struct EngineFigures {
    /// A single node's engine, asked at each scrape.
    inbox: Mutex<Option<Arc<Inbox>>>,
    /// The memory breakdown, taken every [`MEMORY_INTERVAL`]: it walks
    /// every user and conversation.
    memory: Mutex<Option<(MemoryReport, Instant)>>,
    /// A group member's raft view, read at each scrape (raft keeps its
    /// metrics current; reading them is a copy of a small struct).
    group: Mutex<Option<crate::cluster::GroupHandle>>,
}

/// How often the refresh takes the memory breakdown.
pub const MEMORY_INTERVAL: Duration = Duration::from_secs(30);

/// Encodes [`EngineFigures`] at scrape time: the engine's counts as they
/// are, the memory breakdown as last taken.
#[derive(Debug)]
struct EngineCollector(Arc<EngineFigures>);

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> std::fmt::Result {
    let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Microseconds the engine sums, as the seconds a metric carries.
fn seconds(micros: u64) -> f64 {
    micros as f64 / 1e6
}

fn counter<N: prometheus_client::encoding::EncodeCounterValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: N,
) -> std::fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl std::fmt::Debug for EngineFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineFigures")
            .field("memory", &self.memory)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl EngineFigures {
    /// The engine watched, if any: a group member's is the one its last
    /// snapshot install opened.
    fn engine(&self) -> Option<Arc<Inbox>> {
        if let Some(group) = &*self.group.lock().unwrap_or_else(|p| p.into_inner()) {
            return Some(group.inbox());
        }
        self.inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Arc::clone)
    }
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        encode_raft(&mut encoder, &self.0)?;
        encode_memory(&mut encoder, &self.0)?;
        let Some(stats) = self.0.engine().map(|inbox| inbox.stats()) else {
            return Ok(());
        };
        let e = &mut encoder;
        gauge(e, "inboxd_users", "Users known to the store", stats.users)?;
        gauge(
            e,
            "inboxd_conversations",
            "Conversations",
            stats.conversations,
        )?;
        gauge(e, "inboxd_devices", "Registered devices", stats.devices)?;
        gauge(
            e,
            "inboxd_messages",
            "Messages retained (not yet reclaimed by history retention)",
            stats.messages,
        )?;
        gauge(
            e,
            "inboxd_events_live",
            "User sync events not yet reclaimed",
            stats.events_live,
        )?;
        gauge(
            e,
            "inboxd_bytes_on_disk",
            "Bytes of segment and checkpoint files",
            stats.bytes_on_disk,
        )?;
        gauge(
            e,
            "inboxd_index_bytes",
            "Bytes of in-memory indexes, each entry counted at its widest (an upper bound)",
            stats.index_bytes,
        )?;
        counter(
            e,
            "inboxd_write_batches",
            "Durable write batches (group commits)",
            stats.write_batches,
        )?;
        counter(e, "inboxd_fsyncs", "fdatasync calls", stats.fsyncs)?;
        counter(
            e,
            "inboxd_rounds_refused_for_space",
            "Rounds refused before any change because the disk had no room for the next segment",
            stats.rounds_refused_for_space,
        )?;
        counter(
            e,
            "inboxd_state_reloads_for_space",
            "State reloads after the log refused an applied round for space (compaction's rounds)",
            stats.state_reloads_for_space,
        )?;
        gauge(
            e,
            "inboxd_pipeline_on_one_cpu",
            "1 while the connection workers and the sequencer are held on one CPU (light load)",
            u64::from(stats.pipeline_on_one_cpu),
        )?;
        let c = &stats.compaction;
        counter(
            e,
            "inboxd_compaction_events_reclaimed",
            "Sync events reclaimed by compaction",
            c.events_reclaimed,
        )?;
        counter(
            e,
            "inboxd_compaction_bytes_reclaimed",
            "Bytes reclaimed by compaction",
            c.bytes_reclaimed,
        )?;
        counter(
            e,
            "inboxd_compaction_bytes_rewritten",
            "Bytes rewritten by compaction",
            c.bytes_rewritten,
        )?;
        counter(
            e,
            "inboxd_compaction_segments_dropped",
            "Whole segments dropped",
            c.segments_dropped,
        )?;
        counter(
            e,
            "inboxd_compaction_segments_rewritten",
            "Sparse segments rewritten",
            c.segments_rewritten,
        )?;
        // The engine keeps the sum and count of commit times, not their
        // distribution: a histogram with the +Inf bucket only.
        let mut fsync = e.encode_descriptor(
            "inboxd_fsync_seconds",
            "Group commit (write + fdatasync) latency",
            None,
            MetricType::Histogram,
        )?;
        fsync.encode_histogram::<NoLabelSet>(
            seconds(stats.fsync_latency_us_sum),
            stats.fsyncs,
            &[(f64::MAX, stats.fsyncs)],
            None,
        )
    }
}

/// `inboxd_raft_*`, on a member of a replicated group: the snapshots it
/// built and installed, where its log starts (last snapshot, last
/// purged index), the read-index rounds it ran, the entries it keeps in
/// memory for replication, its term, the leader it knows, whether it leads,
/// its log and applied index, and on the leader the time since a quorum
/// acknowledged it and each follower's lag in entries.
fn encode_raft(e: &mut DescriptorEncoder, figures: &EngineFigures) -> std::fmt::Result {
    let group = figures.group.lock().unwrap_or_else(|p| p.into_inner());
    let Some((status, snapshots, bounds, read_rounds, discarded, cache, path)) =
        group.as_ref().map(|g| {
            (
                g.status(),
                g.snapshot_counts(),
                g.log_bounds(),
                g.read_rounds(),
                g.rounds_discarded(),
                g.entry_cache(),
                g.commit_path(),
            )
        })
    else {
        return Ok(());
    };
    drop(group);
    counter(
        e,
        "inboxd_raft_snapshots_built",
        "Raft snapshots this node built and kept since it started",
        snapshots.built,
    )?;
    counter(
        e,
        "inboxd_raft_snapshots_installed",
        "Raft snapshots from the leader that replaced this node's engine since it started",
        snapshots.installed,
    )?;
    counter(
        e,
        "inboxd_raft_read_rounds",
        "Read-index rounds this node ran as the leader since it started; reads that arrive together share one",
        read_rounds,
    )?;
    counter(
        e,
        "inboxd_raft_rounds_discarded",
        "Rounds this node applied and then discarded since it started: a deposed leader's uncommitted tail, or a follower's tail the leader's log replaced",
        discarded,
    )?;
    encode_commit_path(e, &path)?;
    gauge(
        e,
        "inboxd_raft_entry_cache_entries",
        "Recent raft entries kept in memory for replication (at most 8192)",
        cache.0 as u64,
    )?;
    gauge(
        e,
        "inboxd_raft_entry_cache_bytes",
        "Bytes of the rounds in the recent raft entries kept in memory (at most 32 MiB)",
        cache.1 as u64,
    )?;
    gauge(
        e,
        "inboxd_raft_snapshot_index",
        "Last index covered by the snapshot this node holds (0 for none)",
        bounds.snapshot_index,
    )?;
    gauge(
        e,
        "inboxd_raft_purged_index",
        "Last index purged from this node's raft log (0 for none); a follower behind it catches up only by a snapshot",
        bounds.purged_index,
    )?;
    gauge(
        e,
        "inboxd_raft_term",
        "Raft term this node is in",
        status.term,
    )?;
    gauge(
        e,
        "inboxd_raft_leader_id",
        "Node id of the leader this node knows (0: none known)",
        status.leader.unwrap_or(0),
    )?;
    gauge(
        e,
        "inboxd_raft_is_leader",
        "1 while this node leads its group",
        u64::from(status.role == "leader"),
    )?;
    gauge(
        e,
        "inboxd_raft_last_log_index",
        "Index of the last entry in this node's raft log",
        status.last_log_index,
    )?;
    gauge(
        e,
        "inboxd_raft_last_applied_index",
        "Index of the last entry this node applied",
        status.last_applied_index,
    )?;
    if let Some(ms) = status.millis_since_quorum_ack {
        gauge(
            e,
            "inboxd_raft_quorum_ack_age_seconds",
            "On the leader: seconds since a quorum last acknowledged it (truncated)",
            ms / 1000,
        )?;
    }
    let lagging: Vec<(String, u64)> = status
        .members
        .iter()
        .filter(|m| m.node_id != status.node_id)
        .filter_map(|m| {
            let matched = m.matched_index?;
            Some((
                m.node_id.to_string(),
                status.last_log_index.saturating_sub(matched),
            ))
        })
        .collect();
    if !lagging.is_empty() {
        let mut family = e.encode_descriptor(
            "inboxd_raft_follower_lag_entries",
            "On the leader: entries each follower is behind its log",
            None,
            MetricType::Gauge,
        )?;
        for (node, lag) in &lagging {
            let gauge = ConstGauge::new(i64::try_from(*lag).unwrap_or(i64::MAX));
            gauge.encode(family.encode_family(&[("node", node.as_str())])?)?;
        }
    }
    Ok(())
}

/// `inboxd_raft_append*` and `inboxd_raft_round_commit*`: the commit
/// path's sums and counts (`cluster/commit_path.rs`); a mean over a window
/// is the ratio of their differences.
fn encode_commit_path(
    e: &mut DescriptorEncoder,
    path: &crate::cluster::CommitPathFigures,
) -> std::fmt::Result {
    counter(
        e,
        "inboxd_raft_appends",
        "Appends raft made to this node's log (a follower: one per append request; the leader: its own rounds)",
        path.appends,
    )?;
    counter(
        e,
        "inboxd_raft_appended_entries",
        "Entries those appends carried",
        path.appended_entries,
    )?;
    counter(
        e,
        "inboxd_raft_append_durable_seconds",
        "Time from each append's call to its entries being durable in this node's log, summed",
        seconds(path.append_micros),
    )?;
    counter(
        e,
        "inboxd_raft_rounds_committed",
        "On the leader: its rounds committed under the leadership that proposed them",
        path.rounds_committed,
    )?;
    counter(
        e,
        "inboxd_raft_round_commit_seconds",
        "On the leader: time from each round's proposal to raft to its commit, summed",
        seconds(path.round_commit_micros),
    )
}

/// `inboxd_memory_bytes{structure, kind}`: bytes per structure, `live`
/// (its entries) and `allocated` (capacity and overhead).
fn encode_memory(e: &mut DescriptorEncoder, figures: &EngineFigures) -> std::fmt::Result {
    let memory = figures.memory.lock().unwrap_or_else(|p| p.into_inner());
    let Some((report, at)) = memory.as_ref() else {
        return Ok(());
    };
    gauge(
        e,
        "inboxd_memory_age_seconds",
        "Seconds since the memory breakdown (inboxd_memory_bytes) was taken",
        at.elapsed().as_secs(),
    )?;
    let mut family = e.encode_descriptor(
        "inboxd_memory_bytes",
        "Bytes of in-memory structures: entries (live) and allocated",
        None,
        MetricType::Gauge,
    )?;
    for m in &report.structures {
        for (kind, value) in [("live", m.live), ("allocated", m.allocated)] {
            let labels = [("structure", m.structure.as_str()), ("kind", kind)];
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// Takes the memory breakdown of the engine watched once, on the
/// blocking pool: it walks every user and conversation.
pub async fn take_memory(metrics: &Metrics) {
    let Some(inbox) = metrics.engine.engine() else {
        return;
    };
    let take = move || crate::heap::with_process_memory(inbox.memory());
    if let Ok(memory) = tokio::task::spawn_blocking(take).await {
        *metrics
            .engine
            .memory
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((memory, Instant::now()));
    }
}

/// Takes the memory breakdown every [`MEMORY_INTERVAL`] until `shutdown`
/// flips: one walk per interval, however many scrapes.
pub async fn refresh_memory(
    metrics: Arc<Metrics>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let start = tokio::time::Instant::now() + MEMORY_INTERVAL;
    let mut every = tokio::time::interval_at(start, MEMORY_INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = shutdown.changed() => return,
        }
        take_memory(&metrics).await;
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` (over TLS
/// when `tls` is set) until the task is aborted: it goes on through the
/// shutdown drain, so `/readyz` can say 503 meanwhile. HTTP/1.1 only; a
/// request head must arrive within 5 s.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, tls: Option<TlsAcceptor>) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let metrics = Arc::clone(&metrics);
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => http(stream, metrics).await,
                Some(acceptor) => match crate::server::tls_accept(&acceptor, stream, peer).await {
                    Some(stream) => http(stream, metrics).await,
                    None => {
                        metrics.tls_handshakes_failed.inc();
                    }
                },
            }
        });
    }
}

async fn http<S>(stream: S, metrics: Arc<Metrics>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let metrics = Arc::clone(&metrics);
        async move { Ok::<_, Infallible>(route(&metrics, &request)) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(5))
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

fn route<B>(metrics: &Metrics, request: &Request<B>) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, content_type: &'static str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(content_type),
        );
        response
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match request.uri().path() {
        "/metrics" | "/" => text(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        // Alive: the process answers. A supervisor restarts it otherwise.
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        // Ready: the store is open (this listener starts only after it
        // is) and the daemon is not draining for shutdown.
        "/readyz" if metrics.ready.load(Ordering::Relaxed) => {
            text(StatusCode::OK, "text/plain", "ready\n".into())
        }
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "shutting down\n".into(),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}
