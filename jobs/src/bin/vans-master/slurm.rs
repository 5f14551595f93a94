//! The Slurm backend: one batch job per vans job. The batch script exports the cluster's
//! size and the scheduler's port and runs every task with `srun`; each task takes its role
//! from its Slurm rank (rank 0 the scheduler, then the servers, then the workers, as the
//! book's "Roles from Slurm, MPI and PyTorch launchers", `docs/src/operators/launch.md`,
//! says) and writes `<task>.log`; a small shell wrapper records each task's exit code in
//! `rank-N.exit`. The master follows the job with `scontrol` and stops it with `scancel`.

use std::path::Path;
use std::time::Duration;

use jobs::BoxError;
use jobs::{JobSpec, State};
use tokio::process::Command;

use crate::Jobs;

/// Quotes `word` for a POSIX shell.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Runs the task's command (`$2…`) and writes its exit code to `$1/rank-<Slurm rank>.exit`;
/// a task killed before it ends (srun's `--kill-on-bad-exit`, `scancel`) writes none.
const EXIT_WRAPPER: &str =
    r#"d=$1; shift; "$@"; c=$?; echo "$c" > "$d/rank-$SLURM_PROCID.exit"; exit "$c""#;

/// The shell's exit code of a task ended by SIGTERM (128 + 15) and by SIGKILL (128 + 9).
const STOPPED_BY_TERM: i32 = 143;
/// See [`STOPPED_BY_TERM`].
const STOPPED_BY_KILL: i32 = 137;

/// The batch script of `spec`, with its output in `dir`.
fn script(spec: &JobSpec, dir: &Path, tasks: usize) -> String {
    let mut s = String::from("#!/bin/bash\n");
    s += &format!("#SBATCH --job-name={}\n", spec.name);
    s += &format!("#SBATCH --ntasks={tasks}\n");
    s += &format!(
        "#SBATCH --output={}\n",
        dir.join("slurm.out")
            .display()
            .to_string()
            .replace(' ', "\\ ")
    );
    s += "set -euo pipefail\n";
    s += &format!("export DMLC_NUM_SERVER={}\n", spec.servers());
    s += &format!("export DMLC_NUM_WORKER={}\n", spec.worker_num);
    s += &format!("export NUM_WORKERS={}\n", spec.worker_num);
    s += "export DMLC_PS_ROOT_PORT=${DMLC_PS_ROOT_PORT:-$((20000 + SLURM_JOB_ID % 20000))}\n";
    s += &format!("export VANS_TASK={}\n", quote(&spec.name));
    for (k, v) in &spec.env {
        s += &format!("export {k}={}\n", quote(v));
    }
    // One log per task, by Slurm rank (renamed to task names by the master).
    s += &format!(
        "exec srun --kill-on-bad-exit=1 --output={} /bin/sh -c {} vans-task {} {}\n",
        quote(&dir.join("rank-%t.log").display().to_string()),
        quote(EXIT_WRAPPER),
        quote(&dir.display().to_string()),
        spec.command
            .iter()
            .map(|w| quote(w))
            .collect::<Vec<_>>()
            .join(" ")
    );
    s
}

async fn run(program: &str, args: &[&str]) -> Result<String, BoxError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|e| format!("cannot run {program} (is Slurm installed?): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Submits job `id` and starts following it.
pub(crate) async fn start(jobs: Jobs, id: u64, spec: &JobSpec, dir: &Path) -> Result<(), BoxError> {
    let tasks = spec.tasks();
    let path = dir.join("job.sbatch");
    std::fs::write(&path, script(spec, dir, tasks.len()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let path = path.display().to_string();
    let slurm_id = run("sbatch", &["--parsable", &path]).await?;
    let slurm_id = slurm_id.trim().split(';').next().unwrap_or("").to_owned();
    if slurm_id.is_empty() {
        return Err("sbatch printed no job id".into());
    }
    let cancel_id = slurm_id.clone();
    let cancel = move || {
        let _ = std::process::Command::new("scancel")
            .arg(&cancel_id)
            .status();
    };
    let mut stop_now = None;
    jobs.update(id, |job| {
        if job.status.state == State::Stopped {
            // Asked to stop while sbatch ran.
            stop_now = Some(cancel);
        } else {
            job.stop = Some(Box::new(cancel));
        }
    });
    if let Some(cancel) = stop_now {
        cancel();
    }
    let names: Vec<String> = tasks.into_iter().map(|(name, _, _)| name).collect();
    let dir = dir.to_owned();
    tokio::spawn(follow(jobs, id, slurm_id, names, dir));
    Ok(())
}

/// Polls the Slurm job until it ends; renames the rank logs to task names.
async fn follow(
    jobs: Jobs,
    id: u64,
    slurm_id: String,
    names: Vec<String>,
    dir: std::path::PathBuf,
) {
    let link_logs = || {
        for (rank, name) in names.iter().enumerate() {
            let from = dir.join(format!("rank-{rank}.log"));
            let to = dir.join(format!("{name}.log"));
            if from.exists() && !to.exists() {
                let _ = std::fs::hard_link(&from, &to);
            }
        }
    };
    let mut misses = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let info = match run("scontrol", &["show", "job", "-o", &slurm_id]).await {
            Ok(info) => {
                misses = 0;
                info
            }
            // A busy controller: ask again, for a minute, before giving up on the job.
            Err(e) if misses < 120 => {
                misses += 1;
                if misses == 1 {
                    eprintln!("vans-master: job {id}: scontrol failed, trying again: {e}");
                }
                continue;
            }
            Err(e) => {
                jobs.update(id, |job| {
                    job.status.state = State::Failed;
                    job.status.error = Some(format!("Slurm job {slurm_id} lost: {e}"));
                });
                return;
            }
        };
        let field = |key: &str| {
            info.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key))
                .unwrap_or("")
                .to_owned()
        };
        let slurm_state = field("JobState=");
        let exit = field("ExitCode=");
        let state = match slurm_state.as_str() {
            "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" => {
                State::Pending
            }
            "COMPLETED" => State::Succeeded,
            "CANCELLED" => State::Stopped,
            "FAILED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY" | "BOOT_FAIL" | "DEADLINE"
            | "PREEMPTED" | "SPECIAL_EXIT" | "REVOKED" => State::Failed,
            // RUNNING, COMPLETING, SUSPENDED, STAGE_OUT, SIGNALING, RESIZING, ...: not over.
            _ => State::Running,
        };
        link_logs();
        // Each task's own exit code, once it wrote one.
        let codes: Vec<Option<i32>> = (0..names.len())
            .map(|rank| {
                std::fs::read_to_string(dir.join(format!("rank-{rank}.exit")))
                    .ok()
                    .and_then(|c| c.trim().parse().ok())
            })
            .collect();
        // A task that failed by itself (not by SIGTERM or SIGKILL, which srun sends the others
        // when one fails and scancel sends all).
        let failed_alone = codes
            .iter()
            .any(|c| c.is_some_and(|c| c != 0 && c != STOPPED_BY_TERM && c != STOPPED_BY_KILL));
        let mut done = false;
        jobs.update(id, |job| {
            if job.status.state == State::Stopped && !state.is_final() {
                return; // asked to stop; scancel is on its way
            }
            // Signalled tasks were stopped when another failed or the job was cancelled;
            // otherwise the signal is their own failure (the OOM killer's SIGKILL, say).
            let stopped = failed_alone || job.status.state == State::Stopped || state == State::Stopped;
            job.status.state = state;
            for (task, code) in job.status.tasks.iter_mut().zip(&codes) {
                (task.state, task.exit_code) = match code {
                    Some(0) => (State::Succeeded, Some(0)),
                    Some(c @ (STOPPED_BY_TERM | STOPPED_BY_KILL)) if stopped => {
                        (State::Stopped, Some(*c))
                    }
                    Some(c) => (State::Failed, Some(*c)),
                    // Not ended, or killed before it could tell (by srun when another
                    // task failed, or by scancel).
                    None if state.is_final() && state != State::Succeeded => (State::Stopped, None),
                    None => (state, None),
                };
            }
            if state == State::Failed {
                let first = job
                    .status
                    .tasks
                    .iter()
                    .find(|t| t.state == State::Failed)
                    .map(|t| {
                        let code = t.exit_code.map_or("?".to_owned(), |c| c.to_string());
                        format!("task {} exited with {code}; ", t.name)
                    })
                    .unwrap_or_default();
                job.status.error = Some(format!(
                    "{first}Slurm job {slurm_id} ended {slurm_state} (exit {exit}); see slurm.out and the task logs"
                ));
            }
            if state.is_final() {
                job.stop = None;
                done = true;
            }
        });
        if done {
            return;
        }
    }
}
