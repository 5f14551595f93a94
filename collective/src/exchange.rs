//! Exchanges that reduce nothing: all-to-all (every rank sends a block to every other,
//! blocks of any sizes) and point-to-point send and receive between two ranks.
//!
//! All-to-all sends each block straight to its rank (one hop, in slices), starting with the
//! next rank up so that not every rank sends to rank 0 first. A point-to-point message is
//! numbered by its pair's own count ([`Shared::begin_p2p`]), so sends and receives between
//! two ranks meet in order whatever collectives run meanwhile.

use crate::comm::{Op, Shared};
use crate::element::Element;
use crate::error::{CollectiveError, Result};
use crate::ring::slices;

/// Where each rank's block starts in a buffer cut into blocks of `counts` elements, and the
/// total; an error unless `counts` has one entry per rank and they add up to `len`.
///
/// Callers also check that a rank's block to itself has the same size both ways
/// ([`own_block`]).
pub(crate) fn offsets(
    counts: &[usize],
    ranks: usize,
    len: usize,
    what: &str,
) -> Result<Vec<usize>> {
    if counts.len() != ranks {
        return Err(CollectiveError::InvalidArgument(format!(
            "all_to_all among {ranks} ranks needs {ranks} {what} counts, not {}",
            counts.len()
        )));
    }
    let mut at = Vec::with_capacity(ranks + 1);
    let mut total = 0usize;
    for &count in counts {
        at.push(total);
        total = total.checked_add(count).ok_or_else(|| {
            CollectiveError::InvalidArgument(format!("{what} counts overflow: {counts:?}"))
        })?;
    }
    at.push(total);
    if total != len {
        return Err(CollectiveError::InvalidArgument(format!(
            "the {what} counts {counts:?} add up to {total} elements, but the {what} buffer \
             holds {len}"
        )));
    }
    Ok(at)
}

/// This rank's block to itself is copied across: its send and receive counts must agree.
pub(crate) fn own_block(send: &[usize], recv: &[usize], rank: usize) -> Result<()> {
    match (send.get(rank), recv.get(rank)) {
        (Some(s), Some(r)) if s == r => Ok(()),
        (s, r) => Err(CollectiveError::InvalidArgument(format!(
            "all_to_all: rank {rank} sends itself {s:?} elements but expects {r:?} from itself"
        ))),
    }
}

/// All-to-all: block `k` of `input` (`send` offsets) goes to rank `k`, and rank `k`'s block
/// for this rank lands in block `k` of `out` (`recv` offsets). A peer that sends a block of
/// another size than this rank expects fails with [`CollectiveError::Mismatch`].
pub(crate) async fn all_to_all<T: Element>(
    shared: &Shared,
    op: &Op,
    input: &[T],
    send: &[usize],
    out: &mut [T],
    recv: &[usize],
) -> Result<()> {
    let n = op.size();
    let r = op.rank;
    let per = (shared.options.slice_bytes / std::mem::size_of::<T>()).max(1);
    out[recv[r]..recv[r + 1]].copy_from_slice(&input[send[r]..send[r + 1]]);
    // Each message carries its block's element count, which the receiver checks against its
    // own count for that peer: a block of another size is a Mismatch, never a silent prefix.
    let counted = |total: usize| Op {
        total,
        ..op.clone()
    };
    for k in (1..n).map(|d| (r + d) % n) {
        let block = send[k]..send[k + 1];
        let op = &counted(block.len());
        // An empty block still travels (one empty slice): the receiver counts on it.
        let mut sent = false;
        for (s, range) in slices(block.clone(), per).enumerate() {
            shared.send_values(op, k, 0, s, &input[range]).await?;
            sent = true;
        }
        if !sent {
            shared.send(op, k, 0, 0, bytes::Bytes::new()).await?;
        }
    }
    for k in (1..n).map(|d| (r + n - d) % n) {
        let block = recv[k]..recv[k + 1];
        let op = &counted(block.len());
        if block.is_empty() {
            shared.recv(op, k, 0, 0, 0).await?;
            continue;
        }
        for (s, range) in slices(block, per).enumerate() {
            shared.recv_into(op, k, 0, s, &mut out[range]).await?;
        }
    }
    Ok(())
}

/// Sends `buf` to rank `to` under `tag` (`op` from [`Shared::begin_p2p`], carrying the
/// buffer's length, which the receiver checks against its own).
pub(crate) async fn send<T: Element>(
    shared: &Shared,
    op: &Op,
    to: usize,
    tag: u32,
    buf: &[T],
) -> Result<()> {
    let per = (shared.options.slice_bytes / std::mem::size_of::<T>()).max(1);
    let mut sent = false;
    for (s, range) in slices(0..buf.len(), per).enumerate() {
        shared
            .send_values(op, to, tag as usize, s, &buf[range])
            .await?;
        sent = true;
    }
    if !sent {
        shared
            .send(op, to, tag as usize, 0, bytes::Bytes::new())
            .await?;
    }
    Ok(())
}

/// Receives into `buf` what rank `from` sent under `tag` (see [`send`]).
pub(crate) async fn recv<T: Element>(
    shared: &Shared,
    op: &Op,
    from: usize,
    tag: u32,
    buf: &mut [T],
) -> Result<()> {
    let per = (shared.options.slice_bytes / std::mem::size_of::<T>()).max(1);
    if buf.is_empty() {
        shared.recv(op, from, tag as usize, 0, 0).await?;
        return Ok(());
    }
    for (s, range) in slices(0..buf.len(), per).enumerate() {
        shared
            .recv_into(op, from, tag as usize, s, &mut buf[range])
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_check_the_counts() {
        assert_eq!(
            offsets(&[2, 0, 3], 3, 5, "input").ok(),
            Some(vec![0, 2, 2, 5])
        );
        let short = offsets(&[2, 3], 3, 5, "input").err().map(|e| e.to_string());
        assert!(short.is_some_and(|e| e.contains("needs 3 input counts, not 2")));
        let wrong = offsets(&[2, 2, 2], 3, 5, "output")
            .err()
            .map(|e| e.to_string());
        assert!(wrong.is_some_and(|e| e.contains("add up to 6 elements")));
        let huge = offsets(&[usize::MAX, 2], 2, 5, "input")
            .err()
            .map(|e| e.to_string());
        assert!(huge.is_some_and(|e| e.contains("overflow")));
    }

    #[test]
    fn a_ranks_block_to_itself_must_match_both_ways() {
        assert!(own_block(&[1, 3], &[1, 5], 0).is_ok());
        let e = own_block(&[1, 3], &[2, 2], 0).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("rank 0 sends itself Some(1)")));
        assert!(own_block(&[1], &[1], 3).is_err());
    }
}
