//! The local backend: a job's tasks as processes on this machine, on loopback. Each task
//! gets `DMLC_*` (the cluster's size, the scheduler's address, its role and its own port),
//! `NUM_WORKERS`, and, servers and workers, `VANS_RANK` (its index) and a `TF_CONFIG`
//! naming its task; its output goes to
//! `<task>.log` in the job's folder. The first task to fail stops the others, except a
//! worker of an elastic job, which is started again in its place (up to `max_restarts`
//! times; the new process rejoins by the parameter server's recovery).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use jobs::BoxError;
use jobs::{JobSpec, State};
use van_core::link::stream::free_loopback_port;

use crate::follow::{self, Look, Seen, Watch};
use crate::Jobs;

/// The environment of every task of `spec`: (task name, variables), on loopback ports.
fn environments(spec: &JobSpec) -> Vec<(String, Vec<(String, String)>)> {
    let root = free_loopback_port();
    let ports: Vec<u16> = spec.tasks().iter().map(|_| free_loopback_port()).collect();
    let address = |_: &str, i: usize| ("127.0.0.1".to_owned(), ports.get(i).copied().unwrap_or(0));
    let mut all = spec.task_environments(("127.0.0.1", root), address);
    for (_, env) in &mut all {
        env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    all
}

/// A running task: its name, how to start it again, and its process.
struct Task {
    name: String,
    env: Vec<(String, String)>,
    child: Child,
}

/// Starts `spec`'s command as task `name` with `env`, its output to `<name>.log` in `dir`
/// (appended to when `append`: a restarted task keeps its earlier output).
fn spawn(
    spec: &JobSpec,
    dir: &Path,
    name: &str,
    env: &[(String, String)],
    append: bool,
) -> Result<Child, String> {
    let program = spec.command.first().ok_or("the job has no command")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(append)
        .write(true)
        .truncate(!append)
        .open(dir.join(format!("{name}.log")))
        .and_then(|log| Ok((log.try_clone()?, log)))
        .map_err(|e| format!("cannot create the log of {name}: {e}"))?;
    Command::new(program)
        .args(&spec.command[1..])
        .envs(env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(log.0)
        .stderr(log.1)
        .current_dir(dir)
        // Its own process group: stopping the task stops what it started.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start {program:?} for {name}: {e}"))
}

/// Starts job `id`'s tasks and follows them ([`follow`]).
pub(crate) fn start(
    jobs: Jobs,
    id: u64,
    spec: &JobSpec,
    dir: &Path,
    stop: Arc<AtomicBool>,
) -> Result<(), BoxError> {
    let mut tasks: Vec<Task> = Vec::new();
    for (name, env) in environments(spec) {
        match spawn(spec, dir, &name, &env, false) {
            Ok(child) => tasks.push(Task { name, env, child }),
            Err(e) => {
                for task in &mut tasks {
                    kill_group(&mut task.child);
                    let _ = task.child.wait();
                }
                return Err(e.into());
            }
        }
    }
    jobs.update(id, |job| {
        for (status, task) in job.status.tasks.iter_mut().zip(&tasks) {
            status.state = State::Running;
            status.pid = Some(task.child.id());
        }
    });
    let watch = Processes {
        spec: spec.clone(),
        dir: dir.to_owned(),
        tasks,
    };
    follow::spawn(jobs, id, spec, stop, watch);
    Ok(())
}

/// A local job's processes, as [`follow`] sees them.
struct Processes {
    spec: JobSpec,
    dir: PathBuf,
    tasks: Vec<Task>,
}

impl Watch for Processes {
    const EVERY: Duration = Duration::from_millis(50);

    async fn look(&mut self) -> Look {
        let mut look = Look::default();
        for task in &mut self.tasks {
            let seen = match task.child.try_wait() {
                Ok(None) => Seen::now(State::Running),
                Ok(Some(status)) => Seen {
                    state: if status.success() {
                        State::Succeeded
                    } else {
                        State::Failed
                    },
                    exit_code: status.code(),
                    why: format!("exited with {status}"),
                },
                // Cannot be waited for (already reaped elsewhere): counted as failed.
                Err(e) => Seen {
                    state: State::Failed,
                    exit_code: None,
                    why: format!("cannot be waited for: {e}"),
                },
            };
            look.tasks.push((task.name.clone(), seen));
        }
        look
    }

    async fn stop(&mut self) -> bool {
        for task in &mut self.tasks {
            kill_group(&mut task.child);
        }
        false
    }

    async fn restart(
        &mut self,
        name: &str,
        why: &str,
        attempt: u32,
        max: u32,
    ) -> Option<Result<u32, String>> {
        let task = self.tasks.iter_mut().find(|t| t.name == name)?;
        // Whatever the dead worker started goes with it (it may hold its port).
        kill_group(&mut task.child);
        let note =
            format!("vans-master: {name} {why}; starting it again (restart {attempt} of {max})\n");
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join(format!("{name}.log")))
            .and_then(|mut log| std::io::Write::write_all(&mut log, note.as_bytes()));
        Some(
            spawn(&self.spec, &self.dir, name, &task.env, true).map(|child| {
                task.child = child;
                task.child.id()
            }),
        )
    }
}

/// Kills `child`'s process group (the task and whatever it started).
fn kill_group(child: &mut Child) {
    let group = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    match group {
        Some(pid) => {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        None => {
            let _ = child.kill();
        }
    }
}
