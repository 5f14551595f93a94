//! `allreduce-bench`: the `collective` crate's all-reduce (and, with `--collectives`,
//! all-gather, reduce-scatter and broadcast) beside Open MPI's, on the same sizes, rank
//! counts and machine, in one run.
//!
//! For each van (`--van tcp,ipc`) and rank count (`--ranks 2,4`) it launches a local cluster
//! of itself (a scheduler, one idle server and the ranks as worker processes, through
//! `launcher`), times f32-sum all-reduces of every size (`--sizes 4K,…,64M`), then runs the
//! same sizes under `mpirun` (a small C program compiled with `mpicc`; TCP on loopback for
//! `tcp`, shared memory for `ipc`). It prints, per size, p50 latency, algorithm bandwidth
//! (bytes / time) and bus bandwidth (NCCL-tests: algbw × 2(n−1)/n) of both, and their
//! ratios (`--json`: one object per row); `--plot FILE.png` draws bus bandwidth against
//! size.
//!
//! `allreduce-bench node MODE` is one process of such a cluster (role from `DMLC_ROLE`):
//! `check` runs every collective once and checks the results, `elastic` runs a loop of
//! checked all-reduces that survives killed and joining ranks, `bench` is the timed part.

mod hosts;
mod mpi;
mod node;
mod options;

use std::path::Path;

use clap::Parser;
use examples::raw::BoxError;
use examples::Table;
use launcher::{launch, LaunchSpec};
use plotters::prelude::*;

use crate::options::{NodeCommand, Options};

/// Where a bench node's rank 0 appends its result lines (set by the driver).
pub(crate) const OUT_ENV: &str = "ALLREDUCE_BENCH_OUT";

/// One measured size of one implementation.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct Row {
    #[serde(rename = "impl")]
    pub imp: String,
    /// The collective (`allreduce`, `allgather`, `reducescatter`, `broadcast`).
    #[serde(default = "default_op")]
    pub op: String,
    pub ranks: usize,
    pub bytes: usize,
    pub mean_s: f64,
    pub p50_s: f64,
    #[serde(default)]
    pub van: String,
}

impl Row {
    /// Algorithm bandwidth, GB/s.
    fn algbw(&self) -> f64 {
        self.bytes as f64 / self.mean_s / 1e9
    }

    /// Bus bandwidth, GB/s: what each link carries (NCCL-tests' definitions: all-reduce
    /// moves `2 (n - 1) / n` of the buffer, all-gather and reduce-scatter `(n - 1) / n`,
    /// broadcast all of it).
    fn busbw(&self) -> f64 {
        let n = self.ranks as f64;
        let factor = match self.op.as_str() {
            "allgather" | "reducescatter" => (n - 1.0) / n,
            "broadcast" => 1.0,
            _ => 2.0 * (n - 1.0) / n,
        };
        self.algbw() * factor
    }

    /// The same case measured by the other implementation.
    fn peer<'a>(&self, rows: &'a [Row], imp: &str) -> Option<&'a Row> {
        rows.iter().find(|m| {
            m.imp == imp
                && m.op == self.op
                && m.van == self.van
                && m.ranks == self.ranks
                && m.bytes == self.bytes
        })
    }
}

fn default_op() -> String {
    "allreduce".into()
}

fn main() {
    ::node::logging::init(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let options = Options::parse();
    // Multi-threaded even with one worker: the collectives block the main thread while
    // they poll shared memory or their sockets, and the vans' I/O goes on in the worker.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.threads)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("allreduce-bench: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = match &options.node {
        Some(NodeCommand::Node { mode }) => runtime.block_on(node::run(mode)),
        None => runtime.block_on(drive(&options)),
    };
    if let Err(e) = result {
        eprintln!("allreduce-bench: {e}");
        std::process::exit(1);
    }
}

async fn drive(o: &Options) -> Result<(), BoxError> {
    if o.explain {
        return explain(o);
    }
    for van in &o.van {
        match van.as_str() {
            "tcp" => {}
            "ipc" if cfg!(feature = "ipc") => {}
            "ipc" => return Err("--van ipc needs a build with feature ipc".into()),
            "uring" if cfg!(feature = "uring") => {}
            "uring" => return Err("--van uring needs a build with feature uring".into()),
            other => return Err(format!("--van {other}: expected tcp, uring or ipc").into()),
        }
    }
    let mpi = match o.mpi.as_str() {
        "off" => None,
        mode => match mpi::build() {
            Ok(program) => Some(program),
            Err(e) if mode == "required" => return Err(e),
            Err(e) => {
                eprintln!("allreduce-bench: Open MPI left out: {e}");
                None
            }
        },
    };
    // `--hosts`: the namespaces, made once for the run.
    let hosts = match o.hosts {
        1 => None,
        count => {
            hosts::check(&o.ranks, count)?;
            let made = examples::netns::Hosts::create("arb", count, false)
                .map_err(|e| format!("--hosts {count}: {e}"))?;
            Some(made)
        }
    };
    let place = match o.hosts {
        1 => String::new(),
        count => format!(" on {count} hosts"),
    };
    let mut rows = Vec::new();
    for (i, van) in o.van.iter().enumerate() {
        for (j, &n) in o.ranks.iter().enumerate() {
            eprintln!(
                "allreduce-bench: vans over {van}, {n} ranks{place}: {}",
                o.collectives.join(", ")
            );
            match &hosts {
                Some(hosts) => {
                    let port = 9100 + (i * o.ranks.len() + j) as u16;
                    rows.extend(hosts::run_vans(o, hosts, n, van, port)?);
                }
                None => rows.extend(run_vans(o, n, van).await?),
            }
            if let Some(program) = &mpi {
                for collective in &o.collectives {
                    eprintln!(
                        "allreduce-bench: Open MPI over {van}, {n} ranks{place}: {collective}"
                    );
                    let measured = mpi::run(
                        program,
                        (n, van),
                        collective,
                        &o.sizes,
                        o.iters,
                        hosts.as_ref(),
                    );
                    rows.extend(measured?);
                }
            }
        }
    }
    if o.json {
        print_json(&rows, o.hosts);
    } else {
        print_table(&rows);
    }
    if let Some(path) = &o.plot {
        plot(&rows, path)?;
        eprintln!("allreduce-bench: plot written to {}", path.display());
    }
    Ok(())
}

/// One local cluster of `n` ranks over `van`; rank 0's rows.
async fn run_vans(o: &Options, n: usize, van: &str) -> Result<Vec<Row>, BoxError> {
    let out = std::env::temp_dir().join(format!(
        "allreduce-bench-{}-{van}-{n}.jsonl",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&out);
    let mut spec = LaunchSpec::new(1, n as u32, std::env::current_exe()?);
    let sizes: Vec<String> = o.sizes.iter().map(usize::to_string).collect();
    spec.args = vec![
        "--threads".into(),
        o.threads.to_string(),
        "node".into(),
        "bench".into(),
        "--sizes".into(),
        sizes.join(","),
        "--collectives".into(),
        o.collectives.join(","),
        "--iters".into(),
        o.iters.to_string(),
    ];
    if o.alloc {
        spec.args.push("--alloc".into());
        spec.env.push(arena_for(o));
    }
    spec.env.push(("DMLC_ENABLE_RDMA".into(), "0".into()));
    spec.env
        .push((OUT_ENV.into(), out.to_string_lossy().into_owned()));
    if van != "ipc" {
        spec.env.push(("VANS_STREAM_VAN".into(), van.into()));
        spec.env.push(("DMLC_ENABLE_IPC".into(), "0".into()));
    }
    spec.timeout = Some(std::time::Duration::from_secs(1800));
    launch(&spec).await?;
    let text = std::fs::read_to_string(&out)
        .map_err(|e| format!("rank 0 left no results in {out:?}: {e}"))?;
    let _ = std::fs::remove_file(&out);
    mpi::parse_rows(&text, van)
}

/// With `--alloc`, an IPC arena that holds the largest buffer beside the default arena.
pub(crate) fn arena_for(o: &Options) -> (String, String) {
    let largest = o.sizes.iter().copied().max().unwrap_or(0);
    let bytes = largest + van_core::config::DEFAULT_IPC_ARENA_BYTES;
    ("VANS_IPC_ARENA_BYTES".into(), bytes.to_string())
}

fn size_label(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn print_table(rows: &[Row]) {
    let mut table = Table::new(&[
        "collective",
        "van",
        "ranks",
        "size",
        "vans p50",
        "vans algbw",
        "vans busbw",
        "MPI p50",
        "MPI busbw",
        "busbw vans/MPI",
        "p50 vans/MPI",
    ]);
    for v in rows.iter().filter(|r| r.imp == "vans") {
        let m = v.peer(rows, "mpi");
        let us = |s: f64| format!("{:.1} µs", s * 1e6);
        let gbs = |g: f64| format!("{g:.3} GB/s");
        table.row(vec![
            v.op.clone(),
            v.van.clone(),
            v.ranks.to_string(),
            size_label(v.bytes),
            us(v.p50_s),
            gbs(v.algbw()),
            gbs(v.busbw()),
            m.map_or("-".into(), |m| us(m.p50_s)),
            m.map_or("-".into(), |m| gbs(m.busbw())),
            m.map_or("-".into(), |m| format!("{:.2}", v.busbw() / m.busbw())),
            m.map_or("-".into(), |m| format!("{:.2}", v.p50_s / m.p50_s)),
        ]);
    }
    print!("{table}");
}

/// `--json`: one object per vans row, with Open MPI's figures and the ratios when measured.
fn print_json(rows: &[Row], hosts: usize) {
    for v in rows.iter().filter(|r| r.imp == "vans") {
        let mut row = serde_json::json!({
            "collective": v.op,
            "van": v.van,
            "ranks": v.ranks,
            "hosts": hosts,
            "bytes": v.bytes,
            "p50_s": v.p50_s,
            "mean_s": v.mean_s,
            "algbw_gbs": v.algbw(),
            "busbw_gbs": v.busbw(),
        });
        if let (Some(m), Some(fields)) = (v.peer(rows, "mpi"), row.as_object_mut()) {
            fields.insert("mpi_p50_s".into(), m.p50_s.into());
            fields.insert("mpi_busbw_gbs".into(), m.busbw().into());
            fields.insert("busbw_ratio".into(), (v.busbw() / m.busbw()).into());
            fields.insert("p50_ratio".into(), (v.p50_s / m.p50_s).into());
        }
        println!("{row}");
    }
}

/// Bus bandwidth against size, one line per (implementation, van, ranks).
fn plot(rows: &[Row], path: &Path) -> Result<(), BoxError> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| "the embedded DejaVu Sans font did not load")?;
    let mut keys: Vec<(String, String, usize, String)> = rows
        .iter()
        .map(|r| (r.imp.clone(), r.van.clone(), r.ranks, r.op.clone()))
        .collect();
    keys.sort();
    keys.dedup();
    let max_bw = rows.iter().map(Row::busbw).fold(0.0f64, f64::max).max(1e-3) * 1.1;
    let (lo, hi) = rows.iter().fold((u32::MAX, 0u32), |(lo, hi), r| {
        let p = r.bytes.max(1).ilog2();
        (lo.min(p), hi.max(p))
    });
    let root = BitMapBackend::new(path, (1400, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "collectives' bus bandwidth: vans vs Open MPI",
            ("sans-serif", 28),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(lo..hi.max(lo + 1), 0.0..max_bw)?;
    chart
        .configure_mesh()
        .x_desc("buffer size")
        .y_desc("bus bandwidth, GB/s")
        .x_label_formatter(&|p| size_label(1usize << p))
        .label_style(("sans-serif", 16))
        .draw()?;
    // One color per (collective, van, ranks); vans thick, Open MPI thin.
    let mut configs: Vec<(&str, &str, usize)> = keys
        .iter()
        .map(|k| (k.3.as_str(), k.1.as_str(), k.2))
        .collect();
    configs.sort_unstable();
    configs.dedup();
    for (imp, van, ranks, op) in &keys {
        let index = configs
            .iter()
            .position(|c| *c == (op.as_str(), van.as_str(), *ranks))
            .unwrap_or(0);
        let color = Palette99::pick(index).to_rgba();
        let mut points: Vec<(u32, f64)> = rows
            .iter()
            .filter(|r| &r.imp == imp && &r.van == van && r.ranks == *ranks && &r.op == op)
            .map(|r| (r.bytes.max(1).ilog2(), r.busbw()))
            .collect();
        points.sort_by_key(|p| p.0);
        let style = ShapeStyle::from(color).stroke_width(if imp == "vans" { 3 } else { 1 });
        chart
            .draw_series(LineSeries::new(points.clone(), style))?
            .label(format!("{imp} {op} {van} {ranks} ranks"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// `--explain`: the algorithm of each (collective, van, ranks, size), as every rank's
/// communicator chooses it with this environment (`collective::choose`; over `ipc` the ranks
/// share their host's memory), then the rows of the selection table those choices came
/// from, with the measurements behind them. `--json`: one object per cell instead.
fn explain(o: &Options) -> Result<(), BoxError> {
    let config = van_core::Config::from_env()?;
    let options = collective::CommOptions::from_config(&config);
    let mut used: Vec<&'static collective::select::Row> = Vec::new();
    if !o.json {
        println!(
            "algorithm by collective, van, ranks and size on {} host(s) \
             (VANS_COLLECTIVE_ALGO={}, VANS_COLLECTIVE_DIRECT_BYTES={}, \
             VANS_COLLECTIVE_MESH={}):",
            o.hosts,
            options.algorithm,
            options.direct_bytes,
            u8::from(options.mesh)
        );
    }
    for name in &o.collectives {
        let collective: collective::Collective = name.parse()?;
        let columns: Vec<(&str, usize)> = o
            .van
            .iter()
            .flat_map(|van| o.ranks.iter().map(move |&n| (van.as_str(), n)))
            .collect();
        let header: Vec<String> = std::iter::once(collective.to_string())
            .chain(columns.iter().map(|(van, n)| format!("{van}, {n} ranks")))
            .collect();
        let mut table = Table::new(&header.iter().map(String::as_str).collect::<Vec<_>>());
        for &size in &o.sizes {
            let mut row = vec![size_label(size)];
            for &(van, n) in &columns {
                let cell = explain_cell(o, &options, &config, collective, van, n, size);
                if let Some(r) = cell
                    .row
                    .filter(|r| !used.iter().any(|u| std::ptr::eq(*u, *r)))
                {
                    used.push(r);
                }
                match o.json {
                    true => println!(
                        "{}",
                        serde_json::json!({
                            "collective": collective.as_str(), "van": van, "ranks": n,
                            "hosts": o.hosts, "bytes": size,
                            "algorithm": cell.algorithm.as_str(),
                            "between_hosts": cell.between.map(|a| a.as_str()),
                            "path": cell.path,
                        })
                    ),
                    false => row.push(cell.to_string()),
                }
            }
            table.row(row);
        }
        if !o.json {
            println!("{table}");
        }
    }
    if !o.json {
        println!("from these rows of the selection table (collective::select::TABLE):");
        for (i, r) in collective::select::TABLE.iter().enumerate() {
            if used.iter().any(|u| std::ptr::eq(*u, r)) {
                println!("  row {i}: {r}\n      {}", r.measured);
            }
        }
    }
    Ok(())
}

/// One cell of `--explain`: the algorithm, the between-hosts one of a hierarchical
/// all-reduce, how messages travel, and the table's row (none when told).
struct Cell {
    algorithm: collective::Algorithm,
    between: Option<collective::Algorithm>,
    path: &'static str,
    row: Option<&'static collective::select::Row>,
}

impl std::fmt::Display for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.between {
            Some(between) => write!(f, "{}: {between} ({})", self.algorithm, self.path),
            None if self.path.is_empty() => write!(f, "{}", self.algorithm),
            None => write!(f, "{} ({})", self.algorithm, self.path),
        }
    }
}

fn explain_cell(
    o: &Options,
    options: &collective::CommOptions,
    config: &van_core::Config,
    collective: collective::Collective,
    van: &str,
    n: usize,
    size: usize,
) -> Cell {
    use collective::{select, Algorithm, Layout};
    // The ranks in order, `n / hosts` on each host (the bench places them so).
    let per_host = vec![n / o.hosts.max(1); o.hosts.max(1)];
    let shared_memory = cfg!(feature = "ipc") && van == "ipc" && config.enable_ipc;
    let layout = Layout::of_hosts(shared_memory, &per_host);
    let algorithm = collective::choose(options, collective, layout, size, n);
    let told = options.algorithm.of(collective) != Algorithm::Auto;
    let row = (!told)
        .then(|| select::row(options, collective, layout, size, n))
        .flatten();
    // Over a stream van the ranks' direct connections (the mesh) carry the messages.
    let path = if options.mesh { "mesh" } else { "vans" };
    match (algorithm, layout) {
        (Algorithm::Shm, Layout::OneHost) => Cell {
            algorithm,
            between: None,
            path: "",
            row,
        },
        // Each rank's share between the hosts, by messages.
        (Algorithm::Hier, Layout::EvenHosts) => {
            let share = size.div_ceil(per_host[0].max(1));
            let between = select::by_messages(options, collective, share, o.hosts);
            Cell {
                algorithm,
                between: Some(between),
                path,
                row,
            }
        }
        // Told shared memory where there is none: the collective fails, saying why.
        (Algorithm::Shm | Algorithm::Hier, _) => Cell {
            algorithm,
            between: None,
            path: "fails: not so placed",
            row,
        },
        _ => Cell {
            algorithm,
            between: None,
            path,
            row,
        },
    }
}
