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
