//! The local table's hot path: a send meeting a waiting receive, and a receive finding a
//! queued value, on one key and spread over many keys.
//!
//! Run with `cargo bench -p rendezvous --bench local`.

// `criterion_group!` generates an undocumented `pub fn`; the workspace warns on missing docs.
#![allow(missing_docs)]

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use rendezvous::{create_key, parse_key, LocalRendezvous, ParsedKey, Rendezvous};

fn keys(n: usize) -> Vec<ParsedKey> {
    (0..n)
        .filter_map(|i| {
            parse_key(&create_key(
                "/job:worker/replica:0/task:0/device:CPU:0",
                1,
                "/job:ps/replica:0/task:0/device:CPU:0",
                &format!("edge/{i}"),
                (0, 0),
            ))
            .ok()
        })
        .collect()
}

fn local(c: &mut Criterion) {
    let value = Bytes::from_static(b"01234567");
    let one = keys(1);
    let table = LocalRendezvous::new();
    c.bench_function("send then recv_async, one key", |b| {
        b.iter(|| {
            let _ = table.send(&one[0], value.clone(), false);
            table.recv_async(&one[0], Box::new(|r| drop(std::hint::black_box(r))));
        })
    });
    c.bench_function("recv_async then send, one key", |b| {
        b.iter(|| {
            table.recv_async(&one[0], Box::new(|r| drop(std::hint::black_box(r))));
            let _ = table.send(&one[0], value.clone(), false);
        })
    });
    let many = keys(1024);
    c.bench_function("1024 sends then 1024 receives, distinct keys", |b| {
        b.iter_batched(
            LocalRendezvous::new,
            |table| {
                for k in &many {
                    let _ = table.send(k, value.clone(), false);
                }
                for k in &many {
                    table.recv_async(k, Box::new(|r| drop(std::hint::black_box(r))));
                }
            },
            BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, local);
criterion_main!(benches);
