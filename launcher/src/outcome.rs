//! What a launch ends with: a [`LaunchReport`] of every node's [`NodeExit`] when all
//! exited 0, a [`LaunchError`] naming the first cause otherwise.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use van_core::Role;

use crate::describe::NodeName;

/// How one node ended.
#[derive(Debug, Clone)]
pub struct NodeExit {
    /// The node's role.
    pub role: Role,
    /// Its rank within the role (`VANS_LAUNCH_RANK`).
    pub rank: u32,
    /// Its process id.
    pub pid: u32,
    /// How it exited: [`ExitStatus::code`], or
    /// [`ExitStatusExt::signal`](std::os::unix::process::ExitStatusExt::signal) when killed.
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
#[non_exhaustive]
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
    /// The job ran longer than [`LaunchSpec::timeout`](crate::LaunchSpec::timeout).
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
