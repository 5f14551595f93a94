//! All-reduce by recursive doubling: in step `k` every rank exchanges its whole buffer with
//! the rank whose number differs in bit `k` and combines the two, so after `log2 p` steps
//! each of the `p` ranks (the largest power of two not above `n`) holds the total. The
//! `n - p` ranks beyond fold in first (rank `p + i` sends its buffer to rank `i`, which
//! combines it) and get the result last. `log2 p + 2` message latencies, the whole buffer
//! sent at each: for latency-bound sizes on many ranks, where the direct exchange sends
//! `n - 1` buffers per rank and the ring waits `2 (n - 1)` latencies.
//!
//! Every combination is of two partial results, and the operators are commutative (IEEE
//! addition and multiplication included; min and max are made so for two NaNs and for
//! signed zeros, see [`Element::combine`]), so the two ranks of a pair compute the same bits
//! and every rank ends with the same total: the tree `reference` spells out.

use crate::comm::{Op, Shared};
use crate::element::{Element, ReduceOp};
use crate::error::Result;
use crate::ring::{receive, send, Combine};

/// All-reduce of `buf` in place by recursive doubling.
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
    // Hops: 0 the fold-in, 1..=steps the exchanges, steps + 1 the fold-out.
    let last = steps + 1;
    if !fold_in(shared, op, buf, reduction, last).await? {
        return Ok(());
    }
    for step in 0..steps {
        let partner = r ^ (1 << step);
        send(shared, op, partner, step + 1, buf).await?;
        receive(
            shared,
            op,
            partner,
            step + 1,
            buf,
            Combine::Reduce(reduction),
        )
        .await?;
    }
    if reduction == ReduceOp::Mean {
        for v in buf.iter_mut() {
            *v = v.divide(n);
        }
    }
    fold_out(shared, op, buf, last).await
}

/// The fold-in of the ranks beyond the largest power of two `p` not above the rank count:
/// rank `p + i` sends its buffer to rank `i` (hop 0), which combines it, and waits for the
/// result (hop `last`): `Ok(false)`, its part done. `Ok(true)`: this rank is among the `p`.
pub(crate) async fn fold_in<T: Element>(
    shared: &Shared,
    op: &Op,
    buf: &mut [T],
    reduction: ReduceOp,
    last: usize,
) -> Result<bool> {
    let (n, r) = (op.size(), op.rank);
    let p = lower_power_of_two(n);
    if r >= p {
        send(shared, op, r - p, 0, buf).await?;
        receive(shared, op, r - p, last, buf, Combine::Copy).await?;
        return Ok(false);
    }
    if r + p < n {
        receive(shared, op, r + p, 0, buf, Combine::Reduce(reduction)).await?;
    }
    Ok(true)
}

/// The fold-out: rank `i` sends the result to rank `p + i` (hop `last`), if there is one.
pub(crate) async fn fold_out<T: Element>(
    shared: &Shared,
    op: &Op,
    buf: &[T],
    last: usize,
) -> Result<()> {
    let (n, r) = (op.size(), op.rank);
    let p = lower_power_of_two(n);
    if r + p < n {
        send(shared, op, r + p, last, buf).await?;
    }
    Ok(())
}

/// The total recursive doubling computes from each rank's value, in its order: the tests'
/// reference (a sum in this fixed order, bit for bit).
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
    let mut width = 1;
    while width < p {
        // After this step, each block of 2 × width ranks holds its block's total.
        for lower in (0..p).step_by(2 * width) {
            let total = partial[lower].combine(partial[lower + width], reduction);
            partial[lower..lower + 2 * width].fill(total);
        }
        width *= 2;
    }
    let total = partial[0];
    Some(match reduction {
        ReduceOp::Mean => total.divide(n),
        _ => total,
    })
}

/// The largest power of two not above `n` (`n` ≥ 1): the ranks that exchange.
pub(crate) fn lower_power_of_two(n: usize) -> usize {
    1usize << (usize::BITS - 1 - n.leading_zeros())
}
