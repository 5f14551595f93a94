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
//! ```

mod driver;
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
