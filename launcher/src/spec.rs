//! What to launch ([`LaunchSpec`]) and what follows from it: its checks, the nodes in start
//! order, the command line as a shell would show it, and the root address (a free port,
//! whether it is a loopback address).

use std::io;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use van_core::Role;

use crate::outcome::LaunchError;

/// The root URI used when none is given.
pub const DEFAULT_ROOT_URI: &str = "127.0.0.1";

/// How long a node has between SIGTERM and SIGKILL when the launcher stops it.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);

/// The most nodes one local launch starts (scheduler included).
pub const MAX_NODES: u32 = 1024;

/// Variables the launcher sets itself; [`LaunchSpec::env`] may not name them.
const RESERVED_ENV: [(&str, &str); 7] = [
    ("DMLC_ROLE", "the launcher sets it per node"),
    ("VANS_RANK", "the launcher sets it per server and worker"),
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
    /// TensorFlow tasks instead of ps-lite nodes (false by default): no scheduler process;
    /// the servers are the `ps` tasks and the workers the `worker` tasks of one `TF_CONFIG`
    /// cluster, each listening on a free port of [`root_uri`](Self::root_uri), and no
    /// `DMLC_*` variable is set. A TensorFlow server with a vans protocol hosts the vans
    /// scheduler in one of its tasks. The job succeeds once worker 0, the chief, has exited
    /// 0; the tasks left (ps tasks and workers that serve until stopped) are then stopped, as
    /// under a TFJob's default success policy.
    pub tensorflow: bool,
    /// Handle SIGINT and SIGTERM sent to this process (true by default). Once handled, tokio
    /// keeps those signals from terminating the process even after [`launch`](crate::launch) returns, so
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
            tensorflow: false,
            handle_signals: true,
        }
    }

    /// Every node in start order: the scheduler (unless [`tensorflow`](Self::tensorflow)),
    /// the servers, the workers, with their ranks.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = (Role, u32)> {
        (!self.tensorflow)
            .then_some((Role::Scheduler, 0))
            .into_iter()
            .chain((0..self.num_servers).map(|rank| (Role::Server, rank)))
            .chain((0..self.num_workers).map(|rank| (Role::Worker, rank)))
    }

    pub(crate) fn validate(&self) -> Result<(), LaunchError> {
        let total = self.nodes().count() as u64;
        if total > u64::from(MAX_NODES) {
            return Err(LaunchError::InvalidSpec(format!(
                "{total} nodes requested; a local launch starts at most {MAX_NODES}"
            )));
        }
        if self.tensorflow && self.root_port != 0 {
            return Err(LaunchError::InvalidSpec(
                "a TensorFlow job has no scheduler port to set (root_port / --port): each \
                 task listens on a free port, named in its TF_CONFIG"
                    .into(),
            ));
        }
        if self.tensorflow && self.num_workers == 0 {
            return Err(LaunchError::InvalidSpec(
                "a TensorFlow job needs at least one worker task".into(),
            ));
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
            if self.tensorflow && key == "TF_CONFIG" {
                return Err(LaunchError::InvalidSpec(
                    "TF_CONFIG cannot be set: the launcher sets it per task".into(),
                ));
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

/// Ports on one address, reserved for nodes not started yet, until this is dropped.
///
/// Each port is held by a socket that is bound with `SO_REUSEADDR` but never listens. The
/// kernel does not hand a bound port to anyone else (neither a `bind` to port 0 nor an
/// outgoing connection's local port), while a node's listener, which also sets
/// `SO_REUSEADDR` (tokio's, std's and gRPC's all do), may still bind it: Linux lets a socket
/// with that option share a port with bound sockets that do not listen. A port merely picked
/// and closed again could go to another process's connection before its node binds it.
pub(crate) struct HeldPorts {
    ports: Vec<u16>,
    _sockets: Vec<socket2::Socket>,
}

impl HeldPorts {
    /// The reserved ports, all different.
    pub(crate) fn ports(&self) -> &[u16] {
        &self.ports
    }
}

/// A free port on `uri`, held until the result is dropped.
pub(crate) fn free_port(uri: &str) -> Result<HeldPorts, LaunchError> {
    let context = format!("could not pick a free port on {uri} (set root_port / --port)");
    hold_ports(uri, 1, context)
}

/// `count` free ports on `uri`, all different, held until the result is dropped.
pub(crate) fn free_ports(uri: &str, count: usize) -> Result<HeldPorts, LaunchError> {
    hold_ports(
        uri,
        count,
        format!("could not pick {count} free ports on {uri}"),
    )
}

/// [`free_ports`], failing with `context`; at least one port.
fn hold_ports(uri: &str, count: usize, context: String) -> Result<HeldPorts, LaunchError> {
    let io_error = |source| LaunchError::Io {
        context: context.clone(),
        source,
    };
    let address = (uri, 0)
        .to_socket_addrs()
        .map_err(io_error)?
        .next()
        .ok_or_else(|| io_error(io::Error::new(io::ErrorKind::NotFound, "no address")))?;
    let hold = || -> io::Result<(u16, socket2::Socket)> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(address),
            socket2::Type::STREAM,
            None,
        )?;
        socket.set_reuse_address(true)?;
        socket.bind(&address.into())?;
        let port = socket
            .local_addr()?
            .as_socket()
            .map(|bound| bound.port())
            .ok_or_else(|| io::Error::other("bound to an address that is not an IP socket"))?;
        Ok((port, socket))
    };
    let (ports, sockets) = (0..count.max(1))
        .map(|_| hold())
        .collect::<io::Result<(Vec<_>, Vec<_>)>>()
        .map_err(io_error)?;
    Ok(HeldPorts {
        ports,
        _sockets: sockets,
    })
}

/// The `TF_CONFIG` of each `ps` task, then of each `worker` task, of the cluster whose ps
/// tasks listen at `ps` and workers at `workers` (`host:port`): the cluster and the task's
/// own type and index. An empty `ps` is left out of the cluster (TensorFlow reads an empty
/// job as one with no tasks). `vans-launch --tensorflow` and `vans-master` both use it.
pub fn tf_configs(ps: &[String], workers: &[String]) -> Vec<String> {
    let mut cluster = serde_json::Map::new();
    if !ps.is_empty() {
        cluster.insert("ps".into(), ps.into());
    }
    cluster.insert("worker".into(), workers.into());
    let tasks = (0..ps.len())
        .map(|index| ("ps", index))
        .chain((0..workers.len()).map(|index| ("worker", index)));
    tasks
        .map(|(kind, index)| {
            serde_json::json!({
                "cluster": cluster,
                "task": { "type": kind, "index": index },
            })
            .to_string()
        })
        .collect()
}

/// Whether `uri` names this machine's loopback (`localhost`, 127.0.0.0/8, `::1`).
pub fn is_loopback(uri: &str) -> bool {
    uri.eq_ignore_ascii_case("localhost") || uri.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The program and its arguments as a shell would need them typed.
pub(crate) fn command_line(spec: &LaunchSpec) -> String {
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
    fn tf_configs_name_each_task_of_one_cluster_and_leave_out_an_empty_ps_job() {
        let (ps, workers) = (["h:1".to_owned()], ["h:2".to_owned(), "h:3".to_owned()]);
        let configs = tf_configs(&ps, &workers);
        let expected = [("ps", 0), ("worker", 0), ("worker", 1)];
        assert_eq!(configs.len(), expected.len());
        for (config, (kind, index)) in configs.iter().zip(expected) {
            assert_eq!(
                config,
                &format!(
                    r#"{{"cluster":{{"ps":["h:1"],"worker":["h:2","h:3"]}},"task":{{"index":{index},"type":"{kind}"}}}}"#
                )
            );
        }
        assert_eq!(
            tf_configs(&[], &workers[..1]),
            [r#"{"cluster":{"worker":["h:2"]},"task":{"index":0,"type":"worker"}}"#]
        );
    }

    #[test]
    fn a_held_port_is_refused_to_others_and_open_to_the_node() {
        let held = free_ports("127.0.0.1", 2).unwrap();
        let [a, b] = [held.ports()[0], held.ports()[1]];
        assert_ne!(a, b);
        // Nobody without SO_REUSEADDR (an outgoing connection's local port) gets it...
        let plain =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let address: std::net::SocketAddr = ([127, 0, 0, 1], a).into();
        let refused = plain.bind(&address.into()).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::AddrInUse, "{refused}");
        // ...while the node's listener binds it and is reached there.
        let listener = std::net::TcpListener::bind(address).unwrap();
        let _client = std::net::TcpStream::connect(address).unwrap();
        assert!(listener.accept().is_ok());
        drop(held);
    }

    #[test]
    fn free_port_and_loopback() {
        assert!(free_port("127.0.0.1").is_ok_and(|held| held.ports()[0] != 0));
        assert!(is_loopback("127.0.0.1") && is_loopback("localhost") && is_loopback("::1"));
        assert!(!is_loopback("10.0.0.2"));
    }
}
