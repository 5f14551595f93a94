//! Buffers that come back: a collective sends a copy of each slice to a van, and the mesh
//! reads each frame into a buffer; a fresh allocation per slice costs page faults and
//! zeroing (a fifth of the CPU time of a large all-reduce over the vans; three times the
//! time of a 1 MiB all-reduce over the mesh). A buffer returns here when the van has
//! written it, or the collective has consumed the frame (the last `Bytes` is dropped), and
//! the next slice reuses it.

use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

/// Bytes of buffers kept for reuse: up to what a collective had in flight at once. A ring
/// over the mesh holds about a rank's chunk of frames of the next hop while it finishes the
/// current one (128 MiB for a 256 MiB all-reduce on 2 ranks); returned to the system, that
/// memory is faulted in again by the next collective of the size.
const KEEP_BYTES: usize = 256 << 20;

/// A pool of send and frame buffers; see the [module docs](self).
#[derive(Default)]
pub(crate) struct SendPool {
    free: Mutex<Free>,
}

/// The buffers kept, and their capacity in all.
#[derive(Default)]
struct Free {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl SendPool {
    /// A copy of `data`, in a reused buffer when one is free.
    pub(crate) fn copy(self: &Arc<Self>, data: &[u8]) -> Bytes {
        let mut vec = self.take();
        vec.extend_from_slice(data);
        self.wrap(vec)
    }

    /// An empty buffer, reused when one is free (its capacity kept).
    pub(crate) fn take(&self) -> Vec<u8> {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let vec = free.buffers.pop();
            free.bytes -= vec.as_ref().map_or(0, Vec::capacity);
            vec
        };
        let mut vec = reused.unwrap_or_default();
        vec.clear();
        vec
    }

    /// `vec` as `Bytes` that come back to this pool when the last of them is dropped.
    pub(crate) fn wrap(self: &Arc<Self>, vec: Vec<u8>) -> Bytes {
        Bytes::from_owner(Recycled {
            vec,
            pool: Arc::downgrade(self),
        })
    }
}

/// A buffer on its way through a van; back to its pool when dropped.
struct Recycled {
    vec: Vec<u8>,
    pool: Weak<SendPool>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.vec
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            let mut free = pool.free.lock().unwrap_or_else(|e| e.into_inner());
            let bytes = free.bytes + self.vec.capacity();
            if bytes <= KEEP_BYTES {
                free.buffers.push(std::mem::take(&mut self.vec));
                free.bytes = bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_and_are_reused() {
        let pool = Arc::new(SendPool::default());
        let a = pool.copy(&[1, 2, 3]);
        assert_eq!(&a[..], &[1, 2, 3]);
        let at = a.as_ptr();
        drop(a);
        let b = pool.copy(&[4, 5]);
        assert_eq!(&b[..], &[4, 5]);
        assert_eq!(b.as_ptr(), at, "the first buffer was not reused");
        // Slices keep the buffer out of the pool until the last one goes.
        let c = b.slice(1..);
        drop(b);
        assert_eq!(&c[..], &[5]);
        assert!(pool
            .free
            .lock()
            .map(|f| f.buffers.is_empty())
            .unwrap_or(false));
        drop(c);
        assert_eq!(pool.free.lock().map(|f| f.buffers.len()).unwrap_or(0), 1);
    }

    #[test]
    fn the_pool_keeps_buffers_up_to_its_byte_budget() {
        let pool = Arc::new(SendPool::default());
        // Capacity only: the pages are never touched.
        let third = KEEP_BYTES / 3 + 1;
        let held: Vec<Bytes> = (0..3)
            .map(|_| pool.wrap(Vec::with_capacity(third)))
            .collect();
        drop(held);
        let kept = |pool: &SendPool| {
            let free = pool.free.lock().unwrap_or_else(|e| e.into_inner());
            (free.buffers.len(), free.bytes)
        };
        assert_eq!(kept(&pool), (2, 2 * third));
        // Taking one gives its bytes back to the budget.
        let vec = pool.take();
        assert!(vec.capacity() >= third && vec.is_empty());
        assert_eq!(kept(&pool), (1, third));
    }
}
