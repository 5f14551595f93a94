//! Whole clusters in one process (in-process van): sums, barriers, failures, bootstrap.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use node::local::LocalCluster;
use ps::{
    node_ids, KvMeta, KvPairs, KvServer, KvWorker, NodeError, Postoffice, RequestHandler, Role,
    SumHandler,
};
use tokio::sync::Notify;
use van_core::inproc::{Hub, InProcessVan};
use van_core::{Config, VanKind};

/// Keys on both servers and on several shards of each: near 0, the middle, and the top.
fn keys() -> Vec<u64> {
    vec![
        0,
        1,
        2,
        u64::MAX / 3,
        u64::MAX / 2 - 1,
        u64::MAX / 2 + 1,
        u64::MAX - 1,
        u64::MAX,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_read_back_exact_sums_with_lengths_across_servers_and_shards() {
    let workers = 3u32;
    let results = LocalCluster::new(2, workers)
        .run(move |po| async move {
            let mut pulled = None;
            match po.role() {
                Role::Server => {
                    let _server = KvServer::<f64>::with_sum(&po, 0, 0, 3).await?;
                    po.finalize().await?;
                }
                Role::Worker => {
                    let worker = KvWorker::<f64>::new(&po, 0, 0).await?;
                    let keys = keys();
                    // Key i holds i + 1 values; worker r pushes (r + 1) * (i + 1) + j.
                    let lens: Vec<i32> = (1..=keys.len() as i32).collect();
                    let r = f64::from(po.my_rank());
                    let vals: Vec<f64> = lens
                        .iter()
                        .enumerate()
                        .flat_map(|(i, n)| {
                            (0..*n).map(move |j| (r + 1.0) * (i as f64 + 1.0) + f64::from(j))
                        })
                        .collect();
                    let id = worker.push(&keys, &vals, Some(&lens), 0).await?;
                    worker.wait(id).await?;
                    po.barrier(node_ids::WORKER_GROUP).await?;
                    let id = worker.pull(&keys, 0).await?;
                    pulled = Some(worker.wait(id).await?);
                    po.barrier(node_ids::WORKER_GROUP).await?;
                    // push_pull returns the value after this push.
                    let id = worker.push_pull(&keys[..1], &[1.0], Some(&[1]), 0).await?;
                    let after = worker.wait(id).await?;
                    assert!(after.vals::<f64>()?[0] >= 1.0 + 6.0);
                    po.finalize().await?;
                }
                Role::Scheduler => po.finalize().await?,
            }
            Ok(pulled)
        })
        .await
        .unwrap();
    let w = f64::from(workers);
    let rank_sum = w * (w + 1.0) / 2.0;
    let pulled: Vec<KvPairs> = results.into_iter().flatten().collect();
    assert_eq!(pulled.len(), workers as usize);
    for pairs in pulled {
        assert_eq!(pairs.keys().unwrap().as_ref(), keys().as_slice());
        let lens = pairs.lens().unwrap().unwrap().to_vec();
        assert_eq!(lens, (1..=keys().len() as i32).collect::<Vec<_>>());
        let expected: Vec<f64> = lens
            .iter()
            .enumerate()
            .flat_map(|(i, n)| (0..*n).map(move |j| rank_sum * (i as f64 + 1.0) + w * f64::from(j)))
            .collect();
        assert_eq!(pairs.vals::<f64>().unwrap().as_ref(), expected.as_slice());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_releases_only_when_every_member_arrived() {
    let arrived = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&arrived);
    let seen = LocalCluster::new(1, 4)
        .run(move |po| {
            let arrived = Arc::clone(&counter);
            async move {
                let mut seen = None;
                if po.role() == Role::Worker {
                    // Staggered arrivals: the last worker comes 300 ms after the first.
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(po.my_rank()))).await;
                    arrived.fetch_add(1, Ordering::SeqCst);
                    po.barrier(node_ids::WORKER_GROUP).await?;
                    seen = Some(arrived.load(Ordering::SeqCst));
                }
                // Servers and the scheduler are not members of the worker group: asking them to
                // wait on it is refused at once instead of hanging.
                if po.role() != Role::Worker {
                    let refused = po.barrier(node_ids::WORKER_GROUP).await;
                    assert!(
                        matches!(refused, Err(NodeError::InvalidArgument(_))),
                        "{refused:?}"
                    );
                }
                po.finalize().await?;
                Ok(seen)
            }
        })
        .await
        .unwrap();
    let seen: Vec<u32> = seen.into_iter().flatten().collect();
    assert_eq!(seen, vec![4, 4, 4, 4], "a worker left the barrier early");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_finalize_every_call_is_stopped_and_finalize_again_succeeds() {
    LocalCluster::new(1, 1)
        .run(|po| async move {
            let worker = match po.role() {
                Role::Worker => Some(KvWorker::<f32>::new(&po, 0, 0).await?),
                Role::Server => {
                    let _server = KvServer::<f32>::with_sum(&po, 0, 0, 1).await?;
                    po.finalize().await?;
                    return Ok(());
                }
                Role::Scheduler => None,
            };
            if let Some(worker) = &worker {
                worker
                    .wait(worker.push(&[1], &[2.0], None, 0).await?)
                    .await?;
            }
            po.finalize().await?;
            // ps-lite programs finalize by habit under runners that finalize too.
            po.finalize().await?;
            // Whatever van carried it, a call on a finalized node is `Stopped`.
            let barrier = po
                .barrier(node_ids::WORKER_GROUP | node_ids::SERVER_GROUP)
                .await;
            assert!(matches!(barrier, Err(NodeError::Stopped)), "{barrier:?}");
            if let Some(worker) = &worker {
                let push = worker.push(&[1], &[2.0], None, 0).await;
                assert!(matches!(push, Err(NodeError::Stopped)), "{push:?}");
                // A worker made on a finalized node is refused as every call is.
                let late = KvWorker::<f32>::new(&po, 0, 1).await.map(|_| ());
                assert!(matches!(late, Err(NodeError::Stopped)), "{late:?}");
            }
            Ok(())
        })
        .await
        .unwrap();
}

/// Delays its answer to `cmd` 7 and tells the node to die meanwhile.
struct DyingHandler(Arc<Notify>);

impl RequestHandler for DyingHandler {
    fn handle(&mut self, meta: &KvMeta, _request: KvPairs) -> Result<KvPairs, String> {
        if meta.cmd == 7 {
            // Wake the node from another thread: a wake-up from this (blocked) runtime thread
            // would sit in its local queue until the handler returns.
            let die = Arc::clone(&self.0);
            std::thread::spawn(move || die.notify_one());
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(KvPairs::default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_requests_to_a_dead_server_fail_with_its_name() {
    let result = LocalCluster::new(1, 1)
        .run(|po| async move {
            match po.role() {
                Role::Server => {
                    let die = Arc::new(Notify::new());
                    let signal = Arc::clone(&die);
                    let make = move |_| DyingHandler(Arc::clone(&signal));
                    let _server = KvServer::<f32>::new(&po, 0, 0, 1, make).await?;
                    die.notified().await;
                    po.stop().await; // the server dies with the request pending
                    Ok(None)
                }
                Role::Worker => {
                    let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
                    let id = worker.push(&[5], &[1.0], None, 7).await?;
                    let outcome = tokio::time::timeout(Duration::from_secs(20), worker.wait(id))
                        .await
                        .expect("the pending request never completed");
                    po.stop().await;
                    Ok(Some(outcome.map(|_| ())))
                }
                Role::Scheduler => {
                    // The scheduler sees the server go too; its finalize barrier then fails.
                    let _ = tokio::time::timeout(Duration::from_secs(20), po.finalize()).await;
                    Ok(None)
                }
            }
        })
        .await
        .unwrap();
    let outcome = result.into_iter().flatten().next().unwrap();
    match outcome {
        Err(NodeError::NodeFailed { node, role, .. }) => {
            assert_eq!(node, 8);
            assert_eq!(role, "server");
        }
        other => panic!("expected the request to fail naming server 8, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_deadline_names_who_is_missing() {
    let hub = Hub::new();
    let config = |role| {
        Config::builder()
            .role(role)
            .num_servers(1)
            .num_workers(2)
            .root_uri("scheduler")
            .root_port(1)
            .node_host(role.as_str())
            .stream_van(VanKind::InProcess)
            .bootstrap_timeout(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let scheduler =
        Postoffice::start_with_van(config(Role::Scheduler), Arc::new(InProcessVan::new(&hub)));
    let server =
        Postoffice::start_with_van(config(Role::Server), Arc::new(InProcessVan::new(&hub)));
    let worker =
        Postoffice::start_with_van(config(Role::Worker), Arc::new(InProcessVan::new(&hub)));
    let (scheduler, server, worker) = tokio::join!(scheduler, server, worker);
    match scheduler {
        Err(NodeError::Bootstrap { summary, .. }) => {
            assert!(summary.contains("1/1 server"), "{summary}");
            assert!(summary.contains("1/2 worker"), "{summary}");
            assert!(summary.contains("waiting for 1 worker"), "{summary}");
        }
        other => panic!("expected a bootstrap error, got {other:?}"),
    }
    for node in [server, worker] {
        match node {
            Err(NodeError::Bootstrap { summary, .. }) => {
                assert!(
                    summary.contains("no node table from the scheduler"),
                    "{summary}"
                )
            }
            other => panic!("expected a bootstrap error, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_nodes_connect_to_everyone_before_any_traffic_and_lazy_ones_do_not() {
    for eager in [true, false] {
        let connected = LocalCluster::new(2, 2)
            .eager_connect(eager)
            .run(|po| async move {
                let peers: Vec<i32> = po.connected_peers().iter().map(|(p, _)| *p).collect();
                po.finalize().await?;
                Ok((po.role(), po.my_id(), peers))
            })
            .await
            .unwrap();
        for (role, me, peers) in connected {
            if role == Role::Scheduler {
                continue;
            }
            // Everyone reaches the scheduler; eager nodes also every other node.
            let mut expected = vec![1];
            if eager {
                expected.extend([8, 9, 10, 11].into_iter().filter(|id| *id != me));
            }
            assert_eq!(peers, expected, "{role} {me}, eager: {eager}");
        }
    }
}

/// A sum handler that answers nothing until the test opens its gate.
struct GatedSum {
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    sum: ps::SumHandler<f32>,
}

impl RequestHandler for GatedSum {
    fn handle(&mut self, meta: &KvMeta, request: KvPairs) -> Result<KvPairs, String> {
        // A handler must not block its runtime thread: a task woken on that thread just
        // before (in its LIFO slot, which no other thread steals) would wait with it — here,
        // 1 run in 20, the very task that opens the gate, and the test hung. Blocking in
        // place hands the thread's queue to another thread first.
        tokio::task::block_in_place(|| {
            let (open, wake) = &*self.gate;
            let mut open = open.lock().unwrap();
            while !*open {
                open = wake.wait(open).unwrap();
            }
        });
        self.sum.handle(meta, request)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_holds_at_most_its_byte_budget_of_large_requests_not_yet_handled() {
    // The budget is the frame pool's size (64 MiB by default); a stalled handler must stop
    // the server from taking in more than that (plus the one request waiting for room).
    const VALUES: usize = 1 << 18; // 1 MiB of f32 per push
    const PUSHES: usize = 96;
    let budget = van_core::pool::DEFAULT_POOL_BYTES;
    let request = VALUES * 4;
    let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let results = LocalCluster::new(1, 1)
        .run(move |po| {
            let gate = Arc::clone(&gate);
            async move {
                let mut most_held = 0usize;
                match po.role() {
                    Role::Server => {
                        let server = KvServer::<f32>::new(&po, 0, 0, 1, |_| GatedSum {
                            gate: Arc::clone(&gate),
                            sum: ps::SumHandler::default(),
                        })
                        .await?;
                        // Wait until the server has taken in a full budget, then give the
                        // worker time to push the rest.
                        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                        while server.held_bytes() < budget - request {
                            assert!(
                                tokio::time::Instant::now() < deadline,
                                "budget never filled"
                            );
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        for _ in 0..40 {
                            most_held = most_held.max(server.held_bytes());
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        let (open, wake) = &*gate;
                        *open.lock().unwrap() = true;
                        wake.notify_all();
                        po.barrier(node_ids::SERVER_GROUP | node_ids::WORKER_GROUP)
                            .await?;
                        assert_eq!(server.held_bytes(), 0, "every hold is returned");
                        po.finalize().await?;
                    }
                    Role::Worker => {
                        let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
                        let vals = vec![1.0f32; VALUES];
                        let mut ids = Vec::with_capacity(PUSHES);
                        for _ in 0..PUSHES {
                            ids.push(worker.push(&[7], &vals, None, 0).await?);
                        }
                        for id in ids {
                            worker.wait(id).await?;
                        }
                        let id = worker.pull(&[7], 0).await?;
                        let sums = worker.wait(id).await?;
                        assert!(sums.vals::<f32>()?.iter().all(|v| *v == PUSHES as f32));
                        po.barrier(node_ids::SERVER_GROUP | node_ids::WORKER_GROUP)
                            .await?;
                        po.finalize().await?;
                    }
                    Role::Scheduler => po.finalize().await?,
                }
                Ok(most_held)
            }
        })
        .await
        .unwrap();
    let most_held = results.into_iter().max().unwrap();
    // The budget counts whole 64 KiB units (a request's keys are its few bytes beyond), and
    // one more request waits for room: at most two requests over.
    assert!(
        most_held >= budget - request && most_held <= budget + 2 * request,
        "held {most_held} bytes with a budget of {budget}"
    );
}

/// What the one worker of a cluster's `run` returned (the other nodes return `None`), within
/// 60 s.
async fn worker_result<T>(run: impl std::future::Future<Output = ps::Result<Vec<Option<T>>>>) -> T {
    let results = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the cluster did not finish in time")
        .unwrap();
    results
        .into_iter()
        .flatten()
        .next()
        .expect("no worker returned")
}

/// Refuses `cmd` 7, sums everything else.
#[derive(Default)]
struct RefusingSum(ps::SumHandler<f32>);

impl RequestHandler for RefusingSum {
    fn handle(&mut self, meta: &KvMeta, request: KvPairs) -> Result<KvPairs, String> {
        if meta.cmd == 7 {
            return Err("command 7 is refused here".into());
        }
        self.0.handle(meta, request)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_failure_is_reported_as_such_and_not_as_a_dead_server() {
    let cluster = LocalCluster::new(1, 1);
    let run = cluster.run(|po| async move {
        match po.role() {
            Role::Server => {
                let _server =
                    KvServer::<f32>::new(&po, 0, 0, 1, |_| RefusingSum::default()).await?;
                po.finalize().await?;
                Ok(None)
            }
            Role::Worker => {
                let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
                let id = worker.push(&[5], &[1.0], None, 7).await?;
                let refused = worker.wait(id).await;
                // The server is alive: the next request goes through.
                let id = worker.push_pull(&[5], &[2.0], None, 0).await?;
                let sums = worker.wait(id).await?;
                assert_eq!(&*sums.vals::<f32>()?, &[2.0]);
                assert!(po.dead_error(8).is_none(), "server 8 recorded as dead");
                po.finalize().await?;
                Ok(Some(refused.map(|_| ())))
            }
            Role::Scheduler => po.finalize().await.map(|()| None),
        }
    });
    match worker_result(run).await {
        Err(NodeError::HandlerFailed { server, reason }) => {
            assert_eq!(server, 8);
            assert_eq!(reason, "command 7 is refused here");
        }
        other => panic!("expected the handler's failure naming server 8, got {other:?}"),
    }
}

/// A worker's request for an application no process serves fails within a second or so,
/// naming the application and what the server serves, instead of waiting out its timeout;
/// one for an application that registers while the request is held is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_an_application_nobody_serves_is_refused_naming_it() {
    let cluster = LocalCluster::new(1, 1);
    let sent = Arc::new(Notify::new());
    let run = cluster.run(move |po| {
        let sent = Arc::clone(&sent);
        async move {
            match po.role() {
                Role::Server => {
                    let _served =
                        KvServer::<f32>::new(&po, 0, 0, 1, |_| SumHandler::<f32>::default());
                    let _served = _served.await?;
                    // Application 2 registers only once the worker's request for it is out.
                    sent.notified().await;
                    let _late =
                        KvServer::<f32>::new(&po, 2, 0, 1, |_| SumHandler::<f32>::default());
                    let _late = _late.await?;
                    po.finalize().await?;
                    Ok(None)
                }
                Role::Worker => {
                    let late = KvWorker::<f32>::new(&po, 2, 0).await?;
                    let held = late.push_pull(&[5], &[2.0], None, 0).await?;
                    sent.notify_one();
                    let unserved = KvWorker::<f32>::new(&po, 1, 0).await?;
                    let start = std::time::Instant::now();
                    let id = unserved.pull(&[5], 0).await?;
                    let refused = unserved.wait(id).await;
                    let waited = start.elapsed();
                    let sums = late.wait(held).await?;
                    assert_eq!(&*sums.vals::<f32>()?, &[2.0]);
                    po.finalize().await?;
                    Ok(Some((refused.map(|_| ()), waited)))
                }
                Role::Scheduler => po.finalize().await.map(|()| None),
            }
        }
    });
    let (refused, waited) = worker_result(run).await;
    match refused {
        Err(NodeError::HandlerFailed { server, reason }) => {
            assert_eq!(server, 8);
            for part in [
                "no application 1 (customer 0)",
                "it serves application 0 (customer 0), application 2 (customer 0)",
            ] {
                assert!(reason.contains(part), "{reason:?} lacks {part:?}");
            }
        }
        other => panic!("expected a refusal naming application 1, got {other:?}"),
    }
    // Held for the grace, then refused: not the worker's timeout.
    assert!(waited >= ps::UNSERVED_GRACE, "refused after {waited:?}");
    assert!(
        waited < Duration::from_secs(20),
        "refused only after {waited:?}"
    );
}

/// A request held when nothing on the node could refuse it is refused once an application
/// that can registers, however late (the sweep comes back while requests are held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_is_refused_once_a_server_that_can_refuse_it_registers() {
    let cluster = LocalCluster::new(1, 1);
    let sent = Arc::new(Notify::new());
    let run = cluster.run(move |po| {
        let sent = Arc::clone(&sent);
        async move {
            match po.role() {
                Role::Server => {
                    // Past the first sweep: nothing here could refuse the request then.
                    sent.notified().await;
                    tokio::time::sleep(ps::UNSERVED_GRACE + Duration::from_millis(500)).await;
                    let made = KvServer::<f32>::new(&po, 0, 0, 1, |_| SumHandler::<f32>::default());
                    let _served = made.await?;
                    po.finalize().await?;
                    Ok(None)
                }
                Role::Worker => {
                    let unserved = KvWorker::<f32>::new(&po, 1, 0).await?;
                    let id = unserved.pull(&[5], 0).await?;
                    sent.notify_one();
                    let refused = unserved.wait(id).await;
                    po.finalize().await?;
                    Ok(Some(refused.map(|_| ())))
                }
                Role::Scheduler => po.finalize().await.map(|()| None),
            }
        }
    });
    match worker_result(run).await {
        Err(NodeError::HandlerFailed { reason, .. }) => {
            assert!(reason.contains("no application 1 (customer 0)"), "{reason}");
        }
        other => panic!("expected a refusal naming application 1, got {other:?}"),
    }
}

/// An application that cannot take a data message without waiting: each delivery waits
/// until the test opens the gate (as a server whose shard queue is full).
struct StalledApp {
    started: Arc<Notify>,
    gate: tokio::sync::watch::Receiver<bool>,
    seen: Arc<std::sync::Mutex<Vec<i32>>>,
}

#[async_trait::async_trait]
impl node::postoffice::Customer for StalledApp {
    async fn deliver(&self, msg: ps::Message) {
        self.seen.lock().unwrap().push(msg.meta.head);
        self.started.notify_one();
        let mut gate = self.gate.clone();
        let open = tokio::time::timeout(Duration::from_secs(30), gate.wait_for(|open| *open));
        assert!(open.await.is_ok(), "the gate never opened");
    }

    fn node_failed(&self, _node: van_core::NodeId, _error: &str) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_messages_are_handled_while_a_data_delivery_waits() {
    const APP: i32 = 77;
    const TASKS: i32 = node_ids::SERVER_GROUP | node_ids::WORKER_GROUP;
    let cluster = LocalCluster::new(1, 1);
    let run = cluster.run(|po| async move {
        match po.role() {
            Role::Server => {
                let started = Arc::new(Notify::new());
                let (open, gate) = tokio::sync::watch::channel(false);
                let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
                let app = StalledApp {
                    started: Arc::clone(&started),
                    gate,
                    seen: Arc::clone(&seen),
                };
                po.register_customer(APP, 0, Arc::new(app)).await?;
                po.barrier(TASKS).await?;
                // The first message's delivery now waits, holding the dispatch loop's data.
                tokio::time::timeout(Duration::from_secs(10), started.notified())
                    .await
                    .expect("the data message never arrived");
                // The release of this barrier arrives behind that delivery.
                let released =
                    tokio::time::timeout(Duration::from_secs(5), po.barrier(TASKS)).await;
                let seen_meanwhile = seen.lock().unwrap().clone();
                open.send_replace(true);
                // Once the gate opens, the messages held behind it arrive, in order.
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while seen.lock().unwrap().len() < 3 && std::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let seen = seen.lock().unwrap().clone();
                po.finalize().await?;
                Ok(Some((released.is_ok(), seen_meanwhile, seen)))
            }
            Role::Worker => {
                po.barrier(TASKS).await?;
                for head in 1..=3 {
                    let msg = ps::Message {
                        meta: ps::Meta {
                            head,
                            app_id: APP,
                            sender: Some(po.my_id()),
                            recipient: Some(8),
                            request: true,
                            ..ps::Meta::default()
                        },
                        data: van_core::Parts::new(),
                    };
                    po.send(msg).await?;
                }
                po.barrier(TASKS).await?;
                po.finalize().await?;
                Ok(None)
            }
            Role::Scheduler => po.finalize().await.map(|()| None),
        }
    });
    let results = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the cluster did not finish in time")
        .unwrap();
    let (released, seen_meanwhile, seen) = results.into_iter().flatten().next().unwrap();
    assert!(
        released,
        "the barrier release waited behind a data delivery"
    );
    assert_eq!(
        seen_meanwhile,
        vec![1],
        "later data overtook the waiting delivery"
    );
    assert_eq!(seen, vec![1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_started_with_vans_rank_get_the_rank_they_asked_for() {
    let hub = Hub::new();
    let config = |role: Role, rank| {
        Config::builder()
            .role(role)
            .num_servers(1)
            .num_workers(3)
            .root_uri("scheduler")
            .root_port(1)
            .node_host(role.as_str())
            .stream_van(VanKind::InProcess)
            .bootstrap_timeout(Duration::from_secs(30))
            .rank(rank)
            .build()
            .unwrap()
    };
    // Workers start in the order 2, 0, 1, so their ports (the address order) are not ranks.
    let mut nodes = vec![(Role::Scheduler, None), (Role::Server, None)];
    nodes.extend([2, 0, 1].map(|rank| (Role::Worker, Some(rank))));
    let tasks: Vec<_> = nodes
        .into_iter()
        .map(|(role, rank)| {
            let (config, van) = (config(role, rank), Arc::new(InProcessVan::new(&hub)));
            tokio::spawn(async move {
                let po = Postoffice::start_with_van(config, van).await?;
                let got = (role == Role::Worker).then(|| po.my_rank());
                po.finalize().await?;
                Ok::<_, NodeError>((rank, got))
            })
        })
        .collect();
    for task in tasks {
        let (asked, got) = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the cluster did not finish in time")
            .unwrap()
            .unwrap();
        assert_eq!(got, asked);
    }
}

/// A pull never answers with fewer values than keys: a key no one pushed pulls as zeros of
/// the length a pull into a buffer expects, each in its place (ps-lite's behaviour), or fails
/// naming the key when the pull cannot say; a repeated key fails the request by name. Two
/// servers, so the missing key's server differs from the others'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_never_pushed_pull_as_zeros_or_fail_by_name_and_repeated_keys_are_refused() {
    let missing = u64::MAX - 5;
    LocalCluster::new(2, 1)
        .run(move |po| async move {
            match po.role() {
                Role::Server => {
                    let _server = KvServer::<f32>::with_sum(&po, 0, 0, 1).await?;
                    po.finalize().await?;
                }
                Role::Worker => {
                    let worker = KvWorker::<f32>::new(&po, 0, 0).await?;
                    let id = worker.push(&[1, 5], &[1.0, 2.0, 3.0, 4.0], None, 0).await?;
                    worker.wait(id).await?;
                    // Into a buffer: zeros of the expected length, in the missing key's place.
                    let keys = ps::values::to_bytes(&[1u64, 5, missing]);
                    let id = worker.zpull_into(keys.clone(), vec![0xffu8; 24], 0).await?;
                    let pulled = worker.wait(id).await?;
                    assert_eq!(&*pulled.vals::<f32>()?, &[1.0, 2.0, 3.0, 4.0, 0.0, 0.0]);
                    // Without a buffer the length is unknown: an error naming the key.
                    let id = worker.pull(&[1, 5, missing], 0).await?;
                    match worker.wait(id).await {
                        Err(NodeError::HandlerFailed { reason, .. }) => {
                            assert!(reason.contains(&format!("key {missing} was never pushed")))
                        }
                        other => panic!("a pull of a key never pushed answered {other:?}"),
                    }
                    // A buffer expecting another length than a key holds: named too.
                    let id = worker.zpull_into(keys, vec![0u8; 36], 0).await?;
                    match worker.wait(id).await {
                        Err(NodeError::HandlerFailed { reason, .. }) => {
                            assert!(reason.contains("key 1 holds 2 values; the pull expects 3"))
                        }
                        other => panic!("a pull of the wrong length answered {other:?}"),
                    }
                    // A repeated key, on a push and a pull: refused by name, nothing summed.
                    for result in [
                        worker.push(&[7, 7], &[1.0, 1.0], None, 0).await,
                        worker.pull(&[1, 5, 5], 0).await,
                    ] {
                        match result {
                            Err(NodeError::InvalidArgument(e)) => {
                                assert!(e.contains("is given twice"), "{e}")
                            }
                            other => panic!("repeated keys answered {other:?}"),
                        }
                    }
                    let id = worker.push(&[7], &[1.0], None, 0).await?;
                    worker.wait(id).await?;
                    let id = worker.pull(&[7], 0).await?;
                    assert_eq!(&*worker.wait(id).await?.vals::<f32>()?, &[1.0]);
                    po.finalize().await?;
                }
                Role::Scheduler => po.finalize().await?,
            }
            Ok(())
        })
        .await
        .unwrap();
}
