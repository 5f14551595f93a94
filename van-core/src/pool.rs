//! [`FramePool`]: buffers for large received frames, reused instead of freshly allocated.
//!
//! A fresh multi-megabyte allocation is new memory: the kernel maps it page by page as the
//! first bytes land, a page fault per 4 KiB (about a thousand for a 4 MiB frame), and gives it
//! back when it is freed. A stream van that reads 1–4 MiB frames back to back spends much of
//! its time there. The pool keeps buffers whose frames the application has dropped and hands
//! them out again, already mapped.
//!
//! A frame read into a pooled buffer becomes [`Bytes`] whose owner returns the buffer to the
//! pool when the last slice of the frame is dropped (the message and every segment the
//! application kept), so reuse never touches bytes still in use. The pool is bounded: at most
//! [`FramePool::max_bytes`] of idle buffers; a buffer that does not fit is freed.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;

/// Idle bytes a pool keeps by default.
pub const DEFAULT_POOL_BYTES: usize = 64 << 20;

/// Buffers of received frames, shared by a van's connections; cheap to clone.
#[derive(Clone, Debug)]
pub struct FramePool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    max_bytes: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Idle buffers (empty, with their capacity).
    idle: Vec<Vec<u8>>,
    /// Capacity of the idle buffers, in all.
    idle_bytes: usize,
    stats: PoolStats,
}

/// What a pool has done, for tests and diagnostics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers handed out that were newly allocated.
    pub allocated: u64,
    /// Buffers handed out that were reused.
    pub reused: u64,
    /// Buffers that came back and were kept.
    pub returned: u64,
    /// Buffers that came back and were freed (the pool was full).
    pub dropped: u64,
}

impl FramePool {
    /// A pool keeping at most `max_bytes` of idle buffers.
    pub fn new(max_bytes: usize) -> FramePool {
        FramePool {
            inner: Arc::new(Inner {
                max_bytes,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The most idle bytes this pool keeps.
    pub fn max_bytes(&self) -> usize {
        self.inner.max_bytes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.inner)
    }

    /// An empty buffer with room for at least `capacity` bytes: the smallest idle one that is
    /// large enough, else a new one.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        let mut state = self.lock();
        let best = state
            .idle
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= capacity)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let buffer = state.idle.swap_remove(i);
                state.idle_bytes -= buffer.capacity();
                state.stats.reused += 1;
                buffer
            }
            None => {
                state.stats.allocated += 1;
                drop(state);
                Vec::with_capacity(capacity)
            }
        }
    }

    /// `buffer` as [`Bytes`] (no copy) that give it back to this pool once the last slice of
    /// them is dropped.
    pub fn freeze(&self, buffer: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buffer,
            pool: Arc::downgrade(&self.inner),
        })
    }

    /// What the pool has done so far.
    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// Idle buffers and their bytes.
    pub fn idle(&self) -> (usize, usize) {
        let state = self.lock();
        (state.idle.len(), state.idle_bytes)
    }
}

impl Default for FramePool {
    fn default() -> Self {
        FramePool::new(DEFAULT_POOL_BYTES)
    }
}

fn lock(inner: &Inner) -> MutexGuard<'_, State> {
    // A few vector operations, no call out: a poisoned lock still holds consistent data.
    inner.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pooled buffer lent out as [`Bytes`]; goes back on drop.
struct Pooled {
    buffer: Vec<u8>,
    pool: Weak<Inner>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        // The pool is gone with its van: the buffer is simply freed.
        let Some(inner) = self.pool.upgrade() else {
            return;
        };
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.clear();
        let mut state = lock(&inner);
        if state.idle_bytes + buffer.capacity() <= inner.max_bytes {
            state.idle_bytes += buffer.capacity();
            state.idle.push(buffer);
            state.stats.returned += 1;
        } else {
            state.stats.dropped += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_the_last_slice_is_dropped_and_is_reused() {
        let pool = FramePool::new(16 << 20);
        let mut buffer = pool.take(4 << 20);
        buffer.extend(std::iter::repeat_n(7u8, 4 << 20));
        let address = buffer.as_ptr();
        let frame = pool.freeze(buffer);
        let segment = frame.slice(100..200);
        drop(frame);
        // A segment still holds the frame: nothing is back yet.
        assert_eq!(pool.idle(), (0, 0));
        assert!(segment.iter().all(|b| *b == 7));
        drop(segment);
        assert_eq!(pool.idle().0, 1);
        // The next frame of that size gets the same, already mapped, memory.
        let again = pool.take(3 << 20);
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty());
        assert_eq!(
            pool.stats(),
            PoolStats {
                allocated: 1,
                reused: 1,
                returned: 1,
                dropped: 0
            }
        );
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound_and_picks_the_smallest_fit() {
        let pool = FramePool::new(5 << 20);
        let small = pool.freeze(pool.take(1 << 20));
        let large = pool.freeze(pool.take(4 << 20));
        let extra = pool.freeze(pool.take(2 << 20));
        drop((small, large));
        // 1 + 4 MiB kept; the 2 MiB buffer no longer fits under 5 MiB.
        drop(extra);
        let stats = pool.stats();
        assert_eq!((stats.returned, stats.dropped), (2, 1));
        assert!(pool.idle().1 <= 5 << 20);
        // 512 KiB is served by the 1 MiB buffer, not the 4 MiB one.
        assert!(pool.take(512 << 10).capacity() < 4 << 20);
        assert!(pool.take(3 << 20).capacity() >= 4 << 20);
        assert_eq!(pool.idle(), (0, 0));
    }

    #[test]
    fn buffers_outliving_their_pool_are_freed() {
        let pool = FramePool::new(1 << 20);
        let frame = pool.freeze(vec![1u8; 1000]);
        drop(pool);
        assert_eq!(&frame[..3], &[1, 1, 1]);
        drop(frame);
    }
}
