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
    let make = TcpVan::default;
    let a = testkit::start(&make, 9).await;
    let mut b = testkit::start(&make, 8).await;
    const FRAMES: u32 = 20;
    a.van.connect(&b.node).await.unwrap();
    for seq in 0..FRAMES {
        testkit::send(&*a.van, testkit::numbered(9, 8, seq, 2 << 20)).await;
        // Received, checked, dropped: its buffer goes back before the next frame arrives.
        let msg = testkit::expect_message(&mut b.inbox).await;
        assert_eq!(msg.meta.request_id, seq as i32);
        assert_eq!(msg.data_len(), 2 << 20);
    }
    let stats = b.van.frame_pool_stats();
    assert_eq!(
        stats.allocated + stats.reused,
        u64::from(FRAMES),
        "{stats:?}"
    );
    assert!(
        stats.allocated <= 2,
        "fresh buffers for most frames: {stats:?}"
    );
    assert!(stats.returned >= u64::from(FRAMES) - 1, "{stats:?}");

    // With the pool off every large frame gets a fresh buffer.
    let no_pool = || {
        TcpVan::new(van_tcp::TcpOptions {
            frame_pool_bytes: 0,
            ..van_tcp::TcpOptions::default()
        })
    };
    let c = testkit::start(&no_pool, 11).await;
    let mut d = testkit::start(&no_pool, 10).await;
    c.van.connect(&d.node).await.unwrap();
    for seq in 0..4 {
        testkit::send(&*c.van, testkit::numbered(11, 10, seq, 2 << 20)).await;
        drop(testkit::expect_message(&mut d.inbox).await);
    }
    let stats = d.van.frame_pool_stats();
    assert_eq!((stats.allocated, stats.reused, stats.dropped), (4, 0, 4));
}
