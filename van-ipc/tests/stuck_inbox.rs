//! A node that stops draining its inbox must not hold the van's threads forever: once the van
//! stops, a reader blocked on the full inbox gives up: a task on the runtime (socket mode)
//! or a thread (named mode). (Its own test binary, so that the thread count below sees no
//! other test's vans.)

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use van_core::testkit::numbered;
use van_core::{inbox, Node, Role, Van};
use van_ipc::{IpcOptions, IpcVan};

/// Threads of this process whose name starts with `prefix`.
fn threads(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|name| name.starts_with(prefix))
        })
        .count()
}

/// The two tests count this process's threads: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Connects a sender to a receiver whose inbox holds one batch and is never drained, and
/// fills it, so the receiver's reader blocks on delivery.
async fn stuck(named: bool) -> (IpcVan, IpcVan, van_core::Inbox, van_core::Inbox) {
    let options = || IpcOptions {
        ring_bytes: 1 << 20,
        arena_bytes: 0,
        named,
        ..IpcOptions::default()
    };
    let sender = IpcVan::new(options());
    let (tx, sender_inbox) = inbox(16);
    sender.bind("127.0.0.1", 0, tx).await.unwrap();
    let receiver = IpcVan::new(options());
    // One batch fits; nobody ever reads this inbox, but it stays alive.
    let (tx, never_drained) = inbox(1);
    let endpoint = receiver.bind("127.0.0.1", 0, tx).await.unwrap();
    let mut node = Node::new(Role::Server, "127.0.0.1", 0).with_id(9);
    node.endpoints.push(endpoint);
    sender.connect(&node).await.unwrap();
    for seq in 0..64 {
        // Separate sends a little so that the reader delivers more than one batch.
        sender.send(numbered(8, 9, seq, 64)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    (sender, receiver, sender_inbox, never_drained)
}

/// Waits up to 10 s for `done`, failing with `what` otherwise.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_task_blocked_on_a_full_inbox_ends_when_the_van_stops() {
    let _serial = SERIAL.lock().await;
    let runtime = tokio::runtime::Handle::current();
    let before = runtime.metrics().num_alive_tasks();
    let (sender, receiver, _a, _b) = stuck(false).await;
    assert_eq!(threads("vans-ipc-r"), 0, "readers run on the runtime");
    assert!(runtime.metrics().num_alive_tasks() > before);
    receiver.stop().await.unwrap();
    sender.stop().await.unwrap();
    eventually("reader tasks still alive after stop", || {
        runtime.metrics().num_alive_tasks() <= before
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_mode_reader_thread_blocked_on_a_full_inbox_exits_when_the_van_stops() {
    let _serial = SERIAL.lock().await;
    let (sender, receiver, _a, _b) = stuck(true).await;
    assert_eq!(threads("vans-ipc-r"), 2, "one reader thread per van");
    receiver.stop().await.unwrap();
    sender.stop().await.unwrap();
    eventually("reader thread(s) still blocked after stop", || {
        threads("vans-ipc-r") == 0
    })
    .await;
}
