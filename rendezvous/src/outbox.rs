//! The outbox: messages waiting for the manager's single sender task, with a bound on their
//! bytes. Rendezvous callbacks may run on any thread and the postoffice calls the customer
//! from its dispatch loop, so nothing sends directly: messages are queued here, without
//! blocking, and the sender task (in `transport`) drains them into the postoffice in order.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;
use van_core::Message;

use crate::sync::lock;

/// Messages waiting for the sender task, with a bound on their bytes.
pub(crate) struct Outbox {
    state: Mutex<OutboxState>,
    notify: Notify,
    max_bytes: usize,
}

#[derive(Default)]
struct OutboxState {
    queue: VecDeque<Message>,
    bytes: usize,
    closed: bool,
}

fn message_bytes(msg: &Message) -> usize {
    msg.data_len() + msg.meta.body.len()
}

impl Outbox {
    /// An empty outbox refusing bounded messages beyond `max_bytes`.
    pub(crate) fn new(max_bytes: usize) -> Outbox {
        Outbox {
            state: Mutex::new(OutboxState::default()),
            notify: Notify::new(),
            max_bytes,
        }
    }

    /// Queues `msg`; fails (with the reason) when the outbox is closed or full.
    pub(crate) fn push(&self, msg: Message) -> Result<(), String> {
        self.queue(msg, true)
    }

    /// Queues an answer to a peer's request or a cancel, past the byte bound: refusing an
    /// answer would lose its value (it already left the table, so queueing it adds no memory)
    /// and leave the requester waiting; refusing a cancel would leave a withdrawn receive at
    /// the owner, to swallow a later value. Each is bounded by a request of the peer's or of
    /// this task's. Fails only when the outbox is closed.
    pub(crate) fn push_reply(&self, msg: Message) -> Result<(), String> {
        self.queue(msg, false)
    }

    fn queue(&self, msg: Message, bounded: bool) -> Result<(), String> {
        let size = message_bytes(&msg);
        {
            let mut state = lock(&self.state);
            if state.closed {
                return Err("the rendezvous manager is shutting down".into());
            }
            if bounded && state.bytes > 0 && state.bytes + size > self.max_bytes {
                return Err(format!(
                    "{} bytes are already queued for sending (RendezvousMgrBuilder::\
                     max_outbox_bytes is {}): the network does not keep up",
                    state.bytes, self.max_bytes
                ));
            }
            state.bytes += size;
            state.queue.push_back(msg);
        }
        self.notify.notify_one();
        Ok(())
    }

    /// Refuses every later message and wakes the sender, which drains what is queued.
    pub(crate) fn close(&self) {
        lock(&self.state).closed = true;
        self.notify.notify_one();
    }

    /// Bytes queued and not yet taken by the sender.
    pub(crate) fn bytes(&self) -> usize {
        lock(&self.state).bytes
    }

    /// Everything queued, once there is something; `None` when closed and drained.
    pub(crate) async fn next_batch(&self) -> Option<VecDeque<Message>> {
        loop {
            {
                let mut state = lock(&self.state);
                if !state.queue.is_empty() {
                    state.bytes = 0;
                    return Some(std::mem::take(&mut state.queue));
                }
                if state.closed {
                    return None;
                }
            }
            self.notify.notified().await;
        }
    }
}
