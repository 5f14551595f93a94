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
//! are exact; and a link taken down mid-run surfaces a named error on both sides.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::text;

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");

/// The namespaces of one test: a switch (a bridge) and three hosts.
struct Hosts {
    switch: String,
    hosts: Vec<String>,
    /// Each host's address on the private subnet.
    addrs: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), text(&out)))
    }
}

impl Hosts {
    /// Creates the namespaces; `None` (the test says it skipped) only without root. As root,
    /// a namespace or link that cannot be made fails the test: a machine that should run the
    /// suite must not pass it by skipping.
    fn create(tag: &str) -> Option<Hosts> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: network namespaces need root");
            return None;
        }
        let id = std::process::id() % 100_000;
        let subnet = format!("10.213.{}", id % 250);
        let switch = format!("vans{id}{tag}sw");
        let mut made = Hosts {
            switch: switch.clone(),
            hosts: Vec::new(),
            addrs: Vec::new(),
        };
        // On failure the panic drops `made`, which deletes what was made.
        if let Err(e) = made.build(&subnet, id, tag) {
            panic!("running as root, yet the test's network namespaces could not be made: {e}");
        }
        Some(made)
    }

    /// Makes the switch and the three hosts, recording each as it is made.
    fn build(&mut self, subnet: &str, id: u32, tag: &str) -> Result<(), String> {
        let switch = self.switch.clone();
        ip(&["netns", "add", &switch])?;
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", "br0", "up"])?;
        for i in 0..3 {
            let host = format!("vans{id}{tag}h{i}");
            ip(&["netns", "add", &host])?;
            self.hosts.push(host.clone());
            // A decoy made first (so it is the host's first interface after lo): a veth pair
            // within the host, `eth1` on another subnet that no other host reaches. A node that
            // took the first interface instead of `DMLC_INTERFACE` or the route to the
            // scheduler would announce an address nobody can dial.
            ip(&[
                "-n", &host, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1p",
            ])?;
            let decoy = format!("10.214.{}.{}/24", id % 250, i + 1);
            ip(&["-n", &host, "addr", "add", &decoy, "dev", "eth1"])?;
            ip(&["-n", &host, "link", "set", "eth1", "up"])?;
            ip(&["-n", &host, "link", "set", "eth1p", "up"])?;
            // One end in the switch (on the bridge), the other the host's eth0.
            let port = format!("vp{id}{tag}{i}");
            ip(&[
                "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &host,
            ])?;
            ip(&["link", "set", &port, "netns", &switch])?;
            ip(&["-n", &switch, "link", "set", &port, "master", "br0", "up"])?;
            let addr = format!("{subnet}.{}", i + 1);
            ip(&[
                "-n",
                &host,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &host, "link", "set", "eth0", "up"])?;
            ip(&["-n", &host, "link", "set", "lo", "up"])?;
            self.addrs.push(addr);
        }
        Ok(())
    }

    /// `ps-bench` as `role` on host `host`, with the scheduler on host 0.
    fn node(&self, host: usize, role: &str, env: &[(&str, &str)], args: &[&str]) -> Child {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.hosts[host], PS_BENCH])
            .args(args)
            .env("DMLC_ROLE", role)
            .env("DMLC_NUM_SERVER", "2")
            .env("DMLC_NUM_WORKER", "3")
            .env("DMLC_PS_ROOT_URI", &self.addrs[0])
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
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in self.hosts.iter().chain([&self.switch]) {
            let _ = ip(&["netns", "del", ns]);
        }
    }
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
    children
        .into_iter()
        .map(|(host, role, child)| (host, role, common::wait_output(child, role)))
        .collect()
}

#[test]
fn tcp_between_hosts_shared_memory_within_one_and_exact_sums() {
    let Some(hosts) = Hosts::create("a") else {
        return;
    };
    let args = ["--mode", "check", "--keys", "32"];
    let children = LAYOUT
        .iter()
        .map(|&(host, role)| (host, role, hosts.node(host, role, &[], &args)))
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
    let Some(hosts) = Hosts::create("r") else {
        return;
    };
    let args = ["--mode", "check", "--keys", "8"];
    let unset = [("DMLC_INTERFACE", ""), ("PS_VERBOSE", "1")];
    let children = LAYOUT
        .iter()
        .map(|&(host, role)| (host, role, hosts.node(host, role, &unset, &args)))
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
    let Some(hosts) = Hosts::create("b") else {
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
        .map(|&(host, role)| (host, role, hosts.node(host, role, &env, &args)))
        .collect();
    std::thread::sleep(Duration::from_secs(6));
    let down = Instant::now();
    ip(&["-n", &hosts.hosts[2], "link", "set", "eth0", "down"]).unwrap();
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
    assert!(
        host0.contains("declaring nodes dead") && host0.contains(&format!("{w1}")),
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
