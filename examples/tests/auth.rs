//! An authenticated cluster of real processes on 127.0.0.1: nodes holding the secret form the
//! cluster and verify exact sums, while an intruder without the secret, and one with another
//! secret, cannot register (so they cannot take a worker's place, push or read values).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{free_port, loopback_node, text, wait_output};

use std::process::Command;

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");
const SECRET: &str = "7f3a9c1e5b2d4f6a8c0e1b3d5f7a9c2e";

/// `ps-bench --mode check` for one role of a 1-server, 1-worker cluster.
fn node(role: &str, port: u16, secret: Option<&str>) -> Command {
    let mut cmd = loopback_node(PS_BENCH, role, port);
    cmd.args(["--mode", "check", "--keys", "16"])
        .env("VANS_BOOTSTRAP_TIMEOUT_SECS", "20")
        .env_remove("VANS_CLUSTER_SECRET")
        .env_remove("VANS_CLUSTER_SECRET_FILE");
    if let Some(secret) = secret {
        cmd.env("VANS_CLUSTER_SECRET", secret);
    }
    cmd
}

#[test]
fn intruders_without_the_secret_cannot_join_and_the_cluster_sums_exactly() {
    let port = free_port();
    let scheduler = node("scheduler", port, Some(SECRET)).spawn().unwrap();
    // The intruders come first: had either registered, it would hold the only worker slot.
    let missing = node("worker", port, None)
        .env("VANS_BOOTSTRAP_TIMEOUT_SECS", "4")
        .spawn()
        .unwrap();
    let wrong = node("worker", port, Some("another-secret-of-32-characters!"))
        .env("VANS_BOOTSTRAP_TIMEOUT_SECS", "4")
        .spawn()
        .unwrap();
    let missing = wait_output(missing, "intruder without a secret");
    let wrong = wait_output(wrong, "intruder with another secret");
    assert!(!missing.status.success(), "{}", text(&missing));
    assert!(!wrong.status.success(), "{}", text(&wrong));
    let wrong_text = text(&wrong);
    assert!(
        wrong_text.contains("different cluster secret"),
        "the refusal must say why: {wrong_text}"
    );

    let server = node("server", port, Some(SECRET)).spawn().unwrap();
    let worker = node("worker", port, Some(SECRET)).spawn().unwrap();
    let worker = wait_output(worker, "worker");
    let server = wait_output(server, "server");
    let scheduler = wait_output(scheduler, "scheduler");
    for (name, out) in [
        ("worker", &worker),
        ("server", &server),
        ("scheduler", &scheduler),
    ] {
        assert!(out.status.success(), "{name} failed: {}", text(out));
    }
    let all = text(&worker);
    assert!(
        all.contains("worker 0: exact sums verified for 16 keys from 1 workers"),
        "{all}"
    );
    let scheduler_log = text(&scheduler);
    assert!(
        scheduler_log.contains("refused a connection"),
        "the scheduler must log the refusals: {scheduler_log}"
    );
}
