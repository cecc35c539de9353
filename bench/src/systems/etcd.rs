//! etcd as a replicated inbox: `members` etcd 3.4 members on loopback, one
//! raft group, the baseline of `--cluster N` beside inboxd's group.
//!
//! Durability is etcd's default: a member fsyncs its WAL before it
//! acknowledges an append, and the leader replies once a quorum has. The
//! harness's connections all go to the leader (as they do for inboxd's
//! group), each on its own gRPC channel.
//!
//! Keys (numbers are 16 lowercase hex digits, so key order is number order):
//! - `c/{conv}`: the conversation's counter; its value is the last seq
//!   given out (decimal);
//! - `m/{conv}/{seq}`: the message, `sender (8 bytes BE) | payload`;
//! - `u/{uid}`: the user's counter; its value is the last sync seq;
//! - `e/{uid}/{seq}`: the user's sync event, `conv | message seq` (8 bytes
//!   BE each);
//! - `d/{uid}/{device}`: the device's last ACKed seq (decimal).
//!
//! A send is one transaction, allocating every seq it needs as a fair
//! client of etcd does (optimistic concurrency, as etcd's own STM): it
//! compares each counter it bumps (the conversation's and each
//! recipient's) with the value it last saw, and on success puts the
//! counters' next values, the message key and one event key per recipient
//! at that recipient's next seq. The harness keeps the counters it last saw
//! in one table shared by every connection, so a transaction usually
//! succeeds at the first try (one round trip per send); when another send
//! got there first, the failure branch of the same transaction returns
//! the counters' current values, and the send tries again with them. A
//! user's events therefore have gapless seqs in commit order, as inboxd's
//! do, and a sync never misses one that commits late. Batched sends (the
//! preload of a backlog) allocate several seqs per counter in one
//! transaction.
//!
//! Sync is one linearizable range read of `[e/{uid}/{applied + 1},
//! e/{uid}0)` limited to a page (etcd's `more` says whether more follow);
//! the ACK puts `d/{uid}/{device}`, a write through the log like a send.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, StatusResponse, Txn, TxnOp, TxnOpResponse,
};

use super::process::{find_binary, wait_until, ChildGuard};
use super::{dir_bytes, Conn, DeviceCursor, MemberPid, Page, Result, System};
use crate::procfs::{self, Measured};
use crate::workload::{Outgoing, Setup};

/// A send that lost this many races in a row to other sends ends the run:
/// the counters it compares cannot be that contended in any scenario.
const ATTEMPTS_MAX: u32 = 1_000;
/// Sends of a batch committed in one transaction: a transaction holds at
/// most `--max-txn-ops` operations and `--max-request-bytes` bytes.
const BATCH_SENDS_MAX: usize = 64;
/// The members' transaction limits, above the defaults (128 operations,
/// 1.5 MiB) so that a send to a group of hundreds fits in one transaction.
const MAX_TXN_OPS: u32 = 20_000;
const MAX_REQUEST_BYTES: u32 = 8 << 20;
/// How long a group may take to elect its first leader.
const START_DEADLINE: Duration = Duration::from_secs(60);

pub fn installed() -> Option<PathBuf> {
    find_binary(&["etcd"])
}

struct Member {
    name: String,
    client_port: u16,
    server: ChildGuard,
}

impl Member {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

pub struct EtcdGroup {
    name: String,
    version: String,
    members: Vec<Member>,
    leader: usize,
    /// The last value seen of each counter key; absent means 0.
    counters: Mutex<HashMap<Vec<u8>, u64>>,
    /// Transactions whose compares failed, tried again.
    conflicts: AtomicU64,
    /// Declared last, so dropped last: the members stop before their
    /// directories go.
    dir: tempfile::TempDir,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// The key of a number under `prefix`: 16 hex digits, so that key order is
/// number order.
fn numbered(prefix: &str, n: u64) -> Vec<u8> {
    format!("{prefix}/{n:016x}").into_bytes()
}

fn event_key(uid: u64, seq: u64) -> Vec<u8> {
    format!("e/{uid:016x}/{seq:016x}").into_bytes()
}

/// The first key after every event key of `uid`: `/` + 1 is `0`.
fn events_end(uid: u64) -> Vec<u8> {
    format!("e/{uid:016x}0").into_bytes()
}

/// The seq an event key ends with.
fn event_seq(key: &[u8]) -> Result<u64> {
    let text = std::str::from_utf8(key)?;
    let hex = text
        .rsplit('/')
        .next()
        .ok_or_else(|| format!("not an event key: {text:?}"))?;
    Ok(u64::from_str_radix(hex, 16).map_err(|e| format!("event key {text:?}: {e}"))?)
}

fn counter_value(value: &[u8]) -> Result<u64> {
    let text = std::str::from_utf8(value)?;
    Ok(text
        .parse()
        .map_err(|e| format!("counter value {text:?}: {e}"))?)
}

/// One transaction's writes, planned from the counters' values last seen.
struct Planned {
    /// Hold only if no other send moved the counters since.
    compares: Vec<Compare>,
    puts: Vec<TxnOp>,
    /// Each counter bumped and its new value, in the order first bumped.
    next: Vec<(Vec<u8>, u64)>,
}

/// The transaction that commits `sends`, from the counters' values `seen`.
fn plan_sends(sends: &[Outgoing<'_>], seen: &HashMap<Vec<u8>, u64>) -> Planned {
    // Each counter's value as the sends of this transaction move it, in
    // the order first bumped.
    let mut next: Vec<(Vec<u8>, u64)> = Vec::new();
    let mut bump = |key: Vec<u8>| -> u64 {
        if let Some((_, n)) = next.iter_mut().find(|(k, _)| *k == key) {
            *n += 1;
            return *n;
        }
        let n = seen.get(&key).copied().unwrap_or(0) + 1;
        next.push((key, n));
        n
    };
    let mut puts = Vec::new();
    for send in sends {
        let conv_seq = bump(numbered("c", send.conv));
        let mut body = Vec::with_capacity(8 + send.payload.len());
        body.extend_from_slice(&send.sender.to_be_bytes());
        body.extend_from_slice(send.payload);
        puts.push(TxnOp::put(
            format!("m/{:016x}/{conv_seq:016x}", send.conv),
            body,
            None,
        ));
        let mut event = Vec::with_capacity(16);
        event.extend_from_slice(&send.conv.to_be_bytes());
        event.extend_from_slice(&conv_seq.to_be_bytes());
        let mut recipients = send.recipients.to_vec();
        recipients.sort_unstable();
        recipients.dedup();
        for uid in recipients {
            let seq = bump(numbered("u", uid));
            puts.push(TxnOp::put(event_key(uid, seq), event.clone(), None));
        }
    }
    let compares = next
        .iter()
        .map(|(key, _)| match seen.get(key).copied().unwrap_or(0) {
            // A counter never written has version 0.
            0 => Compare::version(key.clone(), CompareOp::Equal, 0),
            n => Compare::value(key.clone(), CompareOp::Equal, n.to_string()),
        })
        .collect();
    puts.extend(
        next.iter()
            .map(|(key, n)| TxnOp::put(key.clone(), n.to_string(), None)),
    );
    Planned {
        compares,
        puts,
        next,
    }
}

impl EtcdGroup {
    /// Starts `size` members on fresh directories under `base` and waits
    /// until the group has a leader that serves a linearizable read.
    pub fn start(base: &Path, binary: &Path, size: usize) -> Result<Self> {
        if size == 0 {
            return Err("a group needs at least one member".into());
        }
        let dir = tempfile::Builder::new().prefix("etcd-").tempdir_in(base)?;
        let ports = super::group::free_ports(2 * size)?;
        let peer_url = |i: usize| format!("http://127.0.0.1:{}", ports[size + i]);
        let cluster = (0..size)
            .map(|i| format!("m{}={}", i + 1, peer_url(i)))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("bench-{:016x}", rand::random::<u64>());
        let version = Command::new(binary)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .map(|l| l.trim().to_string())
            })
            .unwrap_or_default();
        let mut members = Vec::with_capacity(size);
        for (i, &client_port) in ports[..size].iter().enumerate() {
            let name = format!("m{}", i + 1);
            let data = dir.path().join(&name);
            let client_url = format!("http://127.0.0.1:{client_port}");
            let server = ChildGuard::spawn(
                "etcd",
                Command::new(binary)
                    .arg("--name")
                    .arg(&name)
                    .arg("--data-dir")
                    .arg(&data)
                    .arg("--listen-client-urls")
                    .arg(&client_url)
                    .arg("--advertise-client-urls")
                    .arg(&client_url)
                    .arg("--listen-peer-urls")
                    .arg(peer_url(i))
                    .arg("--initial-advertise-peer-urls")
                    .arg(peer_url(i))
                    .arg("--initial-cluster")
                    .arg(&cluster)
                    .args(["--initial-cluster-state", "new"])
                    .arg("--initial-cluster-token")
                    .arg(&token)
                    .arg("--max-txn-ops")
                    .arg(MAX_TXN_OPS.to_string())
                    .arg("--max-request-bytes")
                    .arg(MAX_REQUEST_BYTES.to_string())
                    // The backend's 2 GiB default would fill in a long run.
                    .args(["--quota-backend-bytes", "8589934592"])
                    .args(["--logger", "zap", "--log-level", "warn"]),
            )?;
            members.push(Member {
                name,
                client_port,
                server,
            });
        }
        let mut group = Self {
            name: format!("etcd-group{size}"),
            version,
            members,
            leader: 0,
            counters: Mutex::new(HashMap::new()),
            conflicts: AtomicU64::new(0),
            dir,
        };
        group.find_leader()?;
        Ok(group)
    }

    /// Asks every member for its status until one says it leads and serves
    /// a linearizable read.
    fn find_leader(&mut self) -> Result<()> {
        let rt = runtime()?;
        let endpoints: Vec<String> = self.members.iter().map(Member::endpoint).collect();
        let members = &mut self.members;
        let (leader, _) = wait_until(
            "etcd group",
            START_DEADLINE,
            || members.iter_mut().try_for_each(|m| m.server.check_alive()),
            || {
                rt.block_on(async {
                    for (i, endpoint) in endpoints.iter().enumerate() {
                        let Ok(mut client) = Client::connect([endpoint], None).await else {
                            continue;
                        };
                        let Ok(status) = client.status().await else {
                            continue;
                        };
                        let me = status.header().map(|h| h.member_id());
                        if me == Some(status.leader()) {
                            client.get("ready-probe", None).await?;
                            return Ok(i);
                        }
                    }
                    Err::<usize, super::Error>("no leader yet".into())
                })
            },
        )?;
        self.leader = leader;
        Ok(())
    }

    fn status(&self, member: &Member) -> Option<StatusResponse> {
        let rt = runtime().ok()?;
        rt.block_on(async {
            let mut client = Client::connect([member.endpoint()], None).await.ok()?;
            client.status().await.ok()
        })
    }

    /// The text of the leader's metrics endpoint (`/metrics` on its client
    /// port), if it answers.
    fn scrape(&self) -> Option<String> {
        use std::io::{Read, Write};
        let member = &self.members[self.leader];
        let timeout = Duration::from_secs(5);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], member.client_port));
        let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
        s.set_read_timeout(Some(timeout)).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        Some(text)
    }
}

struct EtcdConn<'a> {
    rt: tokio::runtime::Runtime,
    client: Client,
    group: &'a EtcdGroup,
}

impl EtcdConn<'_> {
    /// Commits `sends` in one transaction, trying again with the counters'
    /// current values each time another send moved one first.
    fn commit(&mut self, sends: &[Outgoing<'_>]) -> Result<()> {
        for _ in 0..ATTEMPTS_MAX {
            let Planned {
                compares,
                puts,
                next,
            } = {
                let seen = self
                    .group
                    .counters
                    .lock()
                    .map_err(|_| "counter table poisoned")?;
                plan_sends(sends, &seen)
            };
            let reads: Vec<TxnOp> = next
                .iter()
                .map(|(key, _)| TxnOp::get(key.clone(), None))
                .collect();
            let txn = Txn::new().when(compares).and_then(puts).or_else(reads);
            let response = self.rt.block_on(self.client.txn(txn))?;
            let mut seen = self
                .group
                .counters
                .lock()
                .map_err(|_| "counter table poisoned")?;
            if response.succeeded() {
                for (key, n) in next {
                    let known = seen.entry(key).or_insert(0);
                    *known = (*known).max(n);
                }
                return Ok(());
            }
            // Lost a race: learn the counters' current values.
            self.group.conflicts.fetch_add(1, Ordering::Relaxed);
            for ((key, _), op) in next.into_iter().zip(response.op_responses()) {
                let TxnOpResponse::Get(got) = op else {
                    return Err("etcd answered a read with another operation".into());
                };
                let now = match got.kvs().first() {
                    Some(kv) => counter_value(kv.value())?,
                    None => 0,
                };
                let known = seen.entry(key).or_insert(0);
                *known = (*known).max(now);
            }
        }
        Err(format!("a send lost {ATTEMPTS_MAX} races for its counters in a row").into())
    }
}

impl Conn for EtcdConn<'_> {
    fn send(&mut self, send: &Outgoing<'_>) -> Result<()> {
        self.commit(std::slice::from_ref(send))
    }

    fn send_batch(&mut self, sends: &[Outgoing<'_>]) -> Result<()> {
        for chunk in sends.chunks(BATCH_SENDS_MAX) {
            self.commit(chunk)?;
        }
        Ok(())
    }

    fn sync_page(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<Page> {
        let cursor_key = format!("d/{:016x}/{:016x}", device.uid, device.device);
        if !device.started {
            let got = self
                .rt
                .block_on(self.client.get(cursor_key.clone(), None))?;
            let acked = match got.kvs().first() {
                Some(kv) => counter_value(kv.value())?,
                None => 0,
            };
            device.acked = acked;
            device.applied = acked;
            device.started = true;
        }
        let read_started = std::time::Instant::now();
        let options = GetOptions::new()
            .with_range(events_end(device.uid))
            .with_limit(i64::from(limit));
        let page = self.rt.block_on(
            self.client
                .get(event_key(device.uid, device.applied + 1), Some(options)),
        )?;
        let read = read_started.elapsed();
        let kvs = page.kvs();
        let bytes = kvs
            .iter()
            .map(|kv| kv.key().len() + kv.value().len())
            .sum::<usize>() as u64;
        let has_more = page.more();
        if let Some(last) = kvs.last() {
            let seq = event_seq(last.key())?;
            device.applied = seq;
            if device.ack_due(has_more) {
                self.rt
                    .block_on(self.client.put(cursor_key, seq.to_string(), None))?;
                device.acked = seq;
            }
        }
        Ok(Page {
            events: u32::try_from(kvs.len()).unwrap_or(u32::MAX),
            bytes,
            has_more,
            read,
        })
    }
}

impl System for EtcdGroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn connect(&self) -> Result<Box<dyn Conn + '_>> {
        let rt = runtime()?;
        let endpoint = self.members[self.leader].endpoint();
        let client = rt.block_on(Client::connect([endpoint], None))?;
        Ok(Box::new(EtcdConn {
            rt,
            client,
            group: self,
        }))
    }

    fn prepare(&self, _setup: &Setup) -> Result<()> {
        // Counters are created by their first write; membership is not
        // kept (a send names its recipients, as in the Redis layout).
        Ok(())
    }

    /// The leader's WAL: `etcd_disk_wal_fsync_duration_seconds` counts
    /// every fsync of it (one per batch of raft entries made durable).
    fn write_counters(&self) -> Option<super::WriteCounters> {
        let text = self.scrape()?;
        let value = |name: &str| -> Option<f64> {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        };
        let fsyncs = value("etcd_disk_wal_fsync_duration_seconds_count")?;
        let seconds = value("etcd_disk_wal_fsync_duration_seconds_sum")?;
        Some(super::WriteCounters {
            write_batches: fsyncs as u64,
            fsyncs: fsyncs as u64,
            fsync_latency_us_sum: (seconds * 1e6) as u64,
        })
    }

    fn measured(&self) -> Option<Measured> {
        let member = &self.members[self.leader];
        procfs::server_pid(Some(member.client_port), None, member.server.pid())
            .map(Measured::Server)
    }

    fn member_pids(&self) -> Vec<MemberPid> {
        self.members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                Some(MemberPid {
                    member: u32::try_from(i + 1).ok()?,
                    leader: i == self.leader,
                    pid: m.server.pid()?,
                })
            })
            .collect()
    }

    fn conflicts(&self) -> Option<u64> {
        Some(self.conflicts.load(Ordering::Relaxed))
    }

    /// The highest raft term any member reports.
    fn term(&self) -> Option<u64> {
        self.members
            .iter()
            .filter_map(|m| self.status(m).map(|s| s.raft_term()))
            .max()
    }

    fn data_bytes(&self) -> u64 {
        dir_bytes(
            self.dir
                .path()
                .join(&self.members[self.leader].name)
                .as_path(),
        )
    }

    fn describe(&self) -> String {
        format!(
            "{} ({} members on loopback, each fsyncing its own WAL before it acknowledges; figures from the leader): {}, --max-txn-ops {MAX_TXN_OPS}",
            self.name,
            self.members.len(),
            self.version
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send<'a>(conv: u64, recipients: &'a [u64]) -> Outgoing<'a> {
        Outgoing {
            conv,
            sender: recipients[0],
            recipients,
            payload: b"hi",
            client_msg_id: 0,
        }
    }

    #[test]
    fn event_keys_sort_by_seq_and_stay_below_the_users_end() {
        let keys: Vec<Vec<u8>> = [1u64, 2, 9, 10, 255, 256, u64::MAX - 1]
            .iter()
            .map(|&s| event_key(7, s))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(sorted, keys);
        assert!(keys.iter().all(|k| *k < events_end(7)));
        assert!(events_end(7) <= event_key(8, 0));
        assert_eq!(event_seq(&event_key(7, 0x1234)).unwrap(), 0x1234);
        assert!(event_seq(b"e/0000000000000007/zz").is_err());
    }

    #[test]
    fn a_send_compares_every_counter_it_bumps_and_puts_each_event_at_the_next_seq() {
        let mut seen = HashMap::new();
        seen.insert(numbered("u", 2), 41);
        let Planned {
            compares,
            puts,
            next,
        } = plan_sends(&[send(5, &[1, 2, 2])], &seen);
        assert_eq!(
            next,
            vec![
                (numbered("c", 5), 1),
                (numbered("u", 1), 1),
                (numbered("u", 2), 42),
            ],
            "a recipient named twice gets one event"
        );
        assert_eq!(compares.len(), 3);
        // The message, two events, three counters.
        assert_eq!(puts.len(), 6);
    }

    #[test]
    fn a_batch_gives_one_user_consecutive_seqs_and_bumps_its_counter_once() {
        let seen = HashMap::new();
        let sends = [send(5, &[1, 2]), send(6, &[1, 3]), send(5, &[2, 1])];
        let Planned {
            compares,
            puts,
            next,
        } = plan_sends(&sends, &seen);
        let value = |key: Vec<u8>| next.iter().find(|(k, _)| *k == key).map(|(_, n)| *n);
        assert_eq!(value(numbered("u", 1)), Some(3));
        assert_eq!(value(numbered("u", 2)), Some(2));
        assert_eq!(value(numbered("u", 3)), Some(1));
        assert_eq!(value(numbered("c", 5)), Some(2));
        assert_eq!(value(numbered("c", 6)), Some(1));
        assert_eq!(compares.len(), next.len(), "one compare per counter");
        // Three messages, six events, five counters.
        assert_eq!(puts.len(), 3 + 6 + 5);
    }
}
