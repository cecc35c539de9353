//! One client connection: framing, the handshake, limits, pipelining and
//! hint pushes. Requests themselves go to [`crate::service`].
//!
//! A connection is a `Connection` that takes each frame through named
//! steps: `read_frame`, then `handshake` for the first frame, else `admit`
//! (body, rate limit, admin token) and `dispatch` (to the connection
//! itself, the cluster, or the engine in the connection's order), and
//! the reply (`reply_when_done`, on a task of the request's own). What
//! each opcode needs is read from one table, [`crate::ops::describe`];
//! where a request may be served is decided by the node's
//! [`crate::route::Route`].
//!
//! Invariants:
//! - nothing reaches the engine before a successful `HELLO` (a version
//!   this build serves, right token);
//! - a request with id 0 (reserved for the server's own frames) is refused
//!   and the connection closes;
//! - a version 1 connection gets version 1 layouts ([`inbox_wire::v1`]); anything else first is answered
//!   `UNAUTHENTICATED` and the connection closes;
//! - admin requests (those [`crate::ops::describe`] marks `admin`:
//!   `STATS`, `MEMORY`, `EXPLAIN*`, `COMPACT`, `CHECKPOINT`, `CLUSTER_*`)
//!   run only on a connection that said `HELLO` with the admin token; with
//!   the client token they are answered `FORBIDDEN`. The admin token may
//!   make every other request too;
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

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use inbox_engine::Inbox;
use inbox_wire::{
    Empty, ErrorCode, ErrorReply, Frame, FrameCodec, Request, Response, WireError, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, RwLock, Semaphore};

use crate::config::Limits;
use crate::metrics::Metrics;
use crate::ops::{describe, Handler, Key, OpInfo, Order};
use crate::read_pool::ReadPool;
use crate::route::Route;
use crate::{hints, service};

mod handshake;
mod rate;
mod subscriptions;

use handshake::Role;
use rate::RateLimiter;
use subscriptions::Subscriptions;

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
    /// Where requests may be served: a single node serves them all, a
    /// member of a replicated group only while it leads.
    pub route: Route,
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
        self.route.engine(&self.inbox)
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

/// An `ERROR` frame in the newest layout: for refusals made before a
/// connection's version is settled (the handshake, accept).
fn error_frame(request_id: u64, code: ErrorCode, detail: u64, message: impl Into<String>) -> Frame {
    error_frame_in(PROTOCOL_VERSION, request_id, code, detail, message)
}

/// An `ERROR` frame in the layout of protocol `version`.
fn error_frame_in(
    version: u16,
    request_id: u64,
    code: ErrorCode,
    detail: u64,
    message: impl Into<String>,
) -> Frame {
    let error = Response::Error(ErrorReply::new(code, detail, message));
    reply_frame(version, &error, request_id)
}

/// `response` as a frame in the layout of protocol `version`.
fn reply_frame(version: u16, response: &Response, request_id: u64) -> Frame {
    inbox_wire::v2::reply_frame_for(version, response, request_id)
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

/// Why a connection stops reading.
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
    reader: R,
    writer: W,
    peer: Option<SocketAddr>,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut input = Input::new(reader, &shared.limits);
    let mut conn = Connection::open(writer, peer, shared);
    let close = conn.run(&mut input, &mut shutdown).await;
    conn.close(close).await;
}

/// The read half: bytes buffered, and when the peer must have completed
/// its next frame.
struct Input<R> {
    reader: R,
    buf: BytesMut,
    codec: FrameCodec,
    /// The idle clock runs from the last complete frame, not the last
    /// byte: a peer trickling a byte at a time (slowloris) still has to
    /// finish a frame within the timeout, and the handshake within a
    /// shorter one.
    deadline: tokio::time::Instant,
    idle_timeout: Duration,
}

impl<R: AsyncRead + Unpin> Input<R> {
    fn new(reader: R, limits: &Limits) -> Self {
        let idle_timeout = limits.idle_timeout;
        Input {
            reader,
            buf: BytesMut::with_capacity(8 << 10),
            codec: FrameCodec::new(limits.frame_bytes_max),
            deadline: tokio::time::Instant::now() + idle_timeout.min(HANDSHAKE_TIMEOUT),
            idle_timeout,
        }
    }

    fn restart_clock(&mut self) {
        self.deadline = tokio::time::Instant::now() + self.idle_timeout;
    }
}

/// A request that passed admission, with what the connection needs of its
/// frame.
struct Admitted {
    request: Request,
    info: OpInfo,
    id: u64,
    body_bytes: usize,
}

/// One connection's state between frames.
struct Connection {
    shared: Arc<Shared>,
    peer: Option<SocketAddr>,
    /// This connection's number, for [`crate::alone::Alone`].
    id: u64,
    /// Frames to the writer task.
    tx: mpsc::Sender<Frame>,
    writer_task: tokio::task::JoinHandle<()>,
    /// Requests running; a permit is taken per request.
    in_flight: Arc<Semaphore>,
    in_flight_max: usize,
    rate: RateLimiter,
    /// Set by a successful handshake.
    role: Option<Role>,
    /// The protocol version the handshake settled on.
    version: u16,
    pipeline: Pipeline,
    subscriptions: Subscriptions,
}

impl Connection {
    fn open<W>(writer: W, peer: Option<SocketAddr>, shared: Arc<Shared>) -> Connection
    where
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let in_flight_max = shared.limits.in_flight_max as usize;
        let (tx, rx) = mpsc::channel::<Frame>(in_flight_max + 64);
        Connection {
            peer,
            id: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
            tx,
            writer_task: tokio::spawn(write_loop(writer, rx)),
            in_flight: Arc::new(Semaphore::new(in_flight_max)),
            in_flight_max,
            rate: RateLimiter::new(shared.limits.rate_per_s, shared.limits.rate_burst),
            role: None,
            version: PROTOCOL_VERSION,
            pipeline: Pipeline::default(),
            subscriptions: Subscriptions::new(Arc::clone(&shared)),
            shared,
        }
    }

    /// Serves frames until the connection must close: each is read, then
    /// either settles the handshake or is admitted and dispatched.
    async fn run<R: AsyncRead + Unpin>(
        &mut self,
        input: &mut Input<R>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Close {
        loop {
            let frame = match self.read_frame(input, shutdown).await {
                Ok(frame) => frame,
                Err(close) => return close,
            };
            let step = if self.role.is_none() {
                self.handshake(&frame).await
            } else {
                match self.admit(frame).await {
                    Some(admitted) => self.dispatch(admitted, !input.buf.is_empty()).await,
                    None => Ok(()),
                }
            };
            if let Err(close) = step {
                return close;
            }
        }
    }

    /// Step 1: the next complete frame, reading more bytes as needed.
    /// A frame that breaks the framing, or comes with request id 0, is
    /// answered and ends the connection.
    async fn read_frame<R: AsyncRead + Unpin>(
        &mut self,
        input: &mut Input<R>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Frame, Close> {
        loop {
            if *shutdown.borrow() {
                return Err(Close::Quietly);
            }
            match input.codec.decode(&mut input.buf) {
                Ok(Some(frame)) => {
                    input.restart_clock();
                    return self.check_request_id(frame).await;
                }
                Ok(None) => self.fill(input, shutdown).await?,
                Err(err) => {
                    tracing::info!(peer = ?self.peer, error = %err, "closing connection: corrupt stream");
                    let detail = match err {
                        WireError::FrameTooLarge { max, .. } => u64::from(max),
                        _ => 0,
                    };
                    self.send(self.error_frame(0, err.code(), detail, err.to_string()))
                        .await;
                    return Err(Close::WithError);
                }
            }
        }
    }

    /// Reads more bytes into `input`, within its deadline. A connection
    /// past the deadline with nothing running is closed.
    async fn fill<R: AsyncRead + Unpin>(
        &mut self,
        input: &mut Input<R>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), Close> {
        let read = tokio::select! {
            read = tokio::time::timeout_at(input.deadline, input.reader.read_buf(&mut input.buf)) => read,
            _ = shutdown.changed() => return Err(Close::Quietly),
        };
        let buffered = input.buf.len();
        match read {
            Ok(Ok(0)) if buffered > 0 => {
                // The peer half-closed inside a frame; it may still be
                // reading, so say what happened.
                let message = format!("stream ended inside a frame ({buffered} bytes buffered)");
                self.send(self.error_frame(0, ErrorCode::BadRequest, 0, message))
                    .await;
                Err(Close::WithError)
            }
            Ok(Ok(0)) | Ok(Err(_)) => Err(Close::Quietly),
            Ok(Ok(_)) => Ok(()),
            Err(_idle) if self.in_flight.available_permits() != self.in_flight_max => {
                // Requests still running: not idle, wait again.
                input.restart_clock();
                Ok(())
            }
            Err(_idle) if buffered > 0 => {
                tracing::info!(peer = ?self.peer, buffered, "closing connection: frame not completed in time");
                let message = format!("frame not completed in time ({buffered} bytes buffered)");
                self.send(self.error_frame(0, ErrorCode::BadRequest, 0, message))
                    .await;
                Err(Close::WithError)
            }
            Err(_idle) => {
                tracing::debug!(peer = ?self.peer, role = ?self.role, "closing idle connection");
                Err(Close::Quietly)
            }
        }
    }

    /// Request id 0 belongs to the server's own frames (hints and
    /// connection errors): a reply to it could not be told apart.
    async fn check_request_id(&mut self, frame: Frame) -> Result<Frame, Close> {
        if frame.request_id != 0 {
            return Ok(frame);
        }
        tracing::info!(peer = ?self.peer, "closing connection: request id 0");
        let message = "request id 0 is reserved for the server's own frames";
        self.send(self.error_frame(0, ErrorCode::BadRequest, 0, message))
            .await;
        Err(Close::WithError)
    }

    /// Step 2: the first frame must be a `HELLO` that settles the role and
    /// the version; anything else is answered and ends the connection.
    async fn handshake(&mut self, frame: &Frame) -> Result<(), Close> {
        match handshake::handshake(&self.shared, frame) {
            Ok(settled) => {
                self.role = Some(settled.role);
                self.version = settled.version;
                self.send(settled.reply).await;
                Ok(())
            }
            Err(reply) => {
                tracing::info!(peer = ?self.peer, "closing connection: handshake refused");
                self.send(reply).await;
                Err(Close::WithError)
            }
        }
    }

    /// Step 3: decodes the body, takes a token of the rate limit and checks
    /// the admin token. A refused request is answered here and never
    /// reaches the engine; the connection goes on.
    async fn admit(&mut self, frame: Frame) -> Option<Admitted> {
        let id = frame.request_id;
        let body_bytes = frame.body.len();
        let request = match Request::decode(frame.opcode, frame.body) {
            Ok(request) => request,
            Err(err) => {
                let name = inbox_wire::Op::from_u8(frame.opcode).map_or("UNKNOWN", |op| op.name());
                self.refuse(id, name, ErrorReply::new(err.code(), 0, err.to_string()))
                    .await;
                return None;
            }
        };
        let op = request.op();
        if let Err(wait) = self.rate.take() {
            // Rounded up: a client that waits exactly this long finds a token.
            let wait_ms = u64::try_from(wait.as_micros().div_ceil(1000))
                .unwrap_or(u64::MAX)
                .max(1);
            let message = format!(
                "over {} requests/s on this connection",
                self.shared.limits.rate_per_s
            );
            let refusal = ErrorReply::new(ErrorCode::RateLimited, wait_ms, message);
            self.refuse(id, op.name(), refusal).await;
            return None;
        }
        let info = describe(op);
        if info.admin && self.role != Some(Role::Admin) {
            let message = format!("{} needs the admin token", op.name());
            let refusal = ErrorReply::new(ErrorCode::Forbidden, 0, message);
            self.refuse(id, op.name(), refusal).await;
            return None;
        }
        Some(Admitted {
            request,
            info,
            id,
            body_bytes,
        })
    }

    /// Step 4: hands an admitted request to whoever answers it (see
    /// [`Handler`]). `more_buffered`: the client has more bytes on the way.
    async fn dispatch(&mut self, admitted: Admitted, more_buffered: bool) -> Result<(), Close> {
        match admitted.info.handler {
            Handler::Connection => {
                self.answer_here(admitted).await;
                Ok(())
            }
            Handler::Cluster => self.cluster(admitted).await,
            Handler::Engine => self.engine(admitted, more_buffered).await,
        }
    }

    /// The requests the connection answers itself, at once.
    async fn answer_here(&mut self, admitted: Admitted) {
        let id = admitted.id;
        let reply = match admitted.request {
            Request::Hello(_) => {
                let refusal = ErrorReply::new(ErrorCode::BadRequest, 0, "already authenticated");
                Response::Error(refusal)
            }
            Request::Ping(_) => Response::Ping(Empty {}),
            Request::Subscribe(ref list) | Request::SubscribeDirty(ref list) => {
                let dirty = matches!(admitted.request, Request::SubscribeDirty(_));
                if let Err(refusal) = self.subscriptions.subscribe(&list.uids, dirty, &self.tx) {
                    let name = admitted.request.op().name();
                    self.refuse(id, name, refusal).await;
                    return;
                }
                if dirty {
                    Response::SubscribeDirty(Empty {})
                } else {
                    Response::Subscribe(Empty {})
                }
            }
            Request::Unsubscribe(list) => {
                self.subscriptions.unsubscribe(&list.uids);
                Response::Unsubscribe(Empty {})
            }
            other => Response::Error(ErrorReply::new(
                ErrorCode::Internal,
                0,
                format!("{} is not answered by the connection", other.op().name()),
            )),
        };
        self.send(reply.to_frame(id)).await;
    }

    /// The cluster's requests. A membership change runs on the leader for
    /// up to a minute: it is answered from a task of its own, like any
    /// request that takes time.
    async fn cluster(&mut self, admitted: Admitted) -> Result<(), Close> {
        let id = admitted.id;
        if let Request::ClusterStatus(_) = admitted.request {
            // Every member answers for itself: no leader needed.
            let status = self.shared.route.status();
            self.send(Response::ClusterStatus(status).to_frame(id))
                .await;
            return Ok(());
        }
        let Ok(permit) = Arc::clone(&self.in_flight).acquire_owned().await else {
            return Err(Close::Quietly);
        };
        let (shared, tx, version) = (Arc::clone(&self.shared), self.tx.clone(), self.version);
        tokio::spawn(async move {
            let op = admitted.request.op();
            let started = Instant::now();
            let response = shared.route.change_membership(admitted.request).await;
            let code = match &response {
                Response::Error(err) => Some(err.code),
                _ => None,
            };
            shared.metrics.observe_request(op, code, started.elapsed());
            let _ = tx.send(reply_frame(version, &response, id)).await;
            drop(permit);
        });
        Ok(())
    }

    /// An engine request: takes its place in the connection's order and
    /// in the engine queue's budget, starts it, and answers it from a task
    /// of its own.
    async fn engine(&mut self, admitted: Admitted, more_buffered: bool) -> Result<(), Close> {
        // Waiting for a permit here is the backpressure: while the
        // connection has `in_flight_max` requests running, nothing more is
        // read from the socket.
        let Ok(permit) = Arc::clone(&self.in_flight).acquire_owned().await else {
            return Err(Close::Quietly);
        };
        let Admitted {
            request,
            info,
            id,
            body_bytes,
        } = admitted;
        let op = request.op();
        let here = self.here(more_buffered);
        let turn = self.pipeline.take_turn(info.order);
        let started = Instant::now();
        let queued = self.queue(info.order, body_bytes).await?;
        let reply = self.start(request, &info, here, turn.earlier.clone()).await;
        let pending = Pending {
            op,
            id,
            version: self.version,
            started,
            permit,
            queued,
            turn,
        };
        tokio::spawn(reply_when_done(
            Arc::clone(&self.shared),
            self.tx.clone(),
            reply,
            pending,
        ));
        Ok(())
    }

    /// Where a send is committed: on this worker only for a connection
    /// alone with nothing else on the way (a client with more requests
    /// buffered or in flight has them decided in one round).
    fn here(&self, more_buffered: bool) -> service::Here {
        if self.shared.alone.note(self.id)
            && !more_buffered
            && self.in_flight.available_permits() + 1 == self.in_flight_max
        {
            service::Here::IfIdle
        } else {
            service::Here::Never
        }
    }

    /// A write's share of the engine queue, waited for before it is
    /// queued: while the queue is full the reader stops with it.
    async fn queue(&self, order: Order, body_bytes: usize) -> Result<Option<Queued>, Close> {
        if order == Order::Read {
            return Ok(None);
        }
        let cost = queue_cost(body_bytes);
        let Ok(permit) = Arc::clone(&self.shared.engine_queue)
            .acquire_many_owned(cost)
            .await
        else {
            return Err(Close::Quietly);
        };
        let bytes = u64::from(cost) * ENGINE_QUEUE_UNIT;
        self.shared.metrics.engine_queue_bytes.inc_by(bytes);
        Ok(Some(Queued { permit, bytes }))
    }

    /// Routes the request and makes its engine call: a write is queued on
    /// the sequencer right here, in arrival order, once every earlier read
    /// has read; a read is returned to run after `earlier` (the last
    /// earlier write) has completed.
    async fn start(
        &self,
        request: Request,
        info: &OpInfo,
        here: service::Here,
        earlier: Option<watch::Receiver<bool>>,
    ) -> service::Started {
        let key = Key::of(&request);
        if let Err(refusal) = self.shared.route.admit(info, key) {
            return Box::pin(std::future::ready(Response::Error(refusal)));
        }
        let shared = &self.shared;
        match info.order {
            Order::Write => {
                let _no_reads = self.pipeline.reads.write().await;
                service::start(
                    &shared.engine(),
                    &shared.metrics,
                    &shared.read_pool,
                    request,
                    here,
                )
            }
            Order::Read | Order::ReadWrite => {
                // Holds later writes back until this one has read.
                let reading = Arc::clone(&self.pipeline.reads).read_owned().await;
                Box::pin(read(
                    Arc::clone(shared),
                    request,
                    *info,
                    key,
                    earlier,
                    reading,
                ))
            }
        }
    }

    /// An `ERROR` frame in the layout of the connection's version (the
    /// newest until the handshake settles one).
    fn error_frame(
        &self,
        request_id: u64,
        code: ErrorCode,
        detail: u64,
        message: impl Into<String>,
    ) -> Frame {
        error_frame_in(self.version, request_id, code, detail, message)
    }

    /// Queues `frame` for the writer (a closed writer drops it: the
    /// connection is ending anyway).
    async fn send(&self, frame: Frame) {
        let _ = self.tx.send(frame).await;
    }

    /// Answers a request refused before it ran, and counts it.
    async fn refuse(&self, id: u64, name: &'static str, refusal: ErrorReply) {
        self.shared.metrics.observe_refused(name, refusal.code);
        self.send(self.error_frame(id, refusal.code, refusal.detail, refusal.message))
            .await;
    }

    /// Finishes what was read: waits until every running request has
    /// replied and the hint pushers have stopped, then closes the writer.
    async fn close(self, close: Close) {
        if matches!(close, Close::WithError) {
            self.shared.metrics.frames_rejected.inc();
        }
        let Connection {
            tx,
            writer_task,
            in_flight,
            in_flight_max,
            mut subscriptions,
            ..
        } = self;
        let _ = in_flight.acquire_many(in_flight_max as u32).await;
        subscriptions.stop_pushing().await;
        drop(tx);
        let _ = writer_task.await;
        drop(subscriptions);
    }
}

/// A read: runs once `earlier` (the last earlier write of the connection)
/// has completed, within the route's read path, and holds `reading` (which
/// keeps later writes from being queued) until it has read.
async fn read(
    shared: Arc<Shared>,
    request: Request,
    info: OpInfo,
    key: Key,
    earlier: Option<watch::Receiver<bool>>,
    reading: tokio::sync::OwnedRwLockReadGuard<()>,
) -> Response {
    if let Some(earlier) = earlier {
        wait_done(earlier).await;
    }
    // A group's leader confirms it still leads, and notes the leadership
    // its read runs in.
    let ticket = match shared.route.before_read(&info, key).await {
        Ok(ticket) => ticket,
        Err(refusal) => return Response::Error(refusal),
    };
    let reply = service::start(
        &shared.engine(),
        &shared.metrics,
        &shared.read_pool,
        request,
        service::Here::Never,
    );
    // Most reads run when awaited: they must have read before a later
    // write of this connection is queued. A sync has decided (or been
    // queued) inside `start` already, and so have compaction and
    // checkpoint requests.
    let response = if info.reads_when_awaited {
        let response = reply.await;
        drop(reading);
        response
    } else {
        drop(reading);
        reply.await
    };
    // Answered only once what it read is committed.
    if let Err(refusal) = shared.route.after_read(ticket).await {
        return Response::Error(refusal);
    }
    response
}

/// A write's share of the engine queue, held until it is answered.
struct Queued {
    permit: OwnedSemaphorePermit,
    bytes: u64,
}

/// Ordering (see the module header): the last write's completion, and a
/// lock that reads hold until they have read and writes take to queue.
#[derive(Default)]
struct Pipeline {
    writes_done: Option<watch::Receiver<bool>>,
    reads: Arc<RwLock<()>>,
}

/// A request's place in its connection's order.
struct Turn {
    /// The last earlier write's completion.
    earlier: Option<watch::Receiver<bool>>,
    /// A write's own completion, flipped once answered and once every
    /// earlier write's has flipped: waiting for the last one waits for
    /// them all.
    done: Option<watch::Sender<bool>>,
}

impl Pipeline {
    fn take_turn(&mut self, order: Order) -> Turn {
        let earlier = self.writes_done.clone();
        let done = match order {
            Order::Read => None,
            Order::Write | Order::ReadWrite => {
                let (done_tx, done_rx) = watch::channel(false);
                self.writes_done = Some(done_rx);
                Some(done_tx)
            }
        };
        Turn { earlier, done }
    }
}

/// What the reply step needs of a started request.
struct Pending {
    op: inbox_wire::Op,
    id: u64,
    version: u16,
    started: Instant,
    permit: OwnedSemaphorePermit,
    queued: Option<Queued>,
    turn: Turn,
}

/// Step 5: waits for `reply`, names the leader in a `NOT_LEADER`, counts
/// it, and queues its frame (within `reply_frame_bytes_max`); then gives
/// back the request's budgets and marks a write done.
async fn reply_when_done(
    shared: Arc<Shared>,
    tx: mpsc::Sender<Frame>,
    reply: service::Started,
    pending: Pending,
) {
    let mut response = reply.await;
    // A round that lost its leadership names the leader.
    shared.route.name_leader(&mut response);
    let code = match &response {
        Response::Error(err) => Some(err.code),
        _ => None,
    };
    shared
        .metrics
        .observe_request(pending.op, code, pending.started.elapsed());
    let _ = tx
        .send(sized_reply(&shared, pending.version, &response, pending.id))
        .await;
    if let Some(queued) = pending.queued {
        shared.metrics.engine_queue_bytes.dec_by(queued.bytes);
        drop(queued.permit);
    }
    drop(pending.permit);
    if let Some(done) = pending.turn.done {
        if let Some(earlier) = pending.turn.earlier {
            wait_done(earlier).await;
        }
        let _ = done.send(true);
    }
}

/// `response`'s frame, or `TOO_LARGE` if it is over the reply frame limit.
fn sized_reply(shared: &Shared, version: u16, response: &Response, id: u64) -> Frame {
    let frame = reply_frame(version, response, id);
    let limit = shared.limits.reply_frame_bytes_max;
    if frame.frame_len().is_some_and(|len| len <= limit) {
        return frame;
    }
    error_frame_in(
        version,
        id,
        ErrorCode::TooLarge,
        u64::from(limit),
        format!("reply is over the {limit}-byte frame limit; ask for fewer items"),
    )
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
