//! A network partition of a group of three `inboxd serve` processes on
//! loopback: the leader is cut off from the two others, then the network
//! heals. Checked:
//!
//! - the leader cut off acknowledges nothing new: writes sent to it on its
//!   own client port, right after the cut and again once the others have a
//!   new leader, are made into rounds in its log (its raft log grows) but
//!   never answered with a success, and are answered with an error once
//!   the network heals; a read there is refused (`NOT_LEADER`), not
//!   answered without what the others took meanwhile;
//! - the two others elect a new leader, in a later term, and serve writes
//!   while the partition lasts;
//! - on heal the old leader follows the new one: its uncommitted tail is
//!   discarded and it takes the new leader's log. Every acknowledged send
//!   is stored exactly once at its `msg_seq`, with no gap; a write refused
//!   on the old leader is stored only if a later retry by its idempotency
//!   key was acknowledged, and that retry is no duplicate (the old
//!   leader's round for it never reached the group); every member's
//!   `inboxd digest` of its data directory is equal.
//!
//! How the leader is cut off: the group's raft traffic passes through a
//! test-controlled TCP proxy (`inbox_tests::proxy`). Each member listens
//! for raft on its own loopback IP (127.0.0.2, .3, .4) and its raft
//! connections leave from that IP (the raft network binds them to the
//! `--raft-listen` IP); the membership names a port of the proxy for each
//! member, which forwards to the member's listener. So the port a
//! connection reaches says which member is called and its source IP which
//! member calls, and the proxy can close every connection from or to one
//! member, and refuse new ones, until it heals. Client ports are not
//! proxied: a client still reaches the member cut off.
//!
//! Every wait has a deadline that fails with what was seen; nothing is
//! timed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use inbox_server::client::{Client, ClientError, GroupClient};
use inbox_tests::group::{changing_hands, send, send_all, Group};
use inbox_tests::*;
use inbox_wire::{ConvMember, ErrorCode, HistoryReq, MessageKind, Request, Response};
use tokio::task::JoinHandle;

/// How long a test waits for anything the group should do by itself.
const DEADLINE: Duration = Duration::from_secs(30);

/// No send answered as a duplicate: nothing was sent twice.
const NONE: [u64; 0] = [];

/// Sends `range` on `client` (one member's client port), each on a task
/// of its own, and returns those tasks.
fn send_directly(
    client: &Arc<Client>,
    range: std::ops::Range<u64>,
) -> Vec<(u64, JoinHandle<Result<Response, ClientError>>)> {
    let mut sends = Vec::new();
    for i in range {
        let client = Arc::clone(client);
        sends.push((i, tokio::spawn(async move { client.call(send(i)).await })));
    }
    sends
}

/// A send to the leader cut off ends in an error that tells the client to
/// go elsewhere, never in an acknowledgement.
fn assert_refused(i: u64, answer: Result<Response, ClientError>) {
    match answer {
        Ok(reply) => panic!("send {i} to the old leader was acknowledged: {reply:?}"),
        Err(e) => assert!(
            matches!(
                e.code(),
                Some(ErrorCode::NotLeader | ErrorCode::Unavailable)
            ),
            "send {i} to the old leader: {e}"
        ),
    }
}

/// Waits until the last index of `node`'s raft log (its
/// `CLUSTER_STATUS`) is above `index`; returns it.
async fn log_grows_past(group: &Group, node: u64, index: u64) -> u64 {
    let start = Instant::now();
    loop {
        let all = group.statuses().await;
        let (_, status) = all
            .iter()
            .find(|(n, _)| *n == node)
            .unwrap_or_else(|| panic!("member {node} answers: {all:?}"));
        if status.last_log_index > index {
            return status.last_log_index;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "member {node}'s log did not grow past {index} within {DEADLINE:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_acknowledges_nothing_and_its_tail_is_discarded_when_it_rejoins() {
    let mut group = Group::start_proxied(3, &[]);
    let old = group.leader().await;
    let others: Vec<u64> = (1..=3).filter(|n| *n != old).collect();
    let everyone = GroupClient::connect_members(&group.client_addrs, ADMIN_TOKEN, None)
        .await
        .expect("a member accepts");
    for uid in 1..=2 {
        let join = Request::Join(ConvMember { uid, conv: 7 });
        inbox_tests::group::until_served(&everyone, join, DEADLINE, changing_hands).await;
    }
    let mut acked = BTreeMap::new();
    assert_eq!(send_all(&everyone, 0..20, DEADLINE, &mut acked).await, NONE);
    drop(everyone);

    // Cut the leader off. Whatever it makes from now on stays with it.
    let before_cut = group
        .statuses()
        .await
        .into_iter()
        .find(|(n, _)| *n == old)
        .map(|(_, s)| s)
        .expect("the leader answers");
    group.proxy().cut(old).await;

    // Writes to the old leader, on its own client port: it makes them into
    // rounds and hands them to raft, which cannot commit them.
    let direct = Arc::new(
        Client::connect(group.client_addrs[(old - 1) as usize], ADMIN_TOKEN)
            .await
            .expect("the old leader's client port"),
    );
    let mut refused = send_directly(&direct, 100..105);
    log_grows_past(&group, old, before_cut.last_log_index).await;

    // The two others elect a leader of a later term, and serve writes.
    let new = group.leader_among(&others).await;
    let statuses = group.statuses().await;
    let term_of = |node: u64| {
        statuses
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, s)| s.term)
            .expect("a member answers")
    };
    assert!(
        term_of(new) > before_cut.term,
        "the new leader's term is not above the old leader's {}: {statuses:?}",
        before_cut.term
    );
    let majority: Vec<_> = others
        .iter()
        .map(|n| group.client_addrs[(*n - 1) as usize])
        .collect();
    let majority = GroupClient::connect_members(&majority, ADMIN_TOKEN, None)
        .await
        .expect("a member of the majority accepts");
    assert_eq!(
        send_all(&majority, 20..40, DEADLINE, &mut acked).await,
        NONE
    );

    // The old leader still says it leads (a leader keeps its role until it
    // hears of a later term), and makes rounds of more writes that it
    // cannot commit either. Its raft no longer takes them: openraft 0.10
    // refuses a leader's writes once its lease ran out (no quorum within
    // the longest election timeout), so they stay in its engine only.
    let (_, old_view) = group
        .statuses()
        .await
        .into_iter()
        .find(|(n, _)| *n == old)
        .expect("the old leader answers");
    assert_eq!(
        (old_view.role.as_str(), old_view.term),
        ("leader", before_cut.term),
        "the old leader's view: {old_view:?}"
    );
    refused.extend(send_directly(&direct, 105..110));
    let tail = old_view.last_log_index;
    // Nor does it serve a read, which would miss what the majority took:
    // it cannot confirm its leadership with a quorum (read-index). On a
    // connection of its own: a read waits for the connection's earlier
    // writes.
    let reader = Client::connect(group.client_addrs[(old - 1) as usize], ADMIN_TOKEN)
        .await
        .expect("the old leader's client port");
    let read = reader.history(HistoryReq {
        uid: 1,
        conv: 7,
        before_seq: None,
        limit: 200,
    });
    match tokio::time::timeout(DEADLINE, read).await {
        Ok(Err(e)) if e.code() == Some(ErrorCode::NotLeader) => {}
        Ok(answer) => panic!("a read on the leader cut off: {answer:?}"),
        Err(_) => panic!("a read on the leader cut off: no answer within {DEADLINE:?}"),
    }
    // Nothing it took is acknowledged while the partition lasts.
    let mut pending = Vec::new();
    for (i, task) in refused {
        if task.is_finished() {
            assert_refused(i, task.await.expect("a send task"));
        } else {
            pending.push((i, task));
        }
    }
    assert!(
        group.proxy().refused() > 0,
        "the cut refused no connection: the members never called the member cut off"
    );

    // Heal: every write the old leader took fails.
    group.proxy().heal();
    for (i, task) in pending {
        match tokio::time::timeout(DEADLINE, task).await {
            Ok(answer) => assert_refused(i, answer.expect("a send task")),
            Err(_) => {
                panic!("send {i} to the old leader: no answer within {DEADLINE:?} of the heal")
            }
        }
    }

    // The three agree on a leader: the old one follows it.
    let leader = group.leader().await;
    let everyone = GroupClient::connect_members(&group.client_addrs, ADMIN_TOKEN, None)
        .await
        .expect("a member accepts");
    // Some refused writes are retried by their keys: they run now, for
    // the first time in the group.
    let retried = [100, 101, 105, 106];
    assert_eq!(
        send_all(&everyone, retried, DEADLINE, &mut acked).await,
        NONE,
        "a send refused on the old leader, yet its retry is a duplicate"
    );
    assert_eq!(
        send_all(&everyone, 40..50, DEADLINE, &mut acked).await,
        NONE
    );

    // Everything is read back from the leader.
    let admin = group.daemon(leader).client().await;
    let history = all_history(&admin, 1, 7).await;
    let seqs: Vec<u64> = history.iter().map(|m| m.msg_seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "a gap");
    for (i, seq) in &acked {
        let m = &history[(*seq - 1) as usize];
        assert_eq!(
            m.payload,
            Bytes::from(format!("message {i}")),
            "msg_seq {seq}"
        );
    }
    let stored: Vec<&Bytes> = history
        .iter()
        .filter(|m| m.kind == MessageKind::Normal)
        .map(|m| &m.payload)
        .collect();
    assert_eq!(
        stored.len(),
        acked.len(),
        "every send stored is an acknowledged one, once"
    );
    for i in (100..110).filter(|i| !retried.contains(i)) {
        let payload = Bytes::from(format!("message {i}"));
        assert!(
            !stored.contains(&&payload),
            "send {i}, refused and never retried, is stored"
        );
    }

    // Stopped, the three data directories hold the same state.
    drop((everyone, majority, direct, admin));
    let digests = group.stop_and_digest().await;
    assert!(
        digests.windows(2).all(|w| w[0].1 == w[1].1),
        "the members' states differ: {digests:?}"
    );
    println!(
        "partition: member {old} cut off (its log grew from {} to at least {tail}), \
         member {new} led meanwhile, member {leader} after; sends acknowledged {}; digest {}",
        before_cut.last_log_index,
        acked.len(),
        digests[0].1
    );
}
