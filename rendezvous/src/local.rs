//! [`LocalRendezvous`]: the table where sends meet receives inside one task, as TensorFlow's
//! `LocalRendezvous`.
//!
//! Each key has a FIFO queue that holds either values nobody has asked for yet or receivers
//! waiting for values, never both: a send hands its value to the oldest waiter if there is
//! one, otherwise queues it; a receive takes the oldest value if there is one, otherwise
//! queues itself. The queue's type makes the mixed state unrepresentable, and a property
//! test drives random interleavings against a model.
//!
//! ```
//! use bytes::Bytes;
//! use rendezvous::{create_key, parse_key, LocalRendezvous, Rendezvous};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let table = LocalRendezvous::new();
//! let key = parse_key(&create_key("/cpu:0", 1, "/cpu:0", "x", (0, 0))).unwrap();
//! let later = table.recv(&key); // queued: no value yet
//! table.send(&key, Bytes::from_static(b"hello"), false).unwrap(); // never blocks
//! assert_eq!(later.await.unwrap().value, Bytes::from_static(b"hello"));
//! # });
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;
use van_core::rendezvous::Received;
use van_core::rendezvous::{DoneCallback, RecvFuture};
use van_core::{ParsedKey, Rendezvous, RendezvousError};

/// Identifies a queued receive within one [`LocalRendezvous`], for cancelling it.
pub type WaiterId = u64;

/// A waiter queue of a key is pruned of abandoned receives (dropped futures) when it reaches
/// this length and at every doubling after, so that receives which time out again and again
/// on a key that never gets a value do not accumulate.
pub(crate) const PRUNE_FROM: usize = 64;

/// How a receive is answered: a callback, or a channel whose reader may have gone away.
pub(crate) enum Done {
    /// [`Rendezvous::recv_async`]'s callback, called exactly once.
    Callback(DoneCallback),
    /// A future's channel; a closed channel means the future was dropped, and a value is
    /// then handed to the next waiter instead of being lost.
    Channel(oneshot::Sender<Result<Received, RendezvousError>>),
}

impl Done {
    /// Delivers the result (outside any lock: a callback runs user code).
    pub(crate) fn complete(self, result: Result<Received, RendezvousError>) {
        match self {
            Done::Callback(done) => done(result),
            Done::Channel(tx) => {
                // A closed channel: the receive was abandoned; nobody to tell.
                let _ = tx.send(result);
            }
        }
    }

    /// Whether nobody waits for the answer any more (a dropped future).
    pub(crate) fn is_abandoned(&self) -> bool {
        matches!(self, Done::Channel(tx) if tx.is_closed())
    }
}

impl std::fmt::Debug for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Done::Callback(_) => f.write_str("Done::Callback"),
            Done::Channel(tx) => write!(f, "Done::Channel(closed: {})", tx.is_closed()),
        }
    }
}

struct Waiter {
    id: WaiterId,
    done: Done,
}

/// A key's queue: values or waiters, never both, never empty (an empty queue is removed).
enum Queue {
    Values(VecDeque<Received>),
    Waiters(VecDeque<Waiter>),
}

#[derive(Default)]
struct Table {
    /// Set by the first `start_abort`; every later call gets it.
    status: Option<RendezvousError>,
    queues: HashMap<String, Queue>,
    next_waiter: WaiterId,
}

/// What a key's queue holds, from [`LocalRendezvous::queued`]; at most one field is non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Queued {
    /// Values sent and not yet received.
    pub values: usize,
    /// Receives waiting for a value (including abandoned ones not yet pruned).
    pub waiters: usize,
}

/// The rendezvous table of one task: [`send`](Rendezvous::send) never blocks,
/// [`recv_async`](Rendezvous::recv_async) completes its callback exactly once (at once when
/// the value is there, otherwise from the thread that sends it), and
/// [`start_abort`](Rendezvous::start_abort) fails every pending and later call with its
/// status. Values keep their dead-tensor flag ([`Received::is_dead`]).
///
/// Values are buffered without a bound, as in TensorFlow: a step's producer runs ahead of its
/// consumer by design, and the step's cleanup (which aborts the table) frees what is left.
#[derive(Default)]
pub struct LocalRendezvous {
    table: Mutex<Table>,
}

impl std::fmt::Debug for LocalRendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let table = self.lock();
        f.debug_struct("LocalRendezvous")
            .field("keys", &table.queues.len())
            .field("status", &table.status)
            .finish()
    }
}

impl LocalRendezvous {
    /// An empty table.
    pub fn new() -> LocalRendezvous {
        LocalRendezvous::default()
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Every critical section is a few queue operations with no call out (callbacks run
        // after the guard is dropped), so a poisoned lock still holds a consistent table.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `value` available under `key` (the string form of a [`ParsedKey`]).
    pub(crate) fn send_str(&self, key: &str, value: Received) -> Result<(), RendezvousError> {
        let mut item = value;
        let mut table = self.lock();
        if let Some(status) = &table.status {
            return Err(status.clone());
        }
        loop {
            let Some(queue) = table.queues.get_mut(key) else {
                table
                    .queues
                    .insert(key.to_owned(), Queue::Values(VecDeque::from([item])));
                return Ok(());
            };
            let waiters = match queue {
                Queue::Values(values) => {
                    values.push_back(item);
                    return Ok(());
                }
                Queue::Waiters(waiters) => waiters,
            };
            let Some(waiter) = waiters.pop_front() else {
                // Unreachable by the invariant (empty queues are removed); repair it.
                table.queues.remove(key);
                continue;
            };
            if waiters.is_empty() {
                table.queues.remove(key);
            }
            match waiter.done {
                Done::Channel(tx) => match tx.send(Ok(item)) {
                    Ok(()) => return Ok(()),
                    // The future was dropped: the value goes to the next waiter, or the queue.
                    Err(Ok(back)) => item = back,
                    Err(Err(_)) => return Ok(()),
                },
                Done::Callback(done) => {
                    drop(table);
                    done(Ok(item));
                    return Ok(());
                }
            }
        }
    }

    /// Queues a receive of `key`, or answers it at once. Returns the waiter's id when it was
    /// queued (for [`cancel_waiter`](Self::cancel_waiter)), `None` when it was answered (or
    /// abandoned before it could be).
    pub(crate) fn recv_waiter(&self, key: &str, done: Done) -> Option<WaiterId> {
        let mut guard = self.lock();
        if let Some(status) = &guard.status {
            let status = status.clone();
            drop(guard);
            done.complete(Err(status));
            return None;
        }
        if done.is_abandoned() {
            return None;
        }
        let table = &mut *guard;
        let value = match table.queues.get_mut(key) {
            Some(Queue::Values(values)) => {
                let value = values.pop_front();
                if values.is_empty() {
                    table.queues.remove(key);
                }
                value
            }
            _ => None,
        };
        let Some(value) = value else {
            return Some(Self::push_waiter(table, key, done));
        };
        match done {
            Done::Channel(tx) => {
                if let Err(Ok(back)) = tx.send(Ok(value)) {
                    // Dropped just now: put the value back where it was.
                    match table.queues.get_mut(key) {
                        Some(Queue::Values(values)) => values.push_front(back),
                        _ => {
                            table
                                .queues
                                .insert(key.to_owned(), Queue::Values(VecDeque::from([back])));
                        }
                    }
                }
            }
            Done::Callback(callback) => {
                // Release the lock before running user code.
                drop(guard);
                callback(Ok(value));
            }
        }
        None
    }

    fn push_waiter(table: &mut Table, key: &str, done: Done) -> WaiterId {
        let id = table.next_waiter;
        table.next_waiter = table.next_waiter.wrapping_add(1);
        let waiter = Waiter { id, done };
        match table.queues.get_mut(key) {
            Some(Queue::Waiters(waiters)) => {
                if waiters.len() >= PRUNE_FROM && waiters.len().is_power_of_two() {
                    waiters.retain(|w| !w.done.is_abandoned());
                }
                waiters.push_back(waiter);
            }
            _ => {
                table
                    .queues
                    .insert(key.to_owned(), Queue::Waiters(VecDeque::from([waiter])));
            }
        }
        id
    }

    /// Removes the queued receive `id` of `key` and completes it with `error`. Returns false
    /// when it is no longer queued (it was answered, or aborted).
    pub(crate) fn cancel_waiter(&self, key: &str, id: WaiterId, error: RendezvousError) -> bool {
        let mut table = self.lock();
        let Some(Queue::Waiters(waiters)) = table.queues.get_mut(key) else {
            return false;
        };
        let Some(at) = waiters.iter().position(|w| w.id == id) else {
            return false;
        };
        let waiter = waiters.remove(at);
        if waiters.is_empty() {
            table.queues.remove(key);
        }
        drop(table);
        if let Some(waiter) = waiter {
            waiter.done.complete(Err(error));
        }
        true
    }

    /// Whether the receive `id` of `key` is still waiting (neither answered nor withdrawn).
    pub(crate) fn is_waiting(&self, key: &str, id: WaiterId) -> bool {
        match self.lock().queues.get(key) {
            Some(Queue::Waiters(waiters)) => waiters.iter().any(|w| w.id == id),
            _ => false,
        }
    }

    /// Receives `key`, failing with [`RendezvousError::DeadlineExceeded`] if no value arrives
    /// before `deadline` (`None`: wait until a value arrives or the table is aborted). A
    /// receive that times out is withdrawn, so it does not consume a later value.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rendezvous::{create_key, parse_key, LocalRendezvous, RendezvousError};
    /// use tokio::time::Instant;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let table = LocalRendezvous::new();
    /// let key = parse_key(&create_key("/cpu:0", 1, "/cpu:0", "never-sent", (0, 0))).unwrap();
    /// let deadline = Instant::now() + Duration::from_millis(10);
    /// let result = table.recv_with_deadline(&key, Some(deadline)).await;
    /// assert!(matches!(result, Err(RendezvousError::DeadlineExceeded { .. })));
    /// # });
    /// ```
    pub async fn recv_with_deadline(
        &self,
        key: &ParsedKey,
        deadline: Option<Instant>,
    ) -> Result<Received, RendezvousError> {
        let (tx, mut rx) = oneshot::channel();
        let id = self.recv_waiter(key.full_key(), Done::Channel(tx));
        let Some(deadline) = deadline else {
            return rx.await.unwrap_or_else(|_| Err(dropped(key)));
        };
        match tokio::time::timeout_at(deadline, &mut rx).await {
            Ok(result) => result.unwrap_or_else(|_| Err(dropped(key))),
            Err(_) => {
                let expired = RendezvousError::DeadlineExceeded {
                    key: key.full_key().to_owned(),
                };
                if let Some(id) = id {
                    self.cancel_waiter(key.full_key(), id, expired.clone());
                }
                // A value that arrived between the deadline and the withdrawal is kept.
                rx.try_recv().unwrap_or(Err(expired))
            }
        }
    }

    /// What `key`'s queue holds now.
    pub fn queued(&self, key: &str) -> Queued {
        match self.lock().queues.get(key) {
            None => Queued::default(),
            Some(Queue::Values(values)) => Queued {
                values: values.len(),
                waiters: 0,
            },
            Some(Queue::Waiters(waiters)) => Queued {
                values: 0,
                waiters: waiters.len(),
            },
        }
    }

    /// Every key with a non-empty queue and what it holds, sorted by key.
    pub fn snapshot(&self) -> Vec<(String, Queued)> {
        let table = self.lock();
        let mut keys: Vec<(String, Queued)> = table
            .queues
            .iter()
            .map(|(key, queue)| {
                let queued = match queue {
                    Queue::Values(v) => Queued {
                        values: v.len(),
                        waiters: 0,
                    },
                    Queue::Waiters(w) => Queued {
                        values: 0,
                        waiters: w.len(),
                    },
                };
                (key.clone(), queued)
            })
            .collect();
        keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        keys
    }

    /// The abort status, once [`start_abort`](Rendezvous::start_abort) has run.
    pub fn status(&self) -> Option<RendezvousError> {
        self.lock().status.clone()
    }
}

/// Receives still waiting when the table goes are failed, so that `recv_async` callbacks
/// run exactly once (as TensorFlow's `~LocalRendezvousImpl` aborts a non-empty table).
impl Drop for LocalRendezvous {
    fn drop(&mut self) {
        let table = self.table.get_mut().unwrap_or_else(|e| e.into_inner());
        if table
            .queues
            .values()
            .any(|queue| matches!(queue, Queue::Waiters(_)))
        {
            self.start_abort(RendezvousError::Aborted(
                "the rendezvous table was dropped while receives were waiting".to_owned(),
            ));
        }
    }
}

fn dropped(key: &ParsedKey) -> RendezvousError {
    RendezvousError::Aborted(format!(
        "the rendezvous dropped the receive of `{}` without answering",
        key.full_key()
    ))
}

impl Rendezvous for LocalRendezvous {
    fn send(&self, key: &ParsedKey, value: Bytes, is_dead: bool) -> Result<(), RendezvousError> {
        self.send_str(
            key.full_key(),
            Received {
                value,
                is_dead,
                header: Bytes::new(),
            },
        )
    }

    fn recv_async(&self, key: &ParsedKey, done: DoneCallback) {
        self.recv_waiter(key.full_key(), Done::Callback(done));
    }

    /// The first abort wins: its status is kept and given to every pending and later call;
    /// queued values are dropped.
    fn start_abort(&self, error: RendezvousError) {
        let queues = {
            let mut table = self.lock();
            if table.status.is_none() {
                table.status = Some(error);
            }
            std::mem::take(&mut table.queues)
        };
        let status = self
            .status()
            .unwrap_or_else(|| RendezvousError::Aborted("the rendezvous was aborted".to_owned()));
        for queue in queues.into_values() {
            if let Queue::Waiters(waiters) = queue {
                for waiter in waiters {
                    waiter.done.complete(Err(status.clone()));
                }
            }
        }
    }

    /// As the trait's, but a dropped future gives up its place: a value sent later goes to
    /// the next receiver instead of being lost.
    fn recv(&self, key: &ParsedKey) -> RecvFuture {
        let (tx, rx) = oneshot::channel();
        self.recv_waiter(key.full_key(), Done::Channel(tx));
        RecvFuture::new(key.full_key(), rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::time::Duration;
    use van_core::rendezvous::{create_key, parse_key};

    fn key(name: &str) -> ParsedKey {
        parse_key(&create_key("/cpu:0", 7, "/gpu:0", name, (0, 0))).unwrap()
    }

    fn value(n: u8) -> Bytes {
        Bytes::from(vec![n; usize::from(n % 5)])
    }

    #[tokio::test]
    async fn a_send_before_the_receive_is_kept_and_fifo_per_key() {
        let table = LocalRendezvous::new();
        let (a, b) = (key("a"), key("b"));
        for n in 0..3 {
            table.send(&a, value(n), n == 1).unwrap();
        }
        table.send(&b, value(9), false).unwrap();
        assert_eq!(
            table.queued(a.full_key()),
            Queued {
                values: 3,
                waiters: 0
            }
        );
        for n in 0..3 {
            let got = table.recv(&a).await.unwrap();
            assert_eq!((got.value, got.is_dead), (value(n), n == 1));
        }
        assert_eq!(table.recv(&b).await.unwrap().value, value(9));
        assert!(table.snapshot().is_empty());
    }

    #[tokio::test]
    async fn waiters_are_served_in_order_and_callbacks_run_once() {
        let table = Arc::new(LocalRendezvous::new());
        let k = key("w");
        let calls = Arc::new(Mutex::new(Vec::new()));
        for i in 0..3 {
            let calls = Arc::clone(&calls);
            table.recv_async(
                &k,
                Box::new(move |r| calls.lock().unwrap().push((i, r.unwrap().value))),
            );
        }
        assert_eq!(
            table.queued(k.full_key()),
            Queued {
                values: 0,
                waiters: 3
            }
        );
        for n in 0..3 {
            table.send(&k, value(n + 1), false).unwrap();
        }
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls, vec![(0, value(1)), (1, value(2)), (2, value(3))]);
        assert_eq!(table.queued(k.full_key()), Queued::default());
    }

    #[tokio::test]
    async fn abort_fails_pending_and_later_calls_with_the_first_status() {
        let table = LocalRendezvous::new();
        let k = key("x");
        let pending = table.recv(&k);
        table.send(&key("other"), value(1), false).unwrap();
        table.start_abort(RendezvousError::Aborted("first".into()));
        table.start_abort(RendezvousError::Aborted("second".into()));
        assert_eq!(pending.await, Err(RendezvousError::Aborted("first".into())));
        assert_eq!(
            table.send(&k, value(1), false),
            Err(RendezvousError::Aborted("first".into()))
        );
        assert_eq!(
            table.recv(&key("other")).await,
            Err(RendezvousError::Aborted("first".into()))
        );
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        table.recv_async(&k, Box::new(move |r| tx.send(r).unwrap()));
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            Err(RendezvousError::Aborted("first".into()))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_expires_and_the_expired_receive_takes_no_later_value() {
        let table = LocalRendezvous::new();
        let k = key("late");
        let deadline = Instant::now() + Duration::from_secs(3);
        assert_eq!(
            table.recv_with_deadline(&k, Some(deadline)).await,
            Err(RendezvousError::DeadlineExceeded {
                key: k.full_key().to_owned()
            })
        );
        assert_eq!(Instant::now(), deadline);
        assert_eq!(table.queued(k.full_key()), Queued::default());
        table.send(&k, value(3), false).unwrap();
        assert_eq!(table.queued(k.full_key()).values, 1);
        let got = table
            .recv_with_deadline(&k, Some(Instant::now() + Duration::from_secs(1)))
            .await
            .unwrap();
        assert_eq!(got.value, value(3));
    }

    #[tokio::test]
    async fn a_dropped_future_gives_its_value_to_the_next_receiver() {
        let table = LocalRendezvous::new();
        let k = key("d");
        let abandoned = table.recv(&k);
        let kept = table.recv(&k);
        drop(abandoned);
        table.send(&k, value(4), false).unwrap();
        assert_eq!(kept.await.unwrap().value, value(4));
        // With only an abandoned receiver, the value stays in the table.
        drop(table.recv(&k));
        table.send(&k, value(2), false).unwrap();
        assert_eq!(
            table.queued(k.full_key()),
            Queued {
                values: 1,
                waiters: 0
            }
        );
    }

    #[test]
    fn dropping_the_table_completes_waiting_callbacks() {
        // `recv_async` calls its callback exactly once, even when the table goes away first.
        let table = LocalRendezvous::new();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        table.recv_async(&key("orphan"), Box::new(move |r| tx.send(r).unwrap()));
        drop(table);
        assert!(
            matches!(
                rx.recv_timeout(Duration::from_secs(5)),
                Ok(Err(RendezvousError::Aborted(_)))
            ),
            "the callback of a receive waiting in a dropped table was never called"
        );
    }

    #[test]
    fn abandoned_waiters_do_not_pile_up() {
        let table = LocalRendezvous::new();
        let k = key("pile");
        for _ in 0..10_000 {
            drop(table.recv(&k));
        }
        assert!(table.queued(k.full_key()).waiters < 2 * PRUNE_FROM);
    }

    #[test]
    fn cancel_removes_only_the_named_waiter() {
        let table = LocalRendezvous::new();
        let k = key("c");
        let (tx, rx) = std::sync::mpsc::sync_channel(2);
        let tx2 = tx.clone();
        let first = table
            .recv_waiter(
                k.full_key(),
                Done::Callback(Box::new(move |r| tx.send(r).unwrap())),
            )
            .unwrap();
        table
            .recv_waiter(
                k.full_key(),
                Done::Callback(Box::new(move |r| tx2.send(r).unwrap())),
            )
            .unwrap();
        let error = RendezvousError::Aborted("cancelled".into());
        assert!(table.cancel_waiter(k.full_key(), first, error.clone()));
        assert!(!table.cancel_waiter(k.full_key(), first, error.clone()));
        assert_eq!(rx.recv().unwrap(), Err(error));
        table.send(&k, value(1), false).unwrap();
        assert_eq!(rx.recv().unwrap().unwrap().value, value(1));
    }

    /// One step of a random interleaving.
    #[derive(Debug, Clone)]
    enum Op {
        Send(usize, u8),
        /// A receive answered through a callback.
        Recv(usize),
        /// A receive through a future that is dropped before any value arrives.
        Abandon(usize),
        /// Cancels the oldest live callback receive of the key, if any.
        Cancel(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..3usize, any::<u8>()).prop_map(|(k, v)| Op::Send(k, v)),
            4 => (0..3usize).prop_map(Op::Recv),
            1 => (0..3usize).prop_map(Op::Abandon),
            1 => (0..3usize).prop_map(Op::Cancel),
        ]
    }

    proptest! {
        /// Under any interleaving, each key's queue holds only values or only waiters, values
        /// reach live receivers in send order, and nothing is lost or duplicated.
        #[test]
        fn a_queue_holds_only_values_or_only_waiters(ops in proptest::collection::vec(op(), 1..200)) {
            let table = LocalRendezvous::new();
            let keys: Vec<ParsedKey> = (0..3).map(|i| key(&format!("k{i}"))).collect();
            let got: Arc<Mutex<Vec<(usize, usize, u8)>>> = Arc::default();
            // The model: per key, values not yet received, and live waiters (by receive
            // number, with their waiter id).
            let mut model_values: Vec<VecDeque<u8>> = vec![VecDeque::new(); 3];
            let mut model_waiters: Vec<VecDeque<(usize, WaiterId)>> = vec![VecDeque::new(); 3];
            let mut expected: Vec<(usize, usize, u8)> = Vec::new();
            let mut receives = 0usize;
            for op in ops {
                match op {
                    Op::Send(k, v) => {
                        table.send(&keys[k], Bytes::from(vec![v]), false).unwrap();
                        match model_waiters[k].pop_front() {
                            Some((n, _)) => expected.push((k, n, v)),
                            None => model_values[k].push_back(v),
                        }
                    }
                    Op::Recv(k) => {
                        let n = receives;
                        receives += 1;
                        let got = Arc::clone(&got);
                        let id = table.recv_waiter(keys[k].full_key(), Done::Callback(Box::new(move |r| {
                            // Cancelled receives are answered with an error; record values only.
                            if let Ok(r) = r {
                                got.lock().unwrap().push((k, n, r.value[0]));
                            }
                        })));
                        match model_values[k].pop_front() {
                            Some(v) => {
                                prop_assert!(id.is_none());
                                expected.push((k, n, v));
                            }
                            None => model_waiters[k].push_back((n, id.unwrap())),
                        }
                    }
                    Op::Abandon(k) => {
                        drop(table.recv(&keys[k]));
                        // With values queued, the future took one and dropped it with itself
                        // (it was answered at once); otherwise it left an abandoned waiter.
                        if model_values[k].pop_front().is_some() {
                            receives += 1;
                        }
                    }
                    Op::Cancel(k) => {
                        if let Some((_, id)) = model_waiters[k].pop_front() {
                            let cancelled = table.cancel_waiter(
                                keys[k].full_key(), id, RendezvousError::Aborted("x".into()));
                            prop_assert!(cancelled);
                        }
                    }
                }
                for (k, key) in keys.iter().enumerate() {
                    let queued = table.queued(key.full_key());
                    prop_assert!(queued.values == 0 || queued.waiters == 0, "{queued:?}");
                    prop_assert_eq!(queued.values, model_values[k].len());
                    // Abandoned waiters may still be queued; live ones are all there.
                    prop_assert!(queued.waiters >= model_waiters[k].len());
                }
            }
            prop_assert_eq!(got.lock().unwrap().clone(), expected);
        }
    }
}
