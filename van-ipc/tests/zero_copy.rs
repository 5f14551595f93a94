//! Zero-copy sends through the IPC van's shared arena, between two vans of this process
//! (real memfds, rings and threads): content, reference counting, exhaustion, and a van
//! without an arena.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use van_core::testkit::numbered;
use van_core::{inbox, Event, Inbox, Message, Node, Role, Van, VanKind};
use van_ipc::{IpcOptions, IpcVan};

const WAIT: Duration = Duration::from_secs(30);

async fn van(arena_bytes: usize) -> (IpcVan, Inbox, Node) {
    let van = IpcVan::new(IpcOptions {
        ring_bytes: 1 << 20,
        arena_bytes,
        ..IpcOptions::default()
    });
    let (tx, rx) = inbox(64);
    let endpoint = van.bind("127.0.0.1", 0, tx).await.unwrap();
    let mut node = Node::new(Role::Server, "127.0.0.1", 0);
    node.endpoints.push(endpoint);
    (van, rx, node)
}

async fn next(rx: &mut Inbox) -> Message {
    match tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap()
    {
        Event::Message(msg) => msg,
        other => panic!("unexpected {other:?}"),
    }
}

fn fill(van: &IpcVan, len: usize) -> Bytes {
    let mut buf = van.alloc(len).unwrap().expect("an arena");
    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = (i * 7 % 256) as u8;
    }
    buf.freeze()
}

fn held(van: &IpcVan) -> usize {
    let (capacity, free) = van.arena_usage().unwrap();
    capacity - free
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn received_buffers_hold_the_senders_blocks_until_dropped() {
    let (a, _rx_a, _) = van(8 << 20).await;
    let (b, mut rx_b, node_b) = van(8 << 20).await;
    a.connect(&node_b.with_id(9)).await.unwrap();
    let payload = fill(&a, 2 << 20);
    let mut msg = numbered(8, 9, 0, 0);
    msg.data = van_core::smallvec::smallvec![
        payload.slice(100..200),
        Bytes::new(),
        payload.clone(),
        Bytes::from_static(b"copied"),
    ];
    let sent = msg.data.clone();
    a.send(msg).await.unwrap();
    drop(payload);
    let received = next(&mut rx_b).await;
    assert_eq!(received.data, sent);
    drop(sent);
    // Our own copies are gone; the receiver's keep the 2 MiB allocation.
    assert_eq!(held(&a), 2 << 20);
    let first = received.data[0].clone();
    drop(received);
    assert_eq!(held(&a), 2 << 20, "a slice still references the allocation");
    drop(first);
    assert_eq!(held(&a), 0);
    // The receiver's arena was never touched.
    assert_eq!(held(&b), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_arena_is_a_clear_error_until_buffers_come_back() {
    let (a, _rx_a, _) = van(1 << 20).await;
    let whole = a.alloc(1 << 20).unwrap().unwrap();
    let error = a.alloc(1).unwrap_err().to_string();
    assert!(
        error.contains("arena full") && error.contains("VANS_IPC_ARENA_BYTES"),
        "{error}"
    );
    drop(whole);
    assert!(a.alloc(1 << 20).unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_van_without_an_arena_still_receives_and_sends_by_copy() {
    let (a, mut rx_a, node_a) = van(4 << 20).await;
    let (b, mut rx_b, node_b) = van(0).await;
    assert!(b.alloc(4096).unwrap().is_none());
    assert!(b.arena_usage().is_none());
    a.connect(&node_b.with_id(9)).await.unwrap();
    b.connect(&node_a.with_id(8)).await.unwrap();
    let payload = fill(&a, 300_000);
    let mut msg = numbered(8, 9, 0, 0);
    msg.data = van_core::smallvec::smallvec![payload.clone()];
    a.send(msg).await.unwrap();
    let got = next(&mut rx_b).await;
    assert_eq!(got.data[0], payload);
    // Sending the received bytes onwards copies them (they are not b's memory).
    let mut back = numbered(9, 8, 1, 0);
    back.data = got.data.clone();
    b.send(back).await.unwrap();
    assert_eq!(next(&mut rx_a).await.data[0], payload);
    drop((got, payload));
    // b's writer thread lets go of its copy's source right after writing it.
    let started = std::time::Instant::now();
    while held(&a) != 0 {
        assert!(
            started.elapsed() < WAIT,
            "{} arena bytes still held",
            held(&a)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(VanKind::Ipc, a.kind());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_ordinary_payloads_travel_through_the_arena_and_small_ones_through_the_ring() {
    let (a, _rx_a, _) = van(8 << 20).await;
    let (_b, mut rx_b, node_b) = van(8 << 20).await;
    a.connect(&node_b.with_id(9)).await.unwrap();
    // Plain heap memory, not allocated from the arena: the van stages it there (one copy).
    let large: Bytes = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let small = Bytes::from_static(b"a small segment stays in the ring");
    let mut msg = numbered(8, 9, 0, 0);
    msg.data = van_core::smallvec::smallvec![small.clone(), large.clone()];
    a.send(msg).await.unwrap();
    let received = next(&mut rx_b).await;
    assert_eq!(received.data[0], small);
    assert_eq!(received.data[1], large);
    // The receiver's copy of the large segment is the sender's arena: held until dropped.
    assert_eq!(held(&a), 1_000_000usize.div_ceil(64 << 10) * (64 << 10));
    drop(received);
    assert_eq!(held(&a), 0);

    // When the arena cannot take a payload, it goes through the ring instead.
    let filler = a.alloc(8 << 20).unwrap().unwrap();
    let mut msg = numbered(8, 9, 1, 0);
    msg.data = van_core::smallvec::smallvec![large.clone()];
    a.send(msg).await.unwrap();
    assert_eq!(next(&mut rx_b).await.data[0], large);
    drop(filler);
    assert_eq!(held(&a), 0);
}
