//! Found by the `engine_model` fuzz target: a send that fails because its
//! fsync failed can still be on disk, and after a restart its retry is
//! answered as a duplicate with the original ids. That is the idempotency
//! contract working (the client never learned the outcome; the retry
//! settles it), not a loss: the message is stored once, at the seq the
//! retry reports. The model had forbidden the duplicate.

use std::sync::Arc;

use bytes::Bytes;
use inbox_engine::log::{FaultyIo, SyncPolicy};
use inbox_engine::*;

fn config(dir: &std::path::Path) -> InboxConfig {
    let mut c = InboxConfig::new(dir);
    c.sync = SyncPolicy::Always;
    // Small segments: recovery scans each preallocated segment to its end.
    c.segment_bytes = 64 << 10;
    c.compaction_interval = None;
    c.token_key = [7; 32];
    c
}

fn send(ib: &Inbox) -> Result<SendReply> {
    ib.send(SendRequest {
        conv: ConvId(1),
        sender: Uid(1),
        client_msg_id: 42,
        msg_type: 1,
        payload: Bytes::from_static(b"hello"),
    })
    .wait()
}

#[test]
fn a_send_that_failed_under_an_fsync_fault_is_stored_once_and_its_retry_reports_it() {
    let mut duplicates = 0;
    // Which sync of the send's round fails decides whether its records
    // reached the files; try each.
    for nth in 1..=3 {
        let dir = tempfile::tempdir().unwrap();
        {
            let io = Arc::new(FaultyIo::new());
            let ib = Inbox::open_with_io(config(dir.path()), io.clone()).unwrap();
            ib.join(Uid(1), ConvId(1)).wait().unwrap();
            io.fail_nth_sync(nth);
            if send(&ib).is_ok() {
                // The failure hit a later round: nothing to retry.
                continue;
            }
            assert!(
                io.failures_fired() > 0,
                "the send failed because the sync did"
            );
        }
        let ib = Inbox::open(config(dir.path())).unwrap();
        let retry = send(&ib).expect("the retry succeeds after a restart");
        let history = ib.history(Uid(1), ConvId(1), None, 10).unwrap();
        let copies: Vec<&Message> = history
            .messages
            .iter()
            .filter(|m| m.msg_id == retry.msg_id)
            .collect();
        assert_eq!(copies.len(), 1, "stored exactly once: {history:?}");
        assert_eq!(
            copies[0].msg_seq, retry.msg_seq,
            "at the seq the retry reports"
        );
        assert_eq!(
            history
                .messages
                .iter()
                .filter(|m| m.kind == MessageKind::Normal)
                .count(),
            1,
            "one message for one idempotency key"
        );
        if retry.duplicate {
            duplicates += 1;
        }
    }
    assert!(
        duplicates > 0,
        "no failed send had reached the disk: the case never happened"
    );
}
