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

use super::group::{Group, Rounds};
use super::signal::Stopped;
use crate::element::{combine_slice, Element, ReduceOp};
use crate::ring::{chunk, slices};

/// Chunks up to this many bytes are reduced whole by every rank (one wait); larger ones a
/// share per rank (two waits, `1/n` of the reduction each).
pub(crate) const SMALL_BYTES: usize = 16 << 10;

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

/// All-reduces `buf` through the group of `rounds`, in chunks of a slot.
pub(super) fn allreduce<T: Element>(
    rounds: &mut Rounds<'_>,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<(), Stopped> {
    let g = rounds.g;
    let (n, r) = (g.size, g.rank);
    let size = std::mem::size_of::<T>();
    let mut scratch: Vec<T> = Vec::new();
    for range in slices(0..buf.len(), g.slot_bytes / size) {
        let m = range.len();
        let part = &mut buf[range];
        let parity = rounds.next_chunk();
        // SAFETY: `m` elements fit a slot (the chunk is at most a slot's worth); only this
        // rank writes its slot, and no rank reads this parity's slots until the publication
        // below (their last reads of them ended before the last wait of this rank).
        unsafe {
            std::ptr::copy_nonoverlapping(part.as_ptr(), g.slot(r, parity) as *mut T, m);
        }
        rounds.publish(Some(parity));
        rounds.wait_all(Some(parity))?;
        if m * size <= SMALL_BYTES {
            // SAFETY (each view): all of every slot; nobody writes slots of this parity now.
            part.copy_from_slice(unsafe { view(g, 0, parity, 0, m) });
            for q in 1..n {
                combine_slice(part, unsafe { view(g, q, parity, 0, m) }, op);
            }
            if op == ReduceOp::Mean {
                part.iter_mut().for_each(|v| *v = v.divide(n));
            }
            continue;
        }
        for block in slices(chunk(m, n, r), BLOCK) {
            let (start, len) = (block.start, block.len());
            scratch.clear();
            // SAFETY (each view): share `r` of every slot, which only this rank writes
            // (below, after the reads of the block).
            scratch.extend_from_slice(unsafe { view(g, 0, parity, start, len) });
            for q in 1..n {
                combine_slice(&mut scratch, unsafe { view(g, q, parity, start, len) }, op);
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
