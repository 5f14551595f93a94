//! [`ByteBudget`]: how many bytes of large frames may wait in one peer's send queue.
//!
//! A send queue bounded only by its number of frames lets a burst of large frames pile up
//! gigabytes (4096 frames of 4 MiB) ahead of everything sent after them: memory grows, and a
//! small request queued behind them waits for all of it to be written without any goodput
//! gained (the socket was already full). With a budget, a large frame's sender waits until
//! the frames ahead of it have been written down to the budget; small frames (below
//! [`SMALL_FRAME`]) never wait for it, so what they queue behind is bounded by the
//! budget, whatever the depth of large requests in flight.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::wire::Frame;

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
struct Held {
    permit: Option<OwnedSemaphorePermit>,
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

    /// Waits until a frame of `len` bytes fits (at once for a small frame); the frame holds
    /// what it took until the returned value is dropped. A frame larger than the whole budget
    /// takes all of it.
    async fn reserve(&self, len: usize) -> Held {
        if self.is_exempt(len) {
            return Held { permit: None };
        }
        let take = u32::try_from(len.min(self.capacity)).unwrap_or(u32::MAX);
        // The semaphore is never closed, so the acquire cannot fail; if it ever did, the frame
        // would go out without holding budget rather than not at all.
        Held {
            permit: Arc::clone(&self.bytes).acquire_many_owned(take).await.ok(),
        }
    }

    /// Whether a frame of `len` bytes takes nothing from the budget (a small frame, or no
    /// byte limit), so queueing it never waits for bytes.
    pub fn is_exempt(&self, len: usize) -> bool {
        len < SMALL_FRAME || self.capacity == Semaphore::MAX_PERMITS
    }

    /// Waits until `frame` (its encoded parts) fits, then ties what it takes to the frame's
    /// own bytes: the budget comes back when the van drops the last of them, whenever that is
    /// (after the kernel's completion, for a van that lends buffers to it). No byte is
    /// copied.
    pub async fn attach(&self, mut frame: Frame) -> Frame {
        let len = frame.iter().map(Bytes::len).sum();
        let held = self.reserve(len).await;
        if held.permit.is_some() {
            if let Some(last) = frame.iter_mut().rev().find(|part| !part.is_empty()) {
                let bytes = std::mem::take(last);
                *last = Bytes::from_owner(Budgeted { bytes, _held: held });
            }
        }
        frame
    }

    /// Bytes of large frames that could be queued now without waiting.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

/// A frame's part that holds the frame's budget for as long as it lives.
struct Budgeted {
    bytes: Bytes,
    _held: Held,
}

impl AsRef<[u8]> for Budgeted {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn large_frames_wait_for_room_small_ones_never_do() {
        let budget = ByteBudget::new(8 << 20);
        let a = budget.reserve(4 << 20).await;
        let b = budget.reserve(4 << 20).await;
        assert_eq!(budget.available(), 0);
        // A third large frame waits...
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move { drop(budget.reserve(4 << 20).await) })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        // ...a small one does not.
        let small = budget.reserve(100).await;
        assert!(small.permit.is_none());
        // Writing one frame makes room for the next.
        drop(a);
        waiting.await.unwrap();
        drop(b);
        assert_eq!(budget.available(), 8 << 20);
        // A frame larger than the budget takes all of it rather than waiting forever.
        let huge = budget.reserve(64 << 20).await;
        assert_eq!(budget.available(), 0);
        drop(huge);
        assert_eq!(budget.available(), 8 << 20);
    }

    #[tokio::test]
    async fn an_attached_frame_holds_its_budget_until_its_parts_are_dropped() {
        let budget = ByteBudget::new(4 << 20);
        let payload = Bytes::from(vec![5u8; 3 << 20]);
        let frame =
            smallvec::smallvec![Bytes::from_static(b"header"), payload.clone(), Bytes::new()];
        let frame = budget.attach(frame).await;
        assert_eq!(budget.available(), (4 << 20) - (3 << 20) - 6);
        // The same bytes, not a copy.
        assert_eq!(frame[1].as_ptr(), payload.as_ptr());
        let kept = frame[1].slice(10..20);
        drop(frame);
        // A slice the van still holds keeps the budget taken.
        assert!(budget.available() < 4 << 20);
        drop(kept);
        assert_eq!(budget.available(), 4 << 20);
        // Small frames take nothing.
        let small = budget
            .attach(smallvec::smallvec![Bytes::from_static(b"tiny")])
            .await;
        assert_eq!(budget.available(), 4 << 20);
        drop(small);
    }
}
