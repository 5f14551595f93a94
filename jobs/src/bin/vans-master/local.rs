//! The local backend: a job's tasks as processes on this machine, on loopback. Each task
//! gets `DMLC_*` (the cluster's size, the scheduler's address and its own port; the
//! scheduler its role), `NUM_WORKERS`, and, servers and workers, a `TF_CONFIG` naming its
//! task, from which they take their role; its output goes to
//! `<task>.log` in the job's folder. The first task to fail stops the others, except a
//! worker of an elastic job, which is started again in its place (up to `max_restarts`
//! times; the new process rejoins by the parameter server's recovery).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobs::BoxError;
use jobs::{JobSpec, State};
use van_core::link::stream::free_loopback_port;

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

/// A running task: its name and role, how to start it again, and its process.
struct Task {
    name: String,
    role: &'static str,
    env: Vec<(String, String)>,
    child: Child,
    /// How often it was started again (elastic jobs).
    restarts: u32,
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

/// Starts job `id`'s tasks and a thread that follows them.
pub(crate) fn start(jobs: Jobs, id: u64, spec: &JobSpec, dir: &Path) -> Result<(), BoxError> {
    let roles: Vec<&'static str> = spec.tasks().into_iter().map(|(_, role, _)| role).collect();
    let mut tasks: Vec<Task> = Vec::new();
    for ((name, env), role) in environments(spec).into_iter().zip(roles) {
        match spawn(spec, dir, &name, &env, false) {
            Ok(child) => tasks.push(Task {
                name,
                role,
                env,
                child,
                restarts: 0,
            }),
            Err(e) => {
                for task in &mut tasks {
                    kill_group(&mut task.child);
                    let _ = task.child.wait();
                }
                return Err(e.into());
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = Arc::clone(&stop);
    jobs.update(id, |job| {
        if job.status.state == State::Stopped {
            // Asked to stop while its tasks were starting.
            stopper.store(true, Ordering::Release);
            return;
        }
        job.status.state = State::Running;
        for (status, task) in job.status.tasks.iter_mut().zip(&tasks) {
            status.state = State::Running;
            status.pid = Some(task.child.id());
        }
        job.stop = Some(Box::new(move || stopper.store(true, Ordering::Release)));
    });
    let spec = spec.clone();
    let dir = dir.to_owned();
    std::thread::spawn(move || follow(jobs, id, &spec, &dir, tasks, stop));
    Ok(())
}

/// Waits for the tasks, recording each exit; in an elastic job, starts a failed worker again
/// (up to `max_restarts` times each: the new process takes the dead one's place by
/// recovery); stops the rest on any other failure or a stop request.
fn follow(
    jobs: Jobs,
    id: u64,
    spec: &JobSpec,
    dir: &Path,
    mut tasks: Vec<Task>,
    stop: Arc<AtomicBool>,
) {
    let mut running = tasks.len();
    let mut failed: Option<String> = None;
    let mut killed = false;
    // The scheduler or a server has ended: a worker started again could not rejoin. The
    // tasks are in role order, so within a turn these are seen before the workers.
    let mut support_gone = false;
    while running > 0 {
        let stopping = stop.load(Ordering::Acquire);
        if (stopping || failed.is_some()) && !killed {
            for task in &mut tasks {
                kill_group(&mut task.child);
            }
            killed = true;
        }
        for task in &mut tasks {
            let status = match task.child.try_wait() {
                Ok(Some(status)) => Some(status),
                Ok(None) => continue,
                // Cannot be waited for (already reaped elsewhere): counted as failed.
                Err(_) => None,
            };
            let success = status.is_some_and(|s| s.success());
            let described = status.map_or("an unknown status".to_owned(), |s| s.to_string());
            let name = task.name.clone();
            let restart = !success
                && !killed
                && !stopping
                && !support_gone
                && failed.is_none()
                && spec.elastic
                && task.role == "worker"
                && task.restarts < spec.max_restarts;
            if restart {
                // Whatever the dead worker started goes with it (it may hold its port).
                kill_group(&mut task.child);
                task.restarts += 1;
                let note = format!(
                    "vans-master: {name} exited with {described}; starting it again (restart {} \
                     of {})\n",
                    task.restarts, spec.max_restarts
                );
                let _ = std::fs::OpenOptions::new()
                    .append(true)
                    .open(dir.join(format!("{name}.log")))
                    .and_then(|mut log| std::io::Write::write_all(&mut log, note.as_bytes()));
                match spawn(spec, dir, &name, &task.env, true) {
                    Ok(child) => {
                        task.child = child;
                        let (pid, restarts) = (task.child.id(), task.restarts);
                        jobs.update(id, |job| {
                            if let Some(t) = job.status.tasks.iter_mut().find(|t| t.name == name) {
                                (t.pid, t.restarts) = (Some(pid), restarts);
                            }
                        });
                        continue;
                    }
                    Err(e) => failed = Some(format!("task {name} could not be restarted: {e}")),
                }
            }
            // Reported once: a reaped child's try_wait keeps returning its status.
            let mut first = false;
            jobs.update(id, |job| {
                if let Some(t) = job.status.tasks.iter_mut().find(|t| t.name == name) {
                    if t.state.is_final() {
                        return;
                    }
                    first = true;
                    t.exit_code = status.and_then(|s| s.code());
                    t.state = match (success, killed) {
                        (true, _) => State::Succeeded,
                        (false, true) => State::Stopped,
                        (false, false) => State::Failed,
                    };
                }
            });
            if first {
                running -= 1;
                support_gone |= task.role != "worker";
                if !success && !killed && failed.is_none() {
                    failed = Some(format!("task {name} exited with {described}"));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    jobs.update(id, |job| {
        job.stop = None;
        job.status.state = if stop.load(Ordering::Acquire) {
            State::Stopped
        } else if failed.is_some() {
            State::Failed
        } else {
            State::Succeeded
        };
        job.status.error = failed;
    });
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
