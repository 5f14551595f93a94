//! What `ps-bench` shows when it launches its own cluster: `--json` is one JSON document on
//! stdout whose totals add up the workers' rows, and `--plot` writes a PNG.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{text, wait_output};

use std::process::{Command, Stdio};

use examples::report::BenchReport;
use serde_json::Value;

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");

/// `ps-bench` launching its own local cluster (no `DMLC_ROLE`) with `args`.
fn ps_bench(args: &[&str]) -> std::process::Output {
    let child = Command::new(PS_BENCH)
        .args(args)
        .env_remove("DMLC_ROLE")
        // TCP whatever the environment of the test run selects (the rows name the van).
        .env_remove("VANS_STREAM_VAN")
        .env("DMLC_ENABLE_IPC", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child, "ps-bench");
    assert!(out.status.success(), "{}", text(&out));
    out
}

/// Checks that `value` (stdout of `ps-bench --json`) has every case with one row per worker
/// and a total that is their sum (rates) or their worst (latency).
fn assert_totals_add_up(value: &Value, workers: usize) {
    let runs = value["runs"].as_array().expect("runs");
    assert!(!runs.is_empty(), "{value}");
    for run in runs {
        let cases = run["cases"].as_array().expect("cases");
        assert!(!cases.is_empty(), "{run}");
        for case in cases {
            let rows = case["workers"].as_array().expect("workers");
            assert_eq!(rows.len(), workers, "{case}");
            let ranks: Vec<u64> = rows.iter().map(|r| r["worker"].as_u64().unwrap()).collect();
            assert_eq!(ranks, (0..workers as u64).collect::<Vec<_>>(), "{case}");
            let total = &case["total"];
            let sum = |key: &str| rows.iter().map(|r| r[key].as_f64().unwrap()).sum::<f64>();
            let max = |key: &str| rows.iter().map(|r| r[key].as_u64().unwrap()).max().unwrap();
            for key in ["ops_per_s", "gb_per_s"] {
                let (got, want) = (total[key].as_f64().unwrap(), sum(key));
                assert!(
                    (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                    "{key}: {got} != {want}"
                );
            }
            assert_eq!(total["ops"].as_f64().unwrap(), sum("ops"), "{case}");
            assert!(total["ops"].as_u64().unwrap() > 0, "{case}");
            assert_eq!(total["p50_us"].as_u64().unwrap(), max("p50_us"), "{case}");
            assert_eq!(total["p99_us"].as_u64().unwrap(), max("p99_us"), "{case}");
        }
    }
}

#[test]
fn json_of_a_launched_two_worker_cluster_is_one_document_whose_totals_add_up() {
    let out = ps_bench(&[
        "--json",
        "--workers",
        "2",
        "--mode",
        "pushpull",
        "--sizes",
        "8,4096",
        "--windows",
        "1,4",
        "--seconds",
        "0.1",
    ]);
    // The whole of stdout is one document (no launcher prefix, no table, no log line).
    let value: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", text(&out)));
    assert_eq!(
        (value["servers"].as_u64(), value["workers"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(value["runs"][0]["van"], "tcp", "{value}");
    assert_eq!(value["runs"][0]["cases"].as_array().unwrap().len(), 4);
    assert_totals_add_up(&value, 2);
    // Worker 0's raw reference came along.
    assert_eq!(value["runs"][0]["raw"][0]["name"], "ping-pong", "{value}");
    // The time to form the cluster: after the launch, before every node exited.
    let formed = value["runs"][0]["formed_s"].as_f64().expect("formed_s");
    let elapsed = value["runs"][0]["elapsed_s"].as_f64().expect("elapsed_s");
    assert!(formed > 0.0 && formed < elapsed, "{formed} {elapsed}");
    // The cluster's CPU is read by worker 0 alone (every worker scanning /proc made its
    // own reads the largest cost of a 500-worker case); the total carries its reading.
    for case in value["runs"][0]["cases"].as_array().unwrap() {
        let cpu = |w: usize| case["workers"][w]["cluster_cpu_s"].as_f64();
        assert!(cpu(0).is_some() && cpu(1).is_none(), "{case}");
        assert_eq!(case["total"]["cluster_cpu_s"].as_f64(), cpu(0), "{case}");
    }
    // The library's types read it back.
    let report: BenchReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report.runs[0].cases[0].workers.len(), 2);
    // The progress went to stderr (behind the launcher's prefix, whose number is the start
    // order, not the rank the scheduler gave).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("[worker ") && l.contains("] worker 1: pushpull")),
        "{stderr}"
    );
}

#[test]
fn the_in_process_cluster_gathers_its_workers_the_same_way() {
    let out = ps_bench(&[
        "--van",
        "inproc",
        "--json",
        "--workers",
        "3",
        "--servers",
        "2",
        "--mode",
        "push",
        "--sizes",
        "8",
        "--windows",
        "2",
        "--seconds",
        "0.05",
        "--no-raw",
    ]);
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["runs"][0]["van"], "inproc", "{value}");
    assert_totals_add_up(&value, 3);
}

/// Thousands of nodes in one process: each node holds the scheduler's one node table (not a
/// copy each), a barrier costs constant work per arrival, and a connect to an address with
/// thousands of connected vans costs the same as to one with a few. (The 10,000-node run,
/// release build, is in the book's performance chapter.)
#[test]
fn an_in_process_cluster_of_two_thousand_nodes_forms_push_pulls_and_stops() {
    let out = ps_bench(&[
        "--van",
        "inproc",
        "--json",
        "--servers",
        "20",
        "--workers",
        "1980",
        "--mode",
        "pushpull",
        "--sizes",
        "8",
        "--windows",
        "1",
        "--seconds",
        "0.05",
        "--no-raw",
    ]);
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_totals_add_up(&value, 1980);
    let formed = value["runs"][0]["formed_s"].as_f64().expect("formed_s");
    let elapsed = value["runs"][0]["elapsed_s"].as_f64().expect("elapsed_s");
    assert!(formed > 0.0 && formed < elapsed, "{formed} {elapsed}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("worker 1979: pushpull"), "{stderr}");
    // One table for all: 2,001 nodes each holding a copy of it took about 4 GB.
    let rss = value["runs"][0]["peak_rss_mb"]
        .as_f64()
        .expect("peak_rss_mb");
    assert!(rss > 1.0 && rss < 1000.0, "peak RSS {rss} MB");
}

#[test]
fn the_table_has_each_workers_row_and_a_total_and_plot_writes_a_png() {
    let path = std::env::temp_dir().join(format!("ps-bench-test-{}.png", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let out = ps_bench(&[
        "--workers",
        "2",
        "--mode",
        "pull",
        "--sizes",
        "8,4096,65536",
        "--windows",
        "1,4",
        "--seconds",
        "0.05",
        "--no-raw",
        "--plot",
        path.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ps-bench over tcp: 1 server, 2 workers:"),
        "{stdout}"
    );
    let rows = |who: &str| {
        stdout
            .lines()
            .filter(|l| l.starts_with("| pull") && l.split('|').nth(4).map(str::trim) == Some(who))
            .count()
    };
    assert_eq!((rows("0"), rows("1"), rows("total")), (6, 6, 6), "{stdout}");
    let png = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(png.len() > 1000, "{} bytes", png.len());
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}

#[test]
fn the_sparse_mode_pulls_many_ids_per_request_with_one_copy_per_byte() {
    let args = [
        "--servers",
        "3",
        "--workers",
        "2",
        "--keys-per-request",
        "512",
        "--value-floats",
        "16",
        "--zipf",
        "1.2",
        "--windows",
        "1,4",
        "--iters",
        "30",
        "--no-raw",
    ];
    let out = ps_bench(&[&args[..], &["--json"]].concat());
    let value: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_totals_add_up(&value, 2);
    let run = &value["runs"][0];
    let cases = run["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 6, "push, pull, pushpull x 2 windows: {run}");
    for case in cases {
        assert_eq!(case["keys"], 512, "{case}");
        assert_eq!(case["size"], 512 * 16 * 4, "{case}");
        assert_eq!(case["total"]["ops"], 60, "{case}");
    }
    // Each server's answer is copied once into the caller's buffer, and nothing else is.
    assert_eq!(run["copies_per_pulled_byte"].as_f64(), Some(1.0), "{run}");
    let table = String::from_utf8(ps_bench(&args).stdout).unwrap();
    assert!(table.contains("| keys |"), "{table}");
    assert!(table.contains("keys/s"), "{table}");
    assert!(
        table.contains("user-space copies per pulled byte on a worker: 1.000"),
        "{table}"
    );
    // A bad table spec is refused before anything starts.
    let refused = Command::new(PS_BENCH)
        .args(["--keys-per-request", "8", "--table", "optimizer=adamw"])
        .env_remove("DMLC_ROLE")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("unknown optimizer \"adamw\""),
        "{}",
        text(&refused)
    );
}
