//! What each node of the benchmark does, however it was started: servers sum, workers
//! measure every case (or check sums, or meet at a barrier) into a [`WorkerReport`], and
//! worker 0 measures the raw-socket reference.

use std::collections::VecDeque;
use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use examples::raw::{echo_server, raw_socket_to, BoxError, Workload};
use examples::report::{
    BarrierTimes, Case, CheckOutcome, Figures, Mode, RawFigure, WorkerCase, WorkerReport,
};
use ps::optim::TableHandler;
use ps::{node_ids, KvPairs, KvServer, KvWorker, Postoffice, RequestId, Role};

use crate::options::{ModeArg, Options};

/// Runs this node's role until the cluster finalizes; a worker's report comes back.
/// This node's part of the benchmark; a worker's report. `joined_s`: seconds from the
/// cluster's launch until this node joined, when known.
pub(crate) async fn node(
    po: Postoffice,
    o: &Options,
    joined_s: Option<f64>,
) -> Result<Option<WorkerReport>, BoxError> {
    let report = match po.role() {
        Role::Scheduler => None,
        Role::Server => {
            let _server = if o.sparse() {
                let spec = o.table_spec()?;
                KvServer::<f32>::new(&po, 0, 0, o.shards, move |_| TableHandler::new(spec)).await?
            } else {
                KvServer::<f32>::with_sum(&po, 0, 0, o.shards).await?
            };
            po.finalize().await?;
            return Ok(None);
        }
        Role::Worker => {
            let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
            let mut report = WorkerReport {
                worker: po.my_rank(),
                joined_s,
                ..WorkerReport::default()
            };
            let result = match o.mode {
                ModeArg::Check => check(&po, &worker, o).await.map(|c| report.check = Some(c)),
                ModeArg::Barrier => barrier(&po, o).await.map(|b| report.barrier = Some(b)),
                _ if o.sparse() => crate::sparse::benchmark(&po, &worker, o, &mut report).await,
                _ => benchmark(&po, &worker, o, &mut report).await,
            };
            if let Err(e) = result {
                po.stop().await;
                return Err(e);
            }
            report.van = po
                .van_for(node_ids::server_rank_to_id(0))
                .map(|k| k.to_string());
            Some(report)
        }
    };
    po.finalize().await?;
    Ok(report)
}

/// A line for people: on stdout, or on stderr with `--json` (stdout then carries only JSON).
fn say(o: &Options, line: &str) {
    if o.json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// The `i`-th of `n` keys, spread evenly over the key space (so over every server).
fn key(i: u64, n: u64) -> u64 {
    (u64::MAX / n.max(1)).saturating_mul(i)
}

/// Every worker pushes `rank + 1` times the key's index into each key; after a barrier every
/// worker pulls and checks the exact total.
async fn check(
    po: &Postoffice,
    worker: &KvWorker<f32>,
    o: &Options,
) -> Result<CheckOutcome, BoxError> {
    let rank = po.my_rank();
    let n = o.keys;
    let keys: Vec<u64> = (0..n).map(|i| key(i, n)).collect();
    let per_key = 4;
    let factor = rank as f32 + 1.0;
    let vals: Vec<f32> = (0..n)
        .flat_map(|i| (0..per_key).map(move |j| factor * (i as f32 + 1.0) + j as f32))
        .collect();
    let mut memory = None;
    let id = if o.zero_copy {
        // The values written once into memory the van can send by reference.
        let bytes = ps::values::to_bytes(&vals);
        let mut buf = po.alloc(bytes.len());
        buf.as_mut_slice().copy_from_slice(&bytes);
        let kind = buf.van().map_or("ordinary", |k| k.as_str());
        say(o, &format!("worker {rank}: values in {kind} memory"));
        memory = Some(kind.to_owned());
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
            "worker {rank}: wrong sums: expected {:?}, pulled {:?}",
            &expected[..expected.len().min(8)],
            &got[..got.len().min(8)]
        )
        .into());
    }
    say(
        o,
        &format!(
            "worker {rank}: exact sums verified for {n} keys from {} workers",
            po.num_workers()
        ),
    );
    for line in crate::tf_tasks::check(po).await? {
        say(o, &line);
    }
    let mut routes = Vec::new();
    for server_rank in 0..po.num_servers() {
        let server = node_ids::server_rank_to_id(server_rank);
        let van = po
            .van_for(server)
            .map_or("none".to_owned(), |k| k.to_string());
        say(o, &format!("worker {rank}: server {server} via {van}"));
        routes.push(van);
    }
    Ok(CheckOutcome {
        worker: rank,
        keys: n,
        routes,
        memory,
    })
}

/// Milliseconds since the Unix epoch (comparable across processes on one machine).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Workers arrive at a barrier 300 ms apart and print when they arrived and left, so a test
/// can check that nobody left before the last one arrived.
async fn barrier(po: &Postoffice, o: &Options) -> Result<BarrierTimes, BoxError> {
    let rank = po.my_rank();
    tokio::time::sleep(Duration::from_millis(300 * u64::from(rank))).await;
    let arrived_ms = now_ms();
    say(
        o,
        &format!("barrier: worker {rank} arrived at {arrived_ms}"),
    );
    po.barrier(node_ids::WORKER_GROUP).await?;
    let released_ms = now_ms();
    say(
        o,
        &format!("barrier: worker {rank} released at {released_ms}"),
    );
    Ok(BarrierTimes {
        worker: rank,
        arrived_ms,
        released_ms,
    })
}

/// Every case of `o`, measured into `report` (and the raw reference on worker 0). With
/// several workers a barrier starts each case, so their cases overlap and add up.
async fn benchmark(
    po: &Postoffice,
    worker: &KvWorker<f32>,
    o: &Options,
    report: &mut WorkerReport,
) -> Result<(), BoxError> {
    let rank = po.my_rank();
    let n = o.keys;
    let keys: Vec<u64> = (0..n).map(|i| key(i, n)).collect();
    let together = po.num_workers() > 1;
    let length = match o.iters {
        Some(n) => format!("{n} requests"),
        None => format!("{:.1} s", o.seconds),
    };
    for size in &o.sizes {
        // Each size has its own keys (a key's length is fixed by its first push), stored
        // once before any case so that pulls return `size` bytes.
        let keys: Vec<u64> = keys.iter().map(|k| k.wrapping_add(*size as u64)).collect();
        let zeros = vec![0f32; size / 4];
        for k in &keys {
            let id = worker.push(&[*k], &zeros, None, 0).await?;
            worker.wait(id).await?;
        }
        let vals = values(po, *size, o);
        let key_bytes: Vec<Bytes> = keys.iter().map(|k| ps::values::to_bytes(&[*k])).collect();
        for mode in o.modes() {
            for window in &o.windows {
                eprintln!("worker {rank}: {mode} {size} B x{window} in flight for {length} ...");
                if together {
                    po.barrier(node_ids::WORKER_GROUP).await?;
                }
                let cpu_before = cluster_cpu_seconds(rank);
                let mut r = run_case(
                    worker,
                    *window,
                    o,
                    |i| {
                        let keys = key_bytes[i % key_bytes.len()].clone();
                        let pairs = KvPairs {
                            keys: keys.clone(),
                            vals: vals.clone(),
                            lens: None,
                        };
                        let worker = worker.clone();
                        async move {
                            match mode {
                                Mode::Push => worker.zpush(pairs, 0).await,
                                Mode::Pull => worker.zpull(keys, 0).await,
                                Mode::PushPull => worker.zpush_pull(pairs, 0).await,
                            }
                        }
                    },
                    |_| Ok(()),
                )
                .await?;
                let cpu = cluster_cpu_seconds(rank)
                    .zip(cpu_before)
                    .map(|(after, before)| after - before);
                let case = Case {
                    mode,
                    size: *size as u64,
                    window: *window as u64,
                    keys: 1,
                };
                let figures = Figures::measure(case, r.ops, r.elapsed, &mut r.latencies_us, cpu);
                report.cases.push(WorkerCase { case, figures });
            }
        }
    }
    if rank == 0 && !o.no_raw {
        report.raw = raw_reference(o).await?;
    }
    Ok(())
}

/// CPU ticks (user + system) of this node and its sibling nodes — every child of the
/// launcher that started this one — from `/proc/<pid>/stat`, read by worker `rank` 0 only
/// (`None` elsewhere): with every worker reading it at each case's edges, 496 workers made
/// a quarter of a million `/proc` reads per case and counted them as the case's CPU. `None`
/// too when not started by a launcher (the siblings would be unrelated processes).
pub(crate) fn cluster_cpu_seconds(rank: u32) -> Option<f64> {
    if rank != 0 {
        return None;
    }
    std::env::var_os("VANS_LAUNCH_RANK")?;
    let parent = std::os::unix::process::parent_id();
    let ticks = rustix::param::clock_ticks_per_second();
    if ticks == 0 {
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

/// One measured case, before its figures are worked out.
pub(crate) struct CaseResult {
    pub(crate) ops: u64,
    pub(crate) elapsed: Duration,
    pub(crate) latencies_us: Vec<u32>,
}

/// The values every request of a size's cases pushes: `size` bytes of `1f32`, written once (in the
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

/// Keeps `window` requests in flight for `o.seconds` or `o.iters`: `issue(i)` sends the
/// `i`-th, `answered` looks at each answer.
pub(crate) async fn run_case<F, Fut>(
    worker: &KvWorker<f32>,
    window: usize,
    o: &Options,
    mut issue: F,
    mut answered: impl FnMut(&KvPairs) -> Result<(), BoxError>,
) -> Result<CaseResult, BoxError>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ps::Result<RequestId>>,
{
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
            let id = issue(next).await?;
            next += 1;
            in_flight.push_back((id, Instant::now()));
            continue;
        }
        let Some((id, sent)) = in_flight.pop_front() else {
            break;
        };
        answered(&worker.wait(id).await?)?;
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
            .arg("--raw-echo")
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

/// `ps-bench --raw-echo`: prints its address, then serves until killed.
pub(crate) async fn run_echo() -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    echo_server(listener).await
}

/// The raw-socket figures the cases are compared with, measured now.
async fn raw_reference(o: &Options) -> Result<Vec<RawFigure>, BoxError> {
    let echo = EchoProcess::spawn()?;
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
    let mut figures = Vec::with_capacity(cases.len());
    for w in cases {
        let elapsed = raw_socket_to(&echo.address, w).await?;
        figures.push(RawFigure {
            name: w.name.to_owned(),
            size: w.size as u64,
            window: w.window as u64,
            figure: w.figure(elapsed),
            unit: w.unit().to_owned(),
        });
    }
    Ok(figures)
}
