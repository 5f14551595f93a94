//! [`VARIABLES`]: every environment variable vans reads, with its default and effect (the
//! rows of the table in the book's configuration chapter, `docs/src/operators/configuration.md`,
//! which `VANS_BLESS=1 cargo test -p van-core --test docs_variables` generates from this list),
//! and [`EnvVar`], one row.

/// One environment variable vans reads: a row of the configuration chapter's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvVar {
    /// The variable's name.
    pub name: &'static str,
    /// Its value when unset, as a person would write it.
    pub default: &'static str,
    /// What it does and what it accepts.
    pub effect: &'static str,
}

/// Every variable [`Config::from_env`](super::Config::from_env) reads, in the order it checks them.
pub const VARIABLES: &[EnvVar] = &[
    EnvVar {
        name: "TF_CONFIG",
        default: "unset",
        effect: "TensorFlow cluster JSON (Kubeflow TFJob); supplies each of DMLC_ROLE (`ps`: \
                 server; `chief` (or `master`), `worker`: worker; `evaluator`: error), \
                 DMLC_NUM_WORKER (chief + worker tasks), DMLC_NUM_SERVER (ps tasks), DMLC_PS_ROOT_URI and \
                 DMLC_PS_ROOT_PORT (the address of chief:0, else worker:0, whose process also \
                 hosts the scheduler), DMLC_NODE_HOST (this task's host) and DMLC_ENABLE_RDMA \
                 (`rpc_layer` containing `verbs` or `rdma`: 1; `grpc`, `grpc+vans`, \
                 `grpc+vans+push`, `grpc+seastar`, `grpc+mpi`, `star_server`, unset: 0) that is not set explicitly; explicit \
                 DMLC_* variables win; a job listed sparsely (`{\"1\": \"host:port\"}`, \
                 Kubeflow's dynamic workers) cannot supply its count: set DMLC_NUM_WORKER \
                 (or DMLC_NUM_SERVER)",
    },
    EnvVar {
        name: "SLURM_PROCID",
        default: "unset",
        effect: "Slurm's rank of this task (srun): when DMLC_ROLE is unset, rank 0 is the scheduler, ranks 1 to DMLC_NUM_SERVER the servers, the rest the workers (DMLC_NUM_SERVER must be set; DMLC_NUM_WORKER, if set, must agree)",
    },
    EnvVar {
        name: "SLURM_NTASKS",
        default: "unset",
        effect: "Slurm's number of tasks: the job's size with SLURM_PROCID",
    },
    EnvVar {
        name: "SLURM_STEP_NODELIST",
        default: "unset",
        effect: "Slurm's hosts of the step; its first host (where rank 0 runs) is the scheduler's address when neither DMLC_PS_ROOT_URI nor MASTER_ADDR is set",
    },
    EnvVar {
        name: "SLURM_JOB_NODELIST",
        default: "unset",
        effect: "Slurm's hosts of the job, used as SLURM_STEP_NODELIST when that is unset",
    },
    EnvVar {
        name: "OMPI_COMM_WORLD_RANK",
        default: "unset",
        effect: "Open MPI's rank (mpirun): the role by the same rule as SLURM_PROCID",
    },
    EnvVar {
        name: "OMPI_COMM_WORLD_SIZE",
        default: "unset",
        effect: "Open MPI's number of processes",
    },
    EnvVar {
        name: "PMI_RANK",
        default: "unset",
        effect: "a PMI launcher's rank (MPICH, Intel MPI): the role by the same rule as SLURM_PROCID",
    },
    EnvVar {
        name: "PMI_SIZE",
        default: "unset",
        effect: "a PMI launcher's number of processes",
    },
    EnvVar {
        name: "RANK",
        default: "unset",
        effect: "PyTorch-style rank (torchrun, Kubeflow PyTorchJob): the role by the same rule as SLURM_PROCID",
    },
    EnvVar {
        name: "WORLD_SIZE",
        default: "unset",
        effect: "PyTorch-style number of processes",
    },
    EnvVar {
        name: "MASTER_ADDR",
        default: "unset",
        effect: "PyTorch-style address of rank 0: the scheduler's address when DMLC_PS_ROOT_URI is unset",
    },
    EnvVar {
        name: "MASTER_PORT",
        default: "unset",
        effect: "PyTorch-style port of rank 0: the scheduler's port when DMLC_PS_ROOT_PORT is unset",
    },
    EnvVar {
        name: "DMLC_ROLE",
        default: "unset",
        effect: "`scheduler`, `server` or `worker` (any case); unset: single process, no cluster",
    },
    EnvVar {
        name: "DMLC_NUM_WORKER",
        default: "1 (required when DMLC_ROLE is set)",
        effect: "number of worker processes; at least 1 when DMLC_ROLE=worker",
    },
    EnvVar {
        name: "DMLC_NUM_SERVER",
        default: "1 (required when DMLC_ROLE is set)",
        effect: "number of server processes; at least 1 when DMLC_ROLE is worker or server",
    },
    EnvVar {
        name: "VANS_RANK",
        default: "unset (ranks by address)",
        effect: "this worker's or server's rank within its role, asked of the scheduler: 0 to \
                 DMLC_NUM_WORKER - 1 (a worker) or DMLC_NUM_SERVER - 1 (a server); nodes that \
                 give one are numbered by it (worker rank N is node 9 + 2N, server rank N node \
                 8 + 2N; give one to every node of a role or to none) and a process started \
                 again with the same rank takes its place (recovery); announced as TensorFlow \
                 task `worker:N` or `ps:N`, so a task TF_CONFIG gives must be the same one; an \
                 error on the scheduler",
    },
    EnvVar {
        name: "DMLC_PS_ROOT_URI",
        default: "127.0.0.1 (required when DMLC_ROLE is set)",
        effect: "host or IP address of the scheduler",
    },
    EnvVar {
        name: "DMLC_PS_ROOT_PORT",
        default: "unset (required when DMLC_ROLE is set)",
        effect: "port of the scheduler, 1..=65535",
    },
    EnvVar {
        name: "DMLC_INTERFACE",
        default: "unset",
        effect: "network interface whose address this node announces (e.g. `eth5`); \
                 ignored when DMLC_NODE_HOST is set; unset: the address that routes to the \
                 scheduler (as ps-lite picks it; logged)",
    },
    EnvVar {
        name: "DMLC_NODE_HOST",
        default: "unset",
        effect: "host or IP address this node announces; wins over DMLC_INTERFACE",
    },
    EnvVar {
        name: "DMLC_PORT",
        default: "0",
        effect: "port this node listens on; 0: an ephemeral port",
    },
    EnvVar {
        name: "PORT",
        default: "0",
        effect: "ps-lite's legacy name for DMLC_PORT; ignored when DMLC_PORT is set",
    },
    EnvVar {
        name: "DMLC_ENABLE_RDMA",
        default: "0",
        effect: "`1`, `true` or `ibverbs`: the RDMA van for remote peers; `0` or `false`: \
                 the stream van",
    },
    EnvVar {
        name: "PS_VERBOSE",
        default: "0",
        effect: "logging: 0 quiet, 1 connection setup, 2 every message",
    },
    EnvVar {
        name: "PS_HEARTBEAT_INTERVAL",
        default: "0 (off)",
        effect: "seconds between heartbeats a node sends to the scheduler; 0: none",
    },
    EnvVar {
        name: "PS_HEARTBEAT_TIMEOUT",
        default: "0 (off)",
        effect: "seconds of silence after which the scheduler declares a node dead, and a \
                 node that sends heartbeats declares the scheduler lost; 0: never; must exceed \
                 PS_HEARTBEAT_INTERVAL when both are set",
    },
    EnvVar {
        name: "PS_RESEND",
        default: "0 (off)",
        effect: "1: resend messages not acknowledged in time and drop duplicates (exactly-once \
                 delivery across broken connections); a broken connection is then no failure, \
                 only PS_HEARTBEAT_TIMEOUT declares a node dead",
    },
    EnvVar {
        name: "PS_RESEND_TIMEOUT",
        default: "1000",
        effect: "milliseconds to wait for an acknowledgement before resending (with PS_RESEND=1)",
    },
    EnvVar {
        name: "VANS_STREAM_VAN",
        default: "tcp",
        effect: "van for remote peers without RDMA: `tcp`, `uring`, or `inproc` \
                 (single process)",
    },
    EnvVar {
        name: "VANS_MAX_FRAME_BYTES",
        default: "1073741824 (1 GiB)",
        effect: "largest frame sent or accepted, header included; at least 1",
    },
    EnvVar {
        name: "VANS_MAX_SEGMENTS",
        default: "1024",
        effect: "largest number of data segments in one message; at least 1",
    },
    EnvVar {
        name: "VANS_MAX_META_BYTES",
        default: "4194304 (4 MiB)",
        effect: "largest encoded meta (node tables included); at least 1",
    },
    EnvVar {
        name: "VANS_CONNECT_TIMEOUT_MS",
        default: "10000 (10 s)",
        effect: "milliseconds allowed to open one connection; at least 1",
    },
    EnvVar {
        name: "VANS_BOOTSTRAP_TIMEOUT_SECS",
        default: "120",
        effect: "seconds allowed to register with the scheduler and receive the node table; \
                 at least 1",
    },
    EnvVar {
        name: "VANS_REPLACEMENT_GRACE_SECS",
        default: "0",
        effect: "on the scheduler: seconds `finalize`'s barrier (and so a server's \
                 `serve()`) waits for a new process in the place of a member that died, \
                 then for its arrival, before it fails naming the dead; 0 fails it at once \
                 (fast failure). Set it where failed nodes are started again (a restart \
                 policy, an elastic job)",
    },
    EnvVar {
        name: "VANS_UNPUSHED_KEYS",
        default: "zeros",
        effect: "how a summing server (ps-lite's default handler) answers a pull of a key no \
                 one has pushed: `zeros`, as many as the pull expects (a pull into a buffer \
                 says how many; one without a buffer fails naming the key), or `error` (the \
                 pull fails naming the key); never fewer values than keys",
    },
    EnvVar {
        name: "DMLC_ENABLE_IPC",
        default: "1",
        effect: "`0` or `false`: never use shared memory, even for peers on this host; `1` or \
                 `true`: use it when the IPC van is compiled in",
    },
    EnvVar {
        name: "BYTEPS_ENABLE_IPC",
        default: "1",
        effect: "BytePS's name for DMLC_ENABLE_IPC; when both are set they must agree",
    },
    EnvVar {
        name: "VANS_IPC_ARENA_BYTES",
        default: "67108864 (64 MiB)",
        effect: "bytes of shared memory each IPC van reserves for zero-copy buffers \
                 (`Postoffice::alloc`); `0` turns zero-copy sends off",
    },
    EnvVar {
        name: "VANS_IPC_NAMED",
        default: "0",
        effect: "`1`: the IPC van listens through an accept queue in `/dev/shm` instead of an \
                 abstract Unix socket, for co-located peers in different network namespaces \
                 (no zero-copy buffers then)",
    },
    EnvVar {
        name: "VANS_BUSY_POLLING",
        default: "0",
        effect: "`1`: vans that can poll (shared memory, io_uring) spin instead of sleeping \
                 between messages; lowest latency, one core busy per connection",
    },
    EnvVar {
        name: "PS_ENABLE_POLLING",
        default: "0",
        effect: "StarServer's name for VANS_BUSY_POLLING on servers; any of the three set to 1 \
                 turns polling on",
    },
    EnvVar {
        name: "WORKER_ENABLE_POLLING",
        default: "0",
        effect: "StarServer's name for VANS_BUSY_POLLING on workers",
    },
    EnvVar {
        name: "VANS_URING_THREADS",
        default: "unset (1)",
        effect: "I/O threads of the io_uring van, each with its own ring and connections; \
                 wins over the Seastar/StarServer names below; at least 1",
    },
    EnvVar {
        name: "SEASTAR_CORE_NUMBER",
        default: "unset",
        effect: "TensorFlow Seastar's name for VANS_URING_THREADS (any role)",
    },
    EnvVar {
        name: "NETWORK_PS_CORE_NUMBER",
        default: "unset",
        effect: "StarServer's name for VANS_URING_THREADS on servers; wins over \
                 SEASTAR_CORE_NUMBER there",
    },
    EnvVar {
        name: "NETWORK_WORKER_CORE_NUMBER",
        default: "unset",
        effect: "StarServer's name for VANS_URING_THREADS on workers; wins over \
                 SEASTAR_CORE_NUMBER there",
    },
    EnvVar {
        name: "VANS_PIN_CORES",
        default: "0",
        effect: "`1`: pin each io_uring I/O thread to one core of the process's CPU set \
                 (thread i to the i-th allowed core); wins over the StarServer names below",
    },
    EnvVar {
        name: "PS_DISABLE_PIN_CORES",
        default: "unset",
        effect: "StarServer's switch on servers: `1` turns pinning off, `0` turns it on \
                 (when VANS_PIN_CORES is unset)",
    },
    EnvVar {
        name: "WORKER_DISABLE_PIN_CORES",
        default: "unset",
        effect: "StarServer's switch on workers: `1` turns pinning off, `0` turns it on \
                 (when VANS_PIN_CORES is unset)",
    },
    EnvVar {
        name: "VANS_URING_ZC_BYTES",
        default: "65536",
        effect: "the io_uring van sends batches of at least this many bytes with \
                 SENDMSG_ZC (zero-copy) to peers that are not on loopback, and drops back to \
                 plain sends on a connection whose kernel reports it copied anyway; `0`: never",
    },
    EnvVar {
        name: "VANS_FRAME_POOL_BYTES",
        default: "67108864",
        effect: "the TCP and io_uring vans keep up to this many bytes of large received-frame \
                 buffers (256 KiB and up for TCP, 32 KiB for io_uring) once the application drops \
                 the frames, and read the next large frames into them instead of fresh memory; \
                 `0`: every large frame gets fresh memory",
    },
    EnvVar {
        name: "VANS_PEER_BUDGET_BYTES",
        default: "33554432",
        effect: "the TCP and io_uring vans queue at most this many bytes of large frames (64 KiB \
                 and up) per peer; a send that would exceed it waits until earlier frames are written, so \
                 what a small request queues behind is bounded; small frames never wait for it; \
                 `0`: no limit",
    },
    EnvVar {
        name: "VANS_CLUSTER_SECRET",
        default: "unset",
        effect: "the secret every node of the cluster shares (at least 16 bytes, e.g. \
                 `openssl rand -hex 32`); every connection of every van then runs a mutual \
                 HMAC-SHA256 challenge-response before any frame is read, and peers without \
                 it are refused. Unset: no authentication (a warning when listening on a \
                 non-loopback address)",
    },
    EnvVar {
        name: "VANS_CLUSTER_SECRET_FILE",
        default: "unset",
        effect: "a file holding the cluster secret (a trailing newline is ignored), e.g. a \
                 mounted Kubernetes Secret; not together with VANS_CLUSTER_SECRET",
    },
    EnvVar {
        name: "VANS_HANDSHAKE_TIMEOUT_MS",
        default: "10000",
        effect: "how long a new connection may take to authenticate before it is dropped",
    },
    EnvVar {
        name: "VANS_MAX_PENDING_PER_ADDRESS",
        default: "64",
        effect: "connections one source address may have authenticating at once; more are \
                 refused at once, so a flood of idle connections cannot hold a listener",
    },
    EnvVar {
        name: "VANS_MAX_CONNECTIONS",
        default: "8192",
        effect: "accepted connections a van keeps open at once, in all; more are closed at \
                 once (logged once per address), so a flood cannot take every descriptor",
    },
    EnvVar {
        name: "VANS_MAX_CONNECTIONS_PER_ADDRESS",
        default: "1024",
        effect: "accepted connections a van keeps open at once from one source address; more \
                 are closed at once, so one address cannot take every place",
    },
    EnvVar {
        name: "VANS_EAGER_CONNECT",
        default: "0",
        effect: "`1`: once the node table arrives, connect to every peer at once (as ps-lite \
                 does) instead of on first use; setup errors then surface at start",
    },
    EnvVar {
        name: "VANS_HOST_ID",
        default: "unset (boot id, host name and network namespace)",
        effect: "this machine's identity as announced to the cluster: nodes with equal \
                 identities share memory; override only to test selection",
    },
    EnvVar {
        name: "VANS_ENDPOINT_MAP",
        default: "unset (`./.endpoint_map` when that file exists)",
        effect: "file mapping control addresses to data addresses, one \
                 `host:port=host:port` per line, `#` comments, as in the TensorFlow \
                 Seastar and StarServer deployments; a missing or invalid file is an error",
    },
    EnvVar {
        name: "VANS_TF_SERVER",
        default: "0",
        effect: "`1`: this process runs a TensorFlow server on its TF_CONFIG address (set by \
                 `vans.tensorflow`'s `grpc+vans` server plugin): TF_CONFIG alone decides the \
                 role, the counts and the root address (DMLC_ROLE, DMLC_NUM_*, \
                 DMLC_PS_ROOT_*, DMLC_NODE_HOST, DMLC_PORT and VANS_RANK are ignored), and \
                 vans listens on the endpoint map's data addresses (which must name every \
                 task) or, without one, the scheduler on the first port above its task's \
                 that no task uses on that host",
    },
    EnvVar {
        name: "VANS_RDMA_FALLBACK",
        default: "none",
        effect: "what a node does when DMLC_ENABLE_RDMA asks for RDMA and it cannot be used (no \
                 device, no driver, no kernel support, van not compiled in, or a peer without \
                 RDMA): `none`: fail with an error naming the cause; `tcp`: warn and use the \
                 stream van instead",
    },
    EnvVar {
        name: "VANS_RDMA_DEVICE",
        default: "unset (the first device whose port 1 is active)",
        effect: "RDMA device the RDMA van opens, by name as `ibv_devices` lists it (e.g. \
                 `mlx5_0`, `rxe0`)",
    },
    EnvVar {
        name: "VANS_RDMA_GID_INDEX",
        default: "unset (auto: the RoCE v2 IPv4-mapped GID, else the first RoCE v2, else 0)",
        effect: "GID table index of port 1 the RDMA van uses; `vans-doctor` lists them",
    },
    EnvVar {
        name: "VANS_RDMA_RX_DEPTH",
        default: "128",
        effect: "receive buffers each RDMA connection posts (and so the credits a sender has \
                 for small messages); 4..=32768",
    },
    EnvVar {
        name: "BYTEPS_RDMA_RX_DEPTH",
        default: "128",
        effect: "BytePS's name for VANS_RDMA_RX_DEPTH; when both are set they must agree",
    },
    EnvVar {
        name: "VANS_RDMA_START_DEPTH",
        default: "16",
        effect: "large messages (RDMA write rendezvous) each RDMA connection keeps in flight \
                 before later sends wait; 1..=4096",
    },
    EnvVar {
        name: "BYTEPS_RDMA_START_DEPTH",
        default: "16",
        effect: "BytePS's name for VANS_RDMA_START_DEPTH; when both are set they must agree",
    },
    EnvVar {
        name: "VANS_RDMA_POOL_BYTES",
        default: "268435456 (256 MiB)",
        effect: "registered memory each RDMA van keeps for reuse (large receives, staging, \
                 `Postoffice::alloc`); more is registered on demand and released after use; \
                 the memlock limit must allow it",
    },
    EnvVar {
        name: "VANS_RDMA_MAX_HANDSHAKES",
        default: "16",
        effect: "accepted RDMA connections that may hold a queue pair and registered rings at \
                 once before their handshake completes (each holds 2 × VANS_RDMA_RX_DEPTH × 8 \
                 KiB, 2 MiB by default); an accepted connection gets one only once it has sent \
                 its queue-pair attributes, and more wait for a turn within the connect \
                 timeout (up to 64 per turn; more are closed at once), so a burst of \
                 connections cannot exhaust the memlock limit; at least 1",
    },
    EnvVar {
        name: "VANS_COLLECTIVE_SLICE_BYTES",
        default: "262144 (256 KiB)",
        effect: "largest message a collective sends; buffers travel in slices of this size, so \
                 a rank forwards one slice while the next is on its way; a whole number of \
                 bytes from 4096 to 1 GiB",
    },
    EnvVar {
        name: "VANS_COLLECTIVE_DIRECT_BYTES",
        default: "65536 (64 KiB)",
        effect: "all-reduces of buffers up to this many bytes take a latency-bound algorithm \
                 (see VANS_COLLECTIVE_ALGO) instead of Rabenseifner's or the ring; up to 1 GiB; \
                 0: never",
    },
    EnvVar {
        name: "VANS_COLLECTIVE_ALGO",
        default: "auto",
        effect: "the algorithm of each collective: auto (the collective crate's selection \
                 table decides: shm when every rank shares this host's memory; an all-reduce \
                 hier when the ranks run on several hosts with the same number on each; else \
                 by size and ranks; allreduce-bench --explain prints it), or comma-separated \
                 items ALGORITHM (every collective that has it) or COLLECTIVE:ALGORITHM, \
                 later items win (allreduce:ring,all_gather:direct). allreduce takes shm, \
                 hier (reduce-scatter through each host's shared memory, all-reduce of each \
                 share between hosts, all-gather through shared memory), direct (every rank \
                 sends its buffer to every other), doubling (recursive doubling: log2 n \
                 exchanges), rabenseifner (reduce-scatter by recursive halving, all-gather \
                 by recursive doubling) or ring (reduce-scatter and all-gather in slices); \
                 reduce_scatter shm, direct, halving or ring; all_gather shm, direct, \
                 doubling or ring; broadcast shm or ring; barrier shm, direct or doubling. \
                 shm and hier are errors when the ranks are not so placed; a bad item names \
                 itself; every choice gives every rank the same bits",
    },
    EnvVar {
        name: "VANS_COLLECTIVE_SPIN_US",
        default: "1000",
        effect: "microseconds a rank waiting on the shared-memory collectives spins before it \
                 sleeps on a futex (longer than a wake-up takes, or ranks fall into sleeping in \
                 turn); when this host's ranks outnumber the cores the process may use it \
                 yields its core instead of spinning; up to 1000000, 0: sleep at once",
    },
    EnvVar {
        name: "VANS_COLLECTIVE_MESH",
        default: "1",
        effect: "whether the workers of a generation that do not all share a host connect to \
                 each other directly over TCP for their collectives (every size; \
                 point-to-point messages stay on the vans), writing from the collective's \
                 buffers, polling like VANS_COLLECTIVE_SPIN_US says, instead of through the \
                 vans; only over tcp or \
                 uring, for up to 64 \
                 ranks, and never when the cluster authenticates (VANS_CLUSTER_SECRET): then \
                 every byte stays on the authenticated vans; 0 or 1",
    },
    EnvVar {
        name: "VANS_COLLECTIVE_SETTLE_WINDOW",
        default: "5",
        effect: "seconds the coordinator of the collectives waits for every live worker to \
                 join before it forms the next generation with those that did; in (0, 86400], \
                 fractions allowed",
    },
    EnvVar {
        name: "VANS_COLLECTIVE_TIMEOUT",
        default: "300",
        effect: "seconds a collective waits for one message before it fails naming the rank it \
                 waited for; in (0, 86400], fractions allowed",
    },
];

/// The `'static` name of a variable vans reads, or `None`.
pub(super) fn known_name(name: &str) -> Option<&'static str> {
    VARIABLES.iter().find(|v| v.name == name).map(|v| v.name)
}
