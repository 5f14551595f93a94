//! The soak's driver: ports, the fault proxies and the endpoint map that routes every node's
//! traffic through them, the node processes, the chaos schedule, and the final report.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use examples::chaos::{self, FaultProxy, Mode, Rng, Schedule};

use crate::{BoxError, Options};

/// Heartbeats every this many seconds, on every soak node.
pub(crate) const HEARTBEAT_INTERVAL_SECS: u64 = 1;
/// Heartbeats: a node silent this long is dead. The schedule's outages stay well below it.
const HEARTBEAT_TIMEOUT_SECS: u64 = 20;
const MAX_OUTAGE: Duration = Duration::from_millis(1500);
/// How long the nodes may take, after the chaos ends, to check and leave.
const FINISH: Duration = Duration::from_secs(60);
/// How long the cluster may take to form before the chaos starts.
const FORMATION: Duration = Duration::from_secs(60);

/// A node of the cluster: its role, its own port, and the proxy in front of it.
struct Planned {
    role: &'static str,
    port: u16,
    proxy: FaultProxy,
}

/// A node's process.
pub(crate) struct Running {
    /// Its role and which process it is, for people.
    pub(crate) name: String,
    pub(crate) child: Child,
    /// Its standard output's lines, when it ends.
    pub(crate) lines: std::thread::JoinHandle<Vec<String>>,
    /// The process's log (its standard error), printed if the run fails.
    pub(crate) log: std::path::PathBuf,
}

/// What the nodes log (unless a non-empty `RUST_LOG` says otherwise): warnings, and the
/// scheduler's and postoffices' membership events (registrations, failures, recoveries), so
/// that a failed run shows what each process saw.
pub(crate) const NODE_LOG: &str = "warn,node::control=info,node::postoffice=info";

/// What the driver itself reads in the scheduler's log (its declarations of death), kept
/// whatever `RUST_LOG` says: with `RUST_LOG=` (empty) or `error`, a network run would
/// otherwise report every cut-off node as never declared dead.
const DRIVER_LOG: &str = "node::control::liveness=warn";

pub(crate) async fn run(o: &Options) -> Result<(), BoxError> {
    let ipc = match o.van.as_str() {
        "tcp" => false,
        "ipc" => true,
        other => return Err(format!("--van {other}: expected tcp or ipc").into()),
    };
    if o.workers == 0 || o.servers == 0 {
        return Err("--servers and --workers must be at least 1".into());
    }
    let dir = std::env::temp_dir().join(format!("vans-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    if let Some(logs) = &o.logs {
        std::fs::create_dir_all(logs)?;
    }
    let mut plan = Vec::new();
    let roles = std::iter::once("scheduler")
        .chain((0..o.servers).map(|_| "server"))
        .chain((0..o.workers).map(|_| "worker"));
    for role in roles {
        // Below the ephemeral range: a killed node binds its port again, and a port the
        // kernel hands out could meanwhile be the source port of another connection.
        let port = van_core::link::stream::free_loopback_port();
        let target: SocketAddr = ([127, 0, 0, 1], port).into();
        let proxy = FaultProxy::start(0, target).await?;
        plan.push(Planned { role, port, proxy });
    }
    // Every node reaches every other through that node's proxy.
    let map: String = plan
        .iter()
        .map(|p| format!("127.0.0.1:{}=127.0.0.1:{}\n", p.port, p.proxy.addr().port()))
        .collect();
    let map_file = dir.join("endpoint_map");
    std::fs::write(&map_file, map)?;
    println!(
        "vans-soak: {} servers x {} workers over {}, {} s of chaos (seed {}), PS_RESEND on",
        o.servers, o.workers, o.van, o.seconds, o.seed
    );
    let until_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64
        + 2_000
        + (o.seconds * 1000.0) as u64;
    let launch = Launch {
        o,
        plan: &plan,
        map: &map_file,
        ipc,
        until_ms,
        dir: o.logs.as_deref().unwrap_or(&dir),
        started: std::cell::Cell::new(0),
        ready: Arc::new(AtomicUsize::new(0)),
    };
    let mut nodes = Vec::new();
    for index in 0..plan.len() {
        nodes.push(launch.spawn(index)?);
    }
    let mut killed = Vec::new();
    let chaos = chaos_loop(&launch, &mut nodes, &mut killed).await;
    for p in &plan {
        p.proxy.set_mode(Mode::Pass);
    }
    let outcome = finish(nodes, killed, Vec::new());
    let _ = std::fs::remove_dir_all(&dir);
    report(o, &chaos, &plan, outcome?)
}

/// What starting a node takes: the same for its first start and every restart.
struct Launch<'a> {
    o: &'a Options,
    plan: &'a [Planned],
    map: &'a Path,
    ipc: bool,
    until_ms: u64,
    /// Where the nodes' logs go.
    dir: &'a Path,
    /// Processes started so far (names their logs).
    started: std::cell::Cell<usize>,
    /// Processes that joined the cluster (said `SOAK-READY`).
    ready: Arc<AtomicUsize>,
}

impl Launch<'_> {
    /// Starts node `index` of the plan (again).
    fn spawn(&self, index: usize) -> Result<Running, BoxError> {
        let (launch, p, scheduler) = (self, &self.plan[index], &self.plan[0]);
        let (o, map, ipc) = (launch.o, launch.map, launch.ipc);
        let cmd = Command::new(std::env::current_exe()?);
        // The scheduler binds its own port; the others reach it through its proxy.
        let root_port = if p.role == "scheduler" {
            scheduler.port
        } else {
            scheduler.proxy.addr().port()
        };
        let env = [
            ("DMLC_ROLE", p.role.to_owned()),
            ("DMLC_PS_ROOT_URI", "127.0.0.1".to_owned()),
            ("DMLC_PS_ROOT_PORT", root_port.to_string()),
            ("DMLC_PORT", p.port.to_string()),
            ("DMLC_INTERFACE", "lo".to_owned()),
            ("DMLC_ENABLE_IPC", if ipc { "1" } else { "0" }.to_owned()),
            ("PS_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT_SECS.to_string()),
            ("VANS_ENDPOINT_MAP", map.display().to_string()),
        ];
        let n = launch.started.get();
        launch.started.set(n + 1);
        let log = launch.dir.join(format!("{n:03}-{}.log", p.role));
        let name = format!("{} (process {n})", p.role);
        start_node(
            cmd,
            o,
            launch.until_ms,
            &env,
            (name, log),
            &launch.ready,
            None,
        )
    }
}

/// A node's progress as it reports it: (when, process number, rounds so far).
pub(crate) type Ticks = Arc<std::sync::Mutex<Vec<(Instant, usize, u64)>>>;

/// Starts `cmd` (this program, maybe behind `ip netns exec`) as one node of the soak: the
/// node arguments and the environment every soak node shares, beside `env` (its role and
/// addresses); its standard error into `log`, its standard output read on a thread that
/// counts `SOAK-READY` lines into `ready`, shows workers' progress as it comes, and with
/// `ticks` (which also asks the node for them) records its `SOAK-TICK` lines there.
pub(crate) fn start_node(
    mut cmd: Command,
    o: &Options,
    until_ms: u64,
    env: &[(&str, String)],
    (name, log): (String, std::path::PathBuf),
    ready: &Arc<AtomicUsize>,
    ticks: Option<(usize, Ticks)>,
) -> Result<Running, BoxError> {
    cmd.args([
        "--node",
        "--until-ms",
        &until_ms.to_string(),
        "--workers",
        &o.workers.to_string(),
        "--keys",
        &o.keys.to_string(),
    ]);
    if ticks.is_some() {
        cmd.arg("--ticks");
    }
    let shared = [
        ("DMLC_NUM_SERVER", o.servers.to_string()),
        ("DMLC_NUM_WORKER", o.workers.to_string()),
        ("DMLC_ENABLE_RDMA", "0".to_owned()),
        ("PS_RESEND", "1".to_owned()),
        ("PS_RESEND_TIMEOUT", "500".to_owned()),
        ("PS_HEARTBEAT_INTERVAL", HEARTBEAT_INTERVAL_SECS.to_string()),
        // Killed and cut-off nodes are started again: the servers' finalize waits for them.
        ("VANS_REPLACEMENT_GRACE_SECS", "60".to_owned()),
    ];
    for (k, v) in shared.iter().chain(env) {
        cmd.env(k, v);
    }
    cmd.env_remove("VANS_HOST_ID");
    let filter = match std::env::var("RUST_LOG") {
        Ok(user) if !user.trim().is_empty() => format!("{user},{DRIVER_LOG}"),
        _ => NODE_LOG.to_owned(),
    };
    cmd.env("RUST_LOG", filter);
    cmd.stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?);
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout from a node")?;
    let ready = Arc::clone(ready);
    let lines = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter(|line| {
                if let (Some(rounds), Some((n, ticks))) = (line.strip_prefix("SOAK-TICK "), &ticks)
                {
                    if let (Ok(rounds), Ok(mut ticks)) = (rounds.trim().parse(), ticks.lock()) {
                        ticks.push((Instant::now(), *n, rounds));
                    }
                    return false;
                }
                if line.starts_with("SOAK-READY") {
                    ready.fetch_add(1, Ordering::Relaxed);
                }
                // A worker's progress is shown as it comes.
                if line.starts_with("vans-soak: worker") {
                    println!("{line}");
                }
                true
            })
            .collect()
    });
    Ok(Running {
        name,
        child,
        lines,
        log,
    })
}

/// What the chaos loop did: faults by kind, garbage connections and how many were dropped.
#[derive(Default)]
struct Chaos {
    faults: BTreeMap<&'static str, u64>,
    garbage: u64,
    garbage_closed: u64,
}

/// Kills node `index` (-9) and starts a new process in its place; the old one joins
/// `killed`.
async fn kill_and_restart(
    launch: &Launch<'_>,
    index: usize,
    nodes: &mut [Running],
    killed: &mut Vec<Running>,
    rng: &mut Rng,
) -> Result<(), BoxError> {
    let node = &mut nodes[index];
    node.child.kill()?;
    node.child.wait()?;
    println!("vans-soak: killed {} (pid {})", node.name, node.child.id());
    tokio::time::sleep(rng.between(Duration::from_millis(200), Duration::from_millis(800))).await;
    let fresh = launch.spawn(index)?;
    killed.push(std::mem::replace(node, fresh));
    Ok(())
}

async fn chaos_loop(
    launch: &Launch<'_>,
    nodes: &mut [Running],
    killed: &mut Vec<Running>,
) -> Chaos {
    let (o, plan) = (launch.o, launch.plan);
    let mut out = Chaos::default();
    let mut schedule = Schedule::new(o.seed, plan.len(), MAX_OUTAGE);
    let mut rng = Rng::new(o.seed ^ 0x5eed);
    // The faults are for a cluster that formed: wait until every node has joined (a kill
    // while the cluster forms only restarts a registration, and tests nothing of recovery).
    let formed = Instant::now() + FORMATION;
    while launch.ready.load(Ordering::Relaxed) < plan.len() && Instant::now() < formed {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if launch.ready.load(Ordering::Relaxed) < plan.len() {
        println!(
            "vans-soak: only {} of {} nodes joined within {FORMATION:?}",
            launch.ready.load(Ordering::Relaxed),
            plan.len()
        );
        return out;
    }
    // The chaos ends with the workers' rounds (at `until_ms`).
    let left = (UNIX_EPOCH + Duration::from_millis(launch.until_ms))
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    let end = Instant::now() + left;
    let kills_end = end.checked_sub(Duration::from_secs(10)).unwrap_or(end);
    let mut next_kill =
        (o.kill_every > 0.0).then(|| Instant::now() + Duration::from_secs_f64(o.kill_every));
    let mut kill_server = false;
    let mut last_said = Instant::now();
    while Instant::now() < end {
        if let Some(at) = next_kill.filter(|at| Instant::now() >= *at && *at < kills_end) {
            // Workers and servers in turn; never the scheduler.
            let (first, count) = if kill_server {
                (1, o.servers as usize)
            } else {
                (1 + o.servers as usize, o.workers as usize)
            };
            let index = first + rng.below(count as u64) as usize;
            let what = if kill_server {
                "kill -9 server"
            } else {
                "kill -9 worker"
            };
            *out.faults.entry(what).or_default() += 1;
            if let Err(e) = kill_and_restart(launch, index, nodes, killed, &mut rng).await {
                println!("vans-soak: could not kill and restart node {index}: {e}");
            }
            kill_server = !kill_server;
            next_kill = Some(at + Duration::from_secs_f64(o.kill_every));
        }
        let step = schedule.next_step();
        let proxy = &plan[step.proxy].proxy;
        *out.faults.entry(step.fault.name()).or_default() += 1;
        match step.fault.mode() {
            Some(mode) => {
                proxy.set_mode(mode);
                tokio::time::sleep(step.lasts).await;
                if step.fault == chaos::Fault::Partition {
                    proxy.reset();
                }
                proxy.set_mode(Mode::Pass);
            }
            None if step.fault == chaos::Fault::Cut => {
                proxy.cut();
            }
            None => {
                proxy.reset();
            }
        }
        // Now and then, garbage straight to a node's own port.
        if rng.below(3) == 0 {
            let victim = &plan[rng.below(plan.len() as u64) as usize];
            let addr: SocketAddr = ([127, 0, 0, 1], victim.port).into();
            let len = 1 + rng.below(4096) as usize;
            // Counted only when it connected (a node being restarted refuses it).
            if let Ok(closed) = chaos::garbage(addr, len, &mut rng).await {
                out.garbage += 1;
                out.garbage_closed += u64::from(closed);
            }
        }
        tokio::time::sleep(step.pause).await;
        if last_said.elapsed() >= Duration::from_secs(10) {
            last_said = Instant::now();
            let total: u64 = out.faults.values().sum();
            println!(
                "vans-soak: {total} faults injected so far: {:?}",
                out.faults
            );
        }
    }
    out
}

/// Waits for every node; returns the output lines of each (the killed ones' too), or which
/// failed (and the driver's own `failed`, if any), with every process's log.
pub(crate) fn finish(
    mut nodes: Vec<Running>,
    killed: Vec<Running>,
    mut failed: Vec<String>,
) -> Result<Vec<(String, Vec<String>)>, BoxError> {
    let deadline = Instant::now() + FINISH;
    for node in &mut nodes {
        loop {
            match node.child.try_wait()? {
                Some(status) if status.success() => break,
                Some(status) => {
                    failed.push(format!("{} ({status})", node.name));
                    break;
                }
                None if Instant::now() > deadline => {
                    let _ = node.child.kill();
                    let _ = node.child.wait();
                    failed.push(format!("{} (still running; killed)", node.name));
                    break;
                }
                None => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    let mut out = Vec::new();
    let mut logs = Vec::new();
    for node in killed.into_iter().chain(nodes) {
        let lines = node.lines.join().unwrap_or_default();
        logs.push((node.name.clone(), node.log));
        out.push((node.name, lines));
    }
    let warnings: usize = logs
        .iter()
        .filter_map(|(_, log)| std::fs::read_to_string(log).ok())
        .map(|text| text.lines().filter(|l| l.contains(" WARN ")).count())
        .sum();
    println!("vans-soak: the nodes logged {warnings} warnings");
    if !failed.is_empty() {
        for (name, lines) in &out {
            for line in lines {
                println!("{name}: {line}");
            }
        }
        // Every process's log, in the order they started (killed ones too).
        logs.sort_by_key(|(_, log)| log.clone());
        for (name, log) in &logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            println!("---- log of {name}:");
            for line in text.lines() {
                println!("{line}");
            }
        }
        return Err(format!("failed: {}", failed.join("; ")).into());
    }
    Ok(out)
}

/// Prints the summary; fails unless every worker checked its sums with nothing lost or
/// doubled.
fn report(
    o: &Options,
    chaos: &Chaos,
    plan: &[Planned],
    nodes: Vec<(String, Vec<String>)>,
) -> Result<(), BoxError> {
    let faults: u64 = chaos.faults.values().sum();
    let connections: u64 = plan
        .iter()
        .map(|p| {
            p.proxy
                .stats()
                .connections
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum();
    println!(
        "vans-soak: {faults} faults injected {:?}, {} garbage connections ({} dropped by the \
         node), {connections} connections through the proxies",
        chaos.faults, chaos.garbage, chaos.garbage_closed
    );
    verify(o, nodes)
}

/// Sums what the workers and nodes reported; fails unless every worker checked its sums with
/// nothing lost or doubled.
pub(crate) fn verify(o: &Options, nodes: Vec<(String, Vec<String>)>) -> Result<(), BoxError> {
    let field = |line: &str, name: &str| -> Option<i64> {
        let mut words = line.split_whitespace();
        words.find(|w| *w == name)?;
        words.next()?.parse().ok()
    };
    let (mut updates, mut checks, mut lost, mut duplicated, mut workers) = (0, 0, 0, 0, 0);
    let (mut resent, mut dropped, mut stale) = (0, 0, 0);
    for (_, lines) in &nodes {
        for line in lines {
            if line.starts_with("SOAK-WORKER") {
                workers += 1;
                updates += field(line, "updates").unwrap_or(0);
                checks += field(line, "checks").unwrap_or(0);
                lost += field(line, "lost").unwrap_or(0);
                duplicated += field(line, "duplicated").unwrap_or(0);
            }
            if line.starts_with("SOAK-") && !line.starts_with("SOAK-READY") {
                resent += field(line, "resent").unwrap_or(0);
                dropped += field(line, "duplicates-dropped").unwrap_or(0);
                stale += field(line, "stale-dropped").unwrap_or(0);
                println!("{line}");
            }
        }
    }
    println!(
        "vans-soak: {updates} updates verified by {checks} exact checks; lost {lost}, \
         duplicated {duplicated}; messages resent {resent}, copies dropped {dropped}, dropped \
         as meant for or sent by a replaced process {stale}"
    );
    if workers != o.workers {
        return Err(format!("{workers} of {} workers reported", o.workers).into());
    }
    if lost != 0 || duplicated != 0 || updates == 0 {
        return Err("the sums were not exact".into());
    }
    println!("vans-soak: PASS");
    Ok(())
}
