//! The checks behind the fuzz targets, shared with `cargo test`.
//!
//! Each fuzz target in `fuzz/` is a thin wrapper around one function here,
//! so the committed corpus of every target is replayed by the normal test
//! suite (`tests/tests/fuzz_corpus_replay.rs`) and every finding stays a
//! regression test.

pub mod engine_model;
pub mod segment_recover;
pub mod wire_decode;
