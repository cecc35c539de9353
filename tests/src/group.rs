//! A replicated group of `inboxd serve` processes on loopback, for the
//! tests that need one: fixed client and raft ports chosen up front (the
//! members name each other by them), one data directory each, members
//! killed and restarted on their data, new members started to be added by
//! a membership change, and the leader found by asking every member for
//! its `CLUSTER_STATUS`. A group may have its raft traffic pass through a
//! [`Proxy`] that cuts a member off from the others
//! ([`Group::start_proxied`]). Also the sends the group tests make, and
//! their retry until the group serves them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_server::client::{Client, ClientError, GroupClient};
use inbox_wire::{ClusterStatus, Empty, ErrorCode, Request, Response, SendReq};

use crate::proxy::Proxy;
use crate::{data_dir, inboxd_binary, Daemon, ADMIN_TOKEN};

/// How long a test waits for a leader every live member knows.
pub const ELECTION_DEADLINE: Duration = Duration::from_secs(30);

pub struct Group {
    /// `None` while a member is killed.
    pub daemons: Vec<Option<Daemon>>,
    dirs: Vec<tempfile::TempDir>,
    pub client_addrs: Vec<SocketAddr>,
    /// Each member's raft address as the membership names it: where the
    /// others connect to it.
    pub raft_addrs: Vec<SocketAddr>,
    /// Where each member's raft port listens: its raft address, unless a
    /// proxy stands in between.
    pub raft_listens: Vec<SocketAddr>,
    /// Flags every member is started with, besides the group's own.
    extra: Vec<String>,
    proxy: Option<Proxy>,
}

impl Drop for Group {
    /// Stops every member, then removes what a member killed in the
    /// middle of a snapshot install left beside its data directory (the
    /// staged directory, `.<name>.install`, which only that member's next
    /// start would remove): the data directories' own cleanup does not
    /// reach it.
    fn drop(&mut self) {
        self.daemons.iter_mut().for_each(|d| drop(d.take()));
        for dir in &self.dirs {
            let name = dir.path().file_name().unwrap_or_default().to_string_lossy();
            let _ = std::fs::remove_dir_all(dir.path().with_file_name(format!(".{name}.install")));
        }
    }
}

/// Ports of `ip` (a loopback address) that nothing listened on a moment
/// ago, for members that bind them later, taken below the kernel's
/// ephemeral range. A port picked by binding port 0 and letting it go
/// could be handed out again by the kernel, to any socket bound to port 0
/// (a test daemon's client or metrics port) or to an outgoing connection,
/// before the member bound it: it then failed to start with "Address
/// already in use". Below the range the kernel hands out none, and this
/// process hands out none twice.
fn free_ports(ip: IpAddr, n: usize) -> Vec<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let below = ephemeral_low().max(10_001);
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::with_capacity(n);
    let mut tries = 0;
    while out.len() < n {
        tries += 1;
        assert!(tries <= 10_000, "no {n} free ports of {ip} below {below}");
        let port = rand::Rng::gen_range(&mut rand::thread_rng(), 10_000..below);
        if given.contains(&port) || std::net::TcpListener::bind((ip, port)).is_err() {
            continue;
        }
        given.push(port);
        out.push(port);
    }
    out
}

/// The low end of the kernel's ephemeral port range (32768 when it cannot
/// be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

impl Group {
    /// Starts `size` members (node ids 1..=size) on fresh directories.
    pub fn start(size: usize) -> Group {
        Self::start_with(size, &[])
    }

    /// The same, every member with `extra` flags too.
    pub fn start_with(size: usize, extra: &[&str]) -> Group {
        let ports = free_ports(LOCALHOST, 2 * size);
        let addr = |port: u16| SocketAddr::new(LOCALHOST, port);
        let client_addrs: Vec<SocketAddr> = ports[..size].iter().map(|p| addr(*p)).collect();
        let raft_addrs: Vec<SocketAddr> = ports[size..].iter().map(|p| addr(*p)).collect();
        Self::launch(client_addrs, raft_addrs.clone(), raft_addrs, extra, None)
    }

    /// Starts `size` members whose raft traffic passes through a
    /// [`Proxy`], which can cut one off from the others
    /// ([`Group::proxy`]). Member `n`'s raft port listens on its own
    /// loopback IP, [`member_ip`]`(n)`, from which its raft connections
    /// leave too (the raft network binds them to the `--raft-listen` IP),
    /// so the proxy knows who calls; the membership names the proxy's port
    /// for each member. Client ports are not proxied.
    pub fn start_proxied(size: usize, extra: &[&str]) -> Group {
        let client_addrs: Vec<SocketAddr> = free_ports(LOCALHOST, size)
            .into_iter()
            .map(|port| SocketAddr::new(LOCALHOST, port))
            .collect();
        let ips: Vec<IpAddr> = (1..=size as u64).map(member_ip).collect();
        let raft_listens: Vec<SocketAddr> = ips
            .iter()
            .map(|ip| SocketAddr::new(*ip, free_ports(*ip, 1)[0]))
            .collect();
        let proxy = Proxy::start(&raft_listens, &ips);
        let raft_addrs = (1..=size as u64).map(|n| proxy.addr(n)).collect();
        Self::launch(client_addrs, raft_addrs, raft_listens, extra, Some(proxy))
    }

    fn launch(
        client_addrs: Vec<SocketAddr>,
        raft_addrs: Vec<SocketAddr>,
        raft_listens: Vec<SocketAddr>,
        extra: &[&str],
        proxy: Option<Proxy>,
    ) -> Group {
        let size = client_addrs.len();
        let mut group = Group {
            daemons: (0..size).map(|_| None).collect(),
            dirs: (0..size).map(|_| data_dir()).collect(),
            client_addrs,
            raft_addrs,
            raft_listens,
            extra: extra.iter().map(|a| (*a).to_string()).collect(),
            proxy,
        };
        for node in 1..=size as u64 {
            group.restart(node);
        }
        group
    }

    /// The proxy the group's raft traffic passes through.
    pub fn proxy(&self) -> &Proxy {
        self.proxy
            .as_ref()
            .expect("a group started with start_proxied")
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
        assert!(
            self.proxy.is_none(),
            "a proxied group has a proxy port for each of its first members only"
        );
        let ports = free_ports(LOCALHOST, 2);
        let raft = SocketAddr::new(LOCALHOST, ports[1]);
        self.client_addrs.push(SocketAddr::new(LOCALHOST, ports[0]));
        self.raft_addrs.push(raft);
        self.raft_listens.push(raft);
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
            self.raft_listens[i].to_string(),
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

    /// The node ids of the running members.
    pub fn running(&self) -> Vec<u64> {
        (1..=self.daemons.len() as u64)
            .filter(|n| self.daemons[(*n - 1) as usize].is_some())
            .collect()
    }

    /// Waits until every running member has applied the leader's last
    /// index, then stops them all, followers first (so that no election
    /// adds an entry to some only), and returns each one's `inboxd digest`
    /// of its data directory, by node id. Fails after
    /// [`ELECTION_DEADLINE`] if they do not catch up.
    pub async fn stop_and_digest(&mut self) -> Vec<(u64, String)> {
        let leader = self.leader().await;
        let start = Instant::now();
        loop {
            let all = self.statuses().await;
            let head = all
                .iter()
                .find(|(node, _)| *node == leader)
                .map(|(_, s)| s.last_log_index)
                .expect("the leader answers");
            if all.iter().all(|(_, s)| s.last_applied_index == head) {
                break;
            }
            assert!(
                start.elapsed() < ELECTION_DEADLINE,
                "members did not apply the leader's log within {ELECTION_DEADLINE:?}: {all:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let order: Vec<u64> = self
            .running()
            .into_iter()
            .filter(|n| *n != leader)
            .chain([leader])
            .collect();
        let mut digests = Vec::new();
        for node in order {
            let daemon = self.daemons[(node - 1) as usize].take().expect("running");
            let dir = daemon.data_dir.clone();
            daemon.stop();
            let out = std::process::Command::new(inboxd_binary())
                .args(["digest", "--data-dir"])
                .arg(&dir)
                .output()
                .expect("run inboxd digest");
            assert!(
                out.status.success(),
                "inboxd digest of member {node}: {out:?}"
            );
            let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
            digests.push((node, digest));
        }
        digests
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
        self.leader_among(&self.running()).await
    }

    /// The same among `nodes` only (running members): exactly one of them
    /// leads and all of them name it. What the side of a partition that
    /// can elect agrees on, while a member cut off still calls itself the
    /// leader.
    pub async fn leader_among(&self, nodes: &[u64]) -> u64 {
        let start = Instant::now();
        loop {
            let mut all = self.statuses().await;
            all.retain(|(node, _)| nodes.contains(node));
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
                "no leader known to every one of members {nodes:?} within \
                 {ELECTION_DEADLINE:?}: {all:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Group {
    /// What `read` answers on a client of the leader. A read that meets a
    /// change of hands (a member just restarted may call an election even
    /// after it named the leader) is made again on the leader then, until
    /// [`ELECTION_DEADLINE`]; any other error fails the test with `what`.
    pub async fn read_from_leader<T, F, Fut>(&self, what: &str, read: F) -> T
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let start = Instant::now();
        loop {
            let leader = self.leader().await;
            match read(self.daemon(leader).client().await).await {
                Ok(answer) => return answer,
                Err(e) if changing_hands(&e) && start.elapsed() < ELECTION_DEADLINE => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{what} from the leader, node {leader}: {e}"),
            }
        }
    }

    /// Every message of a conversation visible to `uid`, oldest first,
    /// read from the leader (see [`Group::read_from_leader`]).
    pub async fn history_from_leader(&self, uid: u64, conv: u64) -> Vec<inbox_wire::Message> {
        self.read_from_leader("history", |client| async move {
            crate::try_history_above(&client, uid, conv, 0).await
        })
        .await
    }
}

/// 127.0.0.1, where the members of a group without a proxy listen.
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The loopback IP member `node` of a proxied group listens for raft on
/// and connects from: 127.0.0.(node + 1), never 127.0.0.1, which the
/// proxy and the client ports use.
pub fn member_ip(node: u64) -> IpAddr {
    let last = u8::try_from(node + 1)
        .ok()
        .filter(|b| *b < 255)
        .expect("a proxied group has fewer than 254 members");
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
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

/// What a group client may meet while the group changes hands (an
/// election, a membership change, a member going away): the errors
/// [`until_served`] retries in the group tests.
pub fn changing_hands(e: &ClientError) -> bool {
    matches!(
        e.code(),
        Some(ErrorCode::NotLeader) | Some(ErrorCode::Unavailable)
    ) || matches!(e, ClientError::Io(_) | ClientError::Closed(_))
}

/// Sends [`send`]`(i)` for each `i` of `sends`, one after another, each
/// retried through the group's changes of hands until acknowledged, and
/// records each `msg_seq` by send number. A call that hangs (a member that
/// cannot commit holds it) fails at `deadline`. Returns the sends answered
/// as duplicates: a retry whose first attempt was stored after all (its
/// reply lost on the way), which a caller that knows no attempt could
/// have been stored asserts never happens.
pub async fn send_all(
    group: &GroupClient,
    sends: impl IntoIterator<Item = u64>,
    deadline: Duration,
    acked: &mut std::collections::BTreeMap<u64, u64>,
) -> Vec<u64> {
    let mut duplicates = Vec::new();
    for i in sends {
        let served = until_served(group, send(i), deadline, changing_hands);
        let r = match tokio::time::timeout(deadline, served).await {
            Ok(Response::Send(r)) => r,
            Ok(other) => panic!("send {i}: {other:?}"),
            Err(_) => panic!("send {i}: no answer within {deadline:?}"),
        };
        if r.duplicate {
            duplicates.push(i);
        }
        assert!(acked.insert(i, r.msg_seq).is_none(), "send {i} twice");
    }
    duplicates
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
