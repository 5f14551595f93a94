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
