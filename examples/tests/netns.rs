//! Three "hosts" as network namespaces that the test creates, joined by veth pairs to a
//! bridge on a private subnet that exists only inside them; nodes run inside the namespaces
//! (`ip netns exec`), so every address they use is one of the test's own. Needs root and
//! `ip`; without root each test says it skipped and passes (as root, a namespace that
//! cannot be made fails it).
//!
//! What they show: TCP is chosen between hosts and shared memory only within one (the host
//! identity includes the network namespace), `DMLC_INTERFACE` picks the veth (and without it
//! the address that routes to the scheduler is announced), even with a decoy interface on
//! another subnet before it; nodes without a secret on a non-loopback address warn; the sums
//! are exact; a link taken down mid-run surfaces a named error on both sides; and the
//! collectives' all-reduce goes hierarchically across hosts of two ranks each (shared memory
//! on each host, TCP between), gives every rank the same bits, and survives a rank killed
//! with `kill -9` and its replacement. With the network itself cut (nftables, both ways:
//! silence, no reset): a host of two ranks cut off mid-all-reduce is fenced (its ranks stop
//! saying they were removed) while the others go on and later admit new processes on it;
//! and a rendezvous receive waiting on a cut-off task fails naming the step, key and peer.
//! Under 5 % loss on a host's link, every collective, over the mesh and over the vans, is
//! exact and its rounded sums have the same bits as without loss.
//! (`network_faults.rs` puts the parameter server under loss and partitions.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use common::text;
use examples::netns::{Fault, Hosts};

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");
const ALLREDUCE_BENCH: &str = env!("CARGO_BIN_EXE_allreduce-bench");

/// The test's three hosts; `None` (the test says it skipped) only without root. As root, a
/// namespace or link that cannot be made fails the test: a machine that should run the
/// suite must not pass it by skipping.
fn hosts(tag: &str) -> Option<Hosts> {
    if !examples::netns::is_root() {
        eprintln!("skipped: network namespaces need root");
        return None;
    }
    match Hosts::create(tag, 3, true) {
        Ok(hosts) => Some(hosts),
        Err(e) => {
            panic!("running as root, yet the test's network namespaces could not be made: {e}")
        }
    }
}

/// `ps-bench` as `role` on host `host` of `hosts`, with the scheduler on host 0.
fn node(hosts: &Hosts, host: usize, role: &str, env: &[(&str, &str)], args: &[&str]) -> Child {
    let mut cmd = hosts.command(host, PS_BENCH);
    cmd.args(args)
        .env("DMLC_ROLE", role)
        .env("DMLC_NUM_SERVER", "2")
        .env("DMLC_NUM_WORKER", "3")
        .env("DMLC_PS_ROOT_URI", &hosts.addrs[0])
        .env("DMLC_PS_ROOT_PORT", "9100")
        .env("DMLC_INTERFACE", "eth0")
        .env("DMLC_ENABLE_RDMA", "0")
        .env_remove("VANS_HOST_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        // An empty value unsets the variable.
        if v.is_empty() {
            cmd.env_remove(k);
        } else {
            cmd.env(k, v);
        }
    }
    cmd.spawn().unwrap()
}

/// The cluster's layout: host 0 the scheduler and server 0, host 1 server 1 and a worker,
/// host 2 two workers.
const LAYOUT: [(usize, &str); 6] = [
    (0, "scheduler"),
    (0, "server"),
    (1, "server"),
    (1, "worker"),
    (2, "worker"),
    (2, "worker"),
];

fn wait_all(children: Vec<(usize, &'static str, Child)>) -> Vec<(usize, &'static str, Output)> {
    // Side by side, so that when one hangs every output shows why (a node that waits is
    // often waiting for another that failed).
    let waits: Vec<_> = children
        .into_iter()
        .map(|(host, role, child)| {
            let wait = std::thread::spawn(move || common::wait_or_kill(child, common::DEADLINE));
            (host, role, wait)
        })
        .collect();
    let outputs: Vec<_> = waits
        .into_iter()
        .map(|(host, role, wait)| (host, role, wait.join().unwrap()))
        .collect();
    let late: Vec<String> = outputs
        .iter()
        .filter(|(_, _, (_, late))| *late)
        .map(|(host, role, _)| format!("{role} on host {host}"))
        .collect();
    if !late.is_empty() {
        let all: Vec<String> = outputs
            .iter()
            .map(|(host, role, (out, _))| format!("---- {role} on host {host}\n{}", text(out)))
            .collect();
        panic!(
            "{} still running after {:?}, killed:\n{}",
            late.join(", "),
            common::DEADLINE,
            all.join("\n")
        );
    }
    outputs
        .into_iter()
        .map(|(host, role, (out, _))| (host, role, out))
        .collect()
}

#[test]
fn tcp_between_hosts_shared_memory_within_one_and_exact_sums() {
    let Some(hosts) = hosts("a") else {
        return;
    };
    let args = ["--mode", "check", "--keys", "32"];
    let children = LAYOUT
        .iter()
        .map(|&(host, role)| (host, role, node(&hosts, host, role, &[], &args)))
        .collect();
    let outputs = wait_all(children);
    let mut routes = Vec::new();
    for (host, role, out) in &outputs {
        let all = text(out);
        assert!(out.status.success(), "{role} on host {host}: {all}");
        // No secret and a non-loopback address: every node says anyone could join.
        assert!(
            all.contains("no cluster secret is set"),
            "{role} on host {host} did not warn: {all}"
        );
        if *role == "worker" {
            assert!(
                all.contains("exact sums verified for 32 keys from 3 workers"),
                "{all}"
            );
            for line in all.lines().filter(|l| l.contains(" via ")) {
                routes.push((*host, line.rsplit("] ").next().unwrap_or(line).to_owned()));
            }
        }
    }
    // Servers get ids by address: host 0's is 8, host 1's is 10. The worker on host 1 shares
    // its host with server 10 only; host 2 shares with no server.
    assert_eq!(routes.len(), 6, "{routes:?}");
    for (host, line) in &routes {
        let same_host = *host == 1 && line.contains("server 10 ");
        let want = if same_host && cfg!(feature = "ipc") {
            "via ipc"
        } else {
            "via tcp"
        };
        assert!(
            line.ends_with(want),
            "host {host}: {line} (expected {want})"
        );
    }
}

#[test]
fn without_dmlc_interface_nodes_announce_the_address_that_routes_to_the_scheduler() {
    // ps-lite's own tracker (tracker/dmlc_local.py) sets DMLC_PS_ROOT_URI to the host's
    // address and no DMLC_INTERFACE; ps-lite then picks the interface itself.
    let Some(hosts) = hosts("r") else {
        return;
    };
    let args = ["--mode", "check", "--keys", "8"];
    let unset = [("DMLC_INTERFACE", ""), ("PS_VERBOSE", "1")];
    let children = LAYOUT
        .iter()
        .map(|&(host, role)| (host, role, node(&hosts, host, role, &unset, &args)))
        .collect();
    for (host, role, out) in wait_all(children) {
        let all = text(&out);
        assert!(out.status.success(), "{role} on host {host}: {all}");
        if role == "scheduler" {
            continue;
        }
        let announced = format!(
            "DMLC_INTERFACE is unset: announcing {} (eth0)",
            hosts.addrs[host]
        );
        assert!(all.contains(&announced), "{role} on host {host}: {all}");
        if role == "worker" {
            assert!(
                all.contains("exact sums verified for 8 keys from 3 workers"),
                "{all}"
            );
        }
    }
}

#[test]
fn a_link_taken_down_mid_run_is_a_named_error_on_both_sides() {
    let Some(hosts) = hosts("b") else {
        return;
    };
    let env = [
        ("PS_HEARTBEAT_INTERVAL", "1"),
        ("PS_HEARTBEAT_TIMEOUT", "4"),
    ];
    let args = [
        "--mode",
        "push",
        "--sizes",
        "1024",
        "--windows",
        "4",
        "--seconds",
        "20",
        "--no-raw",
    ];
    let children: Vec<_> = LAYOUT
        .iter()
        .map(|&(host, role)| (host, role, node(&hosts, host, role, &env, &args)))
        .collect();
    std::thread::sleep(Duration::from_secs(6));
    let down = Instant::now();
    examples::netns::ip(&["-n", &hosts.names[2], "link", "set", "eth0", "down"]).unwrap();
    let outputs = wait_all(children);
    assert!(
        down.elapsed() < Duration::from_secs(100),
        "took {:?}",
        down.elapsed()
    );
    let all_of = |host: usize| -> String {
        outputs
            .iter()
            .filter(|(h, ..)| *h == host)
            .map(|(.., out)| text(out))
            .collect()
    };
    // Cut off: host 2's workers lose the scheduler, by name.
    for (host, role, out) in &outputs {
        if *host == 2 {
            assert!(
                !out.status.success(),
                "{role} on host 2 exited 0: {}",
                text(out)
            );
        }
    }
    assert!(
        all_of(2).contains("(scheduler) failed"),
        "host 2 did not name the lost scheduler: {}",
        all_of(2)
    );
    // The other side: the scheduler declares host 2's workers dead, and the worker left on
    // host 1 fails naming them.
    let (w1, w2) = (11, 13);
    let host0 = all_of(0);
    // It may exit (its barrier failed) after declaring the first of them: either will do.
    assert!(
        host0.contains("declaring nodes dead")
            && [w1, w2].iter().any(|w| host0.contains(&format!("{w}"))),
        "the scheduler did not declare host 2's workers dead: {host0}"
    );
    // Either or both, depending on which the scheduler had declared when host 1's barrier
    // failed ("nodes [11] are dead", "[11, 13]", a "node 13 ... failed" error).
    let host1 = all_of(1);
    let named = [w1, w2].iter().any(|w| {
        [format!("[{w}"), format!(", {w}]"), format!("node {w}")]
            .iter()
            .any(|t| host1.contains(t.as_str()))
    });
    assert!(named, "host 1 did not name the dead workers: {host1}");
}

const EXCHANGE: &str = env!("CARGO_BIN_EXE_rendezvous-exchange");

/// A rendezvous task (server 8, worker 9) of `--mode hang` on host `host`, the scheduler on
/// host 0 at `port`, with heartbeats every second and a 3 s timeout.
fn exchange_node(
    hosts: &Hosts,
    (host, role, port): (usize, &str, u16),
    protocol: &str,
) -> common::Watched {
    let mut cmd = hosts.command(host, EXCHANGE);
    cmd.args(["--mode", "hang", "--protocols", protocol])
        .env("DMLC_ROLE", role)
        .env("DMLC_NUM_SERVER", "1")
        .env("DMLC_NUM_WORKER", "1")
        .env("DMLC_PS_ROOT_URI", &hosts.addrs[0])
        .env("DMLC_PS_ROOT_PORT", port.to_string())
        .env("DMLC_INTERFACE", "eth0")
        .env("DMLC_ENABLE_RDMA", "0")
        .env("PS_HEARTBEAT_INTERVAL", "1")
        .env("PS_HEARTBEAT_TIMEOUT", "3")
        .env_remove("VANS_HOST_ID");
    common::Watched::spawn(cmd)
}

/// A rendezvous task cut off from the network (both ways: silence, no reset ever comes)
/// while another task's receive waits on it, in pull and push mode: the receive fails
/// naming the step, the key and the peer within the heartbeat timeout and a tick, and the
/// cut-off task ends, saying it was removed from the cluster.
#[test]
fn a_task_cut_off_fails_a_receive_waiting_on_it_naming_the_peer() {
    let Some(hosts) = hosts("v") else {
        return;
    };
    for (port, protocol) in [(9400, "pull"), (9401, "push")] {
        let scheduler = exchange_node(&hosts, (0, "scheduler", port), protocol);
        let mut server = exchange_node(&hosts, (0, "server", port), protocol);
        let mut worker = exchange_node(&hosts, (2, "worker", port), protocol);
        server.wait_for_line(&format!("hang {protocol}: node 8 waits for"), "the server");
        worker.wait_for_line("hang: node 9 is ready to be killed", "the worker");
        let cut = hosts.inject(2, Fault::Partition).unwrap();
        let at = Instant::now();
        let (status, out) = server.wait(Duration::from_secs(60), "the server");
        let elapsed = at.elapsed();
        let (worker_status, worker_out) = worker.wait(Duration::from_secs(30), "the worker");
        cut.heal().unwrap();
        scheduler.kill();
        assert_eq!(status.code(), Some(3), "{protocol}: {out}");
        for part in ["step 7, key `", "never-sent", "peer node 9 (worker)"] {
            assert!(out.contains(part), "{protocol}: no `{part}` in:\n{out}");
        }
        assert!(
            elapsed < Duration::from_secs(10),
            "{protocol}: the receive took {elapsed:?} to fail (timeout 3 s):\n{out}"
        );
        eprintln!("{protocol}: the receive failed {elapsed:.1?} after the cut (timeout 3 s)");
        assert!(!worker_status.success(), "{protocol}: {worker_out}");
        assert!(
            worker_out.contains("removed from the cluster"),
            "{protocol}: the cut-off task did not say it was removed:\n{worker_out}"
        );
    }
}

/// `allreduce-bench node ARGS` as `role` on host `host` (the scheduler on host 0), among
/// `workers` workers; a worker asks for rank `rank`. Collectives log at info level, the rest
/// at warn.
#[cfg(feature = "ipc")]
fn collective_node(
    hosts: &Hosts,
    who: (usize, &str, Option<usize>),
    workers: usize,
    env: &[(&str, &str)],
    args: &[&str],
) -> Child {
    collective_node_under(hosts, &[], who, workers, env, args)
}

/// [`collective_node`] run under the command `wrap` (empty: none).
#[cfg(feature = "ipc")]
fn collective_node_under(
    hosts: &Hosts,
    wrap: &[&str],
    (host, role, rank): (usize, &str, Option<usize>),
    workers: usize,
    env: &[(&str, &str)],
    args: &[&str],
) -> Child {
    let mut cmd = match wrap.split_first() {
        Some((program, rest)) => {
            let mut cmd = hosts.command(host, program);
            cmd.args(rest).arg(ALLREDUCE_BENCH);
            cmd
        }
        None => hosts.command(host, ALLREDUCE_BENCH),
    };
    cmd.args(["--threads", "2", "node"])
        .args(args)
        .env("DMLC_ROLE", role)
        .env("DMLC_NUM_SERVER", "1")
        .env("DMLC_NUM_WORKER", workers.to_string())
        .env("DMLC_PS_ROOT_URI", &hosts.addrs[0])
        .env("DMLC_PS_ROOT_PORT", "9300")
        .env("DMLC_INTERFACE", "eth0")
        .env("DMLC_ENABLE_RDMA", "0")
        .env("RUST_LOG", "warn,collective=info")
        .env_remove("VANS_HOST_ID")
        .env_remove("VANS_IPC_NAMED")
        .env_remove("VANS_STREAM_VAN")
        .env_remove("DMLC_ENABLE_IPC")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match rank {
        Some(rank) => cmd.env("VANS_RANK", rank.to_string()),
        None => cmd.env_remove("VANS_RANK"),
    };
    cmd.spawn().unwrap()
}

/// The nodes of a collective cluster of `count` hosts with two workers each: the scheduler
/// and the server on host 0, ranks `2h` and `2h + 1` on host `h`.
#[cfg(feature = "ipc")]
fn two_per_host(
    hosts: &Hosts,
    count: usize,
    env: &[(&str, &str)],
    args: &[&str],
) -> Vec<(usize, &'static str, Child)> {
    let workers = 2 * count;
    let mut nodes = vec![
        (
            0,
            "scheduler",
            collective_node(hosts, (0, "scheduler", None), workers, env, args),
        ),
        (
            0,
            "server",
            collective_node(hosts, (0, "server", Some(0)), workers, env, args),
        ),
    ];
    for rank in 0..workers {
        let node = collective_node(hosts, (rank / 2, "worker", Some(rank)), workers, env, args);
        nodes.push((rank / 2, "worker", node));
    }
    nodes
}

/// Every collective on 2 hosts × 2 ranks and 3 × 2, the all-reduce forced to go
/// hierarchically (`VANS_COLLECTIVE_ALGO=hier` fails when it cannot): exact integer sums,
/// and an f32 sum whose bits every rank compares with every other's.
#[cfg(feature = "ipc")]
#[test]
fn the_all_reduce_goes_hierarchically_across_hosts_with_the_same_bits_on_every_rank() {
    let Some(hosts) = hosts("c") else {
        return;
    };
    for count in [2, 3] {
        let env = [("VANS_COLLECTIVE_ALGO", "hier")];
        let outputs = wait_all(two_per_host(&hosts, count, &env, &["check"]));
        let workers = 2 * count;
        for (host, role, out) in &outputs {
            let all = text(out);
            assert!(
                out.status.success(),
                "{count} hosts: {role} on host {host}: {all}"
            );
            if *role != "worker" {
                continue;
            }
            assert!(
                all.contains("collective check ok: rank") && all.contains(&format!("of {workers}")),
                "{count} hosts: worker on host {host}: {all}"
            );
            let hierarchical = format!("go hierarchically: {count} hosts of 2 ranks");
            assert!(
                all.contains(&hierarchical),
                "{count} hosts: worker on host {host}: {all}"
            );
        }
    }
}

/// The f32 sum digest every worker of a `check` run printed, after asserting that every
/// node exited 0 and every worker checked its collectives; `what` names the run. One digest:
/// the check fails when ranks hold different bits.
#[cfg(feature = "ipc")]
fn checked_bits(what: &str, outputs: &[(usize, &'static str, Output)]) -> String {
    let mut digests = Vec::new();
    for (host, role, out) in outputs {
        let all = text(out);
        assert!(out.status.success(), "{what}: {role} on host {host}: {all}");
        if *role != "worker" {
            continue;
        }
        assert!(
            all.contains("collective check ok: rank"),
            "{what}: worker on host {host}: {all}"
        );
        let digest = all
            .lines()
            .find_map(|l| l.strip_prefix("collective check f32 sum bits: "))
            .unwrap_or_else(|| panic!("{what}: worker on host {host} printed no bits: {all}"));
        digests.push(digest.trim().to_owned());
    }
    digests.dedup();
    assert_eq!(digests.len(), 1, "{what}: workers hold different bits");
    digests.remove(0)
}

/// Every collective on 2 hosts × 2 ranks with host 1's link losing 5 % of its packets each
/// way (nftables), over the mesh and over the vans: every result exact, and the rounded
/// f32 sum the same bits as the same run's without loss. (TCP repairs the loss; what this
/// shows is that nothing above it reorders, drops or repeats a slice when it does.)
#[cfg(feature = "ipc")]
#[test]
fn collectives_under_loss_give_the_same_bits_as_without_over_the_mesh_and_the_vans() {
    let Some(hosts) = hosts("l") else {
        return;
    };
    for mesh in ["1", "0"] {
        let env = [("VANS_COLLECTIVE_MESH", mesh)];
        let clean = wait_all(two_per_host(&hosts, 2, &env, &["check"]));
        let want = checked_bits(&format!("mesh {mesh}, no loss"), &clean);
        let loss = hosts.inject(1, Fault::Loss { per_mille: 50 }).unwrap();
        let lossy = wait_all(two_per_host(&hosts, 2, &env, &["check"]));
        let dropped = loss.dropped().unwrap();
        loss.heal().unwrap();
        let what = format!("mesh {mesh}, 5 % loss");
        // Tens of MiB crossed the link, in ~1,600 packets (the veth takes 64 KiB segments):
        // a loss that met little of it would show nothing.
        assert!(dropped >= 20, "{what}: only {dropped} packets dropped");
        eprintln!("{what}: {dropped} packets dropped, the same bits");
        assert_eq!(checked_bits(&what, &lossy), want, "{what}: other bits");
        for (host, role, out) in clean.iter().chain(&lossy) {
            let over_mesh = text(out).contains("go over a TCP mesh");
            if *role == "worker" {
                assert_eq!(over_mesh, mesh == "1", "{what}: worker on host {host}");
            }
        }
    }
}

/// The four workers of an elastic run, (host, output) in start order: each must have exited
/// 0 after all of its steps.
#[cfg(feature = "ipc")]
fn elastic_workers(outputs: Vec<(usize, &'static str, Output)>) -> Vec<(usize, String)> {
    let workers: Vec<(usize, String)> = outputs
        .iter()
        .filter(|(_, role, _)| *role == "worker")
        .map(|(host, _, out)| {
            assert!(out.status.success(), "worker on host {host}: {}", text(out));
            (*host, text(out))
        })
        .collect();
    assert_eq!(workers.len(), 4);
    for (host, all) in &workers {
        assert!(
            all.contains("elastic ok: 600 steps"),
            "worker on host {host}: {all}"
        );
    }
    workers
}

/// Each survivor of an elastic run saw a rank's failure named, and went hierarchically
/// across both hosts again once new processes were in (a group formed in the first
/// generation and again in a later one). Under load a worker may join late, so the failed
/// generation need not be number 1.
#[cfg(feature = "ipc")]
fn survivors_saw_a_failure_and_regrouped(survivors: &[(usize, String)]) {
    for (host, all) in survivors {
        assert!(
            all.lines()
                .any(|l| l.contains(") of generation ") && l.contains(" failed")),
            "a survivor on host {host} did not see the failure named: {all}"
        );
        let formed = all.matches("go hierarchically: 2 hosts of 2 ranks").count();
        assert!(
            formed >= 2,
            "a survivor on host {host} went hierarchically {formed} times: {all}"
        );
    }
}

/// An elastic loop of all-reduces on 2 hosts × 2 ranks (hierarchical), where a rank is
/// killed with `kill -9`: the others fail naming it and go on in a generation of 3 (hosts
/// of 2 and 1: by messages), then admit its replacement and go hierarchically again.
#[cfg(feature = "ipc")]
#[test]
fn a_rank_killed_mid_hierarchical_all_reduce_is_named_and_replaced() {
    let Some(hosts) = hosts("d") else {
        return;
    };
    let args = common::ELASTIC_ARGS;
    let mut nodes = two_per_host(&hosts, 2, &[], &args);
    std::thread::sleep(Duration::from_secs(4));
    // Rank 1, on host 0.
    let (_, _, victim) = nodes.remove(3);
    common::signal(victim.id(), "KILL");
    let killed = common::wait_output(victim, "the killed worker");
    assert!(!killed.status.success());
    std::thread::sleep(Duration::from_secs(4));
    let replacement = collective_node(&hosts, (0, "worker", Some(1)), 4, &[], &args);
    nodes.push((0, "worker", replacement));
    let workers = elastic_workers(wait_all(nodes));
    // The survivors (the first three): the failure named, then hierarchical again once the
    // replacement is in (a group formed in the first generation and again in a later one).
    survivors_saw_a_failure_and_regrouped(&workers[..3]);
}

/// The elastic loop of [`a_rank_killed_mid_hierarchical_all_reduce_is_named_and_replaced`],
/// but host 1 (ranks 2 and 3) is cut off from the network (both ways, nftables) for longer
/// than the heartbeat timeout: its ranks stop, saying they were removed from the cluster
/// (no rank waits for ever on a half-open connection), the ranks on host 0 fail naming a
/// rank of host 1 and go on between themselves, and once the cut heals, new processes on
/// host 1 are admitted and the all-reduce goes across both hosts again.
#[cfg(feature = "ipc")]
#[test]
fn a_host_cut_off_mid_all_reduce_is_fenced_and_its_ranks_readmitted() {
    let Some(hosts) = hosts("p") else {
        return;
    };
    let args = common::ELASTIC_ARGS;
    let env = [
        ("PS_HEARTBEAT_INTERVAL", "1"),
        ("PS_HEARTBEAT_TIMEOUT", "4"),
    ];
    let mut nodes = two_per_host(&hosts, 2, &env, &args);
    std::thread::sleep(Duration::from_secs(4));
    let cut = hosts.inject(1, Fault::Partition).unwrap();
    let at = Instant::now();
    // Ranks 2 and 3, the last two nodes, are on host 1.
    let cut_off: Vec<Output> = (0..2)
        .map(|_| {
            let (host, _, child) = nodes.pop().unwrap();
            assert_eq!(host, 1);
            common::wait_output_within(child, "a cut-off rank", Duration::from_secs(30))
        })
        .collect();
    let stopped = at.elapsed();
    let both: String = cut_off
        .iter()
        .map(text)
        .collect::<Vec<_>>()
        .join("\n----\n");
    for out in &cut_off {
        assert!(!out.status.success(), "a cut-off rank exited 0: {both}");
        assert!(
            text(out).contains("removed from the cluster"),
            "a cut-off rank did not say it was removed: {both}"
        );
    }
    assert!(
        stopped < Duration::from_secs(10),
        "the cut-off ranks took {stopped:?} to stop (timeout 4 s)"
    );
    eprintln!("the cut-off ranks stopped {stopped:.1?} after the cut (timeout 4 s)");
    cut.heal().unwrap();
    for rank in [2, 3] {
        let node = collective_node(&hosts, (1, "worker", Some(rank)), 4, &env, &args);
        nodes.push((1, "worker", node));
    }
    let workers = elastic_workers(wait_all(nodes));
    survivors_saw_a_failure_and_regrouped(&workers[..2]);
}

/// A host whose two ranks cannot share memory (one runs in a pid namespace of its own, so
/// cannot open the other's segment through `/proc`), beside a host whose ranks can: the hosts
/// vote, and every rank goes by messages (had one host gone through its group and the other
/// by messages, every all-reduce would wait out the timeout).
#[cfg(feature = "ipc")]
#[test]
fn a_host_that_cannot_share_memory_sends_every_host_by_messages() {
    let Some(hosts) = hosts("e") else {
        return;
    };
    let env = [
        ("RUST_LOG", "collective=debug"),
        ("VANS_COLLECTIVE_TIMEOUT", "30"),
    ];
    let node = |who, wrap: &[&str]| collective_node_under(&hosts, wrap, who, 4, &env, &["check"]);
    let isolated = ["unshare", "--pid", "--fork"];
    let nodes = vec![
        (0, "scheduler", node((0, "scheduler", None), &[])),
        (0, "server", node((0, "server", Some(0)), &[])),
        (0, "worker", node((0, "worker", Some(0)), &[])),
        (0, "worker", node((0, "worker", Some(1)), &[])),
        (1, "worker", node((1, "worker", Some(2)), &[])),
        (1, "worker", node((1, "worker", Some(3)), &isolated)),
    ];
    let outputs = wait_all(nodes);
    // Every node exited 0, every worker checked its collectives, all with the same bits.
    checked_bits("by messages", &outputs);
    for (host, role, out) in &outputs {
        if *role != "worker" {
            continue;
        }
        let all = text(out);
        assert!(
            !all.contains("go hierarchically"),
            "worker on host {host}: {all}"
        );
        let why = match host {
            0 => "the ranks of another host could not share their memory",
            _ => "are in different pid namespaces",
        };
        assert!(
            all.contains(why),
            "worker on host {host} did not say why: {all}"
        );
    }
}
