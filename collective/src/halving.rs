//! All-reduce by Rabenseifner's algorithm: a reduce-scatter by recursive halving, then an
//! all-gather by recursive doubling, among the `p` ranks of the largest power of two not
//! above `n` (the `n - p` ranks beyond fold in first, as in [`crate::doubling`]: rank
//! `p + i` sends its buffer to rank `i`, which combines it, and gets the result last).
//!
//! The buffer is cut into `p` blocks ([`chunk`]`(len, p, b)`). In the
//! halving step at distance `d` (`p/2`, `p/4`, … 1) each rank exchanges half of the blocks
//! it still reduces with the rank `d` away: the lower rank of the pair keeps the lower half
//! and sends the upper, the other the reverse, and each combines the half it receives into
//! its own. After `log2 p` steps rank `r` holds block `r`, reduced over every rank. The
//! doubling steps (distance 1, 2, … `p/2`) then swap the reduced blocks, each rank copying
//! its partner's, until every rank holds all of them. Each rank sends `2 (p - 1) / p` of
//! the buffer, as around the ring, in `2 log2 p` steps instead of `2 (p - 1)`: for medium
//! sizes on many ranks, where the ring's latencies add up.
//!
//! Every block is reduced by one rank only and then copied, and each combination is of two
//! partial results of commutative operators (IEEE addition and multiplication included), so
//! every rank ends with the same bits: the tree [`reference()`] spells out.

use std::ops::Range;

use crate::comm::{Op, Shared};
use crate::doubling::{fold_in, fold_out, lower_power_of_two};
use crate::element::{Element, ReduceOp};
use crate::error::Result;
use crate::ring::{chunk, receive, send, Combine};

/// All-reduce of `buf` in place by Rabenseifner's algorithm.
pub(crate) async fn allreduce<T: Element>(
    shared: &Shared,
    op: &Op,
    buf: &mut [T],
    reduction: ReduceOp,
) -> Result<()> {
    let n = op.size();
    if n == 1 || buf.is_empty() {
        return Ok(());
    }
    let p = lower_power_of_two(n);
    let steps = p.trailing_zeros() as usize;
    // Hops: 0 the fold-in, 1..=steps the halving, steps+1..=2 steps the doubling, then the
    // fold-out.
    let last = 2 * steps + 1;
    if !fold_in(shared, op, buf, reduction, last).await? {
        return Ok(());
    }
    let held = halve(shared, op, buf, reduction, p, 1).await?;
    mean_of(buf, p, held, reduction, n);
    double(shared, op, buf, p, held, steps + 1).await?;
    fold_out(shared, op, buf, last).await
}

/// The elements of blocks `lo..hi` of `p` of a buffer of `len` (`lo < hi`: halves of a
/// power of two; empty only when the buffer has fewer elements than blocks).
fn span(len: usize, p: usize, (lo, hi): (usize, usize)) -> Range<usize> {
    chunk(len, p, lo).start..chunk(len, p, hi - 1).end
}

/// A mean's division by the `ranks` contributions, of the blocks `held` of `p` that this
/// rank reduced (nothing for another operator).
fn mean_of<T: Element>(buf: &mut [T], p: usize, held: (usize, usize), op: ReduceOp, ranks: usize) {
    if op == ReduceOp::Mean {
        let reduced = span(buf.len(), p, held);
        for v in buf[reduced].iter_mut() {
            *v = v.divide(ranks);
        }
    }
}

/// The halving steps among ranks `0..p` (`p` a power of two, this rank among them), hops
/// `first_hop..`: afterwards this rank holds block `rank` of `p` reduced over the `p` ranks;
/// returns that block as `(rank, rank + 1)`.
async fn halve<T: Element>(
    shared: &Shared,
    op: &Op,
    buf: &mut [T],
    reduction: ReduceOp,
    p: usize,
    first_hop: usize,
) -> Result<(usize, usize)> {
    let (r, len) = (op.rank, buf.len());
    // The blocks this rank still reduces, `lo..hi`.
    let (mut lo, mut hi) = (0, p);
    for step in 0..p.trailing_zeros() as usize {
        let d = p >> (step + 1);
        let partner = r ^ d;
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = match r & d {
            0 => ((lo, mid), (mid, hi)),
            _ => ((mid, hi), (lo, mid)),
        };
        let hop = first_hop + step;
        send(shared, op, partner, hop, &buf[span(len, p, give)]).await?;
        let mine = &mut buf[span(len, p, keep)];
        receive(shared, op, partner, hop, mine, Combine::Reduce(reduction)).await?;
        (lo, hi) = keep;
    }
    Ok((lo, hi))
}

/// The doubling steps among ranks `0..p` (`p` a power of two, this rank among them), hops
/// `first_hop..`, from this rank holding blocks `held` of `p`: the partners swap what they
/// hold, twice as much each step, until every rank holds every block.
async fn double<T: Element>(
    shared: &Shared,
    op: &Op,
    buf: &mut [T],
    p: usize,
    held: (usize, usize),
    first_hop: usize,
) -> Result<()> {
    let (r, len) = (op.rank, buf.len());
    let (mut lo, mut hi) = held;
    for step in 0..p.trailing_zeros() as usize {
        let d = 1 << step;
        let partner = r ^ d;
        let theirs = match r & d {
            0 => (hi, hi + (hi - lo)),
            _ => (lo - (hi - lo), lo),
        };
        let hop = first_hop + step;
        send(shared, op, partner, hop, &buf[span(len, p, (lo, hi))]).await?;
        let into = &mut buf[span(len, p, theirs)];
        receive(shared, op, partner, hop, into, Combine::Copy).await?;
        (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
    }
    Ok(())
}

/// Reduce-scatter of `buf` by recursive halving, on a power of two of ranks: rank `r` ends
/// with chunk `r` ([`chunk`]) reduced, each element in the order [`reference()`] spells out
/// (without the fold).
pub(crate) async fn reduce_scatter<T: Element>(
    shared: &Shared,
    op: &Op,
    buf: &mut [T],
    reduction: ReduceOp,
) -> Result<()> {
    let n = op.size();
    debug_assert!(n.is_power_of_two());
    let held = halve(shared, op, buf, reduction, n, 0).await?;
    mean_of(buf, n, held, reduction, n);
    Ok(())
}

/// All-gather by recursive doubling, on a power of two of ranks: `out` is `n` blocks of
/// `input.len()` elements; block `i` ends as rank `i`'s input.
pub(crate) async fn all_gather<T: Element>(
    shared: &Shared,
    op: &Op,
    input: &[T],
    out: &mut [T],
) -> Result<()> {
    let (n, r, m) = (op.size(), op.rank, input.len());
    debug_assert!(n.is_power_of_two());
    out[r * m..(r + 1) * m].copy_from_slice(input);
    double(shared, op, out, n, (r, r + 1), 0).await
}

/// The total Rabenseifner's algorithm computes from each rank's value, in its order: the
/// tests' reference (a sum in this fixed order, bit for bit).
pub fn reference<T: Element>(values: &[T], reduction: ReduceOp) -> Option<T> {
    let n = values.len();
    let first = *values.first()?;
    if n == 1 {
        return Some(first);
    }
    let p = lower_power_of_two(n);
    let mut partial: Vec<T> = values[..p].to_vec();
    for i in 0..n - p {
        partial[i] = partial[i].combine(values[p + i], reduction);
    }
    // Pairs at distance p/2 first, then p/4, … 1.
    let mut d = p / 2;
    while d >= 1 {
        for i in (0..p).filter(|i| i & d == 0) {
            let total = partial[i].combine(partial[i + d], reduction);
            partial[i] = total;
            partial[i + d] = total;
        }
        d /= 2;
    }
    let total = partial[0];
    Some(match reduction {
        ReduceOp::Mean => total.divide(n),
        _ => total,
    })
}
