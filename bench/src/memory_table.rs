//! The soak's memory breakdown table: the server's bytes per structure at
//! the last sample and how each grew with the messages retained.

use std::fmt::Write as _;

use inbox_server::heap::on_heap;

use crate::report::{SoakReport, SoakSample};

/// The last sample's memory breakdown, each structure's slope over
/// messages retained (allocated bytes per million messages, least
/// squares over the samples after the first message), and what the
/// structures leave of RssAnon (the mapped log segments are file-backed,
/// so not in it).
pub fn memory_table(soak: &SoakReport) -> String {
    let mut out = String::new();
    let fitted: Vec<&SoakSample> = soak
        .samples
        .iter()
        .filter(|s| s.messages_sent > 0 && !s.memory.is_empty())
        .collect();
    let Some(last) = fitted.last() else {
        return out;
    };
    #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let messages: Vec<f64> = fitted.iter().map(|s| s.messages_retained as f64).collect();
    let _ = writeln!(
        out,
        "memory at {} messages retained: {:>20} {:>10} {:>14} {:>20}",
        last.messages_retained, "structure", "live MiB", "allocated MiB", "allocated B/M msgs"
    );
    let mut anon = 0u64;
    for m in &last.memory {
        #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
        let ys: Vec<f64> = fitted
            .iter()
            .map(|s| {
                s.memory
                    .iter()
                    .find(|x| x.structure == m.structure)
                    .map_or(0.0, |x| x.allocated as f64)
            })
            .collect();
        let slope = crate::fit::slope(&messages, &ys)
            .map_or_else(|| "-".into(), |b| format!("{:.0}", b * 1e6));
        if on_heap(&m.structure) {
            anon += m.allocated;
        }
        let _ = writeln!(
            out,
            "{:>52} {:>10.1} {:>14.1} {:>20}",
            m.structure,
            mib(m.live),
            mib(m.allocated),
            slope
        );
    }
    if let (Some(walk), Some(hold)) = (last.memory_walk_us, last.memory_longest_hold_us) {
        let _ = writeln!(
            out,
            "taking the breakdown: {walk} µs, longest hold of the state lock {hold} µs"
        );
    }
    let _ = write!(
        out,
        "structures (file-backed ones left out) {:.1} MiB allocated",
        mib(anon)
    );
    let rss = last.rss_anon_bytes;
    let _ = match last.memory.iter().find(|m| m.structure == "heap") {
        Some(heap) => writeln!(
            out,
            ", heap in use {:.1} MiB, RssAnon {:.1} MiB: {:.1} MiB of the heap outside the \
             structures (buffers, queues, checkpoint copies), {:.1} MiB of RssAnon outside the \
             heap (size classes, free pages, stacks)",
            mib(heap.live),
            mib(rss),
            mib(heap.live.saturating_sub(anon)),
            mib(rss.saturating_sub(heap.live))
        ),
        // A daemon whose allocator counts nothing.
        None => writeln!(
            out,
            " of RssAnon {:.1} MiB; the rest is not in the breakdown (allocator, buffers, \
             queues, checkpoint copies)",
            mib(rss)
        ),
    };
    out
}

#[cfg(test)]
mod tests {
    use crate::report::{Report, SoakReport, SoakSample, StructureBytes};

    #[test]
    fn soak_table_breaks_memory_down_by_structure_and_sums_only_the_heap() {
        let sample = |msgs: u64, idem: u64| SoakSample {
            messages_sent: msgs,
            messages_retained: msgs,
            rss_anon_bytes: 64 << 20,
            memory: vec![
                StructureBytes {
                    structure: "idempotency".into(),
                    live: idem,
                    allocated: idem,
                },
                StructureBytes {
                    structure: "log_mmaps".into(),
                    live: 8 << 20,
                    allocated: 8 << 20,
                },
                StructureBytes {
                    structure: "message_metadata_file".into(),
                    live: 4 << 20,
                    allocated: 4 << 20,
                },
                StructureBytes {
                    structure: "idempotency_file".into(),
                    live: 2 << 20,
                    allocated: 2 << 20,
                },
            ],
            ..SoakSample::default()
        };
        let report = Report {
            soak: vec![SoakReport {
                system: "inboxd".into(),
                samples: vec![
                    sample(0, 0),
                    sample(1_000_000, 40 << 20),
                    sample(2_000_000, 80 << 20),
                ],
                ..SoakReport::default()
            }],
            ..Report::default()
        };
        let table = report.soak_table();
        let idem = table
            .lines()
            .find(|l| l.trim_start().starts_with("idempotency"))
            .expect("an idempotency row");
        // 40 MiB more per million messages.
        assert!(idem.ends_with(&format!("{}", 40u64 << 20)), "{idem}");
        assert!(
            table.contains(
                "structures (file-backed ones left out) 80.0 MiB allocated of RssAnon 64.0 MiB"
            ),
            "{table}"
        );
    }

    #[test]
    fn soak_table_splits_rss_into_structures_heap_and_the_rest_when_the_heap_is_counted() {
        let entry = |structure: &str, bytes: u64| StructureBytes {
            structure: structure.into(),
            live: bytes,
            allocated: bytes,
        };
        let sample = SoakSample {
            messages_sent: 1_000,
            messages_retained: 1_000,
            rss_anon_bytes: 50 << 20,
            memory: vec![
                entry("idempotency", 30 << 20),
                entry("log_mmaps", 8 << 20),
                entry("heap", 36 << 20),
                entry("anonymous", 50 << 20),
            ],
            ..SoakSample::default()
        };
        let report = Report {
            soak: vec![SoakReport {
                system: "inboxd".into(),
                samples: vec![sample],
                ..SoakReport::default()
            }],
            ..Report::default()
        };
        let table = report.soak_table();
        // The process totals are not summed as structures: 30 MiB is.
        assert!(
            table.contains(
                "structures (file-backed ones left out) 30.0 MiB allocated, heap in use 36.0 MiB, \
                 RssAnon 50.0 MiB: 6.0 MiB of the heap outside the structures"
            ),
            "{table}"
        );
        assert!(
            table.contains("14.0 MiB of RssAnon outside the heap"),
            "{table}"
        );
    }
}
