//! [`CommHandle`]: a communicator on a [`NodeHandle`]'s runtime, for plain threads and the
//! bindings (Python, C, the PyTorch backend). Each collective takes its buffers by value
//! ([`Buffer`]: a `Vec`, or memory a binding lends) and gives them back when it completes,
//! so no caller memory is touched after the call ends, even when the caller stops waiting
//! (a timeout, an interrupt).
//!
//! A collective is *numbered when it is called*, not when it runs: calls made one after
//! another from one thread are matched across ranks in that order even though they run
//! concurrently on the node's runtime (a PyTorch job issues all-reduces for several gradient
//! buckets at once and waits later). Point-to-point sends and receives are numbered per
//! pair and tag the same way.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use node::handle::{Call, NodeHandle};

use crate::comm::{OpKind, Shared};
use crate::{exchange, ring, CollectiveError, Communicator, Element, Generation, ReduceOp, Result};

/// Memory a collective works in until it completes: owned, or lent by a caller that keeps it
/// alive and leaves it alone until the call's result is taken (the bindings' pinned arrays).
pub trait Buffer<T>: Send + 'static {
    /// The elements.
    fn elements(&self) -> &[T];
    /// The elements, for writing.
    fn elements_mut(&mut self) -> &mut [T];
}

impl<T: Element> Buffer<T> for Vec<T> {
    fn elements(&self) -> &[T] {
        self
    }
    fn elements_mut(&mut self) -> &mut [T] {
        self
    }
}

/// A node's communicator with the node's runtime; cheap to clone, thread-safe. See the
/// [module docs](self) for how concurrent calls are ordered.
#[derive(Clone)]
pub struct CommHandle {
    node: NodeHandle,
    comm: Arc<Communicator>,
}

impl std::fmt::Debug for CommHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommHandle")
            .field("node", &self.node.id())
            .field("generation", &self.generation().number)
            .finish_non_exhaustive()
    }
}

/// A collective numbered when it was called and not yet running: [`call`](Self::call) runs it
/// as a [`Call`] to wait for, [`on_complete`](Self::on_complete) runs it as one task on the
/// node's runtime that hands the result to a callback (no thread waits, no second task).
#[must_use = "a numbered collective does nothing until it is run; the other ranks wait for it"]
pub struct Numbered<R: Send + 'static> {
    node: NodeHandle,
    run: std::pin::Pin<Box<dyn Future<Output = Result<R>> + Send>>,
}

impl<R: Send + 'static> Numbered<R> {
    /// Runs the collective; the call completes with its result.
    pub fn call(self) -> Call<Result<R>> {
        let run = self.run;
        self.node.spawn(async move { Ok(run.await) })
    }

    /// Runs the collective and then `done` with its result, on the node's runtime: `done`
    /// must not block. It runs exactly once: if the runtime shuts down first, with
    /// [`CollectiveError::Ps`] saying so, on the thread that shuts it down.
    pub fn on_complete(self, done: impl FnOnce(Result<R>) + Send + 'static) {
        struct Once<R, F: FnOnce(Result<R>)>(Option<F>, std::marker::PhantomData<fn(R)>);
        impl<R, F: FnOnce(Result<R>)> Drop for Once<R, F> {
            fn drop(&mut self) {
                if let Some(done) = self.0.take() {
                    done(Err(CollectiveError::Ps(
                        "the node's runtime shut down".into(),
                    )));
                }
            }
        }
        let mut once = Once(Some(done), std::marker::PhantomData);
        let run = self.run;
        drop(self.node.runtime().spawn(async move {
            let result = run.await;
            if let Some(done) = once.0.take() {
                done(result);
            }
        }));
    }
}

/// A collective that could not start: it completes at once with the error.
fn refused<R: Send + 'static>(node: &NodeHandle, error: CollectiveError) -> Numbered<R> {
    Numbered {
        node: node.clone(),
        run: Box::pin(async move { Err(error) }),
    }
}

impl CommHandle {
    /// Starts the communicator of worker `node` ([`Communicator::new`]) and waits for the
    /// first generation. The outer error is the node's (stopped, runtime gone); the inner
    /// one the communicator's.
    pub fn start(node: &NodeHandle) -> Call<Result<CommHandle>> {
        let po = node.postoffice().clone();
        let owner = node.clone();
        node.spawn(async move {
            Ok(Communicator::new(&po).await.map(|comm| CommHandle {
                node: owner,
                comm: Arc::new(comm),
            }))
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.comm.shared
    }

    /// `run` (a collective already numbered), abandoning the generation if it fails.
    fn launch<R, F>(&self, generation: u64, run: F) -> Numbered<R>
    where
        R: Send + 'static,
        F: Future<Output = Result<R>> + Send + 'static,
    {
        let shared = Arc::clone(self.shared());
        Numbered {
            node: self.node.clone(),
            run: Box::pin(async move { Communicator::guarded(&shared, generation, run).await }),
        }
    }

    /// The node.
    pub fn node(&self) -> &NodeHandle {
        &self.node
    }

    /// The current generation.
    pub fn generation(&self) -> Generation {
        self.shared().generation()
    }

    /// [`Communicator::allreduce`] of `buf`; the result is the reduced buffer.
    pub fn allreduce<T: Element, B: Buffer<T>>(&self, mut buf: B, op: ReduceOp) -> Numbered<B> {
        let len = buf.elements().len();
        let call = match self
            .shared()
            .begin_carrying::<T>(OpKind::AllReduce, len, |_, _| Ok(()))
        {
            Ok(call) => call,
            Err(e) => return refused(&self.node, e),
        };
        let shared = Arc::clone(self.shared());
        self.launch(call.generation, async move {
            crate::run_allreduce(&shared, &call, buf.elements_mut(), op).await?;
            Ok(buf)
        })
    }

    /// [`Communicator::broadcast`] of `buf` from rank `root`.
    pub fn broadcast<T: Element, B: Buffer<T>>(&self, mut buf: B, root: usize) -> Numbered<B> {
        let len = buf.elements().len();
        let call = match self
            .shared()
            .begin_carrying::<T>(OpKind::Broadcast, len, |size, _| {
                crate::check_root(root, size)
            }) {
            Ok(call) => call,
            Err(e) => return refused(&self.node, e),
        };
        let shared = Arc::clone(self.shared());
        self.launch(call.generation, async move {
            crate::run_broadcast(&shared, &call, buf.elements_mut(), root).await?;
            Ok(buf)
        })
    }

    /// [`Communicator::all_gather`]: `out` (`size × input.len()` elements) receives every
    /// rank's `input`, in rank order.
    pub fn all_gather<T: Element, I: Buffer<T>, B: Buffer<T>>(
        &self,
        input: I,
        mut out: B,
    ) -> Numbered<B> {
        let (n, total) = (input.elements().len(), out.elements().len());
        let begun = self
            .shared()
            .begin_carrying::<T>(OpKind::AllGather, total, |size, _| {
                crate::check_gather(n, total, size)
            });
        let call = match begun {
            Ok(call) => call,
            Err(e) => return refused(&self.node, e),
        };
        let shared = Arc::clone(self.shared());
        self.launch(call.generation, async move {
            crate::run_all_gather(&shared, &call, input.elements(), out.elements_mut()).await?;
            Ok(out)
        })
    }

    /// Reduce-scatter without touching `input` (`size` equal blocks): `out` receives this
    /// rank's block of the reduction (chunk `rank` of [`ring::chunk`]; its length must be
    /// that chunk's). The input is copied once, since the ring reduces in place.
    pub fn reduce_scatter<T: Element, I: Buffer<T>, B: Buffer<T>>(
        &self,
        input: I,
        mut out: B,
        op: ReduceOp,
    ) -> Numbered<B> {
        let (len, want) = (input.elements().len(), out.elements().len());
        let begun = self
            .shared()
            .begin_carrying::<T>(OpKind::ReduceScatter, len, |size, rank| {
                let mine = ring::chunk(len, size, rank).len();
                if mine == want {
                    return Ok(());
                }
                Err(CollectiveError::InvalidArgument(format!(
                    "reduce_scatter of {len} elements among {size} ranks gives rank {rank} {mine} \
                 elements, but its output holds {want}"
                )))
            });
        let call = match begun {
            Ok(call) => call,
            Err(e) => return refused(&self.node, e),
        };
        let shared = Arc::clone(self.shared());
        self.launch(call.generation, async move {
            let mut work = input.elements().to_vec();
            drop(input);
            crate::run_reduce_scatter(&shared, &call, &mut work, op).await?;
            let mine = ring::chunk(work.len(), call.size(), call.rank);
            out.elements_mut().copy_from_slice(&work[mine]);
            Ok(out)
        })
    }

    /// [`Communicator::all_to_all`]: block `k` of `input` goes to rank `k`; `out` receives
    /// rank `k`'s block in its block `k`.
    pub fn all_to_all<T: Element, I: Buffer<T>, B: Buffer<T>>(
        &self,
        input: I,
        send_counts: Vec<usize>,
        mut out: B,
        recv_counts: Vec<usize>,
    ) -> Numbered<B> {
        let (n_in, n_out) = (input.elements().len(), out.elements().len());
        let mut offsets = None;
        let begun = self.shared().begin(OpKind::AllToAll, |size, rank| {
            offsets = Some((
                exchange::offsets(&send_counts, size, n_in, "input")?,
                exchange::offsets(&recv_counts, size, n_out, "output")?,
            ));
            exchange::own_block(&send_counts, &recv_counts, rank)
        });
        let (call, (send, recv)) = match (begun, offsets) {
            (Ok(call), Some(offsets)) => (call.carrying::<T>(0), offsets),
            (Err(e), _) => return refused(&self.node, e),
            (Ok(_), None) => {
                let e = CollectiveError::InvalidArgument("all_to_all was not checked".into());
                return refused(&self.node, e);
            }
        };
        let shared = Arc::clone(self.shared());
        self.launch(call.generation, async move {
            let out_elements = out.elements_mut();
            exchange::all_to_all(&shared, &call, input.elements(), &send, out_elements, &recv)
                .await?;
            Ok(out)
        })
    }

    /// [`Communicator::send`] of `buf` to rank `to` under `tag`; the buffer comes back.
    pub fn send<T: Element, B: Buffer<T>>(&self, buf: B, to: usize, tag: i32) -> Numbered<B> {
        let begun = crate::p2p_tag(tag)
            .and_then(|tag| Ok((tag, self.shared().begin_p2p(to, tag as i32, true)?)));
        let (tag, call) = match begun {
            Ok((tag, call)) => (tag, call.carrying::<T>(buf.elements().len())),
            Err(e) => return refused(&self.node, e),
        };
        let shared = Arc::clone(self.shared());
        self.launch(call.generation, async move {
            exchange::send(&shared, &call, to, tag, buf.elements()).await?;
            Ok(buf)
        })
    }

    /// [`Communicator::recv`] into `buf` from rank `from` under `tag`.
    pub fn recv<T: Element, B: Buffer<T>>(&self, mut buf: B, from: usize, tag: i32) -> Numbered<B> {
        let begun = crate::p2p_tag(tag)
            .and_then(|tag| Ok((tag, self.shared().begin_p2p(from, tag as i32, false)?)));
        let (tag, call) = match begun {
            Ok((tag, call)) => (tag, call.carrying::<T>(buf.elements().len())),
            Err(e) => return refused(&self.node, e),
        };
        let shared = Arc::clone(self.shared());
        self.launch(call.generation, async move {
            exchange::recv(&shared, &call, from, tag, buf.elements_mut()).await?;
            Ok(buf)
        })
    }

    /// [`Communicator::barrier`].
    pub fn barrier(&self) -> Numbered<()> {
        let call = match self
            .shared()
            .begin_carrying::<i32>(OpKind::Barrier, 1, |_, _| Ok(()))
        {
            Ok(call) => call,
            Err(e) => return refused(&self.node, e),
        };
        let shared = Arc::clone(self.shared());
        let me = self.node.id();
        self.launch(call.generation, async move {
            crate::run_barrier(&shared, &call, me).await
        })
    }

    /// [`Communicator::settle`].
    pub fn settle(&self, timeout: Duration) -> Call<Result<Generation>> {
        let shared = Arc::clone(self.shared());
        self.node
            .spawn(async move { Ok(crate::settle(&shared, timeout).await) })
    }
}
