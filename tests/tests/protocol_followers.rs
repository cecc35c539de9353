//! What a follower of a replicated group answers (PROTOCOL.md, "Who
//! serves what in a group"): every read and every write is refused with
//! `NOT_LEADER`, whose `leader_addr` field names the leader's client
//! address; `PING`, the subscriptions and `CLUSTER_STATUS` are answered by
//! the follower itself.

use std::time::{Duration, Instant};

use inbox_server::client::{leader_addr, Client};
use inbox_tests::group::Group;
use inbox_tests::ADMIN_TOKEN;
use inbox_wire::*;

const DEADLINE: Duration = Duration::from_secs(30);

/// The index of the member that says it leads.
async fn leading(addrs: &[std::net::SocketAddr]) -> usize {
    let start = Instant::now();
    loop {
        for (n, a) in addrs.iter().enumerate() {
            if let Ok(c) = Client::connect(*a, ADMIN_TOKEN).await {
                if c.cluster_status(Empty {})
                    .await
                    .is_ok_and(|s| s.role == "leader")
                {
                    return n;
                }
            }
        }
        assert!(start.elapsed() < DEADLINE, "no leader within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_refuses_reads_and_writes_naming_the_leader_and_serves_pings_and_subscriptions()
{
    let members = Group::start(3);
    let leader = leading(&members.client_addrs).await;
    let leader_at = members.client_addrs[leader];
    let follower_at = members.client_addrs[(leader + 1) % 3];
    let follower = Client::connect(follower_at, ADMIN_TOKEN).await.unwrap();
    // The follower has heard from the leader once it names it.
    let start = Instant::now();
    while follower
        .cluster_status(Empty {})
        .await
        .unwrap()
        .leader
        .is_none()
    {
        assert!(start.elapsed() < DEADLINE);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let refused = [
        Request::Join(ConvMember { conv: 7, uid: 1 }),
        Request::Devices(UserReq { uid: 1 }),
        Request::History(HistoryReq {
            uid: 1,
            conv: 7,
            before_seq: None,
            limit: 0,
        }),
        Request::ConvList(ConvListReq {
            uid: 1,
            limit: 0,
            cursor: None,
        }),
        Request::Dirty(UserReq { uid: 1 }),
    ];
    for request in refused {
        let name = request.op().name();
        let err = follower.call(request).await.expect_err(name);
        assert_eq!(err.code(), Some(ErrorCode::NotLeader), "{name}: {err}");
        assert_eq!(leader_addr(&err), Some(leader_at), "{name}: {err}");
    }

    follower.ping(Empty {}).await.expect("PING");
    let uids = UidList { uids: vec![1, 2] };
    follower.subscribe(uids.clone()).await.expect("SUBSCRIBE");
    follower
        .subscribe_dirty(uids.clone())
        .await
        .expect("SUBSCRIBE_DIRTY");
    follower.unsubscribe(uids).await.expect("UNSUBSCRIBE");
    let status = follower.cluster_status(Empty {}).await.unwrap();
    assert_eq!(status.role, "follower");
}
