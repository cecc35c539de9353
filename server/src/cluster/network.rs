//! raft's RPCs between the nodes of a group, on their own port: plain TCP
//! (no TLS yet; run the raft port on a private network), one request at a
//! time per connection, each message one frame:
//! ```text
//! len u32 (little-endian, at most MAX_FRAME), CBOR body [len]
//! ```
//! A connection opens with a [`Hello`] carrying the group's shared token,
//! compared in constant time; a wrong token gets an error frame and the
//! connection is closed. Then each request is a [`Request`] and each
//! answer the matching `Result` of the receiving raft (a snapshot chunk's
//! answer is a [`ChunkAnswer`]).
//!
//! Replication to a follower is pipelined: the leader opens a connection
//! of its own for it ([`Request::AppendStream`]) and from then on writes
//! each append as raft hands it over, up to [`APPENDS_IN_FLIGHT`] ahead of
//! the answers, which come back in order (raft's `stream_append` on both
//! sides). The follower takes the next append while the previous ones are
//! still being made durable, so one append's fdatasync overlaps the next
//! one's transfer, and a round no longer waits for the append before it
//! to be answered. Votes, heartbeats and snapshots keep the connection of
//! one request at a time.
//!
//! The messages are openraft 0.10's, which serialize differently from
//! 0.9's (its errors, and the `PreVote` request it added): a member on
//! 0.9 and one on 0.10 do not understand each other, so a group is
//! upgraded whole. Snapshots travel in chunks of [`SNAPSHOT_CHUNK`] bytes,
//! sent by this module from raft's snapshot file (openraft 0.10 hands the
//! network a whole snapshot and leaves the transport to it).
//!
//! Bytes travel as CBOR byte strings: a round's payload ([`super::Round`])
//! and a snapshot chunk's data ([`SnapshotChunk`]). serde's derive writes
//! a `Vec<u8>` as a sequence of integers, one CBOR item per byte: a 5 KB
//! round took about 9.5 KB on the wire and a 3 MiB snapshot chunk about
//! 6 MB, and encoding and decoding them cost CPU by the byte. A byte
//! string decodes from the old sequence form too, so a member reads what
//! an older one sends; an older member cannot read what a newer one
//! sends, so a group is upgraded whole.
//!
//! A node's connections to the other members leave from the IP of its own
//! raft address when that is a specific address ([`source_ip`]), not from
//! whichever one the kernel's routing picks: a member's raft traffic then
//! comes from the address the others know it by, which a firewall between
//! the members can allow (and a test can tell the members apart by, on
//! one host).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use openraft::RaftNetworkFactory;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use super::snapshot::ChunkAnswer;
use super::{InboxRaft, Peer, Snapshot, SnapshotMeta, TypeConfig, Vote};

/// The largest frame either side accepts (a batch of entries).
pub const MAX_FRAME: u32 = 64 << 20;

/// The bytes of a snapshot sent in one chunk.
pub const SNAPSHOT_CHUNK: usize = 3 << 20;

/// The appends a replication stream has on the way to a follower at
/// most, not yet answered: the leader sends the next one without waiting
/// for the answers to the previous ones, so a follower's fdatasync
/// overlaps the transfer of the next entries.
pub const APPENDS_IN_FLIGHT: usize = 16;

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The first frame of a connection.
#[derive(Serialize, Deserialize)]
struct Hello {
    token: Vec<u8>,
}

/// One raft call.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    Snapshot(SnapshotChunk),
    PreVote(VoteRequest<TypeConfig>),
    /// Turns the connection into one replication stream: from then on
    /// the sender writes only [`AppendEntriesRequest`]s, without waiting,
    /// and the receiver answers each, in order, with an [`AppendAnswer`].
    AppendStream,
}

/// The answer to one append of a replication stream: the receiving raft's
/// (the last log id it holds durably, or why it refused), or why it could
/// not answer (it stopped).
type AppendAnswer = Result<StreamAppendResult<TypeConfig>, String>;

/// One chunk of a snapshot: the leader's vote and the snapshot's metadata
/// (in every chunk), the chunk's place in the image, and its bytes as one
/// byte string.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct SnapshotChunk {
    pub vote: Vote,
    pub meta: SnapshotMeta,
    /// Names the snapshot being sent, so that chunks of two sends are
    /// never mixed: the leader's vote and the snapshot's last log id.
    pub id: String,
    pub offset: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    pub done: bool,
}

type Answer<T> = Result<T, RaftError<TypeConfig>>;

async fn write_frame<T: Serialize>(s: &mut TcpStream, v: &T) -> std::io::Result<()> {
    write_frame_to(s, v).await
}

async fn write_frame_to<T: Serialize>(
    s: &mut (impl tokio::io::AsyncWrite + Unpin),
    v: &T,
) -> std::io::Result<()> {
    let mut buf = vec![0; 4];
    ciborium::into_writer(v, &mut buf).map_err(std::io::Error::other)?;
    let len = u32::try_from(buf.len() - 4)
        .ok()
        .filter(|l| *l <= MAX_FRAME)
        .ok_or_else(|| std::io::Error::other("raft frame too large"))?;
    buf[..4].copy_from_slice(&len.to_le_bytes());
    s.write_all(&buf).await
}

async fn read_frame<T: DeserializeOwned>(s: &mut TcpStream) -> std::io::Result<T> {
    read_frame_from(s).await
}

async fn read_frame_from<T: DeserializeOwned>(
    s: &mut (impl tokio::io::AsyncRead + Unpin),
) -> std::io::Result<T> {
    let len = s.read_u32_le().await?;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("raft frame of {len} bytes is over the limit of {MAX_FRAME}"),
        ));
    }
    let mut buf = vec![0; len as usize];
    s.read_exact(&mut buf).await?;
    ciborium::from_reader(&buf[..])
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

/// Serves raft's port until the listener fails.
pub async fn serve(
    listener: TcpListener,
    raft: InboxRaft,
    snapshots: super::SnapshotReceiver,
    token: Arc<[u8]>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "raft port: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (raft, snapshots, token) = (raft.clone(), snapshots.clone(), Arc::clone(&token));
        tokio::spawn(async move {
            if let Err(e) = serve_conn(stream, raft, snapshots, &token).await {
                if e.kind() != std::io::ErrorKind::UnexpectedEof {
                    tracing::debug!(%peer, error = %e, "raft connection closed");
                }
            }
        });
    }
}

async fn serve_conn(
    mut s: TcpStream,
    raft: InboxRaft,
    snapshots: super::SnapshotReceiver,
    token: &[u8],
) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let hello: Hello = read_frame(&mut s).await?;
    let ok: bool = hello.token.ct_eq(token).into();
    let reply: Result<(), String> = if ok {
        Ok(())
    } else {
        Err("raft port: wrong token".into())
    };
    write_frame(&mut s, &reply).await?;
    if !ok {
        return Ok(());
    }
    loop {
        match read_frame::<Request>(&mut s).await? {
            Request::Append(rpc) => {
                let a: Answer<_> = raft.append_entries(rpc).await;
                write_frame(&mut s, &a).await?;
            }
            Request::Vote(rpc) => {
                let a: Answer<_> = raft.vote(rpc).await;
                write_frame(&mut s, &a).await?;
            }
            Request::PreVote(rpc) => {
                let a: Answer<_> = raft.pre_vote(rpc).await;
                write_frame(&mut s, &a).await?;
            }
            Request::Snapshot(chunk) => {
                let a: ChunkAnswer = snapshots.receive(chunk).await;
                write_frame(&mut s, &a).await?;
            }
            Request::AppendStream => return serve_append_stream(s, raft).await,
        }
    }
}

/// Serves a replication stream (see [`Request::AppendStream`]): the
/// appends are read as they come and handed to raft's `stream_append`,
/// which takes the next one while the previous ones are still being made
/// durable, and the answers are written back in order. Ends when either
/// side closes, or at raft's first refusal (the leader opens a new
/// stream).
async fn serve_append_stream(s: TcpStream, raft: InboxRaft) -> std::io::Result<()> {
    use futures_util::StreamExt as _;
    let (mut rd, mut wr) = s.into_split();
    let (tx, rx) =
        tokio::sync::mpsc::channel::<AppendEntriesRequest<TypeConfig>>(APPENDS_IN_FLIGHT);
    let reader = tokio::spawn(async move {
        loop {
            let req = read_frame_from(&mut rd).await?;
            if tx.send(req).await.is_err() {
                return Ok::<(), std::io::Error>(());
            }
        }
    });
    let answers = raft.stream_append(tokio_stream_of(rx));
    futures_util::pin_mut!(answers);
    let mut result = Ok(());
    while let Some(a) = answers.next().await {
        let a: AppendAnswer = a.map_err(|fatal| fatal.to_string());
        if let Err(e) = write_frame_to(&mut wr, &a).await {
            result = Err(e);
            break;
        }
    }
    reader.abort();
    result
}

/// An mpsc receiver as a stream.
fn tokio_stream_of<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

/// Makes connections to the other members, by their raft address.
pub struct TcpNetwork {
    token: Arc<[u8]>,
    /// The IP outgoing connections are bound to; `None` lets the kernel
    /// choose.
    source: Option<IpAddr>,
}

impl TcpNetwork {
    /// Connections from whichever address the kernel chooses.
    pub fn new(token: Arc<[u8]>) -> TcpNetwork {
        TcpNetwork {
            token,
            source: None,
        }
    }

    /// Connections leave from `ip`: each socket is bound to it (any port)
    /// before it connects. A member whose address is of the other family
    /// (IPv4 or IPv6) is connected to unbound.
    pub fn with_source(mut self, ip: IpAddr) -> TcpNetwork {
        self.source = Some(ip);
        self
    }
}

/// The IP a node listening for raft on `listen` connects from: the listen
/// IP, unless it is unspecified (`0.0.0.0`, `::`), which names no one
/// address.
pub fn source_ip(listen: SocketAddr) -> Option<IpAddr> {
    Some(listen.ip()).filter(|ip| !ip.is_unspecified())
}

/// Connects to `addr` (`HOST:PORT`), from `source` if given, trying each
/// address it resolves to in turn as `TcpStream::connect` does.
async fn open(addr: &str, source: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(addr).await;
    };
    let mut last = None;
    for target in tokio::net::lookup_host(addr).await? {
        let attempt = if target.is_ipv4() == source.is_ipv4() {
            connect_from(source, target).await
        } else {
            TcpStream::connect(target).await
        };
        match attempt {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{addr} resolves to no address"),
        )
    }))
}

/// A connection to `target` from `source` (any free port of it).
///
/// The port is chosen at `connect`, as for an unbound socket, not at
/// `bind` (`IP_BIND_ADDRESS_NO_PORT`): a port taken at `bind` is held
/// exclusively for the connection's life, and could be the raft or client
/// port of a member that is down and about to restart on it (its restart
/// then failed with "address already in use"). `SO_REUSEADDR` as well, so
/// a listener may still bind a port this connection uses.
async fn connect_from(source: IpAddr, target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = match source {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    bind_address_no_port(&socket)?;
    socket.bind(SocketAddr::new(source, 0)).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("binding {source} to connect to {target}: {e}"),
        )
    })?;
    socket.connect(target).await
}

/// Linux's `IP_BIND_ADDRESS_NO_PORT` on `socket` (it applies to IPv6
/// sockets too).
fn bind_address_no_port(socket: &TcpSocket) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: a plain setsockopt on a socket this function borrows, with
    // a pointer to a c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            std::ptr::addr_of!(on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl RaftNetworkFactory<TypeConfig> for TcpNetwork {
    type Network = TcpConn;

    async fn new_client(&mut self, target: u64, node: &Peer) -> TcpConn {
        TcpConn {
            target,
            addr: node.raft_addr.clone(),
            token: Arc::clone(&self.token),
            source: self.source,
            stream: None,
        }
    }
}

/// One member's connection, opened on first use and again after a
/// failure.
pub struct TcpConn {
    target: u64,
    addr: String,
    token: Arc<[u8]>,
    source: Option<IpAddr>,
    stream: Option<TcpStream>,
}

/// A call that did not get an answer.
fn unreachable(e: std::io::Error) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(&e))
}

impl TcpConn {
    async fn connect(&mut self) -> std::io::Result<&mut TcpStream> {
        if self.stream.is_none() {
            self.stream = Some(self.dial().await?);
        }
        Ok(self.stream.as_mut().expect("just connected"))
    }

    /// Sends one request and reads its answer `A` within `ttl`; any
    /// failure drops the connection.
    async fn exchange<A: DeserializeOwned>(
        &mut self,
        req: &Request,
        ttl: Duration,
    ) -> Result<A, RPCError<TypeConfig>> {
        let target = self.target;
        let answer = tokio::time::timeout(ttl, async {
            let s = self.connect().await?;
            write_frame(s, req).await?;
            read_frame::<A>(s).await
        })
        .await;
        match answer {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(e)) => {
                self.stream = None;
                Err(unreachable(e))
            }
            Err(_) => {
                self.stream = None;
                Err(RPCError::Network(NetworkError::new(
                    &std::io::Error::other(format!("no answer from node {target} within {ttl:?}")),
                )))
            }
        }
    }

    /// One raft call: a remote raft that stopped counts as unreachable.
    async fn call<T: DeserializeOwned>(
        &mut self,
        req: Request,
        option: &RPCOption,
    ) -> Result<T, RPCError<TypeConfig>> {
        match self.exchange::<Answer<T>>(&req, option.hard_ttl()).await? {
            Ok(v) => Ok(v),
            Err(e) => Err(unreachable(std::io::Error::other(format!(
                "node {}: {e}",
                self.target
            )))),
        }
    }

    /// Sends `snapshot`'s file in chunks of [`SNAPSHOT_CHUNK`] bytes,
    /// each within the call's deadline (the last one includes the
    /// follower's install).
    async fn send_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        option: &RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        use tokio::io::AsyncReadExt as _;
        let Snapshot { meta, snapshot } = snapshot;
        let mut file = snapshot;
        let len = file
            .metadata()
            .await
            .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?
            .len();
        let id = format!(
            "{}-{}-{}",
            vote.leader_id,
            meta.last_log_id.map_or(0, |l| l.index),
            len
        );
        let mut offset = 0u64;
        loop {
            let want =
                usize::try_from(len - offset).map_or(SNAPSHOT_CHUNK, |r| r.min(SNAPSHOT_CHUNK));
            let mut data = vec![0; want];
            file.read_exact(&mut data)
                .await
                .map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
            let done = offset + want as u64 == len;
            let chunk = SnapshotChunk {
                vote,
                meta: meta.clone(),
                id: id.clone(),
                offset,
                data,
                done,
            };
            let answer: ChunkAnswer = self
                .exchange(&Request::Snapshot(chunk), option.hard_ttl())
                .await
                .map_err(StreamingError::from)?;
            match answer {
                Ok(Some(reply)) if done => return Ok(reply),
                Ok(None) if !done => offset += want as u64,
                Ok(_) => {
                    return Err(StreamingError::Network(NetworkError::from_string(format!(
                        "node {}: an answer out of step with the snapshot's chunks",
                        self.target
                    ))))
                }
                Err(why) => {
                    return Err(StreamingError::Network(NetworkError::from_string(format!(
                        "node {} refused the snapshot: {why}",
                        self.target
                    ))))
                }
            }
        }
    }
}

/// A replication stream's answers, as raft reads them.
type AppendAnswers<'s> =
    BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>;

impl TcpConn {
    /// Opens a connection of its own for a replication stream (see
    /// [`Request::AppendStream`]); the connection of the other calls is
    /// left as it is.
    async fn open_append_stream(&self) -> std::io::Result<TcpStream> {
        let mut s = self.dial().await?;
        write_frame(&mut s, &Request::AppendStream).await?;
        Ok(s)
    }

    /// A new connection to the peer, past the token handshake.
    async fn dial(&self) -> std::io::Result<TcpStream> {
        let mut s = tokio::time::timeout(CONNECT_TIMEOUT, open(&self.addr, self.source))
            .await
            .map_err(|_| {
                std::io::Error::other(format!("connecting to {}: timed out", self.addr))
            })??;
        s.set_nodelay(true)?;
        write_frame(
            &mut s,
            &Hello {
                token: self.token.to_vec(),
            },
        )
        .await?;
        read_frame::<Result<(), String>>(&mut s)
            .await?
            .map_err(std::io::Error::other)?;
        Ok(s)
    }

    /// The pipelined replication stream: a task writes each append as raft
    /// hands it over, without waiting for answers, at most
    /// [`APPENDS_IN_FLIGHT`] ahead of them; the answers are read in order.
    /// An answer owed for longer than the call's soft deadline fails the
    /// stream (a follower that stopped answering), and so does any error
    /// of the connection; raft then opens a new one.
    async fn append_stream<S>(
        &mut self,
        mut input: S,
        option: RPCOption,
    ) -> Result<AppendAnswers<'static>, RPCError<TypeConfig>>
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        use futures_util::StreamExt as _;
        let target = self.target;
        let ttl = option.soft_ttl();
        // The whole opening within the deadline: a member that is down
        // may still have its port bound and never answer the hello.
        let s = tokio::time::timeout(ttl, self.open_append_stream())
            .await
            .map_err(|_| {
                unreachable(std::io::Error::other(format!(
                    "opening a replication stream to node {target}: no answer within {ttl:?}"
                )))
            })?
            .map_err(unreachable)?;
        let (mut rd, mut wr) = s.into_split();
        // A permit per append on the way, returned with its answer.
        let window = Arc::new(tokio::sync::Semaphore::new(APPENDS_IN_FLIGHT));
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
        let sending = Arc::clone(&window);
        // Set once raft's input ended: the answers end with the last one
        // owed.
        let input_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = Arc::clone(&input_done);
        // The writer ends when the answers are dropped (raft let go of
        // the stream), whatever it waits for then.
        tokio::spawn(async move {
            let send = async move {
                while let Some(req) = input.next().await {
                    let Ok(permit) = sending.acquire().await else {
                        return;
                    };
                    permit.forget();
                    if write_frame_to(&mut wr, &req).await.is_err() {
                        return;
                    }
                }
                done.store(true, std::sync::atomic::Ordering::Release);
            };
            tokio::select! {
                _ = closed_rx => {}
                () = send => {}
            }
        });
        let (tx, rx) =
            tokio::sync::mpsc::channel::<std::io::Result<AppendAnswer>>(APPENDS_IN_FLIGHT);
        let reader = tokio::spawn(async move {
            loop {
                let a = read_frame_from::<AppendAnswer>(&mut rd).await;
                let failed = a.is_err();
                if tx.send(a).await.is_err() || failed {
                    return;
                }
            }
        });
        let state = (rx, window, Some(closed_tx), reader, input_done);
        let answers = futures_util::stream::unfold(Some(state), move |state| async move {
            let (mut rx, window, closed, reader, input_done) = state?;
            let owed = || window.available_permits() < APPENDS_IN_FLIGHT;
            if input_done.load(std::sync::atomic::Ordering::Acquire) && !owed() {
                reader.abort();
                return None;
            }
            let got = loop {
                match tokio::time::timeout(ttl, rx.recv()).await {
                    Ok(got) => break got,
                    // Nothing owed: an idle stream.
                    Err(_) if !owed() => {
                        if input_done.load(std::sync::atomic::Ordering::Acquire) {
                            break None;
                        }
                        continue;
                    }
                    Err(_) => {
                        break Some(Err(std::io::Error::other(format!(
                            "no answer from node {target} within {ttl:?}"
                        ))))
                    }
                }
            };
            let item = match got {
                Some(Ok(Ok(r))) => Ok(r),
                Some(Ok(Err(why))) => Err(unreachable(std::io::Error::other(format!(
                    "node {target}: {why}"
                )))),
                Some(Err(e)) => Err(unreachable(e)),
                None => return None,
            };
            window.add_permits(1);
            let go_on = matches!(item, Ok(Ok(_)));
            if !go_on {
                reader.abort();
                drop(closed);
                return Some((item, None));
            }
            Some((item, Some((rx, window, closed, reader, input_done))))
        });
        Ok(Box::pin(answers))
    }
}

impl RaftNetworkV2<TypeConfig> for TcpConn {
    type SnapshotData = tokio::fs::File;

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<AppendAnswers<'s>, RPCError<TypeConfig>>>
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        Box::pin(async move { self.append_stream(input, option).await })
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(Request::Append(rpc), &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(Request::Vote(rpc), &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(Request::PreVote(rpc), &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let sent = tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            sent = self.send_snapshot(vote, snapshot, &option) => sent,
        };
        if sent.is_err() {
            // A send cut off mid-frame leaves the connection out of step.
            self.stream = None;
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use openraft::vote::RaftLeaderId as _;
    use openraft::Entry;

    use super::super::{EntryPayload, LeaderId, LogId, Round};
    use super::*;

    fn cbor<T: Serialize>(v: &T) -> Vec<u8> {
        let mut buf = Vec::new();
        ciborium::into_writer(v, &mut buf).unwrap();
        buf
    }

    /// A round as the derive wrote it before: a sequence of integers.
    #[derive(Serialize)]
    struct OldRound(Vec<u8>);

    fn payload() -> Vec<u8> {
        (0..5_000u32).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn a_round_travels_as_one_byte_string_and_its_old_integer_form_still_decodes() {
        let round = Round(payload());
        let append = Request::Append(AppendEntriesRequest {
            vote: Vote::new_committed(3, 1),
            prev_log_id: None,
            entries: vec![Entry {
                log_id: LogId::new(LeaderId::new(3, 1), 7),
                payload: EntryPayload::Normal(round.clone()),
            }],
            leader_commit: None,
        });
        let wire = cbor(&append).len();
        assert!(
            wire < payload().len() + 256,
            "an append of a {}-byte round took {wire} bytes",
            payload().len()
        );
        let old = cbor(&OldRound(payload()));
        assert!(
            old.len() > payload().len() * 3 / 2,
            "the old form is the long one"
        );
        let back: Round = ciborium::from_reader(&old[..]).unwrap();
        assert_eq!(back, round);
    }

    /// An append of `index` alone, by the leader of term 3.
    fn append_of(index: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(3, 1),
            prev_log_id: index
                .checked_sub(1)
                .map(|p| LogId::new(LeaderId::new(3, 1), p)),
            entries: vec![Entry {
                log_id: LogId::new(LeaderId::new(3, 1), index),
                payload: EntryPayload::Normal(Round(vec![index as u8; 64])),
            }],
            leader_commit: None,
        }
    }

    #[tokio::test]
    async fn a_replication_stream_sends_the_next_appends_before_the_first_is_answered() {
        use futures_util::StreamExt as _;
        const SENT: u64 = 5;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // A follower that reads every append before it answers any: a
        // sender that waited for each answer would never get past the
        // first.
        let follower = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let _: Hello = read_frame(&mut s).await.unwrap();
            write_frame(&mut s, &Ok::<(), String>(())).await.unwrap();
            assert!(matches!(
                read_frame::<Request>(&mut s).await.unwrap(),
                Request::AppendStream
            ));
            let mut read = Vec::new();
            for _ in 0..SENT {
                let req = tokio::time::timeout(
                    Duration::from_secs(5),
                    read_frame::<AppendEntriesRequest<TypeConfig>>(&mut s),
                )
                .await
                .unwrap_or_else(|_| {
                    panic!("{} appends arrived before the first answer", read.len())
                })
                .unwrap();
                read.push(req.entries[0].log_id.index);
            }
            for &index in &read {
                let answer: AppendAnswer = Ok(Ok(Some(LogId::new(LeaderId::new(3, 1), index))));
                write_frame(&mut s, &answer).await.unwrap();
            }
            read
        });
        let token: Arc<[u8]> = Arc::from(&b"secret"[..]);
        let peer = Peer {
            raft_addr: addr.to_string(),
            client_addr: String::new(),
        };
        let mut conn = TcpNetwork::new(token).new_client(2, &peer).await;
        let input = futures_util::stream::iter((1..=SENT).map(append_of));
        let option = RPCOption::new(Duration::from_secs(5));
        let answers: Vec<_> = conn
            .stream_append(input, option)
            .await
            .unwrap()
            .collect()
            .await;
        let acked: Vec<u64> = answers
            .into_iter()
            .map(|a| a.unwrap().unwrap().unwrap().index)
            .collect();
        assert_eq!(acked, (1..=SENT).collect::<Vec<_>>());
        assert_eq!(follower.await.unwrap(), (1..=SENT).collect::<Vec<_>>());
    }

    #[test]
    fn a_snapshot_chunk_travels_as_one_byte_string() {
        let chunk = SnapshotChunk {
            vote: Vote::new_committed(3, 1),
            meta: SnapshotMeta::default(),
            id: "T3-N1-40-5000".into(),
            offset: 4_096,
            data: payload(),
            done: true,
        };
        let wire = cbor(&Request::Snapshot(chunk));
        assert!(
            wire.len() < payload().len() + 256,
            "a chunk of {} bytes took {} bytes",
            payload().len(),
            wire.len()
        );
        match ciborium::from_reader::<Request, _>(&wire[..]).unwrap() {
            Request::Snapshot(back) => {
                assert_eq!((back.offset, back.done), (4_096, true));
                assert_eq!(back.data, payload());
            }
            _ => panic!("decoded as another request"),
        }
    }
}
