//! The shared-memory all-reduce on a formed [`Group`] (see the [module docs](super)); the
//! other collectives are in [`super::gather`].
//!
//! **Who touches which bytes when.** Rank `q` writes slot `(q, p)` only at a chunk's copy-in
//! and, above [`SMALL_BYTES`], its own share of it after the first wait. Between the two
//! waits, rank `r` reads share `r` of every slot (disjoint from what others write); after
//! the second, share `q` of slot `q` (which nobody writes until the chunk after next). The
//! chunk after next writes the same slots again, but only after its writer has seen every
//! rank finish the next chunk's copy-in, which each does after it finished reading this
//! one. So each view below covers bytes nobody writes while it lives. (Every collective
//! keeps that rule: a rank's reads of a chunk end before its next publication.)
//!
//! A chunk read where it lies, in its rank's buffer in the arena, takes its slot's place
//! for the reduction only: rank `r` reads share `r` of it between the two waits, and its
//! rank writes the chunk (copying the reduced shares out of the slots) only after the
//! second, when every rank has published that its reads are done. So a caller whose call
//! succeeds gets its buffer back with nobody reading it, and no third wait is needed. A
//! rank that fails after publishing a chunk in place aborts the group before its caller
//! gets the buffer back (`Through::phase`), and a rank that read such a chunk looks at the
//! abort word after its reads: what it read is then not used, and it fails too.

use super::group::{Group, Rounds};
use super::signal::Stopped;
use crate::element::{combine_slice, combine_slice_after, Element, ReduceOp};
use crate::ring::{chunk, slices};

/// Chunks up to this many bytes are reduced whole by every rank (one wait); larger ones a
/// share per rank (two waits, `1/n` of the reduction each).
pub(crate) const SMALL_BYTES: usize = 16 << 10;

/// Largest all-reduce whose chunks are read where they lie when they are in their rank's
/// arena. Above, ranks that each read the others' buffers from memory at once measured
/// slower than one copy into the slots, which the others then read from the caches
/// (`allreduce-bench --van ipc --alloc`, 2 ranks on this machine's 32 MiB L3: 6.4–6.6 ms
/// against 5.5–5.7 at 64 MiB, and 4–6% slower at 16 MiB; 3 and 4 ranks gained 2–7% there).
pub(crate) const IN_PLACE_MAX_BYTES: usize = 8 << 20;

/// Elements of a share reduced at a time, in a scratch buffer that stays in the L1 cache.
const BLOCK: usize = 2048;

/// `len` elements of slot `(q, parity)` from element `start`.
///
/// # Safety
///
/// `start + len` must be within the slot, and no rank may write those elements while the
/// view lives (the module docs say when).
pub(super) unsafe fn view<T: Element>(
    g: &Group,
    q: usize,
    parity: usize,
    start: usize,
    len: usize,
) -> &[T] {
    // SAFETY: the slot is inside the mapping, which `g` keeps alive; slots start at
    // multiples of the cache line, so the elements are aligned; the caller vouches for the
    // bounds and for no concurrent writer.
    unsafe { std::slice::from_raw_parts((g.slot(q, parity) as *const T).add(start), len) }
}

/// All-reduces `buf` through the group of `rounds`, in chunks of a slot. A chunk above
/// [`SMALL_BYTES`] of a buffer up to [`IN_PLACE_MAX_BYTES`] that lies in its rank's arena
/// (a buffer from `Postoffice::alloc`) is not copied in: the rank publishes its offset, and
/// the others read their shares of it there.
pub(super) fn allreduce<T: Element>(
    rounds: &mut Rounds<'_>,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<(), Stopped> {
    let g = rounds.g;
    let (n, r) = (g.size, g.rank);
    let size = std::mem::size_of::<T>();
    let mut scratch: Vec<T> = Vec::new();
    let placeable = std::mem::size_of_val(buf) <= IN_PLACE_MAX_BYTES;
    // Where each rank's chunk lies, for the chunk at hand (reused from chunk to chunk).
    let mut sources: Vec<*const T> = Vec::with_capacity(n);
    for range in slices(0..buf.len(), g.slot_bytes / size) {
        let m = range.len();
        let part = &mut buf[range];
        let parity = rounds.next_chunk();
        let small = m * size <= SMALL_BYTES;
        // Up to SMALL_BYTES every rank reduces into its whole chunk while others may still
        // read theirs: those are copied in.
        let origin = match !small && placeable {
            true => g.arenas.offset_of(part),
            false => None,
        };
        if origin.is_none() {
            // SAFETY: `m` elements fit a slot (the chunk is at most a slot's worth); only
            // this rank writes its slot, and no rank reads this parity's slots until the
            // publication below (their last reads of them ended before the last wait of
            // this rank).
            unsafe {
                std::ptr::copy_nonoverlapping(part.as_ptr(), g.slot(r, parity) as *mut T, m);
            }
        }
        rounds.publish_from(parity, origin);
        rounds.wait_all(Some(parity))?;
        if small {
            // `slot 0 ⊕ slot 1 ⊕ …` into `part`, which holds this rank's own slot: rank 0
            // combines the others into it, rank 1 combines slot 0 in on the left, any other
            // starts from a copy of slot 0.
            // SAFETY (each view): all of every slot; nobody writes slots of this parity now.
            match r {
                0 => {}
                1 => combine_slice_after(part, unsafe { view(g, 0, parity, 0, m) }, op),
                _ => part.copy_from_slice(unsafe { view(g, 0, parity, 0, m) }),
            }
            for q in (1..n).filter(|&q| q != 1 || r != 1) {
                combine_slice(part, unsafe { view(g, q, parity, 0, m) }, op);
            }
            if op == ReduceOp::Mean {
                part.iter_mut().for_each(|v| *v = v.divide(n));
            }
            continue;
        }
        // Until the copy-out, this rank's chunk is only read, through `own`.
        let own = part.as_mut_ptr();
        sources.clear();
        for q in 0..n {
            sources.push(g.source::<T>(q, parity, m, own)?);
        }
        let in_others = (0..n).any(|q| q != r && sources[q] != g.slot(q, parity) as *const T);
        // SAFETY: `len` elements from `start` of `q`'s chunk, within it (`start + len <=
        // m`; `source` checked an arena's bounds); nobody writes a chunk's share `r` before
        // this rank publishes (a chunk in a buffer is written by its rank after the second
        // wait; a slot's share `r` by this rank, after its reads), unless its rank failed
        // meanwhile, and then the abort word says so before what was read is used.
        let share_of = |q: usize, start: usize, len: usize| unsafe {
            std::slice::from_raw_parts(sources[q].add(start), len)
        };
        for block in slices(chunk(m, n, r), BLOCK) {
            let (start, len) = (block.start, block.len());
            scratch.clear();
            scratch.extend_from_slice(share_of(0, start, len));
            for q in 1..n {
                combine_slice(&mut scratch, share_of(q, start, len), op);
            }
            if op == ReduceOp::Mean {
                scratch.iter_mut().for_each(|v| *v = v.divide(n));
            }
            // SAFETY: share `r` of this rank's own slot, in bounds; no view of it lives.
            unsafe {
                let mine = (g.slot(r, parity) as *mut T).add(start);
                std::ptr::copy_nonoverlapping(scratch.as_ptr(), mine, len);
            }
        }
        // A rank that gave up after publishing may have its buffer back: what was read of
        // it is not used.
        if in_others {
            rounds.check_abort()?;
        }
        rounds.publish(None);
        rounds.wait_all(None)?;
        for q in 0..n {
            let share = chunk(m, n, q);
            // SAFETY: share `q` of slot `q`, reduced and published; nobody writes it now.
            let reduced = unsafe { view(g, q, parity, share.start, share.len()) };
            part[share].copy_from_slice(reduced);
        }
    }
    Ok(())
}
