//! [`SimpleApp`]: ps-lite's `SimpleApp`, requests and responses of a command (`head`, an
//! `i32`) and a `body` (bytes) between nodes. Applications use it for their own commands
//! beside the key-value traffic ("save a checkpoint", "report your statistics").
//!
//! Every node that takes part creates a `SimpleApp` on the same app and customer id; its
//! handler answers the requests that reach it. A request goes to one node or to a group
//! ([`node_ids::SERVER_GROUP`] and the like), and [`SimpleApp::wait`] returns every answer.
//!
//! ```
//! use bytes::Bytes;
//! use node::local::LocalCluster;
//! use ps::node_ids::SERVER_GROUP;
//! use ps::simple_app::SimpleApp;
//! use ps::Role;
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let results = LocalCluster::new(2, 1)
//!     .run(|po| async move {
//!         // Every node answers command 1 ("ping") with "pong".
//!         let app = SimpleApp::new(&po, 1, 0, |_sender, head, _body| match head {
//!             1 => Ok((0, Bytes::from("pong"))),
//!             other => Err(format!("unknown command {other}")),
//!         })
//!         .await?;
//!         let mut answers = Vec::new();
//!         if po.role() == Role::Worker {
//!             let id = app.request(SERVER_GROUP, 1, Bytes::new()).await?;
//!             answers = app.wait(id).await?;
//!         }
//!         po.finalize().await?;
//!         Ok(answers)
//!     })
//!     .await?;
//! // Only the worker asked; it heard from both servers (ids 8 and 10), in id order.
//! let pongs = Bytes::from("pong");
//! assert_eq!(results.concat(), vec![(8, 0, pongs.clone()), (10, 0, pongs)]);
//! # Ok::<(), ps::NodeError>(())
//! # }).unwrap();
//! ```

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::{debug, warn};
use van_core::{node_ids, Message, Meta, NodeId};

use crate::in_flight::{insert_new, Completion};
use crate::kv::RequestId;
use node::error::role_name;
use node::error::{NodeError, Result};
use node::hash::IntMap;
use node::postoffice::{Customer, Postoffice};

/// Requests queued for the handler before the node stops reading (back-pressure).
const REQUEST_QUEUE: usize = 1024;
/// `meta.option` of a response that carries the handler's error text instead of an answer.
const OPTION_HANDLER_ERROR: i32 = 1;

/// One answer: the responding node, its `head` and its `body`.
type Response = (NodeId, i32, Bytes);
/// What a handler returns: the response's `head` and `body`, or an error text.
type HandlerResult = std::result::Result<(i32, Bytes), String>;
/// The user's request handler.
type Handler = Box<dyn Fn(NodeId, i32, Bytes) -> HandlerResult + Send + Sync>;

/// Sends commands (`head`, `body`) to other nodes and answers theirs, as ps-lite's
/// `SimpleApp`. Cheap to clone (all clones are the same application).
///
/// [`request`](Self::request) returns a [`RequestId`] at once; [`wait`](Self::wait) returns
/// every answer. A request to a node that died fails with [`NodeError::NodeFailed`] naming it;
/// a handler that returns an error makes `wait` fail with [`NodeError::Protocol`] naming the
/// node whose handler failed.
#[derive(Clone)]
pub struct SimpleApp {
    inner: Arc<AppInner>,
}

impl std::fmt::Debug for SimpleApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimpleApp")
            .field("app_id", &self.inner.app_id)
            .field("customer_id", &self.inner.customer_id)
            .finish_non_exhaustive()
    }
}

struct AppInner {
    po: Postoffice,
    app_id: i32,
    customer_id: i32,
    next_id: AtomicI32,
    pending: Mutex<IntMap<RequestId, InFlightRequest>>,
    /// Feeds the handler task; taken (closing the queue, ending the task) when the local
    /// postoffice stops.
    requests: Mutex<Option<mpsc::Sender<Job>>>,
}

/// A request from another node, on its way to the handler.
struct Job {
    sender: NodeId,
    request_id: RequestId,
    head: i32,
    body: Bytes,
}

#[derive(Default)]
struct InFlightRequest {
    /// Nodes that have not answered yet.
    outstanding: Vec<NodeId>,
    /// Answers so far.
    responses: Vec<Response>,
    /// Whether the request has completed (answers after that are late, not unexpected).
    done: bool,
    completion: Completion<Vec<Response>>,
}

impl InFlightRequest {
    /// Completes the request: hands the result to the waiter, or keeps it for `wait`.
    fn complete(&mut self, result: Result<Vec<Response>>) {
        self.done = true;
        self.outstanding.clear();
        self.completion.complete(result);
    }
}

impl crate::in_flight::InFlight<Vec<Response>> for InFlightRequest {
    fn completion(&mut self) -> &mut Completion<Vec<Response>> {
        &mut self.completion
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Map and option operations only, with no await and no call out: a poisoned lock still
    // holds consistent data.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl SimpleApp {
    /// Registers the application (`app_id`, `customer_id`) on this node. `handler` answers
    /// the requests that reach it: `(sender, head, body)` to the response's `(head, body)`,
    /// or an error text that the requester's [`wait`](Self::wait) reports.
    ///
    /// The handler runs on an async runtime thread, one request at a time, so it must not
    /// block (no sleeping, no blocking I/O). A handler that panics answers with an error.
    pub async fn new(
        po: &Postoffice,
        app_id: i32,
        customer_id: i32,
        handler: impl Fn(NodeId, i32, Bytes) -> std::result::Result<(i32, Bytes), String>
            + Send
            + Sync
            + 'static,
    ) -> Result<SimpleApp> {
        let (tx, rx) = mpsc::channel(REQUEST_QUEUE);
        let inner = Arc::new(AppInner {
            po: po.clone(),
            app_id,
            customer_id,
            next_id: AtomicI32::new(0),
            pending: Mutex::new(IntMap::default()),
            requests: Mutex::new(Some(tx)),
        });
        po.register_customer(app_id, customer_id, Arc::clone(&inner) as Arc<dyn Customer>)
            .await?;
        tokio::spawn(answer_requests(
            po.clone(),
            app_id,
            customer_id,
            Box::new(handler),
            rx,
        ));
        Ok(SimpleApp { inner })
    }

    /// Sends command `head` with `body` to `recipient`, a node id or a group id (such as
    /// [`node_ids::SERVER_GROUP`], or several groups or-ed together), and returns a request
    /// id for [`wait`](Self::wait). A group means every member but this node; a group with
    /// no other member completes at once with no answers.
    ///
    /// Fails with [`NodeError::InvalidArgument`] for an id not in the cluster (or this node's
    /// own id), and with [`NodeError::NodeFailed`] if a recipient is known to be dead.
    pub async fn request(&self, recipient: NodeId, head: i32, body: Bytes) -> Result<RequestId> {
        let inner = &self.inner;
        let po = &inner.po;
        let targets = recipients(po, recipient)?;
        if let Some(e) = targets.iter().find_map(|node| po.dead_error(*node)) {
            return Err(e);
        }
        let mut entry = InFlightRequest::default();
        if targets.is_empty() {
            entry.complete(Ok(Vec::new()));
        } else {
            entry.outstanding = targets.clone();
        }
        let id = insert_new(&inner.next_id, &inner.pending, entry);
        let msgs: Vec<Message> = targets
            .iter()
            .map(|node| Message {
                meta: Meta {
                    simple_app: true,
                    head,
                    body: body.clone(),
                    request: true,
                    request_id: id,
                    app_id: inner.app_id,
                    customer_id: inner.customer_id,
                    sender: Some(po.my_id()),
                    recipient: Some(*node),
                    ..Meta::default()
                },
                data: van_core::Parts::new(),
            })
            .collect();
        if !msgs.is_empty() {
            if let Err(e) = po.send_batch(msgs).await {
                lock(&inner.pending).remove(&id);
                return Err(e);
            }
        }
        Ok(id)
    }

    /// Waits for every answer to request `id`: `(node, head, body)` sorted by node id.
    ///
    /// Fails with [`NodeError::Protocol`] naming the node if its handler returned an error,
    /// with [`NodeError::NodeFailed`] if a recipient died first, and with
    /// [`NodeError::UnknownRequest`] if `id` was never issued or was already waited for.
    pub async fn wait(&self, id: RequestId) -> Result<Vec<(NodeId, i32, Bytes)>> {
        crate::in_flight::wait(&self.inner.pending, id).await
    }

    /// Number of requests issued and not yet waited for.
    pub fn pending(&self) -> usize {
        lock(&self.inner.pending).len()
    }
}

/// The nodes a request to `recipient` goes to, sorted by id.
fn recipients(po: &Postoffice, recipient: NodeId) -> Result<Vec<NodeId>> {
    let me = po.my_id();
    let ids = po.nodes().iter().filter_map(|node| node.id);
    if node_ids::is_group(recipient) {
        let mut members: Vec<NodeId> = po
            .nodes()
            .iter()
            .filter(|node| node_ids::group_of(node.role) & recipient != 0)
            .filter_map(|node| node.id)
            .filter(|id| *id != me)
            .collect();
        members.sort_unstable();
        return Ok(members);
    }
    if recipient == me {
        return Err(NodeError::InvalidArgument(format!(
            "node {recipient} is this node: a SimpleApp sends requests to other nodes only"
        )));
    }
    if ids.clone().any(|id| id == recipient) {
        return Ok(vec![recipient]);
    }
    let known: Vec<String> = ids.map(|id| id.to_string()).collect();
    Err(NodeError::InvalidArgument(format!(
        "node {recipient} is not in the cluster (nodes: {}; groups: 1 scheduler, 2 servers, \
         4 workers, or a combination)",
        known.join(", ")
    )))
}

/// The handler task: answers requests one at a time, until the queue closes.
async fn answer_requests(
    po: Postoffice,
    app_id: i32,
    customer_id: i32,
    handler: Handler,
    mut jobs: mpsc::Receiver<Job>,
) {
    while let Some(job) = jobs.recv().await {
        let (sender, request_id) = (job.sender, job.request_id);
        let answer = catch_unwind(AssertUnwindSafe(|| handler(sender, job.head, job.body)))
            .unwrap_or_else(|_| Err("the handler panicked".to_owned()));
        let (head, body, option) = match answer {
            Ok((head, body)) => (head, body, 0),
            Err(reason) if reason.is_empty() => (job.head, "error".into(), OPTION_HANDLER_ERROR),
            Err(reason) => (job.head, reason.into(), OPTION_HANDLER_ERROR),
        };
        let response = Message {
            meta: Meta {
                simple_app: true,
                head,
                body,
                option,
                request: false,
                request_id,
                app_id,
                customer_id,
                sender: Some(po.my_id()),
                recipient: Some(sender),
                ..Meta::default()
            },
            data: van_core::Parts::new(),
        };
        if let Err(e) = po.send(response).await {
            warn!(
                to = sender,
                "cannot answer simple request {request_id}: {e}"
            );
        }
    }
    debug!(app_id, customer_id, "simple app handler stopped");
}

#[async_trait]
impl Customer for AppInner {
    async fn deliver(&self, msg: Message) {
        let meta = msg.meta;
        let Some(sender) = meta.sender else {
            warn!("simple app message without a sender; ignored");
            return;
        };
        if !meta.simple_app {
            warn!(
                from = sender,
                app = self.app_id,
                customer = self.customer_id,
                "a non-SimpleApp message reached a SimpleApp (do two applications share these \
                 ids?); ignored"
            );
            return;
        }
        if meta.request {
            let queue = lock(&self.requests).clone();
            let job = Job {
                sender,
                request_id: meta.request_id,
                head: meta.head,
                body: meta.body,
            };
            match queue {
                Some(queue) if queue.send(job).await.is_ok() => {}
                _ => debug!(
                    from = sender,
                    "request arrived after the app stopped; dropped"
                ),
            }
            return;
        }
        let mut pending = lock(&self.pending);
        let Some(entry) = pending.get_mut(&meta.request_id) else {
            warn!(
                from = sender,
                request = meta.request_id,
                "response to an unknown simple request"
            );
            return;
        };
        let Some(at) = entry.outstanding.iter().position(|n| *n == sender) else {
            if !entry.done {
                warn!(
                    from = sender,
                    request = meta.request_id,
                    "unexpected simple response"
                );
            }
            return;
        };
        entry.outstanding.swap_remove(at);
        if meta.option == OPTION_HANDLER_ERROR {
            let reason = String::from_utf8_lossy(&meta.body);
            entry.complete(Err(NodeError::Protocol {
                from: Some(sender),
                reason: format!("handler failed on {} {sender}: {reason}", role_name(sender)),
            }));
            return;
        }
        entry.responses.push((sender, meta.head, meta.body));
        if entry.outstanding.is_empty() {
            let mut responses = std::mem::take(&mut entry.responses);
            responses.sort_unstable_by_key(|(node, _, _)| *node);
            entry.complete(Ok(responses));
        }
    }

    fn node_failed(&self, node: NodeId, error: &str) {
        if self.po.is_stopped() || node == self.po.my_id() {
            // This node stopped: end the handler task and fail everything still waiting.
            lock(&self.requests).take();
            for entry in lock(&self.pending).values_mut() {
                if !entry.done {
                    entry.complete(Err(self.po.stopped_error()));
                }
            }
            return;
        }
        for entry in lock(&self.pending).values_mut() {
            if entry.outstanding.contains(&node) {
                entry.complete(Err(NodeError::node_failed(node, error.to_owned())));
            }
        }
    }
}
