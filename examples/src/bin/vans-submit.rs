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
//! container image, which only a Kubernetes master could run: this master's backends run
//! commands, so it is refused with that reason.

use std::time::Duration;

use clap::Parser;
use examples::master::client::request;
use examples::master::{JobSpec, JobStatus, State, Strategy};
use examples::raw::BoxError;

/// The submitter's options.
#[derive(Parser, Debug)]
#[command(name = "vans-submit", version)]
struct Options {
    /// The master: `http://host:port` or `host:port`.
    #[arg(long)]
    master: String,
    /// ParameterServer or AllReduce.
    #[arg(long, value_parser = ["ParameterServer", "AllReduce"])]
    strategy: String,
    /// Parameter servers (0 for AllReduce).
    #[arg(long, default_value = "1")]
    ps_num: u32,
    /// Workers.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    worker_num: u32,
    /// A container image to run (Kubernetes only; refused by these backends).
    #[arg(long)]
    image: Option<String>,
    /// The name of this task.
    #[arg(long)]
    task: String,
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

fn address(master: &str) -> String {
    master
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
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
    if let Some(image) = &o.image {
        return Err(format!(
            "--image {image}: images run on Kubernetes, which this master's backends (local, \
             slurm) are not; pass the command after `--` instead"
        )
        .into());
    }
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
        env,
    };
    spec.check()?;
    let addr = address(&o.master);
    let (code, body) =
        request(&addr, "POST", "/jobs", Some(&serde_json::to_string(&spec)?)).await?;
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
        let (code, body) = request(&addr, "GET", &format!("/jobs/{id}"), None).await?;
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
            let (_, log) = request(
                &addr,
                "GET",
                &format!("/jobs/{id}/logs/{}", task.name),
                None,
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
    format!(
        "job {}: {} (tasks: {})",
        status.id,
        format!("{:?}", status.state).to_lowercase(),
        tasks.join(", ")
    )
}
