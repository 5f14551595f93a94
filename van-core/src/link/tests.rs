//! The table's rules, without I/O: routes, spares, learning, losses, stop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize};

use super::*;
use crate::van::inbox;

/// A connection that records what the table asked of it.
#[derive(Default)]
struct Probe {
    finished: AtomicUsize,
    aborted: AtomicUsize,
    closed: AtomicBool,
}

impl Connection for Probe {
    fn finish(&self) {
        self.finished.fetch_add(1, Ordering::SeqCst);
    }
    fn abort(&self) {
        self.aborted.fetch_add(1, Ordering::SeqCst);
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

fn bound() -> Links<&'static str> {
    let links = Links::new(VanKind::Tcp);
    let (sender, _inbox) = inbox(4);
    links.bound(sender, None).unwrap();
    links
}

fn add(links: &Links<&'static str>, peer: Option<NodeId>, name: &'static str) -> (u64, Arc<Probe>) {
    let id = links.next_id();
    let probe = Arc::new(Probe::default());
    links
        .add(id, peer, name, probe.clone() as Arc<dyn Connection>, None)
        .unwrap();
    (id, probe)
}

#[test]
fn the_first_connection_is_the_route_and_a_second_is_a_spare() {
    let links = bound();
    let (first, _) = add(&links, Some(9), "first");
    let (second, _) = add(&links, Some(9), "second");
    assert_eq!(links.link(9).unwrap(), "first");
    assert_eq!(links.connections(), 2);
    // The spare's end is no loss while the route lives.
    assert!(links.closed(second, "spare closed").is_none());
    assert_eq!(links.link(9).unwrap(), "first");
    // The route's end is.
    let lost = links
        .closed(first, "reset")
        .expect("the route's end is a loss");
    assert_eq!(lost.peer, Some(9));
    assert_eq!(lost.reason, "reset");
    match links.link(9) {
        Err(VanError::PeerGone { peer: 9, reason }) => assert_eq!(reason, "reset"),
        other => panic!("expected PeerGone, got {other:?}"),
    }
}

#[test]
fn an_accepted_connection_becomes_a_route_when_its_peer_is_learned() {
    let links = bound();
    let (accepted, _) = add(&links, None, "accepted");
    assert!(matches!(
        links.link(4),
        Err(VanError::UnknownPeer { peer: 4 })
    ));
    links.learn(accepted, 4);
    assert_eq!(links.link(4).unwrap(), "accepted");
    assert_eq!(links.peers(), vec![4]);
    // A later dial finds the route and becomes a spare; learning again changes nothing.
    let (dialed, _) = add(&links, Some(4), "dialed");
    links.learn(dialed, 4);
    assert_eq!(links.link(4).unwrap(), "accepted");
}

#[test]
fn an_unidentified_connection_ending_is_reported_without_a_peer() {
    let links = bound();
    let (id, _) = add(&links, None, "garbage");
    let lost = links.closed(id, "bad frame").expect("reported");
    assert_eq!(lost.peer, None);
    // Closing twice reports once.
    assert!(links.closed(id, "bad frame").is_none());
}

#[test]
fn a_closed_route_is_replaced_by_the_next_connection() {
    let links = bound();
    let (_, probe) = add(&links, Some(2), "old");
    probe.closed.store(true, Ordering::SeqCst);
    // Not handed out while closed, even before its reader reports the end.
    assert!(matches!(links.link(2), Err(VanError::PeerGone { .. })));
    assert!(links.peers().is_empty());
    add(&links, Some(2), "new");
    assert_eq!(links.link(2).unwrap(), "new");
}

#[test]
fn a_replaced_process_s_connections_are_retired_and_their_end_is_no_loss() {
    let links = bound();
    // The old process's route (still open: its death not noticed yet) and a connection
    // it had opened to us.
    let (old_route, _) = add(&links, Some(9), "old");
    let (old_accepted, _) = add(&links, None, "old accepted");
    links.learn(old_accepted, 9);
    links.forget(9);
    // No route until the new process is dialed; then the dial is the route.
    assert!(matches!(
        links.link(9),
        Err(VanError::UnknownPeer { peer: 9 })
    ));
    let (new_route, _) = add(&links, Some(9), "new");
    assert_eq!(links.link(9).unwrap(), "new");
    // A message still arriving on a retired connection does not make it the route again.
    links.learn(old_accepted, 9);
    assert_eq!(links.link(9).unwrap(), "new");
    // The old connections' end, noticed late, is no loss; the new route's is.
    assert!(links.closed(old_route, "killed").is_none());
    assert!(links.closed(old_accepted, "killed").is_none());
    assert_eq!(links.link(9).unwrap(), "new");
    assert_eq!(
        links.closed(new_route, "reset").map(|l| l.peer),
        Some(Some(9))
    );
}

#[test]
fn nothing_is_a_loss_after_stop_and_stop_ends_everything() {
    let links = bound();
    let (route, a) = add(&links, Some(1), "a");
    let (_, b) = add(&links, None, "b");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let flushed = runtime.block_on(links.stop(Duration::from_secs(1)));
    assert!(flushed);
    for probe in [&a, &b] {
        assert_eq!(probe.finished.load(Ordering::SeqCst), 1);
        assert_eq!(probe.aborted.load(Ordering::SeqCst), 1);
    }
    assert!(links.closed(route, "stopped").is_none());
    assert!(matches!(links.link(1), Err(VanError::Stopped(_))));
    assert!(matches!(links.inbox(), Err(VanError::Stopped(_))));
    // A connection that arrives after the stop is refused and aborted.
    let late = Arc::new(Probe::default());
    let id = links.next_id();
    assert!(links
        .add(
            id,
            Some(3),
            "late",
            late.clone() as Arc<dyn Connection>,
            None
        )
        .is_err());
    assert_eq!(late.aborted.load(Ordering::SeqCst), 1);
}

#[test]
fn stop_waits_for_writers_up_to_the_flush_timeout() {
    let links = bound();
    let (tx, rx) = oneshot::channel::<()>();
    let probe = Arc::new(Probe::default());
    links
        .add(links.next_id(), Some(1), "slow", probe.clone(), Some(rx))
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A writer that never finishes: stop gives up after the timeout and aborts it.
    let flushed = runtime.block_on(links.stop(Duration::from_millis(50)));
    assert!(!flushed);
    assert_eq!(probe.aborted.load(Ordering::SeqCst), 1);
    drop(tx);

    // A writer that finishes: stop reports the flush.
    let links = bound();
    let (tx, rx) = oneshot::channel::<()>();
    links
        .add(
            links.next_id(),
            Some(1),
            "quick",
            Arc::new(Probe::default()),
            Some(rx),
        )
        .unwrap();
    let flushed = runtime.block_on(async {
        let stop = links.stop(Duration::from_secs(5));
        let writer = async {
            tokio::task::yield_now().await;
            let _ = tx.send(());
        };
        tokio::join!(stop, writer).0
    });
    assert!(flushed);
}

#[test]
fn a_dead_peer_s_connections_end_at_once_and_a_stop_does_not_wait_for_them() {
    let links = bound();
    // A writer to the dead peer that would never finish flushing, and one to a live peer.
    let (_never, dead_rx) = oneshot::channel::<()>();
    let dead = Arc::new(Probe::default());
    links
        .add(
            links.next_id(),
            Some(8),
            "to 8",
            dead.clone(),
            Some(dead_rx),
        )
        .unwrap();
    let (accepted, from_dead) = add(&links, None, "from 8");
    links.learn(accepted, 8);
    let (_, live) = add(&links, Some(10), "to 10");
    links.drop_peer(8, "declared dead");
    assert_eq!(dead.aborted.load(Ordering::SeqCst), 1);
    assert_eq!(from_dead.aborted.load(Ordering::SeqCst), 1);
    assert_eq!(live.aborted.load(Ordering::SeqCst), 0);
    assert_eq!(links.connections(), 1);
    match links.link(8) {
        Err(VanError::PeerGone { peer: 8, reason }) => assert_eq!(reason, "declared dead"),
        other => panic!("expected PeerGone, got {other:?}"),
    }
    // Their ends, reported late by their readers, are no loss.
    assert!(links.closed(accepted, "reset").is_none());
    // A connection opened to the dead peer after the verdict (a last notice dialed to a
    // dying process) is not flushed at stop either: the stop is not held up by it.
    let (_never_either, late_rx) = oneshot::channel::<()>();
    let late = Arc::new(Probe::default());
    links
        .add(
            links.next_id(),
            Some(8),
            "to 8 again",
            late.clone(),
            Some(late_rx),
        )
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert!(runtime.block_on(links.stop(Duration::from_secs(30))));
    assert_eq!(late.aborted.load(Ordering::SeqCst), 1);
    assert_eq!(late.finished.load(Ordering::SeqCst), 0);

    // A process that took the dead peer's id (forget) is flushed as any other.
    let links = bound();
    links.drop_peer(8, "declared dead");
    links.forget(8);
    let (_never, rx) = oneshot::channel::<()>();
    let successor = Arc::new(Probe::default());
    links
        .add(
            links.next_id(),
            Some(8),
            "new 8",
            successor.clone(),
            Some(rx),
        )
        .unwrap();
    assert!(!runtime.block_on(links.stop(Duration::from_millis(50))));
    assert_eq!(successor.finished.load(Ordering::SeqCst), 1);
}

#[test]
fn one_dial_per_peer() {
    let links = Arc::new(bound());
    let dials = Arc::new(AtomicUsize::new(0));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let links = Arc::clone(&links);
            let dials = Arc::clone(&dials);
            tasks.push(tokio::spawn(async move {
                let table = Arc::clone(&links);
                links
                    .connect(5, |_inbox| async move {
                        dials.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let id = table.next_id();
                        table.add(id, Some(5), "dialed", Arc::new(Probe::default()), None)
                    })
                    .await
            }));
        }
        for task in tasks {
            task.await.unwrap().unwrap();
        }
    });
    assert_eq!(dials.load(Ordering::SeqCst), 1, "dialed more than once");
    assert_eq!(links.connections(), 1);
}

/// A dial to a process that was replaced meanwhile (a hung dial to a cut-off host) does
/// not hold up the dial to the new process, and when it connects after all, what it made
/// is retired rather than becoming the route.
#[test]
fn a_dial_to_a_replaced_process_neither_blocks_nor_becomes_the_route() {
    let links = Arc::new(bound());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let table = Arc::clone(&links);
        let old = tokio::spawn({
            let links = Arc::clone(&links);
            async move {
                links
                    .connect(5, |_inbox| async move {
                        // Hangs until the test lets it connect (as a SYN to a cut host
                        // would, until a partition heals).
                        let _ = released.await;
                        let id = table.next_id();
                        table.add(id, Some(5), "old", Arc::new(Probe::default()), None)
                    })
                    .await
            }
        });
        tokio::task::yield_now().await;
        // A new process takes node 5's id: its dial goes ahead at once.
        links.forget(5);
        let table = Arc::clone(&links);
        let fresh = links.connect(5, |_inbox| async move {
            let id = table.next_id();
            table.add(id, Some(5), "new", Arc::new(Probe::default()), None)
        });
        tokio::time::timeout(Duration::from_secs(5), fresh)
            .await
            .expect("the dial to the new process waited for the old one")
            .unwrap();
        assert_eq!(links.link(5).unwrap(), "new");
        // The old dial connects after all: refused as the replaced process's, and what it
        // made is no route (the next send dials the new process again).
        release.send(()).unwrap();
        match old.await.unwrap() {
            Err(VanError::PeerGone { peer: 5, reason }) => {
                assert!(reason.contains("new process"), "{reason}")
            }
            other => panic!("expected PeerGone, got {other:?}"),
        }
        assert!(
            links.link(5).is_err(),
            "a replaced process's connection is a route"
        );
    });
}

#[test]
fn bind_and_connect_need_the_right_state() {
    let links: Links<&'static str> = Links::new(VanKind::Ipc);
    assert!(matches!(
        links.inbox(),
        Err(VanError::NotBound(VanKind::Ipc))
    ));
    let (sender, _inbox) = inbox(4);
    links.bound(sender.clone(), None).unwrap();
    assert!(matches!(
        links.check_bindable(),
        Err(VanError::AlreadyBound(VanKind::Ipc))
    ));
    assert!(matches!(
        links.bound(sender, None),
        Err(VanError::AlreadyBound(VanKind::Ipc))
    ));
}

#[test]
fn a_frame_queue_refuses_frames_once_its_writer_is_gone() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (queue, mut frames) = FrameQueue::new(2, 0);
        queue
            .push(1, smallvec::smallvec![bytes::Bytes::from_static(b"a")])
            .await
            .unwrap();
        assert_eq!(frames.recv().await.unwrap()[0].as_ref(), b"a");
        drop(frames);
        assert!(queue.is_closed());
        assert!(matches!(
            queue
                .push(1, smallvec::smallvec![bytes::Bytes::from_static(b"b")])
                .await,
            Err(VanError::PeerGone { peer: 1, .. })
        ));
    });
}

#[test]
fn free_loopback_ports_are_never_handed_out_twice() {
    // None of these is bound, so each is still free when the next is picked: without the
    // memory of what was handed out, 300 picks among 12,000 ports repeat one almost surely.
    let picks: Vec<u16> = (0..300).map(|_| stream::free_loopback_port()).collect();
    let distinct: std::collections::BTreeSet<u16> = picks.iter().copied().collect();
    assert_eq!(distinct.len(), picks.len(), "{picks:?}");
    assert!(
        picks.iter().all(|p| (20_000..32_000).contains(p)),
        "{picks:?}"
    );
}
