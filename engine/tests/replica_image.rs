//! Replica images: a leader's whole state at one index, staged on a node
//! that has none of its files, is that state (same digest, same answers)
//! and takes the entries after it; a damaged, cut or mislabelled image is
//! refused and leaves nothing behind.

mod replica_common;

use std::sync::Arc;
use std::time::Duration;

use inbox_engine::inbox::{exchange_dirs, image_info, stage_image, Entry, ImageCheck, ImageInfo};
use inbox_engine::*;
use replica_common::*;
use sha2::Digest;

const SEG: u64 = 64 << 10;

/// Joins, devices, sends (enough to roll segments), a sync with an ACK, a
/// recall and a read cursor.
fn workload(ib: &Inbox, round: u128) {
    for (uid, conv) in [(1, 10), (2, 10), (3, 11), (1, 11), (4, 12)] {
        ib.join(Uid(uid), ConvId(conv)).wait().unwrap();
    }
    ib.register_device(Uid(2), DeviceId(1)).wait().unwrap();
    let body = "x".repeat(900);
    let mut first = None;
    for i in 0..80u128 {
        let conv = 10 + (i % 3) as u64;
        let sender = [1, 3, 4][(i % 3) as usize];
        let r = send(ib, conv, sender, round * 10_000 + i, &body).unwrap();
        first.get_or_insert(r.msg_id);
    }
    catch_up(ib, 2, 1);
    ib.recall(RecallRequest {
        conv: ConvId(10),
        sender: Uid(1),
        client_msg_id: round * 10_000 + 900,
        target: first.unwrap(),
    })
    .wait()
    .unwrap();
    ib.mark_read(Uid(2), ConvId(10), MsgSeq(5)).wait().unwrap();
}

/// An image of `ib` built in `scratch` (its logs under `build`, the image
/// in `image`), and the image's bytes.
fn export(
    ib: &Inbox,
    scratch: &std::path::Path,
    meta: &mut dyn FnMut(u64) -> Vec<u8>,
) -> (ImageInfo, Vec<u8>) {
    let file = scratch.join("image");
    let info = ib
        .export_image(&scratch.join("build"), &file, meta)
        .unwrap();
    (info, std::fs::read(file).unwrap())
}

/// What an [`ImageCheck`] fed `image` in chunks of `size` says.
fn check_in_chunks(image: &[u8], size: usize) -> Result<ImageInfo> {
    let mut check = ImageCheck::new();
    for chunk in image.chunks(size) {
        check.push(chunk);
    }
    assert_eq!(check.len(), image.len() as u64);
    check.finish()
}

/// A leader that ran the workload twice with a compaction between, its
/// entries kept.
fn leader_with_history() -> (Node, Vec<Entry>) {
    let leader = Node::new(SEG);
    let pump = Pump::start(leader.ib().lead().unwrap(), vec![]);
    workload(leader.ib(), 1);
    leader.clock.advance(Duration::from_secs(8 * 24 * 3600));
    leader.ib().compact().unwrap();
    workload(leader.ib(), 2);
    let log = pump.stop();
    let entries = log.lock().unwrap().clone();
    (leader, entries)
}

#[test]
fn an_image_staged_on_a_new_node_is_the_leaders_state_and_takes_the_entries_after_it() {
    let (leader, _) = leader_with_history();
    let scratch = tempfile::tempdir().unwrap();
    let (info, image) = export(leader.ib(), scratch.path(), &mut |i| {
        format!("meta {i}").into_bytes()
    });
    assert!(!scratch.path().join("build").exists(), "scratch removed");
    assert_eq!(info.index, leader.ib().replica_index());
    assert_eq!(info.digest, leader.ib().replica_digest());
    assert_eq!(info.meta, format!("meta {}", info.index).into_bytes());
    assert_eq!(image_info(&image).unwrap(), info);
    // Checked as it streams in, in chunks of any size, it says the same.
    for size in [1, 7, 31, 32, 33, 52, 4096, image.len()] {
        assert_eq!(
            check_in_chunks(&image, size).unwrap(),
            info,
            "chunks of {size}"
        );
    }

    // A node with none of the leader's files, other segment sizes.
    let mut node = Node::follower(SEG * 2);
    let staged = node.dir.path().join("staged");
    let cfg = config(&staged, &node.clock, SEG * 2);
    assert_eq!(stage_image(&image, &staged, &cfg).unwrap(), info);
    drop(node.inbox.take());
    let new_dir = tempfile::tempdir().unwrap();
    std::fs::remove_dir(new_dir.path()).unwrap();
    std::fs::rename(&staged, new_dir.path()).unwrap();
    node.dir = new_dir;
    node.open_again();
    let ib = node.ib();
    assert_eq!(ib.replica_index(), info.index);
    assert_eq!(ib.replica_digest(), leader.ib().replica_digest());
    assert_eq!(answers(ib), answers(leader.ib()));
    ib.check_invariants().unwrap();
    ib.check_segment_refs().unwrap();

    // It follows on from the image's index.
    let pump = Pump::start(leader.ib().lead().unwrap(), vec![Arc::clone(ib)]);
    workload(leader.ib(), 3);
    wait_index(ib, leader.ib().replica_index());
    pump.stop();
    assert_eq!(ib.replica_digest(), leader.ib().replica_digest());
    assert_eq!(answers(ib), answers(leader.ib()));
}

#[test]
fn a_damaged_or_cut_image_is_refused_and_stages_nothing() {
    let (leader, _) = leader_with_history();
    let scratch = tempfile::tempdir().unwrap();
    let (_, image) = export(leader.ib(), scratch.path(), &mut |_| Vec::new());
    let node = Node::follower(SEG);
    let staged = node.dir.path().join("staged");
    let cfg = config(&staged, &node.clock, SEG);
    let step = (image.len() / 97).max(1);
    for at in (0..image.len()).step_by(step) {
        let mut bad = image.clone();
        bad[at] ^= 0x40;
        let err = stage_image(&bad, &staged, &cfg).unwrap_err();
        assert!(matches!(err, Error::BadRequest(_)), "flip at {at}: {err}");
        assert!(!staged.exists(), "flip at {at} left a directory");
        let err = check_in_chunks(&bad, 1000).unwrap_err();
        assert!(matches!(err, Error::BadRequest(_)), "flip at {at}: {err}");
    }
    for len in [0, 10, 60, image.len() / 2, image.len() - 1] {
        let err = stage_image(&image[..len], &staged, &cfg).unwrap_err();
        assert!(matches!(err, Error::BadRequest(_)), "cut at {len}: {err}");
        assert!(!staged.exists());
        let err = check_in_chunks(&image[..len], 1000).unwrap_err();
        assert!(matches!(err, Error::BadRequest(_)), "cut at {len}: {err}");
    }
    // An image longer than it should be: the checksum is then not where
    // it was.
    let mut long = image.clone();
    long.extend_from_slice(&[0; 5]);
    assert!(check_in_chunks(&long, 1000).is_err());
    // A header naming 4 GiB of metadata is refused, not buffered.
    let mut huge = image[..48].to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&[7; 100_000]);
    let err = check_in_chunks(&huge, 4096).unwrap_err();
    assert!(err.to_string().contains("metadata is longer"), "{err}");
}

#[test]
fn an_image_whose_state_is_not_the_one_it_names_is_refused_after_unpacking() {
    let (leader, _) = leader_with_history();
    let scratch = tempfile::tempdir().unwrap();
    let (_, image) = export(leader.ib(), scratch.path(), &mut |_| Vec::new());
    // The digest it names (bytes 16..48) changed, the checksum made to
    // match: only opening the unpacked state tells.
    let mut lying = image[..image.len() - 32].to_vec();
    lying[16] ^= 1;
    let sum = sha2::Sha256::digest(&lying);
    lying.extend_from_slice(&sum);
    let node = Node::follower(SEG);
    let staged = node.dir.path().join("staged");
    let cfg = config(&staged, &node.clock, SEG);
    let err = stage_image(&lying, &staged, &cfg).unwrap_err();
    assert!(err.to_string().contains("not the one it names"), "{err}");
    assert!(!staged.exists());
}

#[test]
fn exchanging_two_directories_swaps_their_contents_in_one_step() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    std::fs::write(a.join("f"), b"old").unwrap();
    std::fs::write(b.join("f"), b"new").unwrap();
    exchange_dirs(&b, &a).unwrap();
    assert_eq!(std::fs::read(a.join("f")).unwrap(), b"new");
    assert_eq!(std::fs::read(b.join("f")).unwrap(), b"old");
    assert!(exchange_dirs(&root.path().join("missing"), &a).is_err());
    assert_eq!(std::fs::read(a.join("f")).unwrap(), b"new");
}

#[test]
fn either_side_of_the_exchange_opens_whole_on_the_old_state_or_the_new_one() {
    let (leader, _) = leader_with_history();
    let scratch = tempfile::tempdir().unwrap();
    let (info, image) = export(leader.ib(), scratch.path(), &mut |_| Vec::new());
    // A node with a state of its own.
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let staged = root.path().join(".data.install");
    let clock = Arc::new(inbox_engine::inbox::ManualClock::new(T0));
    let open = |dir: &std::path::Path| Inbox::open(config(dir, &clock, SEG)).unwrap();
    let ib = open(&data);
    ib.join(Uid(9), ConvId(90)).wait().unwrap();
    send(&ib, 90, 9, 1, "the node's own").unwrap();
    let old = (ib.replica_index(), ib.replica_digest());
    stage_image(&image, &staged, &config(&staged, &clock, SEG)).unwrap();
    ib.shutdown().unwrap();
    drop(ib);

    // Stopped before the exchange: the data directory is the old state.
    let ib = open(&data);
    assert_eq!((ib.replica_index(), ib.replica_digest()), old);
    ib.shutdown().unwrap();
    drop(ib);

    // Stopped after it: the data directory is the image's state, the old
    // one is whole beside it until removed.
    exchange_dirs(&staged, &data).unwrap();
    let ib = open(&data);
    assert_eq!(
        (ib.replica_index(), ib.replica_digest()),
        (info.index, info.digest)
    );
    assert_eq!(answers(&ib), answers(leader.ib()));
    ib.shutdown().unwrap();
    drop(ib);
    let ib = open(&staged);
    assert_eq!((ib.replica_index(), ib.replica_digest()), old);
}

#[test]
fn a_copy_waiting_for_a_deposed_leaders_rounds_finishes_once_its_leadership_is_ended() {
    // Found by group_kills_under_load: a leader's snapshot build took its
    // copy while a round was handed to raft and not yet committed; the
    // copy waits for the round to settle. Then the leader was deposed, and
    // its step down (`follow`) queued behind the copy on the sequencer
    // while holding the consensus layer's lock that every append takes:
    // the node answered nothing more. Ending the leadership first fails the
    // round, so the copy, and then the step down, finish.
    let leader = Node::new(SEG);
    let handle = leader.ib().lead().unwrap();
    let never_committed = leader.ib().join(Uid(1), ConvId(1));
    let handed = handle.wait_entries(Duration::from_secs(10));
    assert_eq!(
        handed.len(),
        1,
        "the round was handed to the consensus layer"
    );
    let scratch = tempfile::tempdir().unwrap();
    let ib = Arc::clone(leader.ib());
    let dir = scratch.path().to_path_buf();
    let copy = std::thread::spawn(move || {
        ib.export_image(&dir.join("build"), &dir.join("image"), &mut |_| Vec::new())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !copy.is_finished(),
        "the copy waits for the round to settle"
    );

    handle.end("another node leads");
    let (tx, rx) = std::sync::mpsc::channel();
    let ib = Arc::clone(leader.ib());
    std::thread::spawn(move || tx.send(ib.follow()));
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the step down finished")
        .unwrap();
    // The copy holds the failed round's effects (rounds are applied
    // before they commit): the consensus layer discards the round next,
    // which makes its build take a new copy.
    copy.join().unwrap().expect("the image was built");
    let err = never_committed.wait().unwrap_err();
    assert!(matches!(err, Error::NotLeader(_)), "{err}");
}

#[test]
fn a_round_made_after_the_leadership_was_ended_is_never_handed_out_and_fails() {
    let leader = Node::new(SEG);
    let handle = leader.ib().lead().unwrap();
    handle.end("another node leads");
    // The sequencer has not stepped down yet: it still marks rounds with
    // the ended leadership.
    let late = leader.ib().join(Uid(1), ConvId(1));
    let err = late.wait().unwrap_err();
    assert!(matches!(err, Error::NotLeader(_)), "{err}");
    assert!(handle.take_entries().is_empty(), "an entry was handed out");
}

/// Bytes of `path` in unwritten (allocated, never written) extents, from
/// the file system's extent map (`FS_IOC_FIEMAP`).
fn unwritten_bytes(path: &std::path::Path) -> u64 {
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Extent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }
    #[repr(C)]
    struct Map {
        start: u64,
        length: u64,
        flags: u32,
        mapped: u32,
        count: u32,
        reserved: u32,
        extents: [Extent; 512],
    }
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    const FIEMAP_FLAG_SYNC: u32 = 1;
    const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let mut map = Map {
        start: 0,
        length: u64::MAX,
        flags: FIEMAP_FLAG_SYNC,
        mapped: 0,
        count: 512,
        reserved: 0,
        extents: [Extent::default(); 512],
    };
    // SAFETY: `map` is a properly laid out `struct fiemap` with room for
    // `count` extents, and the fd is open for the call.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP, &mut map) };
    assert_eq!(
        rc,
        0,
        "FIEMAP on {}: {} (this test needs a file system with unwritten extents, such as ext4 or XFS)",
        path.display(),
        std::io::Error::last_os_error()
    );
    assert!(map.mapped < 512, "more extents than the test reads");
    map.extents[..map.mapped as usize]
        .iter()
        .filter(|e| e.flags & FIEMAP_EXTENT_UNWRITTEN != 0)
        .map(|e| e.length)
        .sum()
}

#[test]
fn a_staged_images_active_segments_are_written_in_full_so_the_next_commits_overwrite_written_blocks(
) {
    let (leader, _) = leader_with_history();
    let scratch = tempfile::tempdir().unwrap();
    let (info, image) = export(leader.ib(), scratch.path(), &mut |_| Vec::new());
    // On the build's own disk, not tmpfs: tmpfs has no unwritten extents.
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let staged = root.path().join("staged");
    let clock = Arc::new(inbox_engine::inbox::ManualClock::new(T0));
    let cfg = config(&staged, &clock, SEG);
    assert_eq!(stage_image(&image, &staged, &cfg).unwrap(), info);
    // The leader's compaction left one segment per log, the active one,
    // and the image holds it; the open that checked the staged state
    // prepared a spare after it (written, as every prepared segment is).
    let segments = |log: &str| -> Vec<std::path::PathBuf> {
        let mut segs: Vec<_> = std::fs::read_dir(staged.join(log))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "seg"))
            .collect();
        segs.sort();
        segs
    };
    let active = staged.join("evt").join("0000000001.seg");
    for log in ["evt", "msg"] {
        let segs = segments(log);
        assert_eq!(segs.len(), 2, "{log}: {segs:?}");
        for seg in &segs {
            assert_eq!(std::fs::metadata(seg).unwrap().len(), SEG);
            assert_eq!(
                unwritten_bytes(seg),
                0,
                "{} has unwritten space: commits into it would convert extents",
                seg.display()
            );
        }
    }
    // The installed node's next commits do go into the image's active
    // segment, past the data the image brought.
    let data_end = |path: &std::path::Path| {
        let bytes = std::fs::read(path).unwrap();
        bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1)
    };
    let before = data_end(&active);
    let ib = Inbox::open(cfg).unwrap();
    ib.follow().unwrap();
    ib.apply_entry(Entry::empty(info.index + 1)).wait().unwrap();
    ib.shutdown().unwrap();
    assert!(data_end(&active) > before, "the commit went elsewhere");
    // A file only allocated, beside them, does show unwritten space: the
    // check above can fail on this file system.
    let control = root.path().join("allocated");
    let f = std::fs::File::create(&control).unwrap();
    // SAFETY: plain integer arguments; the fd is owned by `f`.
    let rc =
        unsafe { libc::posix_fallocate(std::os::unix::io::AsRawFd::as_raw_fd(&f), 0, SEG as i64) };
    assert_eq!(rc, 0);
    assert_eq!(unwritten_bytes(&control), SEG);
}
