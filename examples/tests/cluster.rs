//! Clusters of real processes on 127.0.0.1: `ps-bench` started by hand once per role (as in
//! ps-lite's tutorial) and through `vans-launch`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{all_succeeded, free_port, text, wait_output};

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");
/// Generous: these run on a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(120);

/// `ps-bench` for one role, configured only through ps-lite's environment.
fn node(role: &str, port: u16, args: &[&str]) -> Command {
    let mut cmd = common::loopback_node(PS_BENCH, role, port);
    cmd.args(args);
    cmd
}

#[test]
fn three_shells_form_a_cluster_and_exit_zero_even_with_the_worker_first() {
    let port = free_port();
    let args = [
        "--sizes",
        "8,4096",
        "--windows",
        "1,8",
        "--seconds",
        "0.1",
        "--no-raw",
    ];
    // The worker starts first and must wait for the scheduler.
    let worker = node("worker", port, &args).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let scheduler = node("scheduler", port, &args).spawn().unwrap();
    let server = node("server", port, &args).spawn().unwrap();
    let [worker, _, _] = all_succeeded([
        ("worker", worker),
        ("server", server),
        ("scheduler", scheduler),
    ]);
    let table = String::from_utf8_lossy(&worker.stdout);
    assert!(table.contains("worker 0 (1 servers, 1 workers)"), "{table}");
    for mode in ["push", "pull", "pushpull"] {
        assert!(
            table.contains(&format!("| {mode}")),
            "no {mode} row: {table}"
        );
    }
}

#[test]
fn a_worker_without_scheduler_fails_at_the_bootstrap_deadline_with_a_clear_error() {
    let port = free_port();
    let started = Instant::now();
    let worker = node("worker", port, &[])
        .env("VANS_BOOTSTRAP_TIMEOUT_SECS", "2")
        .spawn()
        .unwrap();
    let out = wait_output(worker, "lonely worker");
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cluster did not form within 2s"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
}

/// A bootstrap that goes on says what it waits for: a worker with no scheduler warns (at the
/// default level, where it used to be silent for the whole deadline) that it still waits for
/// the scheduler at its address; a scheduler short of nodes says at info level who has
/// joined. Both after 10 s, side by side.
#[test]
fn a_long_bootstrap_says_what_it_waits_for() {
    let (lonely_port, scheduler_port) = (free_port(), free_port());
    let worker = node("worker", lonely_port, &[])
        .env("VANS_BOOTSTRAP_TIMEOUT_SECS", "12")
        .env_remove("PS_VERBOSE")
        .env_remove("RUST_LOG")
        .spawn()
        .unwrap();
    let scheduler = node("scheduler", scheduler_port, &[])
        .env("VANS_BOOTSTRAP_TIMEOUT_SECS", "12")
        .env("PS_VERBOSE", "1")
        .env_remove("RUST_LOG")
        .spawn()
        .unwrap();
    let worker_says = text(&wait_output(worker, "lonely worker"));
    assert!(
        worker_says.contains(&format!(
            "still waiting for the scheduler at 127.0.0.1:{lonely_port} after 1"
        )) && worker_says.contains("of the 12s bootstrap deadline"),
        "{worker_says}"
    );
    assert!(worker_says.contains("WARN"), "{worker_says}");
    let scheduler_says = text(&wait_output(scheduler, "lonely scheduler"));
    assert!(
        scheduler_says.contains("of the 12s bootstrap deadline: 0/1 servers, 0/1 workers joined"),
        "{scheduler_says}"
    );
}

fn launch(servers: u32, workers: u32, env: &[&str], args: &[&str]) -> Command {
    let mut cmd = Command::new(common::LAUNCH.as_str());
    cmd.args(["-s", &servers.to_string(), "-w", &workers.to_string()]);
    for e in env {
        cmd.args(["--env", e]);
    }
    cmd.arg("--")
        .arg(PS_BENCH)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

#[test]
fn two_servers_three_workers_read_back_exact_sums() {
    let child = launch(2, 3, &[], &["--mode", "check", "--keys", "64"])
        .spawn()
        .unwrap();
    let out = wait_output(child, "launcher");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    for rank in 0..3 {
        assert!(
            all.contains(&format!(
                "worker {rank}: exact sums verified for 64 keys from 3 workers"
            )),
            "worker {rank} did not verify: {all}"
        );
    }
}

#[test]
fn no_worker_leaves_a_barrier_before_the_last_arrives() {
    let child = launch(1, 3, &[], &["--mode", "barrier"]).spawn().unwrap();
    let out = wait_output(child, "launcher");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let times = |event: &str| -> Vec<u128> {
        all.lines()
            .filter(|l| l.contains(&format!(" {event} at ")))
            .filter_map(|l| l.rsplit(' ').next()?.trim().parse().ok())
            .collect()
    };
    let (arrived, released) = (times("arrived"), times("released"));
    assert_eq!((arrived.len(), released.len()), (3, 3), "{all}");
    let last_arrival = arrived.iter().max().unwrap();
    assert!(
        released.iter().all(|r| r >= last_arrival),
        "a worker left before the last arrived: arrived {arrived:?}, released {released:?}"
    );
    // The arrivals really were spread out, so the check above means something.
    assert!(arrived.iter().max().unwrap() - arrived.iter().min().unwrap() >= 500);
}

/// Children of `parent`, from /proc.
fn children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may hold spaces; the parent pid is the 2nd field after ")".
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

fn role_of(pid: u32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"DMLC_ROLE="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

#[test]
fn killing_a_server_fails_the_workers_requests_by_name_and_the_launcher_cleans_up() {
    let mut child = launch(
        2,
        2,
        &["PS_HEARTBEAT_INTERVAL=1", "PS_HEARTBEAT_TIMEOUT=4"],
        &[
            "--mode",
            "push",
            "--sizes",
            "4096",
            "--windows",
            "8",
            "--seconds",
            "60",
            "--no-raw",
        ],
    )
    .spawn()
    .unwrap();
    let launcher = child.id();
    // Wait until both workers are pushing (their progress lines go to stderr).
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let started = Instant::now();
    let nodes = loop {
        let nodes: Vec<(u32, String)> = children(launcher)
            .into_iter()
            .filter_map(|pid| Some((pid, role_of(pid)?)))
            .collect();
        if nodes.len() == 5 {
            break nodes;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the cluster did not start: {nodes:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Give the workers time to get going, then kill a server without warning.
    std::thread::sleep(Duration::from_secs(3));
    let (server, _) = nodes.iter().find(|(_, role)| role == "server").unwrap();
    let killed = Instant::now();
    common::signal(*server, "KILL");
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            killed.elapsed() < DEADLINE,
            "the launcher did not exit after a server died"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = killed.elapsed();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let stderr = reader.join().unwrap();
    let all = format!("{stdout}{stderr}");
    assert!(
        !status.success(),
        "the launcher exited 0 after a server was killed: {all}"
    );
    // Within the heartbeat timeout (4 s) plus the launcher's grace for the others.
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}: {all}");
    // The workers' pending requests failed naming the dead server.
    assert!(
        all.contains("(server) failed"),
        "no worker reported the dead server by name: {all}"
    );
    // Nobody is left behind.
    std::thread::sleep(Duration::from_millis(200));
    for (pid, role) in &nodes {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(*pid),
            "{role} {pid} is still running"
        );
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

#[test]
fn a_kubeflow_tf_config_job_runs_unchanged_with_the_chief_hosting_the_scheduler() {
    let (chief, worker, ps) = (free_port(), free_port(), free_port());
    let cluster = format!(
        r#""cluster": {{"chief": ["127.0.0.1:{chief}"], "worker": ["127.0.0.1:{worker}"], "ps": ["127.0.0.1:{ps}"]}}"#
    );
    let task = |kind: &str| {
        let tf_config = format!(
            r#"{{{cluster}, "task": {{"type": "{kind}", "index": 0}}, "rpc_layer": "grpc"}}"#
        );
        Command::new(PS_BENCH)
            .args(["--mode", "check", "--keys", "16"])
            .env("TF_CONFIG", tf_config)
            .env_remove("DMLC_ROLE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let nodes = [
        ("ps", task("ps")),
        ("worker", task("worker")),
        ("chief", task("chief")),
    ];
    let mut verified = 0;
    for (kind, child) in nodes {
        let out = wait_output(child, kind);
        assert!(out.status.success(), "{kind} failed: {}", text(&out));
        verified +=
            usize::from(text(&out).contains("exact sums verified for 16 keys from 2 workers"));
    }
    assert_eq!(verified, 2, "both the chief and the worker verify the sums");
}

#[test]
fn tensorflow_task_names_reach_the_processes_that_run_them_whatever_their_addresses() {
    // Kubeflow-style: the chief, two workers and a ps, on hosts that sort opposite to the
    // task order (numbering by address made the chief worker rank 2, and
    // `/job:worker/task:0` another process).
    let tasks = [
        ("chief", 0, "127.0.0.3"),
        ("worker", 0, "127.0.0.2"),
        ("worker", 1, "127.0.0.1"),
        ("ps", 0, "127.0.0.1"),
    ];
    let addresses: Vec<String> = tasks
        .iter()
        .map(|(_, _, host)| format!("\"{host}:{}\"", free_port()))
        .collect();
    let cluster = format!(
        r#""cluster": {{"chief": [{}], "worker": [{}, {}], "ps": [{}]}}"#,
        addresses[0], addresses[1], addresses[2], addresses[3]
    );
    let children: Vec<_> = tasks
        .iter()
        .map(|(kind, index, _)| {
            let tf_config =
                format!(r#"{{{cluster}, "task": {{"type": "{kind}", "index": {index}}}}}"#);
            let child = Command::new(PS_BENCH)
                .args(["--mode", "check", "--keys", "8"])
                .env("TF_CONFIG", tf_config)
                .env_remove("DMLC_ROLE")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (format!("{kind}:{index}"), child)
        })
        .collect();
    let mut said = String::new();
    for (task, child) in children {
        let out = wait_output(child, &task);
        assert!(out.status.success(), "{task} failed: {}", text(&out));
        said.push_str(&text(&out));
    }
    for line in [
        "task /job:chief/task:0: worker rank 0 (node 9)",
        "task /job:worker/task:0: worker rank 1 (node 11)",
        "task /job:worker/task:1: worker rank 2 (node 13)",
        "task /job:chief/task:0: received a tensor from each of 2 tasks by TensorFlow name",
    ] {
        assert!(said.contains(line), "missing {line:?} in:\n{said}");
    }
}

// With the `rdma` feature, tests/rdma.rs checks the "no RDMA device" error instead.
#[cfg(not(feature = "rdma"))]
#[test]
fn asking_for_rdma_in_a_build_without_it_is_a_clear_error_not_a_silent_fallback() {
    let worker = node("worker", free_port(), &[])
        .env("DMLC_ENABLE_RDMA", "1")
        .spawn()
        .unwrap();
    let out = wait_output(worker, "rdma worker");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rdma van is not compiled in") && stderr.contains("feature `rdma`"),
        "{stderr}"
    );
}

/// The "via …" a stream-van route prints: these tests run over whichever stream van the
/// environment selects (`VANS_STREAM_VAN=uring` runs them all over io_uring; scripts/test.sh
/// does that once more after the main run).
fn via_stream() -> String {
    format!(
        "via {}",
        std::env::var("VANS_STREAM_VAN").unwrap_or_else(|_| "tcp".into())
    )
}

/// Runs the exact-sum check on 2 servers and 2 workers with `env`; returns each worker's
/// "server N via VAN" lines.
fn sums_and_vans(env: &[&str]) -> Vec<String> {
    let mut lines = sums_and_vans_with(env, &[]);
    lines.retain(|l| l.contains(" via "));
    lines
}

/// [`sums_and_vans`] with more ps-bench arguments; also returns the lines naming the memory
/// the values were pushed from and the vans' "listening at" log lines.
fn sums_and_vans_with(env: &[&str], args: &[&str]) -> Vec<String> {
    let mut all_args = vec!["--mode", "check", "--keys", "32"];
    all_args.extend_from_slice(args);
    let child = launch(2, 2, env, &all_args).spawn().unwrap();
    let out = wait_output(child, "launcher");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    for rank in 0..2 {
        assert!(
            all.contains(&format!(
                "worker {rank}: exact sums verified for 32 keys from 2 workers"
            )),
            "{all}"
        );
    }
    all.lines()
        .filter(|l| l.contains(" via ") || l.contains(" memory") || l.contains("listening at"))
        .map(|l| l.rsplit("] ").next().unwrap_or(l).to_owned())
        .collect()
}

#[cfg(feature = "ipc")]
#[test]
fn co_located_nodes_use_shared_memory_and_tcp_when_ipc_is_off_with_the_same_sums() {
    let vans = sums_and_vans(&[]);
    assert_eq!(vans.len(), 4, "{vans:?}");
    assert!(vans.iter().all(|l| l.ends_with("via ipc")), "{vans:?}");
    let vans = sums_and_vans(&["DMLC_ENABLE_IPC=0"]);
    assert_eq!(vans.len(), 4, "{vans:?}");
    assert!(vans.iter().all(|l| l.ends_with(&via_stream())), "{vans:?}");
    let vans = sums_and_vans(&["BYTEPS_ENABLE_IPC=0"]);
    assert!(vans.iter().all(|l| l.ends_with(&via_stream())), "{vans:?}");
}

#[cfg(feature = "ipc")]
#[test]
fn values_pushed_from_the_shared_arena_give_the_same_sums_over_ipc_and_tcp() {
    let lines = sums_and_vans_with(&[], &["--zero-copy"]);
    let memory: Vec<&String> = lines.iter().filter(|l| l.contains(" memory")).collect();
    assert_eq!(memory.len(), 2, "{lines:?}");
    assert!(
        memory.iter().all(|l| l.ends_with("values in ipc memory")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .filter(|l| l.contains(" via "))
            .all(|l| l.ends_with("via ipc")),
        "{lines:?}"
    );
    // The same buffers sent over TCP are ordinary bytes.
    let lines = sums_and_vans_with(&["DMLC_ENABLE_IPC=0"], &["--zero-copy"]);
    assert!(
        lines
            .iter()
            .filter(|l| l.contains(" via "))
            .all(|l| l.ends_with(&via_stream())),
        "{lines:?}"
    );
}

#[cfg(feature = "ipc")]
#[test]
fn the_named_segment_mode_carries_the_same_sums_and_leaves_nothing_in_dev_shm() {
    let lines = sums_and_vans_with(&["VANS_IPC_NAMED=1", "RUST_LOG=info"], &[]);
    let vans: Vec<&String> = lines.iter().filter(|l| l.contains(" via ")).collect();
    assert_eq!(vans.len(), 4, "{lines:?}");
    assert!(vans.iter().all(|l| l.ends_with("via ipc")), "{lines:?}");
    // Servers and workers listen through accept queues in /dev/shm, not abstract sockets.
    let ipc: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("ipc van listening"))
        .collect();
    assert_eq!(ipc.len(), 4, "{lines:?}");
    assert!(
        ipc.iter().all(|l| l.contains("listening at shm:vans-")),
        "{lines:?}"
    );
    // Every node exited in order: its accept queue is gone, and connection segments were
    // unlinked at the handshake. (Other tests' live segments carry other pids.)
    let leftovers: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("vans-"))
                .filter(|n| {
                    let pid = n.split('-').nth(2).and_then(|p| p.parse::<i32>().ok());
                    !pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        leftovers.is_empty(),
        "segments of exited nodes: {leftovers:?}"
    );
}

#[test]
fn without_shared_memory_every_peer_is_reached_over_tcp() {
    let vans = sums_and_vans(&["DMLC_ENABLE_IPC=0"]);
    assert_eq!(vans.len(), 4, "{vans:?}");
    assert!(vans.iter().all(|l| l.ends_with(&via_stream())), "{vans:?}");
}

#[test]
fn ps_verbose_2_logs_every_message_like_ps_lite() {
    let child = launch(1, 1, &["PS_VERBOSE=2"], &["--mode", "check", "--keys", "4"])
        .spawn()
        .unwrap();
    let out = wait_output(child, "launcher");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    for line in [
        "send request control AddNode",
        "recv response control AddNode",
        "send request push cmd 0",
        "recv request pull cmd 0",
        "send response pull cmd 0",
    ] {
        assert!(all.contains(line), "no `{line}` in the log:\n{all}");
    }
}
