//! The rendezvous of a node handle, from plain threads: a server task and a worker task
//! exchange tensors over TCP on 127.0.0.1, in pull and in push mode, with blocking waits and
//! completion callbacks; bad keys and cleaned-up steps are errors, not hangs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use node::handle::NodeHandle;
use node::{Config, NodeError, Role};
use rendezvous::handle::RendezvousHandle;
use rendezvous::{cpu_device, create_key, Protocol};
use van_core::testkit::free_port;

fn config(role: Role, port: u16) -> Config {
    Config::builder()
        .role(role)
        .num_servers(1)
        .num_workers(1)
        .root_uri("127.0.0.1")
        .root_port(port)
        .bootstrap_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn key(from: u32, to: u32, name: &str, step: u64) -> String {
    create_key(
        &cpu_device(from as i32).unwrap(),
        1,
        &cpu_device(to as i32).unwrap(),
        name,
        (0, step),
    )
}

fn exchange(protocol: Protocol) {
    let port = free_port();
    let scheduler = std::thread::spawn(move || {
        let node = NodeHandle::start(config(Role::Scheduler, port)).unwrap();
        node.finalize().wait().unwrap();
    });
    let server = std::thread::spawn(move || {
        let node = NodeHandle::start(config(Role::Server, port)).unwrap();
        let rdv = RendezvousHandle::start(&node, protocol).wait().unwrap();
        for step in 0..5i64 {
            // Receive the ping, answer with it reversed.
            let ping = rdv
                .recv(step, &key(9, 8, "ping", step as u64))
                .wait()
                .unwrap();
            assert!(!ping.is_dead);
            let pong: Vec<u8> = ping.value.iter().rev().copied().collect();
            rdv.send(step, &key(8, 9, "pong", step as u64), pong.into(), false)
                .unwrap();
        }
        node.finalize().wait().unwrap();
    });
    let node = NodeHandle::start(config(Role::Worker, port)).unwrap();
    let rdv = RendezvousHandle::start(&node, protocol).wait().unwrap();
    assert_eq!(rdv.protocol(), protocol);
    for step in 0..5i64 {
        let ping: Vec<u8> = (0..(1000 * step as usize + 3)).map(|i| i as u8).collect();
        rdv.send(
            step,
            &key(9, 8, "ping", step as u64),
            Bytes::from(ping.clone()),
            false,
        )
        .unwrap();
        let (tx, rx) = mpsc::sync_channel(4);
        let pong_key = key(8, 9, "pong", step as u64);
        if step % 2 == 0 {
            rdv.recv(step, &pong_key)
                .on_complete(move |r| tx.send(r).unwrap());
        } else {
            rdv.recv_then(step, &pong_key, move |r| tx.send(r).unwrap());
        }
        let pong = rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
        let expected: Vec<u8> = ping.into_iter().rev().collect();
        assert_eq!(pong.value, expected);
        rdv.cleanup(step);
    }
    // A malformed key is refused at once.
    assert!(matches!(
        rdv.send(9, "not;a;key", Bytes::new(), false),
        Err(NodeError::InvalidArgument(_))
    ));
    assert!(matches!(
        rdv.recv(9, "nope").wait(),
        Err(NodeError::InvalidArgument(_))
    ));
    // recv_then of a value already here, and of a bad key: answered on the runtime, never on
    // the calling thread.
    let here = key(9, 9, "local", 0);
    rdv.send(60, &here, Bytes::from_static(b"here"), false)
        .unwrap();
    for k in [here.as_str(), "nope"] {
        let (tx, rx) = mpsc::sync_channel(1);
        rdv.recv_then(60, k, move |r| {
            tx.send((std::thread::current().id(), r)).unwrap()
        });
        let (thread, got) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_ne!(thread, std::thread::current().id());
        match got {
            Ok(value) => assert_eq!((k, &value.value[..]), (here.as_str(), &b"here"[..])),
            Err(e) => assert!(
                k == "nope" && matches!(e, NodeError::InvalidArgument(_)),
                "{e}"
            ),
        }
    }
    // A receive pending when its step is cleaned up ends with the rendezvous' error.
    let pending = rdv.recv(100, &key(8, 9, "never", 0));
    std::thread::sleep(Duration::from_millis(50));
    rdv.cleanup(100);
    match pending.wait() {
        Err(NodeError::Rendezvous(e)) => assert!(e.to_string().contains("abort"), "{e}"),
        other => panic!("expected a rendezvous error, got {other:?}"),
    }
    node.finalize().wait().unwrap();
    server.join().unwrap();
    scheduler.join().unwrap();
}

#[test]
fn pull_mode_from_plain_threads() {
    exchange(Protocol::Pull);
}

#[test]
fn push_mode_from_plain_threads() {
    exchange(Protocol::Push);
}
