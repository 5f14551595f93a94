//! The Slurm backend: one batch job per vans job. The batch script exports the cluster's
//! size and the scheduler's port and runs every task with `srun`; each task takes its role
//! from its Slurm rank (rank 0 the scheduler, then the servers, then the workers, as the
//! book's "Roles from Slurm, MPI and PyTorch launchers", `docs/src/operators/launch.md`,
//! says) and writes `<task>.log`; a small shell wrapper records each task's exit code in
//! `rank-N.exit`. The master follows the job with `scontrol` and stops it with `scancel`.
//!
//! A TensorFlow job's tasks get no `DMLC_*` variable; each sets its `TF_CONFIG` from its
//! Slurm rank and the step's nodes before its command runs (`deploy/slurm/tf-config.sh`,
//! embedded: ps tasks first, then workers, each on its node's next port).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use jobs::BoxError;
use jobs::{JobSpec, State};
use tokio::process::Command;

use crate::follow::{self, Look, Seen, Watch};
use crate::Jobs;

/// Quotes `word` for a POSIX shell.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Runs the task's command (`$2…`) and writes its exit code to `$1/rank-<Slurm rank>.exit`;
/// a task killed before it ends (srun's `--kill-on-bad-exit`, `scancel`) writes none.
const EXIT_WRAPPER: &str =
    r#"d=$1; shift; "$@"; c=$?; echo "$c" > "$d/rank-$SLURM_PROCID.exit"; exit "$c""#;

/// `vans_tf_config NUM_PS`, the shell function that sets a task's `TF_CONFIG` from Slurm's
/// variables; users' own batch scripts source the same file.
const TF_CONFIG_SH: &str = include_str!("../../../../deploy/slurm/tf-config.sh");

/// [`EXIT_WRAPPER`] for a TensorFlow task: `TF_CONFIG` first (`$2`: the number of ps tasks);
/// a task whose cluster cannot be read exits 1 and says why.
fn tf_wrapper() -> String {
    format!(
        "{TF_CONFIG_SH}\nd=$1; n=$2; shift 2; vans_tf_config \"$n\" || \
         {{ echo 1 > \"$d/rank-$SLURM_PROCID.exit\"; exit 1; }}; \
         \"$@\"; c=$?; echo \"$c\" > \"$d/rank-$SLURM_PROCID.exit\"; exit \"$c\""
    )
}

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
    if !spec.tensorflow {
        s += &format!("export DMLC_NUM_SERVER={}\n", spec.servers());
        s += &format!("export DMLC_NUM_WORKER={}\n", spec.worker_num);
        s += "export DMLC_PS_ROOT_PORT=${DMLC_PS_ROOT_PORT:-$((20000 + SLURM_JOB_ID % 20000))}\n";
    }
    s += &format!("export NUM_WORKERS={}\n", spec.worker_num);
    s += &format!("export VANS_TASK={}\n", quote(&spec.name));
    for (k, v) in &spec.env {
        s += &format!("export {k}={}\n", quote(v));
    }
    let (wrapper, ps) = match spec.tensorflow {
        true => (tf_wrapper(), format!(" {}", spec.servers())),
        false => (EXIT_WRAPPER.to_owned(), String::new()),
    };
    // One log per task, by Slurm rank (renamed to task names by the master); ranks in blocks,
    // as a TensorFlow task's TF_CONFIG assumes.
    s += &format!(
        "exec srun --kill-on-bad-exit=1 --distribution=block --output={} /bin/sh -c {} \
         vans-task {}{ps} {}\n",
        quote(&dir.join("rank-%t.log").display().to_string()),
        quote(&wrapper),
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

/// Submits job `id` and follows it ([`follow`]).
pub(crate) async fn start(
    jobs: Jobs,
    id: u64,
    spec: &JobSpec,
    dir: &Path,
    stop: Arc<AtomicBool>,
) -> Result<(), BoxError> {
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
    let watch = SlurmJob {
        id,
        slurm_id,
        names: tasks.into_iter().map(|(name, _, _)| name).collect(),
        dir: dir.to_owned(),
        misses: 0,
        cancelled: false,
    };
    follow::spawn(jobs, id, spec, stop, watch);
    Ok(())
}

/// A vans job's Slurm job, as [`follow`] sees it: `scontrol` for its state,
/// the wrapper's `rank-N.exit` files for each task's code.
struct SlurmJob {
    id: u64,
    slurm_id: String,
    /// Task names in Slurm rank order.
    names: Vec<String>,
    dir: PathBuf,
    /// `scontrol` failures in a row.
    misses: u32,
    /// `scancel` was sent.
    cancelled: bool,
}

impl SlurmJob {
    /// Links each rank's log to its task's name, once the rank wrote it.
    fn link_logs(&self) {
        for (rank, name) in self.names.iter().enumerate() {
            let from = self.dir.join(format!("rank-{rank}.log"));
            let to = self.dir.join(format!("{name}.log"));
            if from.exists() && !to.exists() {
                let _ = std::fs::hard_link(&from, &to);
            }
        }
    }
}

impl Watch for SlurmJob {
    const EVERY: Duration = Duration::from_millis(500);

    async fn look(&mut self) -> Look {
        let (id, slurm_id) = (self.id, &self.slurm_id);
        let info = match run("scontrol", &["show", "job", "-o", slurm_id]).await {
            Ok(info) => {
                self.misses = 0;
                info
            }
            // A busy controller: ask again, for a minute, before giving up on the job.
            Err(e) if self.misses < 120 => {
                self.misses += 1;
                if self.misses == 1 {
                    eprintln!("vans-master: job {id}: scontrol failed, trying again: {e}");
                }
                return Look::default();
            }
            Err(e) => {
                return Look {
                    failed: Some(format!("Slurm job {slurm_id} lost: {e}")),
                    ..Look::default()
                }
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
        self.link_logs();
        // Each task's own exit code, once it wrote one.
        let codes: Vec<Option<i32>> = (0..self.names.len())
            .map(|rank| {
                std::fs::read_to_string(self.dir.join(format!("rank-{rank}.exit")))
                    .ok()
                    .and_then(|c| c.trim().parse().ok())
            })
            .collect();
        // A task that failed by itself (not by SIGTERM or SIGKILL, which srun sends the others
        // when one fails and scancel sends all).
        let failed_alone = codes
            .iter()
            .any(|c| c.is_some_and(|c| c != 0 && c != STOPPED_BY_TERM && c != STOPPED_BY_KILL));
        // Signalled tasks were stopped when another failed or the job was cancelled;
        // otherwise the signal is their own failure (the OOM killer's SIGKILL, say).
        let stopped = failed_alone || self.cancelled || state == State::Stopped;
        let mut look = Look::default();
        for (name, code) in self.names.iter().zip(&codes) {
            let seen = match code {
                Some(0) => State::Succeeded,
                Some(STOPPED_BY_TERM | STOPPED_BY_KILL) if stopped => State::Stopped,
                Some(_) => State::Failed,
                // Not ended, or killed before it could tell (by srun when another task
                // failed, or by scancel).
                None if state.is_final() && state != State::Succeeded => State::Stopped,
                None => state,
            };
            let why = match code {
                Some(c) => format!("exited with {c}"),
                None => format!("ended with its Slurm job, {slurm_state}"),
            };
            look.tasks.push((
                name.clone(),
                Seen {
                    state: seen,
                    exit_code: *code,
                    why,
                },
            ));
        }
        if state == State::Failed && !failed_alone {
            look.failed = Some(format!(
                "Slurm job {slurm_id} ended {slurm_state} (exit {exit}); see slurm.out and the \
                 task logs"
            ));
        }
        look
    }

    async fn stop(&mut self) -> bool {
        self.cancelled = true;
        if let Err(e) = run("scancel", &[&self.slurm_id]).await {
            eprintln!("vans-master: job {}: {e}", self.id);
        }
        false
    }
}
