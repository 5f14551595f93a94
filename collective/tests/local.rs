//! Every collective on 2, 3 and 4 ranks of an in-process cluster (the process tests in
//! `examples/tests/collective.rs` run the same over real vans): sizes that do not divide by
//! the rank count, zero-length buffers, many slices per chunk, every element type.

use collective::{bf16, CommOptions, Communicator, ReduceOp};
use node::Postoffice;

mod common;

/// What one worker saw: its rank and the bits of its floating-point results.
type Seen = (usize, Vec<u64>);

/// Twice: all-reduces around the ring only, then with small buffers sent to every rank at
/// once (two communicators of the same node, told apart by their customer ids).
async fn worker(po: Postoffice) -> collective::Result<Seen> {
    let ring = CommOptions {
        customer_id: 1,
        direct_bytes: 0,
        ..options()
    };
    let (_, ring_bits) = collectives(&po, ring).await?;
    let (rank, bits) = collectives(&po, options()).await?;
    Ok((rank, [ring_bits, bits].concat()))
}

fn options() -> CommOptions {
    CommOptions {
        // Many slices per chunk, so the pipeline really pipelines.
        slice_bytes: 4096,
        // A worker whose check panics leaves the others waiting for it: they fail after
        // this, not after the default 300 s.
        timeout: std::time::Duration::from_secs(20),
        ..CommOptions::default()
    }
}

async fn collectives(
    po: &Postoffice,
    options: CommOptions,
) -> collective::Result<(usize, Vec<u64>)> {
    let customer = options.customer_id;
    let mut comm = Communicator::with_options(po, options).await?;
    let (r, n) = (comm.rank().unwrap_or(usize::MAX), comm.size());
    assert_eq!(n as u32, po.num_workers());
    let mut bits = Vec::new();

    // i32 sum, a length no rank count divides, many slices.
    let len = 10_007;
    let mut a: Vec<i32> = (0..len).map(|i| (r * 100_000 + i) as i32).collect();
    comm.allreduce(&mut a, ReduceOp::Sum).await?;
    for (i, v) in a.iter().enumerate() {
        let expected: i64 = (0..n).map(|k| (k * 100_000 + i) as i64).sum();
        assert_eq!(*v as i64, expected, "i32 sum at {i}");
    }
    // i64 min and max.
    let mut lo: Vec<i64> = (0..7).map(|i| i * 10 - r as i64).collect();
    comm.allreduce(&mut lo, ReduceOp::Min).await?;
    assert_eq!(
        lo,
        (0..7).map(|i| i * 10 - (n as i64 - 1)).collect::<Vec<_>>()
    );
    let mut hi: Vec<i64> = (0..3).map(|i| i + r as i64).collect();
    comm.allreduce(&mut hi, ReduceOp::Max).await?;
    assert_eq!(hi, (0..3).map(|i| i + n as i64 - 1).collect::<Vec<_>>());
    // i32 mean truncates toward zero.
    let mut mean = vec![r as i32 * 3 + 1; 5];
    comm.allreduce(&mut mean, ReduceOp::Mean).await?;
    let total: i32 = (0..n as i32).map(|k| k * 3 + 1).sum();
    assert_eq!(mean, vec![total / n as i32; 5]);
    // f64 and f32 sums: within rounding of the reference, the same bits everywhere.
    let mut f: Vec<f64> = (0..3001)
        .map(|i| (i as f64 + 0.1) * (r + 1) as f64 / 7.0)
        .collect();
    comm.allreduce(&mut f, ReduceOp::Sum).await?;
    for (i, v) in f.iter().enumerate() {
        let reference: f64 = (0..n)
            .map(|k| (i as f64 + 0.1) * (k + 1) as f64 / 7.0)
            .sum();
        assert!(
            (v - reference).abs() <= 1e-9 * reference.abs().max(1.0),
            "f64 at {i}"
        );
    }
    bits.extend(f.iter().map(|v| v.to_bits()));
    let mut g: Vec<f32> = (0..2049)
        .map(|i| (i as f32).sin() * (r + 1) as f32)
        .collect();
    comm.allreduce(&mut g, ReduceOp::Mean).await?;
    for (i, v) in g.iter().enumerate() {
        let reference = (0..n)
            .map(|k| (i as f32).sin() * (k + 1) as f32)
            .sum::<f32>()
            / n as f32;
        assert!(
            (v - reference).abs() <= 1e-5,
            "f32 mean at {i}: {v} vs {reference}"
        );
    }
    bits.extend(g.iter().map(|v| u64::from(v.to_bits())));
    // bf16: small integers are exact.
    let mut h: Vec<bf16> = (0..9).map(|i| bf16::from_f32((i + r) as f32)).collect();
    comm.allreduce(&mut h, ReduceOp::Sum).await?;
    for (i, v) in h.iter().enumerate() {
        let expected: usize = (0..n).map(|k| i + k).sum();
        assert_eq!(v.to_f32(), expected as f32, "bf16 at {i}");
    }
    // Zero-length and single-element buffers.
    let mut empty: Vec<f32> = Vec::new();
    comm.allreduce(&mut empty, ReduceOp::Sum).await?;
    let mut one = vec![r as i64 + 1];
    comm.allreduce(&mut one, ReduceOp::Sum).await?;
    assert_eq!(one, vec![(n * (n + 1) / 2) as i64]);
    // Reduce-scatter: this rank's chunk holds the sums.
    let mut rs: Vec<i32> = (0..10).map(|i| i * (r as i32 + 1)).collect();
    let mine = comm.reduce_scatter(&mut rs, ReduceOp::Sum).await?;
    assert_eq!(mine, collective::ring::chunk(10, n, r));
    let factor: i32 = (1..=n as i32).sum();
    for i in mine {
        assert_eq!(rs[i], i as i32 * factor, "reduce_scatter at {i}");
    }
    // A mean reduce-scatter truncates once: rank q contributes q + 1 at every element.
    let mut rm: Vec<i64> = vec![r as i64 + 1; 13];
    let mine = comm.reduce_scatter(&mut rm, ReduceOp::Mean).await?;
    let mean = (1..=n as i64).sum::<i64>() / n as i64;
    assert!(rm[mine].iter().all(|&v| v == mean), "mean reduce_scatter");
    // All-gather, with an empty input too.
    let input: Vec<f64> = (0..3).map(|i| (r * 10 + i) as f64).collect();
    let mut out = vec![0.0; 3 * n];
    comm.all_gather(&input, &mut out).await?;
    let expected: Vec<f64> = (0..n)
        .flat_map(|k| (0..3).map(move |i| (k * 10 + i) as f64))
        .collect();
    assert_eq!(out, expected);
    let mut nothing: Vec<i32> = Vec::new();
    comm.all_gather(&[], &mut nothing).await?;
    // Broadcast from the last rank, many slices.
    let mut b: Vec<i64> = if r == n - 1 {
        (0..5000).map(|i| i * 7).collect()
    } else {
        vec![-1; 5000]
    };
    comm.broadcast(&mut b, n - 1).await?;
    assert_eq!(b, (0..5000).map(|i| i * 7).collect::<Vec<_>>());
    // Bad arguments are errors, not hangs, and take no collective number: here only rank 0
    // makes them, and the barrier after still meets the others'.
    if r == 0 {
        assert!(comm.broadcast(&mut b, n).await.is_err());
        assert!(comm.all_gather(&input, &mut out[1..]).await.is_err());
    }
    comm.barrier().await?;
    // No rank leaves a barrier before every rank reached it: the last rank arrives late.
    let key = (n, customer);
    if r == n - 1 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    *ARRIVED.lock().unwrap().entry(key).or_default() += 1;
    comm.barrier().await?;
    let arrived = ARRIVED.lock().unwrap()[&key];
    assert_eq!(
        arrived, n,
        "rank {r} left the barrier with {arrived} of {n} ranks there"
    );
    Ok((r, bits))
}

/// Ranks that reached the second barrier, by rank count and customer id (the tests of
/// each rank count run at once, in this process).
static ARRIVED: std::sync::Mutex<std::collections::BTreeMap<(usize, i32), usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn run(workers: u32) {
    let seen = common::on_each_worker(workers, worker);
    let mut ranks: Vec<usize> = seen.iter().map(|(r, _)| *r).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..workers as usize).collect::<Vec<_>>());
    for (rank, bits) in &seen[1..] {
        assert!(
            bits == &seen[0].1,
            "rank {rank}'s floating-point results differ from rank {}'s",
            seen[0].0
        );
    }
}

#[test]
fn two_ranks() {
    run(2);
}

#[test]
fn three_ranks() {
    run(3);
}

#[test]
fn four_ranks() {
    run(4);
}

#[test]
fn one_rank_is_the_identity() {
    run(1);
}
