//! The write pipeline on one CPU while the load is light.
//!
//! At one connection a send crosses two threads each way: the connection
//! worker hands the command to the sequencer, and the sequencer hands the
//! reply back once its round is durable. Each hand-off wakes a sleeping
//! thread, and when the kernel wakes it on another, idle CPU, that CPU
//! must first be woken itself: on a virtual machine, an interrupt to a
//! halted virtual CPU. Two of those cost a one-connection send 25 to
//! 45 µs here (`docs/BENCHMARKS.md`, "A send at one connection: two
//! wake-ups across CPUs"). On one CPU the woken thread simply runs when
//! the waker sleeps.
//!
//! Under load the pipeline needs its CPUs: at 16 connections the daemon
//! uses most of a core beside its clients, and a round holds several
//! commands. So the sequencer gathers the threads that joined the
//! pipeline ([`join`]: the daemon's connection workers) and itself on the
//! CPU it runs on only while its rounds hold about one command and the
//! whole process uses little CPU, and gives them back every CPU they had
//! as soon as either grows ([`Decision`]). It looks once per
//! [`WINDOW`] of rounds, just after a round's fdatasync returned: the
//! CPU the kernel woke it on then is near the disk's completions, so a
//! gathered pipeline's wait for the disk ends without an interrupt
//! between CPUs either. An idle pipeline stays where it is.
//!
//! Only the sequencer and the joined threads are gathered. A thread that
//! one of them starts while gathered inherits its one CPU (a read-pool
//! thread spawned on demand by a worker, a new engine's threads when a
//! group member swaps engines), so spreading gives every thread of the
//! process the CPUs the process had at the first placement, and a new
//! sequencer takes them back for itself at once. Of two engines in one
//! process, the one that goes gives the joined threads back only if it
//! gathered them last.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the sequencer counts rounds before it decides.
pub const WINDOW: Duration = Duration::from_millis(100);

/// Threads placed with the sequencer, by kernel thread id.
static JOINED: Mutex<Vec<libc::pid_t>> = Mutex::new(Vec::new());

/// The placement that last gathered the joined threads (0: none holds
/// them). A process may run two engines for a moment (a group member
/// installing a snapshot swaps its engine): the one that goes gives the
/// joined threads back only if it is still the one that holds them.
static HOLDER: AtomicU64 = AtomicU64::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The CPUs the process had when its first placement was made (an
/// engine's open, before anything was gathered). Spreading gives every
/// thread of the process these: a thread started by a gathered one (a
/// read-pool thread spawned on demand, a new engine's threads) inherited
/// the one CPU.
static EVERY_CPU: std::sync::OnceLock<Option<libc::cpu_set_t>> = std::sync::OnceLock::new();

thread_local! {
    static HAS_JOINED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Puts the calling thread in the pipeline: a sequencer that gathers its
/// pipeline on one CPU takes this thread along. Cheap after the first
/// call on a thread, so it may be called from a hook that runs often
/// (the daemon calls it each time a connection worker goes idle).
pub fn join() {
    if HAS_JOINED.with(|j| j.replace(true)) {
        return;
    }
    // SAFETY: plain syscall without arguments.
    let tid = unsafe { libc::gettid() };
    JOINED.lock().unwrap_or_else(|p| p.into_inner()).push(tid);
}

/// Takes the calling thread out of the pipeline (the daemon calls it as
/// a runtime thread stops), so that its id, which the kernel may give to
/// another thread later, is not placed.
pub fn leave() {
    if !HAS_JOINED.with(|j| j.replace(false)) {
        return;
    }
    // SAFETY: plain syscall without arguments.
    let tid = unsafe { libc::gettid() };
    JOINED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|&t| t != tid);
}

/// One window's rounds and the process's CPU over it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub rounds: u64,
    pub commands: u64,
    /// CPU time of the whole process over the window, in CPUs (1.0: one
    /// CPU busy for all of it).
    pub busy: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Gather,
    Spread,
    Stay,
}

/// Rounds a window needs before it says anything: 200 a second.
const ROUNDS_MIN: u64 = 20;
/// Gather while a round holds at most this many commands on average…
const GATHER_PER_ROUND: f64 = 1.25;
/// …and the process uses at most this much of a CPU.
const GATHER_BUSY: f64 = 0.6;
/// Spread once rounds hold this many, or the process uses this much: on
/// one CPU it could not use more than about one.
const SPREAD_PER_ROUND: f64 = 2.0;
const SPREAD_BUSY: f64 = 0.9;

impl Decision {
    pub fn of(gathered: bool, w: Window) -> Decision {
        let per_round = w.commands as f64 / w.rounds.max(1) as f64;
        if gathered {
            if per_round >= SPREAD_PER_ROUND || w.busy >= SPREAD_BUSY {
                return Decision::Spread;
            }
        } else if w.rounds >= ROUNDS_MIN && per_round <= GATHER_PER_ROUND && w.busy <= GATHER_BUSY {
            return Decision::Gather;
        }
        Decision::Stay
    }
}

/// The sequencer's side: counts its rounds and moves the pipeline.
pub(crate) struct Placement {
    id: u64,
    /// The process's CPUs at its first placement ([`EVERY_CPU`]); `None`
    /// when there is nothing to choose (one CPU) or placement is off.
    all: Option<libc::cpu_set_t>,
    gathered: bool,
    started: Instant,
    cpu_at_start: Duration,
    rounds: u64,
    commands: u64,
}

impl Placement {
    pub fn new(on: bool) -> Self {
        let all = on
            .then(|| *EVERY_CPU.get_or_init(own_cpus))
            .flatten()
            .filter(|set| count(set) > 1);
        if let Some(all) = &all {
            // Started by a gathered thread, this one inherited its CPU.
            place_self(all);
        }
        Placement {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            all,
            gathered: false,
            started: Instant::now(),
            cpu_at_start: process_cpu(),
            rounds: 0,
            commands: 0,
        }
    }

    /// Whether the pipeline is on one CPU now.
    #[cfg(test)]
    pub fn gathered(&self) -> bool {
        self.gathered
    }

    /// Counts a round of `commands`; once a window is full, decides.
    /// Returns the new placement when it changed.
    pub fn after_round(&mut self, commands: usize) -> Option<bool> {
        let all = self.all?;
        self.rounds += 1;
        self.commands += commands as u64;
        let now = Instant::now();
        let elapsed = now.duration_since(self.started);
        if elapsed < WINDOW {
            return None;
        }
        let cpu = process_cpu();
        let window = Window {
            rounds: self.rounds,
            commands: self.commands,
            busy: cpu.saturating_sub(self.cpu_at_start).as_secs_f64() / elapsed.as_secs_f64(),
        };
        self.started = now;
        self.cpu_at_start = cpu;
        self.rounds = 0;
        self.commands = 0;
        let set = match Decision::of(self.gathered, window) {
            Decision::Stay => return None,
            Decision::Gather => {
                // SAFETY: no arguments; -1 on failure.
                let here = unsafe { libc::sched_getcpu() };
                if here < 0 {
                    return None;
                }
                one_cpu(here as usize)
            }
            Decision::Spread => {
                spread(&all);
                self.gathered = false;
                HOLDER.store(0, Ordering::Relaxed);
                return Some(false);
            }
        };
        if !gather(&set) {
            // The sequencer itself cannot move (a cpuset, a seccomp
            // filter): stop trying, and leave every thread where it may
            // run anywhere.
            spread(&all);
            self.all = None;
            self.gathered = false;
            return None;
        }
        self.gathered = true;
        HOLDER.store(self.id, Ordering::Relaxed);
        Some(true)
    }
}

impl Drop for Placement {
    /// Gives the sequencer's thread, which goes back to the engine's pool,
    /// the process's CPUs, and every other thread too unless another
    /// placement gathered them since.
    fn drop(&mut self) {
        if let (true, Some(all)) = (self.gathered, self.all) {
            let holds = HOLDER
                .compare_exchange(self.id, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
            if holds {
                spread(&all);
            } else {
                place_self(&all);
            }
        }
    }
}

/// An empty CPU set.
fn empty_set() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    unsafe { std::mem::zeroed() }
}

/// The CPUs `tid` (0: the calling thread) may run on.
fn cpus_of_thread(tid: libc::pid_t) -> Option<libc::cpu_set_t> {
    let mut set = empty_set();
    // SAFETY: the call writes at most `size_of_val(&set)` bytes into `set`.
    let r = unsafe { libc::sched_getaffinity(tid, std::mem::size_of_val(&set), &mut set) };
    (r == 0).then_some(set)
}

/// The CPUs the calling thread may run on.
fn own_cpus() -> Option<libc::cpu_set_t> {
    cpus_of_thread(0)
}

fn count(set: &libc::cpu_set_t) -> usize {
    // SAFETY: reads the bits of an initialised set.
    let n = unsafe { libc::CPU_COUNT(set) };
    n as usize
}

fn one_cpu(cpu: usize) -> libc::cpu_set_t {
    let mut set = empty_set();
    // SAFETY: CPU_SET ignores an index beyond the set's bits.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set
}

/// Gives every thread of the process `all`.
fn spread(all: &libc::cpu_set_t) {
    place_self(all);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for tid in tasks
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse::<libc::pid_t>().ok())
    {
        // SAFETY: `all` is an initialised cpu_set_t of its own size; the
        // thread is this process's (listed under /proc/self).
        unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(all), all) };
    }
}

/// Moves the calling thread and every joined thread to `set`. False if
/// the calling thread could not be moved. A joined thread that is gone
/// is dropped from the list.
fn gather(set: &libc::cpu_set_t) -> bool {
    if !place_self(set) {
        return false;
    }
    let size = std::mem::size_of_val(set);
    let mut joined = JOINED.lock().unwrap_or_else(|p| p.into_inner());
    joined.retain(|&tid| {
        // A thread that ended without `leave` is dropped: its id may
        // name another process's thread by now.
        std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
            // SAFETY: `set` is an initialised cpu_set_t of `size` bytes.
            && unsafe { libc::sched_setaffinity(tid, size, set) == 0 }
    });
    true
}

/// Moves the calling thread to `set`; false if it could not be moved.
fn place_self(set: &libc::cpu_set_t) -> bool {
    // SAFETY: `set` is an initialised cpu_set_t of its own size.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(set), set) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "the sequencer cannot be placed");
        return false;
    }
    true
}

/// CPU time of the whole process so far.
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: fills `ts`; cannot fail for this clock.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The CPUs `tid` (0: the calling thread) may run on, counted.
pub fn cpus_of(tid: libc::pid_t) -> usize {
    cpus_of_thread(tid).map_or(0, |set| count(&set))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(rounds: u64, commands: u64, busy: f64) -> Window {
        Window {
            rounds,
            commands,
            busy,
        }
    }

    #[test]
    fn the_pipeline_gathers_only_while_rounds_are_single_and_the_process_is_light() {
        // One connection: a command a round, half a CPU.
        assert_eq!(Decision::of(false, window(500, 500, 0.5)), Decision::Gather);
        // Too few rounds to tell.
        assert_eq!(Decision::of(false, window(10, 10, 0.1)), Decision::Stay);
        // Rounds of a few commands: several connections at once.
        assert_eq!(Decision::of(false, window(500, 700, 0.5)), Decision::Stay);
        // Single rounds, but the process is busy (reads served beside them).
        assert_eq!(Decision::of(false, window(500, 500, 0.8)), Decision::Stay);
    }

    #[test]
    fn a_gathered_pipeline_spreads_once_rounds_grow_or_the_process_needs_a_cpu() {
        assert_eq!(Decision::of(true, window(500, 500, 0.5)), Decision::Stay);
        // Between the two bounds it stays gathered: no flapping.
        assert_eq!(Decision::of(true, window(500, 800, 0.7)), Decision::Stay);
        assert_eq!(Decision::of(true, window(300, 2100, 0.5)), Decision::Spread);
        assert_eq!(Decision::of(true, window(500, 500, 0.95)), Decision::Spread);
        // An idle window says nothing that moves it.
        assert_eq!(Decision::of(true, window(0, 0, 0.0)), Decision::Stay);
    }

    /// The tests that move threads share the process's list of joined
    /// threads: one at a time.
    static MOVING: Mutex<()> = Mutex::new(());

    /// The turn of a test that moves threads; `None` on one CPU, where
    /// there is nothing to choose.
    fn moving_turn() -> Option<std::sync::MutexGuard<'static, ()>> {
        let turn = MOVING.lock().unwrap_or_else(|p| p.into_inner());
        (cpus_of(0) >= 2).then_some(turn)
    }

    /// A thread that joins the pipeline and waits; its kernel id, and the
    /// sender that lets it leave and end.
    fn joined_thread() -> (
        libc::pid_t,
        std::sync::mpsc::Sender<()>,
        std::thread::JoinHandle<()>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            join();
            // SAFETY: no arguments.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = done_rx.recv();
            leave();
        });
        (rx.recv().unwrap(), done_tx, worker)
    }

    /// Light rounds until `p` gathers.
    fn gather(p: &mut Placement) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "never gathered");
            if let Some(gathered) = p.after_round(1) {
                assert!(gathered);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Rounds of eight commands until `p` spreads.
    fn spread_by_heavy_rounds(p: &mut Placement) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "never spread");
            if let Some(gathered) = p.after_round(8) {
                assert!(!gathered);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn an_engine_that_goes_leaves_the_joined_threads_to_the_one_that_gathered_them_last() {
        let Some(_turn) = moving_turn() else {
            return;
        };
        let (tid, done, worker) = joined_thread();
        let before = cpus_of(tid);
        let mut old = Placement::new(true);
        gather(&mut old);
        // The new engine's sequencer, on a thread of its own.
        let (gathered_tx, gathered_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let new = std::thread::spawn(move || {
            let mut new = Placement::new(true);
            gather(&mut new);
            gathered_tx.send(()).unwrap();
            let _ = go_rx.recv();
            drop(new);
        });
        gathered_rx.recv().unwrap();
        drop(old);
        assert_eq!(
            cpus_of(0),
            before,
            "the old sequencer's thread has its CPUs back"
        );
        assert_eq!(
            cpus_of(tid),
            1,
            "the joined thread stays with the placement that gathered it last"
        );
        drop(go_tx);
        new.join().unwrap();
        assert_eq!(
            cpus_of(tid),
            before,
            "and gets its CPUs back when that one goes"
        );
        drop(done);
        worker.join().unwrap();
    }

    #[test]
    fn a_thread_started_by_a_gathered_one_gets_every_cpu_when_the_pipeline_spreads() {
        let Some(_turn) = moving_turn() else {
            return;
        };
        let before = cpus_of(0);
        let mut p = Placement::new(true);
        gather(&mut p);
        // Started from the gathered thread, as the read pool's threads are
        // from a gathered worker: it inherits the one CPU.
        let (tid, done, started) = joined_thread();
        leave_remotely(tid);
        assert_eq!(cpus_of(tid), 1);
        spread_by_heavy_rounds(&mut p);
        assert_eq!(cpus_of(tid), before, "the inherited CPU is undone");
        drop(done);
        started.join().unwrap();
    }

    /// Takes `tid` out of the joined list, as if it had never joined.
    fn leave_remotely(tid: libc::pid_t) {
        JOINED.lock().unwrap().retain(|&t| t != tid);
    }

    #[test]
    fn light_rounds_gather_the_joined_threads_on_the_sequencers_cpu_and_heavy_ones_spread_them() {
        let Some(_turn) = moving_turn() else {
            return;
        };
        let (tid, done_tx, worker) = joined_thread();
        let before = cpus_of(tid);
        let mut p = Placement::new(true);
        gather(&mut p);
        assert!(p.gathered());
        assert_eq!(cpus_of(0), 1, "the sequencer is on one CPU");
        assert_eq!(cpus_of(tid), 1, "and so is the joined thread");
        spread_by_heavy_rounds(&mut p);
        assert!(!p.gathered());
        assert_eq!(cpus_of(tid), before, "the joined thread has its CPUs back");
        drop(done_tx);
        worker.join().unwrap();
        assert!(
            !JOINED.lock().unwrap().contains(&tid),
            "a thread that left is not placed again"
        );
    }
}
