//! The engine's threads, taken from a process-wide pool of parked OS
//! threads.
//!
//! An open engine runs seven long-lived threads (the sequencer, the
//! checkpoint and snapshot writers, and each log's writer and segment
//! preparer). Creating and joining them is a large
//! part of what opening an engine costs (`docs/RELIABILITY.md` has the
//! figures). The daemon opens an engine once, but a group member
//! installing a snapshot opens a new one, and the crash tests and fuzz
//! targets open thousands. When an engine stops, its threads park here instead of
//! exiting, and the next engine takes them over.
//!
//! A pooled thread behaves like a spawned one for the code it runs: it
//! carries the given name (the kernel's `comm`, which `top`, `perf` and
//! `/proc/PID/task/*/comm` show), a panic ends only that job and is
//! returned by [`Handle::join`], and everything the job owned is dropped
//! before `join` returns. The standard library knows every pooled thread
//! as `engine-pool`; [`current_name`] says which job one is running (a
//! panic hook uses it). At most [`IDLE_MAX`] threads park; a parked
//! thread exits after [`IDLE_FOR`] without work.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Threads kept parked at most; more than two engines' worth is waste.
pub const IDLE_MAX: usize = 24;
/// How long a parked thread waits for work before it exits.
pub const IDLE_FOR: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send + 'static>;
type Outcome = std::thread::Result<()>;

/// One piece of work for a pooled thread, and where its outcome goes.
struct Task {
    name: String,
    job: Job,
    done: Arc<Done>,
}

#[derive(Default)]
struct Done {
    outcome: Mutex<Option<Outcome>>,
    cv: Condvar,
}

/// A parked thread: it waits on the receiving end of `wake`.
struct Parked {
    id: u64,
    wake: mpsc::Sender<Task>,
}

/// Parked threads, waiting for work.
struct Pool {
    idle: Mutex<Vec<Parked>>,
    next_id: std::sync::atomic::AtomicU64,
}

/// The pool every engine draws from.
static POOL: Pool = Pool::new();

/// Waits for a job run by [`spawn`], like a `JoinHandle`.
#[must_use = "a job's panic is seen only through join"]
pub struct Handle {
    done: Arc<Done>,
}

impl Handle {
    /// Blocks until the job has returned (or panicked) and everything it
    /// owned is dropped; `Err` carries the panic's payload.
    pub fn join(self) -> Result<(), Box<dyn Any + Send + 'static>> {
        let mut outcome = lock(&self.done.outcome);
        loop {
            if let Some(result) = outcome.take() {
                return result;
            }
            outcome = self
                .done
                .cv
                .wait(outcome)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

thread_local! {
    /// The name of the job this pooled thread is running.
    static JOB_NAME: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// The name given to [`spawn`] for the job the calling thread runs, or
/// `None` on a thread that is not running a pooled job.
pub fn current_name() -> Option<String> {
    JOB_NAME.with(|n| n.borrow().clone())
}

/// Runs `job` on a pooled thread named `name` (at most 15 bytes are kept,
/// as for any Linux thread name).
pub fn spawn(name: &str, job: impl FnOnce() + Send + 'static) -> std::io::Result<Handle> {
    POOL.spawn(name, Box::new(job))
}

impl Pool {
    const fn new() -> Pool {
        Pool {
            idle: Mutex::new(Vec::new()),
            next_id: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn spawn(&'static self, name: &str, job: Job) -> std::io::Result<Handle> {
        let done = Arc::new(Done::default());
        let mut task = Task {
            name: name.to_string(),
            job,
            done: Arc::clone(&done),
        };
        // A parked thread that timed out may be gone by the time it is woken:
        // its receiver is dropped and the task comes back, to try the next.
        loop {
            let Some(parked) = lock(&self.idle).pop() else {
                break;
            };
            match parked.wake.send(task) {
                Ok(()) => return Ok(Handle { done }),
                Err(mpsc::SendError(back)) => task = back,
            }
        }
        std::thread::Builder::new()
            .name("engine-pool".into())
            .spawn(move || self.work(task))?;
        Ok(Handle { done })
    }

    /// A pooled thread's life: run a task, park, repeat until no task comes.
    fn work(&self, mut task: Task) {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        loop {
            set_name(&task.name);
            JOB_NAME.with(|n| *n.borrow_mut() = Some(task.name.clone()));
            let outcome = catch_unwind(AssertUnwindSafe(task.job));
            JOB_NAME.with(|n| *n.borrow_mut() = None);
            *lock(&task.done.outcome) = Some(outcome);
            task.done.cv.notify_all();
            set_name("inbox-idle");
            match self.park(id) {
                Some(next) => task = next,
                None => return,
            }
        }
    }

    /// Parks the calling thread until a task arrives; `None` when the pool is
    /// full or nothing came within [`IDLE_FOR`].
    fn park(&self, id: u64) -> Option<Task> {
        let (wake, tasks) = mpsc::channel();
        {
            let mut idle = lock(&self.idle);
            if idle.len() >= IDLE_MAX {
                return None;
            }
            idle.push(Parked { id, wake });
        }
        match tasks.recv_timeout(IDLE_FOR) {
            Ok(task) => Some(task),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => {
                let mut idle = lock(&self.idle);
                if let Some(at) = idle.iter().position(|p| p.id == id) {
                    idle.remove(at);
                    return None;
                }
                drop(idle);
                // A spawner took this thread off the list just as it timed
                // out: its task is on the way.
                tasks.recv().ok()
            }
        }
    }
}

/// The pool's locks guard plain data that a panic cannot leave half
/// written (jobs run outside them), so a poisoned lock is still good.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets the calling thread's kernel name (`comm`), cut to 15 bytes.
fn set_name(name: &str) {
    let mut bytes = [0u8; 16];
    let n = name.len().min(15);
    bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16
    // bytes from the pointer; `bytes` is 16 bytes with a zero at the end.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, bytes.as_ptr());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn comm() -> String {
        std::fs::read_to_string("/proc/thread-self/comm")
            .expect("comm")
            .trim()
            .to_string()
    }

    #[test]
    fn a_job_runs_under_its_name_and_join_waits_for_it() {
        let ran = Arc::new(AtomicUsize::new(0));
        let (r, names) = (Arc::clone(&ran), Arc::new(Mutex::new(Vec::new())));
        let n = Arc::clone(&names);
        let handle = spawn("pool-test-a-very-long-name", move || {
            std::thread::sleep(Duration::from_millis(20));
            n.lock().unwrap().push(comm());
            n.lock().unwrap().push(current_name().unwrap());
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        handle.join().unwrap();
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "join returned before the job"
        );
        assert_eq!(
            names.lock().unwrap().as_slice(),
            ["pool-test-a-ver", "pool-test-a-very-long-name"]
        );
    }

    #[test]
    fn a_stopped_job_thread_is_reused_by_the_next_job() {
        // A pool of its own, so no other test takes the parked thread.
        let pool: &'static Pool = Box::leak(Box::new(Pool::new()));
        let thread_of_job = |name: &str| {
            let tid = Arc::new(Mutex::new(None));
            let t = Arc::clone(&tid);
            let job: Job = Box::new(move || *t.lock().unwrap() = Some(std::thread::current().id()));
            pool.spawn(name, job).unwrap().join().unwrap();
            let id = tid.lock().unwrap().take();
            id.expect("the job ran")
        };
        let first = thread_of_job("pool-reuse-1");
        // The thread parks after its job: wait until it is on the list.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while lock(&pool.idle).is_empty() {
            assert!(std::time::Instant::now() < deadline, "no thread parked");
            std::thread::yield_now();
        }
        let second = thread_of_job("pool-reuse-2");
        assert_eq!(first, second, "the second job started a new thread");
    }

    #[test]
    fn a_panicking_job_is_reported_by_join_and_drops_what_it_owned() {
        struct Flag(Arc<AtomicUsize>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let flag = Flag(Arc::clone(&dropped));
        let handle = spawn("pool-panic", move || {
            let _owned = flag;
            panic!("on purpose");
        })
        .unwrap();
        let err = handle.join().expect_err("the panic is returned");
        assert_eq!(err.downcast_ref::<&str>(), Some(&"on purpose"));
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "the job's state was dropped"
        );
        // The pool still works after a panic.
        spawn("pool-after", || {}).unwrap().join().unwrap();
    }
}
