//! What `KvWorker` and `SimpleApp` share about requests in flight: a result that is either
//! handed to whoever waits or kept until someone does, and the `wait` that collects it.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

use node::hash::IntMap;
use node::{NodeError, RequestId, Result};

/// The outcome of one request and its waiter.
#[derive(Debug)]
pub(crate) struct Completion<T> {
    result: Option<Result<T>>,
    waiter: Option<oneshot::Sender<Result<T>>>,
}

impl<T> Default for Completion<T> {
    fn default() -> Self {
        Completion {
            result: None,
            waiter: None,
        }
    }
}

impl<T> Completion<T> {
    /// Hands `result` to the waiter, or keeps it for a later `wait`.
    pub(crate) fn complete(&mut self, result: Result<T>) {
        match self.waiter.take() {
            Some(waiter) => {
                if let Err(unsent) = waiter.send(result) {
                    self.result = Some(unsent);
                }
            }
            None => self.result = Some(result),
        }
    }
}

/// An entry of a table of requests in flight.
pub(crate) trait InFlight<T> {
    /// The entry's completion.
    fn completion(&mut self) -> &mut Completion<T>;
}

pub(crate) fn lock<E>(table: &Mutex<IntMap<RequestId, E>>) -> MutexGuard<'_, IntMap<RequestId, E>> {
    // Map operations only, no await and no call out: a poisoned lock still holds
    // consistent data.
    table.lock().unwrap_or_else(|e| e.into_inner())
}

/// Enters `entry`, a new request, into `table` under a fresh id from `next`, and returns the
/// id. The id is picked and the entry inserted under one lock, so after the ids wrap one
/// still pending is skipped instead of shared.
pub(crate) fn insert_new<E>(
    next: &AtomicI32,
    table: &Mutex<IntMap<RequestId, E>>,
    entry: E,
) -> RequestId {
    let mut pending = lock(table);
    let id = next_free_id(next, &pending);
    pending.insert(id, entry);
    id
}

/// The id for a new request of `table`, advancing `next` (call it with the table's lock
/// held, and insert the request before letting go). Ids count up from 0 and wrap back to 0
/// after `i32::MAX`; an id still in `table` (issued and not yet waited for) is skipped, so a
/// request can never take over another's entry and answers.
fn next_free_id<E>(next: &AtomicI32, table: &IntMap<RequestId, E>) -> RequestId {
    let mut id = next.load(Ordering::Relaxed) & i32::MAX;
    // Of `table.len() + 1` consecutive ids at least one is free: the loop ends by then.
    for _ in 0..=table.len() {
        if !table.contains_key(&id) {
            break;
        }
        id = id.wrapping_add(1) & i32::MAX;
    }
    next.store(id.wrapping_add(1) & i32::MAX, Ordering::Relaxed);
    id
}

/// Waits for request `id` of `table` and removes it. A waiter whose future was dropped (a
/// timeout, a cancelled task) does not block a new `wait`.
pub(crate) async fn wait<T, E: InFlight<T>>(
    table: &Mutex<IntMap<RequestId, E>>,
    id: RequestId,
) -> Result<T> {
    let rx = {
        let mut pending = lock(table);
        let completion = pending
            .get_mut(&id)
            .ok_or(NodeError::UnknownRequest(id))?
            .completion();
        if let Some(result) = completion.result.take() {
            pending.remove(&id);
            return result;
        }
        if completion.waiter.as_ref().is_some_and(|w| !w.is_closed()) {
            return Err(NodeError::InvalidArgument(format!(
                "request {id} is already being waited for"
            )));
        }
        let (tx, rx) = oneshot::channel();
        completion.waiter = Some(tx);
        rx
    };
    let result = rx.await.unwrap_or(Err(NodeError::Stopped));
    lock(table).remove(&id);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_wrap_to_zero_and_skip_those_still_pending() {
        let mut table: IntMap<RequestId, ()> = IntMap::default();
        let next = AtomicI32::new(i32::MAX - 1);
        for id in [i32::MAX - 1, i32::MAX, 0, 2] {
            table.insert(id, ());
        }
        // MAX - 1, MAX and 0 are taken: the counter wraps past them to 1, then skips 2.
        assert_eq!(next_free_id(&next, &table), 1);
        table.insert(1, ());
        assert_eq!(next_free_id(&next, &table), 3);
        // Never negative, whatever the counter holds.
        next.store(i32::MIN, Ordering::Relaxed);
        assert_eq!(next_free_id(&next, &table), 3);
    }

    #[test]
    fn a_new_request_is_entered_under_the_id_it_is_given() {
        let next = AtomicI32::new(i32::MAX);
        let table = Mutex::new(IntMap::default());
        lock(&table).insert(0, "old");
        assert_eq!(insert_new(&next, &table, "max"), i32::MAX);
        // 0 is still pending: the next request skips it.
        assert_eq!(insert_new(&next, &table, "new"), 1);
        let table = lock(&table);
        assert_eq!(
            (table.get(&0), table.get(&i32::MAX), table.get(&1)),
            (Some(&"old"), Some(&"max"), Some(&"new"))
        );
    }
}
