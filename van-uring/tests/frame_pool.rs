//! Large frames are received into the van's pool of buffers, which come back when the
//! application drops the frames, over real loopback sockets driven by io_uring.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use van_core::testkit;
use van_core::Van;
use van_uring::{IoUringVan, UringOptions};

fn van(frame_pool_bytes: usize) -> IoUringVan {
    IoUringVan::new(UringOptions {
        frame_pool_bytes,
        ..UringOptions::default()
    })
    .unwrap_or_else(|e| panic!("io_uring van: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_frame_buffers_return_to_the_pool_and_are_reused() {
    let make = || van(64 << 20);
    let a = testkit::start(&make, 9).await;
    let mut b = testkit::start(&make, 8).await;
    a.van.connect(&b.node).await.unwrap();
    const FRAMES: u32 = 20;
    for seq in 0..FRAMES {
        testkit::send(&*a.van, testkit::numbered(9, 8, seq, 2 << 20)).await;
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

    // With the pool off every large frame gets a fresh buffer.
    let make = || van(0);
    let c = testkit::start(&make, 11).await;
    let mut d = testkit::start(&make, 10).await;
    c.van.connect(&d.node).await.unwrap();
    for seq in 0..4 {
        testkit::send(&*c.van, testkit::numbered(11, 10, seq, 2 << 20)).await;
        drop(testkit::expect_message(&mut d.inbox).await);
    }
    let stats = d.van.frame_pool_stats();
    assert_eq!((stats.allocated, stats.reused), (4, 0));
}
