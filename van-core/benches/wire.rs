//! Wire-format throughput: encode and decode of a small and a large message, and a batch.
//!
//! Run with `cargo bench -p van-core --bench wire`. The measurement is kept short (1 s warm-up,
//! 3 s measurement, 20 samples per benchmark) so the whole file runs in well under a minute;
//! pass criterion's `--measurement-time` for steadier numbers.
//!
//! Reading the figures: neither `encode_into` nor `decode` touches payload bytes. Encoding
//! appends the segments' `Bytes` handles to the parts list and decoding slices the frame, so
//! the 4 MiB figures are in the hundreds of GB/s or more and measure per-message overhead,
//! not memory bandwidth. `encode_to_vec/4MiB` copies the payload once into a contiguous
//! buffer and shows what a copy would cost for comparison.
// `criterion_group!` generates an undocumented `pub fn`; the workspace warns on missing docs.
#![allow(missing_docs)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use van_core::wire::{decode, encode_into, encode_to_vec};
use van_core::{Limits, Message};

/// A push of one 8-byte value, as a KV worker sends it (sender, recipient, flags set).
fn small_message() -> Message {
    let mut msg = Message::to(8, vec![Bytes::from_static(&[1, 2, 3, 4, 5, 6, 7, 8])]);
    msg.meta.sender = Some(9);
    msg.meta.request = true;
    msg.meta.push = true;
    msg.meta.request_id = 12345;
    msg
}

fn large_message() -> Message {
    Message::to(8, vec![Bytes::from(vec![0xa5u8; 4 << 20])])
}

fn encoded(msg: &Message) -> Bytes {
    Bytes::from(encode_to_vec(msg, &Limits::default()).unwrap())
}

fn bench_encode(c: &mut Criterion) {
    let limits = Limits::default();
    let mut group = c.benchmark_group("encode");
    for (name, msg, throughput) in [
        ("8B", small_message(), Throughput::Elements(1)),
        ("4MiB", large_message(), Throughput::Bytes(4 << 20)),
    ] {
        group.throughput(throughput);
        // The arena and the parts list are reused across iterations, as a van's writer does.
        let mut arena = BytesMut::with_capacity(4096);
        let mut parts = Vec::with_capacity(8);
        group.bench_function(name, |b| {
            b.iter(|| {
                parts.clear();
                encode_into(black_box(&msg), &limits, &mut arena, &mut parts).unwrap()
            })
        });
    }
    group.finish();

    let mut batch = c.benchmark_group("encode_batch");
    let messages: Vec<Message> = (0..64).map(|_| small_message()).collect();
    batch.throughput(Throughput::Elements(messages.len() as u64));
    let mut arena = BytesMut::with_capacity(64 * 256);
    let mut parts = Vec::with_capacity(64 * 3);
    batch.bench_function("64x8B", |b| {
        b.iter(|| {
            parts.clear();
            for msg in &messages {
                encode_into(black_box(msg), &limits, &mut arena, &mut parts).unwrap();
            }
            parts.len()
        })
    });
    batch.finish();

    let mut copy = c.benchmark_group("encode_to_vec");
    let large = large_message();
    copy.throughput(Throughput::Bytes(4 << 20));
    copy.bench_function("4MiB", |b| {
        b.iter(|| encode_to_vec(black_box(&large), &limits).unwrap())
    });
    copy.finish();
}

fn bench_decode(c: &mut Criterion) {
    let limits = Limits::default();
    let mut group = c.benchmark_group("decode");
    for (name, msg, throughput) in [
        ("8B", small_message(), Throughput::Elements(1)),
        ("4MiB", large_message(), Throughput::Bytes(4 << 20)),
    ] {
        group.throughput(throughput);
        let frame = encoded(&msg);
        // Cloning a `Bytes` is a reference-count increment, as handing a received frame on is.
        group.bench_function(name, |b| {
            b.iter_batched(
                || frame.clone(),
                |frame| decode(black_box(frame), &limits).unwrap(),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = bench_encode, bench_decode
}
criterion_main!(benches);
