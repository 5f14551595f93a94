//! The all-reduce by messages: the dispatch to the message algorithm [`crate::choose`] picks
//! (also the share a hierarchical all-reduce sends between hosts).

use crate::comm::{Op, Shared};
use crate::element::{Element, ReduceOp};
use crate::error::Result;
use crate::select::Algorithm;
use crate::{doubling, halving, ring};

/// All-reduce of a numbered collective by `algorithm`, a message algorithm
/// ([`crate::select::by_messages`]); the ring for any other.
pub(crate) async fn allreduce<T: Element>(
    shared: &Shared,
    call: &Op,
    buf: &mut [T],
    op: ReduceOp,
    algorithm: Algorithm,
) -> Result<()> {
    match algorithm {
        Algorithm::Direct => ring::direct(shared, call, buf, op).await,
        Algorithm::Doubling => doubling::allreduce(shared, call, buf, op).await,
        Algorithm::Rabenseifner => halving::allreduce(shared, call, buf, op).await,
        _ => ring::reduce(shared, call, buf, op, 2).await,
    }
}
