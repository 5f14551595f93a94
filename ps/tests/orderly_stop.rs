//! An orderly shutdown of a healthy cluster reports no failure: a peer that leaves after the
//! final barrier is not a failed node, even when its close arrives before our own barrier
//! release (the release comes over the scheduler link, the close over the peer's link, and
//! nothing orders the two). ps-bench with 2 servers and 2 workers used to log "node failed:
//! connection lost" there, over TCP and shared memory alike.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ps::{node_ids, KvServer, KvWorker, Postoffice, Role, ALL_GROUPS};
use van_core::inproc::{Hub, InProcessVan};
use van_core::{
    inbox, Command, Config, Endpoint, Event, Inbox, InboxSender, Message, Node, NodeId, Van,
    VanError, VanKind,
};

/// Longest the worker's barrier release is held back waiting for the server's close.
const HOLD_LIMIT: Duration = Duration::from_secs(10);
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

/// The scheduler's release of the all-nodes barrier (what ends a node's finalize barrier).
fn is_final_release(msg: &Message) -> bool {
    !msg.meta.request
        && msg.meta.sender == Some(node_ids::SCHEDULER)
        && msg
            .meta
            .control
            .as_ref()
            .is_some_and(|c| c.cmd == Command::Barrier && c.barrier_group == ALL_GROUPS)
}

/// An in-process van that holds this node's final barrier release back until the loss of
/// `peer` has been delivered: the order in which a slow scheduler link makes them arrive.
struct ReleaseAfterPeerClose {
    inner: InProcessVan,
    peer: NodeId,
    /// Set when the release was delivered after the peer's loss (the race was exercised).
    close_came_first: Arc<AtomicBool>,
}

#[async_trait]
impl Van for ReleaseAfterPeerClose {
    fn kind(&self) -> VanKind {
        self.inner.kind()
    }

    async fn bind(&self, host: &str, port: u16, to: InboxSender) -> Result<Endpoint, VanError> {
        let (tx, from) = inbox(64);
        let endpoint = self.inner.bind(host, port, tx).await?;
        tokio::spawn(forward(
            from,
            to,
            self.peer,
            Arc::clone(&self.close_came_first),
        ));
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

/// Forwards everything from `from` to `to`, except that the final barrier release waits
/// (at most [`HOLD_LIMIT`]) until the loss of `peer` has gone through.
async fn forward(
    mut from: Inbox,
    to: InboxSender,
    peer: NodeId,
    close_came_first: Arc<AtomicBool>,
) {
    let mut held: Option<(Event, tokio::time::Instant)> = None;
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
                let (release, _) = held.take().unwrap();
                if to.deliver(vec![release]).await.is_err() {
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
                Event::Message(msg) if held.is_none() && is_final_release(msg) => {
                    held = Some((event, tokio::time::Instant::now() + HOLD_LIMIT));
                }
                Event::PeerLost(lost) if lost.peer == Some(peer) => {
                    out.push(event);
                    if let Some((release, _)) = held.take() {
                        close_came_first.store(true, Ordering::Release);
                        out.push(release);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_leaving_before_our_barrier_release_is_not_a_failed_node() {
    let hub = Hub::new();
    let server_id = node_ids::server_rank_to_id(0);
    let close_came_first = Arc::new(AtomicBool::new(false));

    let scheduler = {
        let van = Arc::new(InProcessVan::new(&hub));
        tokio::spawn(async move {
            let po = Postoffice::start_with_van(config(Role::Scheduler), van).await?;
            po.finalize().await
        })
    };
    let server = {
        let van = Arc::new(InProcessVan::new(&hub));
        tokio::spawn(async move {
            let po = Postoffice::start_with_van(config(Role::Server), van).await?;
            let _server = KvServer::<f32>::with_sum(&po, 0, 0, 1).await?;
            po.finalize().await
        })
    };
    let worker = {
        let van = Arc::new(ReleaseAfterPeerClose {
            inner: InProcessVan::new(&hub),
            peer: server_id,
            close_came_first: Arc::clone(&close_came_first),
        });
        tokio::spawn(async move {
            let po = Postoffice::start_with_van(config(Role::Worker), van).await?;
            let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
            // Traffic, so that the worker has a link to the server whose end it sees.
            let id = worker.push(&[1, u64::MAX], &[1.0, 2.0], None, 0).await?;
            worker.wait(id).await?;
            po.finalize().await?;
            Ok::<_, ps::NodeError>(po.dead_error(server_id))
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
    scheduler.unwrap();
    server.unwrap();
    let dead = worker.unwrap();
    assert!(
        close_came_first.load(Ordering::Acquire),
        "the server's close did not reach the worker before its release: the race was not \
         exercised"
    );
    assert!(
        dead.is_none(),
        "the server left in order after the final barrier, yet the worker recorded it as \
         failed: {dead:?}"
    );
}
