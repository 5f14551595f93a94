//! A scheduler lost by silence: its process is stopped (SIGSTOP), so its connections stay
//! open and nothing breaks; only the missing answers to heartbeats tell the others. Every
//! node must fail with an error naming the scheduler within the heartbeat timeout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{free_port, loopback_node, signal, text, wait_output};

use std::process::Child;
use std::time::{Duration, Instant};

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");

fn node(role: &str, port: u16) -> Child {
    loopback_node(PS_BENCH, role, port)
        .args([
            "--mode",
            "push",
            "--sizes",
            "1024",
            "--windows",
            "4",
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
