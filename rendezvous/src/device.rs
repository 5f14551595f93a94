//! Which task owns a device: the device names in rendezvous keys mapped to postoffice node
//! ids, so that a remote rendezvous knows where to ask for a value (pull) or where to deliver
//! it (push).
//!
//! The default, [`task_of_device`], reads TensorFlow's device names:
//! `/job:ps/replica:0/task:3/device:CPU:0` is server rank 3 (node id 14) and
//! `/job:worker/replica:0/task:1/device:GPU:0` is worker rank 1 (node id 11), matching how the
//! parameter server numbers nodes. Clusters that name their jobs differently pass their own
//! [`DeviceResolver`] to the manager's builder.

use std::sync::Arc;

use van_core::{node_ids, NodeId, Role};

/// Maps a device name to the node id of the task that owns it; `None` when no task does.
pub type DeviceResolver = Arc<dyn Fn(&str) -> Option<NodeId> + Send + Sync>;

/// The node owning a TensorFlow device name: jobs `ps` and `server` are servers, `worker` is
/// workers, `scheduler` is the scheduler; the task index is the rank within the role. The
/// rest of the name (replica, device) does not matter.
///
/// ```
/// use rendezvous::device::task_of_device;
///
/// assert_eq!(task_of_device("/job:ps/replica:0/task:3/device:CPU:0"), Some(14));
/// assert_eq!(task_of_device("/job:worker/replica:0/task:1/device:GPU:0"), Some(11));
/// assert_eq!(task_of_device("/job:worker/task:0"), Some(9));
/// assert_eq!(task_of_device("/job:evaluator/replica:0/task:0"), None);
/// assert_eq!(task_of_device("/cpu:0"), None);
/// ```
pub fn task_of_device(device: &str) -> Option<NodeId> {
    let mut job = None;
    let mut task = None;
    for part in device.split('/') {
        if let Some(name) = part.strip_prefix("job:") {
            job = Some(name);
        } else if let Some(index) = part.strip_prefix("task:") {
            task = index.parse::<u32>().ok();
        }
    }
    let rank = task?;
    if rank >= van_core::config::MAX_NODES_PER_ROLE {
        return None;
    }
    match job? {
        "ps" | "server" => Some(node_ids::server_rank_to_id(rank)),
        "worker" => Some(node_ids::worker_rank_to_id(rank)),
        "scheduler" if rank == 0 => Some(node_ids::SCHEDULER),
        _ => None,
    }
}

/// The CPU device name of a node, in the form [`task_of_device`] reads back:
/// `/job:worker/replica:0/task:1/device:CPU:0` for node 11.
///
/// ```
/// use rendezvous::device::{cpu_device, task_of_device};
///
/// assert_eq!(cpu_device(11).unwrap(), "/job:worker/replica:0/task:1/device:CPU:0");
/// assert_eq!(cpu_device(8).unwrap(), "/job:ps/replica:0/task:0/device:CPU:0");
/// for node in [1, 8, 9, 10, 11, 200, 201] {
///     assert_eq!(task_of_device(&cpu_device(node).unwrap()), Some(node));
/// }
/// assert_eq!(cpu_device(4), None); // a group, not a task
/// ```
pub fn cpu_device(node: NodeId) -> Option<String> {
    let job = match node_ids::role_of(node)? {
        Role::Scheduler => "scheduler",
        Role::Server => "ps",
        Role::Worker => "worker",
    };
    let rank = node_ids::id_to_rank(node);
    Some(format!("/job:{job}/replica:0/task:{rank}/device:CPU:0"))
}

/// The default resolver, [`task_of_device`].
pub fn default_resolver() -> DeviceResolver {
    Arc::new(task_of_device)
}
