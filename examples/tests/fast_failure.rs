//! Fast failure: after a kill -9 of any one node, every surviving node exits within the
//! heartbeat timeout plus 1 s; so it does after a server hangs (SIGSTOP) under a flood of
//! 4 MiB pushes, counted from the hang, with 3 s of slack for noticing the silence. Requests and barriers fail naming the dead node, and
//! no van waits out its flush timeout (10 s) for frames queued to a process that will never
//! read them: the scheduler's verdict drops them at once (`Van::drop_peer`). Without that,
//! the workers of the hung server's cluster exited 14 s after the hang instead of 4.3 s.
//!
//! The named shared-memory test needs a build with shared memory (`--features ipc`, as the
//! test command's `--all-features` run has): it says so when the nodes never listened there.
//!
//! One cluster per case (1 scheduler, 1 server, 2 workers of `ps-bench` pushing in cases of
//! 0.3 s with a barrier of the workers before each), run one after another so that the times
//! measured are not those of a machine running several clusters.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{free_port, loopback_node, signal, DEADLINE, PS_BENCH};

use std::io::Read;
use std::process::Child;
use std::time::{Duration, Instant};

/// `PS_HEARTBEAT_TIMEOUT`, in seconds (heartbeats every second).
const HEARTBEAT_TIMEOUT: u64 = 4;

/// The roles of the cluster, in start order.
const ROLES: [&str; 4] = ["scheduler", "server", "worker", "worker"];

/// The clusters of this file run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One node of the cluster, its stderr read on a thread (so that a full pipe never stalls
/// it).
struct Running {
    role: &'static str,
    child: Child,
    stderr: std::thread::JoinHandle<String>,
}

/// What the workers push: value bytes, the requests in flight of each case and its length,
/// and the case at which the victim gets its signal (`settle` after both workers start it).
struct Load {
    size: &'static str,
    windows: fn() -> Vec<u32>,
    seconds: &'static str,
    signal_at: &'static str,
    /// How long after both workers start that case the victim gets its signal.
    settle: Duration,
}

/// 1 KiB values, windows 1 to 60 in cases of 0.3 s (18 s in all, far longer than the test):
/// a barrier of the workers every 0.3 s.
const LIGHT: Load = Load {
    size: "1024",
    windows: || (1..=60).collect(),
    seconds: "0.3",
    signal_at: "x3 in flight",
    settle: Duration::from_secs(1),
};

/// 4 MiB values, 64 in flight, for 60 s: the queues to the server hold hundreds of MiB.
const FLOOD: Load = Load {
    size: "4194304",
    windows: || vec![64],
    seconds: "60",
    signal_at: "x64 in flight",
    // Long enough for the flood to fill every socket buffer and queue to the server.
    settle: Duration::from_secs(3),
};

fn start(
    port: u16,
    load: &Load,
    env: &[(&str, &str)],
) -> (Vec<Running>, std::sync::mpsc::Receiver<()>) {
    let (pushing, started) = std::sync::mpsc::sync_channel(ROLES.len());
    let nodes = ROLES
        .iter()
        .map(|&role| {
            let mut cmd = loopback_node(&PS_BENCH, role, port);
            let windows: Vec<String> = (load.windows)().iter().map(u32::to_string).collect();
            cmd.args([
                "--mode",
                "push",
                "--sizes",
                load.size,
                "--seconds",
                load.seconds,
            ])
            .args(["--windows", &windows.join(","), "--no-raw"])
            .env("DMLC_NUM_WORKER", "2")
            .env("PS_HEARTBEAT_INTERVAL", "1")
            .env("PS_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT.to_string())
            .envs(env.iter().copied());
            let mut child = cmd.spawn().unwrap();
            let mut stderr = child.stderr.take().unwrap();
            let pushing = pushing.clone();
            let signal_at = load.signal_at;
            let stderr = std::thread::spawn(move || {
                let mut all = Vec::new();
                let mut buf = [0u8; 4096];
                let mut told = false;
                while let Ok(n) = stderr.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    all.extend_from_slice(&buf[..n]);
                    if !told && String::from_utf8_lossy(&all).contains(signal_at) {
                        told = true;
                        let _ = pushing.send(());
                    }
                }
                String::from_utf8_lossy(&all).into_owned()
            });
            Running {
                role,
                child,
                stderr,
            }
        })
        .collect();
    (nodes, started)
}

/// Sends `sig` (`KILL` or `STOP`) to node `victim` (an index of [`ROLES`]) a second after
/// both workers started the load's case; returns how long each survivor took to exit after the signal,
/// and its output.
fn signal_and_time(victim: usize, sig: &str, load: &Load, env: &[(&str, &str)]) -> Survivors {
    let (mut nodes, pushing) = start(free_port(), load, env);
    let pids: Vec<u32> = nodes.iter().map(|n| n.child.id()).collect();
    for _ in 0..2 {
        if pushing.recv_timeout(DEADLINE).is_err() {
            for node in &mut nodes {
                let _ = node.child.kill();
            }
            panic!("the workers did not start pushing");
        }
    }
    std::thread::sleep(load.settle);
    let shm_before = shm_files_of(&pids);
    signal(nodes[victim].child.id(), sig);
    let killed = Instant::now();
    let mut exited: Vec<Option<Duration>> = vec![None; nodes.len()];
    exited[victim] = Some(Duration::ZERO);
    while exited.iter().any(Option::is_none) && killed.elapsed() < DEADLINE {
        for (i, node) in nodes.iter_mut().enumerate() {
            if exited[i].is_none() && node.child.try_wait().unwrap().is_some() {
                exited[i] = Some(killed.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if sig == "STOP" {
        signal(nodes[victim].child.id(), "KILL");
        signal(nodes[victim].child.id(), "CONT");
    }
    let mut survivors = Vec::new();
    for (i, mut node) in nodes.into_iter().enumerate() {
        if exited[i].is_none() {
            let _ = node.child.kill();
        }
        let _ = node.child.wait();
        let output = node.stderr.join().unwrap_or_default();
        if i != victim {
            survivors.push((node.role, exited[i].unwrap_or(DEADLINE), output));
        }
    }
    Survivors {
        survivors,
        pids,
        shm_before,
    }
}

/// What [`signal_and_time`] saw: each survivor's role, time to exit and output; the process
/// ids of every node; and their files in `/dev/shm` just before the signal.
struct Survivors {
    survivors: Vec<(&'static str, Duration, String)>,
    pids: Vec<u32>,
    shm_before: Vec<String>,
}

/// The `vans-<uid>-<pid>-…` files of `/dev/shm` that processes `pids` created.
fn shm_files_of(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| {
                    let pid = name.strip_prefix("vans-").and_then(|rest| {
                        rest.split('-').nth(1).and_then(|p| p.parse::<u32>().ok())
                    });
                    pid.is_some_and(|p| pids.contains(&p))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn every_survivor_exits_within_the_heartbeat_timeout_after(
    victim: usize,
    sig: &str,
    load: &Load,
    env: &[(&str, &str)],
) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A kill closes the victim's connections, so the others know at once (the bound:
    // the heartbeat timeout plus 1 s). A hang shows only as silence, which the scheduler
    // notices up to a heartbeat period (1 s) after the timeout, on a loaded machine later:
    // its bound has 3 s of slack, still far below the 14 s a stop took when it flushed to
    // the hung server.
    let slack = if sig == "KILL" { 1 } else { 3 };
    let bound = Duration::from_secs(HEARTBEAT_TIMEOUT + slack);
    let survivors = signal_and_time(victim, sig, load, env).survivors;
    let times: Vec<String> = survivors
        .iter()
        .map(|(role, took, _)| format!("{role} {:.2} s", took.as_secs_f64()))
        .collect();
    eprintln!("SIG{sig} to the {}: {}", ROLES[victim], times.join(", "));
    for (role, took, output) in &survivors {
        assert!(
            *took <= bound,
            "after SIG{sig} to the {}, the {role} took {took:?} to exit (bound {bound:?}): \
             {output}",
            ROLES[victim]
        );
        assert!(
            !output.contains("not written within"),
            "the {role} waited to flush frames to a dead peer: {output}"
        );
    }
}

#[test]
fn every_survivor_of_a_killed_scheduler_exits_within_the_heartbeat_timeout() {
    every_survivor_exits_within_the_heartbeat_timeout_after(0, "KILL", &LIGHT, &[]);
}

#[test]
fn every_survivor_of_a_killed_server_exits_within_the_heartbeat_timeout() {
    every_survivor_exits_within_the_heartbeat_timeout_after(1, "KILL", &LIGHT, &[]);
}

#[test]
fn every_survivor_of_a_killed_worker_exits_within_the_heartbeat_timeout() {
    every_survivor_exits_within_the_heartbeat_timeout_after(2, "KILL", &LIGHT, &[]);
}

/// In named shared-memory mode, a kill -9 used to leave the server's accept queue (12 KiB)
/// in `/dev/shm` in 3 of 3 runs: the survivors exited before the once-a-second sweep. Now
/// the survivors remove a dead peer's segments when they learn of its death and when they
/// stop (judged by its owner lock): nothing of the run is left, in 10 of 10 runs.
#[cfg(feature = "ipc")]
#[test]
fn a_killed_server_in_named_mode_leaves_nothing_in_dev_shm() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let named = [("VANS_IPC_NAMED", "1"), ("DMLC_ENABLE_IPC", "1")];
    for run in 1..=10 {
        let Survivors {
            survivors,
            pids,
            shm_before,
        } = signal_and_time(1, "KILL", &LIGHT, &named);
        for (role, took, output) in &survivors {
            assert!(
                *took < DEADLINE,
                "run {run}: the {role} did not exit: {output}"
            );
        }
        // The servers and workers did listen in /dev/shm (a build with shared memory).
        assert!(
            shm_before.len() >= 3,
            "run {run}: no accept queues in /dev/shm while the cluster ran (build with \
             `--features ipc`): {shm_before:?}"
        );
        let left = shm_files_of(&pids);
        assert!(left.is_empty(), "run {run}: left in /dev/shm: {left:?}");
    }
}

#[test]
fn every_survivor_of_a_hung_flooded_server_exits_within_the_heartbeat_timeout() {
    every_survivor_exits_within_the_heartbeat_timeout_after(1, "STOP", &FLOOD, &[]);
}

/// The hung server again, its peers on the stream van alone (no shared memory): TCP.
#[test]
fn a_hung_flooded_server_over_tcp_holds_up_no_survivor() {
    let tcp = [("DMLC_ENABLE_IPC", "0"), ("VANS_STREAM_VAN", "tcp")];
    every_survivor_exits_within_the_heartbeat_timeout_after(1, "STOP", &FLOOD, &tcp);
}

/// The hung server again over the io_uring van: its threads close the dead peer's
/// connections abortively instead of flushing to it at stop.
#[cfg(feature = "uring")]
#[test]
fn a_hung_flooded_server_over_io_uring_holds_up_no_survivor() {
    let uring = [("DMLC_ENABLE_IPC", "0"), ("VANS_STREAM_VAN", "uring")];
    every_survivor_exits_within_the_heartbeat_timeout_after(1, "STOP", &FLOOD, &uring);
}
