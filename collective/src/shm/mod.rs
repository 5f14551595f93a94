//! Collectives through shared memory, for a generation whose ranks all share this host:
//! all-reduce, all-gather, reduce-scatter, broadcast and barrier with no messages and no van,
//! and no copy but one into the segment and one out of it (none in for an all-reduce's buffer
//! in the IPC van's arena, from `Postoffice::alloc`). For a generation on several hosts with
//! the same number of ranks on each, each host's ranks form a group of their own, and the
//! all-reduce goes hierarchically (`run::hierarchical`): a reduce-scatter through the host's
//! group, an all-reduce of each share between the hosts by messages, an all-gather through
//! the group.
//!
//! **The group.** On a generation's first such collective, rank 0 creates a sealed memfd
//! segment ([`van_ipc::Segment`]) and the ranks exchange, over the vans (two small direct
//! all-reduces numbered apart from the collectives'), a row each: process id, pid namespace,
//! rank 0's descriptor number and a random token, and the descriptor number and length of
//! the rank's IPC arena. Every other rank opens the memfd through `/proc/<pid>/fd/<fd>` (the
//! same user may), checks the seals, the length and the token, and all say whether they got
//! it (and, on one host, whether they mapped every rank's arena too); only if every rank did
//! does the generation use the segment (across hosts, each host's ranks vote on their group,
//! then the hosts vote: every rank takes the same path). Otherwise (different pid
//! namespaces, a `/proc` that refuses) it takes the message algorithms, or fails when
//! `VANS_COLLECTIVE_ALGO=shm` asked for shared memory. A
//! memfd has no name: a crash leaves nothing in `/dev/shm`, and the memory goes with the
//! last rank that maps it. A new generation makes a new segment.
//!
//! **The segment** ([`group`]). A header (magic, token, ranks, slot size; the abort word,
//! the sleepers and the futex word; a cache line per rank with its progress counter and, for
//! its last two chunks, their signatures and where an all-reduce's chunk lies), then two
//! slots per rank of
//! [`CommOptions::slice_bytes`](crate::CommOptions::slice_bytes) each.
//!
//! **The algorithms** ([`reduce`], [`gather`]). A buffer goes through in chunks of a slot;
//! each chunk's slots alternate between the two of each rank, so a rank writes the next chunk
//! while others still read the last, and it rewrites a slot only after it saw every rank move
//! past it. All-reduce: every rank copies its chunk into its slot (or, above 16 KiB in a
//! buffer up to 8 MiB in its arena, says where it lies) and publishes; then, for
//! chunks up to [`reduce::SMALL_BYTES`], every rank reduces all the slots into its own buffer
//! (one wait); above, rank `r` reduces share `r` of every slot into its own slot, publishes,
//! and every rank copies the reduced shares out (two waits, `1/n` of the reduction each).
//! Every element is `slot 0 ⊕ slot 1 ⊕ … ⊕ slot n-1` in that order, so every rank gets the
//! same bits. All-gather copies in and then every slot out; reduce-scatter puts a piece of
//! every rank's block in each chunk (ranks 0 and 1 keep their own out) and rank `r` reduces
//! its piece; broadcast has the root
//! copy in and the others copy out. Each chunk's first publication carries the collective's
//! signature (number, kind, element type, length), checked by the ranks that wait for it:
//! ranks that disagree fail with [`CollectiveError::Mismatch`](crate::CollectiveError::Mismatch) instead of mixing buffers.
//!
//! A rank on a current-thread tokio runtime votes against the segment: its waits would
//! stop its vans' writers (see `spin::can_block`).
//!
//! **Waiting** ([`signal`]): spin on the counters for `VANS_COLLECTIVE_SPIN_US` (1 ms: longer
//! than a futex wake-up takes in a virtual machine), or, when the ranks outnumber the cores
//! this process may use, yield the core for as long (spinning would only steal the core the
//! awaited rank needs); then sleep on a futex in the segment. The collective blocks its thread
//! meanwhile (`block_in_place` on a multi-thread runtime). A rank that fails or leaves sets
//! the abort word, which stops every waiter at once; a sleeper also checks the generation and
//! the peers' processes every 10 ms, so a rank killed with `SIGKILL` is named within that.
//!
//! Collectives are numbered when called and may run concurrently on the node's runtime
//! ([`crate::handle`]); those that take this path get a *ticket* when numbered and run in
//! ticket order ([`turns::Turns`]), since they share the slots.
//!
//! Without shared memory compiled in (no `ipc` feature, or not Linux) only [`Collective`]
//! and a [`run`](fn@run) that never takes this path remain.
#[cfg(all(feature = "ipc", target_os = "linux"))]
mod gather;
#[cfg(all(feature = "ipc", target_os = "linux"))]
pub(crate) mod group;
#[cfg(all(feature = "ipc", target_os = "linux"))]
pub(crate) mod reduce;
#[cfg(all(feature = "ipc", target_os = "linux"))]
mod run;
#[cfg(all(feature = "ipc", target_os = "linux"))]
mod signal;
#[cfg(all(feature = "ipc", target_os = "linux"))]
pub(crate) mod turns;

#[cfg(all(feature = "ipc", target_os = "linux"))]
pub(crate) use run::run;

/// What a collective does through a formed group.
#[cfg_attr(not(all(feature = "ipc", target_os = "linux")), allow(dead_code))]
pub(crate) enum Collective<'a, T> {
    AllReduce(&'a mut [T], crate::element::ReduceOp),
    AllGather(&'a [T], &'a mut [T]),
    ReduceScatter(&'a mut [T], crate::element::ReduceOp),
    Broadcast(&'a mut [T], usize),
}

/// Never through shared memory in a build without it: no collective gets a ticket.
#[cfg(not(all(feature = "ipc", target_os = "linux")))]
pub(crate) async fn run<T: crate::element::Element>(
    _shared: &crate::comm::Shared,
    _call: &crate::comm::Op,
    _ticket: u64,
    _what: Collective<'_, T>,
) -> crate::error::Result<bool> {
    Ok(false)
}

#[cfg(all(test, feature = "ipc", target_os = "linux"))]
mod tests;
