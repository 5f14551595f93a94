//! `ps-ipc-bench`: ps-lite's `test_ipc_benchmark` — worker and server co-located on this
//! host — run twice in one invocation, over shared memory and over TCP, beside a
//! single-thread `memcpy` of the same sizes, so the ratios are printed.
//!
//! It runs the sibling `ps-bench` binary (built with the `ipc` feature) as a local cluster
//! three times: with `DMLC_ENABLE_IPC=1` (values copied into the rings), with IPC and
//! `--zero-copy` (values allocated in the worker's shared arena: pushes move references, not
//! bytes), and with `DMLC_ENABLE_IPC=0` (TCP); it reads ps-bench's JSON report and measures
//! `memcpy` here.
//!
//! Usage: `ps-ipc-bench [--sizes 8,1048576,4194304] [--windows 1,4] [--seconds 1]` (see
//! `--help`).

use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use examples::raw::BoxError;
use examples::report::{BenchReport, Figures};
use examples::{ratio, Table};

/// ps-lite's test_ipc_benchmark: worker and server co-located on this host, over shared
/// memory (values copied, then zero-copy) and over TCP, beside a single-thread memcpy.
///
/// Runs the sibling ps-bench binary (built with the `ipc` feature) as a local cluster three
/// times — DMLC_ENABLE_IPC=1, DMLC_ENABLE_IPC=1 with --zero-copy, DMLC_ENABLE_IPC=0 — with
/// the options below passed on to it, and prints one table with the ratios.
#[derive(Debug, Parser)]
#[command(name = "ps-ipc-bench")]
struct Options {
    /// Value bytes per request, comma-separated (ps-bench's --sizes).
    #[arg(long, value_name = "LIST", default_value = "8,1048576,4194304")]
    sizes: String,
    /// Requests in flight, comma-separated (ps-bench's --windows).
    #[arg(long, value_name = "LIST", default_value = "1,4")]
    windows: String,
    /// Seconds per case (ps-bench's --seconds).
    #[arg(long, value_name = "S", default_value = "1")]
    seconds: String,
}

fn main() {
    let options = Options::parse();
    if let Err(e) = run(&options) {
        eprintln!("ps-ipc-bench: {e}");
        std::process::exit(1);
    }
}

fn run(options: &Options) -> Result<(), BoxError> {
    let Options {
        sizes,
        windows,
        seconds,
    } = options;
    let bench = std::env::current_exe()?
        .parent()
        .ok_or("no directory for ps-bench")?
        .join("ps-bench");
    let mut runs = Vec::new();
    for (van, ipc, extra) in [
        ("ipc", "1", None),
        ("ipc zero-copy", "1", Some("--zero-copy")),
        ("tcp", "0", None),
    ] {
        eprintln!("ps-ipc-bench: running ps-bench over {van} ...");
        let out = Command::new(&bench)
            .args(["--mode", "all", "--json", "--no-raw"])
            .args(extra)
            .args(["--sizes", sizes, "--windows", windows, "--seconds", seconds])
            .env("DMLC_ENABLE_IPC", ipc)
            .env_remove("DMLC_ROLE")
            .output()
            .map_err(|e| format!("cannot run {}: {e}", bench.display()))?;
        if !out.status.success() {
            return Err(format!(
                "ps-bench over {van} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        let report: BenchReport = serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "ps-bench over {van} printed no JSON report ({e}):\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        })?;
        let cases = report.runs.into_iter().next().map(|r| r.cases);
        runs.push(cases.unwrap_or_default());
    }
    let (ipc, zc, tcp) = (&runs[0], &runs[1], &runs[2]);
    let mut table = Table::new(&[
        "mode",
        "size",
        "in flight",
        "ipc GB/s",
        "ipc zc GB/s",
        "tcp GB/s",
        "ipc p50 µs",
        "ipc zc p50 µs",
        "tcp p50 µs",
        "memcpy GB/s",
        "ipc / tcp",
        "zc / tcp",
        "zc / memcpy",
    ]);
    for ((a, z), b) in ipc.iter().zip(zc).zip(tcp) {
        let case = a.case;
        let size = case.size as usize;
        let copy = memcpy_gbps(size);
        let (a, z, b) = (&a.total, &z.total, &b.total);
        // Small messages compare by latency, large ones by bandwidth.
        let speedup = |fast: &Figures| {
            if size < 4096 {
                ratio(b.p50_us as f64, fast.p50_us as f64)
            } else {
                ratio(fast.gb_per_s, b.gb_per_s)
            }
        };
        table.row(vec![
            case.mode.name().to_owned(),
            size.to_string(),
            case.window.to_string(),
            format!("{:.3}", a.gb_per_s),
            format!("{:.3}", z.gb_per_s),
            format!("{:.3}", b.gb_per_s),
            a.p50_us.to_string(),
            z.p50_us.to_string(),
            b.p50_us.to_string(),
            format!("{copy:.2}"),
            format!("{:.2}x", speedup(a)),
            format!("{:.2}x", speedup(z)),
            format!("{:.2}x", ratio(z.gb_per_s, copy)),
        ]);
    }
    println!("{table}");
    println!(
        "(ipc / tcp and zc / tcp: p50 latency ratio below 4 KiB, bandwidth ratio above; zc: \
         values in the shared arena, pushes carry references; memcpy: one thread copying the \
         same size repeatedly, measured now)"
    );
    Ok(())
}

/// Single-thread copy bandwidth for buffers of `size` bytes, in GB/s.
fn memcpy_gbps(size: usize) -> f64 {
    let size = size.max(8);
    let src = vec![1u8; size];
    let mut dst = vec![0u8; size];
    let mut copied = 0usize;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(200) {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        copied += size;
    }
    copied as f64 / started.elapsed().as_secs_f64() / 1e9
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_options_are_passed_on_as_given() {
        Options::command().debug_assert();
        let o = Options::try_parse_from(["ps-ipc-bench"]).unwrap();
        assert_eq!(
            (o.sizes.as_str(), o.windows.as_str()),
            ("8,1048576,4194304", "1,4")
        );
        assert_eq!(o.seconds, "1");
        let o = Options::try_parse_from(["ps-ipc-bench", "--sizes", "8", "--seconds=0.5"]).unwrap();
        assert_eq!((o.sizes.as_str(), o.seconds.as_str()), ("8", "0.5"));
        assert!(Options::try_parse_from(["ps-ipc-bench", "--size", "8"]).is_err());
    }
}
