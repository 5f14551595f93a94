//! The shared-memory collectives' names in a build without them (no `ipc` feature, or not
//! Linux): no collective gets a ticket, so [`run`] is never reached.

use crate::comm::{Op, Shared};
use crate::element::{Element, ReduceOp};
use crate::error::Result;

/// What a collective does through a formed group (see the `ipc` build's `shm` module).
#[allow(dead_code)]
pub(crate) enum Collective<'a, T> {
    AllReduce(&'a mut [T], ReduceOp),
    AllGather(&'a [T], &'a mut [T]),
    ReduceScatter(&'a mut [T], ReduceOp),
    Broadcast(&'a mut [T], usize),
}

/// Never through shared memory in this build.
pub(crate) async fn run<T: Element>(
    _shared: &Shared,
    _call: &Op,
    _ticket: u64,
    _what: Collective<'_, T>,
) -> Result<bool> {
    Ok(false)
}
