//! The cost of authentication: opening a loopback TCP connection with and without the
//! cluster-secret handshake (both sides' HMACs, nonces and the extra round trips), side by
//! side in one run.
//!
//! Run with `cargo bench -p van-core --bench auth`; kept short (1 s warm-up, 3 s measurement).
// `criterion_group!` generates an undocumented `pub fn`; the workspace warns on missing docs.
#![allow(missing_docs)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tokio::net::{TcpListener, TcpStream};
use van_core::auth::{AuthOptions, ClusterSecret, Gate, Side};

fn connect(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("connect");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    for (name, secret) in [
        ("plain", None),
        (
            "authenticated",
            Some(ClusterSecret::new("0123456789abcdef0123").unwrap()),
        ),
    ] {
        let gate = Gate::new(AuthOptions {
            secret,
            ..AuthOptions::default()
        });
        let (listener, address) = rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            (listener, address)
        });
        let acceptor = gate.clone();
        rt.spawn(async move {
            loop {
                let (mut stream, remote) = listener.accept().await.unwrap();
                let gate = acceptor.clone();
                tokio::spawn(async move {
                    let _ = gate
                        .authenticate(&mut stream, Side::Acceptor, &remote.ip())
                        .await;
                });
            }
        });
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let mut stream = TcpStream::connect(address).await.unwrap();
                    gate.authenticate(&mut stream, Side::Dialer, &address.ip())
                        .await
                        .unwrap();
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, connect);
criterion_main!(benches);
