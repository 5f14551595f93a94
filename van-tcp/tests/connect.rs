//! Connection management beyond the conformance suite.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use van_core::testkit;
use van_core::Van;
use van_tcp::TcpVan;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connects_to_one_peer_dial_once() {
    let make = TcpVan::default;
    let a = testkit::start(&make, 9).await;
    let b = testkit::start(&make, 8).await;
    let mut dials = Vec::new();
    for _ in 0..8 {
        let (van, node) = (a.van.clone(), b.node.clone());
        dials.push(tokio::spawn(async move { van.connect(&node).await }));
    }
    for dial in dials {
        dial.await.unwrap().unwrap();
    }
    // Let the listener accept whatever was dialed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.van.open_connections(), 1, "dialed more than once");
    assert_eq!(
        b.van.open_connections(),
        1,
        "accepted more than one connection"
    );
    testkit::send(&*a.van, testkit::numbered(9, 8, 0, 8)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_frame_buffers_return_to_the_pool_and_are_reused() {
    testkit::check_frame_pool(
        TcpVan::default,
        || {
            TcpVan::new(van_tcp::TcpOptions {
                frame_pool_bytes: 0,
                ..van_tcp::TcpOptions::default()
            })
        },
        TcpVan::frame_pool_stats,
    )
    .await;
}

/// A peer that accepts and reads nothing until told to, so frames pile up in the sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_queue_of_large_frames_holds_at_most_the_budget_ahead_of_a_small_one() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;
    use van_core::wire::{self, FrameHeader, Limits, HEADER_LEN};
    use van_core::{Node, Role};

    const LARGE: usize = 4 << 20;
    const DEPTH: usize = 32;
    let budget = 16 << 20;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let a = testkit::start(
        &|| {
            TcpVan::new(van_tcp::TcpOptions {
                peer_budget_bytes: budget,
                ..van_tcp::TcpOptions::default()
            })
        },
        9,
    )
    .await;
    let slow = Node::new(Role::Server, "127.0.0.1", port).with_id(8);
    a.van.connect(&slow).await.unwrap();
    let (mut socket, _) = listener.accept().await.unwrap();

    // A deep queue of large frames: each send returns once its frame is queued.
    let queued = Arc::new(AtomicUsize::new(0));
    let senders = {
        let (van, queued) = (Arc::clone(&a.van), Arc::clone(&queued));
        tokio::spawn(async move {
            for seq in 0..DEPTH as u32 {
                if van.send(testkit::numbered(9, 8, seq, LARGE)).await.is_err() {
                    break; // the peer closed, at the end of the test
                }
                queued.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The sockets' buffers hold a few MiB (at most 16 MiB here: loopback autotuning); the
    // queue holds at most the budget more. Without a budget all 32 would be queued.
    let ahead = queued.load(Ordering::SeqCst);
    let bound = (budget + (16 << 20)) / LARGE + 1;
    assert!(
        ahead <= bound,
        "{ahead} large frames queued, over the bound of {bound}"
    );
    // A small frame does not wait for the budget.
    tokio::time::timeout(
        Duration::from_secs(5),
        a.van.send(testkit::numbered(9, 8, 1000, 8)),
    )
    .await
    .expect("a small frame waited behind the budget")
    .unwrap();

    // Read the stream: the small frame comes right after the large ones queued before it.
    let mut position = 0;
    let mut header = [0u8; HEADER_LEN];
    loop {
        socket.read_exact(&mut header).await.unwrap();
        let len = FrameHeader::parse(&header, &Limits::default())
            .unwrap()
            .frame_len as usize;
        let mut rest = vec![0u8; len - HEADER_LEN];
        socket.read_exact(&mut rest).await.unwrap();
        if len < LARGE {
            let mut frame = header.to_vec();
            frame.extend_from_slice(&rest);
            let msg = wire::decode(frame.into(), &Limits::default()).unwrap();
            assert_eq!(msg.meta.request_id, 1000);
            break;
        }
        position += 1;
    }
    assert!(
        position <= bound,
        "the small frame waited behind {position} large ones"
    );
    drop(socket);
    senders.abort();
}
