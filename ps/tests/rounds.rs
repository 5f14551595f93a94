//! Synchronous rounds (`ROUND_CMD`) in a whole cluster in one process: every worker gets each
//! round's exact sum, round after round, and a round request of several keys is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use node::local::LocalCluster;
use ps::{node_ids, KvServer, KvWorker, NodeError, Role, ROUND_CMD};

/// Keys on both servers and on several shards of each.
const KEYS: [u64; 5] = [1, 2, u64::MAX / 3, u64::MAX / 2 + 1, u64::MAX - 1];
const WORKERS: u32 = 3;
const ROUNDS: u32 = 4;

/// Key `k` carries `k + 1` values.
fn len_of(k: usize) -> usize {
    k + 1
}

/// What worker `rank` pushes for key `k` in round `round`: different in every round.
fn pushed(rank: u32, round: u32, k: usize) -> Vec<f32> {
    (0..len_of(k))
        .map(|j| ((rank + 1) * (round + 1)) as f32 + (k * 10 + j) as f32 + (round * rank) as f32)
        .collect()
}

/// The round's sum of key `k`: what every worker must get.
fn round_sum(round: u32, k: usize) -> Vec<f32> {
    let mut sum = vec![0.0; len_of(k)];
    for rank in 0..WORKERS {
        for (s, v) in sum.iter_mut().zip(pushed(rank, round, k)) {
            *s += v;
        }
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_gets_each_rounds_exact_sum() {
    let results = LocalCluster::new(2, WORKERS)
        .run(|po| async move {
            let mut got = Vec::new();
            match po.role() {
                Role::Server => {
                    let _server = KvServer::<f32>::with_sum(&po, 0, 0, 3).await?;
                    po.finalize().await?;
                }
                Role::Worker => {
                    let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
                    let rank = po.my_rank();
                    for round in 0..ROUNDS {
                        // Every key's round in flight at once, one request per key; workers
                        // start their rounds at different moments.
                        tokio::time::sleep(std::time::Duration::from_millis(
                            u64::from((rank + round) % WORKERS) * 20,
                        ))
                        .await;
                        let mut ids = Vec::new();
                        for (k, key) in KEYS.iter().enumerate() {
                            let vals = pushed(rank, round, k);
                            ids.push(worker.push_pull(&[*key], &vals, None, ROUND_CMD).await?);
                        }
                        for (k, id) in ids.into_iter().enumerate() {
                            let pairs = worker.wait(id).await?;
                            assert_eq!(pairs.keys()?.as_ref(), &[KEYS[k]]);
                            assert_eq!(
                                pairs.lens()?.map(|l| l.to_vec()),
                                Some(vec![len_of(k) as i32])
                            );
                            got.push((round, k, pairs.vals::<f32>()?.to_vec()));
                        }
                    }
                    // Several keys in one round request: refused whether they fall in one
                    // shard (the handler says so) or in several (the server does).
                    for keys in [[1u64, 2], [1, u64::MAX / 3]] {
                        let id = worker
                            .push_pull(&keys, &[1.0, 2.0], None, ROUND_CMD)
                            .await?;
                        match worker.wait(id).await {
                            Err(NodeError::HandlerFailed { reason, .. }) => {
                                assert!(reason.contains("one key per request"), "{reason}");
                            }
                            other => panic!("a two-key round was not refused: {other:?}"),
                        }
                    }
                    // The ps-lite store never saw the rounds: its keys were never pushed.
                    let id = worker.pull(&KEYS, 0).await?;
                    match worker.wait(id).await {
                        Err(NodeError::HandlerFailed { reason, .. }) => {
                            assert!(reason.contains("was never pushed"), "{reason}");
                        }
                        other => panic!("the store answered keys only rounds saw: {other:?}"),
                    }
                    po.barrier(node_ids::WORKER_GROUP).await?;
                    po.finalize().await?;
                }
                Role::Scheduler => po.finalize().await?,
            }
            Ok(got)
        })
        .await
        .unwrap();
    let workers: Vec<_> = results.into_iter().filter(|r| !r.is_empty()).collect();
    assert_eq!(workers.len(), WORKERS as usize);
    for got in workers {
        assert_eq!(got.len(), (ROUNDS as usize) * KEYS.len());
        for (round, k, vals) in got {
            assert_eq!(vals, round_sum(round, k), "round {round}, key {}", KEYS[k]);
        }
    }
}
