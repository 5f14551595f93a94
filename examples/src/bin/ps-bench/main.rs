//! `ps-bench`: ps-lite's `test_benchmark` over the vans parameter server.
//!
//! Run once per role with ps-lite's environment, exactly like ps-lite's tutorial:
//!
//! ```text
//! DMLC_ROLE=scheduler DMLC_NUM_WORKER=1 DMLC_NUM_SERVER=1 DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=8123 ps-bench
//! DMLC_ROLE=server    ... ps-bench
//! DMLC_ROLE=worker    ... ps-bench
//! ```
//!
//! Each worker started so prints its own table (or its [`WorkerReport`] with `--json`).
//!
//! With no `DMLC_ROLE` it launches a local cluster of itself (1 scheduler, `--servers`
//! servers, `--workers` workers) through `launcher`, passing its nodes a results directory
//! (`PS_BENCH_RESULTS_DIR`): each worker writes its report there instead of printing it, and
//! this process gathers them and prints, per case, each worker's row and the cluster's total,
//! or one JSON document with `--json` (everything else goes to stderr), and draws them with
//! `--plot FILE.png`. With no arguments it runs a short benchmark (a few seconds) and every
//! role exits 0.
//!
//! Every worker measures, for each mode × value size × in-flight window, one key per request
//! (keys spread over all servers) as in ps-lite: goodput (GB/s of values), operations per
//! second and p50/p99 latency, and worker rank 0 measures a raw TCP socket in the same run
//! (ping-pong round trip and stream GB/s) for the ratios. `--mode check` instead verifies
//! exact sums: every worker pushes known values, a barrier, then every worker pulls and
//! compares with the expected total. `--mode barrier` has workers arrive at a barrier 300 ms
//! apart and print when they arrived and left.
//!
//! `--van tcp,uring` compares stream vans in one invocation: the local cluster is launched
//! once per van (`VANS_STREAM_VAN`, shared memory off), one after the other, and a table
//! gives each case's total for every van side by side with the ratio to the first van, and
//! the CPU time of the whole cluster (every node process, read from `/proc/<pid>/stat` at the
//! start and end of each case) per GB moved and per request.

mod node;
mod options;
mod sparse;
mod tf_tasks;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ::node::local::LocalCluster;
use examples::raw::BoxError;
use examples::report::{BenchReport, RunReport, WorkerReport};
use launcher::{launch, LaunchSpec};
use ps::{Config, Postoffice};
use van_core::VanKind;

use crate::options::{Options, VanArg, LAUNCHED_AT_ENV, RESULTS_DIR_ENV};

fn main() {
    ::node::logging::init(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let options = Options::from_command_line();
    let runtime = match examples::runtime(options.threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ps-bench: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = if options.raw_echo {
        runtime.block_on(node::run_echo())
    } else {
        runtime.block_on(run(options))
    };
    if let Err(e) = result {
        eprintln!("ps-bench: {e}");
        std::process::exit(1);
    }
}

async fn run(options: Options) -> Result<(), BoxError> {
    let config = Config::from_env()?;
    if config.role.is_none() {
        let report = match options.van.first() {
            Some(VanArg::Inproc) => run_in_process(&options).await?,
            _ => launch_local(&options).await?,
        };
        return show(&report, &options);
    }
    let po = Postoffice::start(config).await?;
    // Wall clocks of one host: the launching ps-bench and this node share it.
    let joined_s = options
        .launched_at
        .and_then(|at| at.elapsed().ok())
        .map(|d| d.as_secs_f64());
    match node::node(po, &options, joined_s).await? {
        Some(report) => deliver(report, &options),
        None => Ok(()),
    }
}

/// A worker's report, where this node was asked to put it: the results directory of the
/// ps-bench that launched it, or else stdout (its own table, or its report with `--json`)
/// and `--plot`.
fn deliver(report: WorkerReport, o: &Options) -> Result<(), BoxError> {
    if let Some(dir) = &o.results_dir {
        std::fs::write(
            report_path(dir, report.worker),
            serde_json::to_vec(&report)?,
        )?;
        return Ok(());
    }
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    let rank = report.worker;
    let van = report.van.clone().unwrap_or_else(|| "tcp".into());
    let run = RunReport::gather(&van, vec![report], None, None);
    if !o.json && !run.cases.is_empty() {
        let (servers, workers) = cluster_size();
        println!(
            "worker {rank} ({servers} servers, {workers} workers):\n{}",
            run.table()
        );
        if let Some(raw) = run.raw_table() {
            println!("reference, same run:\n{raw}");
        }
    }
    if let Some(path) = &o.plot {
        let (servers, workers) = cluster_size();
        let report = BenchReport {
            servers,
            workers,
            runs: vec![run],
        };
        draw(&report, path)?;
    }
    Ok(())
}

/// The cluster's size from ps-lite's environment, as a hand-started node sees it.
fn cluster_size() -> (u32, u32) {
    let count = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    };
    (count("DMLC_NUM_SERVER"), count("DMLC_NUM_WORKER"))
}

/// The launching process's output: the tables or one JSON document on stdout, the PNG.
fn show(report: &BenchReport, o: &Options) -> Result<(), BoxError> {
    if o.json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{report}");
    }
    if let Some(path) = &o.plot {
        draw(report, path)?;
    }
    Ok(())
}

fn draw(report: &BenchReport, path: &Path) -> Result<(), BoxError> {
    examples::plot::draw(report, path).map_err(|e| format!("--plot {}: {e}", path.display()))?;
    eprintln!("ps-bench: plot written to {}", path.display());
    Ok(())
}

/// `--van inproc`: the whole cluster as tasks of this process, over the in-process van.
async fn run_in_process(o: &Options) -> Result<BenchReport, BoxError> {
    let options = Arc::new(o.clone());
    let started = Instant::now();
    let results = LocalCluster::new(o.servers, o.workers)
        .run(move |po| {
            let options = Arc::clone(&options);
            // Every node's task starts once its postoffice has joined.
            let joined_s = Some(started.elapsed().as_secs_f64());
            async move {
                node::node(po, &options, joined_s)
                    .await
                    .map_err(|e| ps::NodeError::InvalidArgument(e.to_string()))
            }
        })
        .await?;
    let reports: Vec<WorkerReport> = results.into_iter().flatten().collect();
    let elapsed = started.elapsed().as_secs_f64();
    Ok(BenchReport {
        servers: o.servers,
        workers: o.workers,
        runs: vec![RunReport {
            peak_rss_mb: peak_rss_mb(),
            ..RunReport::gather("inproc", reports, Some(elapsed), None)
        }],
    })
}

/// No `DMLC_ROLE`: run this program as a local cluster, once per van of `--van`.
async fn launch_local(o: &Options) -> Result<BenchReport, BoxError> {
    if o.van.contains(&VanArg::Uring) && !cfg!(feature = "uring") {
        return Err(
            "--van uring: this ps-bench was built without the io_uring van; rebuild \
                    with `--features uring`"
                .into(),
        );
    }
    let vans: Vec<Option<VanKind>> = if o.van.is_empty() {
        vec![None]
    } else {
        o.van.iter().map(|v| Some(v.kind())).collect()
    };
    let mut runs = Vec::with_capacity(vans.len());
    for van in vans {
        runs.push(launch_run(o, van, o.van.len() > 1).await?);
    }
    Ok(BenchReport {
        servers: o.servers,
        workers: o.workers,
        runs,
    })
}

/// One launch of the local cluster (over `van`, shared memory off, when given), and every
/// worker's report gathered from the results directory.
async fn launch_run(
    o: &Options,
    van: Option<VanKind>,
    comparing: bool,
) -> Result<RunReport, BoxError> {
    let results = ResultsDir::create()?;
    let mut spec = LaunchSpec::new(o.servers, o.workers, std::env::current_exe()?);
    spec.args = o.args.clone();
    spec.env.push(("DMLC_ENABLE_RDMA".into(), "0".into()));
    spec.env.push((
        RESULTS_DIR_ENV.into(),
        results.path.to_string_lossy().into_owned(),
    ));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    spec.env
        .push((LAUNCHED_AT_ENV.into(), now.as_micros().to_string()));
    if let Some(van) = van {
        spec.env.push(("VANS_STREAM_VAN".into(), van.to_string()));
        spec.env.push(("DMLC_ENABLE_IPC".into(), "0".into()));
    }
    if comparing {
        eprintln!(
            "ps-bench: --- {} ---",
            van.map_or("default", VanKind::as_str)
        );
    }
    let before = children_cpu_seconds();
    let launched = launch(&spec).await?;
    let cpu = children_cpu_seconds() - before;
    let elapsed = launched.elapsed.as_secs_f64();
    eprintln!(
        "ps-bench: {} nodes exited 0 in {elapsed:.1} s, {cpu:.2} CPU s in all (getrusage of \
         the exited nodes)",
        launched.nodes.len(),
    );
    let reports = results.read(o.workers)?;
    // The van the workers saw when none was asked for (shared memory, with feature `ipc`).
    let label = van
        .map(|v| v.to_string())
        .or_else(|| reports.first().and_then(|r| r.van.clone()))
        .unwrap_or_else(|| VanKind::Tcp.to_string());
    Ok(RunReport::gather(&label, reports, Some(elapsed), Some(cpu)))
}

fn report_path(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("worker-{rank}.json"))
}

/// The directory the workers of one launch write their reports to; removed when dropped.
struct ResultsDir {
    path: PathBuf,
}

impl ResultsDir {
    fn create() -> Result<ResultsDir, BoxError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!("ps-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path)
            .map_err(|e| format!("cannot create the results directory {path:?}: {e}"))?;
        Ok(ResultsDir { path })
    }

    /// The reports of workers 0 to `workers - 1`.
    fn read(&self, workers: u32) -> Result<Vec<WorkerReport>, BoxError> {
        (0..workers)
            .map(|rank| {
                let path = report_path(&self.path, rank);
                let text = std::fs::read(&path)
                    .map_err(|e| format!("worker {rank} left no results in {path:?}: {e}"))?;
                serde_json::from_slice(&text)
                    .map_err(|e| format!("worker {rank}'s results in {path:?}: {e}").into())
            })
            .collect()
    }
}

impl Drop for ResultsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// CPU seconds (user + system) of this process's children that have exited and been
/// waited for.
fn children_cpu_seconds() -> f64 {
    let Some(usage) = rusage(libc::RUSAGE_CHILDREN) else {
        return 0.0;
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// Peak resident memory of this process so far, in MB (`ru_maxrss`, KiB on Linux).
fn peak_rss_mb() -> Option<f64> {
    rusage(libc::RUSAGE_SELF).map(|u| u.ru_maxrss as f64 * 1024.0 / 1e6)
}

fn rusage(who: libc::c_int) -> Option<libc::rusage> {
    // libc, not rustix: rustix has no getrusage.
    // SAFETY: `rusage` is plain data (all-zero is valid) and getrusage only writes it.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        (libc::getrusage(who, &mut usage) == 0).then_some(usage)
    }
}
