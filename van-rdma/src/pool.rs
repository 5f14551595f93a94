//! Registered memory for large messages, kept for reuse: the registration cache.
//!
//! Registering memory pins its pages and programs the NIC, which costs far more than copying
//! a few kilobytes, so the van registers large buffers once and reuses them. Buffers come in
//! power-of-two size classes (at least [`MIN_CLASS`]); a buffer whose last user is gone (the
//! receiver dropped the `Bytes` of a message written into it, a send completed from it)
//! returns to its class's free list still registered, and the next message of that size
//! reuses it: repeated pushes of the same key cost no registration after the first. The pool
//! keeps at most `VANS_RDMA_POOL_BYTES` registered; beyond that, free buffers of other sizes
//! are released, and when every kept buffer is in use a buffer is registered for the one
//! message and released after it.
//!
//! The pool also answers "is this memory registered?" for data segments the application
//! filled in a buffer from [`Van::alloc`](van_core::Van::alloc): those are written to the
//! peer straight from where they are, with no staging copy.

use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::verbs::{Mr, Pd, Sge};

/// Smallest buffer the pool hands out (smaller messages travel in the receive rings).
pub const MIN_CLASS: usize = 64 << 10;

/// Counters of a pool, for tests and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Buffers registered so far (pooled or one-off).
    pub registrations: u64,
    /// Buffers handed out again without registering.
    pub reuses: u64,
    /// Bytes registered and kept by the pool now (free or in use).
    pub kept_bytes: usize,
}

/// A pool of registered buffers; see the [module docs](self).
pub struct Pool {
    pd: Arc<Pd>,
    cap: usize,
    state: Mutex<PoolState>,
    registrations: AtomicU64,
    reuses: AtomicU64,
}

#[derive(Default)]
struct PoolState {
    free: HashMap<usize, Vec<Region>>,
    /// Bytes of pooled regions (free or leased).
    kept: usize,
    /// Every live region: start address → (length, lkey).
    ranges: BTreeMap<usize, (usize, u32)>,
}

/// One registered buffer.
struct Region {
    mr: Mr,
    /// Its class, or 0 for a one-off registration.
    class: usize,
}

/// A buffer taken from the pool; it goes back when dropped.
pub struct Lease {
    region: Option<Region>,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("addr", &self.addr())
            .field("len", &self.len())
            .finish()
    }
}

impl Pool {
    /// A pool keeping at most `cap` bytes registered with `pd`.
    pub fn new(pd: Arc<Pd>, cap: usize) -> Arc<Pool> {
        Arc::new(Pool {
            pd,
            cap,
            state: Mutex::new(PoolState::default()),
            registrations: AtomicU64::new(0),
            reuses: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // Map operations only: a poisoned lock still holds consistent data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A registered buffer of at least `len` bytes (zeroed when new; when reused it holds
    /// what it held before).
    pub fn take(self: &Arc<Self>, len: usize) -> std::io::Result<Lease> {
        let class = len
            .max(MIN_CLASS)
            .checked_next_power_of_two()
            .unwrap_or(len);
        let mut evicted = Vec::new();
        let pooled = {
            let mut state = self.lock();
            if let Some(region) = state.free.get_mut(&class).and_then(Vec::pop) {
                self.reuses.fetch_add(1, Ordering::Relaxed);
                return Ok(self.lease(region));
            }
            // Make room by releasing free buffers of other sizes.
            // Saturating: `class` may be a peer-announced length near `usize::MAX`.
            while state.kept.saturating_add(class) > self.cap {
                let Some(other) = state.free.values_mut().find_map(Vec::pop) else {
                    break;
                };
                state.kept -= other.class;
                state.ranges.remove(&(other.mr.ptr().as_ptr() as usize));
                evicted.push(other);
            }
            let pooled = state.kept.saturating_add(class) <= self.cap;
            if pooled {
                state.kept += class;
            }
            pooled
        };
        // Deregistering and registering are system calls: outside the lock.
        drop(evicted);
        let size = if pooled { class } else { len.max(1) };
        let mr = match Mr::new(&self.pd, size) {
            Ok(mr) => mr,
            Err(e) => {
                if pooled {
                    self.lock().kept -= class;
                }
                return Err(e);
            }
        };
        self.registrations.fetch_add(1, Ordering::Relaxed);
        let region = Region {
            class: if pooled { class } else { 0 },
            mr,
        };
        self.lock().ranges.insert(
            region.mr.ptr().as_ptr() as usize,
            (region.mr.len(), region.mr.lkey()),
        );
        Ok(self.lease(region))
    }

    fn lease(self: &Arc<Self>, region: Region) -> Lease {
        Lease {
            region: Some(region),
            pool: Arc::clone(self),
        }
    }

    fn give_back(&self, region: Region) {
        let mut state = self.lock();
        if region.class != 0 {
            state.free.entry(region.class).or_default().push(region);
        } else {
            state.ranges.remove(&(region.mr.ptr().as_ptr() as usize));
            drop(state);
            drop(region);
        }
    }

    /// The entry for `len` bytes at `ptr` if they lie in one of the pool's buffers.
    pub fn lookup(&self, ptr: *const u8, len: usize) -> Option<Sge> {
        let start = ptr as usize;
        let state = self.lock();
        let (&base, &(region_len, lkey)) = state.ranges.range(..=start).next_back()?;
        let end = start.checked_add(len)?;
        (end <= base + region_len).then_some(Sge {
            addr: start as u64,
            len: u32::try_from(len).ok()?,
            lkey,
        })
    }

    /// The counters.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            registrations: self.registrations.load(Ordering::Relaxed),
            reuses: self.reuses.load(Ordering::Relaxed),
            kept_bytes: self.lock().kept,
        }
    }
}

impl Lease {
    fn mr(&self) -> Option<&Mr> {
        self.region.as_ref().map(|r| &r.mr)
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.mr().map_or(0, |mr| mr.ptr().as_ptr() as u64)
    }

    /// Start pointer.
    pub fn ptr(&self) -> NonNull<u8> {
        self.mr().map_or(NonNull::dangling(), Mr::ptr)
    }

    /// Length (at least what was asked for).
    pub fn len(&self) -> usize {
        self.mr().map_or(0, Mr::len)
    }

    /// Whether it has no bytes (never, for a lease from `take`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr().map_or(0, Mr::rkey)
    }

    /// Entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        self.mr()?.sge(offset, len)
    }

    /// The bytes to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len();
        // SAFETY: the lease is the only handle to its region's memory (valid for `len`
        // bytes while the region lives, which `self` keeps), and `&mut self` makes this the
        // only access; the device does not touch it outside posted work requests, whose
        // owners hold the lease without handing out slices meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr().as_ptr(), len) }
    }

    /// The whole buffer as `Bytes` (no copy); it returns to the pool when every slice is
    /// dropped.
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(LeaseBytes(self))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            self.pool.give_back(region);
        }
    }
}

impl van_core::buf::BufOwner for Lease {}

/// A lease viewed as bytes (read-only from then on).
struct LeaseBytes(Lease);

impl AsRef<[u8]> for LeaseBytes {
    fn as_ref(&self) -> &[u8] {
        let len = self.0.len();
        // SAFETY: valid for `len` bytes while the lease lives (held by `self`); once turned
        // into `Bytes` nobody writes the buffer: the device wrote it before (its completion
        // was polled) or only reads it.
        unsafe { std::slice::from_raw_parts(self.0.ptr().as_ptr(), len) }
    }
}
