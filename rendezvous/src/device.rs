//! Which task owns a device: the device names in rendezvous keys mapped to postoffice node
//! ids, so that a remote rendezvous knows where to ask for a value (pull) or where to deliver
//! it (push).
//!
//! The default, [`table_resolver`], looks up TensorFlow task names in the node table when the
//! nodes announce their tasks (from `TF_CONFIG`): `/job:chief/replica:0/task:0/device:CPU:0`
//! is the node that runs the chief, `/job:worker/task:0` the one that runs worker task 0,
//! whatever their ranks. Otherwise (and for jobs no node announces) it reads the names as
//! [`task_of_device`] does: `/job:ps/replica:0/task:3/device:CPU:0` is server rank 3 (node
//! id 14) and `/job:worker/replica:0/task:1/device:GPU:0` is worker rank 1 (node id 11),
//! matching how the parameter server numbers nodes. Clusters that name their jobs
//! differently pass their own [`DeviceResolver`] to the manager's builder.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use van_core::{node_ids, Node, NodeId, Role};

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
    let (job, task) = job_and_task(device);
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
/// `/job:worker/replica:0/task:1/device:CPU:0` for node 11. These names count ranks: in a
/// cluster whose nodes announce TensorFlow tasks (from `TF_CONFIG`), the manager's default
/// resolver reads `/job:worker/task:N` as worker *task* N, so take names from
/// [`device_in`] (or [`RendezvousMgr::device`](crate::RendezvousMgr::device)) there.
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

/// The CPU device name of `node` in a cluster with node table `nodes`, as
/// [`table_resolver`] reads it back: the name of its TensorFlow task when it announced one,
/// else [`cpu_device`]'s.
///
/// ```
/// use rendezvous::device::{device_in, table_resolver};
/// use van_core::{Node, Role, TfTask};
///
/// let mut chief = Node::new(Role::Worker, "host", 2222).with_id(9);
/// chief.task = Some(TfTask { job: "chief".into(), index: 0 });
/// let mut worker = Node::new(Role::Worker, "host", 2223).with_id(11);
/// worker.task = Some(TfTask { job: "worker".into(), index: 0 });
/// let table = [chief, worker];
/// assert_eq!(device_in(&table, 9).unwrap(), "/job:chief/replica:0/task:0/device:CPU:0");
/// let resolve = table_resolver(&table);
/// for node in [9, 11] {
///     assert_eq!(resolve(&device_in(&table, node).unwrap()), Some(node));
/// }
/// ```
pub fn device_in(nodes: &[Node], node: NodeId) -> Option<String> {
    match nodes
        .iter()
        .find(|n| n.id == Some(node))
        .and_then(|n| n.task.as_ref())
    {
        Some(task) => Some(format!(
            "/job:{}/replica:0/task:{}/device:CPU:0",
            task.job, task.index
        )),
        None => cpu_device(node),
    }
}

/// The job and the task index a device name gives (`/job:J/…/task:T/…`), each if present.
fn job_and_task(device: &str) -> (Option<&str>, Option<u32>) {
    let mut job = None;
    let mut task = None;
    for part in device.split('/') {
        if let Some(name) = part.strip_prefix("job:") {
            job = Some(name);
        } else if let Some(index) = part.strip_prefix("task:") {
            task = index.parse::<u32>().ok();
        }
    }
    (job, task)
}

/// The resolver [`task_of_device`], which ignores the node table.
pub fn default_resolver() -> DeviceResolver {
    Arc::new(task_of_device)
}

/// The resolver of a cluster with node table `nodes` (the manager's default): a job that
/// some node runs as its TensorFlow task resolves through the table only — `/job:worker/
/// task:0` is the node that announced worker task 0, never the chief that holds worker rank
/// 0, and a task no node runs is no node — and any other name as [`task_of_device`] reads
/// it. Without tasks in the table it is [`task_of_device`].
///
/// ```
/// use rendezvous::device::table_resolver;
/// use van_core::{Node, Role, TfTask};
///
/// let node = |role, id, job: &str, index| {
///     let mut n = Node::new(role, "host", 2222).with_id(id);
///     n.task = Some(TfTask { job: job.into(), index });
///     n
/// };
/// // The chief is worker rank 0 (node 9), worker task 0 is worker rank 1 (node 11).
/// let table = [node(Role::Server, 8, "ps", 0), node(Role::Worker, 9, "chief", 0),
///              node(Role::Worker, 11, "worker", 0)];
/// let resolve = table_resolver(&table);
/// assert_eq!(resolve("/job:chief/replica:0/task:0/device:CPU:0"), Some(9));
/// assert_eq!(resolve("/job:worker/replica:0/task:0/device:CPU:0"), Some(11));
/// assert_eq!(resolve("/job:worker/replica:0/task:1/device:CPU:0"), None);
/// assert_eq!(resolve("/job:ps/task:0"), Some(8));
/// assert_eq!(resolve("/job:server/task:0"), Some(8)); // no node runs `server`: by rank
/// ```
pub fn table_resolver(nodes: &[Node]) -> DeviceResolver {
    let tasks: HashMap<(String, u32), NodeId> = nodes
        .iter()
        .filter_map(|n| {
            Some((
                (n.task.as_ref()?.job.clone(), n.task.as_ref()?.index),
                n.id?,
            ))
        })
        .collect();
    if tasks.is_empty() {
        return default_resolver();
    }
    let jobs: HashSet<String> = tasks.keys().map(|(job, _)| job.clone()).collect();
    Arc::new(move |device| match job_and_task(device) {
        (Some(job), task) if jobs.contains(job) => tasks.get(&(job.to_owned(), task?)).copied(),
        _ => task_of_device(device),
    })
}
