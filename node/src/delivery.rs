//! How data messages reach a node's applications: the [`Customer`] trait they implement,
//! the table of [`Customers`] (with the messages held for applications that have not
//! registered yet), and [`DataQueue`], the data side of the postoffice's dispatch loop.
//!
//! A customer may have to wait to take a data message (a server whose shard queue is full,
//! or whose byte budget is spent); the loop then keeps that delivery in its [`DataQueue`]
//! and goes on reading its inbox, so that the control messages behind it (barrier releases,
//! failure notices) are handled at once, while the data messages read meanwhile queue there,
//! in order, behind the waiting delivery. What queues is bounded ([`MAX_BACKLOG_EVENTS`],
//! [`MAX_BACKLOG_BYTES`]): beyond it the loop stops reading, which pushes back on the senders
//! through the vans.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use async_trait::async_trait;
use tracing::warn;
use van_core::{Event, Message, NodeId};

/// Messages held for applications that have not registered yet, in all.
const MAX_PARKED: usize = 65_536;
/// Payload bytes held for applications that have not registered yet, in all.
const MAX_PARKED_BYTES: usize = 256 << 20;

/// Data messages (and peer-lost events) a dispatch loop reads past a waiting delivery before
/// it stops reading its inbox.
pub(crate) const MAX_BACKLOG_EVENTS: usize = 4096;
/// Payload bytes of the data messages a dispatch loop reads past a waiting delivery before it
/// stops reading its inbox (a server's byte budget is about the frame pool's size: this
/// keeps what waits outside it small beside that).
pub(crate) const MAX_BACKLOG_BYTES: usize = 16 << 20;

/// An application on a node (a `KvWorker`, `KvServer`, `SimpleApp`, or one from another crate
/// such as the rendezvous manager) that receives the data messages addressed to its (app id,
/// customer id). Register one with
/// [`Postoffice::register_customer`](crate::Postoffice::register_customer).
///
/// The postoffice calls `try_deliver` and `deliver` from its dispatch loop, one data message
/// at a time and in arrival order: a customer must hand the message on quickly (queue it,
/// complete a waiter) and never block a thread. A `deliver` that awaits (a full queue) holds
/// back the node's later data messages, for every application, but not its control messages
/// (barrier releases and failure notices are handled meanwhile).
#[async_trait]
pub trait Customer: Send + Sync {
    /// Takes a data message without waiting, when it can: the dispatch loop's fast path,
    /// which costs no boxed future. Returns `None` when it took the message; hands it back
    /// (`Some`) to have it delivered with [`deliver`](Self::deliver) instead, for example
    /// when a queue is full. The default always hands it back.
    fn try_deliver(&self, msg: Message) -> Option<Message> {
        Some(msg)
    }
    /// A data message for this customer (when [`try_deliver`](Self::try_deliver) handed it
    /// back).
    async fn deliver(&self, msg: Message);
    /// `node` failed; fail whatever waits on it. `node` is this node's own id when the local
    /// postoffice stopped.
    fn node_failed(&self, node: NodeId, error: &str);
    /// A new process took the place of `node`, which had failed (recovery): it is reachable
    /// again at its new address, and holds nothing of what the old process held unless the
    /// application restored it. What waited on the old process will not be answered (what
    /// was sent to it and not acknowledged is dropped): the default fails it with
    /// [`node_failed`](Self::node_failed).
    fn node_recovered(&self, node: NodeId) {
        self.node_failed(node, RECOVERED);
    }
    /// The answer that refuses `request`, a request for an application nobody on this node
    /// serves (no customer registered under its ids [`UNSERVED_GRACE`] after it came), when
    /// the request is of this customer's protocol (a key-value server refuses key-value
    /// requests); `reason` names what this node serves. `None` (the default): not its kind,
    /// and the request stays held for an application that may register later.
    fn refusal(&self, request: &Message, reason: &str) -> Option<Message> {
        let _ = (request, reason);
        None
    }
}

/// How long a request for an application this node does not serve is held before a
/// registered application of its protocol refuses it ([`Customer::refusal`]): applications
/// registered one after another at start-up are not refused meanwhile, and a caller with the
/// wrong application id hears so at once instead of at its timeout.
pub const UNSERVED_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Why requests to a node that a new process replaced fail.
pub const RECOVERED: &str = "replaced by a new process before it answered";

/// A node's applications by (app id, customer id), and the messages held for those that
/// have not registered yet.
#[derive(Default)]
pub(crate) struct Customers {
    registered: HashMap<(i32, i32), Arc<dyn Customer>>,
    /// Messages that arrived before their application registered (or while it was taking
    /// over its backlog: new messages queue behind the backlog, so order is kept).
    parked: HashMap<(i32, i32), Vec<Message>>,
    /// Applications still being handed their backlog.
    draining: HashSet<(i32, i32)>,
    /// Payload bytes held in `parked`, across all applications.
    parked_bytes: usize,
    /// Ids with requests held and a refusal sweep to come ([`Customers::take_unserved`]).
    unserved: HashSet<(i32, i32)>,
    /// Ids whose first held request is still to be reported (the postoffice then arms a
    /// sweep for them).
    newly_unserved: Vec<(i32, i32)>,
}

impl Customers {
    /// The customer `msg` is for, with the message; `None` when the message was held for an
    /// application that has not registered yet or is still taking its backlog (or dropped,
    /// with a warning, when too much is held already).
    pub(crate) fn route(&mut self, msg: Message) -> Option<(Arc<dyn Customer>, Message)> {
        let key = (msg.meta.app_id, msg.meta.customer_id);
        match self.registered.get(&key) {
            Some(c) if !self.draining.contains(&key) => return Some((Arc::clone(c), msg)),
            _ => {}
        }
        let size = msg.data_len();
        let held: usize = self.parked.values().map(Vec::len).sum();
        // Registered and still taking its backlog, or nobody's.
        let unserved = !self.registered.contains_key(&key);
        if msg.meta.request && unserved && self.unserved.insert(key) {
            warn!(
                app = key.0,
                customer = key.1,
                from = ?msg.meta.sender,
                "a request for an application this node does not serve is held ({}) until one \
                 registers; an application of its protocol here refuses it after {:?}",
                self.served(),
                UNSERVED_GRACE
            );
            self.newly_unserved.push(key);
        }
        if held < MAX_PARKED && self.parked_bytes + size <= MAX_PARKED_BYTES {
            self.parked_bytes += size;
            self.parked.entry(key).or_default().push(msg);
        } else {
            warn!(
                app = key.0,
                customer = key.1,
                from = ?msg.meta.sender,
                "dropping a message for an application that is not registered \
                 (too many held already)"
            );
        }
        None
    }

    /// What this node serves, for a message: `it serves application 0 (customer 0)`.
    fn served(&self) -> String {
        let mut keys: Vec<&(i32, i32)> = self.registered.keys().collect();
        keys.sort();
        let keys: Vec<String> = keys
            .iter()
            .map(|(app, customer)| format!("application {app} (customer {customer})"))
            .collect();
        match keys.is_empty() {
            true => "it serves no application yet".into(),
            false => format!("it serves {}", keys.join(", ")),
        }
    }

    /// The ids whose first held request came since the last call: the postoffice sweeps
    /// each [`UNSERVED_GRACE`] later ([`refuse`](Self::refuse)).
    pub(crate) fn take_unserved(&mut self) -> Vec<(i32, i32)> {
        std::mem::take(&mut self.newly_unserved)
    }

    /// The answers refusing the requests held under `key` when still nobody serves it, from
    /// the registered applications of their protocol (the refused requests are no longer
    /// held); what none refuses stays held, and requests among it are swept again one
    /// [`UNSERVED_GRACE`] later (an application that can refuse them may register
    /// meanwhile).
    pub(crate) fn refuse(&mut self, key: (i32, i32)) -> Vec<Message> {
        self.unserved.remove(&key);
        if self.registered.contains_key(&key) {
            return Vec::new();
        }
        let Some(held) = self.parked.remove(&key) else {
            return Vec::new();
        };
        let reason = format!(
            "no application {} (customer {}) on this node: {}; check the application id on \
             both sides",
            key.0,
            key.1,
            self.served()
        );
        let mut answers = Vec::new();
        let mut kept = Vec::new();
        for msg in held {
            let answer = msg
                .meta
                .request
                .then(|| {
                    self.registered
                        .values()
                        .find_map(|c| c.refusal(&msg, &reason))
                })
                .flatten();
            match answer {
                Some(answer) => {
                    self.parked_bytes = self.parked_bytes.saturating_sub(msg.data_len());
                    answers.push(answer);
                }
                None => kept.push(msg),
            }
        }
        if kept.iter().any(|m| m.meta.request) {
            self.unserved.insert(key);
            self.newly_unserved.push(key);
        }
        if !kept.is_empty() {
            self.parked.insert(key, kept);
        }
        answers
    }

    /// Registers `customer` under `key`; false when another application holds it. Messages
    /// for it are held behind its backlog until [`take_backlog`](Self::take_backlog) finds
    /// none left.
    pub(crate) fn register(&mut self, key: (i32, i32), customer: Arc<dyn Customer>) -> bool {
        if self.registered.contains_key(&key) {
            return false;
        }
        self.registered.insert(key, customer);
        self.draining.insert(key);
        true
    }

    /// The messages held for `key`, oldest first; `None` once there are none left, after
    /// which the application gets its messages directly.
    pub(crate) fn take_backlog(&mut self, key: (i32, i32)) -> Option<Vec<Message>> {
        let backlog = self.parked.remove(&key).unwrap_or_default();
        if backlog.is_empty() {
            self.draining.remove(&key);
            return None;
        }
        let bytes: usize = backlog.iter().map(Message::data_len).sum();
        self.parked_bytes = self.parked_bytes.saturating_sub(bytes);
        Some(backlog)
    }

    /// Forgets the application under `key` (later messages for it are held as for one not
    /// registered yet); false when none was.
    pub(crate) fn unregister(&mut self, key: (i32, i32)) -> bool {
        self.draining.remove(&key);
        self.registered.remove(&key).is_some()
    }

    /// Every registered application.
    pub(crate) fn all(&self) -> Vec<Arc<dyn Customer>> {
        self.registered.values().cloned().collect()
    }

    /// Forgets every application and every held message.
    pub(crate) fn clear(&mut self) {
        *self = Customers::default();
    }
}

/// A customer's delivery of one data message that could not finish at once.
type Delivery = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The data side of a dispatch loop: the delivery that waits, if any, and the events read
/// after it. Peer-lost events queue with the data: they must not overtake the messages that
/// the lost peer sent before its connection went. Each event is queued with a number the
/// loop gives it when it reads it (the lost peer's incarnation then, so a loss can be told
/// from a loss of the process that replaced it meanwhile).
#[derive(Default)]
pub(crate) struct DataQueue {
    waiting: Option<Delivery>,
    backlog: VecDeque<(Event, u64)>,
    bytes: usize,
}

impl DataQueue {
    /// Nothing waits and nothing is queued: the next data event can be delivered at once.
    pub(crate) fn is_idle(&self) -> bool {
        self.waiting.is_none() && self.backlog.is_empty()
    }

    /// Whether the loop may read more of its inbox.
    pub(crate) fn has_room(&self) -> bool {
        self.backlog.len() < MAX_BACKLOG_EVENTS && self.bytes < MAX_BACKLOG_BYTES
    }

    /// Hands `msg` to `customer`: on its fast path, else through its `deliver`, which is
    /// kept here if it cannot finish at once (most finish on their first poll).
    pub(crate) async fn start(&mut self, customer: Arc<dyn Customer>, msg: Message) {
        let Some(msg) = customer.try_deliver(msg) else {
            return;
        };
        let mut delivery: Delivery = Box::pin(async move { customer.deliver(msg).await });
        let first = std::future::poll_fn(|cx| Poll::Ready(delivery.as_mut().poll(cx)));
        if first.await.is_pending() {
            self.waiting = Some(delivery);
        }
    }

    /// Queues a data event, with the loop's number for it, behind the waiting delivery.
    pub(crate) fn push(&mut self, event: Event, read_as: u64) {
        self.bytes += event_bytes(&event);
        self.backlog.push_back((event, read_as));
    }

    /// The oldest queued event and its number, once nothing waits.
    pub(crate) fn pop(&mut self) -> Option<(Event, u64)> {
        if self.waiting.is_some() {
            return None;
        }
        let (event, read_as) = self.backlog.pop_front()?;
        self.bytes = self.bytes.saturating_sub(event_bytes(&event));
        Some((event, read_as))
    }

    /// Finishes the waiting delivery (at once if there is none). Cancel-safe: dropped
    /// unfinished, the delivery stays here and goes on at the next call.
    pub(crate) async fn finish_waiting(&mut self) {
        if let Some(delivery) = self.waiting.as_mut() {
            delivery.await;
        }
        self.waiting = None;
    }
}

fn event_bytes(event: &Event) -> usize {
    match event {
        Event::Message(msg) => msg.data_len() + msg.meta.body.len(),
        Event::PeerLost(_) => 0,
    }
}
