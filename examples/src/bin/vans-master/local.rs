//! The local backend: a job's tasks as processes on this machine, on loopback. Each task
//! gets `DMLC_*` (its role, the cluster's size, the scheduler's address and its own port),
//! `NUM_WORKERS`, and, servers and workers, a `TF_CONFIG` naming its task; its output goes to
//! `<task>.log` in the job's folder. The first task to fail stops the others.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use examples::master::{JobSpec, State, Strategy};
use examples::raw::BoxError;
use van_core::link::stream::free_loopback_port;

use crate::Jobs;

/// The environment of every task of `spec`: (task name, variables).
fn environments(spec: &JobSpec) -> Vec<(String, Vec<(String, String)>)> {
    let root = free_loopback_port();
    let tasks = spec.tasks();
    let ports: Vec<u16> = tasks.iter().map(|_| free_loopback_port()).collect();
    let addresses = |role: &str| -> Vec<String> {
        tasks
            .iter()
            .zip(&ports)
            .filter(|((_, r, _), _)| *r == role)
            .map(|(_, port)| format!("127.0.0.1:{port}"))
            .collect()
    };
    let cluster = serde_json::json!({ "ps": addresses("server"), "worker": addresses("worker") });
    tasks
        .iter()
        .zip(&ports)
        .map(|((name, role, rank), port)| {
            let mut env = vec![
                ("DMLC_ROLE".to_owned(), (*role).to_owned()),
                ("DMLC_NUM_SERVER".to_owned(), spec.servers().to_string()),
                ("DMLC_NUM_WORKER".to_owned(), spec.worker_num.to_string()),
                ("DMLC_PS_ROOT_URI".to_owned(), "127.0.0.1".to_owned()),
                ("DMLC_PS_ROOT_PORT".to_owned(), root.to_string()),
                ("NUM_WORKERS".to_owned(), spec.worker_num.to_string()),
                ("VANS_TASK".to_owned(), format!("{}/{name}", spec.name)),
            ];
            if *role != "scheduler" {
                env.push(("DMLC_PORT".to_owned(), port.to_string()));
                let task_type = if *role == "server" { "ps" } else { "worker" };
                let tf = serde_json::json!({
                    "cluster": cluster,
                    "task": { "type": task_type, "index": rank },
                });
                env.push(("TF_CONFIG".to_owned(), tf.to_string()));
            }
            if spec.strategy == Strategy::AllReduce {
                env.push(("VANS_STRATEGY".to_owned(), "AllReduce".to_owned()));
            }
            env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
            (name.clone(), env)
        })
        .collect()
}

/// Starts job `id`'s tasks and a thread that follows them.
pub(crate) fn start(jobs: Jobs, id: u64, spec: &JobSpec, dir: &Path) -> Result<(), BoxError> {
    let mut children: Vec<(String, Child)> = Vec::new();
    for (name, env) in environments(spec) {
        let spawned = File::create(dir.join(format!("{name}.log")))
            .and_then(|log| Ok((log.try_clone()?, log)))
            .map_err(|e| format!("cannot create the log of {name}: {e}"))
            .and_then(|(out, err)| {
                Command::new(&spec.command[0])
                    .args(&spec.command[1..])
                    .envs(env)
                    .stdin(Stdio::null())
                    .stdout(out)
                    .stderr(err)
                    .current_dir(dir)
                    // Its own process group: stopping the task stops what it started.
                    .process_group(0)
                    .spawn()
                    .map_err(|e| format!("cannot start {:?} for {name}: {e}", spec.command[0]))
            });
        match spawned {
            Ok(child) => children.push((name, child)),
            Err(e) => {
                for (_, child) in &mut children {
                    kill_group(child);
                    let _ = child.wait();
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
        for task in &mut job.status.tasks {
            task.state = State::Running;
        }
        job.stop = Some(Box::new(move || stopper.store(true, Ordering::Release)));
    });
    std::thread::spawn(move || follow(jobs, id, children, stop));
    Ok(())
}

/// Waits for the tasks, recording each exit; stops the rest on a failure or a stop request.
fn follow(jobs: Jobs, id: u64, mut children: Vec<(String, Child)>, stop: Arc<AtomicBool>) {
    let mut running = children.len();
    let mut failed: Option<String> = None;
    let mut killed = false;
    while running > 0 {
        let stopping = stop.load(Ordering::Acquire);
        if (stopping || failed.is_some()) && !killed {
            for (_, child) in &mut children {
                kill_group(child);
            }
            killed = true;
        }
        for (name, child) in &mut children {
            let status = match child.try_wait() {
                Ok(Some(status)) => Some(status),
                Ok(None) => continue,
                // Cannot be waited for (already reaped elsewhere): counted as failed.
                Err(_) => None,
            };
            let success = status.is_some_and(|s| s.success());
            let described = status.map_or("an unknown status".to_owned(), |s| s.to_string());
            // Reported once: a reaped child's try_wait keeps returning its status.
            let name = name.clone();
            let mut first = false;
            jobs.update(id, |job| {
                if let Some(task) = job.status.tasks.iter_mut().find(|t| t.name == name) {
                    if task.state.is_final() {
                        return;
                    }
                    first = true;
                    task.exit_code = status.and_then(|s| s.code());
                    task.state = match (success, killed) {
                        (true, _) => State::Succeeded,
                        (false, true) => State::Stopped,
                        (false, false) => State::Failed,
                    };
                }
            });
            if first {
                running -= 1;
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
