//! A TCP proxy in front of the raft ports of a group's members, which cuts
//! one member off from the others and lets it back.
//!
//! The proxy listens on one port of 127.0.0.1 for each member, and the
//! group's membership names that port as the member's raft address: every
//! raft connection to member `n` arrives at the proxy's port for `n`, which
//! forwards it to `n`'s real raft listener. On one host every connection
//! comes from loopback, so the members are told apart by source IP: member
//! `n` listens for raft on its own loopback IP (Linux routes all of
//! 127.0.0.0/8 to `lo`), and a member's raft connections leave from the IP
//! of its `--raft-listen` address. The port a connection arrives on says
//! which member is called, its source IP which member calls.
//!
//! [`Proxy::cut`] closes every forwarded connection from or to the member
//! and, until [`Proxy::heal`], accepts each new one only to close it at
//! once: the caller sees the connection end at once and openraft counts
//! the member unreachable and tries again after its backoff (500 ms), where
//! a connection left unanswered would hold each call until its deadline.
//!
//! The proxy runs on a runtime of its own (one thread), so that a test
//! blocking its own runtime's threads (starting or stopping a daemon)
//! never holds up the group's raft traffic.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct Proxy {
    /// Where the members reach member `n`: `addrs[n - 1]`.
    addrs: Vec<SocketAddr>,
    state: Arc<Mutex<State>>,
    runtime: Option<tokio::runtime::Runtime>,
}

#[derive(Default)]
struct State {
    /// Members cut off.
    cut: HashSet<u64>,
    /// Connections being forwarded.
    links: Vec<Link>,
    /// Connections closed on arrival because a member was cut off.
    refused: u64,
}

/// One forwarded connection: from which member (`None`: a caller that is
/// no member), to which.
struct Link {
    from: Option<u64>,
    to: u64,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Forwards to member `n`'s raft listener at `targets[n - 1]`, and
    /// knows member `n` by its connections' source IP `sources[n - 1]`.
    pub fn start(targets: &[SocketAddr], sources: &[IpAddr]) -> Proxy {
        assert_eq!(targets.len(), sources.len(), "one source IP per member");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("raft-proxy")
            .enable_all()
            .build()
            .expect("the proxy's runtime");
        let state = Arc::new(Mutex::new(State::default()));
        let mut addrs = Vec::new();
        for (i, target) in targets.iter().enumerate() {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a proxy port");
            listener
                .set_nonblocking(true)
                .expect("a non-blocking listener");
            addrs.push(listener.local_addr().expect("a bound port"));
            let accept = accept_loop(
                listener,
                i as u64 + 1,
                *target,
                sources.to_vec(),
                Arc::clone(&state),
            );
            runtime.spawn(accept);
        }
        Proxy {
            addrs,
            state,
            runtime: Some(runtime),
        }
    }

    /// The address the members reach member `node` at.
    pub fn addr(&self, node: u64) -> SocketAddr {
        self.addrs[(node - 1) as usize]
    }

    /// Cuts `node` off: once this returns, nothing more passes between it
    /// and any other member (its connections are closed, their forwarding
    /// tasks ended, so no byte they hold is passed on), and every new
    /// connection from or to it is closed on arrival.
    pub async fn cut(&self, node: u64) {
        let gone: Vec<Link> = {
            let mut state = self.state();
            state.cut.insert(node);
            let (gone, kept) = std::mem::take(&mut state.links)
                .into_iter()
                .partition(|l| l.from == Some(node) || l.to == node);
            state.links = kept;
            gone
        };
        for link in gone {
            link.task.abort();
            // Returns once the task's future, and its sockets, are dropped.
            let _ = link.task.await;
        }
    }

    /// Lets every member's connections through again.
    pub fn heal(&self) {
        self.state().cut.clear();
    }

    /// How many connections were closed on arrival because a member was
    /// cut off.
    pub fn refused(&self) -> u64 {
        self.state().refused
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Dropping a runtime waits for its threads, which a test's own
        // runtime does not allow; its tasks and sockets go all the same.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Accepts the connections to member `to` and forwards each to `target`,
/// unless its caller or `to` is cut off. The check and the registration of
/// a forwarded connection are made under the lock [`Proxy::cut`] takes, so
/// a connection is either refused or closed by the cut.
async fn accept_loop(
    listener: std::net::TcpListener,
    to: u64,
    target: SocketAddr,
    sources: Vec<IpAddr>,
    state: Arc<Mutex<State>>,
) {
    let listener = TcpListener::from_std(listener).expect("a tokio listener");
    loop {
        let (inbound, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(_) => {
                // Out of descriptors, say: try again shortly.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let from = sources
            .iter()
            .position(|ip| *ip == peer.ip())
            .map(|i| i as u64 + 1);
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        if state.cut.contains(&to) || from.is_some_and(|f| state.cut.contains(&f)) {
            state.refused += 1;
            drop(inbound);
            continue;
        }
        state.links.retain(|l| !l.task.is_finished());
        let task = tokio::spawn(forward(inbound, target));
        state.links.push(Link { from, to, task });
    }
}

/// Passes bytes both ways until either side closes.
async fn forward(mut inbound: TcpStream, target: SocketAddr) {
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
}
