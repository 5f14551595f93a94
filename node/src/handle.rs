//! Node handles that own their I/O runtime, for callers that have none: plain threads, C and
//! Python through the bindings, a tokio runtime of the caller's own (current-thread or
//! multi-thread), or another executor (`futures::executor::block_on`, smol).
//!
//! [`NodeHandle::start`] joins the cluster on a tokio runtime that the handle owns
//! (`config.io_threads` threads, one by default). Operations run on that runtime, except that
//! a worker's request is sent from the calling thread when the van can take it at once (no
//! hop to the runtime and back); each is answered through a [`Call`], which is at once
//!
//! - a `Future` that any executor can poll (it needs no tokio context, so awaiting it on a
//!   caller's runtime never blocks that runtime's workers),
//! - a blocking wait, [`Call::wait`] / [`Call::wait_timeout`] (ps-lite's `Wait`), refused
//!   with an error on an async runtime thread rather than stalling it, and
//! - a completion callback, [`Call::on_complete`] (ps-lite's callback style), run on the
//!   node's runtime.
//!
//! The key-value applications on such a node (`ps::handle`'s `Worker` and `Server`), like
//! rendezvous and collectives, are started from the handle by the crates that define them.
//!
//! ```no_run
//! use node::handle::NodeHandle;
//! use node::Config;
//!
//! # fn run() -> node::Result<()> {
//! let node = NodeHandle::start(Config::from_env()?)?; // DMLC_ROLE=worker ...
//! println!("node {} of {} workers", node.rank(), node.num_workers());
//! node.barrier(node::ALL_GROUPS).wait()?;
//! node.finalize().wait()?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use van_core::{Config, NodeId, Role};

use crate::error::{NodeError, Result};
use crate::postoffice::Postoffice;

/// How long dropping the last handle of a node that was neither finalized nor stopped waits
/// for its vans to close.
const DROP_STOP_GRACE: Duration = Duration::from_secs(2);

/// A node of the cluster with its own I/O runtime; cheap to clone (all clones are the same
/// node). Thread-safe: every method may be called from any thread.
///
/// Leave the cluster with [`finalize`](Self::finalize) (a barrier of every node, then stop)
/// or [`stop`](Self::stop). Dropping the last clone without either stops the node's vans
/// (waiting up to two seconds when called outside an async runtime) and then its runtime.
#[derive(Clone)]
pub struct NodeHandle {
    inner: Arc<NodeInner>,
}

struct NodeInner {
    runtime: OwnedRuntime,
    po: Postoffice,
}

impl Drop for NodeInner {
    fn drop(&mut self) {
        if self.po.is_stopped() || tokio::runtime::Handle::try_current().is_ok() {
            return;
        }
        if let Some(runtime) = &self.runtime.0 {
            let po = self.po.clone();
            // The timer is made inside the runtime (it needs its context).
            let _ =
                runtime.block_on(async { tokio::time::timeout(DROP_STOP_GRACE, po.stop()).await });
        }
    }
}

/// A runtime that shuts down in the background when dropped, which never blocks: safe on a
/// caller's runtime thread and on the runtime's own threads (where dropping a tokio runtime
/// panics).
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl OwnedRuntime {
    fn handle(&self) -> tokio::runtime::Handle {
        match &self.0 {
            Some(runtime) => runtime.handle().clone(),
            // Taken only in `drop`, after which nothing can ask.
            None => unreachable!("a node's runtime was used while being dropped"),
        }
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for NodeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHandle")
            .field("postoffice", &self.inner.po)
            .finish_non_exhaustive()
    }
}

/// A runtime for one node: `config.io_threads` worker threads (one by default).
fn node_runtime(config: &Config) -> Result<tokio::runtime::Runtime> {
    let threads = config.io_threads.unwrap_or(1).max(1) as usize;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("vans-io")
        .enable_all()
        .build()
        .map_err(|e| NodeError::InvalidArgument(format!("cannot start the I/O runtime: {e}")))
}

impl NodeHandle {
    /// Joins the cluster `config` describes, blocking until the node table has arrived (or
    /// `config.bootstrap_timeout` passed). Must not be called on an async runtime thread: use
    /// [`start_async`](Self::start_async) there.
    pub fn start(config: Config) -> Result<NodeHandle> {
        NodeHandle::start_async(config)?.wait()
    }

    /// Joins the cluster from the environment (`DMLC_*` or `TF_CONFIG`), blocking.
    pub fn from_env() -> Result<NodeHandle> {
        NodeHandle::start(Config::from_env()?)
    }

    /// Starts joining the cluster; the returned call completes with the node once it has
    /// joined. The runtime is created here, so this fails at once only when it cannot be.
    pub fn start_async(config: Config) -> Result<Call<NodeHandle>> {
        let runtime = OwnedRuntime(Some(node_runtime(&config)?));
        let handle = runtime.handle();
        let (tx, rx) = oneshot::channel();
        handle.spawn(async move {
            let node = Postoffice::start(config).await.map(|po| NodeHandle {
                inner: Arc::new(NodeInner { runtime, po }),
            });
            if let Err(Ok(node)) = tx.send(node) {
                // Nobody waits any more: leave, and let the runtime go (dropping the last
                // handle on the runtime's own thread shuts it down in the background).
                node.inner.po.stop().await;
            }
        });
        Ok(Call::new(handle, async move {
            rx.await.unwrap_or(Err(NodeError::Stopped))
        }))
    }

    /// The node's postoffice, for Rust code that runs on [`runtime`](Self::runtime).
    pub fn postoffice(&self) -> &Postoffice {
        &self.inner.po
    }

    /// The node's runtime, to spawn Rust tasks next to the node's own.
    pub fn runtime(&self) -> tokio::runtime::Handle {
        self.inner.runtime.handle()
    }

    /// Runs `future` on the node's runtime; its result comes back through the call.
    pub fn spawn<T, F>(&self, future: F) -> Call<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        spawn_call(&self.runtime(), future)
    }

    /// This node's role.
    pub fn role(&self) -> Role {
        self.inner.po.role()
    }

    /// This node's id (ps-lite numbering: scheduler 1, servers 8, 10, …, workers 9, 11, …).
    pub fn id(&self) -> NodeId {
        self.inner.po.my_id()
    }

    /// This node's rank within its role.
    pub fn rank(&self) -> u32 {
        self.inner.po.my_rank()
    }

    /// Number of servers in the cluster.
    pub fn num_servers(&self) -> u32 {
        self.inner.po.num_servers()
    }

    /// Number of workers in the cluster.
    pub fn num_workers(&self) -> u32 {
        self.inner.po.num_workers()
    }

    /// Waits until every node of `group` has called `barrier` with the same group
    /// ([`Postoffice::barrier`]).
    pub fn barrier(&self, group: i32) -> Call<()> {
        let po = self.inner.po.clone();
        self.spawn(async move { po.barrier(group).await })
    }

    /// Leaves the cluster in order: a barrier of every node, then stop
    /// ([`Postoffice::finalize`]).
    pub fn finalize(&self) -> Call<()> {
        let po = self.inner.po.clone();
        self.spawn(async move { po.finalize().await })
    }

    /// Stops the node without a barrier (after a failure); pending calls fail.
    pub fn stop(&self) -> Call<()> {
        let po = self.inner.po.clone();
        self.spawn(async move {
            po.stop().await;
            Ok(())
        })
    }

    /// Whether the node has stopped (finalized, stopped, or its scheduler is gone).
    pub fn is_stopped(&self) -> bool {
        self.inner.po.is_stopped()
    }
}

/// Spawns `future` on `handle`, answering through a [`Call`].
fn spawn_call<T, F>(handle: &tokio::runtime::Handle, future: F) -> Call<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    handle.spawn(async move {
        // The caller may have dropped its call: the result is not wanted then.
        let _ = tx.send(future.await);
    });
    Call::new(handle.clone(), async move {
        // The task ended without an answer: its runtime shut down.
        rx.await.unwrap_or(Err(NodeError::Stopped))
    })
}

/// An operation's future, polled by whoever waits for the call.
/// `Sync` too, so a call can sit in shared structures (a Python object, a C request table).
type Operation<T> = Pin<Box<dyn Future<Output = Result<T>> + Send + Sync>>;

/// Where a call stands.
enum State<T> {
    /// Not answered yet.
    Running(Operation<T>),
    /// Answered, not yet taken.
    Answered(Result<T>),
    /// Taken.
    Taken,
}

/// The answer to an operation of a node handle: await it (on any executor), wait for it
/// ([`wait`](Self::wait)), or have a callback run with it ([`on_complete`](Self::on_complete)).
///
/// The operation's own future is polled by whoever waits, so an answer wakes the waiting
/// thread directly (no hop through the node's runtime). Every future behind a call is
/// runtime-agnostic. Dropping a call does not cancel the operation: what is left of it runs
/// to the end on the node's runtime, and its result is discarded.
#[must_use = "a call does nothing more once dropped: its result is discarded"]
pub struct Call<T: Send + 'static> {
    state: State<T>,
    handle: tokio::runtime::Handle,
}

impl<T: Send + 'static> std::fmt::Debug for Call<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("running", &matches!(self.state, State::Running(_)))
            .finish_non_exhaustive()
    }
}

// The operation is boxed and a result is only ever moved: nothing in a call is pinned in place.
impl<T: Send + 'static> Unpin for Call<T> {}

impl<T: Send + 'static> Drop for Call<T> {
    fn drop(&mut self) {
        // Let the operation finish (a request leaves its table only when waited for).
        if let State::Running(operation) = std::mem::replace(&mut self.state, State::Taken) {
            drop(self.handle.spawn(operation));
        }
    }
}

impl<T: Send + 'static> Call<T> {
    /// A call answered by `operation`, polled by whoever waits for the call; a call dropped
    /// unanswered leaves `operation` to finish on `handle` (so a request still leaves its
    /// table). For crates that build their operations on a node (`ps::handle`).
    pub fn new(
        handle: tokio::runtime::Handle,
        operation: impl Future<Output = Result<T>> + Send + Sync + 'static,
    ) -> Call<T> {
        Call {
            state: State::Running(Box::pin(operation)),
            handle,
        }
    }

    /// A call answered with `f` of this call's answer (an error passes through).
    pub fn map<U, F>(self, f: F) -> Call<U>
    where
        T: Sync,
        U: Send + 'static,
        F: FnOnce(T) -> U + Send + Sync + 'static,
    {
        let handle = self.handle.clone();
        Call::new(handle, async move { self.await.map(f) })
    }

    /// A call already answered with `result`.
    pub fn answered(handle: tokio::runtime::Handle, result: Result<T>) -> Call<T> {
        Call {
            state: State::Answered(result),
            handle,
        }
    }

    /// Blocks the calling thread until the operation completes. Fails with
    /// [`NodeError::InvalidArgument`] on an async runtime thread (await the call there instead):
    /// blocking it could stall the very tasks that would complete the call.
    pub fn wait(mut self) -> Result<T> {
        self.wait_until(None)
    }

    /// Like [`wait`](Self::wait), giving up after `timeout` with [`NodeError::Timeout`]; the call
    /// can be waited for again then.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<T> {
        self.wait_until(Some(Instant::now() + timeout))
    }

    fn wait_until(&mut self, deadline: Option<Instant>) -> Result<T> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(NodeError::InvalidArgument(
                "a blocking wait on an async runtime thread would stall it; await the call \
                 instead"
                    .into(),
            ));
        }
        let started = Instant::now();
        match block_on_until(&mut *self, deadline) {
            Some(result) => result,
            None => Err(NodeError::Timeout {
                waited: started.elapsed(),
            }),
        }
    }

    /// Whether the result is there (a wait would not block).
    pub fn is_ready(&mut self) -> bool {
        if let State::Running(operation) = &mut self.state {
            let mut cx = Context::from_waker(std::task::Waker::noop());
            match operation.as_mut().poll(&mut cx) {
                Poll::Ready(result) => self.state = State::Answered(result),
                Poll::Pending => return false,
            }
        }
        true
    }

    /// Runs `done` with the result on the node's runtime, once the operation completes. `done`
    /// must not block (it runs on an I/O thread). It runs exactly once: if the node's runtime
    /// shuts down before the operation completes, it runs with [`NodeError::Stopped`] on the
    /// thread that shuts the runtime down.
    pub fn on_complete(mut self, done: impl FnOnce(Result<T>) + Send + 'static) {
        let done = Once(Some(done), PhantomData);
        let result = match std::mem::replace(&mut self.state, State::Taken) {
            State::Running(operation) => {
                drop(self.handle.spawn(async move { done.call(operation.await) }));
                return;
            }
            State::Answered(result) => result,
            State::Taken => Err(already_taken()),
        };
        drop(self.handle.spawn(async move { done.call(result) }));
    }
}

/// A completion callback that runs exactly once: with the result, or with
/// [`NodeError::Stopped`] when it is dropped first (its task was dropped by a runtime shutting
/// down), so nobody waits on a callback that will never come.
struct Once<T, F: FnOnce(Result<T>)>(Option<F>, PhantomData<fn(T)>);

impl<T, F: FnOnce(Result<T>)> Once<T, F> {
    fn call(mut self, result: Result<T>) {
        if let Some(done) = self.0.take() {
            done(result);
        }
    }
}

impl<T, F: FnOnce(Result<T>)> Drop for Once<T, F> {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done(Err(NodeError::Stopped));
        }
    }
}

fn already_taken() -> NodeError {
    NodeError::InvalidArgument("the call's result was already taken".into())
}

impl<T: Send + 'static> Future for Call<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let result = match &mut self.state {
            State::Running(operation) => match operation.as_mut().poll(cx) {
                Poll::Ready(result) => result,
                Poll::Pending => return Poll::Pending,
            },
            State::Answered(_) => match std::mem::replace(&mut self.state, State::Taken) {
                State::Answered(result) => result,
                _ => Err(already_taken()),
            },
            State::Taken => Err(already_taken()),
        };
        self.state = State::Taken;
        Poll::Ready(result)
    }
}

/// Polls `future` on the calling thread until it is ready or `deadline` passes.
pub fn block_on_until<F: Future>(future: F, deadline: Option<Instant>) -> Option<F::Output> {
    use std::task::{Wake, Waker};
    struct ThreadWaker(std::thread::Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        match deadline {
            None => std::thread::park(),
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
        }
    }
}
