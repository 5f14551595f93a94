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
    let (n, r) = (op.size(), op.rank);
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
    let len = buf.len();
    // The elements of blocks `lo..hi` (never empty: halves of a power of two).
    let span = |(lo, hi): (usize, usize)| -> Range<usize> {
        chunk(len, p, lo).start..chunk(len, p, hi - 1).end
    };
    // Halving: the blocks this rank still reduces, `lo..hi`.
    let (mut lo, mut hi) = (0, p);
    for step in 0..steps {
        let d = p >> (step + 1);
        let partner = r ^ d;
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = match r & d {
            0 => ((lo, mid), (mid, hi)),
            _ => ((mid, hi), (lo, mid)),
        };
        send(shared, op, partner, step + 1, &buf[span(give)]).await?;
        let mine = &mut buf[span(keep)];
        receive(
            shared,
            op,
            partner,
            step + 1,
            mine,
            Combine::Reduce(reduction),
        )
        .await?;
        (lo, hi) = keep;
    }
    if reduction == ReduceOp::Mean {
        for v in buf[span((lo, hi))].iter_mut() {
            *v = v.divide(n);
        }
    }
    // Doubling: the blocks this rank holds reduced, `lo..hi`, twice as many each step.
    for step in 0..steps {
        let d = 1 << step;
        let partner = r ^ d;
        let theirs = match r & d {
            0 => (hi, hi + (hi - lo)),
            _ => (lo - (hi - lo), lo),
        };
        let hop = steps + step + 1;
        send(shared, op, partner, hop, &buf[span((lo, hi))]).await?;
        receive(
            shared,
            op,
            partner,
            hop,
            &mut buf[span(theirs)],
            Combine::Copy,
        )
        .await?;
        (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
    }
    fold_out(shared, op, buf, last).await
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
