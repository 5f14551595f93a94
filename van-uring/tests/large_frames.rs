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

/// A burst of 4 MiB frames queued back to back: each frame's body is received straight into
/// its own buffer, not into provided buffers and copied (a multishot receive armed between
/// frames would take up to 32 buffers of the next frame before a cancel lands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_large_frames_are_received_in_place() {
    use van_core::testkit::{check_numbered, expect_message, numbered};
    use van_core::{inbox, Node, Role, Van};
    let (a, b) = (van(64 << 20), van(64 << 20));
    let (tx_a, _rx_a) = inbox(64);
    let (tx_b, mut rx_b) = inbox(64);
    a.bind("127.0.0.1", 0, tx_a).await.unwrap();
    let end_b = b.bind("127.0.0.1", 0, tx_b).await.unwrap();
    let mut node_b = Node::new(Role::Server, "127.0.0.1", 0).with_id(9);
    node_b.endpoints.push(end_b);
    a.connect(&node_b).await.unwrap();
    const FRAMES: u32 = 16;
    const LEN: usize = 4 << 20;
    let frames: Vec<_> = (0..FRAMES).map(|seq| numbered(8, 9, seq, LEN)).collect();
    a.send_batch(frames).await.unwrap();
    for seq in 0..FRAMES {
        check_numbered(&expect_message(&mut rx_b).await, 8, seq);
    }
    let copied = b.stats().large_copied;
    let total = u64::from(FRAMES) * LEN as u64;
    // The multishot receive armed before the first large frame may copy most of that one
    // (it is cancelled only once the frame's header is seen); after it, only each frame's
    // first chunk (one provided buffer) should be copied: 5-8 of the 64 MiB here. Without
    // receiving one buffer at a time after a large frame, 63 of the 64 MiB are.
    assert!(
        copied <= total / 4,
        "{copied} of {total} bytes of large frames were copied out of provided buffers"
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
