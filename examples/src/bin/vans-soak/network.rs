//! The soak on network-namespace hosts (`--network`): the same nodes and exact checks as the
//! proxy soak, but the faults are the kernel's, on the links between hosts
//! ([`examples::netns::Fault`]: random loss, partitions both ways and one way), so every
//! connection, heartbeat and retransmission meets them as it would between machines.
//!
//! Three hosts: host 0 the scheduler, server 0 and the first half of the workers; host 1 the
//! other servers; host 2 the other workers. Short faults (loss, partitions shorter than a
//! third of the heartbeat timeout) must leave every node alive. A *long* partition (longer
//! than the heartbeat timeout; `--long-every`, or `long` in `--faults`) cuts host 1 or 2
//! off: the scheduler must declare its nodes dead within the timeout and one heartbeat, a
//! replacement for each is started on host 0 (`--replace-across`: on the other of hosts 1
//! and 2) and must take its place, and when the partition heals the old processes (zombies) must learn they were replaced
//! and exit with that error, with none of their late messages applied (the exact sums say
//! so).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use examples::chaos::Rng;
use examples::netns::{Fault, Hosts};

use crate::driver::{finish, start_node, verify, Running, Ticks, HEARTBEAT_INTERVAL_SECS};
use crate::{BoxError, Options};

/// How long the cluster may take to form before the faults start.
const FORMATION: Duration = Duration::from_secs(60);
/// How long a zombie may take, after its partition heals, to learn it was replaced and exit.
const ZOMBIE_EXIT: Duration = Duration::from_secs(20);
/// What a zombie's log must say: it learnt the cluster went on without it (`node::EVICTED`).
const ZOMBIE_WORDS: &str = "removed from the cluster";
/// What the scheduler logs when it declares nodes dead.
const DEATH_WORDS: &str = "declaring nodes dead";
/// The port of the first process; each process takes the next (a replacement on another host must
/// not meet a port in use there).
const FIRST_PORT: u16 = 9300;

/// One step of a fault plan: a fault on a host, for a while.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    host: usize,
    fault: Fault,
    /// A fault kept beyond the heartbeat timeout (its nodes replaced, then fenced), or for
    /// `lasts`.
    long: bool,
    lasts: Duration,
}

/// Parses `--faults`: `HOST:KIND:SECONDS` steps separated by commas, KIND one of `lossN`
/// (N % of the packets each way, 0.1 to 100), `partition`, `deaf`, `mute`, or `long`,
/// `longdeaf`, `longmute` (that partition kept beyond the heartbeat timeout, its nodes
/// replaced: SECONDS is ignored).
pub(crate) fn parse_plan(spec: &str) -> Result<Vec<Step>, String> {
    spec.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|step| {
            let bad = |why: &str| format!("--faults step {step:?}: {why} (HOST:KIND:SECONDS)");
            let parts: Vec<&str> = step.trim().split(':').collect();
            let [host, kind, secs] = parts[..] else {
                return Err(bad("three fields expected"));
            };
            let host: usize = host.parse().map_err(|_| bad("HOST is 0, 1 or 2"))?;
            if host > 2 {
                return Err(bad("HOST is 0, 1 or 2"));
            }
            let lasts: f64 = secs.parse().map_err(|_| bad("SECONDS is a number"))?;
            if !(0.0..=3600.0).contains(&lasts) {
                return Err(bad("SECONDS is 0 to 3600"));
            }
            let long = kind.starts_with("long");
            if long && host == 0 {
                return Err(bad("host 0 holds the scheduler: no long partition there"));
            }
            let fault = match kind {
                "partition" | "long" => Fault::Partition,
                "deaf" | "longdeaf" => Fault::Deaf,
                "mute" | "longmute" => Fault::Mute,
                loss if loss.starts_with("loss") => {
                    let pct: f64 = loss[4..]
                        .parse()
                        .map_err(|_| bad("lossN: N a percentage"))?;
                    if !(0.1..=100.0).contains(&pct) {
                        return Err(bad("lossN: N from 0.1 to 100"));
                    }
                    Fault::Loss {
                        per_mille: (pct * 10.0).round() as u32,
                    }
                }
                _ => {
                    return Err(bad(
                        "KIND is lossN, partition, deaf, mute, long, longdeaf or longmute",
                    ))
                }
            };
            Ok(Step {
                host,
                fault,
                long,
                lasts: Duration::from_secs_f64(lasts),
            })
        })
        .collect()
}

/// The placement of the nodes: (role, host).
fn layout(o: &Options) -> Vec<(&'static str, usize)> {
    let mut plan = vec![("scheduler", 0), ("server", 0)];
    plan.extend((1..o.servers).map(|_| ("server", 1)));
    let half = o.workers / 2;
    plan.extend((0..o.workers).map(|w| ("worker", if w < half { 0 } else { 2 })));
    plan
}

/// What starting a process takes, on any host.
struct Launch<'a> {
    o: &'a Options,
    hosts: &'a Hosts,
    until_ms: u64,
    dir: &'a Path,
    started: std::cell::Cell<usize>,
    ready: Arc<AtomicUsize>,
    /// The workers' progress.
    ticks: Ticks,
}

impl Launch<'_> {
    /// Starts a `role` process on `host`.
    fn spawn(&self, role: &'static str, host: usize) -> Result<(Running, usize), BoxError> {
        let n = self.started.get();
        self.started.set(n + 1);
        let port = FIRST_PORT + n as u16;
        let cmd = self.hosts.command(host, std::env::current_exe()?);
        let env = [
            ("DMLC_ROLE", role.to_owned()),
            ("DMLC_PS_ROOT_URI", self.hosts.addrs[0].clone()),
            ("DMLC_PS_ROOT_PORT", FIRST_PORT.to_string()),
            ("DMLC_PORT", port.to_string()),
            ("DMLC_INTERFACE", "eth0".to_owned()),
            ("PS_HEARTBEAT_TIMEOUT", self.o.heartbeat_timeout.to_string()),
            // Off loopback, as a real cluster should be.
            (
                "VANS_CLUSTER_SECRET",
                format!("vans-soak-{:016x}", self.o.seed ^ 0x5ec2e7),
            ),
        ];
        let log = self.dir.join(format!("{n:03}-{role}-host{host}.log"));
        let name = format!("{role} (process {n}, host {host})");
        let ticks = Some((n, Arc::clone(&self.ticks)));
        let running = start_node(
            cmd,
            self.o,
            self.until_ms,
            &env,
            (name, log),
            &self.ready,
            ticks,
        )?;
        Ok((running, host))
    }
}

/// What one kind of fault did over the run.
#[derive(Default)]
struct Tally {
    injected: u64,
    /// Time under the fault.
    under: Duration,
    /// Long partitions: from the cut to the scheduler's declaration.
    detection: Vec<Duration>,
    /// Long partitions: from the declaration to every replacement joined.
    recovery: Vec<Duration>,
}

/// A long partition's old processes, to be checked at the end.
struct Zombie {
    running: Running,
    healed: Instant,
}

pub(crate) async fn run(o: &Options) -> Result<(), BoxError> {
    if o.servers < 2 || o.workers < 2 {
        return Err("--network needs at least 2 servers and 2 workers (3 hosts)".into());
    }
    let timeout = Duration::from_secs(o.heartbeat_timeout);
    let plan = match &o.faults {
        Some(spec) => Some(parse_plan(spec)?),
        None => None,
    };
    let hosts = Hosts::create("sk", 3, false)
        .map_err(|e| format!("--network: the hosts could not be made: {e}"))?;
    let dir = std::env::temp_dir().join(format!("vans-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    if let Some(logs) = &o.logs {
        std::fs::create_dir_all(logs)?;
    }
    let seconds = match &plan {
        Some(steps) => {
            let total: f64 = steps
                .iter()
                .map(|s| match s.long {
                    true => timeout.as_secs_f64() + 8.0,
                    false => s.lasts.as_secs_f64() + 1.0,
                })
                .sum();
            o.seconds.max(total + 10.0)
        }
        None => o.seconds,
    };
    println!(
        "vans-soak: {} servers x {} workers on 3 network-namespace hosts ({}), {seconds} s of \
         network faults (seed {}), heartbeat timeout {} s, PS_RESEND on",
        o.servers, o.workers, hosts.subnet, o.seed, o.heartbeat_timeout
    );
    let until_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64
        + 2_000
        + (seconds * 1000.0) as u64;
    let launch = Launch {
        o,
        hosts: &hosts,
        until_ms,
        dir: o.logs.as_deref().unwrap_or(&dir),
        started: std::cell::Cell::new(0),
        ready: Arc::new(AtomicUsize::new(0)),
        ticks: Arc::new(Mutex::new(Vec::new())),
    };
    let layout = layout(o);
    let mut nodes = Vec::new();
    for &(role, host) in &layout {
        nodes.push((role, launch.spawn(role, host)?));
        if role == "scheduler" {
            // The others' first dial finds it listening.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let deaths = Deaths::new(nodes[0].1 .0.log.clone());
    let mut state = Chaos {
        launch: &launch,
        nodes,
        killed: Vec::new(),
        zombies: Vec::new(),
        tallies: BTreeMap::new(),
        windows: Vec::new(),
        deaths_expected: 0,
        deaths,
        rng: Rng::new(o.seed ^ 0x6e65_7477),
        failures: Vec::new(),
    };
    state.drive(plan).await;
    finish_run(o, state, timeout)
}

/// The run's moving parts while faults are injected.
struct Chaos<'a> {
    launch: &'a Launch<'a>,
    /// Each node's current process, and its host.
    nodes: Vec<(&'static str, (Running, usize))>,
    killed: Vec<Running>,
    zombies: Vec<Zombie>,
    tallies: BTreeMap<String, Tally>,
    /// When each fault was in force: (kind, from, to).
    windows: Vec<(String, Instant, Instant)>,
    /// Nodes the scheduler should have declared dead (kills and long partitions).
    deaths_expected: usize,
    /// The scheduler's declarations of death.
    deaths: Deaths,
    rng: Rng,
    /// What went wrong during the run (a death not detected, a replacement not joined).
    failures: Vec<String>,
}

impl Chaos<'_> {
    async fn drive(&mut self, plan: Option<Vec<Step>>) {
        let (launch, o) = (self.launch, self.launch.o);
        let formed = Instant::now() + FORMATION;
        let everyone = self.nodes.len();
        while launch.ready.load(Ordering::Relaxed) < everyone && Instant::now() < formed {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if launch.ready.load(Ordering::Relaxed) < everyone {
            self.failures.push(format!(
                "only {} of {everyone} nodes joined within {FORMATION:?}",
                launch.ready.load(Ordering::Relaxed)
            ));
            return;
        }
        let end = (UNIX_EPOCH + Duration::from_millis(launch.until_ms))
            .duration_since(SystemTime::now())
            .map(|left| Instant::now() + left)
            .unwrap_or_else(|_| Instant::now());
        let timeout = Duration::from_secs(o.heartbeat_timeout);
        // Faults that change membership stop this long before the end, so that the final
        // barrier sees every replacement joined.
        let quiet = end.checked_sub(Duration::from_secs(15)).unwrap_or(end);
        match plan {
            Some(steps) => {
                // A clean second first: the loss-free rate to compare with.
                tokio::time::sleep(Duration::from_secs(2)).await;
                for step in steps {
                    self.step(step, timeout).await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            None => {
                let mut next_kill = (o.kill_every > 0.0)
                    .then(|| Instant::now() + Duration::from_secs_f64(o.kill_every));
                let mut next_long = (o.long_every > 0.0)
                    .then(|| Instant::now() + Duration::from_secs_f64(o.long_every));
                let mut last_said = Instant::now();
                let mut long_host = 1;
                while Instant::now() + Duration::from_secs(5) < end {
                    let now = Instant::now();
                    if let Some(at) = next_long.filter(|at| now >= *at) {
                        // Host 1 or 2 in turn, one that still holds nodes (replacements
                        // start on host 0): a cut of an empty host tests nothing.
                        let holds = |h: usize| self.nodes.iter().any(|(_, (_, on))| *on == h);
                        let host = [long_host, 3 - long_host].into_iter().find(|&h| holds(h));
                        if let Some(host) =
                            host.filter(|_| now + timeout + Duration::from_secs(8) < quiet)
                        {
                            // Both ways or one way (either), at random.
                            let fault = [Fault::Partition, Fault::Deaf, Fault::Mute]
                                [self.rng.below(3) as usize];
                            self.step(
                                Step {
                                    host,
                                    fault,
                                    long: true,
                                    lasts: Duration::ZERO,
                                },
                                timeout,
                            )
                            .await;
                            long_host = 3 - host;
                        }
                        next_long =
                            Some(at.max(Instant::now()) + Duration::from_secs_f64(o.long_every));
                    } else if let Some(at) = next_kill.filter(|at| now >= *at) {
                        if now < quiet {
                            self.kill_one().await;
                        }
                        next_kill = Some(at + Duration::from_secs_f64(o.kill_every));
                    } else {
                        let step = self.random_step(timeout);
                        self.step(step, timeout).await;
                    }
                    tokio::time::sleep(
                        self.rng
                            .between(Duration::from_millis(300), Duration::from_millis(1500)),
                    )
                    .await;
                    if last_said.elapsed() >= Duration::from_secs(10) {
                        last_said = Instant::now();
                        let total: u64 = self.tallies.values().map(|t| t.injected).sum();
                        println!("vans-soak: {total} network faults injected so far");
                    }
                }
            }
        }
    }

    /// A short fault: loss of 1, 5 or 20 % for 1 to 5 s, or a partition (both ways or one)
    /// shorter than a third of the heartbeat timeout.
    fn random_step(&mut self, timeout: Duration) -> Step {
        let host = self.rng.below(3) as usize;
        let (fault, lasts) = match self.rng.below(10) {
            0..=3 => {
                let per_mille = [10, 50, 200][self.rng.below(3) as usize];
                let lasts = self
                    .rng
                    .between(Duration::from_secs(1), Duration::from_secs(5));
                (Fault::Loss { per_mille }, lasts)
            }
            k => {
                let fault = match k {
                    4 | 5 => Fault::Partition,
                    6 | 7 => Fault::Deaf,
                    _ => Fault::Mute,
                };
                let lasts = self.rng.between(Duration::from_millis(300), timeout / 3);
                (fault, lasts)
            }
        };
        Step {
            host,
            fault,
            long: false,
            lasts,
        }
    }

    /// Kill -9 a worker or a server (in turn) and start a new process on its host.
    async fn kill_one(&mut self) {
        let candidates: Vec<usize> = (1..self.nodes.len()).collect();
        let index = candidates[self.rng.below(candidates.len() as u64) as usize];
        let (role, (running, host)) = &mut self.nodes[index];
        let (role, host) = (*role, *host);
        let _ = running.child.kill();
        let _ = running.child.wait();
        println!("vans-soak: kill -9 {}", running.name);
        let tally = self.tallies.entry(format!("kill -9 {role}")).or_default();
        tally.injected += 1;
        self.deaths_expected += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
        match self.launch.spawn(role, host) {
            Ok(fresh) => {
                let (old, _) = std::mem::replace(&mut self.nodes[index].1, fresh);
                self.killed.push(old);
            }
            Err(e) => self
                .failures
                .push(format!("could not restart a {role}: {e}")),
        }
    }

    /// Runs one step of the plan.
    async fn step(&mut self, step: Step, timeout: Duration) {
        let fault = step.fault;
        if step.long {
            return self.long_partition(step.host, fault, timeout).await;
        }
        let name = match fault {
            Fault::Loss { .. } => format!("{fault}"),
            _ => format!("{fault} < timeout"),
        };
        println!(
            "vans-soak: host {}: {fault} for {:.1} s",
            step.host,
            step.lasts.as_secs_f64()
        );
        let injected = match self.launch.hosts.inject(step.host, fault) {
            Ok(injected) => injected,
            Err(e) => {
                self.failures.push(format!("could not inject {fault}: {e}"));
                return;
            }
        };
        let from = Instant::now();
        tokio::time::sleep(step.lasts).await;
        if let Err(e) = injected.heal() {
            self.failures.push(format!("could not heal {fault}: {e}"));
        }
        let to = Instant::now();
        let tally = self.tallies.entry(name.clone()).or_default();
        tally.injected += 1;
        tally.under += to - from;
        self.windows.push((name, from, to));
    }

    /// Cuts `host` off for longer than the heartbeat timeout: its nodes must be declared
    /// dead within the timeout and one heartbeat, replacements started elsewhere must join,
    /// and once the cut heals the old processes must exit, told they were replaced.
    async fn long_partition(&mut self, host: usize, fault: Fault, timeout: Duration) {
        let cut: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].1 .1 == host)
            .collect();
        println!(
            "vans-soak: host {host}: {fault} longer than the heartbeat timeout ({} nodes there)",
            cut.len()
        );
        let deaths_before = self.deaths.count();
        let injected = match self.launch.hosts.inject(host, fault) {
            Ok(injected) => injected,
            Err(e) => {
                self.failures
                    .push(format!("could not cut host {host}: {e}"));
                return;
            }
        };
        let from = Instant::now();
        self.deaths_expected += cut.len();
        // Declared dead within the timeout and one heartbeat (and a tick's slack).
        let bound =
            timeout + Duration::from_secs(HEARTBEAT_INTERVAL_SECS) + Duration::from_millis(500);
        let deaths = &mut self.deaths;
        let detected = within(from, bound + Duration::from_secs(10), || {
            deaths.count() >= deaths_before + cut.len()
        })
        .await;
        let tally = self
            .tallies
            .entry(format!("{fault} > timeout"))
            .or_default();
        tally.injected += 1;
        match detected {
            Some(took) => {
                println!(
                    "vans-soak: host {host}'s {} nodes declared dead {:.2} s after the cut",
                    cut.len(),
                    took.as_secs_f64()
                );
                tally.detection.push(took);
                if took > bound {
                    self.failures.push(format!(
                        "host {host}'s nodes were declared dead after {took:?}, beyond the \
                         timeout and one heartbeat ({bound:?})"
                    ));
                }
            }
            None => self.failures.push(format!(
                "host {host} was cut off for {:?} and its nodes were not declared dead",
                from.elapsed()
            )),
        }
        // Replacements elsewhere, as an orchestrator would start them: on host 0, or with
        // `--replace-across` on the other of hosts 1 and 2 (so that a later cut of that host
        // replaces them again).
        let elsewhere = if self.launch.o.replace_across {
            3 - host
        } else {
            0
        };
        let declared = Instant::now();
        let ready_before = self.launch.ready.load(Ordering::Relaxed);
        let mut old = Vec::new();
        for &index in &cut {
            let role = self.nodes[index].0;
            match self.launch.spawn(role, elsewhere) {
                Ok(fresh) => old.push(std::mem::replace(&mut self.nodes[index].1, fresh).0),
                Err(e) => self
                    .failures
                    .push(format!("could not start a replacement {role}: {e}")),
            }
        }
        let ready = &self.launch.ready;
        let recovered = within(declared, Duration::from_secs(30), || {
            ready.load(Ordering::Relaxed) >= ready_before + old.len()
        })
        .await;
        let tally = self
            .tallies
            .entry(format!("{fault} > timeout"))
            .or_default();
        match recovered {
            Some(took) => {
                println!(
                    "vans-soak: {} replacements joined {:.2} s after the declaration",
                    old.len(),
                    took.as_secs_f64()
                );
                tally.recovery.push(took);
            }
            None => self.failures.push(format!(
                "the replacements of host {host}'s nodes did not join within 30 s"
            )),
        }
        // The old processes stay cut off a little longer, then come back as zombies.
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Err(e) = injected.heal() {
            self.failures
                .push(format!("could not heal host {host}: {e}"));
        }
        let healed = Instant::now();
        let name = format!("{fault} > timeout");
        self.tallies.entry(name.clone()).or_default().under += healed - from;
        self.windows.push((name, from, healed));
        println!(
            "vans-soak: host {host} healed; {} old processes there",
            old.len()
        );
        self.zombies
            .extend(old.into_iter().map(|running| Zombie { running, healed }));
    }
}

/// How long after `from` `done` came true, looking every 50 ms until `limit` after `from`.
async fn within(
    from: Instant,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> Option<Duration> {
    while from.elapsed() < limit {
        if done() {
            return Some(from.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The scheduler's declarations of death, read from its log as it grows (only what was
/// appended since the last look is read).
struct Deaths {
    log: PathBuf,
    /// Bytes of the log read so far (whole lines only).
    read: u64,
    /// Node ids declared dead in them (the `dead=[..]` lists).
    ids: usize,
}

impl Deaths {
    fn new(log: PathBuf) -> Deaths {
        Deaths {
            log,
            read: 0,
            ids: 0,
        }
    }

    /// How many node ids the scheduler has declared dead so far.
    fn count(&mut self) -> usize {
        use std::io::{Read, Seek, SeekFrom};
        let mut appended = Vec::new();
        let read = std::fs::File::open(&self.log).and_then(|mut file| {
            file.seek(SeekFrom::Start(self.read))?;
            file.read_to_end(&mut appended)
        });
        if read.is_err() {
            return self.ids;
        }
        // A line still being written is read next time.
        let whole = appended
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1);
        self.read += whole as u64;
        let text = String::from_utf8_lossy(&appended[..whole]);
        self.ids += text
            .lines()
            .filter(|l| l.contains(DEATH_WORDS))
            .map(|l| {
                l.split_once("dead=[")
                    .and_then(|(_, rest)| rest.split_once(']'))
                    .map_or(1, |(ids, _)| {
                        ids.split(',').filter(|s| !s.trim().is_empty()).count()
                    })
            })
            .sum::<usize>();
        self.ids
    }
}

/// Waits for the zombies and the nodes, checks the zombies were fenced, and reports.
fn finish_run(o: &Options, mut chaos: Chaos<'_>, timeout: Duration) -> Result<(), BoxError> {
    let mut failures = std::mem::take(&mut chaos.failures);
    // Every zombie exits, told it was replaced.
    let mut fenced = 0;
    for zombie in &mut chaos.zombies {
        let deadline = zombie.healed + ZOMBIE_EXIT;
        let status = loop {
            match zombie.running.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = zombie.running.child.kill();
                    let _ = zombie.running.child.wait();
                    break None;
                }
            }
        };
        let log = std::fs::read_to_string(&zombie.running.log).unwrap_or_default();
        match status {
            Some(status) if !status.success() && log.contains(ZOMBIE_WORDS) => fenced += 1,
            Some(status) => failures.push(format!(
                "zombie {} exited ({status}) without saying it was replaced",
                zombie.running.name
            )),
            None => failures.push(format!(
                "zombie {} was still running {ZOMBIE_EXIT:?} after its partition healed",
                zombie.running.name
            )),
        }
    }
    let deaths = chaos.deaths.count();
    if deaths > chaos.deaths_expected {
        failures.push(format!(
            "the scheduler declared {deaths} nodes dead; the kills and long partitions explain \
             {}: a live node was declared dead",
            chaos.deaths_expected
        ));
    }
    let ticks = chaos
        .launch
        .ticks
        .lock()
        .map(|t| t.clone())
        .unwrap_or_default();
    let zombies: Vec<Running> = chaos.zombies.into_iter().map(|z| z.running).collect();
    let killed: Vec<Running> = chaos.killed.into_iter().chain(zombies).collect();
    let nodes: Vec<Running> = chaos.nodes.into_iter().map(|(_, (r, _))| r).collect();
    let outcome = finish(nodes, killed, failures);
    // The table: fault kind, injected, time under it, worker rounds per second under it.
    println!("vans-soak: fault                              injected  under (s)  rounds/s  detection (s)  recovery (s)");
    let rate = |windows: &[(Instant, Instant)]| -> Option<f64> { rounds_rate(&ticks, windows) };
    let mut clean: Vec<(Instant, Instant)> = Vec::new();
    if let (Some(first), Some(last)) = (ticks.first(), ticks.last()) {
        // Loss-free: the times no fault was in force.
        let mut faults: Vec<(Instant, Instant)> =
            chaos.windows.iter().map(|(_, a, b)| (*a, *b)).collect();
        faults.sort();
        let mut at = first.0;
        for (a, b) in faults {
            if a > at {
                clean.push((at, a));
            }
            at = at.max(b);
        }
        if last.0 > at {
            clean.push((at, last.0));
        }
    }
    let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
    println!(
        "vans-soak: {:<34} {:>8}  {:>9}  {:>8}",
        "none",
        "-",
        format!(
            "{:.1}",
            clean
                .iter()
                .map(|(a, b)| (*b - *a).as_secs_f64())
                .sum::<f64>()
        ),
        fmt(rate(&clean))
    );
    for (kind, tally) in &chaos.tallies {
        let windows: Vec<(Instant, Instant)> = chaos
            .windows
            .iter()
            .filter(|(k, _, _)| k == kind)
            .map(|(_, a, b)| (*a, *b))
            .collect();
        let list = |d: &[Duration]| {
            if d.is_empty() {
                "-".to_owned()
            } else {
                d.iter()
                    .map(|d| format!("{:.2}", d.as_secs_f64()))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        };
        println!(
            "vans-soak: {kind:<34} {:>8}  {:>9.1}  {:>8}  {:>13}  {:>12}",
            tally.injected,
            tally.under.as_secs_f64(),
            fmt(rate(&windows)),
            list(&tally.detection),
            list(&tally.recovery)
        );
    }
    println!(
        "vans-soak: zombies fenced {fenced}; nodes declared dead {deaths} (expected {}); \
         heartbeat timeout {timeout:?}",
        chaos.deaths_expected
    );
    verify(o, outcome?)
}

/// The workers' rounds per second within `windows`, from their progress ticks.
fn rounds_rate(ticks: &[(Instant, usize, u64)], windows: &[(Instant, Instant)]) -> Option<f64> {
    let secs: f64 = windows.iter().map(|(a, b)| (*b - *a).as_secs_f64()).sum();
    if secs < 0.5 {
        return None;
    }
    // Each process's rounds between consecutive ticks, counted where the later tick falls.
    let mut last: BTreeMap<usize, u64> = BTreeMap::new();
    let mut rounds = 0u64;
    for &(at, process, count) in ticks {
        let before = last.insert(process, count).unwrap_or(0);
        if windows.iter().any(|(a, b)| at >= *a && at < *b) {
            rounds += count.saturating_sub(before);
        }
    }
    Some(rounds as f64 / secs)
}
