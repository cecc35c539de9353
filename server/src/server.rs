//! The daemon's lifecycle: open the engine, bind, accept, and shut down in
//! order (stop accepting → finish in-flight requests → `Inbox::shutdown`).
//!
//! [`run`] takes the shutdown signal as a `watch` so that the binary can
//! wire it to SIGTERM and tests can drive it directly.

use std::net::SocketAddr;
use std::sync::Arc;

use inbox_engine::Inbox;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::config::{self, Config};
use crate::conn::{self, Shared};
use crate::disk_space;
use crate::metrics::{self, Metrics};
use crate::tls::{ServerTls, TlsAcceptor};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("data directory {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("token: {0}")]
    Token(std::io::Error),
    #[error("admin token: {0}")]
    AdminToken(std::io::Error),
    #[error("the admin token must differ from the client token")]
    SameTokens,
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error(
        "io_backend = \"io_uring\" was asked for, but io_uring cannot be set up: {0}; \
         refusing to start (io_backend = \"pwrite\" works everywhere)"
    )]
    IoUring(std::io::Error),
    #[error("refusing to start: {0}")]
    DiskSpace(String),
    #[error("cannot open the store: {0}")]
    Open(inbox_engine::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error("shutdown did not sync cleanly: {0}")]
    Shutdown(inbox_engine::Error),
}

/// The segment size to open the store with: see [`disk_space`].
fn fit_segments(config: &Config, configured: u64) -> Result<u64, ServeError> {
    let data_dir_error = |source| ServeError::DataDir {
        path: config.data_dir.clone(),
        source,
    };
    let existing = disk_space::existing_segment_bytes(&config.data_dir).map_err(data_dir_error)?;
    let available = disk_space::available_bytes(&config.data_dir).map_err(data_dir_error)?;
    let choice = disk_space::choose_segment_bytes(
        configured,
        config.segment_bytes.is_some(),
        existing,
        available,
    )
    .map_err(ServeError::DiskSpace)?;
    if let Some(note) = &choice.note {
        tracing::warn!(segment_bytes = choice.segment_bytes, "{note}");
    }
    Ok(choice.segment_bytes)
}

/// The addresses actually bound (port 0 resolved).
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub listen: SocketAddr,
    pub metrics: SocketAddr,
}

/// Runs the daemon until `shutdown` flips to `true`, then drains and
/// syncs. `on_bound` is called once both listeners are up.
pub async fn run(
    config: Config,
    mut shutdown: watch::Receiver<bool>,
    on_bound: impl FnOnce(Bound),
) -> Result<(), ServeError> {
    std::fs::create_dir_all(&config.data_dir).map_err(|source| ServeError::DataDir {
        path: config.data_dir.clone(),
        source,
    })?;
    let (token, generated) = config::load_token(&config.token).map_err(ServeError::Token)?;
    if let Some(path) = generated {
        tracing::info!(path = %path.display(), "no token configured: generated one (mode 0600); clients read it from this file");
    }
    let (admin_token, generated) =
        config::load_token(&config.admin_token).map_err(ServeError::AdminToken)?;
    if let Some(path) = generated {
        tracing::info!(path = %path.display(), "no admin token configured: generated one (mode 0600); admin tools read it from this file");
    }
    if admin_token == token {
        return Err(ServeError::SameTokens);
    }
    let tls = config.tls.as_ref().map(ServerTls::acceptor).transpose()?;
    // A group's members share the key (a token issued by one leader is
    // honoured by the next); a single node keeps its own in its data
    // directory.
    let token_key = match &config.cluster {
        Some(_) => config::group_batch_token_key(&token),
        None => config::load_batch_token_key(&config.data_dir).map_err(|source| {
            ServeError::DataDir {
                path: config.data_dir.clone(),
                source,
            }
        })?,
    };

    if config.io_backend == inbox_engine::log::IoBackend::IoUring {
        // Asked for explicitly: fail here, naming the option, rather than
        // deep inside opening the store (and never fall back silently).
        inbox_engine::log::UringIo::new().map_err(ServeError::IoUring)?;
    }
    let mut engine_config = config.engine_config(token_key);
    engine_config.segment_bytes = fit_segments(&config, engine_config.segment_bytes)?;
    let inbox = tokio::task::spawn_blocking(move || Inbox::open(engine_config))
        .await
        .unwrap_or_else(|join| Err(inbox_engine::Error::Internal(join.to_string())))
        .map_err(ServeError::Open)?;
    let inbox = Arc::new(inbox);
    // A replicated group only when configured: otherwise no raft at all.
    let cluster = match &config.cluster {
        Some(c) => Some(
            crate::cluster::Cluster::serve(
                c,
                Arc::clone(&inbox),
                &config.data_dir,
                Arc::from(&token[..]),
            )
            .await?,
        ),
        None => None,
    };
    // The engine's figures, the memory breakdown too, are there from the
    // first scrape on.
    let metrics = Arc::new(Metrics::default());
    match &cluster {
        Some(cluster) => metrics.watch_group(cluster.handle()),
        None => metrics.watch_engine(Arc::clone(&inbox)),
    }
    let walk = std::time::Instant::now();
    metrics::take_memory(&metrics).await;
    tracing::info!(
        memory_ms = walk.elapsed().as_millis() as u64,
        "memory breakdown taken"
    );

    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })?;
    let metrics_listener = TcpListener::bind(config.metrics_listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.metrics_listen,
            source,
        })?;
    let bound = Bound {
        listen: listener.local_addr().unwrap_or(config.listen),
        metrics: metrics_listener
            .local_addr()
            .unwrap_or(config.metrics_listen),
    };
    tracing::info!(listen = %bound.listen, metrics = %bound.metrics, data_dir = %config.data_dir.display(), tls = tls.is_some(), worker_threads = config.worker_threads, mutual_tls = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some()), "inboxd serving");
    on_bound(bound);

    let metrics_task = tokio::spawn(metrics::serve(
        metrics_listener,
        Arc::clone(&metrics),
        tls.clone(),
    ));
    let shared = Arc::new(Shared {
        inbox: Arc::clone(&inbox),
        metrics: Arc::clone(&metrics),
        limits: config.limits.clone(),
        token,
        admin_token,
        read_pool: crate::read_pool::ReadPool::with_default_limit(&metrics),
        engine_queue: crate::conn::engine_queue(&config.limits),
        route: crate::route::Route::new(cluster.as_ref().map(crate::cluster::Cluster::handle)),
        hint_routes: Arc::default(),
        dirty_routes: Arc::default(),
        alone: crate::alone::Alone::new(config.send_inline_when_alone),
    });
    let hints_tasks = {
        let current = Arc::clone(&shared);
        let engine: crate::hints::CurrentEngine = Arc::new(move || current.engine().into_owned());
        [
            tokio::spawn(crate::hints::dispatch::<crate::hints::Watermarks>(
                Arc::clone(&engine),
                Arc::clone(&shared.hint_routes),
                Arc::clone(&metrics),
                shutdown.clone(),
            )),
            tokio::spawn(crate::hints::dispatch::<crate::hints::Markers>(
                engine,
                Arc::clone(&shared.dirty_routes),
                Arc::clone(&metrics),
                shutdown.clone(),
            )),
        ]
    };
    let memory_task = tokio::spawn(metrics::refresh_memory(
        Arc::clone(&metrics),
        shutdown.clone(),
    ));
    let page_cache_task = tokio::spawn(crate::page_cache::watch(
        Arc::clone(&shared),
        shutdown.clone(),
    ));
    let slots = Arc::new(Semaphore::new(config.limits.max_connections as usize));
    let mut connections = JoinSet::new();

    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => break,
        };
        // Reap finished connection tasks so the set stays small.
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            metrics.connections_refused.inc();
            tracing::warn!(%peer, "connection refused: at the connection limit");
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    None => conn::refuse(stream, "too many connections").await,
                    Some(acceptor) => {
                        if let Some(stream) = tls_accept(&acceptor, stream, peer).await {
                            conn::refuse(stream, "too many connections").await;
                        }
                    }
                }
            });
            continue;
        };
        metrics.connections.inc();
        metrics.connections_open.inc();
        let shared = Arc::clone(&shared);
        let shutdown = shutdown.clone();
        let metrics = Arc::clone(&metrics);
        let tls = tls.clone();
        connections.spawn(async move {
            match tls {
                None => {
                    let (reader, writer) = stream.into_split();
                    conn::serve(reader, writer, Some(peer), shared, shutdown).await;
                }
                Some(acceptor) => {
                    // The handshake runs on the connection's task, so a slow
                    // or silent peer never holds up the accept loop.
                    if let Some(stream) = tls_accept(&acceptor, stream, peer).await {
                        let (reader, writer) = tokio::io::split(stream);
                        conn::serve(reader, writer, Some(peer), shared, shutdown).await;
                    } else {
                        metrics.tls_handshakes_failed.inc();
                    }
                }
            }
            metrics.connections_open.dec();
            drop(slot);
        });
    }

    drop(listener);
    metrics.set_not_ready();
    tracing::info!(
        connections = connections.len(),
        "shutting down: no longer accepting; finishing in-flight requests"
    );
    let drained = tokio::time::timeout(config.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(grace = ?config.shutdown_grace, "in-flight requests did not finish within the grace period");
        connections.abort_all();
    }
    metrics_task.abort();
    memory_task.abort();
    page_cache_task.abort();
    // The dispatcher holds the shared state: gone before the engine stops.
    for task in hints_tasks {
        task.abort();
        let _ = task.await;
    }
    // A group's engine is the one its last snapshot install opened.
    let engine = shared.engine().into_owned();
    drop(shared);
    if let Some(cluster) = cluster {
        cluster.shutdown().await;
    }
    tokio::task::spawn_blocking(move || engine.shutdown())
        .await
        .unwrap_or_else(|join| Err(inbox_engine::Error::Internal(join.to_string())))
        .map_err(ServeError::Shutdown)?;
    tracing::info!("shutdown complete: store synced");
    Ok(())
}

/// Runs the TLS handshake within [`conn::HANDSHAKE_TIMEOUT`]. A failure is
/// the peer's (wrong CA, no client certificate under mutual TLS, plain TCP
/// on a TLS port) and is logged at `info`, not answered.
pub(crate) async fn tls_accept<S>(
    acceptor: &TlsAcceptor,
    stream: S,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<S>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match tokio::time::timeout(conn::HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(err)) => {
            tracing::info!(%peer, error = %err, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::info!(%peer, "TLS handshake not completed in time");
            None
        }
    }
}
