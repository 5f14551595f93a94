//! Large frames over real loopback sockets driven by io_uring: received into the van's pool
//! of buffers, which come back when the application drops the frames; sent within the
//! per-peer byte budget.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use van_core::testkit;
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
    testkit::check_frame_pool(|| van(64 << 20), || van(0), IoUringVan::frame_pool_stats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_queue_of_large_frames_holds_at_most_the_budget_ahead_of_a_small_one() {
    testkit::check_peer_budget(
        |budget| {
            IoUringVan::new(UringOptions {
                peer_budget_bytes: budget,
                ..UringOptions::default()
            })
            .unwrap_or_else(|e| panic!("io_uring van: {e}"))
        },
        16 << 20,
    )
    .await;
}
