//! van-ipc between two real processes: exact echoes of every size (fragmented ones included),
//! then a SIGKILL of the peer mid-transfer, reported by name, with nothing left behind.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use van_core::testkit::{check_numbered, numbered};
use van_core::{inbox, Endpoint, Event, Node, Role, Van, VanError, VanKind};
use van_ipc::{IpcOptions, IpcVan};

const CHILD: &str = "VANS_IPC_TEST_CHILD";
const WAIT: Duration = Duration::from_secs(60);
/// `meta.head` of a message the child keeps (besides echoing it).
const HOLD: i32 = 77;

fn options() -> IpcOptions {
    IpcOptions {
        ring_bytes: 1 << 20,
        ..IpcOptions::default()
    }
}

/// The child: prints its endpoint, then echoes every message back to its sender (and keeps
/// those marked [`HOLD`], holding their buffers until it dies).
#[test]
fn child_echo_process() {
    if std::env::var_os(CHILD).is_none() {
        return; // only meaningful when started by the tests below
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let van = IpcVan::new(options());
        let (tx, mut rx) = inbox(64);
        let endpoint = van.bind("127.0.0.1", 0, tx).await.unwrap();
        // Tell the parent where we listen: write then rename, so it never reads half a name.
        let path = std::env::var(CHILD).unwrap();
        std::fs::write(format!("{path}.tmp"), &endpoint.address).unwrap();
        std::fs::rename(format!("{path}.tmp"), &path).unwrap();
        let mut held = Vec::new();
        while let Some(event) = rx.recv().await {
            if let Event::Message(mut msg) = event {
                if msg.meta.head == HOLD {
                    held.push(msg.clone());
                }
                let from = msg.meta.sender.unwrap();
                msg.meta.recipient = Some(from);
                msg.meta.sender = Some(8);
                if van.send(msg).await.is_err() {
                    break;
                }
            }
        }
    });
}

/// The child process, killed when dropped (so a failing test leaves no orphan behind).
struct Child(std::process::Child);

impl std::ops::Deref for Child {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Child {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child() -> (Child, String) {
    let path = std::env::temp_dir().join(format!(
        "vans-ipc-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let mut child = Child(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_echo_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD, &path)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = std::time::Instant::now();
    loop {
        if let Ok(address) = std::fs::read_to_string(&path) {
            let _ = std::fs::remove_file(&path);
            return (child, address.trim().to_owned());
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child exited early: {status}");
        }
        assert!(
            started.elapsed() < WAIT,
            "the child never reported its address"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn peer(address: String) -> Node {
    let mut node = Node::new(Role::Server, "127.0.0.1", 0).with_id(8);
    node.endpoints.push(Endpoint {
        kind: VanKind::Ipc,
        address,
    });
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoes_of_every_size_cross_processes_exactly() {
    let (mut child, address) = spawn_child();
    let van = Arc::new(IpcVan::new(options()));
    let (tx, mut rx) = inbox(64);
    van.bind("127.0.0.1", 0, tx).await.unwrap();
    van.connect(&peer(address)).await.unwrap();
    // 3 MiB and 9 MiB exceed the 1 MiB ring: fragmented, reassembled, wrapped.
    let sizes = [0usize, 1, 8, 4095, 65_536, 1 << 20, 3 << 20, 9 << 20];
    for round in 0..3u32 {
        for (i, size) in sizes.iter().enumerate() {
            let seq = round * 100 + i as u32;
            van.send(numbered(9, 8, seq, *size)).await.unwrap();
            let echo = match tokio::time::timeout(WAIT, rx.recv())
                .await
                .unwrap()
                .unwrap()
            {
                Event::Message(msg) => msg,
                other => panic!("unexpected {other:?}"),
            };
            assert_eq!(echo.data[0].len(), *size);
            // The child swapped sender and recipient: check the payload by its sequence.
            let mut expected = echo.clone();
            expected.meta.sender = Some(9);
            check_numbered(&expected, 9, seq);
        }
    }
    // Many small messages in flight at once, in order.
    for seq in 1000..3000u32 {
        van.send(numbered(9, 8, seq, 24)).await.unwrap();
    }
    for seq in 1000..3000u32 {
        match tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap()
        {
            Event::Message(mut msg) => {
                msg.meta.sender = Some(9);
                check_numbered(&msg, 9, seq);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    van.stop().await.unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_peer_is_reported_by_id_and_leaves_nothing_in_dev_shm() {
    let (mut child, address) = spawn_child();
    let child_pid = child.id();
    let van = Arc::new(IpcVan::new(options()));
    let (tx, mut rx) = inbox(64);
    van.bind("127.0.0.1", 0, tx).await.unwrap();
    van.connect(&peer(address)).await.unwrap();
    // Keep the ring busy with large messages while the peer dies.
    let sender = Arc::clone(&van);
    let pump = tokio::spawn(async move {
        let payload = Bytes::from(vec![5u8; 512 * 1024]);
        loop {
            let mut msg = numbered(9, 8, 0, 0);
            msg.data = van_core::smallvec::smallvec![payload.clone()];
            if let Err(e) = sender.send(msg).await {
                return e;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let lost = loop {
        match tokio::time::timeout(WAIT, rx.recv()).await {
            Ok(Some(Event::PeerLost(lost))) => break lost,
            Ok(Some(Event::Message(_))) => continue,
            Ok(None) => panic!("inbox ended"),
            Err(_) => panic!("the killed peer was not reported within {WAIT:?}"),
        }
    };
    assert_eq!((lost.peer, lost.kind), (Some(8), VanKind::Ipc));
    let error = tokio::time::timeout(WAIT, pump).await.unwrap().unwrap();
    assert!(
        matches!(error, VanError::PeerGone { peer: 8, .. }),
        "sends after the crash: {error}"
    );
    // memfd segments never appear in /dev/shm; nothing of the dead process is there.
    if let Ok(entries) = std::fs::read_dir("/dev/shm") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            assert!(
                !(name.starts_with("vans-") && name.contains(&child_pid.to_string())),
                "stale segment {name}"
            );
        }
    }
    van.stop().await.unwrap();
}

/// Fills a zero-copy buffer of the parent's arena with a pattern of `len` bytes.
fn arena_payload(van: &IpcVan, len: usize, seed: u8) -> Bytes {
    let mut buf = van.alloc(len).unwrap().expect("the van has an arena");
    assert_eq!(buf.van(), Some(VanKind::Ipc));
    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = seed.wrapping_add((i % 251) as u8);
    }
    buf.freeze()
}

/// Polls the arena until it is entirely free again (or fails after `WAIT`).
async fn arena_released(van: &IpcVan) {
    let started = std::time::Instant::now();
    loop {
        let (capacity, free) = van.arena_usage().unwrap();
        if free == capacity {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "{} of {capacity} arena bytes still held",
            capacity - free
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_copy_buffers_reach_another_process_and_come_back_free() {
    let (mut child, address) = spawn_child();
    let van = Arc::new(IpcVan::new(options()));
    let (tx, mut rx) = inbox(64);
    van.bind("127.0.0.1", 0, tx).await.unwrap();
    van.connect(&peer(address)).await.unwrap();
    let (capacity, _) = van.arena_usage().unwrap();
    // Larger than the 1 MiB ring: only a reference can carry it in one record.
    for (seq, len) in [(0u32, 1usize), (1, 65_536), (2, 3 << 20), (3, 8 << 20)] {
        let payload = arena_payload(&van, len, seq as u8);
        let mut msg = numbered(9, 8, seq, 0);
        msg.data =
            van_core::smallvec::smallvec![payload.slice(len / 3..), Bytes::from_static(b"heap")];
        let expected = msg.data.clone();
        drop(payload);
        van.send(msg).await.unwrap();
        let echo = match tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap()
            .unwrap()
        {
            Event::Message(msg) => msg,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(echo.data, expected, "payload {seq} of {len} bytes");
        drop(expected);
        // The child dropped its references after echoing (a copy): all blocks come back.
        arena_released(&van).await;
    }
    // Held references keep the blocks; the holder's death releases them.
    let payload = arena_payload(&van, 5 << 20, 9);
    let mut msg = numbered(9, 8, 10, 0);
    msg.meta.head = HOLD;
    msg.data = van_core::smallvec::smallvec![payload];
    van.send(msg).await.unwrap();
    match tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap()
    {
        Event::Message(echo) => assert_eq!(echo.data[0].len(), 5 << 20),
        other => panic!("unexpected {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, free) = van.arena_usage().unwrap();
    assert!(
        free <= capacity - (5 << 20),
        "the child holds 5 MiB of the arena, but {free} of {capacity} bytes are free"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    arena_released(&van).await;
    van.stop().await.unwrap();
}
