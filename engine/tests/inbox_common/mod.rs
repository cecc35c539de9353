//! Helpers shared by the inbox integration tests: a temp data dir, a
//! manual clock, and short-hands for the common calls.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use inbox_engine::inbox::ManualClock;
use inbox_engine::log::SyncPolicy;
use inbox_engine::*;

pub const T0: u64 = 1_700_000_000_000;

/// Fields drop in order: the engine (and its final checkpoint) before
/// its directory.
pub struct Harness {
    pub inbox: Option<Inbox>,
    pub dir: tempfile::TempDir,
    pub clock: Arc<ManualClock>,
}

pub fn config(dir: &std::path::Path, clock: &Arc<ManualClock>) -> InboxConfig {
    let mut c = InboxConfig::new(dir);
    c.sync = SyncPolicy::None;
    c.segment_bytes = 1 << 20;
    c.token_key = [42; 32];
    c.clock = clock.clone();
    // Compaction runs only when a test asks for it (`Inbox::compact`), so
    // no test races a background pass.
    c.compaction_interval = None;
    c
}

impl Harness {
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    pub fn with(tune: impl Fn(&mut InboxConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(T0));
        let mut c = config(dir.path(), &clock);
        tune(&mut c);
        let inbox = Inbox::open(c).unwrap();
        Self {
            dir,
            clock,
            inbox: Some(inbox),
        }
    }

    pub fn ib(&self) -> &Inbox {
        self.inbox.as_ref().unwrap()
    }

    /// Every message of `conv` `uid` may read, oldest first, paged through
    /// `history` 500 at a time.
    pub fn whole_history(&self, uid: Uid, conv: ConvId) -> Vec<Message> {
        let mut out = Vec::new();
        let mut before = None;
        loop {
            let page = self.ib().history(uid, conv, before, 500).unwrap();
            before = page.messages.last().map(|m| m.msg_seq);
            out.extend(page.messages);
            if !page.has_more {
                break;
            }
        }
        out.reverse();
        out
    }

    /// Shuts the engine down and opens the same dir again. With
    /// `keep_checkpoints` false every checkpoint is deleted first, so
    /// recovery replays the whole log.
    pub fn restart(&mut self, keep_checkpoints: bool, tune: impl Fn(&mut InboxConfig)) {
        drop(self.inbox.take());
        if !keep_checkpoints {
            let _ = std::fs::remove_dir_all(self.dir.path().join("checkpoint"));
        }
        let mut c = config(self.dir.path(), &self.clock);
        tune(&mut c);
        self.inbox = Some(Inbox::open(c).unwrap());
    }

    /// Kills the engine: opens a copy of the data dir taken while the
    /// engine runs (every write it made, as a killed process leaves them)
    /// in a fresh directory, and abandons the old engine there, so no
    /// shutdown checkpoint reaches the copy and recovery replays the log
    /// after the last checkpoint written before the kill.
    pub fn kill_restart(&mut self, tune: impl Fn(&mut InboxConfig)) {
        let image = tempfile::tempdir().unwrap();
        copy_running_dir(self.dir.path(), image.path());
        drop(self.inbox.take());
        self.dir = image;
        let mut c = config(self.dir.path(), &self.clock);
        tune(&mut c);
        self.inbox = Some(Inbox::open(c).unwrap());
    }

    /// Segment files in the `evt` log's directory (prepared spares
    /// included).
    pub fn evt_segment_files(&self) -> usize {
        std::fs::read_dir(self.dir.path().join("evt"))
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().ends_with(".seg")
            })
            .count()
    }

    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    pub fn join(&self, uid: Uid, conv: ConvId) -> MembershipReply {
        self.ib().join(uid, conv).wait().unwrap()
    }

    pub fn send(&self, conv: ConvId, sender: Uid, cmid: u128, body: &str) -> SendReply {
        self.ib()
            .send(SendRequest {
                conv,
                sender,
                client_msg_id: cmid,
                msg_type: 1,
                payload: Bytes::copy_from_slice(body.as_bytes()),
            })
            .wait()
            .unwrap()
    }

    /// Sends many messages at once (pipelined through the sequencer).
    pub fn send_many(
        &self,
        conv: ConvId,
        sender: Uid,
        cmid_base: u128,
        n: usize,
    ) -> Vec<SendReply> {
        let pending: Vec<_> = (0..n)
            .map(|i| {
                self.ib().send(SendRequest {
                    conv,
                    sender,
                    client_msg_id: cmid_base + i as u128,
                    msg_type: 1,
                    payload: Bytes::from(format!("m{i}")),
                })
            })
            .collect();
        pending.into_iter().map(|p| p.wait().unwrap()).collect()
    }

    pub fn register(&self, uid: Uid, device: DeviceId) -> RegisterReply {
        self.ib().register_device(uid, device).wait().unwrap()
    }

    pub fn sync(
        &self,
        uid: Uid,
        device: DeviceId,
        generation: Option<Generation>,
        local: SyncSeq,
        limit: u32,
        token: Option<Bytes>,
    ) -> Result<SyncPage> {
        self.ib()
            .sync(SyncRequest {
                uid,
                device,
                generation,
                local_applied_seq: local,
                limit,
                batch_token: token,
            })
            .wait()
    }

    pub fn ack(
        &self,
        uid: Uid,
        device: DeviceId,
        generation: Generation,
        seq: SyncSeq,
        token: &Bytes,
    ) -> Result<AckReply> {
        self.ib()
            .ack(AckRequest {
                uid,
                device,
                generation,
                seq,
                batch_token: token.clone(),
            })
            .wait()
    }

    /// A device's whole catch-up: pages until the batch ends, then an ACK
    /// of the batch hwm. Returns the events and the generation.
    pub fn catch_up(
        &self,
        uid: Uid,
        device: DeviceId,
        generation: Generation,
        local: SyncSeq,
    ) -> (Vec<SyncEvent>, Generation, SyncSeq) {
        let mut events = Vec::new();
        let first = self
            .sync(uid, device, Some(generation), local, 100, None)
            .unwrap();
        let gen = first.generation;
        let token = first.batch_token.clone();
        let mut cursor = first.next_cursor;
        let mut more = first.has_more;
        events.extend(first.events);
        while more {
            let p = self
                .sync(uid, device, Some(gen), cursor, 100, Some(token.clone()))
                .unwrap();
            events.extend(p.events);
            cursor = p.next_cursor;
            more = p.has_more;
        }
        let acked = self
            .ack(uid, device, gen, cursor, &token)
            .unwrap()
            .acked_sync_seq;
        (events, gen, acked)
    }
}

/// Copies a data dir an engine is running in. A file renamed or removed
/// during the copy (by the checkpoint writer, or by a log's preparer
/// turning a spare into a prepared segment) is skipped: a kill at that
/// moment could leave it either way, and a spare holds no data.
pub fn copy_running_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            copy_running_dir(&path, &to.join(entry.file_name()));
        } else if let Err(e) = std::fs::copy(&path, to.join(entry.file_name())) {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::NotFound,
                "{}: {e}",
                path.display()
            );
        }
    }
}

/// Prints what a randomized test exercised and fails if any case it claims
/// never happened: `names[i]` is the case counted by `counts[i]`.
pub fn assert_every_case_reached(
    test: &str,
    cases: u32,
    names: &[&str],
    counts: &[std::sync::atomic::AtomicU64],
) {
    let counts: Vec<(&str, u64)> = names
        .iter()
        .zip(counts)
        .map(|(name, n)| (*name, n.load(std::sync::atomic::Ordering::Relaxed)))
        .collect();
    println!("{test} reached, in {cases} cases: {counts:?}");
    let missing: Vec<&str> = counts
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(name, _)| *name)
        .collect();
    assert!(
        missing.is_empty(),
        "{test}: never reached in {cases} cases: {missing:?}"
    );
}
