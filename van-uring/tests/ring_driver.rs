//! Who drives the rings: inside a runtime, the runtime (each ring's loop is one of its tasks,
//! so a message crosses no thread); with `dedicated_threads`, a thread per ring. Its own test
//! binary, so that the thread count sees no other test's vans.

#![cfg(target_os = "linux")]

/// Threads of this process whose name starts with `prefix`.
fn threads(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|name| name.starts_with(prefix))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Inside a runtime the rings are its tasks (no thread of their own); `dedicated_threads`
/// gives them threads.
#[tokio::test(flavor = "current_thread")]
async fn rings_run_on_the_runtime_unless_given_threads() {
    let before = threads("vans-uring-");
    let on_runtime = van_uring::IoUringVan::new(van_uring::UringOptions {
        threads: 2,
        ..van_uring::UringOptions::default()
    })
    .unwrap_or_else(|e| panic!("io_uring van: {e}"));
    assert_eq!(threads("vans-uring-"), before, "no ring thread was started");
    let own = van_uring::IoUringVan::new(van_uring::UringOptions {
        threads: 2,
        dedicated_threads: true,
        ..van_uring::UringOptions::default()
    })
    .unwrap_or_else(|e| panic!("io_uring van: {e}"));
    assert_eq!(threads("vans-uring-"), before + 2, "one thread per ring");
    van_core::Van::stop(&on_runtime)
        .await
        .unwrap_or_else(|e| panic!("stop: {e}"));
    van_core::Van::stop(&own)
        .await
        .unwrap_or_else(|e| panic!("stop: {e}"));
}

/// A message and its answer go through rings driven by a single-threaded runtime: the loop
/// must wake on completions and on sends with nothing else running.
#[tokio::test(flavor = "current_thread")]
async fn a_single_threaded_runtime_drives_its_rings() {
    use van_core::testkit::{expect_message, numbered};
    use van_core::{inbox, Node, Role, Van};
    let make = || {
        van_uring::IoUringVan::new(van_uring::UringOptions::default())
            .unwrap_or_else(|e| panic!("io_uring van: {e}"))
    };
    let (a, b) = (make(), make());
    let (tx_a, mut rx_a) = inbox(16);
    let (tx_b, mut rx_b) = inbox(16);
    let end_a = a
        .bind("127.0.0.1", 0, tx_a)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let end_b = b
        .bind("127.0.0.1", 0, tx_b)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut node_b = Node::new(Role::Server, "127.0.0.1", 0).with_id(9);
    node_b.endpoints.push(end_b);
    let mut node_a = Node::new(Role::Worker, "127.0.0.1", 0).with_id(8);
    node_a.endpoints.push(end_a);
    a.connect(&node_b).await.unwrap_or_else(|e| panic!("{e}"));
    b.connect(&node_a).await.unwrap_or_else(|e| panic!("{e}"));
    for seq in 0..100 {
        a.send(numbered(8, 9, seq, 1000))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let got = expect_message(&mut rx_b).await;
        assert_eq!(got.meta.request_id, seq as i32);
        b.send(numbered(9, 8, seq, 10))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let back = expect_message(&mut rx_a).await;
        assert_eq!(back.meta.sender, Some(9));
    }
    a.stop().await.unwrap_or_else(|e| panic!("{e}"));
    b.stop().await.unwrap_or_else(|e| panic!("{e}"));
}

/// A van whose runtime (and so whose ring loops) has ended cannot hand a new connection to a
/// loop: the dial fails and the socket is closed, instead of a connection nobody serves
/// staying open (the peer would wait on it for ever).
#[test]
fn a_connection_for_a_loop_that_ended_is_closed_and_the_dial_fails() {
    use std::io::Read;
    use van_core::{Endpoint, Node, Role, Van, VanKind};
    let van = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"))
        .block_on(async {
            let van = van_uring::IoUringVan::new(van_uring::UringOptions::default())
                .unwrap_or_else(|e| panic!("io_uring van: {e}"));
            let (inbox, _) = van_core::inbox(4);
            van.bind("127.0.0.1", 0, inbox)
                .await
                .unwrap_or_else(|e| panic!("bind: {e}"));
            van
        });
    // That runtime is gone, and its loops with it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let mut peer = Node::new(Role::Server, "127.0.0.1", port).with_id(8);
    peer.endpoints
        .push(Endpoint::stream(VanKind::Uring, "127.0.0.1", port));
    let dialed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"))
        .block_on(van.connect(&peer));
    assert!(dialed.is_err(), "a dial handed to an ended loop succeeded");
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("{e}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut accepted = loop {
        match listener.accept() {
            Ok((accepted, _)) => break accepted,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Err(e) => panic!("the dial never reached the peer: {e}"),
        }
    };
    accepted
        .set_nonblocking(false)
        .unwrap_or_else(|e| panic!("{e}"));
    accepted
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut byte = [0u8; 1];
    match accepted.read(&mut byte) {
        Ok(0) => {}
        other => panic!("the connection stayed open: {other:?}"),
    }
}
