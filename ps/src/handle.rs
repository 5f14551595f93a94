//! Key-value applications on a [`NodeHandle`] (a node that owns its I/O runtime, for plain
//! threads, the bindings and other executors): [`Worker`] and [`Server`], started with the
//! [`KvNode`] methods of the handle.
//!
//! Values are typed at run time here ([`DataType`]), so a foreign caller picks the type with
//! an argument; [`Worker`] and [`Server`] dispatch to [`KvWorker<T>`] and [`KvServer<T>`].
//!
//! ```no_run
//! use node::handle::NodeHandle;
//! use ps::handle::KvNode;
//! use ps::{Config, KvPairs};
//! use van_core::DataType;
//!
//! # fn run() -> ps::Result<()> {
//! let node = NodeHandle::start(Config::from_env()?)?; // DMLC_ROLE=worker ...
//! let worker = node.worker(DataType::F32, 0, 0).wait()?;
//! worker.push(KvPairs::from_slices(&[1u64, 3], &[1.0f32, 2.0], None), 0).wait()?;
//! let pulled = worker.pull(ps::values::to_bytes(&[1u64, 3]), 0).wait()?;
//! assert_eq!(pulled.vals::<f32>()?.len(), 2);
//! node.finalize().wait()?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use node::handle::{Call, NodeHandle};
use van_core::DataType;

use crate::kv::{KvPairs, KvServer, KvWorker, Op, PullBuffer, RequestHandler, Snapshot};
use crate::{NodeError, Result};
use node::Postoffice;

/// The key-value applications a [`NodeHandle`] can start: `use ps::handle::KvNode;` and call
/// them on the handle.
pub trait KvNode {
    /// A worker application pushing and pulling values of type `dtype`.
    fn worker(&self, dtype: DataType, app_id: i32, customer_id: i32) -> Call<Worker>;
    /// A server application summing values of type `dtype` (ps-lite's default handle), with
    /// `shards` shared-nothing shards.
    fn sum_server(
        &self,
        dtype: DataType,
        app_id: i32,
        customer_id: i32,
        shards: usize,
    ) -> Call<Server>;
    /// A server application holding an embedding table of `f32` rows with a server-side
    /// optimizer ([`crate::optim`]), in `shards` shards.
    fn table_server(
        &self,
        spec: crate::optim::TableSpec,
        app_id: i32,
        customer_id: i32,
        shards: usize,
    ) -> Call<Server>;
    /// A server application whose `shards` shards each answer with a handler from
    /// `make(shard)`. The handlers run on the node's runtime and must not block.
    fn server<H, M>(
        &self,
        dtype: DataType,
        app_id: i32,
        customer_id: i32,
        shards: usize,
        make: M,
    ) -> Call<Server>
    where
        H: RequestHandler,
        M: Fn(usize) -> H + Send + 'static;
    /// [`server`](Self::server) started from `snapshot` before it takes any request
    /// ([`KvServer::new_restored`]): what a server started again after a failure wants.
    fn server_restored<H, M>(
        &self,
        dtype: DataType,
        app_id: i32,
        customer_id: i32,
        shards: usize,
        make: M,
        snapshot: Snapshot,
    ) -> Call<Server>
    where
        H: RequestHandler,
        M: Fn(usize) -> H + Send + 'static;
}

impl KvNode for NodeHandle {
    fn worker(&self, dtype: DataType, app_id: i32, customer_id: i32) -> Call<Worker> {
        let po = self.postoffice().clone();
        let node = self.clone();
        self.spawn(async move {
            let kv = AnyWorker::new(dtype, &po, app_id, customer_id).await?;
            Ok(Worker { kv, dtype, node })
        })
    }

    fn sum_server(
        &self,
        dtype: DataType,
        app_id: i32,
        customer_id: i32,
        shards: usize,
    ) -> Call<Server> {
        let po = self.postoffice().clone();
        let node = self.clone();
        self.spawn(async move {
            let kv = Arc::new(start_sum_server(dtype, &po, app_id, customer_id, shards).await?);
            Ok(Server { dtype, kv, node })
        })
    }

    fn table_server(
        &self,
        spec: crate::optim::TableSpec,
        app_id: i32,
        customer_id: i32,
        shards: usize,
    ) -> Call<Server> {
        self.server(DataType::F32, app_id, customer_id, shards, move |_| {
            crate::optim::TableHandler::new(spec)
        })
    }

    fn server<H, M>(
        &self,
        dtype: DataType,
        app_id: i32,
        customer_id: i32,
        shards: usize,
        make: M,
    ) -> Call<Server>
    where
        H: RequestHandler,
        M: Fn(usize) -> H + Send + 'static,
    {
        launch_server(self, dtype, app_id, customer_id, shards, make, None)
    }

    fn server_restored<H, M>(
        &self,
        dtype: DataType,
        app_id: i32,
        customer_id: i32,
        shards: usize,
        make: M,
        snapshot: Snapshot,
    ) -> Call<Server>
    where
        H: RequestHandler,
        M: Fn(usize) -> H + Send + 'static,
    {
        launch_server(
            self,
            dtype,
            app_id,
            customer_id,
            shards,
            make,
            Some(snapshot),
        )
    }
}

fn launch_server<H, M>(
    node: &NodeHandle,
    dtype: DataType,
    app_id: i32,
    customer_id: i32,
    shards: usize,
    make: M,
    snapshot: Option<Snapshot>,
) -> Call<Server>
where
    H: RequestHandler,
    M: Fn(usize) -> H + Send + 'static,
{
    let po = node.postoffice().clone();
    let handle = node.clone();
    node.spawn(async move {
        let started = start_server(
            dtype,
            &po,
            app_id,
            customer_id,
            shards,
            make,
            snapshot.as_ref(),
        );
        let kv = Arc::new(started.await?);
        Ok(Server {
            dtype,
            kv,
            node: handle,
        })
    })
}

macro_rules! any_kv {
    ($($variant:ident => $t:ty),* $(,)?) => {
        /// A [`KvWorker`] of one of the value types a foreign caller can name.
        #[derive(Clone, Debug)]
        enum AnyWorker { $($variant(KvWorker<$t>)),* }

        /// The value types of [`Worker`] and [`Server`].
        pub const VALUE_TYPES: &[DataType] = &[$(DataType::$variant),*];

        impl AnyWorker {
            async fn new(dtype: DataType, po: &Postoffice, app: i32, customer: i32) -> Result<Self> {
                match dtype {
                    $(DataType::$variant => Ok(AnyWorker::$variant(KvWorker::new(po, app, customer).await?)),)*
                    other => Err(unsupported(other)),
                }
            }

            /// Sends the request; its id, to wait for.
            async fn issue(
                &self, op: Op, pairs: KvPairs, cmd: i32, out: Option<Box<dyn PullBuffer>>,
            ) -> Result<crate::RequestId> {
                match self {
                    $(AnyWorker::$variant(kv) => kv.request(op, pairs, cmd, out).await,)*
                }
            }

            /// Requests issued and not yet answered and collected.
            fn in_flight(&self) -> usize {
                match self {
                    $(AnyWorker::$variant(kv) => kv.pending(),)*
                }
            }

            /// Value bytes pulls into callers' buffers copied so far.
            fn copied_pull_bytes(&self) -> u64 {
                match self {
                    $(AnyWorker::$variant(kv) => kv.copied_pull_bytes(),)*
                }
            }

            /// The answer to request `id`.
            async fn wait(self, id: crate::RequestId) -> Result<KvPairs> {
                match self {
                    $(AnyWorker::$variant(kv) => kv.wait(id).await,)*
                }
            }
        }

        // A server stays registered with its postoffice (which holds it) for as long as the
        // node runs; the typed `KvServer` is kept only for its checkpoints.

        /// A [`KvServer`] of one of the value types, for its snapshot and restore.
        #[derive(Debug)]
        enum AnyServer { $($variant(KvServer<$t>)),* }

        impl AnyServer {
            async fn snapshot(&self) -> Result<Snapshot> {
                match self {
                    $(AnyServer::$variant(kv) => kv.snapshot().await,)*
                }
            }

            async fn restore(&self, snapshot: &Snapshot) -> Result<()> {
                match self {
                    $(AnyServer::$variant(kv) => kv.restore(snapshot).await,)*
                }
            }
        }

        /// Starts a [`KvServer`] of `dtype` summing values.
        async fn start_sum_server(dtype: DataType, po: &Postoffice, app: i32, customer: i32, shards: usize) -> Result<AnyServer> {
            match dtype {
                $(DataType::$variant => KvServer::<$t>::with_sum(po, app, customer, shards).await.map(AnyServer::$variant),)*
                other => Err(unsupported(other)),
            }
        }

        /// Starts a [`KvServer`] of `dtype` with handlers from `make`, from `snapshot` when
        /// given ([`KvServer::new_restored`]).
        async fn start_server<H: RequestHandler>(
            dtype: DataType, po: &Postoffice, app: i32, customer: i32, shards: usize,
            make: impl Fn(usize) -> H, snapshot: Option<&Snapshot>,
        ) -> Result<AnyServer> {
            match (dtype, snapshot) {
                $(
                    (DataType::$variant, None) => KvServer::<$t>::new(po, app, customer, shards, make).await.map(AnyServer::$variant),
                    (DataType::$variant, Some(snapshot)) => KvServer::<$t>::new_restored(po, app, customer, shards, make, snapshot).await.map(AnyServer::$variant),
                )*
                (other, _) => Err(unsupported(other)),
            }
        }
    };
}

any_kv!(F32 => f32, F64 => f64, I32 => i32, I64 => i64, U8 => u8, U64 => u64);

fn unsupported(dtype: DataType) -> NodeError {
    NodeError::InvalidArgument(format!(
        "values of type {dtype:?} are not supported here; use one of {VALUE_TYPES:?}"
    ))
}

/// A worker application of a [`NodeHandle`]: push, pull and push-pull of values of one type.
/// Cheap to clone; thread-safe.
#[derive(Clone)]
pub struct Worker {
    kv: AnyWorker,
    dtype: DataType,
    node: NodeHandle,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("dtype", &self.dtype)
            .field("kv", &self.kv)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// The type of the values this worker pushes and pulls.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The node this worker runs on.
    pub fn node(&self) -> &NodeHandle {
        &self.node
    }

    /// Pushes `pairs` (sorted keys; values of [`dtype`](Self::dtype); optional per-key
    /// lengths) without copying them: the bytes are held until the servers have answered.
    pub fn push(&self, pairs: KvPairs, cmd: i32) -> Call<()> {
        self.call(Op::Push, pairs, cmd, None).map(|_| ())
    }

    /// Requests of this worker that are in flight (issued, answer not yet collected), for
    /// diagnostics: a dropped call's request still counts until its answer arrives.
    pub fn in_flight(&self) -> usize {
        self.kv.in_flight()
    }

    /// Value bytes [`pull_into`](Self::pull_into) and [`push_pull_into`](Self::push_pull_into)
    /// have copied so far ([`KvWorker::copied_pull_bytes`]).
    pub fn copied_pull_bytes(&self) -> u64 {
        self.kv.copied_pull_bytes()
    }

    /// Pulls the values of sorted `keys` (little-endian `u64` bytes).
    pub fn pull(&self, keys: Bytes, cmd: i32) -> Call<KvPairs> {
        let pairs = KvPairs {
            keys,
            ..KvPairs::default()
        };
        self.call(Op::Pull, pairs, cmd, None)
    }

    /// Pulls the values of sorted `keys` into `out`, each server's answer copied once to its
    /// keys' place ([`KvWorker::zpull_into`]); the answer's values are `out`.
    pub fn pull_into(&self, keys: Bytes, out: impl PullBuffer, cmd: i32) -> Call<KvPairs> {
        let pairs = KvPairs {
            keys,
            ..KvPairs::default()
        };
        self.call(Op::Pull, pairs, cmd, Some(Box::new(out)))
    }

    /// Any request, `op` with `pairs` ([`KvWorker::request`]): a pull's `pairs.lens`, when
    /// given, say how many values it expects of each key (a summing server answers a key no
    /// one pushed with that many zeros).
    pub fn request(&self, op: Op, pairs: KvPairs, cmd: i32) -> Call<KvPairs> {
        self.call(op, pairs, cmd, None)
    }

    /// Pushes `pairs`, then pulls the updated values, in one request per server.
    pub fn push_pull(&self, pairs: KvPairs, cmd: i32) -> Call<KvPairs> {
        self.call(Op::PushPull, pairs, cmd, None)
    }

    /// [`push_pull`](Self::push_pull) with the pulled values written into `out`, as
    /// [`pull_into`](Self::pull_into) does.
    pub fn push_pull_into(&self, pairs: KvPairs, out: impl PullBuffer, cmd: i32) -> Call<KvPairs> {
        self.call(Op::PushPull, pairs, cmd, Some(Box::new(out)))
    }

    fn call(
        &self,
        op: Op,
        pairs: KvPairs,
        cmd: i32,
        out: Option<Box<dyn PullBuffer>>,
    ) -> Call<KvPairs> {
        let handle = self.node.runtime();
        let kv = self.kv.clone();
        let mut issue: Pin<Box<dyn Future<Output = Result<crate::RequestId>> + Send>> = {
            let kv = kv.clone();
            Box::pin(async move { kv.issue(op, pairs, cmd, out).await })
        };
        // Sent from the calling thread, in the runtime's context: a request whose frames fit
        // the van's queue (the common case) goes out without waking the runtime, and its
        // answer wakes the waiter directly. One that has to wait (a first connection, a full
        // queue) goes on as a task of the runtime.
        let polled = {
            let _context = handle.enter();
            let mut cx = Context::from_waker(std::task::Waker::noop());
            issue.as_mut().poll(&mut cx)
        };
        match polled {
            Poll::Ready(Ok(id)) => Call::new(handle, kv.wait(id)),
            Poll::Ready(Err(e)) => Call::answered(handle, Err(e)),
            Poll::Pending => self.node.spawn(async move { kv.wait(issue.await?).await }),
        }
    }
}

/// A server application of a [`NodeHandle`]. It keeps answering for as long as the node
/// runs, whether or not this value is kept.
#[derive(Debug, Clone)]
pub struct Server {
    dtype: DataType,
    kv: Arc<AnyServer>,
    node: NodeHandle,
}

impl Server {
    /// The type of the values this server handles.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The values this server holds, for a checkpoint ([`KvServer::snapshot`]: take it where
    /// no request is in flight, after a barrier of the workers).
    pub fn snapshot(&self) -> Call<Snapshot> {
        let kv = Arc::clone(&self.kv);
        self.node.spawn(async move { kv.snapshot().await })
    }

    /// Rolls this server back to `snapshot` ([`KvServer::restore`]); a server started again
    /// after a failure starts from its snapshot instead ([`NodeHandle::server_restored`]).
    pub fn restore(&self, snapshot: Snapshot) -> Call<()> {
        let kv = Arc::clone(&self.kv);
        self.node.spawn(async move { kv.restore(&snapshot).await })
    }
}

impl KvPairs {
    /// Copies the values into `out`, which must be exactly as long as they are (ps-lite's
    /// `ZPull` into a caller's buffer: this is the one copy from the received frame).
    pub fn copy_vals_into(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.vals.len() {
            return Err(NodeError::InvalidArgument(format!(
                "the output buffer holds {} bytes but {} bytes of values arrived",
                out.len(),
                self.vals.len()
            )));
        }
        out.copy_from_slice(&self.vals);
        Ok(())
    }
}
