//! [`SharedBuf`]: a message buffer allocated in memory a van can send without copying.
//!
//! A van whose peers can read the sender's memory (shared memory between co-located
//! processes; registered memory for RDMA) offers buffers through [`Van::alloc`]. The caller
//! fills the buffer, [`freeze`](SharedBuf::freeze)s it into [`Bytes`] and sends those bytes
//! as a data segment; the van recognises them and passes a reference instead of the payload.
//! Sent to any other peer (or through another van), the same `Bytes` are ordinary bytes.
//!
//! [`Van::alloc`]: crate::Van::alloc

use std::fmt;
use std::ptr::NonNull;

use bytes::Bytes;

use crate::message::VanKind;

/// Keeps a [`SharedBuf`]'s memory allocated; dropped when the last `Bytes` made from the
/// buffer is gone, which is when the owner may reuse the memory (once peers let go too).
pub trait BufOwner: Send + Sync + 'static {}

/// A writable buffer in memory owned by a van (see the [module docs](self)).
pub struct SharedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Whose memory this is (`None`: ordinary heap memory).
    van: Option<VanKind>,
    /// Held only to keep the memory allocated; dropped with the last `Bytes`.
    _owner: Box<dyn BufOwner>,
}

// SAFETY: `SharedBuf` is the only handle to its `len` bytes until `freeze` (the allocator
// hands each range out once and reuses it only after the owner is dropped), so moving it to
// another thread moves exclusive access with it, like a `Vec<u8>`; the owner is `Send`.
unsafe impl Send for SharedBuf {}
// SAFETY: `&SharedBuf` only gives `&[u8]` (via `as_slice`), which is sound to share.
unsafe impl Sync for SharedBuf {}

/// The memory a van shares with co-located processes (the IPC van's arena), as a process
/// on the same host can map it: through `/proc/<pid>/fd/<fd>`, a sealed memfd mapped at
/// `start` in this process for `len` bytes. Buffers from [`Van::alloc`](crate::Van::alloc)
/// that lie in it can be read by such a process where they are, without a copy (the
/// collective crate's shared-memory all-reduce does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedRegion {
    /// The memfd's descriptor number in this process.
    pub fd: i32,
    /// Where this process maps it (an address, for comparisons only).
    pub start: usize,
    /// Its length in bytes.
    pub len: usize,
}

impl SharedRegion {
    /// The offset of `len` bytes at `at` in the region, when they lie wholly in it.
    pub fn offset_of(&self, at: *const u8, len: usize) -> Option<usize> {
        let offset = (at as usize).checked_sub(self.start)?;
        (offset.checked_add(len)? <= self.len).then_some(offset)
    }
}

impl SharedBuf {
    /// A zeroed buffer in ordinary memory: what callers use when no van offers memory it
    /// can send without copying. Any van sends it (by copying).
    pub fn heap(len: usize) -> SharedBuf {
        let mut memory = vec![0u8; len].into_boxed_slice();
        let ptr = NonNull::new(memory.as_mut_ptr()).unwrap_or(NonNull::dangling());
        SharedBuf {
            ptr,
            len,
            van: None,
            // Moving the box does not move its bytes: `ptr` stays valid while it lives.
            _owner: Box::new(Heap(memory)),
        }
    }

    /// Wraps `len` bytes at `ptr` in memory of the van `van`, kept allocated by `owner`.
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as `owner` lives,
    /// and no one else may read or write those bytes until this buffer is frozen and sent
    /// (the allocator must not hand the range out again before `owner` is dropped).
    pub unsafe fn from_raw_parts(
        ptr: NonNull<u8>,
        len: usize,
        van: VanKind,
        owner: Box<dyn BufOwner>,
    ) -> Self {
        SharedBuf {
            ptr,
            len,
            van: Some(van),
            _owner: owner,
        }
    }

    /// The van whose memory holds the buffer, or `None` for [`SharedBuf::heap`] memory.
    pub fn van(&self) -> Option<VanKind> {
        self.van
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, to read.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: by the contract of `from_raw_parts`, `ptr` is valid for `len` bytes while
        // `owner` (held by `self`) lives, and no one else writes them.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Turns the filled buffer into [`Bytes`] (no copy). Slices and clones of the result
    /// keep the memory allocated; the van that allocated it sends them by reference.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(Frozen(self))
    }
}

impl fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("van", &self.van)
            .finish_non_exhaustive()
    }
}

/// Heap memory for [`SharedBuf::heap`].
struct Heap(#[allow(dead_code)] Box<[u8]>);

impl BufOwner for Heap {}

/// A frozen buffer: read-only from now on.
struct Frozen(SharedBuf);

impl AsRef<[u8]> for Frozen {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Counted(Arc<AtomicUsize>, #[allow(dead_code)] Box<[u8]>);
    impl BufOwner for Counted {}
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn frozen_bytes_keep_the_owner_until_the_last_slice_is_dropped() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut memory = vec![0u8; 16].into_boxed_slice();
        let ptr = NonNull::new(memory.as_mut_ptr()).expect("a box is never null");
        // SAFETY: the box lives inside the owner, so `ptr` stays valid; nobody else uses it.
        let mut buf = unsafe {
            SharedBuf::from_raw_parts(
                ptr,
                16,
                VanKind::InProcess,
                Box::new(Counted(Arc::clone(&dropped), memory)),
            )
        };
        buf.as_mut_slice().copy_from_slice(&[7u8; 16]);
        let bytes = buf.freeze();
        let slice = bytes.slice(4..8);
        assert_eq!(bytes.as_ptr(), ptr.as_ptr().cast_const());
        drop(bytes);
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        assert_eq!(&slice[..], &[7u8; 4]);
        drop(slice);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn heap_buffers_are_zeroed_and_belong_to_no_van() {
        let mut buf = SharedBuf::heap(5);
        assert_eq!(buf.van(), None);
        assert_eq!(buf.as_slice(), &[0; 5]);
        buf.as_mut_slice()[4] = 9;
        assert_eq!(&buf.freeze()[..], &[0, 0, 0, 0, 9]);
        assert!(SharedBuf::heap(0).freeze().is_empty());
    }

    #[test]
    fn a_region_locates_only_what_lies_wholly_in_it() {
        let region = SharedRegion {
            fd: 3,
            start: 4096,
            len: 8192,
        };
        assert_eq!(region.offset_of(4096 as *const u8, 8192), Some(0));
        assert_eq!(region.offset_of(8192 as *const u8, 16), Some(4096));
        assert_eq!(region.offset_of(8192 as *const u8, 4097), None);
        assert_eq!(region.offset_of(4095 as *const u8, 1), None);
        assert_eq!(region.offset_of(usize::MAX as *const u8, 2), None);
    }
}
