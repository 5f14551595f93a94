//! The C ABI from real C and C++ programs: each is compiled here with the system `cc` / `c++`
//! against `include/vans.h` and `libvans.so`, then run as a local cluster of processes
//! (`launcher`) that read their roles from the environment. Every program checks its own
//! results and exits non-zero on a mismatch; the tests also check what the programs printed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{c_program, compile, crate_dir, number_after, run_cluster};

const WORKERS: u32 = 2;
const REPEAT: u32 = 6;

/// The sum every worker of test_kv_app must print: each key's value `i % modulus + 1`,
/// pushed REPEAT times by each worker.
fn expected_kv_sum(modulus: u32) -> f64 {
    let pushed: u32 = (0..1000).map(|i| i % modulus + 1).sum();
    f64::from(pushed * REPEAT * WORKERS)
}

/// Every worker printed the expected sum, and the ranks they printed are 0..WORKERS (the
/// scheduler assigns ranks, so a worker's rank need not be its launch rank).
fn check_kv_sums(run: &common::ClusterRun, modulus: u32) {
    let mut ranks = Vec::new();
    for launched in 0..WORKERS {
        let log = run.log(&format!("worker-{launched}"));
        let rank = number_after(log, "worker rank ").unwrap_or(-1.0);
        let sum = number_after(log, "keys, sum of pulled values ");
        assert_eq!(
            sum,
            Some(expected_kv_sum(modulus)),
            "a worker printed:\n{log}"
        );
        ranks.push(rank);
    }
    ranks.sort_by(f64::total_cmp);
    assert_eq!(ranks, [0.0, 1.0]);
}

#[test]
fn c_kv_app_pushes_and_pulls_the_sums() {
    let program = c_program("test_kv_app.c");
    let run = run_cluster(program.path(), &[], 2, WORKERS);
    run.assert_success();
    check_kv_sums(&run, 97);
}

#[test]
fn cpp_kv_app_pushes_and_pulls_the_sums() {
    let program = compile(
        "test_kv_app_cpp",
        &[crate_dir().join("tests/cpp/test_kv_app.cc")],
        true,
    );
    let run = run_cluster(program.path(), &[], 2, WORKERS);
    run.assert_success();
    check_kv_sums(&run, 89);
    assert!(run
        .log("worker-0")
        .contains("error as expected: VANS_ERR_INVALID_ARGUMENT"));
}

fn rendezvous(protocol: &str) {
    let program = c_program("test_rendezvous.c");
    let run = run_cluster(program.path(), &[protocol], 1, 1);
    run.assert_success();
    let worker = run.log("worker-0");
    assert!(
        worker.contains(&format!("rendezvous ok: {protocol}, 3 steps")),
        "{worker}"
    );
    assert!(
        worker.contains("has 100 bytes but the buffer holds 10"),
        "{worker}"
    );
}

#[test]
fn c_rendezvous_in_pull_mode() {
    rendezvous("pull");
}

#[test]
fn c_rendezvous_in_push_mode() {
    rendezvous("push");
}

#[test]
fn c_error_paths_are_codes_and_messages() {
    let program = c_program("test_errors.c");
    let run = run_cluster(program.path(), &[], 1, 1);
    run.assert_success();
    let worker = run.log("worker-0");
    assert!(worker.contains("errors ok"), "{worker}");
    assert!(
        worker.contains(
            "VANS_ERR_INVALID_ARGUMENT: invalid argument: the output buffer holds 12 bytes but \
             16 bytes of values arrived"
        ),
        "{worker}"
    );
    assert!(worker.contains("wait inside a callback: VANS_ERR_INVALID_ARGUMENT"));
}

#[test]
fn c_server_handler_keeps_the_maximum() {
    let program = c_program("test_server_handler.c");
    let run = run_cluster(program.path(), &[], 2, WORKERS);
    run.assert_success();
    let expected: u32 = (0..200).map(|i| 10 * WORKERS + i % 7).sum();
    for launched in 0..WORKERS {
        let log = run.log(&format!("worker-{launched}"));
        assert_eq!(
            number_after(log, "max ok, sum of pulled values "),
            Some(f64::from(expected)),
            "{log}"
        );
        assert!(
            log.contains("command 99 is refused by the max handler"),
            "{log}"
        );
    }
}

#[test]
fn c_table_servers_step_as_each_optimizer_does() {
    let program = c_program("test_table.c");
    let run = run_cluster(program.path(), &[], 2, WORKERS);
    run.assert_success();
    let mut sums = Vec::new();
    for launched in 0..WORKERS {
        let log = run.log(&format!("worker-{launched}"));
        let sum = number_after(log, "tables ok, sum of pulled values ");
        assert!(sum.is_some_and(|s| s != 0.0), "{log}");
        assert!(log.contains("table with dim 8"), "{log}");
        sums.push(sum);
    }
    // Both workers pulled the same rows.
    assert_eq!(sums[0], sums[1]);
    for server in 0..2 {
        let log = run.log(&format!("server-{server}"));
        assert!(log.contains("unknown optimizer \"adamw\""), "{log}");
        assert!(log.contains("beta1 is not a setting"), "{log}");
    }
}

#[test]
fn c_collectives_among_three_workers() {
    let program = c_program("test_collective.c");
    let run = run_cluster(program.path(), &[], 1, 3);
    run.assert_success();
    let mut ranks: Vec<f64> = (0..3)
        .map(|w| {
            let log = run.log(&format!("worker-{w}"));
            assert!(log.contains("of 3"), "{log}");
            number_after(log, "collective ok: rank ").unwrap_or(-1.0)
        })
        .collect();
    ranks.sort_by(f64::total_cmp);
    assert_eq!(ranks, [0.0, 1.0, 2.0]);
}
