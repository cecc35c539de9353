//! Redis as an inbox: one stream per user, AOF on.
//!
//! Keys:
//! - `seq:{conv}`: the conversation counter, `INCR`ed;
//! - `msg:{conv}`: a hash `msg_id -> sender | payload`, each message once;
//! - `inbox:{uid}`: the user's stream; one `XADD` per recipient holding
//!   `(conv, msg_id)`; the stream id is the user's sync position;
//! - `cursor:{uid}:{device}`: the device's last ACKed stream id.
//!
//! A send is one `MULTI`/`EXEC` (the INCR, the HSET and every XADD), so the
//! seq is allocated atomically with the writes. With `appendfsync always`,
//! Redis fsyncs the AOF before it sends the replies of an event-loop round
//! (group commit across clients); `everysec` acknowledges before the fsync
//! and is labelled as the weaker durability it is.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::process::{find_binary, free_port, wait_until, ChildGuard};
use super::{dir_bytes, Conn, DeviceCursor, Page, Result, System};
use crate::procfs::{self, Measured};
use crate::workload::{Outgoing, Setup};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    Always,
    EverySec,
}

pub struct Redis {
    binary: PathBuf,
    port: u16,
    fsync: Fsync,
    server: ChildGuard,
    version: String,
    msg_ids: AtomicU64,
    /// Declared last, so dropped last: the server stops (it may still
    /// write its shutdown checkpoint) before its directory is removed.
    dir: tempfile::TempDir,
}

pub fn installed() -> Option<PathBuf> {
    find_binary(&["redis-server"])
}

impl Redis {
    pub fn start(base: &Path, binary: &Path, fsync: Fsync) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("redis-").tempdir_in(base)?;
        let port = free_port()?;
        let version = Command::new(binary)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let server = Self::spawn(binary, dir.path(), port, fsync)?;
        let mut redis = Self {
            dir,
            binary: binary.to_path_buf(),
            port,
            fsync,
            server,
            version,
            msg_ids: AtomicU64::new(1),
        };
        redis.wait_ready()?;
        Ok(redis)
    }

    fn spawn(binary: &Path, dir: &Path, port: u16, fsync: Fsync) -> Result<ChildGuard> {
        ChildGuard::spawn(
            "redis-server",
            Command::new(binary)
                .arg("--port")
                .arg(port.to_string())
                .arg("--bind")
                .arg("127.0.0.1")
                .arg("--dir")
                .arg(dir)
                .arg("--logfile")
                .arg(dir.join("redis.log"))
                .args(["--daemonize", "no", "--protected-mode", "no", "--save", ""])
                .args(["--appendonly", "yes"])
                .arg("--appendfsync")
                .arg(match fsync {
                    Fsync::Always => "always",
                    Fsync::EverySec => "everysec",
                })
                .args(["--maxclients", "2000"]),
        )
    }

    fn client(&self) -> Result<redis::Client> {
        Ok(redis::Client::open(format!(
            "redis://127.0.0.1:{}/",
            self.port
        ))?)
    }

    fn wait_ready(&mut self) -> Result<Duration> {
        let client = self.client()?;
        let server = &mut self.server;
        let ((), took) = wait_until(
            "redis-server",
            Duration::from_secs(600),
            || server.check_alive(),
            || {
                let mut conn = client.get_connection()?;
                // PING answers while the AOF is still loading; a GET does not.
                let _: Option<String> = redis::cmd("GET").arg("ready-probe").query(&mut conn)?;
                Ok(())
            },
        )?;
        Ok(took)
    }
}

impl System for Redis {
    fn name(&self) -> &str {
        match self.fsync {
            Fsync::Always => "redis",
            Fsync::EverySec => "redis-everysec",
        }
    }

    fn connect(&self) -> Result<Box<dyn Conn + '_>> {
        let conn = self.client()?.get_connection()?;
        Ok(Box::new(RedisConn {
            conn,
            msg_ids: &self.msg_ids,
        }))
    }

    fn prepare(&self, _setup: &Setup) -> Result<()> {
        // Counters and streams are created by their first write.
        Ok(())
    }

    fn crash_and_restart(&mut self) -> Result<Duration> {
        self.server.kill_hard()?;
        self.server = Self::spawn(&self.binary, self.dir.path(), self.port, self.fsync)?;
        self.wait_ready()
    }

    fn measured(&self) -> Option<Measured> {
        procfs::server_pid(Some(self.port), None, self.server.pid()).map(Measured::Server)
    }

    fn data_bytes(&self) -> u64 {
        dir_bytes(self.dir.path())
    }

    fn describe(&self) -> String {
        let fsync = match self.fsync {
            Fsync::Always => "appendfsync always",
            Fsync::EverySec => "appendfsync everysec: WEAKER durability, up to 1 s of acknowledged writes lost on a crash",
        };
        format!("{}: {} ({fsync})", self.name(), self.version)
    }
}

struct RedisConn<'a> {
    conn: redis::Connection,
    msg_ids: &'a AtomicU64,
}

fn add_send(pipe: &mut redis::Pipeline, send: &Outgoing<'_>, msg_id: u64) {
    pipe.cmd("INCR").arg(format!("seq:{}", send.conv));
    let mut body = Vec::with_capacity(8 + send.payload.len());
    body.extend_from_slice(&send.sender.to_be_bytes());
    body.extend_from_slice(send.payload);
    pipe.cmd("HSET")
        .arg(format!("msg:{}", send.conv))
        .arg(msg_id)
        .arg(body)
        .ignore();
    for uid in send.recipients {
        pipe.cmd("XADD")
            .arg(format!("inbox:{uid}"))
            .arg("*")
            .arg("c")
            .arg(send.conv)
            .arg("m")
            .arg(msg_id)
            .ignore();
    }
}

impl Conn for RedisConn<'_> {
    fn send(&mut self, send: &Outgoing<'_>) -> Result<()> {
        let msg_id = self.msg_ids.fetch_add(1, Ordering::Relaxed);
        let mut pipe = redis::pipe();
        pipe.atomic();
        add_send(&mut pipe, send, msg_id);
        let (_seq,): (u64,) = pipe.query(&mut self.conn)?;
        Ok(())
    }

    fn send_batch(&mut self, sends: &[Outgoing<'_>]) -> Result<()> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for send in sends {
            add_send(
                &mut pipe,
                send,
                self.msg_ids.fetch_add(1, Ordering::Relaxed),
            );
        }
        let _: Vec<u64> = pipe.query(&mut self.conn)?;
        Ok(())
    }

    fn sync_page(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<Page> {
        if !device.started {
            let acked: Option<Vec<u8>> = redis::cmd("GET")
                .arg(format!("cursor:{}:{}", device.uid, device.device))
                .query(&mut self.conn)?;
            device.position = acked.unwrap_or_default();
            device.started = true;
        }
        let start = if device.position.is_empty() {
            b"-".to_vec()
        } else {
            let mut exclusive = b"(".to_vec();
            exclusive.extend_from_slice(&device.position);
            exclusive
        };
        let read_started = std::time::Instant::now();
        let entries: Vec<(Vec<u8>, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
            .arg(format!("inbox:{}", device.uid))
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(limit + 1)
            .query(&mut self.conn)?;
        let read = read_started.elapsed();
        let has_more = entries.len() > limit as usize;
        let page = &entries[..entries.len().min(limit as usize)];
        let bytes = page
            .iter()
            .map(|(id, fields)| id.len() + fields.iter().map(Vec::len).sum::<usize>())
            .sum::<usize>() as u64;
        if let Some((last, _)) = page.last() {
            device.position.clone_from(last);
            device.applied += page.len() as u64;
            if device.ack_due(has_more) {
                // With appendfsync always, the reply waits for the AOF fsync.
                let () = redis::cmd("SET")
                    .arg(format!("cursor:{}:{}", device.uid, device.device))
                    .arg(last)
                    .query(&mut self.conn)?;
                device.acked = device.applied;
            }
        }
        Ok(Page {
            events: u32::try_from(page.len()).unwrap_or(u32::MAX),
            bytes,
            has_more,
            read,
        })
    }
}
