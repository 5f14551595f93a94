//! The manager's side of the wire: its postoffice customer (requests, responses, pushed values
//! and cancels from other tasks), the sender task that drains the outbox into the postoffice,
//! and the receives waiting on other tasks and the requests waiting on this one as they are
//! placed, answered and withdrawn. It also gives steps what they ask of their manager
//! ([`StepHost`]), over these and the shared state's routes.
//!
//! Everything here runs without blocking: the postoffice calls the customer from its dispatch
//! loop, and rendezvous callbacks may run on any thread, so messages are queued in the
//! outbox and sent by the sender task, in order.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use bytes::Bytes;
use node::postoffice::Customer;
use node::{NodeError, Postoffice};
use tracing::{debug, warn};
use van_core::rendezvous::Received;
use van_core::{Message, NodeId, ParsedKey, Rendezvous, RendezvousError};

use crate::error::{peer_name, remote_error, MessageError};
use crate::local::Done;
use crate::outbox::Outbox;
use crate::protocol::Protocol;
use crate::remote::{finish, new_ticket, RemoteRendezvous, Route, StepHost, Ticket, TicketCell};
use crate::state::{MgrInner, PendingPull, Served};
use crate::sync::lock;
use crate::wire::{self, Address, RemoteStatus, RendezvousMessage, StatusCode};

/// Requests from other tasks tracked at once (so that a cancel or the requester's death can
/// withdraw them); requests beyond it are still answered, only not withdrawable.
const MAX_SERVED: usize = 1 << 20;

/// What the sender remembers of a message, to fail the right calls if sending it fails.
struct Sent {
    head: i32,
    request: bool,
    request_id: i32,
    body: Bytes,
}

/// Drains the outbox into the postoffice, one batch per peer, until the manager goes.
pub(crate) async fn run_sender(po: Postoffice, outbox: Arc<Outbox>, mgr: Weak<MgrInner>) {
    let mut groups: Vec<(NodeId, Vec<Message>)> = Vec::new();
    while let Some(batch) = outbox.next_batch().await {
        for msg in batch {
            let peer = msg.meta.recipient.unwrap_or_default();
            match groups.iter_mut().find(|(p, _)| *p == peer) {
                Some((_, msgs)) => msgs.push(msg),
                None => groups.push((peer, vec![msg])),
            }
        }
        for (peer, msgs) in groups.drain(..) {
            let sent: Vec<Sent> = msgs
                .iter()
                .map(|m| Sent {
                    head: m.meta.head,
                    request: m.meta.request,
                    request_id: m.meta.request_id,
                    body: m.meta.body.clone(),
                })
                .collect();
            if let Err(error) = po.send_batch(msgs).await {
                // Once the manager is gone, its customer still answers late requests through
                // here: a failure then concerns nobody waiting.
                match mgr.upgrade() {
                    Some(mgr) => mgr.send_failed(peer, sent, &error),
                    None => debug!(peer, "rendezvous messages not sent: {error}"),
                }
            }
        }
    }
    debug!("rendezvous sender stopped");
}

/// The manager's postoffice application: the [`Customer`] registered under the manager's app
/// and customer ids, which hands what arrives for them to the manager. The postoffice keeps
/// it until it stops, so it outlives a dropped manager: it then answers the RecvTensor
/// requests that still arrive, with an error, through the outbox (closed when it goes).
pub(crate) struct MgrCustomer {
    mgr: Weak<MgrInner>,
    outbox: Arc<Outbox>,
    /// This task (the sender of answers).
    me: NodeId,
    app_id: i32,
    customer_id: i32,
}

impl MgrCustomer {
    pub(crate) fn new(mgr: &Arc<MgrInner>) -> MgrCustomer {
        MgrCustomer {
            mgr: Arc::downgrade(mgr),
            outbox: Arc::clone(&mgr.outbox),
            me: mgr.me,
            app_id: mgr.options.app_id,
            customer_id: mgr.options.customer_id,
        }
    }

    fn take(&self, msg: Message) {
        match self.mgr.upgrade() {
            Some(mgr) => mgr.deliver(msg),
            None => self.refuse(msg),
        }
    }

    /// A message for the dropped manager: a request is answered with an error, so that its
    /// requester does not wait until its own deadline; anything else concerns nobody here.
    fn refuse(&self, msg: Message) {
        let (Some(from), wire::RECV_TENSOR, true) =
            (msg.meta.sender, msg.meta.head, msg.meta.request)
        else {
            return;
        };
        let step_id = wire::peek(&msg.meta.body).map_or(0, |(step_id, _)| step_id);
        let status = RemoteStatus {
            code: StatusCode::Failed,
            message: dropped(self.me),
        };
        let address = Address {
            app_id: self.app_id,
            customer_id: self.customer_id,
            sender: self.me,
            recipient: from,
        };
        let answer = wire::recv_response(msg.meta.request_id, step_id, Err(status), address);
        if let Err(reason) = self.outbox.push_reply(answer) {
            debug!(
                from,
                "RecvTensor request to a dropped manager not answered: {reason}"
            );
        }
    }
}

/// Why calls fail once the manager of node `me` is dropped.
fn dropped(me: NodeId) -> String {
    format!("the rendezvous manager of node {me} was dropped")
}

#[async_trait]
impl Customer for MgrCustomer {
    /// Everything is handed on without waiting.
    fn try_deliver(&self, msg: Message) -> Option<Message> {
        self.take(msg);
        None
    }

    async fn deliver(&self, msg: Message) {
        self.take(msg);
    }

    fn node_failed(&self, node: NodeId, error: &str) {
        match self.mgr.upgrade() {
            Some(mgr) => mgr.node_failed(node, error),
            // The postoffice stopped: nothing more can be sent.
            None if node == self.me => self.outbox.close(),
            None => {}
        }
    }
}

impl Drop for MgrCustomer {
    fn drop(&mut self) {
        // The postoffice let go of it (it stopped, or registration failed): the sender ends
        // once it has sent what is queued.
        self.outbox.close();
    }
}

impl Drop for MgrInner {
    /// Aborts every step here, and tells the other tasks at once instead of leaving them to
    /// their own deadlines: the requests this task holds are answered with an error, and
    /// every task gets a goodbye, which fails the receives waiting on values from here.
    fn drop(&mut self) {
        let reason = dropped(self.me);
        let served: Vec<((NodeId, node::RequestId), Served)> = lock(&self.served).drain().collect();
        for ((from, request), entry) in served {
            let status = RemoteStatus {
                code: StatusCode::Failed,
                message: reason.clone(),
            };
            self.respond(from, request, entry.step_id, Err(status));
        }
        self.shut_down(RendezvousError::Aborted(reason.clone()));
        for &task in self.tasks.iter().filter(|&&task| task != self.me) {
            // Fails only when the outbox is closed: the postoffice has stopped already.
            let _ = self
                .outbox
                .push_reply(wire::goodbye(&reason, self.address(task)));
        }
    }
}

impl MgrInner {
    fn address(&self, recipient: NodeId) -> Address {
        Address {
            app_id: self.options.app_id,
            customer_id: self.options.customer_id,
            sender: self.me,
            recipient,
        }
    }

    /// Withdraws pull `request`, completing it with `error`; `notify` tells the owner.
    fn cancel_pull(&self, request: node::RequestId, error: RendezvousError, notify: bool) -> bool {
        let Some(pull) = lock(&self.pulls).remove(&request) else {
            return false;
        };
        if notify {
            let msg = wire::cancel(request, pull.step_id, self.address(pull.peer));
            // Best effort: the owner also drops it when the step ends there.
            let _ = self.outbox.push_reply(msg);
        }
        pull.done.complete(Err(error));
        true
    }

    /// Fails pull `request` because `peer` cannot answer it.
    fn fail_pull(&self, request: node::RequestId, peer: NodeId, reason: &str) {
        let pull = {
            let mut pulls = lock(&self.pulls);
            match pulls.get(&request) {
                Some(p) if p.peer == peer => pulls.remove(&request),
                _ => None,
            }
        };
        if let Some(pull) = pull {
            let error = remote_error(pull.step_id, &pull.key, peer, reason.to_owned());
            pull.done.complete(Err(error));
        }
    }

    /// A message of this application arrived.
    fn deliver(self: &Arc<Self>, msg: Message) {
        let Some(from) = msg.meta.sender else {
            warn!("rendezvous message without a sender; ignored");
            return;
        };
        let (head, request, request_id) = (msg.meta.head, msg.meta.request, msg.meta.request_id);
        // A push that does not decode must fail its step, which its header names.
        let push_body = (head == wire::PUSH_TENSOR).then(|| msg.meta.body.clone());
        match RendezvousMessage::decode(msg) {
            Err(error) => {
                warn!(
                    from,
                    head,
                    "bad rendezvous message from {}: {error}",
                    peer_name(from)
                );
                match (head, request) {
                    (wire::RECV_TENSOR, true) => self.respond(
                        from,
                        request_id,
                        0,
                        Err(RemoteStatus {
                            code: StatusCode::InvalidArgument,
                            message: format!(
                                "node {} cannot decode the RecvTensor request: {error}",
                                self.me
                            ),
                        }),
                    ),
                    (wire::RECV_TENSOR, false) => self.fail_pull(
                        request_id,
                        from,
                        &format!("undecodable RecvTensor response: {error}"),
                    ),
                    (wire::PUSH_TENSOR, _) => {
                        self.reject_push(from, push_body.as_deref().unwrap_or_default(), &error)
                    }
                    _ => {}
                }
            }
            Ok(RendezvousMessage::RecvRequest {
                request_id,
                step_id,
                key,
            }) => self.serve(from, request_id, step_id, &key),
            Ok(RendezvousMessage::RecvResponse {
                request_id, result, ..
            }) => self.answer_pull(from, request_id, result),
            Ok(RendezvousMessage::Push {
                step_id,
                key,
                value,
            }) => self.accept_push(from, step_id, key, value),
            Ok(RendezvousMessage::Cancel { request_id, .. }) => {
                self.cancel_served(from, request_id)
            }
            Ok(RendezvousMessage::Goodbye { reason }) => self.peer_gone(from, &reason),
        }
    }

    /// A pushed value that does not decode never reaches the receive waiting for it. Rather
    /// than leave that receive waiting until cleanup, the step it was meant for fails now,
    /// naming the key and the producer (created first if this task has not seen it yet, so
    /// that a later receive fails at once too). When not even the step can be read, the
    /// receives waiting on values from `from` fail.
    fn reject_push(self: &Arc<Self>, from: NodeId, body: &[u8], error: &MessageError) {
        let reason = format!("a value it pushed could not be decoded: {error}");
        match wire::peek_header(body) {
            Some((step_id, key)) => {
                if let Some(step) = self.find_for_peer(step_id) {
                    step.start_abort(remote_error(step_id, &key, from, reason));
                }
            }
            None => {
                for step in self.all_live_steps() {
                    step.peer_failed(from, &reason);
                }
            }
        }
    }

    /// `from`'s manager was dropped: what waits on it fails now, and later calls towards it
    /// fail at once.
    fn peer_gone(&self, from: NodeId, reason: &str) {
        if from == self.me || !self.tasks.contains(&from) {
            warn!(
                from,
                "goodbye from {}, not another task; ignored",
                peer_name(from)
            );
            return;
        }
        lock(&self.gone).insert(from, reason.to_owned());
        self.fail_peer(from, reason);
    }

    /// A RecvTensor request: answer it from this task's table when the value is there.
    fn serve(
        self: &Arc<Self>,
        from: NodeId,
        request: node::RequestId,
        step_id: i64,
        key: &ParsedKey,
    ) {
        if self.options.protocol == Protocol::Push {
            // The requester pulls: it would wait for a value this node pushes elsewhere.
            let status = RemoteStatus {
                code: StatusCode::InvalidArgument,
                message: format!(
                    "node {} runs the push protocol and serves no RecvTensor request, but {} \
                     pulls; every task of the job must run the same protocol",
                    self.me,
                    peer_name(from)
                ),
            };
            return self.respond(from, request, step_id, Err(status));
        }
        let Some(step) = self.find_for_peer(step_id) else {
            let status = RemoteStatus {
                code: StatusCode::Aborted,
                message: format!("step {step_id} was already cleaned up on node {}", self.me),
            };
            return self.respond(from, request, step_id, Err(status));
        };
        let ticket = new_ticket();
        let tracked = {
            let mut served = lock(&self.served);
            let tracked = served.len() < MAX_SERVED;
            if tracked {
                served.insert(
                    (from, request),
                    Served {
                        step_id,
                        step: Arc::downgrade(&step),
                        ticket: Arc::clone(&ticket),
                    },
                );
            }
            tracked
        };
        let weak = Arc::downgrade(self);
        let done = Done::Callback(Box::new(move |result| {
            let Some(mgr) = weak.upgrade() else {
                return;
            };
            if tracked && lock(&mgr.served).remove(&(from, request)).is_none() {
                return; // withdrawn by the requester, or the requester died
            }
            let result = result.map_err(|e| RemoteStatus::from_error(&e));
            mgr.respond(from, request, step_id, result);
        }));
        step.recv_local_internal(key, done, Some(&ticket));
    }

    fn respond(
        &self,
        to: NodeId,
        request: node::RequestId,
        step_id: i64,
        result: Result<Received, RemoteStatus>,
    ) {
        let msg = wire::recv_response(request, step_id, result, self.address(to));
        if let Err(reason) = self.outbox.push_reply(msg) {
            warn!(
                to,
                step = step_id,
                "cannot answer RecvTensor request {request}: {reason}"
            );
        }
    }

    /// A RecvTensor response: completes the pull it answers.
    fn answer_pull(
        &self,
        from: NodeId,
        request: node::RequestId,
        result: Result<Received, RemoteStatus>,
    ) {
        let pull = {
            let mut pulls = lock(&self.pulls);
            match pulls.get(&request) {
                Some(p) if p.peer == from => pulls.remove(&request),
                Some(p) => {
                    warn!(
                        from,
                        "RecvTensor response {request} from {} but it was asked of {}; ignored",
                        peer_name(from),
                        peer_name(p.peer)
                    );
                    None
                }
                None => None,
            }
        };
        let Some(pull) = pull else {
            debug!(
                from,
                "late RecvTensor response {request} (withdrawn); ignored"
            );
            return;
        };
        let result = result.map_err(|status| match status.code {
            StatusCode::Aborted => RendezvousError::Aborted(status.message),
            StatusCode::InvalidArgument => RendezvousError::InvalidArgument(status.message),
            StatusCode::Failed => remote_error(pull.step_id, &pull.key, from, status.message),
        });
        pull.done.complete(result);
    }

    /// A value pushed by its producer: into the step's table here.
    fn accept_push(self: &Arc<Self>, from: NodeId, step_id: i64, key: ParsedKey, value: Received) {
        if self.options.protocol == Protocol::Pull {
            // This node's receives ask the producer, which pushes instead: fail the step
            // rather than let them wait for an answer that never comes.
            let reason = format!(
                "it runs the push protocol, node {} the pull protocol; every task of the job \
                 must run the same protocol",
                self.me
            );
            if let Some(step) = self.find_for_peer(step_id) {
                step.start_abort(remote_error(step_id, key.full_key(), from, reason));
            }
            return;
        }
        match self.route(&key) {
            Ok(route) if route.dst == self.me && route.src == from => {}
            Ok(route) => {
                warn!(
                    from,
                    step = step_id,
                    "{} pushed `{key}`, whose source is node {} and destination node {}, to \
                     node {}; ignored",
                    peer_name(from),
                    route.src,
                    route.dst,
                    self.me
                );
                return;
            }
            Err(e) => {
                warn!(from, step = step_id, "pushed value ignored: {e}");
                return;
            }
        }
        match self.find_for_peer(step_id) {
            Some(step) => step.deliver_pushed(key, value),
            None => debug!(
                from,
                "value for `{key}` of step {step_id}, already cleaned up; dropped"
            ),
        }
    }

    /// The requester withdrew `request`.
    fn cancel_served(&self, from: NodeId, request: node::RequestId) {
        let entry = lock(&self.served).remove(&(from, request));
        if let Some(entry) = entry {
            if let Some(step) = entry.step.upgrade() {
                step.cancel(
                    &entry.ticket,
                    RendezvousError::Aborted(format!(
                        "RecvTensor request {request} withdrawn by {}",
                        peer_name(from)
                    )),
                );
            }
        }
    }

    /// Sending to `peer` failed: the calls that depended on those messages fail.
    fn send_failed(&self, peer: NodeId, sent: Vec<Sent>, error: &NodeError) {
        let reason = format!("sending to it failed: {error}");
        warn!(
            peer,
            "rendezvous messages to {} not sent: {error}",
            peer_name(peer)
        );
        for msg in sent {
            match (msg.head, msg.request) {
                (wire::RECV_TENSOR, true) => self.fail_pull(msg.request_id, peer, &reason),
                (wire::PUSH_TENSOR, _) => {
                    let Some((step_id, key)) = wire::peek(&msg.body) else {
                        continue;
                    };
                    if let Some(step) = self.live_step(step_id) {
                        step.start_abort(remote_error(step_id, key, peer, reason.clone()));
                    }
                }
                _ => {}
            }
        }
    }

    /// `node` died (or, when it is this node, the postoffice stopped).
    fn node_failed(&self, node: NodeId, reason: &str) {
        if node == self.me || self.po.is_stopped() {
            self.shut_down(RendezvousError::Aborted(format!(
                "the postoffice of node {} stopped: {reason}",
                self.me
            )));
            return;
        }
        self.fail_peer(node, reason);
    }

    /// `node` can no longer answer: its pulls, the requests it made here and the receives
    /// waiting on its values end.
    fn fail_peer(&self, node: NodeId, reason: &str) {
        let pulls: Vec<PendingPull> = {
            let mut pulls = lock(&self.pulls);
            let ids: Vec<node::RequestId> = pulls
                .iter()
                .filter(|(_, p)| p.peer == node)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter().filter_map(|id| pulls.remove(&id)).collect()
        };
        for pull in pulls {
            let error = remote_error(pull.step_id, &pull.key, node, reason.to_owned());
            pull.done.complete(Err(error));
        }
        let served: Vec<Served> = {
            let mut served = lock(&self.served);
            let ids: Vec<(NodeId, node::RequestId)> =
                served.keys().filter(|(n, _)| *n == node).copied().collect();
            ids.into_iter()
                .filter_map(|id| served.remove(&id))
                .collect()
        };
        for entry in served {
            if let Some(step) = entry.step.upgrade() {
                step.cancel(
                    &entry.ticket,
                    RendezvousError::Aborted(format!("the requester, {}, failed", peer_name(node))),
                );
            }
        }
        let steps = self.all_live_steps();
        for step in steps {
            step.peer_failed(node, reason);
        }
    }
}

/// What a step needs of its manager: the shared state's options and routes, and this
/// module's pushes and pulls.
impl StepHost for MgrInner {
    fn me(&self) -> NodeId {
        self.me
    }

    fn protocol(&self) -> Protocol {
        self.options.protocol
    }

    fn max_deferred_calls(&self) -> usize {
        self.options.max_deferred_calls
    }

    fn route(&self, key: &ParsedKey) -> Result<Route, RendezvousError> {
        MgrInner::route(self, key)
    }

    fn peer_dead(&self, peer: NodeId) -> Option<String> {
        MgrInner::peer_dead(self, peer)
    }

    /// Push mode: sends the value of `key` to its consumer `dst`.
    fn push(
        &self,
        step: &RemoteRendezvous,
        key: &ParsedKey,
        value: Received,
        dst: NodeId,
    ) -> Result<(), RendezvousError> {
        let step_id = step.step_id();
        if let Some(reason) = self.peer_dead(dst) {
            return Err(remote_error(step_id, key.full_key(), dst, reason));
        }
        let msg = wire::push(step_id, key.full_key(), value, self.address(dst));
        self.outbox
            .push(msg)
            .map_err(|reason| remote_error(step_id, key.full_key(), dst, reason))
    }

    /// Pull mode: asks `src` for the value of `key`; `done` gets the answer.
    fn pull(
        &self,
        step: &RemoteRendezvous,
        key: &ParsedKey,
        src: NodeId,
        done: Done,
        ticket: Option<&TicketCell>,
    ) {
        let step_id = step.step_id();
        if let Some(reason) = self.peer_dead(src) {
            let error = remote_error(step_id, key.full_key(), src, reason);
            return finish(done, ticket, Err(error));
        }
        let request = {
            let mut pulls = lock(&self.pulls);
            // Ids wrap after 2^31 requests: skip any still pending, never overwrite it.
            let mut request = self.next_request.fetch_add(1, Ordering::Relaxed);
            while pulls.contains_key(&request) {
                request = self.next_request.fetch_add(1, Ordering::Relaxed);
            }
            pulls.insert(
                request,
                PendingPull {
                    step_id,
                    incarnation: step.incarnation(),
                    key: key.full_key().to_owned(),
                    peer: src,
                    done,
                },
            );
            // Queued under the table's lock, so that an abort that withdraws this request
            // queues its cancel after the request itself.
            let msg = wire::recv_request(request, step_id, key.full_key(), self.address(src));
            if let Err(reason) = self.outbox.push(msg) {
                let pull = pulls.remove(&request);
                drop(pulls);
                if let Some(pull) = pull {
                    let error = remote_error(step_id, key.full_key(), src, reason);
                    finish(pull.done, ticket, Err(error));
                }
                return;
            }
            request
        };
        if let Some(ticket) = ticket {
            let mut cell = lock(ticket);
            if let Ticket::Cancelled(error) = &*cell {
                let error = error.clone();
                *cell = Ticket::Finished;
                drop(cell);
                self.cancel_pull(request, error, true);
                return;
            }
            *cell = Ticket::Remote(request);
        }
        // An abort or a death that came while the request was being placed.
        if let Some(status) = step.status() {
            self.cancel_pull(request, status, true);
        } else if let Some(reason) = self.peer_dead(src) {
            self.fail_pull(request, src, &reason);
        }
    }

    fn cancel_pull(&self, request: node::RequestId, error: RendezvousError) -> bool {
        MgrInner::cancel_pull(self, request, error, true)
    }

    /// The step was aborted: withdraws its pulls.
    fn abort_pulls(&self, step_id: i64, incarnation: u64, status: &RendezvousError) {
        let withdrawn: Vec<(node::RequestId, PendingPull)> = {
            let mut pulls = lock(&self.pulls);
            let ids: Vec<node::RequestId> = pulls
                .iter()
                .filter(|(_, p)| p.step_id == step_id && p.incarnation == incarnation)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| pulls.remove(&id).map(|p| (id, p)))
                .collect()
        };
        for (request, pull) in withdrawn {
            let _ = self
                .outbox
                .push_reply(wire::cancel(request, step_id, self.address(pull.peer)));
            pull.done.complete(Err(status.clone()));
        }
    }
}
