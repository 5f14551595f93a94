//! Under a continuous flood of small frames a ring still hands its events to the inbox in
//! bounded batches (an unbounded reap gathered every message of the flood into one batch).

#![cfg(target_os = "linux")]

use std::io::Write;
use std::time::Duration;

use van_core::testkit::numbered;
use van_core::wire::{encode_to_vec, Limits};
use van_core::{inbox, Event, Van};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_is_delivered_in_bounded_batches() {
    const MESSAGES: u32 = 400_000;
    let van = van_uring::IoUringVan::new(van_uring::UringOptions::default())
        .unwrap_or_else(|e| panic!("io_uring van: {e}"));
    let (tx, mut rx) = inbox(1024);
    let endpoint = van
        .bind("127.0.0.1", 0, tx)
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    // One write of every frame: the kernel fills each buffer the ring gives back at once.
    let mut burst = Vec::new();
    for seq in 0..MESSAGES {
        let frame = encode_to_vec(&numbered(9, 8, seq, 8), &Limits::default())
            .unwrap_or_else(|e| panic!("encode: {e}"));
        burst.extend_from_slice(&frame);
    }
    let address = endpoint.address.clone();
    let writer = std::thread::spawn(move || {
        let mut socket =
            std::net::TcpStream::connect(address).unwrap_or_else(|e| panic!("connect: {e}"));
        socket
            .write_all(&burst)
            .unwrap_or_else(|e| panic!("write: {e}"));
        socket
    });
    let mut received = 0;
    while received < MESSAGES {
        match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
            Ok(Some(Event::Message(msg))) => {
                assert_eq!(msg.meta.request_id, received as i32, "out of order");
                received += 1;
            }
            other => panic!("after {received} messages: {other:?}"),
        }
    }
    let _socket = writer.join().unwrap_or_else(|_| panic!("writer panicked"));
    let largest = van.stats().largest_batch;
    // The bound, plus what the last few completions taken carry (a 64 KiB buffer of these
    // ~100-byte frames holds ~650).
    let bound = van_uring::MAX_BATCH_EVENTS + 8 * 1024;
    assert!(
        largest <= bound,
        "a batch of {largest} events (bound {bound})"
    );
    eprintln!("largest batch: {largest} events");
    van.stop().await.unwrap_or_else(|e| panic!("stop: {e}"));
}
