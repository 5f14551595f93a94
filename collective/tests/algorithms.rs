//! Every all-reduce algorithm (`direct`, `doubling`, `rabenseifner`, `ring`, forced through
//! `CommOptions::algorithm`) on 1 to 5 ranks of an in-process cluster, with lengths no rank
//! count divides: each rank's floats equal, bit for bit, the total taken in the algorithm's
//! own fixed order (values of very different magnitudes, so another order gives other bits).

use collective::{
    doubling, halving, ring, Algorithm, CommOptions, Communicator, Element, ReduceOp,
};
use node::Postoffice;

mod common;

const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Direct,
    Algorithm::Doubling,
    Algorithm::Rabenseifner,
    Algorithm::Ring,
];
/// Lengths: one element, fewer than the ranks, a prime, several 4 KiB slices plus a bit.
const LENGTHS: [usize; 4] = [1, 3, 1009, 3 * 1024 + 7];

/// Rank `rank`'s element `i`: magnitudes from 1e-3 to 1e5, so sums round differently in
/// different orders.
fn value(rank: usize, i: usize) -> f64 {
    let scale = [1e5, 1e-3, 7.0, 3e3, 0.25][rank % 5];
    scale * (1.0 + ((i * 7 + rank * 13) % 101) as f64 / 97.0)
}

/// What `algorithm` computes for element `i` of a buffer of `len` on `n` ranks.
fn expected<T: Element>(
    algorithm: Algorithm,
    n: usize,
    len: usize,
    i: usize,
    op: ReduceOp,
    make: impl Fn(usize, usize) -> T,
) -> T {
    let v: Vec<T> = (0..n).map(|k| make(k, i)).collect();
    let total = match algorithm {
        // In rank order.
        Algorithm::Direct => v[1..].iter().fold(v[0], |acc, x| acc.combine(*x, op)),
        Algorithm::Doubling => return doubling::reference(&v, op).unwrap_or(v[0]),
        Algorithm::Rabenseifner => return halving::reference(&v, op).unwrap_or(v[0]),
        // Element i lies in chunk c, which starts at rank c + 1 and gathers each next rank's
        // value in front of what came.
        _ => {
            let c = (0..n)
                .find(|&c| ring::chunk(len, n, c).contains(&i))
                .unwrap_or(0);
            (2..=n).fold(v[(c + 1) % n], |acc, k| v[(c + k) % n].combine(acc, op))
        }
    };
    match op {
        ReduceOp::Mean => total.divide(n),
        _ => total,
    }
}

/// What one rank saw: how many elements it compared, and the first mismatches.
type Seen = (usize, Vec<String>);

/// Runs every case and compares; a mismatch is noted, not a panic, so the other ranks are
/// not left waiting for this one's next collective.
async fn every_algorithm(po: Postoffice) -> collective::Result<Seen> {
    let mut checked = 0;
    let mut wrong = Vec::new();
    let mut note = |what: String| {
        if wrong.len() < 5 {
            wrong.push(what);
        }
    };
    for (a, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let options = CommOptions {
            customer_id: a as i32 + 1,
            slice_bytes: 4096,
            algorithm: algorithm.into(),
            ..CommOptions::default()
        };
        let mut comm = Communicator::with_options(&po, options).await?;
        let (r, n) = (comm.rank().unwrap_or(usize::MAX), comm.size());
        for len in LENGTHS {
            for op in [ReduceOp::Sum, ReduceOp::Mean] {
                let mut f: Vec<f64> = (0..len).map(|i| value(r, i)).collect();
                comm.allreduce(&mut f, op).await?;
                let mut g: Vec<f32> = (0..len).map(|i| value(r, i) as f32).collect();
                comm.allreduce(&mut g, op).await?;
                for i in 0..len {
                    let want = expected(algorithm, n, len, i, op, value);
                    if f[i].to_bits() != want.to_bits() {
                        note(format!(
                            "{algorithm} f64 {op:?} on {n} ranks, len {len}, at {i}: rank {r} \
                             has {} for {want}",
                            f[i]
                        ));
                    }
                    let want = expected(algorithm, n, len, i, op, |k, i| value(k, i) as f32);
                    if g[i].to_bits() != want.to_bits() {
                        note(format!(
                            "{algorithm} f32 {op:?} on {n} ranks, len {len}, at {i}: rank {r} \
                             has {} for {want}",
                            g[i]
                        ));
                    }
                    checked += 2;
                }
            }
        }
        // Integers: exact whatever the order.
        let mut ints: Vec<i64> = (0..LENGTHS[2]).map(|i| (r * 1000 + i) as i64).collect();
        comm.allreduce(&mut ints, ReduceOp::Sum).await?;
        for (i, v) in ints.iter().enumerate() {
            let want: i64 = (0..n).map(|k| (k * 1000 + i) as i64).sum();
            if *v != want {
                note(format!(
                    "{algorithm} i64 sum at {i}: rank {r} has {v} for {want}"
                ));
            }
        }
    }
    Ok((checked, wrong))
}

fn run(workers: u32) {
    let seen = common::on_each_worker(workers, every_algorithm);
    let wrong: Vec<&String> = seen.iter().flat_map(|(_, w)| w).collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Every rank compared every element of every case.
    let per_rank = ALGORITHMS.len() * 2 * 2 * LENGTHS.iter().sum::<usize>();
    assert!(seen.iter().all(|(c, _)| *c == per_rank));
}

#[test]
fn every_algorithm_on_one_rank() {
    run(1);
}

#[test]
fn every_algorithm_on_two_ranks() {
    run(2);
}

#[test]
fn every_algorithm_on_three_ranks() {
    run(3);
}

#[test]
fn every_algorithm_on_four_ranks() {
    run(4);
}

#[test]
fn every_algorithm_on_five_ranks() {
    run(5);
}

/// The all-reduce's rows: shared memory where the ranks share it (hierarchically on even
/// hosts), else by size and rank count, unless an algorithm is named.
#[test]
fn allreduce_chooses_by_placement_and_size_unless_told() {
    use collective::{Collective, Layout};
    let options = CommOptions::default();
    let choose = |options: &CommOptions, bytes, ranks, layout| {
        collective::choose(options, Collective::AllReduce, layout, bytes, ranks)
    };
    for (bytes, ranks) in [(4096, 2), (64 << 20, 4), (1, 3)] {
        assert_eq!(
            choose(&options, bytes, ranks, Layout::OneHost),
            Algorithm::Shm
        );
        assert_eq!(
            choose(&options, bytes, ranks, Layout::EvenHosts),
            Algorithm::Hier
        );
    }
    let plan = |bytes, ranks| choose(&options, bytes, ranks, Layout::Apart);
    for ranks in [2, 3, 5, 6] {
        assert_eq!(plan(4096, ranks), Algorithm::Direct, "{ranks}");
    }
    for ranks in [4, 8, 16] {
        assert_eq!(plan(4096, ranks), Algorithm::Doubling, "{ranks}");
        assert_eq!(plan(options.direct_bytes, ranks), Algorithm::Doubling);
    }
    let medium = collective::RABENSEIFNER_MAX_BYTES;
    assert_eq!(plan(options.direct_bytes + 1, 4), Algorithm::Rabenseifner);
    assert_eq!(plan(medium, 5), Algorithm::Rabenseifner);
    assert_eq!(plan(medium + 1, 4), Algorithm::Ring);
    assert_eq!(plan(options.direct_bytes + 1, 3), Algorithm::Ring);
    for told in [Algorithm::Doubling, Algorithm::Hier, Algorithm::Shm] {
        let options = CommOptions {
            algorithm: told.into(),
            ..CommOptions::default()
        };
        for layout in [Layout::OneHost, Layout::EvenHosts, Layout::Apart] {
            assert_eq!(choose(&options, 64 << 20, 4, layout), told);
        }
    }
}
