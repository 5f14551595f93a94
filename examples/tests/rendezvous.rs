//! The rendezvous across real processes on 127.0.0.1: `rendezvous-exchange` tasks exchanging
//! tensors step after step in pull and push mode (over TCP, and over shared memory with the
//! `ipc` feature), and a task SIGKILLed while another waits on it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{free_port, Watched as Node};

use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

const EXCHANGE: &str = env!("CARGO_BIN_EXE_rendezvous-exchange");
/// Generous: these run on a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(240);

/// `rendezvous-exchange` launching its own clusters (no DMLC_ROLE).
fn launched(args: &[&str]) -> (ExitStatus, String) {
    let mut cmd = Command::new(EXCHANGE);
    cmd.args(args).env_remove("DMLC_ROLE");
    Node::spawn(cmd).wait(DEADLINE, "rendezvous-exchange")
}

fn check_exchange(van: &str) {
    let (status, all) = launched(&["--mode", "check", "--vans", van]);
    assert!(status.success(), "{all}");
    for mode in ["pull", "push"] {
        let line = format!(
            "check {mode}: 100 steps, 10000 tensors each way with 1 peer(s), every value and \
             dead flag verified, via {van}"
        );
        assert!(all.contains(&line), "no `{line}`:\n{all}");
        let line = format!("check {mode}: node 9 verified 10000 pings from node 8 via {van}");
        assert!(all.contains(&line), "no `{line}`:\n{all}");
    }
}

#[test]
fn ten_thousand_tensors_over_100_steps_between_processes_in_pull_and_push_over_tcp() {
    check_exchange("tcp");
}

#[cfg(feature = "ipc")]
#[test]
fn ten_thousand_tensors_over_100_steps_between_processes_in_pull_and_push_over_ipc() {
    check_exchange("ipc");
}

#[test]
fn three_tasks_exchange_with_every_peer_in_both_modes() {
    let (status, all) = launched(&[
        "--mode",
        "check",
        "--vans",
        "tcp",
        "--workers",
        "2",
        "--steps",
        "20",
        "--tensors",
        "50",
    ]);
    assert!(status.success(), "{all}");
    for mode in ["pull", "push"] {
        let line = format!("check {mode}: 20 steps, 2000 tensors each way with 2 peer(s)");
        assert!(all.contains(&line), "no `{line}`:\n{all}");
        for node in [9, 11] {
            let line = format!("check {mode}: node {node} verified 1000 pings from node 8");
            assert!(all.contains(&line), "no `{line}`:\n{all}");
        }
    }
}

#[test]
fn the_benchmark_reports_pull_and_push_rows_from_one_run() {
    let (status, all) = launched(&["--quick", "--vans", "tcp", "--json"]);
    assert!(status.success(), "{all}");
    let json = all
        .lines()
        .find(|l| l.starts_with("[{"))
        .unwrap_or_else(|| panic!("no JSON table:\n{all}"));
    let rows: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
    assert_eq!(rows.len(), 6, "{json}");
    for mode in ["pull", "push"] {
        for (tensor, in_flight) in [("8 B", 1.0), ("8 B", 64.0), ("4 MiB", 4.0)] {
            let row = rows
                .iter()
                .find(|r| r["mode"] == mode && r["tensor"] == tensor && r["in flight"] == in_flight)
                .unwrap_or_else(|| panic!("no {mode} {tensor} x{in_flight} row: {json}"));
            assert!(row["round trips/s"].as_f64().unwrap() > 0.0, "{json}");
        }
    }
}

/// One node of a hand-started cluster (1 server, 1 worker), with heartbeats.
fn node(role: &str, port: u16, protocol: &str) -> Node {
    let mut cmd = common::loopback_node(EXCHANGE, role, port);
    cmd.args(["--mode", "hang", "--protocols", protocol])
        .env("PS_HEARTBEAT_INTERVAL", "1")
        .env("PS_HEARTBEAT_TIMEOUT", "3");
    Node::spawn(cmd)
}

fn killed_peer(protocol: &str) {
    let port = free_port();
    let scheduler = node("scheduler", port, protocol);
    let mut server = node("server", port, protocol);
    let mut worker = node("worker", port, protocol);
    // The server (node 8) waits for a tensor from the worker (node 9), which never sends it.
    server.wait_for_line(&format!("hang {protocol}: node 8 waits for"), "the server");
    worker.wait_for_line("hang: node 9 is ready to be killed", "the worker");
    let killed = Instant::now();
    worker.kill(); // SIGKILL
    let (status, out) = server.wait(Duration::from_secs(60), "the server");
    let elapsed = killed.elapsed();
    scheduler.kill();
    assert_eq!(status.code(), Some(3), "{out}");
    // The error names the step, the key and the peer.
    for part in [
        "step 7, key `/job:worker/replica:0/task:0/device:CPU:0;0000000000000001;\
         /job:ps/replica:0/task:0/device:CPU:0;never-sent;0:0`",
        "peer node 9 (worker)",
    ] {
        assert!(out.contains(part), "no `{part}` in:\n{out}");
    }
    // Connection loss is seen at once; heartbeats (3 s timeout) bound it otherwise.
    assert!(
        elapsed < Duration::from_secs(15),
        "took {elapsed:?}:\n{out}"
    );
}

#[test]
fn a_sigkilled_task_fails_a_pull_waiting_on_it_naming_step_key_and_peer() {
    killed_peer("pull");
}

#[test]
fn a_sigkilled_task_fails_a_push_receive_waiting_on_it_naming_step_key_and_peer() {
    killed_peer("push");
}
