//! The message every van carries: a [`Meta`] plus data segments.
//!
//! The vocabulary is ps-lite's (`Meta`, `Control`, `Node`, roles, commands, data types) so
//! that people who know ps-lite can read our logs and port their code. [`VanKind`] names the
//! transport each of a node's [`Endpoint`]s is for.

use std::sync::Arc;

use bytes::Bytes;

/// A node's identifier, in ps-lite numbering (see [`crate::node_ids`]).
pub type NodeId = i32;

/// The three roles of a ps-lite cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Bootstraps the cluster: assigns ids, runs barriers, watches heartbeats.
    Scheduler,
    /// Holds a key range and answers pushes and pulls.
    Server,
    /// Runs the training computation; pushes gradients and pulls parameters.
    Worker,
}

impl Role {
    /// The lowercase name used by `DMLC_ROLE` (`scheduler`, `server`, `worker`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Server => "server",
            Role::Worker => "worker",
        }
    }

    pub(crate) fn to_wire(self) -> u8 {
        match self {
            Role::Scheduler => 0,
            Role::Server => 1,
            Role::Worker => 2,
        }
    }

    pub(crate) fn from_wire(value: u8) -> Option<Role> {
        match value {
            0 => Some(Role::Scheduler),
            1 => Some(Role::Server),
            2 => Some(Role::Worker),
            _ => None,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A control command, as in ps-lite's `Control::Command`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Command {
    /// No command.
    #[default]
    Empty,
    /// Orderly shutdown of the receiving node.
    Terminate,
    /// Registration of nodes (request to the scheduler, node table in the reply).
    AddNode,
    /// Barrier request (to the scheduler) or release (from it).
    Barrier,
    /// Acknowledgement of a message carrying a signature.
    Ack,
    /// Liveness report to the scheduler.
    Heartbeat,
    /// Notice from the scheduler that the listed nodes are dead.
    NodeFailure,
}

impl Command {
    pub(crate) fn to_wire(self) -> u8 {
        match self {
            Command::Empty => 0,
            Command::Terminate => 1,
            Command::AddNode => 2,
            Command::Barrier => 3,
            Command::Ack => 4,
            Command::Heartbeat => 5,
            Command::NodeFailure => 6,
        }
    }

    pub(crate) fn from_wire(value: u8) -> Option<Command> {
        Some(match value {
            0 => Command::Empty,
            1 => Command::Terminate,
            2 => Command::AddNode,
            3 => Command::Barrier,
            4 => Command::Ack,
            5 => Command::Heartbeat,
            6 => Command::NodeFailure,
            _ => return None,
        })
    }
}

/// The element type of a data segment, as in ps-lite's `DataType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `char` in ps-lite: raw bytes.
    Char,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64` (ps-lite's `Key`).
    U64,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// Anything else; the application knows.
    Other,
}

impl DataType {
    /// Every data type, in wire order.
    pub const ALL: [DataType; 12] = [
        DataType::Char,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::U8,
        DataType::U16,
        DataType::U32,
        DataType::U64,
        DataType::F32,
        DataType::F64,
        DataType::Other,
    ];

    /// Size of one element in bytes (1 for [`DataType::Char`] and [`DataType::Other`]).
    pub fn size(self) -> usize {
        match self {
            DataType::Char | DataType::I8 | DataType::U8 | DataType::Other => 1,
            DataType::I16 | DataType::U16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Its name, as numpy spells it (`float32`, `int64`, `uint8`, …; `char` and `other` for
    /// ps-lite's raw bytes and anything else): the one table the bindings share.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Char => "char",
            DataType::I8 => "int8",
            DataType::I16 => "int16",
            DataType::I32 => "int32",
            DataType::I64 => "int64",
            DataType::U8 => "uint8",
            DataType::U16 => "uint16",
            DataType::U32 => "uint32",
            DataType::U64 => "uint64",
            DataType::F32 => "float32",
            DataType::F64 => "float64",
            DataType::Other => "other",
        }
    }

    /// The type [`name`](Self::name) spells `name`.
    pub fn from_name(name: &str) -> Option<DataType> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Its number (ps-lite's `DataType` value, the wire code and the C binding's `VANS_*`).
    pub fn code(self) -> u8 {
        // ALL is in wire order, so the index is the code.
        Self::ALL.iter().position(|t| *t == self).unwrap_or(11) as u8
    }

    /// The type numbered `code`.
    pub fn from_code(code: u8) -> Option<DataType> {
        Self::ALL.get(usize::from(code)).copied()
    }

    pub(crate) fn to_wire(self) -> u8 {
        self.code()
    }

    pub(crate) fn from_wire(value: u8) -> Option<DataType> {
        Self::from_code(value)
    }
}

/// The transports vans knows about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VanKind {
    /// Channels inside one process (`van_core::inproc`).
    InProcess,
    /// TCP on tokio (`van-tcp`).
    Tcp,
    /// io_uring sockets (`van-uring`).
    Uring,
    /// RDMA verbs (`van-rdma`).
    Rdma,
    /// Shared memory between processes on one host (`van-ipc`).
    Ipc,
}

impl VanKind {
    /// Every kind, in wire order.
    pub const ALL: [VanKind; 5] = [
        VanKind::InProcess,
        VanKind::Tcp,
        VanKind::Uring,
        VanKind::Rdma,
        VanKind::Ipc,
    ];

    /// The name used in configuration and logs (`inproc`, `tcp`, `uring`, `rdma`, `ipc`).
    pub fn as_str(self) -> &'static str {
        match self {
            VanKind::InProcess => "inproc",
            VanKind::Tcp => "tcp",
            VanKind::Uring => "uring",
            VanKind::Rdma => "rdma",
            VanKind::Ipc => "ipc",
        }
    }

    /// The Cargo feature of `ps`/`rendezvous` that compiles this van in.
    pub fn feature(self) -> &'static str {
        match self {
            VanKind::InProcess => "(always compiled)",
            other => other.as_str(),
        }
    }

    pub(crate) fn to_wire(self) -> u8 {
        match self {
            VanKind::InProcess => 0,
            VanKind::Tcp => 1,
            VanKind::Uring => 2,
            VanKind::Rdma => 3,
            VanKind::Ipc => 4,
        }
    }

    pub(crate) fn from_wire(code: u8) -> Option<VanKind> {
        Self::ALL.get(usize::from(code)).copied()
    }
}

impl std::fmt::Display for VanKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for VanKind {
    type Err = String;

    fn from_str(s: &str) -> Result<VanKind, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown van `{s}` (expected one of {})", names.join(", "))
            })
    }
}

/// Where a node can be reached by one kind of van.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Which van this address is for.
    pub kind: VanKind,
    /// The van's own address syntax: `host:port` for stream vans, a path for IPC.
    pub address: String,
}

impl Endpoint {
    /// A stream-van endpoint `host:port`.
    pub fn stream(kind: VanKind, host: &str, port: u16) -> Endpoint {
        let address = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Endpoint { kind, address }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", self.kind, self.address)
    }
}

/// A node of the cluster, as carried in the scheduler's node table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    /// The node's role.
    pub role: Role,
    /// The assigned id, or `None` before registration.
    pub id: Option<NodeId>,
    /// Host name or IP address of the primary (stream) endpoint.
    pub host: String,
    /// Port of the primary endpoint (0 before binding).
    pub port: u16,
    /// Identity of the machine (boot id plus hostname): equal identities share memory.
    pub host_identity: String,
    /// Every van endpoint this node listens on.
    pub endpoints: Vec<Endpoint>,
    /// Whether the node rejoins after a failure (ps-lite's `is_recovery`).
    pub is_recovery: bool,
    /// The node's process: a number each process draws when it starts (nonzero; 0 when not
    /// known), so that a process that later takes this node's id (recovery) is told apart
    /// from this one.
    pub incarnation: u64,
    /// The TensorFlow task the node runs (from `TF_CONFIG`), if any: the scheduler numbers
    /// such nodes in task order and recovery puts a restarted task back in its own place.
    pub task: Option<TfTask>,
}

/// A TensorFlow task: a job name and an index in it (`/job:worker/task:1`), as `TF_CONFIG`'s
/// `task` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TfTask {
    /// The job (`chief`, `master`, `worker`, `ps`, …); never empty.
    pub job: String,
    /// The task's index within its job.
    pub index: u32,
}

impl TfTask {
    /// Where the task comes in the scheduler's numbering of its role: `chief`, then `master`,
    /// then `worker`, then any other job, each by index (TensorFlow's chief is worker rank 0).
    pub fn order(&self) -> (u8, &str, u32) {
        let job = match self.job.as_str() {
            "chief" => 0,
            "master" => 1,
            "worker" => 2,
            _ => 3,
        };
        (job, self.job.as_str(), self.index)
    }
}

impl std::fmt::Display for TfTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/job:{}/task:{}", self.job, self.index)
    }
}

impl Node {
    /// A node with a role, host and port, no id and no extra endpoints.
    pub fn new(role: Role, host: impl Into<String>, port: u16) -> Node {
        Node {
            role,
            id: None,
            host: host.into(),
            port,
            host_identity: String::new(),
            endpoints: Vec::new(),
            is_recovery: false,
            incarnation: 0,
            task: None,
        }
    }

    /// The same node with an id.
    pub fn with_id(mut self, id: NodeId) -> Node {
        self.id = Some(id);
        self
    }

    /// The endpoint for a van kind, if the node listens on one.
    pub fn endpoint(&self, kind: VanKind) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.kind == kind)
    }
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.id {
            Some(id) => write!(f, "{}[{}]@{}:{}", self.role, id, self.host, self.port)?,
            None => write!(f, "{}[?]@{}:{}", self.role, self.host, self.port)?,
        }
        match &self.task {
            Some(task) => write!(f, " ({task})"),
            None => Ok(()),
        }
    }
}

/// The control block of a message: cluster management, not data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Control {
    /// What to do.
    pub cmd: Command,
    /// Nodes concerned (registration, node table, failures). Shared, not copied, between
    /// the messages that carry the same table: the scheduler sends one table to every node,
    /// and in one process (the in-process van) they all keep that one copy.
    pub nodes: Arc<[Node]>,
    /// Barrier group, a bitmask of [`crate::node_ids`] groups.
    pub barrier_group: i32,
    /// Signature of the message being acknowledged (ps-lite's `msg_sig`); on a barrier
    /// request, 1 marks `finalize`'s barrier (`node::control::FINAL_BARRIER`).
    pub msg_sig: u64,
}

impl Control {
    /// A control block with a command and nothing else.
    pub fn command(cmd: Command) -> Control {
        Control {
            cmd,
            ..Control::default()
        }
    }
}

/// Everything about a message except its data segments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Meta {
    /// Application command (ps-lite's `head`, the `cmd` of KV calls).
    pub head: i32,
    /// Application id.
    pub app_id: i32,
    /// Customer id within the application.
    pub customer_id: i32,
    /// Request id (ps-lite's `timestamp`), echoed by the response.
    pub request_id: i32,
    /// Sending node, `None` before registration.
    pub sender: Option<NodeId>,
    /// Receiving node or group.
    pub recipient: Option<NodeId>,
    /// A request (true) or a response (false).
    pub request: bool,
    /// A push.
    pub push: bool,
    /// A pull.
    pub pull: bool,
    /// A `SimpleApp` (head, body) message rather than key-value data.
    pub simple_app: bool,
    /// Free-form body (`SimpleApp` bodies, rendezvous keys).
    pub body: Bytes,
    /// The element type of each data segment.
    pub data_types: DataTypes,
    /// Cluster control, if this is a control message.
    pub control: Option<Control>,
    /// Scheduling priority; higher goes first where a van reorders.
    pub priority: i32,
    /// Key of a zero-copy or RDMA transfer.
    pub key: u64,
    /// Remote address of a zero-copy or RDMA transfer.
    pub addr: u64,
    /// Value length of a zero-copy or RDMA transfer.
    pub val_len: u64,
    /// Free option word of zero-copy paths (e.g. an RDMA rkey).
    pub option: i32,
    /// The sender's sequence number for this message to this recipient, when the sender
    /// resends unacknowledged messages (`PS_RESEND`); the receiver acknowledges it and drops
    /// a copy it has seen. `None` otherwise.
    pub seq: Option<Seq>,
}

/// A message's place in what one process sends another (`PS_RESEND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Seq {
    /// The number: the sender's incarnation in the top bits, a count from 1 below.
    pub number: u64,
    /// The incarnation of the recipient the sender meant ([`Node::incarnation`]; 0: any).
    /// A process that took the recipient's id since drops the message: it was meant for the
    /// one before.
    pub to: u64,
}

/// A message: a [`Meta`] and zero or more data segments.
///
/// For key-value traffic the segments are keys, values and optionally per-key lengths, as in
/// ps-lite. Segments are [`Bytes`], so they travel from the application to the socket and from
/// the socket to the application without copies beyond what the van needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    /// The meta.
    pub meta: Meta,
    /// The data segments.
    pub data: Parts,
}

/// A message's data segments. Up to three (keys, values, lengths) are stored inline, so a
/// message allocates nothing for them; build one with [`smallvec::smallvec!`] or
/// `Parts::from_vec`.
pub type Parts = smallvec::SmallVec<[Bytes; 3]>;

/// The types of a message's data segments. Up to six are stored inline.
pub type DataTypes = smallvec::SmallVec<[DataType; 6]>;

impl Message {
    /// A data message to `recipient` with the given segments.
    pub fn to(recipient: NodeId, data: impl Into<Parts>) -> Message {
        Message {
            meta: Meta {
                recipient: Some(recipient),
                ..Meta::default()
            },
            data: data.into(),
        }
    }

    /// Total bytes of the data segments.
    pub fn data_len(&self) -> usize {
        self.data.iter().map(Bytes::len).sum()
    }

    /// One line about the message: what it is, its ids, its size (`PS_VERBOSE=2`, ps-lite's
    /// per-message log).
    pub fn summary(&self) -> String {
        let m = &self.meta;
        let what = match &m.control {
            Some(control) => format!("control {:?} group {}", control.cmd, control.barrier_group),
            None if m.simple_app => format!("simple-app head {}", m.head),
            None => format!(
                "{}{}{} cmd {}",
                if m.push { "push" } else { "" },
                if m.push && m.pull { "-" } else { "" },
                if m.pull { "pull" } else { "" },
                m.head
            ),
        };
        format!(
            "{} {what} #{} {:?} -> {:?}, app {}/{}, {} segments, {} bytes",
            if m.request { "request" } else { "response" },
            m.request_id,
            m.sender,
            m.recipient,
            m.app_id,
            m.customer_id,
            self.data.len(),
            self.data_len()
        )
    }
}

/// ps-lite's node-id numbering: scheduler 1, groups 2/4, servers 8, 10, …, workers 9, 11, ….
///
/// Group ids are bitmasks and can be combined (`SERVER_GROUP | WORKER_GROUP`).
///
/// ```
/// use van_core::node_ids::*;
/// assert_eq!(server_rank_to_id(0), 8);
/// assert_eq!(worker_rank_to_id(1), 11);
/// assert_eq!(id_to_rank(11), 1);
/// assert!(is_worker(11) && !is_server(11));
/// ```
pub mod node_ids {
    use super::{NodeId, Role};

    /// The scheduler's id (also its group).
    pub const SCHEDULER: NodeId = 1;
    /// The group of all servers.
    pub const SERVER_GROUP: NodeId = 2;
    /// The group of all workers.
    pub const WORKER_GROUP: NodeId = 4;
    /// The first id given to an individual node.
    pub const FIRST_NODE_ID: NodeId = 8;

    /// The id of the server with this rank.
    pub fn server_rank_to_id(rank: u32) -> NodeId {
        FIRST_NODE_ID.saturating_add((rank as NodeId).saturating_mul(2))
    }

    /// The id of the worker with this rank.
    pub fn worker_rank_to_id(rank: u32) -> NodeId {
        server_rank_to_id(rank).saturating_add(1)
    }

    /// The rank of a server or worker id (0 for the scheduler and groups).
    pub fn id_to_rank(id: NodeId) -> u32 {
        (id.saturating_sub(FIRST_NODE_ID).max(0) / 2) as u32
    }

    /// Whether `id` names an individual server.
    pub fn is_server(id: NodeId) -> bool {
        id >= FIRST_NODE_ID && id % 2 == 0
    }

    /// Whether `id` names an individual worker.
    pub fn is_worker(id: NodeId) -> bool {
        id >= FIRST_NODE_ID && id % 2 == 1
    }

    /// Whether `id` is a group (or a combination of groups) rather than one node.
    pub fn is_group(id: NodeId) -> bool {
        (1..FIRST_NODE_ID).contains(&id)
    }

    /// The group bit of a role.
    pub fn group_of(role: Role) -> NodeId {
        match role {
            Role::Scheduler => SCHEDULER,
            Role::Server => SERVER_GROUP,
            Role::Worker => WORKER_GROUP,
        }
    }

    /// The role an individual id belongs to, `None` for groups.
    pub fn role_of(id: NodeId) -> Option<Role> {
        if id == SCHEDULER {
            Some(Role::Scheduler)
        } else if is_server(id) {
            Some(Role::Server)
        } else if is_worker(id) {
            Some(Role::Worker)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::node_ids::*;
    use super::*;

    #[test]
    fn node_numbering_matches_ps_lite() {
        assert_eq!(SCHEDULER, 1);
        assert_eq!(
            (0..3).map(server_rank_to_id).collect::<Vec<_>>(),
            [8, 10, 12]
        );
        assert_eq!(
            (0..3).map(worker_rank_to_id).collect::<Vec<_>>(),
            [9, 11, 13]
        );
        for rank in 0..100 {
            assert_eq!(id_to_rank(server_rank_to_id(rank)), rank);
            assert_eq!(id_to_rank(worker_rank_to_id(rank)), rank);
            assert_eq!(role_of(server_rank_to_id(rank)), Some(Role::Server));
            assert_eq!(role_of(worker_rank_to_id(rank)), Some(Role::Worker));
        }
        assert!(is_group(SERVER_GROUP | WORKER_GROUP | SCHEDULER));
        assert_eq!(role_of(SERVER_GROUP), None);
    }

    #[test]
    fn data_type_codes_round_trip() {
        for (code, t) in DataType::ALL.iter().enumerate() {
            assert_eq!(usize::from(t.to_wire()), code);
            assert_eq!(DataType::from_wire(code as u8), Some(*t));
        }
        assert_eq!(DataType::from_wire(12), None);
    }

    #[test]
    fn data_type_names_are_numpys_and_round_trip() {
        let names: Vec<&str> = DataType::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(
            names,
            [
                "char", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float32", "float64", "other"
            ]
        );
        for t in DataType::ALL {
            assert_eq!(DataType::from_name(t.name()), Some(t));
            assert_eq!(DataType::from_code(t.code()), Some(t));
        }
        assert_eq!(DataType::from_name("f32"), None);
    }
}
