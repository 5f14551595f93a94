//! Buffer ownership across cancellation and shutdown: no byte the kernel may still read or
//! write is freed or reused before the kernel lets go of it.
//!
//! The payload of each send is a `Bytes` whose owner records, when it is dropped, how many
//! sends the van still counts as in the kernel (`StatsHandle::send_ops`, decremented when a
//! send's completion — and, for zero-copy sends, its notification — arrives, before any of
//! its memory is released). A van that freed a payload on cancel or stop without waiting for
//! the kernel would be seen dropping it while the count is still 1.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use van_core::testkit::{self, Peer};
use van_core::wire::{self, Limits};
use van_core::{Event, Message, Node, Role, Van};
use van_uring::{IoUringVan, StatsHandle, UringOptions};

const WAIT: Duration = Duration::from_secs(20);
/// Far more than loopback socket buffers hold, so the send stays in the kernel.
const PAYLOAD: usize = 32 << 20;

/// Payload memory that reports, when freed, what the van still had in the kernel.
struct Tracked {
    data: Vec<u8>,
    stats: StatsHandle,
    freed_with: Arc<Mutex<Option<usize>>>,
}

impl AsRef<[u8]> for Tracked {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        *self.freed_with.lock().unwrap() = Some(self.stats.send_ops());
    }
}

fn options(zero_copy: bool) -> UringOptions {
    UringOptions {
        zc_threshold: zero_copy.then_some(4096),
        zc_loopback: zero_copy,
        flush_timeout: Duration::from_millis(300),
        ..UringOptions::default()
    }
}

/// A van connected to a listener that accepts and never reads; returns the van, the
/// accepted socket and the payload's drop record after a send of [`PAYLOAD`] bytes is
/// stuck in the kernel.
async fn stuck_send(zero_copy: bool) -> (Peer<IoUringVan>, TcpStream, Arc<Mutex<Option<usize>>>) {
    let make = || IoUringVan::new(options(zero_copy)).unwrap();
    let a = testkit::start(&make, 9).await;
    let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = sink.local_addr().unwrap().port();
    a.van
        .connect(&Node::new(Role::Server, "127.0.0.1", port).with_id(8))
        .await
        .unwrap();
    let (socket, _) = tokio::time::timeout(WAIT, sink.accept())
        .await
        .unwrap()
        .unwrap();
    let freed_with = Arc::new(Mutex::new(None));
    let payload = Bytes::from_owner(Tracked {
        data: vec![7u8; PAYLOAD],
        stats: a.van.stats_handle(),
        freed_with: Arc::clone(&freed_with),
    });
    let mut msg = Message::to(8, vec![payload]);
    msg.meta.sender = Some(9);
    a.van.send(msg).await.unwrap();
    // The send is submitted and cannot finish: the sink does not read.
    let deadline = Instant::now() + WAIT;
    while a.van.stats().send_ops == 0 {
        assert!(
            Instant::now() < deadline,
            "the send never reached the kernel"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // One send, or (zero-copy) a partial one awaiting its notification plus the rest.
    assert!(a.van.stats().send_ops >= 1, "{:?}", a.van.stats());
    assert!(
        freed_with.lock().unwrap().is_none(),
        "payload freed mid-send"
    );
    (a, socket, freed_with)
}

/// Waits until the payload is freed; returns the in-kernel sends it saw then.
async fn freed(freed_with: &Mutex<Option<usize>>) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(seen) = *freed_with.lock().unwrap() {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "the payload was never freed (leak)"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn cancel_mid_send(zero_copy: bool) {
    let (mut a, mut socket, freed_with) = stuck_send(zero_copy).await;
    // The peer sends garbage: the van drops the connection, cancelling the send in flight.
    socket.write_all(&[0xAB; 64]).await.unwrap();
    match tokio::time::timeout(WAIT, a.inbox.recv()).await {
        Ok(Some(Event::PeerLost(lost))) => assert!(lost.reason.contains("bad magic"), "{lost:?}"),
        other => panic!("expected the connection to be dropped, got {other:?}"),
    }
    assert_eq!(
        freed(&freed_with).await,
        0,
        "payload freed while in the kernel"
    );
    // The connection itself is reaped once its last operation ended: maybe a turn of the
    // ring's loop after the payload went.
    settled(&a.van).await;
    let stats = a.van.stats();
    if zero_copy {
        assert!(stats.zc_sends > 0, "the send was not zero-copy: {stats:?}");
    }
    // The van still serves others.
    let mut b = testkit::start(&|| IoUringVan::new(options(zero_copy)).unwrap(), 10).await;
    testkit::connect(&a, &b).await;
    testkit::send(&*a.van, testkit::numbered(9, 10, 0, 100)).await;
    testkit::check_numbered(&testkit::expect_message(&mut b.inbox).await, 9, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_send_frees_the_payload_only_after_the_kernel_is_done() {
    cancel_mid_send(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_zero_copy_send_waits_for_the_notification() {
    cancel_mid_send(true).await;
}

async fn stop_with_send_in_flight(zero_copy: bool) {
    let (a, _socket, freed_with) = stuck_send(zero_copy).await;
    let started = Instant::now();
    tokio::time::timeout(WAIT, a.van.stop())
        .await
        .expect("stop hung")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stop took {:?}",
        started.elapsed()
    );
    assert_eq!(
        freed(&freed_with).await,
        0,
        "payload freed while in the kernel"
    );
    let stats = a.van.stats();
    assert_eq!(
        (stats.send_ops, stats.recv_ops, stats.connections),
        (0, 0, 0),
        "{stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_with_a_send_in_flight_frees_it_only_after_the_kernel_is_done() {
    stop_with_send_in_flight(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_with_a_zero_copy_send_in_flight_waits_for_the_notification() {
    stop_with_send_in_flight(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_van_with_a_send_in_flight_frees_it_only_after_the_kernel_is_done() {
    let (a, _socket, freed_with) = stuck_send(false).await;
    drop(a);
    assert_eq!(
        freed(&freed_with).await,
        0,
        "payload freed while in the kernel"
    );
}

/// Waits until the van holds nothing in the kernel but its full provided-buffer ring.
async fn settled(van: &IoUringVan) {
    let deadline = Instant::now() + WAIT;
    loop {
        let stats = van.stats();
        if stats.connections == 0
            && stats.recv_ops == 0
            && stats.send_ops == 0
            && stats.ring_buffers == stats.ring_capacity
        {
            return;
        }
        assert!(Instant::now() < deadline, "buffers not returned: {stats:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_closing_mid_receive_give_every_buffer_back() {
    let make = || {
        IoUringVan::new(UringOptions {
            recv_buffer_bytes: 4096,
            recv_buffers: 8,
            ..UringOptions::default()
        })
        .unwrap()
    };
    let mut b = testkit::start(&make, 8).await;
    let addr = b.van.local_addr().unwrap();
    settled(&b.van).await;
    // Complete small frames, then one cut at every kind of place: inside a small frame
    // (multishot receive into provided buffers) and inside a large one (direct receive into
    // the frame's own buffer, in flight when the peer goes).
    let small = wire::encode_to_vec(&testkit::numbered(9, 8, 0, 1000), &Limits::default()).unwrap();
    let large =
        wire::encode_to_vec(&testkit::numbered(9, 8, 1, 8 << 20), &Limits::default()).unwrap();
    for (round, (cut, reset)) in [
        (small.len() / 2, false),
        (small.len() / 2, true),
        (large.len() / 3, false),
        (large.len() / 3, true),
        (large.len() - 1, true),
    ]
    .into_iter()
    .enumerate()
    {
        let mut socket = TcpStream::connect(addr).await.unwrap();
        for _ in 0..10 {
            socket.write_all(&small).await.unwrap();
        }
        let partial = if cut < small.len() { &small } else { &large };
        socket.write_all(&partial[..cut]).await.unwrap();
        // Let the van take the bytes (and arm a receive for the rest) before the peer goes.
        tokio::time::sleep(Duration::from_millis(50)).await;
        if reset {
            socket2::SockRef::from(&socket)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
        }
        drop(socket);
        let mut messages = 0;
        loop {
            match tokio::time::timeout(WAIT, b.inbox.recv()).await {
                Ok(Some(Event::Message(msg))) => {
                    testkit::check_numbered(&msg, 9, 0);
                    messages += 1;
                }
                Ok(Some(Event::PeerLost(lost))) => {
                    assert!(
                        lost.reason.contains("truncated") || lost.reason.contains("reset"),
                        "round {round}: {lost:?}"
                    );
                    break;
                }
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(messages, 10, "round {round}");
        settled(&b.van).await;
    }
    // And a peer that reads nothing back still leaves the van whole.
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket.write_all(&small).await.unwrap();
    testkit::check_numbered(&testkit::expect_message(&mut b.inbox).await, 9, 0);
    socket.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, socket.read_to_end(&mut rest)).await;
    settled(&b.van).await;
}
