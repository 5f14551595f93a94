//! `barrier(ALL_GROUPS)` is public and may be used in the middle of a run; only finalize's
//! barrier ends it. A node that loses a peer while waiting at, or after, an ordinary
//! all-nodes barrier reports that peer as failed (the quiet leave-taking of
//! tests/orderly_stop.rs is for the final barrier alone).
//!
//! The worker here never hears the scheduler's failure notices, and a failed barrier reaches
//! it only after its own link to the server has broken, so what it records comes from that
//! link, seen while it still waits.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ps::{node_ids, KvServer, KvWorker, NodeError, Postoffice, Role, ALL_GROUPS};
use tokio::sync::oneshot;
use van_core::inproc::{Hub, InProcessVan};
use van_core::{
    inbox, Command, Config, Endpoint, Event, Inbox, InboxSender, Message, Node, NodeId, Van,
    VanError, VanKind,
};

/// Longest a failed barrier is held back waiting for the server's close.
const HOLD_LIMIT: Duration = Duration::from_secs(10);
/// Longest the worker waits for the server's loss to be recorded.
const RECORD_LIMIT: Duration = Duration::from_secs(10);
/// Longest the whole cluster may take.
const CLUSTER_LIMIT: Duration = Duration::from_secs(60);

fn config(role: Role) -> Config {
    Config::builder()
        .role(role)
        .num_servers(1)
        .num_workers(1)
        .root_uri("scheduler")
        .root_port(1)
        .node_host(role.as_str())
        .stream_van(VanKind::InProcess)
        .bootstrap_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// An in-process van that drops the scheduler's node-failure notices to this node, and holds
/// a failed barrier back until the loss of `peer` has been delivered.
struct DeafToFailureNotices {
    inner: InProcessVan,
    peer: NodeId,
}

#[async_trait]
impl Van for DeafToFailureNotices {
    fn kind(&self) -> VanKind {
        self.inner.kind()
    }

    async fn bind(&self, host: &str, port: u16, to: InboxSender) -> Result<Endpoint, VanError> {
        let (tx, from) = inbox(64);
        let endpoint = self.inner.bind(host, port, tx).await?;
        tokio::spawn(forward(from, to, self.peer));
        Ok(endpoint)
    }

    async fn connect(&self, node: &Node) -> Result<(), VanError> {
        self.inner.connect(node).await
    }

    async fn send(&self, msg: Message) -> Result<(), VanError> {
        self.inner.send(msg).await
    }

    async fn stop(&self) -> Result<(), VanError> {
        self.inner.stop().await
    }
}

fn is_failure_notice(msg: &Message) -> bool {
    (msg.meta.control.as_ref()).is_some_and(|c| c.cmd == Command::NodeFailure)
}

fn is_failed_barrier(msg: &Message) -> bool {
    !msg.meta.request
        && (msg.meta.control.as_ref())
            .is_some_and(|c| c.cmd == Command::Barrier && !c.nodes.is_empty())
}

/// Forwards everything from `from` to `to` but failure notices; a failed barrier waits (at
/// most [`HOLD_LIMIT`]) until the loss of `peer` has gone through.
async fn forward(mut from: Inbox, to: InboxSender, peer: NodeId) {
    let mut held: Option<(Event, tokio::time::Instant)> = None;
    let mut peer_lost = false;
    let mut batch = Vec::new();
    loop {
        let deadline = held.as_ref().map(|(_, deadline)| *deadline);
        let received = tokio::select! {
            received = from.recv_batch(&mut batch) => received,
            () = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            } => {
                let (failed, _) = held.take().unwrap();
                if to.deliver(vec![failed]).await.is_err() {
                    return;
                }
                continue;
            }
        };
        if received == 0 {
            return;
        }
        let mut out = Vec::with_capacity(batch.len());
        for event in batch.drain(..) {
            match &event {
                Event::Message(msg) if is_failure_notice(msg) => {}
                Event::Message(msg) if !peer_lost && held.is_none() && is_failed_barrier(msg) => {
                    held = Some((event, tokio::time::Instant::now() + HOLD_LIMIT));
                }
                Event::PeerLost(lost) if lost.peer == Some(peer) => {
                    peer_lost = true;
                    out.push(event);
                    if let Some((failed, _)) = held.take() {
                        out.push(failed);
                    }
                }
                _ => out.push(event),
            }
        }
        if !out.is_empty() && to.deliver(out).await.is_err() {
            return;
        }
    }
}

/// Waits (at most [`RECORD_LIMIT`]) until `po` records `node` as dead.
async fn recorded_failure(po: &Postoffice, node: NodeId) -> Option<NodeError> {
    let deadline = tokio::time::Instant::now() + RECORD_LIMIT;
    loop {
        let dead = po.dead_error(node);
        if dead.is_some() || tokio::time::Instant::now() >= deadline {
            return dead;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// When the server stops, relative to an ordinary all-nodes barrier.
#[derive(Clone, Copy, PartialEq)]
enum ServerStops {
    /// While the worker waits at the barrier (the server never arrives).
    DuringBarrier,
    /// After the barrier has released everyone.
    AfterBarrier,
}

/// Runs a scheduler, a server that stops (without finalize) as `when` says and a worker
/// deaf to failure notices; returns what the worker recorded about the server.
async fn worker_record_of_a_server_that_stops(when: ServerStops) -> Option<NodeError> {
    let hub = Hub::new();
    let server_id = node_ids::server_rank_to_id(0);
    let (go_tx, go_rx) = oneshot::channel::<()>();
    let (done_tx, done_rx) = oneshot::channel::<()>();

    let scheduler = {
        let van = Arc::new(InProcessVan::new(&hub));
        tokio::spawn(async move {
            let po = Postoffice::start_with_van(config(Role::Scheduler), van).await?;
            let barrier = po.barrier(ALL_GROUPS).await;
            let _ = done_rx.await;
            po.stop().await;
            Ok::<_, NodeError>(barrier)
        })
    };
    let server = {
        let van = Arc::new(InProcessVan::new(&hub));
        tokio::spawn(async move {
            let po = Postoffice::start_with_van(config(Role::Server), van).await?;
            let _server = KvServer::<f32>::with_sum(&po, 0, 0, 1).await?;
            if when == ServerStops::AfterBarrier {
                po.barrier(ALL_GROUPS).await?;
            }
            let _ = go_rx.await;
            po.stop().await;
            Ok::<_, NodeError>(())
        })
    };
    let worker = {
        let van = Arc::new(DeafToFailureNotices {
            inner: InProcessVan::new(&hub),
            peer: server_id,
        });
        tokio::spawn(async move {
            let po = Postoffice::start_with_van(config(Role::Worker), van).await?;
            let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
            // Traffic, so that the worker has a link to the server whose end it sees.
            let id = worker.push(&[1, u64::MAX], &[1.0, 2.0], None, 0).await?;
            worker.wait(id).await?;
            let mut barrier = std::pin::pin!(po.barrier(ALL_GROUPS));
            if when == ServerStops::AfterBarrier {
                barrier.await?;
                let _ = go_tx.send(());
            } else {
                // One poll registers the barrier here and sends it to the scheduler.
                tokio::select! {
                    biased;
                    _ = &mut barrier => panic!("the barrier released without the server"),
                    () = std::future::ready(()) => {}
                }
                let _ = go_tx.send(());
                assert!(
                    barrier.await.is_err(),
                    "the barrier must fail: the server died"
                );
            }
            let dead = recorded_failure(&po, server_id).await;
            let _ = done_tx.send(());
            po.stop().await;
            Ok::<_, NodeError>(dead)
        })
    };

    let (scheduler, server, worker) = tokio::time::timeout(CLUSTER_LIMIT, async {
        (
            scheduler.await.unwrap(),
            server.await.unwrap(),
            worker.await.unwrap(),
        )
    })
    .await
    .expect("the cluster did not finish");
    let scheduler_barrier = scheduler.unwrap();
    assert_eq!(
        scheduler_barrier.is_ok(),
        when == ServerStops::AfterBarrier,
        "{scheduler_barrier:?}"
    );
    server.unwrap();
    worker.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_lost_during_an_ordinary_all_nodes_barrier_is_a_failed_node() {
    let dead = worker_record_of_a_server_that_stops(ServerStops::DuringBarrier).await;
    let dead = dead.expect("the server's link broke mid-run, yet the worker recorded nothing");
    assert!(dead.to_string().contains("connection lost"), "{dead}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_lost_after_an_ordinary_all_nodes_barrier_is_a_failed_node() {
    let dead = worker_record_of_a_server_that_stops(ServerStops::AfterBarrier).await;
    let dead = dead.expect(
        "the server's link broke after a mid-run all-nodes barrier, yet the worker recorded \
         nothing (the barrier was taken for the final one)",
    );
    assert!(dead.to_string().contains("connection lost"), "{dead}");
}
