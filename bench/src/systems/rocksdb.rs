//! RocksDB, embedded, with the same key layout as the inbox:
//!
//! | key | value |
//! |---|---|
//! | `m` conv seq | msg_id, sender, payload (each message once) |
//! | `o` uid conv seq | msg_id (the offline inbox) |
//! | `e` uid sync_seq | type, conv, seq, msg_id (the user's sync stream) |
//! | `c` uid device | acked_sync_seq |
//!
//! Integers are big-endian so keys sort numerically. A send is one
//! `WriteBatch` written with `sync = true`; RocksDB's write group merges
//! the batches of concurrent writers into one WAL write and one fsync (the
//! same group commit inboxd has). An embedded LSM has no atomic counter, so
//! seqs are allocated in memory under a lock, as an application would.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rocksdb::{Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB};

use super::{dir_bytes, Conn, DeviceCursor, Page, Result, Screen, System};
use crate::procfs::Measured;
use crate::workload::{Outgoing, Setup, Uid};

const EVENT_TYPE_MSG: u8 = 1;

pub struct RocksDb {
    db: DB,
    counters: Mutex<Counters>,
    msg_ids: AtomicU64,
    /// Declared last, so dropped last: the database closes before its
    /// directory is removed.
    dir: tempfile::TempDir,
}

#[derive(Default)]
struct Counters {
    conv_seq: HashMap<u64, u64>,
    user_seq: HashMap<u64, u64>,
}

fn key(tag: u8, parts: &[u64]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + 8 * parts.len());
    k.push(tag);
    for p in parts {
        k.extend_from_slice(&p.to_be_bytes());
    }
    k
}

impl RocksDb {
    pub fn open(base: &Path) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("rocksdb-")
            .tempdir_in(base)?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.increase_parallelism(2);
        opts.set_write_buffer_size(64 << 20);
        let db = DB::open(&opts, dir.path())?;
        Ok(Self {
            dir,
            db,
            counters: Mutex::new(Counters::default()),
            msg_ids: AtomicU64::new(1),
        })
    }

    fn batch_for(&self, sends: &[Outgoing<'_>]) -> WriteBatch {
        let mut batch = WriteBatch::default();
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        for send in sends {
            let seq = {
                let c = counters.conv_seq.entry(send.conv).or_default();
                *c += 1;
                *c
            };
            let msg_id = self.msg_ids.fetch_add(1, Ordering::Relaxed);
            let mut value = Vec::with_capacity(16 + send.payload.len());
            value.extend_from_slice(&msg_id.to_be_bytes());
            value.extend_from_slice(&send.sender.to_be_bytes());
            value.extend_from_slice(send.payload);
            batch.put(key(b'm', &[send.conv, seq]), value);
            for &uid in send.recipients {
                let sync_seq = {
                    let c = counters.user_seq.entry(uid).or_default();
                    *c += 1;
                    *c
                };
                let mut event = Vec::with_capacity(25);
                event.push(EVENT_TYPE_MSG);
                event.extend_from_slice(&send.conv.to_be_bytes());
                event.extend_from_slice(&seq.to_be_bytes());
                event.extend_from_slice(&msg_id.to_be_bytes());
                batch.put(key(b'e', &[uid, sync_seq]), event);
                if uid != send.sender {
                    batch.put(key(b'o', &[uid, send.conv, seq]), msg_id.to_be_bytes());
                }
            }
        }
        batch
    }
}

impl System for RocksDb {
    fn name(&self) -> &str {
        "rocksdb"
    }

    fn connect(&self) -> Result<Box<dyn Conn + '_>> {
        let mut sync = WriteOptions::default();
        sync.set_sync(true);
        Ok(Box::new(RocksConn { db: self, sync }))
    }

    fn prepare(&self, _setup: &Setup) -> Result<()> {
        Ok(())
    }

    /// Embedded: its work is done by the harness's threads.
    fn measured(&self) -> Option<Measured> {
        Some(Measured::Harness)
    }

    fn data_bytes(&self) -> u64 {
        dir_bytes(self.dir.path())
    }

    fn describe(&self) -> String {
        "rocksdb: embedded, WAL synced per write batch (group commit across writers)".into()
    }
}

struct RocksConn<'a> {
    db: &'a RocksDb,
    sync: WriteOptions,
}

impl Conn for RocksConn<'_> {
    fn send(&mut self, send: &Outgoing<'_>) -> Result<()> {
        let batch = self.db.batch_for(std::slice::from_ref(send));
        self.db.db.write_opt(batch, &self.sync)?;
        Ok(())
    }

    fn send_batch(&mut self, sends: &[Outgoing<'_>]) -> Result<()> {
        let batch = self.db.batch_for(sends);
        self.db.db.write_opt(batch, &self.sync)?;
        Ok(())
    }

    fn sync_page(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<Page> {
        let cursor_key = key(b'c', &[device.uid, device.device]);
        if !device.started {
            device.acked = match self.db.db.get(&cursor_key)? {
                Some(v) => {
                    u64::from_be_bytes(v.as_slice().try_into().map_err(|_| "bad cursor value")?)
                }
                None => 0,
            };
            device.applied = device.acked;
            device.started = true;
        }
        let read_started = std::time::Instant::now();
        let prefix = key(b'e', &[device.uid]);
        let from = key(b'e', &[device.uid, device.applied + 1]);
        let mut events = 0u32;
        let mut bytes = 0u64;
        let mut last = None;
        let mut has_more = false;
        for item in self
            .db
            .db
            .iterator(IteratorMode::From(&from, Direction::Forward))
        {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            if events == limit {
                has_more = true;
                break;
            }
            let seq_bytes: [u8; 8] = k[9..17].try_into().map_err(|_| "bad event key")?;
            last = Some(u64::from_be_bytes(seq_bytes));
            events += 1;
            bytes += 8 + v.len() as u64;
        }
        let read = read_started.elapsed();
        if let Some(last) = last {
            device.applied = last;
            if device.ack_due(has_more) {
                self.db
                    .db
                    .put_opt(&cursor_key, last.to_be_bytes(), &self.sync)?;
                device.acked = last;
            }
        }
        Ok(Page {
            events,
            bytes,
            has_more,
            read,
        })
    }

    /// No conversation index in this layout either: the list is a scan of
    /// the user's offline keys, then a reverse scan per conversation.
    fn first_screen(&mut self, uid: Uid, per_conv: u32) -> Result<Screen> {
        let prefix = key(b'o', &[uid]);
        let mut convs: Vec<(u64, u64)> = Vec::new();
        for item in self
            .db
            .db
            .iterator(IteratorMode::From(&prefix, Direction::Forward))
        {
            let (k, _) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            let conv = u64::from_be_bytes(k[9..17].try_into().map_err(|_| "bad offline key")?);
            let seq = u64::from_be_bytes(k[17..25].try_into().map_err(|_| "bad offline key")?);
            match convs.last_mut() {
                Some((c, max)) if *c == conv => *max = (*max).max(seq),
                _ => convs.push((conv, seq)),
            }
        }
        let mut screen = Screen {
            convs: u32::try_from(convs.len()).unwrap_or(u32::MAX),
            bytes: convs.len() as u64 * 24,
            ..Screen::default()
        };
        for (conv, max) in convs {
            let conv_prefix = key(b'm', &[conv]);
            let from = key(b'm', &[conv, max]);
            let newest = self
                .db
                .db
                .iterator(IteratorMode::From(&from, Direction::Reverse));
            for item in newest.take(per_conv as usize) {
                let (k, v) = item?;
                if !k.starts_with(&conv_prefix) {
                    break;
                }
                screen.messages += 1;
                screen.bytes += 8 + v.len() as u64;
            }
        }
        Ok(screen)
    }
}
