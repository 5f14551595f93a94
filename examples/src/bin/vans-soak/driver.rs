//! The soak's driver: ports, the fault proxies and the endpoint map that routes every node's
//! traffic through them, the node processes, the chaos schedule, and the final report.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use examples::chaos::{self, FaultProxy, Mode, Rng, Schedule};

use crate::{BoxError, Options};

/// Heartbeats: a node silent this long is dead. The schedule's outages stay well below it.
const HEARTBEAT_TIMEOUT_SECS: u64 = 20;
const MAX_OUTAGE: Duration = Duration::from_millis(1500);
/// How long the nodes may take, after the chaos ends, to check and leave.
const FINISH: Duration = Duration::from_secs(60);

/// A node of the cluster: its role, its own port, and the proxy in front of it.
struct Planned {
    role: &'static str,
    port: u16,
    proxy: FaultProxy,
}

struct Running {
    name: String,
    child: Child,
    lines: std::thread::JoinHandle<Vec<String>>,
}

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
    let outcome = finish(nodes, killed);
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
}

impl Launch<'_> {
    /// Starts node `index` of the plan (again).
    fn spawn(&self, index: usize) -> Result<Running, BoxError> {
        let (launch, p, scheduler) = (self, &self.plan[index], &self.plan[0]);
        let (o, map, ipc) = (launch.o, launch.map, launch.ipc);
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.args([
            "--node",
            "--until-ms",
            &launch.until_ms.to_string(),
            "--workers",
            &o.workers.to_string(),
            "--keys",
            &o.keys.to_string(),
        ]);
        // The scheduler binds its own port; the others reach it through its proxy.
        let root_port = if p.role == "scheduler" {
            scheduler.port
        } else {
            scheduler.proxy.addr().port()
        };
        let env = [
            ("DMLC_ROLE", p.role.to_owned()),
            ("DMLC_NUM_SERVER", o.servers.to_string()),
            ("DMLC_NUM_WORKER", o.workers.to_string()),
            ("DMLC_PS_ROOT_URI", "127.0.0.1".to_owned()),
            ("DMLC_PS_ROOT_PORT", root_port.to_string()),
            ("DMLC_PORT", p.port.to_string()),
            ("DMLC_INTERFACE", "lo".to_owned()),
            ("DMLC_ENABLE_RDMA", "0".to_owned()),
            ("DMLC_ENABLE_IPC", if ipc { "1" } else { "0" }.to_owned()),
            ("PS_RESEND", "1".to_owned()),
            ("PS_RESEND_TIMEOUT", "500".to_owned()),
            ("PS_HEARTBEAT_INTERVAL", "1".to_owned()),
            ("PS_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT_SECS.to_string()),
            ("VANS_ENDPOINT_MAP", map.display().to_string()),
        ];
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd.spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout from a node")?;
        let lines = std::thread::spawn(move || {
            BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect()
        });
        Ok(Running {
            name: p.role.to_owned(),
            child,
            lines,
        })
    }
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
    // Let the cluster form before the first fault.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let end = Instant::now() + Duration::from_secs_f64(o.seconds);
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
/// failed.
fn finish(
    mut nodes: Vec<Running>,
    killed: Vec<Running>,
) -> Result<Vec<(String, Vec<String>)>, BoxError> {
    let deadline = Instant::now() + FINISH;
    let mut failed = Vec::new();
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
    for node in killed.into_iter().chain(nodes) {
        let lines = node.lines.join().unwrap_or_default();
        out.push((node.name, lines));
    }
    if !failed.is_empty() {
        for (name, lines) in &out {
            for line in lines {
                println!("{name}: {line}");
            }
        }
        return Err(format!("nodes failed: {}", failed.join(", ")).into());
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
            if line.starts_with("SOAK-") {
                resent += field(line, "resent").unwrap_or(0);
                dropped += field(line, "duplicates-dropped").unwrap_or(0);
                stale += field(line, "stale-dropped").unwrap_or(0);
                println!("{line}");
            }
        }
    }
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
