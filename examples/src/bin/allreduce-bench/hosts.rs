//! `--hosts N`: the ranks spread over `N` hosts made of network namespaces
//! ([`examples::netns`]), vans and Open MPI with the same placement (ranks `0..n/N` on the
//! first host, and so on), each host's ranks sharing its memory and the hosts joined by TCP
//! through a bridge.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use examples::netns::Hosts;
use examples::raw::BoxError;

use crate::options::Options;
use crate::{mpi, Row, OUT_ENV};

/// Longest a cluster of one van and rank count may take.
const LONGEST: Duration = Duration::from_secs(1800);

/// The host of rank `rank` among `n` ranks on `hosts.len()` hosts.
fn host_of(rank: usize, n: usize, hosts: usize) -> usize {
    rank * hosts / n
}

/// Checks that every rank count spreads evenly over `hosts` hosts (each with at least one).
pub(crate) fn check(ranks: &[usize], hosts: usize) -> Result<(), BoxError> {
    match ranks.iter().find(|&&n| n % hosts != 0) {
        Some(n) => Err(format!("--ranks {n} does not spread evenly over --hosts {hosts}").into()),
        None => Ok(()),
    }
}

/// One cluster of `n` ranks over `van` on `hosts` (the scheduler and the idle server on the
/// first); rank 0's rows. `port` is the scheduler's (each cluster of a run takes its own, so
/// no socket of the last one is in the way).
pub(crate) fn run_vans(
    o: &Options,
    hosts: &Hosts,
    n: usize,
    van: &str,
    port: u16,
) -> Result<Vec<Row>, BoxError> {
    let out = std::env::temp_dir().join(format!(
        "allreduce-bench-{}-{van}-{n}-hosts.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&out);
    let exe = std::env::current_exe()?;
    let mut nodes: Vec<(String, usize, Child)> = Vec::new();
    let roles = [("scheduler", 0, None), ("server", 0, Some(0))]
        .into_iter()
        .chain((0..n).map(|w| ("worker", host_of(w, n, hosts.names.len()), Some(w))));
    for (role, host, rank) in roles {
        let child = spawn(o, hosts, &exe, &out, (role, host, rank), (n, van, port));
        match child {
            Ok(child) => nodes.push((format!("{role} on host {host}"), host, child)),
            Err(e) => {
                stop(&mut nodes);
                return Err(format!("cannot start the {role} on host {host}: {e}").into());
            }
        }
    }
    wait(&mut nodes)?;
    let text = std::fs::read_to_string(&out)
        .map_err(|e| format!("rank 0 left no results in {out:?}: {e}"))?;
    let _ = std::fs::remove_file(&out);
    mpi::parse_rows(&text, van)
}

/// Starts one node: `role` on `host` (servers and workers asking for `rank`).
fn spawn(
    o: &Options,
    hosts: &Hosts,
    exe: &Path,
    out: &Path,
    (role, host, rank): (&str, usize, Option<usize>),
    (n, van, port): (usize, &str, u16),
) -> std::io::Result<Child> {
    let sizes: Vec<String> = o.sizes.iter().map(usize::to_string).collect();
    let mut cmd = hosts.command(host, exe);
    cmd.args(["--threads", &o.threads.to_string(), "node", "bench"])
        .args(["--sizes", &sizes.join(",")])
        .args(["--collectives", &o.collectives.join(",")])
        .args(["--iters", &o.iters.to_string()])
        .args(o.alloc.then_some("--alloc"))
        .envs(o.alloc.then(|| crate::arena_for(o)))
        .env("DMLC_ROLE", role)
        .env("DMLC_NUM_SERVER", "1")
        .env("DMLC_NUM_WORKER", n.to_string())
        .env("DMLC_PS_ROOT_URI", &hosts.addrs[0])
        .env("DMLC_PS_ROOT_PORT", port.to_string())
        .env("DMLC_INTERFACE", "eth0")
        .env("DMLC_ENABLE_RDMA", "0")
        .env(OUT_ENV, out)
        .env_remove("VANS_HOST_ID")
        // Named shared memory would leave the namespace out of the host identity.
        .env_remove("VANS_IPC_NAMED")
        .env_remove("DMLC_NODE_HOST")
        .stdout(Stdio::null());
    match rank {
        Some(rank) => cmd.env("VANS_RANK", rank.to_string()),
        None => cmd.env_remove("VANS_RANK"),
    };
    if van != "ipc" {
        cmd.env("VANS_STREAM_VAN", van).env("DMLC_ENABLE_IPC", "0");
    }
    cmd.spawn()
}

/// Waits for every node; the first that fails (or the deadline) stops the rest.
fn wait(nodes: &mut Vec<(String, usize, Child)>) -> Result<(), BoxError> {
    let deadline = Instant::now() + LONGEST;
    while !nodes.is_empty() {
        let mut i = 0;
        while i < nodes.len() {
            match nodes[i].2.try_wait() {
                Ok(Some(status)) if status.success() => {
                    nodes.remove(i);
                }
                Ok(Some(status)) => {
                    let who = nodes.remove(i).0;
                    stop(nodes);
                    return Err(format!("the {who} failed ({status})").into());
                }
                Ok(None) => i += 1,
                Err(e) => {
                    let who = nodes.remove(i).0;
                    stop(nodes);
                    return Err(format!("cannot wait for the {who}: {e}").into());
                }
            }
        }
        if Instant::now() > deadline {
            stop(nodes);
            return Err(format!("the cluster did not finish within {LONGEST:?}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Kills and reaps what is left.
fn stop(nodes: &mut Vec<(String, usize, Child)>) {
    for (_, _, child) in nodes.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
    nodes.clear();
}
