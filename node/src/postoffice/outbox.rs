//! The scheduler's outboxes: one ordered queue of what it sends to each node, carried out by a
//! task of that node's own.
//!
//! The scheduler used to send from the loop that decided: its dispatch loop (answers to
//! heartbeats, barrier releases) and its timer (the verdicts on silent nodes). A send that must
//! dial first (a node that just registered, a route that broke) waits out the connect timeout
//! (10 s) when the node's host is cut off, and the loop waited with it: the heartbeats of every
//! other node went unanswered, so their leases ran out, and the verdict on the cut-off node
//! came 10 s late (found by `vans-soak --network`, one-way cuts, and by a TensorFlow job whose
//! client process hosts the scheduler). Now a loop posts and goes on; a node that cannot be
//! reached holds up only what goes to that node.
//!
//! Order is kept per node. A [`Post::Connect`] (a node registered: a first process, or a new one
//! in a dead one's place) starts a new queue for the node; what the queue before it still held
//! was meant for the process before and is dropped, and a dial to that process that is under
//! way does not hold up the new queue.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tracing::warn;
use van_core::{Message, Node, NodeId};

/// One thing the scheduler does towards a node.
#[derive(Debug)]
pub(super) enum Post {
    /// Connect to the node (it registered); starts the node's queue afresh.
    Connect(Node),
    /// Send a message to the node.
    Send(Message),
}

impl std::fmt::Display for Post {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Post::Connect(node) => write!(f, "connect to {node}"),
            Post::Send(msg) => f.write_str(&msg.summary()),
        }
    }
}

/// How many posts a node's queue holds. The scheduler sends a node a few messages per
/// heartbeat; a queue this full is one's to a node it has not reached for many heartbeats,
/// which the heartbeat timeout declares dead: further posts to it are dropped (and logged).
pub(super) const CAPACITY: usize = 1024;

/// A node's queue: the sending side, and which of the node's queues it is.
struct Queue {
    generation: u64,
    tx: mpsc::Sender<Post>,
    /// Whether a post was dropped for want of room (logged once per queue).
    overflowed: bool,
}

#[derive(Default)]
struct State {
    queues: HashMap<NodeId, Queue>,
    /// Posts queued or being carried out, over every queue.
    pending: usize,
    /// The generation the next new queue gets.
    next: u64,
}

/// The receiving side of a new queue, for the task that carries it out.
pub(super) struct NewQueue {
    /// Which of the node's queues this is ([`Outboxes::is_current`]).
    pub(super) generation: u64,
    pub(super) rx: mpsc::Receiver<Post>,
}

/// Every node's queue; see the [module docs](self).
#[derive(Default)]
pub(super) struct Outboxes {
    state: Mutex<State>,
    /// Woken when nothing is pending any more.
    idle: Notify,
}

impl Outboxes {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A few map operations per critical section, no call out: poison leaves it consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `post` for node `to`. Returns the new queue when one was started (the caller
    /// runs a task that carries it out): for a node's first post, and for every
    /// [`Post::Connect`].
    pub(super) fn post(&self, to: NodeId, post: Post) -> Option<NewQueue> {
        let mut state = self.lock();
        let post = match (&post, state.queues.get_mut(&to)) {
            (Post::Send(_), Some(queue)) => match queue.tx.try_send(post) {
                Ok(()) => {
                    state.pending += 1;
                    return None;
                }
                Err(mpsc::error::TrySendError::Full(post)) => {
                    if !std::mem::replace(&mut queue.overflowed, true) {
                        warn!(
                            peer = to,
                            "{CAPACITY} messages wait for node {to}, which cannot be reached: \
                             dropping {post} and what else does not fit (logged once)"
                        );
                    }
                    return None;
                }
                // Its task ended (the postoffice is stopping): a new queue takes it.
                Err(mpsc::error::TrySendError::Closed(post)) => post,
            },
            _ => post,
        };
        let generation = state.next;
        state.next += 1;
        let (tx, rx) = mpsc::channel(CAPACITY);
        // Cannot fail: the queue is new and `rx` alive.
        let _ = tx.try_send(post);
        state.pending += 1;
        // Replacing the queue drops the old sender: its task drains it (dropping what is
        // left, no longer current) and ends.
        state.queues.insert(
            to,
            Queue {
                generation,
                tx,
                overflowed: false,
            },
        );
        Some(NewQueue { generation, rx })
    }

    /// Whether queue `generation` is still node `to`'s (what it holds is for the process the
    /// node is now).
    pub(super) fn is_current(&self, to: NodeId, generation: u64) -> bool {
        self.lock()
            .queues
            .get(&to)
            .is_some_and(|q| q.generation == generation)
    }

    /// One post was carried out (or dropped).
    pub(super) fn done(&self) {
        let mut state = self.lock();
        state.pending = state.pending.saturating_sub(1);
        if state.pending == 0 {
            self.idle.notify_waiters();
        }
    }

    /// Waits until every post has been carried out, at most `limit`; whether they were.
    pub(super) async fn flushed(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.idle.notified();
                tokio::pin!(idle);
                // Registered before looking, so a `done` in between still wakes us.
                idle.as_mut().enable();
                if self.lock().pending == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send() -> Post {
        Post::Send(Message::default())
    }

    #[test]
    fn sends_share_a_queue_and_a_connect_starts_a_new_one() {
        let boxes = Outboxes::default();
        // The receivers live on, as their tasks would.
        let first = boxes
            .post(9, send())
            .expect("a node's first post starts its queue");
        assert_eq!(first.generation, 0);
        assert!(
            boxes.post(9, send()).is_none(),
            "a second send joins the queue"
        );
        assert!(boxes.is_current(9, 0));
        // Another node has its own queue.
        let other = boxes.post(11, send()).expect("another node's queue");
        assert_eq!(other.generation, 1);
        // A new process in node 9's place: a new queue; the old one is no longer current.
        let node = Node::new(van_core::Role::Worker, "h", 1);
        let new = boxes
            .post(9, Post::Connect(node))
            .expect("a connect starts a queue");
        assert_eq!(new.generation, 2);
        assert!(!boxes.is_current(9, 0));
        assert!(boxes.is_current(9, 2));
        // The old queue holds its two posts and then ends: its sender went.
        let mut old = first.rx;
        assert!(old.try_recv().is_ok() && old.try_recv().is_ok());
        assert!(matches!(
            old.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn flushed_waits_for_every_post_and_gives_up_at_its_limit() {
        let boxes = Outboxes::default();
        assert!(
            boxes.flushed(Duration::from_secs(1)).await,
            "nothing pending"
        );
        let _queue = boxes.post(9, send());
        let _ = boxes.post(9, send());
        assert!(!boxes.flushed(Duration::from_secs(1)).await, "two pending");
        boxes.done();
        boxes.done();
        assert!(boxes.flushed(Duration::from_secs(1)).await);
    }

    #[test]
    fn a_full_queue_drops_what_comes_next_and_counts_only_what_it_holds() {
        let boxes = Outboxes::default();
        let _queue = boxes.post(9, send()).expect("a new queue");
        for _ in 1..CAPACITY + 10 {
            assert!(boxes.post(9, send()).is_none());
        }
        assert_eq!(boxes.lock().pending, CAPACITY);
    }

    #[test]
    fn a_queue_whose_task_ended_is_started_again() {
        let boxes = Outboxes::default();
        let queue = boxes.post(9, send());
        drop(queue);
        let again = boxes.post(9, send());
        assert_eq!(again.map(|q| q.generation), Some(1));
    }
}
