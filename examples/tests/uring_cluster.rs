//! The cluster checks of the parameter server with the stream van switched to io_uring
//! (`VANS_STREAM_VAN=uring`, feature `uring`): real processes on 127.0.0.1 through
//! `vans-launch`, exact sums read back, and `ps-bench --van tcp,uring` comparing both vans in
//! one invocation (and with 4 servers and 8 workers, gathered into one JSON document).

#![cfg(all(feature = "uring", target_os = "linux"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{text, wait_output};

use std::process::{Command, Output, Stdio};

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");

#[test]
fn two_servers_two_workers_read_back_exact_sums_over_io_uring() {
    let mut cmd = Command::new(common::LAUNCH.as_str());
    cmd.args(["-s", "2", "-w", "2"]);
    for env in [
        "VANS_STREAM_VAN=uring",
        "DMLC_ENABLE_IPC=0",
        "VANS_URING_THREADS=2",
    ] {
        cmd.args(["--env", env]);
    }
    cmd.args(["--", PS_BENCH, "--mode", "check", "--keys", "32"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = wait_output(cmd.spawn().unwrap(), "launcher");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    for rank in 0..2 {
        assert!(
            all.contains(&format!(
                "worker {rank}: exact sums verified for 32 keys from 2 workers"
            )),
            "worker {rank} did not verify: {all}"
        );
    }
    let vans: Vec<&str> = all.lines().filter(|l| l.contains(" via ")).collect();
    assert_eq!(vans.len(), 4, "{all}");
    assert!(vans.iter().all(|l| l.ends_with("via uring")), "{vans:?}");
}

/// `ps-bench` launching its own local cluster (no `DMLC_ROLE`) with `args`, waited for.
fn ps_bench(args: &[&str]) -> Output {
    let child = Command::new(PS_BENCH)
        .args(args)
        .env_remove("DMLC_ROLE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_output(child, "ps-bench")
}

#[test]
fn ps_bench_compares_tcp_and_uring_in_one_invocation() {
    let out = ps_bench(&[
        "--van",
        "tcp,uring",
        "--mode",
        "pushpull",
        "--sizes",
        "8,65536",
        "--windows",
        "8",
        "--seconds",
        "0.1",
        "--no-raw",
    ]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let table = stdout
        .split("side by side")
        .nth(1)
        .unwrap_or_else(|| panic!("no comparison table: {all}"));
    assert!(
        table.contains("ops/s uring") && table.contains("uring/tcp"),
        "{table}"
    );
    for size in ["8", "65536"] {
        let row = table
            .lines()
            .find(|l| {
                l.starts_with("| pushpull") && l.split('|').nth(2).map(str::trim) == Some(size)
            })
            .unwrap_or_else(|| panic!("no {size} B row: {table}"));
        // Both vans moved data, and the cluster's CPU was measured for both (only the GB/s
        // ratio of 8-byte values may round to nothing).
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        for ops in &cells[4..6] {
            assert!(ops.parse::<f64>().is_ok_and(|v| v > 0.0), "{row}");
        }
        assert!(row.matches("n/a").count() <= 1, "{row}");
    }
}

#[test]
fn many_peers_four_servers_eight_workers_over_tcp_and_uring_give_one_total_per_case() {
    let out = ps_bench(&[
        "--van",
        "tcp,uring",
        "--servers",
        "4",
        "--workers",
        "8",
        "--mode",
        "pushpull",
        "--sizes",
        "8,65536",
        "--windows",
        "4",
        "--seconds",
        "0.1",
        "--no-raw",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", text(&out)));
    let vans: Vec<&str> = value["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["van"].as_str().unwrap())
        .collect();
    assert_eq!(vans, ["tcp", "uring"]);
    for run in value["runs"].as_array().unwrap() {
        let cases = run["cases"].as_array().unwrap();
        // One case per size: an empty run would pass every check below.
        assert_eq!(cases.len(), 2, "{run}");
        for case in cases {
            let rows = case["workers"].as_array().unwrap();
            assert_eq!(rows.len(), 8, "{case}");
            let sum: f64 = rows.iter().map(|r| r["ops_per_s"].as_f64().unwrap()).sum();
            let total = case["total"]["ops_per_s"].as_f64().unwrap();
            assert!(total > 0.0 && (total - sum).abs() <= 1e-9 * sum, "{case}");
            // Every worker reached the servers and the cluster's CPU was read.
            assert!(
                rows.iter().all(|r| r["ops"].as_u64().unwrap() > 0),
                "{case}"
            );
            assert!(case["total"]["cpu_us_per_op"].as_f64().is_some(), "{case}");
        }
    }
}
