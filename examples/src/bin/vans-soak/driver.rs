//! The soak's driver: ports, the fault proxies and the endpoint map that routes every node's
//! traffic through them, the node processes, the chaos schedule, and the final report.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use examples::chaos::{self, FaultProxy, Mode, Rng, Schedule};

use crate::{BoxError, Options};

/// Heartbeats: a node silent this long is dead. The schedule's outages stay well below it.
const HEARTBEAT_TIMEOUT_SECS: u64 = 20;
const MAX_OUTAGE: Duration = Duration::from_millis(1500);
/// How long the nodes may take, after the chaos ends, to check and leave.
const FINISH: Duration = Duration::from_secs(180);

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

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
        let port = free_port()?;
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
    let mut nodes = Vec::new();
    for p in &plan {
        nodes.push(spawn(o, p, &plan[0], &map_file, ipc)?);
    }
    let chaos = chaos_loop(o, &plan).await;
    for p in &plan {
        p.proxy.set_mode(Mode::Pass);
    }
    let outcome = finish(nodes);
    let _ = std::fs::remove_dir_all(&dir);
    report(o, &chaos, &plan, outcome?)
}

fn spawn(
    o: &Options,
    p: &Planned,
    scheduler: &Planned,
    map: &Path,
    ipc: bool,
) -> Result<Running, BoxError> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "--node",
        "--seconds",
        &o.seconds.to_string(),
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

/// What the chaos loop did: faults by kind, garbage connections and how many were dropped.
#[derive(Default)]
struct Chaos {
    faults: BTreeMap<&'static str, u64>,
    garbage: u64,
    garbage_closed: u64,
}

async fn chaos_loop(o: &Options, plan: &[Planned]) -> Chaos {
    let mut out = Chaos::default();
    let mut schedule = Schedule::new(o.seed, plan.len(), MAX_OUTAGE);
    let mut rng = Rng::new(o.seed ^ 0x5eed);
    // Let the cluster form before the first fault.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let end = Instant::now() + Duration::from_secs_f64(o.seconds);
    let mut last_said = Instant::now();
    while Instant::now() < end {
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
            out.garbage += 1;
            if let Ok(true) = chaos::garbage(addr, len, &mut rng).await {
                out.garbage_closed += 1;
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

/// Waits for every node; returns the output lines of each, or which failed.
fn finish(mut nodes: Vec<Running>) -> Result<Vec<(String, Vec<String>)>, BoxError> {
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
    for node in nodes {
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
    let (mut resent, mut dropped) = (0, 0);
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
         duplicated {duplicated}; messages resent {resent}, copies dropped {dropped}"
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
