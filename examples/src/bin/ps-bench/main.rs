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
//! or with no `DMLC_ROLE`, when it launches a local cluster of itself (1 scheduler,
//! `--servers` servers, `--workers` workers) through `launcher`. With no arguments it
//! runs a short benchmark (a few seconds) and every role exits 0.
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
//! gives each case for every van side by side with the ratio to the first van, and the CPU
//! time of the whole cluster (every node process, read from `/proc/<pid>/stat` at the start
//! and end of each case) per GB moved and per request.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use examples::raw::{echo_server, raw_socket_to, BoxError, Workload};
use examples::Table;
use launcher::{launch, LaunchSpec};
use ps::local::LocalCluster;
use ps::{node_ids, Config, KvPairs, KvServer, KvWorker, Postoffice, Role};
use std::sync::Arc;
use van_core::VanKind;

const USAGE: &str = "usage: ps-bench [options]
  --mode M        push | pull | pushpull | all | check | barrier   (default all)
  --sizes LIST    value bytes per request, comma-separated, multiples of 4 (default 8,65536,1048576)
  --windows LIST  requests in flight, comma-separated (default 1,64)
  --keys N        distinct keys, spread over the servers (default 16)
  --seconds S     seconds per case (default 0.3)
  --iters N       requests per case instead of a duration
  --shards N      shards per server (default 1)
  --servers N     servers when launching a local cluster (default 1)
  --workers N     workers when launching a local cluster (default 1)
  --van V[,V..]   tcp (processes, the default), uring (processes, io_uring: feature
                  `uring`) or inproc (one process, in-process van); a list of process vans
                  (`tcp,uring`) runs the cluster once per van and prints them side by side,
                  with ratios and the cluster's CPU seconds per GB. Naming tcp or uring
                  turns shared memory off, so that van carries the traffic.
  --threads N     runtime threads per node; 1 runs each node on one thread (default 1)
  --no-raw        skip the raw-socket reference
  --zero-copy     push values allocated with Postoffice::alloc (the IPC van's shared arena:
                  a push to a co-located server then moves no payload bytes)
  --json          print JSON instead of a table
Without DMLC_ROLE, ps-bench launches a local cluster of itself over TCP on 127.0.0.1.";

#[derive(Debug, Clone)]
struct Options {
    modes: Vec<Mode>,
    check: bool,
    barrier: bool,
    sizes: Vec<usize>,
    windows: Vec<usize>,
    keys: u64,
    seconds: f64,
    iters: Option<u64>,
    shards: usize,
    servers: u32,
    workers: u32,
    raw: bool,
    zero_copy: bool,
    json: bool,
    threads: usize,
    van: VanKind,
    /// Every van named by `--van` (more than one: a comparison); empty when not given.
    vans: Vec<VanKind>,
    /// Where worker 0 writes its results as JSON (set by a comparing launcher).
    results_file: Option<String>,
    /// The arguments as given, passed on to the launched nodes.
    args: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Push,
    Pull,
    PushPull,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Push => "push",
            Mode::Pull => "pull",
            Mode::PushPull => "pushpull",
        }
    }
}

fn parse_list(value: &str, what: &str) -> Result<Vec<usize>, String> {
    value
        .split(',')
        .map(|v| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{what}: `{v}` is not a positive whole number"))
        })
        .collect()
}

fn parse_args(args: Vec<String>) -> Result<Options, String> {
    let mut o = Options {
        modes: vec![Mode::Push, Mode::Pull, Mode::PushPull],
        check: false,
        barrier: false,
        sizes: vec![8, 65_536, 1 << 20],
        windows: vec![1, 64],
        keys: 16,
        seconds: 0.3,
        iters: None,
        shards: 1,
        servers: 1,
        workers: 1,
        raw: true,
        zero_copy: false,
        json: false,
        threads: 1,
        van: VanKind::Tcp,
        vans: Vec::new(),
        results_file: None,
        args: args.clone(),
    };
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--mode" => {
                o.modes = match value("--mode")?.as_str() {
                    "push" => vec![Mode::Push],
                    "pull" => vec![Mode::Pull],
                    "pushpull" | "push-pull" => vec![Mode::PushPull],
                    "all" => vec![Mode::Push, Mode::Pull, Mode::PushPull],
                    "check" => {
                        o.check = true;
                        Vec::new()
                    }
                    "barrier" => {
                        o.barrier = true;
                        Vec::new()
                    }
                    other => return Err(format!("unknown mode `{other}`")),
                }
            }
            "--sizes" => o.sizes = parse_list(&value("--sizes")?, "--sizes")?,
            "--windows" => o.windows = parse_list(&value("--windows")?, "--windows")?,
            "--keys" => o.keys = parse_list(&value("--keys")?, "--keys")?[0] as u64,
            "--shards" => o.shards = parse_list(&value("--shards")?, "--shards")?[0],
            "--servers" => o.servers = parse_list(&value("--servers")?, "--servers")?[0] as u32,
            "--workers" => o.workers = parse_list(&value("--workers")?, "--workers")?[0] as u32,
            "--seconds" => {
                let v = value("--seconds")?;
                o.seconds = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| *s > 0.0 && s.is_finite())
                    .ok_or_else(|| format!("--seconds: `{v}` is not a positive number"))?;
            }
            "--threads" => o.threads = parse_list(&value("--threads")?, "--threads")?[0],
            "--van" => {
                o.vans = value("--van")?
                    .split(',')
                    .map(|name| match name.trim() {
                        "tcp" => Ok(VanKind::Tcp),
                        "uring" => Ok(VanKind::Uring),
                        "inproc" => Ok(VanKind::InProcess),
                        other => Err(format!(
                            "--van: `{other}` is not available here (tcp, uring or inproc)"
                        )),
                    })
                    .collect::<Result<_, _>>()?;
                o.van = o.vans[0];
                if o.vans.len() > 1 && o.vans.contains(&VanKind::InProcess) {
                    return Err("--van: inproc runs in one process and cannot be compared \
                                with process vans in one run"
                        .into());
                }
            }
            "--results-file" => o.results_file = Some(value("--results-file")?),
            "--iters" => o.iters = Some(parse_list(&value("--iters")?, "--iters")?[0] as u64),
            "--no-raw" => o.raw = false,
            "--zero-copy" => o.zero_copy = true,
            "--json" => o.json = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if let Some(bad) = o.sizes.iter().find(|s| *s % 4 != 0) {
        return Err(format!(
            "--sizes: {bad} is not a multiple of 4 (values are f32)"
        ));
    }
    Ok(o)
}

fn main() {
    let filter = match std::env::var("PS_VERBOSE").as_deref() {
        Ok("2") => "debug",
        Ok("1") => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let raw_echo = std::env::args().nth(1).as_deref() == Some(RAW_ECHO);
    let options = match parse_args(std::env::args().skip(1).filter(|a| a != RAW_ECHO).collect()) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("ps-bench: {e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    // One thread per node by default: with several nodes per machine, extra runtime threads
    // mostly add cross-thread wake-ups.
    let mut builder = if options.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(options.threads);
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ps-bench: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = if raw_echo {
        runtime.block_on(run_echo())
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
        return match options.van {
            VanKind::InProcess => run_in_process(&options).await,
            _ => launch_local(&options).await,
        };
    }
    let po = Postoffice::start(config).await?;
    node(po, &options).await
}

/// What every node does, whatever started it.
async fn node(po: Postoffice, options: &Options) -> Result<(), BoxError> {
    match po.role() {
        Role::Scheduler => {}
        Role::Server => {
            let _server = KvServer::<f32>::with_sum(&po, 0, 0, options.shards).await?;
            po.finalize().await?;
            return Ok(());
        }
        Role::Worker => {
            let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
            let result = if options.check {
                check(&po, &worker, options).await
            } else if options.barrier {
                barrier(&po).await
            } else {
                benchmark(&po, &worker, options).await
            };
            if let Err(e) = result {
                po.stop().await;
                return Err(e);
            }
        }
    }
    po.finalize().await?;
    Ok(())
}

/// `--van inproc`: the whole cluster as tasks of this process, over the in-process van.
async fn run_in_process(options: &Options) -> Result<(), BoxError> {
    let options = Arc::new(options.clone());
    LocalCluster::new(options.servers, options.workers)
        .run(move |po| {
            let options = Arc::clone(&options);
            async move {
                node(po, &options)
                    .await
                    .map_err(|e| ps::PsError::InvalidArgument(e.to_string()))
            }
        })
        .await?;
    Ok(())
}

/// No `DMLC_ROLE`: run this program as a local cluster.
async fn launch_local(options: &Options) -> Result<(), BoxError> {
    if options.vans.contains(&VanKind::Uring) && !cfg!(feature = "uring") {
        return Err(
            "--van uring: this ps-bench was built without the io_uring van; rebuild \
                    with `--features uring`"
                .into(),
        );
    }
    if options.vans.len() > 1 {
        return compare_vans(options).await;
    }
    let program = std::env::current_exe()?;
    let mut spec = LaunchSpec::new(options.servers, options.workers, program);
    spec.args = options.args.clone();
    spec.env.push(("DMLC_ENABLE_RDMA".into(), "0".into()));
    if let Some(van) = options.vans.first() {
        spec.env.push(("VANS_STREAM_VAN".into(), van.to_string()));
        spec.env.push(("DMLC_ENABLE_IPC".into(), "0".into()));
    }
    let report = launch(&spec).await?;
    eprintln!(
        "ps-bench: {} nodes exited 0 in {:.1} s",
        report.nodes.len(),
        report.elapsed.as_secs_f64()
    );
    Ok(())
}

/// `--van A,B,..`: the cluster once per van, then every case side by side.
async fn compare_vans(options: &Options) -> Result<(), BoxError> {
    let program = std::env::current_exe()?;
    let mut runs = Vec::new();
    for van in &options.vans {
        let path = std::env::temp_dir().join(format!(
            "ps-bench-{}-{}-{van}.json",
            std::process::id(),
            now_ms()
        ));
        let mut spec = LaunchSpec::new(options.servers, options.workers, program.clone());
        spec.args = args_for_van(&options.args, *van, &path.to_string_lossy());
        spec.env.push(("DMLC_ENABLE_RDMA".into(), "0".into()));
        spec.env.push(("VANS_STREAM_VAN".into(), van.to_string()));
        spec.env.push(("DMLC_ENABLE_IPC".into(), "0".into()));
        eprintln!("ps-bench: --- {van} ---");
        let before = children_cpu_seconds();
        let report = launch(&spec).await?;
        let cpu = children_cpu_seconds() - before;
        eprintln!(
            "ps-bench: {van}: {} nodes exited 0 in {:.1} s, {cpu:.2} CPU s in all (getrusage \
             of the exited nodes)",
            report.nodes.len(),
            report.elapsed.as_secs_f64(),
        );
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("worker 0 of the {van} run left no results in {path:?}: {e}"))?;
        let _ = std::fs::remove_file(&path);
        let rows: serde_json::Value = serde_json::from_str(&text)?;
        runs.push((*van, rows, cpu));
    }
    print_comparison(&runs, options.json);
    Ok(())
}

/// The arguments of a comparison's nodes: one van, and where worker 0 writes its results.
fn args_for_van(args: &[String], van: VanKind, results: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--van" || arg == "--results-file" {
            it.next();
            continue;
        }
        out.push(arg.clone());
    }
    out.extend([
        "--van".into(),
        van.to_string(),
        "--results-file".into(),
        results.into(),
    ]);
    out
}

/// CPU seconds (user + system) of this process's children that have exited and been
/// waited for.
fn children_cpu_seconds() -> f64 {
    // SAFETY: `rusage` is plain data (all-zero is valid) and getrusage only writes it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) != 0 {
            return 0.0;
        }
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// The side-by-side table of a comparison: each case's figures for every van, ratios to
/// the first van, and the cluster's CPU cost.
fn print_comparison(runs: &[(VanKind, serde_json::Value, f64)], json: bool) {
    let Some((first, base, _)) = runs.first() else {
        return;
    };
    let number = |row: &serde_json::Value, key: &str| row.get(key).and_then(|v| v.as_f64());
    let same_case = |a: &serde_json::Value, b: &serde_json::Value| {
        ["mode", "size", "in flight"]
            .iter()
            .all(|k| a.get(*k) == b.get(*k))
    };
    let mut header = vec!["mode".to_owned(), "size".to_owned(), "in flight".to_owned()];
    for figure in ["ops/s", "GB/s", "CPU s/GB", "CPU µs/op"] {
        for (van, _, _) in runs {
            header.push(format!("{figure} {van}"));
        }
        if figure != "CPU µs/op" {
            for (van, _, _) in &runs[1..] {
                header.push(format!("{van}/{first}"));
            }
        }
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = Table::new(&header_refs);
    let empty = Vec::new();
    for row in base.as_array().unwrap_or(&empty) {
        let cell = |v: Option<&serde_json::Value>| match v {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        };
        let mut cells = vec![
            cell(row.get("mode")),
            cell(row.get("size")),
            cell(row.get("in flight")),
        ];
        let matching: Vec<Option<&serde_json::Value>> = runs
            .iter()
            .map(|(_, rows, _)| {
                rows.as_array()
                    .and_then(|rows| rows.iter().find(|r| same_case(r, row)))
            })
            .collect();
        for (key, precision) in [("ops/s", 0), ("GB/s", 3), ("CPU s/GB", 2), ("CPU µs/op", 1)] {
            let values: Vec<Option<f64>> = matching
                .iter()
                .map(|r| r.and_then(|r| number(r, key)))
                .collect();
            for v in &values {
                cells.push(v.map_or("n/a".into(), |v| format!("{v:.precision$}")));
            }
            if key != "CPU µs/op" {
                for v in &values[1..] {
                    cells.push(match (values[0], v) {
                        (Some(a), Some(b)) if a > 0.0 => format!("{:.2}x", b / a),
                        _ => "n/a".into(),
                    });
                }
            }
        }
        table.row(cells);
    }
    if json {
        println!("{{\"comparison\":{}}}", table.to_json());
    } else {
        let totals: Vec<String> = runs
            .iter()
            .map(|(van, _, cpu)| format!("{van} {cpu:.2} s"))
            .collect();
        println!(
            "side by side, same invocation (ratios: to {first}; CPU: every node process of the \
             cluster during the case; whole runs: {}):\n{table}",
            totals.join(", ")
        );
    }
}

/// CPU ticks (user + system) of this node and its sibling nodes — every child of the
/// launcher that started this one — from `/proc/<pid>/stat`. `None` when not started by a
/// launcher (the siblings would be unrelated processes).
fn cluster_cpu_seconds() -> Option<f64> {
    std::env::var_os("VANS_LAUNCH_RANK")?;
    let parent = std::os::unix::process::parent_id();
    // SAFETY: sysconf takes no pointers.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return None;
    }
    let mut total = 0u64;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may hold spaces; fields after ")" are: state, ppid, ..., utime
        // (12th), stime (13th).
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) != Some(parent) {
            continue;
        }
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        total += field(11) + field(12);
    }
    Some(total as f64 / ticks as f64)
}

/// The `i`-th of `n` keys, spread evenly over the key space (so over every server).
fn key(i: u64, n: u64) -> u64 {
    (u64::MAX / n.max(1)).saturating_mul(i)
}

/// Every worker pushes `rank + 1` times the key's index into each key; after a barrier every
/// worker pulls and checks the exact total.
async fn check(po: &Postoffice, worker: &KvWorker<f32>, o: &Options) -> Result<(), BoxError> {
    let rank = po.my_rank() as f32;
    let n = o.keys;
    let keys: Vec<u64> = (0..n).map(|i| key(i, n)).collect();
    let per_key = 4;
    let vals: Vec<f32> = (0..n)
        .flat_map(|i| (0..per_key).map(move |j| (rank + 1.0) * (i as f32 + 1.0) + j as f32))
        .collect();
    let id = if o.zero_copy {
        // The values written once into memory the van can send by reference.
        let bytes = ps::values::to_bytes(&vals);
        let mut buf = po.alloc(bytes.len());
        buf.as_mut_slice().copy_from_slice(&bytes);
        let memory = buf.van().map_or("ordinary", |k| k.as_str());
        println!("worker {}: values in {memory} memory", po.my_rank());
        let pairs = KvPairs {
            keys: ps::values::to_bytes(&keys),
            vals: buf.freeze(),
            lens: None,
        };
        worker.zpush(pairs, 0).await?
    } else {
        worker.push(&keys, &vals, None, 0).await?
    };
    worker.wait(id).await?;
    po.barrier(node_ids::WORKER_GROUP).await?;
    let id = worker.pull(&keys, 0).await?;
    let pulled = worker.wait(id).await?;
    let got = pulled.vals::<f32>()?;
    let w = po.num_workers() as f32;
    let workers_sum = w * (w + 1.0) / 2.0;
    let expected: Vec<f32> = (0..n)
        .flat_map(|i| (0..per_key).map(move |j| workers_sum * (i as f32 + 1.0) + w * j as f32))
        .collect();
    if pulled.keys()?.as_ref() != keys.as_slice() || got.as_ref() != expected.as_slice() {
        return Err(format!(
            "worker {}: wrong sums: expected {:?}, pulled {:?}",
            po.my_rank(),
            &expected[..expected.len().min(8)],
            &got[..got.len().min(8)]
        )
        .into());
    }
    println!(
        "worker {}: exact sums verified for {} keys from {} workers",
        po.my_rank(),
        n,
        po.num_workers()
    );
    for rank in 0..po.num_servers() {
        let server = node_ids::server_rank_to_id(rank);
        let van = po
            .van_for(server)
            .map_or("none".to_owned(), |k| k.to_string());
        println!("worker {}: server {server} via {van}", po.my_rank());
    }
    Ok(())
}

/// Milliseconds since the Unix epoch (comparable across processes on one machine).
fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Workers arrive at a barrier 300 ms apart and print when they arrived and left, so a test
/// can check that nobody left before the last one arrived.
async fn barrier(po: &Postoffice) -> Result<(), BoxError> {
    tokio::time::sleep(Duration::from_millis(300 * u64::from(po.my_rank()))).await;
    println!("barrier: worker {} arrived at {}", po.my_rank(), now_ms());
    po.barrier(node_ids::WORKER_GROUP).await?;
    println!("barrier: worker {} released at {}", po.my_rank(), now_ms());
    Ok(())
}

/// One measured case.
struct CaseResult {
    ops: u64,
    elapsed: Duration,
    latencies_us: Vec<u32>,
}

async fn benchmark(po: &Postoffice, worker: &KvWorker<f32>, o: &Options) -> Result<(), BoxError> {
    let rank = po.my_rank();
    let n = o.keys;
    let keys: Vec<u64> = (0..n).map(|i| key(i, n)).collect();
    let mut table = Table::new(&[
        "mode",
        "size",
        "in flight",
        "ops/s",
        "GB/s",
        "p50 µs",
        "p99 µs",
        "CPU s/GB",
        "CPU µs/op",
    ]);
    for size in &o.sizes {
        // Each size has its own keys (a key's length is fixed by its first push), stored
        // once before any case so that pulls return `size` bytes.
        let keys: Vec<u64> = keys.iter().map(|k| k.wrapping_add(*size as u64)).collect();
        for k in &keys {
            let id = worker.push(&[*k], &vec![0f32; size / 4], None, 0).await?;
            worker.wait(id).await?;
        }
        for mode in &o.modes {
            for window in &o.windows {
                let length = match o.iters {
                    Some(n) => format!("{n} requests"),
                    None => format!("{:.1} s", o.seconds),
                };
                eprintln!(
                    "worker {rank}: {} {} B x{} in flight for {length} ...",
                    mode.name(),
                    size,
                    window,
                );
                let vals = values(po, *size, o);
                let cpu_before = cluster_cpu_seconds();
                let r = run_case(worker, &keys, *mode, &vals, *window, o).await?;
                let cpu = cluster_cpu_seconds()
                    .zip(cpu_before)
                    .map(|(after, before)| after - before);
                let secs = r.elapsed.as_secs_f64().max(1e-9);
                let moved = match mode {
                    Mode::PushPull => 2 * size,
                    _ => *size,
                } as f64;
                let mut lat = r.latencies_us;
                lat.sort_unstable();
                let pct = |p: f64| {
                    lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
                        .copied()
                        .unwrap_or(0)
                };
                table.row(vec![
                    mode.name().into(),
                    size.to_string(),
                    window.to_string(),
                    format!("{:.0}", r.ops as f64 / secs),
                    format!("{:.3}", r.ops as f64 * moved / secs / 1e9),
                    pct(0.5).to_string(),
                    pct(0.99).to_string(),
                    cpu.map_or("n/a".into(), |c| {
                        format!("{:.2}", c / (r.ops as f64 * moved / 1e9).max(1e-12))
                    }),
                    cpu.map_or("n/a".into(), |c| {
                        format!("{:.1}", c * 1e6 / (r.ops as f64).max(1.0))
                    }),
                ]);
            }
        }
    }
    if let (0, Some(path)) = (rank, &o.results_file) {
        std::fs::write(path, table.to_json())?;
    }
    if o.json {
        println!("{{\"worker\":{rank},\"results\":{}}}", table.to_json());
    } else {
        println!(
            "worker {rank} ({} servers, {} workers):\n{table}",
            po.num_servers(),
            po.num_workers()
        );
    }
    if rank == 0 && o.raw {
        raw_reference(o).await?;
    }
    Ok(())
}

/// The values every request of a case pushes: `size` bytes of `1f32`, written once (in the
/// IPC van's shared arena with `--zero-copy`, when it has room).
fn values(po: &Postoffice, size: usize, o: &Options) -> Bytes {
    if !o.zero_copy {
        return ps::values::to_bytes(&vec![1f32; size / 4]);
    }
    let mut buf = po.alloc(size);
    if buf.van().is_none() {
        eprintln!("ps-bench: --zero-copy: no shared arena for {size} bytes; using ordinary memory");
    }
    for chunk in buf.as_mut_slice().chunks_exact_mut(4) {
        chunk.copy_from_slice(&1f32.to_le_bytes());
    }
    buf.freeze()
}

async fn run_case(
    worker: &KvWorker<f32>,
    keys: &[u64],
    mode: Mode,
    vals: &Bytes,
    window: usize,
    o: &Options,
) -> Result<CaseResult, BoxError> {
    let key_bytes: Vec<Bytes> = keys.iter().map(|k| ps::values::to_bytes(&[*k])).collect();
    let deadline = Instant::now() + Duration::from_secs_f64(o.seconds);
    let started = Instant::now();
    let mut in_flight = VecDeque::with_capacity(window);
    let mut latencies = Vec::new();
    let mut ops = 0u64;
    let mut next = 0usize;
    loop {
        let running = match o.iters {
            Some(n) => (next as u64) < n,
            None => Instant::now() < deadline,
        };
        if running && in_flight.len() < window {
            let keys = key_bytes[next % key_bytes.len()].clone();
            next += 1;
            let pairs = KvPairs {
                keys: keys.clone(),
                vals: vals.clone(),
                lens: None,
            };
            let id = match mode {
                Mode::Push => worker.zpush(pairs, 0).await?,
                Mode::Pull => worker.zpull(keys, 0).await?,
                Mode::PushPull => worker.zpush_pull(pairs, 0).await?,
            };
            in_flight.push_back((id, Instant::now()));
            continue;
        }
        let Some((id, sent)) = in_flight.pop_front() else {
            break;
        };
        worker.wait(id).await?;
        latencies.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
        ops += 1;
    }
    Ok(CaseResult {
        ops,
        elapsed: started.elapsed(),
        latencies_us: latencies,
    })
}

/// This program, started as `ps-bench --raw-echo`: the far end of the raw reference, in its
/// own single-threaded process like a server node.
struct EchoProcess {
    child: std::process::Child,
    address: String,
}

impl EchoProcess {
    fn spawn() -> Result<EchoProcess, BoxError> {
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .arg(RAW_ECHO)
            .env_remove("DMLC_ROLE")
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            std::io::BufReader::new(stdout).read_line(&mut line)?;
        }
        let address = line.trim().to_owned();
        if address.is_empty() {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the raw echo process did not report its address".into());
        }
        Ok(EchoProcess { child, address })
    }
}

impl Drop for EchoProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The argument that turns ps-bench into the raw reference's echo process.
const RAW_ECHO: &str = "--raw-echo";

/// Runs the echo process: prints its address, then serves until killed.
async fn run_echo() -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    echo_server(listener).await
}

/// The raw-socket figures the table is compared with, measured now.
async fn raw_reference(o: &Options) -> Result<(), BoxError> {
    let echo = EchoProcess::spawn()?;
    let mut table = Table::new(&["raw tcp socket", "size", "in flight", "figure", "unit"]);
    let mut cases = vec![Workload {
        name: "ping-pong",
        size: 8,
        window: 1,
        count: 5_000,
        reply: 8,
    }];
    for size in &o.sizes {
        if *size >= 4096 {
            cases.push(Workload {
                name: "stream",
                size: *size,
                window: 4,
                count: (256 << 20) / size,
                reply: 8,
            });
        }
    }
    cases.push(Workload {
        name: "stream",
        size: 8,
        window: 64,
        count: 100_000,
        reply: 8,
    });
    for w in cases {
        let elapsed = raw_socket_to(&echo.address, w).await?;
        let figure = w.figure(elapsed);
        table.row(vec![
            w.name.into(),
            w.size.to_string(),
            w.window.to_string(),
            format!("{figure:.3}"),
            w.unit().into(),
        ]);
    }
    if o.json {
        println!("{{\"raw\":{}}}", table.to_json());
    } else {
        println!("reference, same run:\n{table}");
    }
    Ok(())
}
