//! `inboxd salvage` on a damaged data directory, then `inboxd serve` on
//! the new one: both reports name the damaged place, history and sync are
//! served, the lost message is a tombstone, a retry of the lost send is
//! accepted as a new message, and a device behind the loss is told to
//! reset.

use std::process::{Command, Stdio};

use inbox_tests::{all_history, inboxd_binary, send_text, Daemon};
use inbox_wire::ErrorCode;

/// Segments of 1 MiB: each log's files are written whole when prepared.
const SMALL_SEGMENTS: &[&str] = &["--segment-bytes", "1048576"];

fn inboxd(args: &[&str]) -> std::process::Output {
    Command::new(inboxd_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run inboxd")
}

/// Flips a byte of the last occurrence of `marker` in the `evt` segment
/// files: inside the body of the message that carries it.
fn damage_last_occurrence(data_dir: &std::path::Path, marker: &[u8]) {
    let evt = data_dir.join("evt");
    let mut segments: Vec<_> = std::fs::read_dir(&evt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segments.sort();
    for path in segments.into_iter().rev() {
        let mut bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(marker.len()).rposition(|w| w == marker) {
            bytes[at + marker.len() + 2] ^= 0x5a;
            std::fs::write(&path, bytes).unwrap();
            return;
        }
    }
    panic!("no evt segment holds the marker");
}

#[tokio::test]
async fn salvage_then_serve_answers_history_and_sync_from_the_new_directory() {
    let data = inbox_tests::data_dir();
    let daemon = Daemon::start_with(data.path(), SMALL_SEGMENTS);
    let client = daemon.client().await;
    for uid in [1, 2] {
        client
            .join(inbox_wire::ConvMember { conv: 100, uid })
            .await
            .unwrap();
    }
    let behind = inbox_tests::register(&client, 2, 1).await;
    let past = inbox_tests::register(&client, 2, 2).await;
    send_text(&client, 100, 1, "before the loss").await;
    let behind = client
        .sync_to_end(2, 1, Some(behind), 0, true)
        .await
        .unwrap();
    let lost_send = inbox_wire::SendReq {
        conv: 100,
        sender: 1,
        client_msg_id: 0x1057_5e4d,
        msg_type: 1,
        payload: bytes::Bytes::from_static(b"LOSE-ME this body is damaged on disk"),
    };
    let lost = client.send(lost_send.clone()).await.unwrap();
    send_text(&client, 100, 2, "after the loss").await;
    let past = client.sync_to_end(2, 2, Some(past), 0, true).await.unwrap();
    send_text(&client, 100, 1, "later still").await;
    let want_past = client
        .sync_to_end(2, 2, Some(past.generation), past.acked_sync_seq, false)
        .await
        .unwrap();
    assert!(!want_past.events.is_empty());
    let want_history = all_history(&client, 2, 100).await;
    drop(client);
    assert!(daemon.stop().success());

    damage_last_occurrence(data.path(), b"LOSE-ME");
    let parent = inbox_tests::data_dir();
    let to = parent.path().join("salvaged");
    let (from_arg, to_arg) = (data.path().display().to_string(), to.display().to_string());
    let out = inboxd(&["salvage", "--from", &from_arg, "--to", &to_arg, "--json"]);
    assert_eq!(out.status.code(), Some(3), "salvaged with losses: {out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(
        report["lost_messages"],
        serde_json::json!([{"conv": 100, "first_msg_seq": lost.msg_seq, "last_msg_seq": lost.msg_seq}]),
        "{report}"
    );
    let users: Vec<u64> = report["lost_events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["uid"].as_u64().unwrap())
        .collect();
    assert_eq!(users, [1, 2], "{report}");
    assert!(report["uncertain"].is_null(), "{report}");
    // The final checkpoint of the clean stop covers the damaged record:
    // the damage is still met, and named, in both reports.
    let damage = report["damage"].as_array().unwrap();
    assert!(
        damage.iter().any(|d| d["log"] == "evt"),
        "the JSON report names the damaged evt place: {report}"
    );
    let text_to = parent.path().join("salvaged-text");
    let text = inboxd(&[
        "salvage",
        "--from",
        &from_arg,
        "--to",
        &text_to.display().to_string(),
    ]);
    assert_eq!(text.status.code(), Some(3), "{text:?}");
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("damage: ") && l.contains("evt")),
        "the text report has the damage line: {text}"
    );

    let verify = inboxd(&["verify", "--data-dir", &to_arg]);
    assert!(verify.status.success(), "{verify:?}");

    let daemon = Daemon::start_with(&to, SMALL_SEGMENTS);
    let client = daemon.client().await;
    let history = all_history(&client, 2, 100).await;
    assert_eq!(history.len(), want_history.len());
    for (got, want) in history.iter().zip(&want_history) {
        if got.msg_seq == lost.msg_seq {
            assert!(got.tombstone && got.payload.is_empty(), "{got:?}");
        } else {
            assert_eq!(got, want);
        }
    }
    let synced = client
        .sync_to_end(2, 2, Some(past.generation), past.acked_sync_seq, false)
        .await
        .unwrap();
    assert_eq!(synced.events, want_past.events, "past the loss: syncs on");
    let reset = client
        .sync_to_end(2, 1, Some(behind.generation), behind.acked_sync_seq, false)
        .await
        .unwrap_err();
    assert_eq!(reset.code(), Some(ErrorCode::ResetRequired), "{reset}");
    // Its key went with it: the very same send again is a new message.
    let retried = client.send(lost_send).await.expect("the retry is accepted");
    assert!(retried.msg_seq > lost.msg_seq, "{retried:?} after {lost:?}");
    assert_ne!(retried.msg_id, lost.msg_id);
    drop(client);
    assert!(daemon.stop().success());
}
