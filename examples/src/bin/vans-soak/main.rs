//! `vans-soak`: a cluster of real processes (a scheduler, servers, workers) on 127.0.0.1 with
//! a fault proxy in front of every node, a chaos schedule driving the proxies (delay,
//! throttle, blackhole, cut, reset) and garbage written to every node's port, while the
//! workers push, pull and push-pull and check every sum exactly. With `PS_RESEND` on, no
//! update may be lost or counted twice; the run says how many were checked and exits 1 if
//! any was.
//!
//! ```text
//! vans-soak --seconds 60 --van tcp      # 2 servers x 4 workers, TCP between them
//! vans-soak --seconds 60 --van ipc      # co-located nodes over shared memory
//! vans-soak --seconds 600 --network --kill-every 30 --long-every 60   # between hosts
//! ```
//!
//! With `--network` (root, `ip` and `nft`) the nodes run on three network-namespace hosts
//! and the faults are the kernel's, on the links between them: packet loss, partitions
//! both ways and one way, and partitions longer than the heartbeat timeout whose old
//! processes must be fenced when they come back (see `network.rs`).

mod driver;
mod network;
mod node;

use clap::Parser;

/// Soak a cluster under a chaos schedule and verify exact sums.
#[derive(Parser, Debug, Clone)]
#[command(version)]
pub(crate) struct Options {
    /// How long the workers run under chaos (seconds).
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Servers in the cluster.
    #[arg(long, default_value_t = 2)]
    servers: u32,
    /// Workers in the cluster.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Van between servers and workers: `tcp` (through the fault proxies) or `ipc` (shared
    /// memory; the scheduler's links still go through the proxies).
    #[arg(long, default_value = "tcp")]
    van: String,
    /// Seed of the chaos schedule (the same seed replays the same faults).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Shared keys every worker adds to.
    #[arg(long, default_value_t = 16)]
    keys: u64,
    /// Kill -9 a worker or a server (in turn) every this many seconds and start a new
    /// process in its place (0: never). Kills stop 10 s before the end.
    #[arg(long, default_value_t = 0.0)]
    kill_every: f64,
    /// Keep each process's log (its standard error: warnings and membership events) in this
    /// folder. Without it they go to a temporary folder that is removed at the end; they are
    /// printed when the run fails.
    #[arg(long)]
    logs: Option<std::path::PathBuf>,
    /// Run the nodes on three network-namespace hosts and inject the faults into the links
    /// between them (loss, partitions both ways and one way) instead of through proxies.
    /// Needs root, `ip` (iproute2) and `nft` (nftables).
    #[arg(long)]
    network: bool,
    /// With `--network`: a fixed plan of faults instead of the random schedule, as
    /// `HOST:KIND:SECONDS` steps separated by commas; KIND is `lossN` (N % of the packets
    /// dropped each way), `partition`, `deaf` (receives nothing), `mute` (sends nothing) or
    /// `long` (a partition beyond the heartbeat timeout: its nodes are replaced on host 0 and
    /// must be fenced when it heals). Example: `1:loss5:6,2:partition:2,1:long:0`.
    #[arg(long, requires = "network")]
    faults: Option<String>,
    /// With `--network`: cut host 1 or 2 (in turn) off for longer than the heartbeat timeout
    /// every this many seconds (0: never).
    #[arg(long, default_value_t = 0.0, requires = "network")]
    long_every: f64,
    /// With `--network`: start the replacements of a long cut's nodes on the other of hosts 1
    /// and 2 instead of host 0, so that a later cut of that host replaces a node a second
    /// time (a final barrier that then never completes is a known open fault, 1 run in 4).
    #[arg(long, requires = "network")]
    replace_across: bool,
    /// Heartbeat timeout of the nodes, in seconds (with `--network`; the proxy soak uses 20).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u64).range(2..=600))]
    heartbeat_timeout: u64,
    /// Print the worker's rounds every 250 ms (set by the driver).
    #[arg(long, hide = true)]
    ticks: bool,
    /// Run as one node of the cluster (set by the driver, with the node's environment).
    #[arg(long, hide = true)]
    node: bool,
    /// When a node's workers stop, in milliseconds since the epoch (set by the driver, so
    /// that a worker started again stops with the others).
    #[arg(long, hide = true)]
    until_ms: Option<u64>,
}

fn main() {
    let options = Options::parse();
    ::node::logging::init(false);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) if options.node => rt.block_on(node::run(&options)),
        Ok(rt) if options.network => rt.block_on(network::run(&options)),
        Ok(rt) => rt.block_on(driver::run(&options)),
        Err(e) => Err(e.into()),
    };
    if let Err(e) = result {
        eprintln!("vans-soak: {e}");
        std::process::exit(1);
    }
}

/// Errors of this program, for people.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
