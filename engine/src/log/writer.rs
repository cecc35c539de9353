//! The group-commit writer thread.
//!
//! Appenders queue encoded batches (in LSN order, under the submit mutex);
//! this thread takes everything queued at once, writes each run of
//! contiguous batches with one write, makes it durable with one fdatasync
//! (per the sync policy), publishes the new durable length and LSN, and
//! wakes every waiter. While it syncs, new batches pile up in the queue and
//! go out together in the next round: that is the group commit.
//!
//! Invariants:
//! - batches become durable in LSN order; `durable_lsn` only grows;
//! - a segment is synced in full before the next segment is begun (its
//!   prepared header overwritten with its first LSN, and synced), so only
//!   the last begun segment can ever have a torn tail;
//! - the new segment's header is durable before the old one is sealed (and
//!   so may be deleted): the LSN chain never rests on a deleted segment;
//! - in a recycled segment every write ends with an all-zero batch header,
//!   so the data's end is marked even though stale bytes follow it.
//! - after any write or sync error the log is poisoned: nothing queued or
//!   submitted later is written or reported durable.
//!
//! A pass may also run on a submitter's thread (`Log::commit_inline`)
//! while this thread is idle. After each pass, whichever thread ran it
//! runs the owner's durable hook, if one is installed
//! (`Log::set_durable_hook`): the inbox engine finishes its rounds there
//! instead of waking a thread to wait for each batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::format::SEGMENT_HEADER_LEN;
use super::segment::Segment;
use super::shared::Shared;
use super::{LogError, Lsn, SyncPolicy};

/// Work for the writer, in submission order.
pub(crate) enum Item {
    Batch {
        seg: Arc<Segment>,
        offset: u64,
        lsn: Lsn,
        bytes: Vec<u8>,
    },
    /// Begin `new` (a prepared spare: write its real header) and seal `old`.
    Roll {
        old: Option<Arc<Segment>>,
        new: Arc<Segment>,
        header: [u8; SEGMENT_HEADER_LEN],
    },
    /// Write and fdatasync everything before it, whatever the policy.
    Flush(std::sync::mpsc::Sender<Result<(), LogError>>),
}

/// A run of contiguous batches in one segment, gathered into one buffer.
struct Run {
    seg: Option<Arc<Segment>>,
    start: u64,
    last_lsn: Lsn,
    buf: Vec<u8>,
}

/// What the writer keeps between passes. It lives in the log's shared
/// state, behind a mutex: the writer thread takes it for each pass, and so
/// does a submitter that writes its own batches while the thread is idle
/// ([`commit_inline`]).
pub(crate) struct WriterState {
    run: Run,
    /// Segment written since its last fdatasync (Interval / None).
    unsynced: Option<Arc<Segment>>,
    last_sync: Instant,
}

impl WriterState {
    pub(crate) fn new() -> Self {
        WriterState {
            run: Run {
                seg: None,
                start: 0,
                last_lsn: 0,
                buf: Vec::new(),
            },
            unsynced: None,
            last_sync: Instant::now(),
        }
    }
}

/// One pass's view: the log and the writer's state, locked.
struct Writer<'a> {
    shared: &'a Shared,
    st: &'a mut WriterState,
}

pub(crate) fn run(shared: Arc<Shared>) {
    // A panic outside a pass (the final sync, the hook) must not leave
    // waiters blocked forever either.
    let guard = PoisonOnUnwind(&shared);
    main_loop(&shared);
    std::mem::drop(guard);
}

/// Writes (and, per the sync policy, makes durable) everything queued, on
/// the caller's thread, unless the writer thread is in a pass: then that
/// pass or the next takes it. Returns whether it wrote. A single
/// submitter that would otherwise wake the writer thread and wait for it
/// saves that hand-off; while its write and fdatasync run, new work
/// gathers for the next pass as it would behind the thread's.
pub(crate) fn commit_inline(shared: &Shared) -> bool {
    let Some(mut st) = shared.writer.try_lock() else {
        // The thread is in a pass; it looks at the queue again after it.
        shared.work.notify_one();
        return false;
    };
    let wrote = Writer {
        shared,
        st: &mut st,
    }
    .pass();
    drop(st);
    if wrote {
        run_hook(shared);
    }
    wrote
}

fn run_hook(shared: &Shared) {
    if let Some(hook) = &*shared.durable_hook.lock() {
        hook();
    }
}

/// Poisons the log if a pass panics, so no waiter blocks forever.
struct PoisonOnUnwind<'a>(&'a Shared);

impl Drop for PoisonOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.poison("a log write panicked".into());
        }
    }
}

fn main_loop(shared: &Shared) {
    let interval = match shared.sync {
        SyncPolicy::Interval(d) => Some(d),
        _ => None,
    };
    loop {
        // What the interval policy needs to know while idle, copied out
        // of the writer's state (an inline commit may hold it). Only that
        // policy looks: under the others the thread touches the state in
        // its passes alone, so an idle thread never makes an inline
        // commit find it taken.
        let (pending_sync, last_sync) = match interval {
            Some(_) => {
                let st = shared.writer.lock();
                (st.unsynced.is_some(), st.last_sync)
            }
            None => (false, Instant::now()),
        };
        let shutdown = {
            let mut st = shared.state.lock();
            loop {
                if !st.queue.is_empty() || st.shutdown {
                    break;
                }
                match (interval, pending_sync) {
                    (Some(d), true) => {
                        let due = last_sync + d;
                        let now = Instant::now();
                        if now >= due {
                            break;
                        }
                        shared.work.wait_for(&mut st, due - now);
                    }
                    _ => shared.work.wait(&mut st),
                }
            }
            st.shutdown
        };
        {
            let mut ws = shared.writer.lock();
            let mut w = Writer {
                shared,
                st: &mut ws,
            };
            w.pass();
            if let Some(d) = interval {
                if w.st.unsynced.is_some() && w.st.last_sync.elapsed() >= d {
                    w.sync_unsynced();
                }
            }
            if shutdown && shared.state.lock().queue.is_empty() {
                w.sync_unsynced();
                drop(ws);
                run_hook(shared);
                return;
            }
        }
        run_hook(shared);
    }
}

impl Writer<'_> {
    /// One pass: takes everything queued and writes it. The caller holds
    /// the writer's state, taken before the queue, so passes run in queue
    /// order whichever thread runs them. Returns whether anything was
    /// queued.
    fn pass(&mut self) -> bool {
        let items = std::mem::take(&mut self.shared.state.lock().queue);
        if items.is_empty() {
            return false;
        }
        // A panic here must not leave waiters blocked forever.
        let guard = PoisonOnUnwind(self.shared);
        self.process(items);
        std::mem::drop(guard);
        true
    }

    fn poisoned(&self) -> bool {
        self.shared.is_poisoned()
    }

    fn process(&mut self, items: Vec<Item>) {
        for item in items {
            if self.poisoned() {
                if let Item::Flush(tx) = item {
                    let _ = tx.send(Err(self.shared.poison_error()));
                }
                continue;
            }
            match item {
                Item::Batch {
                    seg,
                    offset,
                    lsn,
                    bytes,
                } => {
                    let same = self
                        .st
                        .run
                        .seg
                        .as_ref()
                        .is_some_and(|s| Arc::ptr_eq(s, &seg))
                        && self.st.run.start + self.st.run.buf.len() as u64 == offset;
                    if !same {
                        // Cannot happen (offsets are handed out contiguously
                        // and a roll ends a run), but writing what we have
                        // first keeps the order safe anyway.
                        self.write_run(true);
                        self.st.run.seg = Some(seg);
                        self.st.run.start = offset;
                    }
                    self.st.run.buf.extend_from_slice(&bytes);
                    self.st.run.last_lsn = lsn;
                }
                Item::Roll { old, new, header } => {
                    self.write_run(true);
                    if let Some(old) = &old {
                        if self
                            .st
                            .unsynced
                            .as_ref()
                            .is_some_and(|s| Arc::ptr_eq(s, old))
                        {
                            self.sync_unsynced();
                        }
                    }
                    if self.poisoned() {
                        continue;
                    }
                    if let Err(e) = self.roll(old.as_deref(), &new, &header) {
                        self.shared
                            .poison(format!("creating segment {}: {e}", new.id));
                    }
                }
                Item::Flush(tx) => {
                    self.write_run(true);
                    self.sync_unsynced();
                    let r = if self.poisoned() {
                        Err(self.shared.poison_error())
                    } else {
                        Ok(())
                    };
                    let _ = tx.send(r);
                }
            }
        }
        let sync = matches!(self.shared.sync, SyncPolicy::Always);
        self.write_run(sync);
    }

    fn roll(
        &mut self,
        old: Option<&Segment>,
        new: &Arc<Segment>,
        header: &[u8],
    ) -> std::io::Result<()> {
        // The prepared file already has its name, its directory entry and
        // written blocks: beginning it is one overwrite of its first block.
        self.shared.io.write_at(&new.file, 0, header, true)?;
        if let Some(old) = old {
            old.seal();
        }
        self.shared.segments.write().insert(new.id, Arc::clone(new));
        tracing::debug!(
            segment = new.id,
            first_lsn = new.first_lsn,
            "segment created"
        );
        Ok(())
    }

    /// Writes the gathered run (with an fdatasync when `sync`), then
    /// publishes it as durable (under `Interval`/`None`, written counts).
    /// Rolls and flushes sync whatever the policy, so a segment is always
    /// complete on disk before the next one exists.
    fn write_run(&mut self, sync: bool) {
        let Some(seg) = self.st.run.seg.clone() else {
            return;
        };
        if self.st.run.buf.is_empty() {
            return;
        }
        if self.poisoned() {
            self.st.run.buf.clear();
            return;
        }
        let do_sync = sync;
        let start = self.st.run.start;
        let end = start + self.st.run.buf.len() as u64;
        assert_eq!(
            start,
            seg.durable_len(),
            "runs must extend the durable data"
        );
        let marker = seg.end_marker_len(end);
        self.st.run.buf.resize(self.st.run.buf.len() + marker, 0);
        let t = Instant::now();
        let res = self
            .shared
            .io
            .write_at(&seg.file, start, &self.st.run.buf, do_sync);
        self.st.run.buf.clear();
        self.st.run.start = end;
        if let Err(e) = res {
            let what = if do_sync { "write+fdatasync" } else { "write" };
            self.shared.poison(format!(
                "{what} of segment {} at offset {start} failed: {e}",
                seg.id
            ));
            return;
        }
        if do_sync {
            self.st.last_sync = Instant::now();
            if self
                .st
                .unsynced
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, &seg))
            {
                self.st.unsynced = None;
            }
        } else {
            self.st.unsynced = Some(Arc::clone(&seg));
        }
        self.shared.stats.record_commit(end - start, t.elapsed());
        seg.set_durable(end, self.st.run.last_lsn);
        self.shared.publish_durable(self.st.run.last_lsn);
    }

    fn sync_unsynced(&mut self) {
        let Some(seg) = self.st.unsynced.take() else {
            return;
        };
        if self.poisoned() {
            return;
        }
        if let Err(e) = self.shared.io.sync_data(&seg.file) {
            self.shared
                .poison(format!("fdatasync of segment {} failed: {e}", seg.id));
        }
        self.st.last_sync = Instant::now();
    }
}

/// Running counters of the writer, for metrics.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub commits: std::sync::atomic::AtomicU64,
    pub bytes: std::sync::atomic::AtomicU64,
    pub commit_ns: std::sync::atomic::AtomicU64,
}

impl Stats {
    fn record_commit(&self, bytes: u64, took: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        self.commits.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
        self.commit_ns
            .fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }
}
