//! Plain `SENDMSG` against `SENDMSG_ZC` over loopback, one van pair, one stream of messages
//! of each size: the measurement behind the crate's SEND_ZC rule.
//!
//! ```text
//! cargo run --release -p van-uring --example send_zc
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(target_os = "linux")]
fn main() {
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use van_core::testkit;
    use van_core::{Message, Van};
    use van_uring::{IoUringVan, UringOptions};

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        println!("| size | plain GB/s | zero-copy GB/s | zc/plain | zc sends | dropped to plain |");
        println!("| --- | --- | --- | --- | --- | --- |");
        for size in [4usize << 10, 64 << 10, 1 << 20, 4 << 20] {
            let mut figures = Vec::new();
            let mut zc_stats = (0, 0);
            for zero_copy in [false, true] {
                let options = UringOptions {
                    zc_threshold: zero_copy.then_some(1),
                    zc_loopback: zero_copy,
                    ..UringOptions::default()
                };
                let make = || IoUringVan::new(options.clone()).unwrap();
                let a = testkit::start(&make, 9).await;
                let mut b = testkit::start(&make, 8).await;
                testkit::connect(&a, &b).await;
                let payload = Bytes::from(vec![1u8; size]);
                let count = ((1usize << 30) / size).max(64);
                let sender = a.van.clone();
                let started = Instant::now();
                let send = tokio::spawn(async move {
                    for _ in 0..count {
                        let mut msg = Message::to(8, vec![payload.clone()]);
                        msg.meta.sender = Some(9);
                        sender.send(msg).await.unwrap();
                    }
                });
                for _ in 0..count {
                    testkit::expect_message(&mut b.inbox).await;
                }
                let secs = started.elapsed().as_secs_f64();
                send.await.unwrap();
                figures.push((count * size) as f64 / secs / 1e9);
                if zero_copy {
                    let stats = a.van.stats();
                    zc_stats = (stats.zc_sends, stats.zc_copied);
                }
                a.van.stop().await.unwrap();
                b.van.stop().await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!(
                "| {size} | {:.2} | {:.2} | {:.2}x | {} | {} |",
                figures[0],
                figures[1],
                figures[1] / figures[0],
                zc_stats.0,
                zc_stats.1
            );
        }
    });
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("io_uring is Linux only");
}
