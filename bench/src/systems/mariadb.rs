//! MariaDB with the seeds' schema, at `innodb_flush_log_at_trx_commit=1`
//! and no binlog: a commit returns once its redo log is fsynced (InnoDB
//! group-commits concurrent transactions).
//!
//! Tables (as in the design articles):
//! - `conv_seq(conv_id PK, seq)`: the per-conversation counter, advanced by
//!   `UPDATE conv_seq SET seq = LAST_INSERT_ID(seq + 1) WHERE conv_id = ?`;
//! - `msg(conv_id, seq, msg_id, sender, payload, PK(conv_id, seq))`: each
//!   message once;
//! - `offline_msg_00..offline_msg_15(uid, conv_id, seq, msg_id,
//!   PK(uid, conv_id, seq))`: the offline inbox, sharded by `uid % 16`;
//! - `user_seq(uid PK, seq)` and `sync_event(uid, sync_seq, type, conv_id,
//!   seq, PK(uid, sync_seq))`: the per-user sync stream;
//! - `user_sync_cursor(uid, device_id, acked_sync_seq, PK(uid, device_id))`.
//!
//! One send is one transaction doing all of that for each recipient. The
//! counter's new value is read from the statement's OK packet (the
//! `LAST_INSERT_ID(expr)` it set), which is what `SELECT LAST_INSERT_ID()`
//! returns, without its extra round trip. Counter rows are locked in a
//! fixed order (the conversation, then recipients by uid) so concurrent
//! sends do not deadlock; a deadlock or lock timeout that happens anyway is
//! retried after a random pause, as an application would.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Conn as MyConn, OptsBuilder, TxOpts};

use super::process::{find_binary, free_port, wait_until, ChildGuard};
use super::{dir_bytes, Conn, DeviceCursor, Page, Result, Screen, System};
use crate::procfs::{self, Measured};
use crate::workload::{Outgoing, Setup, Uid};

const OFFLINE_SHARDS: u64 = 16;
const EVENT_TYPE_MSG: u8 = 1;
/// Bytes of one sync event row as returned: sync_seq, type, conv_id, seq.
const EVENT_ROW_BYTES: u64 = 8 + 1 + 8 + 8;
const TX_RETRIES_MAX: u32 = 20;
/// Tries of a whole batch before it is sent one send per transaction.
const BATCH_RETRIES_MAX: u32 = 3;

pub struct MariaDb {
    datadir: PathBuf,
    server_bin: PathBuf,
    server_args: Vec<String>,
    port: u16,
    server: ChildGuard,
    version: String,
    msg_ids: AtomicU64,
    /// Declared last, so dropped last: the server stops (it may still
    /// write its shutdown checkpoint) before its directory is removed.
    dir: tempfile::TempDir,
}

pub fn installed() -> Option<(PathBuf, PathBuf)> {
    let server = find_binary(&["mariadbd", "mysqld"])?;
    let install_db = find_binary(&["mariadb-install-db", "mysql_install_db"])?;
    Some((server, install_db))
}

impl MariaDb {
    pub fn start(
        base: &std::path::Path,
        server_bin: &std::path::Path,
        install_db: &std::path::Path,
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("mariadb-")
            .tempdir_in(base)?;
        let datadir = dir.path().join("data");
        std::fs::create_dir_all(&datadir)?;
        let out = Command::new(install_db)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", datadir.display()))
            .arg("--user=root")
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db")
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "mariadb-install-db failed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            )
            .into());
        }
        let version = Command::new(server_bin)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let port = free_port()?;
        let d = dir.path();
        let server_args: Vec<String> = [
            "--no-defaults".to_string(),
            format!("--datadir={}", datadir.display()),
            format!("--socket={}", d.join("mysqld.sock").display()),
            format!("--pid-file={}", d.join("mysqld.pid").display()),
            format!("--log-error={}", d.join("error.log").display()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--user=root".into(),
            // Private instance: no grant checks, no DNS.
            "--skip-grant-tables".into(),
            "--skip-name-resolve".into(),
            // Durability as inboxd's default: every commit fsynced.
            "--innodb-flush-log-at-trx-commit=1".into(),
            "--skip-log-bin".into(),
            "--sync-binlog=0".into(),
            "--innodb-buffer-pool-size=1G".into(),
            "--innodb-log-file-size=512M".into(),
            "--max-connections=1000".into(),
            "--max-allowed-packet=64M".into(),
        ]
        .into();
        let mut server =
            ChildGuard::spawn("mariadbd", Command::new(server_bin).args(&server_args))?;
        let opts = Self::opts(port, None);
        wait_until(
            "mariadbd",
            Duration::from_secs(60),
            || server.check_alive(),
            || MyConn::new(opts.clone()).map_err(Into::into),
        )?;
        let mut conn = MyConn::new(opts)?;
        conn.query_drop("CREATE DATABASE inbox")?;
        conn.query_drop("USE inbox")?;
        for sql in schema() {
            conn.query_drop(sql)?;
        }
        Ok(Self {
            dir,
            datadir,
            server_bin: server_bin.to_path_buf(),
            server_args,
            port,
            server,
            version,
            msg_ids: AtomicU64::new(1),
        })
    }

    fn opts(port: u16, db: Option<&str>) -> OptsBuilder {
        OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(port)
            .user(Some("root"))
            .db_name(db)
            .stmt_cache_size(Some(64))
    }

    fn conn(&self) -> Result<MyConn> {
        Ok(MyConn::new(Self::opts(self.port, Some("inbox")))?)
    }
}

fn schema() -> Vec<String> {
    let mut sql = vec![
        "CREATE TABLE conv_seq (conv_id BIGINT UNSIGNED NOT NULL PRIMARY KEY, \
         seq BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
            .to_string(),
        "CREATE TABLE msg (conv_id BIGINT UNSIGNED NOT NULL, seq BIGINT UNSIGNED NOT NULL, \
         msg_id BIGINT UNSIGNED NOT NULL, sender BIGINT UNSIGNED NOT NULL, payload BLOB NOT NULL, \
         PRIMARY KEY (conv_id, seq)) ENGINE=InnoDB"
            .to_string(),
        "CREATE TABLE user_seq (uid BIGINT UNSIGNED NOT NULL PRIMARY KEY, \
         seq BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
            .to_string(),
        "CREATE TABLE sync_event (uid BIGINT UNSIGNED NOT NULL, sync_seq BIGINT UNSIGNED NOT NULL, \
         type TINYINT UNSIGNED NOT NULL, conv_id BIGINT UNSIGNED NOT NULL, seq BIGINT UNSIGNED NOT NULL, \
         PRIMARY KEY (uid, sync_seq)) ENGINE=InnoDB"
            .to_string(),
        "CREATE TABLE user_sync_cursor (uid BIGINT UNSIGNED NOT NULL, device_id BIGINT UNSIGNED NOT NULL, \
         acked_sync_seq BIGINT UNSIGNED NOT NULL, PRIMARY KEY (uid, device_id)) ENGINE=InnoDB"
            .to_string(),
    ];
    for shard in 0..OFFLINE_SHARDS {
        sql.push(format!(
            "CREATE TABLE offline_msg_{shard:02} (uid BIGINT UNSIGNED NOT NULL, \
             conv_id BIGINT UNSIGNED NOT NULL, seq BIGINT UNSIGNED NOT NULL, \
             msg_id BIGINT UNSIGNED NOT NULL, PRIMARY KEY (uid, conv_id, seq)) ENGINE=InnoDB"
        ));
    }
    sql
}

impl System for MariaDb {
    fn name(&self) -> &str {
        "mariadb"
    }

    fn connect(&self) -> Result<Box<dyn Conn + '_>> {
        Ok(Box::new(MariaConn {
            conn: self.conn()?,
            msg_ids: &self.msg_ids,
            retries: 0,
        }))
    }

    fn prepare(&self, setup: &Setup) -> Result<()> {
        let mut conn = self.conn()?;
        for chunk in setup.convs.chunks(1000) {
            let mut sql = String::from("INSERT IGNORE INTO conv_seq (conv_id, seq) VALUES ");
            for (i, c) in chunk.iter().enumerate() {
                let _ = write!(sql, "{}({}, 0)", if i == 0 { "" } else { "," }, c.conv);
            }
            conn.query_drop(sql)?;
        }
        let mut users: Vec<u64> = setup
            .convs
            .iter()
            .flat_map(|c| c.members.iter().copied())
            .collect();
        users.extend(setup.devices.iter().map(|d| d.0));
        users.sort_unstable();
        users.dedup();
        for chunk in users.chunks(1000) {
            let mut sql = String::from("INSERT IGNORE INTO user_seq (uid, seq) VALUES ");
            for (i, uid) in chunk.iter().enumerate() {
                let _ = write!(sql, "{}({uid}, 0)", if i == 0 { "" } else { "," });
            }
            conn.query_drop(sql)?;
        }
        Ok(())
    }

    fn crash_and_restart(&mut self) -> Result<Duration> {
        self.server.kill_hard()?;
        let start = std::time::Instant::now();
        self.server = ChildGuard::spawn(
            "mariadbd",
            Command::new(&self.server_bin).args(&self.server_args),
        )?;
        let opts = Self::opts(self.port, Some("inbox"));
        let server = &mut self.server;
        // Serving again means a query on the schema answers, not only a
        // connection (InnoDB finishes its redo apply before that).
        wait_until(
            "mariadbd",
            Duration::from_secs(600),
            || server.check_alive(),
            || {
                let mut conn = MyConn::new(opts.clone())?;
                conn.query_drop("SELECT seq FROM conv_seq LIMIT 1")?;
                Ok(())
            },
        )?;
        Ok(start.elapsed())
    }

    fn measured(&self) -> Option<Measured> {
        procfs::server_pid(
            Some(self.port),
            Some(&self.dir.path().join("mysqld.pid")),
            self.server.pid(),
        )
        .map(Measured::Server)
    }

    fn data_bytes(&self) -> u64 {
        dir_bytes(&self.datadir)
    }

    fn describe(&self) -> String {
        format!(
            "mariadb: {} (innodb_flush_log_at_trx_commit=1, binlog off)",
            self.version
        )
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        self.server.stop(Duration::from_secs(30));
    }
}

struct MariaConn<'a> {
    conn: MyConn,
    msg_ids: &'a AtomicU64,
    retries: u64,
}

fn is_retryable(e: &mysql::Error) -> bool {
    // 1213: deadlock; 1205: lock wait timeout.
    matches!(e, mysql::Error::MySqlError(m) if m.code == 1213 || m.code == 1205)
}

impl MariaConn<'_> {
    /// The sends' statements, in one transaction.
    fn send_tx(&mut self, sends: &[Outgoing<'_>]) -> std::result::Result<(), mysql::Error> {
        let mut tx = self.conn.start_transaction(TxOpts::default())?;
        for send in sends {
            tx.exec_drop(
                "UPDATE conv_seq SET seq = LAST_INSERT_ID(seq + 1) WHERE conv_id = ?",
                (send.conv,),
            )?;
            let seq = match tx.last_insert_id() {
                Some(seq) if seq > 0 => seq,
                _ => tx
                    .query_first::<u64, _>("SELECT LAST_INSERT_ID()")?
                    .unwrap_or(0),
            };
            let msg_id = self.msg_ids.fetch_add(1, Ordering::Relaxed);
            tx.exec_drop(
                "INSERT INTO msg (conv_id, seq, msg_id, sender, payload) VALUES (?, ?, ?, ?, ?)",
                (send.conv, seq, msg_id, send.sender, send.payload),
            )?;
            let mut events =
                String::from("INSERT INTO sync_event (uid, sync_seq, type, conv_id, seq) VALUES ");
            // Recipients are sorted by uid: row locks in one global order.
            for (i, &uid) in send.recipients.iter().enumerate() {
                tx.exec_drop(
                    "UPDATE user_seq SET seq = LAST_INSERT_ID(seq + 1) WHERE uid = ?",
                    (uid,),
                )?;
                let sync_seq = match tx.last_insert_id() {
                    Some(s) if s > 0 => s,
                    _ => tx
                        .query_first::<u64, _>("SELECT LAST_INSERT_ID()")?
                        .unwrap_or(0),
                };
                let _ = write!(
                    events,
                    "{}({uid}, {sync_seq}, {EVENT_TYPE_MSG}, {}, {seq})",
                    if i == 0 { "" } else { "," },
                    send.conv
                );
            }
            tx.query_drop(events)?;
            let mut shards: Vec<String> = vec![String::new(); OFFLINE_SHARDS as usize];
            for &uid in send.recipients.iter().filter(|&&u| u != send.sender) {
                let rows = &mut shards[(uid % OFFLINE_SHARDS) as usize];
                let _ = write!(
                    rows,
                    "{}({uid}, {}, {seq}, {msg_id})",
                    if rows.is_empty() { "" } else { "," },
                    send.conv
                );
            }
            for (shard, rows) in shards.iter().enumerate() {
                if !rows.is_empty() {
                    tx.query_drop(format!(
                        "INSERT INTO offline_msg_{shard:02} (uid, conv_id, seq, msg_id) VALUES {rows}"
                    ))?;
                }
            }
        }
        tx.commit()
    }

    /// The sends in one transaction, retried after a deadlock or lock
    /// timeout at most `retries` times.
    fn send_with_retry(
        &mut self,
        sends: &[Outgoing<'_>],
        retries: u32,
    ) -> std::result::Result<(), mysql::Error> {
        let mut attempt = 0;
        loop {
            match self.send_tx(sends) {
                Ok(()) => return Ok(()),
                Err(e) if is_retryable(&e) && attempt < retries => {
                    attempt += 1;
                    self.retries += 1;
                    // A random pause, so the same transactions do not meet
                    // again in the same order.
                    let pause_ms = rand::random::<u64>() % (u64::from(attempt.min(8)) * 5 + 1);
                    std::thread::sleep(Duration::from_millis(pause_ms));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Conn for MariaConn<'_> {
    fn send(&mut self, send: &Outgoing<'_>) -> Result<()> {
        Ok(self.send_with_retry(std::slice::from_ref(send), TX_RETRIES_MAX)?)
    }

    /// One transaction for the batch. A batch locks the rows of many sends
    /// in send order, so batches of threads whose conversations share users
    /// (a ring) can deadlock in a cycle, and InnoDB keeps picking the same
    /// victim (the one that has written least: the one just retried). After
    /// a few tries the batch goes one send per transaction, whose rows are
    /// locked in one global order and cannot deadlock with each other.
    fn send_batch(&mut self, sends: &[Outgoing<'_>]) -> Result<()> {
        match self.send_with_retry(sends, BATCH_RETRIES_MAX) {
            Ok(()) => Ok(()),
            Err(e) if is_retryable(&e) => {
                for send in sends {
                    self.send_with_retry(std::slice::from_ref(send), TX_RETRIES_MAX)?;
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn sync_page(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<Page> {
        if !device.started {
            device.acked = self
                .conn
                .exec_first::<u64, _, _>(
                    "SELECT acked_sync_seq FROM user_sync_cursor WHERE uid = ? AND device_id = ?",
                    (device.uid, device.device),
                )?
                .unwrap_or(0);
            device.applied = device.acked;
            device.started = true;
        }
        let read_started = std::time::Instant::now();
        let rows: Vec<(u64, u8, u64, u64)> = self.conn.exec(
            "SELECT sync_seq, type, conv_id, seq FROM sync_event \
             WHERE uid = ? AND sync_seq > ? ORDER BY sync_seq LIMIT ?",
            (device.uid, device.applied, limit + 1),
        )?;
        let read = read_started.elapsed();
        let has_more = rows.len() > limit as usize;
        let page = &rows[..rows.len().min(limit as usize)];
        if let Some(last) = page.last() {
            device.applied = last.0;
            if device.ack_due(has_more) {
                // Autocommit: durable before the reply.
                self.conn.exec_drop(
                    "INSERT INTO user_sync_cursor (uid, device_id, acked_sync_seq) VALUES (?, ?, ?) \
                     ON DUPLICATE KEY UPDATE acked_sync_seq = GREATEST(acked_sync_seq, VALUES(acked_sync_seq))",
                    (device.uid, device.device, last.0),
                )?;
                device.acked = last.0;
            }
        }
        Ok(Page {
            events: u32::try_from(page.len()).unwrap_or(u32::MAX),
            bytes: page.len() as u64 * EVENT_ROW_BYTES,
            has_more,
            read,
        })
    }

    /// The seeds' schema has no conversation table: the list is the user's
    /// offline inbox grouped by conversation (unread = offline count), then
    /// the newest messages of each conversation from `msg`.
    fn first_screen(&mut self, uid: Uid, per_conv: u32) -> Result<Screen> {
        let shard = uid % OFFLINE_SHARDS;
        let convs: Vec<(u64, u64, u64)> = self.conn.exec(
            format!(
                "SELECT conv_id, MAX(seq), COUNT(*) FROM offline_msg_{shard:02} \
                 WHERE uid = ? GROUP BY conv_id ORDER BY MAX(seq) DESC"
            ),
            (uid,),
        )?;
        let mut screen = Screen {
            convs: u32::try_from(convs.len()).unwrap_or(u32::MAX),
            bytes: convs.len() as u64 * 24,
            ..Screen::default()
        };
        for (conv, _, _) in &convs {
            let messages: Vec<(u64, u64, u64, Vec<u8>)> = self.conn.exec(
                "SELECT seq, msg_id, sender, payload FROM msg WHERE conv_id = ? ORDER BY seq DESC LIMIT ?",
                (conv, per_conv),
            )?;
            screen.messages += u32::try_from(messages.len()).unwrap_or(u32::MAX);
            screen.bytes += messages.iter().map(|m| 24 + m.3.len() as u64).sum::<u64>();
        }
        Ok(screen)
    }
}
