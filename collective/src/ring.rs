//! The algorithms: every collective is a ring (each rank sends to the next and receives from
//! the previous), buffers travel in slices, and a rank forwards each slice as soon as it has
//! it, so every link carries data while the rest is still on its way.
//!
//! All-reduce is reduce-scatter then all-gather: the buffer is cut into one chunk per rank
//! (sizes differ by at most one element); in `n - 1` hops each chunk travels the ring and
//! collects every rank's contribution, ending fully reduced on its owner (rank `r` owns
//! chunk `r`); in `n - 1` more hops the owners' chunks travel the ring again and are copied.
//! Each chunk is reduced in one fixed order and then copied, so every rank ends with the
//! same bits, floating point included.

use std::ops::Range;

use crate::comm::{Op, Shared};
use crate::element::{combine_slice, reduce_into, Element, ReduceOp};
use crate::error::Result;
use crate::spin::Spin;

/// Slices a rank sends ahead of what it has received in the first hop of a ring through
/// the vans: enough to keep every link busy (4 MiB at the default 256 KiB slice), few
/// enough that a large buffer is not queued to the van all at once (the receiver holds what
/// arrives early).
const IN_FLIGHT_SLICES: usize = 16;

/// The same over the mesh when every rank of the machine has a core: the socket buffers
/// keep the link busy, and what they do not take at once is copied and queued, so fewer
/// slices ahead copy less. `allreduce-bench --van tcp`, 2 ranks, 16 MiB: 3.5–3.7 ms with 2
/// or 4 ahead, 6.0 ms with 16. Ranks that outnumber the cores keep 16: each runs further
/// per turn on a core (4 ranks on 2 cores, five runs each: 4 MiB 4.25–4.84 ms with 16
/// ahead, 4.39–4.91 with 4; 16 MiB median 17.8 ms against 19.7).
const MESH_IN_FLIGHT_SLICES: usize = 4;

/// Slices sent ahead in the first hop of a ring of `op`.
fn in_flight(shared: &Shared, op: &Op) -> usize {
    match shared.mesh_waits(op) {
        Some(Spin::Busy(_)) => MESH_IN_FLIGHT_SLICES,
        _ => IN_FLIGHT_SLICES,
    }
}

/// The elements of chunk `i` of `n` of a buffer of `len` elements: rank `i`'s share in
/// [`reduce_scatter`](crate::Communicator::reduce_scatter).
pub fn chunk(len: usize, n: usize, i: usize) -> Range<usize> {
    let at = |i: usize| ((len as u128 * i as u128) / n as u128) as usize;
    at(i)..at(i + 1)
}

/// The slices of `range`, each at most `per` elements (none for an empty range).
pub(crate) fn slices(range: Range<usize>, per: usize) -> impl Iterator<Item = Range<usize>> {
    let per = per.max(1);
    (range.start..range.end)
        .step_by(per)
        .map(move |s| s..(s + per).min(range.end))
}

pub(crate) fn elements_per_slice<T: Element>(shared: &Shared) -> usize {
    (shared.options.slice_bytes / std::mem::size_of::<T>()).max(1)
}

fn ring_neighbours(op: &Op) -> (usize, usize) {
    let n = op.size();
    ((op.rank + 1) % n, (op.rank + n - 1) % n)
}

/// All-reduce of a small buffer in one step: every rank sends its whole buffer to every
/// other and reduces all of them itself, in rank order (so every rank computes the same bits).
/// Each rank sends `n - 1` buffers instead of the ring's `2 (n - 1) / n`, but a result is one
/// message latency away instead of `2 (n - 1)`.
pub(crate) async fn direct<T: Element>(
    shared: &Shared,
    op: &Op,
    buf: &mut [T],
    reduction: ReduceOp,
) -> Result<()> {
    let n = op.size();
    let r = op.rank;
    if n == 1 || buf.is_empty() {
        return Ok(());
    }
    let mine: Vec<T> = buf.to_vec();
    for k in (1..n).map(|d| (r + d) % n) {
        send(shared, op, k, 0, &mine).await?;
    }
    in_rank_order(shared, op, buf, &mine, reduction).await
}

/// Every rank's contribution to `out` combined in rank order (the same bits wherever it is
/// done): rank 0's copied in, then each other's reduced in (this rank's own from `mine`), and
/// a mean divided at the end.
async fn in_rank_order<T: Element>(
    shared: &Shared,
    op: &Op,
    out: &mut [T],
    mine: &[T],
    reduction: ReduceOp,
) -> Result<()> {
    let (n, r) = (op.size(), op.rank);
    for k in 0..n {
        if k == r {
            if k != 0 {
                combine_slice(out, mine, reduction);
            }
            continue;
        }
        let combine = match k {
            0 => Combine::Copy,
            _ => Combine::Reduce(reduction),
        };
        receive(shared, op, k, 0, out, combine).await?;
    }
    if reduction == ReduceOp::Mean {
        for v in out.iter_mut() {
            *v = v.divide(n);
        }
    }
    Ok(())
}

/// Reduce-scatter of a small buffer in one step, as [`direct`] all-reduces: every rank
/// sends each other rank that rank's chunk, and reduces the chunks it receives for its own in
/// rank order. One message latency instead of the ring's `n - 1`.
pub(crate) async fn direct_reduce_scatter<T: Element>(
    shared: &Shared,
    op: &Op,
    buf: &mut [T],
    reduction: ReduceOp,
) -> Result<()> {
    let (n, r, len) = (op.size(), op.rank, buf.len());
    if n == 1 {
        return Ok(());
    }
    for k in (1..n).map(|d| (r + d) % n) {
        send(shared, op, k, 0, &buf[chunk(len, n, k)]).await?;
    }
    let own = chunk(len, n, r);
    let mine: Vec<T> = buf[own.clone()].to_vec();
    in_rank_order(shared, op, &mut buf[own], &mine, reduction).await
}

/// All-gather of small blocks in one step: every rank sends its block to every other.
pub(crate) async fn direct_all_gather<T: Element>(
    shared: &Shared,
    op: &Op,
    input: &[T],
    out: &mut [T],
) -> Result<()> {
    let (n, r, m) = (op.size(), op.rank, input.len());
    out[r * m..(r + 1) * m].copy_from_slice(input);
    for k in (1..n).map(|d| (r + d) % n) {
        send(shared, op, k, 0, input).await?;
    }
    for k in (1..n).map(|d| (r + n - d) % n) {
        receive(
            shared,
            op,
            k,
            0,
            &mut out[k * m..(k + 1) * m],
            Combine::Copy,
        )
        .await?;
    }
    Ok(())
}

/// What [`receive`] does with each slice.
pub(crate) enum Combine {
    /// Copy it into place.
    Copy,
    /// Reduce it into place.
    Reduce(ReduceOp),
}

/// `buf` to rank `to` as hop `hop`, in slices.
pub(crate) async fn send<T: Element>(
    shared: &Shared,
    op: &Op,
    to: usize,
    hop: usize,
    buf: &[T],
) -> Result<()> {
    for (s, range) in slices(0..buf.len(), elements_per_slice::<T>(shared)).enumerate() {
        shared.send_values(op, to, hop, s, &buf[range]).await?;
    }
    Ok(())
}

/// Rank `from`'s hop `hop` into `buf`, copied or combined slice by slice.
pub(crate) async fn receive<T: Element>(
    shared: &Shared,
    op: &Op,
    from: usize,
    hop: usize,
    buf: &mut [T],
    combine: Combine,
) -> Result<()> {
    for (s, range) in slices(0..buf.len(), elements_per_slice::<T>(shared)).enumerate() {
        let out = &mut buf[range];
        match combine {
            Combine::Copy => {
                shared.recv_into(op, from, hop, s, out).await?;
            }
            Combine::Reduce(reduction) => {
                let data = shared.recv(op, from, hop, s, size_of_val(out)).await?;
                reduce_into(out, &data, reduction);
            }
        }
    }
    Ok(())
}

/// Reduce-scatter (`phases` = 1) or all-reduce (`phases` = 2) of `buf` in place.
pub(crate) async fn reduce<T: Element>(
    shared: &Shared,
    op: &Op,
    buf: &mut [T],
    reduction: ReduceOp,
    phases: usize,
) -> Result<()> {
    let n = op.size();
    let r = op.rank;
    let len = buf.len();
    if n == 1 {
        return Ok(());
    }
    let (right, left) = ring_neighbours(op);
    let per = elements_per_slice::<T>(shared);
    let size = std::mem::size_of::<T>();
    let hops = phases * (n - 1);
    // Hop 0: this rank's contribution to the chunk its right neighbour starts reducing, at
    // most `in_flight` ahead of what arrives from the left (the rest goes out as hop
    // 0's slices arrive), so a large buffer is not all queued at once.
    let first: Vec<Range<usize>> = slices(chunk(len, n, (r + n - 1) % n), per).collect();
    let ahead = in_flight(shared, op);
    let mut sent = 0;
    while sent < first.len().min(ahead) {
        shared
            .send_values(op, right, 0, sent, &buf[first[sent].clone()])
            .await?;
        sent += 1;
    }
    for hop in 0..hops {
        // The chunk arriving at this hop; the one sent at hop + 1 is the same chunk.
        let c = (r + 2 * n - hop - 2) % n;
        for (s, range) in slices(chunk(len, n, c), per).enumerate() {
            let forward = if hop < n - 1 {
                let data = shared.recv(op, left, hop, s, range.len() * size).await?;
                let out = &mut buf[range.clone()];
                reduce_into(out, &data, reduction);
                if hop == n - 2 && reduction == ReduceOp::Mean {
                    for v in out.iter_mut() {
                        *v = v.divide(n);
                    }
                }
                None
            } else {
                // Copied as it came: forwarded as it came when it came as a message.
                shared
                    .recv_into(op, left, hop, s, &mut buf[range.clone()])
                    .await?
            };
            if hop == 0 && sent < first.len() {
                shared
                    .send_values(op, right, 0, sent, &buf[first[sent].clone()])
                    .await?;
                sent += 1;
            }
            if hop + 1 < hops {
                match forward {
                    Some(data) => shared.send(op, right, hop + 1, s, data).await?,
                    None => {
                        shared
                            .send_values(op, right, hop + 1, s, &buf[range])
                            .await?
                    }
                }
            }
        }
        // Chunks differ by at most one element, so hop 0 may have a slice more to send than
        // it received.
        while hop == 0 && sent < first.len() {
            shared
                .send_values(op, right, 0, sent, &buf[first[sent].clone()])
                .await?;
            sent += 1;
        }
    }
    Ok(())
}

/// All-gather: `out` is `n` blocks of `input.len()` elements; block `i` ends as rank `i`'s
/// input.
pub(crate) async fn all_gather<T: Element>(
    shared: &Shared,
    op: &Op,
    input: &[T],
    out: &mut [T],
) -> Result<()> {
    let n = op.size();
    let r = op.rank;
    let m = input.len();
    out[r * m..(r + 1) * m].copy_from_slice(input);
    if n == 1 {
        return Ok(());
    }
    let (right, left) = ring_neighbours(op);
    let per = elements_per_slice::<T>(shared);
    // This rank's block, at most `in_flight` ahead of what arrives (as in `reduce`).
    let first: Vec<Range<usize>> = slices(0..m, per).collect();
    let ahead = in_flight(shared, op);
    let mut sent = 0;
    while sent < first.len().min(ahead) {
        shared
            .send_values(op, right, 0, sent, &input[first[sent].clone()])
            .await?;
        sent += 1;
    }
    for hop in 0..n - 1 {
        let block = (r + n - hop - 1) % n;
        for (s, range) in slices(0..m, per).enumerate() {
            let at = block * m + range.start..block * m + range.end;
            let data = shared
                .recv_into(op, left, hop, s, &mut out[at.clone()])
                .await?;
            if hop == 0 && sent < first.len() {
                shared
                    .send_values(op, right, 0, sent, &input[first[sent].clone()])
                    .await?;
                sent += 1;
            }
            if hop + 1 < n - 1 {
                match data {
                    Some(data) => shared.send(op, right, hop + 1, s, data).await?,
                    None => shared.send_values(op, right, hop + 1, s, &out[at]).await?,
                }
            }
        }
    }
    Ok(())
}

/// Broadcast of `buf` from rank `root`: a chain around the ring, slice by slice.
pub(crate) async fn broadcast<T: Element>(
    shared: &Shared,
    op: &Op,
    buf: &mut [T],
    root: usize,
) -> Result<()> {
    let n = op.size();
    if n == 1 {
        return Ok(());
    }
    let (right, left) = ring_neighbours(op);
    let per = elements_per_slice::<T>(shared);
    let len = buf.len();
    let distance = (op.rank + n - root) % n;
    for (s, range) in slices(0..len, per).enumerate() {
        if distance == 0 {
            shared.send_values(op, right, 0, s, &buf[range]).await?;
            continue;
        }
        let data = shared
            .recv_into(op, left, 0, s, &mut buf[range.clone()])
            .await?;
        if distance + 1 < n {
            match data {
                Some(data) => shared.send(op, right, 0, s, data).await?,
                None => shared.send_values(op, right, 0, s, &buf[range]).await?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_buffer_and_differ_by_at_most_one() {
        for len in [0usize, 1, 2, 3, 7, 10, 1000, 1001] {
            for n in 1..6 {
                let ranges: Vec<_> = (0..n).map(|i| chunk(len, n, i)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[n - 1].end, len);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let sizes: Vec<_> = ranges.iter().map(|r| r.len()).collect();
                let (lo, hi) = (sizes.iter().min(), sizes.iter().max());
                assert!(
                    hi.zip(lo).is_some_and(|(h, l)| h - l <= 1),
                    "{len}/{n}: {sizes:?}"
                );
            }
        }
    }

    #[test]
    fn slices_cover_a_range_in_order() {
        let s: Vec<_> = slices(3..10, 3).collect();
        assert_eq!(s, vec![3..6, 6..9, 9..10]);
        assert_eq!(slices(5..5, 3).count(), 0);
    }
}
