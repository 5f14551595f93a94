//! The provided-buffer ring of one I/O thread: buffers the kernel picks from when a
//! multishot receive has data, so no buffer is tied to a connection until bytes arrive.
//!
//! Ownership: a buffer is in exactly one place — lent to the kernel (`lent[bid]`, the kernel
//! may write it), or taken by the thread after the kernel returned it in a completion. A
//! taken buffer is either given back at once (its bytes were copied out: small chunks),
//! held back while the inbox is full ([`BufRing::hold`]), or becomes the storage of a
//! `Bytes` handed to the application (large chunks, no copy); a held or fresh buffer takes
//! its id when the ring is replenished. The ring memory and the lent
//! buffers are freed only after the ring is unregistered ([`BufRing::unregister`]), which
//! the thread does once no receive is in flight.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::BufRingEntry;
use io_uring::IoUring;

/// The buffer group of the ring (one per io_uring, so every thread uses 0).
pub(crate) const GROUP: u16 = 0;

/// One thread's provided-buffer ring.
pub(crate) struct BufRing {
    ring: NonNull<BufRingEntry>,
    layout: Layout,
    entries: u16,
    /// Our copy of the tail; published to the kernel by [`BufRing::publish`].
    tail: u16,
    /// The buffer lent to the kernel under each id, if any.
    lent: Vec<Option<Vec<u8>>>,
    /// Ids whose buffer was taken and not replaced yet.
    missing: Vec<u16>,
    /// Buffers held back from the kernel (see [`BufRing::hold`]), reused by `replenish`.
    spare: Vec<Vec<u8>>,
    buf_len: usize,
    registered: bool,
}

impl BufRing {
    /// Registers a ring of `entries` buffers of `buf_len` bytes with `uring`.
    pub(crate) fn new(uring: &IoUring, entries: u16, buf_len: usize) -> std::io::Result<BufRing> {
        let size = usize::from(entries) * std::mem::size_of::<BufRingEntry>();
        let layout = Layout::from_size_align(size.max(4096), 4096)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ring = NonNull::new(raw.cast::<BufRingEntry>())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        let mut this = BufRing {
            ring,
            layout,
            entries,
            tail: 0,
            lent: (0..entries).map(|_| None).collect(),
            missing: (0..entries).collect(),
            spare: Vec::new(),
            buf_len,
            registered: false,
        };
        // SAFETY: the ring memory is page-aligned, zeroed, `entries` long, and lives until
        // `unregister` (or is leaked with the ring when the kernel may still use it).
        unsafe {
            uring.submitter().register_buf_ring_with_flags(
                this.ring.as_ptr() as u64,
                entries,
                GROUP,
                0,
            )?;
        }
        this.registered = true;
        this.replenish();
        Ok(this)
    }

    /// Bytes of each buffer (what a single receive into the group may take).
    pub(crate) fn buffer_len(&self) -> u32 {
        u32::try_from(self.buf_len).unwrap_or(u32::MAX)
    }

    /// Buffers currently lent to the kernel.
    pub(crate) fn lent(&self) -> usize {
        usize::from(self.entries) - self.missing.len()
    }

    /// Takes the buffer the kernel returned under `bid`, holding `len` received bytes.
    pub(crate) fn take(&mut self, bid: u16, len: usize) -> Option<Vec<u8>> {
        let mut buf = self.lent.get_mut(usize::from(bid))?.take()?;
        self.missing.push(bid);
        let len = len.min(buf.capacity());
        // SAFETY: the kernel wrote `len` bytes (bounded by the capacity it was given) into
        // this buffer before posting the completion that named it.
        unsafe { buf.set_len(len) };
        Some(buf)
    }

    /// Lends `buf` (its bytes already consumed) to the kernel again under `bid`.
    pub(crate) fn give_back(&mut self, bid: u16, mut buf: Vec<u8>) {
        if let Some(at) = self.missing.iter().position(|b| *b == bid) {
            self.missing.swap_remove(at);
            buf.clear();
            self.lend(bid, buf);
            self.publish();
        }
    }

    /// Keeps `buf` (its bytes already consumed) from the kernel until the next
    /// [`replenish`](Self::replenish): while the inbox is full, a receive that keeps getting
    /// its buffers back would keep reading into memory; this way it runs out of buffers and
    /// ends (`ENOBUFS`), and the socket pushes back on the peer.
    pub(crate) fn hold(&mut self, bid: u16, mut buf: Vec<u8>) {
        if self.missing.contains(&bid) {
            buf.clear();
            self.spare.push(buf);
        }
    }

    /// Lends a buffer (a held one, else a fresh one) for every id whose buffer was taken.
    pub(crate) fn replenish(&mut self) {
        if self.missing.is_empty() {
            return;
        }
        for bid in std::mem::take(&mut self.missing) {
            let buf = self
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(self.buf_len));
            self.lend(bid, buf);
        }
        self.publish();
    }

    fn lend(&mut self, bid: u16, mut buf: Vec<u8>) {
        let mask = self.entries - 1;
        let index = usize::from(self.tail & mask);
        // SAFETY: `index < entries`, inside the ring allocation; only this thread writes
        // entries, and the kernel reads an entry only after the tail is published past it.
        let entry = unsafe { &mut *self.ring.as_ptr().add(index) };
        entry.set_addr(buf.as_mut_ptr() as u64);
        entry.set_len(u32::try_from(buf.capacity()).unwrap_or(u32::MAX));
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
        // The Vec's heap block does not move when the Vec is moved into the table.
        self.lent[usize::from(bid)] = Some(buf);
    }

    fn publish(&mut self) {
        // SAFETY: the tail field overlays the `resv` of entry 0, inside the allocation, and is
        // only written by us; the kernel reads it with acquire semantics, so a release store
        // makes the entries written before it visible.
        unsafe {
            let tail = BufRingEntry::tail(self.ring.as_ptr()) as *const AtomicU16;
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    /// Unregisters the ring; the kernel no longer touches it or its buffers. Call only when
    /// no receive that selects buffers is in flight.
    pub(crate) fn unregister(&mut self, uring: &IoUring) {
        if self.registered {
            if let Err(e) = uring.submitter().unregister_buf_ring(GROUP) {
                tracing::warn!("cannot unregister the provided-buffer ring: {e}");
            }
            self.registered = false;
        }
    }

    /// Gives up on the memory: the kernel may still write it (used when a ring could not be
    /// drained in time at shutdown).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        if self.registered {
            // Still registered: the kernel may use the memory, so it must not be freed.
            tracing::warn!("provided-buffer ring dropped while registered; leaking it");
            std::mem::forget(std::mem::take(&mut self.lent));
            return;
        }
        // SAFETY: allocated in `new` with this layout, not registered any more.
        unsafe { std::alloc::dealloc(self.ring.as_ptr().cast(), self.layout) };
    }
}
