//! A replicated group of `inboxd serve` processes on loopback, for the
//! tests that need one: fixed client and raft ports chosen up front (the
//! members name each other by them), one data directory each, members
//! killed and restarted on their data, new members started to be added by
//! a membership change, and the leader found by asking every member for
//! its `CLUSTER_STATUS`. Also the sends the group tests make, and their
//! retry until the group serves them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_server::client::{Client, ClientError, GroupClient};
use inbox_wire::{ClusterStatus, Empty, ErrorCode, Request, Response, SendReq};

use crate::{data_dir, Daemon, ADMIN_TOKEN};

/// How long a test waits for a leader every live member knows.
pub const ELECTION_DEADLINE: Duration = Duration::from_secs(30);

pub struct Group {
    /// `None` while a member is killed.
    pub daemons: Vec<Option<Daemon>>,
    dirs: Vec<tempfile::TempDir>,
    pub client_addrs: Vec<SocketAddr>,
    pub raft_addrs: Vec<SocketAddr>,
    /// Flags every member is started with, besides the group's own.
    extra: Vec<String>,
}

/// Loopback ports free a moment ago.
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

impl Group {
    /// Starts `size` members (node ids 1..=size) on fresh directories.
    pub fn start(size: usize) -> Group {
        Self::start_with(size, &[])
    }

    /// The same, every member with `extra` flags too.
    pub fn start_with(size: usize, extra: &[&str]) -> Group {
        let ports = free_ports(2 * size);
        let addr = |port: u16| -> SocketAddr { ([127, 0, 0, 1], port).into() };
        let client_addrs: Vec<SocketAddr> = ports[..size].iter().map(|p| addr(*p)).collect();
        let raft_addrs: Vec<SocketAddr> = ports[size..].iter().map(|p| addr(*p)).collect();
        let mut group = Group {
            daemons: (0..size).map(|_| None).collect(),
            dirs: (0..size).map(|_| data_dir()).collect(),
            client_addrs,
            raft_addrs,
            extra: extra.iter().map(|a| (*a).to_string()).collect(),
        };
        for node in 1..=size as u64 {
            group.restart(node);
        }
        group
    }

    /// Starts a node that is in no membership yet, with the next node id,
    /// fresh ports and an empty data directory, and no `--bootstrap` (its
    /// id is not the lowest of its `--peers`): it waits until the group
    /// adds it (`CLUSTER_ADD_NODE`). Returns its node id.
    pub fn start_new_member(&mut self) -> u64 {
        let node = self.new_member();
        self.restart(node);
        node
    }

    /// The same without starting it: its id, ports and directory are
    /// chosen, and [`Group::restart`] starts it.
    pub fn new_member(&mut self) -> u64 {
        let ports = free_ports(2);
        self.client_addrs.push(([127, 0, 0, 1], ports[0]).into());
        self.raft_addrs.push(([127, 0, 0, 1], ports[1]).into());
        self.dirs.push(data_dir());
        self.daemons.push(None);
        self.daemons.len() as u64
    }

    /// `--peers`: every node this group has had, this one included. Only
    /// a member with an empty log that bootstraps reads it.
    fn peers(&self) -> String {
        (0..self.daemons.len())
            .map(|i| format!("{}={}/{}", i + 1, self.raft_addrs[i], self.client_addrs[i]))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `node`'s raft and client addresses, as `CLUSTER_ADD_NODE`
    /// names them.
    pub fn addrs(&self, node: u64) -> (String, String) {
        let i = (node - 1) as usize;
        (
            self.raft_addrs[i].to_string(),
            self.client_addrs[i].to_string(),
        )
    }

    /// Starts member `node` (1-based) on its data directory.
    pub fn restart(&mut self, node: u64) {
        let i = (node - 1) as usize;
        assert!(self.daemons[i].is_none(), "member {node} is running");
        let (id, raft, listen, peers) = (
            node.to_string(),
            self.raft_addrs[i].to_string(),
            self.client_addrs[i].to_string(),
            self.peers(),
        );
        let mut args = vec![
            "--node-id",
            &id,
            "--raft-listen",
            &raft,
            "--peers",
            &peers,
            "--listen",
            &listen,
        ];
        args.extend(self.extra.iter().map(String::as_str));
        self.daemons[i] = Some(Daemon::start_with(self.dirs[i].path(), &args));
    }

    /// Member `node`'s data directory.
    pub fn dir(&self, node: u64) -> &std::path::Path {
        self.dirs[(node - 1) as usize].path()
    }

    /// SIGKILL of member `node`.
    pub fn kill(&mut self, node: u64) {
        let daemon = self.daemons[(node - 1) as usize]
            .take()
            .unwrap_or_else(|| panic!("member {node} is not running"));
        daemon.crash();
    }

    pub fn daemon(&self, node: u64) -> &Daemon {
        self.daemons[(node - 1) as usize]
            .as_ref()
            .unwrap_or_else(|| panic!("member {node} is not running"))
    }

    /// Every running member's `CLUSTER_STATUS`, by node id.
    pub async fn statuses(&self) -> Vec<(u64, ClusterStatus)> {
        let mut all = Vec::new();
        for (i, daemon) in self.daemons.iter().enumerate() {
            if daemon.is_none() {
                continue;
            }
            let client = Client::connect(self.client_addrs[i], ADMIN_TOKEN)
                .await
                .expect("connect to a running member");
            let status = client
                .cluster_status(Empty {})
                .await
                .expect("CLUSTER_STATUS");
            all.push((i as u64 + 1, status));
        }
        all
    }

    /// Waits until exactly one running member leads and every running
    /// member names it; returns its node id. Fails after
    /// [`ELECTION_DEADLINE`], never hangs.
    pub async fn leader(&self) -> u64 {
        let start = Instant::now();
        loop {
            let all = self.statuses().await;
            let leaders: Vec<u64> = all
                .iter()
                .filter(|(_, s)| s.role == "leader")
                .map(|(node, _)| *node)
                .collect();
            if let [leader] = leaders.as_slice() {
                if all.iter().all(|(_, s)| s.leader == Some(*leader)) {
                    return *leader;
                }
            }
            assert!(
                start.elapsed() < ELECTION_DEADLINE,
                "no leader known to every running member within {ELECTION_DEADLINE:?}: {all:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Send `i` of the group tests: to conversation 7, alternately from users
/// 1 and 2, with idempotency key `1000 + i` and payload "message i".
pub fn send(i: u64) -> Request {
    Request::Send(SendReq {
        conv: 7,
        sender: 1 + i % 2,
        client_msg_id: 1000 + u128::from(i),
        msg_type: 1,
        payload: Bytes::from(format!("message {i}")),
    })
}

/// Whether `e` is a server's `NOT_LEADER`.
pub fn not_leader(e: &ClientError) -> bool {
    matches!(e, ClientError::Server { .. }) && e.code() == Some(ErrorCode::NotLeader)
}

/// Retries `request` through `group` until it is answered, while
/// `retriable` says the errors met are ones the group gets over (an
/// election, a membership change); fails on any other error, and after
/// `deadline`.
pub async fn until_served(
    group: &GroupClient,
    request: Request,
    deadline: Duration,
    retriable: impl Fn(&ClientError) -> bool,
) -> Response {
    let start = Instant::now();
    loop {
        match group.call(request.clone()).await {
            Ok(r) => return r,
            Err(e) if retriable(&e) => {
                assert!(
                    start.elapsed() < deadline,
                    "not served within {deadline:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}
