//! A named-mode node killed with SIGKILL leaves nothing in `/dev/shm` for long: its accept
//! queue (which lives as long as the node listens) is removed by a live named-mode peer as
//! soon as that peer learns of the death (its heartbeat watcher, here; the scheduler's
//! verdict or its own stop, in a cluster), judged by the owner lock the kernel released
//! when the node died (no cleanup at exit, no restart of anyone needed). A dialer of the
//! dead node's address hears at once that its process is gone, by the same lock.

#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use van_core::{inbox, Endpoint, Node, Role, Van, VanKind};
use van_ipc::named::{self, OwnerStatus, SegmentName};
use van_ipc::{IpcOptions, IpcVan};

/// Tells `child_node` to run, and the parent's address to dial.
const CHILD_DIALS: &str = "VANS_NAMED_CRASH_CHILD_DIALS";
/// The line the child prints with its address once it listens and is connected.
const READY: &str = "VANS-CHILD-READY";
/// Longest any wait of the test may take.
const WAIT: Duration = Duration::from_secs(30);
/// How long the killed node's accept queue may outlive it: the heartbeat timeout (3 s) that
/// tells the live van, and scheduling slack on a busy machine.
const CLEANUP_LIMIT: Duration = Duration::from_secs(10);
/// How long the child lives at most if nobody kills it.
const CHILD_LIFETIME: Duration = Duration::from_secs(120);

fn named_van() -> IpcVan {
    IpcVan::new(IpcOptions {
        ring_bytes: 64 << 10,
        arena_bytes: 0,
        named: true,
        ..IpcOptions::default()
    })
}

fn peer(id: u16, address: &str) -> Node {
    let mut node = Node::new(Role::Server, "127.0.0.1", 0).with_id(id.into());
    node.endpoints.push(Endpoint {
        kind: VanKind::Ipc,
        address: address.to_owned(),
    });
    node
}

/// The child: a named-mode van that listens, dials the parent, prints its address, and
/// idles until it is killed.
#[test]
fn child_node() {
    let Ok(parent) = std::env::var(CHILD_DIALS) else {
        return; // only meaningful when started by the test below
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let van = named_van();
        let (tx, _rx) = inbox(64);
        let endpoint = van.bind("127.0.0.1", 0, tx).await.unwrap();
        van.connect(&peer(9, &parent)).await.unwrap();
        println!("{READY} {}", endpoint.address);
        tokio::time::sleep(CHILD_LIFETIME).await;
    });
}

/// The child process, SIGKILLed when dropped (so a failing test leaves no orphan).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The entries of `/dev/shm` whose name says `pid` created them.
fn segments_of(pid: u32) -> Vec<named::ShmEntry> {
    named::list_segments()
        .unwrap()
        .into_iter()
        .filter(|e| e.owner_pid() == Some(pid))
        .collect()
}

/// Starts the child (behind `wrapper`, a command and its arguments, if any) dialing
/// `parent`, and waits for the address it listens at.
async fn spawn_child(wrapper: &[&str], parent: &str) -> (Child, String) {
    let exe = std::env::current_exe().unwrap();
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(exe);
            command
        }
        None => Command::new(exe),
    };
    let mut child = Child(
        command
            .args([
                "--exact",
                "child_node",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_DIALS, parent)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // The harness prints `test child_node ... ` on the same line first.
            if let Some(at) = line.find(READY) {
                let _ = ready_tx.send(line[at + READY.len()..].trim().to_owned());
            }
        }
    });
    let address = tokio::task::spawn_blocking(move || ready_rx.recv_timeout(WAIT))
        .await
        .unwrap()
        .expect("the child never reported ready");
    (child, address)
}

/// Waits (at most [`CLEANUP_LIMIT`] after `killed`) until no entry of `/dev/shm` is `left`.
async fn wait_until_gone(killed: Instant, left: impl Fn() -> Vec<named::ShmEntry>) {
    loop {
        let left = left();
        if left.is_empty() {
            return;
        }
        assert!(
            killed.elapsed() < CLEANUP_LIMIT,
            "{:?} after SIGKILL the dead node still has {left:?} in /dev/shm",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_named_node_leaves_nothing_in_dev_shm() {
    // The live node: it listens in named mode while the other one dies.
    let van = named_van();
    let (tx, _rx) = inbox(64);
    let ours = van.bind("127.0.0.1", 0, tx).await.unwrap();
    let (mut child, address) = spawn_child(&[], &ours.address).await;
    let pid = child.0.id();
    // Connections both ways: the child accepted one and dialed one.
    van.connect(&peer(8, &address)).await.unwrap();

    let queue = SegmentName::from_address(&address).unwrap();
    assert_eq!(queue.pid, pid);
    let before = segments_of(pid);
    assert_eq!(
        before.iter().map(|e| e.name).collect::<Vec<_>>(),
        vec![Some(queue)],
        "while it lives, the child has its accept queue in /dev/shm and nothing else"
    );
    assert_eq!(before[0].owner, OwnerStatus::Alive);

    child.0.kill().unwrap();
    let killed = Instant::now();
    child.0.wait().unwrap();
    // A dialer does not wait out its 10 s timeout on the dead node's queue: the free owner
    // lock says the process is gone (or the queue is gone already).
    let dial = address.clone();
    let dialed = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        (
            named::connect(&dial, 64 << 10, Duration::from_secs(10)),
            started.elapsed(),
        )
    })
    .await
    .unwrap();
    match dialed {
        (Err(e), took) => {
            assert!(took < Duration::from_secs(1), "the dial took {took:?}: {e}");
            let said = e.to_string();
            assert!(
                said.contains("process is gone") || !queue.path().exists(),
                "{said}"
            );
        }
        (Ok(_), _) => panic!("dialed a killed node"),
    }
    wait_until_gone(killed, || segments_of(pid)).await;
    assert!(!queue.path().exists());
    van.stop().await.unwrap();
}

/// Containers that share `/dev/shm` usually have pid namespaces of their own, where a pid
/// says nothing: the owner lock still tells a dead node from a live one. Needs
/// `unshare --pid` (root); says so and passes where it is not permitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_in_another_pid_namespace_is_cleaned_by_its_owner_lock() {
    const UNSHARE: [&str; 4] = ["unshare", "--pid", "--fork", "--kill-child"];
    let permitted = Command::new(UNSHARE[0])
        .args(&UNSHARE[1..])
        .arg("true")
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !permitted {
        eprintln!("skipped: `unshare --pid --fork` is not available or not permitted here");
        return;
    }
    let van = named_van();
    let (tx, _rx) = inbox(64);
    let ours = van.bind("127.0.0.1", 0, tx).await.unwrap();
    let (mut unshare, address) = spawn_child(&UNSHARE, &ours.address).await;
    van.connect(&peer(8, &address)).await.unwrap();

    let queue = SegmentName::from_address(&address).unwrap();
    assert_ne!(
        queue.pid_namespace,
        named::pid_namespace(),
        "the child runs in a pid namespace of its own"
    );
    let of_child = || {
        named::list_segments()
            .unwrap()
            .into_iter()
            .filter(|e| {
                e.name
                    .is_some_and(|n| n.pid_namespace == queue.pid_namespace)
            })
            .collect::<Vec<_>>()
    };
    let before = of_child();
    assert_eq!(
        before.iter().map(|e| e.name).collect::<Vec<_>>(),
        vec![Some(queue)]
    );
    assert_eq!(
        before[0].owner,
        OwnerStatus::Alive,
        "the owner lock shows a live owner across pid namespaces"
    );

    // SIGKILL to `unshare`; `--kill-child` has the kernel SIGKILL the node with it.
    unshare.0.kill().unwrap();
    let killed = Instant::now();
    unshare.0.wait().unwrap();
    wait_until_gone(killed, of_child).await;
    assert!(!queue.path().exists());
    van.stop().await.unwrap();
}
