//! `rendezvous-exchange`: tasks in separate processes exchanging tensors through the
//! rendezvous manager, step after step, in pull (`grpc+seastar`) and push (`star_server`)
//! mode, validating every value.
//!
//! ```text
//! cargo run --release -p examples --features ipc --bin rendezvous-exchange
//! ```
//!
//! Without `DMLC_ROLE` it launches local clusters of itself (a scheduler, one server and
//! `--workers` workers as processes on 127.0.0.1; the server and the workers are the tasks),
//! once per van of `--vans` — `tcp` with shared memory switched off (`DMLC_ENABLE_IPC=0`),
//! `ipc` with it on, where the router picks it for the co-located tasks — and prints one table.
//! With `DMLC_ROLE` set it is one node of such a cluster (start it once per role, as
//! `ps-bench`).
//!
//! Each step, task 0 (the server) sends a "ping" tensor per key to every other task and
//! receives a "pong" back from each; the others receive the pings, check them byte for byte
//! and echo them as pongs; task 0 checks each pong byte for byte against the ping it sent.
//! Every step is found, initialized and cleaned up as a TensorFlow step would be.
//!
//! - `--mode bench` (default): round trips per second for 8-byte tensors (1 and 64 in
//!   flight per step) and GB/s for 4 MiB tensors (4 in flight), pull vs push, per van.
//! - `--mode check`: `--steps` steps of `--tensors` tensors each way per peer (sizes from 0
//!   to 1 MiB, some of them dead tensors), every value checked; prints what was verified.
//! - `--mode hang`: a few checked steps, then task 0 waits for a tensor that task 1 never
//!   sends, and task 1 waits to be killed; task 0 reports the error its receive ends with
//!   (exit code 3). For the dead-peer test.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use examples::cli::positive;
use examples::raw::BoxError;
use examples::Table;
use launcher::{launch, LaunchSpec};
use ps::{node_ids, Config, Postoffice, Role};
use rendezvous::{
    cpu_device, create_key, parse_key, ParsedKey, Protocol, Rendezvous, RendezvousMgr,
};
use van_core::NodeId;

/// Steps of the hang mode's checked prologue.
const HANG_PROLOGUE_STEPS: i64 = 3;
/// The step whose receive waits on the peer that will be killed.
const HANG_STEP: i64 = 7;
/// Tensors up to this size are generated one by one; larger ones are slices of a pool.
const SMALL_MAX: usize = 64 << 10;
/// Distinct offsets into the pool for large tensors (in units of 8 bytes).
const POOL_SLACK: usize = 1 << 20;
/// A launched job that takes longer than this is stopped.
const JOB_TIMEOUT: Duration = Duration::from_secs(900);

/// `--mode`: what the tasks do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Round trips per second for 8-byte tensors (1 and 64 in flight per step) and GB/s for
    /// 4 MiB tensors (4 in flight), pull vs push, per van.
    Bench,
    /// --steps steps of --tensors tensors each way per peer (sizes from 0 to 1 MiB, some of
    /// them dead tensors), every value checked.
    Check,
    /// A few checked steps, then task 0 waits for a tensor that task 1 never sends (exit
    /// code 3; for the dead-peer test).
    Hang,
}

impl Mode {
    /// The name `--mode` takes.
    fn name(self) -> &'static str {
        match self {
            Mode::Bench => "bench",
            Mode::Check => "check",
            Mode::Hang => "hang",
        }
    }
}

/// The vans `--vans` can name when this binary was built with the `ipc` feature, else tcp.
const DEFAULT_VANS: &str = if cfg!(feature = "ipc") {
    "tcp,ipc"
} else {
    "tcp"
};

/// Tasks in separate processes exchanging tensors through the rendezvous manager, step after
/// step, in pull (grpc+seastar) and push (star_server) mode, validating every value.
///
/// Without DMLC_ROLE it launches local clusters of itself on 127.0.0.1 (a scheduler, one
/// server and --workers workers; the server and the workers are the tasks), once per van of
/// --vans, and prints one table; with DMLC_ROLE it is one node of such a cluster.
#[derive(Debug, Clone, Parser)]
#[command(name = "rendezvous-exchange")]
struct Options {
    /// What the tasks do.
    #[arg(long, value_enum, value_name = "M", default_value_t = Mode::Bench)]
    mode: Mode,
    /// Rendezvous protocols, comma-separated: pull, push (also grpc+seastar, star_server).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "pull,push", value_parser = protocol)]
    protocols: Vec<Protocol>,
    /// The clusters to launch, comma-separated: tcp (shared memory off), ipc (feature `ipc`;
    /// the default with it is tcp,ipc).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = DEFAULT_VANS, value_parser = van)]
    vans: Vec<String>,
    /// Workers besides the server, when launching.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    workers: u32,
    /// check and hang: steps.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    steps: u64,
    /// check: tensors per step each way per peer.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = positive)]
    tensors: usize,
    /// bench: about a tenth of the steps.
    #[arg(long)]
    quick: bool,
    /// Runtime threads per node.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = positive)]
    threads: usize,
    /// Print the table as JSON.
    #[arg(long)]
    json: bool,
    /// Where task 0 appends its results (set by the launching process).
    #[arg(long, hide = true)]
    results: Option<String>,
}

impl Options {
    /// The options every launched node gets: those that shape what a task does.
    fn node_args(&self) -> Vec<String> {
        let protocols: Vec<String> = self.protocols.iter().map(Protocol::to_string).collect();
        let mut args = vec![
            "--mode".to_owned(),
            self.mode.name().to_owned(),
            "--protocols".to_owned(),
            protocols.join(","),
            "--steps".to_owned(),
            self.steps.to_string(),
            "--tensors".to_owned(),
            self.tensors.to_string(),
            "--threads".to_owned(),
            self.threads.to_string(),
        ];
        if self.quick {
            args.push("--quick".to_owned());
        }
        args
    }
}

fn protocol(value: &str) -> Result<Protocol, String> {
    value.parse::<Protocol>().map_err(|e| e.to_string())
}

fn van(value: &str) -> Result<String, String> {
    match value {
        "tcp" => Ok(value.to_owned()),
        "ipc" if cfg!(feature = "ipc") => Ok(value.to_owned()),
        "ipc" => Err("the ipc van is not compiled in: build with `--features ipc`".into()),
        other => Err(format!("unknown van `{other}` (tcp, ipc)")),
    }
}

fn main() -> ExitCode {
    let options = Options::parse();
    node::logging::init(false);
    let runtime = match examples::runtime(options.threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rendezvous-exchange: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(options)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rendezvous-exchange: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: Options) -> Result<ExitCode, BoxError> {
    let config = Config::from_env()?;
    if config.role.is_none() {
        launch_local(&options).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let po = Postoffice::start(config).await?;
    match node(&po, &options).await {
        Ok(code) => Ok(code),
        Err(e) => {
            po.stop().await;
            Err(e)
        }
    }
}

/// No `DMLC_ROLE`: one local cluster of this program per van, then one table.
async fn launch_local(options: &Options) -> Result<(), BoxError> {
    let program = std::env::current_exe()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let results = std::env::temp_dir().join(format!(
        "rendezvous-exchange-{}-{nanos}.jsonl",
        std::process::id()
    ));
    let mut rows = Vec::new();
    for van in &options.vans {
        let mut spec = LaunchSpec::new(1, options.workers, &program);
        spec.args = options.node_args();
        spec.args
            .extend(["--results".to_owned(), results.display().to_string()]);
        spec.env.push(("DMLC_ENABLE_RDMA".into(), "0".into()));
        let ipc = if van == "ipc" { "1" } else { "0" };
        spec.env.push(("DMLC_ENABLE_IPC".into(), ipc.into()));
        spec.timeout = Some(JOB_TIMEOUT);
        eprintln!(
            "rendezvous-exchange: {van} cluster, 1 server and {} workers",
            options.workers
        );
        let outcome = launch(&spec).await;
        let text = std::fs::read_to_string(&results).unwrap_or_default();
        let _ = std::fs::remove_file(&results);
        outcome?;
        for line in text.lines() {
            rows.push(serde_json::from_str::<serde_json::Value>(line)?);
        }
    }
    if options.mode == Mode::Bench {
        print_table(&rows, options.json);
    }
    Ok(())
}

fn print_table(rows: &[serde_json::Value], json: bool) {
    let mut table = Table::new(&[
        "van",
        "mode",
        "tensor",
        "in flight",
        "steps",
        "round trips/s",
        "GB/s",
        "µs/step",
    ]);
    for r in rows {
        let text = |k: &str| r[k].as_str().unwrap_or("?").to_owned();
        let number = |k: &str| r[k].as_f64().unwrap_or(0.0);
        let size = number("size");
        let round_trips = number("round_trips");
        let seconds = number("seconds").max(1e-9);
        let rate = round_trips / seconds;
        table.row(vec![
            text("van"),
            text("mode"),
            human_size(size as usize),
            format!("{}", number("in_flight")),
            format!("{}", number("steps")),
            format!("{rate:.0}"),
            // Both directions carry the tensor: ping and pong.
            format!("{:.3}", 2.0 * size * rate / 1e9),
            format!("{:.1}", 1e6 * seconds / number("steps").max(1.0)),
        ]);
    }
    if json {
        println!("{}", table.to_json());
    } else {
        println!("{table}");
        println!(
            "A round trip is a ping and its pong; GB/s counts the tensor both ways. A step is \
             find, initialize, the exchange of `in flight` round trips and cleanup. Every \
             value was checked byte for byte."
        );
    }
}

fn human_size(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// One measured case: tensor size, tensors per step and peer, steps.
#[derive(Debug, Clone, Copy)]
struct Case {
    size: usize,
    per_step: usize,
    steps: u64,
}

/// The tasks of the cluster (every node but the scheduler), sorted; task 0 pings the others.
fn tasks(po: &Postoffice) -> Vec<NodeId> {
    let mut ids: Vec<NodeId> = po
        .nodes()
        .iter()
        .filter(|n| n.role != Role::Scheduler)
        .filter_map(|n| n.id)
        .collect();
    ids.sort_unstable();
    ids
}

const TASKS: i32 = node_ids::SERVER_GROUP | node_ids::WORKER_GROUP;

async fn node(po: &Postoffice, o: &Options) -> Result<ExitCode, BoxError> {
    if po.role() == Role::Scheduler {
        po.finalize().await?;
        return Ok(ExitCode::SUCCESS);
    }
    let tasks = tasks(po);
    let me = po.my_id();
    let pinger = tasks[0];
    let pongers: Vec<NodeId> = tasks[1..].to_vec();
    let mut managers = Vec::new();
    for (i, protocol) in o.protocols.iter().enumerate() {
        let mgr = RendezvousMgr::builder(po)
            .protocol(*protocol)
            .customer_id(i as i32)
            .build()
            .await?;
        managers.push(mgr);
    }
    po.barrier(TASKS).await?;
    let exchange = Exchange::new(me, pinger, pongers.clone());
    if o.mode == Mode::Hang {
        return hang(po, &managers[0], &exchange).await;
    }
    let cases = match o.mode {
        Mode::Check => vec![Case {
            size: 0, // sizes vary per tensor
            per_step: o.tensors,
            steps: o.steps,
        }],
        _ => {
            let scale = if o.quick { 10 } else { 1 };
            vec![
                Case {
                    size: 8,
                    per_step: 1,
                    steps: 3000 / scale,
                },
                Case {
                    size: 8,
                    per_step: 64,
                    steps: 300 / scale,
                },
                Case {
                    size: 4 << 20,
                    per_step: 4,
                    steps: 60 / scale,
                },
            ]
        }
    };
    let van = pongers
        .first()
        .and_then(|p| po.van_for(*p))
        .map_or("none".to_owned(), |k| k.to_string());
    let mut results = Vec::new();
    for (m, mgr) in managers.iter().enumerate() {
        for (c, case) in cases.iter().enumerate() {
            let first_step = (m * cases.len() + c) as i64 * 1_000_000;
            let check = o.mode == Mode::Check;
            let elapsed = exchange.run(mgr, first_step, *case, check).await?;
            po.barrier(TASKS).await?;
            // Task 0 cleaned up each of its steps as it finished it; the others still hold
            // their last one. (Not `cleanup_all`: a peer already past the barrier may have
            // created the next case's first step here with its request.)
            mgr.cleanup(first_step + case.steps as i64 - 1);
            if me == pinger {
                let round_trips = case.steps * case.per_step as u64 * pongers.len() as u64;
                if check {
                    println!(
                        "check {}: {} steps, {} tensors each way with {} peer(s), every value \
                         and dead flag verified, via {van}",
                        mgr.protocol().mode(),
                        case.steps,
                        round_trips,
                        pongers.len()
                    );
                } else {
                    eprintln!(
                        "{} {} x{} over {van}: {:.0} round trips/s",
                        mgr.protocol().mode(),
                        human_size(case.size),
                        case.per_step,
                        round_trips as f64 / elapsed.as_secs_f64().max(1e-9)
                    );
                }
                results.push(serde_json::json!({
                    "van": van,
                    "mode": mgr.protocol().mode(),
                    "size": case.size,
                    "in_flight": case.per_step,
                    "steps": case.steps,
                    "round_trips": round_trips,
                    "seconds": elapsed.as_secs_f64(),
                }));
            } else if check {
                println!(
                    "check {}: node {me} verified {} pings from node {pinger} via {van}",
                    mgr.protocol().mode(),
                    case.steps * case.per_step as u64
                );
            }
        }
        let stats = mgr.stats();
        if stats.live_steps != 0 || stats.pending_pulls != 0 || stats.served_requests != 0 {
            return Err(
                format!("node {me}: the manager is not empty after cleanup: {stats:?}").into(),
            );
        }
    }
    if let (Some(path), false) = (&o.results, results.is_empty()) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        for r in &results {
            writeln!(file, "{r}")?;
        }
    }
    po.finalize().await?;
    Ok(ExitCode::SUCCESS)
}

/// `--mode hang`: a checked prologue, then task 0 waits on task 1, which waits to be killed.
async fn hang(
    po: &Postoffice,
    mgr: &RendezvousMgr,
    exchange: &Exchange,
) -> Result<ExitCode, BoxError> {
    let prologue = Case {
        size: 8,
        per_step: 2,
        steps: HANG_PROLOGUE_STEPS as u64,
    };
    exchange.run(mgr, 0, prologue, true).await?;
    po.barrier(TASKS).await?;
    let me = po.my_id();
    let Some(&victim) = exchange.pongers.first() else {
        return Err("--mode hang needs at least two tasks".into());
    };
    if me == exchange.pinger {
        let step = mgr.find(HANG_STEP);
        step.initialize()?;
        let key = exchange.key(victim, me, "never-sent")?;
        let pending = step.recv(&key);
        println!(
            "hang {}: node {me} waits for `{key}` of step {HANG_STEP} from node {victim}",
            mgr.protocol().mode()
        );
        let _ = std::io::stdout().flush();
        let started = Instant::now();
        let result = pending.await;
        let waited = started.elapsed();
        return match result {
            Ok(_) => Err("a value that was never sent arrived".into()),
            Err(e) => {
                eprintln!(
                    "rendezvous-exchange: after {:.1} s the receive failed: {e}",
                    waited.as_secs_f64()
                );
                po.stop().await;
                Ok(ExitCode::from(3))
            }
        };
    }
    if me == victim {
        println!("hang: node {me} is ready to be killed");
        let _ = std::io::stdout().flush();
    }
    // Wait for the kill (or for the launcher to stop everyone), or until the cluster goes on
    // without this node (cut off from it: then it must end, saying why).
    Err(po.stopped().await.into())
}

/// The tensors and keys of one run; the same on every task, so each can check the others.
struct Exchange {
    me: NodeId,
    pinger: NodeId,
    pongers: Vec<NodeId>,
    /// Random bytes that large tensors are slices of.
    pool: Bytes,
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut s = seed;
    while out.len() < len {
        s = examples::splitmix64(s);
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(len);
    out
}

impl Exchange {
    fn new(me: NodeId, pinger: NodeId, pongers: Vec<NodeId>) -> Exchange {
        Exchange {
            me,
            pinger,
            pongers,
            pool: Bytes::from(random_bytes(42, (4 << 20) + POOL_SLACK)),
        }
    }

    fn key(&self, src: NodeId, dst: NodeId, name: &str) -> Result<ParsedKey, BoxError> {
        let device = |n: NodeId| {
            cpu_device(n).ok_or_else(|| format!("node {n} is not a task (no device name)"))
        };
        let key = create_key(&device(src)?, 1, &device(dst)?, name, (0, 0));
        Ok(parse_key(&key)?)
    }

    /// The size of tensor `i` of `step` in check mode (0 B to 1 MiB), or the case's size.
    fn size(&self, case: &Case, check: bool, step: i64, i: usize) -> usize {
        if !check {
            return case.size;
        }
        if i % 50 == 49 {
            return 1 << 20;
        }
        [0, 8, 100, 4096, 65_536][(i + step as usize) % 5]
    }

    fn is_dead(check: bool, step: i64, i: usize) -> bool {
        check && (i * 7 + step as usize) % 13 == 0
    }

    /// The ping from task 0 to `peer`, tensor `i` of `step`: unique content per tensor.
    fn ping(&self, step: i64, i: usize, peer: NodeId, len: usize) -> Bytes {
        let seed = examples::splitmix64(
            (step as u64).wrapping_mul(1_000_003) ^ ((i as u64) << 20) ^ (peer as u64) << 48,
        );
        if len <= SMALL_MAX {
            Bytes::from(random_bytes(seed, len))
        } else {
            let offset = (seed as usize % (POOL_SLACK / 8)) * 8;
            self.pool.slice(offset..offset + len)
        }
    }

    /// One case: `case.steps` steps from `first_step`; returns how long task 0 took.
    async fn run(
        &self,
        mgr: &RendezvousMgr,
        first_step: i64,
        case: Case,
        check: bool,
    ) -> Result<Duration, BoxError> {
        let n = case.per_step;
        let started = Instant::now();
        if self.me == self.pinger {
            let keys = |name: &str, to_me: bool| -> Result<Vec<Vec<ParsedKey>>, BoxError> {
                self.pongers
                    .iter()
                    .map(|q| {
                        (0..n)
                            .map(|i| {
                                let name = format!("{name}/{i}");
                                match to_me {
                                    false => self.key(self.me, *q, &name),
                                    true => self.key(*q, self.me, &name),
                                }
                            })
                            .collect()
                    })
                    .collect()
            };
            let pings = keys("ping", false)?;
            let pongs = keys("pong", true)?;
            for s in 0..case.steps as i64 {
                let step_id = first_step + s;
                let step = mgr.find(step_id);
                step.initialize()?;
                let mut sent = Vec::with_capacity(n * self.pongers.len());
                for (q, (peer, keys)) in self.pongers.iter().zip(&pings).enumerate() {
                    for (i, key) in keys.iter().enumerate() {
                        let value = self.ping(step_id, i, *peer, self.size(&case, check, s, i));
                        let dead = Self::is_dead(check, s, i);
                        step.send(key, value.clone(), dead)?;
                        sent.push((q, i, value, dead));
                    }
                }
                let receives: Vec<_> = sent
                    .iter()
                    .map(|(q, i, _, _)| step.recv(&pongs[*q][*i]))
                    .collect();
                for ((q, i, value, dead), receive) in sent.into_iter().zip(receives) {
                    let got = receive.await?;
                    if got.value != value || got.is_dead != dead {
                        return Err(mismatch(step_id, &pongs[q][i], &value, dead, &got).into());
                    }
                }
                mgr.cleanup(step_id);
            }
        } else {
            let pings: Vec<ParsedKey> = (0..n)
                .map(|i| self.key(self.pinger, self.me, &format!("ping/{i}")))
                .collect::<Result<_, _>>()?;
            let pongs: Vec<ParsedKey> = (0..n)
                .map(|i| self.key(self.me, self.pinger, &format!("pong/{i}")))
                .collect::<Result<_, _>>()?;
            for s in 0..case.steps as i64 {
                let step_id = first_step + s;
                let step = mgr.find(step_id);
                step.initialize()?;
                let receives: Vec<_> = pings.iter().map(|k| step.recv(k)).collect();
                for (i, receive) in receives.into_iter().enumerate() {
                    let got = receive.await?;
                    if i == 0 && s > 0 {
                        // Task 0 started this step, so it has everything of the previous one
                        // (in pull mode it pulled our pongs from our table before that).
                        mgr.cleanup(step_id - 1);
                    }
                    let expected = self.ping(step_id, i, self.me, self.size(&case, check, s, i));
                    let dead = Self::is_dead(check, s, i);
                    if got.value != expected || got.is_dead != dead {
                        return Err(mismatch(step_id, &pings[i], &expected, dead, &got).into());
                    }
                    step.send(&pongs[i], got.value, got.is_dead)?;
                }
            }
        }
        Ok(started.elapsed())
    }
}

fn mismatch(
    step: i64,
    key: &ParsedKey,
    expected: &Bytes,
    dead: bool,
    got: &rendezvous::Received,
) -> String {
    let head = |b: &Bytes| format!("{:02x?}", &b[..b.len().min(8)]);
    format!(
        "step {step}, `{key}`: expected {} bytes {}… (dead: {dead}), got {} bytes {}… (dead: {})",
        expected.len(),
        head(expected),
        got.value.len(),
        head(&got.value),
        got.is_dead
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(std::iter::once("rendezvous-exchange").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_and_what_nodes_get() {
        Options::command().debug_assert();
        let o = parse(&[]).unwrap();
        assert_eq!(o.mode, Mode::Bench);
        assert_eq!(o.protocols, [Protocol::Pull, Protocol::Push]);
        assert_eq!(o.vans.join(","), DEFAULT_VANS);
        assert_eq!((o.workers, o.steps, o.tensors, o.threads), (1, 100, 100, 1));
        assert!(!o.quick && !o.json && o.results.is_none());

        let o = parse(&[
            "--mode",
            "check",
            "--protocols",
            "star_server",
            "--vans",
            "tcp",
            "--workers",
            "2",
            "--steps",
            "20",
            "--tensors",
            "50",
            "--threads",
            "2",
            "--quick",
            "--json",
            "--results",
            "/tmp/r",
        ])
        .unwrap();
        let args = o.node_args();
        assert_eq!(
            args,
            [
                "--mode",
                "check",
                "--protocols",
                "star_server",
                "--steps",
                "20",
                "--tensors",
                "50",
                "--threads",
                "2",
                "--quick",
            ]
        );
        // A node parses what it is given to the same options.
        let node = parse(&args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        assert_eq!(node.node_args(), args);
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            &["--mode", "fly"][..],
            &["--protocols", "carrier"],
            &["--vans", "rdma"],
            &["--workers", "0"],
            &["--steps", "0"],
            &["--tensors", "x"],
            &["--threads", "0"],
            &["--bogus"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
