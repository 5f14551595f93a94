//! Open MPI's `MPI_Allreduce` on the same sizes: a small C program, compiled with `mpicc`
//! into a temporary directory and run with `mpirun` on this machine (or across `--hosts`).

use std::path::PathBuf;
use std::process::Command;

use examples::netns::Hosts;
use examples::raw::BoxError;

use crate::Row;

/// Times `MPI_Allreduce` (float sum, in place), `MPI_Allgather`, `MPI_Reduce_scatter_block`
/// or `MPI_Bcast` like the vans ranks do; rank 0 prints one JSON line per size.
const PROGRAM: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One collective of `len` floats (the whole buffer: all-gather's output, reduce-scatter's
   input); `part` is a rank's block. */
static void run(const char *op, float *buf, float *part, long len, int n) {
    int block = (int)(len / n);
    if (!strcmp(op, "allgather"))
        MPI_Allgather(part, block, MPI_FLOAT, buf, block, MPI_FLOAT, MPI_COMM_WORLD);
    else if (!strcmp(op, "reducescatter"))
        MPI_Reduce_scatter_block(buf, part, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (!strcmp(op, "broadcast"))
        MPI_Bcast(buf, (int)len, MPI_FLOAT, 0, MPI_COMM_WORLD);
    else
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char *op = argv[1];
    int iters = atoi(argv[2]);
    /* 4 KiB all-reduces for 200 ms by rank 0's clock, as vans' ranks warm up. */
    float warm[1024];
    for (int i = 0; i < 1024; i++) warm[i] = 1.0f;
    double started = MPI_Wtime();
    for (int more = 1; more;) {
        for (int i = 0; i < 10; i++)
            MPI_Allreduce(MPI_IN_PLACE, warm, 1024, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        more = rank == 0 && MPI_Wtime() - started < 0.2;
        MPI_Allreduce(MPI_IN_PLACE, &more, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    }
    for (int a = 3; a < argc; a++) {
        long bytes = atol(argv[a]);
        long len = bytes / 4;
        if (strcmp(op, "allgather") == 0 || strcmp(op, "reducescatter") == 0)
            len = len / n * n;
        float *buf = malloc(len * 4 + 4);
        float *part = malloc(len / n * 4 + 4);
        for (long i = 0; i < len; i++) buf[i] = 1.0f;
        for (long i = 0; i < len / n; i++) part[i] = 1.0f;
        long big = bytes > (1 << 20) ? bytes : (1 << 20);
        int rounds = (int)((long)iters * (1 << 20) / big);
        if (rounds < 5) rounds = 5;
        double *times = malloc(sizeof(double) * rounds);
        for (int w = 0; w < 2; w++) run(op, buf, part, len, n);
        MPI_Barrier(MPI_COMM_WORLD);
        double all = MPI_Wtime();
        for (int i = 0; i < rounds; i++) {
            double t = MPI_Wtime();
            run(op, buf, part, len, n);
            times[i] = MPI_Wtime() - t;
        }
        double total = MPI_Wtime() - all;
        qsort(times, rounds, sizeof(double), cmp);
        /* A broadcast's root is done once its buffer is on its way: a receiver reports. */
        int reporter = strcmp(op, "broadcast") == 0 ? n - 1 : 0;
        if (rank == reporter)
            printf("{\"impl\":\"mpi\",\"op\":\"%s\",\"ranks\":%d,\"bytes\":%ld,"
                   "\"rounds\":%d,\"mean_s\":%.9f,\"p50_s\":%.9f}\n",
                   op, n, len * 4, rounds, total / rounds, times[rounds / 2]);
        fflush(stdout);
        free(times);
        free(part);
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
"#;

/// `mpirun`'s remote shell for `--hosts` (`--mca plm_rsh_agent`): called as `ssh` would be
/// (options, a host, a command line), it runs the command line in that host's namespace,
/// under a hostname of its own (so Open MPI's ranks see as many hosts as vans' do).
const AGENT: &str = r#"#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host && $*"
"#;

/// The compiled program in a temporary directory (removed when dropped), beside the agent.
pub(crate) struct MpiProgram {
    dir: PathBuf,
    binary: PathBuf,
}

impl Drop for MpiProgram {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn found(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Compiles the program, or says why it cannot.
pub(crate) fn build() -> Result<MpiProgram, BoxError> {
    if !found("mpicc") || !found("mpirun") {
        return Err(
            "mpicc or mpirun not found (Debian: apt-get install openmpi-bin \
                    libopenmpi-dev)"
                .into(),
        );
    }
    let dir = std::env::temp_dir().join(format!("allreduce-bench-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {dir:?}: {e}"))?;
    let program = MpiProgram {
        binary: dir.join("mpi-allreduce"),
        dir,
    };
    let source = program.dir.join("mpi-allreduce.c");
    std::fs::write(&source, PROGRAM).map_err(|e| format!("cannot write {source:?}: {e}"))?;
    let out = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&program.binary)
        .arg(&source)
        .output()
        .map_err(|e| format!("mpicc: {e}"))?;
    if !out.status.success() {
        return Err(format!("mpicc failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let agent = program.dir.join("netns-agent");
    std::fs::write(&agent, AGENT).map_err(|e| format!("cannot write {agent:?}: {e}"))?;
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| format!("cannot make {agent:?} executable: {e}"))?;
    Ok(program)
}

/// Runs `ranks` MPI processes over `van` (tcp: the TCP transport; ipc: shared memory, and
/// TCP between hosts) on this machine, or spread over `hosts` as vans' ranks are (`mpirun`
/// on the first host, reaching the others through the agent), and returns the reporting
/// rank's rows.
pub(crate) fn run(
    program: &MpiProgram,
    (ranks, van): (usize, &str),
    collective: &str,
    sizes: &[usize],
    iters: usize,
    hosts: Option<&Hosts>,
) -> Result<Vec<Row>, BoxError> {
    let interfaces = match hosts {
        Some(hosts) => hosts.subnet.clone(),
        None => "lo".into(),
    };
    let btl = match (van, hosts) {
        ("ipc", None) => "self,vader",
        ("ipc", Some(_)) => "self,vader,tcp",
        _ => "self,tcp",
    };
    let mut cmd = match hosts {
        Some(hosts) => {
            let per_host = ranks / hosts.names.len();
            let slots: Vec<String> = hosts
                .names
                .iter()
                .map(|h| format!("{h}:{per_host}"))
                .collect();
            let mut cmd = hosts.command(0, "mpirun");
            cmd.args(["-H", &slots.join(",")])
                .args(["--mca", "plm_rsh_agent"])
                .arg(program.dir.join("netns-agent"))
                // Each host gets as many ranks as slots, so mpirun sees no oversubscription
                // and its ranks would poll without yielding; on this machine's cores (fewer
                // than the ranks) they yield, as on one host with `--oversubscribe`.
                .args(["--mca", "mpi_yield_when_idle", "1"]);
            cmd
        }
        None => Command::new("mpirun"),
    };
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
    .args(["--mca", "pml", "ob1", "--mca", "btl", btl])
    .args(["--mca", "btl_tcp_if_include", &interfaces])
    .args(["--mca", "oob_tcp_if_include", &interfaces])
    .args(["-np", &ranks.to_string()])
    .arg(&program.binary)
    .arg(collective)
    .arg(iters.to_string())
    .args(sizes.iter().map(|s| s.to_string()));
    let out = cmd.output().map_err(|e| format!("mpirun: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mpirun failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    parse_rows(&String::from_utf8_lossy(&out.stdout), van)
}

/// The JSON lines of a run (either implementation), labelled with `van`.
pub(crate) fn parse_rows(text: &str, van: &str) -> Result<Vec<Row>, BoxError> {
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let mut row: Row =
                serde_json::from_str(l).map_err(|e| format!("bad result line {l:?}: {e}"))?;
            row.van = van.to_owned();
            Ok(row)
        })
        .collect()
}
