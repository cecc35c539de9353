//! inboxd over TCP through its async Rust client (`inbox_server::client`).
//!
//! The harness starts the `inboxd` binary (from `--inboxd`, else
//! `target/release`, else `target/debug`) on a temporary data directory,
//! listening on a loopback port the kernel picks, with its default sync
//! policy (`always`: fdatasync before reply, group-committed). Its
//! per-connection rate limit is lifted, as no baseline has one.
//!
//! Each harness client thread owns a current-thread tokio runtime and one
//! client connection, so a call is a direct `block_on` with no hop between
//! threads: the same closed loop the baselines' blocking clients run.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_server::client::{CatchUpOptions, Client, ClientError};
use inbox_wire::{
    AckReq, AckSnapshotReq, ConvListReq, ConvMember, Empty, ErrorCode, Event, FinishLeaseReq,
    PullCursor, PullReq, SendReq, SnapshotPageReq, SyncReq, UidList, UserDevice, UserReq,
};

use super::process::{find_binary, ChildGuard};
use super::{dir_bytes, Conn, DeviceCursor, Page, Result, Screen, SnapshotCatchUp, System};
use crate::procfs::{self, Measured};
use crate::workload::{Outgoing, Setup, Uid};

/// Application message type of the harness's sends.
const MSG_TYPE_TEXT: u16 = 1;
/// Requests each preparing connection keeps in flight.
const PREPARE_WINDOW: usize = 128;
const PREPARE_CONNECTIONS: usize = 8;

pub struct Inboxd {
    binary: PathBuf,
    token: String,
    /// Flags added to `inboxd serve` (kept for restarts).
    extra_args: Vec<String>,
    /// What `--listen` asks for: a port the kernel picks, or a fixed one a
    /// group's members name each other by.
    listen: String,
    pub(crate) addr: SocketAddr,
    /// Where its metrics endpoint listens, as it said at start.
    metrics: Option<SocketAddr>,
    server: ChildGuard,
    /// Declared last, so dropped last: the server stops (it may still
    /// write its shutdown checkpoint) before its directory is removed.
    dir: tempfile::TempDir,
}

/// The inboxd binary: `explicit`, else the workspace's release build, else
/// its debug build, else one on PATH.
pub fn binary(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return path.is_file().then(|| path.to_path_buf());
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    for profile in ["release", "debug"] {
        let path = target.join(profile).join("inboxd");
        if path.is_file() {
            return Some(path);
        }
    }
    // Next to this binary (target/<profile>/inbox-bench).
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        let path = dir.join("inboxd");
        if path.is_file() {
            return Some(path);
        }
    }
    find_binary(&["inboxd"])
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

impl Inboxd {
    /// Starts the stopped server again on its data; returns the time until
    /// it serves a request.
    fn restart(&mut self) -> Result<Duration> {
        let start = Instant::now();
        self.respawn()?;
        self.wait_serving(Duration::from_secs(600))?;
        Ok(start.elapsed())
    }

    /// Starts the stopped server again on its data, without waiting for
    /// it to serve (a group's follower never does).
    pub(crate) fn respawn(&mut self) -> Result<()> {
        let (server, addr, metrics) = Self::spawn(
            &self.binary,
            self.dir.path(),
            &self.token,
            &self.listen,
            &self.extra_args,
        )?;
        self.server = server;
        self.addr = addr;
        self.metrics = metrics;
        Ok(())
    }

    /// Starts inboxd on a fresh data directory under `base`, with
    /// `extra_args` added to its command line.
    pub fn start(
        base: &Path,
        explicit: Option<&Path>,
        extra_args: &[&str],
    ) -> Result<Box<dyn System>> {
        let inboxd = Self::start_node(base, explicit, "127.0.0.1:0", extra_args, None)?;
        inboxd.wait_serving(Duration::from_secs(60))?;
        Ok(Box::new(inboxd))
    }

    /// Starts one inboxd listening on `listen`, without waiting for it to
    /// serve (a group's member serves once the group has a leader), with
    /// `token` shared by a group's members, or a fresh one.
    pub(crate) fn start_node(
        base: &Path,
        explicit: Option<&Path>,
        listen: &str,
        extra_args: &[&str],
        token: Option<&str>,
    ) -> Result<Self> {
        let Some(binary) = binary(explicit) else {
            return Err(
                "no inboxd binary (cargo build --release -p inbox-server, or --inboxd PATH)".into(),
            );
        };
        let dir = tempfile::Builder::new()
            .prefix("inboxd-")
            .tempdir_in(base)?;
        let token = token.map_or_else(
            || format!("bench-{:016x}", rand::random::<u64>()),
            str::to_string,
        );
        let extra_args: Vec<String> = extra_args.iter().map(|a| (*a).to_string()).collect();
        let (server, addr, metrics) =
            Self::spawn(&binary, dir.path(), &token, listen, &extra_args)?;
        Ok(Self {
            metrics,
            dir,
            binary,
            token,
            extra_args,
            listen: listen.to_string(),
            addr,
            server,
        })
    }

    /// Kills the server with SIGKILL, leaving its data as the kill left it.
    pub(crate) fn kill_hard(&mut self) -> Result<()> {
        self.server.kill_hard()
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// Starts `inboxd serve` and reads the addresses it listens on (clients,
    /// then metrics) from its first line of stdout.
    fn spawn(
        binary: &Path,
        dir: &Path,
        token: &str,
        listen: &str,
        extra_args: &[String],
    ) -> Result<(ChildGuard, SocketAddr, Option<SocketAddr>)> {
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen", listen, "--metrics-listen", "127.0.0.1:0"])
            .args(["--token", token])
            .args(["--admin-token", &admin_token(token)])
            .args(["--rate-per-s", "100000000", "--rate-burst", "100000000"])
            .args(["--max-connections", "4096"])
            .args(extra_args)
            .env("RUST_LOG", "warn");
        let (mut guard, stdout) = ChildGuard::spawn_with_stdout("inboxd", &mut command)?;
        let mut line = String::new();
        let mut reader = BufReader::new(stdout);
        reader.read_line(&mut line)?;
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            guard.check_alive()?;
            return Err(format!("inboxd did not say where it listens: {line:?}").into());
        };
        let metrics = line
            .split_once(" metrics on ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok());
        // Keep draining stdout so the daemon never blocks on a full pipe.
        std::thread::spawn(move || for _ in reader.lines() {});
        Ok((guard, addr, metrics))
    }

    /// The text of its metrics endpoint, if it answers.
    pub(crate) fn scrape(&self) -> Option<String> {
        use std::io::{Read, Write};
        let timeout = Duration::from_secs(5);
        let mut s = std::net::TcpStream::connect_timeout(&self.metrics?, timeout).ok()?;
        s.set_read_timeout(Some(timeout)).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        Some(text)
    }

    fn wait_serving(&self, timeout: Duration) -> Result<Duration> {
        let rt = runtime()?;
        let start = Instant::now();
        loop {
            let probe = rt.block_on(async {
                let client = Client::connect(self.addr, self.token.clone()).await?;
                client.ping(Empty {}).await?;
                Ok::<_, ClientError>(())
            });
            match probe {
                Ok(()) => return Ok(start.elapsed()),
                Err(e) if start.elapsed() > timeout => {
                    return Err(format!("inboxd not serving after {timeout:?}: {e}").into());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    fn client_on(&self, rt: &tokio::runtime::Runtime) -> Result<Client> {
        Ok(rt.block_on(Client::connect(self.addr, self.token.clone()))?)
    }

    /// A client allowed to make admin requests (compaction, stats).
    fn admin_client_on(&self, rt: &tokio::runtime::Runtime) -> Result<Client> {
        Ok(rt.block_on(Client::connect(self.addr, admin_token(&self.token)))?)
    }

    /// Runs `call` for every item, over several connections with a window
    /// of requests in flight on each.
    fn pipelined<T, F, Fut>(&self, items: Vec<T>, call: F) -> Result<()>
    where
        T: std::marker::Send + 'static,
        F: Fn(Arc<Client>, T) -> Fut + Clone + std::marker::Send + 'static,
        Fut: std::future::Future<Output = std::result::Result<(), ClientError>>
            + std::marker::Send
            + 'static,
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let addr = self.addr;
        let token = self.token.clone();
        rt.block_on(async move {
            let mut lanes: Vec<Vec<T>> = (0..PREPARE_CONNECTIONS).map(|_| Vec::new()).collect();
            for (i, item) in items.into_iter().enumerate() {
                lanes[i % PREPARE_CONNECTIONS].push(item);
            }
            let mut tasks = tokio::task::JoinSet::new();
            for lane in lanes {
                let (token, call) = (token.clone(), call.clone());
                tasks.spawn(async move {
                    let client = Arc::new(Client::connect(addr, token).await?);
                    let mut in_flight = tokio::task::JoinSet::new();
                    for item in lane {
                        if in_flight.len() >= PREPARE_WINDOW {
                            if let Some(done) = in_flight.join_next().await {
                                done.map_err(|e| ClientError::Io(e.to_string()))??;
                            }
                        }
                        in_flight.spawn(call(Arc::clone(&client), item));
                    }
                    while let Some(done) = in_flight.join_next().await {
                        done.map_err(|e| ClientError::Io(e.to_string()))??;
                    }
                    Ok::<_, ClientError>(())
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.map_err(|e| ClientError::Io(e.to_string()))??;
            }
            Ok::<_, ClientError>(())
        })?;
        Ok(())
    }
}

impl System for Inboxd {
    fn name(&self) -> &str {
        "inboxd"
    }

    fn hold_subscribers(&self, n: u32, first_uid: u64) -> Result<Option<Box<dyn std::any::Any>>> {
        if n == 0 {
            return Ok(None);
        }
        // One worker: the connections only wait (their uids get no hint).
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (addr, token) = (self.addr, self.token.clone());
        let clients = rt.block_on(async move {
            let mut clients = Vec::with_capacity(n as usize);
            for i in 0..u64::from(n) {
                let client = Client::connect(addr, token.clone()).await?;
                client
                    .subscribe(UidList {
                        uids: vec![first_uid + i],
                    })
                    .await?;
                clients.push(client);
            }
            Ok::<_, ClientError>(clients)
        })?;
        Ok(Some(Box::new((clients, rt))))
    }

    fn connect(&self) -> Result<Box<dyn Conn + '_>> {
        let rt = runtime()?;
        let client = Arc::new(self.client_on(&rt)?);
        Ok(Box::new(InboxdConn { rt, client }))
    }

    fn prepare(&self, setup: &Setup) -> Result<()> {
        let joins: Vec<ConvMember> = setup
            .convs
            .iter()
            .flat_map(|c| {
                c.members
                    .iter()
                    .map(|&uid| ConvMember { conv: c.conv, uid })
            })
            .collect();
        self.pipelined(joins, |client, member| async move {
            client.join(member).await.map(|_| ())
        })?;
        let devices: Vec<UserDevice> = setup
            .devices
            .iter()
            .map(|&(uid, device)| UserDevice { uid, device })
            .collect();
        self.pipelined(devices, |client, device| async move {
            client.register_device(device).await.map(|_| ())
        })
    }

    fn crash_and_restart(&mut self) -> Result<Duration> {
        self.server.kill_hard()?;
        self.restart()
    }

    fn restart_cold(&mut self) -> Result<Duration> {
        self.server.stop(Duration::from_secs(60));
        super::evict_from_page_cache(self.dir.path())?;
        let took = self.restart()?;
        // Recovery read the newest segment back to find its end; drop that
        // too (pages the server has mapped and touched stay).
        super::evict_from_page_cache(self.dir.path())?;
        Ok(took)
    }

    fn compact_now(&self) -> Result<()> {
        let rt = runtime()?;
        let client = self.admin_client_on(&rt)?;
        rt.block_on(client.compact(Empty {}))?;
        Ok(())
    }

    fn write_counters(&self) -> Option<super::WriteCounters> {
        let rt = runtime().ok()?;
        let client = self.admin_client_on(&rt).ok()?;
        let stats = rt.block_on(client.stats(Empty {})).ok()?;
        Some(super::WriteCounters {
            write_batches: stats.write_batches,
            fsyncs: stats.fsyncs,
            fsync_latency_us_sum: stats.fsync_latency_us_sum,
        })
    }

    fn measured(&self) -> Option<Measured> {
        procfs::server_pid(Some(self.addr.port()), None, self.server.pid()).map(Measured::Server)
    }

    fn holdings(&self) -> Option<super::Holdings> {
        let rt = runtime().ok()?;
        // STATS is an admin request.
        let client = self.admin_client_on(&rt).ok()?;
        let stats = rt.block_on(client.stats(Empty {})).ok()?;
        Some(super::Holdings {
            messages: stats.messages,
            events_live: stats.events_live,
        })
    }

    fn memory(&self) -> Option<(Vec<crate::report::StructureBytes>, u64, u64)> {
        let rt = runtime().ok()?;
        let client = self.admin_client_on(&rt).ok()?;
        let m = rt.block_on(client.memory(Empty {})).ok()?;
        let structures = m
            .structures
            .into_iter()
            .map(|s| crate::report::StructureBytes {
                structure: s.structure,
                live: s.live,
                allocated: s.allocated,
            })
            .collect();
        Some((structures, m.walk_us, m.longest_hold_us))
    }

    fn data_bytes(&self) -> u64 {
        dir_bytes(&self.dir.path().join("data"))
    }

    fn describe(&self) -> String {
        let version = Command::new(&self.binary)
            .arg("--version")
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let extra = if self.extra_args.is_empty() {
            String::new()
        } else {
            format!(", {}", self.extra_args.join(" "))
        };
        format!(
            "inboxd: {version} ({}, sync always{extra})",
            self.binary.display()
        )
    }
}

struct InboxdConn {
    rt: tokio::runtime::Runtime,
    client: Arc<Client>,
}

pub(crate) fn send_req(send: &Outgoing<'_>) -> SendReq {
    SendReq {
        conv: send.conv,
        sender: send.sender,
        client_msg_id: send.client_msg_id,
        msg_type: MSG_TYPE_TEXT,
        payload: Bytes::copy_from_slice(send.payload),
    }
}

/// Bytes of a conversation summary on the wire, without its summary text.
const CONV_SUMMARY_BYTES: u64 = 8 * 4 + 4 + 4 + 4 + 8 + 2;
/// Bytes of a message on the wire, without its payload.
const MESSAGE_BYTES: u64 = 8 * 4 + 1 + 2 + 9 + 8 + 1 + 4;

/// Bytes of one event as encoded on the wire.
fn event_bytes(event: &Event) -> u64 {
    // sync_seq, kind, body length; then the body.
    const HEAD: u64 = 8 + 1 + 4;
    match event {
        Event::Known { body, .. } => HEAD + 8 * 4 + 4 + body.summary.len() as u64,
        Event::Bare { .. } => HEAD + 8 * 4,
        Event::Unknown { body, .. } => HEAD + body.len() as u64,
    }
}

impl Conn for InboxdConn {
    fn send(&mut self, send: &Outgoing<'_>) -> Result<()> {
        self.rt.block_on(self.client.send(send_req(send)))?;
        Ok(())
    }

    fn send_batch(&mut self, sends: &[Outgoing<'_>]) -> Result<()> {
        // Pipelined: the whole batch in flight on this connection at once.
        let requests: Vec<SendReq> = sends.iter().map(send_req).collect();
        let client = &self.client;
        self.rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for request in requests {
                let client = Arc::clone(client);
                tasks.spawn(async move { client.send(request).await });
            }
            while let Some(done) = tasks.join_next().await {
                done.map_err(|e| ClientError::Io(e.to_string()))??;
            }
            Ok::<_, ClientError>(())
        })?;
        Ok(())
    }

    fn sync_page(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<Page> {
        self.rt.block_on(sync_page_on(&self.client, device, limit))
    }

    /// As a device does with the Rust client: `Client::catch_up`, which
    /// asks for the next page before it waits for the last page's `ACK`
    /// (`PROTOCOL.md`, "Pipelined catch-up").
    fn catch_up(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<(u64, u64, u64)> {
        let client = &self.client;
        self.rt.block_on(async {
            start_cursor(client, device).await?;
            let options = CatchUpOptions {
                limit,
                ack_every: device.ack_every.max(1),
                ids_only: device.ids_only,
                ack_in_sync: true,
                ..CatchUpOptions::default()
            };
            let run = client
                .catch_up(
                    device.uid,
                    device.device,
                    device.generation,
                    device.applied,
                    true,
                    options,
                )
                .await?;
            device.generation = Some(run.generation);
            device.acked = run.acked_sync_seq;
            device.applied = device.applied.max(run.acked_sync_seq);
            let bytes = run.events.iter().map(event_bytes).sum();
            Ok((run.events.len() as u64, u64::from(run.pages), bytes))
        })
    }

    fn catch_up_by_snapshot(&mut self, uid: Uid, device: u64) -> Result<SnapshotCatchUp> {
        let client = &self.client;
        self.rt.block_on(async {
            let generation = client
                .register_device(UserDevice { uid, device })
                .await?
                .device
                .generation;
            let start = Instant::now();
            let asked = client
                .sync(SyncReq {
                    uid,
                    device,
                    generation: Some(generation),
                    local_applied_seq: 0,
                    limit: 0,
                    batch_token: None,
                    max_replay: Some(1),
                    without_summaries: false,
                    ids_only: false,
                    ack_through: None,
                })
                .await;
            match asked {
                Err(ClientError::Server {
                    code: ErrorCode::ResetRequired,
                    ..
                }) => {}
                Ok(_) => return Err("a backlog of at most one event: nothing to reset".into()),
                Err(e) => return Err(e.into()),
            }
            let info = client.begin_snapshot(UserDevice { uid, device }).await?;
            let mut out = SnapshotCatchUp::default();
            for page in 0..info.pages {
                let p = client
                    .snapshot_page(SnapshotPageReq {
                        uid,
                        snapshot_id: info.snapshot_id,
                        page,
                    })
                    .await?;
                let bytes = p
                    .convs
                    .iter()
                    .map(|c| CONV_SUMMARY_BYTES + c.last_summary.len() as u64)
                    .sum::<u64>()
                    + p.messages
                        .iter()
                        .map(|m| MESSAGE_BYTES + m.payload.len() as u64)
                        .sum::<u64>();
                if page == 0 {
                    out.first_screen = start.elapsed();
                    out.first_page_bytes = bytes;
                }
                out.pages += 1;
                out.convs += u32::try_from(p.convs.len()).unwrap_or(u32::MAX);
                out.messages += u32::try_from(p.messages.len()).unwrap_or(u32::MAX);
                out.bytes += bytes;
            }
            client
                .ack_snapshot(AckSnapshotReq {
                    uid,
                    device,
                    snapshot_id: info.snapshot_id,
                    generation: info.generation,
                })
                .await?;
            out.total = start.elapsed();
            Ok(out)
        })
    }

    /// The conversation list comes from the per-user conversation state
    /// (R15); one pull fetches the newest messages of every conversation.
    fn first_screen(&mut self, uid: Uid, per_conv: u32) -> Result<Screen> {
        let client = &self.client;
        self.rt.block_on(async {
            let mut summaries = Vec::new();
            let mut cursor = None;
            loop {
                let page = client
                    .conv_list(ConvListReq {
                        uid,
                        limit: 500,
                        cursor,
                    })
                    .await?;
                summaries.extend(page.convs);
                cursor = page.next_cursor;
                if cursor.is_none() {
                    break;
                }
            }
            let mut screen = Screen {
                convs: u32::try_from(summaries.len()).unwrap_or(u32::MAX),
                bytes: summaries
                    .iter()
                    .map(|c| CONV_SUMMARY_BYTES + c.last_summary.len() as u64)
                    .sum(),
                ..Screen::default()
            };
            let cursors = summaries
                .iter()
                .map(|c| PullCursor {
                    conv: c.conv,
                    after_seq: c.last_msg_seq.saturating_sub(u64::from(per_conv)),
                })
                .collect();
            let pulled = client
                .pull(PullReq {
                    uid,
                    per_conv_limit: per_conv,
                    cursors,
                })
                .await?;
            for conv in &pulled.convs {
                screen.messages += u32::try_from(conv.messages.len()).unwrap_or(u32::MAX);
                screen.bytes += conv
                    .messages
                    .iter()
                    .map(|m| MESSAGE_BYTES + m.payload.len() as u64)
                    .sum::<u64>();
            }
            Ok(screen)
        })
    }
}

/// The admin token the bench's daemon is started with, beside its client
/// token.
pub(crate) fn admin_token(token: &str) -> String {
    format!("{token}-admin")
}

/// The device knows its generation and its last ACK; a fresh harness
/// cursor reads them, as the MariaDB driver reads user_sync_cursor.
async fn start_cursor(client: &Client, device: &mut DeviceCursor) -> Result<()> {
    if !device.started {
        let list = client.devices(UserReq { uid: device.uid }).await?;
        if let Some(info) = list.devices.iter().find(|d| d.device == device.device) {
            device.generation = Some(info.generation);
            device.acked = info.acked_sync_seq;
            device.applied = info.acked_sync_seq;
        }
        device.started = true;
    }
    Ok(())
}

/// One page of a device's catch-up on `client` (read, ACKed, its lease
/// finished on the last page), as the harness's sync scenarios make it;
/// also what a group member serves (`group.rs`).
pub(super) async fn sync_page_on(
    client: &Client,
    device: &mut DeviceCursor,
    limit: u32,
) -> Result<Page> {
    start_cursor(client, device).await?;
    let read_started = Instant::now();
    let page = client
        .sync(SyncReq {
            uid: device.uid,
            device: device.device,
            generation: device.generation,
            local_applied_seq: device.applied,
            limit,
            batch_token: (!device.position.is_empty())
                .then(|| Bytes::from(device.position.clone())),
            ids_only: device.ids_only,
            ..SyncReq::default()
        })
        .await?;
    let read = read_started.elapsed();
    let bytes = page.events.iter().map(event_bytes).sum();
    let events = u32::try_from(page.events.len()).unwrap_or(u32::MAX);
    let ack_due = device.ack_due(page.has_more);
    if ack_due && page.next_cursor > page.acked_sync_seq {
        client
            .ack(AckReq {
                uid: device.uid,
                device: device.device,
                generation: page.generation,
                seq: page.next_cursor,
                batch_token: page.batch_token.clone(),
            })
            .await?;
    }
    if !page.has_more {
        if let Some(lease) = &page.lease {
            client
                .finish_lease(FinishLeaseReq {
                    uid: device.uid,
                    device: device.device,
                    lease_id: lease.lease_id,
                    generation: page.generation,
                })
                .await?;
        }
    }
    device.generation = Some(page.generation);
    device.applied = device.applied.max(page.next_cursor);
    if ack_due {
        device.acked = device.acked.max(page.next_cursor);
    }
    device.position = if page.has_more {
        page.batch_token.to_vec()
    } else {
        Vec::new()
    };
    Ok(Page {
        events,
        bytes,
        has_more: page.has_more,
        read,
    })
}
