//! `allreduce-bench`'s command line.

use clap::{Parser, Subcommand};

/// All-reduce over the vans beside Open MPI's `MPI_Allreduce`, 2 and 4 ranks as processes.
#[derive(Parser, Debug)]
#[command(name = "allreduce-bench", version)]
pub(crate) struct Options {
    /// Rank counts to run (each a local cluster of that many worker processes).
    #[arg(long, value_delimiter = ',', default_value = "2,4", value_parser = examples::cli::positive)]
    pub ranks: Vec<usize>,
    /// Buffer sizes in bytes (suffixes K, M: powers of 1024).
    #[arg(long, value_delimiter = ',', value_parser = size,
          default_value = "4K,16K,64K,256K,1M,4M,16M,64M")]
    pub sizes: Vec<usize>,
    /// Vans to run: tcp (shared memory off), uring (the io_uring stream van, shared memory
    /// off; needs feature uring; Open MPI beside it over TCP), ipc (shared memory between
    /// the co-located ranks; needs feature ipc).
    #[arg(long, value_delimiter = ',', default_value = "tcp")]
    pub van: Vec<String>,
    /// Collectives to time: allreduce, allgather, reducescatter, broadcast (sizes are the
    /// whole buffer: all-gather's output, reduce-scatter's input).
    #[arg(long, value_delimiter = ',', default_value = "allreduce", value_parser = collective_name)]
    pub collectives: Vec<String>,
    /// Spread each rank count over this many hosts, made of network namespaces joined by a
    /// bridge (needs root and `ip`), the ranks in order (`0..n/N` on the first): over ipc,
    /// shared memory within a host and TCP between hosts (vans' all-reduce goes
    /// hierarchically); Open MPI runs with the same placement (`mpirun` with a remote shell
    /// that enters the namespaces). Every rank count must be a multiple.
    #[arg(long, default_value = "1", value_parser = examples::cli::positive)]
    pub hosts: usize,
    /// Print one JSON object per measured row (vans and MPI, with the ratios) instead of the
    /// table.
    #[arg(long)]
    pub json: bool,
    /// Timed collectives per size up to 1 MiB (fewer above, at least 5).
    #[arg(long, default_value = "50", value_parser = examples::cli::positive)]
    pub iters: usize,
    /// Open MPI beside vans: auto (when mpicc and mpirun are installed), off, or required.
    #[arg(long, default_value = "auto", value_parser = ["auto", "off", "required"])]
    pub mpi: String,
    /// Runtime worker threads of each rank process: they carry the vans' I/O, while the
    /// collectives run on the main thread (polling shared memory or their sockets, as MPI's
    /// ranks do).
    #[arg(long, default_value = "1", value_parser = examples::cli::positive)]
    pub threads: usize,
    /// Take vans' all-reduce buffers from `Postoffice::alloc` (the IPC van's shared arena,
    /// made large enough for the largest size) instead of the heap: over ipc, the
    /// shared-memory all-reduce then reads each rank's buffer where it lies instead of
    /// copying it in.
    #[arg(long)]
    pub alloc: bool,
    /// Also draw bus bandwidth against size to this PNG.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Print the algorithm each size and rank count takes (the collective crate's plan,
    /// with this environment's VANS_COLLECTIVE_* settings) and exit without running.
    #[arg(long)]
    pub explain: bool,
    #[command(subcommand)]
    pub node: Option<NodeCommand>,
}

/// Internal: one process of a cluster (the driver starts these).
#[derive(Subcommand, Debug)]
pub(crate) enum NodeCommand {
    /// Run as one node of a cluster (role from DMLC_ROLE).
    Node {
        #[command(subcommand)]
        mode: NodeMode,
    },
}

/// What a worker process does.
#[derive(Subcommand, Debug)]
pub(crate) enum NodeMode {
    /// Every collective once, results checked exactly.
    Check,
    /// A loop of all-reduces that survives failures and joins, each step checked exactly.
    Elastic {
        /// Steps to complete.
        #[arg(long, default_value = "200")]
        steps: u64,
        /// Elements (i64) per all-reduce.
        #[arg(long, default_value = "10000")]
        len: usize,
        /// Pause after each step, in milliseconds.
        #[arg(long, default_value = "10")]
        step_ms: u64,
        /// The rank `--die-rank` of the first generation kills itself (SIGKILL) 3 ms into
        /// this step's all-reduce, while the others wait on it or on each other (fault
        /// tests).
        #[arg(long)]
        die_at_step: Option<u64>,
        /// The rank that dies at `--die-at-step`.
        #[arg(long, default_value = "1")]
        die_rank: usize,
    },
    /// Each collective once at each size, printing the algorithm it took
    /// (`took COLLECTIVE BYTES ALGORITHM`): the grid `--explain` predicts.
    Select {
        /// Sizes in bytes, the whole buffer (each a multiple of 4 × the rank count).
        #[arg(long, value_delimiter = ',', value_parser = size)]
        sizes: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "allreduce", value_parser = collective_name)]
        collectives: Vec<String>,
    },
    /// Rank 1 calls another collective than the others (fault tests): `length` (an
    /// all-reduce of 1200 f32 where the others reduce 1000), `dtype` (of 1000 f64) or
    /// `collective` (an all-gather of 1000 f32); every rank prints the error it got.
    Mismatch {
        #[arg(value_parser = ["length", "dtype", "collective"])]
        what: String,
    },
    /// Time collectives of each size (rank 0 reports).
    Bench {
        #[arg(long, value_delimiter = ',', value_parser = size)]
        sizes: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "allreduce", value_parser = collective_name)]
        collectives: Vec<String>,
        #[arg(long, default_value = "50")]
        iters: usize,
        /// All-reduce buffers from `Postoffice::alloc`.
        #[arg(long)]
        alloc: bool,
    },
}

/// The collectives the bench times, as both sides name them.
pub(crate) const COLLECTIVES: [&str; 4] = ["allreduce", "allgather", "reducescatter", "broadcast"];

fn collective_name(text: &str) -> Result<String, String> {
    let name = text.trim().to_ascii_lowercase().replace(['-', '_'], "");
    match COLLECTIVES.contains(&name.as_str()) {
        true => Ok(name),
        false => Err(format!(
            "`{text}`: expected one of {}",
            COLLECTIVES.join(", ")
        )),
    }
}

/// `4096`, `4K`, `64M`: a size in bytes.
fn size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().last() {
        Some((at, 'K' | 'k')) => (&t[..at], 1 << 10),
        Some((at, 'M' | 'm')) => (&t[..at], 1 << 20),
        Some((at, 'G' | 'g')) => (&t[..at], 1 << 30),
        _ => (t, 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|n| *n >= 4 && *n % 4 == 0)
        .ok_or_else(|| format!("`{text}` is not a size of whole f32s (4, 4K, 64M)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_suffixes() {
        assert_eq!(size("4K"), Ok(4096));
        assert_eq!(size("64M"), Ok(64 << 20));
        assert_eq!(size("8"), Ok(8));
        for bad in ["0", "3", "1.5K", "K", "-4", "6"] {
            assert!(size(bad).is_err(), "{bad}");
        }
    }
}
