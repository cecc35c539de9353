//! raft's RPCs between the nodes of a group, on their own port: plain TCP
//! (no TLS yet; run the raft port on a private network), one request at a
//! time per connection, each message one frame:
//! ```text
//! len u32 (little-endian, at most MAX_FRAME), CBOR body [len]
//! ```
//! A connection opens with a [`Hello`] carrying the group's shared token,
//! compared in constant time; a wrong token gets an error frame and the
//! connection is closed. Then each request is a [`Request`] and each
//! answer the matching `Result` of the receiving raft.
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

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RaftNetwork, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use super::{InboxRaft, Peer, TypeConfig};

/// The largest frame either side accepts (a batch of entries).
pub const MAX_FRAME: u32 = 64 << 20;

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
    Vote(VoteRequest<u64>),
    Snapshot(SnapshotChunk),
}

/// openraft's `InstallSnapshotRequest`, field for field, with its data as
/// one byte string: what the raft port sends of a snapshot chunk.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct SnapshotChunk {
    vote: openraft::Vote<u64>,
    meta: openraft::SnapshotMeta<u64, Peer>,
    offset: u64,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
    done: bool,
}

impl From<InstallSnapshotRequest<TypeConfig>> for SnapshotChunk {
    fn from(r: InstallSnapshotRequest<TypeConfig>) -> Self {
        let InstallSnapshotRequest {
            vote,
            meta,
            offset,
            data,
            done,
        } = r;
        SnapshotChunk {
            vote,
            meta,
            offset,
            data,
            done,
        }
    }
}

impl From<SnapshotChunk> for InstallSnapshotRequest<TypeConfig> {
    fn from(c: SnapshotChunk) -> Self {
        let SnapshotChunk {
            vote,
            meta,
            offset,
            data,
            done,
        } = c;
        InstallSnapshotRequest {
            vote,
            meta,
            offset,
            data,
            done,
        }
    }
}

type Answer<T, E = openraft::error::Infallible> = Result<T, RaftError<u64, E>>;

async fn write_frame<T: Serialize>(s: &mut TcpStream, v: &T) -> std::io::Result<()> {
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
            Request::Snapshot(chunk) => {
                let a: Answer<_, InstallSnapshotError> =
                    snapshots.install_snapshot(chunk.into()).await;
                write_frame(&mut s, &a).await?;
            }
        }
    }
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
fn unreachable<E: std::error::Error>(e: std::io::Error) -> RPCError<u64, Peer, E> {
    RPCError::Unreachable(Unreachable::new(&e))
}

impl TcpConn {
    async fn connect(&mut self) -> std::io::Result<&mut TcpStream> {
        if self.stream.is_none() {
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
            self.stream = Some(s);
        }
        Ok(self.stream.as_mut().expect("just connected"))
    }

    /// Sends one request and reads its answer within the call's deadline;
    /// any failure drops the connection.
    async fn call<T, E>(
        &mut self,
        req: Request,
        option: &RPCOption,
    ) -> Result<T, RPCError<u64, Peer, RaftError<u64, E>>>
    where
        T: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let target = self.target;
        let ttl = option.hard_ttl();
        let answer = tokio::time::timeout(ttl, async {
            let s = self.connect().await?;
            write_frame(s, &req).await?;
            read_frame::<Result<T, RaftError<u64, E>>>(s).await
        })
        .await;
        match answer {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(e))) => Err(RPCError::RemoteError(RemoteError::new(target, e))),
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
}

impl RaftNetwork<TypeConfig> for TcpConn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, Peer, RaftError<u64>>> {
        self.call(Request::Append(rpc), &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, Peer, RaftError<u64, InstallSnapshotError>>,
    > {
        self.call(Request::Snapshot(rpc.into()), &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, Peer, RaftError<u64>>> {
        self.call(Request::Vote(rpc), &option).await
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, SnapshotMeta, Vote};

    use super::super::Round;
    use super::*;

    fn cbor<T: Serialize>(v: &T) -> Vec<u8> {
        let mut buf = Vec::new();
        ciborium::into_writer(v, &mut buf).unwrap();
        buf
    }

    /// The requests as the derive wrote them before: every `Vec<u8>` a
    /// sequence of integers.
    #[derive(Serialize)]
    struct OldRound(Vec<u8>);
    #[derive(Serialize)]
    #[serde(bound = "")]
    enum OldRequest {
        Snapshot(InstallSnapshotRequest<TypeConfig>),
    }

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
                log_id: LogId::new(CommittedLeaderId::new(3, 1), 7),
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

    #[test]
    fn a_snapshot_chunk_travels_as_one_byte_string_and_its_old_integer_form_still_decodes() {
        let req = InstallSnapshotRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            meta: SnapshotMeta::default(),
            offset: 4_096,
            data: payload(),
            done: true,
        };
        let wire = cbor(&Request::Snapshot(req.clone().into())).len();
        assert!(
            wire < payload().len() + 256,
            "a chunk of {} bytes took {wire} bytes",
            payload().len()
        );
        let old = cbor(&OldRequest::Snapshot(req.clone()));
        match ciborium::from_reader::<Request, _>(&old[..]).unwrap() {
            Request::Snapshot(chunk) => {
                assert_eq!(InstallSnapshotRequest::<TypeConfig>::from(chunk), req)
            }
            _ => panic!("decoded as another request"),
        }
    }
}
