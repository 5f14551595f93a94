//! `--mode check` under `TF_CONFIG`: TensorFlow's task names reach the processes that run
//! those tasks. Each worker says which task it runs and which node it became; every worker
//! other than the chief sends the chief a tensor from its own task's device name through the
//! rendezvous, and the chief receives each by that name, so a name resolved to the wrong
//! process fails the check (the value would never come, or be another task's).

use std::time::Duration;

use bytes::Bytes;
use examples::raw::BoxError;
use ps::{node_ids, Postoffice, Role};
use rendezvous::{create_key, parse_key, Protocol, Rendezvous, RendezvousMgr};
use van_core::{Node, TfTask};

/// The rendezvous step of the check.
const STEP: i64 = 1;
/// How long the chief waits for each worker's tensor.
const RECV_TIMEOUT: Duration = Duration::from_secs(30);

/// The CPU device of a TensorFlow task.
fn device(task: &TfTask) -> String {
    format!(
        "/job:{}/replica:0/task:{}/device:CPU:0",
        task.job, task.index
    )
}

/// Runs the check when this worker announces a TensorFlow task; returns the lines to print.
pub(crate) async fn check(po: &Postoffice) -> Result<Vec<String>, BoxError> {
    let Some(mine) = po.config().tf_task.clone() else {
        return Ok(Vec::new());
    };
    let rank = po.my_rank();
    let mut lines = vec![format!(
        "task {mine}: worker rank {rank} (node {})",
        po.my_id()
    )];
    let workers: Vec<&Node> = po
        .nodes()
        .iter()
        .filter(|n| n.role == Role::Worker)
        .collect();
    let task_of = |n: &Node| {
        n.task
            .clone()
            .ok_or_else(|| format!("worker node {:?} announces no TensorFlow task", n.id))
    };
    let chief = workers
        .iter()
        .min_by_key(|n| n.id)
        .ok_or("no worker in the node table")?;
    let chief_device = device(&task_of(chief)?);
    let mgr = RendezvousMgr::new(po, Protocol::Pull).await?;
    // The manager names this node by its task, as TensorFlow does.
    if mgr.device(po.my_id()).as_deref() != Some(device(&mine).as_str()) {
        return Err(format!(
            "the manager names node {} {:?}, not {}",
            po.my_id(),
            mgr.device(po.my_id()),
            device(&mine)
        )
        .into());
    }
    let step = mgr.find(STEP);
    step.initialize()?;
    let key = |from: &TfTask| {
        parse_key(&create_key(
            &device(from),
            1,
            &chief_device,
            "hello",
            (0, 0),
        ))
    };
    if chief.id == Some(po.my_id()) {
        let mut heard = 0;
        for other in workers.iter().filter(|n| n.id != chief.id) {
            let task = task_of(other)?;
            let got = tokio::time::timeout(RECV_TIMEOUT, step.recv(&key(&task)?))
                .await
                .map_err(|_| format!("no tensor from {task} within {RECV_TIMEOUT:?}"))??;
            if got.value != device(&task).as_bytes() {
                return Err(format!(
                    "the tensor named for {task} carries {:?}",
                    String::from_utf8_lossy(&got.value)
                )
                .into());
            }
            heard += 1;
        }
        lines.push(format!(
            "task {mine}: received a tensor from each of {heard} tasks by TensorFlow name"
        ));
    } else {
        step.send(&key(&mine)?, Bytes::from(device(&mine)), false)?;
    }
    // The senders keep their values until the chief has taken them.
    po.barrier(node_ids::WORKER_GROUP).await?;
    mgr.cleanup(STEP);
    Ok(lines)
}
