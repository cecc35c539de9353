//! The checks behind the fuzz targets, shared with `cargo test`.
//!
//! Each fuzz target in `fuzz/` is a thin wrapper around one function here,
//! so the committed corpus of every target is replayed by the normal test
//! suite (`tests/tests/fuzz_corpus_replay.rs`) and every finding stays a
//! regression test.

pub mod engine_model;
pub mod segment_recover;
pub mod wire_decode;

/// A scratch directory for one fuzz case: on tmpfs when the machine has
/// one, so that fsync costs nothing and the fuzzer spends its time in the
/// code under test. The checks do not depend on where it lives.
pub(crate) fn scratch_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("a temp dir")
}

/// Pins the calling thread, and every thread it starts from now on, to one
/// CPU, picked by process id so that the jobs of a forking fuzzer spread
/// over the CPUs. The engine hands each operation across several threads;
/// on a virtual machine a wake-up on another CPU costs an interrupt to
/// that CPU, and on the same CPU it does not. On a 2-core machine this
/// made the `engine_model` corpus run about 1.2 to 1.5 times as fast
/// (`cargo run --release -p inbox-tests --example engine_model_speed`,
/// plain and under `taskset -c 0`). For fuzz targets only: a test process
/// runs many tests at once and wants every CPU.
pub fn pin_to_one_cpu() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = std::process::id() as usize % cpus;
    // SAFETY: `set` is a plain bit set on the stack, initialised by
    // CPU_ZERO; sched_setaffinity only reads it. Pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        // A refusal (a cgroup without that CPU) leaves the thread as it
        // was: only speed depends on it.
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
