//! `DMLC_ENABLE_RDMA` end to end, with real processes: on a machine without RDMA (this
//! repository's CI host) asking for RDMA is an error at start naming the cause, and the TCP
//! fallback works only when allowed; inside the Soft-RoCE guest (`scripts/rdma-vm.sh` runs
//! this binary there) a scheduler, 2 servers and 2 workers read back exact sums with every
//! worker→server route on the RDMA van, and `vans-doctor` reports the device.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{text, wait_output_within};

use std::process::{Command, Stdio};
use std::time::Duration;

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");
/// Generous: the guest is emulated, the host is a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(240);

/// Whether this machine has an RDMA device the van can open (the guest), checking on the
/// way that the guest really has one.
fn device_here() -> bool {
    let here = van_rdma::probe(&van_core::config::RdmaSettings::default()).is_ok();
    assert!(
        here || std::env::var_os("VANS_RDMA_REQUIRE_DEVICE").is_none(),
        "VANS_RDMA_REQUIRE_DEVICE is set but no RDMA device can be opened"
    );
    here
}

/// `vans-launch` with 2 servers and 2 workers running the exact-sum check; returns the
/// whole output after checking every worker verified its sums.
fn check_cluster(env: &[&str], args: &[&str]) -> String {
    let mut cmd = Command::new(common::LAUNCH.as_str());
    cmd.args(["-s", "2", "-w", "2", "-t", "200"]);
    for e in env {
        cmd.args(["--env", e]);
    }
    cmd.arg("--")
        .arg(PS_BENCH)
        .args(["--mode", "check"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = wait_output_within(cmd.spawn().unwrap(), "launcher", DEADLINE);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    for rank in 0..2 {
        assert!(
            all.contains(&format!("worker {rank}: exact sums verified")),
            "{all}"
        );
    }
    all
}

/// The "server N via VAN" lines of an output.
fn routes(all: &str) -> Vec<&str> {
    all.lines().filter(|l| l.contains(" via ")).collect()
}

#[cfg(feature = "rdma")]
#[test]
fn asking_for_rdma_without_a_device_is_an_error_at_start_naming_the_cause() {
    if device_here() {
        return; // In the guest there is a device: the other tests run there.
    }
    let started = std::time::Instant::now();
    let out = Command::new(PS_BENCH)
        .env("DMLC_ROLE", "worker")
        .env("DMLC_NUM_WORKER", "1")
        .env("DMLC_NUM_SERVER", "1")
        .env("DMLC_PS_ROOT_URI", "127.0.0.1")
        // No scheduler is needed: the RDMA van fails before the node registers.
        .env("DMLC_PS_ROOT_PORT", "9")
        .env("DMLC_INTERFACE", "lo")
        .env("DMLC_ENABLE_RDMA", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(30), "not at start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let cause = van_rdma::sysfs::no_device_cause(&van_rdma::sysfs::kernel_view());
    assert!(
        stderr.contains("DMLC_ENABLE_RDMA is set but no RDMA device: ") && stderr.contains(&cause),
        "expected the no-device error naming `{cause}`, got: {stderr}"
    );
    // The doctor says the same, and that such a node would fail.
    let out = Command::new(common::DOCTOR.as_str())
        .env("DMLC_ENABLE_RDMA", "1")
        .output()
        .unwrap();
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("cannot start: no RDMA device: "),
        "{report}"
    );
    assert!(report.contains("memlock limit: "), "{report}");
    assert!(report.contains("verdict: a server or worker with this environment would fail"));
}

#[test]
fn without_a_device_the_tcp_fallback_is_used_only_when_allowed_and_warned_about() {
    if device_here() {
        return;
    }
    let all = check_cluster(
        &[
            "DMLC_ENABLE_RDMA=1",
            "VANS_RDMA_FALLBACK=tcp",
            "DMLC_ENABLE_IPC=0",
        ],
        &["--keys", "32"],
    );
    let vans = routes(&all);
    assert_eq!(vans.len(), 4, "{all}");
    assert!(vans.iter().all(|l| l.ends_with("via tcp")), "{vans:?}");
    assert!(
        all.contains("VANS_RDMA_FALLBACK=tcp: every peer is reached over the tcp van"),
        "no warning about the fallback: {all}"
    );
}

#[test]
fn over_rdma_two_servers_and_two_workers_read_back_exact_sums() {
    if !device_here() {
        return;
    }
    // 20,000 keys: 320 KB of values per push, so pushes and pulls take the RDMA WRITE path
    // as well as SEND/RECV.
    for extra in [&[][..], &["--zero-copy"][..]] {
        let mut args = vec!["--keys", "20000"];
        args.extend_from_slice(extra);
        let all = check_cluster(&["DMLC_ENABLE_RDMA=1", "DMLC_ENABLE_IPC=0"], &args);
        let vans = routes(&all);
        assert_eq!(vans.len(), 4, "{all}");
        assert!(vans.iter().all(|l| l.ends_with("via rdma")), "{vans:?}");
        if !extra.is_empty() {
            let memory: Vec<&str> = all.lines().filter(|l| l.contains(" memory")).collect();
            assert_eq!(memory.len(), 2, "{all}");
            assert!(
                memory.iter().all(|l| l.ends_with("values in rdma memory")),
                "{memory:?}"
            );
        }
    }
}

#[cfg(feature = "ipc")]
#[test]
fn with_rdma_on_co_located_peers_still_use_shared_memory() {
    if !device_here() {
        return;
    }
    let all = check_cluster(&["DMLC_ENABLE_RDMA=1"], &["--keys", "32"]);
    let vans = routes(&all);
    assert_eq!(vans.len(), 4, "{all}");
    assert!(vans.iter().all(|l| l.ends_with("via ipc")), "{vans:?}");
}

#[test]
fn the_doctor_reports_the_device_its_gids_and_the_van_each_peer_gets() {
    if !device_here() {
        return;
    }
    let out = Command::new(common::DOCTOR.as_str())
        .env("DMLC_ENABLE_RDMA", "1")
        .env("DMLC_ENABLE_IPC", "0")
        .output()
        .unwrap();
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    for want in [
        "RDMA core (ib_core): loaded",
        "device rxe0",
        "RoCE v2",
        "would open: rxe0 port 1 (Ethernet)",
        "memlock limit: ",
        "the scheduler              -> tcp",
        "a server on another host   -> rdma",
        "verdict: a node with this environment can start",
    ] {
        assert!(report.contains(want), "no `{want}` in:\n{report}");
    }
}
