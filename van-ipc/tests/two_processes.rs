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

fn options() -> IpcOptions {
    IpcOptions {
        ring_bytes: 1 << 20,
        ..IpcOptions::default()
    }
}

/// The child: prints its endpoint, then echoes every message back to its sender.
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
        while let Some(event) = rx.recv().await {
            if let Event::Message(mut msg) = event {
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

fn spawn_child() -> (std::process::Child, String) {
    let path = std::env::temp_dir().join(format!(
        "vans-ipc-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let mut child = Command::new(std::env::current_exe().unwrap())
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
        .unwrap();
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
            msg.data = vec![payload.clone()];
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
