//! Nodes lost by silence: a process stopped with SIGSTOP keeps its connections open and
//! nothing breaks; only the missing heartbeats tell the others. A stopped scheduler: every
//! node must fail with an error naming it within the heartbeat timeout. A stopped server
//! under a flood of large pushes: the worker's sends wait for room the server never makes,
//! and must end with an error naming the server once the scheduler declares it dead.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{free_port, loopback_node, signal, text, wait_output};

use std::process::Child;
use std::time::{Duration, Instant};

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");

fn node(role: &str, port: u16) -> Child {
    pushing(role, port, "1024", "4")
}

/// A node of a cluster whose worker pushes values of `size` bytes, `window` in flight, for
/// 120 s.
fn pushing(role: &str, port: u16, size: &str, window: &str) -> Child {
    loopback_node(PS_BENCH, role, port)
        .args([
            "--mode",
            "push",
            "--sizes",
            size,
            "--windows",
            window,
            "--seconds",
            "120",
            "--no-raw",
        ])
        .env("PS_HEARTBEAT_INTERVAL", "1")
        .env("PS_HEARTBEAT_TIMEOUT", "4")
        .spawn()
        .unwrap()
}

/// Whether the child is still running.
fn running(child: &mut Child) -> bool {
    child.try_wait().unwrap().is_none()
}

#[test]
fn a_stopped_scheduler_fails_every_node_by_name_within_the_heartbeat_timeout() {
    let port = free_port();
    let mut scheduler = node("scheduler", port);
    let mut server = node("server", port);
    let mut worker = node("worker", port);
    // Let the cluster form and the worker push for a while (it runs for 120 s otherwise).
    std::thread::sleep(Duration::from_secs(6));
    for (name, child) in [("scheduler", &mut scheduler), ("server", &mut server)] {
        assert!(running(child), "the {name} ended early");
    }
    assert!(running(&mut worker), "the worker ended early");
    signal(scheduler.id(), "STOP");
    let stopped = Instant::now();
    let server_out = wait_output(server, "server");
    let worker_out = wait_output(worker, "worker");
    let elapsed = stopped.elapsed();
    signal(scheduler.id(), "KILL");
    signal(scheduler.id(), "CONT");
    let _ = scheduler.wait();
    for (name, out) in [("server", &server_out), ("worker", &worker_out)] {
        let all = text(out);
        assert!(!out.status.success(), "the {name} exited 0: {all}");
        assert!(
            all.contains("no answer from the scheduler"),
            "the {name} did not name the silent scheduler: {all}"
        );
    }
    assert!(
        text(&worker_out).contains("node 1 (scheduler) failed"),
        "the worker's requests did not fail naming the scheduler: {}",
        text(&worker_out)
    );
    // Timeout 4 s, checked every 1 s; generous slack for a loaded machine, but far below
    // the 120 s the worker would otherwise run.
    assert!(
        elapsed < Duration::from_secs(20),
        "the nodes took {elapsed:?} to notice"
    );
}

#[test]
fn a_stopped_server_fails_the_sends_that_wait_for_it() {
    let port = free_port();
    // 4 MiB pushes, 64 in flight: the server's queue and socket fill as soon as it stops.
    let [mut scheduler, mut server, mut worker] =
        ["scheduler", "server", "worker"].map(|role| pushing(role, port, "4194304", "64"));
    std::thread::sleep(Duration::from_secs(6));
    for (name, child) in [
        ("scheduler", &mut scheduler),
        ("server", &mut server),
        ("worker", &mut worker),
    ] {
        assert!(running(child), "the {name} ended early");
    }
    signal(server.id(), "STOP");
    let stopped = Instant::now();
    let worker_out = wait_output(worker, "worker");
    let elapsed = stopped.elapsed();
    signal(server.id(), "KILL");
    signal(server.id(), "CONT");
    let _ = server.wait();
    let _ = scheduler.kill();
    let _ = scheduler.wait();
    let all = text(&worker_out);
    assert!(!worker_out.status.success(), "the worker exited 0: {all}");
    assert!(
        all.contains("node 8 (server) failed: declared dead by the scheduler"),
        "the worker did not fail naming the stopped server: {all}"
    );
    // Heartbeat timeout 4 s, then the worker's own stop (its flush gives up after 10 s on
    // the frames queued for the stopped server); without the fix it ran for 60 s and more.
    assert!(
        elapsed < Duration::from_secs(40),
        "the worker took {elapsed:?} to fail"
    );
}
