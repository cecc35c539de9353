//! Prometheus text metrics (R26) and the tiny HTTP responder that serves
//! them.
//!
//! Counters and histograms are lock-free atomics updated on the request
//! path; the engine's own counters come from [`Inbox::stats`] at scrape
//! time. Nothing here ever sees a message body or a token.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inbox_engine::{ConvPull, Inbox, SyncPage};
use inbox_wire::{ErrorCode, Op};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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

/// A fixed-bucket histogram of non-negative values.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    /// Sum in millionths, so that it can be an integer atomic.
    sum_micro: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micro: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|bound| value <= *bound) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "metrics values are small and non-negative; saturation is fine"
        )]
        let micro = (value * 1e6) as u64;
        self.sum_micro.fetch_add(micro, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_micro.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// Every metric the daemon exports besides the engine's stats.
#[derive(Debug)]
pub struct Metrics {
    latency_by_op: Vec<Histogram>,
    results: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    sync_page_events: Histogram,
    pull_messages_per_conv: Histogram,
    device_cursor_lag: Histogram,
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_refused: AtomicU64,
    pub frames_rejected: AtomicU64,
    pub hints_sent: AtomicU64,
    pub hints_dropped: AtomicU64,
    /// Subscriptions held by all connections; also the count the
    /// server-wide subscription cap is checked against.
    pub subscriptions: AtomicU64,
    pub tls_handshakes_failed: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            latency_by_op: Op::ALL
                .iter()
                .map(|_| Histogram::new(LATENCY_BUCKETS_S))
                .collect(),
            results: Mutex::new(BTreeMap::new()),
            sync_page_events: Histogram::new(COUNT_BUCKETS),
            pull_messages_per_conv: Histogram::new(COUNT_BUCKETS),
            device_cursor_lag: Histogram::new(COUNT_BUCKETS),
            connections_open: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            frames_rejected: AtomicU64::new(0),
            hints_sent: AtomicU64::new(0),
            hints_dropped: AtomicU64::new(0),
            subscriptions: AtomicU64::new(0),
            tls_handshakes_failed: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Counts one request of `op` that ended with `code` (`None` = ok).
    pub fn observe_request(&self, op: Op, code: Option<ErrorCode>, elapsed: Duration) {
        if let Some(i) = Op::ALL.iter().position(|known| *known == op) {
            self.latency_by_op[i].observe(elapsed.as_secs_f64());
        }
        let result = code.map_or("OK", ErrorCode::name);
        let mut results = self.results.lock().unwrap_or_else(|p| p.into_inner());
        *results.entry((op.name(), result)).or_insert(0) += 1;
    }

    /// Counts a request that was refused before it reached the engine
    /// (rate limit, bad body, unknown opcode).
    pub fn observe_refused(&self, op_name: &'static str, code: ErrorCode) {
        let mut results = self.results.lock().unwrap_or_else(|p| p.into_inner());
        *results.entry((op_name, code.name())).or_insert(0) += 1;
    }

    pub fn observe_sync_page(&self, page: &SyncPage) {
        self.sync_page_events.observe(page.events.len() as f64);
        let lag = page.batch_hwm.saturating_sub(page.acked_sync_seq);
        self.device_cursor_lag.observe(lag as f64);
    }

    pub fn observe_pull(&self, pulled: &[ConvPull]) {
        for conv in pulled {
            self.pull_messages_per_conv
                .observe(conv.messages.len() as f64);
        }
    }

    /// The whole exposition, engine stats included.
    pub fn render(&self, inbox: &Inbox) -> String {
        let mut out = String::with_capacity(16 << 10);
        out.push_str("# HELP inboxd_request_seconds Request latency by opcode, from frame decoded to reply queued.\n");
        out.push_str("# TYPE inboxd_request_seconds histogram\n");
        for (op, histogram) in Op::ALL.iter().zip(&self.latency_by_op) {
            if histogram.count.load(Ordering::Relaxed) > 0 {
                histogram.render(
                    &mut out,
                    "inboxd_request_seconds",
                    &format!("op=\"{}\"", op.name()),
                );
            }
        }
        out.push_str("# HELP inboxd_requests_total Requests by opcode and result code.\n");
        out.push_str("# TYPE inboxd_requests_total counter\n");
        {
            let results = self.results.lock().unwrap_or_else(|p| p.into_inner());
            for ((op, result), count) in results.iter() {
                let _ = writeln!(
                    out,
                    "inboxd_requests_total{{op=\"{op}\",result=\"{result}\"}} {count}"
                );
            }
        }
        for (name, help, histogram) in [
            (
                "inboxd_sync_page_events",
                "Events per sync page.",
                &self.sync_page_events,
            ),
            (
                "inboxd_pull_messages_per_conv",
                "Messages per conversation in a pull reply.",
                &self.pull_messages_per_conv,
            ),
            (
                "inboxd_device_cursor_lag_events",
                "Batch high watermark minus the device's ACK, per sync page.",
                &self.device_cursor_lag,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            histogram.render(&mut out, name, "");
        }
        let gauges = [
            (
                "inboxd_connections_open",
                "gauge",
                "Open client connections.",
                self.connections_open.load(Ordering::Relaxed),
            ),
            (
                "inboxd_connections_total",
                "counter",
                "Accepted client connections.",
                self.connections_total.load(Ordering::Relaxed),
            ),
            (
                "inboxd_connections_refused_total",
                "counter",
                "Connections refused by the connection limit.",
                self.connections_refused.load(Ordering::Relaxed),
            ),
            (
                "inboxd_frames_rejected_total",
                "counter",
                "Frames that closed their connection (oversized, corrupt, unauthenticated).",
                self.frames_rejected.load(Ordering::Relaxed),
            ),
            (
                "inboxd_hints_sent_total",
                "counter",
                "Hints pushed to subscribers.",
                self.hints_sent.load(Ordering::Relaxed),
            ),
            (
                "inboxd_hints_dropped_total",
                "counter",
                "Hint rounds dropped because a subscriber was slow.",
                self.hints_dropped.load(Ordering::Relaxed),
            ),
            (
                "inboxd_subscriptions",
                "gauge",
                "Uids subscribed to hints, over all connections.",
                self.subscriptions.load(Ordering::Relaxed),
            ),
            (
                "inboxd_tls_handshakes_failed_total",
                "counter",
                "TLS handshakes that failed or timed out (protocol and metrics ports).",
                self.tls_handshakes_failed.load(Ordering::Relaxed),
            ),
        ];
        let stats = inbox.stats();
        let fsync_latency_s_sum = stats.fsync_latency_us_sum as f64 / 1e6;
        let engine = [
            (
                "inboxd_users",
                "gauge",
                "Users known to the store.",
                stats.users,
            ),
            (
                "inboxd_conversations",
                "gauge",
                "Conversations.",
                stats.conversations,
            ),
            (
                "inboxd_devices",
                "gauge",
                "Registered devices.",
                stats.devices,
            ),
            (
                "inboxd_messages",
                "gauge",
                "Messages retained (not yet reclaimed by history retention).",
                stats.messages,
            ),
            (
                "inboxd_events_live",
                "gauge",
                "User sync events not yet reclaimed.",
                stats.events_live,
            ),
            (
                "inboxd_write_batches_total",
                "counter",
                "Durable write batches (group commits).",
                stats.write_batches,
            ),
            (
                "inboxd_fsyncs_total",
                "counter",
                "fdatasync calls.",
                stats.fsyncs,
            ),
            (
                "inboxd_bytes_on_disk",
                "gauge",
                "Bytes of segment and checkpoint files.",
                stats.bytes_on_disk,
            ),
            (
                "inboxd_index_bytes",
                "gauge",
                "Bytes of in-memory indexes.",
                stats.index_bytes,
            ),
            (
                "inboxd_compaction_events_reclaimed_total",
                "counter",
                "Sync events reclaimed by compaction.",
                stats.compaction.events_reclaimed,
            ),
            (
                "inboxd_compaction_bytes_reclaimed_total",
                "counter",
                "Bytes reclaimed by compaction.",
                stats.compaction.bytes_reclaimed,
            ),
            (
                "inboxd_compaction_bytes_rewritten_total",
                "counter",
                "Bytes rewritten by compaction.",
                stats.compaction.bytes_rewritten,
            ),
            (
                "inboxd_compaction_segments_dropped_total",
                "counter",
                "Whole segments dropped.",
                stats.compaction.segments_dropped,
            ),
            (
                "inboxd_compaction_segments_rewritten_total",
                "counter",
                "Sparse segments rewritten.",
                stats.compaction.segments_rewritten,
            ),
        ];
        for (name, kind, help, value) in gauges.into_iter().chain(engine) {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP inboxd_fsync_seconds fdatasync latency.\n# TYPE inboxd_fsync_seconds summary\ninboxd_fsync_seconds_sum {fsync_latency_s_sum}\ninboxd_fsync_seconds_count {}",
            stats.fsyncs
        );
        out
    }
}

/// Serves `GET /metrics` on `listener` (over TLS when `tls` is set) until
/// `shutdown` flips. Anything else gets a 404; a request head over 8 KiB
/// or slower than 5 s is dropped.
pub async fn serve(
    listener: TcpListener,
    inbox: Arc<Inbox>,
    metrics: Arc<Metrics>,
    tls: Option<TlsAcceptor>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let Ok((stream, peer)) = accepted else {
            continue;
        };
        let inbox = Arc::clone(&inbox);
        let metrics = Arc::clone(&metrics);
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => respond(stream, &inbox, &metrics).await,
                Some(acceptor) => match crate::server::tls_accept(&acceptor, stream, peer).await {
                    Some(stream) => respond(stream, &inbox, &metrics).await,
                    None => {
                        metrics
                            .tls_handshakes_failed
                            .fetch_add(1, Ordering::Relaxed);
                    }
                },
            }
        });
    }
}

async fn respond<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    inbox: &Inbox,
    metrics: &Metrics,
) {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        true
    };
    if !matches!(
        tokio::time::timeout(Duration::from_secs(5), read_head).await,
        Ok(true)
    ) {
        return;
    }
    let (status, body) = if head.starts_with(b"GET /metrics ") || head.starts_with(b"GET / ") {
        ("200 OK", metrics.render(inbox))
    } else {
        ("404 Not Found", "not found; try /metrics\n".to_string())
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}
