//! What waits on another task ends at once, not at its own deadline, when that task cannot
//! deliver: its rendezvous manager is dropped (pull and push), a request reaches the manager
//! after it was dropped, or a value it pushed does not decode. A server (node 8) and a worker
//! (node 9) of an in-process cluster (`node::local::LocalCluster`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use node::local::LocalCluster;
use node::postoffice::Customer;
use node::{node_ids, NodeError, Postoffice, Role};
use rendezvous::mgr::DEFAULT_APP_ID;
use rendezvous::wire::{Address, RemoteStatus, RendezvousMessage, StatusCode};
use rendezvous::{
    cpu_device, create_key, parse_key, ParsedKey, Protocol, Received, Rendezvous, RendezvousError,
    RendezvousMgr,
};
use tokio::sync::mpsc;
use van_core::{Message, NodeId};

const SERVER: NodeId = 8;
const WORKER: NodeId = 9;
const TASKS: i32 = node_ids::SERVER_GROUP | node_ids::WORKER_GROUP;
/// Every test ends well within this, or fails.
const TEST_DEADLINE: Duration = Duration::from_secs(60);
/// "At once": far below any deadline a caller would set, far above a local round trip.
const PROMPTLY: Duration = Duration::from_secs(5);

fn key(src: NodeId, dst: NodeId, name: &str) -> ParsedKey {
    parse_key(&create_key(
        &cpu_device(src).unwrap(),
        1,
        &cpu_device(dst).unwrap(),
        name,
        (0, 0),
    ))
    .unwrap()
}

fn failed(e: impl std::fmt::Display) -> NodeError {
    NodeError::InvalidArgument(e.to_string())
}

/// Runs `node` on the server and the worker of a 1-server, 1-worker in-process cluster (the
/// scheduler only finalizes), with a deadline; returns what each returned.
async fn pair<T, F, Fut>(node: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Postoffice) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = node::Result<T>> + Send + 'static,
{
    let cluster = LocalCluster::new(1, 1);
    let run = cluster.run(move |po| {
        let node = node.clone();
        async move {
            if po.role() == Role::Scheduler {
                po.finalize().await?;
                return Ok(None);
            }
            node(po).await.map(Some)
        }
    });
    let results = tokio::time::timeout(TEST_DEADLINE, run)
        .await
        .expect("the cluster did not finish in time")
        .expect("a node failed");
    results.into_iter().flatten().collect()
}

/// What a receive came to within [`PROMPTLY`] (`None`: still waiting).
type Outcome = Option<Result<Received, RendezvousError>>;

async fn within_promptly(
    receive: impl Future<Output = Result<Received, RendezvousError>>,
) -> Outcome {
    tokio::time::timeout(PROMPTLY, receive).await.ok()
}

/// Checks that `outcome` is the remote error for `key` of `step_id` from the server, whose
/// reason contains `because`.
fn assert_remote(outcome: &Outcome, step_id: i64, key: &ParsedKey, because: &str) {
    match outcome {
        Some(Err(RendezvousError::Remote {
            step_id: s,
            key: k,
            peer,
            reason,
        })) => {
            assert_eq!((*s, k.as_str()), (step_id, key.full_key()));
            assert_eq!(peer, "node 8 (server)");
            assert!(reason.contains(because), "{reason}");
        }
        None => panic!("step {step_id}: the receive was still waiting after {PROMPTLY:?}"),
        other => panic!("step {step_id}: expected a remote error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_manager_fails_the_receives_of_other_tasks_waiting_on_it() {
    for protocol in [Protocol::Pull, Protocol::Push] {
        let outcomes = pair(move |po| async move {
            let mgr = RendezvousMgr::new(&po, protocol).await.map_err(failed)?;
            let k = key(SERVER, WORKER, "never-sent");
            let step = mgr.find(1);
            step.initialize().map_err(failed)?;
            po.barrier(TASKS).await?;
            let mut outcomes = Vec::new();
            if po.my_id() == WORKER {
                // Pull: a request held by the server. Push: a receive of a value it would push.
                let pending = step.recv(&k);
                po.barrier(TASKS).await?;
                outcomes.push(within_promptly(pending).await);
                // Later receives from the server do not wait either.
                let later = mgr.find(2);
                later.initialize().map_err(failed)?;
                outcomes.push(within_promptly(later.recv(&k)).await);
                mgr.cleanup_all();
            } else {
                po.barrier(TASKS).await?;
                if protocol == Protocol::Pull {
                    let deadline = std::time::Instant::now() + PROMPTLY;
                    while mgr.stats().served_requests == 0 && std::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    assert_eq!(mgr.stats().served_requests, 1, "the request never arrived");
                }
                drop(step);
                drop(mgr);
            }
            po.barrier(TASKS).await?;
            po.finalize().await?;
            Ok(outcomes)
        })
        .await;
        let outcomes: Vec<Outcome> = outcomes.into_iter().flatten().collect();
        assert_eq!(outcomes.len(), 2, "{protocol}");
        let k = key(SERVER, WORKER, "never-sent");
        assert_remote(
            &outcomes[0],
            1,
            &k,
            "rendezvous manager of node 8 was dropped",
        );
        assert_remote(
            &outcomes[1],
            2,
            &k,
            "rendezvous manager of node 8 was dropped",
        );
    }
}

/// A bare application in the place of a rendezvous manager: passes on the RecvTensor
/// responses it gets.
struct Listener(mpsc::Sender<Message>);

#[async_trait]
impl Customer for Listener {
    fn try_deliver(&self, msg: Message) -> Option<Message> {
        if msg.meta.head == rendezvous::wire::RECV_TENSOR {
            let _ = self.0.try_send(msg);
        }
        None
    }

    async fn deliver(&self, msg: Message) {
        let _ = self.try_deliver(msg);
    }

    fn node_failed(&self, _node: NodeId, _error: &str) {}
}

#[tokio::test]
async fn a_request_reaching_a_dropped_manager_is_answered_with_an_error() {
    const CUSTOMER: i32 = 5;
    let answers = pair(|po| async move {
        let mut answer = None;
        if po.my_id() == SERVER {
            let mgr = RendezvousMgr::builder(&po)
                .customer_id(CUSTOMER)
                .build()
                .await
                .map_err(failed)?;
            drop(mgr);
            po.barrier(TASKS).await?;
        } else {
            // Not a manager: it asks without knowing that the server's is gone.
            let (tx, mut rx) = mpsc::channel(4);
            po.register_customer(DEFAULT_APP_ID, CUSTOMER, std::sync::Arc::new(Listener(tx)))
                .await?;
            po.barrier(TASKS).await?;
            let request = RendezvousMessage::RecvRequest {
                request_id: 77,
                step_id: 3,
                key: key(SERVER, WORKER, "asked-too-late"),
            };
            let address = Address {
                app_id: DEFAULT_APP_ID,
                customer_id: CUSTOMER,
                sender: WORKER,
                recipient: SERVER,
            };
            po.send(request.encode(address)).await?;
            let reply = tokio::time::timeout(PROMPTLY, rx.recv())
                .await
                .ok()
                .flatten();
            answer = Some(reply.map(RendezvousMessage::decode));
        }
        po.barrier(TASKS).await?;
        po.finalize().await?;
        Ok(answer)
    })
    .await;
    match answers.into_iter().flatten().next() {
        Some(Some(Ok(RendezvousMessage::RecvResponse {
            request_id: 77,
            step_id: 3,
            result: Err(RemoteStatus { code, message }),
        }))) => {
            assert_eq!(code, StatusCode::Failed);
            assert_eq!(message, "the rendezvous manager of node 8 was dropped");
        }
        Some(None) => panic!("the request was not answered within {PROMPTLY:?}"),
        other => panic!("expected an error response, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pushed_value_that_does_not_decode_fails_its_receive_at_once() {
    let garbled = key(SERVER, WORKER, "garbled");
    let outcomes = pair(move |po| async move {
        let mgr = RendezvousMgr::new(&po, Protocol::Push)
            .await
            .map_err(failed)?;
        let k = key(SERVER, WORKER, "garbled");
        let mut outcomes = Vec::new();
        // Step 3: the value's segment is missing. Step 4: not even the header is readable.
        for step_id in [3i64, 4] {
            let step = mgr.find(step_id);
            step.initialize().map_err(failed)?;
            if po.my_id() == WORKER {
                let pending = step.recv(&k);
                po.barrier(TASKS).await?;
                outcomes.push(within_promptly(pending).await);
            } else {
                po.barrier(TASKS).await?;
                let value = Received {
                    value: Bytes::from_static(b"lost"),
                    is_dead: false,
                    header: Bytes::new(),
                };
                let push = RendezvousMessage::Push {
                    step_id,
                    key: k.clone(),
                    value,
                };
                let address = Address {
                    app_id: DEFAULT_APP_ID,
                    customer_id: 0,
                    sender: SERVER,
                    recipient: WORKER,
                };
                let mut msg = push.encode(address);
                if step_id == 3 {
                    msg.data.clear();
                    msg.meta.data_types.clear();
                } else {
                    let mut body = msg.meta.body.to_vec();
                    body[0] = 0xee; // a format version nobody speaks
                    msg.meta.body = Bytes::from(body);
                }
                po.send(msg).await?;
            }
            po.barrier(TASKS).await?;
        }
        mgr.cleanup_all();
        po.finalize().await?;
        Ok(outcomes)
    })
    .await;
    let outcomes: Vec<Outcome> = outcomes.into_iter().flatten().collect();
    assert_eq!(outcomes.len(), 2);
    assert_remote(
        &outcomes[0],
        3,
        &garbled,
        "could not be decoded: rendezvous PushTensor",
    );
    assert_remote(
        &outcomes[1],
        4,
        &garbled,
        "could not be decoded: rendezvous message version",
    );
}
