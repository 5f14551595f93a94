//! Which all-reduce algorithm runs: [`plan`] by placement, size and rank count (unless
//! `VANS_COLLECTIVE_ALGO` names one), and the message algorithms' dispatch.

use van_core::config::CollectiveAlgorithm as Algorithm;

use crate::comm::{self, CommOptions};
use crate::element::{Element, ReduceOp};
use crate::error::Result;
use crate::{doubling, halving, ring};

/// Where a generation's ranks run, as [`plan`] asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Every rank shares this host's memory.
    OneHost,
    /// Several hosts, each running the same number (2 or more) of ranks that share its
    /// memory.
    EvenHosts,
    /// Otherwise (or shared memory is off).
    Apart,
}

/// The algorithm an all-reduce of `bytes` on `ranks` ranks placed as `layout` takes with
/// `options` (never `Auto`): the one `options.algorithm` names; else [`Algorithm::Shm`] on
/// one host and [`Algorithm::Hier`] on even hosts; else, up to `options.direct_bytes`,
/// [`Algorithm::Doubling`] on 4, 8, 16 … ranks and [`Algorithm::Direct`] on others; up to
/// [`RABENSEIFNER_MAX_BYTES`] on 4 ranks or more, [`Algorithm::Rabenseifner`]; the
/// [`Algorithm::Ring`] beyond (a hierarchical all-reduce picks its between-hosts algorithm
/// the same way, for the hosts and the share). The message algorithms were chosen from
/// `allreduce-bench` runs on a 2-core machine (TCP and shared memory, 2 to 4 ranks):
/// recursive doubling took 15–35% less time than the direct exchange at 4 KiB–64 KiB on 4
/// ranks, and was no better on 2 (the same exchange) or 3 (its fold-in step costs a
/// latency); Rabenseifner's against the ring, see [`RABENSEIFNER_MAX_BYTES`]. Every rank of
/// a generation decides alike (same options, same size: checked by each collective; the
/// same node table).
pub fn plan(options: &CommOptions, bytes: usize, ranks: usize, layout: Layout) -> Algorithm {
    match (options.algorithm, layout) {
        (Algorithm::Auto, Layout::OneHost) => Algorithm::Shm,
        (Algorithm::Auto, Layout::EvenHosts) => Algorithm::Hier,
        (Algorithm::Auto, Layout::Apart) => by_messages(options, bytes, ranks),
        (chosen, _) => chosen,
    }
}

/// Largest all-reduce that takes Rabenseifner's algorithm (on 4 ranks or more, above
/// `direct_bytes`), the ring beyond. `allreduce-bench`, TCP on loopback, 4 ranks on 2 cores,
/// two runs each: Rabenseifner took 176–183 µs at 128 KiB where the ring took 221–239, and
/// 791–851 at 512 KiB where it took 879–901; at 1 MiB 1403–1536 where the ring took
/// 1272–1318.
pub const RABENSEIFNER_MAX_BYTES: usize = 512 << 10;

/// [`plan`] among the algorithms that send messages.
fn by_messages(options: &CommOptions, bytes: usize, ranks: usize) -> Algorithm {
    match options.algorithm {
        Algorithm::Auto | Algorithm::Shm | Algorithm::Hier
            if bytes > options.direct_bytes && bytes <= RABENSEIFNER_MAX_BYTES && ranks >= 4 =>
        {
            Algorithm::Rabenseifner
        }
        Algorithm::Auto | Algorithm::Shm | Algorithm::Hier if bytes > options.direct_bytes => {
            Algorithm::Ring
        }
        Algorithm::Auto | Algorithm::Shm | Algorithm::Hier
            if ranks >= 4 && ranks.is_power_of_two() =>
        {
            Algorithm::Doubling
        }
        Algorithm::Auto | Algorithm::Shm | Algorithm::Hier => Algorithm::Direct,
        chosen => chosen,
    }
}

/// All-reduce of a numbered collective by the message algorithm [`plan`] picks.
pub(crate) async fn run_by_messages<T: Element>(
    shared: &comm::Shared,
    call: &comm::Op,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    match by_messages(&shared.options, std::mem::size_of_val(buf), call.size()) {
        Algorithm::Direct => ring::direct(shared, call, buf, op).await,
        Algorithm::Doubling => doubling::allreduce(shared, call, buf, op).await,
        Algorithm::Rabenseifner => halving::allreduce(shared, call, buf, op).await,
        Algorithm::Auto | Algorithm::Shm | Algorithm::Hier | Algorithm::Ring => {
            ring::reduce(shared, call, buf, op, 2).await
        }
    }
}
