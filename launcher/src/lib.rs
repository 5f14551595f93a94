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
//! | `DMLC_PS_ROOT_PORT` | [`LaunchSpec::root_port`], or a free port when that is 0 (held by the launcher until the job ends, so nothing else takes it before the scheduler binds it) |
//! | `DMLC_NODE_HOST` | `127.0.0.1`, only when the root URI is a loopback address or `localhost` |
//! | `VANS_LAUNCH_RANK` | the node's rank within its role, from 0 |
//! | `VANS_RANK` | the same, for servers and workers: the node asks the scheduler for that rank, so the `[worker 2]` in front of its lines is its `rank` |
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

// How node names, exit statuses and counts are worded.
mod describe;
// The job: starting every node, reacting to what happens, the result.
mod job;
// One node's process: its command and its supervisor.
mod node;
// What a launch ends with: the report or the error.
mod outcome;
// Node output and the launcher's own messages.
mod output;
// SIGINT and SIGTERM sent to the launcher.
mod signals;
// What to launch, its checks and what follows from it.
mod spec;

pub use job::{launch, SETTLE};
pub use outcome::{LaunchError, LaunchReport, NodeExit};
pub use output::MAX_LINE_BYTES;
pub use spec::{is_loopback, tf_configs, LaunchSpec, DEFAULT_GRACE, DEFAULT_ROOT_URI, MAX_NODES};
