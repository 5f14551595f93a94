//! One node's process: the command that starts it (its environment, a process group of its
//! own, death with the launcher) and the supervisor that reaps it and stops it when asked
//! (SIGTERM to its group, SIGKILL after the grace period, leftovers killed).

use std::io;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};
use van_core::Role;

use crate::spec::{is_loopback, LaunchSpec};

/// What the launcher asks of the running nodes; only ever increases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum StopLevel {
    Run,
    /// SIGTERM now, SIGKILL after the grace period.
    Terminate,
    /// SIGKILL now.
    Kill,
}

/// A supervisor's report: the node at `index` is gone.
pub(crate) struct Exited {
    pub(crate) index: usize,
    pub(crate) result: io::Result<ExitStatus>,
    pub(crate) stopped_by_launcher: bool,
    /// Processes were left in the node's group after it exited, and were killed.
    pub(crate) killed_leftovers: bool,
}

/// The ps-lite variables a TensorFlow task does without: inherited ones are removed, so that
/// nothing but its `TF_CONFIG` describes the cluster.
const PS_LITE_VARIABLES: [&str; 7] = [
    "DMLC_ROLE",
    "DMLC_NUM_SERVER",
    "DMLC_NUM_WORKER",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
    "DMLC_NODE_HOST",
    "VANS_RANK",
];

/// The command that starts one node; `tf_config` for a TensorFlow task
/// ([`LaunchSpec::tensorflow`]).
pub(crate) fn node_command(
    spec: &LaunchSpec,
    role: Role,
    rank: u32,
    port: u16,
    tf_config: Option<&str>,
) -> Command {
    let mut command = Command::new(&spec.program);
    command.args(&spec.args);
    if let Some(tf_config) = tf_config {
        for name in PS_LITE_VARIABLES {
            command.env_remove(name);
        }
        command
            .envs(spec.env.iter().map(|(key, value)| (key, value)))
            .env("TF_CONFIG", tf_config)
            .env("VANS_LAUNCH_RANK", rank.to_string());
        return finish(command);
    }
    command
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
        .env("VANS_LAUNCH_RANK", rank.to_string());
    // The node asks the scheduler for the rank its label shows (`[worker 2]` is rank 2);
    // the scheduler has none.
    if role == Role::Scheduler {
        // One inherited from the launcher's environment would be a configuration error there.
        command.env_remove("VANS_RANK");
    } else {
        command.env("VANS_RANK", rank.to_string());
    }
    finish(command)
}

/// Output piped, a process group of its own, death with the launcher.
fn finish(mut command: Command) -> Command {
    command
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
    let Some(parent) = std::process::id().try_into().ok().and_then(pid) else {
        return;
    };
    let hook = move || {
        // This runs in the forked child before exec, where only async-signal-safe calls are
        // allowed. rustix makes prctl(2) and getppid(2) as plain system calls: they take
        // integers, take no locks and allocate nothing (getppid is on POSIX's
        // async-signal-safe list; prctl is Linux's equivalent). Error values are built from
        // the raw errno without allocating.
        rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
        // The launcher may have died between fork and prctl; then no signal would come.
        if rustix::process::getppid() != Some(parent) {
            return Err(rustix::io::Errno::SRCH.into());
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
pub(crate) async fn supervise(
    mut child: Child,
    index: usize,
    grace: Duration,
    mut stop: watch::Receiver<StopLevel>,
    exits: mpsc::Sender<Exited>,
) {
    let group = child.id().and_then(|id| pid(id.try_into().ok()?));
    let (mut term_sent, mut kill_sent, mut launcher_gone) = (false, false, false);
    let mut kill_at = None;
    let result = loop {
        let level = *stop.borrow_and_update();
        if level >= StopLevel::Terminate && !term_sent {
            term_sent = true;
            signal_group(&child, Signal::TERM);
            kill_at = Some(Instant::now() + grace);
        }
        if (level == StopLevel::Kill || launcher_gone) && !kill_sent {
            kill_sent = true;
            signal_group(&child, Signal::KILL);
        }
        tokio::select! {
            result = child.wait() => break result,
            changed = stop.changed(), if !launcher_gone => launcher_gone = changed.is_err(),
            _ = sleep_until(kill_at.unwrap_or_else(Instant::now)),
                if kill_at.is_some() && !kill_sent =>
            {
                kill_sent = true;
                signal_group(&child, Signal::KILL);
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
fn signal_group(child: &Child, signal: Signal) {
    let Some(pid) = child.id().and_then(|id| pid(id.try_into().ok()?)) else {
        return;
    };
    // `Child::id` is `Some` only until the child is reaped, and only `supervise` reaps it, so
    // `pid` is still our child (perhaps a zombie): neither it nor its process group (it
    // called setpgid(0, 0) before exec, and `spawn` returned after exec) can name another
    // process.
    if rustix::process::kill_process_group(pid, signal).is_err() {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// SIGKILLs what is left in process group `group` after its leader was reaped, and says
/// whether anything was.
fn kill_leftovers(group: Pid) -> bool {
    // While any process of the group lives, Linux does not give its id to a new process, so
    // the group can only hold what our node left behind; an empty group fails with ESRCH.
    // (Reaching a stranger would need the pid counter to wrap around to `group` in the
    // microseconds since the reap and the new process to lead a group at once.)
    rustix::process::kill_process_group(group, Signal::KILL).is_ok()
}

/// `raw` as a [`Pid`] when it names one process (is positive): never 0 or a negative group
/// number, which `kill` would read as "every process of a group".
fn pid(raw: i32) -> Option<Pid> {
    (raw > 0).then_some(raw).and_then(Pid::from_raw)
}
