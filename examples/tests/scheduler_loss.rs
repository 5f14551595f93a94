//! Nodes lost by silence: a process stopped with SIGSTOP keeps its connections open and
//! nothing breaks; only the missing heartbeats tell the others. A stopped scheduler: every
//! node must fail within the heartbeat timeout, with an error naming it (or, on a worker,
//! naming the server that stopped for that reason a moment earlier). A stopped server
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
        .env("PS_HEARTBEAT_TIMEOUT", "4")
        .spawn()
        .unwrap()
}

/// `role` of a cluster whose worker pushes `size`-byte values, `window` in flight, for 120 s,
/// with heartbeats every second.
fn pushing(role: &str, port: u16, size: &str, window: &str) -> std::process::Command {
    let mut cmd = loopback_node(PS_BENCH, role, port);
    cmd.args(["--mode", "push", "--sizes", size, "--windows", window])
        .args(["--seconds", "120", "--no-raw"])
        .env("PS_HEARTBEAT_INTERVAL", "1");
    cmd
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
        assert!(!out.status.success(), "the {name} exited 0: {}", text(out));
    }
    let server_says = text(&server_out);
    assert!(
        server_says.contains("no answer from the scheduler"),
        "the server did not name the silent scheduler: {server_says}"
    );
    // Both notice the silence within the same second or so; the first to stop ends its
    // connections at once, so the worker may see the server leave (which named the
    // scheduler) just before it notices the silence itself.
    let worker_says = text(&worker_out);
    assert!(
        (worker_says.contains("no answer from the scheduler")
            && worker_says.contains("node 1 (scheduler) failed"))
            || worker_says.contains("node 8 (server) failed: connection lost"),
        "the worker's requests did not fail naming the scheduler or the server that left: \
         {worker_says}"
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
    // Over TCP and over shared memory (what loopback nodes pick in a build with `ipc`), side
    // by side.
    let runs: Vec<_> = ["0", "1"]
        .into_iter()
        .map(|ipc| std::thread::spawn(move || stopped_server(ipc)))
        .collect();
    for run in runs {
        if let Err(panic) = run.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// A server stopped under 4 MiB pushes, 64 in flight (`DMLC_ENABLE_IPC` = `ipc`): the
/// worker must fail naming it once the scheduler declares it dead.
fn stopped_server(ipc: &str) {
    use std::io::BufRead;
    let port = free_port();
    let [mut scheduler, mut server, mut worker] = ["scheduler", "server", "worker"].map(|role| {
        pushing(role, port, "4194304", "64")
            // Longer than the other test's 4 s: moving 256 MiB in flight on a loaded 2-core
            // machine can starve a heartbeat for seconds (a CI run lost the server that way).
            .env("PS_HEARTBEAT_TIMEOUT", "8")
            .env("DMLC_ENABLE_IPC", ipc)
            .spawn()
            .unwrap()
    });
    // The worker's progress (on stderr), read as it comes: the server is stopped once the
    // worker pushes.
    let stderr = worker.stderr.take().unwrap();
    let (lines, started) = std::sync::mpsc::sync_channel(1);
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("in flight for") {
                let _ = lines.try_send(());
            }
            all += &line;
            all.push('\n');
        }
        all
    });
    if started.recv_timeout(Duration::from_secs(60)).is_err() {
        for child in [&mut scheduler, &mut server, &mut worker] {
            let _ = child.kill();
        }
        panic!("ipc {ipc}: the worker never started pushing");
    }
    std::thread::sleep(Duration::from_secs(1));
    assert!(running(&mut server), "ipc {ipc}: the server ended early");
    signal(server.id(), "STOP");
    let stopped = Instant::now();
    let worker_out = wait_output(worker, "worker");
    let elapsed = stopped.elapsed();
    signal(server.id(), "KILL");
    signal(server.id(), "CONT");
    let _ = server.wait();
    let _ = scheduler.kill();
    let _ = scheduler.wait();
    let all = format!("{}{}", text(&worker_out), reader.join().unwrap());
    assert!(
        !worker_out.status.success(),
        "ipc {ipc}: the worker exited 0: {all}"
    );
    assert!(
        all.contains("node 8 (server) failed: declared dead by the scheduler"),
        "ipc {ipc}: the worker did not fail naming the stopped server: {all}"
    );
    // Heartbeat timeout 8 s; the frames queued for the stopped server are dropped with the
    // scheduler's verdict, so the worker's stop does not wait for them (over TCP it waited
    // 60 s and more before heartbeats, 10 s more before the verdict dropped them).
    assert!(
        elapsed < Duration::from_secs(50),
        "ipc {ipc}: the worker took {elapsed:?} to fail"
    );
}
