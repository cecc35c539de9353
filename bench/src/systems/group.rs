//! A replicated inboxd group: `members` `inboxd serve` processes on
//! loopback, each with its own data directory, client port and raft port,
//! forming one raft group. The harness's connections all go to the leader,
//! as a service's would once `NOT_LEADER` has redirected them, so every
//! scenario measures what a client of the group sees. CPU and memory are
//! the leader's.
//!
//! [`Group::fail_over`] kills the leader with SIGKILL and times how long
//! the group takes to serve a write and a read again; the killed member is
//! then restarted on its data and rejoins as a follower.

use std::path::Path;
use std::time::{Duration, Instant};

use inbox_server::client::{Client, ClientError, GroupClient};
use inbox_wire::{Empty, ErrorCode, Request, Response, UserDevice, UserReq};

use super::inboxd::Inboxd;
use super::{Conn, DeviceCursor, Page, Result, Setup, System};
use crate::procfs::Measured;
use crate::workload::Outgoing;

/// How long a group may take to elect its first leader, or a new one.
const ELECTION_DEADLINE: Duration = Duration::from_secs(60);
/// The uid whose devices the fail-over probes write and read: outside
/// every workload's population.
const PROBE_UID: u64 = u64::MAX / 2;

pub struct Group {
    name: String,
    members: Vec<Inboxd>,
    leader: usize,
    probes: u64,
}

/// Loopback ports free a moment ago (the group's members name each other
/// by port, so they are chosen before any starts).
pub(crate) fn free_ports(n: usize) -> Result<Vec<u16>> {
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(held
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<_>>>()?)
}

/// Whether a call was served: `NOT_LEADER`, `UNAVAILABLE` (a group
/// between leaders) and a dead connection are "not here"; any other error
/// ends the run.
fn served<T>(result: std::result::Result<T, ClientError>) -> Result<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(ClientError::Io(_) | ClientError::Closed(_)) => Ok(false),
        Err(e)
            if matches!(
                e.code(),
                Some(ErrorCode::NotLeader | ErrorCode::Unavailable)
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether `member` serves a write and then a read: only a leader does.
async fn serves(member: &Inboxd, device: u64) -> Result<bool> {
    let Ok(client) = Client::connect(member.addr, member.token().to_string()).await else {
        return Ok(false);
    };
    let write = client
        .register_device(UserDevice {
            uid: PROBE_UID,
            device,
        })
        .await;
    if !served(write)? {
        return Ok(false);
    }
    served(client.devices(UserReq { uid: PROBE_UID }).await)
}

impl Group {
    /// Starts a group of `size` members on fresh data directories under
    /// `base` and waits for its first leader.
    pub fn start(base: &Path, explicit: Option<&Path>, size: usize) -> Result<Self> {
        if size == 0 {
            return Err("a group needs at least one member".into());
        }
        let ports = free_ports(2 * size)?;
        let client = |i: usize| format!("127.0.0.1:{}", ports[i]);
        let raft = |i: usize| format!("127.0.0.1:{}", ports[size + i]);
        let peers = (0..size)
            .map(|i| format!("{}={}/{}", i + 1, raft(i), client(i)))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("bench-{:016x}", rand::random::<u64>());
        let mut members = Vec::with_capacity(size);
        for i in 0..size {
            let id = (i + 1).to_string();
            let raft = raft(i);
            let args = [
                "--node-id",
                id.as_str(),
                "--raft-listen",
                raft.as_str(),
                "--peers",
                peers.as_str(),
            ];
            members.push(Inboxd::start_node(
                base,
                explicit,
                &client(i),
                &args,
                Some(&token),
            )?);
        }
        let mut group = Self {
            name: format!("inboxd-group{size}"),
            members,
            leader: 0,
            probes: 0,
        };
        group.await_leader(None)?;
        Ok(group)
    }

    fn leader(&self) -> &Inboxd {
        &self.members[self.leader]
    }

    /// Asks each member, skipping `down`, for a write and then a read
    /// until one serves both: it is the leader. Returns how long that took.
    fn await_leader(&mut self, down: Option<usize>) -> Result<Duration> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let start = Instant::now();
        loop {
            for (i, member) in self.members.iter().enumerate() {
                if Some(i) == down {
                    continue;
                }
                self.probes += 1;
                if rt.block_on(serves(member, self.probes))? {
                    self.leader = i;
                    return Ok(start.elapsed());
                }
            }
            if start.elapsed() > ELECTION_DEADLINE {
                return Err(format!("{}: no leader after {ELECTION_DEADLINE:?}", self.name).into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the leader with SIGKILL and times how long the group takes
    /// to serve a write and then a read on another member. The killed
    /// member is then restarted on its data, and has rejoined as a
    /// follower, before this returns.
    pub fn fail_over(&mut self) -> Result<Duration> {
        let killed = self.leader;
        self.members[killed].kill_hard()?;
        let took = self.await_leader(Some(killed))?;
        self.members[killed].respawn()?;
        self.await_follower(killed)?;
        Ok(took)
    }

    /// Waits until member `i` is back in the group and has caught up: the
    /// leader reports every member holding its whole log. A kill before
    /// that would time an election between members whose logs differ,
    /// which raft slows down on purpose.
    fn await_follower(&self, i: usize) -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let leader = self.leader();
        let start = Instant::now();
        loop {
            let caught_up = rt.block_on(async {
                let admin = super::inboxd::admin_token(leader.token());
                let client = Client::connect(leader.addr, admin).await.ok()?;
                let status = client.cluster_status(Empty {}).await.ok()?;
                Some(
                    status.role == "leader"
                        && status
                            .members
                            .iter()
                            .all(|m| m.matched_index == Some(status.last_log_index)),
                )
            });
            if caught_up == Some(true) {
                return Ok(());
            }
            if start.elapsed() > ELECTION_DEADLINE {
                return Err(format!(
                    "{}: member {} did not catch up within {ELECTION_DEADLINE:?}",
                    self.name,
                    i + 1
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }
}

struct GroupConn {
    rt: tokio::runtime::Runtime,
    client: GroupClient,
}

impl Conn for GroupConn {
    fn send(&mut self, send: &Outgoing<'_>) -> Result<()> {
        let request = Request::Send(super::inboxd::send_req(send));
        match self.rt.block_on(self.client.call(request))? {
            Response::Send(_) => Ok(()),
            other => Err(format!("SEND answered {other:?}").into()),
        }
    }

    /// On the member the group client talks to now: the leader, unless
    /// the leadership moved (the sync phase kills no one).
    fn sync_page(&mut self, device: &mut DeviceCursor, limit: u32) -> Result<Page> {
        self.rt.block_on(async {
            let client = self.client.client().await;
            super::inboxd::sync_page_on(&client, device, limit).await
        })
    }
}

impl System for Group {
    fn name(&self) -> &str {
        &self.name
    }

    /// A group client starting at the leader: if the leadership moves
    /// during a run, its requests follow it, as a service's would.
    fn connect(&self) -> Result<Box<dyn Conn + '_>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let leader = self.leader().addr;
        let mut order = vec![leader];
        order.extend(self.members.iter().map(|m| m.addr).filter(|a| *a != leader));
        let client = rt.block_on(GroupClient::connect_members(
            &order,
            self.leader().token().to_string(),
            None,
        ))?;
        Ok(Box::new(GroupConn { rt, client }))
    }

    fn prepare(&self, setup: &Setup) -> Result<()> {
        self.leader().prepare(setup)
    }

    fn write_counters(&self) -> Option<super::WriteCounters> {
        self.leader().write_counters()
    }

    fn measured(&self) -> Option<Measured> {
        self.leader().measured()
    }

    fn member_pids(&self) -> Vec<super::MemberPid> {
        self.members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                Some(super::MemberPid {
                    member: u32::try_from(i + 1).ok()?,
                    leader: i == self.leader,
                    pid: m.measured()?.pid(),
                })
            })
            .collect()
    }

    /// The highest term a live member reports in `CLUSTER_STATUS`.
    fn term(&self) -> Option<u64> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        self.members
            .iter()
            .filter_map(|member| {
                rt.block_on(async {
                    let admin = super::inboxd::admin_token(member.token());
                    let client = Client::connect(member.addr, admin).await.ok()?;
                    client.cluster_status(Empty {}).await.ok().map(|s| s.term)
                })
            })
            .max()
    }

    fn commit_path(&self) -> Option<super::CommitPath> {
        let value = |text: &str, name: &str| -> f64 {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        let mut path = super::CommitPath::default();
        for (i, member) in self.members.iter().enumerate() {
            let text = member.scrape()?;
            let appends = value(&text, "inboxd_raft_appends_total");
            let append_s = value(&text, "inboxd_raft_append_durable_seconds_total");
            if i == self.leader {
                path.rounds_committed = value(&text, "inboxd_raft_rounds_committed_total");
                path.round_commit_s = value(&text, "inboxd_raft_round_commit_seconds_total");
                path.leader_appends = appends;
                path.leader_append_s = append_s;
            } else {
                path.follower_appends += appends;
                path.follower_entries += value(&text, "inboxd_raft_appended_entries_total");
                path.follower_append_s += append_s;
            }
        }
        Some(path)
    }

    fn holdings(&self) -> Option<super::Holdings> {
        self.leader().holdings()
    }

    fn data_bytes(&self) -> u64 {
        self.leader().data_bytes()
    }

    fn describe(&self) -> String {
        format!(
            "{} ({} members on loopback, each fsyncing its own log; figures from the leader): {}",
            self.name,
            self.members.len(),
            self.leader().describe()
        )
    }
}
