//! A full inbox stops the van from reading: what a peer can write while nobody drains the
//! inbox is bounded (socket buffers, the provided-buffer ring, the batches in flight), and
//! nothing written is lost once the inbox drains.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use van_core::testkit;
use van_core::wire::{self, Limits};
use van_core::{Event, Van};
use van_uring::{IoUringVan, UringOptions};

const WAIT: Duration = Duration::from_secs(30);
/// The peer stops trying after this much, whether or not the van pushed back.
const WRITE_CAP: usize = 64 << 20;
/// What the van may take in without delivering: the receiving socket's buffer (a few MiB
/// on loopback), its provided-buffer ring and a couple of batches. A van that keeps reading
/// into memory while its inbox is full takes everything up to [`WRITE_CAP`].
const BOUND: usize = 24 << 20;
/// The peer writes at most this much at a time, then pauses, so an I/O thread that keeps
/// up never runs out of provided buffers (which would stop it reading by accident).
const PACE: usize = 32 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_inbox_stops_reading_and_loses_nothing() {
    let van = IoUringVan::new(UringOptions {
        recv_buffer_bytes: 4096,
        recv_buffers: 1024,
        ..UringOptions::default()
    })
    .unwrap();
    let (tx, mut inbox) = van_core::inbox(1);
    let endpoint = van.bind("127.0.0.1", 0, tx).await.unwrap();
    let port = endpoint
        .address
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let frame = wire::encode_to_vec(&testkit::numbered(9, 8, 0, 200), &Limits::default()).unwrap();
    let chunk: Vec<u8> = frame
        .iter()
        .copied()
        .cycle()
        .take(frame.len() * 256)
        .collect();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    // A small send buffer: what the peer manages to write is what the van took.
    socket.set_send_buffer_size(64 << 10).unwrap();
    socket
        .connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
        .unwrap();
    socket.set_nonblocking(true).unwrap();
    let socket = TcpStream::from_std(socket.into()).unwrap();
    // Write until the van stops taking bytes for a while (or the cap is reached).
    let mut written = 0usize;
    let mut at = 0usize;
    let mut last_progress = Instant::now();
    while written < WRITE_CAP && last_progress.elapsed() < Duration::from_millis(500) {
        if tokio::time::timeout(Duration::from_millis(100), socket.writable())
            .await
            .is_err()
        {
            continue;
        }
        let end = chunk.len().min(at + PACE);
        match socket.try_write(&chunk[at..end]) {
            Ok(n) => {
                written += n;
                at = (at + n) % chunk.len();
                last_progress = Instant::now();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("write failed: {e}"),
        }
    }
    assert!(
        written < BOUND,
        "the van took {} MiB while its inbox was full",
        written >> 20
    );
    // Every whole frame written arrives once the inbox drains.
    let expected = written / frame.len();
    let mut received = 0;
    while received < expected {
        match tokio::time::timeout(WAIT, inbox.recv()).await {
            Ok(Some(Event::Message(msg))) => {
                testkit::check_numbered(&msg, 9, 0);
                received += 1;
            }
            other => panic!("after {received} of {expected} messages: {other:?}"),
        }
    }
    drop(socket);
    van.stop().await.unwrap();
}
