//! Regression: acknowledging a snapshot that a later `BEGIN_SNAPSHOT` of
//! the same device superseded answered `NOT_FOUND`, where the protocol
//! says a snapshot of another generation is a lost compare-and-set,
//! `CONFLICT`. The superseded snapshot is gone, so `SNAPSHOT_INFO` of it
//! answers `NOT_FOUND`: either way, the device installs the newer one.

use inbox_tests::{register, Daemon};
use inbox_wire::{AckSnapshotReq, DeviceState, ErrorCode, SnapshotRef, UserDevice};

#[tokio::test]
async fn acknowledging_a_superseded_snapshot_is_a_conflict_and_the_newer_one_installs() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start(data.path());
    let client = daemon.client().await;
    register(&client, 1, 1).await;
    let first = client
        .begin_snapshot(UserDevice { uid: 1, device: 1 })
        .await
        .unwrap();
    let second = client
        .begin_snapshot(UserDevice { uid: 1, device: 1 })
        .await
        .unwrap();
    assert_eq!(second.generation, first.generation + 1);

    let err = client
        .ack_snapshot(AckSnapshotReq {
            uid: 1,
            device: 1,
            snapshot_id: first.snapshot_id,
            generation: second.generation,
        })
        .await
        .expect_err("the first snapshot was superseded");
    assert_eq!(err.code(), Some(ErrorCode::Conflict), "{err}");

    let err = client
        .snapshot_info(SnapshotRef {
            uid: 1,
            snapshot_id: first.snapshot_id,
        })
        .await
        .expect_err("a superseded snapshot is gone");
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");

    // A snapshot id never issued is not found either, for ACK too.
    let err = client
        .ack_snapshot(AckSnapshotReq {
            uid: 1,
            device: 1,
            snapshot_id: second.snapshot_id + 100,
            generation: second.generation,
        })
        .await
        .expect_err("never issued");
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");

    // The refusals changed nothing: the newer snapshot installs.
    let device = client
        .ack_snapshot(AckSnapshotReq {
            uid: 1,
            device: 1,
            snapshot_id: second.snapshot_id,
            generation: second.generation,
        })
        .await
        .expect("the newer snapshot installs");
    assert_eq!(device.state, DeviceState::Active);
}
