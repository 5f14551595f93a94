//! Zero-copy send buffers: each van's shared **arena**, and references into it.
//!
//! An [`IpcVan`](crate::IpcVan) maps one sealed memfd (the arena) and hands it, read by the
//! peer, to every peer it connects to. [`Arena::alloc`] carves a [`SharedBuf`] out of it;
//! the caller fills it and sends the frozen `Bytes`. When a data segment of an outgoing
//! message lies in the arena, the van sends a *reference* (block, offset, length) in the
//! ring instead of the bytes, and the receiver's `Bytes` point straight into the mapping of
//! the sender's arena: the payload is written once, by the application, and never copied.
//!
//! **Who may reuse a block.** The arena is cut into blocks of [`BLOCK_BYTES`]; an allocation
//! is a run of blocks, known by its first block. Each connection has a *reference table*
//! (its own small memfd, one `u32` counter per block): the sender adds one before it sends a
//! reference, the receiver's `Bytes` subtract one when their last clone is dropped. An
//! allocation is free again when the sender's own `Bytes` are all dropped and every table
//! reads 0 for it. A connection's table stops counting when the connection closed and the
//! peer process is gone (`kill(pid, 0)` says so); while a closed connection's peer lives,
//! its references still hold (it may still read the bytes).
//!
//! **Trust.** Peers are processes of the same user (the handshake checks the uid). A peer
//! could still write the arena or its counters: it can only make the *sender* reuse memory
//! early (corrupting what the peer itself reads) or never (leaking arena space); the sender
//! reads nothing back from the arena but counters. References from a peer are validated
//! against the mapping's bounds before any `Bytes` is built.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use van_core::buf::BufOwner;
use van_core::SharedBuf;

use crate::error::IpcError;
use crate::segment::Segment;

/// Allocation granularity of the arena.
pub const BLOCK_BYTES: usize = 64 << 10;
/// Magic that starts a references record in the ring (a frame starts with `VANS`).
pub(crate) const REFS_MAGIC: [u8; 4] = *b"VREF";
/// Bytes of one reference in a references record: index, block (`u32`), offset, length.
const REF_BYTES: usize = 24;

/// One data segment sent by reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ref {
    /// Index of the data segment in the message.
    pub index: u32,
    /// First block of the allocation holding the bytes.
    pub block: u32,
    /// Offset of the bytes in the arena.
    pub offset: u64,
    /// Length of the bytes.
    pub len: u64,
}

/// Encodes a references record: `VREF`, a `u32` count, then each reference.
pub(crate) fn encode_refs(refs: &[Ref]) -> Bytes {
    let mut out = Vec::with_capacity(8 + refs.len() * REF_BYTES);
    out.extend_from_slice(&REFS_MAGIC);
    out.extend_from_slice(&(refs.len() as u32).to_le_bytes());
    for r in refs {
        out.extend_from_slice(&r.index.to_le_bytes());
        out.extend_from_slice(&r.block.to_le_bytes());
        out.extend_from_slice(&r.offset.to_le_bytes());
        out.extend_from_slice(&r.len.to_le_bytes());
    }
    Bytes::from(out)
}

/// Decodes a references record (the caller checked the magic); never panics.
pub(crate) fn decode_refs(record: &[u8]) -> Result<Vec<Ref>, IpcError> {
    let bad = |what: &str| IpcError::corrupt(format!("bad references record: {what}"));
    let count = record
        .get(4..8)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| bad("too short"))? as usize;
    let body = &record[8..];
    if body.len() != count.saturating_mul(REF_BYTES) {
        return Err(bad(&format!("{} bytes for {count} references", body.len())));
    }
    let word = |b: &[u8], at: usize| -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    Ok(body
        .chunks_exact(REF_BYTES)
        .map(|c| {
            let head = word(c, 0);
            Ref {
                index: head as u32,
                block: (head >> 32) as u32,
                offset: word(c, 8),
                len: word(c, 16),
            }
        })
        .collect())
}

/// The sending side: our arena and its allocator.
#[derive(Debug)]
pub struct Arena {
    segment: Arc<Segment>,
    blocks: usize,
    state: Mutex<ArenaState>,
}

#[derive(Debug)]
struct ArenaState {
    /// Whether each block is free.
    free: Vec<bool>,
    /// Allocations by first block.
    live: BTreeMap<u32, Live>,
    /// Reference tables of connections that may still hold references.
    tables: Vec<Arc<RefTable>>,
}

#[derive(Debug)]
struct Live {
    blocks: u32,
    /// Whether our own `SharedBuf`/`Bytes` still exist.
    local: bool,
}

fn lock(state: &Mutex<ArenaState>) -> MutexGuard<'_, ArenaState> {
    // Plain data; a panic elsewhere cannot leave it half-updated in a harmful way.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Arena {
    /// Creates an arena of `bytes` (rounded up to whole blocks), reserved up front.
    ///
    /// # Errors
    ///
    /// [`IpcError::Os`] when the memory cannot be reserved (the message names the bytes).
    pub fn create(name: &str, bytes: usize) -> Result<Arc<Arena>, IpcError> {
        let blocks = bytes.div_ceil(BLOCK_BYTES).clamp(1, u32::MAX as usize);
        let segment = Arc::new(Segment::create(name, blocks * BLOCK_BYTES)?);
        Ok(Arc::new(Arena {
            segment,
            blocks,
            state: Mutex::new(ArenaState {
                free: vec![true; blocks],
                live: BTreeMap::new(),
                tables: Vec::new(),
            }),
        }))
    }

    /// The arena's memfd, for a peer to map.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    /// Total bytes.
    pub fn capacity(&self) -> usize {
        self.blocks * BLOCK_BYTES
    }

    /// Bytes not allocated now (allocations whose references are all released count as
    /// free after the next allocation or this call reclaims them).
    pub fn free_bytes(&self) -> usize {
        let mut state = lock(&self.state);
        state.reclaim();
        state.free.iter().filter(|f| **f).count() * BLOCK_BYTES
    }

    /// A buffer of `len` bytes in the arena.
    ///
    /// # Errors
    ///
    /// [`IpcError::ArenaFull`] when no run of free blocks is long enough, even after
    /// reclaiming what peers released.
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<SharedBuf, IpcError> {
        let blocks = len.max(1).div_ceil(BLOCK_BYTES);
        let mut state = lock(&self.state);
        let first = match state.find_run(blocks) {
            Some(first) => first,
            None => {
                state.reclaim();
                state.find_run(blocks).ok_or_else(|| IpcError::ArenaFull {
                    needed: len,
                    free: state.free.iter().filter(|f| **f).count() * BLOCK_BYTES,
                    capacity: self.capacity(),
                })?
            }
        };
        for f in &mut state.free[first..first + blocks] {
            *f = false;
        }
        state.live.insert(
            first as u32,
            Live {
                blocks: blocks as u32,
                local: true,
            },
        );
        drop(state);
        // SAFETY: `first + blocks <= self.blocks`, so the range is inside the mapping.
        let ptr = unsafe { self.segment.as_ptr().add(first * BLOCK_BYTES) };
        let ptr = NonNull::new(ptr).ok_or_else(|| IpcError::corrupt("null arena mapping"))?;
        let owner = LocalOwner {
            arena: Arc::clone(self),
            block: first as u32,
        };
        // SAFETY: the blocks were free and are now marked allocated, so no other buffer
        // covers them until `owner` is dropped and every peer released them; the mapping
        // lives as long as `owner` holds the arena. Peers only read blocks they were sent.
        Ok(unsafe { SharedBuf::from_raw_parts(ptr, len, crate::KIND, Box::new(owner)) })
    }

    /// Where `bytes` lie in the arena, if they do: the allocation's first block and the
    /// offset of the bytes.
    pub(crate) fn locate(&self, bytes: &Bytes) -> Option<(u32, u64)> {
        let start = self.segment.as_ptr() as usize;
        let at = bytes.as_ptr() as usize;
        if bytes.is_empty() || at < start || at + bytes.len() > start + self.capacity() {
            return None;
        }
        let offset = at - start;
        let block = (offset / BLOCK_BYTES) as u32;
        let state = lock(&self.state);
        let (&first, live) = state.live.range(..=block).next_back()?;
        let end = (first as usize + live.blocks as usize) * BLOCK_BYTES;
        (offset + bytes.len() <= end).then_some((first, offset as u64))
    }

    /// A reference table for a new connection to the process `peer_pid`.
    ///
    /// # Errors
    ///
    /// [`IpcError::Os`] when the table's memfd cannot be created.
    pub(crate) fn new_table(
        &self,
        name: &str,
        peer_pid: Option<i32>,
    ) -> Result<Arc<RefTable>, IpcError> {
        let bytes = (self.blocks * 4).next_multiple_of(4096);
        let table = Arc::new(RefTable {
            segment: Arc::new(Segment::create(name, bytes)?),
            blocks: self.blocks,
            peer_pid,
            closed: AtomicBool::new(false),
        });
        lock(&self.state).tables.push(Arc::clone(&table));
        Ok(table)
    }

    fn release_local(&self, block: u32) {
        let mut state = lock(&self.state);
        if let Some(live) = state.live.get_mut(&block) {
            live.local = false;
        }
        state.reclaim();
    }
}

impl ArenaState {
    fn find_run(&self, blocks: usize) -> Option<usize> {
        let mut run = 0;
        for (i, free) in self.free.iter().enumerate() {
            if *free {
                run += 1;
                if run == blocks {
                    return Some(i + 1 - blocks);
                }
            } else {
                run = 0;
            }
        }
        None
    }

    /// Frees allocations nobody holds, and forgets tables of connections that ended with
    /// their peer process.
    fn reclaim(&mut self) {
        self.tables.retain(|t| !t.retired());
        let tables = &self.tables;
        let mut freed = Vec::new();
        self.live.retain(|&first, live| {
            let held = live.local || tables.iter().any(|t| t.count(first) != 0);
            if !held {
                freed.push((first as usize, live.blocks as usize));
            }
            held
        });
        for (first, blocks) in freed {
            for f in &mut self.free[first..first + blocks] {
                *f = true;
            }
        }
    }
}

/// Keeps an allocation ours while the sender's `Bytes` live.
struct LocalOwner {
    arena: Arc<Arena>,
    block: u32,
}

impl BufOwner for LocalOwner {}

impl Drop for LocalOwner {
    fn drop(&mut self) {
        self.arena.release_local(self.block);
    }
}

/// One connection's reference counters for one arena (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct RefTable {
    segment: Arc<Segment>,
    blocks: usize,
    peer_pid: Option<i32>,
    closed: AtomicBool,
}

impl RefTable {
    /// The table's memfd, for the peer to map.
    pub(crate) fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }

    fn counter(&self, block: u32) -> Option<&AtomicU32> {
        let block = block as usize;
        if block >= self.blocks {
            return None;
        }
        // SAFETY: `block < blocks` and the segment holds at least `blocks * 4` bytes, page
        // aligned, so the pointer is in bounds and 4-aligned; the memory is only accessed
        // atomically by both processes, and lives as long as `self.segment`.
        Some(unsafe { &*self.segment.as_ptr().cast::<AtomicU32>().add(block) })
    }

    /// Counts a reference about to be sent to the peer.
    pub(crate) fn acquire(&self, block: u32) {
        if let Some(c) = self.counter(block) {
            c.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn count(&self, block: u32) -> u32 {
        self.counter(block).map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Marks the connection ended; the table stops counting once the peer process is gone.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn retired(&self) -> bool {
        self.closed.load(Ordering::Acquire) && !self.peer_pid.is_some_and(process_alive)
    }
}

/// Whether a process with this pid exists (`kill(pid, 0)`; `EPERM` means it does).
fn process_alive(pid: i32) -> bool {
    // 0 (what SO_PEERCRED says of a peer outside our pid namespace) names no single process
    // and is taken as alive, as `kill(0, 0)` (our own process group) always said.
    let Some(pid) = (pid > 0)
        .then_some(pid)
        .and_then(rustix::process::Pid::from_raw)
    else {
        return true;
    };
    // Signal 0 only checks for existence and permission; nothing is sent.
    matches!(
        rustix::process::test_kill_process(pid),
        Ok(()) | Err(rustix::io::Errno::PERM)
    )
}

/// The receiving side: a peer's arena and the table of our connection to it.
#[derive(Debug)]
pub(crate) struct PeerArena {
    arena: Arc<Segment>,
    table: Arc<Segment>,
    blocks: usize,
}

impl PeerArena {
    /// Checks a peer's arena and table segments against each other.
    pub(crate) fn new(arena: Segment, table: Segment) -> Result<PeerArena, IpcError> {
        let blocks = arena.len() / BLOCK_BYTES;
        if blocks == 0 || arena.len() % BLOCK_BYTES != 0 {
            return Err(IpcError::bad_segment(format!(
                "an arena of {} bytes is not a whole number of {BLOCK_BYTES}-byte blocks",
                arena.len()
            )));
        }
        if table.len() < blocks * 4 {
            return Err(IpcError::bad_segment(format!(
                "a reference table of {} bytes for {blocks} blocks",
                table.len()
            )));
        }
        Ok(PeerArena {
            arena: Arc::new(arena),
            table: Arc::new(table),
            blocks,
        })
    }

    /// The bytes a reference names, kept alive (and counted) until dropped.
    pub(crate) fn bytes(&self, r: &Ref) -> Result<Bytes, IpcError> {
        let end = r.offset.checked_add(r.len);
        let in_bounds = (r.block as usize) < self.blocks
            && r.offset >= r.block as u64 * BLOCK_BYTES as u64
            && end.is_some_and(|e| e <= self.arena.len() as u64);
        if !in_bounds {
            return Err(IpcError::corrupt(format!(
                "reference to {} bytes at {} (block {}) outside the {}-byte arena",
                r.len,
                r.offset,
                r.block,
                self.arena.len()
            )));
        }
        Ok(Bytes::from_owner(PeerSlice {
            arena: Arc::clone(&self.arena),
            table: Arc::clone(&self.table),
            block: r.block,
            offset: r.offset as usize,
            len: r.len as usize,
        }))
    }
}

/// Received bytes in a peer's arena; dropping the last clone releases the reference.
struct PeerSlice {
    arena: Arc<Segment>,
    table: Arc<Segment>,
    block: u32,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for PeerSlice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `offset + len` was checked against the mapping, which lives as long as
        // `self.arena`. The sender writes an allocation only before sending it and reuses it
        // only after our counter for it drops to zero (when this value is dropped), so the
        // bytes do not change while this slice exists — unless the peer breaks the protocol,
        // which can then change only the values we read, never their bounds.
        unsafe { std::slice::from_raw_parts(self.arena.as_ptr().add(self.offset), self.len) }
    }
}

impl Drop for PeerSlice {
    fn drop(&mut self) {
        // SAFETY: the block was bounds-checked against the table's size when the slice was
        // made; the table is 4-aligned (page aligned) and only accessed atomically.
        let counter = unsafe {
            &*self
                .table
                .as_ptr()
                .cast::<AtomicU32>()
                .add(self.block as usize)
        };
        // Saturating: a peer that zeroed its own counter must not make us wrap it.
        let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn peer_arena(blocks: usize) -> PeerArena {
        let arena = Arena::create("test-arena", blocks * BLOCK_BYTES).unwrap();
        let table = arena.new_table("test-refs", None).unwrap();
        let dup = |s: &Segment| {
            let fd = s.fd().try_clone_to_owned().unwrap();
            Segment::open(fd).unwrap()
        };
        PeerArena::new(dup(arena.segment()), dup(table.segment())).unwrap()
    }

    #[test]
    fn references_round_trip() {
        let refs = [
            Ref {
                index: 0,
                block: 3,
                offset: 3 * BLOCK_BYTES as u64 + 5,
                len: 7,
            },
            Ref {
                index: 9,
                block: u32::MAX,
                offset: u64::MAX,
                len: 0,
            },
        ];
        let record = encode_refs(&refs);
        assert!(record.starts_with(&REFS_MAGIC));
        assert_eq!(decode_refs(&record).unwrap(), refs);
    }

    #[test]
    fn references_outside_the_arena_are_refused() {
        let arena = peer_arena(2);
        let block = BLOCK_BYTES as u64;
        let ok = Ref {
            index: 0,
            block: 1,
            offset: block,
            len: block,
        };
        assert_eq!(arena.bytes(&ok).unwrap().len(), BLOCK_BYTES);
        for bad in [
            Ref { block: 2, ..ok },
            Ref {
                len: block + 1,
                ..ok
            },
            Ref {
                offset: u64::MAX,
                len: 2,
                ..ok
            },
            Ref { offset: 0, ..ok },
        ] {
            assert!(
                matches!(arena.bytes(&bad), Err(IpcError::Corrupt { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_table_smaller_than_the_arena_is_refused() {
        let big = Arena::create("test-big", 2048 * BLOCK_BYTES).unwrap();
        let small = Arena::create("test-small", BLOCK_BYTES).unwrap();
        let table = small.new_table("test-refs", None).unwrap();
        let dup = |s: &Segment| Segment::open(s.fd().try_clone_to_owned().unwrap()).unwrap();
        let error = PeerArena::new(dup(big.segment()), dup(table.segment())).unwrap_err();
        assert!(matches!(error, IpcError::BadSegment { .. }), "{error}");
    }

    proptest! {
        #[test]
        fn garbage_references_never_panic(record in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut with_magic = REFS_MAGIC.to_vec();
            with_magic.extend_from_slice(&record);
            for r in decode_refs(&with_magic).unwrap_or_default() {
                let _ = peer_arena(1).bytes(&r);
            }
        }
    }
}
