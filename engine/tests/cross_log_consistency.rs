//! Cross-log consistency at open and in `verify_data_dir` (behind
//! `inboxd verify`): a location in the indexes that does not resolve to a
//! durable record of its log refuses both, with the same message, naming
//! the entry and the place.

mod inbox_common;

use std::time::Duration;

use inbox_common::*;
use inbox_engine::inbox::verify_data_dir;
use inbox_engine::*;

const CONV: ConvId = ConvId(10);

fn tune(c: &mut InboxConfig) {
    c.segment_bytes = 4096;
    c.safety_window = Duration::from_secs(3600);
}

/// A body that does not compress, so a few messages fill a segment.
fn noise(seed: u64, len: usize) -> String {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

/// The newest segment file of `log` and the end of its durable data.
fn newest_segment(h: &Harness, log: &str) -> (std::path::PathBuf, u64) {
    let dir = h.dir.path().join(log);
    let report = inbox_engine::log::verify(&dir).unwrap();
    // The newest segment with data (not one prepared ahead of need).
    let last = report
        .segments
        .iter()
        .rfind(|s| !s.prepared)
        .expect("a segment");
    (dir.join(format!("{:010}.seg", last.id)), last.bytes)
}

/// Zeros `seg` from `at` on: a write the disk lost reads as the
/// preallocated zeros. (A shorter file is a segment cut from outside,
/// refused before this check; `damage_refusals.rs` covers that.)
fn lose_tail(seg: &std::path::Path, at: u64) {
    let mut bytes = std::fs::read(seg).unwrap();
    bytes[at as usize..].fill(0);
    std::fs::write(seg, bytes).unwrap();
}

fn shut_down(h: &mut Harness) -> InboxConfig {
    h.ib().shutdown().unwrap();
    drop(h.inbox.take());
    let mut c = config(h.dir.path(), &h.clock);
    tune(&mut c);
    c
}

/// Open and verify refuse alike; the message is returned.
fn both_refuse(c: &InboxConfig) -> String {
    let verified = verify_data_dir(c)
        .expect_err("verify must refuse")
        .to_string();
    let opened = match Inbox::open(c.clone()) {
        Ok(_) => panic!("open must refuse"),
        Err(e) => e.to_string(),
    };
    assert_eq!(opened, verified, "open and verify disagree");
    // Verify changed nothing, and open refused before changing anything
    // that would make a second look differ.
    assert_eq!(verify_data_dir(c).unwrap_err().to_string(), verified);
    verified
}

#[test]
fn a_msg_tail_lost_after_a_clean_shutdown_refuses_open_and_verify_alike() {
    let mut h = Harness::with(tune);
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    for i in 0..40 {
        h.send(CONV, Uid(1), 100 + i, &noise(i as u64, 300));
    }
    // Past the safety window no event holds the sealed segments: the pass
    // moves their bodies to the message store.
    h.advance(Duration::from_secs(2 * 3600));
    h.ib().compact().unwrap();
    let (seg, end) = newest_segment(&h, "msg");
    assert!(end > 64, "bodies were moved to msg");
    let c = shut_down(&mut h);
    assert!(verify_data_dir(&c).is_ok());
    // The newest msg segment loses the end of its last record.
    lose_tail(&seg, end - 10);
    let msg = both_refuse(&c);
    assert!(
        msg.contains(&format!("conv {CONV} message msg_seq")) && msg.contains("msg log"),
        "{msg}"
    );
}

#[test]
fn an_evt_tail_lost_under_a_checkpoint_refuses_open_and_verify_alike() {
    let mut h = Harness::with(tune);
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    for i in 0..5 {
        h.send(CONV, Uid(1), 100 + i, "hello");
    }
    // The final checkpoint covers every record.
    let c = shut_down(&mut h);
    assert!(verify_data_dir(&c).is_ok());
    let (seg, end) = newest_segment(&h, "evt");
    lose_tail(&seg, end - 5);
    let msg = both_refuse(&c);
    assert!(
        msg.contains("covers evt LSN") && msg.contains("log data is missing"),
        "{msg}"
    );
}

#[test]
fn a_message_whose_body_segment_is_gone_refuses_open_and_verify_alike() {
    let mut h = Harness::with(tune);
    h.join(Uid(1), CONV);
    h.join(Uid(2), CONV);
    for i in 0..40 {
        h.send(CONV, Uid(1), 100 + i, &noise(i as u64, 300));
    }
    h.advance(Duration::from_secs(2 * 3600));
    h.ib().compact().unwrap();
    let c = shut_down(&mut h);
    // The oldest msg segment goes missing: a lost file, not a torn tail.
    let report = inbox_engine::log::verify(&h.dir.path().join("msg")).unwrap();
    let first = report.segments.first().unwrap().id;
    std::fs::remove_file(h.dir.path().join("msg").join(format!("{first:010}.seg"))).unwrap();
    let msg = both_refuse(&c);
    assert!(
        msg.contains(&format!("segment {first} offset")) && msg.contains("does not exist"),
        "{msg}"
    );
}
