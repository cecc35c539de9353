//! One client connection: framing, the handshake, limits, pipelining and
//! hint pushes. Requests themselves go to [`crate::service`].
//!
//! Invariants:
//! - nothing reaches the engine before a successful `HELLO` (a version
//!   this build serves, right token);
//! - a request with id 0 (reserved for the server's own frames) is refused
//!   and the connection closes;
//! - a version 1 connection gets version 1 layouts ([`inbox_wire::v1`]); anything else first is answered
//!   `UNAUTHENTICATED` and the connection closes;
//! - admin requests (`COMPACT`, `CHECKPOINT`, `EXPLAIN*`, `STATS`) run only
//!   on a connection that said `HELLO` with the admin token; with the
//!   client token they are answered `FORBIDDEN`. The admin token may make
//!   every other request too;
//! - a connection holds at most `subscribe_uids_max` subscriptions and all
//!   connections together at most `subscriptions_max`: a `SUBSCRIBE` over
//!   the first is answered `TOO_LARGE`, over the second `RATE_LIMITED`, and
//!   adds nothing;
//! - a frame that breaks the framing (over the size limit, too short) is
//!   answered (request id 0) and the connection closes: the next frame
//!   boundary cannot be found. A well-framed bad body or unknown opcode is
//!   answered and the connection goes on;
//! - a refused request (bad body, rate limit) never reaches the engine, so
//!   it changes nothing;
//! - requests take effect in the order they arrived, while their replies
//!   go out as each completes: a write (it goes to the sequencer) is queued
//!   on the engine by the reader itself, in arrival order, so the sequencer
//!   sees a connection's writes in that order without waiting for any of
//!   them; a read (or `SYNC`) waits until every earlier write of the
//!   connection has completed, and the next write is not queued until the
//!   reads before it have read. Pipelined writes therefore still share
//!   rounds, and pipelined reads still run side by side;
//! - at most `in_flight_max` requests run at once; when they do, the reader
//!   stops reading and TCP pushes back on the client;
//! - writes queued on the engine by all connections together hold at most
//!   `engine_queue_bytes_max` of request bytes (each counts its body, at
//!   least [`ENGINE_QUEUE_UNIT`]); a reader whose write does not fit waits
//!   before queuing it, so it too stops reading: the sequencer's queue is
//!   bounded and the push-back reaches the clients that fill it;
//! - a connection that completes no frame within the idle timeout (the
//!   `HELLO` within at most [`HANDSHAKE_TIMEOUT`]) and has nothing running
//!   is closed, however many bytes it trickles in: a slowloris peer cannot
//!   hold a connection slot forever;
//! - on shutdown the reader stops, every request already read finishes and
//!   its reply is written, then the socket closes.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use inbox_engine::Inbox;
use inbox_wire::{
    Empty, ErrorCode, ErrorReply, Frame, FrameCodec, Hello, HelloOk, Request, Response, WireError,
    PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
};
use subtle::ConstantTimeEq as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::config::Limits;
use crate::metrics::Metrics;
use crate::read_pool::ReadPool;
use crate::{hints, service};

/// Longest wait for a complete `HELLO` on a new connection (or the idle
/// timeout, when that is shorter): a connection that has not authenticated
/// holds a slot without doing anything useful.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The granule of the engine queue's budget, bytes: a write costs its
/// body's size rounded up to it, at least one.
pub const ENGINE_QUEUE_UNIT: u64 = 1024;

/// What every connection shares.
pub struct Shared {
    pub inbox: Arc<Inbox>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub token: Bytes,
    pub admin_token: Bytes,
    /// Where reads that may touch the disk run.
    pub read_pool: ReadPool,
    /// The budget of writes queued on the engine and not yet answered, in
    /// [`ENGINE_QUEUE_UNIT`]s (see [`engine_queue`]).
    pub engine_queue: Arc<Semaphore>,
    /// Set when this node is one of a replicated group: a node that does
    /// not lead answers every request `NOT_LEADER`.
    pub group: Option<crate::cluster::GroupHandle>,
    /// Which connections listen for which uid's `HINT`s and `DIRTY_HINT`s;
    /// the daemon's dispatchers ([`hints::dispatch`]) route each round by
    /// them.
    pub(crate) hint_routes: Arc<hints::Routes<inbox_wire::Hint>>,
    pub(crate) dirty_routes: Arc<hints::Routes<inbox_wire::DirtyHint>>,
    /// Whether one connection alone is making requests: its sends are
    /// then committed on its worker ([`crate::alone`]).
    pub alone: crate::alone::Alone,
}

/// Numbers connections for [`crate::alone::Alone`]; 0 is nobody.
static NEXT_CONNECTION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Shared {
    /// The engine requests go to: a group's current one (a snapshot
    /// install replaces it), else `inbox`, borrowed at no cost.
    pub fn engine(&self) -> std::borrow::Cow<'_, Arc<Inbox>> {
        match &self.group {
            Some(g) => std::borrow::Cow::Owned(g.inbox()),
            None => std::borrow::Cow::Borrowed(&self.inbox),
        }
    }
}

/// The semaphore bounding what all connections may have queued on the
/// engine: `bytes_max` in units of [`ENGINE_QUEUE_UNIT`], never less than
/// one largest request, so any request the framing accepts can be queued.
pub fn engine_queue(limits: &Limits) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(engine_queue_units(limits) as usize))
}

fn engine_queue_units(limits: &Limits) -> u32 {
    let floor = queue_cost(limits.frame_bytes_max as usize);
    u32::try_from(limits.engine_queue_bytes_max / ENGINE_QUEUE_UNIT)
        .unwrap_or(u32::MAX)
        .clamp(floor, Semaphore::MAX_PERMITS as u32)
}

/// What a write whose body is `body_bytes` long costs the engine queue.
fn queue_cost(body_bytes: usize) -> u32 {
    u32::try_from((body_bytes as u64).div_ceil(ENGINE_QUEUE_UNIT).max(1)).unwrap_or(u32::MAX)
}

/// What the token presented in `HELLO` allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Client,
    Admin,
}

/// Requests that inspect or steer the whole store rather than one user's
/// data: they need the admin token.
fn is_admin(request: &Request) -> bool {
    matches!(
        request,
        Request::Stats(_)
            | Request::Explain(_)
            | Request::ExplainSegment(_)
            | Request::Compact(_)
            | Request::Checkpoint(_)
            | Request::Memory(_)
            | Request::ClusterStatus(_)
            | Request::ClusterAddNode(_)
            | Request::ClusterRemoveNode(_)
    )
}

/// Gives back a connection's subscriptions to the shared budget, and takes
/// its mailbox off the hint routes, when the connection ends, however it
/// ends.
struct SubscriptionGuard {
    shared: Arc<Shared>,
    subscribed: Arc<Mutex<HashSet<u64>>>,
    mailbox: Arc<hints::Mailbox<inbox_wire::Hint>>,
    dirty_mailbox: Arc<hints::Mailbox<inbox_wire::DirtyHint>>,
}

impl Drop for SubscriptionGuard {
    fn drop(&mut self) {
        let set = self.subscribed.lock().unwrap_or_else(|p| p.into_inner());
        let uids: Vec<u64> = set.iter().copied().collect();
        drop(set);
        self.shared.hint_routes.remove(&uids, &self.mailbox);
        self.shared.dirty_routes.remove(&uids, &self.dirty_mailbox);
        let held = uids.len() as u64;
        self.shared
            .metrics
            .subscriptions
            .inner()
            .fetch_sub(held, Ordering::Relaxed);
    }
}

/// A token bucket: `rate_per_s` sustained, `burst` at once.
struct RateLimiter {
    tokens: f64,
    rate_per_s: f64,
    burst: f64,
    last: Instant,
}

impl RateLimiter {
    fn new(rate_per_s: u32, burst: u32) -> Self {
        Self {
            tokens: f64::from(burst),
            rate_per_s: f64::from(rate_per_s),
            burst: f64::from(burst),
            last: Instant::now(),
        }
    }

    /// Takes one token, or says how long until one is available.
    fn take(&mut self) -> Result<(), Duration> {
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * self.rate_per_s;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64(
            (1.0 - self.tokens) / self.rate_per_s,
        ))
    }
}

/// Compares tokens in time independent of where they differ (only the
/// length, which is not secret, ends the comparison early).
fn token_matches(expected: &[u8], presented: &[u8]) -> bool {
    bool::from(expected.ct_eq(presented))
}

fn error_frame(request_id: u64, code: ErrorCode, detail: u64, message: impl Into<String>) -> Frame {
    Response::Error(ErrorReply::new(code, detail, message)).to_frame(request_id)
}

/// Writes queued frames, batching whatever is ready into one write.
async fn write_loop<W: AsyncWrite + Unpin>(mut socket: W, mut rx: mpsc::Receiver<Frame>) {
    let codec = FrameCodec::new(u32::MAX);
    let mut out = BytesMut::with_capacity(64 << 10);
    while let Some(frame) = rx.recv().await {
        let _ = codec.encode(&frame, &mut out);
        while out.len() < (256 << 10) {
            match rx.try_recv() {
                Ok(frame) => {
                    let _ = codec.encode(&frame, &mut out);
                }
                Err(_) => break,
            }
        }
        if socket.write_all(&out).await.is_err() {
            return;
        }
        out.clear();
    }
    let _ = socket.shutdown().await;
}

/// How the reader loop ended.
enum Close {
    /// Peer closed, idle, or shutdown.
    Quietly,
    /// A reply was queued that explains why.
    WithError,
}

/// Serves one connection, given as its two halves (a TCP socket's or a
/// TLS stream's), until the peer leaves, the stream breaks, or `shutdown`
/// flips.
pub async fn serve<R, W>(
    mut reader: R,
    writer: W,
    peer: Option<SocketAddr>,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let in_flight_max = shared.limits.in_flight_max as usize;
    let connection = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel::<Frame>(in_flight_max + 64);
    let writer_task = tokio::spawn(write_loop(writer, rx));
    let in_flight = Arc::new(Semaphore::new(in_flight_max));
    let codec = FrameCodec::new(shared.limits.frame_bytes_max);
    let mut rate = RateLimiter::new(shared.limits.rate_per_s, shared.limits.rate_burst);
    let subscribed = Arc::new(Mutex::new(HashSet::new()));
    let mailbox = Arc::new(hints::Mailbox::default());
    let dirty_mailbox = Arc::new(hints::Mailbox::default());
    // Set by the first `SUBSCRIBE_DIRTY`: from then on every uid the
    // connection subscribes to is also routed `DIRTY_HINT`s.
    let mut dirty_routed = false;
    let _subscriptions = SubscriptionGuard {
        shared: Arc::clone(&shared),
        subscribed: Arc::clone(&subscribed),
        mailbox: Arc::clone(&mailbox),
        dirty_mailbox: Arc::clone(&dirty_mailbox),
    };
    let (closed_tx, closed_rx) = watch::channel(false);
    let mut hint_task = None;
    let mut dirty_hint_task = None;
    let mut role = None;
    // The protocol version the handshake settled on.
    let mut version = PROTOCOL_VERSION;
    let mut buf = BytesMut::with_capacity(8 << 10);
    // Ordering (see the module header): the last write's completion, and a
    // lock that reads hold until they have read and writes take to queue.
    let mut writes_done: Option<watch::Receiver<bool>> = None;
    let reads = Arc::new(tokio::sync::RwLock::new(()));
    // The idle clock runs from the last complete frame, not the last byte:
    // a peer trickling a byte at a time (slowloris) still has to finish a
    // frame within the timeout, and the handshake within a shorter one.
    let idle_timeout = shared.limits.idle_timeout;
    let mut deadline = tokio::time::Instant::now() + idle_timeout.min(HANDSHAKE_TIMEOUT);

    let close = loop {
        if *shutdown.borrow() {
            break Close::Quietly;
        }
        let frame = match codec.decode(&mut buf) {
            Ok(Some(frame)) => {
                deadline = tokio::time::Instant::now() + idle_timeout;
                frame
            }
            Ok(None) => {
                let read = tokio::select! {
                    read = tokio::time::timeout_at(deadline, reader.read_buf(&mut buf)) => read,
                    _ = shutdown.changed() => break Close::Quietly,
                };
                match read {
                    Ok(Ok(0)) if !buf.is_empty() => {
                        // The peer half-closed inside a frame; it may still
                        // be reading, so say what happened.
                        let message =
                            format!("stream ended inside a frame ({} bytes buffered)", buf.len());
                        let _ = tx
                            .send(error_frame(0, ErrorCode::BadRequest, 0, message))
                            .await;
                        break Close::WithError;
                    }
                    Ok(Ok(0)) | Ok(Err(_)) => break Close::Quietly,
                    Ok(Ok(_)) => continue,
                    Err(_idle) => {
                        if in_flight.available_permits() != in_flight_max {
                            // Requests still running: not idle, wait again.
                            deadline = tokio::time::Instant::now() + idle_timeout;
                            continue;
                        }
                        if !buf.is_empty() {
                            tracing::info!(
                                ?peer,
                                buffered = buf.len(),
                                "closing connection: frame not completed in time"
                            );
                            let message = format!(
                                "frame not completed in time ({} bytes buffered)",
                                buf.len()
                            );
                            let _ = tx
                                .send(error_frame(0, ErrorCode::BadRequest, 0, message))
                                .await;
                            break Close::WithError;
                        }
                        tracing::debug!(?peer, ?role, "closing idle connection");
                        break Close::Quietly;
                    }
                }
            }
            Err(err) => {
                tracing::info!(?peer, error = %err, "closing connection: corrupt stream");
                let detail = match err {
                    WireError::FrameTooLarge { max, .. } => u64::from(max),
                    _ => 0,
                };
                let _ = tx
                    .send(error_frame(0, err.code(), detail, err.to_string()))
                    .await;
                break Close::WithError;
            }
        };

        if frame.request_id == 0 {
            // Request id 0 belongs to the server's own frames (hints and
            // connection errors): a reply to it could not be told apart.
            tracing::info!(?peer, "closing connection: request id 0");
            let _ = tx
                .send(error_frame(
                    0,
                    ErrorCode::BadRequest,
                    0,
                    "request id 0 is reserved for the server's own frames",
                ))
                .await;
            break Close::WithError;
        }

        let Some(role) = role else {
            match handshake(&shared, &frame) {
                Ok((granted, negotiated, reply)) => {
                    role = Some(granted);
                    version = negotiated;
                    let _ = tx.send(reply).await;
                    continue;
                }
                Err(reply) => {
                    tracing::info!(?peer, "closing connection: handshake refused");
                    let _ = tx.send(reply).await;
                    break Close::WithError;
                }
            }
        };

        let request_id = frame.request_id;
        let body_bytes = frame.body.len();
        let request = match Request::decode(frame.opcode, frame.body) {
            Ok(request) => request,
            Err(err) => {
                let name = inbox_wire::Op::from_u8(frame.opcode).map_or("UNKNOWN", |op| op.name());
                shared.metrics.observe_refused(name, err.code());
                let _ = tx
                    .send(error_frame(request_id, err.code(), 0, err.to_string()))
                    .await;
                continue;
            }
        };
        if let Err(wait) = rate.take() {
            let op = request.op();
            shared
                .metrics
                .observe_refused(op.name(), ErrorCode::RateLimited);
            // Rounded up: a client that waits exactly this long finds a token.
            let wait_ms = u64::try_from(wait.as_micros().div_ceil(1000))
                .unwrap_or(u64::MAX)
                .max(1);
            let _ = tx
                .send(error_frame(
                    request_id,
                    ErrorCode::RateLimited,
                    wait_ms,
                    format!(
                        "over {} requests/s on this connection",
                        shared.limits.rate_per_s
                    ),
                ))
                .await;
            continue;
        }

        if is_admin(&request) && role != Role::Admin {
            let op = request.op();
            shared
                .metrics
                .observe_refused(op.name(), ErrorCode::Forbidden);
            let _ = tx
                .send(error_frame(
                    request_id,
                    ErrorCode::Forbidden,
                    0,
                    format!("{} needs the admin token", op.name()),
                ))
                .await;
            continue;
        }

        match request {
            Request::Hello(_) => {
                let _ = tx
                    .send(error_frame(
                        request_id,
                        ErrorCode::BadRequest,
                        0,
                        "already authenticated",
                    ))
                    .await;
            }
            Request::Ping(_) => {
                let _ = tx.send(Response::Ping(Empty {}).to_frame(request_id)).await;
            }
            // Every member answers for itself: no leader needed.
            Request::ClusterStatus(_) => {
                let status = match &shared.group {
                    Some(group) => group.status(),
                    None => inbox_wire::ClusterStatus {
                        role: "single".into(),
                        ..inbox_wire::ClusterStatus::default()
                    },
                };
                let _ = tx
                    .send(Response::ClusterStatus(status).to_frame(request_id))
                    .await;
            }
            // Run on the leader by the group itself, for up to a minute:
            // answered from a task of their own, like any request that
            // takes time.
            Request::ClusterAddNode(_) | Request::ClusterRemoveNode(_) => {
                let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                    break Close::Quietly;
                };
                let (shared, tx) = (Arc::clone(&shared), tx.clone());
                tokio::spawn(async move {
                    let op = request.op();
                    let started = Instant::now();
                    let response = change_membership(shared.group.as_ref(), request).await;
                    let code = match &response {
                        Response::Error(err) => Some(err.code),
                        _ => None,
                    };
                    shared.metrics.observe_request(op, code, started.elapsed());
                    let _ = tx.send(reply_frame(version, &response, request_id)).await;
                    drop(permit);
                });
            }
            Request::Subscribe(ref list) | Request::SubscribeDirty(ref list) => {
                let dirty = matches!(request, Request::SubscribeDirty(_));
                let fresh = match subscribe(&shared, &subscribed, &list.uids) {
                    Ok(fresh) => fresh,
                    Err(refusal) => {
                        let name = if dirty {
                            "SUBSCRIBE_DIRTY"
                        } else {
                            "SUBSCRIBE"
                        };
                        shared.metrics.observe_refused(name, refusal.code);
                        let _ = tx
                            .send(error_frame(
                                request_id,
                                refusal.code,
                                refusal.detail,
                                refusal.message,
                            ))
                            .await;
                        continue;
                    }
                };
                shared.hint_routes.add(&fresh, &mailbox);
                if dirty_routed {
                    shared.dirty_routes.add(&fresh, &dirty_mailbox);
                } else if dirty {
                    // Every uid held, fresh or not, none routed yet.
                    dirty_routed = true;
                    let held: Vec<u64> = subscribed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .copied()
                        .collect();
                    shared.dirty_routes.add(&held, &dirty_mailbox);
                }
                if hint_task.is_none() {
                    hint_task = Some(tokio::spawn(hints::push_loop(
                        Arc::clone(&mailbox),
                        tx.clone(),
                        Arc::clone(&shared.metrics),
                        closed_rx.clone(),
                    )));
                }
                if dirty_routed && dirty_hint_task.is_none() {
                    dirty_hint_task = Some(tokio::spawn(hints::push_loop(
                        Arc::clone(&dirty_mailbox),
                        tx.clone(),
                        Arc::clone(&shared.metrics),
                        closed_rx.clone(),
                    )));
                }
                let reply = if dirty {
                    Response::SubscribeDirty(Empty {})
                } else {
                    Response::Subscribe(Empty {})
                };
                let _ = tx.send(reply.to_frame(request_id)).await;
            }
            Request::Unsubscribe(list) => {
                {
                    let mut set = subscribed.lock().unwrap_or_else(|p| p.into_inner());
                    let gone: Vec<u64> = list
                        .uids
                        .iter()
                        .copied()
                        .filter(|uid| set.remove(uid))
                        .collect();
                    shared.hint_routes.remove(&gone, &mailbox);
                    shared.dirty_routes.remove(&gone, &dirty_mailbox);
                    let removed = gone.len() as u64;
                    shared
                        .metrics
                        .subscriptions
                        .inner()
                        .fetch_sub(removed, Ordering::Relaxed);
                }
                let _ = tx
                    .send(Response::Unsubscribe(Empty {}).to_frame(request_id))
                    .await;
            }
            request => {
                // Waiting for a permit here is the backpressure: while the
                // connection has `in_flight_max` requests running, nothing
                // more is read from the socket.
                let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                    break Close::Quietly;
                };
                let op = request.op();
                // A send runs on this worker only for a connection alone
                // with nothing else on the way: a client with more requests
                // buffered or in flight has them decided in one round.
                let here = if shared.alone.note(connection)
                    && buf.is_empty()
                    && in_flight.available_permits() + 1 == in_flight_max
                {
                    service::Here::IfIdle
                } else {
                    service::Here::Never
                };
                let order = service::order_of(&request);
                let reads_when_awaited = service::reads_when_awaited(&request);
                let earlier = writes_done.clone();
                let done = match order {
                    service::Order::Read => None,
                    service::Order::Write | service::Order::ReadWrite => {
                        let (done_tx, done_rx) = watch::channel(false);
                        writes_done = Some(done_rx);
                        Some(done_tx)
                    }
                };
                // A write's `done` flips only after every earlier write's:
                // waiting for the last one waits for them all.
                let chain = earlier.clone();
                let started = Instant::now();
                // A write waits here, before it is queued, while the engine
                // queue is full: the reader stops with it.
                let queued = match order {
                    service::Order::Read => None,
                    service::Order::Write | service::Order::ReadWrite => {
                        let cost = queue_cost(body_bytes);
                        match Arc::clone(&shared.engine_queue)
                            .acquire_many_owned(cost)
                            .await
                        {
                            Ok(p) => {
                                let bytes = u64::from(cost) * ENGINE_QUEUE_UNIT;
                                shared.metrics.engine_queue_bytes.inc_by(bytes);
                                Some((p, bytes))
                            }
                            Err(_) => break Close::Quietly,
                        }
                    }
                };
                let local = about_this_node(&request);
                let refusal = (shared.group.as_ref())
                    .filter(|g| !g.is_leading() && !local)
                    .map(|g| g.not_leader("not the leader"));
                let reply: service::Started = match (refusal, order) {
                    (Some(refusal), _) => Box::pin(std::future::ready(Response::Error(refusal))),
                    (None, service::Order::Write) => {
                        // Queued on the sequencer right here, in arrival
                        // order, once every earlier read has been answered.
                        let _no_reads = reads.write().await;
                        service::start(
                            &shared.engine(),
                            &shared.metrics,
                            &shared.read_pool,
                            request,
                            here,
                        )
                    }
                    (None, service::Order::Read | service::Order::ReadWrite) => {
                        // Holds later writes back until this one has read.
                        let reading = Arc::clone(&reads).read_owned().await;
                        let shared = Arc::clone(&shared);
                        Box::pin(async move {
                            if let Some(earlier) = earlier {
                                wait_done(earlier).await;
                            }
                            // A group's leader confirms it still leads,
                            // and notes the leadership its read runs in.
                            let mut leadership = None;
                            if let Some(g) = shared.group.as_ref().filter(|_| !local) {
                                if let Err(refusal) = g.read_index().await {
                                    return Response::Error(refusal);
                                }
                                if reads_replicated_state(&request) {
                                    match g.leadership() {
                                        Some(l) => leadership = Some(l),
                                        None => {
                                            return Response::Error(g.not_leader("not the leader"))
                                        }
                                    }
                                }
                            }
                            let reply = service::start(
                                &shared.engine(),
                                &shared.metrics,
                                &shared.read_pool,
                                request,
                                service::Here::Never,
                            );
                            // Most reads run when awaited: they must have
                            // read before a later write of this connection
                            // is queued. A sync has decided (or been
                            // queued) inside `start` already, and so have
                            // compaction and checkpoint requests.
                            let response = if reads_when_awaited {
                                let response = reply.await;
                                drop(reading);
                                response
                            } else {
                                drop(reading);
                                reply.await
                            };
                            // Answered only once what it read is committed.
                            if let (Some(g), Some(l)) = (&shared.group, leadership) {
                                if let Err(refusal) = g.settle_read(&l).await {
                                    return Response::Error(refusal);
                                }
                            }
                            response
                        })
                    }
                };
                let shared = Arc::clone(&shared);
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut response = reply.await;
                    // A round that lost its leadership names the leader.
                    if let (Response::Error(err), Some(g)) = (&mut response, &shared.group) {
                        if err.code == inbox_wire::ErrorCode::NotLeader && err.leader_addr.is_none()
                        {
                            *err = g.not_leader(&err.message);
                        }
                    }
                    let code = match &response {
                        Response::Error(err) => Some(err.code),
                        _ => None,
                    };
                    shared.metrics.observe_request(op, code, started.elapsed());
                    let mut frame = reply_frame(version, &response, request_id);
                    let limit = shared.limits.reply_frame_bytes_max;
                    if frame.frame_len().is_none_or(|len| len > limit) {
                        frame = error_frame(
                            request_id,
                            ErrorCode::TooLarge,
                            u64::from(limit),
                            format!(
                                "reply is over the {limit}-byte frame limit; ask for fewer items"
                            ),
                        );
                    }
                    let _ = tx.send(frame).await;
                    if let Some((permit, bytes)) = queued {
                        shared.metrics.engine_queue_bytes.dec_by(bytes);
                        drop(permit);
                    }
                    drop(permit);
                    if let Some(done) = done {
                        if let Some(earlier) = chain {
                            wait_done(earlier).await;
                        }
                        let _ = done.send(true);
                    }
                });
            }
        }
    };

    if matches!(close, Close::WithError) {
        shared.metrics.frames_rejected.inc();
    }
    // Finish what was read: wait until every running request has replied.
    let _ = in_flight.acquire_many(in_flight_max as u32).await;
    let _ = closed_tx.send(true);
    for task in [hint_task, dirty_hint_task].into_iter().flatten() {
        let _ = task.await;
    }
    drop(tx);
    let _ = writer_task.await;
}

/// Whether `request` is about this node's own store and files, which every
/// member of a group answers for itself, followers included, with no
/// read-index: `STATS` (so that members can be compared live), `MEMORY`
/// and `EXPLAIN_SEGMENT`.
fn about_this_node(request: &Request) -> bool {
    matches!(
        request,
        Request::Stats(_) | Request::Memory(_) | Request::ExplainSegment(_)
    )
}

/// Whether `request` answers from the replicated state, which a group's
/// leader applies before it commits (see [`GroupHandle::settle_read`]).
/// The operator's requests about this node's own files and figures do
/// not.
///
/// [`GroupHandle::settle_read`]: crate::cluster::GroupHandle::settle_read
fn reads_replicated_state(request: &Request) -> bool {
    matches!(
        request,
        Request::Sync(_)
            | Request::Devices(_)
            | Request::Pull(_)
            | Request::History(_)
            | Request::ConvList(_)
            | Request::Dirty(_)
            | Request::ConvMode(_)
            | Request::SnapshotInfo(_)
            | Request::SnapshotPage(_)
    )
}

/// `CLUSTER_ADD_NODE` or `CLUSTER_REMOVE_NODE`, run by the group (a
/// follower answers `NOT_LEADER`); a node without a group says so.
async fn change_membership(
    group: Option<&crate::cluster::GroupHandle>,
    request: Request,
) -> Response {
    let Some(group) = group else {
        return Response::Error(crate::cluster::not_in_a_group());
    };
    let done = match request {
        Request::ClusterAddNode(req) => group.add_node(req).await.map(Response::ClusterAddNode),
        Request::ClusterRemoveNode(req) => group
            .remove_node(req)
            .await
            .map(Response::ClusterRemoveNode),
        other => Err(ErrorReply::new(
            ErrorCode::Internal,
            0,
            format!("{} is not a membership change", other.op().name()),
        )),
    };
    done.unwrap_or_else(Response::Error)
}

/// Adds `uids` to a connection's subscriptions, all or nothing, within the
/// per-connection and the total caps; returns those it did not hold.
fn subscribe(
    shared: &Shared,
    subscribed: &Mutex<HashSet<u64>>,
    uids: &[u64],
) -> Result<Vec<u64>, ErrorReply> {
    let mut set = subscribed.lock().unwrap_or_else(|p| p.into_inner());
    let mut fresh: Vec<u64> = uids
        .iter()
        .copied()
        .filter(|uid| !set.contains(uid))
        .collect();
    fresh.sort_unstable();
    fresh.dedup();
    let per_connection = u64::from(shared.limits.subscribe_uids_max);
    let wanted = fresh.len() as u64;
    if set.len() as u64 + wanted > per_connection {
        return Err(ErrorReply::new(
            ErrorCode::TooLarge,
            per_connection,
            format!(
                "a connection may subscribe to at most {per_connection} uids ({} held, {wanted} new)",
                set.len()
            ),
        ));
    }
    let total_max = shared.limits.subscriptions_max;
    let reserved = shared.metrics.subscriptions.inner().fetch_update(
        Ordering::Relaxed,
        Ordering::Relaxed,
        |held| held.checked_add(wanted).filter(|total| *total <= total_max),
    );
    if reserved.is_err() {
        return Err(ErrorReply::new(
            ErrorCode::RateLimited,
            SUBSCRIBE_RETRY_MS,
            format!("the server holds its maximum of {total_max} subscriptions; retry later"),
        ));
    }
    set.extend(fresh.iter().copied());
    Ok(fresh)
}

/// Retry-after for a `SUBSCRIBE` refused at the server-wide cap: room comes
/// back as other connections unsubscribe or close, not on a clock.
const SUBSCRIBE_RETRY_MS: u64 = 1_000;

/// Checks the first frame: it must be a well-formed `HELLO` with a
/// supported version and the client or the admin token, and answers it;
/// on success, also says what the token allows and which protocol version
/// the connection speaks.
fn handshake(shared: &Shared, frame: &Frame) -> Result<(Role, u16, Frame), Frame> {
    let id = frame.request_id;
    if frame.opcode != inbox_wire::Op::Hello as u8 {
        return Err(error_frame(
            id,
            ErrorCode::Unauthenticated,
            0,
            "send HELLO with a token before anything else",
        ));
    }
    let hello: Hello = match Request::decode(frame.opcode, frame.body.clone()) {
        Ok(Request::Hello(hello)) => hello,
        Ok(_) | Err(_) => {
            return Err(error_frame(id, ErrorCode::BadRequest, 0, "malformed HELLO"));
        }
    };
    if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&hello.version) {
        return Err(error_frame(
            id,
            ErrorCode::Unsupported,
            u64::from(PROTOCOL_VERSION),
            format!(
                "protocol version {} is not supported; this server speaks \
                 {PROTOCOL_VERSION_MIN} to {PROTOCOL_VERSION}",
                hello.version
            ),
        ));
    }
    // Both comparisons always run, so the time taken does not say which
    // token came close.
    let client = token_matches(&shared.token, &hello.token);
    let admin = token_matches(&shared.admin_token, &hello.token);
    let role = match (admin, client) {
        (true, _) => Role::Admin,
        (false, true) => Role::Client,
        (false, false) => {
            return Err(error_frame(
                id,
                ErrorCode::Unauthenticated,
                0,
                "wrong token",
            ));
        }
    };
    tracing::debug!(client = %hello.client_name, version = hello.version, ?role, "client authenticated");
    let reply = Response::Hello(hello_ok(shared));
    Ok((role, hello.version, reply_frame(hello.version, &reply, id)))
}

/// Everything `HELLO_OK` announces: the connection's limits and the
/// engine's.
fn hello_ok(shared: &Shared) -> HelloOk {
    let inbox = shared.engine();
    let engine = inbox.config();
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    HelloOk {
        version: PROTOCOL_VERSION,
        server_name: format!("inboxd/{}", env!("CARGO_PKG_VERSION")),
        frame_bytes_max: shared.limits.frame_bytes_max,
        in_flight_max: shared.limits.in_flight_max,
        reply_frame_bytes_max: shared.limits.reply_frame_bytes_max,
        payload_bytes_max: u32::try_from(inbox.payload_limit()).unwrap_or(u32::MAX),
        summary_bytes_max: u32::try_from(inbox_engine::SUMMARY_BYTES_MAX).unwrap_or(u32::MAX),
        sync_page_default: engine.sync_page_default,
        sync_page_max: engine.sync_page_max,
        pull_per_conv_default: engine.pull_per_conv_default,
        pull_per_conv_max: engine.pull_per_conv_max,
        history_limit_max: engine.pull_per_conv_max,
        conv_list_limit_max: engine.sync_page_max,
        devices_per_user_max: engine.devices_per_user_max,
        rate_per_s: shared.limits.rate_per_s,
        rate_burst: shared.limits.rate_burst,
        idle_timeout_ms: ms(shared.limits.idle_timeout),
        batch_token_ttl_ms: ms(engine.batch_token_ttl),
        recovery_lease_ttl_ms: ms(engine.recovery_lease_ttl),
        snapshot_ttl_ms: ms(engine.snapshot_ttl),
        max_connections: shared.limits.max_connections,
        subscribe_uids_max: shared.limits.subscribe_uids_max,
        subscriptions_max: shared.limits.subscriptions_max,
        large_group_members: engine.large_group_members,
        idempotency_ttl_ms: ms(engine.idempotency_ttl),
    }
}

/// `response` as a frame in the layout of protocol `version`.
fn reply_frame(version: u16, response: &Response, request_id: u64) -> Frame {
    inbox_wire::v2::reply_frame_for(version, response, request_id)
}

/// Waits until a write (and so every write before it) has completed. A
/// dropped sender means its task ended without flipping it: nothing left
/// to wait for.
async fn wait_done(mut done: watch::Receiver<bool>) {
    let _ = done.wait_for(|done| *done).await;
}

/// Refuses a connection over the connection limit with one error frame.
pub async fn refuse<W: AsyncWrite + Unpin>(mut stream: W, reason: &str) {
    let mut out = BytesMut::new();
    let _ = FrameCodec::new(u32::MAX)
        .encode(&error_frame(0, ErrorCode::Unavailable, 0, reason), &mut out);
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&out)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limiter_allows_the_burst_then_says_when_to_retry() {
        let mut bucket = RateLimiter::new(10, 3);
        assert!(bucket.take().is_ok());
        assert!(bucket.take().is_ok());
        assert!(bucket.take().is_ok());
        let wait = bucket.take().expect_err("burst spent");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
    }

    #[test]
    fn token_comparison_needs_every_byte() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abc", b"abd"));
        assert!(!token_matches(b"abc", b"ab"));
        assert!(!token_matches(b"", b"x"));
    }
}
