//! # collective: all-reduce and friends among a ps cluster's workers
//!
//! A [`Communicator`] joins the workers of a running vans cluster (the postoffice's node
//! table, its failure detection and its vans: each pair of workers talks over the van the
//! selection policy picks for it — shared memory between co-located workers, RDMA when
//! enabled, TCP otherwise) and runs collectives on caller buffers, in place:
//!
//! - [`allreduce`](Communicator::allreduce): when every rank shares this host's memory,
//!   through one shared segment the ranks map (`shm`: each rank copies its buffer in,
//!   reduces its share of every rank's, and copies the result out; no messages); when the
//!   ranks run on several hosts with the same number (2 or more) on each, hierarchically
//!   (a reduce-scatter through each host's shared memory, an all-reduce of each share
//!   between the hosts by the ranks holding it, an all-gather through shared memory);
//!   otherwise ring reduce-scatter then all-gather, sliced and pipelined ([`ring`] explains
//!   the algorithm); buffers up to [`CommOptions::direct_bytes`] go to every rank at once
//!   instead (one message latency), by recursive doubling ([`doubling`]) on 4, 8, 16 …
//!   ranks, and medium buffers on 4 ranks or more by Rabenseifner's algorithm
//!   ([`halving`]). One table ([`select::TABLE`]) says which algorithm every collective
//!   takes, by placement, size and ranks ([`choose`]; `allreduce-bench --explain` prints
//!   it); `VANS_COLLECTIVE_ALGO` ([`CommOptions::algorithm`]) tells one collective, or every
//!   one, to take another (`allreduce:ring,all_gather:direct`), and
//!   [`last_algorithm`](Communicator::last_algorithm) says which one ran;
//! - [`broadcast`](Communicator::broadcast), [`all_gather`](Communicator::all_gather),
//!   [`reduce_scatter`](Communicator::reduce_scatter) (these three through the shared
//!   segment too, when the ranks share it), [`all_to_all`](Communicator::all_to_all),
//!   [`barrier`](Communicator::barrier), and point-to-point [`send`](Communicator::send) and
//!   [`recv`](Communicator::recv);
//! - over `f32`, `f64`, `i32`, `i64`, `u8`, `bf16` and `f16` ([`Element`]) with sum, mean,
//!   min, max and product ([`ReduceOp`]).
//!
//! Every rank must call the same collectives in the same order with buffers of the same
//! length (checked: a mismatch is [`CollectiveError::Mismatch`]). Floating-point results are
//! bit-identical on every rank.
//!
//! **Elastic membership.** The ranks of a [`Generation`] are its member workers in id
//! order. A member that dies fails the collective in progress on every survivor with
//! [`CollectiveError::RankFailed`] naming it (at once when a connection breaks, else within
//! the heartbeat timeout); a worker that starts in its place (ps recovery) asks to join, and
//! the others' next collective fails with [`CollectiveError::MembershipChanged`]. Either
//! way the training loop calls [`settle`](Communicator::settle), which returns the next
//! generation, and goes on:
//!
//! ```no_run
//! # async fn train(po: node::Postoffice) -> collective::Result<()> {
//! use std::time::Duration;
//! let mut comm = collective::Communicator::new(&po).await?;
//! let mut grads = vec![0f32; 1 << 20];
//! for step in 0..100 {
//!     // ... compute grads for this step ...
//!     match comm.allreduce(&mut grads, collective::ReduceOp::Mean).await {
//!         Ok(()) => {} // apply grads
//!         Err(e) => {
//!             eprintln!("step {step}: {e}");
//!             let generation = comm.settle(Duration::from_secs(60)).await?;
//!             eprintln!("now {} ranks", generation.size());
//!             // ... restore the step's state and redo it ...
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```

mod comm;
pub mod doubling;
pub mod element;
pub mod error;
mod exchange;
pub mod halving;
pub mod handle;
mod hosts;
mod mesh;
mod messages;
mod options;
mod pool;
pub mod ring;
pub mod select;
mod shm;
mod spin;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use node::Postoffice;
use tokio::task::JoinHandle;
use van_core::{NodeId, Role};

pub use comm::{Generation, APP_ID};
pub use options::CommOptions;
pub use select::{choose, Algorithm, Algorithms, Collective, Layout, RABENSEIFNER_MAX_BYTES};

pub use element::{Element, ReduceOp};
pub use error::{CollectiveError, Result};
pub use half::{bf16, f16};

use comm::{CommCustomer, OpKind, Shared};

/// A node's handle on the collectives of its cluster's workers (see the [crate docs](crate)).
/// Collectives take `&mut self`: one runs at a time, in the same order on every rank.
pub struct Communicator {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Communicator {
    /// Joins the workers of `po`'s cluster with the options of its configuration
    /// ([`CommOptions::from_config`]), and waits for the first generation (every live worker
    /// that creates a communicator within the settle window is in it).
    pub async fn new(po: &Postoffice) -> Result<Communicator> {
        Communicator::with_options(po, CommOptions::from_config(po.config())).await
    }

    /// As [`new`](Self::new), with explicit options.
    pub async fn with_options(po: &Postoffice, options: CommOptions) -> Result<Communicator> {
        if po.role() != Role::Worker {
            return Err(CollectiveError::InvalidArgument(format!(
                "collectives run among workers; this node is a {}",
                po.role()
            )));
        }
        let customer_id = options.customer_id;
        let startup = options.settle_window + options.settle_window;
        let (shared, queue) = Shared::new(po.clone(), options);
        po.register_customer(
            APP_ID,
            customer_id,
            Arc::new(CommCustomer(Arc::clone(&shared))),
        )
        .await?;
        let task = tokio::spawn(comm::run(Arc::clone(&shared), queue));
        // Dropped on failure: unregisters, so a retry can register again.
        let comm = Communicator { shared, task };
        settle(&comm.shared, startup.max(Duration::from_secs(30))).await?;
        Ok(comm)
    }

    /// Runs one collective of `generation`: a failure (or the call being dropped half-way)
    /// ends this rank's part in the generation, so the others are stopped at once.
    pub(crate) async fn guarded<T>(
        shared: &Shared,
        generation: u64,
        run: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        struct Abandon<'a> {
            shared: &'a Shared,
            generation: u64,
            armed: bool,
        }
        impl Drop for Abandon<'_> {
            fn drop(&mut self) {
                if self.armed {
                    self.shared.abandon(
                        self.generation,
                        &CollectiveError::MembershipChanged {
                            generation: self.generation,
                            reason: "a collective of this rank was cancelled half-way".into(),
                        },
                    );
                }
            }
        }
        let mut guard = Abandon {
            shared,
            generation,
            armed: true,
        };
        // Every rank settles the generation's mesh before its first collective of it runs,
        // and a collective over the mesh ends once its last frames are written.
        let result = match mesh::form::ensure(shared, generation).await {
            Ok(()) => match run.await {
                Ok(value) => shared.flush_mesh(generation).map(|()| value),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        guard.armed = false;
        if let Err(e) = &result {
            shared.abandon(generation, e);
        }
        result
    }

    /// The current generation (number and members).
    pub fn generation(&self) -> Generation {
        self.shared.generation()
    }

    /// This node's rank in the current generation (`None` when it is not a member).
    pub fn rank(&self) -> Option<usize> {
        self.generation().rank_of(self.shared.me)
    }

    /// The number of ranks of the current generation.
    pub fn size(&self) -> usize {
        self.generation().size()
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        self.shared.me
    }

    /// The algorithm the last all-reduce, reduce-scatter, all-gather, broadcast or barrier
    /// of this communicator took (`Shm` or `Hier` through shared memory), as [`choose`]
    /// picked it from the placement the node table gives; for a call that failed by
    /// messages, the one it tried; `None` before the first.
    pub fn last_algorithm(&self) -> Option<Algorithm> {
        let took = self.shared.took.load(std::sync::atomic::Ordering::Relaxed);
        Algorithm::ALL
            .get(usize::from(took).checked_sub(1)?)
            .copied()
    }

    /// Waits for the membership to settle: after a failed collective, asks to join the next
    /// generation and returns it once formed (with this node as a member); when the current
    /// generation is intact, returns it at once. Fails with
    /// [`CollectiveError::SettleTimeout`] after `timeout`.
    pub async fn settle(&mut self, timeout: Duration) -> Result<Generation> {
        settle(&self.shared, timeout).await
    }

    /// Reduces `buf` across all ranks with `op`, in place: every rank ends with the same
    /// result.
    pub async fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let call = self
            .shared
            .begin_carrying::<T>(OpKind::AllReduce, buf.len(), |_, _| Ok(()))?;
        let run = run_allreduce(&self.shared, &call, buf, op);
        Self::guarded(&self.shared, call.generation, run).await
    }

    /// Reduces `buf` across all ranks with `op`, leaving each rank's share of the result in
    /// place: returns the range of `buf` this rank owns (chunk `rank` of `size`, sizes
    /// differing by at most one element). The rest of `buf` holds partial sums.
    pub async fn reduce_scatter<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<Range<usize>> {
        let call = self
            .shared
            .begin_carrying::<T>(OpKind::ReduceScatter, buf.len(), |_, _| Ok(()))?;
        let run = run_reduce_scatter(&self.shared, &call, buf, op);
        Self::guarded(&self.shared, call.generation, run).await?;
        Ok(ring::chunk(buf.len(), call.size(), call.rank))
    }

    /// Gathers every rank's `input` (all of the same length) into `out`, block `i` from rank
    /// `i`; `out` must hold `size × input.len()` elements.
    pub async fn all_gather<T: Element>(&mut self, input: &[T], out: &mut [T]) -> Result<()> {
        let (n, total) = (input.len(), out.len());
        let call = self
            .shared
            .begin_carrying::<T>(OpKind::AllGather, out.len(), |size, _| {
                check_gather(n, total, size)
            })?;
        let run = run_all_gather(&self.shared, &call, input, out);
        Self::guarded(&self.shared, call.generation, run).await
    }

    /// Copies rank `root`'s `buf` into every other rank's.
    pub async fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        let call = self
            .shared
            .begin_carrying::<T>(OpKind::Broadcast, buf.len(), |size, _| {
                check_root(root, size)
            })?;
        let run = run_broadcast(&self.shared, &call, buf, root);
        Self::guarded(&self.shared, call.generation, run).await
    }

    /// All-to-all: block `k` of `input` (of `send_counts[k]` elements) goes to rank `k`,
    /// and rank `k`'s block for this rank lands in block `k` of `out` (of
    /// `recv_counts[k]` elements). Each rank's `recv_counts[k]` must be rank `k`'s
    /// `send_counts` for it (checked on arrival: [`CollectiveError::Mismatch`]).
    pub async fn all_to_all<T: Element>(
        &mut self,
        input: &[T],
        send_counts: &[usize],
        out: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let mut offsets = None;
        let call = self
            .shared
            .begin(OpKind::AllToAll, |size, rank| {
                offsets = Some((
                    exchange::offsets(send_counts, size, input.len(), "input")?,
                    exchange::offsets(recv_counts, size, out.len(), "output")?,
                ));
                exchange::own_block(send_counts, recv_counts, rank)
            })?
            .carrying::<T>(0);
        let (send, recv) = offsets.unwrap_or_default();
        let run = exchange::all_to_all(&self.shared, &call, input, &send, out, &recv);
        Self::guarded(&self.shared, call.generation, run).await
    }

    /// Sends `buf` to rank `to` under `tag` (a number of the caller's, 0 or more): the
    /// `n`-th send of a tag to a rank meets that rank's `n`-th [`recv`](Self::recv) of it,
    /// whatever collectives run meanwhile. Completes once the message is handed to the van.
    /// Takes `&self`: sends and receives may run beside a collective.
    pub async fn send<T: Element>(&self, buf: &[T], to: usize, tag: i32) -> Result<()> {
        let tag = p2p_tag(tag)?;
        let call = self.shared.begin_p2p(to, tag as i32, true)?;
        let call = call.carrying::<T>(buf.len());
        let run = exchange::send(&self.shared, &call, to, tag, buf);
        Self::guarded(&self.shared, call.generation, run).await
    }

    /// Receives into `buf` what rank `from` sends under `tag` (see [`send`](Self::send));
    /// the sender's buffer must have `buf`'s length and element type.
    pub async fn recv<T: Element>(&self, buf: &mut [T], from: usize, tag: i32) -> Result<()> {
        let tag = p2p_tag(tag)?;
        let call = self.shared.begin_p2p(from, tag as i32, false)?;
        let call = call.carrying::<T>(buf.len());
        let run = exchange::recv(&self.shared, &call, from, tag, buf);
        Self::guarded(&self.shared, call.generation, run).await
    }

    /// Returns once every rank has called it: an all-reduce of one token per rank, through
    /// shared memory when every rank shares this host (the ranks spin there, as around their
    /// other collectives, instead of sleeping on messages).
    pub async fn barrier(&mut self) -> Result<()> {
        let call = self
            .shared
            .begin_carrying::<i32>(OpKind::Barrier, 1, |_, _| Ok(()))?;
        let run = run_barrier(&self.shared, &call, self.shared.me);
        Self::guarded(&self.shared, call.generation, run).await
    }
}

/// Settles into the next generation (or the current one) and settles its TCP mesh
/// ([`mesh::form::ensure`]).
pub(crate) async fn settle(shared: &comm::Shared, timeout: Duration) -> Result<Generation> {
    let generation = shared.settle(timeout).await?;
    // Formed here when it can be (a failure shows in the next collective, which asks again).
    let _ = mesh::form::ensure(shared, generation.number).await;
    Ok(generation)
}

/// Runs `what` through shared memory when `call` holds a ticket for it (on one host, or
/// hierarchically across hosts): `Ok(true)` when done there. Without a ticket (or a group),
/// `Ok(false)`, unless `VANS_COLLECTIVE_ALGO` told the collective to take `shm` or `hier`:
/// then an error saying why it cannot be had.
async fn through_shared_memory<T: Element>(
    shared: &comm::Shared,
    call: &comm::Op,
    what: shm::Collective<'_, T>,
) -> Result<bool> {
    let collective = call.kind.collective();
    let told = collective.map(|c| shared.options.algorithm.of(c));
    let name = collective.map_or("", Collective::as_str);
    match (call.shm_ticket, told) {
        (Some(ticket), _) => shm::run(shared, call, ticket, what).await,
        // A barrier goes by messages where it must: it carries no buffer to share.
        (None, Some(Algorithm::Shm))
            if call.size() > 1 && call.total > 0 && call.kind != comm::OpKind::Barrier =>
        {
            Err(CollectiveError::InvalidArgument(format!(
                "VANS_COLLECTIVE_ALGO tells {name} to take shm, but the ranks do not all share \
                 this host's memory (another host, shared memory disabled, or this build lacks \
                 the ipc feature)"
            )))
        }
        (None, Some(Algorithm::Hier)) if call.total > 0 => {
            Err(CollectiveError::InvalidArgument(format!(
                "VANS_COLLECTIVE_ALGO tells {name} to take hier, but the ranks do not run on \
                 several hosts with the same number (2 or more) on each, sharing memory there \
                 (shared memory disabled, or this build lacks the ipc feature)"
            )))
        }
        _ => Ok(false),
    }
}

/// The path of `call` on `bytes` (the whole buffer): `None` when it went through shared
/// memory (`what`, done), else the message algorithm [`select::by_messages`] picks. Either
/// way recorded as the communicator's [`last_algorithm`](Communicator::last_algorithm).
async fn path<T: Element>(
    shared: &comm::Shared,
    call: &comm::Op,
    collective: Collective,
    bytes: usize,
    what: shm::Collective<'_, T>,
) -> Result<Option<Algorithm>> {
    let (took, by_messages) = match through_shared_memory(shared, call, what).await? {
        true if call.hosts.is_some() => (Algorithm::Hier, None),
        true => (Algorithm::Shm, None),
        false => {
            let algorithm = select::by_messages(&shared.options, collective, bytes, call.size());
            (algorithm, Some(algorithm))
        }
    };
    let code = Algorithm::ALL
        .iter()
        .position(|a| *a == took)
        .map_or(0, |i| i + 1);
    shared
        .took
        .store(code as u8, std::sync::atomic::Ordering::Relaxed);
    Ok(by_messages)
}

/// All-reduce of a numbered collective, by the algorithm [`choose`] picks.
pub(crate) async fn run_allreduce<T: Element>(
    shared: &comm::Shared,
    call: &comm::Op,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let bytes = std::mem::size_of_val(buf);
    let what = shm::Collective::AllReduce(&mut *buf, op);
    match path(shared, call, Collective::AllReduce, bytes, what).await? {
        None => Ok(()),
        Some(algorithm) => messages::allreduce(shared, call, buf, op, algorithm).await,
    }
}

/// Reduce-scatter of a numbered collective, by the algorithm [`choose`] picks.
pub(crate) async fn run_reduce_scatter<T: Element>(
    shared: &comm::Shared,
    call: &comm::Op,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let bytes = std::mem::size_of_val(buf);
    let what = shm::Collective::ReduceScatter(&mut *buf, op);
    match path(shared, call, Collective::ReduceScatter, bytes, what).await? {
        None => Ok(()),
        Some(Algorithm::Halving) => halving::reduce_scatter(shared, call, buf, op).await,
        Some(Algorithm::Direct) => ring::direct_reduce_scatter(shared, call, buf, op).await,
        Some(_) => ring::reduce(shared, call, buf, op, 1).await,
    }
}

/// All-gather of a numbered collective, by the algorithm [`choose`] picks.
pub(crate) async fn run_all_gather<T: Element>(
    shared: &comm::Shared,
    call: &comm::Op,
    input: &[T],
    out: &mut [T],
) -> Result<()> {
    let bytes = std::mem::size_of_val(out);
    let what = shm::Collective::AllGather(input, &mut *out);
    match path(shared, call, Collective::AllGather, bytes, what).await? {
        None => Ok(()),
        Some(Algorithm::Doubling) => halving::all_gather(shared, call, input, out).await,
        Some(Algorithm::Direct) => ring::direct_all_gather(shared, call, input, out).await,
        Some(_) => ring::all_gather(shared, call, input, out).await,
    }
}

/// Broadcast of a numbered collective: through shared memory, else around the ring.
pub(crate) async fn run_broadcast<T: Element>(
    shared: &comm::Shared,
    call: &comm::Op,
    buf: &mut [T],
    root: usize,
) -> Result<()> {
    let bytes = std::mem::size_of_val(buf);
    let what = shm::Collective::Broadcast(&mut *buf, root);
    match path(shared, call, Collective::Broadcast, bytes, what).await? {
        None => Ok(()),
        Some(_) => ring::broadcast(shared, call, buf, root).await,
    }
}

/// A barrier of a numbered collective (carrying one `i32`): an all-reduce of each rank's
/// token, so each rank hears from all.
pub(crate) async fn run_barrier(shared: &comm::Shared, call: &comm::Op, me: NodeId) -> Result<()> {
    // Every rank's result holds every rank's token: none returns before all have called.
    let mut token = [1i32];
    let what = shm::Collective::AllReduce(&mut token[..], ReduceOp::Sum);
    if let Some(algorithm) = path(shared, call, Collective::Barrier, 4, what).await? {
        messages::allreduce(shared, call, &mut token, ReduceOp::Sum, algorithm).await?;
    }
    let expected = call.size() as i32;
    match token[0] == expected {
        true => Ok(()),
        false => Err(CollectiveError::Mismatch {
            rank: call.rank,
            node: me,
            reason: format!("barrier tokens summed to {}, expected {expected}", token[0]),
        }),
    }
}

/// A broadcast's root must be a rank.
pub(crate) fn check_root(root: usize, size: usize) -> Result<()> {
    if root < size {
        return Ok(());
    }
    Err(CollectiveError::InvalidArgument(format!(
        "broadcast from rank {root} in a generation of {size} ranks"
    )))
}

/// An all-gather's output holds one input per rank.
pub(crate) fn check_gather(input: usize, out: usize, size: usize) -> Result<()> {
    if out == input * size {
        return Ok(());
    }
    Err(CollectiveError::InvalidArgument(format!(
        "all_gather of {input} elements among {size} ranks needs an output of {}, not {out}",
        input * size
    )))
}

/// A point-to-point tag as the wire carries it.
pub(crate) fn p2p_tag(tag: i32) -> Result<u32> {
    u32::try_from(tag).map_err(|_| {
        CollectiveError::InvalidArgument(format!("tag {tag} is negative; tags are 0 or more"))
    })
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.task.abort();
        self.shared
            .po
            .unregister_customer(APP_ID, self.shared.options.customer_id);
    }
}
