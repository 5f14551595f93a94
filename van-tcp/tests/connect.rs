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

/// What a deep queue of large frames holds ahead of a small one, with a peer that reads
/// nothing (see `van_core::testkit::check_peer_budget`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_queue_of_large_frames_holds_at_most_the_budget_ahead_of_a_small_one() {
    testkit::check_peer_budget(
        |budget| {
            TcpVan::new(van_tcp::TcpOptions {
                peer_budget_bytes: budget,
                ..van_tcp::TcpOptions::default()
            })
        },
        16 << 20,
    )
    .await;
}

#[test]
fn an_orderly_stop_loses_no_flushed_frame_while_input_is_unread() {
    testkit::run(testkit::flushed_frames_survive_unread_input(
        &TcpVan::default,
        &TcpVan::default,
    ));
}

#[test]
fn a_failed_write_loses_no_received_frame() {
    testkit::run(testkit::received_frames_survive_a_failed_write(
        &TcpVan::default,
    ));
}

#[test]
fn a_reset_loses_no_received_frame() {
    testkit::run(testkit::received_frames_survive_a_reset(&TcpVan::default));
}
