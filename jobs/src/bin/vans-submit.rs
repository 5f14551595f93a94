//! `vans-submit`: submits a job to `vans-master` and shows its progress until it ends, with
//! the seed client's options:
//!
//! ```text
//! vans-submit --master http://127.0.0.1:8470 --strategy AllReduce --ps-num 0 --worker-num 4 \
//!     --task test -- ./target/release/allreduce-bench node check
//! ```
//!
//! It prints each change of the job's and its tasks' states, then, when the job failed, the
//! end of each failed task's log; exits 0 when every task exited 0. `--image` names a
//! container image for a master with the Kubernetes backend (the command after `--` then
//! replaces the image's own, and may be left out); other backends refuse it.
//!
//! `--dry-run` (a build with the `kubernetes` feature) submits nothing: it prints the
//! Kubernetes objects the job would be (a `List`, in JSON, which `kubectl apply -f -` takes),
//! laid out as `--layout pods` (a headless service and a pod per task) or `tfjob` (a Kubeflow
//! TFJob), for `--namespace` and `--kube-secret`; `--master` is then not needed.

use std::time::Duration;

use clap::Parser;
use jobs::client::Master;
use jobs::BoxError;
use jobs::{JobSpec, JobStatus, State, Strategy};

/// The submitter's options.
#[derive(Parser, Debug)]
#[command(name = "vans-submit", version)]
struct Options {
    /// The master: `http://host:port`, `host:port` or `https://host:port` (with --ca-file;
    /// a build with the `tls` feature).
    #[arg(long, required_unless_present = "dry_run")]
    master: Option<String>,
    /// The PEM certificate to trust for an https:// master: its own, or its authority's.
    #[arg(long)]
    ca_file: Option<std::path::PathBuf>,
    /// A file holding the master's token (instead of VANS_MASTER_TOKEN).
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,
    /// ParameterServer or AllReduce.
    #[arg(long, value_parser = ["ParameterServer", "AllReduce"])]
    strategy: String,
    /// Parameter servers (0 for AllReduce).
    #[arg(long, default_value = "1")]
    ps_num: u32,
    /// Workers.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    worker_num: u32,
    /// A container image to run (a master with the Kubernetes backend).
    #[arg(long)]
    image: Option<String>,
    /// Print the job's Kubernetes objects instead of submitting it.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run: the namespace of the objects.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// With --dry-run: `pods` or `tfjob`.
    #[arg(long, default_value = "pods", value_parser = ["pods", "tfjob"])]
    layout: String,
    /// With --dry-run: a Secret (key `secret`) with the cluster secret.
    #[arg(long)]
    kube_secret: Option<String>,
    /// The name of this task.
    #[arg(long)]
    task: String,
    /// Elastic: a worker that fails is started again in its place (local backend).
    #[arg(long)]
    elastic: bool,
    /// TensorFlow tasks: ps and worker tasks with their TF_CONFIG, no scheduler task; the
    /// job succeeds when worker-0 (the chief) exits 0 (local and Slurm backends).
    #[arg(long)]
    tensorflow: bool,
    /// With --elastic: how often each worker may be started again.
    #[arg(long, default_value_t = jobs::DEFAULT_MAX_RESTARTS)]
    max_restarts: u32,
    /// Extra environment for every task, `NAME=VALUE` (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Give up waiting after this many seconds (the job goes on).
    #[arg(long, default_value = "3600")]
    timeout: u64,
    /// The program and its arguments, run by every task.
    #[arg(last = true)]
    command: Vec<String>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let options = Options::parse();
    match submit(options).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("vans-submit: {e}");
            std::process::exit(2);
        }
    }
}

async fn submit(o: Options) -> Result<bool, BoxError> {
    let mut env = std::collections::BTreeMap::new();
    for pair in &o.env {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("--env {pair}: expected NAME=VALUE"))?;
        env.insert(k.to_owned(), v.to_owned());
    }
    let spec = JobSpec {
        name: o.task.clone(),
        strategy: if o.strategy == "AllReduce" {
            Strategy::AllReduce
        } else {
            Strategy::ParameterServer
        },
        ps_num: o.ps_num,
        worker_num: o.worker_num,
        command: o.command.clone(),
        image: o.image.clone(),
        env,
        elastic: o.elastic,
        max_restarts: o.max_restarts,
        tensorflow: o.tensorflow,
    };
    spec.check()?;
    if o.dry_run {
        dry_run(&o, &spec)?;
        return Ok(true);
    }
    let addr = o.master.as_deref().unwrap_or_default();
    let master = Master::new(addr, o.ca_file.as_deref())?;
    let token = jobs::token::Token::from_env_or_file(o.token_file.as_deref())?;
    let token = token.as_ref();
    let (code, body) = master
        .request("POST", "/jobs", Some(&serde_json::to_string(&spec)?), token)
        .await?;
    if code != 201 {
        return Err(format!("the master refused the job ({code}): {body}").into());
    }
    let mut status: JobStatus = serde_json::from_str(&body)?;
    let id = status.id;
    println!(
        "job {id} ({}) submitted to {addr}, {} backend",
        spec.name, status.backend
    );
    let mut shown = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(o.timeout);
    loop {
        let line = summary(&status);
        if line != shown {
            println!("{line}");
            shown = line;
        }
        if status.state.is_final() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "job {id} still {:?} after {} s; it goes on",
                status.state, o.timeout
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (code, body) = master
            .request("GET", &format!("/jobs/{id}"), None, token)
            .await?;
        if code != 200 {
            return Err(format!("job {id}: the master answered {code}: {body}").into());
        }
        status = serde_json::from_str(&body)?;
    }
    if let Some(error) = &status.error {
        println!("job {id}: {error}");
    }
    if status.state != State::Succeeded {
        for task in status.tasks.iter().filter(|t| t.state == State::Failed) {
            let (_, log) = master
                .request(
                    "GET",
                    &format!("/jobs/{id}/logs/{}", task.name),
                    None,
                    token,
                )
                .await?;
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            println!("--- {} (last lines) ---", task.name);
            for line in tail.into_iter().rev() {
                println!("{line}");
            }
        }
    }
    Ok(status.state == State::Succeeded)
}

/// Prints the job's Kubernetes objects as a `List`.
#[cfg(feature = "kubernetes")]
fn dry_run(o: &Options, spec: &JobSpec) -> Result<(), BoxError> {
    use jobs::kubernetes::KubeJob;
    let job = KubeJob {
        id: 0,
        spec,
        namespace: o.namespace.clone(),
        secret: o.kube_secret.clone(),
        instance: String::new(),
        layout: o.layout.parse()?,
    };
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": job.objects()?,
    });
    println!("{}", serde_json::to_string_pretty(&list)?);
    Ok(())
}

/// Without the `kubernetes` feature there is nothing to print.
#[cfg(not(feature = "kubernetes"))]
fn dry_run(o: &Options, _: &JobSpec) -> Result<(), BoxError> {
    let _ = (&o.namespace, &o.layout, &o.kube_secret);
    Err("--dry-run needs a build with the `kubernetes` feature \
         (cargo build --release -p jobs --features kubernetes)"
        .into())
}

/// One line: the job's state and its tasks' (counted by state).
fn summary(status: &JobStatus) -> String {
    let mut counts: Vec<(State, usize)> = Vec::new();
    for task in &status.tasks {
        match counts.iter_mut().find(|(s, _)| *s == task.state) {
            Some((_, n)) => *n += 1,
            None => counts.push((task.state, 1)),
        }
    }
    let tasks: Vec<String> = counts
        .iter()
        .map(|(s, n)| format!("{n} {}", format!("{s:?}").to_lowercase()))
        .collect();
    let restarts: u32 = status.tasks.iter().map(|t| t.restarts).sum();
    let restarted = match restarts {
        0 => String::new(),
        n => format!("; {n} worker restarts"),
    };
    format!(
        "job {}: {} (tasks: {}{restarted})",
        status.id,
        format!("{:?}", status.state).to_lowercase(),
        tasks.join(", ")
    )
}
