//! Roles from the launch engine: ps-bench started by Open MPI's `mpirun` and by a
//! PyTorch-style launcher (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with no `DMLC_ROLE`:
//! rank 0 becomes the scheduler, rank 1 the server, the rest the workers, and the sums are
//! exact. (`scripts/setup.sh` installs Open MPI's `mpirun`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};

const PS_BENCH: &str = env!("CARGO_BIN_EXE_ps-bench");

#[test]
fn mpirun_ranks_become_scheduler_server_and_workers() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        panic!("mpirun not found: run scripts/setup.sh (Debian: apt-get install openmpi-bin)");
    }
    let port = common::free_port().to_string();
    let child = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
        ])
        .args([
            "--mca",
            "btl",
            "self,tcp",
            "--mca",
            "btl_tcp_if_include",
            "lo",
        ])
        .args(["--mca", "oob_tcp_if_include", "lo"])
        .args(["-np", "4"])
        .args([
            "-x",
            "DMLC_NUM_SERVER=1",
            "-x",
            "DMLC_PS_ROOT_URI=127.0.0.1",
        ])
        .args([
            "-x",
            &format!("DMLC_PS_ROOT_PORT={port}"),
            "-x",
            "DMLC_ENABLE_RDMA=0",
        ])
        .args([PS_BENCH, "--mode", "check", "--keys", "16"])
        .env_remove("DMLC_ROLE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::wait_output(child, "mpirun");
    let all = common::text(&out);
    assert!(out.status.success(), "{all}");
    common::exact_sums(&all, 16, 2);
}

#[test]
fn pytorch_style_ranks_become_scheduler_server_and_workers() {
    let port = common::free_port().to_string();
    let children: Vec<_> = (0..4)
        .map(|rank| {
            Command::new(PS_BENCH)
                .args(["--mode", "check", "--keys", "16"])
                .env_remove("DMLC_ROLE")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "4")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("DMLC_NUM_SERVER", "1")
                .env("DMLC_ENABLE_RDMA", "0")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut all = String::new();
    for (rank, child) in children.into_iter().enumerate() {
        let out = common::wait_output(child, &format!("rank {rank}"));
        let text = common::text(&out);
        assert!(out.status.success(), "rank {rank}: {text}");
        all.push_str(&text);
    }
    common::exact_sums(&all, 16, 2);
}

#[test]
fn an_engine_rank_without_the_server_count_is_a_named_error() {
    let out = Command::new(PS_BENCH)
        .env_remove("DMLC_ROLE")
        .env_remove("DMLC_NUM_SERVER")
        .env("RANK", "2")
        .env("WORLD_SIZE", "4")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "9")
        .output()
        .unwrap();
    let all = common::text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("role from the PyTorch launch: rank 2 of 4: set DMLC_NUM_SERVER"),
        "{all}"
    );
}
