//! Inputs the `engine_model` fuzz target failed on, each under the name of
//! what broke, replayed through the same check. Set `ENGINE_MODEL_TRACE=1`
//! to print every operation and refusal of a case.

use std::path::Path;

fn replay(name: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions/engine_model")
        .join(name);
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    inbox_tests::fuzzing::engine_model::check(&data);
}

/// A join failed under an injected fsync fault but reached the disk; after
/// a power cut the same join, once a later fault had stopped the engine,
/// was answered with that period's seq and no write. The model took any
/// join seq above its head for a new record and reported an acknowledged
/// write after the fault; the engine was right (fail-stop holds: nothing
/// was written), and the model now settles such a seq without counting it
/// as a write.
#[test]
fn a_join_answered_from_a_period_that_landed_under_a_fault_is_not_a_write_after_the_fault() {
    replay("join_of_a_member_whose_join_landed_under_a_fault.bin");
}

/// Open. An fsync failed during a compaction pass (the log poisoned, as it
/// must); the engine was killed, more was written and compacted, then
/// power was cut; after a checkpoint, a sync failed with "no durable record
/// at segment 3 offset 56" although no fault was armed: the index points at
/// an event the log does not hold. It fails in about one run of three
/// (timing decides how commits and the periodic checkpoint interleave).
/// Not yet known whether the engine or the power-cut image is wrong: the
/// image takes checkpoint files as soon as they are renamed, before the
/// writer's directory fsync. Run it with `--ignored`, with
/// `ENGINE_MODEL_TRACE=1` for the operations.
#[test]
#[ignore = "open finding: fails about one run in three, cause not yet known"]
fn a_sync_after_a_kill_and_a_power_cut_following_a_failed_compaction_fsync_finds_its_events() {
    replay("sync_after_kill_then_power_cut_following_a_failed_compaction_fsync.bin");
}
