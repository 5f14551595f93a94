//! [`CommHandle`]: a communicator on a [`NodeHandle`]'s runtime, for plain threads and the
//! bindings (Python, C). Each collective takes its buffer by value and gives it back reduced,
//! so no caller memory is touched after the call returns, even when the caller stops
//! waiting (a timeout, an interrupt).

use std::sync::Arc;
use std::time::Duration;

use ps::embed::{Call, NodeHandle};

use crate::{Communicator, Element, Generation, ReduceOp, Result};

/// A node's communicator with the node's runtime; cheap to clone, thread-safe. Collectives
/// of one communicator run one at a time (a second call waits for the first).
#[derive(Clone)]
pub struct CommHandle {
    node: NodeHandle,
    comm: Arc<tokio::sync::Mutex<Communicator>>,
    shared: Arc<crate::comm::Shared>,
}

impl std::fmt::Debug for CommHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommHandle")
            .field("node", &self.node.id())
            .field("generation", &self.generation().number)
            .finish_non_exhaustive()
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
                shared: Arc::clone(&comm.shared),
                comm: Arc::new(tokio::sync::Mutex::new(comm)),
            }))
        })
    }

    /// The node.
    pub fn node(&self) -> &NodeHandle {
        &self.node
    }

    /// The current generation.
    pub fn generation(&self) -> Generation {
        self.shared.generation()
    }

    /// [`Communicator::allreduce`] of `values`; the result is the reduced buffer.
    pub fn allreduce<T: Element>(&self, mut values: Vec<T>, op: ReduceOp) -> Call<Result<Vec<T>>> {
        let comm = Arc::clone(&self.comm);
        self.node.spawn(async move {
            let result = comm.lock().await.allreduce(&mut values, op).await;
            Ok(result.map(|()| values))
        })
    }

    /// [`Communicator::broadcast`] of `values` from rank `root`.
    pub fn broadcast<T: Element>(&self, mut values: Vec<T>, root: usize) -> Call<Result<Vec<T>>> {
        let comm = Arc::clone(&self.comm);
        self.node.spawn(async move {
            let result = comm.lock().await.broadcast(&mut values, root).await;
            Ok(result.map(|()| values))
        })
    }

    /// [`Communicator::barrier`].
    pub fn barrier(&self) -> Call<Result<()>> {
        let comm = Arc::clone(&self.comm);
        self.node
            .spawn(async move { Ok(comm.lock().await.barrier().await) })
    }

    /// [`Communicator::settle`].
    pub fn settle(&self, timeout: Duration) -> Call<Result<Generation>> {
        let comm = Arc::clone(&self.comm);
        self.node
            .spawn(async move { Ok(comm.lock().await.settle(timeout).await) })
    }
}
