//! A local launcher: one scheduler, `S` servers and `W` workers as child processes of this one,
//! in the manner of dmlc-tracker's `local` launcher.
//!
//! Every node runs the same program with the same arguments; what tells them apart is the
//! ps-lite environment the launcher adds to the inherited one:
//!
//! | variable | value |
//! | --- | --- |
//! | `DMLC_ROLE` | `scheduler`, `server` or `worker` |
//! | `DMLC_NUM_SERVER` | [`LaunchSpec::num_servers`] |
//! | `DMLC_NUM_WORKER` | [`LaunchSpec::num_workers`] |
//! | `DMLC_PS_ROOT_URI` | [`LaunchSpec::root_uri`] |
//! | `DMLC_PS_ROOT_PORT` | [`LaunchSpec::root_port`], or a free port when that is 0 |
//! | `DMLC_NODE_HOST` | `127.0.0.1`, only when the root URI is a loopback address or `localhost` |
//! | `VANS_LAUNCH_RANK` | the node's rank within its role, from 0 (informational only) |
//!
//! then [`LaunchSpec::env`] (which may override `DMLC_NODE_HOST` or add `PS_VERBOSE`,
//! `DMLC_ENABLE_RDMA`, ...). The scheduler starts first, then the servers, then the workers.
//!
//! Each line a node writes is printed by the launcher with the node's name in front
//! (`[scheduler] `, `[server 0] `, `[worker 2] `): its stdout lines on the launcher's stdout,
//! its stderr lines on the launcher's stderr, as they arrive. The launcher's own messages go
//! to stderr behind `[launcher] `.
//!
//! The job succeeds when every node exits with code 0. When a node fails (non-zero code or a
//! signal), when [`LaunchSpec::timeout`] passes, or when the launcher gets SIGINT or SIGTERM,
//! the launcher stops every other node (after a node failed, only once the others have had
//! [`SETTLE`] to exit by themselves and report what they saw), SIGTERM first and SIGKILL after
//! [`LaunchSpec::grace`], waits for all of them, and reports the first cause. A SIGINT or
//! SIGTERM while nodes are being stopped skips the grace period.
//!
//! Which processes are stopped:
//!
//! - Each node leads its own process group, and the launcher signals the whole group, so a
//!   node that is a shell script (`sh -c 'setup; ./ps-bench'`) goes with everything it
//!   started. Whatever is still in a node's group when the node exits, even with code 0, is
//!   SIGKILLed then. Processes that leave the group (`setsid`, daemons) are not followed.
//! - Because the nodes are not in the terminal's foreground group, a Ctrl-C reaches only the
//!   launcher, which stops the nodes in the order above.
//! - On Linux each node is started with `PR_SET_PDEATHSIG = SIGKILL`, so the nodes die even
//!   when the launcher itself is SIGKILLed; what they started survives in that case only.
//!   Dropping the [`launch`] future SIGKILLs the nodes too.
//!
//! ```no_run
//! use std::time::Duration;
//! use launcher::{launch, LaunchSpec};
//!
//! # async fn run() -> Result<(), launcher::LaunchError> {
//! let mut spec = LaunchSpec::new(2, 3, "target/release/ps-bench");
//! spec.args = vec!["--quick".into()];
//! spec.env.push(("PS_VERBOSE".into(), "1".into()));
//! spec.timeout = Some(Duration::from_secs(600));
//! let report = launch(&spec).await?;
//! assert_eq!(report.nodes.len(), 6);
//! # Ok(())
//! # }
//! ```
//!
//! The `vans-launch` binary in `examples` wraps this crate in a command line. It is a crate of
//! its own so that the parameter server (`ps`) does not need tokio's `process` and `signal`:
//! the launcher decides where processes run, `ps` only reads the configuration it hands out.
#![cfg(unix)]

use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, TcpListener, ToSocketAddrs};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};
use van_core::Role;

/// The root URI used when none is given.
pub const DEFAULT_ROOT_URI: &str = "127.0.0.1";

/// After a node fails, how long the others may run on before they are stopped: long enough
/// to notice the failure themselves and say so.
pub const SETTLE: Duration = Duration::from_secs(2);

/// How long a node has between SIGTERM and SIGKILL when the launcher stops it.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);

/// The most nodes one local launch starts (scheduler included).
pub const MAX_NODES: u32 = 1024;

/// A line of node output longer than this is printed in pieces of this many bytes.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// After the last node exits, how long the launcher keeps printing output still in its pipes
/// (a grandchild that inherited them could otherwise keep the launcher waiting forever).
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// Variables the launcher sets itself; [`LaunchSpec::env`] may not name them.
const RESERVED_ENV: [(&str, &str); 6] = [
    ("DMLC_ROLE", "the launcher sets it per node"),
    ("DMLC_NUM_SERVER", "set num_servers (--servers) instead"),
    ("DMLC_NUM_WORKER", "set num_workers (--workers) instead"),
    ("DMLC_PS_ROOT_URI", "set root_uri (--uri) instead"),
    ("DMLC_PS_ROOT_PORT", "set root_port (--port) instead"),
    ("VANS_LAUNCH_RANK", "the launcher sets it per node"),
];

/// What to launch: how many nodes of each role, which program, and how long to allow.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// How many servers (`DMLC_NUM_SERVER`).
    pub num_servers: u32,
    /// How many workers (`DMLC_NUM_WORKER`).
    pub num_workers: u32,
    /// The program every node runs.
    pub program: PathBuf,
    /// Its arguments, the same for every node.
    pub args: Vec<String>,
    /// Extra environment for every node, applied after the inherited environment and the
    /// launcher's common `DMLC_*` variables.
    pub env: Vec<(String, String)>,
    /// The scheduler's address (`DMLC_PS_ROOT_URI`); [`DEFAULT_ROOT_URI`] by default.
    pub root_uri: String,
    /// The scheduler's port (`DMLC_PS_ROOT_PORT`); 0 picks a free port on `root_uri`.
    pub root_port: u16,
    /// Stop every node and fail with [`LaunchError::Timeout`] if the job runs longer.
    pub timeout: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when nodes are stopped; [`DEFAULT_GRACE`] by default.
    pub grace: Duration,
    /// Handle SIGINT and SIGTERM sent to this process (true by default). Once handled, tokio
    /// keeps those signals from terminating the process even after [`launch`] returns, so
    /// embedders with their own signal policy set this to false.
    pub handle_signals: bool,
}

impl LaunchSpec {
    /// A spec with the defaults: no arguments, no extra environment, root on
    /// `127.0.0.1` at a free port, no timeout, [`DEFAULT_GRACE`], signals handled.
    pub fn new(num_servers: u32, num_workers: u32, program: impl Into<PathBuf>) -> Self {
        LaunchSpec {
            num_servers,
            num_workers,
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            root_uri: DEFAULT_ROOT_URI.to_owned(),
            root_port: 0,
            timeout: None,
            grace: DEFAULT_GRACE,
            handle_signals: true,
        }
    }

    /// Every node in start order: the scheduler, the servers, the workers, with their ranks.
    fn nodes(&self) -> impl Iterator<Item = (Role, u32)> {
        std::iter::once((Role::Scheduler, 0))
            .chain((0..self.num_servers).map(|rank| (Role::Server, rank)))
            .chain((0..self.num_workers).map(|rank| (Role::Worker, rank)))
    }

    fn validate(&self) -> Result<(), LaunchError> {
        let total = u64::from(self.num_servers) + u64::from(self.num_workers) + 1;
        if total > u64::from(MAX_NODES) {
            return Err(LaunchError::InvalidSpec(format!(
                "{total} nodes requested; a local launch starts at most {MAX_NODES}"
            )));
        }
        if self.program.as_os_str().is_empty() {
            return Err(LaunchError::InvalidSpec("no program given".into()));
        }
        if self.root_uri.is_empty() {
            return Err(LaunchError::InvalidSpec("the root URI is empty".into()));
        }
        for (key, value) in &self.env {
            if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
                return Err(LaunchError::InvalidSpec(format!(
                    "invalid environment entry {key:?}={value:?}: names must be non-empty \
                     without '=' and neither may contain NUL"
                )));
            }
            if let Some((_, hint)) = RESERVED_ENV.iter().find(|(name, _)| name == key) {
                return Err(LaunchError::InvalidSpec(format!(
                    "{key} cannot be set: {hint}"
                )));
            }
        }
        Ok(())
    }
}

/// How one node ended.
#[derive(Debug, Clone)]
pub struct NodeExit {
    /// The node's role.
    pub role: Role,
    /// Its rank within the role (`VANS_LAUNCH_RANK`).
    pub rank: u32,
    /// Its process id.
    pub pid: u32,
    /// How it exited: [`ExitStatus::code`], or [`ExitStatusExt::signal`] when killed.
    pub status: ExitStatus,
    /// Whether the launcher had asked it to stop before it exited.
    pub stopped_by_launcher: bool,
}

/// A job in which every node exited with code 0.
#[derive(Debug, Clone)]
pub struct LaunchReport {
    /// Every node, in start order (scheduler, servers, workers).
    pub nodes: Vec<NodeExit>,
    /// From the first spawn to the last exit.
    pub elapsed: Duration,
}

/// Why a launch failed. In every case all nodes that were started have been stopped and
/// reaped by the time the error is returned.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The spec cannot be launched; the message names the field to fix.
    #[error("invalid launch spec: {0}")]
    InvalidSpec(String),
    /// A node could not be started (program missing or not executable, too many processes).
    #[error(
        "could not start {node} ({program}): {source}",
        node = NodeName(*.role, *.rank),
        program = .program.display()
    )]
    Spawn {
        /// The node's role.
        role: Role,
        /// Its rank within the role.
        rank: u32,
        /// The program.
        program: PathBuf,
        /// What `spawn` said.
        source: io::Error,
    },
    /// The first node that failed, e.g. "server 1 exited with code 3"; look at its prefixed
    /// output above for the reason.
    #[error("{node} {status}", node = NodeName(*.role, *.rank))]
    NodeFailed {
        /// The node's role.
        role: Role,
        /// Its rank within the role.
        rank: u32,
        /// Its process id.
        pid: u32,
        /// How it ended: "exited with code 3", "was killed by signal 11 (SIGSEGV)".
        status: String,
    },
    /// The job ran longer than [`LaunchSpec::timeout`].
    #[error(
        "the job ran longer than its {:.1} s timeout; all nodes were stopped",
        .0.as_secs_f64()
    )]
    Timeout(Duration),
    /// The launcher got SIGINT or SIGTERM (named here).
    #[error("interrupted by {0}; all nodes were stopped")]
    Interrupted(&'static str),
    /// A system call of the launcher itself failed; `context` says which.
    #[error("{context}: {source}")]
    Io {
        /// What the launcher was doing.
        context: String,
        /// The error.
        source: io::Error,
    },
}

/// A node's name in messages and output prefixes: `scheduler`, `server 0`, `worker 2`.
#[derive(Debug, Clone, Copy)]
struct NodeName(Role, u32);

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Role::Scheduler => f.write_str("scheduler"),
            role => write!(f, "{role} {}", self.1),
        }
    }
}

/// What the launcher asks of the running nodes; only ever increases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum StopLevel {
    Run,
    /// SIGTERM now, SIGKILL after the grace period.
    Terminate,
    /// SIGKILL now.
    Kill,
}

/// Why the launcher is stopping the job.
enum Cause {
    Spawn(LaunchError),
    Failed(NodeExit),
    Timeout(Duration),
    Signal(&'static str),
}

/// A supervisor's report: the node at `index` is gone.
struct Exited {
    index: usize,
    result: io::Result<ExitStatus>,
    stopped_by_launcher: bool,
    /// Processes were left in the node's group after it exited, and were killed.
    killed_leftovers: bool,
}

/// Starts the nodes of `spec`, prints their output, and waits for all of them; see the
/// [module documentation](self) for the environment, output and failure handling.
///
/// The nodes are spawned from the thread that polls this future. Their Linux parent-death
/// signal is tied to that thread, so poll it from a thread that outlives the job (the thread
/// of `block_on`, a runtime worker), not from `spawn_blocking`. Dropping the future SIGKILLs
/// every node.
pub async fn launch(spec: &LaunchSpec) -> Result<LaunchReport, LaunchError> {
    spec.validate()?;
    let port = match spec.root_port {
        0 => free_port(&spec.root_uri)?,
        port => port,
    };
    // Installed before the first spawn, so a Ctrl-C while spawning still stops every node.
    let mut signals = match spec.handle_signals {
        true => Some(Signals::install()?),
        false => None,
    };
    say(format_args!(
        "launching 1 scheduler, {}, {} on {}:{port}: {}",
        plural(spec.num_servers, "server"),
        plural(spec.num_workers, "worker"),
        spec.root_uri,
        command_line(spec)
    ));
    let (mut job, mut exits) = Job::start(spec, port);
    let deadline = spec.timeout.map(|timeout| (job.start + timeout, timeout));
    while job.remaining > 0 {
        tokio::select! {
            biased;
            name = next_signal(&mut signals) => job.on_signal(name),
            _ = sleep_until(deadline.map_or(job.start, |(at, _)| at)),
                if deadline.is_some() && job.cause.is_none() =>
            {
                job.stop(Cause::Timeout(deadline.map_or(Duration::ZERO, |(_, timeout)| timeout)));
            }
            _ = sleep_until(job.settle_until.unwrap_or(job.start)), if job.settle_until.is_some() => {
                job.settled();
            }
            exited = exits.recv() => match exited {
                Some(exited) => job.on_exit(exited)?,
                None => break,
            },
        }
    }
    job.finish().await
}

/// The running nodes and what has happened to them.
struct Job {
    start: Instant,
    /// Role, rank and pid of each started node, in start order.
    started: Vec<(Role, u32, u32)>,
    exits: Vec<Option<NodeExit>>,
    remaining: usize,
    /// Why the job is being stopped; `None` while it runs normally.
    cause: Option<Cause>,
    stop: watch::Sender<StopLevel>,
    /// After a node failed: when the others get SIGTERM if they have not exited by then.
    settle_until: Option<Instant>,
    // JoinSets abort their tasks when dropped, so a dropped `launch` drops every `Child`,
    // and `kill_on_drop` SIGKILLs it (the node only, not what it started).
    supervisors: JoinSet<()>,
    forwarders: JoinSet<()>,
}

impl Job {
    /// Spawns the nodes in order; stops at the first that cannot be spawned.
    fn start(spec: &LaunchSpec, port: u16) -> (Job, mpsc::Receiver<Exited>) {
        let total = spec.nodes().count();
        let (stop, stop_rx) = watch::channel(StopLevel::Run);
        // One slot per node: each supervisor sends exactly once, so sends never wait.
        let (exit_tx, exit_rx) = mpsc::channel(total);
        let mut job = Job {
            start: Instant::now(),
            started: Vec::with_capacity(total),
            exits: Vec::with_capacity(total),
            remaining: 0,
            cause: None,
            settle_until: None,
            stop,
            supervisors: JoinSet::new(),
            forwarders: JoinSet::new(),
        };
        for (role, rank) in spec.nodes() {
            let mut child = match node_command(spec, role, rank, port).spawn() {
                Ok(child) => child,
                Err(source) => {
                    let program = spec.program.clone();
                    job.stop(Cause::Spawn(LaunchError::Spawn {
                        role,
                        rank,
                        program,
                        source,
                    }));
                    break;
                }
            };
            let prefix = format!("[{}] ", NodeName(role, rank));
            if let Some(stdout) = child.stdout.take() {
                job.forwarders
                    .spawn(forward_lines(stdout, prefix.clone(), Sink::Stdout));
            }
            if let Some(stderr) = child.stderr.take() {
                job.forwarders
                    .spawn(forward_lines(stderr, prefix, Sink::Stderr));
            }
            let index = job.started.len();
            job.started.push((role, rank, child.id().unwrap_or(0)));
            job.exits.push(None);
            job.remaining += 1;
            let (stop_rx, exit_tx) = (stop_rx.clone(), exit_tx.clone());
            job.supervisors
                .spawn(supervise(child, index, spec.grace, stop_rx, exit_tx));
        }
        (job, exit_rx)
    }

    /// Starts stopping every node for `cause`, unless a cause is already set.
    fn stop(&mut self, cause: Cause) {
        if self.cause.is_some() {
            return;
        }
        let remaining = plural_count(self.remaining, "node");
        match &cause {
            Cause::Spawn(error) if self.remaining == 0 => say(format_args!("{error}")),
            Cause::Spawn(error) => say(format_args!(
                "{error}; stopping the {remaining} already started"
            )),
            Cause::Failed(exit) => say(format_args!(
                "{} {}; stopping the other {remaining} (after {:.1} s for them to report what \
                 they saw)",
                NodeName(exit.role, exit.rank),
                describe(exit.status),
                SETTLE.as_secs_f64()
            )),
            Cause::Timeout(timeout) => say(format_args!(
                "the job ran longer than its {:.1} s timeout; stopping {remaining}",
                timeout.as_secs_f64()
            )),
            Cause::Signal(name) => say(format_args!(
                "got {name}; stopping {remaining} (send it again to kill them at once)"
            )),
        }
        let settle = matches!(cause, Cause::Failed(_));
        self.cause = Some(cause);
        if settle {
            // Peers of a failed node usually fail on their own a moment later, naming it;
            // stopping them at once would lose those messages.
            self.settle_until = Some(Instant::now() + SETTLE);
        } else {
            self.stop.send_replace(StopLevel::Terminate);
        }
    }

    /// The settle time after a failure is over: stop whoever is left.
    fn settled(&mut self) {
        self.settle_until = None;
        self.stop.send_replace(StopLevel::Terminate);
    }

    fn on_signal(&mut self, name: &'static str) {
        if self.cause.is_none() {
            self.stop(Cause::Signal(name));
        } else if self.settle_until.is_some() {
            say(format_args!("got {name}; stopping the nodes now"));
            self.settled();
        } else if *self.stop.borrow() < StopLevel::Kill {
            let remaining = plural_count(self.remaining, "node");
            say(format_args!(
                "got {name} while stopping; killing {remaining} at once"
            ));
            self.stop.send_replace(StopLevel::Kill);
        }
    }

    fn on_exit(&mut self, exited: Exited) -> Result<(), LaunchError> {
        let Some(&(role, rank, pid)) = self.started.get(exited.index) else {
            return Ok(());
        };
        let status = exited.result.map_err(|source| {
            // Cannot happen for our own child; the JoinSets kill the rest when dropped.
            self.stop.send_replace(StopLevel::Kill);
            let context = format!("could not wait for {} (pid {pid})", NodeName(role, rank));
            LaunchError::Io { context, source }
        })?;
        self.remaining -= 1;
        let stopped_by_launcher = exited.stopped_by_launcher;
        // (When the launcher stopped the node, its group got the same signals already.)
        if exited.killed_leftovers && !stopped_by_launcher {
            let name = NodeName(role, rank);
            say(format_args!(
                "killed processes that {name} left running in its process group"
            ));
        }
        let exit = NodeExit {
            role,
            rank,
            pid,
            status,
            stopped_by_launcher,
        };
        if !status.success() && !stopped_by_launcher {
            match self.cause {
                None => self.stop(Cause::Failed(exit.clone())),
                Some(_) => say(format_args!(
                    "{} {}",
                    NodeName(role, rank),
                    describe(status)
                )),
            }
        }
        self.exits[exited.index] = Some(exit);
        Ok(())
    }

    /// Collects the tasks once every node has exited, and turns the cause into the result.
    async fn finish(mut self) -> Result<LaunchReport, LaunchError> {
        // Every supervisor has reported, so every node has been reaped.
        while self.supervisors.join_next().await.is_some() {}
        // Print what is still in the pipes, unless a grandchild holds one open.
        let forwarders = &mut self.forwarders;
        let drained = tokio::time::timeout(OUTPUT_DRAIN, async {
            while forwarders.join_next().await.is_some() {}
        });
        if drained.await.is_err() {
            say(format_args!(
                "a node's output is held open (by a grandchild?); no longer printing it"
            ));
            self.forwarders.abort_all();
        }
        let elapsed = self.start.elapsed();
        let nodes: Vec<NodeExit> = self.exits.into_iter().flatten().collect();
        let secs = elapsed.as_secs_f64();
        let Some(cause) = self.cause else {
            say(format_args!(
                "all {} nodes exited 0 in {secs:.1} s",
                nodes.len()
            ));
            return Ok(LaunchReport { nodes, elapsed });
        };
        if !nodes.is_empty() {
            let count = nodes.len();
            let stopped = nodes.iter().filter(|node| node.stopped_by_launcher).count();
            say(format_args!(
                "all {count} started nodes have exited ({stopped} stopped by the launcher) \
                 after {secs:.1} s"
            ));
        }
        Err(match cause {
            Cause::Spawn(error) => error,
            Cause::Failed(exit) => LaunchError::NodeFailed {
                role: exit.role,
                rank: exit.rank,
                pid: exit.pid,
                status: describe(exit.status),
            },
            Cause::Timeout(timeout) => LaunchError::Timeout(timeout),
            Cause::Signal(name) => LaunchError::Interrupted(name),
        })
    }
}

/// The command that starts one node.
fn node_command(spec: &LaunchSpec, role: Role, rank: u32, port: u16) -> Command {
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .env("DMLC_NUM_SERVER", spec.num_servers.to_string())
        .env("DMLC_NUM_WORKER", spec.num_workers.to_string())
        .env("DMLC_PS_ROOT_URI", &spec.root_uri)
        .env("DMLC_PS_ROOT_PORT", port.to_string());
    if is_loopback(&spec.root_uri) {
        command.env("DMLC_NODE_HOST", "127.0.0.1");
    }
    command
        .envs(spec.env.iter().map(|(key, value)| (key, value)))
        .env("DMLC_ROLE", role.as_str())
        .env("VANS_LAUNCH_RANK", rank.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group lets the launcher stop the node with everything it started,
        // and keeps a terminal's Ctrl-C to the launcher, which then stops the nodes in order.
        .process_group(0)
        .kill_on_drop(true);
    die_with_parent(&mut command);
    command
}

/// Has the kernel SIGKILL the node when the launcher dies, even by SIGKILL.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    let Ok(parent) = libc::pid_t::try_from(std::process::id()) else {
        return;
    };
    let hook = move || {
        // SAFETY: this runs in the forked child before exec, where only async-signal-safe
        // calls are allowed. prctl(2) and getppid(2) are plain system calls: they take
        // integers, take no locks and allocate nothing (getppid is on POSIX's
        // async-signal-safe list; prctl is Linux's equivalent syscall wrapper). Error values
        // are built from the raw errno without allocating.
        unsafe {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The launcher may have died between fork and prctl; then no signal would come.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        Ok(())
    };
    // SAFETY: `hook` only makes async-signal-safe system calls (see above) and touches no
    // memory shared with the parent, which is what `pre_exec` requires.
    unsafe {
        command.pre_exec(hook);
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut Command) {}

/// Owns one node: reaps it, and stops it when asked (SIGTERM, SIGKILL after `grace`). Signals
/// go to the node's process group, so what the node started goes with it.
async fn supervise(
    mut child: Child,
    index: usize,
    grace: Duration,
    mut stop: watch::Receiver<StopLevel>,
    exits: mpsc::Sender<Exited>,
) {
    let group = child.id().and_then(|pid| libc::pid_t::try_from(pid).ok());
    let (mut term_sent, mut kill_sent, mut launcher_gone) = (false, false, false);
    let mut kill_at = None;
    let result = loop {
        let level = *stop.borrow_and_update();
        if level >= StopLevel::Terminate && !term_sent {
            term_sent = true;
            signal_group(&child, libc::SIGTERM);
            kill_at = Some(Instant::now() + grace);
        }
        if (level == StopLevel::Kill || launcher_gone) && !kill_sent {
            kill_sent = true;
            signal_group(&child, libc::SIGKILL);
        }
        tokio::select! {
            result = child.wait() => break result,
            changed = stop.changed(), if !launcher_gone => launcher_gone = changed.is_err(),
            _ = sleep_until(kill_at.unwrap_or_else(Instant::now)),
                if kill_at.is_some() && !kill_sent =>
            {
                kill_sent = true;
                signal_group(&child, libc::SIGKILL);
            }
        }
    };
    let killed_leftovers = group.is_some_and(kill_leftovers);
    let stopped_by_launcher = term_sent || kill_sent;
    let exited = Exited {
        index,
        result,
        stopped_by_launcher,
        killed_leftovers,
    };
    // The channel holds one slot per node, so this never waits.
    let _ = exits.send(exited).await;
}

/// Sends `signal` to the process group the node leads: the node and whatever it started
/// that did not move to a group of its own.
fn signal_group(child: &Child, signal: libc::c_int) {
    let Some(pid) = child.id().and_then(|pid| libc::pid_t::try_from(pid).ok()) else {
        return;
    };
    // SAFETY: kill(2) takes integers and touches no memory of ours. `Child::id` is `Some` only
    // until the child is reaped, and only `supervise` reaps it, so `pid` is still our child
    // (perhaps a zombie): neither it nor its process group `-pid` (it called setpgid(0, 0)
    // before exec, and `spawn` returned after exec) can name another process.
    unsafe {
        if libc::kill(-pid, signal) != 0 {
            libc::kill(pid, signal);
        }
    }
}

/// SIGKILLs what is left in process group `group` after its leader was reaped, and says
/// whether anything was.
fn kill_leftovers(group: libc::pid_t) -> bool {
    // SAFETY: kill(2) takes integers and touches no memory of ours. While any process of the
    // group lives, Linux does not give its id to a new process, so `-group` can only reach
    // what our node left behind; an empty group fails with ESRCH. (Reaching a stranger would
    // need the pid counter to wrap around to `group` in the microseconds since the reap and
    // the new process to lead a group at once.)
    unsafe { libc::kill(-group, libc::SIGKILL) == 0 }
}

/// Where a node's output line goes.
#[derive(Debug, Clone)]
enum Sink {
    Stdout,
    Stderr,
    #[cfg(test)]
    Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>),
}

/// Prints each line of `pipe` with `prefix`, as it arrives; invalid UTF-8 becomes U+FFFD and
/// lines longer than [`MAX_LINE_BYTES`] are split.
async fn forward_lines(pipe: impl AsyncRead + Unpin, prefix: String, sink: Sink) {
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        let buffer = match reader.fill_buf().await {
            Ok(buffer) => buffer,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if buffer.is_empty() {
            break;
        }
        let room = MAX_LINE_BYTES - line.len();
        let (taken, complete) = match buffer.iter().take(room).position(|&byte| byte == b'\n') {
            Some(newline) => {
                line.extend_from_slice(&buffer[..newline]);
                (newline + 1, true)
            }
            None => {
                let taken = buffer.len().min(room);
                line.extend_from_slice(&buffer[..taken]);
                (taken, line.len() == MAX_LINE_BYTES)
            }
        };
        reader.consume(taken);
        if complete {
            print_line(&prefix, &line, &sink);
            line.clear();
        }
    }
    if !line.is_empty() {
        print_line(&prefix, &line, &sink);
    }
}

fn print_line(prefix: &str, line: &[u8], sink: &Sink) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut text = String::with_capacity(prefix.len() + line.len() + 1);
    text.push_str(prefix);
    text.push_str(&String::from_utf8_lossy(line));
    text.push('\n');
    // One write per line keeps lines of different nodes whole. A closed stdout or stderr
    // must not stop the node (its pipe would fill) nor the launcher, so errors are dropped.
    let _ = match sink {
        Sink::Stdout => io::stdout().lock().write_all(text.as_bytes()),
        Sink::Stderr => io::stderr().lock().write_all(text.as_bytes()),
        #[cfg(test)]
        Sink::Capture(buffer) => buffer
            .lock()
            .map(|mut buffer| buffer.extend_from_slice(text.as_bytes()))
            .map_err(|_| io::ErrorKind::Other.into()),
    };
}

/// Prints one of the launcher's own messages on stderr.
fn say(message: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "[launcher] {message}");
}

/// SIGINT and SIGTERM listeners.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    fn install() -> Result<Self, LaunchError> {
        let listen = |kind, name: &str| {
            signal(kind).map_err(|source| LaunchError::Io {
                context: format!("could not handle {name}"),
                source,
            })
        };
        Ok(Signals {
            interrupt: listen(SignalKind::interrupt(), "SIGINT")?,
            terminate: listen(SignalKind::terminate(), "SIGTERM")?,
        })
    }
}

/// The name of the next SIGINT or SIGTERM; never resolves when signals are not handled.
async fn next_signal(signals: &mut Option<Signals>) -> &'static str {
    let Some(signals) = signals else {
        return std::future::pending().await;
    };
    tokio::select! {
        Some(()) = signals.interrupt.recv() => "SIGINT",
        Some(()) = signals.terminate.recv() => "SIGTERM",
        else => std::future::pending().await,
    }
}

/// A port that was free on `uri` a moment ago: bind port 0, read the port, close.
fn free_port(uri: &str) -> Result<u16, LaunchError> {
    let io_error = |source| LaunchError::Io {
        context: format!("could not pick a free port on {uri} (set root_port / --port)"),
        source,
    };
    let address = (uri, 0)
        .to_socket_addrs()
        .map_err(io_error)?
        .next()
        .ok_or_else(|| io_error(io::Error::new(io::ErrorKind::NotFound, "no address")))?;
    let listener = TcpListener::bind(address).map_err(io_error)?;
    Ok(listener.local_addr().map_err(io_error)?.port())
}

fn is_loopback(uri: &str) -> bool {
    uri.eq_ignore_ascii_case("localhost") || uri.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// "exited with code 3", "was killed by signal 9 (SIGKILL)".
fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    let Some(number) = status.signal() else {
        return format!("ended with status {status}");
    };
    let core = if status.core_dumped() {
        ", core dumped"
    } else {
        ""
    };
    match signal_name(number) {
        Some(name) => format!("was killed by signal {number} ({name}{core})"),
        None => format!("was killed by signal {number}{core}"),
    }
}

fn signal_name(number: i32) -> Option<&'static str> {
    Some(match number {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => return None,
    })
}

fn plural(count: u32, noun: &str) -> String {
    plural_count(count as usize, noun)
}

fn plural_count(count: usize, noun: &str) -> String {
    match count {
        1 => format!("1 {noun}"),
        _ => format!("{count} {noun}s"),
    }
}

/// The program and its arguments as a shell would need them typed.
fn command_line(spec: &LaunchSpec) -> String {
    let program = spec.program.to_string_lossy();
    std::iter::once(program.as_ref())
        .chain(spec.args.iter().map(String::as_str))
        .map(shell_quote)
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(script: &str) -> ExitStatus {
        match std::process::Command::new("/bin/sh")
            .args(["-c", script])
            .status()
        {
            Ok(status) => status,
            Err(error) => panic!("/bin/sh: {error}"),
        }
    }

    #[test]
    fn node_names_and_statuses_read_like_sentences() {
        assert_eq!(NodeName(Role::Scheduler, 0).to_string(), "scheduler");
        assert_eq!(NodeName(Role::Server, 1).to_string(), "server 1");
        assert_eq!(describe(status_of("exit 3")), "exited with code 3");
        assert_eq!(
            describe(status_of("kill -9 $$")),
            "was killed by signal 9 (SIGKILL)"
        );
        let error = LaunchError::NodeFailed {
            role: Role::Server,
            rank: 1,
            pid: 42,
            status: describe(status_of("exit 3")),
        };
        assert_eq!(error.to_string(), "server 1 exited with code 3");
    }

    #[test]
    fn spec_rejects_what_the_launcher_owns() {
        let mut spec = LaunchSpec::new(1, 1, "/bin/true");
        assert!(spec.validate().is_ok());
        spec.env.push(("DMLC_NUM_WORKER".into(), "4".into()));
        let message = spec
            .validate()
            .map_err(|error| error.to_string())
            .err()
            .unwrap_or_default();
        assert!(message.contains("--workers"), "{message}");
        spec.env = vec![("A=B".into(), "1".into())];
        assert!(spec.validate().is_err());
        spec.env.clear();
        spec.num_workers = MAX_NODES;
        assert!(spec.validate().is_err());
    }

    #[test]
    fn nodes_start_scheduler_then_servers_then_workers() {
        let spec = LaunchSpec::new(2, 1, "/bin/true");
        let nodes: Vec<_> = spec.nodes().collect();
        assert_eq!(
            nodes,
            [
                (Role::Scheduler, 0),
                (Role::Server, 0),
                (Role::Server, 1),
                (Role::Worker, 0)
            ]
        );
    }

    #[test]
    fn the_command_line_is_shown_as_it_would_be_typed() {
        let mut spec = LaunchSpec::new(1, 1, "/bin/sh");
        spec.args = vec!["-c".into(), "echo it's $DMLC_ROLE".into(), String::new()];
        assert_eq!(
            command_line(&spec),
            r#"/bin/sh -c 'echo it'\''s $DMLC_ROLE' ''"#
        );
    }

    #[test]
    fn free_port_and_loopback() {
        assert!(free_port("127.0.0.1").is_ok_and(|port| port != 0));
        assert!(is_loopback("127.0.0.1") && is_loopback("localhost") && is_loopback("::1"));
        assert!(!is_loopback("10.0.0.2"));
    }

    #[tokio::test]
    async fn launch_runs_every_node_and_reports_the_first_failure() {
        let mut spec = LaunchSpec::new(2, 2, "/bin/sh");
        spec.handle_signals = false;
        spec.args = vec!["-c".into(), "echo $DMLC_ROLE $VANS_LAUNCH_RANK".into()];
        let report = launch(&spec).await;
        assert!(
            report.as_ref().is_ok_and(|report| report.nodes.len() == 5),
            "{report:?}"
        );

        spec.grace = Duration::from_millis(200);
        spec.args = vec![
            "-c".into(),
            r#"[ "$DMLC_ROLE" = server ] && [ "$VANS_LAUNCH_RANK" = 1 ] && exit 3; exec sleep 60"#
                .into(),
        ];
        match launch(&spec).await {
            Err(LaunchError::NodeFailed {
                role: Role::Server,
                rank: 1,
                status,
                ..
            }) => {
                assert_eq!(status, "exited with code 3")
            }
            other => panic!("expected server 1 to fail, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_missing_program_is_a_spawn_error() {
        let mut spec = LaunchSpec::new(1, 1, "/nonexistent/vans-program");
        spec.handle_signals = false;
        let result = launch(&spec).await;
        assert!(
            matches!(
                result,
                Err(LaunchError::Spawn {
                    role: Role::Scheduler,
                    ..
                })
            ),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn lines_are_prefixed_split_when_long_and_decoded_lossily() {
        let (mut writer, reader) = tokio::io::duplex(1024);
        let captured = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Sink::Capture(captured.clone());
        let task = tokio::spawn(forward_lines(reader, "[worker 2] ".into(), sink));
        let mut data = b"first\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        data.extend_from_slice(b"\n\xff\xfe bad\r\n\nno newline");
        tokio::io::AsyncWriteExt::write_all(&mut writer, &data)
            .await
            .ok();
        drop(writer);
        assert!(task.await.is_ok());
        let text = captured.lock().map(|text| text.clone()).unwrap_or_default();
        let text = String::from_utf8(text).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let long = "x".repeat(MAX_LINE_BYTES);
        let expected = [
            "[worker 2] first".to_owned(),
            format!("[worker 2] {long}"),
            "[worker 2] xxxxxxxxxx".to_owned(),
            "[worker 2] \u{fffd}\u{fffd} bad".to_owned(),
            "[worker 2] ".to_owned(),
            "[worker 2] no newline".to_owned(),
        ];
        assert_eq!(lines, expected);
    }
}
