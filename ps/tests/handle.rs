//! Node handles that own their runtime, called every way a foreign caller might: from plain
//! threads (blocking waits and callbacks), from inside a caller's tokio runtime
//! (current-thread and multi-thread), and from other executors (futures' `block_on`, smol).
//! Each test runs a real cluster over TCP on 127.0.0.1: a scheduler and a summing server on
//! their own threads, and the worker driven the way under test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use node::handle::{Call, NodeHandle};
use ps::handle::{KvNode, Worker};
use ps::values::to_bytes;
use ps::{Config, KvPairs, NodeError, Role};
use van_core::testkit::free_port;
use van_core::DataType;

const KEYS: [u64; 4] = [1, 5, 1 << 40, u64::MAX - 1];

fn config(role: Role, port: u16, servers: u32) -> Config {
    Config::builder()
        .role(role)
        .num_servers(servers)
        .num_workers(1)
        .root_uri("127.0.0.1")
        .root_port(port)
        .bootstrap_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// The scheduler and `servers` summing f32 servers, each on its own thread until finalize.
fn start_others(port: u16, servers: u32) -> Vec<JoinHandle<()>> {
    let mut nodes = vec![std::thread::spawn(move || {
        let node = NodeHandle::start(config(Role::Scheduler, port, servers)).unwrap();
        node.finalize().wait().unwrap();
    })];
    for _ in 0..servers {
        nodes.push(std::thread::spawn(move || {
            let node = NodeHandle::start(config(Role::Server, port, servers)).unwrap();
            let _server = node.sum_server(DataType::F32, 0, 0, 2).wait().unwrap();
            node.finalize().wait().unwrap();
        }));
    }
    nodes
}

fn join(nodes: Vec<JoinHandle<()>>) {
    for node in nodes {
        node.join().unwrap();
    }
}

fn pairs(vals: &[f32]) -> KvPairs {
    KvPairs::from_slices(&KEYS, vals, None)
}

/// Push, push again, pull: the sum of both pushes, on whichever executor awaits the calls.
async fn push_push_pull(worker: &Worker) -> Vec<f32> {
    worker.push(pairs(&[1.0, 2.0, 3.0, 4.0]), 0).await.unwrap();
    worker
        .push(pairs(&[10.0, 20.0, 30.0, 40.0]), 0)
        .await
        .unwrap();
    let pulled = worker.pull(to_bytes(&KEYS), 0).await.unwrap();
    pulled.vals::<f32>().unwrap().into_owned()
}

const SUMS: [f32; 4] = [11.0, 22.0, 33.0, 44.0];

#[test]
fn plain_threads_block_and_call_back() {
    let port = free_port();
    let others = start_others(port, 2);
    let node = NodeHandle::start(config(Role::Worker, port, 2)).unwrap();
    assert_eq!(node.role(), Role::Worker);
    assert_eq!((node.id(), node.rank()), (9, 0));
    assert_eq!((node.num_servers(), node.num_workers()), (2, 1));
    let worker = node.worker(DataType::F32, 0, 0).wait().unwrap();

    // Blocking waits; the keys span both servers.
    worker.push(pairs(&[1.0, 2.0, 3.0, 4.0]), 0).wait().unwrap();
    // Callbacks, ps-lite style: the push and the push-pull report on the node's runtime.
    let (tx, rx) = mpsc::sync_channel(4);
    let pushed = tx.clone();
    worker
        .push(pairs(&[10.0, 20.0, 30.0, 40.0]), 0)
        .on_complete(move |r| pushed.send(r.map(|_| Vec::new())).unwrap());
    rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
    worker.push_pull(pairs(&[0.0; 4]), 0).on_complete(move |r| {
        tx.send(r.map(|p| p.vals::<f32>().unwrap().into_owned()))
            .unwrap()
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap(),
        SUMS
    );

    // Pull into a caller's buffer.
    let pulled = worker.pull(to_bytes(&KEYS), 0).wait().unwrap();
    let mut out = [0f32; 4];
    pulled
        .copy_vals_into(bytemuck::cast_slice_mut(&mut out))
        .unwrap();
    assert_eq!(out, SUMS);
    let mut short = [0f32; 3];
    assert!(matches!(
        pulled.copy_vals_into(bytemuck::cast_slice_mut(&mut short)),
        Err(NodeError::InvalidArgument(_))
    ));

    // Calls dropped without a wait: their requests still complete and leave the table.
    for _ in 0..50 {
        drop(worker.push(pairs(&[0.0; 4]), 0));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while worker.in_flight() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} requests left",
            worker.in_flight()
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // A wait with a time limit on something that cannot finish (a barrier nobody else
    // joins) times out and can be waited for again.
    let mut lonely = node.barrier(ps::node_ids::WORKER_GROUP | 2);
    assert!(matches!(
        lonely.wait_timeout(Duration::from_millis(50)),
        Err(NodeError::Timeout { .. })
    ));
    drop(lonely);
    // Unsorted keys are refused before anything is sent.
    let bad = KvPairs::from_slices(&[5u64, 1], &[1.0f32, 2.0], None);
    assert!(matches!(
        worker.push(bad, 0).wait(),
        Err(NodeError::InvalidArgument(_))
    ));
    // A type the handle does not carry.
    assert!(matches!(
        node.worker(DataType::Other, 1, 0).wait(),
        Err(NodeError::InvalidArgument(_))
    ));
    node.finalize().wait().unwrap();
    assert!(node.is_stopped());
    join(others);
}

#[test]
fn inside_a_current_thread_tokio_runtime() {
    let port = free_port();
    let others = start_others(port, 1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // Creating the node's own runtime inside this one does not panic, and awaiting its
        // calls never blocks this runtime's only thread: a timer keeps ticking meanwhile.
        let ticks = tokio::spawn(async {
            let mut n = 0u32;
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                n += 1;
                if n == 10 {
                    return n;
                }
            }
        });
        let node = NodeHandle::start_async(config(Role::Worker, port, 1))
            .unwrap()
            .await
            .unwrap();
        let worker = node.worker(DataType::F32, 0, 0).await.unwrap();
        assert_eq!(push_push_pull(&worker).await, SUMS);
        assert_eq!(ticks.await.unwrap(), 10);
        // A blocking wait here is refused instead of stalling the runtime.
        match worker.pull(to_bytes(&KEYS), 0).wait() {
            Err(NodeError::InvalidArgument(text)) => assert!(text.contains("await"), "{text}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        node.finalize().await.unwrap();
        // Dropping the handle (and its runtime) on this runtime's thread does not panic.
        drop(worker);
        drop(node);
    });
    join(others);
}

#[test]
fn inside_a_multi_thread_tokio_runtime() {
    let port = free_port();
    let others = start_others(port, 2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let node = NodeHandle::start_async(config(Role::Worker, port, 2))
            .unwrap()
            .await
            .unwrap();
        let worker = node.worker(DataType::F32, 0, 0).await.unwrap();
        // Calls awaited from tasks of the caller's runtime, concurrently.
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let worker = worker.clone();
                tokio::spawn(async move { worker.push(pairs(&[1.0; 4]), 0).await })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let pulled = worker.pull(to_bytes(&KEYS), 0).await.unwrap();
        assert_eq!(&*pulled.vals::<f32>().unwrap(), &[8.0; 4]);
        node.finalize().await.unwrap();
    });
    drop(runtime);
    join(others);
}

#[test]
fn from_futures_block_on_and_smol() {
    let port = free_port();
    let others = start_others(port, 1);
    let start: Call<NodeHandle> = NodeHandle::start_async(config(Role::Worker, port, 1)).unwrap();
    let node = futures::executor::block_on(start).unwrap();
    let worker = futures::executor::block_on(node.worker(DataType::F32, 0, 0)).unwrap();
    assert_eq!(futures::executor::block_on(push_push_pull(&worker)), SUMS);
    // The same node from smol's executor.
    let pulled = smol::block_on(worker.push_pull(pairs(&[1.0; 4]), 0)).unwrap();
    assert_eq!(&*pulled.vals::<f32>().unwrap(), &[12.0, 23.0, 34.0, 45.0]);
    smol::block_on(node.finalize()).unwrap();
    join(others);
}

#[test]
fn a_failed_start_is_an_error_not_a_hang() {
    // Nobody listens at the scheduler's port: the bootstrap deadline ends the wait.
    let config = Config::builder()
        .role(Role::Worker)
        .num_servers(1)
        .num_workers(1)
        .root_uri("127.0.0.1")
        .root_port(free_port())
        .bootstrap_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    match NodeHandle::start(config) {
        Err(NodeError::Bootstrap { .. }) => {}
        other => panic!("expected a bootstrap error, got {other:?}"),
    }
    // No role: a configuration error, at once.
    let config = Config::builder().build().unwrap();
    assert!(matches!(
        NodeHandle::start(config),
        Err(NodeError::InvalidArgument(_))
    ));
}

#[test]
fn dropping_a_node_that_never_finalized_stops_it() {
    let port = free_port();
    let (tx, rx) = mpsc::sync_channel(4);
    let mut others = Vec::new();
    for role in [Role::Scheduler, Role::Server] {
        let tx = tx.clone();
        others.push(std::thread::spawn(move || {
            let node = NodeHandle::start(config(role, port, 1)).unwrap();
            let _server =
                (role == Role::Server).then(|| node.sum_server(DataType::F32, 0, 0, 1).wait());
            tx.send(node.finalize().wait()).unwrap();
        }));
    }
    let node = NodeHandle::start(config(Role::Worker, port, 1)).unwrap();
    let worker = node.worker(DataType::F32, 0, 0).wait().unwrap();
    worker.push(pairs(&[1.0; 4]), 0).wait().unwrap();
    // Gone without a goodbye, from a plain thread: the vans close, the runtime ends, and
    // the others' finalize ends with an error instead of waiting for this worker forever.
    let started = std::time::Instant::now();
    drop(worker);
    drop(node);
    assert!(started.elapsed() < Duration::from_secs(5));
    for _ in 0..2 {
        let result = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        assert!(result.is_err(), "finalize without the worker succeeded");
    }
    join(others);
}

#[test]
fn a_callback_runs_once_even_when_its_operation_never_finishes() {
    let port = free_port();
    let others = start_others(port, 1);
    let node = NodeHandle::start(config(Role::Worker, port, 1)).unwrap();
    node.finalize().wait().unwrap();
    // An operation that never completes: only the runtime's shutdown ends it.
    let (tx, rx) = mpsc::sync_channel(1);
    node.spawn(std::future::pending::<ps::Result<()>>())
        .on_complete(move |r| tx.send(r).unwrap());
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    drop(node);
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Err(NodeError::Stopped)) => {}
        other => panic!("expected the callback with Stopped, got {other:?}"),
    }
    join(others);
}
