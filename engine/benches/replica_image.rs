//! What one replica image costs to build (`Inbox::export_image`, the work
//! behind every raft snapshot): wall time and image bytes for a small
//! store, under two segment sizes. The image's own logs are fresh, so the
//! cost should follow the live data, not the size of the segments they
//! are written into.
//!
//! It also times one check of the image (`Image::parse`: its SHA-256 and
//! layout), the pass an install makes over the file it received before
//! staging it.
//!
//! Run: `cargo bench -p inbox-engine --bench replica_image`
//! (prints the figures; `harness = false`: one build is long enough to
//! time alone, and the figure wanted is how it scales with the segment
//! size, not a mean within noise.)

use std::time::Instant;

use bytes::Bytes;
use inbox_engine::inbox::Image;
use inbox_engine::*;

const SENDS: u64 = 2_000;
const BUILDS: usize = 5;

fn main() {
    println!("replica image of {SENDS} sends of 200 bytes, {BUILDS} builds each");
    println!("segment size | median build | slowest build | image bytes | median check");
    for segment_bytes in [1u64 << 20, 128 << 20] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = InboxConfig::new(dir.path().join("data"));
        c.segment_bytes = segment_bytes;
        c.compaction_interval = None;
        let ib = Inbox::open(c).unwrap();
        ib.join(Uid(1), ConvId(1)).wait().unwrap();
        ib.join(Uid(2), ConvId(1)).wait().unwrap();
        let pending: Vec<_> = (0..SENDS)
            .map(|i| {
                ib.send(SendRequest {
                    conv: ConvId(1),
                    sender: Uid(1 + i % 2),
                    client_msg_id: u128::from(i) + 1,
                    msg_type: 1,
                    payload: Bytes::from(vec![b'x'; 200]),
                })
            })
            .collect();
        for p in pending {
            p.wait().unwrap();
        }
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..BUILDS {
            let start = Instant::now();
            let out = dir.path().join("image");
            ib.export_image(&dir.path().join("image.tmp"), &out, &mut |_| Vec::new())
                .unwrap();
            times.push(start.elapsed());
            bytes = std::fs::metadata(&out).unwrap().len();
        }
        times.sort();
        let image = std::fs::read(dir.path().join("image")).unwrap();
        let mut checks: Vec<_> = (0..BUILDS)
            .map(|_| {
                let start = Instant::now();
                Image::parse(&image).unwrap();
                start.elapsed()
            })
            .collect();
        checks.sort();
        println!(
            "{:>8} MiB | {:>9.1} ms | {:>10.1} ms | {bytes} | {:.2} ms ({:.0} MB/s)",
            segment_bytes >> 20,
            times[BUILDS / 2].as_secs_f64() * 1e3,
            times[BUILDS - 1].as_secs_f64() * 1e3,
            checks[BUILDS / 2].as_secs_f64() * 1e3,
            bytes as f64 / checks[BUILDS / 2].as_secs_f64() / 1e6,
        );
        ib.shutdown().unwrap();
    }
}
