//! A server's checkpoint hooks in a whole cluster in one process: a snapshot taken at a
//! barrier, more pushes, a restore, and the pulls read the values of the snapshot.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use node::local::LocalCluster;
use ps::{
    KvMeta, KvPairs, KvServer, KvWorker, NodeError, RequestHandler, Role, Snapshot, SumHandler,
    ALL_GROUPS,
};

/// Keys on both servers and on several shards of each.
const KEYS: [u64; 4] = [1, u64::MAX / 3, u64::MAX / 2 + 1, u64::MAX - 1];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_snapshot_brings_back_the_values_of_its_moment() {
    let cluster = LocalCluster::new(2, 2);
    let run = cluster.run(|po| async move {
        match po.role() {
            Role::Server => {
                let server = KvServer::<i64>::with_sum(&po, 0, 0, 3).await?;
                po.barrier(ALL_GROUPS).await?; // first pushes done
                let bytes = server.snapshot().await?.to_bytes();
                let snapshot = Snapshot::from_bytes(&bytes)?;
                assert_eq!(snapshot.shards(), 3);
                po.barrier(ALL_GROUPS).await?; // snapshot taken
                po.barrier(ALL_GROUPS).await?; // second pushes done
                server.restore(&snapshot).await?;
                // A fresh application started from the snapshot (as a restarted server would).
                let fresh = KvServer::<i64>::new_restored(
                    &po,
                    2,
                    0,
                    3,
                    |_| SumHandler::<i64>::default(),
                    &snapshot,
                )
                .await?;
                po.barrier(ALL_GROUPS).await?; // restored
                                               // A snapshot of another server's range is refused, naming both.
                let other = KvServer::<i64>::with_sum(&po, 1, 0, 2).await?;
                let refused = other.restore(&snapshot).await.unwrap_err();
                assert!(refused.to_string().contains("in 3 shards"), "{refused}");
                drop(fresh);
                po.finalize().await?;
            }
            Role::Worker => {
                let worker = KvWorker::<i64>::new(&po, 0, 0).await?;
                let rank = i64::from(po.my_rank());
                let push = |v: i64| {
                    let worker = worker.clone();
                    async move {
                        let id = worker.push(&KEYS, &[v; 4], None, 0).await?;
                        worker.wait(id).await.map(|_| ())
                    }
                };
                push(rank + 1).await?;
                po.barrier(ALL_GROUPS).await?;
                po.barrier(ALL_GROUPS).await?;
                push(100).await?;
                po.barrier(ALL_GROUPS).await?;
                po.barrier(ALL_GROUPS).await?;
                let id = worker.pull(&KEYS, 0).await?;
                let pulled = worker.wait(id).await?;
                // 1 + 2 from the first pushes; the 100s came after the snapshot.
                assert_eq!(&*pulled.vals::<i64>()?, &[3, 3, 3, 3]);
                let started_from = KvWorker::<i64>::new(&po, 2, 0).await?;
                let id = started_from.pull(&KEYS, 0).await?;
                let pulled = started_from.wait(id).await?;
                assert_eq!(&*pulled.vals::<i64>()?, &[3, 3, 3, 3]);
                po.finalize().await?;
            }
            Role::Scheduler => {
                for _ in 0..4 {
                    po.barrier(ALL_GROUPS).await?;
                }
                po.finalize().await?;
            }
        }
        Ok(())
    });
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the cluster did not finish in time")
        .expect("a node failed");
}

/// A handler without checkpoint support.
struct Plain;

impl RequestHandler for Plain {
    fn handle(&mut self, _: &KvMeta, _: KvPairs) -> Result<KvPairs, String> {
        Ok(KvPairs::default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_without_snapshots_says_so() {
    let cluster = LocalCluster::new(1, 1);
    let run = cluster.run(|po| async move {
        if po.role() == Role::Server {
            let server = KvServer::<f32>::new(&po, 0, 0, 2, |_| Plain).await?;
            match server.snapshot().await {
                Err(NodeError::InvalidArgument(e)) => {
                    assert!(e.contains("does not take snapshots"), "{e}")
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        po.finalize().await?;
        Ok(())
    });
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the cluster did not finish in time")
        .expect("a node failed");
}
