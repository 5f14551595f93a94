//! All-gather, reduce-scatter and broadcast through a formed group: the same chunks, slots
//! and waits as the all-reduce ([`super::reduce`] says who touches which bytes when), each
//! with one wait per chunk.

use super::group::Rounds;
use super::reduce::view;
use super::signal::Stopped;
use crate::element::{combine_slice, Element, ReduceOp};
use crate::ring::{chunk, slices};

/// Every rank's `input` into block `q` of `out` (`out.len() == size × input.len()`): see
/// [`gather_blocks`].
pub(super) fn all_gather<T: Element>(
    rounds: &mut Rounds<'_>,
    input: &[T],
    out: &mut [T],
) -> Result<(), Stopped> {
    gather_blocks(rounds, Some(input), out)
}

/// Every rank's block into every rank's `out`, block `q` being [`chunk`]`(len, size, q)`:
/// this rank's from `mine` (that block's length), or, with `None`, already in place in
/// `out`. Each chunk carries up to a slot of every rank's block: each rank copies its piece
/// into its slot, and, once every rank published, every other rank's piece is copied out.
pub(super) fn gather_blocks<T: Element>(
    rounds: &mut Rounds<'_>,
    mine: Option<&[T]>,
    out: &mut [T],
) -> Result<(), Stopped> {
    let g = rounds.g;
    let (n, r, len) = (g.size, g.rank, out.len());
    let per = (g.slot_bytes / std::mem::size_of::<T>()).max(1);
    let longest = (0..n).map(|q| chunk(len, n, q).len()).max().unwrap_or(0);
    let piece = |q: usize, at: usize| {
        let block = chunk(len, n, q);
        (block.start + at).min(block.end)..(block.start + at + per).min(block.end)
    };
    for at in (0..longest).step_by(per) {
        let parity = rounds.next_chunk();
        let own = piece(r, at);
        let from = match mine {
            Some(mine) => &mine[own.start - chunk(len, n, r).start..][..own.len()],
            None => &out[own.clone()],
        };
        // SAFETY: a piece fits a slot; only this rank writes its slot, and nobody reads
        // this parity until the publication below.
        unsafe {
            let slot = g.slot(r, parity) as *mut T;
            std::ptr::copy_nonoverlapping(from.as_ptr(), slot, own.len());
        }
        rounds.publish(Some(parity));
        rounds.wait_all(Some(parity))?;
        for q in (0..n).filter(|&q| q != r || mine.is_some()) {
            let at = piece(q, at);
            // SAFETY: rank `q`'s published piece; nobody writes it until this rank's next
            // publication has been seen.
            let theirs = unsafe { view(g, q, parity, 0, at.len()) };
            out[at].copy_from_slice(theirs);
        }
    }
    Ok(())
}

/// This rank's block of the reduction of every rank's `buf` (block `r` of
/// [`chunk`]`(len, size, r)`), left in place in `buf`. Each chunk carries a piece of every
/// block (piece `q` at `q × per` in the slot); rank `r` reduces piece `r` of every slot, in
/// rank order, straight into its block. Ranks 0 and 1 keep their own piece out of the slot
/// and fold in place (`s1 ⊕ s0` is `s0 ⊕ s1`: the operators commute, but for which of two
/// NaNs' payloads a sum keeps; each piece is reduced by one rank, so every rank still gets
/// the same bits), which saves a copy of a piece per chunk; other ranks fold from their
/// slot.
pub(super) fn reduce_scatter<T: Element>(
    rounds: &mut Rounds<'_>,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<(), Stopped> {
    let g = rounds.g;
    let (n, r, len) = (g.size, g.rank, buf.len());
    let per = (g.slot_bytes / std::mem::size_of::<T>() / n).max(1);
    let longest = (0..n).map(|q| chunk(len, n, q).len()).max().unwrap_or(0);
    let in_place = r <= 1;
    for at in (0..longest).step_by(per) {
        let parity = rounds.next_chunk();
        for q in (0..n).filter(|&q| q != r || !in_place) {
            let block = chunk(len, n, q);
            let piece = (block.start + at).min(block.end)..(block.start + at + per).min(block.end);
            // SAFETY: piece `q` of this rank's slot (at most `per` elements at `q × per`,
            // within the slot); nobody reads this parity until the publication below.
            unsafe {
                let slot = (g.slot(r, parity) as *mut T).add(q * per);
                std::ptr::copy_nonoverlapping(buf[piece.clone()].as_ptr(), slot, piece.len());
            }
        }
        rounds.publish(Some(parity));
        rounds.wait_all(Some(parity))?;
        let mine = chunk(len, n, r);
        let piece = (mine.start + at).min(mine.end)..(mine.start + at + per).min(mine.end);
        let out = &mut buf[piece.clone()];
        // SAFETY (each view): piece `r` of a published slot; nobody writes them now.
        let slot = |q: usize| unsafe { view(g, q, parity, r * per, piece.len()) };
        let rest = match r {
            // `out` holds s0.
            0 => 1,
            // `out` holds s1: s1 ⊕ s0 is s0 ⊕ s1.
            1 => {
                combine_slice(out, slot(0), op);
                2
            }
            _ => {
                out.copy_from_slice(slot(0));
                1
            }
        };
        for q in rest..n {
            combine_slice(out, slot(q), op);
        }
        if op == ReduceOp::Mean {
            out.iter_mut().for_each(|v| *v = v.divide(n));
        }
    }
    Ok(())
}

/// Rank `root`'s `buf` into every rank's. The root writes a chunk into its slot and
/// publishes; each other rank publishes the same step as it starts on that chunk (so it is
/// done with the one before), waits for the root and copies the chunk out. Before the root
/// writes a chunk it waits for every rank to have started the last one (so the slot it
/// writes, two chunks back, has no reader). Every rank ends by waiting for every other to
/// have started the final chunk: the rule the next collective relies on (a rank's slots of
/// one parity are rewritten only after it saw every rank move past them), which the other
/// collectives keep by waiting for every rank at every chunk.
pub(super) fn broadcast<T: Element>(
    rounds: &mut Rounds<'_>,
    buf: &mut [T],
    root: usize,
) -> Result<(), Stopped> {
    let g = rounds.g;
    let r = g.rank;
    let mut any = false;
    for range in slices(0..buf.len(), g.slot_bytes / std::mem::size_of::<T>()) {
        let parity = rounds.next_chunk();
        let len = range.len();
        if r == root {
            if any {
                rounds.wait_all(None)?;
            }
            // SAFETY: a chunk fits a slot; every reader of this slot's last chunk has moved
            // past it (just above, or before the collective before ended).
            unsafe {
                let slot = g.slot(r, parity) as *mut T;
                std::ptr::copy_nonoverlapping(buf[range].as_ptr(), slot, len);
            }
            rounds.publish(Some(parity));
        } else {
            rounds.publish(None);
            rounds.wait_for(root, parity)?;
            // SAFETY: the root's published chunk; it writes this slot again only after
            // this rank's next publication.
            buf[range].copy_from_slice(unsafe { view(g, root, parity, 0, len) });
        }
        any = true;
    }
    match any {
        true => rounds.wait_all(None),
        false => Ok(()),
    }
}
