//! A leader paused (SIGSTOP) and resumed (SIGCONT) after the group moved
//! on without it: three `inboxd serve` processes on loopback. A leader
//! applies its rounds before they commit, so its state holds rounds the
//! group may discard. Checked:
//!
//! - a retried send answered from the idempotency table of such a round
//!   waits for that round: once the old leader learns of the new term, the
//!   retry gets `NOT_LEADER`, never "duplicate" with the `msg_seq` of a
//!   round that never committed (which in the group holds another
//!   message), and the key is stored once, as new, when retried on the
//!   group;
//! - a read on the old leader that saw such a round (a device registered
//!   in it) is not answered with it: `NOT_LEADER`, or an answer the group
//!   agrees with;
//! - a randomized run pauses and resumes the leader while sends, retries
//!   and reads are in flight, and checks that every successful send reply
//!   names the message the group holds at that `msg_seq`, and that no read
//!   returns a device the group lacks at the end. It prints its reach:
//!   pauses, rounds discarded, retried keys.
//!
//! Every wait has a deadline that fails with what was seen.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inbox_server::client::{Client, ClientError, GroupClient};
use inbox_tests::group::{changing_hands, send, until_served, Group};
use inbox_tests::*;
use inbox_wire::{ConvMember, ErrorCode, Request, Response, UserDevice, UserReq};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DEADLINE: Duration = Duration::from_secs(30);

/// The payload [`send`]`(i)` carries.
fn payload_of(i: u64) -> Vec<u8> {
    format!("message {i}").into_bytes()
}

/// Joins users 1 and 2 to conversation 7 through the group.
async fn join_both(group: &GroupClient) {
    for uid in 1..=2 {
        let join = Request::Join(ConvMember { uid, conv: 7 });
        until_served(group, join, DEADLINE, changing_hands).await;
    }
}

/// Conversation 7 as the group's leader serves it: payload by `msg_seq`.
async fn stored(group: &Group) -> BTreeMap<u64, Vec<u8>> {
    group
        .history_from_leader(1, 7)
        .await
        .into_iter()
        .map(|m| (m.msg_seq, m.payload.to_vec()))
        .collect()
}

/// Takes member `node` out of the group's running set and stops it
/// (SIGSTOP): the group's helpers then ask only the others.
fn pause(group: &mut Group, node: u64) -> Daemon {
    let daemon = group.daemons[(node - 1) as usize]
        .take()
        .expect("the member runs");
    daemon.signal(libc::SIGSTOP);
    daemon
}

/// Resumes a paused member (SIGCONT) and puts it back in the running set.
fn resume(group: &mut Group, node: u64, daemon: Daemon) {
    daemon.signal(libc::SIGCONT);
    group.daemons[(node - 1) as usize] = Some(daemon);
}

/// Waits for `call` on a member that was paused: it must end within the
/// deadline once the member runs again.
async fn answer_of<T>(
    what: &str,
    call: tokio::task::JoinHandle<Result<T, ClientError>>,
) -> Result<T, ClientError> {
    match tokio::time::timeout(DEADLINE, call).await {
        Ok(answer) => answer.expect("the call's task"),
        Err(_) => panic!("{what}: no answer within {DEADLINE:?} of the resume"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_never_answers_a_retry_or_a_read_from_a_round_it_did_not_commit() {
    let mut group = Group::start(3);
    let old = group.leader().await;
    let others: Vec<u64> = (1..=3).filter(|n| *n != old).collect();
    let everyone = GroupClient::connect_members(&group.client_addrs, ADMIN_TOKEN, None)
        .await
        .expect("a member accepts");
    join_both(&everyone).await;
    for i in 0..3 {
        until_served(&everyone, send(i), DEADLINE, changing_hands).await;
    }
    drop(everyone);

    // The leader alone: nothing it makes from now on can commit.
    for n in &others {
        group.kill(*n);
    }
    let addr = group.client_addrs[(old - 1) as usize];
    let a = Arc::new(Client::connect(addr, ADMIN_TOKEN).await.expect("A"));
    let b = Arc::new(Client::connect(addr, ADMIN_TOKEN).await.expect("B"));
    let c = Arc::new(Client::connect(addr, ADMIN_TOKEN).await.expect("C"));
    // Key K on A, then the same send on B: B's is an idempotent hit on
    // A's round, which is applied but not committed.
    let first = {
        let a = Arc::clone(&a);
        tokio::spawn(async move { a.call(send(100)).await })
    };
    // A device registered in a round of its own, on C, then read on B.
    let device = {
        let c = Arc::clone(&c);
        tokio::spawn(async move {
            c.call(Request::RegisterDevice(UserDevice { uid: 9, device: 4 }))
                .await
        })
    };
    // Each request is decided within microseconds of its arrival; the
    // wait only makes sure the old leader decided them before the pause
    // (were one decided after it, the old leader would refuse it, which
    // the assertions below accept as well).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retry = {
        let b = Arc::clone(&b);
        tokio::spawn(async move { b.call(send(100)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let paused = pause(&mut group, old);

    // The two others come back, elect a leader of a later term, and take
    // three sends: the `msg_seq` the old leader gave K is now another
    // message's.
    for n in &others {
        group.restart(*n);
    }
    let new = group.leader_among(&others).await;
    assert_ne!(new, old);
    let majority: Vec<_> = others
        .iter()
        .map(|n| group.client_addrs[(*n - 1) as usize])
        .collect();
    let majority = GroupClient::connect_members(&majority, ADMIN_TOKEN, None)
        .await
        .expect("a member of the majority accepts");
    for i in 200..203 {
        until_served(&majority, send(i), DEADLINE, changing_hands).await;
    }
    drop(majority);

    // A read of the device's user on the old leader, which still thinks
    // it leads once it runs again.
    resume(&mut group, old, paused);
    let d = Client::connect(addr, ADMIN_TOKEN).await.expect("D");
    let devices = d.devices(UserReq { uid: 9 });
    let devices = tokio::time::timeout(DEADLINE, devices)
        .await
        .unwrap_or_else(|_| panic!("DEVICES on the old leader: no answer within {DEADLINE:?}"));

    let first = answer_of("K on A", first).await;
    let retry = answer_of("K again on B", retry).await;
    let device = answer_of("REGISTER_DEVICE on C", device).await;
    let held = stored(&group).await;
    for (what, answer) in [("K on A", &first), ("K again on B", &retry)] {
        match answer {
            Ok(Response::Send(r)) => assert_eq!(
                held.get(&r.msg_seq),
                Some(&payload_of(100)),
                "{what} was answered {r:?}, but the group holds {:?} at that msg_seq",
                held.get(&r.msg_seq)
                    .map(|p| String::from_utf8_lossy(p).into_owned())
            ),
            Ok(other) => panic!("{what}: {other:?}"),
            Err(e) => assert!(
                changing_hands(e),
                "{what}: an error that is not a change of hands: {e}"
            ),
        }
    }
    assert!(
        device.is_err(),
        "REGISTER_DEVICE on the old leader alone was acknowledged: {device:?}"
    );
    // The group never took the device: a read that shows it answered from
    // a round the group discarded.
    match devices {
        Ok(list) => assert!(
            list.devices.is_empty(),
            "DEVICES on the old leader showed a device of a round that never committed: {list:?}"
        ),
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::NotLeader), "DEVICES: {e}"),
    }

    // K, retried on the group, is stored once, as new.
    let everyone = GroupClient::connect_members(&group.client_addrs, ADMIN_TOKEN, None)
        .await
        .expect("a member accepts");
    match until_served(&everyone, send(100), DEADLINE, changing_hands).await {
        Response::Send(r) => assert!(!r.duplicate, "K was never stored, yet: {r:?}"),
        other => panic!("K on the group: {other:?}"),
    }
    let held = stored(&group).await;
    let copies = held.values().filter(|p| **p == payload_of(100)).count();
    assert_eq!(copies, 1, "K is stored {copies} times: {held:?}");
}

/// What the randomized run's clients saw.
#[derive(Default)]
struct Seen {
    /// Send number -> the `msg_seq` a success named.
    sends: HashMap<u64, u64>,
    /// Keys sent again after an attempt ended without an answer that
    /// named a message (`NOT_LEADER`, a cut connection, no answer in time).
    retried_keys: u64,
    /// Of those, the ones answered "duplicate" (an earlier attempt's round
    /// committed after all).
    retried_duplicates: u64,
    /// Devices (uid, device) some read answered with.
    devices_read: Vec<(u64, u64)>,
    /// Devices whose registration was acknowledged.
    devices_acked: Vec<(u64, u64)>,
}

/// One client of the randomized run: a connection to one member at a
/// time, moved to the next member on a refusal, so that it sees every
/// refusal itself (a `GroupClient` would hide them). An attempt with no
/// answer in time is made again on a new connection, to the same member
/// or the next one at random: a retry then reaches a paused leader too,
/// as a client with a pool of connections would.
struct Roamer {
    addrs: Vec<std::net::SocketAddr>,
    at: usize,
    client: Option<Client>,
    rng: StdRng,
}

/// How long one attempt may take before the member is taken for paused.
const ATTEMPT: Duration = Duration::from_secs(1);

impl Roamer {
    async fn call(&mut self, request: Request) -> Result<Response, ClientError> {
        if self.client.is_none() {
            let connect = Client::connect(self.addrs[self.at], ADMIN_TOKEN);
            match tokio::time::timeout(ATTEMPT, connect).await {
                Ok(Ok(c)) => self.client = Some(c),
                Ok(Err(e)) => return Err(self.next(e)),
                Err(_) => return Err(self.next(ClientError::Closed("connect timed out".into()))),
            }
        }
        let client = self.client.as_ref().expect("connected");
        match tokio::time::timeout(ATTEMPT, client.call(request)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) if changing_hands(&e) => Err(self.next(e)),
            Ok(Err(e)) => Err(e),
            Err(_) if self.rng.gen_bool(0.5) => {
                self.client = None;
                Err(ClientError::Closed("no answer in time".into()))
            }
            Err(_) => Err(self.next(ClientError::Closed("no answer in time".into()))),
        }
    }

    /// Moves to the next member; returns `e`.
    fn next(&mut self, e: ClientError) -> ClientError {
        self.client = None;
        self.at = (self.at + 1) % self.addrs.len();
        e
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_paused_under_load_answer_only_what_the_group_committed() {
    let pauses: u64 = std::env::var("GROUP_PAUSES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let mut group = Group::start(3);
    let everyone = GroupClient::connect_members(&group.client_addrs, ADMIN_TOKEN, None)
        .await
        .expect("a member accepts");
    join_both(&everyone).await;
    drop(everyone);
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for c in 0..4u64 {
        let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
        let mut roamer = Roamer {
            addrs: group.client_addrs.clone(),
            at: c as usize % 3,
            client: None,
            rng: StdRng::seed_from_u64(100 + c),
        };
        load.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(c);
            let mut i = c * 1_000_000;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                if rng.gen_bool(0.2) {
                    // A device of this client's user, then a read of them.
                    let (uid, device) = (100 + c, i % 1_000_000);
                    let reg = Request::RegisterDevice(UserDevice { uid, device });
                    if let Ok(Response::RegisterDevice(_)) = roamer.call(reg).await {
                        seen.lock().unwrap().devices_acked.push((uid, device));
                    }
                    if let Ok(Response::Devices(list)) =
                        roamer.call(Request::Devices(UserReq { uid })).await
                    {
                        let mut s = seen.lock().unwrap();
                        s.devices_read
                            .extend(list.devices.iter().map(|d| (uid, d.device)));
                    }
                    continue;
                }
                // A send, retried with its key until it is answered.
                let started = Instant::now();
                let mut attempts = 0;
                loop {
                    attempts += 1;
                    match roamer.call(send(i)).await {
                        Ok(Response::Send(r)) => {
                            let mut s = seen.lock().unwrap();
                            if attempts > 1 {
                                s.retried_keys += 1;
                                s.retried_duplicates += u64::from(r.duplicate);
                            }
                            s.sends.insert(i, r.msg_seq);
                            break;
                        }
                        Ok(other) => panic!("send {i}: {other:?}"),
                        Err(e) if changing_hands(&e) => {
                            assert!(started.elapsed() < 2 * DEADLINE, "send {i} not served: {e}");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => panic!("send {i}: {e}"),
                    }
                }
            }
        }));
    }

    let mut discarded = 0;
    for _ in 0..pauses {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let old = group.leader().await;
        let others: Vec<u64> = (1..=3).filter(|n| *n != old).collect();
        let paused = pause(&mut group, old);
        group.leader_among(&others).await;
        // The new leader serves for a while before the old one resumes.
        tokio::time::sleep(Duration::from_millis(500)).await;
        resume(&mut group, old, paused);
        group.leader().await;
        discarded = 0;
        for n in 1..=3 {
            discarded += group
                .daemon(n)
                .metric("inboxd_raft_rounds_discarded_total")
                .await
                .unwrap_or(0);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in load {
        tokio::time::timeout(3 * DEADLINE, task)
            .await
            .expect("the load stops")
            .expect("a load task");
    }

    let held = stored(&group).await;
    // Every load task has ended: what they saw is taken out whole.
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(!seen.sends.is_empty(), "no send was acknowledged");
    for (i, seq) in &seen.sends {
        assert_eq!(
            held.get(seq),
            Some(&payload_of(*i)),
            "send {i} was answered msg_seq {seq}, which the group holds as {:?}",
            held.get(seq)
                .map(|p| String::from_utf8_lossy(p).into_owned())
        );
    }
    let mut devices: HashMap<u64, Vec<u64>> = HashMap::new();
    for uid in 100..104 {
        let list = group
            .read_from_leader("devices", |client| async move {
                client.devices(UserReq { uid }).await
            })
            .await;
        devices.insert(uid, list.devices.iter().map(|d| d.device).collect());
    }
    for (uid, device) in seen.devices_read.iter().chain(&seen.devices_acked) {
        assert!(
            devices[uid].contains(device),
            "device {device} of user {uid} was read or acknowledged, but the group lacks it"
        );
    }
    println!(
        "reach: {pauses} pauses, {discarded} rounds discarded by deposed leaders, \
         {} sends acknowledged, {} keys retried ({} answered as duplicates), \
         {} devices read",
        seen.sends.len(),
        seen.retried_keys,
        seen.retried_duplicates,
        seen.devices_read.len()
    );
    assert!(
        seen.retried_keys > 0,
        "no send was retried: the pauses met no send in flight"
    );
}
