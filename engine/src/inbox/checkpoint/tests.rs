//! Tests of the checkpoint file: its sections, the versions it reads,
//! and what a damaged file does.

use super::*;
use crate::api::{ConvId, MsgSeq};
use crate::log::PwriteIo;
use std::path::Path;

/// A state whose encoding takes several [`WRITE_CHUNK`]s: one
/// conversation of 100,000 messages (26 bytes each in the body).
fn large_state() -> State {
    let mut st = State::new(0);
    st.evt_lsn = 9;
    let conv = Arc::make_mut(st.convs.entry(ConvId(7)).or_default());
    for i in 0..100_000u64 {
        conv.msgs.push(MsgMeta {
            loc: i << 8,
            msg_id: crate::api::MsgId(1_000 + i),
            sender: Uid(i % 3),
            kind: crate::api::MessageKind::Normal,
            flags: 0,
        });
    }
    st
}

#[test]
fn a_checkpoint_streamed_in_chunks_is_the_canonical_body_between_its_header_and_crc() {
    let tmp = tempfile::tempdir().unwrap();
    let st = large_state();
    let body = encode_state(&st);
    assert!(body.len() > 2 * WRITE_CHUNK, "{} bytes", body.len());
    let io: Arc<dyn LogIo> = Arc::new(PwriteIo);
    write_state(&io, tmp.path(), &st).unwrap();
    let (_, path) = list(tmp.path()).unwrap().remove(0);
    let file = fs::read(&path).unwrap();
    assert_eq!(&file[..8], MAGIC);
    assert_eq!(file[8..16], 9u64.to_le_bytes());
    assert_eq!(file[16..24], (body.len() as u64).to_le_bytes());
    assert_eq!(&file[24..24 + body.len()], &body[..]);
    let (data, crc) = file.split_at(file.len() - 4);
    assert_eq!(crc, crc32fast::hash(data).to_le_bytes());
    let (lsn, back) = read(&path).unwrap();
    assert_eq!(lsn, 9);
    assert_eq!(encode_state(&back), body, "it reads back as the same state");
}

#[test]
fn a_write_error_in_the_middle_of_a_streamed_checkpoint_leaves_no_file_and_the_older_one() {
    let tmp = tempfile::tempdir().unwrap();
    let faulty = Arc::new(crate::log::FaultyIo::new());
    let io: Arc<dyn LogIo> = faulty.clone();
    let mut older = State::new(0);
    older.evt_lsn = 3;
    write_state(&io, tmp.path(), &older).unwrap();
    // The second chunk of the body fails.
    faulty.fail_nth_write(2);
    assert!(write_state(&io, tmp.path(), &large_state()).is_err());
    assert_eq!(faulty.failures_fired(), 1);
    let names: Vec<String> = fs::read_dir(dir(tmp.path()))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names,
        [file_name(3, false)],
        "no tmp file, the older one kept"
    );
    let kept = read(&list(tmp.path()).unwrap()[0].1).unwrap().1;
    assert_eq!(encode_state(&kept), encode_state(&older));
}

#[test]
fn an_empty_short_or_cut_checkpoint_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let io: Arc<dyn LogIo> = Arc::new(PwriteIo);
    write_state(&io, tmp.path(), &large_state()).unwrap();
    let (_, path) = list(tmp.path()).unwrap().remove(0);
    let whole = fs::read(&path).unwrap();
    for (len, why) in [
        (0, "bad magic or too short"),
        (20, "bad magic or too short"),
        (whole.len() - 1, "checksum mismatch"),
    ] {
        fs::write(&path, &whole[..len]).unwrap();
        assert_eq!(read(&path).err().as_deref(), Some(why), "cut at {len}");
    }
}

#[test]
fn a_second_checkpoint_at_the_same_lsn_is_kept_as_a_separate_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let io: Arc<dyn LogIo> = Arc::new(PwriteIo);
    let write = |lsn| {
        let mut st = State::new(0);
        st.evt_lsn = lsn;
        write_state(&io, tmp.path(), &st)
    };
    write(5).unwrap();
    write(5).unwrap();
    let lsns: Vec<u64> = list(tmp.path()).unwrap().iter().map(|(l, _)| *l).collect();
    assert_eq!(lsns, [5, 5], "both retained checkpoints cover LSN 5");
    for (_, path) in list(tmp.path()).unwrap() {
        assert_eq!(read(&path).unwrap().0, 5);
    }
    write(5).unwrap();
    assert_eq!(
        list(tmp.path()).unwrap().len(),
        2,
        "a third copy replaces the second"
    );
    write(7).unwrap();
    let lsns: Vec<u64> = list(tmp.path()).unwrap().iter().map(|(l, _)| *l).collect();
    assert_eq!(lsns, [7, 5], "the newest two are kept");
}

/// `body` (format 3) with its sections changed by `edit`, and its
/// table made again to match.
fn with_sections(body: &[u8], edit: impl FnOnce(&mut Vec<(u32, Vec<u8>)>)) -> Vec<u8> {
    let mut sections: Vec<(u32, Vec<u8>)> = section_table(body)
        .unwrap()
        .into_iter()
        .map(|(tag, bytes)| (tag, bytes.to_vec()))
        .collect();
    edit(&mut sections);
    let mut out: Vec<u8> = sections.iter().flat_map(|(_, b)| b.clone()).collect();
    for (tag, bytes) in &sections {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    }
    out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    out
}

#[test]
fn every_section_is_written_once_in_tag_order_and_the_table_accounts_for_every_byte() {
    let body = encode_state(&large_state());
    let tags: Vec<u32> = section_table(&body).unwrap().iter().map(|s| s.0).collect();
    assert_eq!(
        tags,
        [
            tag::HEAD,
            tag::CONVS,
            tag::USERS,
            tag::SNAPSHOTS,
            tag::MSG_BASES,
            tag::EDIT_LINKS,
            tag::LARGE_GROUPS,
            tag::IDEMPOTENCY,
            tag::REPLICA_INDEX
        ]
    );
    let head = section_table(&body).unwrap()[0].1;
    assert_eq!(head.len(), 24);
    assert_eq!(head[16..], 9u64.to_le_bytes(), "evt_lsn");
}

#[test]
fn a_section_of_an_unknown_tag_is_skipped_and_the_state_round_trips_through_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let mut st = State::new(0);
    st.evt_lsn = 9;
    st.replica_index = 4;
    Arc::make_mut(st.convs.entry(ConvId(7)).or_default())
        .edits
        .make_mut()
        .insert(MsgSeq(1), vec![MsgSeq(2)]);
    let body = encode_state(&st);
    // What a later version may add: sections under tags this version
    // does not know, after its own.
    let grown = with_sections(&body, |s| {
        s.push((tag::FANOUT + 1, b"a section from the future".to_vec()));
        s.push((u32::MAX, vec![0xff; 1000]));
    });
    assert_eq!(decode_state(&grown).unwrap(), st);
    // Through a file: header, CRC and mapping, as recovery reads it.
    let mut file = Vec::new();
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&st.evt_lsn.to_le_bytes());
    file.extend_from_slice(&(grown.len() as u64).to_le_bytes());
    file.extend_from_slice(&grown);
    file.extend_from_slice(&crc32fast::hash(&file).to_le_bytes());
    fs::create_dir(dir(tmp.path())).unwrap();
    let path = dir(tmp.path()).join(file_name(st.evt_lsn, false));
    fs::write(&path, &file).unwrap();
    let (lsn, back) = read(&path).unwrap();
    assert_eq!(lsn, 9);
    assert_eq!(back, st);
    // Written again, the unknown sections are gone: this version
    // writes what it knows.
    assert_eq!(encode_state(&back), body);
}

#[test]
fn a_body_with_a_bad_table_or_misordered_sections_is_refused() {
    let body = encode_state(&large_state());
    let refused = |body: &[u8], why: &str| {
        assert_eq!(
            decode_state(body).err(),
            Some(DecodeError(leak(why))),
            "{why}"
        );
    };
    fn leak(s: &str) -> &'static str {
        Box::leak(s.to_owned().into_boxed_str())
    }
    refused(&body[..2], "checkpoint body too short");
    let mut huge = body.clone();
    let n = huge.len();
    huge[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
    refused(&huge, "checkpoint section table longer than the body");
    let mut long = body.clone();
    let first_len_at = n - 4 - 9 * TABLE_ENTRY + 4;
    long[first_len_at..first_len_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    refused(&long, "checkpoint section runs past its table");
    let twice = with_sections(&body, |s| {
        let users = s[2].clone();
        s.insert(3, users);
    });
    refused(&twice, "checkpoint sections repeated or out of order");
    let headless = with_sections(&body, |s| {
        s.remove(0);
    });
    refused(&headless, "checkpoint does not begin with its head section");
    let padded = with_sections(&body, |s| s[1].1.push(0));
    refused(&padded, "trailing bytes in a checkpoint section");
}

/// A section ends where its bytes do: a count checked against the
/// bytes left must not expect more per item than the smallest item.
#[test]
fn a_user_whose_last_conversation_row_is_the_smallest_one_decodes() {
    use crate::inbox::state::UserConv;
    let mut st = State::new(0);
    let user = Arc::make_mut(st.users.entry(Uid(3)).or_default());
    let uc = UserConv::default();
    user.order.insert(uc.key(ConvId(7)));
    user.convs.insert(ConvId(7), uc);
    let body = encode_state(&st);
    assert_eq!(decode_state(&body).unwrap(), st);
}

#[test]
fn edits_large_groups_and_marker_clears_round_trip_and_a_checkpoint_without_their_sections_has_none(
) {
    use crate::inbox::state::{LargeMode, LastEntry};
    let mut st = State::new(0);
    let conv = Arc::make_mut(st.convs.entry(ConvId(7)).or_default());
    conv.edits.make_mut().insert(MsgSeq(1), vec![MsgSeq(2)]);
    conv.large = Some(Box::new(LargeMode {
        switch_seq: MsgSeq(4),
        last: LastEntry {
            msg_seq: MsgSeq(9),
            msg_id: crate::api::MsgId(12),
            sender: crate::api::Uid(3),
            summary: crate::inbox::state::Summary::new(b"hi"),
            at_ms: 77,
        },
        stamp: 0,
    }));
    let user = Arc::make_mut(st.users.entry(Uid(3)).or_default());
    let uc = crate::inbox::state::UserConv {
        cleared_seq: MsgSeq(8),
        ..Default::default()
    };
    user.order.insert(uc.key(ConvId(7)));
    user.convs.insert(ConvId(7), uc);
    st.replica_index = 3;
    let body = encode_state(&st);
    assert_eq!(
        decode_state(&body).unwrap(),
        st,
        "every section round-trips"
    );
    let bare = with_sections(&body, |s| {
        s.retain(|(t, _)| [tag::HEAD, tag::CONVS, tag::USERS].contains(t))
    });
    let mut plain = st.clone();
    let conv = Arc::make_mut(plain.convs.get_mut(&ConvId(7)).unwrap());
    conv.edits = Default::default();
    conv.large = None;
    let user = Arc::make_mut(plain.users.get_mut(&Uid(3)).unwrap());
    user.convs.get_mut(&ConvId(7)).unwrap().cleared_seq = MsgSeq(0);
    plain.replica_index = 0;
    assert_eq!(decode_state(&bare).unwrap(), plain);
}

/// A checkpoint as format 2 wrote it (`INBXCKP2`, untagged), committed
/// as a fixture: written by the engine of that format after two users
/// joined conversation 10 and five joined 20 (a large group from its
/// fourth member), user 2 registered device 7, three messages and an
/// edit were sent, user 2 read up to `msg_seq` 3 and pinned 10, and one
/// round was replicated (a message in 10) at LSN 15.
#[test]
fn a_format_2_checkpoint_still_loads_and_is_written_again_as_format_3() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoint-v2.bin");
    assert_eq!(&fs::read(&path).unwrap()[..8], MAGIC_V2);
    let (lsn, st) = read(&path).unwrap();
    assert_eq!((lsn, st.evt_lsn, st.replica_index), (15, 15, 1));
    assert_eq!(st.users.len(), 5);
    let small = &st.convs[&ConvId(10)];
    assert_eq!(small.head(), MsgSeq(6), "2 joins, 2 sends, an edit, 1 more");
    assert!(small.large.is_none());
    assert!(!small.edits.is_empty(), "the edit is linked to its target");
    assert!(st.convs[&ConvId(20)].large.is_some());
    let user = &st.users[&Uid(2)];
    assert_eq!(user.devices.len(), 1);
    assert_eq!(user.devices[0].row.device, crate::api::DeviceId(7));
    let row = user.convs.get(&ConvId(10)).unwrap();
    assert_eq!((row.read_seq, row.pinned), (MsgSeq(3), true));
    assert!(st.idem.len() >= 4, "the sends' idempotency keys");
    let body = encode_state(&st);
    assert_eq!(decode_state(&body).unwrap(), st);
}

#[test]
fn checkpoint_names_other_than_the_two_forms_are_ignored() {
    assert_eq!(
        parse_name("ckpt-00000000000000000005.bin"),
        Some((5, false))
    );
    assert_eq!(
        parse_name("ckpt-00000000000000000005-2.bin"),
        Some((5, true))
    );
    assert_eq!(parse_name("ckpt-00000000000000000005.bin.tmp"), None);
    assert_eq!(parse_name("ckpt-5.bin"), None);
    assert_eq!(parse_name("ckpt-0000000000000000000x.bin"), None);
}
