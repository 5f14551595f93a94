//! All-reduce by recursive doubling: in step `k` every rank exchanges its whole buffer with
//! the rank whose number differs in bit `k` and combines the two, so after `log2 p` steps
//! each of the `p` ranks (the largest power of two not above `n`) holds the total. The
//! `n - p` ranks beyond fold in first (rank `p + i` sends its buffer to rank `i`, which
//! combines it) and get the result last. `log2 p + 2` message latencies, the whole buffer
//! sent at each: for latency-bound sizes on many ranks, where the direct exchange sends
//! `n - 1` buffers per rank and the ring waits `2 (n - 1)` latencies.
//!
//! Every combination is of two partial results, and the operators are commutative (IEEE
//! addition and multiplication included), so the two ranks of a pair compute the same bits
//! and every rank ends with the same total: the tree `reference` spells out.

use crate::comm::{Op, Shared};
use crate::element::{copy_into, reduce_into, Element, ReduceOp};
use crate::error::Result;
use crate::ring::{elements_per_slice, slices, to_bytes};

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
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let steps = p.trailing_zeros() as usize;
    // Hops: 0 the fold-in, 1..=steps the exchanges, steps + 1 the fold-out.
    let last = steps + 1;
    if r >= p {
        send(shared, op, r - p, 0, buf).await?;
        return receive(shared, op, r - p, last, buf, Combine::Copy).await;
    }
    if r + p < n {
        receive(shared, op, r + p, 0, buf, Combine::Reduce(reduction)).await?;
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
    if r + p < n {
        send(shared, op, r + p, last, buf).await?;
    }
    Ok(())
}

enum Combine {
    Copy,
    Reduce(ReduceOp),
}

/// `buf` to rank `to` as hop `hop`, in slices.
async fn send<T: Element>(
    shared: &Shared,
    op: &Op,
    to: usize,
    hop: usize,
    buf: &[T],
) -> Result<()> {
    for (s, range) in slices(0..buf.len(), elements_per_slice::<T>(shared)).enumerate() {
        let data = to_bytes(shared, op, to, &buf[range]);
        shared.send(op, to, hop, s, data).await?;
    }
    Ok(())
}

/// Rank `from`'s hop `hop` into `buf`, copied or combined slice by slice.
async fn receive<T: Element>(
    shared: &Shared,
    op: &Op,
    from: usize,
    hop: usize,
    buf: &mut [T],
    combine: Combine,
) -> Result<()> {
    let size = std::mem::size_of::<T>();
    for (s, range) in slices(0..buf.len(), elements_per_slice::<T>(shared)).enumerate() {
        let data = shared.recv(op, from, hop, s, range.len() * size).await?;
        let out = &mut buf[range];
        match combine {
            Combine::Copy => copy_into(out, &data),
            Combine::Reduce(reduction) => reduce_into(out, &data, reduction),
        }
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
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
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
