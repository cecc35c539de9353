//! Daemon configuration: flags, then `INBOXD_*` environment variables,
//! then a TOML file, then the embedded defaults, in that order of
//! precedence. Flags and environment are parsed by clap (each flag names
//! its variable); the file fills what both left unset.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use inbox_engine::log::SyncPolicy;
use serde::Deserialize;

use crate::tls::ServerTls;

/// `inboxd serve` options. Every one is optional so that "unset" can fall
/// through to the file and then the default.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML file with the same keys as these flags (snake_case).
    #[arg(long, env = "INBOXD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory [default: ./data].
    #[arg(long, env = "INBOXD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Protocol listen address [default: 127.0.0.1:7070].
    #[arg(long, env = "INBOXD_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Prometheus metrics listen address [default: 127.0.0.1:7071].
    #[arg(long, env = "INBOXD_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Shared secret clients present in HELLO. Prefer --token-file.
    #[arg(long, env = "INBOXD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the shared secret [default: DATA_DIR/token, generated
    /// with mode 0600 when missing].
    #[arg(long, env = "INBOXD_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Secret for admin requests (COMPACT, CHECKPOINT, EXPLAIN,
    /// EXPLAIN_SEGMENT, STATS). Prefer --admin-token-file.
    #[arg(long, env = "INBOXD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// File holding the admin secret [default: DATA_DIR/admin_token,
    /// generated with mode 0600 when missing].
    #[arg(long, env = "INBOXD_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// PEM certificate chain (leaf first): serve TLS on every listener.
    #[arg(long, env = "INBOXD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "INBOXD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): require client certificates that chain to
    /// them (mutual TLS). Needs --tls-cert.
    #[arg(long, env = "INBOXD_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Concurrent client connections [default: 1024].
    #[arg(long, env = "INBOXD_MAX_CONNECTIONS")]
    pub max_connections: Option<u32>,
    /// Largest request frame accepted, bytes [default: 1048576].
    #[arg(long, env = "INBOXD_FRAME_BYTES_MAX")]
    pub frame_bytes_max: Option<u32>,
    /// Largest reply frame sent, bytes [default: 67108864].
    #[arg(long, env = "INBOXD_REPLY_FRAME_BYTES_MAX")]
    pub reply_frame_bytes_max: Option<u32>,
    /// Requests read ahead per connection before reading stops [default: 256].
    #[arg(long, env = "INBOXD_IN_FLIGHT_MAX")]
    pub in_flight_max: Option<u32>,
    /// Close a connection that completed no frame for this long, seconds
    /// (the HELLO is due within at most 10) [default: 300].
    #[arg(long, env = "INBOXD_IDLE_TIMEOUT_S")]
    pub idle_timeout_s: Option<u64>,
    /// Sustained requests per second per connection [default: 20000].
    #[arg(long, env = "INBOXD_RATE_PER_S")]
    pub rate_per_s: Option<u32>,
    /// Burst of requests per connection above the rate [default: 2000].
    #[arg(long, env = "INBOXD_RATE_BURST")]
    pub rate_burst: Option<u32>,
    /// Uids one connection may be subscribed to at once [default: 100000].
    #[arg(long, env = "INBOXD_SUBSCRIBE_UIDS_MAX")]
    pub subscribe_uids_max: Option<u32>,
    /// Subscriptions held by all connections together [default: 1000000].
    #[arg(long, env = "INBOXD_SUBSCRIPTIONS_MAX")]
    pub subscriptions_max: Option<u64>,
    /// `always` (fdatasync before reply), `none`, or `interval:MS` [default: always].
    #[arg(long, env = "INBOXD_SYNC")]
    pub sync: Option<String>,
    /// Seconds to wait for in-flight requests at shutdown [default: 30].
    #[arg(long, env = "INBOXD_SHUTDOWN_GRACE_S")]
    pub shutdown_grace_s: Option<u64>,
    /// Lifetime of a sync batch token, seconds [default: the engine's, 600].
    #[arg(long, env = "INBOXD_BATCH_TOKEN_TTL_S")]
    pub batch_token_ttl_s: Option<u64>,
    /// Size of each preallocated log segment, bytes [default: the
    /// engine's, 134217728]. Below about 129 KiB it also caps payloads
    /// (a message must fit half a segment), under the 64 KiB default.
    #[arg(long, env = "INBOXD_SEGMENT_BYTES")]
    pub segment_bytes: Option<u64>,
    /// Events younger than this are never reclaimed, seconds [default: the
    /// engine's, 7 days].
    #[arg(long, env = "INBOXD_SAFETY_WINDOW_S")]
    pub safety_window_s: Option<u64>,
    /// Seconds between background compaction passes; 0 turns them off
    /// [default: the engine's, 60].
    #[arg(long, env = "INBOXD_COMPACTION_INTERVAL_S")]
    pub compaction_interval_s: Option<u64>,
}

/// The same keys as [`ServeArgs`], read from TOML.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    listen: Option<SocketAddr>,
    metrics_listen: Option<SocketAddr>,
    token: Option<String>,
    token_file: Option<PathBuf>,
    admin_token: Option<String>,
    admin_token_file: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    max_connections: Option<u32>,
    frame_bytes_max: Option<u32>,
    reply_frame_bytes_max: Option<u32>,
    in_flight_max: Option<u32>,
    idle_timeout_s: Option<u64>,
    rate_per_s: Option<u32>,
    rate_burst: Option<u32>,
    subscribe_uids_max: Option<u32>,
    subscriptions_max: Option<u64>,
    sync: Option<String>,
    shutdown_grace_s: Option<u64>,
    batch_token_ttl_s: Option<u64>,
    segment_bytes: Option<u64>,
    safety_window_s: Option<u64>,
    compaction_interval_s: Option<u64>,
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
        source: toml::de::Error,
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

impl Config {
    /// Resolves flags/env (already merged by clap) over the file over the
    /// defaults.
    pub fn resolve(args: &ServeArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            None => FileConfig::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                toml::from_str(&text).map_err(|source| ConfigError::Parse {
                    path: path.clone(),
                    source,
                })?
            }
        };
        let defaults = Limits::default();
        let data_dir = args
            .data_dir
            .clone()
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from("./data"));
        let token = match (args.token.clone(), args.token_file.clone()) {
            (Some(token), _) => TokenSource::Inline(token),
            (None, Some(path)) => TokenSource::File(path),
            (None, None) => match (file.token, file.token_file) {
                (Some(token), _) => TokenSource::Inline(token),
                (None, Some(path)) => TokenSource::File(path),
                (None, None) => TokenSource::Generated(data_dir.join("token")),
            },
        };
        let admin_token = match (args.admin_token.clone(), args.admin_token_file.clone()) {
            (Some(token), _) => TokenSource::Inline(token),
            (None, Some(path)) => TokenSource::File(path),
            (None, None) => match (file.admin_token, file.admin_token_file) {
                (Some(token), _) => TokenSource::Inline(token),
                (None, Some(path)) => TokenSource::File(path),
                (None, None) => TokenSource::Generated(data_dir.join("admin_token")),
            },
        };
        let tls_cert = args.tls_cert.clone().or(file.tls_cert);
        let tls_key = args.tls_key.clone().or(file.tls_key);
        let tls_client_ca = args.tls_client_ca.clone().or(file.tls_client_ca);
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
            max_connections: args
                .max_connections
                .or(file.max_connections)
                .unwrap_or(defaults.max_connections),
            frame_bytes_max: args
                .frame_bytes_max
                .or(file.frame_bytes_max)
                .unwrap_or(defaults.frame_bytes_max),
            reply_frame_bytes_max: args
                .reply_frame_bytes_max
                .or(file.reply_frame_bytes_max)
                .unwrap_or(defaults.reply_frame_bytes_max),
            in_flight_max: args
                .in_flight_max
                .or(file.in_flight_max)
                .unwrap_or(defaults.in_flight_max),
            idle_timeout: args
                .idle_timeout_s
                .or(file.idle_timeout_s)
                .map_or(defaults.idle_timeout, Duration::from_secs),
            rate_per_s: args
                .rate_per_s
                .or(file.rate_per_s)
                .unwrap_or(defaults.rate_per_s),
            rate_burst: args
                .rate_burst
                .or(file.rate_burst)
                .unwrap_or(defaults.rate_burst),
            subscribe_uids_max: args
                .subscribe_uids_max
                .or(file.subscribe_uids_max)
                .unwrap_or(defaults.subscribe_uids_max),
            subscriptions_max: args
                .subscriptions_max
                .or(file.subscriptions_max)
                .unwrap_or(defaults.subscriptions_max),
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
        let sync = match args.sync.clone().or(file.sync) {
            Some(text) => parse_sync(&text)?,
            None => SyncPolicy::Always,
        };
        Ok(Config {
            data_dir,
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7070))),
            metrics_listen: args
                .metrics_listen
                .or(file.metrics_listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7071))),
            token,
            admin_token,
            tls,
            limits,
            sync,
            shutdown_grace: Duration::from_secs(
                args.shutdown_grace_s
                    .or(file.shutdown_grace_s)
                    .unwrap_or(30),
            ),
            batch_token_ttl: args
                .batch_token_ttl_s
                .or(file.batch_token_ttl_s)
                .map(Duration::from_secs),
            segment_bytes: args.segment_bytes.or(file.segment_bytes),
            safety_window: args
                .safety_window_s
                .or(file.safety_window_s)
                .map(Duration::from_secs),
            compaction_interval: args
                .compaction_interval_s
                .or(file.compaction_interval_s)
                .map(Duration::from_secs),
        })
    }
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
            "listen = \"127.0.0.1:9000\"\nin_flight_max = 7\nsync = \"interval:5\"\n",
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
        assert_eq!(config.metrics_listen, "127.0.0.1:7071".parse().unwrap());
        assert_eq!(config.data_dir, PathBuf::from("./data"));
        assert_eq!(
            config.token,
            TokenSource::Generated(PathBuf::from("./data/token"))
        );
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
    fn batch_token_key_is_stable_across_loads() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_batch_token_key(dir.path()).unwrap();
        assert_eq!(load_batch_token_key(dir.path()).unwrap(), first);
    }
}
