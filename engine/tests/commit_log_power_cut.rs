//! Power cuts of the whole data directory with message bodies in the
//! commit log (R20): a backend that images the directory, as a power cut
//! would leave it (`FaultyIo::crash_image_tree`: unsynced writes dropped
//! or torn, unsynced directory entries undone), right before every
//! mutating IO operation of a send's commit and of a compaction pass that
//! moves bodies from `evt` to `msg`. Every image must open (and verify)
//! with every acknowledged send present and its body readable, and
//! nothing unacknowledged half-present.
//!
//! The model and the repair at open agree on the whole store too: the
//! newest `evt` segment cut at each batch's start, one byte in, its
//! middle, one byte before its end and its end, as a power cut leaves it
//! (zeros from there on, the file's length kept), opens, verifies, and
//! serves exactly the sends of the batches whole before the cut; the same
//! segment shortened to the same place, and an older segment shortened at
//! any of those places, is refused by open and verify alike, naming the
//! size expected, with the file left as it was: never served short.

mod inbox_common;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use inbox_common::*;
use inbox_engine::inbox::{verify_data_dir, CompactionStep, ManualClock};
use inbox_engine::log::{FaultyIo, LogIo, SyncPolicy};
use inbox_engine::*;
use parking_lot::Mutex;

const CONV: ConvId = ConvId(10);
const HOUR: Duration = Duration::from_secs(3600);
/// Images per cut: unsynced writes dropped, and two torn variants.
const SEEDS: [Option<u64>; 3] = [None, Some(7), Some(1234)];

fn tune(c: &mut InboxConfig) {
    c.sync = SyncPolicy::Always;
    c.segment_bytes = 4096;
    c.safety_window = HOUR;
    c.compaction_interval = None;
}

/// A `FaultyIo` that, while armed, images the directory before each
/// mutating operation.
#[derive(Debug)]
struct CutIo {
    inner: Arc<FaultyIo>,
    root: PathBuf,
    armed: AtomicBool,
    images: Mutex<Vec<(String, tempfile::TempDir)>>,
}

impl CutIo {
    fn new(root: &Path) -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::new(FaultyIo::new()),
            root: root.to_path_buf(),
            armed: AtomicBool::new(false),
            images: Mutex::new(Vec::new()),
        })
    }

    fn cut(&self, op: &str) {
        if !self.armed.load(Ordering::Acquire) {
            return;
        }
        let mut images = self.images.lock();
        let n = images.len() / SEEDS.len();
        for seed in SEEDS {
            let img = tempfile::tempdir().unwrap();
            self.inner
                .crash_image_tree(&self.root, img.path(), seed)
                .unwrap();
            images.push((format!("cut {n} before {op}, torn seed {seed:?}"), img));
        }
    }

    fn take(&self) -> Vec<(String, tempfile::TempDir)> {
        std::mem::take(&mut *self.images.lock())
    }
}

impl LogIo for CutIo {
    fn name(&self) -> &'static str {
        "cut"
    }
    fn create_preallocated(&self, path: &Path, len: u64) -> io::Result<File> {
        self.cut("create");
        self.inner.create_preallocated(path, len)
    }
    fn open_existing(&self, path: &Path) -> io::Result<File> {
        self.inner.open_existing(path)
    }
    fn allocate(&self, file: &File, len: u64) -> io::Result<()> {
        self.inner.allocate(file, len)
    }
    fn write_at(&self, file: &File, offset: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        self.cut("write");
        self.inner.write_at(file, offset, buf, false)?;
        if sync {
            self.sync_data(file)?;
        }
        Ok(())
    }
    fn sync_data(&self, file: &File) -> io::Result<()> {
        self.cut("fdatasync");
        self.inner.sync_data(file)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.cut("rename");
        self.inner.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.cut("unlink");
        self.inner.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.cut("directory fsync");
        self.inner.sync_dir(dir)
    }
}

fn cfg(dir: &Path, clock: &Arc<ManualClock>) -> InboxConfig {
    let mut c = config(dir, clock);
    tune(&mut c);
    c
}

/// A body that does not compress, so a few messages fill a segment.
fn body(i: u64) -> Bytes {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..300)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect::<Vec<_>>()
        .into()
}

fn send(ib: &Inbox, i: u64) -> Result<SendReply> {
    ib.send(SendRequest {
        conv: CONV,
        sender: Uid(1),
        client_msg_id: u128::from(i),
        msg_type: 1,
        payload: body(i),
    })
    .wait()
}

/// Every message uid 2 can read, (msg_seq, payload), oldest first; every
/// body must be readable.
fn messages(ib: &Inbox) -> Vec<(MsgSeq, Bytes)> {
    let pulled = ib.pull(Uid(2), &[(CONV, MsgSeq(0))], 500).unwrap();
    pulled[0]
        .messages
        .iter()
        .filter(|m| m.kind == MessageKind::Normal)
        .map(|m| (m.msg_seq, m.payload.clone()))
        .collect()
}

/// uid 2's message events (conv, msg_seq), as a fresh device syncs them.
fn events(ib: &Inbox) -> Vec<MsgSeq> {
    let dev = ib.register_device(Uid(2), DeviceId(77)).wait().unwrap();
    let page = ib
        .sync(SyncRequest {
            uid: Uid(2),
            device: DeviceId(77),
            generation: Some(dev.device.generation),
            local_applied_seq: SyncSeq(0),
            limit: 500,
            batch_token: None,
        })
        .wait()
        .unwrap();
    page.events
        .iter()
        .filter(|e| e.kind == EventKind::Msg)
        .map(|e| e.msg_seq)
        .collect()
}

/// Opens an image and checks it: it verifies and opens; every send of
/// `acked` is there with its body; `maybe` (unacknowledged) is there whole
/// or not at all, as a message and as an event alike; nothing else is.
/// Returns whether `maybe` landed.
fn check_image(
    what: &str,
    img: &Path,
    clock: &Arc<ManualClock>,
    acked: &[u64],
    maybe: Option<u64>,
) -> bool {
    let c = cfg(img, clock);
    if let Err(e) = verify_data_dir(&c) {
        panic!("{what}: verify refuses: {e}");
    }
    let ib = Inbox::open_with_io(c, Arc::new(FaultyIo::new()))
        .unwrap_or_else(|e| panic!("{what}: open refuses: {e}"));
    let got = messages(&ib);
    let want: Vec<Bytes> = acked.iter().map(|i| body(*i)).collect();
    let bodies: Vec<Bytes> = got.iter().map(|(_, b)| b.clone()).collect();
    let landed = bodies.len() == want.len() + 1;
    if landed {
        assert_eq!(bodies[..want.len()], want[..], "{what}");
        assert_eq!(
            Some(&bodies[want.len()]),
            maybe.map(body).as_ref(),
            "{what}"
        );
    } else {
        assert_eq!(
            bodies, want,
            "{what}: an acknowledged send is missing or damaged"
        );
    }
    if maybe.is_some() {
        // (Past the safety window, as in the compaction test, the events
        // are trimmed; here none is.)
        let seqs: Vec<MsgSeq> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(events(&ib), seqs, "{what}: events and messages disagree");
    }
    // The recovered engine goes on: it compacts (moving what is left) and
    // still serves the same.
    ib.compact().unwrap();
    assert_eq!(messages(&ib), got, "{what}: after a pass on the image");
    landed
}

fn setup(dir: &Path, clock: &Arc<ManualClock>, io: &Arc<CutIo>, n: u64) -> Inbox {
    let ib = Inbox::open_with_io(cfg(dir, clock), io.clone()).unwrap();
    ib.join(Uid(1), CONV).wait().unwrap();
    ib.join(Uid(2), CONV).wait().unwrap();
    for i in 1..=n {
        send(&ib, i).unwrap();
    }
    ib
}

#[test]
fn a_power_cut_at_any_point_of_a_send_keeps_every_acknowledged_send_and_no_half_of_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let io = CutIo::new(dir.path());
    let ib = setup(dir.path(), &clock, &io, 20);
    let acked: Vec<u64> = (1..=20).collect();
    io.armed.store(true, Ordering::Release);
    send(&ib, 21).unwrap();
    io.armed.store(false, Ordering::Release);
    let images = io.take();
    // At least: before the write, before its fdatasync.
    assert!(images.len() >= 2 * SEEDS.len(), "{} images", images.len());
    let mut landed = 0;
    let mut lost = 0;
    for (what, img) in &images {
        if check_image(what, img.path(), &clock, &acked, Some(21)) {
            landed += 1;
        } else {
            lost += 1;
        }
    }
    // The write lands whole in some images (torn seeds keep it, or part of
    // it, which recovery cuts) and is absent in others.
    assert!(landed > 0 && lost > 0, "landed {landed}, lost {lost}");
}

#[test]
fn a_power_cut_at_any_point_of_a_pass_moving_bodies_to_msg_loses_no_message() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let io = CutIo::new(dir.path());
    let ib = setup(dir.path(), &clock, &io, 40);
    let acked: Vec<u64> = (1..=40).collect();
    let steps = Arc::new(Mutex::new(Vec::new()));
    {
        let steps = Arc::clone(&steps);
        ib.set_compaction_hook(Some(Arc::new(move |s| steps.lock().push(s))));
    }
    clock.advance(2 * HOUR);
    io.armed.store(true, Ordering::Release);
    let report = ib.compact().unwrap();
    io.armed.store(false, Ordering::Release);
    let steps = steps.lock().clone();
    for want in [
        CompactionStep::BodiesCopied,
        CompactionStep::BodiesMoved,
        CompactionStep::Checkpointed,
        CompactionStep::SegmentDeleted,
    ] {
        assert!(steps.contains(&want), "{want:?} in {steps:?}; {report:?}");
    }
    let images = io.take();
    println!("{} images over {steps:?}", images.len());
    for (what, img) in &images {
        check_image(what, img.path(), &clock, &acked, None);
    }
    assert_eq!(messages(&ib).len(), 40);
}

/// Each `msg` segment file of `dir` and the end of its durable data.
fn msg_segments(dir: &Path) -> Vec<(PathBuf, u64)> {
    let report = inbox_engine::log::verify(&dir.join("msg")).unwrap();
    report
        .segments
        .iter()
        .map(|s| (dir.join("msg").join(format!("{:010}.seg", s.id)), s.bytes))
        .collect()
}

/// Undoes in the image at `img` every `msg` write made after `before`:
/// newer segment files go, older ones read zeros past their old end.
fn undo_msg_writes(img: &Path, before: &[(PathBuf, u64)]) {
    for (path, _) in msg_segments(img) {
        let name = path.file_name().unwrap().to_owned();
        match before.iter().find(|(p, _)| p.file_name() == Some(&name)) {
            None => std::fs::remove_file(&path).unwrap(),
            // Back to zeros, as the preallocated segment read before those
            // writes: a shorter file would be a segment cut from outside.
            Some((_, end)) => {
                let mut bytes = std::fs::read(&path).unwrap();
                bytes[*end as usize..].fill(0);
                std::fs::write(&path, bytes).unwrap();
            }
        }
    }
}

#[test]
fn a_cut_between_the_msg_copy_and_its_move_record_serves_the_evt_bodies_and_the_reverse_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let io = CutIo::new(dir.path());
    let ib = setup(dir.path(), &clock, &io, 40);
    let acked: Vec<u64> = (1..=40).collect();
    let before = msg_segments(dir.path());
    let images: Arc<Mutex<Vec<(CompactionStep, tempfile::TempDir)>>> = Arc::default();
    {
        let (images, io) = (Arc::clone(&images), Arc::clone(&io));
        ib.set_compaction_hook(Some(Arc::new(move |step| {
            let mut images = images.lock();
            let first = !images.iter().any(|(s, _)| *s == step);
            if first
                && matches!(
                    step,
                    CompactionStep::BodiesCopied | CompactionStep::BodiesMoved
                )
            {
                let img = tempfile::tempdir().unwrap();
                io.inner
                    .crash_image_tree(&io.root, img.path(), None)
                    .unwrap();
                images.push((step, img));
            }
        })));
    }
    clock.advance(2 * HOUR);
    ib.compact().unwrap();
    let images = std::mem::take(&mut *images.lock());
    assert_eq!(images.len(), 2);
    for (step, img) in images {
        match step {
            // The msg batch reached the disk, the move record did not: the
            // messages still read their bodies in evt; the msg copies are
            // orphans.
            CompactionStep::BodiesCopied => {
                assert_ne!(msg_segments(img.path()), before);
                check_image("msg copied, not moved", img.path(), &clock, &acked, None);
            }
            // The reverse, which the pass never writes (the move waits for
            // the msg batch to be durable): the move record is on disk and
            // the msg batch is not. Open and verify refuse alike, naming a
            // message, instead of serving INTERNAL for it.
            _ => {
                undo_msg_writes(img.path(), &before);
                let c = cfg(img.path(), &clock);
                let verified = verify_data_dir(&c).unwrap_err().to_string();
                let opened = match Inbox::open_with_io(c, Arc::new(FaultyIo::new())) {
                    Ok(_) => panic!("open must refuse a move whose msg copy is lost"),
                    Err(e) => e.to_string(),
                };
                assert_eq!(opened, verified);
                assert!(
                    verified.contains("message msg_seq") && verified.contains("msg log"),
                    "{verified}"
                );
            }
        }
    }
}

/// Each begun `evt` segment of `dir`: its file, where its data ends, and
/// its batches as (start, end) offsets, walked by their frames' lengths.
fn evt_batches(dir: &Path) -> Vec<(PathBuf, Vec<(u64, u64)>)> {
    let report = inbox_engine::log::verify(&dir.join("evt")).unwrap();
    report
        .segments
        .iter()
        .filter(|s| !s.prepared)
        .map(|s| {
            let path = dir.join("evt").join(format!("{:010}.seg", s.id));
            let bytes = std::fs::read(&path).unwrap();
            let mut batches = Vec::new();
            let mut at = inbox_engine::log::format::SEGMENT_HEADER_LEN as u64;
            while at < s.bytes {
                let len =
                    u32::from_le_bytes(bytes[at as usize..at as usize + 4].try_into().unwrap());
                batches.push((at, at + u64::from(len)));
                at += u64::from(len);
            }
            assert_eq!(at, s.bytes, "the frames tile segment {}", s.id);
            (path, batches)
        })
        .collect()
}

/// The places a cut is tried in each batch: its start, one byte in, its
/// middle, one byte before its end, its end.
fn cuts_of(batches: &[(u64, u64)]) -> Vec<u64> {
    batches
        .iter()
        .flat_map(|&(start, end)| [start, start + 1, (start + end) / 2, end - 1, end])
        .collect()
}

/// The sends before `cut` of the segment `path`, in every segment up to
/// it: the message records (kind 9) that carry a body (a join's has none).
fn sends_before(dir: &Path, path: &Path, cut: u64) -> usize {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let segment: u32 = name.trim_end_matches(".seg").parse().unwrap();
    let mut n = 0;
    inbox_engine::log::replay_dir(&dir.join("evt"), 0, &mut |_, loc, kind, payload| {
        let before =
            loc.segment < segment || (loc.segment == segment && u64::from(loc.offset) < cut);
        n += usize::from(kind == 9 && payload.len() > 300 && before);
        Ok(())
    })
    .unwrap();
    n
}

/// `image` with the segment at `path` (a path in `from`) cut at `cut`:
/// zeros from there on, the file's length kept (a power cut's loss of
/// unsynced bytes), or the file shortened to it (a cut from outside).
fn cut_image(from: &Path, path: &Path, cut: u64, shorten: bool) -> tempfile::TempDir {
    let image = tempfile::tempdir().unwrap();
    copy_running_dir(from, image.path());
    let at = image.path().join(path.strip_prefix(from).unwrap());
    if shorten {
        File::options()
            .write(true)
            .open(&at)
            .unwrap()
            .set_len(cut)
            .unwrap();
    } else {
        let mut bytes = std::fs::read(&at).unwrap();
        bytes[cut as usize..].fill(0);
        std::fs::write(&at, bytes).unwrap();
    }
    image
}

/// Opens a store whose segment at `path` was shortened: verify and open
/// refuse alike, naming the size expected, and the file stays as it was.
fn assert_refused_short(what: &str, img: &Path, path: &Path, clock: &Arc<ManualClock>) {
    let before = std::fs::read(path).unwrap();
    let c = cfg(img, clock);
    let verified = verify_data_dir(&c).map(|_| ()).unwrap_err().to_string();
    let opened = match Inbox::open_with_io(c, Arc::new(FaultyIo::new())) {
        Ok(ib) => panic!("{what}: served short: {} messages", messages(&ib).len()),
        Err(e) => e.to_string(),
    };
    assert_eq!(opened, verified, "{what}");
    assert!(verified.contains("bytes long"), "{what}: {verified}");
    assert_eq!(
        std::fs::read(path).unwrap(),
        before,
        "{what}: the refusal changed the file"
    );
}

#[test]
fn a_crash_image_cut_in_the_newest_segment_opens_and_a_truncated_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let io = CutIo::new(dir.path());
    let ib = setup(dir.path(), &clock, &io, 40);
    let acked: Vec<Bytes> = (1..=40).map(body).collect();
    let segments = evt_batches(dir.path());
    assert!(segments.len() >= 3, "several evt segments");
    assert!(
        std::fs::read_dir(dir.path().join("checkpoint")).map_or(true, |d| d.count() == 0),
        "no checkpoint covers the log: any cut of it is a power cut's"
    );
    let (newest, batches) = segments.last().unwrap();
    let newest_bytes = std::fs::read(newest).unwrap();
    let mut checked = 0;
    for cut in cuts_of(batches) {
        let what = format!("newest segment cut at {cut}");
        // Everything of a batch the cut left whole is served, nothing of
        // the batch the cut went through. (A batch whose bytes past the
        // cut were zeros already is whole.)
        let whole_before = batches
            .iter()
            .filter(|&&(_, end)| {
                end <= cut
                    || newest_bytes[cut as usize..end as usize]
                        .iter()
                        .all(|&b| b == 0)
            })
            .map(|&(_, end)| end)
            .max()
            .unwrap_or(0);
        let kept = sends_before(dir.path(), newest, whole_before);
        let img = cut_image(dir.path(), newest, cut, false);
        let c = cfg(img.path(), &clock);
        verify_data_dir(&c).unwrap_or_else(|e| panic!("{what}: verify refuses: {e}"));
        let opened = Inbox::open_with_io(c, Arc::new(FaultyIo::new()))
            .unwrap_or_else(|e| panic!("{what}: open refuses: {e}"));
        let served: Vec<Bytes> = opened.pull(Uid(2), &[(CONV, MsgSeq(0))], 500).unwrap()[0]
            .messages
            .iter()
            .filter(|m| m.kind == MessageKind::Normal && !m.tombstone)
            .map(|m| m.payload.clone())
            .collect();
        assert_eq!(served.len(), kept, "{what}");
        assert!(
            served == acked[..kept],
            "{what}: not the acknowledged sends"
        );
        drop(opened);

        let img = cut_image(dir.path(), newest, cut, true);
        let at = img.path().join(newest.strip_prefix(dir.path()).unwrap());
        assert_refused_short(&format!("{what}, shortened"), img.path(), &at, &clock);
        checked += 1;
    }
    assert_eq!(checked, batches.len() * 5);
    drop(ib);
}

#[test]
fn an_older_segment_truncated_at_or_inside_any_batch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let io = CutIo::new(dir.path());
    let ib = setup(dir.path(), &clock, &io, 40);
    let segments = evt_batches(dir.path());
    let (older, batches) = &segments[segments.len() - 2];
    for cut in cuts_of(batches) {
        let img = cut_image(dir.path(), older, cut, true);
        let at = img.path().join(older.strip_prefix(dir.path()).unwrap());
        assert_refused_short(
            &format!("older segment cut to {cut}"),
            img.path(),
            &at,
            &clock,
        );
    }
    drop(ib);
}
