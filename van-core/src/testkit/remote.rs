//! The conformance checks with the peer in another process, for vans that cross processes
//! (TCP, shared memory, RDMA).
//!
//! The test binary runs itself a second time as the peer: a generated test (`..._peer`) that
//! does nothing unless [`PEER_ENV`] is set, and otherwise binds a van, writes its endpoint to
//! the file the variable names, and obeys commands sent as messages (`head`): [`ECHO`] a
//! message back to its sender, send a [`BURST`] of numbered messages, or [`STOP`] (flush,
//! then exit). One line generates everything:
//!
//! ```ignore
//! van_core::van_cross_process_conformance_tests!(my_van::MyVan::default);
//! ```

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{check_numbered, numbered, pattern, within, WAIT};
use crate::message::{Command as ControlCommand, Control, DataType, Endpoint, Message, Meta, Node};
use crate::message::{NodeId, Role};
use crate::van::{inbox, Event, Inbox, Van, VanKind};

/// The variable that turns the peer test into the peer (its value: where to write the
/// endpoint).
pub const PEER_ENV: &str = "VANS_TESTKIT_PEER";
/// Command: send this message back to its sender.
pub const ECHO: i32 = 0;
/// Command: send `meta.key` numbered messages of `meta.val_len` bytes to the sender.
pub const BURST: i32 = 1;
/// Command: stop the van (flushing what is queued) and exit.
pub const STOP: i32 = 2;

/// The peer's node id; the local side is [`LOCAL`].
pub const PEER: NodeId = 8;
/// The local node id.
pub const LOCAL: NodeId = 9;

/// Generates the peer entry and one `#[test]` per cross-process check for a van factory,
/// optionally behind a guard (`requires: fn() -> bool`, as for
/// [`van_conformance_tests!`](crate::van_conformance_tests); the peer entry itself runs
/// unguarded: it does nothing unless it is the peer). Invoke it at the top level of an
/// integration-test file.
#[macro_export]
macro_rules! van_cross_process_conformance_tests {
    ($make:expr $(,)?) => {
        $crate::van_cross_process_conformance_tests!($make, requires: $crate::testkit::always);
    };
    ($make:expr, requires: $requires:expr $(,)?) => {
        #[test]
        fn cross_process_conformance_peer() {
            let make = $make;
            $crate::testkit::remote::peer_main(&make);
        }
        $crate::van_cross_process_conformance_tests!(@tests $make, $requires;
            remote_ordering, remote_message_sizes, remote_meta_and_zero_length_segments,
            remote_concurrent_senders, remote_stop_flushes_then_reports_the_peer,
            remote_killed_peer_is_reported);
    };
    (@tests $make:expr, $requires:expr; $($check:ident),*) => {
        $(
            #[test]
            fn $check() {
                if !($requires)() {
                    return;
                }
                let make = $make;
                $crate::testkit::run($crate::testkit::remote::$check(
                    &make,
                    "cross_process_conformance_peer",
                ));
            }
        )*
    };
}

/// The peer process: does nothing unless [`PEER_ENV`] is set.
pub fn peer_main<V: Van + 'static>(make: &impl Fn() -> V) {
    let Some(path) = std::env::var_os(PEER_ENV) else {
        return;
    };
    super::run(async move {
        let van = Arc::new(make());
        let (tx, mut inbox) = inbox(64);
        let endpoint = within(van.bind("127.0.0.1", 0, tx), "peer bind").await;
        let tmp = PathBuf::from(&path).with_extension("tmp");
        let line = format!("{} {}", endpoint.kind, endpoint.address);
        if let Err(e) = std::fs::write(&tmp, line).and_then(|()| std::fs::rename(&tmp, &path)) {
            panic!("peer cannot write its endpoint: {e}");
        }
        while let Some(event) = inbox.recv().await {
            let Event::Message(msg) = event else { continue };
            let Some(from) = msg.meta.sender else {
                continue;
            };
            match msg.meta.head {
                ECHO => {
                    let mut reply = msg;
                    reply.meta.sender = Some(PEER);
                    reply.meta.recipient = Some(from);
                    if van.send(reply).await.is_err() {
                        break;
                    }
                }
                BURST => {
                    let len = usize::try_from(msg.meta.val_len).unwrap_or(0);
                    for seq in 0..msg.meta.key as u32 {
                        if van.send(numbered(PEER, from, seq, len)).await.is_err() {
                            break;
                        }
                    }
                }
                STOP => {
                    within(van.stop(), "peer stop").await;
                    break;
                }
                _ => {}
            }
        }
    });
}

/// The peer process and the node that reaches it.
pub struct RemotePeer {
    child: Child,
    /// The peer's node (id [`PEER`], its endpoint).
    pub node: Node,
}

impl RemotePeer {
    /// Starts this test binary again as the peer (`peer_test` is the peer entry's name).
    pub fn spawn(peer_test: &str) -> RemotePeer {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!(
            "vans-testkit-peer-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("no test binary: {e}"));
        let mut child = Command::new(exe)
            .args([peer_test, "--nocapture", "--test-threads", "1"])
            .env(PEER_ENV, &path)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the peer process: {e}"));
        let started = Instant::now();
        let line = loop {
            if let Ok(line) = std::fs::read_to_string(&path) {
                let _ = std::fs::remove_file(&path);
                break line;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the peer process exited early: {status}");
            }
            assert!(
                started.elapsed() < WAIT,
                "the peer never reported its endpoint"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let (kind, address) = line
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("bad endpoint line `{line}`"));
        let kind: VanKind = kind
            .parse()
            .unwrap_or_else(|e| panic!("bad van kind in `{line}`: {e}"));
        let mut node = Node::new(Role::Server, "127.0.0.1", 0).with_id(PEER);
        if let Some(port) = address.rsplit(':').next().and_then(|p| p.parse().ok()) {
            node.port = port;
        }
        node.endpoints.push(Endpoint {
            kind,
            address: address.to_owned(),
        });
        RemotePeer { child, node }
    }

    /// SIGKILLs the peer and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (bounded) for the peer to exit by itself; returns whether it exited 0.
    pub fn wait_exit(&mut self) -> bool {
        let started = Instant::now();
        while started.elapsed() < WAIT {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for RemotePeer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A local van connected to a fresh peer process.
async fn pair<V: Van + 'static>(
    make: &impl Fn() -> V,
    peer_test: &str,
) -> (Arc<V>, Inbox, RemotePeer) {
    let peer = RemotePeer::spawn(peer_test);
    let local = super::start(make, LOCAL).await;
    super::within(local.van.connect(&peer.node), "connect to the peer process").await;
    (local.van, local.inbox, peer)
}

async fn next_message(inbox: &mut Inbox) -> Message {
    super::expect_message(inbox).await
}

fn command(head: i32, key: u64, val_len: u64) -> Message {
    Message {
        meta: Meta {
            head,
            key,
            val_len,
            sender: Some(LOCAL),
            recipient: Some(PEER),
            request: true,
            ..Meta::default()
        },
        data: crate::Parts::new(),
    }
}

/// 5,000 messages from the peer process arrive in order, exactly once, intact.
pub async fn remote_ordering<V: Van + 'static>(make: &impl Fn() -> V, peer_test: &str) {
    let (van, mut inbox, _peer) = pair(make, peer_test).await;
    super::send(&*van, command(BURST, 5_000, 37)).await;
    for seq in 0..5_000 {
        check_numbered(&next_message(&mut inbox).await, PEER, seq);
    }
    super::expect_quiet(&mut inbox, Duration::from_millis(200)).await;
}

/// Messages from empty to 64 MiB go to the other process and come back intact.
pub async fn remote_message_sizes<V: Van + 'static>(make: &impl Fn() -> V, peer_test: &str) {
    let (van, mut inbox, _peer) = pair(make, peer_test).await;
    for (seq, len) in super::SIZES.iter().enumerate() {
        let mut msg = numbered(LOCAL, PEER, seq as u32, *len);
        msg.meta.head = ECHO;
        super::send(&*van, msg).await;
        let mut echo = next_message(&mut inbox).await;
        assert_eq!(echo.data[0].len(), *len);
        echo.meta.sender = Some(LOCAL);
        check_numbered(&echo, LOCAL, seq as u32);
    }
}

/// Every meta field and zero-length segments survive the trip to the other process and back.
pub async fn remote_meta_and_zero_length_segments<V: Van + 'static>(
    make: &impl Fn() -> V,
    peer_test: &str,
) {
    let (van, mut inbox, peer) = pair(make, peer_test).await;
    let msg = Message {
        meta: Meta {
            head: ECHO,
            app_id: 3,
            customer_id: 4,
            request_id: 77,
            sender: Some(LOCAL),
            recipient: Some(PEER),
            request: true,
            push: true,
            simple_app: true,
            body: Bytes::from_static("body ✓".as_bytes()),
            data_types: smallvec::smallvec![DataType::U64, DataType::F32],
            control: Some(Control {
                cmd: ControlCommand::Barrier,
                nodes: vec![peer.node.clone()].into(),
                barrier_group: 6,
                msg_sig: u64::MAX,
            }),
            priority: -2,
            key: 42,
            addr: 0xdead_beef,
            val_len: 1 << 40,
            option: 5,
            ..Meta::default()
        },
        data: smallvec::smallvec![Bytes::new(), pattern(100, 1), Bytes::new(), Bytes::new()],
    };
    super::send(&*van, msg.clone()).await;
    let mut echo = next_message(&mut inbox).await;
    assert_eq!(echo.meta.sender, Some(PEER));
    echo.meta.sender = Some(LOCAL);
    echo.meta.recipient = Some(PEER);
    assert_eq!(echo, msg);
}

/// Eight tasks send through one van to the other process; each task's order holds.
pub async fn remote_concurrent_senders<V: Van + 'static>(make: &impl Fn() -> V, peer_test: &str) {
    const TASKS: u32 = 8;
    const N: u32 = 300;
    let (van, mut inbox, _peer) = pair(make, peer_test).await;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let van = Arc::clone(&van);
        tasks.push(tokio::spawn(async move {
            for seq in 0..N {
                let mut msg = numbered(LOCAL, PEER, seq, 16);
                msg.meta.head = ECHO;
                msg.meta.option = task as i32;
                super::send(&*van, msg).await;
            }
        }));
    }
    let mut next = vec![0u32; TASKS as usize];
    for _ in 0..TASKS * N {
        let mut msg = next_message(&mut inbox).await;
        let task = usize::try_from(msg.meta.option).unwrap_or(usize::MAX);
        assert!(task < next.len(), "bad task {}", msg.meta.option);
        msg.meta.sender = Some(LOCAL);
        check_numbered(&msg, LOCAL, next[task]);
        next[task] += 1;
    }
    for task in tasks {
        task.await
            .unwrap_or_else(|e| panic!("sender task failed: {e}"));
    }
}

/// The peer sends 200 messages and stops: all 200 arrive, then the loss is reported and
/// sends fail, and the peer process exits cleanly.
pub async fn remote_stop_flushes_then_reports_the_peer<V: Van + 'static>(
    make: &impl Fn() -> V,
    peer_test: &str,
) {
    let (van, mut inbox, mut peer) = pair(make, peer_test).await;
    super::send(&*van, command(BURST, 200, 1000)).await;
    super::send(&*van, command(STOP, 0, 0)).await;
    for seq in 0..200 {
        check_numbered(&next_message(&mut inbox).await, PEER, seq);
    }
    super::expect_peer_lost(&mut inbox, PEER).await;
    assert!(
        peer.wait_exit(),
        "the peer process did not exit cleanly after stop"
    );
    super::expect_sends_fail(&*van, LOCAL, PEER).await;
}

/// SIGKILL of the peer process mid-stream is reported with the peer's id, and sends fail.
pub async fn remote_killed_peer_is_reported<V: Van + 'static>(
    make: &impl Fn() -> V,
    peer_test: &str,
) {
    let (van, mut inbox, mut peer) = pair(make, peer_test).await;
    super::send(&*van, command(BURST, 1_000_000, 4096)).await;
    // Let the stream run, then kill the peer without warning.
    let _ = next_message(&mut inbox).await;
    peer.kill();
    super::expect_peer_lost(&mut inbox, PEER).await;
    super::expect_sends_fail(&*van, LOCAL, PEER).await;
}
