//! Collectives among worker processes on 127.0.0.1 (`allreduce-bench node …`): every
//! collective on 2, 3 and 4 ranks, over TCP and (with feature `ipc`) shared memory; and an
//! elastic loop that loses a rank to `kill -9`, goes on in a new generation without it, and
//! admits the process started in its place, with the planned all-reduce algorithm and with
//! each other one forced.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Child, Command};
use std::time::Duration;

const BENCH: &str = env!("CARGO_BIN_EXE_allreduce-bench");

/// One node of a cluster of 1 server and `workers` workers whose scheduler is at `port`.
fn node(role: &str, port: u16, workers: usize, args: &[&str], tcp: bool) -> Command {
    let mut cmd = common::loopback_node(BENCH, role, port);
    cmd.env("DMLC_NUM_WORKER", workers.to_string())
        .env("PS_HEARTBEAT_INTERVAL", "1")
        .env("PS_HEARTBEAT_TIMEOUT", "10")
        .arg("node")
        .args(args);
    if tcp {
        cmd.env("DMLC_ENABLE_IPC", "0");
    }
    cmd
}

struct Cluster {
    scheduler: Child,
    server: Child,
    workers: Vec<Child>,
}

fn start(workers: usize, args: &[&str], tcp: bool) -> (Cluster, u16) {
    start_with(workers, args, tcp, &[])
}

/// [`start`] with more environment for every node.
fn start_with(workers: usize, args: &[&str], tcp: bool, env: &[(&str, &str)]) -> (Cluster, u16) {
    let port = common::free_port();
    let spawn = |role| {
        node(role, port, workers, args, tcp)
            .envs(env.iter().copied())
            .spawn()
            .unwrap()
    };
    let scheduler = spawn("scheduler");
    let server = spawn("server");
    let workers = (0..workers).map(|_| spawn("worker")).collect();
    (
        Cluster {
            scheduler,
            server,
            workers,
        },
        port,
    )
}

/// Waits for every worker, then the server and scheduler; returns the workers' output.
fn finish(cluster: Cluster, what: &str) -> Vec<String> {
    let outputs: Vec<String> = cluster
        .workers
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let out = common::wait_output(w, &format!("{what}: worker {i}"));
            let text = common::text(&out);
            assert!(out.status.success(), "{what}: worker {i} failed:\n{text}");
            text
        })
        .collect();
    for (name, child) in [("server", cluster.server), ("scheduler", cluster.scheduler)] {
        let out = common::wait_output(child, &format!("{what}: {name}"));
        assert!(
            out.status.success(),
            "{what}: {name} failed:\n{}",
            common::text(&out)
        );
    }
    outputs
}

fn every_collective(workers: usize, tcp: bool) {
    let what = format!("{workers} ranks, tcp {tcp}");
    let (cluster, _) = start(workers, &["check"], tcp);
    let outputs = finish(cluster, &what);
    let mut ranks: Vec<usize> = outputs
        .iter()
        .map(|text| {
            let line = text
                .lines()
                .find(|l| l.starts_with("collective check ok"))
                .unwrap_or_else(|| panic!("{what}: no check line in\n{text}"));
            assert!(line.ends_with(&format!("of {workers}")), "{line}");
            line.split_whitespace().nth(4).unwrap().parse().unwrap()
        })
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..workers).collect::<Vec<_>>(), "{what}");
}

#[test]
fn every_collective_on_two_three_and_four_ranks_over_tcp() {
    for workers in [2, 3, 4] {
        every_collective(workers, true);
    }
}

#[cfg(feature = "ipc")]
#[test]
fn every_collective_on_three_ranks_over_shared_memory() {
    every_collective(3, false);
}

#[test]
fn a_killed_rank_fails_the_others_who_go_on_without_it_and_admit_its_replacement() {
    // The plan's choice: recursive doubling on 4 ranks, the direct exchange on 3.
    elastic_loop(None);
}

#[test]
fn the_elastic_loop_holds_around_the_ring() {
    elastic_loop(Some("ring"));
}

#[test]
fn the_elastic_loop_holds_by_recursive_doubling_on_three_ranks_too() {
    // The generation of 3 folds its third rank in and out.
    elastic_loop(Some("doubling"));
}

/// Four ranks all-reduce in a loop (`VANS_COLLECTIVE_ALGO=algorithm` on every node when
/// given); one is killed, the others go on without it, its replacement is admitted.
fn elastic_loop(algorithm: Option<&str>) {
    // About 20 s of steps: the replacement joins while the survivors are mid-loop.
    let args = [
        "elastic",
        "--steps",
        "600",
        "--len",
        "5000",
        "--step-ms",
        "30",
    ];
    let env: Vec<(&str, &str)> = algorithm
        .map(|a| ("VANS_COLLECTIVE_ALGO", a))
        .into_iter()
        .collect();
    let (mut cluster, port) = start_with(4, &args, true, &env);
    std::thread::sleep(Duration::from_secs(4));
    let victim = cluster.workers.remove(1);
    common::signal(victim.id(), "KILL");
    let killed = common::wait_output(victim, "the killed worker");
    assert!(!killed.status.success());
    std::thread::sleep(Duration::from_secs(4));
    // A new process in its place: it takes the dead node's id and asks to join.
    cluster.workers.push(
        node("worker", port, 4, &args, true)
            .envs(env.iter().copied())
            .spawn()
            .unwrap(),
    );
    let outputs = finish(cluster, "elastic");
    for (i, text) in outputs.iter().enumerate() {
        assert!(
            text.contains("elastic ok: 600 steps"),
            "worker {i} did not finish:\n{text}"
        );
    }
    // The survivors saw the failure named, a generation of 3, then one of 4 again.
    for (i, text) in outputs[..3].iter().enumerate() {
        assert!(
            text.lines().any(|l| l.contains("of generation 1 failed")),
            "survivor {i} did not see the rank's failure named:\n{text}"
        );
        let sizes: Vec<usize> = text
            .lines()
            .filter_map(|l| l.strip_prefix("generation "))
            .filter_map(|l| l.split(" size ").nth(1)?.split(' ').next()?.parse().ok())
            .collect();
        let three = sizes.iter().position(|&s| s == 3);
        let four_after = three.and_then(|t| sizes[t..].iter().position(|&s| s == 4));
        assert!(
            sizes.first() == Some(&4) && four_after.is_some(),
            "survivor {i}: generation sizes {sizes:?} (expected 4, then 3, then 4):\n{text}"
        );
    }
}
