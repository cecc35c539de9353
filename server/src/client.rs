//! The async Rust client: one TCP connection, pipelined.
//!
//! One writer task sends frames; one reader task matches each reply to its
//! request by request id through a map of oneshot senders, and forwards
//! `HINT` pushes to [`Client::hints`]. Any number of calls may be in flight
//! at once from any number of tasks (the server applies backpressure past
//! its `in_flight_max`).
//!
//! Errors are typed: a server error carries its [`ErrorCode`] (and the
//! code's `detail`, e.g. retry-after for `RATE_LIMITED`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use inbox_wire::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

pub use crate::tls::ClientTls;
pub use inbox_wire;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error reply.
    #[error("{code}: {message}")]
    Server {
        code: ErrorCode,
        detail: u64,
        message: String,
        /// `NOT_LEADER`: the leader's client address, when the server knows
        /// it.
        leader_addr: Option<String>,
    },
    #[error("io: {0}")]
    Io(String),
    /// The server sent something this client cannot parse.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The connection closed before the reply arrived.
    #[error("connection closed: {0}")]
    Closed(String),
}

impl ClientError {
    /// The server's error code, if this is a server error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Server { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<ErrorReply> for ClientError {
    fn from(reply: ErrorReply) -> Self {
        Self::Server {
            code: reply.code,
            detail: reply.detail,
            message: reply.message,
            leader_addr: reply.leader_addr,
        }
    }
}

type PendingMap = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<Result<Response, ClientError>>>>>>;

/// A connected, authenticated client.
pub struct Client {
    outgoing: mpsc::Sender<Frame>,
    pending: PendingMap,
    next_id: AtomicU64,
    hints: Mutex<Option<mpsc::Receiver<Hints>>>,
    dirty_hints: Mutex<Option<mpsc::Receiver<DirtyHints>>>,
    server: HelloOk,
}

/// Hint rounds buffered for [`Client::hints`]; more are dropped (hints may
/// be lost by design).
const HINT_BUFFER: usize = 1024;

impl Client {
    /// Connects over plain TCP, says HELLO with `token`, and waits for the
    /// server's answer.
    pub async fn connect(addr: SocketAddr, token: impl Into<Bytes>) -> Result<Client, ClientError> {
        Self::connect_with(addr, token, None).await
    }

    /// Connects, over TLS when `tls` is given, says HELLO with `token`, and
    /// waits for the server's answer.
    pub async fn connect_with(
        addr: SocketAddr,
        token: impl Into<Bytes>,
        tls: Option<&ClientTls>,
    ) -> Result<Client, ClientError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| ClientError::Io(format!("connect {addr}: {e}")))?;
        let _ = stream.set_nodelay(true);
        match tls {
            None => {
                let (reader, writer) = stream.into_split();
                Self::start(reader, writer, token.into()).await
            }
            Some(tls) => {
                let stream = tls
                    .connect(stream)
                    .await
                    .map_err(|e| ClientError::Io(format!("TLS handshake with {addr}: {e}")))?;
                let (reader, writer) = tokio::io::split(stream);
                Self::start(reader, writer, token.into()).await
            }
        }
    }

    async fn start<R, W>(mut reader: R, mut writer: W, token: Bytes) -> Result<Client, ClientError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (outgoing, mut outgoing_rx) = mpsc::channel::<Frame>(1024);
        let pending: PendingMap = Arc::new(Mutex::new(Some(HashMap::new())));
        let (hint_tx, hint_rx) = mpsc::channel(HINT_BUFFER);
        let (dirty_hint_tx, dirty_hint_rx) = mpsc::channel(HINT_BUFFER);

        tokio::spawn(async move {
            let codec = FrameCodec::new(u32::MAX);
            let mut out = BytesMut::with_capacity(64 << 10);
            while let Some(frame) = outgoing_rx.recv().await {
                let _ = codec.encode(&frame, &mut out);
                while out.len() < (256 << 10) {
                    let Ok(frame) = outgoing_rx.try_recv() else {
                        break;
                    };
                    let _ = codec.encode(&frame, &mut out);
                }
                if writer.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
            }
        });

        let reader_pending = Arc::clone(&pending);
        tokio::spawn(async move {
            let codec = FrameCodec::new(frame::REPLY_FRAME_BYTES_MAX_DEFAULT);
            let mut buf = BytesMut::with_capacity(64 << 10);
            let reason = loop {
                let frame = match codec.decode(&mut buf) {
                    Ok(Some(frame)) => frame,
                    Ok(None) => match reader.read_buf(&mut buf).await {
                        Ok(0) => break "server closed the connection".to_string(),
                        Ok(_) => continue,
                        Err(e) => break format!("read: {e}"),
                    },
                    Err(e) => break format!("corrupt stream from server: {e}"),
                };
                let response = Response::decode(frame.opcode, frame.body)
                    .map_err(|e| ClientError::Protocol(e.to_string()));
                match response {
                    Ok(Response::Hint(hints)) => {
                        let _ = hint_tx.try_send(hints);
                        continue;
                    }
                    Ok(Response::DirtyHint(hints)) => {
                        let _ = dirty_hint_tx.try_send(hints);
                        continue;
                    }
                    _ => {}
                }
                if frame.request_id == 0 {
                    // A connection-level error: the server closes next.
                    if let Ok(Response::Error(err)) = response {
                        break format!("{}: {}", err.code, err.message);
                    }
                    continue;
                }
                let waiter = reader_pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_mut()
                    .and_then(|map| map.remove(&frame.request_id));
                if let Some(waiter) = waiter {
                    let _ = waiter.send(response);
                }
            };
            let waiters = reader_pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            for (_, waiter) in waiters.into_iter().flatten() {
                let _ = waiter.send(Err(ClientError::Closed(reason.clone())));
            }
        });

        let mut client = Client {
            outgoing,
            pending,
            next_id: AtomicU64::new(1),
            hints: Mutex::new(Some(hint_rx)),
            dirty_hints: Mutex::new(Some(dirty_hint_rx)),
            server: HelloOk::default(),
        };
        let hello = Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            client_name: format!("inbox-client/{}", env!("CARGO_PKG_VERSION")),
            token,
        });
        match client.call(hello).await? {
            Response::Hello(ok) => client.server = ok,
            other => return Err(unexpected(&other)),
        }
        Ok(client)
    }

    /// What the server said in its HELLO reply.
    pub fn server(&self) -> &HelloOk {
        &self.server
    }

    /// The stream of hint pushes for subscribed uids. Can be taken once.
    pub fn hints(&self) -> Option<mpsc::Receiver<Hints>> {
        self.hints.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The stream of `DIRTY_HINT` pushes (large groups), after
    /// [`Client::subscribe_dirty`]. Can be taken once.
    pub fn dirty_hints(&self) -> Option<mpsc::Receiver<DirtyHints>> {
        self.dirty_hints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Sends any request and waits for its reply. A server error reply is
    /// returned as [`ClientError::Server`].
    pub async fn call(&self, request: Request) -> Result<Response, ClientError> {
        self.queue(request).await?.await
    }

    /// Writes `request` now and returns what waits for its reply: requests
    /// queued one after another (each `queue` awaited before the next) go
    /// out, and take effect, in that order, while their replies are still
    /// outstanding. The way to pipeline requests whose order matters.
    pub async fn queue(
        &self,
        request: Request,
    ) -> Result<impl std::future::Future<Output = Result<Response, ClientError>>, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let Some(map) = pending.as_mut() else {
                return Err(ClientError::Closed("connection is closed".into()));
            };
            map.insert(id, tx);
        }
        if self.outgoing.send(request.to_frame(id)).await.is_err() {
            return Err(ClientError::Closed("writer stopped".into()));
        }
        Ok(async move {
            match rx.await {
                Ok(Ok(Response::Error(err))) => Err(err.into()),
                Ok(result) => result,
                Err(_) => Err(ClientError::Closed("connection is closed".into())),
            }
        })
    }
}

fn unexpected(response: &Response) -> ClientError {
    ClientError::Protocol(format!(
        "unexpected reply opcode 0x{:02x}",
        response.opcode()
    ))
}

macro_rules! typed_calls {
    ($( $(#[$meta:meta])* $method:ident($req:ty) -> $variant:ident($rep:ty); )*) => {
        impl Client {
            $(
                $(#[$meta])*
                pub async fn $method(&self, request: $req) -> Result<$rep, ClientError> {
                    match self.call(Request::$variant(request)).await? {
                        Response::$variant(reply) => Ok(reply),
                        other => Err(unexpected(&other)),
                    }
                }
            )*
        }
    };
}

typed_calls! {
    ping(Empty) -> Ping(Empty);
    join(ConvMember) -> Join(MembershipReply);
    leave(ConvMember) -> Leave(MembershipReply);
    /// Returns once the message and its fan-out are durable.
    send(SendReq) -> Send(SendReply);
    recall(RecallReq) -> Recall(SendReply);
    edit(EditReq) -> Edit(SendReply);
    register_device(UserDevice) -> RegisterDevice(RegisterReply);
    revoke_device(UserDevice) -> RevokeDevice(DeviceInfo);
    devices(UserReq) -> Devices(DeviceList);
    sync(SyncReq) -> Sync(SyncPage);
    ack(AckReq) -> Ack(AckReply);
    finish_lease(FinishLeaseReq) -> FinishLease(DeviceInfo);
    pull(PullReq) -> Pull(PullReply);
    history(HistoryReq) -> History(HistoryPage);
    mark_read(MarkReadReq) -> MarkRead(ReadReply);
    set_conv_flags(ConvFlagsReq) -> SetConvFlags(Empty);
    conv_list(ConvListReq) -> ConvList(ConvListPage);
    /// The user's dirty large groups (R7).
    dirty(UserReq) -> Dirty(DirtyList);
    /// Clears a large group's marker at the observed version; after a
    /// newer entry the server answers `MARKER_MOVED` (detail: the version).
    clear_dirty(ClearDirtyReq) -> ClearDirty(ClearDirtyReply);
    conv_mode(ConvModeReq) -> ConvMode(ConvMode);
    begin_snapshot(UserDevice) -> BeginSnapshot(SnapshotInfo);
    snapshot_info(SnapshotRef) -> SnapshotInfo(SnapshotInfo);
    snapshot_page(SnapshotPageReq) -> SnapshotPage(SnapshotPage);
    ack_snapshot(AckSnapshotReq) -> AckSnapshot(DeviceInfo);
    /// Hints for these uids then arrive on [`Client::hints`].
    subscribe(UidList) -> Subscribe(Empty);
    /// As `subscribe`, and large groups' marker moves for the connection's
    /// subscribed uids then arrive on [`Client::dirty_hints`].
    subscribe_dirty(UidList) -> SubscribeDirty(Empty);
    unsubscribe(UidList) -> Unsubscribe(Empty);
    stats(Empty) -> Stats(Stats);
    explain(UserReq) -> Explain(UserExplain);
    explain_segment(SegmentReq) -> ExplainSegment(SegmentExplain);
    memory(Empty) -> Memory(MemoryReport);
    cluster_status(Empty) -> ClusterStatus(ClusterStatus);
    cluster_add_node(AddNodeReq) -> ClusterAddNode(ClusterStatus);
    cluster_remove_node(RemoveNodeReq) -> ClusterRemoveNode(ClusterStatus);
    compact(Empty) -> Compact(CompactionReport);
    checkpoint(Empty) -> Checkpoint(Empty);
}

/// The result of [`Client::sync_to_end`].
#[derive(Clone, Debug, Default)]
pub struct SyncRun {
    pub events: Vec<Event>,
    pub pages: u32,
    pub generation: u64,
    /// The device's ACK after the run (unchanged when `ack` was false).
    pub acked_sync_seq: u64,
    pub batch_hwm: u64,
    pub lease: Option<LeaseInfo>,
    /// `ACK`s written ([`Client::catch_up`]; [`Client::sync_to_end`]
    /// writes one at the end and leaves this at 0).
    pub acks: u32,
}

impl Client {
    /// Syncs every page of one batch and, if `ack`, ACKs its end (and
    /// finishes a recovery lease if the batch was one). This is the loop
    /// every device runs; the rules it follows are the server's.
    pub async fn sync_to_end(
        &self,
        uid: u64,
        device: u64,
        generation: Option<u64>,
        local_applied_seq: u64,
        ack: bool,
    ) -> Result<SyncRun, ClientError> {
        let mut run = SyncRun::default();
        let mut request = SyncReq {
            uid,
            device,
            generation,
            local_applied_seq,
            limit: 0,
            batch_token: None,
            ..SyncReq::default()
        };
        loop {
            let page = self.sync(request.clone()).await?;
            run.pages += 1;
            run.generation = page.generation;
            run.acked_sync_seq = page.acked_sync_seq;
            run.batch_hwm = page.batch_hwm;
            run.lease = page.lease.clone();
            run.events.extend(page.events);
            if !page.has_more {
                if ack && page.next_cursor > page.acked_sync_seq {
                    let acked = self
                        .ack(AckReq {
                            uid,
                            device,
                            generation: page.generation,
                            seq: page.next_cursor,
                            batch_token: page.batch_token.clone(),
                        })
                        .await?;
                    run.acked_sync_seq = acked.acked_sync_seq;
                }
                if ack {
                    if let Some(lease) = page.lease {
                        self.finish_lease(FinishLeaseReq {
                            uid,
                            device,
                            lease_id: lease.lease_id,
                            generation: page.generation,
                        })
                        .await?;
                    }
                }
                return Ok(run);
            }
            request.generation = Some(page.generation);
            request.local_applied_seq = page.next_cursor;
            request.batch_token = Some(page.batch_token);
        }
    }
}

/// Pages [`Client::catch_up`] applies between two `ACK`s unless told
/// otherwise ([`CatchUpOptions::ack_every`]). A `SYNC` waits for the
/// connection's earlier writes, so every `ACK` puts one durable write
/// between two pages; one every eight pages lets the reads run at their
/// own pace, and a reconnect replays at most eight pages (800 events at
/// the default page size), which the device skips by `sync_seq`.
pub const CATCH_UP_ACK_EVERY: u32 = 8;

/// How [`Client::catch_up`] asks for its pages.
#[derive(Clone, Copy, Debug, Default)]
pub struct CatchUpOptions {
    /// Page size; 0 asks for the server's default.
    pub limit: u32,
    /// With `ack`, `ACK` after every this many pages and after the last;
    /// 0 means [`CATCH_UP_ACK_EVERY`] (every page with `ack_in_sync`), 1
    /// every page. The `ACK` is cumulative: it names the last
    /// `next_cursor` applied.
    pub ack_every: u32,
    /// `SYNC`'s `max_replay`: a longer backlog answers `RESET_REQUIRED`.
    pub max_replay: Option<u64>,
    /// `SYNC`'s `without_summaries`.
    pub without_summaries: bool,
    /// `SYNC`'s `ids_only`: events without a summary field.
    pub ids_only: bool,
    /// With `ack`, a due `ACK` of a page with more to come rides on the
    /// next page's `SYNC` (`ack_through`) instead of going on its own:
    /// one request per page, and the next page does not wait for the
    /// `ACK` to be durable, so every page can be acknowledged. The last
    /// page's `ACK` still goes on its own and is awaited. Needs a daemon
    /// that takes `SYNC`'s optional field 4 (an older one refuses the
    /// field).
    pub ack_in_sync: bool,
}

impl Client {
    /// A device's whole catch-up on one batch, pipelined (PROTOCOL.md,
    /// "Pipelined catch-up"): once a page with more to come is applied,
    /// the next page's `SYNC` and this page's `ACK` are written back to
    /// back, and the `ACK` reply is awaited only after the next page has
    /// been asked for, so a page costs one round trip, not two. At most
    /// one `ACK` is in flight. After the last page: its `ACK`, then
    /// `FINISH_LEASE` if the batch was a lease. Without `ack` nothing is
    /// acknowledged (pages are then fetched one after another).
    ///
    /// An `ACK` goes with every [`CatchUpOptions::ack_every`]-th page
    /// and with the last: a `SYNC` written after an `ACK` is served only
    /// once that `ACK` is durable, so acknowledging every page would pace
    /// the reads by the disk's flushes.
    ///
    /// Every event of the batch is returned exactly once, in order; the
    /// first error stops the run (a failed `ACK` included).
    pub async fn catch_up(
        &self,
        uid: u64,
        device: u64,
        generation: Option<u64>,
        local_applied_seq: u64,
        ack: bool,
        options: CatchUpOptions,
    ) -> Result<SyncRun, ClientError> {
        let mut run = SyncRun::default();
        let request = |generation, local_applied_seq, batch_token, ack_through| SyncReq {
            uid,
            device,
            generation,
            local_applied_seq,
            limit: options.limit,
            batch_token,
            max_replay: options.max_replay,
            without_summaries: options.without_summaries,
            ids_only: options.ids_only,
            ack_through,
        };
        // The first page decides the batch: nothing is written after it
        // until it has come.
        let mut page = self
            .sync(request(generation, local_applied_seq, None, None))
            .await?;
        let ack_every = match options.ack_every {
            // An ACK in the next SYNC costs no flush in between.
            0 if options.ack_in_sync => 1,
            0 => CATCH_UP_ACK_EVERY,
            n => n,
        };
        let mut ack_in_flight = None;
        loop {
            run.pages += 1;
            run.generation = page.generation;
            run.acked_sync_seq = run.acked_sync_seq.max(page.acked_sync_seq);
            run.batch_hwm = page.batch_hwm;
            run.lease = page.lease.clone().or(run.lease);
            run.events.extend(std::mem::take(&mut page.events));
            let ack_due = ack
                && (!page.has_more || run.pages % ack_every == 0)
                && page.next_cursor > run.acked_sync_seq;
            let in_sync = ack_due && options.ack_in_sync && page.has_more;
            let next = if page.has_more {
                let next = request(
                    Some(page.generation),
                    page.next_cursor,
                    Some(page.batch_token.clone()),
                    in_sync.then_some(page.next_cursor),
                );
                Some(self.queue(Request::Sync(next)).await?)
            } else {
                None
            };
            if ack_due {
                run.acks += 1;
            }
            if ack_due && !in_sync {
                let acked = self
                    .queue(Request::Ack(AckReq {
                        uid,
                        device,
                        generation: page.generation,
                        seq: page.next_cursor,
                        batch_token: page.batch_token.clone(),
                    }))
                    .await?;
                if let Some(earlier) = ack_in_flight.replace(acked) {
                    run.acked_sync_seq = acked_seq(earlier.await?)?.max(run.acked_sync_seq);
                }
            }
            let Some(next) = next else {
                break;
            };
            page = match next.await? {
                Response::Sync(page) => page,
                other => return Err(unexpected(&other)),
            };
        }
        if let Some(last) = ack_in_flight {
            run.acked_sync_seq = acked_seq(last.await?)?.max(run.acked_sync_seq);
        }
        if ack {
            if let Some(lease) = &run.lease {
                self.finish_lease(FinishLeaseReq {
                    uid,
                    device,
                    lease_id: lease.lease_id,
                    generation: run.generation,
                })
                .await?;
            }
        }
        Ok(run)
    }
}

fn acked_seq(response: Response) -> Result<u64, ClientError> {
    match response {
        Response::Ack(a) => Ok(a.acked_sync_seq),
        other => Err(unexpected(&other)),
    }
}

/// How many `NOT_LEADER` redirects one request of a [`GroupClient`]
/// follows before its error is returned.
pub const LEADER_HOPS_MAX: usize = 3;

/// The leader's client address a `NOT_LEADER` error names in its
/// `leader_addr` field, if it names one.
pub fn leader_addr(err: &ClientError) -> Option<SocketAddr> {
    match err {
        ClientError::Server {
            code: ErrorCode::NotLeader,
            leader_addr: Some(addr),
            ..
        } => addr.parse().ok(),
        _ => None,
    }
}

/// How long a [`GroupClient`] keeps trying other members, by default,
/// while none serves (a leader died and the group is electing another).
/// A fail-over takes a few election timeouts (see `docs/CLUSTER.md`).
pub const GROUP_PATIENCE: Duration = Duration::from_secs(15);

/// How long one connection attempt to a member may take.
const MEMBER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A client of a replicated group.
///
/// - A request answered `NOT_LEADER` that names the leader is sent again
///   over a new connection to that leader, which then serves the later
///   requests: at most [`LEADER_HOPS_MAX`] redirects per request.
/// - When the connection breaks (its member died), or the leader named
///   cannot be reached or no leader is known (an election is running), or
///   a member is `UNAVAILABLE`, the request is sent again to the next
///   member that accepts a connection, with a backoff of 50 ms doubling to
///   500 ms, for up to its patience ([`GROUP_PATIENCE`] unless
///   [`GroupClient::with_patience`]).
///
/// Sending again is safe for what the protocol makes idempotent: a write
/// refused by a follower changed nothing; a send whose reply was lost (its
/// round may or may not have been kept) is answered as a duplicate with the
/// original ids, by its idempotency key (`client_msg_id`); joins, ACKs and
/// read marks are idempotent by value; reads are always safe. A recall or
/// edit whose first attempt was kept is refused with `CONFLICT` on the
/// retry: the caller reads that as done.
pub struct GroupClient {
    token: Bytes,
    tls: Option<ClientTls>,
    /// Every member known: those given at connect, and leaders learned
    /// from `NOT_LEADER`.
    members: tokio::sync::Mutex<Vec<SocketAddr>>,
    current: tokio::sync::Mutex<(SocketAddr, Arc<Client>)>,
    patience: Duration,
}

/// Errors after which another member may serve the same request.
fn another_member_may_serve(err: &ClientError) -> bool {
    match err {
        ClientError::Io(_) | ClientError::Closed(_) => true,
        // A `NOT_LEADER` may name a leader that just died: the members
        // learn of a new one only when their election timeout passes.
        ClientError::Server { code, .. } => {
            *code == ErrorCode::Unavailable || *code == ErrorCode::NotLeader
        }
        ClientError::Protocol(_) => false,
    }
}

impl GroupClient {
    /// Connects to one member; the others are learned from redirects.
    pub async fn connect(
        addr: SocketAddr,
        token: impl Into<Bytes>,
        tls: Option<ClientTls>,
    ) -> Result<GroupClient, ClientError> {
        Self::connect_members(&[addr], token, tls).await
    }

    /// Connects to the first of `members` that accepts a connection, and
    /// keeps all of them to fall back on.
    pub async fn connect_members(
        members: &[SocketAddr],
        token: impl Into<Bytes>,
        tls: Option<ClientTls>,
    ) -> Result<GroupClient, ClientError> {
        let token = token.into();
        let mut last = ClientError::Io("no member given".into());
        for &addr in members {
            match connect_member(addr, &token, tls.as_ref()).await {
                Ok(client) => {
                    return Ok(GroupClient {
                        token,
                        tls,
                        members: tokio::sync::Mutex::new(members.to_vec()),
                        current: tokio::sync::Mutex::new((addr, Arc::new(client))),
                        patience: GROUP_PATIENCE,
                    })
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// How long a request keeps trying other members while none serves.
    pub fn with_patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// The connection requests go to now.
    pub async fn client(&self) -> Arc<Client> {
        Arc::clone(&self.current.lock().await.1)
    }

    /// Sends `request`, following `NOT_LEADER` redirects and moving to
    /// another member when this one cannot serve (see [`GroupClient`]).
    pub async fn call(&self, request: Request) -> Result<Response, ClientError> {
        let deadline = tokio::time::Instant::now() + self.patience;
        let mut hops = 0;
        let mut backoff = Duration::from_millis(50);
        loop {
            let (at, client) = {
                let current = self.current.lock().await;
                (current.0, Arc::clone(&current.1))
            };
            let err = match client.call(request.clone()).await {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            if let Some(leader) = leader_addr(&err).filter(|_| hops < LEADER_HOPS_MAX) {
                hops += 1;
                self.learn(leader).await;
                if let Ok(next) = connect_member(leader, &self.token, self.tls.as_ref()).await {
                    *self.current.lock().await = (leader, Arc::new(next));
                    continue;
                }
            } else if !another_member_may_serve(&err) {
                return Err(err);
            }
            if tokio::time::Instant::now() + backoff > deadline {
                return Err(err);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
            self.move_on(at).await;
        }
    }

    async fn learn(&self, addr: SocketAddr) {
        let mut members = self.members.lock().await;
        if !members.contains(&addr) {
            members.push(addr);
        }
    }

    /// Connects to the first member after `from` (in the known order,
    /// wrapping around, `from` itself last) that accepts; keeps the current
    /// connection if none does.
    async fn move_on(&self, from: SocketAddr) {
        let members = self.members.lock().await.clone();
        let start = members.iter().position(|m| *m == from).map_or(0, |i| i + 1);
        for i in 0..members.len() {
            let addr = members[(start + i) % members.len()];
            if let Ok(next) = connect_member(addr, &self.token, self.tls.as_ref()).await {
                *self.current.lock().await = (addr, Arc::new(next));
                return;
            }
        }
    }
}

async fn connect_member(
    addr: SocketAddr,
    token: &Bytes,
    tls: Option<&ClientTls>,
) -> Result<Client, ClientError> {
    match tokio::time::timeout(
        MEMBER_CONNECT_TIMEOUT,
        Client::connect_with(addr, token.clone(), tls),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(ClientError::Io(format!(
            "connect {addr}: no answer within {MEMBER_CONNECT_TIMEOUT:?}"
        ))),
    }
}

#[cfg(test)]
mod group_tests {
    use super::*;

    #[test]
    fn a_not_leader_error_names_the_leaders_address() {
        let err = |code, addr: Option<&str>| ClientError::Server {
            code,
            detail: 0,
            message: "not the leader; leader node 2; leader_addr=127.0.0.1:9".into(),
            leader_addr: addr.map(str::to_owned),
        };
        assert_eq!(
            leader_addr(&err(ErrorCode::NotLeader, Some("127.0.0.1:7072"))),
            Some("127.0.0.1:7072".parse().unwrap())
        );
        // The message is for humans: only the field counts.
        assert_eq!(leader_addr(&err(ErrorCode::NotLeader, None)), None);
        assert_eq!(
            leader_addr(&err(ErrorCode::Unavailable, Some("127.0.0.1:7072"))),
            None
        );
    }
}
