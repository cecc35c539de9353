//! Tests of the idempotency table: lookups, buckets, runs and tables,
//! and the copies a checkpoint takes.

use super::*;

fn no_spread(_: Uid) -> [u64; 2] {
    [0, 0]
}

fn sent(sender: Uid, cmid: u128, conv: ConvId, msg_seq: MsgSeq, msg_id: MsgId) -> Sent {
    Sent {
        sender,
        cmid,
        conv,
        msg_seq,
        msg_id,
    }
}

fn ids(v: &[Candidate]) -> Vec<u64> {
    v.iter().map(|s| s.msg_id.0).collect()
}

#[test]
fn keys_with_the_same_tag_are_all_candidates_in_open_and_closed_buckets() {
    // Without a spread the tag is the client_msg_id: two senders'
    // key 7 share it.
    let mut t = IdemTable::with_spread(no_spread);
    let ttl = 1_600;
    t.insert(sent(Uid(1), 7, ConvId(10), MsgSeq(1), MsgId(101)), 0, ttl);
    t.insert(sent(Uid(2), 7, ConvId(10), MsgSeq(2), MsgId(102)), 1, ttl);
    t.insert(sent(Uid(2), 8, ConvId(10), MsgSeq(3), MsgId(103)), 2, ttl);
    assert_eq!(ids(&t.candidates(Uid(1), 7, 3, ttl)), [101, 102]);
    // A later bucket closes the first one: same answers.
    t.insert(sent(Uid(3), 7, ConvId(10), MsgSeq(4), MsgId(104)), 150, ttl);
    assert_eq!(t.buckets().count(), 2);
    assert_eq!(ids(&t.candidates(Uid(1), 7, 151, ttl)), [104, 101, 102]);
    assert_eq!(ids(&t.candidates(Uid(1), 9, 151, ttl)), Vec::<u64>::new());
}

#[test]
fn a_bucket_is_dropped_once_all_its_keys_are_past_the_ttl() {
    let mut t = IdemTable::default();
    let ttl = 1_600; // buckets of 100 ms
    t.insert(sent(Uid(1), 1, ConvId(1), MsgSeq(1), MsgId(1)), 50, ttl);
    // At 1,650 the key is exactly the TTL old: still remembered.
    assert_eq!(t.candidates(Uid(1), 1, 1_650, ttl).len(), 1);
    // Its bucket ends at 100: from 1,700 on it is answered no more...
    assert_eq!(t.candidates(Uid(1), 1, 1_700, ttl).len(), 0);
    // ...and the next insert drops it.
    t.insert(sent(Uid(1), 2, ConvId(1), MsgSeq(2), MsgId(2)), 1_700, ttl);
    assert_eq!(t.len(), 1);
    assert_eq!(t.buckets().count(), 1);
}

#[test]
fn buckets_stay_ordered_and_disjoint_when_the_ttl_changes() {
    let mut t = IdemTable::default();
    // Buckets of 100 ms, then (after a restart with another TTL) of 1 s.
    t.insert(sent(Uid(1), 1, ConvId(1), MsgSeq(1), MsgId(1)), 950, 1_600);
    t.insert(
        sent(Uid(1), 2, ConvId(1), MsgSeq(2), MsgId(2)),
        1_010,
        16_000,
    );
    t.insert(
        sent(Uid(1), 3, ConvId(1), MsgSeq(3), MsgId(3)),
        2_500,
        16_000,
    );
    let spans: Vec<(u64, u64)> = t.buckets().map(|b| (b.start_ms, b.end_ms)).collect();
    assert_eq!(spans, [(900, 1_000), (1_000, 2_000), (2_000, 3_000)]);
    t.insert(
        sent(Uid(1), 4, ConvId(1), MsgSeq(4), MsgId(4)),
        3_050,
        1_600,
    );
    let last = t.buckets().last().map(|b| (b.start_ms, b.end_ms));
    assert_eq!(last, Some((3_000, 3_100)));
    assert_eq!(t.candidates(Uid(1), 2, 3_050, 16_000).len(), 1);
}

#[test]
fn the_open_bucket_grows_and_finds_every_key() {
    let mut t = IdemTable::default();
    for i in 0..10_000u64 {
        t.insert(
            sent(
                Uid(i % 7),
                i as u128,
                ConvId(1),
                MsgSeq(i + 1),
                MsgId(i + 1),
            ),
            0,
            1_000,
        );
    }
    for i in 0..10_000u64 {
        let c = t.candidates(Uid(i % 7), i as u128, 0, 1_000);
        assert_eq!(ids(&c), [i + 1]);
    }
    let b = t.bytes();
    assert_eq!(b.live, 10_000 * SLOT_BYTES);
    assert!(b.allocated >= b.live);
}

#[test]
fn a_decoded_table_equals_the_one_it_was_encoded_from() {
    let mut t = IdemTable::default();
    for i in 0..100u64 {
        t.insert(
            sent(Uid(1), i as u128, ConvId(1), MsgSeq(i + 1), MsgId(i + 1)),
            i * 30,
            1_600,
        );
    }
    let mut d = IdemTable::default();
    for b in t.buckets() {
        d.push_decoded(b.start_ms, b.end_ms, b.base_id, b.entries());
    }
    assert_eq!(d, t);
    assert_eq!(ids(&d.candidates(Uid(1), 99, 3_000, 1_600)), [100]);
}

#[test]
fn ids_more_than_2_to_the_32_past_a_buckets_base_start_a_bucket_of_the_same_span() {
    let mut t = IdemTable::default();
    let far = (1u64 << 32) + 5;
    t.insert(sent(Uid(1), 1, ConvId(1), MsgSeq(1), MsgId(5)), 10, 1_600);
    t.insert(
        sent(Uid(1), 2, ConvId(1), MsgSeq(2), MsgId(far - 1)),
        20,
        1_600,
    );
    t.insert(
        sent(Uid(1), 3, ConvId(1), MsgSeq(3), MsgId(far + 1)),
        30,
        1_600,
    );
    let spans: Vec<(u64, u64, u64)> = t
        .buckets()
        .map(|b| (b.start_ms, b.end_ms, b.base_id.0))
        .collect();
    assert_eq!(spans, [(0, 100, 5), (0, 100, far + 1)]);
    for (cmid, id) in [(1, 5), (2, far - 1), (3, far + 1)] {
        assert_eq!(ids(&t.candidates(Uid(1), cmid, 40, 1_600)), [id]);
    }
    // Both go together, once past the TTL.
    t.insert(
        sent(Uid(1), 4, ConvId(1), MsgSeq(4), MsgId(far + 2)),
        1_700,
        1_600,
    );
    assert_eq!(t.len(), 1);
}

#[test]
fn a_copy_shares_every_shard_and_an_insert_afterwards_copies_only_its_own() {
    let mut t = IdemTable::default();
    for i in 0..5_000u64 {
        t.insert(
            sent(Uid(1), i as u128, ConvId(1), MsgSeq(i + 1), MsgId(i + 1)),
            0,
            1_600,
        );
    }
    let copy = t.clone();
    t.insert(
        sent(Uid(1), 9_999, ConvId(1), MsgSeq(5_001), MsgId(5_001)),
        0,
        1_600,
    );
    let (a, b) = (&t.buckets[0].shards, &copy.buckets[0].shards);
    let shared = a
        .iter()
        .zip(b.iter())
        .filter(|(x, y)| Arc::ptr_eq(x, y))
        .count();
    assert_eq!(shared, SHARDS - 1, "one shard copied");
    assert_eq!(copy.len(), 5_000);
    assert_eq!(ids(&t.candidates(Uid(1), 9_999, 0, 1_600)), [5_001]);
    assert!(copy.candidates(Uid(1), 9_999, 0, 1_600).is_empty());
}

#[test]
fn a_closed_buckets_tables_are_merged_a_shard_per_insert_and_answer_the_same_meanwhile() {
    let mut t = IdemTable::default();
    let ttl = 16_000; // buckets of 1 s
    for i in 0..3_000u64 {
        t.insert(
            sent(Uid(2), i as u128, ConvId(1), MsgSeq(i + 1), MsgId(i + 1)),
            10,
            ttl,
        );
    }
    // About 3 keys a shard: all still in tables.
    let with_table = |t: &IdemTable, from: usize| {
        t.buckets[0].shards[from..]
            .iter()
            .filter(|s| s.table_len > 0)
            .count()
    };
    assert!(with_table(&t, 0) > SHARDS * 9 / 10, "{}", with_table(&t, 0));
    let before = t.buckets[0].entries();
    for j in 0..SHARDS as u64 + 10 {
        let k = 3_000 + j;
        t.insert(
            sent(Uid(2), k as u128, ConvId(1), MsgSeq(k + 1), MsgId(k + 1)),
            1_500,
            ttl,
        );
        let merged = (j as usize + 1).min(SHARDS);
        assert_eq!(t.buckets[0].merged, merged);
        assert_eq!(
            with_table(&t, 0),
            with_table(&t, merged),
            "none below {merged}"
        );
        for i in [0u64, 1_234, 2_999] {
            assert_eq!(ids(&t.candidates(Uid(2), i as u128, 1_500, ttl)), [i + 1]);
        }
    }
    assert_eq!(with_table(&t, 0), 0);
    assert_eq!(t.buckets[0].entries(), before);
    let runs = t.buckets[0]
        .shards
        .iter()
        .filter(|s| matches!(s.run, Run::Heap(_)))
        .count() as u64;
    assert_eq!(
        t.buckets[0].allocated(),
        before.len() as u64 * SLOT_BYTES + runs * 16 + SHARDS as u64 * SHARD_BYTES
    );
}

#[test]
fn a_closed_buckets_runs_go_to_the_scratch_file_and_answer_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let file = Arena::open(dir.path()).unwrap();
    let ttl = 16_000; // buckets of 1 s
                      // Three closed buckets of 100,000 keys: about 98 per shard, so
                      // most shards fill the half page that takes them to the file.
    let per = 100_000u64;
    let fill = |t: &mut IdemTable| {
        for i in 0..3 * per {
            t.insert(
                sent(Uid(2), i as u128, ConvId(1), MsgSeq(i + 1), MsgId(i + 1)),
                10 + i / per * 1_000,
                ttl,
            );
        }
        for j in 0..3 * SHARDS as u64 {
            let k = 3 * per + j;
            t.insert(
                sent(Uid(2), k as u128, ConvId(1), MsgSeq(k + 1), MsgId(k + 1)),
                3_500,
                ttl,
            );
        }
    };
    let mut heap = IdemTable::default();
    fill(&mut heap);
    let mut filed = IdemTable::default();
    filed.use_file(&file);
    fill(&mut filed);
    assert_eq!(filed, heap, "the same entries in the same buckets");
    let big_enough: u64 = heap
        .buckets
        .iter()
        .take(3)
        .flat_map(|b| b.shards.iter())
        .map(|s| {
            assert_eq!(s.table_len, 0, "closed buckets are merged");
            s.run.as_slice().len()
        })
        .filter(|n| *n >= FILED_SHARD_MIN)
        .map(|n| n as u64)
        .sum();
    let (n, pages) = filed.in_file();
    assert_eq!(n, big_enough, "every closed shard of half a page or more");
    assert!(n > 2 * per, "most keys: {n}");
    assert_eq!(pages, file.block_bytes());
    assert_eq!(
        filed.bytes().live + n * SLOT_BYTES,
        heap.bytes().live,
        "what is in the file is not counted on the heap"
    );
    for i in [
        0u64,
        per - 1,
        per,
        3 * per - 1,
        3 * per,
        3 * per + 3 * SHARDS as u64 - 1,
    ] {
        assert_eq!(
            ids(&filed.candidates(Uid(2), i as u128, 3_500, ttl)),
            [i + 1],
            "key {i}"
        );
    }
    // A table moved to the file later answers the same, and frees its
    // pages when its buckets expire.
    let mut late = heap.clone();
    late.use_file(&file);
    assert_eq!(late.in_file().0, big_enough);
    assert_eq!(late, heap);
    drop(filed);
    late.insert(
        sent(Uid(2), 9, ConvId(1), MsgSeq(9_999), MsgId(9_999)),
        40_000,
        ttl,
    );
    assert_eq!(late.in_file(), (0, 0));
    assert_eq!(file.block_bytes(), 0, "the expired buckets' pages are gone");
}

#[test]
fn the_newest_bucket_merges_its_tables_into_runs_in_the_file_and_keeps_them_small() {
    let dir = tempfile::tempdir().unwrap();
    let file = Arena::open(dir.path()).unwrap();
    let ttl = 16_000; // buckets of 1 s; every key here in one
    let n = 300_000u64; // about 293 a shard
    let key = |i: u64| sent(Uid(3), i as u128, ConvId(4), MsgSeq(i + 1), MsgId(i + 1));
    let mut heap = IdemTable::default();
    let mut filed = IdemTable::default();
    filed.use_file(&file);
    let mut copy = None;
    for i in 0..n {
        heap.insert(key(i), 10, ttl);
        filed.insert(key(i), 10, ttl);
        if i == n / 2 {
            // A checkpoint's copy, taken half way.
            copy = Some(filed.clone());
        }
    }
    let copy = copy.unwrap();
    assert_eq!(filed.buckets().count(), 1);
    assert_eq!(filed, heap, "the same entries wherever they are");
    let b = &filed.buckets[0];
    let in_tables: usize = b.shards.iter().map(|s| s.table_len).sum();
    let (in_runs, pages) = filed.in_file();
    assert_eq!(in_runs + in_tables as u64, n, "every run is in the file");
    // About 293 keys a shard: each merged several times, at a quarter
    // page of keys.
    assert!(
        in_runs > n / 2 && in_tables <= SHARDS * MERGE_MIN,
        "merged at a quarter page of keys a shard: {in_runs} in runs, {in_tables} in tables"
    );
    assert!(b
        .shards
        .iter()
        .all(|s| s.table_len < MERGE_MIN.max(s.run.as_slice().len() / MERGE_FRACTION)));
    let widest = b.shards.iter().map(|s| s.table.len()).max().unwrap();
    assert!(
        widest <= 64,
        "a young bucket's tables stay at 64 slots (1.5 KiB) at most: one has {widest}"
    );
    assert_eq!(
        filed.bytes().live,
        in_tables as u64 * SLOT_BYTES,
        "only the tables on the heap"
    );
    for i in (0..n).step_by(7).chain([n - 1]) {
        let c = filed.candidates(Uid(3), i as u128, 10, ttl);
        assert_eq!(ids(&c), [i + 1], "key {i}");
    }
    // The copy still answers as it was: the runs it shares were not
    // written over, and the later keys are not in it.
    assert_eq!(copy.len() as u64, n / 2 + 1);
    assert_eq!(ids(&copy.candidates(Uid(3), 77, 10, ttl)), [78]);
    assert!(copy.candidates(Uid(3), (n - 1) as u128, 10, ttl).is_empty());
    assert!(file.block_bytes() > pages, "the copy holds older runs");
    drop(copy);
    assert_eq!(file.block_bytes(), pages, "and gives them back");
    // Decoded from what a checkpoint stores, the runs go straight to
    // the file, with no tables.
    let mut decoded = IdemTable::default();
    decoded.use_file(&file);
    for b in filed.buckets() {
        decoded.push_decoded(b.start_ms, b.end_ms, b.base_id, b.entries());
    }
    assert_eq!(decoded, filed);
    assert_eq!(decoded.in_file().0, n);
    assert_eq!(decoded.bytes().live, 0);
    assert_eq!(ids(&decoded.candidates(Uid(3), 12_345, 10, ttl)), [12_346]);
}

#[test]
fn the_search_from_a_runs_guessed_place_finds_what_a_binary_search_finds() {
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        x = mix64(x.wrapping_add(0x9e37_79b9_7f4a_7c15));
        x
    };
    let shard = 0x2a5u64 << (64 - SHARD_BITS);
    let low = |v: u64| v >> SHARD_BITS;
    for n in [0usize, 1, 2, 3, 17, 170, 1_000, 4_096] {
        // Uniform, bunched at one end, and with runs of one value.
        for shape in 0..3 {
            let mut run: Vec<IdemSlot> = (0..n)
                .map(|i| {
                    let fp = match shape {
                        0 => shard | low(next()),
                        1 => shard | (low(next()) >> 40),
                        _ => shard | ((i as u64 / 5) << 20),
                    };
                    IdemSlot { fp, ..FREE }
                })
                .collect();
            run.sort_unstable();
            let mut asks: Vec<u64> = run.iter().map(|e| e.fp).collect();
            asks.extend((0..200).map(|_| shard | low(next())));
            asks.extend([shard, shard | (u64::MAX >> SHARD_BITS)]);
            asks.extend(run.iter().map(|e| e.fp.wrapping_add(1) | shard));
            for fp in asks {
                assert_eq!(
                    first_at_or_above(&run, fp),
                    run.partition_point(|e| e.fp < fp),
                    "n {n}, shape {shape}, fp {fp:x}"
                );
            }
        }
    }
}

#[test]
fn a_seq_is_made_whole_from_its_low_bits_and_the_head_at_or_above_it() {
    let big = (7u64 << 32) + 3;
    assert_eq!(seq_below(MsgSeq(big), 3), Some(MsgSeq(big)));
    assert_eq!(seq_below(MsgSeq(big), 2), Some(MsgSeq(big - 1)));
    // Low bits above the head's: the seq is in the previous 2^32.
    assert_eq!(
        seq_below(MsgSeq(big), 9),
        Some(MsgSeq(big - 3 - (1 << 32) + 9))
    );
    assert_eq!(seq_below(MsgSeq(5), 5), Some(MsgSeq(5)));
    // A conversation whose head is below the seq never held it.
    assert_eq!(seq_below(MsgSeq(5), 6), None);
}

/// A state whose conv 10 holds messages 1..=3 sent by uid 1, 2, 1,
/// with both uids members from seq 1 on.
fn state_with_shared_tags() -> crate::inbox::state::State {
    use crate::inbox::state::{Conv, MsgMeta, Period, State, OPEN};
    let mut st = State::new(1_000);
    st.idem = IdemTable::with_spread(no_spread);
    let mut c = Conv::default();
    for (i, sender) in [1u64, 2, 1].into_iter().enumerate() {
        c.msgs.push(MsgMeta {
            loc: 0,
            msg_id: MsgId(101 + i as u64),
            sender: Uid(sender),
            kind: MessageKind::Normal,
            flags: 0,
        });
    }
    for uid in [1, 2] {
        let p = Period {
            period_id: 0,
            join_seq: MsgSeq(1),
            leave_seq: OPEN,
        };
        Arc::make_mut(&mut c.members).insert(Uid(uid), vec![p]);
    }
    st.convs.insert(ConvId(10), std::sync::Arc::new(c));
    // Key 7 of uid 1 went to seq 1, key 7 of uid 2 to seq 2: one tag.
    st.idem
        .insert(sent(Uid(1), 7, ConvId(10), MsgSeq(1), MsgId(101)), 0, 1_000);
    st.idem
        .insert(sent(Uid(2), 7, ConvId(10), MsgSeq(2), MsgId(102)), 0, 1_000);
    st
}

#[test]
fn keys_sharing_a_tag_each_find_their_own_send_and_no_other() {
    let st = state_with_shared_tags();
    let one = st.idem_lookup(Uid(1), 7, 0).unwrap();
    let two = st.idem_lookup(Uid(2), 7, 0).unwrap();
    assert_eq!((one.msg_seq, one.msg_id), (MsgSeq(1), MsgId(101)));
    assert_eq!((two.msg_seq, two.msg_id), (MsgSeq(2), MsgId(102)));
    // Uid 3 shares the tag too but sent neither: a new send.
    assert_eq!(st.idem_lookup(Uid(3), 7, 0), None);
}

#[test]
fn a_reclaimed_send_is_taken_only_for_a_member_at_its_seq() {
    let mut st = state_with_shared_tags();
    let c = std::sync::Arc::make_mut(st.convs.get_mut(&ConvId(10)).unwrap());
    c.msgs.remove_front(2);
    c.msgs_base = MsgSeq(2);
    Arc::make_mut(&mut c.members).get_mut(&Uid(2)).unwrap()[0].join_seq = MsgSeq(2);
    // Uid 1 was a member at seq 1 (its send) but not uid 2, which
    // joined at seq 2: only uid 1's key still answers seq 1.
    let one = st.idem_lookup(Uid(1), 7, 0).unwrap();
    assert_eq!(one.msg_seq, MsgSeq(1));
    let two = st.idem_lookup(Uid(2), 7, 0).unwrap();
    assert_eq!(two.msg_seq, MsgSeq(2));
    assert_eq!(st.idem_lookup(Uid(3), 7, 0), None);
}
