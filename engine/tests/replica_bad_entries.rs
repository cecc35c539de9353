//! A follower refuses an entry that is not a leader's round as written,
//! with a clear error, and changes nothing.

mod replica_common;

use std::sync::Arc;

use inbox_engine::inbox::Entry;
use inbox_engine::*;
use replica_common::*;

/// An entry's bytes, built by hand (see `Entry::encode`).
fn entry_bytes(index: u64, records: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut buf = b"IXRE".to_vec();
    buf.push(1);
    buf.extend_from_slice(&index.to_le_bytes());
    buf.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for (kind, payload) in records {
        buf.push(*kind);
        buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        buf.extend_from_slice(payload);
    }
    let crc = crc32fast::hash(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
    buf
}

#[test]
fn a_follower_refuses_entries_that_are_not_a_leaders_rounds_and_changes_nothing() {
    let leader = Node::new(256 << 10);
    let follower = Node::follower(256 << 10);
    let pump = Pump::start(leader.ib().lead().unwrap(), vec![Arc::clone(follower.ib())]);
    leader.ib().join(Uid(1), ConvId(10)).wait().unwrap();
    send(leader.ib(), 10, 1, 1, "hello").unwrap();
    let log = pump.stop();
    let next = follower.ib().replica_index() + 1;
    let digest = follower.ib().state_digest();
    let good = log.lock().unwrap().last().unwrap().clone();
    let good_bytes = good.encode();
    // The replicated record of a real round, to tamper with.
    let real = Entry::decode(&good_bytes).unwrap();
    assert_eq!(real, good);

    let cases: Vec<(&str, Vec<u8>)> = vec![
        // A relocation describes the leader's own files.
        ("relocation", entry_bytes(next, &[(7, vec![1, 0, 0, 0, 0])])),
        // A copy, likewise.
        ("copy", entry_bytes(next, &[(9 | 0x80, vec![1])])),
        // A round mark is the follower's to write.
        ("round mark", entry_bytes(next, &[(14, vec![1; 9])])),
        // A kind nobody owns.
        ("unknown kind", entry_bytes(next, &[(77, vec![1])])),
        // A record that does not decode.
        ("garbled record", entry_bytes(next, &[(4, vec![1, 2, 3])])),
    ];
    for (what, bytes) in cases {
        let entry = Entry::decode(&bytes).unwrap();
        let err = follower.ib().apply_entry(entry).wait().unwrap_err();
        assert!(matches!(err, Error::BadRequest(_)), "{what}: {err}");
        assert_eq!(follower.ib().state_digest(), digest, "{what}");
        assert_eq!(follower.ib().replica_index(), next - 1, "{what}");
    }
    // A gap: the next index is skipped.
    let gap = Entry::decode(&entry_bytes(next + 1, &[])).unwrap();
    let err = follower.ib().apply_entry(gap).wait().unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err}");
    assert_eq!(follower.ib().state_digest(), digest);
    // A leader applies no entries.
    let err = leader.ib().apply_entry(good).wait().unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err}");
}
