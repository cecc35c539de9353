//! Replays every committed fuzz corpus through the same checks the fuzz
//! targets run, so each finding stays a regression test in `cargo test`.

fn replay(target: &str, check: fn(&[u8])) {
    let inputs = inbox_tests::fuzzing::corpus(target);
    assert!(!inputs.is_empty(), "the {target} corpus is empty");
    for data in inputs {
        check(&data);
    }
}

#[test]
fn segment_recover_corpus_never_panics_and_recovers_exactly_the_longest_intact_prefix() {
    replay(
        "segment_recover",
        inbox_tests::fuzzing::segment_recover::check,
    );
    let outcomes = inbox_tests::fuzzing::segment_recover::outcomes();
    println!("segment_recover corpus: {outcomes:?}");
    assert!(
        outcomes.refused > 0 && outcomes.whole > 0 && outcomes.cut > 0,
        "the corpus must refuse damage, recover whole logs and cut torn tails: {outcomes:?}"
    );
}

#[test]
fn wire_decode_corpus_never_panics_and_every_accepted_frame_reencodes_exactly() {
    replay("wire_decode", inbox_tests::fuzzing::wire_decode::check);
}

#[test]
fn engine_model_corpus_keeps_every_acknowledged_write_across_faults_and_restarts() {
    replay("engine_model", inbox_tests::fuzzing::engine_model::check);
    let coverage = inbox_tests::fuzzing::engine_model::coverage();
    println!("engine_model corpus: {coverage}");
    coverage.assert_reached_everything();
}
