//! Space amplification in steady state (R19): users keep receiving
//! messages, their devices keep ACKing, compaction keeps up, and the bytes
//! on disk stay close to the bytes still needed.

mod inbox_common;

use std::time::Duration;

use inbox_common::*;
use inbox_engine::*;

const PHONE: DeviceId = 1;

fn tune(c: &mut InboxConfig) {
    c.segment_bytes = 64 << 10;
    // Events live two hours; a round is half an hour.
    c.safety_window = Duration::from_secs(2 * 3600);
    c.compaction_interval = None;
}

#[test]
fn space_amplification_stays_under_one_and_a_half_times_live_bytes() {
    let h = Harness::with(tune);
    const CONVS: u64 = 4;
    const PER_CONV: u64 = 5;
    let mut gens = Vec::new();
    for conv in 0..CONVS {
        for m in 0..PER_CONV {
            let uid = conv * PER_CONV + m + 1;
            h.join(100 + conv, uid);
            gens.push((uid, h.register(uid, PHONE).device.generation, 0));
        }
    }
    let mut worst_total = 0.0f64;
    let mut worst_evt = 0.0f64;
    for round in 0..24u64 {
        for conv in 0..CONVS {
            let sender = conv * PER_CONV + 1 + round % PER_CONV;
            h.send_many(
                100 + conv,
                sender,
                u128::from(round * 10_000 + conv * 1000),
                150,
            );
        }
        for (uid, gen, acked) in gens.iter_mut() {
            let (_, g, a) = h.catch_up(*uid, PHONE, *gen, *acked);
            *gen = g;
            *acked = a;
        }
        h.advance(Duration::from_secs(1800));
        h.ib().compact().unwrap();
        let u = h.ib().space_usage().unwrap();
        let total = (u.evt_bytes + u.msg_bytes) as f64 / (u.evt_live_bytes + u.msg_bytes) as f64;
        let evt = u.evt_bytes as f64 / u.evt_live_bytes.max(1) as f64;
        if round >= 8 {
            worst_total = worst_total.max(total);
            worst_evt = worst_evt.max(evt);
        }
        println!(
            "round {round:2}: evt {} B on disk / {} B live ({evt:.2}x), msg {} B, total {total:.2}x",
            u.evt_bytes, u.evt_live_bytes, u.msg_bytes
        );
    }
    let stats = h.ib().stats();
    println!(
        "steady state: worst space amplification {worst_total:.2}x overall, {worst_evt:.2}x for the event log; {:?}",
        stats.compaction
    );
    assert!(stats.compaction.segments_dropped > 0);
    assert!(
        worst_total < 1.5,
        "space amplification {worst_total:.2}x is not under 1.5x"
    );
    // The event log alone is reported, not bounded: how its segments fill
    // depends on how concurrent sends fall into rounds, and a pass only
    // writes checkpoints for compaction once an eighth of the log waits for
    // coverage, so it can peak above 2x for a few rounds before the next
    // pass catches up (seen at 2.37x, with 1.24x overall).
    println!("event log alone peaked at {worst_evt:.2}x");
}
