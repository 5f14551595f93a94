//! # collective: all-reduce and friends among a ps cluster's workers
//!
//! A [`Communicator`] joins the workers of a running [`ps`] cluster (the postoffice's node
//! table, its failure detection and its vans: each pair of workers talks over the van the
//! selection policy picks for it — shared memory between co-located workers, RDMA when
//! enabled, TCP otherwise) and runs collectives on caller buffers, in place:
//!
//! - [`allreduce`](Communicator::allreduce): ring reduce-scatter then all-gather, sliced and
//!   pipelined ([`ring`] explains the algorithm); buffers up to
//!   [`CommOptions::direct_bytes`] go to every rank at once instead (one message latency);
//! - [`broadcast`](Communicator::broadcast), [`all_gather`](Communicator::all_gather),
//!   [`reduce_scatter`](Communicator::reduce_scatter), [`barrier`](Communicator::barrier);
//! - over `f32`, `f64`, `i32`, `i64` and `bf16` ([`Element`]) with sum, mean, min and max
//!   ([`ReduceOp`]).
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
//! # async fn train(po: ps::Postoffice) -> collective::Result<()> {
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
pub mod element;
pub mod embed;
pub mod error;
mod pool;
pub mod ring;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use ps::Postoffice;
use tokio::task::JoinHandle;
use van_core::{NodeId, Role};

pub use comm::{CommOptions, Generation, APP_ID};
pub use element::{Element, ReduceOp};
pub use error::{CollectiveError, Result};
pub use half::bf16;

use comm::{Inbox, OpKind, Shared};

/// A node's handle on the collectives of its cluster's workers (see the [crate docs](crate)).
/// Collectives take `&mut self`: one runs at a time, in the same order on every rank.
pub struct Communicator {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Communicator {
    /// Joins the workers of `po`'s cluster with [`CommOptions::from_env`], and waits for the
    /// first generation (every live worker that creates a communicator within the settle
    /// window is in it).
    pub async fn new(po: &Postoffice) -> Result<Communicator> {
        Communicator::with_options(po, CommOptions::from_env()?).await
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
        po.register_customer(APP_ID, customer_id, Arc::new(Inbox(Arc::clone(&shared))))
            .await?;
        let task = tokio::spawn(comm::run(Arc::clone(&shared), queue));
        // Dropped on failure: unregisters, so a retry can register again.
        let comm = Communicator { shared, task };
        comm.shared
            .settle(startup.max(Duration::from_secs(30)))
            .await?;
        Ok(comm)
    }

    /// Runs one collective of `generation`: a failure (or the call being dropped half-way)
    /// ends this rank's part in the generation, so the others are stopped at once.
    async fn guarded<T>(
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
        let result = run.await;
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

    /// Waits for the membership to settle: after a failed collective, asks to join the next
    /// generation and returns it once formed (with this node as a member); when the current
    /// generation is intact, returns it at once. Fails with
    /// [`CollectiveError::SettleTimeout`] after `timeout`.
    pub async fn settle(&mut self, timeout: Duration) -> Result<Generation> {
        self.shared.settle(timeout).await
    }

    /// Reduces `buf` across all ranks with `op`, in place: every rank ends with the same
    /// result.
    pub async fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let call = self
            .shared
            .begin(OpKind::AllReduce, |_| Ok(()))?
            .carrying::<T>(buf.len());
        let shared = &self.shared;
        let run = async {
            if std::mem::size_of_val(buf) <= shared.options.direct_bytes {
                ring::direct(shared, &call, buf, op).await
            } else {
                ring::reduce(shared, &call, buf, op, 2).await
            }
        };
        Self::guarded(shared, call.generation, run).await
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
            .begin(OpKind::ReduceScatter, |_| Ok(()))?
            .carrying::<T>(buf.len());
        let run = ring::reduce(&self.shared, &call, buf, op, 1);
        Self::guarded(&self.shared, call.generation, run).await?;
        Ok(ring::chunk(buf.len(), call.size(), call.rank))
    }

    /// Gathers every rank's `input` (all of the same length) into `out`, block `i` from rank
    /// `i`; `out` must hold `size × input.len()` elements.
    pub async fn all_gather<T: Element>(&mut self, input: &[T], out: &mut [T]) -> Result<()> {
        let call = self
            .shared
            .begin(OpKind::AllGather, |size| {
                if out.len() == input.len() * size {
                    return Ok(());
                }
                Err(CollectiveError::InvalidArgument(format!(
                    "all_gather of {} elements among {size} ranks needs an output of {}, not {}",
                    input.len(),
                    input.len() * size,
                    out.len()
                )))
            })?
            .carrying::<T>(out.len());
        let run = ring::all_gather(&self.shared, &call, input, out);
        Self::guarded(&self.shared, call.generation, run).await
    }

    /// Copies rank `root`'s `buf` into every other rank's.
    pub async fn broadcast<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        let call = self
            .shared
            .begin(OpKind::Broadcast, |size| {
                if root < size {
                    return Ok(());
                }
                Err(CollectiveError::InvalidArgument(format!(
                    "broadcast from rank {root} in a generation of {size} ranks"
                )))
            })?
            .carrying::<T>(buf.len());
        let run = ring::broadcast(&self.shared, &call, buf, root);
        Self::guarded(&self.shared, call.generation, run).await
    }

    /// Returns once every rank has called it.
    pub async fn barrier(&mut self) -> Result<()> {
        let call = self.shared.begin(OpKind::Barrier, |_| Ok(()))?;
        // One element per rank: every chunk travels, so each rank hears from all.
        let size = call.size();
        let call = call.carrying::<i32>(size);
        let mut token = vec![1i32; size];
        let run = ring::reduce(&self.shared, &call, &mut token, ReduceOp::Sum, 2);
        Self::guarded(&self.shared, call.generation, run).await?;
        let expected = call.size() as i32;
        match token.iter().all(|&v| v == expected) {
            true => Ok(()),
            false => Err(CollectiveError::Mismatch {
                rank: call.rank,
                node: self.shared.me,
                reason: format!("barrier tokens {token:?}, expected {expected} each"),
            }),
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.task.abort();
        self.shared
            .po
            .unregister_customer(APP_ID, self.shared.options.customer_id);
    }
}
