//! A whole cluster inside one process, over the in-process van: for tests, demos and
//! simulations. Each node is a task with its own [`Postoffice`]; nodes share a
//! [`van_core::inproc::Hub`] instead of a network.
//!
//! ```
//! use node::local::LocalCluster;
//! use node::Role;
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let ranks = LocalCluster::new(2, 3)
//!     .run(|po| async move {
//!         po.barrier(node::ALL_GROUPS).await?;
//!         let rank = (po.role() == Role::Worker).then(|| po.my_rank());
//!         po.finalize().await?;
//!         Ok(rank)
//!     })
//!     .await?;
//! let mut ranks: Vec<u32> = ranks.into_iter().flatten().collect();
//! ranks.sort();
//! assert_eq!(ranks, vec![0, 1, 2]);
//! # Ok::<(), node::NodeError>(())
//! # }).unwrap();
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use van_core::inproc::{Hub, InProcessVan};
use van_core::{Config, Role, VanKind};

use crate::error::{NodeError, Result};
use crate::postoffice::Postoffice;

/// The scheduler's in-process address.
const SCHEDULER_HOST: &str = "scheduler";
const SCHEDULER_PORT: u16 = 1;

/// A cluster of one scheduler, `num_servers` servers and `num_workers` workers in this process.
#[derive(Debug, Clone)]
pub struct LocalCluster {
    num_servers: u32,
    num_workers: u32,
    heartbeat: Option<(Duration, Duration)>,
    bootstrap_timeout: Duration,
    eager_connect: bool,
}

impl LocalCluster {
    /// A cluster description; nothing runs until [`run`](Self::run).
    pub fn new(num_servers: u32, num_workers: u32) -> LocalCluster {
        LocalCluster {
            num_servers,
            num_workers,
            heartbeat: None,
            bootstrap_timeout: Duration::from_secs(30),
            eager_connect: false,
        }
    }

    /// Turns heartbeats on: nodes report every `interval`, the scheduler declares a node dead
    /// after `timeout` of silence.
    pub fn heartbeats(mut self, interval: Duration, timeout: Duration) -> LocalCluster {
        self.heartbeat = Some((interval, timeout));
        self
    }

    /// Whether nodes connect to every peer as soon as the table arrives
    /// (`VANS_EAGER_CONNECT`).
    pub fn eager_connect(mut self, on: bool) -> LocalCluster {
        self.eager_connect = on;
        self
    }

    /// How long nodes may take to form the cluster.
    pub fn bootstrap_timeout(mut self, timeout: Duration) -> LocalCluster {
        self.bootstrap_timeout = timeout;
        self
    }

    fn config(&self, role: Role) -> Result<Config> {
        let mut builder = Config::builder()
            .role(role)
            .num_servers(self.num_servers)
            .num_workers(self.num_workers)
            .root_uri(SCHEDULER_HOST)
            .root_port(SCHEDULER_PORT)
            .node_host(role.as_str())
            .stream_van(VanKind::InProcess)
            .bootstrap_timeout(self.bootstrap_timeout)
            .eager_connect(self.eager_connect);
        if let Some((interval, timeout)) = self.heartbeat {
            builder = builder
                .heartbeat_interval(interval)
                .heartbeat_timeout(timeout);
        }
        Ok(builder.build()?)
    }

    /// Starts every node, runs `node(postoffice)` on each as its own task, and returns their
    /// results: the scheduler's first, then the servers', then the workers' (in start order,
    /// not rank order: ask the postoffice for ranks). The function decides when its node
    /// finalizes. The first error of any node is returned after all nodes have ended; a node
    /// that could not start or that panicked comes first (its postoffice is stopped, so the
    /// others end too, instead of waiting for it).
    pub async fn run<T, F, Fut>(&self, node: F) -> Result<Vec<T>>
    where
        T: Send + 'static,
        F: Fn(Postoffice) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let hub = Hub::new();
        let mut roles = vec![Role::Scheduler];
        roles.extend(std::iter::repeat_n(Role::Server, self.num_servers as usize));
        roles.extend(std::iter::repeat_n(Role::Worker, self.num_workers as usize));
        let mut tasks = Vec::with_capacity(roles.len());
        for role in roles {
            let config = self.config(role)?;
            let van = Arc::new(InProcessVan::new(&hub));
            let node = node.clone();
            tasks.push(tokio::spawn(async move {
                let po = Postoffice::start_with_van(config, van).await?;
                // In a task of its own, so that a node that panics (a failed assertion in a
                // test) still stops its postoffice: the others then fail instead of waiting
                // for it for ever, and the panic is the error the run returns.
                match tokio::spawn(node(po.clone())).await {
                    Ok(Ok(value)) => Ok(Ok(value)),
                    Ok(Err(e)) => {
                        po.stop().await;
                        Ok(Err(e))
                    }
                    Err(e) => {
                        po.stop().await;
                        Err(NodeError::InvalidArgument(format!(
                            "the {role} node's task panicked or was cancelled: {e}"
                        )))
                    }
                }
            }));
        }
        let mut results = Vec::with_capacity(tasks.len());
        let (mut first_error, mut first_panic) = (None, None);
        for task in tasks {
            match task.await {
                Ok(Ok(Ok(value))) => results.push(value),
                Ok(Ok(Err(e))) => {
                    first_error.get_or_insert(e);
                }
                // A node that could not start, or panicked: the cause of the others' errors.
                Ok(Err(e)) => {
                    first_panic.get_or_insert(e);
                }
                Err(e) => {
                    first_panic.get_or_insert(NodeError::InvalidArgument(format!(
                        "a node task panicked or was cancelled: {e}"
                    )));
                }
            }
        }
        match first_panic.or(first_error) {
            Some(e) => Err(e),
            None => Ok(results),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_that_panics_fails_the_run_instead_of_hanging_it() {
        let cluster = LocalCluster::new(1, 1);
        let run = cluster.run(|po| async move {
            if po.role() == Role::Worker {
                panic!("a failed assertion in the worker");
            }
            // The others wait for the worker at finalize's barrier: it must fail.
            po.finalize().await
        });
        let result = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the run waited for a node that had panicked");
        let err = result.expect_err("a run with a panicked node succeeded");
        assert!(err.to_string().contains("panicked"), "{err}");
    }
}
