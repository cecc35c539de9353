//! Helpers for end-to-end tests against the real inboxd binary.
//!
//! [`Daemon::start`] runs `inboxd serve` on port 0 in a data directory,
//! reads the bound address from its first stdout line, and stops it with
//! SIGTERM (or SIGKILL) on request or when dropped. [`RawConn`] speaks raw
//! frames for the bad-input tests.

pub mod fuzzing;
pub mod group;
pub mod page_cache;
pub mod proxy;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use inbox_server::client::Client;
use inbox_wire::{Frame, FrameCodec, Hello, Request, Response, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The client token every test daemon is started with.
pub const TOKEN: &str = "e2e-test-token";
/// The admin token every test daemon is started with.
pub const ADMIN_TOKEN: &str = "e2e-test-admin-token";

/// Path of the `inboxd` binary built next to the running test executable
/// (`target/<profile>/inboxd`; tests live in `target/<profile>/deps`), or
/// `INBOXD_BINARY` when set (to run the examples against another build).
pub fn inboxd_binary() -> PathBuf {
    if let Some(binary) = std::env::var_os("INBOXD_BINARY") {
        return PathBuf::from(binary);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let binary = profile_dir.join("inboxd");
    assert!(
        binary.exists(),
        "inboxd binary not found at {}: build it first with `cargo build -p inbox-server --bins` \
         (`cargo test --workspace` builds it)",
        binary.display()
    );
    binary
}

/// `inboxd serve` on `data_dir` with the test tokens, both listeners on
/// port 0 of loopback (unless `extra` names `--listen`), warnings logged,
/// and `extra` flags.
pub fn serve_command(binary: &Path, data_dir: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(binary);
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(["--token", TOKEN, "--admin-token", ADMIN_TOKEN])
        .args(extra)
        .env(
            "INBOXD_LOG",
            std::env::var("INBOX_TEST_DAEMON_LOG").unwrap_or_else(|_| "warn".into()),
        );
    // A member of a group listens where its peers know it.
    if !extra.contains(&"--listen") {
        command.args(["--listen", "127.0.0.1:0"]);
    }
    command
}

/// A running `inboxd serve`.
pub struct Daemon {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub data_dir: PathBuf,
}

impl Daemon {
    /// Starts inboxd on `data_dir` with extra flags, waiting until it
    /// listens.
    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Daemon {
        Self::start_binary(&inboxd_binary(), data_dir, extra, &[])
    }

    /// Starts a given inboxd build (e.g. one with failpoints) with extra
    /// flags and environment variables.
    pub fn start_binary(
        binary: &Path,
        data_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let mut child = serve_command(binary, data_dir, extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn inboxd");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read inboxd stdout");
        // "listening on ADDR metrics on ADDR"
        let words: Vec<&str> = line.split_whitespace().collect();
        let (addr, metrics_addr) = match words.as_slice() {
            ["listening", "on", addr, "metrics", "on", metrics] => (
                addr.parse().expect("listen address"),
                metrics.parse().expect("metrics address"),
            ),
            _ => {
                let status = child.wait();
                panic!("inboxd did not start (stdout {line:?}, exit {status:?})");
            }
        };
        Daemon {
            child: Some(child),
            addr,
            metrics_addr,
            data_dir: data_dir.to_path_buf(),
        }
    }

    pub fn start(data_dir: &Path) -> Daemon {
        Self::start_with(data_dir, &[])
    }

    pub fn pid(&self) -> i32 {
        let child = self.child.as_ref().expect("daemon is running");
        i32::try_from(child.id()).expect("pid fits i32")
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a pid we spawned and have not reaped yet, so it
        // cannot name another process.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.pid());
    }

    /// Waits for the process to exit, at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("daemon is running");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("inboxd did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait(Duration::from_secs(30))
    }

    /// SIGKILL: no chance to flush anything.
    pub fn crash(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.wait(Duration::from_secs(10));
    }

    /// A client with the admin token, which may make every request
    /// (admin requests included).
    pub async fn client(&self) -> Client {
        Client::connect(self.addr, ADMIN_TOKEN)
            .await
            .expect("connect and authenticate")
    }

    /// A client with the ordinary client token: admin requests are
    /// `FORBIDDEN` to it.
    pub async fn user_client(&self) -> Client {
        Client::connect(self.addr, TOKEN)
            .await
            .expect("connect and authenticate")
    }

    /// The value of the unlabelled metric `name` on the metrics port.
    pub async fn metric(&self, name: &str) -> Option<u64> {
        metric(&self.scrape().await, name)
    }

    /// The raft snapshots this member installed since it started (0 for
    /// none, or for a daemon that is no group's member).
    pub async fn snapshots_installed(&self) -> u64 {
        self.metric("inboxd_raft_snapshots_installed_total")
            .await
            .unwrap_or(0)
    }

    /// Waits until the metric `name` is above `floor` and returns it;
    /// panics at `deadline` with the last value read.
    pub async fn wait_metric_above(&self, name: &str, floor: u64, deadline: Duration) -> u64 {
        let start = std::time::Instant::now();
        loop {
            let value = self.metric(name).await;
            if let Some(v) = value.filter(|v| *v > floor) {
                return v;
            }
            assert!(
                start.elapsed() < deadline,
                "{name} stayed at {value:?} (waited for above {floor}) for {deadline:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Read attempts the daemon ran so far: (in place, on the read pool).
    pub async fn read_attempts(&self) -> (u64, u64) {
        let text = self.scrape().await;
        let count = |name| metric(&text, name).unwrap_or_else(|| panic!("{name} is not exported"));
        (
            count("inboxd_reads_in_place_total"),
            count("inboxd_reads_pooled_total"),
        )
    }

    /// The Prometheus text from the metrics port.
    pub async fn scrape(&self) -> String {
        let mut stream = TcpStream::connect(self.metrics_addr)
            .await
            .expect("metrics port");
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut text = String::new();
        stream.read_to_string(&mut text).await.expect("read");
        text
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A raw protocol connection: write any bytes, read frames back.
pub struct RawConn {
    stream: TcpStream,
    buf: BytesMut,
    codec: FrameCodec,
}

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> RawConn {
        RawConn {
            stream: TcpStream::connect(addr).await.expect("connect"),
            buf: BytesMut::new(),
            codec: FrameCodec::new(u32::MAX),
        }
    }

    /// Connects and completes the handshake with the right token.
    pub async fn authenticated(addr: SocketAddr) -> RawConn {
        let mut conn = Self::connect(addr).await;
        conn.send(&hello(TOKEN).to_frame(1)).await;
        match conn.recv().await {
            Some((_, Response::Hello(_))) => conn,
            other => panic!("handshake failed: {other:?}"),
        }
    }

    pub async fn write_raw(&mut self, bytes: &[u8]) {
        // The server may already have closed; a failed write shows up as
        // EOF on the next read.
        let _ = self.stream.write_all(bytes).await;
    }

    /// Half-closes: the server sees EOF but can still answer.
    pub async fn shutdown_write(&mut self) {
        let _ = self.stream.shutdown().await;
    }

    pub async fn send(&mut self, frame: &Frame) {
        let mut out = BytesMut::new();
        self.codec.encode(frame, &mut out).expect("encode");
        self.write_raw(&out).await;
    }

    /// The next frame, or `None` once the server closed the connection.
    /// Panics after 10 s of silence.
    pub async fn recv(&mut self) -> Option<(u64, Response)> {
        let deadline = Duration::from_secs(10);
        tokio::time::timeout(deadline, async {
            loop {
                if let Some(frame) = self
                    .codec
                    .decode(&mut self.buf)
                    .expect("server frames are valid")
                {
                    let response = Response::decode(frame.opcode, frame.body).expect("known reply");
                    return Some((frame.request_id, response));
                }
                match self.stream.read_buf(&mut self.buf).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("server answered within 10 s")
    }

    /// True once the server has closed the connection (after draining any
    /// frames still queued).
    pub async fn closed(&mut self) -> bool {
        while self.recv().await.is_some() {}
        true
    }
}

pub fn hello(token: &str) -> Request {
    Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        client_name: "e2e".into(),
        token: Bytes::from(token.to_string().into_bytes()),
    })
}

/// A fresh data directory.
pub fn data_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// The first page of `uid`'s events on `device` (from the start, `limit`
/// events at most).
pub async fn first_sync_page(
    client: &Client,
    uid: u64,
    device: u64,
    generation: u64,
    limit: u32,
) -> inbox_wire::SyncPage {
    client
        .sync(inbox_wire::SyncReq {
            uid,
            device,
            generation: Some(generation),
            local_applied_seq: 0,
            limit,
            batch_token: None,
            ..inbox_wire::SyncReq::default()
        })
        .await
        .expect("sync")
}

/// Registers `device` for `uid` and returns its generation.
pub async fn register(client: &Client, uid: u64, device: u64) -> u64 {
    client
        .register_device(inbox_wire::UserDevice { uid, device })
        .await
        .expect("register device")
        .device
        .generation
}

/// Sends `text` from `sender` to `conv` with a fresh idempotency key. A
/// `RATE_LIMITED` answer (many tasks share one connection) is retried
/// with the same key after the wait its detail names, as a client should.
pub async fn send_text(
    client: &Client,
    conv: u64,
    sender: u64,
    text: &str,
) -> inbox_wire::SendReply {
    let req = inbox_wire::SendReq {
        conv,
        sender,
        client_msg_id: rand::random(),
        msg_type: 1,
        payload: Bytes::from(text.to_string().into_bytes()),
    };
    loop {
        match client.send(req.clone()).await {
            Err(inbox_server::client::ClientError::Server {
                code: inbox_wire::ErrorCode::RateLimited,
                detail,
                ..
            }) => tokio::time::sleep(Duration::from_millis(detail.clamp(1, 1_000))).await,
            reply => return reply.expect("send"),
        }
    }
}

/// Every message of a conversation visible to `uid`, oldest first, by
/// paging history backwards to the start.
pub async fn all_history(client: &Client, uid: u64, conv: u64) -> Vec<inbox_wire::Message> {
    history_above(client, uid, conv, 0).await
}

/// A conversation's history above `floor` (exclusive), in `msg_seq` order,
/// read newest first in pages of 200 until a page reaches `floor`.
pub async fn history_above(
    client: &Client,
    uid: u64,
    conv: u64,
    floor: u64,
) -> Vec<inbox_wire::Message> {
    try_history_above(client, uid, conv, floor)
        .await
        .expect("history")
}

/// [`history_above`], its error returned.
pub async fn try_history_above(
    client: &Client,
    uid: u64,
    conv: u64,
    floor: u64,
) -> Result<Vec<inbox_wire::Message>, inbox_server::client::ClientError> {
    let mut messages = Vec::new();
    let mut before = None;
    loop {
        let page = client
            .history(inbox_wire::HistoryReq {
                uid,
                conv,
                before_seq: before,
                limit: 200,
            })
            .await?;
        let Some(oldest) = page.messages.last().map(|m| m.msg_seq) else {
            break;
        };
        messages.extend(page.messages.into_iter().filter(|m| m.msg_seq > floor));
        if !page.has_more || oldest <= floor + 1 {
            break;
        }
        before = Some(oldest);
    }
    messages.reverse();
    Ok(messages)
}

/// The `(conv, msg_seq)` of every `msg` event, in stream order.
pub fn msg_refs(events: &[inbox_wire::Event]) -> Vec<(u64, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            inbox_wire::Event::Known {
                kind: inbox_wire::EventKind::Msg,
                body,
                ..
            } => Some((body.conv, body.msg_seq)),
            inbox_wire::Event::Bare {
                kind: inbox_wire::EventKind::Msg,
                body,
                ..
            } => Some((body.conv, body.msg_seq)),
            _ => None,
        })
        .collect()
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS:`, `RssAnon:`, ...), in
/// bytes; `None` once the process is gone or without the field.
pub fn proc_status_bytes(pid: i32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The value of the unlabelled metric `name` in Prometheus text.
pub fn metric(text: &str, name: &str) -> Option<u64> {
    metric_as(text, name)
}

/// [`metric`] for a metric whose value is a float (a sum of seconds).
pub fn metric_f64(text: &str, name: &str) -> Option<f64> {
    metric_as(text, name)
}

fn metric_as<T: std::str::FromStr>(text: &str, name: &str) -> Option<T> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}
