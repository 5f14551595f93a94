//! Embedding tables with server-side optimizers (`ps::optim`) in a whole cluster in one
//! process: pulls spanning every server and shard written into the caller's buffer, rows as
//! the seeded initializer gives them, asynchronous and synchronous steps checked against a
//! single table fed the same gradients, and a table snapshot restored on a running server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use node::local::LocalCluster;
use ps::optim::{initial_rows, TableHandler, TableSpec, ACCUMULATE_CMD, APPLY_CMD};
use ps::values::to_bytes;
use ps::{node_ids, KvMeta, KvPairs, KvServer, KvWorker, NodeError, RequestHandler, Role};
use van_core::DataType;

const SPEC: &str = "optimizer=adam dim=4 lr=0.05 init=normal std=0.1 seed=11";
const WORKERS: u32 = 2;

/// Keys on all three servers and on both shards of each.
fn keys() -> Vec<u64> {
    (0..12u64).map(|i| i * (u64::MAX / 12) + 3).collect()
}

/// Worker `rank`'s gradient for the `k`-th key at `step`.
fn grad(rank: u32, step: u32, k: usize) -> Vec<f32> {
    (0..4)
        .map(|j| ((rank * 7 + step * 3 + k as u32 + j) % 11) as f32 / 5.0 - 1.0)
        .collect()
}

fn push(table: &mut TableHandler, cmd: i32, keys: &[u64], grads: &[f32]) {
    let meta = KvMeta {
        cmd,
        push: true,
        pull: false,
        sender: 9,
        request_id: 0,
        app_id: 0,
        customer_id: 0,
        val_type: DataType::F32,
    };
    table
        .handle(&meta, KvPairs::from_slices(keys, grads, None))
        .unwrap();
}

fn rows(table: &mut TableHandler, keys: &[u64]) -> Vec<f32> {
    let meta = KvMeta {
        cmd: 0,
        push: false,
        pull: true,
        sender: 9,
        request_id: 0,
        app_id: 0,
        customer_id: 0,
        val_type: DataType::F32,
    };
    let answer = table
        .handle(&meta, KvPairs::from_slices::<f32>(keys, &[], None))
        .unwrap();
    answer.vals::<f32>().unwrap().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_step_as_one_table_would_in_both_modes_and_restore_mid_run() {
    let spec: TableSpec = SPEC.parse().unwrap();
    let both = node_ids::SERVER_GROUP | node_ids::WORKER_GROUP;
    let results = LocalCluster::new(3, WORKERS)
        .run(move |po| async move {
            let mut got: Vec<Vec<f32>> = Vec::new();
            match po.role() {
                Role::Server => {
                    let server =
                        KvServer::<f32>::new(&po, 0, 0, 2, |_| TableHandler::new(spec)).await?;
                    // Mid-run: a snapshot, then (after the workers stepped on) a rollback.
                    po.barrier(both).await?;
                    let snapshot = server.snapshot().await?;
                    po.barrier(both).await?;
                    po.barrier(both).await?;
                    server.restore(&snapshot).await?;
                    po.barrier(both).await?;
                    po.finalize().await?;
                }
                Role::Worker => {
                    let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
                    let rank = po.my_rank();
                    let keys = keys();
                    let key_bytes = to_bytes(&keys);
                    // First touch: the initializer's rows, into a buffer with no join.
                    let id = worker
                        .zpull_into(key_bytes.clone(), vec![0u8; keys.len() * 16], 0)
                        .await?;
                    got.push(worker.wait(id).await?.vals::<f32>()?.into_owned());
                    // A buffer that is not whole rows is refused at the call.
                    match worker.zpull_into(key_bytes.clone(), vec![0u8; 50], 0).await {
                        Err(NodeError::InvalidArgument(why)) => assert!(why.contains("50 bytes")),
                        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
                    }
                    // Synchronous: both workers accumulate, meet, apply, meet.
                    for step in 0..3 {
                        let grads: Vec<f32> =
                            (0..keys.len()).flat_map(|k| grad(rank, step, k)).collect();
                        let id = worker.push(&keys, &grads, None, ACCUMULATE_CMD).await?;
                        worker.wait(id).await?;
                        po.barrier(node_ids::WORKER_GROUP).await?;
                        let id = worker
                            .zpull_into(key_bytes.clone(), vec![0u8; keys.len() * 16], APPLY_CMD)
                            .await?;
                        worker.wait(id).await?;
                        po.barrier(node_ids::WORKER_GROUP).await?;
                    }
                    let id = worker.pull(&keys, 0).await?;
                    got.push(worker.wait(id).await?.vals::<f32>()?.into_owned());
                    // The servers snapshot between these two barriers.
                    po.barrier(both).await?;
                    po.barrier(both).await?;
                    // Asynchronous, after the snapshot: worker 0 pushes, then it is rolled back.
                    if rank == 0 {
                        let grads: Vec<f32> = (0..keys.len()).flat_map(|k| grad(9, 9, k)).collect();
                        let pairs = KvPairs::from_slices(&keys, &grads, None);
                        let id = worker
                            .zpush_pull_into(pairs, vec![0u8; keys.len() * 16], 0)
                            .await?;
                        got.push(worker.wait(id).await?.vals::<f32>()?.into_owned());
                    }
                    // The servers restore the snapshot between these two barriers.
                    po.barrier(both).await?;
                    po.barrier(both).await?;
                    let id = worker.zpull(Bytes::from(key_bytes.to_vec()), 0).await?;
                    got.push(worker.wait(id).await?.vals::<f32>()?.into_owned());
                    po.finalize().await?;
                }
                Role::Scheduler => po.finalize().await?,
            }
            Ok(got)
        })
        .await
        .unwrap();
    let keys = keys();
    // The reference: one table, fed each step's summed gradients once, then worker 0's push.
    let mut reference = TableHandler::new(spec);
    let initial = initial_rows(&spec, &keys);
    assert_eq!(rows(&mut reference, &keys), initial);
    for step in 0..3 {
        for rank in 0..WORKERS {
            let grads: Vec<f32> = (0..keys.len()).flat_map(|k| grad(rank, step, k)).collect();
            push(&mut reference, ACCUMULATE_CMD, &keys, &grads);
        }
        let meta = KvMeta {
            cmd: APPLY_CMD,
            push: false,
            pull: true,
            sender: 9,
            request_id: 0,
            app_id: 0,
            customer_id: 0,
            val_type: DataType::F32,
        };
        reference
            .handle(&meta, KvPairs::from_slices::<f32>(&keys, &[], None))
            .unwrap();
    }
    let synced = rows(&mut reference, &keys);
    let mut stepped = TableHandler::new(spec);
    stepped.restore(&reference.snapshot().unwrap()).unwrap();
    let grads: Vec<f32> = (0..keys.len()).flat_map(|k| grad(9, 9, k)).collect();
    push(&mut stepped, 0, &keys, &grads);
    let after_push = rows(&mut stepped, &keys);
    assert_ne!(after_push, synced);
    let workers: Vec<&Vec<Vec<f32>>> = results.iter().filter(|r| !r.is_empty()).collect();
    assert_eq!(workers.len(), WORKERS as usize);
    for (rank, got) in workers.iter().enumerate() {
        assert_eq!(got[0], initial, "worker {rank}: first pull");
        assert_eq!(got[1], synced, "worker {rank}: after the synchronous steps");
        if got.len() == 4 {
            assert_eq!(got[2], after_push, "the push-pull's answer");
        }
        assert_eq!(
            got.last().unwrap(),
            &synced,
            "worker {rank}: after the rollback"
        );
    }
    assert!(workers.iter().any(|g| g.len() == 4));
}
