//! The sparse mode (`--keys-per-request N`): each request carries N unique ids drawn from a
//! Zipf distribution over `--vocab` ids, `--value-floats` floats each, to servers holding an
//! embedding table ([`ps::optim`]) whose optimizer applies every push. Pulls land in the
//! caller's buffer, each server's answer copied once to its place ([`KvWorker::zpull_into`]).

use std::collections::HashSet;

use bytes::Bytes;
use examples::chaos::Rng;
use examples::raw::BoxError;
use examples::report::{Case, Figures, Mode, WorkerCase, WorkerReport};
use examples::splitmix64;
use ps::{node_ids, KvPairs, KvWorker, Postoffice};

use crate::node::run_case;
use crate::options::Options;

/// Distinct requests (id sets) a worker cycles through.
const REQUEST_SETS: usize = 32;

/// A uniform number in `[0, 1)`.
fn uniform(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A Zipf-like rank in `0..vocab` with exponent `s`: the inverse CDF of the continuous power
/// law on `[1, vocab + 1)` (uniform when `s` is 0).
fn zipf_rank(u: f64, vocab: u64, s: f64) -> u64 {
    let n = vocab as f64 + 1.0;
    let x = if (s - 1.0).abs() < 1e-9 {
        n.powf(u)
    } else {
        let a = 1.0 - s;
        ((n.powf(a) - 1.0) * u + 1.0).powf(1.0 / a)
    };
    (x as u64).saturating_sub(1).min(vocab - 1)
}

/// `REQUEST_SETS` requests' keys: `n` unique ids each, sorted, as little-endian bytes.
fn request_keys(o: &Options, rank: u32) -> Vec<Bytes> {
    let mut rng = Rng::new(0x5EED ^ u64::from(rank) << 32);
    (0..REQUEST_SETS)
        .map(|_| {
            let mut ids = HashSet::with_capacity(o.keys_per_request);
            while ids.len() < o.keys_per_request {
                let rank = zipf_rank(uniform(&mut rng), o.vocab, o.zipf);
                // Popular ranks spread over the key space, so over every server.
                ids.insert(splitmix64(rank));
            }
            let mut keys: Vec<u64> = ids.into_iter().collect();
            keys.sort_unstable();
            ps::values::to_bytes(&keys)
        })
        .collect()
}

/// Every sparse case of `o` (mode × in flight), measured into `report`.
pub(crate) async fn benchmark(
    po: &Postoffice,
    worker: &KvWorker<f32>,
    o: &Options,
    report: &mut WorkerReport,
) -> Result<(), BoxError> {
    let rank = po.my_rank();
    let requests = request_keys(o, rank);
    let bytes = o.keys_per_request * o.value_floats * 4;
    let grads = ps::values::to_bytes(&vec![1e-3f32; o.keys_per_request * o.value_floats]);
    let together = po.num_workers() > 1;
    let mut pulled = 0u64;
    for mode in o.modes() {
        for window in &o.windows {
            eprintln!(
                "worker {rank}: sparse {mode}, {} ids x {} floats, x{window} in flight ...",
                o.keys_per_request, o.value_floats
            );
            if together {
                po.barrier(node_ids::WORKER_GROUP).await?;
            }
            let cpu_before = crate::node::cluster_cpu_seconds(rank);
            let mut r = run_case(
                worker,
                *window,
                o,
                |i| {
                    let keys = requests[i % requests.len()].clone();
                    let pairs = KvPairs {
                        keys: keys.clone(),
                        vals: grads.clone(),
                        lens: None,
                    };
                    let worker = worker.clone();
                    async move {
                        match mode {
                            Mode::Push => worker.zpush(pairs, 0).await,
                            Mode::Pull => worker.zpull_into(keys, vec![0u8; bytes], 0).await,
                            Mode::PushPull => {
                                worker.zpush_pull_into(pairs, vec![0u8; bytes], 0).await
                            }
                        }
                    }
                },
                |answer| {
                    if mode == Mode::Push {
                        return Ok(());
                    }
                    if answer.vals.len() != bytes {
                        return Err(format!(
                            "a sparse pull answered {} bytes, not {bytes}",
                            answer.vals.len()
                        )
                        .into());
                    }
                    pulled += bytes as u64;
                    Ok(())
                },
            )
            .await?;
            let cpu = crate::node::cluster_cpu_seconds(rank)
                .zip(cpu_before)
                .map(|(after, before)| after - before);
            let case = Case {
                mode,
                size: bytes as u64,
                window: *window as u64,
                keys: o.keys_per_request as u64,
            };
            let figures = Figures::measure(case, r.ops, r.elapsed, &mut r.latencies_us, cpu);
            report.cases.push(WorkerCase { case, figures });
        }
    }
    let copied = worker.copied_pull_bytes();
    if pulled > 0 {
        // User-space copies of pulled values on this worker: the placement of each server's
        // answer into the caller's buffer (frames are decoded without copies).
        report.copies_per_pulled_byte = Some(copied as f64 / pulled as f64);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_ranks_stay_in_range_and_favour_the_head() {
        let vocab = 1_000_000;
        let mut rng = Rng::new(1);
        let mut head = 0;
        for _ in 0..10_000 {
            let rank = zipf_rank(uniform(&mut rng), vocab, 1.1);
            assert!(rank < vocab);
            head += u64::from(rank < 100);
        }
        // With s = 1.1 the first 100 of 10^6 ranks draw far more than 100/10^6 of the mass.
        assert!(head > 2_000, "{head}");
        assert_eq!(zipf_rank(0.0, vocab, 0.0), 0);
        assert_eq!(zipf_rank(0.999_999_999, vocab, 0.0), vocab - 1);
        assert_eq!(zipf_rank(0.5, 1, 2.0), 0);
    }
}
