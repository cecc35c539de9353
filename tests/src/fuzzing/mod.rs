//! The checks behind the fuzz targets, shared with `cargo test`.
//!
//! Each fuzz target in `fuzz/` is a thin wrapper around one function here,
//! so the committed corpus of every target is replayed by the normal test
//! suite (`tests/tests/fuzz_corpus_replay.rs`) and every finding stays a
//! regression test.

pub mod engine_model;
pub mod segment_recover;
pub mod wire_decode;

/// The committed corpus of fuzz target `target`, its inputs in file-name
/// order.
pub fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {} is missing: {e}", dir.display()))
        .map(|entry| entry.expect("a readable corpus entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| std::fs::read(f).expect("a readable corpus file"))
        .collect()
}

/// A scratch directory for one fuzz case: on tmpfs when the machine has
/// one, so that fsync costs nothing and the fuzzer spends its time in the
/// code under test. The checks do not depend on where it lives.
pub(crate) fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(scratch_root())
        .or_else(|_| tempfile::tempdir())
        .expect("a temp dir")
}

/// Where scratch directories go: tmpfs when the machine has one.
fn scratch_root() -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Pins the calling thread, and every thread it starts from now on, to one
/// CPU: the first one no other pinned process holds (a lock file per CPU
/// where scratch directories go, held until the process exits), so
/// that the jobs of a forking fuzzer spread over the CPUs. The engine
/// hands each operation across several threads; on a virtual machine a
/// wake-up on another CPU costs an interrupt to that CPU, and on the same
/// CPU it does not. On a 2-core machine this made the `engine_model`
/// corpus run about 1.2 to 1.5 times as fast
/// (`cargo run --release -p inbox-tests --example engine_model_speed`,
/// plain and under `taskset -c 0`). For fuzz targets only: a test process
/// runs many tests at once and wants every CPU.
pub fn pin_to_one_cpu() {
    use std::os::fd::AsRawFd;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dir = scratch_root();
    // With every CPU taken, share one by process id.
    let mut cpu = std::process::id() as usize % cpus;
    for candidate in 0..cpus {
        let path = dir.join(format!("inbox-fuzz-cpu-{candidate}.lock"));
        let Ok(file) = std::fs::File::create(&path) else {
            continue;
        };
        // SAFETY: flock on a descriptor this function owns.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if locked {
            // Held for the life of the process: the kernel drops the lock
            // when the process exits, however it exits.
            static HELD: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
            let _ = HELD.set(file);
            cpu = candidate;
            break;
        }
    }
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
