//! Collectives among worker processes on 127.0.0.1 (`allreduce-bench node …`): every
//! collective on 2, 3 and 4 ranks, over TCP and (with feature `ipc`) shared memory; every
//! collective taking, at sizes around each bound of the selection table, the algorithm
//! `allreduce-bench --explain` prints for it; and an
//! elastic loop that loses a rank to `kill -9`, goes on in a new generation without it, and
//! admits the process started in its place, with the planned all-reduce algorithm and with
//! each other one forced (shared memory among them).

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

/// Starts a cluster running `args` on each worker, with `env` for every node.
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

fn every_collective_with(workers: usize, tcp: bool, env: &[(&str, &str)]) -> Vec<String> {
    let what = format!("{workers} ranks, tcp {tcp}, {env:?}");
    let (cluster, _) = start_with(workers, &["check"], tcp, env);
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
    outputs
}

#[test]
fn every_collective_on_two_three_and_four_ranks_over_tcp() {
    for workers in [2, 3, 4] {
        let outputs = every_collective_with(workers, true, &[("RUST_LOG", "collective=info")]);
        // Ranks that do not share memory connect directly for their collectives.
        for text in &outputs {
            assert!(
                text.contains(&format!("go over a TCP mesh ({workers} ranks")),
                "no mesh:\n{text}"
            );
        }
    }
}

#[test]
fn every_collective_over_the_vans_without_the_mesh() {
    every_collective_with(3, true, &[("VANS_COLLECTIVE_MESH", "0")]);
}

#[cfg(feature = "ipc")]
#[test]
fn every_collective_on_three_ranks_over_shared_memory() {
    let outputs = every_collective_with(3, false, &[("RUST_LOG", "collective=info")]);
    // Co-located ranks all-reduce through one shared segment, not messages.
    for text in &outputs {
        assert!(
            text.contains("go through shared memory (3 ranks"),
            "no shared-memory group:\n{text}"
        );
        // Each rank mapped the others' arenas, so buffers from `Postoffice::alloc` are read
        // in place.
        assert!(
            text.contains("in a rank's shared arena are read in place"),
            "arenas not mapped:\n{text}"
        );
    }
}

#[cfg(feature = "ipc")]
#[test]
fn every_collective_through_one_shared_segment_on_two_and_four_ranks() {
    for workers in [2, 4] {
        every_collective_with(workers, false, &[("VANS_COLLECTIVE_ALGO", "shm")]);
    }
}

/// Sizes on both sides of the selection table's bounds (64 KiB direct, 512 KiB
/// Rabenseifner's), each a whole f32 per rank on 2, 3 and 4 ranks.
const GRID_SIZES: &str = "48,65520,65568,524256,524304";
const GRID_COLLECTIVES: &str = "allreduce,reducescatter,allgather,broadcast";

/// `allreduce-bench --explain --json` for one van and rank count under `env`: the algorithm
/// of each (collective, bytes).
fn explained(van: &str, ranks: usize, env: &[(&str, &str)]) -> Vec<(String, u64, String)> {
    let out = Command::new(BENCH)
        .args([
            "--explain",
            "--json",
            "--van",
            van,
            "--ranks",
            &ranks.to_string(),
        ])
        .args(["--sizes", GRID_SIZES, "--collectives", GRID_COLLECTIVES])
        .env_remove("VANS_COLLECTIVE_ALGO")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = common::text(&out);
    assert!(out.status.success(), "--explain failed:\n{text}");
    text.lines()
        .map(|line| {
            let cell: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{e}: not a JSON cell: {line}"));
            let field = |k: &str| cell[k].as_str().unwrap_or_default().to_owned();
            (
                field("collective"),
                cell["bytes"].as_u64().unwrap(),
                field("algorithm"),
            )
        })
        .collect()
}

/// Runs every collective of the grid on `ranks` ranks over `van` under `env` and checks that
/// each rank took, at every size, the algorithm `--explain` printed for it.
fn runs_as_explained(van: &str, ranks: usize, env: &[(&str, &str)]) {
    let want = explained(van, ranks, env);
    let cells = GRID_SIZES.split(',').count() * GRID_COLLECTIVES.split(',').count();
    assert_eq!(want.len(), cells, "{want:?}");
    let args = [
        "select",
        "--sizes",
        GRID_SIZES,
        "--collectives",
        GRID_COLLECTIVES,
    ];
    let what = format!("{van}, {ranks} ranks, {env:?}");
    let mut env = env.to_vec();
    env.push(("RUST_LOG", "warn"));
    let (cluster, _) = start_with(ranks, &args, van == "tcp", &env);
    for (i, text) in finish(cluster, &what).iter().enumerate() {
        let took: Vec<(String, u64, String)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("took "))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[0].to_owned(), f[1].parse().unwrap(), f[2].to_owned())
            })
            .collect();
        assert_eq!(
            took, want,
            "{what}: worker {i} took (left) what --explain did not print (right)"
        );
    }
}

#[test]
fn every_collective_takes_the_algorithm_explain_prints_over_tcp() {
    for ranks in [2, 3, 4] {
        runs_as_explained("tcp", ranks, &[]);
    }
    // Told algorithms, per collective; the others still decide.
    let told = [("VANS_COLLECTIVE_ALGO", "allreduce:ring,all_gather:direct")];
    runs_as_explained("tcp", 4, &told);
    // Pairing by bits on 3 ranks cannot be had: the direct exchange, on both sides.
    let told = [("VANS_COLLECTIVE_ALGO", "doubling,reduce_scatter:halving")];
    runs_as_explained("tcp", 3, &told);
}

#[cfg(feature = "ipc")]
#[test]
fn every_collective_takes_the_algorithm_explain_prints_over_shared_memory() {
    for ranks in [2, 3, 4] {
        runs_as_explained("ipc", ranks, &[]);
    }
    // Told to go by messages between ranks that share memory.
    let told = [("VANS_COLLECTIVE_ALGO", "reduce_scatter:ring,broadcast:ring")];
    runs_as_explained("ipc", 3, &told);
}

/// Rank 1 of 3 calls another collective than the others (`what`), over TCP (`tcp`) or
/// shared memory: every rank fails at once with an error naming both sides in the user's
/// terms (`sides`: the odd rank's and the others' length, element type or collective), no
/// internal tag.
fn a_mismatch_names_both_sides(what: &str, tcp: bool, env: &[(&str, &str)], sides: [&str; 2]) {
    let scene = format!("a {what} mismatch, tcp {tcp}, {env:?}");
    let (cluster, _) = start_with(3, &["mismatch", what], tcp, env);
    for (i, text) in finish(cluster, &scene).iter().enumerate() {
        let line = text
            .lines()
            .find(|l| l.starts_with("mismatch after "))
            .unwrap_or_else(|| panic!("{scene}: worker {i} printed no error:\n{text}"));
        for side in sides {
            assert!(
                line.contains(side),
                "{scene}: worker {i} does not say {side:?}: {line}"
            );
        }
        assert!(
            !line.contains(" tag "),
            "{scene}: worker {i} speaks of tags: {line}"
        );
        let secs: f64 = line["mismatch after ".len()..]
            .split(' ')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(f64::MAX);
        assert!(
            secs < 5.0,
            "{scene}: worker {i} failed after {secs} s: {line}"
        );
    }
}

const MISMATCHES: [(&str, [&str; 2]); 3] = [
    ("length", ["1200", "1000"]),
    ("dtype", ["f64", "f32"]),
    ("collective", ["all_gather", "allreduce"]),
];

#[test]
fn a_mismatch_names_both_sides_over_the_mesh_and_the_vans() {
    for (what, sides) in MISMATCHES {
        a_mismatch_names_both_sides(what, true, &[], sides);
        a_mismatch_names_both_sides(what, true, &[("VANS_COLLECTIVE_MESH", "0")], sides);
    }
}

#[cfg(feature = "ipc")]
#[test]
fn a_mismatch_names_both_sides_through_shared_memory() {
    for (what, sides) in MISMATCHES {
        a_mismatch_names_both_sides(what, false, &[], sides);
    }
}

#[test]
fn asking_for_shared_memory_between_ranks_that_cannot_share_it_fails_clearly() {
    // Shared memory disabled: the ranks talk TCP, and the forced algorithm cannot be had.
    // The first worker to all-reduce among two ranks fails saying why. The other may instead
    // see that worker go (or be left in a generation of its own, where nothing needs
    // sharing), so it is given a moment and then stopped; one of them must say why.
    let (mut cluster, _) = start_with(2, &["check"], true, &[("VANS_COLLECTIVE_ALGO", "shm")]);
    let start = std::time::Instant::now();
    while !cluster
        .workers
        .iter_mut()
        .any(|w| matches!(w.try_wait(), Ok(Some(_))))
    {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no worker ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let grace = std::time::Instant::now();
    while grace.elapsed() < Duration::from_secs(10)
        && cluster
            .workers
            .iter_mut()
            .any(|w| matches!(w.try_wait(), Ok(None)))
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut texts = Vec::new();
    for (i, mut worker) in cluster.workers.into_iter().enumerate() {
        let _ = worker.kill();
        let out = common::wait_output(worker, &format!("worker {i}"));
        texts.push((out.status.success(), common::text(&out)));
    }
    assert!(
        texts.iter().any(|(ok, text)| !ok
            && text.contains(
                "VANS_COLLECTIVE_ALGO tells allreduce to take shm, but the ranks \
                              do not all share"
            )),
        "no worker said why: {texts:#?}"
    );
    for mut child in [cluster.server, cluster.scheduler] {
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[test]
fn a_killed_rank_fails_the_others_who_go_on_without_it_and_admit_its_replacement() {
    // The plan's choice: recursive doubling on 4 ranks, the direct exchange on 3.
    elastic_loop(None, true);
}

#[test]
fn the_elastic_loop_holds_around_the_ring() {
    elastic_loop(Some("ring"), true);
}

#[test]
fn the_elastic_loop_holds_by_recursive_doubling_on_three_ranks_too() {
    // The generation of 3 folds its third rank in and out.
    elastic_loop(Some("doubling"), true);
}

#[test]
fn the_elastic_loop_holds_by_rabenseifner_on_three_ranks_too() {
    // Halving and doubling on 4 ranks; on 3, the third folds in and out.
    elastic_loop(Some("rabenseifner"), true);
}

#[test]
fn the_elastic_loop_holds_over_the_vans_without_the_mesh() {
    elastic_loop_with(
        &[
            ("VANS_COLLECTIVE_ALGO", "ring"),
            ("VANS_COLLECTIVE_MESH", "0"),
        ],
        true,
    );
}

/// Rank 1 of 3 kills itself at the start of a step while the others wait in the step's
/// ring all-reduce (1 MiB) over the TCP mesh: rank 2, which receives from it, leaves the
/// generation and shuts its connections, so rank 0, which receives from rank 2, sees that
/// connection break first. Each survivor must name rank 1, then go on in a generation of 2
/// and admit rank 1's replacement.
#[test]
fn a_rank_killed_mid_ring_is_the_one_the_survivors_name_over_tcp() {
    let args = [
        "elastic",
        "--steps",
        "120",
        "--len",
        "131072",
        "--step-ms",
        "0",
    ];
    let dying: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--die-at-step", "40"])
        .collect();
    let (mut cluster, port) = start_with(3, &dying, true, &[]);
    let started = std::time::Instant::now();
    let victim = loop {
        let ended = cluster
            .workers
            .iter_mut()
            .position(|w| matches!(w.try_wait(), Ok(Some(_))));
        if let Some(i) = ended {
            break cluster.workers.remove(i);
        }
        assert!(started.elapsed() < common::DEADLINE, "no rank died");
        std::thread::sleep(Duration::from_millis(20));
    };
    let died = common::wait_output(victim, "the dying worker");
    let text = common::text(&died);
    assert!(!died.status.success(), "{text}");
    let dead: i32 = text
        .split("rank 1 (node ")
        .nth(1)
        .and_then(|rest| rest.split(')').next()?.parse().ok())
        .unwrap_or_else(|| panic!("the dying worker did not say its node:\n{text}"));
    // A new process in its place: it takes the dead node's id and asks to join.
    cluster
        .workers
        .push(node("worker", port, 3, &args, true).spawn().unwrap());
    let outputs = finish(cluster, "a rank killed mid-ring");
    for (i, text) in outputs[..2].iter().enumerate() {
        assert!(
            text.contains("elastic ok: 120 steps"),
            "worker {i}:\n{text}"
        );
        assert_names_the_dead(i, text, Some(dead));
    }
}

#[cfg(feature = "ipc")]
#[test]
fn the_elastic_loop_holds_through_shared_memory() {
    // Every generation (4, 3, then 4 ranks) maps a segment of its own; the killed rank's
    // stops the survivors' waits.
    elastic_loop(Some("shm"), false);
}

/// Four ranks all-reduce in a loop (`VANS_COLLECTIVE_ALGO=algorithm` on every node when
/// given, over TCP or shared memory); one is killed, the others go on without it, its
/// replacement is admitted.
fn elastic_loop(algorithm: Option<&str>, tcp: bool) {
    let env: Vec<(&str, &str)> = algorithm
        .map(|a| ("VANS_COLLECTIVE_ALGO", a))
        .into_iter()
        .collect();
    elastic_loop_with(&env, tcp);
}

/// A survivor's first failure line (`rank R (node X) of generation G failed`, or `… failed`
/// carried in another error) names the killed rank, not a live neighbour whose connection
/// broke because of it: node `dead`, or when not known, the node missing from the
/// generation the survivor settled into next.
fn assert_names_the_dead(i: usize, text: &str, dead: Option<i32>) {
    let lines: Vec<&str> = text.lines().collect();
    let Some(at) = lines
        .iter()
        .position(|l| l.starts_with("step ") && l.contains(" failed") || l.starts_with("sync "))
    else {
        panic!("survivor {i}: no failure line:\n{text}");
    };
    let named: Option<i32> = lines[at]
        .split("(node ")
        .nth(1)
        .and_then(|rest| rest.split(')').next()?.parse().ok());
    let named = named.unwrap_or_else(|| panic!("survivor {i}: {:?} names no node", lines[at]));
    if let Some(dead) = dead {
        assert_eq!(
            named, dead,
            "survivor {i} blamed node {named}: {:?}",
            lines[at]
        );
        return;
    }
    let members = lines[at..]
        .iter()
        .find_map(|l| l.strip_prefix("generation ")?.split(" members ").nth(1))
        .unwrap_or_else(|| panic!("survivor {i}: no generation after the failure:\n{text}"));
    let members: Vec<i32> = members
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .filter_map(|m| m.trim().parse().ok())
        .collect();
    assert!(
        !members.contains(&named),
        "survivor {i} blamed node {named}, a member of the next generation {members:?}: {:?}",
        lines[at]
    );
}

/// [`elastic_loop`] with `env` for every node.
fn elastic_loop_with(env: &[(&str, &str)], tcp: bool) {
    elastic_loop_of(4, env, tcp);
}

/// [`elastic_loop_with`] on `n` ranks.
fn elastic_loop_of(n: usize, env: &[(&str, &str)], tcp: bool) {
    let args = common::ELASTIC_ARGS;
    let (mut cluster, port) = start_with(n, &args, tcp, env);
    std::thread::sleep(Duration::from_secs(4));
    let victim = cluster.workers.remove(1);
    common::signal(victim.id(), "KILL");
    let killed = common::wait_output(victim, "the killed worker");
    assert!(!killed.status.success());
    std::thread::sleep(Duration::from_secs(4));
    // A new process in its place: it takes the dead node's id and asks to join.
    cluster.workers.push(
        node("worker", port, n, &args, tcp)
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
    // The survivors saw the failure named, a generation of n - 1, then one of n again.
    // (Under load a worker may join late, so the first generation of n need not be number 1.)
    for (i, text) in outputs[..n - 1].iter().enumerate() {
        assert!(
            text.lines()
                .any(|l| l.contains(") of generation ") && l.contains(" failed")),
            "survivor {i} did not see the rank's failure named:\n{text}"
        );
        assert_names_the_dead(i, text, None);
        let sizes: Vec<usize> = text
            .lines()
            .filter_map(|l| l.strip_prefix("generation "))
            .filter_map(|l| l.split(" size ").nth(1)?.split(' ').next()?.parse().ok())
            .collect();
        let four = sizes.iter().position(|&s| s == n);
        let three = four.and_then(|f| Some(f + sizes[f..].iter().position(|&s| s == n - 1)?));
        let four_after = three.and_then(|t| sizes[t..].iter().position(|&s| s == n));
        assert!(
            four_after.is_some(),
            "survivor {i}: generation sizes {sizes:?} (expected {n}, then {}, then {n}):\n{text}",
            n - 1
        );
    }
}

/// `allreduce-bench` times every collective beside Open MPI's and reports each as JSON with
/// the same-run ratios (Open MPI's side compiled with `mpicc` and run under `mpirun`).
#[test]
fn the_benchmark_reports_every_collective_beside_open_mpi() {
    let out = Command::new(BENCH)
        .args([
            "--van", "tcp", "--ranks", "2", "--sizes", "4K,64K", "--iters", "5",
        ])
        .args([
            "--collectives",
            "allreduce,allgather,reducescatter,broadcast",
        ])
        .args(["--mpi", "required", "--json"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 8, "{text}");
    for name in ["allreduce", "allgather", "reducescatter", "broadcast"] {
        for bytes in [4096, 65536] {
            let row = rows
                .iter()
                .find(|r| r["collective"] == name && r["bytes"] == bytes)
                .unwrap_or_else(|| panic!("no {name} of {bytes} bytes in {text}"));
            for field in [
                "p50_s",
                "busbw_gbs",
                "mpi_p50_s",
                "busbw_ratio",
                "p50_ratio",
            ] {
                let v = row[field].as_f64().unwrap_or(-1.0);
                assert!(v.is_finite() && v > 0.0, "{name} {bytes}: {field} = {v}");
            }
        }
    }
}

/// `--explain` prints the plan with the path each size takes: shared memory over `ipc`, the
/// mesh over `tcp` up to its limit, the vans beyond.
#[test]
fn explain_shows_the_algorithm_and_the_path_of_each_size() {
    let out = Command::new(BENCH)
        .args([
            "--explain",
            "--van",
            "tcp,ipc",
            "--ranks",
            "2,4",
            "--sizes",
            "4K,256K,64M",
        ])
        .env_remove("VANS_COLLECTIVE_ALGO")
        .env_remove("VANS_COLLECTIVE_MESH")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = |size: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("| {size}")))
            .unwrap_or_else(|| panic!("no {size} row in {text}"))
            .to_owned()
    };
    let small = row("4 KiB");
    assert!(
        small.contains("direct (mesh)") && small.contains("doubling (mesh)"),
        "{small}"
    );
    // Medium sizes on 4 ranks: Rabenseifner's.
    assert!(row("256 KiB").contains("rabenseifner (mesh)"), "{text}");
    let large = row("64 MiB");
    assert!(large.contains("ring (mesh)"), "{large}");
    if cfg!(feature = "ipc") {
        assert!(small.contains("shm") && large.contains("shm"), "{text}");
        // Two hosts of two ranks: hierarchical, each share between the hosts by messages.
        let hosts = Command::new(BENCH)
            .args(["--explain", "--van", "ipc", "--ranks", "4", "--sizes", "4K"])
            .args(["--hosts", "2"])
            .env_remove("VANS_COLLECTIVE_ALGO")
            .env_remove("VANS_COLLECTIVE_MESH")
            .output()
            .unwrap();
        let hosts = String::from_utf8_lossy(&hosts.stdout);
        assert!(hosts.contains("hier: direct (mesh)"), "{hosts}");
    }
    let off = Command::new(BENCH)
        .args(["--explain", "--van", "tcp", "--ranks", "2", "--sizes", "4K"])
        .env("VANS_COLLECTIVE_MESH", "0")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&off.stdout).contains("direct (vans)"));
}
