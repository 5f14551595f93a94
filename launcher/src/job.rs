//! The job: [`launch`] starts every node, then reacts to exits, the timeout, the settle time
//! after a failure and signals until every node is gone, and turns what happened into its
//! result.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};
use van_core::Role;

use crate::describe::{describe, plural, plural_count, NodeName};
use crate::node::{node_command, supervise, Exited, StopLevel};
use crate::outcome::{LaunchError, LaunchReport, NodeExit};
use crate::output::{forward_lines, say, Sink};
use crate::signals::{next_signal, Signals};
use crate::spec::{command_line, free_port, free_ports, tf_configs, LaunchSpec};

/// After a node fails, how long the others may run on before they are stopped: long enough
/// to notice the failure themselves and say so.
pub const SETTLE: Duration = Duration::from_secs(2);

/// After the last node exits, how long the launcher keeps printing output still in its pipes
/// (a grandchild that inherited them could otherwise keep the launcher waiting forever).
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// Why the launcher is stopping the job.
enum Cause {
    Spawn(LaunchError),
    Failed(NodeExit),
    Timeout(Duration),
    Signal(&'static str),
    /// TensorFlow: worker 0, the chief, exited 0, and the tasks left (ps tasks and workers
    /// that serve until stopped) are stopped. The job succeeded.
    ChiefDone,
}

/// Starts the nodes of `spec`, prints their output, and waits for all of them; see the
/// [crate documentation](crate) for the environment, output and failure handling.
///
/// The nodes are spawned from the thread that polls this future. Their Linux parent-death
/// signal is tied to that thread, so poll it from a thread that outlives the job (the thread
/// of `block_on`, a runtime worker), not from `spawn_blocking`. Dropping the future SIGKILLs
/// every node.
pub async fn launch(spec: &LaunchSpec) -> Result<LaunchReport, LaunchError> {
    spec.validate()?;
    // A TensorFlow job has no scheduler port: each task listens on its own.
    // The picked ports stay held until the job ends, so nobody else takes them before the
    // nodes bind them (see `HeldPorts`).
    let (port, tf_configs, _held) = match (spec.tensorflow, spec.root_port) {
        (true, _) => {
            let held = free_ports(&spec.root_uri, spec.nodes().count())?;
            let addresses: Vec<String> = held
                .ports()
                .iter()
                .map(|port| format!("{}:{port}", spec.root_uri))
                .collect();
            let (ps, workers) = addresses.split_at(spec.num_servers as usize);
            (0, tf_configs(ps, workers), Some(held))
        }
        (false, 0) => {
            let held = free_port(&spec.root_uri)?;
            (held.ports()[0], Vec::new(), Some(held))
        }
        (false, port) => (port, Vec::new(), None),
    };
    // Installed before the first spawn, so a Ctrl-C while spawning still stops every node.
    let mut signals = match spec.handle_signals {
        true => Some(Signals::install()?),
        false => None,
    };
    let (servers, workers) = (spec.num_servers, spec.num_workers);
    let nodes = match spec.tensorflow {
        true => format!(
            "TensorFlow tasks, {} and {} on {} (TF_CONFIG)",
            plural(servers, "ps task"),
            plural(workers, "worker task"),
            spec.root_uri
        ),
        false => format!(
            "1 scheduler, {}, {} on {}:{port}",
            plural(servers, "server"),
            plural(workers, "worker"),
            spec.root_uri
        ),
    };
    say(format_args!("launching {nodes}: {}", command_line(spec)));
    raise_fd_limit(spec);
    let (mut job, mut exits) = Job::start(spec, port, &tf_configs);
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
    /// A TensorFlow job, which ends when its chief (worker 0) does.
    tensorflow: bool,
    // JoinSets abort their tasks when dropped, so a dropped `launch` drops every `Child`,
    // and `kill_on_drop` SIGKILLs it (the node only, not what it started).
    supervisors: JoinSet<()>,
    forwarders: JoinSet<()>,
}

impl Job {
    /// Spawns the nodes in order; stops at the first that cannot be spawned.
    fn start(spec: &LaunchSpec, port: u16, tf_configs: &[String]) -> (Job, mpsc::Receiver<Exited>) {
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
            tensorflow: spec.tensorflow,
            stop,
            supervisors: JoinSet::new(),
            forwarders: JoinSet::new(),
        };
        for (index, (role, rank)) in spec.nodes().enumerate() {
            let tf_config = tf_configs.get(index).map(String::as_str);
            let mut child = match node_command(spec, role, rank, port, tf_config).spawn() {
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
            Cause::ChiefDone => say(format_args!(
                "worker 0, the chief, exited 0; stopping the {} left (they serve until \
                 stopped)",
                plural_count(self.remaining, "task")
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
        let chief = self.tensorflow && (role, rank) == (Role::Worker, 0);
        if chief && status.success() && self.remaining > 0 {
            self.stop(Cause::ChiefDone);
        }
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
            Cause::ChiefDone => {
                say(format_args!(
                    "worker 0, the chief, exited 0: the job succeeded"
                ));
                return Ok(LaunchReport { nodes, elapsed });
            }
        })
    }
}

/// Raises this process's soft limit on open files to the hard limit when the cluster needs
/// more than the soft one allows (the nodes inherit it): the launcher holds two pipes per
/// node and the scheduler two connections per node, so 513 nodes need over 1,024, a
/// common soft limit. As Go's runtime does at start; a failure only leaves the limit as it
/// was.
fn raise_fd_limit(spec: &LaunchSpec) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let needed = 2 * (1 + u64::from(spec.num_servers) + u64::from(spec.num_workers)) + 64;
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current.is_some_and(|soft| soft < needed) && limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            say(format_args!(
                "cannot raise the open-file limit ({e}); {needed} may be needed"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
