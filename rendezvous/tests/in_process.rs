//! The remote rendezvous between a server (node 8) and a worker (node 9) of an in-process
//! cluster (`node::local::LocalCluster`, the in-process van): exchange in both protocols,
//! two-phase initialization, abort and cleanup propagation, deadlines, step bounds, a peer
//! that stops. The same behaviour across real processes is in `examples/tests/rendezvous.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use node::local::LocalCluster;
use node::{node_ids, NodeError, Postoffice, Role};
use rendezvous::{
    cpu_device, create_key, parse_key, Instant, ParsedKey, Protocol, Rendezvous, RendezvousError,
    RendezvousMgr,
};
use van_core::NodeId;

const SERVER: NodeId = 8;
const WORKER: NodeId = 9;
const TASKS: i32 = node_ids::SERVER_GROUP | node_ids::WORKER_GROUP;
/// Every test ends well within this, or fails.
const TEST_DEADLINE: Duration = Duration::from_secs(60);

fn key(src: NodeId, dst: NodeId, name: &str) -> ParsedKey {
    parse_key(&create_key(
        &cpu_device(src).unwrap(),
        1,
        &cpu_device(dst).unwrap(),
        name,
        (0, 0),
    ))
    .unwrap()
}

fn value(step: i64, name: &str, len: usize) -> Bytes {
    let seed = format!("{step}/{name}/");
    Bytes::from(seed.bytes().cycle().take(len).collect::<Vec<u8>>())
}

fn failed(e: impl std::fmt::Display) -> NodeError {
    NodeError::InvalidArgument(e.to_string())
}

/// Runs `node` on the server and the worker of a 1-server, 1-worker in-process cluster (the
/// scheduler only finalizes), with a deadline.
async fn pair<T, F, Fut>(node: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Postoffice) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = node::Result<T>> + Send + 'static,
{
    let cluster = LocalCluster::new(1, 1);
    let run = cluster.run(move |po| {
        let node = node.clone();
        async move {
            if po.role() == Role::Scheduler {
                po.finalize().await?;
                return Ok(None);
            }
            node(po).await.map(Some)
        }
    });
    let results = tokio::time::timeout(TEST_DEADLINE, run)
        .await
        .expect("the cluster did not finish in time")
        .expect("a node failed");
    results.into_iter().flatten().collect()
}

/// Polls `condition` until it holds, failing after a few seconds.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn exchange(protocol: Protocol) {
    let checked = pair(move |po| async move {
        let mgr = RendezvousMgr::new(&po, protocol).await.map_err(failed)?;
        let me = po.my_id();
        let peer = if me == SERVER { WORKER } else { SERVER };
        let mut checked = 0;
        for step_id in 0..20i64 {
            if me == SERVER {
                // The worker's requests (pull) or values (push) for this step arrive before
                // the server has even found the step: they must be queued, not lost.
                po.barrier(TASKS).await?;
            }
            let step = mgr.find(step_id);
            for i in 0..10 {
                let k = key(me, peer, &format!("t{i}"));
                let v = value(step_id, &format!("{me}/{i}"), i * 100);
                // Sent before initialize on the server: queued too.
                step.send(&k, v, i % 3 == 0).map_err(failed)?;
            }
            step.initialize().map_err(failed)?;
            let receives: Vec<_> = (0..10)
                .map(|i| step.recv(&key(peer, me, &format!("t{i}"))))
                .collect();
            if me == WORKER {
                po.barrier(TASKS).await?;
            }
            for (i, receive) in receives.into_iter().enumerate() {
                let got = receive.await.map_err(failed)?;
                assert_eq!(got.value, value(step_id, &format!("{peer}/{i}"), i * 100));
                assert_eq!(got.is_dead, i % 3 == 0, "is_dead of t{i}");
                checked += 1;
            }
            // Both sides have received everything of the step (so the peer has pulled what it
            // needed from here) once both pass this barrier.
            po.barrier(TASKS).await?;
            mgr.cleanup(step_id);
        }
        assert_eq!(mgr.stats().live_steps, 0);
        assert_eq!(mgr.stats().pending_pulls, 0);
        po.finalize().await?;
        Ok(checked)
    })
    .await;
    assert_eq!(checked, vec![200, 200]);
}

// Several threads, so that sends, receives and replies race for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pull_exchanges_exact_values_with_dead_flags_over_steps() {
    exchange(Protocol::Pull).await;
}

// Several threads, so that sends, receives and replies race for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn push_exchanges_exact_values_with_dead_flags_over_steps() {
    exchange(Protocol::Push).await;
}

#[tokio::test]
async fn calls_before_initialize_are_queued_in_order_and_run_by_initialize() {
    pair(|po| async move {
        let mgr = RendezvousMgr::new(&po, Protocol::Pull)
            .await
            .map_err(failed)?;
        let me = po.my_id();
        let local = key(me, me, "local");
        let step = mgr.find(3);
        let first = step.recv(&local);
        step.send(&local, Bytes::from_static(b"one"), false)
            .map_err(failed)?;
        step.send(&local, Bytes::from_static(b"two"), true)
            .map_err(failed)?;
        let second = step.recv(&local);
        assert_eq!(step.deferred_calls(), 4);
        assert!(!step.is_initialized());
        assert!(
            step.local().snapshot().is_empty(),
            "nothing ran before initialize"
        );
        step.initialize().map_err(failed)?;
        step.initialize().map_err(failed)?; // again: harmless
        assert_eq!(step.deferred_calls(), 0);
        assert_eq!(
            first.await.map_err(failed)?.value,
            Bytes::from_static(b"one")
        );
        let second = second.await.map_err(failed)?;
        assert_eq!(
            (second.value, second.is_dead),
            (Bytes::from_static(b"two"), true)
        );
        // recv_local on the manager: the transport's view of this task's table.
        mgr.find(3)
            .send(&local, Bytes::from_static(b"three"), false)
            .map_err(failed)?;
        let got = mgr.recv_local(3, &local).await.map_err(failed)?;
        assert_eq!(got.value, Bytes::from_static(b"three"));
        let (tx, rx) = tokio::sync::oneshot::channel();
        mgr.recv_local_async(3, &local, Box::new(move |r| drop(tx.send(r))));
        mgr.find(3)
            .send(&local, Bytes::from_static(b"four"), false)
            .map_err(failed)?;
        assert_eq!(
            rx.await.unwrap().map_err(failed)?.value,
            Bytes::from_static(b"four")
        );
        po.finalize().await?;
        Ok(())
    })
    .await;
}

/// Shared between the two nodes of a test.
type Managers = Arc<Mutex<Vec<(NodeId, RendezvousMgr)>>>;

fn manager_of(managers: &Managers, node: NodeId) -> RendezvousMgr {
    let managers = managers.lock().unwrap();
    managers.iter().find(|(n, _)| *n == node).unwrap().1.clone()
}

// Several threads, so that sends, receives and replies race for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cleanup_cancels_an_in_flight_pull_and_the_owner_withdraws_its_waiter() {
    let managers: Managers = Arc::default();
    pair(move |po| {
        let managers = Arc::clone(&managers);
        async move {
            let mgr = RendezvousMgr::new(&po, Protocol::Pull)
                .await
                .map_err(failed)?;
            managers.lock().unwrap().push((po.my_id(), mgr.clone()));
            let k = key(SERVER, WORKER, "never-sent-in-time");
            let step = mgr.find(1);
            step.initialize().map_err(failed)?;
            po.barrier(TASKS).await?;
            if po.my_id() == WORKER {
                let pending = tokio::spawn(step.recv(&k));
                let server = manager_of(&managers, SERVER);
                eventually("the server holds the request", || {
                    server.stats().served_requests == 1
                })
                .await;
                assert_eq!(mgr.stats().pending_pulls, 1);
                let started = std::time::Instant::now();
                mgr.cleanup(1);
                let result = pending.await.unwrap();
                assert_eq!(
                    result,
                    Err(RendezvousError::Aborted(
                        "step 1 was cleaned up on node 9".into()
                    ))
                );
                assert!(started.elapsed() < Duration::from_secs(1));
                assert_eq!(mgr.stats().pending_pulls, 0);
                // The owner withdraws the waiter it held for us.
                eventually("the server dropped the request", || {
                    server.stats().served_requests == 0
                })
                .await;
                // Later calls on the cleaned-up step fail with the same status.
                assert!(matches!(
                    step.send(&key(WORKER, SERVER, "x"), Bytes::new(), false),
                    Err(RendezvousError::Aborted(_))
                ));
            }
            po.barrier(TASKS).await?;
            if po.my_id() == SERVER {
                // The value sent now is not swallowed by the withdrawn request.
                step.send(&k, Bytes::from_static(b"late"), false)
                    .map_err(failed)?;
                assert_eq!(step.local().queued(k.full_key()).values, 1);
                mgr.cleanup(1);
                assert_eq!(step.local().snapshot(), vec![]);
            }
            po.finalize().await?;
            Ok(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_pull_deadline_expires_and_withdraws_the_request() {
    let managers: Managers = Arc::default();
    pair(move |po| {
        let managers = Arc::clone(&managers);
        async move {
            let mgr = RendezvousMgr::new(&po, Protocol::Pull)
                .await
                .map_err(failed)?;
            managers.lock().unwrap().push((po.my_id(), mgr.clone()));
            let k = key(SERVER, WORKER, "slow");
            let step = mgr.find(2);
            step.initialize().map_err(failed)?;
            po.barrier(TASKS).await?;
            if po.my_id() == WORKER {
                let deadline = Instant::now() + Duration::from_millis(200);
                let result = step.recv_with_deadline(&k, Some(deadline)).await;
                assert_eq!(
                    result,
                    Err(RendezvousError::DeadlineExceeded {
                        key: k.full_key().to_owned()
                    })
                );
                assert!(Instant::now() >= deadline);
                assert_eq!(mgr.stats().pending_pulls, 0);
                let server = manager_of(&managers, SERVER);
                eventually("the server dropped the expired request", || {
                    server.stats().served_requests == 0
                })
                .await;
            }
            po.barrier(TASKS).await?;
            if po.my_id() == SERVER {
                step.send(&k, Bytes::from_static(b"v"), false)
                    .map_err(failed)?;
            }
            po.barrier(TASKS).await?;
            if po.my_id() == WORKER {
                // A new receive with a deadline gets the value.
                let deadline = Instant::now() + Duration::from_secs(10);
                let got = step
                    .recv_with_deadline(&k, Some(deadline))
                    .await
                    .map_err(failed)?;
                assert_eq!(got.value, Bytes::from_static(b"v"));
            }
            po.barrier(TASKS).await?;
            mgr.cleanup(2);
            po.finalize().await?;
            Ok(())
        }
    })
    .await;
}

#[tokio::test]
async fn requests_and_values_for_a_cleaned_up_step_are_refused() {
    for protocol in [Protocol::Pull, Protocol::Push] {
        pair(move |po| async move {
            let mgr = RendezvousMgr::new(&po, protocol).await.map_err(failed)?;
            if po.my_id() == SERVER {
                mgr.find(5).initialize().map_err(failed)?;
                mgr.cleanup(5);
            }
            po.barrier(TASKS).await?;
            if po.my_id() == WORKER {
                let step = mgr.find(5);
                step.initialize().map_err(failed)?;
                match protocol {
                    Protocol::Pull => {
                        let result = step.recv(&key(SERVER, WORKER, "gone")).await;
                        assert_eq!(
                            result,
                            Err(RendezvousError::Aborted(
                                "step 5 was already cleaned up on node 8".into()
                            ))
                        );
                    }
                    Protocol::Push => {
                        step.send(
                            &key(WORKER, SERVER, "late"),
                            Bytes::from_static(b"x"),
                            false,
                        )
                        .map_err(failed)?;
                    }
                }
            }
            po.barrier(TASKS).await?;
            if po.my_id() == SERVER {
                // The late value did not resurrect the step.
                assert_eq!(mgr.live_steps(), Vec::<i64>::new());
            }
            po.finalize().await?;
            Ok(())
        })
        .await;
    }
}

#[tokio::test]
async fn steps_never_cleaned_up_are_bounded_by_count_and_age_with_a_clear_error() {
    pair(|po| async move {
        let me = po.my_id();
        let local = key(me, me, "k");
        let mgr = RendezvousMgr::builder(&po)
            .customer_id(1)
            .max_steps(2)
            .max_step_age(None)
            .build()
            .await
            .map_err(failed)?;
        let oldest = mgr.find(0);
        oldest.initialize().map_err(failed)?;
        let pending = oldest.recv(&local);
        mgr.find(1);
        mgr.find(2);
        let error = pending.await.unwrap_err().to_string();
        assert!(
            error.contains("step 0 aborted")
                && error.contains("never cleaned up")
                && error.contains("max_steps"),
            "{error}"
        );
        assert_eq!(mgr.live_steps(), vec![1, 2]);

        let aging = RendezvousMgr::builder(&po)
            .customer_id(2)
            .max_step_age(Some(Duration::from_millis(100)))
            .build()
            .await
            .map_err(failed)?;
        let step = aging.find(7);
        step.initialize().map_err(failed)?;
        let result = tokio::time::timeout(Duration::from_secs(10), step.recv(&local))
            .await
            .expect("the old step was not aborted");
        let error = result.unwrap_err().to_string();
        assert!(
            error.contains("step 7 aborted") && error.contains("max_step_age"),
            "{error}"
        );
        assert_eq!(aging.live_steps(), Vec::<i64>::new());
        assert!(RendezvousMgr::builder(&po)
            .max_steps(0)
            .build()
            .await
            .is_err());
        po.finalize().await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_pinned_step_outlives_both_limits_and_ends_only_by_cleanup() {
    pair(|po| async move {
        let me = po.my_id();
        let local = key(me, me, "k");
        let mgr = RendezvousMgr::builder(&po)
            .customer_id(1)
            .max_steps(1)
            .max_step_age(Some(Duration::from_millis(50)))
            .build()
            .await
            .map_err(failed)?;
        // Pinned before it exists (step 5) and after (step 0).
        mgr.pin(5);
        let old = mgr.find(0);
        old.initialize().map_err(failed)?;
        mgr.pin(0);
        let pinned = mgr.find(5);
        pinned.initialize().map_err(failed)?;
        let (waiting_old, waiting_pinned) = (old.recv(&local), pinned.recv(&local));
        // Pinned steps do not count: one more is within max_steps 1, two more are over it
        // (the older goes), and the age limit ends the other.
        let first = mgr.find(1);
        first.initialize().map_err(failed)?;
        let second = mgr.find(2);
        second.initialize().map_err(failed)?;
        for (step, id) in [(first, 1), (second, 2)] {
            let ended = tokio::time::timeout(Duration::from_secs(10), step.recv(&local))
                .await
                .expect("an unpinned step was not aborted");
            let error = ended.unwrap_err().to_string();
            assert!(error.contains(&format!("step {id} aborted")), "{error}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(mgr.live_steps(), vec![0, 5]);
        // Both pinned steps still deliver, then end by cleanup.
        old.send(&local, Bytes::from_static(b"a"), false)
            .map_err(failed)?;
        assert_eq!(
            waiting_old.await.map_err(failed)?.value,
            Bytes::from_static(b"a")
        );
        mgr.cleanup(5);
        let error = waiting_pinned.await.unwrap_err().to_string();
        assert!(error.contains("cleaned up"), "{error}");
        assert_eq!(mgr.live_steps(), vec![0]);
        // The cleanup ended the pin: step 5 made again counts, and goes first.
        mgr.find(5).initialize().map_err(failed)?;
        mgr.find(6).initialize().map_err(failed)?;
        assert_eq!(mgr.live_steps(), vec![0, 6]);
        po.finalize().await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn keys_whose_devices_are_elsewhere_are_invalid_arguments() {
    pair(|po| async move {
        let mgr = RendezvousMgr::new(&po, Protocol::Pull)
            .await
            .map_err(failed)?;
        let me = po.my_id();
        let peer = if me == SERVER { WORKER } else { SERVER };
        let step = mgr.find(4);
        step.initialize().map_err(failed)?;
        // A task sends only what its own devices produce ...
        let error = step
            .send(&key(peer, me, "theirs"), Bytes::new(), false)
            .unwrap_err();
        assert!(
            matches!(error, RendezvousError::InvalidArgument(_)),
            "{error}"
        );
        // ... and receives only what its own devices consume.
        let error = step.recv(&key(me, peer, "for-them")).await.unwrap_err();
        assert!(
            matches!(error, RendezvousError::InvalidArgument(_)),
            "{error}"
        );
        let unknown = parse_key(&create_key("/cpu:0", 1, "/cpu:0", "x", (0, 0))).unwrap();
        let error = step
            .send(&unknown, Bytes::new(), false)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("no task owns the source device `/cpu:0`"),
            "{error}"
        );
        let absent = key(me, 13, "nobody"); // worker 2: not in this cluster
        let error = step
            .send(&absent, Bytes::new(), false)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("node 13 (worker), which is not a task of this cluster"),
            "{error}"
        );
        mgr.cleanup(4);
        po.finalize().await?;
        Ok(())
    })
    .await;
}

// Several threads, so that sends, receives and replies race for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_that_stops_fails_waiting_receives_naming_step_key_and_peer() {
    for protocol in [Protocol::Pull, Protocol::Push] {
        let stopped = Arc::new(tokio::sync::Notify::new());
        let cluster = LocalCluster::new(1, 1);
        let run = cluster.run(move |po| {
            let stopped = Arc::clone(&stopped);
            async move {
                let mgr = match po.role() {
                    Role::Scheduler => None,
                    _ => Some(RendezvousMgr::new(&po, protocol).await.map_err(failed)?),
                };
                let k = key(SERVER, WORKER, "from-the-dying");
                match (po.role(), mgr) {
                    (Role::Server, Some(mgr)) => {
                        let step = mgr.find(9);
                        step.initialize().map_err(failed)?;
                        // One value gets through, so the two are connected.
                        step.send(&k, Bytes::from_static(b"first"), false)
                            .map_err(failed)?;
                        po.barrier(TASKS).await?;
                        po.barrier(TASKS).await?;
                        po.stop().await;
                    }
                    (Role::Worker, Some(mgr)) => {
                        let step = mgr.find(9);
                        step.initialize().map_err(failed)?;
                        po.barrier(TASKS).await?;
                        let first = step.recv(&k).await.map_err(failed)?;
                        assert_eq!(first.value, Bytes::from_static(b"first"));
                        let pending = step.recv(&k);
                        po.barrier(TASKS).await?;
                        let result = tokio::time::timeout(Duration::from_secs(20), pending)
                            .await
                            .expect("the receive did not fail after its peer stopped");
                        match result {
                            Err(RendezvousError::Remote {
                                step_id, key, peer, ..
                            }) => {
                                assert_eq!(step_id, 9);
                                assert_eq!(key, k.full_key());
                                assert_eq!(peer, "node 8 (server)");
                            }
                            other => panic!("{protocol}: expected a remote error, got {other:?}"),
                        }
                        // New calls towards the dead peer fail at once.
                        let error = step.recv(&k).await.unwrap_err();
                        assert!(matches!(error, RendezvousError::Remote { .. }), "{error}");
                        stopped.notify_one();
                        po.stop().await;
                    }
                    _ => {
                        stopped.notified().await;
                        po.stop().await;
                    }
                }
                Ok(())
            }
        });
        tokio::time::timeout(TEST_DEADLINE, run)
            .await
            .expect("the cluster did not finish in time")
            .expect("a node failed");
    }
}

#[tokio::test]
async fn calls_beyond_the_deferred_limit_fail_instead_of_being_lost() {
    pair(|po| async move {
        let me = po.my_id();
        let mgr = RendezvousMgr::builder(&po)
            .protocol(Protocol::Push)
            .max_deferred_calls(2)
            .build()
            .await
            .map_err(failed)?;
        let local = key(me, me, "local");
        let step = mgr.find(1);
        step.send(&local, Bytes::from_static(b"1"), false)
            .map_err(failed)?;
        step.send(&local, Bytes::from_static(b"2"), false)
            .map_err(failed)?;
        // The third call finds the queue full: the caller must hear of it, not lose the value.
        let error = step
            .send(&local, Bytes::from_static(b"3"), false)
            .expect_err("a send beyond max_deferred_calls was accepted and dropped");
        assert!(error.to_string().contains("max_deferred_calls"), "{error}");
        assert_eq!(step.deferred_calls(), 2);

        // A value a peer pushes into a full queue cannot be refused to its sender: the step
        // fails, so that the receive waiting for that value ends instead of hanging.
        let pushed = key(SERVER, WORKER, "pushed");
        let marker = key(SERVER, WORKER, "marker");
        let full = mgr.find(2);
        if me == WORKER {
            full.send(&local, Bytes::from_static(b"a"), false)
                .map_err(failed)?;
            full.send(&local, Bytes::from_static(b"b"), false)
                .map_err(failed)?;
        }
        po.barrier(TASKS).await?;
        let next = mgr.find(3);
        next.initialize().map_err(failed)?;
        if me == SERVER {
            full.initialize().map_err(failed)?;
            full.send(&pushed, Bytes::from_static(b"lost?"), false)
                .map_err(failed)?;
            next.send(&marker, Bytes::from_static(b"after"), false)
                .map_err(failed)?;
        } else {
            // Messages from one peer are handled in order: once the marker of step 3 is
            // here, the value pushed into step 2 has been handled too.
            let got = tokio::time::timeout(Duration::from_secs(10), next.recv(&marker))
                .await
                .expect("the marker never came")
                .map_err(failed)?;
            assert_eq!(got.value, Bytes::from_static(b"after"));
            let status = full
                .status()
                .expect("a pushed value was dropped and step 2 went on as if nothing happened");
            assert!(
                status.to_string().contains("max_deferred_calls"),
                "{status}"
            );
            assert!(full.recv(&pushed).await.is_err());
        }
        po.barrier(TASKS).await?;
        mgr.cleanup_all();
        po.finalize().await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn answers_to_requests_are_not_dropped_by_the_outbox_bound() {
    let managers: Managers = Arc::default();
    pair(move |po| {
        let managers = Arc::clone(&managers);
        async move {
            let me = po.my_id();
            // The server's outbox takes one message at a time; the worker's is as usual.
            let bound = if me == SERVER { 1 } else { 1 << 20 };
            let mgr = RendezvousMgr::builder(&po)
                .max_outbox_bytes(bound)
                .build()
                .await
                .map_err(failed)?;
            managers.lock().unwrap().push((me, mgr.clone()));
            let keys = [key(SERVER, WORKER, "a"), key(SERVER, WORKER, "b")];
            let step = mgr.find(1);
            step.initialize().map_err(failed)?;
            po.barrier(TASKS).await?;
            if me == WORKER {
                let receives: Vec<_> = keys.iter().map(|k| step.recv(k)).collect();
                let server = manager_of(&managers, SERVER);
                eventually("the server holds both requests", || {
                    server.stats().served_requests == 2
                })
                .await;
                po.barrier(TASKS).await?;
                for (receive, name) in receives.into_iter().zip(["a", "b"]) {
                    let got = tokio::time::timeout(Duration::from_secs(10), receive)
                        .await
                        .unwrap_or_else(|_| panic!("the answer for `{name}` never came"))
                        .map_err(failed)?;
                    assert_eq!(got.value, Bytes::from(vec![7u8; 100]));
                }
            } else {
                po.barrier(TASKS).await?;
                // Both answers are queued before the sender task can run: the second finds
                // the outbox over its bound. The value already left the table, so refusing
                // the answer would lose it and leave the worker waiting.
                for k in &keys {
                    step.send(k, Bytes::from(vec![7u8; 100]), false)
                        .map_err(failed)?;
                }
            }
            po.barrier(TASKS).await?;
            mgr.cleanup(1);
            po.finalize().await?;
            Ok(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_step_cleaned_up_again_after_reuse_stays_refused() {
    pair(|po| async move {
        let mgr = RendezvousMgr::new(&po, Protocol::Pull)
            .await
            .map_err(failed)?;
        let k = key(SERVER, WORKER, "reused");
        if po.my_id() == SERVER {
            // Step 1 is used, cleaned up, used again (its id reused) and cleaned up again;
            // then 4095 more steps come and go: the second cleanup of step 1 is among the
            // last 4096 (the manager's memory of cleaned-up steps), so it is still refused.
            for _ in 0..2 {
                mgr.find(1).initialize().map_err(failed)?;
                mgr.cleanup(1);
            }
            for step_id in 100..100 + 4095 {
                mgr.find(step_id);
                mgr.cleanup(step_id);
            }
        }
        po.barrier(TASKS).await?;
        if po.my_id() == WORKER {
            let step = mgr.find(1);
            step.initialize().map_err(failed)?;
            let deadline = Instant::now() + Duration::from_secs(5);
            let result = step.recv_with_deadline(&k, Some(deadline)).await;
            assert_eq!(
                result,
                Err(RendezvousError::Aborted(
                    "step 1 was already cleaned up on node 8".into()
                ))
            );
            mgr.cleanup(1);
        }
        po.barrier(TASKS).await?;
        if po.my_id() == SERVER {
            // The late request did not resurrect the step.
            assert_eq!(mgr.live_steps(), Vec::<i64>::new());
        }
        po.finalize().await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_running_different_protocols_fail_with_a_message_instead_of_waiting() {
    // The server pushes, the worker pulls.
    let errors = pair(|po| async move {
        let me = po.my_id();
        let protocol = if me == SERVER {
            Protocol::Push
        } else {
            Protocol::Pull
        };
        let mgr = RendezvousMgr::new(&po, protocol).await.map_err(failed)?;
        let mut errors = Vec::new();
        for step_id in [1, 2] {
            let step = mgr.find(step_id);
            step.initialize().map_err(failed)?;
            if me == WORKER {
                // Step 1: the worker asks the server, which pushes and serves no request.
                // Step 2: a receive of the worker's own is waiting when the server's push
                // arrives: the push fails the step.
                let waited = match step_id {
                    1 => key(SERVER, WORKER, "a"),
                    _ => key(WORKER, WORKER, "never sent"),
                };
                let receive = step.recv(&waited);
                po.barrier(TASKS).await?;
                let error = receive.await.err().map(|e| e.to_string());
                errors.push(error.unwrap_or_default());
            } else {
                po.barrier(TASKS).await?;
                if step_id == 2 {
                    step.send(&key(SERVER, WORKER, "b"), value(2, "b", 8), false)
                        .map_err(failed)?;
                }
            }
            po.barrier(TASKS).await?;
            mgr.cleanup(step_id);
        }
        po.finalize().await?;
        Ok(errors)
    })
    .await;
    let worker = errors.into_iter().flatten().collect::<Vec<_>>();
    assert_eq!(worker.len(), 2);
    for error in worker {
        assert!(
            error.contains("push protocol") && error.contains("same protocol"),
            "{error}"
        );
    }
}
