//! Daemon configuration: flags, then `INBOXD_*` environment variables,
//! then a TOML file, then the embedded defaults, in that order of
//! precedence.
//!
//! Each setting is one field of [`ServeArgs`]: clap reads its flag and
//! environment variable, serde its TOML key, and figment layers the two
//! (what clap left unset is not serialized, so the file shows through).
//! [`Config::resolve`] then applies the defaults and checks the values.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use figment::providers::{Format as _, Serialized, Toml};
use figment::Figment;
use inbox_engine::log::{IoBackend, SyncPolicy};
use inbox_engine::InboxConfig;
use serde::{Deserialize, Serialize};

use crate::tls::ServerTls;

/// Every setting of `inboxd serve` (and of the offline tools, which read
/// the same), defined once: the flag, its environment variable and its
/// TOML key (the field's name) all come from the field. Every one is
/// optional so that "unset" can fall through to the next layer and then
/// to the default.
#[derive(Clone, Debug, Default, clap::Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServeArgs {
    /// TOML file with the same keys as these flags (snake_case).
    #[arg(long, env = "INBOXD_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Data directory [default: ./data].
    #[arg(long, env = "INBOXD_DATA_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Protocol listen address [default: 127.0.0.1:7070].
    #[arg(long, env = "INBOXD_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Prometheus metrics listen address [default: 127.0.0.1:7071].
    #[arg(long, env = "INBOXD_METRICS_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    /// Shared secret clients present in HELLO. Prefer --token-file.
    #[arg(long, env = "INBOXD_TOKEN", hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// File holding the shared secret [default: DATA_DIR/token, generated
    /// with mode 0600 when missing].
    #[arg(long, env = "INBOXD_TOKEN_FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Secret for admin requests (COMPACT, CHECKPOINT, EXPLAIN,
    /// EXPLAIN_SEGMENT, STATS). Prefer --admin-token-file.
    #[arg(long, env = "INBOXD_ADMIN_TOKEN", hide_env_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
    /// File holding the admin secret [default: DATA_DIR/admin_token,
    /// generated with mode 0600 when missing].
    #[arg(long, env = "INBOXD_ADMIN_TOKEN_FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<PathBuf>,
    /// PEM certificate chain (leaf first): serve TLS on every listener.
    #[arg(long, env = "INBOXD_TLS_CERT", requires = "tls_key")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "INBOXD_TLS_KEY", requires = "tls_cert")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): require client certificates that chain to
    /// them (mutual TLS). Needs --tls-cert.
    #[arg(long, env = "INBOXD_TLS_CLIENT_CA")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_client_ca: Option<PathBuf>,
    /// Concurrent client connections [default: 1024].
    #[arg(long, env = "INBOXD_MAX_CONNECTIONS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// Largest request frame accepted, bytes [default: 1048576].
    #[arg(long, env = "INBOXD_FRAME_BYTES_MAX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_bytes_max: Option<u32>,
    /// Largest reply frame sent, bytes [default: 67108864].
    #[arg(long, env = "INBOXD_REPLY_FRAME_BYTES_MAX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_frame_bytes_max: Option<u32>,
    /// Requests read ahead per connection before reading stops [default: 256].
    #[arg(long, env = "INBOXD_IN_FLIGHT_MAX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight_max: Option<u32>,
    /// Close a connection that completed no frame for this long, seconds
    /// (the HELLO is due within at most 10) [default: 300].
    #[arg(long, env = "INBOXD_IDLE_TIMEOUT_S")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_s: Option<u64>,
    /// Sustained requests per second per connection [default: 20000].
    #[arg(long, env = "INBOXD_RATE_PER_S")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_s: Option<u32>,
    /// Burst of requests per connection above the rate [default: 2000].
    #[arg(long, env = "INBOXD_RATE_BURST")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_burst: Option<u32>,
    /// Uids one connection may be subscribed to at once [default: 100000].
    #[arg(long, env = "INBOXD_SUBSCRIBE_UIDS_MAX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscribe_uids_max: Option<u32>,
    /// Subscriptions held by all connections together [default: 1000000].
    #[arg(long, env = "INBOXD_SUBSCRIPTIONS_MAX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscriptions_max: Option<u64>,
    /// Bytes of writes all connections together may have queued on the
    /// engine and unanswered; past it connections stop reading until
    /// replies free room [default: 67108864].
    #[arg(long, env = "INBOXD_ENGINE_QUEUE_BYTES_MAX")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_queue_bytes_max: Option<u64>,
    /// `always` (fdatasync before reply), `none`, or `interval:MS` [default: always].
    #[arg(long, env = "INBOXD_SYNC")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync: Option<String>,
    /// How the logs write: `pwrite` (pwrite + fdatasync, portable) or
    /// `io_uring` (write linked to fdatasync); the daemon refuses to start
    /// if io_uring cannot be set up [default: pwrite].
    #[arg(long, env = "INBOXD_IO_BACKEND")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_backend: Option<String>,
    /// Threads that serve connections. The sequencer and the log writers
    /// have threads of their own, so the default leaves them a core:
    /// one fewer than the cores the daemon may run on, at least one
    /// [default: cores - 1].
    #[arg(long, env = "INBOXD_WORKER_THREADS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_threads: Option<u32>,
    /// Seconds to wait for in-flight requests at shutdown [default: 30].
    #[arg(long, env = "INBOXD_SHUTDOWN_GRACE_S")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_s: Option<u64>,
    /// Lifetime of a sync batch token, seconds [default: the engine's, 600].
    #[arg(long, env = "INBOXD_BATCH_TOKEN_TTL_S")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_token_ttl_s: Option<u64>,
    /// Size of each preallocated log segment, bytes [default: the
    /// engine's, 134217728]. Below about 129 KiB it also caps payloads
    /// (a message must fit half a segment), under the 64 KiB default.
    #[arg(long, env = "INBOXD_SEGMENT_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_bytes: Option<u64>,
    /// Events younger than this are never reclaimed, seconds [default: the
    /// engine's, 7 days].
    #[arg(long, env = "INBOXD_SAFETY_WINDOW_S")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub safety_window_s: Option<u64>,
    /// Seconds between background compaction passes; 0 turns them off
    /// [default: the engine's, 60].
    #[arg(long, env = "INBOXD_COMPACTION_INTERVAL_S")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction_interval_s: Option<u64>,
    /// How long a send's idempotency key is remembered, seconds: a retry
    /// later than this is a new message [default: the engine's, 7 days].
    /// Every member of a group must use the same value.
    #[arg(long, env = "INBOXD_IDEMPOTENCY_TTL_S")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_ttl_s: Option<u64>,
    /// Write an index checkpoint after this many bytes of `evt` log (or
    /// after `checkpoint_every_state_percent` of the newest checkpoint's
    /// size, if that is more): a restart after a crash or a kill replays
    /// at most about this much, and a smaller value makes the checkpoint
    /// writer work more often [default: the engine's, 64 MiB; at least 1
    /// MiB].
    #[arg(long, env = "INBOXD_CHECKPOINT_EVERY_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_every_bytes: Option<u64>,
    /// Also wait for this percent of the newest checkpoint's size in `evt`
    /// log between periodic checkpoints, so that a large state is not
    /// rewritten every `checkpoint_every_bytes`: checkpoints then write at
    /// most 100 / percent bytes per byte of log, and a crash's replay
    /// stays in proportion to loading the checkpoint. 0 turns it off
    /// [default: the engine's, 25; at most 10000].
    #[arg(long, env = "INBOXD_CHECKPOINT_EVERY_STATE_PERCENT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_every_state_percent: Option<u32>,
    /// Keep the message index's full pages and the idempotency table's
    /// sorted runs in an unnamed scratch file in the data directory,
    /// mapped, rather than on the heap [default: true].
    #[arg(long, env = "INBOXD_INDEX_IN_FILE", num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_in_file: Option<bool>,
    /// While rounds hold about one command and the daemon uses under
    /// 0.6 of a CPU, hold the connection workers and the sequencer on one
    /// CPU, so that a send's hand-offs do not wake another CPU; under
    /// load they spread again [default: true].
    #[arg(long, env = "INBOXD_COLOCATE_WHEN_LIGHT", num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub colocate_when_light: Option<bool>,
    /// While one connection alone makes requests, decide and commit its
    /// sends on the worker that reads them, which then waits for the
    /// disk, instead of handing each to the sequencer's thread and back;
    /// a request from any other connection stops it for 20 ms
    /// [default: true].
    #[arg(long, env = "INBOXD_SEND_INLINE_WHEN_ALONE", num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send_inline_when_alone: Option<bool>,
    /// Messages older than this are reclaimed, seconds; unset keeps
    /// history forever [default: unset].
    #[arg(long, env = "INBOXD_HISTORY_RETENTION_S")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_retention_s: Option<u64>,
    /// Bytes of built snapshots kept in memory; the least recently used
    /// are dropped past it and read from their files again [default: the
    /// engine's, 64 MiB].
    #[arg(long, env = "INBOXD_SNAPSHOT_CACHE_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_cache_bytes: Option<u64>,
    /// A conversation with more current members than this becomes a large
    /// group (no per-member events); 0 never switches [default: the
    /// engine's, 500].
    #[arg(long, env = "INBOXD_LARGE_GROUP_MEMBERS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub large_group_members: Option<u32>,
    /// This node's id in a replicated group (with --raft-listen and
    /// --peers); unset runs a single node [default: unset].
    #[arg(long, env = "INBOXD_NODE_ID")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u64>,
    /// Listen address of the group's raft port; connections to the other
    /// members leave from its IP unless that is unspecified (0.0.0.0, ::)
    /// [default: unset].
    #[arg(long, env = "INBOXD_RAFT_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raft_listen: Option<SocketAddr>,
    /// The group's members, this node included:
    /// `ID=RAFT_ADDR/CLIENT_ADDR,...` [default: unset].
    #[arg(long, env = "INBOXD_PEERS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peers: Option<String>,
    /// Write the group's first membership if the log is empty, whatever
    /// this node's id [default: only the node with the lowest id does].
    #[arg(long, env = "INBOXD_BOOTSTRAP", num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<bool>,
    /// Rounds between two raft snapshots (raft then forgets its log up to
    /// 1000 rounds, or this many if fewer, before the snapshot; a follower
    /// further behind is sent the snapshot) [default: 50000].
    #[arg(long, env = "INBOXD_SNAPSHOT_EVERY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_every: Option<u64>,
}

/// A replicated group's settings, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    pub node_id: u64,
    pub raft_listen: SocketAddr,
    pub peers: std::collections::BTreeMap<u64, crate::cluster::Peer>,
    /// Initialize the membership on an empty log.
    pub bootstrap: bool,
    /// Rounds between two raft snapshots.
    pub snapshot_every: u64,
}

/// Parses `ID=RAFT_ADDR/CLIENT_ADDR,...`.
pub fn parse_peers(
    text: &str,
) -> Result<std::collections::BTreeMap<u64, crate::cluster::Peer>, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid {
        key: "peers",
        reason,
    };
    let mut peers = std::collections::BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (id, addrs) = item
            .split_once('=')
            .ok_or_else(|| invalid(format!("{item:?} is not ID=RAFT_ADDR/CLIENT_ADDR")))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| invalid(format!("{id:?} is not a node id")))?;
        let (raft, client) = addrs
            .split_once('/')
            .ok_or_else(|| invalid(format!("{item:?} is not ID=RAFT_ADDR/CLIENT_ADDR")))?;
        let peer = crate::cluster::Peer {
            raft_addr: raft.trim().to_string(),
            client_addr: client.trim().to_string(),
        };
        if peer.raft_addr.is_empty() || peer.client_addr.is_empty() {
            return Err(invalid(format!("{item:?} has an empty address")));
        }
        if peers.insert(id, peer).is_some() {
            return Err(invalid(format!("node {id} is listed twice")));
        }
    }
    Ok(peers)
}

/// The group settings, all or none.
fn resolve_cluster(s: &ServeArgs) -> Result<Option<ClusterConfig>, ConfigError> {
    let invalid = |key, reason: &str| ConfigError::Invalid {
        key,
        reason: reason.into(),
    };
    match (s.node_id, s.raft_listen, &s.peers) {
        (None, None, None) if s.bootstrap.is_none() => Ok(None),
        (Some(node_id), Some(raft_listen), Some(peers)) => {
            let peers = parse_peers(peers)?;
            if !peers.contains_key(&node_id) {
                return Err(invalid("peers", "must list this node (node_id)"));
            }
            let bootstrap = s
                .bootstrap
                .unwrap_or_else(|| peers.keys().next() == Some(&node_id));
            Ok(Some(ClusterConfig {
                node_id,
                raft_listen,
                peers,
                bootstrap,
                snapshot_every: s
                    .snapshot_every
                    .unwrap_or(crate::cluster::SNAPSHOT_EVERY)
                    .max(1),
            }))
        }
        _ => Err(invalid(
            "node_id",
            "node_id, raft_listen and peers go together (bootstrap needs them)",
        )),
    }
}

/// Where the token comes from, resolved at startup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenSource {
    Inline(String),
    File(PathBuf),
    /// Nothing configured: `DATA_DIR/token`, created if missing.
    Generated(PathBuf),
}

/// Per-connection limits.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: u32,
    pub frame_bytes_max: u32,
    pub reply_frame_bytes_max: u32,
    pub in_flight_max: u32,
    pub idle_timeout: Duration,
    pub rate_per_s: u32,
    pub rate_burst: u32,
    /// Uids one connection may be subscribed to at once.
    pub subscribe_uids_max: u32,
    /// Subscriptions held by all connections together: with about 40
    /// bytes per entry (a `u64` in a hash set at its worst load factor),
    /// the default bounds hint state to about 40 MB.
    pub subscriptions_max: u64,
    /// Bytes of writes all connections together may have queued on the
    /// engine, unanswered; past it readers wait before queuing more.
    pub engine_queue_bytes_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            frame_bytes_max: inbox_wire::frame::FRAME_BYTES_MAX_DEFAULT,
            reply_frame_bytes_max: inbox_wire::frame::REPLY_FRAME_BYTES_MAX_DEFAULT,
            in_flight_max: 256,
            idle_timeout: Duration::from_secs(300),
            rate_per_s: 20_000,
            rate_burst: 2_000,
            subscribe_uids_max: 100_000,
            subscriptions_max: 1_000_000,
            engine_queue_bytes_max: 64 << 20,
        }
    }
}

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    pub token: TokenSource,
    pub admin_token: TokenSource,
    /// `None` serves plain TCP.
    pub tls: Option<ServerTls>,
    pub limits: Limits,
    pub sync: SyncPolicy,
    pub io_backend: IoBackend,
    /// Threads of the runtime that serves connections.
    pub worker_threads: usize,
    pub shutdown_grace: Duration,
    /// `None` keeps the engine's default.
    pub batch_token_ttl: Option<Duration>,
    /// `None` keeps the engine's default.
    pub segment_bytes: Option<u64>,
    /// `None` keeps the engine's default.
    pub safety_window: Option<Duration>,
    /// `None` keeps the engine's default; `Some(ZERO)` turns background
    /// compaction off.
    pub compaction_interval: Option<Duration>,
    /// `None` keeps the engine's default.
    pub idempotency_ttl: Option<Duration>,
    /// `None` keeps the engine's default.
    pub checkpoint_every_bytes: Option<u64>,
    /// `None` keeps the engine's default.
    pub checkpoint_every_state_percent: Option<u32>,
    /// `None` keeps the engine's default.
    pub index_in_file: Option<bool>,
    /// Hold the write pipeline on one CPU while the load is light.
    pub colocate_when_light: bool,
    /// Commit a lone connection's sends on its worker.
    pub send_inline_when_alone: bool,
    /// `None` keeps history forever.
    pub history_retention: Option<Duration>,
    /// `None` keeps the engine's default.
    pub snapshot_cache_bytes: Option<u64>,
    /// `None` keeps the engine's default.
    pub large_group_members: Option<u32>,
    /// `None` runs a single node (no raft at all).
    pub cluster: Option<ClusterConfig>,
}

impl Config {
    /// The engine's configuration: what `serve` opens the store with, and
    /// what the offline tools open it with, so both see the same store.
    pub fn engine_config(&self, token_key: [u8; 32]) -> InboxConfig {
        let mut engine = InboxConfig::new(&self.data_dir);
        engine.sync = self.sync;
        engine.io = self.io_backend;
        engine.token_key = token_key;
        if let Some(ttl) = self.batch_token_ttl {
            engine.batch_token_ttl = ttl;
        }
        if let Some(bytes) = self.segment_bytes {
            engine.segment_bytes = bytes;
        }
        if let Some(window) = self.safety_window {
            engine.safety_window = window;
        }
        if let Some(interval) = self.compaction_interval {
            engine.compaction_interval = (!interval.is_zero()).then_some(interval);
        }
        engine.history_retention = self.history_retention;
        if let Some(ttl) = self.idempotency_ttl {
            engine.idempotency_ttl = ttl;
        }
        if let Some(bytes) = self.checkpoint_every_bytes {
            engine.checkpoint_every_bytes = bytes;
        }
        if let Some(percent) = self.checkpoint_every_state_percent {
            engine.checkpoint_every_state_percent = percent;
        }
        if let Some(on) = self.index_in_file {
            engine.index_in_file = on;
        }
        engine.colocate_when_light = self.colocate_when_light;
        // Snapshot pages are cut to fit one reply frame.
        engine.snapshot_page_bytes_max = self.limits.reply_frame_bytes_max;
        if let Some(bytes) = self.snapshot_cache_bytes {
            engine.snapshot_cache_bytes = bytes;
        }
        if let Some(members) = self.large_group_members {
            engine.large_group_members = members;
        }
        engine
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<figment::Error>,
    },
    #[error("bad value for {key}: {reason}")]
    Invalid { key: &'static str, reason: String },
}

fn parse_sync(text: &str) -> Result<SyncPolicy, ConfigError> {
    let invalid = || ConfigError::Invalid {
        key: "sync",
        reason: format!("{text:?}: expected always, none or interval:MS"),
    };
    match text {
        "always" => Ok(SyncPolicy::Always),
        "none" => Ok(SyncPolicy::None),
        other => {
            let ms = other.strip_prefix("interval:").ok_or_else(invalid)?;
            let ms: u64 = ms.parse().map_err(|_| invalid())?;
            Ok(SyncPolicy::Interval(Duration::from_millis(ms)))
        }
    }
}

fn parse_io_backend(text: &str) -> Result<IoBackend, ConfigError> {
    match text {
        "pwrite" => Ok(IoBackend::Pwrite),
        "io_uring" => Ok(IoBackend::IoUring),
        other => Err(ConfigError::Invalid {
            key: "io_backend",
            reason: format!("{other:?}: expected pwrite or io_uring"),
        }),
    }
}

impl Config {
    /// Layers flags and environment (`args`, merged by clap) over the TOML
    /// file named by `--config`, then applies the defaults and checks the
    /// values.
    pub fn resolve(args: &ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            None => ServeArgs::default(),
            Some(path) => {
                // figment treats a missing file as empty; a named one must exist.
                std::fs::metadata(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Figment::from(Toml::file_exact(path))
                    .extract()
                    .map_err(|source| ConfigError::Parse {
                        path: path.clone(),
                        source: Box::new(source),
                    })?
            }
        };
        let merged: ServeArgs = Figment::from(Serialized::defaults(&file))
            .merge(Serialized::defaults(args))
            .extract()
            .map_err(|source| ConfigError::Parse {
                path: args.config.clone().unwrap_or_default(),
                source: Box::new(source),
            })?;
        Self::from_settings(merged, args, &file)
    }

    /// Applies the defaults to merged settings. `args` and `file` are the
    /// two layers, for the settings that are chosen as a whole (a token is
    /// inline or a file: a flag for one replaces the file's other).
    fn from_settings(
        s: ServeArgs,
        args: &ServeArgs,
        file: &ServeArgs,
    ) -> Result<Config, ConfigError> {
        let defaults = Limits::default();
        let cluster = resolve_cluster(&s)?;
        let data_dir = s.data_dir.unwrap_or_else(|| PathBuf::from("./data"));
        let token = match (args.token.clone(), args.token_file.clone()) {
            (Some(token), _) => TokenSource::Inline(token),
            (None, Some(path)) => TokenSource::File(path),
            (None, None) => match (file.token.clone(), file.token_file.clone()) {
                (Some(token), _) => TokenSource::Inline(token),
                (None, Some(path)) => TokenSource::File(path),
                (None, None) => TokenSource::Generated(data_dir.join("token")),
            },
        };
        let admin_token = match (args.admin_token.clone(), args.admin_token_file.clone()) {
            (Some(token), _) => TokenSource::Inline(token),
            (None, Some(path)) => TokenSource::File(path),
            (None, None) => match (file.admin_token.clone(), file.admin_token_file.clone()) {
                (Some(token), _) => TokenSource::Inline(token),
                (None, Some(path)) => TokenSource::File(path),
                (None, None) => TokenSource::Generated(data_dir.join("admin_token")),
            },
        };
        let tls_cert = s.tls_cert;
        let tls_key = s.tls_key;
        let tls_client_ca = s.tls_client_ca;
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some(ServerTls {
                cert,
                key,
                client_ca: tls_client_ca,
            }),
            (None, None) if tls_client_ca.is_none() => None,
            (None, None) => {
                return Err(ConfigError::Invalid {
                    key: "tls_client_ca",
                    reason: "needs tls_cert and tls_key".into(),
                })
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(ConfigError::Invalid {
                    key: "tls_cert",
                    reason: "tls_cert and tls_key go together".into(),
                })
            }
        };
        let limits = Limits {
            max_connections: s.max_connections.unwrap_or(defaults.max_connections),
            frame_bytes_max: s.frame_bytes_max.unwrap_or(defaults.frame_bytes_max),
            reply_frame_bytes_max: s
                .reply_frame_bytes_max
                .unwrap_or(defaults.reply_frame_bytes_max),
            in_flight_max: s.in_flight_max.unwrap_or(defaults.in_flight_max),
            idle_timeout: s
                .idle_timeout_s
                .map_or(defaults.idle_timeout, Duration::from_secs),
            rate_per_s: s.rate_per_s.unwrap_or(defaults.rate_per_s),
            rate_burst: s.rate_burst.unwrap_or(defaults.rate_burst),
            subscribe_uids_max: s.subscribe_uids_max.unwrap_or(defaults.subscribe_uids_max),
            subscriptions_max: s.subscriptions_max.unwrap_or(defaults.subscriptions_max),
            engine_queue_bytes_max: s
                .engine_queue_bytes_max
                .unwrap_or(defaults.engine_queue_bytes_max),
        };
        for (key, value) in [
            ("max_connections", limits.max_connections),
            ("in_flight_max", limits.in_flight_max),
            ("rate_per_s", limits.rate_per_s),
            ("rate_burst", limits.rate_burst),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid {
                    key,
                    reason: "must be at least 1".into(),
                });
            }
        }
        if limits.frame_bytes_max < 1024 {
            return Err(ConfigError::Invalid {
                key: "frame_bytes_max",
                reason: "must be at least 1024".into(),
            });
        }
        let sync = match s.sync {
            Some(text) => parse_sync(&text)?,
            None => SyncPolicy::Always,
        };
        let io_backend = match s.io_backend {
            Some(text) => parse_io_backend(&text)?,
            None => IoBackend::default(),
        };
        if s.checkpoint_every_bytes
            .is_some_and(|b| b < CHECKPOINT_EVERY_BYTES_MIN)
        {
            return Err(ConfigError::Invalid {
                key: "checkpoint_every_bytes",
                reason: format!("must be at least {CHECKPOINT_EVERY_BYTES_MIN} (1 MiB)"),
            });
        }
        if s.checkpoint_every_state_percent
            .is_some_and(|p| p > CHECKPOINT_EVERY_STATE_PERCENT_MAX)
        {
            return Err(ConfigError::Invalid {
                key: "checkpoint_every_state_percent",
                reason: format!("must be at most {CHECKPOINT_EVERY_STATE_PERCENT_MAX}"),
            });
        }
        let worker_threads = match s.worker_threads {
            Some(0) => {
                return Err(ConfigError::Invalid {
                    key: "worker_threads",
                    reason: "must be at least 1".into(),
                })
            }
            Some(n) => n as usize,
            None => {
                default_worker_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
            }
        };
        Ok(Config {
            data_dir,
            listen: s
                .listen
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7070))),
            metrics_listen: s
                .metrics_listen
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7071))),
            token,
            admin_token,
            tls,
            limits,
            sync,
            io_backend,
            worker_threads,
            shutdown_grace: Duration::from_secs(s.shutdown_grace_s.unwrap_or(30)),
            batch_token_ttl: s.batch_token_ttl_s.map(Duration::from_secs),
            segment_bytes: s.segment_bytes,
            safety_window: s.safety_window_s.map(Duration::from_secs),
            compaction_interval: s.compaction_interval_s.map(Duration::from_secs),
            idempotency_ttl: s.idempotency_ttl_s.map(Duration::from_secs),
            checkpoint_every_bytes: s.checkpoint_every_bytes,
            checkpoint_every_state_percent: s.checkpoint_every_state_percent,
            index_in_file: s.index_in_file,
            colocate_when_light: s.colocate_when_light.unwrap_or(true),
            send_inline_when_alone: s.send_inline_when_alone.unwrap_or(true),
            history_retention: s.history_retention_s.map(Duration::from_secs),
            snapshot_cache_bytes: s.snapshot_cache_bytes,
            large_group_members: s.large_group_members,
            cluster,
        })
    }
}

/// The smallest `checkpoint_every_bytes` taken: below it the writer would
/// encode the whole state after every few rounds.
const CHECKPOINT_EVERY_BYTES_MIN: u64 = 1 << 20;

/// The largest `checkpoint_every_state_percent` taken: 100 times the
/// state's size in log between checkpoints already makes the replay after
/// a crash a hundred loads of the checkpoint.
const CHECKPOINT_EVERY_STATE_PERCENT_MAX: u32 = 10_000;

/// The connection-serving threads a daemon with `cores` cores starts: one
/// per core but one, which the sequencer and the log writers use (at
/// least one). A send crosses from a worker to the sequencer and back;
/// with a worker per core, a reply woke one worker, which then woke
/// another to look for work, and the two shared the sequencer's core.
pub fn default_worker_threads(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

/// Writes `contents` to a new file readable by its owner only.
fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Refuses a secret file that group or others can read or write: a token
/// anyone on the host can read authenticates anyone on the host.
pub fn check_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is accessible by group or others (mode {:03o}); it holds a secret: run `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Loads a token for the server, generating the default file (mode 0600)
/// when none is configured. A token file must be private to its owner
/// ([`check_private`]). Returns the token and, when a file was generated,
/// its path (for the log; the token itself is never logged).
pub fn load_token(source: &TokenSource) -> std::io::Result<(Bytes, Option<PathBuf>)> {
    match source {
        TokenSource::Inline(token) => Ok((Bytes::from(token.clone().into_bytes()), None)),
        TokenSource::File(path) => {
            check_private(path)?;
            Ok((read_token(path)?, None))
        }
        TokenSource::Generated(path) => {
            if path.exists() {
                check_private(path)?;
                return Ok((read_token(path)?, None));
            }
            let token = hex(&rand::random::<[u8; 32]>());
            write_private(path, format!("{token}\n").as_bytes())?;
            Ok((Bytes::from(token.into_bytes()), Some(path.clone())))
        }
    }
}

/// A token file holds the token; surrounding whitespace is not part of it.
pub fn read_token(path: &Path) -> std::io::Result<Bytes> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("token file {} is empty", path.display()),
        ));
    }
    Ok(Bytes::from(token.to_string().into_bytes()))
}

/// The key for `batch_token` HMACs on a member of a group: the same on
/// every member, so that a token any member issued is honoured by the
/// next leader after a fail-over. It is derived from the group's shared
/// token (which every member is given, and which authenticates the raft
/// port), never stored: SHA-256 of a label and the token. A change of
/// the group's token voids the batch tokens outstanding, which a client
/// meets as `BAD_TOKEN` and answers with a sync from its ACK.
pub fn group_batch_token_key(group_token: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"inboxd group batch-token key v1\0");
    h.update(group_token);
    h.finalize().into()
}

/// The server key for `batch_token` HMACs: `DATA_DIR/batch_token.key`,
/// 32 random bytes created once (mode 0600) so tokens survive restarts.
pub fn load_batch_token_key(data_dir: &Path) -> std::io::Result<[u8; 32]> {
    let path = data_dir.join("batch_token.key");
    match std::fs::read(&path) {
        Ok(bytes) => {
            check_private(&path)?;
            <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} must hold exactly 32 bytes", path.display()),
                )
            })
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            let key = rand::random::<[u8; 32]>();
            write_private(&path, &key)?;
            Ok(key)
        }
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inboxd.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:9000\"\nin_flight_max = 7\nsync = \"interval:5\"\n\
             io_backend = \"io_uring\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(path),
            in_flight_max: Some(3),
            ..ServeArgs::default()
        };
        let config = Config::resolve(&args).unwrap();
        assert_eq!(config.limits.in_flight_max, 3, "flag beats file");
        assert_eq!(
            config.listen,
            "127.0.0.1:9000".parse().unwrap(),
            "file beats default"
        );
        assert_eq!(config.sync, SyncPolicy::Interval(Duration::from_millis(5)));
        assert_eq!(config.io_backend, IoBackend::IoUring);
        assert_eq!(config.engine_config([0; 32]).io, IoBackend::IoUring);
        let flag = ServeArgs {
            io_backend: Some("pwrite".into()),
            ..args.clone()
        };
        assert_eq!(
            Config::resolve(&flag).unwrap().io_backend,
            IoBackend::Pwrite
        );
        assert_eq!(
            Config::resolve(&ServeArgs::default()).unwrap().io_backend,
            IoBackend::Pwrite,
            "the default"
        );
        assert_eq!(config.metrics_listen, "127.0.0.1:7071".parse().unwrap());
        assert_eq!(config.data_dir, PathBuf::from("./data"));
        assert_eq!(
            config.token,
            TokenSource::Generated(PathBuf::from("./data/token"))
        );
    }

    #[test]
    fn flags_win_over_env_and_env_over_the_file() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inboxd.toml");
        std::fs::write(
            &path,
            "rate_burst = 5\nin_flight_max = 7\nhistory_retention_s = 3600\nidempotency_ttl_s = 600\ncheckpoint_every_bytes = 33554432\ncheckpoint_every_state_percent = 40\nindex_in_file = false\nsnapshot_cache_bytes = 1048576\ntoken = \"from-file\"\n",
        )
        .unwrap();
        // Only this test reads INBOXD_RATE_BURST.
        std::env::set_var("INBOXD_RATE_BURST", "6");
        let cli = Cli::try_parse_from([
            "inboxd".as_ref(),
            "--config".as_ref(),
            path.as_os_str(),
            "--in-flight-max".as_ref(),
            "3".as_ref(),
            "--token-file".as_ref(),
            dir.path().join("token").as_os_str(),
        ])
        .unwrap();
        std::env::remove_var("INBOXD_RATE_BURST");
        let config = Config::resolve(&cli.serve).unwrap();
        assert_eq!(config.limits.in_flight_max, 3, "flag beats file");
        assert_eq!(config.limits.rate_burst, 6, "env beats file");
        assert_eq!(
            config.history_retention,
            Some(Duration::from_secs(3600)),
            "file beats default"
        );
        assert_eq!(
            config.token,
            TokenSource::File(dir.path().join("token")),
            "a token flag replaces the file's token, whichever form"
        );
        let engine = config.engine_config([0; 32]);
        assert_eq!(engine.history_retention, Some(Duration::from_secs(3600)));
        assert_eq!(engine.idempotency_ttl, Duration::from_secs(600));
        assert_eq!(engine.checkpoint_every_bytes, 32 << 20);
        assert_eq!(engine.checkpoint_every_state_percent, 40);
        assert!(!engine.index_in_file);
        assert_eq!(engine.snapshot_cache_bytes, 1 << 20);
    }

    #[test]
    fn unknown_file_keys_and_bad_values_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inboxd.toml");
        std::fs::write(&path, "lisen = \"127.0.0.1:9000\"\n").unwrap();
        let args = ServeArgs {
            config: Some(path.clone()),
            ..ServeArgs::default()
        };
        assert!(matches!(
            Config::resolve(&args),
            Err(ConfigError::Parse { .. })
        ));
        std::fs::write(&path, "sync = \"sometimes\"\n").unwrap();
        assert!(matches!(
            Config::resolve(&args),
            Err(ConfigError::Invalid { key: "sync", .. })
        ));
        std::fs::write(&path, "io_backend = \"aio\"\n").unwrap();
        assert!(matches!(
            Config::resolve(&args),
            Err(ConfigError::Invalid {
                key: "io_backend",
                ..
            })
        ));
        std::fs::write(&path, "worker_threads = 0\n").unwrap();
        assert!(matches!(
            Config::resolve(&args),
            Err(ConfigError::Invalid {
                key: "worker_threads",
                ..
            })
        ));
        std::fs::write(&path, "checkpoint_every_bytes = 0\n").unwrap();
        assert!(matches!(
            Config::resolve(&args),
            Err(ConfigError::Invalid {
                key: "checkpoint_every_bytes",
                ..
            })
        ));
        std::fs::write(&path, "checkpoint_every_state_percent = 10001\n").unwrap();
        assert!(matches!(
            Config::resolve(&args),
            Err(ConfigError::Invalid {
                key: "checkpoint_every_state_percent",
                ..
            })
        ));
    }

    #[test]
    fn the_runtime_leaves_the_sequencer_a_core_unless_told_otherwise() {
        assert_eq!(default_worker_threads(1), 1, "never none");
        assert_eq!(default_worker_threads(2), 1);
        assert_eq!(default_worker_threads(16), 15);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inboxd.toml");
        std::fs::write(&path, "worker_threads = 3\n").unwrap();
        let args = ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        };
        assert_eq!(Config::resolve(&args).unwrap().worker_threads, 3);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let config = Config::resolve(&ServeArgs::default()).unwrap();
        assert_eq!(config.worker_threads, default_worker_threads(cores));
    }

    #[test]
    fn generated_token_is_private_and_reused_on_restart() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let source = TokenSource::Generated(dir.path().join("token"));
        let (first, generated) = load_token(&source).unwrap();
        assert_eq!(generated, Some(dir.path().join("token")));
        let mode = std::fs::metadata(dir.path().join("token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let (second, generated) = load_token(&source).unwrap();
        assert_eq!(first, second);
        assert_eq!(generated, None);
        assert_eq!(first.len(), 64);
    }

    #[test]
    fn a_groups_batch_token_key_is_the_same_on_every_member_and_follows_the_token() {
        let one = group_batch_token_key(b"group secret");
        assert_eq!(one, group_batch_token_key(b"group secret"));
        assert_ne!(one, group_batch_token_key(b"another secret"));
    }

    #[test]
    fn batch_token_key_is_stable_across_loads() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_batch_token_key(dir.path()).unwrap();
        assert_eq!(load_batch_token_key(dir.path()).unwrap(), first);
    }
}
