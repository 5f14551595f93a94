//! The conformance suite every van runs (feature `testkit`).
//!
//! One line in a van's tests runs all of it, each check as its own `#[test]`:
//!
//! ```ignore
//! van_core::van_conformance_tests!(|| my_van::MyVan::new(my_van::Options::default()));
//! ```
//!
//! The argument is an expression evaluating to a factory `Fn() -> V` (`V: Van + 'static`);
//! every check creates the vans it needs, binds them on `127.0.0.1` with ephemeral ports,
//! connects them and exchanges real traffic. Every wait has a deadline, so a broken van fails
//! a check instead of hanging it. The checks are also public functions, for vans that need
//! to run them differently (for example between processes).
//!
//! A van that needs what a host may lack (an RDMA device) names a guard, a `fn() -> bool`
//! that checks and says why when it is missing; each generated test runs its check only when
//! the guard passes. A subset of the checks can be named:
//!
//! ```ignore
//! van_core::van_conformance_tests!(make, requires: device_here);
//! van_core::van_conformance_tests!(make_tiny, requires: device_here,
//!     checks: [ordering_per_peer, ping_pong]);
//! ```
//!
//! [`van_cross_process_conformance_tests!`](crate::van_cross_process_conformance_tests) and
//! [`van_auth_tests!`](crate::van_auth_tests) take the same `requires:`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub mod auth;
mod budget;
mod close;
pub mod garbage;
pub mod limits;
mod pool;
pub mod remote;

pub use budget::check_peer_budget;
pub use close::{
    flushed_frames_survive_unread_input, received_frames_survive_a_failed_write,
    received_frames_survive_a_reset,
};
pub use pool::check_frame_pool;

use crate::message::{Command, Control, DataType, Message, Meta, Node, NodeId, Role};
use crate::van::{inbox, Event, Inbox, Van, VanError};

/// How long any single wait in the suite may take before the check fails.
pub const WAIT: Duration = Duration::from_secs(60);

/// Runs one asynchronous check on a fresh two-thread runtime (used by the macro).
pub fn run<F: Future<Output = ()>>(check: F) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a tokio runtime: {e}"));
    runtime.block_on(check);
}

/// The guard of tests that need nothing a host may lack: always passes.
pub fn always() -> bool {
    true
}

/// Generates one `#[test]` per conformance check for a van factory, optionally behind a
/// guard (`requires: fn() -> bool`) and for a subset of the checks (`checks: [...]`); see
/// the [module docs](crate::testkit).
#[macro_export]
macro_rules! van_conformance_tests {
    ($make:expr $(,)?) => {
        $crate::van_conformance_tests!($make, requires: $crate::testkit::always);
    };
    ($make:expr, checks: [$($check:ident),* $(,)?] $(,)?) => {
        $crate::van_conformance_tests!(@tests $make, $crate::testkit::always; $($check),*);
    };
    ($make:expr, requires: $requires:expr $(,)?) => {
        $crate::van_conformance_tests!(@tests $make, $requires;
            ordering_per_peer, many_peers, message_sizes, zero_length_segments,
            meta_round_trip, concurrent_senders, ping_pong, stop_flushes_and_ends,
            unknown_peer, vanished_peer);
    };
    ($make:expr, requires: $requires:expr, checks: [$($check:ident),* $(,)?] $(,)?) => {
        $crate::van_conformance_tests!(@tests $make, $requires; $($check),*);
    };
    (@tests $make:expr, $requires:expr; $($check:ident),*) => {
        $(
            #[test]
            fn $check() {
                if !($requires)() {
                    return;
                }
                let make = $make;
                $crate::testkit::run($crate::testkit::$check(&make));
            }
        )*
    };
}

/// A bound van with its inbox and the node others use to reach it.
pub struct Peer<V> {
    /// The van.
    pub van: Arc<V>,
    /// Where it delivers.
    pub inbox: Inbox,
    /// Its node (id and endpoint filled in).
    pub node: Node,
}

/// Creates a van with `make`, binds it on 127.0.0.1 with an ephemeral port, and names it `id`.
pub async fn start<V: Van + 'static>(make: &impl Fn() -> V, id: NodeId) -> Peer<V> {
    let van = Arc::new(make());
    let (tx, inbox) = inbox(64);
    let endpoint = within(van.bind("127.0.0.1", 0, tx), "bind").await;
    let role = if id % 2 == 0 {
        Role::Server
    } else {
        Role::Worker
    };
    let mut node = Node::new(role, "127.0.0.1", 0).with_id(id);
    node.endpoints.push(endpoint);
    Peer { van, inbox, node }
}

/// Connects `from` to `to`, failing the check on error.
pub async fn connect<V: Van, W>(from: &Peer<V>, to: &Peer<W>) {
    within(
        from.van.connect(&to.node),
        &format!("connect to {}", to.node),
    )
    .await;
}

/// Sends `msg`, failing the check on error or if the send waits longer than [`WAIT`].
pub async fn send<V: Van + ?Sized>(van: &V, msg: Message) {
    let what = format!("send to {:?} #{}", msg.meta.recipient, msg.meta.request_id);
    within(van.send(msg), &what).await;
}

/// Awaits a van call, failing the check on error or after [`WAIT`].
pub async fn within<T>(call: impl Future<Output = Result<T, VanError>>, what: &str) -> T {
    match tokio::time::timeout(WAIT, call).await {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => panic!("{what} failed: {e}"),
        Err(_) => panic!("{what} did not finish within {WAIT:?}"),
    }
}

/// A free port on 127.0.0.1 for a node that others must be told about before it binds (a
/// scheduler), picked below Linux's ephemeral range (32768 and up): a port the kernel handed
/// out and took back could be handed to another test's node before this one binds it; one
/// picked at random down here only meets another test's pick.
pub fn free_port() -> u16 {
    crate::link::stream::free_loopback_port()
}

/// The next message in `inbox`, failing the check on a deadline, a lost peer or the end.
pub async fn expect_message(inbox: &mut Inbox) -> Message {
    match tokio::time::timeout(WAIT, inbox.recv()).await {
        Ok(Some(Event::Message(msg))) => msg,
        Ok(Some(Event::PeerLost(lost))) => panic!("unexpected lost peer: {lost:?}"),
        Ok(None) => panic!("inbox ended while a message was expected"),
        Err(_) => panic!("no message within {WAIT:?}"),
    }
}

/// Asserts that nothing more arrives within `grace` (no duplicates, no strays).
pub async fn expect_quiet(inbox: &mut Inbox, grace: Duration) {
    if let Ok(Some(Event::Message(msg))) = tokio::time::timeout(grace, inbox.recv()).await {
        panic!("unexpected extra message: {:?}", msg.meta);
    }
}

/// A message to `to` from `from` carrying `seq` in its request id and key, with a payload
/// derived from both so content errors are caught.
pub fn numbered(from: NodeId, to: NodeId, seq: u32, payload_len: usize) -> Message {
    Message {
        meta: Meta {
            sender: Some(from),
            recipient: Some(to),
            request_id: seq as i32,
            key: u64::from(seq),
            request: true,
            data_types: smallvec::smallvec![DataType::U8],
            ..Meta::default()
        },
        data: smallvec::smallvec![pattern(payload_len, u64::from(seq) ^ ((from as u64) << 32))],
    }
}

/// Checks a message made by [`numbered`].
pub fn check_numbered(msg: &Message, from: NodeId, seq: u32) {
    assert_eq!(msg.meta.sender, Some(from), "wrong sender");
    assert_eq!(msg.meta.request_id, seq as i32, "out of order from {from}");
    let expected = pattern(msg.data[0].len(), u64::from(seq) ^ ((from as u64) << 32));
    assert!(msg.data[0] == expected, "payload of {from}#{seq} corrupted");
}

/// `len` deterministic bytes that differ for every `seed`.
pub fn pattern(len: usize, seed: u64) -> Bytes {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

/// 5,000 messages from one van to one peer arrive in order, exactly once, intact.
pub async fn ordering_per_peer<V: Van + 'static>(make: &impl Fn() -> V) {
    let a = start(make, 9).await;
    let mut b = start(make, 8).await;
    connect(&a, &b).await;
    const N: u32 = 5_000;
    let sender = a.van.clone();
    let send = tokio::spawn(async move {
        for seq in 0..N {
            let len = (seq as usize * 37) % 300;
            send(&*sender, numbered(9, 8, seq, len)).await;
        }
    });
    for seq in 0..N {
        check_numbered(&expect_message(&mut b.inbox).await, 9, seq);
    }
    send.await
        .unwrap_or_else(|e| panic!("sender task failed: {e}"));
    expect_quiet(&mut b.inbox, Duration::from_millis(200)).await;
}

/// Eight vans send to one, and one sends to eight, at the same time; per-pair order holds.
pub async fn many_peers<V: Van + 'static>(make: &impl Fn() -> V) {
    const PEERS: i32 = 8;
    const N: u32 = 300;
    let mut hub = start(make, 8).await;
    let mut spokes = Vec::new();
    for i in 0..PEERS {
        let spoke = start(make, 9 + 2 * i).await;
        connect(&spoke, &hub).await;
        connect(&hub, &spoke).await;
        spokes.push(spoke);
    }
    let mut tasks = Vec::new();
    for spoke in &spokes {
        let (van, id) = (spoke.van.clone(), spoke.node.id.unwrap_or_default());
        tasks.push(tokio::spawn(async move {
            for seq in 0..N {
                send(&*van, numbered(id, 8, seq, 64)).await;
            }
        }));
        let (van, id) = (hub.van.clone(), id);
        tasks.push(tokio::spawn(async move {
            for seq in 0..N {
                send(&*van, numbered(8, id, seq, 64)).await;
            }
        }));
    }
    let mut next: HashMap<NodeId, u32> = HashMap::new();
    for _ in 0..(N * PEERS as u32) {
        let msg = expect_message(&mut hub.inbox).await;
        let from = msg.meta.sender.unwrap_or_else(|| panic!("no sender"));
        let seq = next.entry(from).or_insert(0);
        check_numbered(&msg, from, *seq);
        *seq += 1;
    }
    assert_eq!(next.len(), PEERS as usize);
    for spoke in &mut spokes {
        for seq in 0..N {
            check_numbered(&expect_message(&mut spoke.inbox).await, 8, seq);
        }
    }
    for task in tasks {
        task.await
            .unwrap_or_else(|e| panic!("sender task failed: {e}"));
    }
    expect_quiet(&mut hub.inbox, Duration::from_millis(100)).await;
}

/// Messages from empty to 64 MiB, with sizes around the 8-byte alignment, arrive intact.
pub async fn message_sizes<V: Van + 'static>(make: &impl Fn() -> V) {
    let a = start(make, 9).await;
    let mut b = start(make, 8).await;
    connect(&a, &b).await;
    for (seq, len) in SIZES.iter().enumerate() {
        let msg = numbered(9, 8, seq as u32, *len);
        send(&*a.van, msg).await;
        let got = expect_message(&mut b.inbox).await;
        assert_eq!(got.data[0].len(), *len);
        check_numbered(&got, 9, seq as u32);
    }
    // An empty message: no segments at all.
    send(&*a.van, Message::to(8, Vec::new())).await;
    assert!(expect_message(&mut b.inbox).await.data.is_empty());
}

/// Zero-length segments keep their place among other segments.
pub async fn zero_length_segments<V: Van + 'static>(make: &impl Fn() -> V) {
    let a = start(make, 9).await;
    let mut b = start(make, 8).await;
    connect(&a, &b).await;
    let data = vec![
        Bytes::new(),
        Bytes::from_static(b"abc"),
        Bytes::new(),
        Bytes::new(),
        pattern(100, 1),
        Bytes::new(),
    ];
    send(&*a.van, Message::to(8, data.clone())).await;
    assert_eq!(
        expect_message(&mut b.inbox).await.data.as_slice(),
        data.as_slice()
    );
}

/// Every meta field, including a control block with nodes, arrives unchanged.
pub async fn meta_round_trip<V: Van + 'static>(make: &impl Fn() -> V) {
    let a = start(make, 9).await;
    let mut b = start(make, 8).await;
    connect(&a, &b).await;
    let mut node = b.node.clone();
    node.host_identity = "boot-id/host".into();
    node.is_recovery = true;
    let meta = Meta {
        head: -3,
        app_id: 1,
        customer_id: 2,
        request_id: 77,
        sender: Some(9),
        recipient: Some(8),
        request: true,
        push: true,
        pull: false,
        simple_app: true,
        body: Bytes::from_static("body ✓".as_bytes()),
        data_types: smallvec::smallvec![DataType::U64, DataType::F32],
        control: Some(Control {
            cmd: Command::AddNode,
            nodes: vec![a.node.clone(), node].into(),
            barrier_group: 7,
            msg_sig: u64::MAX,
        }),
        priority: -1,
        key: 42,
        addr: 0xdead_beef,
        val_len: 1 << 40,
        option: 5,
        seq: Some(crate::Seq {
            number: u64::MAX - 1,
            to: 77,
        }),
    };
    let msg = Message {
        meta,
        data: smallvec::smallvec![pattern(16, 2), pattern(64, 3)],
    };
    send(&*a.van, msg.clone()).await;
    assert_eq!(expect_message(&mut b.inbox).await, msg);
}

/// Eight tasks share one van and send concurrently; each task's order holds, nothing lost.
pub async fn concurrent_senders<V: Van + 'static>(make: &impl Fn() -> V) {
    const TASKS: u32 = 8;
    const N: u32 = 500;
    let a = start(make, 9).await;
    let mut b = start(make, 8).await;
    connect(&a, &b).await;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let van = a.van.clone();
        tasks.push(tokio::spawn(async move {
            for seq in 0..N {
                let mut msg = numbered(9, 8, seq, 16);
                msg.meta.head = task as i32;
                // Batches of three exercise `send_batch` as well as `send`.
                if seq % 4 == 0 {
                    send(&*van, msg).await;
                } else {
                    within(van.send_batch(vec![msg]), "send_batch").await;
                }
            }
        }));
    }
    let mut next = vec![0u32; TASKS as usize];
    for _ in 0..TASKS * N {
        let msg = expect_message(&mut b.inbox).await;
        let task = usize::try_from(msg.meta.head).unwrap_or(usize::MAX);
        assert!(task < next.len(), "bad task id {}", msg.meta.head);
        check_numbered(&msg, 9, next[task]);
        next[task] += 1;
    }
    assert!(next.iter().all(|n| *n == N));
    for task in tasks {
        task.await
            .unwrap_or_else(|e| panic!("sender task failed: {e}"));
    }
    expect_quiet(&mut b.inbox, Duration::from_millis(100)).await;
}

/// Request/response in both directions over connections each side opened.
pub async fn ping_pong<V: Van + 'static>(make: &impl Fn() -> V) {
    let mut a = start(make, 9).await;
    let mut b = start(make, 8).await;
    connect(&a, &b).await;
    connect(&b, &a).await;
    for seq in 0..500 {
        send(&*a.van, numbered(9, 8, seq, 8)).await;
        check_numbered(&expect_message(&mut b.inbox).await, 9, seq);
        let batch = vec![numbered(8, 9, 2 * seq, 8), numbered(8, 9, 2 * seq + 1, 8)];
        within(b.van.send_batch(batch), "send_batch").await;
        check_numbered(&expect_message(&mut a.inbox).await, 8, 2 * seq);
        check_numbered(&expect_message(&mut a.inbox).await, 8, 2 * seq + 1);
    }
}

/// `stop` flushes what was queued, makes later calls fail with `Stopped`, and ends the inbox.
pub async fn stop_flushes_and_ends<V: Van + 'static>(make: &impl Fn() -> V) {
    let a = start(make, 9).await;
    let mut b = start(make, 8).await;
    connect(&a, &b).await;
    const N: u32 = 200;
    // The receiver reads concurrently: a van may push back on `send` while the peer's inbox
    // is full, and that is allowed.
    let receiver = tokio::spawn(async move {
        for seq in 0..N {
            check_numbered(&expect_message(&mut b.inbox).await, 9, seq);
        }
        b
    });
    for seq in 0..N {
        send(&*a.van, numbered(9, 8, seq, 1000)).await;
    }
    within(a.van.stop(), "stop").await;
    within(a.van.stop(), "a second stop").await;
    let b = receiver
        .await
        .unwrap_or_else(|e| panic!("messages queued before stop were not all delivered: {e}"));
    let after = a.van.send(numbered(9, 8, N, 8)).await;
    assert!(
        matches!(after, Err(VanError::Stopped(_))),
        "send after stop: {after:?}"
    );
    let after = a.van.connect(&b.node).await;
    assert!(
        matches!(after, Err(VanError::Stopped(_))),
        "connect after stop: {after:?}"
    );
    // The stopped van's own inbox ends.
    let mut a_inbox = a.inbox;
    loop {
        match tokio::time::timeout(WAIT, a_inbox.recv()).await {
            Ok(None) => break,
            Ok(Some(_)) => continue,
            Err(_) => panic!("the inbox of a stopped van did not end"),
        }
    }
    within(b.van.stop(), "stop").await;
}

/// Sending to a peer never connected, or without a recipient, fails at once.
pub async fn unknown_peer<V: Van + 'static>(make: &impl Fn() -> V) {
    let a = start(make, 9).await;
    let result = a.van.send(numbered(9, 1234, 0, 8)).await;
    assert!(
        matches!(result, Err(VanError::UnknownPeer { peer: 1234 })),
        "send to an unknown peer: {result:?}"
    );
    let result = a.van.send(Message::default()).await;
    assert!(
        matches!(result, Err(VanError::NoRecipient)),
        "send without recipient: {result:?}"
    );
    let mut nowhere = Node::new(Role::Server, "127.0.0.1", 0).with_id(8);
    nowhere.endpoints.clear();
    assert!(
        a.van.connect(&nowhere).await.is_err(),
        "connect to a node without address"
    );
}

/// Sends from `from` to `peer` until one fails with `PeerGone`/`UnknownPeer` naming `peer`;
/// fails the check if sends keep succeeding, or one hangs, for [`WAIT`].
pub async fn expect_sends_fail<V: Van + ?Sized>(van: &V, from: NodeId, peer: NodeId) {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut seq = 0;
    loop {
        let result = tokio::time::timeout(WAIT, van.send(numbered(from, peer, seq, 1024))).await;
        match result.unwrap_or_else(|_| panic!("a send to a gone peer hung")) {
            Ok(()) => {}
            Err(VanError::PeerGone { peer: p, .. } | VanError::UnknownPeer { peer: p })
                if p == peer =>
            {
                return
            }
            Err(e) => panic!("unexpected error sending to a gone peer: {e}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "sends to a gone peer kept succeeding for {WAIT:?}"
        );
        seq += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (bounded by [`WAIT`]) for a [`PeerLost`](crate::van::PeerLost) naming `peer`,
/// skipping other events.
pub async fn expect_peer_lost(inbox: &mut Inbox, peer: NodeId) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, inbox.recv()).await {
            Ok(Some(Event::PeerLost(lost))) if lost.peer == Some(peer) => return,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("inbox ended before peer {peer} was reported lost"),
            Err(_) => panic!("the loss of peer {peer} was not reported within {WAIT:?}"),
        }
    }
}

/// Message sizes every van must carry: empty, around the 8-byte alignment, up to 64 MiB.
pub const SIZES: [usize; 10] = [
    0,
    1,
    7,
    8,
    9,
    4095,
    65_536,
    (1 << 20) + 3,
    8 << 20,
    64 << 20,
];

/// After a peer stops, sends to it fail within a bounded time, naming the peer, and the
/// van reports the loss as a [`PeerLost`](crate::van::PeerLost) event with the peer's id.
pub async fn vanished_peer<V: Van + 'static>(make: &impl Fn() -> V) {
    let mut a = start(make, 9).await;
    let b = start(make, 8).await;
    connect(&a, &b).await;
    within(b.van.stop(), "stop").await;
    drop(b);
    expect_sends_fail(&*a.van, 9, 8).await;
    expect_peer_lost(&mut a.inbox, 8).await;
}
