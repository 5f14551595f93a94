//! The in-process cluster the collective tests run on: 1 scheduler, 1 server and
//! `workers` workers over the in-process van, `body` run on each worker.

use std::future::Future;

use node::local::LocalCluster;
use node::{Postoffice, Role};

/// Runs `body` on every worker of a fresh in-process cluster (the scheduler and server
/// only finalize) and returns what each worker's body returned, one per worker; a body's
/// error fails the test naming the worker count.
pub fn on_each_worker<T, F, Fut>(workers: u32, body: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Postoffice) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = collective::Result<T>> + Send + 'static,
{
    let node = move |po: Postoffice| {
        let body = body.clone();
        async move {
            if po.role() != Role::Worker {
                po.finalize().await?;
                return Ok(None);
            }
            // On a task of its own, so a check that panics still lets this node finalize
            // (the others would wait for it forever) and fails the run.
            let result = tokio::spawn(body(po.clone())).await;
            po.finalize().await?;
            match result {
                Ok(result) => result.map(Some).map_err(|e| {
                    node::NodeError::InvalidArgument(format!("collective failed: {e}"))
                }),
                Err(e) => Err(node::NodeError::InvalidArgument(format!(
                    "the worker's checks failed: {e}"
                ))),
            }
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let results = runtime
        .block_on(LocalCluster::new(1, workers).run(node))
        .unwrap_or_else(|e| panic!("{workers} workers: {e}"));
    let seen: Vec<T> = results.into_iter().flatten().collect();
    assert_eq!(seen.len(), workers as usize);
    seen
}
