//! [`ByteBudget`]: how many bytes of large frames may wait in one peer's send queue.
//!
//! A send queue bounded only by its number of frames lets a burst of large frames pile up
//! gigabytes (4096 frames of 4 MiB) ahead of everything sent after them: memory grows, and a
//! small request queued behind them waits for all of it to be written without any goodput
//! gained (the socket was already full). With a budget, a large frame's sender waits until
//! the frames ahead of it have been written down to the budget; small frames (below
//! [`ByteBudget::small`]) never wait for it, so what they queue behind is bounded by the
//! budget, whatever the depth of large requests in flight.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes of large frames a peer's queue holds by default.
pub const DEFAULT_BUDGET_BYTES: usize = 32 << 20;
/// Frames below this size are small: they do not count against the budget.
pub const SMALL_FRAME: usize = 64 << 10;

/// The budget of one peer's send queue; cheap to clone (clones share the budget).
#[derive(Clone, Debug)]
pub struct ByteBudget {
    bytes: Arc<Semaphore>,
    capacity: usize,
}

/// Budget held by a queued frame, given back when dropped (once the frame is written).
#[derive(Debug)]
pub struct Held {
    _bytes: Option<OwnedSemaphorePermit>,
}

impl ByteBudget {
    /// A budget of `bytes` (at least one small frame's worth; 0 means unlimited).
    pub fn new(bytes: usize) -> ByteBudget {
        let capacity = if bytes == 0 {
            Semaphore::MAX_PERMITS
        } else {
            bytes.clamp(SMALL_FRAME, Semaphore::MAX_PERMITS)
        };
        ByteBudget {
            bytes: Arc::new(Semaphore::new(capacity)),
            capacity,
        }
    }

    /// The size from which a frame counts against the budget.
    pub fn small(&self) -> usize {
        SMALL_FRAME
    }

    /// Waits until a frame of `len` bytes fits (at once for a small frame); the frame holds
    /// what it took until the returned value is dropped. A frame larger than the whole budget
    /// takes all of it. Ends with `None` only if the budget was closed.
    pub async fn reserve(&self, len: usize) -> Option<Held> {
        if len < SMALL_FRAME {
            return Some(Held { _bytes: None });
        }
        let take = u32::try_from(len.min(self.capacity)).unwrap_or(u32::MAX);
        match Arc::clone(&self.bytes).acquire_many_owned(take).await {
            Ok(permit) => Some(Held {
                _bytes: Some(permit),
            }),
            Err(_) => None,
        }
    }

    /// Bytes of large frames that could be queued now without waiting.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }

    /// Wakes every sender waiting for room with `None` (the connection is gone).
    pub fn close(&self) {
        self.bytes.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn large_frames_wait_for_room_small_ones_never_do() {
        let budget = ByteBudget::new(8 << 20);
        let a = budget.reserve(4 << 20).await.unwrap();
        let b = budget.reserve(4 << 20).await.unwrap();
        assert_eq!(budget.available(), 0);
        // A third large frame waits...
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.reserve(4 << 20).await.map(drop) })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        // ...a small one does not.
        let small = budget.reserve(100).await;
        assert!(small.is_some());
        // Writing one frame makes room for the next.
        drop(a);
        assert!(waiting.await.unwrap().is_some());
        drop(b);
        assert_eq!(budget.available(), 8 << 20);
        // A frame larger than the budget takes all of it rather than waiting forever.
        let huge = budget.reserve(64 << 20).await.unwrap();
        assert_eq!(budget.available(), 0);
        drop(huge);
        budget.close();
        assert!(budget.reserve(1 << 20).await.is_none());
    }
}
