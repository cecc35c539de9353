//! What the raft port's frames cost to encode and decode (CBOR, as
//! `cluster::network` writes them): a 5 KB round and a 3 MiB snapshot
//! chunk, as byte strings (what the port sends) against serde's default
//! for a `Vec<u8>`, a sequence of integers (what it sent before). Prints
//! each form's size on the wire.
//!
//! `cargo bench -p inbox-server --bench raft_frames`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use inbox_server::cluster::network::SnapshotChunk;
use inbox_server::cluster::{Round, SnapshotMeta, Vote};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A round as the derive wrote it before.
#[derive(Serialize, Deserialize)]
struct IntegerRound(Vec<u8>);

/// A snapshot chunk with its bytes as the derive writes them.
#[derive(Serialize, Deserialize)]
struct IntegerChunk {
    vote: Vote,
    meta: SnapshotMeta,
    id: String,
    offset: u64,
    data: Vec<u8>,
    done: bool,
}

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

fn cbor<T: Serialize>(v: &T) -> Vec<u8> {
    let mut buf = Vec::new();
    ciborium::into_writer(v, &mut buf).expect("encodes");
    buf
}

/// Encodes `v` and decodes it back as `T`.
fn round_trip<T: Serialize, U: DeserializeOwned>(v: &T) -> U {
    ciborium::from_reader(&cbor(v)[..]).expect("decodes")
}

fn chunk(data: Vec<u8>) -> SnapshotChunk {
    SnapshotChunk {
        vote: Vote::new_committed(3, 1),
        meta: SnapshotMeta::default(),
        id: "T3-N1-0".into(),
        offset: 0,
        data,
        done: false,
    }
}

fn integer_chunk(data: Vec<u8>) -> IntegerChunk {
    let c = chunk(data);
    IntegerChunk {
        vote: c.vote,
        meta: c.meta,
        id: c.id,
        offset: c.offset,
        data: c.data,
        done: c.done,
    }
}

fn frames(c: &mut Criterion) {
    let round = bytes(5_000);
    println!(
        "round of {} bytes: {} on the wire as a byte string, {} as integers",
        round.len(),
        cbor(&Round(round.clone())).len(),
        cbor(&IntegerRound(round.clone())).len()
    );
    let mut g = c.benchmark_group("raft_frames/round_5k");
    g.throughput(Throughput::Bytes(round.len() as u64));
    g.bench_function("byte_string", |b| {
        let r = Round(round.clone());
        b.iter(|| round_trip::<_, Round>(&r))
    });
    g.bench_function("integers", |b| {
        let r = IntegerRound(round.clone());
        b.iter(|| round_trip::<_, IntegerRound>(&r))
    });
    g.finish();

    let data = bytes(3 << 20);
    let as_bytes = chunk(data.clone());
    let as_integers = integer_chunk(data.clone());
    println!(
        "snapshot chunk of {} bytes: {} on the wire as a byte string, {} as integers",
        data.len(),
        cbor(&as_bytes).len(),
        cbor(&as_integers).len()
    );
    let mut g = c.benchmark_group("raft_frames/chunk_3m");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("byte_string", |b| {
        b.iter(|| round_trip::<_, SnapshotChunk>(&as_bytes))
    });
    g.bench_function("integers", |b| {
        b.iter(|| round_trip::<_, IntegerChunk>(&as_integers))
    });
    g.finish();
}

criterion_group!(benches, frames);
criterion_main!(benches);
