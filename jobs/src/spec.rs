//! What `vans-master` and `vans-submit` (the ElasticDL-style master and client) exchange: the
//! job submission and the status the master reports as JSON.
//!
//! A job is a cluster of tasks started by a backend: the scheduler, `ps_num` servers (one
//! idle server for an `AllReduce` job, whose workers all-reduce among themselves) and
//! `worker_num` workers, each running `command` with its `DMLC_*` variables, `NUM_WORKERS`
//! and (local backend) a `TF_CONFIG` naming its task.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The training strategy of a job (ElasticDL's `--distribution_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Strategy {
    /// Servers hold the parameters; workers push and pull.
    ParameterServer,
    /// Workers all-reduce among themselves (the `collective` crate); one idle server.
    AllReduce,
}

/// A job submission (`POST /jobs`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSpec {
    /// The task name (`--task`): names the job in status and logs.
    pub name: String,
    /// The strategy.
    pub strategy: Strategy,
    /// Parameter servers (`--ps-num`); ignored for `AllReduce`.
    pub ps_num: u32,
    /// Workers (`--worker-num`).
    pub worker_num: u32,
    /// The program and its arguments, run by every task (with an `image`, may be empty: the
    /// image's own command).
    pub command: Vec<String>,
    /// A container image the tasks run (`--image`; the Kubernetes backend only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Extra environment for every task.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// An elastic job (`--elastic`): a worker that fails is started again in its place, up
    /// to `max_restarts` times each, and rejoins by recovery; the program must cope (an
    /// all-reduce job settles into a new generation, a parameter-server worker should check
    /// `Postoffice::is_recovery`). The local backend only.
    #[serde(default)]
    pub elastic: bool,
    /// How often an elastic job's worker may be started again (`--max-restarts`).
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
    /// TensorFlow tasks (`--tensorflow`): `ps_num` ps tasks (none for `AllReduce`) and
    /// `worker_num` worker tasks, each with a `TF_CONFIG` naming its task, and no scheduler
    /// task and no `DMLC_*` variable (a TensorFlow server with a vans protocol hosts the
    /// scheduler itself). The job succeeds once `worker-0`, the chief, exits 0; the tasks
    /// left are then stopped, as under a TFJob's default success policy. The local and Slurm
    /// backends (under Slurm each task sets its `TF_CONFIG` from its rank and the step's
    /// nodes: `deploy/slurm/tf-config.sh`).
    #[serde(default)]
    pub tensorflow: bool,
}

/// [`JobSpec::max_restarts`] when not given.
pub const DEFAULT_MAX_RESTARTS: u32 = 3;

fn default_max_restarts() -> u32 {
    DEFAULT_MAX_RESTARTS
}

impl JobSpec {
    /// Servers (ps tasks) the cluster gets: `ps_num`, or for `AllReduce` one idle server
    /// (none for TensorFlow tasks).
    pub fn servers(&self) -> u32 {
        match self.strategy {
            Strategy::ParameterServer => self.ps_num,
            Strategy::AllReduce => u32::from(!self.tensorflow),
        }
    }

    /// Why the master refuses this job, if it does.
    pub fn check(&self) -> Result<(), String> {
        let no_image = self.image.as_deref().is_none_or(|i| i.trim().is_empty());
        if no_image && self.command.is_empty() {
            return Err("the job has no command (and no image)".into());
        }
        if self.command.first().is_some_and(|c| c.is_empty()) {
            return Err("the job's command is an empty program name".into());
        }
        if self.worker_num == 0 {
            return Err("worker_num must be at least 1".into());
        }
        if self.tensorflow && self.elastic {
            return Err(
                "a TensorFlow job cannot be elastic: a worker started again would \
                        rejoin by vans' recovery, which TensorFlow's tasks do not use"
                    .into(),
            );
        }
        if self.strategy == Strategy::ParameterServer && self.ps_num == 0 {
            return Err("a ParameterServer job needs ps_num of at least 1".into());
        }
        if let Some(k) = self.env.keys().find(|k| {
            k.is_empty()
                || k.starts_with(|c: char| c.is_ascii_digit())
                || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }) {
            return Err(format!(
                "environment variable name {k:?} is not a shell name"
            ));
        }
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "task name {:?} must be letters, digits, `-` or `_`",
                self.name
            ));
        }
        Ok(())
    }

    /// The tasks in rank order: (name, role, rank within the role). TensorFlow jobs have no
    /// scheduler, and their servers are named `ps-N`.
    pub fn tasks(&self) -> Vec<(String, &'static str, u32)> {
        let mut tasks = Vec::new();
        if !self.tensorflow {
            tasks.push(("scheduler".to_owned(), "scheduler", 0));
        }
        let server = if self.tensorflow { "ps" } else { "server" };
        tasks.extend((0..self.servers()).map(|r| (format!("{server}-{r}"), "server", r)));
        tasks.extend((0..self.worker_num).map(|r| (format!("worker-{r}"), "worker", r)));
        tasks
    }

    /// The variables of each task (in [`tasks`](Self::tasks) order) when the master starts
    /// the tasks itself (local and Kubernetes backends): the cluster's size, the scheduler at
    /// `root`, `NUM_WORKERS`, `VANS_TASK`, its `DMLC_ROLE`; servers and workers their
    /// `DMLC_PORT`, their index as `VANS_RANK` (so a worker's rank is its index) and a
    /// `TF_CONFIG` naming their task in the cluster of `address`es (for TensorFlow code);
    /// `VANS_STRATEGY` for `AllReduce`. A TensorFlow job's tasks get `NUM_WORKERS`,
    /// `VANS_TASK` and their `TF_CONFIG` only. `address(task name, index)` is where that
    /// task listens. The job's own `env` is not included.
    pub fn task_environments(
        &self,
        root: (&str, u16),
        address: impl Fn(&str, usize) -> (String, u16),
    ) -> Vec<(String, Vec<(String, String)>)> {
        let tasks = self.tasks();
        let listed = |role: &str| -> Vec<String> {
            tasks
                .iter()
                .enumerate()
                .filter(|(_, (_, r, _))| *r == role)
                .map(|(i, (name, _, _))| {
                    let (host, port) = address(name, i);
                    format!("{host}:{port}")
                })
                .collect()
        };
        let ps = listed("server");
        // The ps tasks' TF_CONFIGs, then the workers'.
        let configs = launcher::tf_configs(&ps, &listed("worker"));
        let var = |k: &str, v: String| (k.to_owned(), v);
        let tf_config = |role: &str, rank: u32| {
            let index = rank as usize + if role == "server" { 0 } else { ps.len() };
            configs.get(index).cloned().unwrap_or_default()
        };
        if self.tensorflow {
            return tasks
                .iter()
                .map(|(name, role, rank)| {
                    let env = vec![
                        var("NUM_WORKERS", self.worker_num.to_string()),
                        var("VANS_TASK", format!("{}/{name}", self.name)),
                        var("TF_CONFIG", tf_config(role, *rank)),
                    ];
                    (name.clone(), env)
                })
                .collect();
        }
        tasks
            .iter()
            .enumerate()
            .map(|(i, (name, role, rank))| {
                let mut env = vec![
                    var("DMLC_NUM_SERVER", self.servers().to_string()),
                    var("DMLC_NUM_WORKER", self.worker_num.to_string()),
                    var("DMLC_PS_ROOT_URI", root.0.to_owned()),
                    var("DMLC_PS_ROOT_PORT", root.1.to_string()),
                    var("NUM_WORKERS", self.worker_num.to_string()),
                    var("VANS_TASK", format!("{}/{name}", self.name)),
                ];
                // Every task can read its role, as under any launcher (a script's
                // `if os.environ.get("DMLC_ROLE")` guard holds in every task).
                env.push(var("DMLC_ROLE", (*role).to_owned()));
                if *role != "scheduler" {
                    env.push(var("DMLC_PORT", address(name, i).1.to_string()));
                    // The rank is the task's index, as TF_CONFIG's task says.
                    env.push(var("VANS_RANK", rank.to_string()));
                    env.push(var("TF_CONFIG", tf_config(role, *rank)));
                }
                if self.strategy == Strategy::AllReduce {
                    env.push(var("VANS_STRATEGY", "AllReduce".to_owned()));
                }
                (name.clone(), env)
            })
            .collect()
    }
}

/// Where a job or a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Submitted to the backend, not started yet.
    Pending,
    /// Running.
    Running,
    /// Every task exited 0.
    Succeeded,
    /// A task failed (the others were stopped).
    Failed,
    /// Stopped on request.
    Stopped,
}

impl State {
    /// Whether the job (or task) is over.
    pub fn is_final(self) -> bool {
        matches!(self, State::Succeeded | State::Failed | State::Stopped)
    }
}

/// One task's status.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskStatus {
    /// `scheduler`, `server-0`, `worker-1`, …
    pub name: String,
    /// Its role.
    pub role: String,
    /// Where it stands.
    pub state: State,
    /// Its exit code, once known.
    pub exit_code: Option<i32>,
    /// How often it was started again (elastic jobs).
    #[serde(default)]
    pub restarts: u32,
    /// Its process id on the master's machine (local backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
}

/// A job's status (`GET /jobs/{id}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobStatus {
    /// The master's id of the job.
    pub id: u64,
    /// The submission.
    pub spec: JobSpec,
    /// `local` or `slurm`.
    pub backend: String,
    /// Where the job stands.
    pub state: State,
    /// The tasks.
    pub tasks: Vec<TaskStatus>,
    /// Why it failed, when it did.
    pub error: Option<String>,
}
