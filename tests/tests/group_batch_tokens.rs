//! Batch tokens across a fail-over: a device that paged a sync batch on
//! one leader goes on paging it and ACKs it on the next one, with the
//! token the first leader issued. Every member of a group signs batch
//! tokens with the group's key, not one of its own.

use std::time::Duration;

use inbox_server::client::GroupClient;
use inbox_tests::group::{changing_hands, send, until_served, Group};
use inbox_tests::*;
use inbox_wire::{AckReq, ConvMember, Request, Response, SyncReq, UserDevice};

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_token_issued_by_a_killed_leader_is_honoured_by_the_next() {
    let mut group = Group::start(3);
    let everyone = GroupClient::connect_members(&group.client_addrs, ADMIN_TOKEN, None)
        .await
        .expect("a member accepts");
    for uid in 1..=2 {
        let join = Request::Join(ConvMember { uid, conv: 7 });
        until_served(&everyone, join, DEADLINE, changing_hands).await;
    }
    let generation = match until_served(
        &everyone,
        Request::RegisterDevice(UserDevice { uid: 2, device: 1 }),
        DEADLINE,
        changing_hands,
    )
    .await
    {
        Response::RegisterDevice(r) => r.device.generation,
        other => panic!("register: {other:?}"),
    };
    for i in 0..10 {
        until_served(&everyone, send(i), DEADLINE, changing_hands).await;
    }
    // The first page of the batch, on the first leader.
    let old = group.leader().await;
    let first = group
        .daemon(old)
        .client()
        .await
        .sync(SyncReq {
            uid: 2,
            device: 1,
            generation: Some(generation),
            local_applied_seq: 0,
            limit: 4,
            ..SyncReq::default()
        })
        .await
        .expect("the first page");
    assert!(first.has_more, "a batch of one page: {first:?}");

    group.kill(old);
    let next = SyncReq {
        uid: 2,
        device: 1,
        generation: Some(generation),
        local_applied_seq: first.next_cursor,
        limit: 4,
        batch_token: Some(first.batch_token.clone()),
        ..SyncReq::default()
    };
    let second = match until_served(&everyone, Request::Sync(next), DEADLINE, changing_hands).await
    {
        Response::Sync(page) => page,
        other => panic!("the next page on the new leader: {other:?}"),
    };
    assert_eq!(second.batch_hwm, first.batch_hwm, "the same batch");
    let ack = AckReq {
        uid: 2,
        device: 1,
        generation,
        seq: first.next_cursor,
        batch_token: first.batch_token.clone(),
    };
    match until_served(&everyone, Request::Ack(ack), DEADLINE, changing_hands).await {
        Response::Ack(a) => assert_eq!(a.acked_sync_seq, first.next_cursor),
        other => panic!("ACK with the old leader's token: {other:?}"),
    }
    assert_ne!(group.leader().await, old);
}
