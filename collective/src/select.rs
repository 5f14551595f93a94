//! Which algorithm a collective takes: one table ([`TABLE`]) of rows — collective,
//! placement, byte range, rank rule → algorithm, each with the measurement behind it — and
//! one [`choose`] that reads it. Every collective's dispatch, the shared-memory ticket and
//! `allreduce-bench --explain` call [`choose`], so what `--explain` prints is what runs;
//! `VANS_COLLECTIVE_ALGO` ([`CommOptions::algorithm`]) tells a collective to take one
//! algorithm instead.

use std::fmt;

use crate::hosts::{self, Placement};
use crate::options::CommOptions;

pub use van_core::config::{
    CollectiveAlgorithm as Algorithm, CollectiveAlgorithms as Algorithms,
    CollectiveKind as Collective,
};

/// Where a generation's ranks run, as [`choose`] asks.
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

impl Layout {
    /// The layout of ranks placed `ranks_per_host` (host by host, ranks numbered in that
    /// order) when they can share memory with their host's others (`shared_memory`), worked
    /// out by the same rules as a communicator's from its node table: one rank alone, or
    /// hosts with different counts, are [`Layout::Apart`].
    pub fn of_hosts(shared_memory: bool, ranks_per_host: &[usize]) -> Layout {
        if !shared_memory {
            return Layout::Apart;
        }
        let names: Vec<String> = ranks_per_host
            .iter()
            .enumerate()
            .flat_map(|(h, &n)| std::iter::repeat_n(format!("host {h}"), n))
            .collect();
        let host: Vec<&str> = names.iter().map(String::as_str).collect();
        Layout::of(&hosts::of_groups(hosts::group_by_host(&host)))
    }

    pub(crate) fn of(placement: &Placement) -> Layout {
        match placement {
            Placement::OneHost => Layout::OneHost,
            Placement::Hosts(_) => Layout::EvenHosts,
            Placement::Apart(_) => Layout::Apart,
        }
    }
}

/// The largest buffer (bytes, the whole buffer: an all-gather's output) a row takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpTo {
    /// Any size.
    Any,
    /// [`CommOptions::direct_bytes`] (`VANS_COLLECTIVE_DIRECT_BYTES`).
    DirectBytes,
    /// [`RABENSEIFNER_MAX_BYTES`].
    RabenseifnerMax,
}

/// The rank counts a row takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ranks {
    /// Any.
    Any,
    /// 4 or more.
    AtLeast4,
    /// 4, 8, 16 …
    PowerOfTwoFrom4,
}

/// One row of the selection table: the collectives, placements, sizes and rank counts it
/// covers, the algorithm they take, and why.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// The collectives the row covers.
    pub collectives: &'static [Collective],
    /// The placements it covers.
    pub layouts: &'static [Layout],
    /// The largest buffer it covers (smaller rows come first: the first row that covers a
    /// call decides).
    pub up_to: UpTo,
    /// The rank counts it covers.
    pub ranks: Ranks,
    /// The algorithm those calls take.
    pub algorithm: Algorithm,
    /// The measurement behind the row.
    pub measured: &'static str,
}

impl Row {
    fn covers(&self, options: &CommOptions, call: Call) -> bool {
        let small = match self.up_to {
            UpTo::Any => true,
            UpTo::DirectBytes => call.bytes <= options.direct_bytes,
            UpTo::RabenseifnerMax => call.bytes <= RABENSEIFNER_MAX_BYTES,
        };
        let ranks = match self.ranks {
            Ranks::Any => true,
            Ranks::AtLeast4 => call.ranks >= 4,
            Ranks::PowerOfTwoFrom4 => call.ranks >= 4 && call.ranks.is_power_of_two(),
        };
        self.collectives.contains(&call.collective)
            && self.layouts.contains(&call.layout)
            && small
            && ranks
    }
}

impl fmt::Display for Row {
    /// `allreduce, all_gather | apart, even hosts | up to VANS_COLLECTIVE_DIRECT_BYTES |
    /// 4, 8, 16 … ranks -> doubling`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.collectives.iter().map(|c| c.as_str()).collect();
        let layouts: Vec<&str> = self
            .layouts
            .iter()
            .map(|l| match l {
                Layout::OneHost => "one host",
                Layout::EvenHosts => "even hosts",
                Layout::Apart => "apart",
            })
            .collect();
        let up_to = match self.up_to {
            UpTo::Any => "any size",
            UpTo::DirectBytes => "up to VANS_COLLECTIVE_DIRECT_BYTES",
            UpTo::RabenseifnerMax => "up to 512 KiB",
        };
        let ranks = match self.ranks {
            Ranks::Any => "any ranks",
            Ranks::AtLeast4 => "4 ranks or more",
            Ranks::PowerOfTwoFrom4 => "4, 8, 16 … ranks",
        };
        write!(
            f,
            "{} | {} | {up_to} | {ranks} -> {}",
            names.join(", "),
            layouts.join(", "),
            self.algorithm
        )
    }
}

/// Largest all-reduce that takes Rabenseifner's algorithm (on 4 ranks or more, above
/// `direct_bytes`), the ring beyond. `allreduce-bench`, TCP on loopback, 4 ranks on 2 cores,
/// two runs each: Rabenseifner took 176–183 µs at 128 KiB where the ring took 221–239, and
/// 791–851 at 512 KiB where it took 879–901; at 1 MiB 1403–1536 where the ring took
/// 1272–1318.
pub const RABENSEIFNER_MAX_BYTES: usize = 512 << 10;

const EVERY: &[Collective] = &[
    Collective::AllReduce,
    Collective::ReduceScatter,
    Collective::AllGather,
    Collective::Broadcast,
    Collective::Barrier,
];
/// Where collectives go by messages.
const BY_MESSAGES: &[Layout] = &[Layout::EvenHosts, Layout::Apart];

/// The selection table, read top to bottom: the first row that covers a call decides. Every
/// call is covered (the last rows take any size and rank count). Measured with
/// `allreduce-bench` (`--collectives` for the others than all-reduce) on a 2-core machine,
/// 2 to 4 ranks; the figures are beside each row.
pub const TABLE: &[Row] = &[
    Row {
        collectives: EVERY,
        layouts: &[Layout::OneHost],
        up_to: UpTo::Any,
        ranks: Ranks::Any,
        algorithm: Algorithm::Shm,
        measured: "no messages: each rank copies in, reduces its share of every rank's in \
                   place and copies out; all-reduce 0.84–2.91× Open MPI's shared memory's \
                   speed (4 KiB–64 MiB, 2 and 4 ranks, one run); a barrier over messages let \
                   its ranks sleep, and rounds after it took 46 µs instead of 0.9",
    },
    Row {
        collectives: &[Collective::AllReduce],
        layouts: &[Layout::EvenHosts],
        up_to: UpTo::Any,
        ranks: Ranks::Any,
        algorithm: Algorithm::Hier,
        measured: "each rank's link carries one share between the hosts, shared memory the \
                   rest; hosts made of network namespaces, busbw against Open MPI's on the \
                   same placement, two runs: 2 × 2 ranks 0.92–3.66×, 3 × 2 1.06–2.86×",
    },
    Row {
        collectives: &[Collective::AllReduce, Collective::AllGather],
        layouts: BY_MESSAGES,
        up_to: UpTo::DirectBytes,
        ranks: Ranks::PowerOfTwoFrom4,
        algorithm: Algorithm::Doubling,
        measured: "recursive doubling took 15–35% less time than the direct exchange at \
                   4–64 KiB on 4 ranks (TCP); no better on 2 (the same exchange) or 3 (its \
                   fold-in step costs a latency)",
    },
    Row {
        collectives: &[Collective::ReduceScatter],
        layouts: BY_MESSAGES,
        up_to: UpTo::DirectBytes,
        ranks: Ranks::PowerOfTwoFrom4,
        algorithm: Algorithm::Halving,
        measured: "4 ranks, TCP, p50 at 4–64 KiB: halving and doubling 39–61 µs, the \
                   direct exchange 66–92, the ring 94–122",
    },
    Row {
        collectives: &[
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
        ],
        layouts: BY_MESSAGES,
        up_to: UpTo::DirectBytes,
        ranks: Ranks::Any,
        algorithm: Algorithm::Direct,
        measured: "one message latency: 4 ranks, TCP, 4–64 KiB: the ring took 94–122 µs \
                   for a reduce-scatter or all-gather, the direct exchange 66–92",
    },
    Row {
        collectives: &[Collective::AllReduce],
        layouts: BY_MESSAGES,
        up_to: UpTo::RabenseifnerMax,
        ranks: Ranks::AtLeast4,
        algorithm: Algorithm::Rabenseifner,
        measured: "4 ranks, TCP: 176–183 µs at 128 KiB where the ring took 221–239, \
                   791–851 at 512 KiB where it took 879–901 (at 1 MiB the ring is ahead)",
    },
    Row {
        collectives: &[
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllGather,
            Collective::Broadcast,
        ],
        layouts: BY_MESSAGES,
        up_to: UpTo::Any,
        ranks: Ranks::Any,
        algorithm: Algorithm::Ring,
        measured: "bandwidth-bound: 2 (n - 1) / n buffers per rank, sliced and pipelined; \
                   4 ranks, TCP, 1 MiB: 1272–1318 µs where Rabenseifner's took 1403–1536",
    },
    Row {
        collectives: &[Collective::Barrier],
        layouts: BY_MESSAGES,
        up_to: UpTo::Any,
        ranks: Ranks::PowerOfTwoFrom4,
        algorithm: Algorithm::Doubling,
        measured: "a barrier is an all-reduce of one token: the small all-reduce's rows",
    },
    Row {
        collectives: &[Collective::Barrier],
        layouts: BY_MESSAGES,
        up_to: UpTo::Any,
        ranks: Ranks::Any,
        algorithm: Algorithm::Direct,
        measured: "a barrier is an all-reduce of one token: the small all-reduce's rows",
    },
];

/// A call as the table reads it.
#[derive(Clone, Copy, Debug)]
struct Call {
    collective: Collective,
    layout: Layout,
    bytes: usize,
    ranks: usize,
}

/// The row of [`TABLE`] that decides a `collective` of `bytes` (the whole buffer) on
/// `ranks` ranks placed as `layout` (`None` only when the table misses a call, which its
/// tests rule out).
pub fn row(
    options: &CommOptions,
    collective: Collective,
    layout: Layout,
    bytes: usize,
    ranks: usize,
) -> Option<&'static Row> {
    let call = Call {
        collective,
        layout,
        bytes,
        ranks,
    };
    TABLE.iter().find(|r| r.covers(options, call))
}

/// The algorithm a `collective` of `bytes` (the whole buffer: an all-gather's output) on
/// `ranks` ranks placed as `layout` takes with `options` (never `Auto`): the one
/// `options.algorithm` tells it to take, else the [`TABLE`]'s. Every rank of a generation
/// decides alike (same options, same size: checked by each collective; the same node
/// table).
pub fn choose(
    options: &CommOptions,
    collective: Collective,
    layout: Layout,
    bytes: usize,
    ranks: usize,
) -> Algorithm {
    match options.algorithm.of(collective) {
        Algorithm::Auto => row(options, collective, layout, bytes, ranks)
            .map_or(Algorithm::Direct, |r| r.algorithm),
        told => runnable(collective, told, ranks),
    }
}

/// `told`, unless `collective` cannot run it on `ranks` ranks: a reduce-scatter by
/// recursive halving and an all-gather by recursive doubling pair ranks by their bits, so
/// they run on 1, 2, 4, 8 … ranks only (the all-reduces fold the others in); on other
/// counts they take the direct exchange, as the table's rows do.
fn runnable(collective: Collective, told: Algorithm, ranks: usize) -> Algorithm {
    match (collective, told) {
        (Collective::ReduceScatter, Algorithm::Halving)
        | (Collective::AllGather, Algorithm::Doubling)
            if !ranks.is_power_of_two() =>
        {
            Algorithm::Direct
        }
        _ => told,
    }
}

/// [`choose`] among the algorithms that send messages: for a call that does not go through
/// shared memory (the ranks apart, or their group not to be had), or the share a
/// hierarchical all-reduce sends between hosts.
pub fn by_messages(
    options: &CommOptions,
    collective: Collective,
    bytes: usize,
    ranks: usize,
) -> Algorithm {
    match options.algorithm.of(collective) {
        told if told.by_messages() => runnable(collective, told, ranks),
        _ => row(options, collective, Layout::Apart, bytes, ranks)
            .map_or(Algorithm::Direct, |r| r.algorithm),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every collective, placement, size and rank count finds a row, and the row's
    /// algorithm is one the collective can be told to take.
    #[test]
    fn the_table_covers_every_call_with_an_algorithm_of_its_collective() {
        let options = CommOptions::default();
        for collective in Collective::ALL {
            for layout in [Layout::OneHost, Layout::EvenHosts, Layout::Apart] {
                for bytes in [0, 4, 64 << 10, (64 << 10) + 4, 512 << 10, (512 << 10) + 4] {
                    for ranks in 1..=9 {
                        let row = row(&options, collective, layout, bytes, ranks);
                        let Some(row) = row else {
                            panic!("no row for {collective} {layout:?} {bytes} B {ranks} ranks");
                        };
                        assert!(collective.algorithms().contains(&row.algorithm), "{row}");
                    }
                }
            }
        }
        // With no latency-bound sizes, a barrier still finds its rows.
        let options = CommOptions {
            direct_bytes: 0,
            ..CommOptions::default()
        };
        let barrier = choose(&options, Collective::Barrier, Layout::Apart, 4, 3);
        assert_eq!(barrier, Algorithm::Direct);
    }

    #[test]
    fn a_told_algorithm_wins_and_the_others_decide() {
        let options = CommOptions {
            algorithm: "allreduce:ring,all_gather:direct"
                .parse()
                .unwrap_or_default(),
            ..CommOptions::default()
        };
        let of = |c| choose(&options, c, Layout::Apart, 4096, 4);
        assert_eq!(of(Collective::AllReduce), Algorithm::Ring);
        assert_eq!(of(Collective::AllGather), Algorithm::Direct);
        assert_eq!(of(Collective::ReduceScatter), Algorithm::Halving);
        assert_eq!(of(Collective::Barrier), Algorithm::Doubling);
        let shm = choose(&options, Collective::Broadcast, Layout::OneHost, 4096, 4);
        assert_eq!(shm, Algorithm::Shm);
        // Pairing by bits needs 2, 4, 8 … ranks: told so on 3 or 6, the direct exchange.
        let options = CommOptions {
            algorithm: "all_gather:doubling,reduce_scatter:halving"
                .parse()
                .unwrap_or_default(),
            ..CommOptions::default()
        };
        for ranks in [3, 6] {
            for c in [Collective::AllGather, Collective::ReduceScatter] {
                assert_eq!(
                    choose(&options, c, Layout::Apart, 1 << 20, ranks),
                    Algorithm::Direct
                );
                assert_eq!(by_messages(&options, c, 1 << 20, ranks), Algorithm::Direct);
            }
        }
        let four = choose(&options, Collective::AllGather, Layout::Apart, 1 << 20, 4);
        assert_eq!(four, Algorithm::Doubling);
    }

    #[test]
    fn layouts_follow_the_node_table_rules() {
        assert_eq!(Layout::of_hosts(true, &[3]), Layout::OneHost);
        assert_eq!(Layout::of_hosts(true, &[1]), Layout::Apart);
        assert_eq!(Layout::of_hosts(true, &[2, 2]), Layout::EvenHosts);
        assert_eq!(Layout::of_hosts(true, &[2, 1]), Layout::Apart);
        assert_eq!(Layout::of_hosts(true, &[1, 1]), Layout::Apart);
        assert_eq!(Layout::of_hosts(false, &[4]), Layout::Apart);
    }
}
