//! ps-bench's command line (clap) and the two settings a launching ps-bench passes its nodes
//! through the environment.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, ValueEnum};
use examples::cli::positive;
use examples::report::Mode;
use van_core::VanKind;

/// Set by a ps-bench that launches its own cluster: the directory where each worker writes
/// its results as `worker-RANK.json`, for the launching process to gather (nodes then print
/// no table of their own).
pub(crate) const RESULTS_DIR_ENV: &str = "PS_BENCH_RESULTS_DIR";

/// Set by a ps-bench that launches its own cluster: when it launched, in microseconds since
/// the Unix epoch, so each worker can report how long the cluster took to form.
pub(crate) const LAUNCHED_AT_ENV: &str = "PS_BENCH_LAUNCHED_AT";

/// `--mode`: what the workers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ModeArg {
    /// Push values to the servers.
    Push,
    /// Pull values from the servers.
    Pull,
    /// Push, then pull the new sum, in one request.
    #[value(alias = "push-pull")]
    Pushpull,
    /// push, pull and pushpull.
    All,
    /// Verify exact sums instead of measuring: every worker pushes known values, a barrier,
    /// then every worker pulls and compares with the expected total.
    Check,
    /// Workers arrive at a barrier 300 ms apart and print when they arrived and left.
    Barrier,
}

/// `--van`: which van carries the cluster's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum VanArg {
    /// Processes over TCP (the default).
    Tcp,
    /// Processes over io_uring (feature `uring`).
    Uring,
    /// One process, every node a task, over the in-process van.
    Inproc,
}

impl VanArg {
    pub(crate) fn kind(self) -> VanKind {
        match self {
            VanArg::Tcp => VanKind::Tcp,
            VanArg::Uring => VanKind::Uring,
            VanArg::Inproc => VanKind::InProcess,
        }
    }
}

/// ps-lite's test_benchmark over the vans parameter server.
///
/// Run it once per role with ps-lite's environment (DMLC_ROLE, DMLC_NUM_WORKER,
/// DMLC_NUM_SERVER, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT), or without DMLC_ROLE: then it
/// launches a local cluster of itself over TCP on 127.0.0.1 (1 scheduler, --servers servers,
/// --workers workers), gathers every worker's results and prints each case's rows with the
/// cluster's total.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "ps-bench",
    after_help = "Without DMLC_ROLE, ps-bench launches a local cluster of itself over TCP on \
                  127.0.0.1. With several workers each case has a row per worker and a total \
                  (ops/s and GB/s summed, p50/p99 the worst worker's, CPU the whole cluster's)."
)]
pub(crate) struct Options {
    /// What the workers do.
    #[arg(long, value_enum, default_value_t = ModeArg::All)]
    pub mode: ModeArg,
    /// Value bytes per request, comma-separated, multiples of 4 (values are f32).
    #[arg(long, value_delimiter = ',', default_value = "8,65536,1048576", value_parser = value_size)]
    pub sizes: Vec<usize>,
    /// Requests in flight, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64", value_parser = positive)]
    pub windows: Vec<usize>,
    /// Distinct keys, spread over the servers.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,
    /// Sparse mode: unique Zipf-distributed ids per request (instead of one key), each of
    /// `--value-floats` floats, from servers holding an embedding table whose optimizer
    /// (`--table`) applies every push; `--sizes` is then ignored.
    #[arg(long, default_value_t = 1, value_parser = positive)]
    pub keys_per_request: usize,
    /// Sparse mode: floats per key (the table's dim).
    #[arg(long, default_value_t = 64, value_parser = positive)]
    pub value_floats: usize,
    /// Sparse mode: the Zipf exponent of the ids (0 is uniform).
    #[arg(long, default_value_t = 1.1, value_parser = exponent)]
    pub zipf: f64,
    /// Sparse mode: distinct ids the requests draw from.
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub vocab: u64,
    /// Sparse mode: the servers' table settings (`ps::optim` spec; `dim` comes from
    /// `--value-floats`).
    #[arg(long, default_value = "optimizer=adagrad lr=0.01 init=normal std=0.01")]
    pub table: String,
    /// Seconds per case.
    #[arg(long, default_value_t = 0.3, value_parser = seconds)]
    pub seconds: f64,
    /// Requests per case instead of a duration.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: Option<u64>,
    /// Shards per server.
    #[arg(long, default_value_t = 1, value_parser = positive)]
    pub shards: usize,
    /// Servers when launching a local cluster.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub servers: u32,
    /// Workers when launching a local cluster.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub workers: u32,
    /// tcp (processes, the default), uring (processes, io_uring: feature `uring`) or inproc
    /// (one process, in-process van). A list of process vans (`tcp,uring`) runs the cluster
    /// once per van and prints them side by side, with ratios and the cluster's CPU seconds
    /// per GB. Naming tcp or uring turns shared memory off, so that van carries the traffic.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "V[,V..]")]
    pub van: Vec<VanArg>,
    /// Runtime threads per node; 1 runs each node on one thread.
    #[arg(long, default_value_t = 1, value_parser = positive)]
    pub threads: usize,
    /// Skip the raw-socket reference.
    #[arg(long)]
    pub no_raw: bool,
    /// Push values allocated with Postoffice::alloc (the IPC van's shared arena: a push to a
    /// co-located server then moves no payload bytes).
    #[arg(long)]
    pub zero_copy: bool,
    /// Print one JSON document on stdout instead of tables (logs and progress go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Also draw goodput and p50 latency against value size into this PNG, one line per
    /// (van, mode, in flight), from the cluster's totals.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Serve as the raw reference's echo process (started by worker 0).
    #[arg(long, hide = true)]
    pub raw_echo: bool,
    /// From `PS_BENCH_RESULTS_DIR` (see [`RESULTS_DIR_ENV`]).
    #[arg(skip)]
    pub results_dir: Option<PathBuf>,
    /// From `PS_BENCH_LAUNCHED_AT` (see [`LAUNCHED_AT_ENV`]).
    #[arg(skip)]
    pub launched_at: Option<SystemTime>,
    /// The arguments as given, passed on to the nodes a launching ps-bench starts.
    #[arg(skip)]
    pub args: Vec<String>,
}

impl Options {
    /// The command line and environment, parsed once; exits with clap's message (status 2) on
    /// a bad argument and with the help on `--help`.
    pub(crate) fn from_command_line() -> Options {
        let mut options = Options::parse();
        if options.van.len() > 1 && options.van.contains(&VanArg::Inproc) {
            Options::command()
                .error(
                    ErrorKind::ArgumentConflict,
                    "--van: inproc runs in one process and cannot be compared with process \
                     vans in one run",
                )
                .exit();
        }
        if options.plot.is_some() && options.modes().is_empty() {
            Options::command()
                .error(
                    ErrorKind::ArgumentConflict,
                    "--plot draws the benchmark's cases: --mode check and barrier have none",
                )
                .exit();
        }
        if options.sparse() {
            // At most half the ids: drawing nearly all of them would take long.
            if u64::try_from(options.keys_per_request).map_or(true, |n| n > options.vocab / 2) {
                Options::command()
                    .error(
                        ErrorKind::ValueValidation,
                        "--keys-per-request: more unique ids per request than half of --vocab",
                    )
                    .exit();
            }
            let bytes = options
                .keys_per_request
                .checked_mul(options.value_floats)
                .and_then(|v| v.checked_mul(4));
            if bytes.is_none_or(|b| b > 1 << 31) {
                Options::command()
                    .error(
                        ErrorKind::ValueValidation,
                        "--keys-per-request x --value-floats: a request over 2 GiB",
                    )
                    .exit();
            }
            if let Err(e) = options.table_spec() {
                Options::command()
                    .error(ErrorKind::ValueValidation, format!("--table: {e}"))
                    .exit();
            }
        }
        options.results_dir = std::env::var_os(RESULTS_DIR_ENV).map(PathBuf::from);
        if let Some(at) = std::env::var_os(LAUNCHED_AT_ENV) {
            match at.to_str().and_then(|v| v.parse::<u64>().ok()) {
                Some(micros) => {
                    options.launched_at = UNIX_EPOCH.checked_add(Duration::from_micros(micros))
                }
                None => Options::command()
                    .error(
                        ErrorKind::ValueValidation,
                        format!("{LAUNCHED_AT_ENV}={at:?}: not a count of microseconds"),
                    )
                    .exit(),
            }
        }
        options.args = std::env::args().skip(1).collect();
        options
    }

    /// Whether requests carry several keys (the sparse mode).
    pub(crate) fn sparse(&self) -> bool {
        self.keys_per_request > 1
    }

    /// The sparse mode's table: `--table` with `--value-floats` as its dim.
    pub(crate) fn table_spec(&self) -> Result<ps::optim::TableSpec, ps::NodeError> {
        format!("{} dim={}", self.table, self.value_floats).parse()
    }

    /// The benchmark modes to run (none for check and barrier).
    pub(crate) fn modes(&self) -> Vec<Mode> {
        match self.mode {
            ModeArg::Push => vec![Mode::Push],
            ModeArg::Pull => vec![Mode::Pull],
            ModeArg::Pushpull => vec![Mode::PushPull],
            ModeArg::All => Mode::ALL.to_vec(),
            ModeArg::Check | ModeArg::Barrier => Vec::new(),
        }
    }
}

fn value_size(value: &str) -> Result<usize, String> {
    let size = positive(value)?;
    if size % 4 != 0 {
        return Err(format!("{size} is not a multiple of 4 (values are f32)"));
    }
    Ok(size)
}

fn exponent(value: &str) -> Result<f64, String> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s >= 0.0 && s.is_finite())
        .ok_or_else(|| format!("`{value}` is not a number ≥ 0"))
}

fn seconds(value: &str) -> Result<f64, String> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && s.is_finite())
        .ok_or_else(|| format!("`{value}` is not a positive number"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_options_keep_ps_lite_names_and_defaults() {
        Options::command().debug_assert();
        let o = Options::try_parse_from(["ps-bench"]).unwrap();
        assert_eq!(o.modes(), Mode::ALL);
        assert_eq!(o.sizes, [8, 65_536, 1 << 20]);
        assert_eq!(o.windows, [1, 64]);
        assert_eq!((o.keys, o.seconds, o.servers, o.workers), (16, 0.3, 1, 1));
        let o = Options::try_parse_from([
            "ps-bench",
            "--mode",
            "push-pull",
            "--van",
            "tcp,uring",
            "--sizes",
            "8,4096",
            "--no-raw",
            "--json",
            "--plot",
            "/tmp/x.png",
        ])
        .unwrap();
        assert_eq!(o.modes(), [Mode::PushPull]);
        assert_eq!(o.van, [VanArg::Tcp, VanArg::Uring]);
        assert!(o.no_raw && o.json && o.plot.is_some());
        for bad in [
            &["--sizes", "6"][..],
            &["--windows", "0"],
            &["--seconds", "-1"],
            &["--van", "carrier-pigeon"],
            &["--mode", "fly"],
        ] {
            let args = std::iter::once("ps-bench").chain(bad.iter().copied());
            assert!(Options::try_parse_from(args).is_err(), "{bad:?}");
        }
    }
}
