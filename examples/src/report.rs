//! ps-bench's results: what each worker measured, the cluster-wide totals, and the tables and
//! JSON document they are shown as.
//!
//! A worker measures its own cases into a [`WorkerReport`]. The process that launched the
//! cluster gathers every worker's report into a [`RunReport`] (per case: each worker's row and
//! the cluster's total), once per van of the invocation, and prints the [`BenchReport`]: as
//! tables (its `Display`) or as one JSON document (`ps-bench --json`).
//!
//! ```
//! use examples::report::{Case, Figures, Mode, RunReport, WorkerCase, WorkerReport};
//! use std::time::Duration;
//!
//! let case = Case { mode: Mode::Push, size: 8, window: 1, keys: 1 };
//! let worker = |rank: u32, ops: u64| WorkerReport {
//!     worker: rank,
//!     van: Some("tcp".into()),
//!     cases: vec![WorkerCase {
//!         case,
//!         figures: Figures::measure(case, ops, Duration::from_secs(1), &mut vec![40, 60], None),
//!     }],
//!     ..WorkerReport::default()
//! };
//! let run = RunReport::gather("tcp", vec![worker(1, 300), worker(0, 100)], None, None);
//! assert_eq!(run.cases[0].total.ops_per_s, 400.0);
//! assert_eq!(run.cases[0].workers[0].worker, 0);
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Table;

/// What every request of a case does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Push values (the servers sum them).
    Push,
    /// Pull values.
    Pull,
    /// Push, then pull the new sum, in one request.
    PushPull,
}

impl Mode {
    /// Every mode, in the order ps-bench runs them.
    pub const ALL: [Mode; 3] = [Mode::Push, Mode::Pull, Mode::PushPull];

    /// The name in tables, JSON and `--mode`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Push => "push",
            Mode::Pull => "pull",
            Mode::PushPull => "pushpull",
        }
    }

    /// Value bytes one request of `size`-byte values moves: push-pull moves them both ways.
    pub fn bytes_moved(self, size: u64) -> u64 {
        match self {
            Mode::PushPull => 2 * size,
            Mode::Push | Mode::Pull => size,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One case: mode × value bytes per request × requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Case {
    /// What each request does.
    pub mode: Mode,
    /// Value bytes per request.
    pub size: u64,
    /// Requests kept in flight.
    pub window: u64,
    /// Keys per request (1, as in ps-lite, except in ps-bench's sparse mode).
    #[serde(default = "one_key")]
    pub keys: u64,
}

fn one_key() -> u64 {
    1
}

/// The figures of one case, for one worker or for the whole cluster.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Requests answered.
    pub ops: u64,
    /// Value bytes those requests moved.
    pub bytes: u64,
    /// Seconds the case ran (a total: the longest worker's).
    pub seconds: f64,
    /// Requests answered per second (a total: the sum over the workers).
    pub ops_per_s: f64,
    /// Goodput, value bytes moved per second in GB/s of 10^9 bytes (a total: the sum).
    pub gb_per_s: f64,
    /// Median latency of a request in µs (a total: the worst worker's).
    pub p50_us: u64,
    /// 99th percentile latency in µs (a total: the worst worker's).
    pub p99_us: u64,
    /// CPU seconds of every node process of the cluster during the case, read from /proc
    /// by worker 0 alone over its barrier-aligned case; `None` on other workers and when
    /// the nodes were not started by a launcher (in-process or by hand). A total takes the
    /// largest reading.
    pub cluster_cpu_s: Option<f64>,
    /// `cluster_cpu_s` per GB of values moved; only in a total (every worker reads the
    /// same cluster, whose CPU serves them all).
    pub cpu_s_per_gb: Option<f64>,
    /// `cluster_cpu_s` per request, in µs; only in a total.
    pub cpu_us_per_op: Option<f64>,
}

impl Figures {
    /// The figures of `ops` requests of `case` answered in `elapsed`, from their latencies
    /// (sorted here).
    pub fn measure(
        case: Case,
        ops: u64,
        elapsed: std::time::Duration,
        latencies_us: &mut [u32],
        cluster_cpu_s: Option<f64>,
    ) -> Figures {
        latencies_us.sort_unstable();
        let percentile = |p: f64| {
            let last = latencies_us.len().saturating_sub(1);
            let at = ((latencies_us.len() as f64 * p) as usize).min(last);
            latencies_us.get(at).map_or(0, |us| u64::from(*us))
        };
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let bytes = ops.saturating_mul(case.mode.bytes_moved(case.size));
        Figures {
            ops,
            bytes,
            seconds,
            ops_per_s: ops as f64 / seconds,
            gb_per_s: bytes as f64 / seconds / 1e9,
            p50_us: percentile(0.5),
            p99_us: percentile(0.99),
            cluster_cpu_s,
            cpu_s_per_gb: None,
            cpu_us_per_op: None,
        }
    }

    /// The cluster's total of the workers' figures of one case: requests, bytes, ops/s and
    /// GB/s summed; latency and CPU the largest worker's (see the fields).
    pub fn total<'a>(workers: impl IntoIterator<Item = &'a Figures>) -> Figures {
        let mut total = Figures {
            ops: 0,
            bytes: 0,
            seconds: 0.0,
            ops_per_s: 0.0,
            gb_per_s: 0.0,
            p50_us: 0,
            p99_us: 0,
            cluster_cpu_s: None,
            cpu_s_per_gb: None,
            cpu_us_per_op: None,
        };
        for w in workers {
            total.ops += w.ops;
            total.bytes += w.bytes;
            total.seconds = total.seconds.max(w.seconds);
            total.ops_per_s += w.ops_per_s;
            total.gb_per_s += w.gb_per_s;
            total.p50_us = total.p50_us.max(w.p50_us);
            total.p99_us = total.p99_us.max(w.p99_us);
            total.cluster_cpu_s = match (total.cluster_cpu_s, w.cluster_cpu_s) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
        total.cpu_s_per_gb = total
            .cluster_cpu_s
            .map(|cpu| cpu / (total.bytes as f64 / 1e9).max(1e-12));
        total.cpu_us_per_op = total
            .cluster_cpu_s
            .map(|cpu| cpu * 1e6 / (total.ops as f64).max(1.0));
        total
    }

    /// The table cells after the case's: ops/s, GB/s, p50 µs, p99 µs, and for a total CPU
    /// s/GB, CPU µs/op (empty in one worker's row of several).
    fn cells(&self, total: bool) -> Vec<String> {
        let mut cells = vec![
            format!("{:.0}", self.ops_per_s),
            format!("{:.3}", self.gb_per_s),
            self.p50_us.to_string(),
            self.p99_us.to_string(),
        ];
        if total {
            cells.push(optional(self.cpu_s_per_gb, 2));
            cells.push(optional(self.cpu_us_per_op, 1));
        }
        cells
    }
}

/// The plural ending of a count: `1 server`, `2 servers`.
pub fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `value` with `precision` decimals, or `n/a`.
fn optional(value: Option<f64>, precision: usize) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.precision$}"))
}

/// One case as one worker measured it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorkerCase {
    /// Which case.
    #[serde(flatten)]
    pub case: Case,
    /// What this worker measured.
    #[serde(flatten)]
    pub figures: Figures,
}

/// One figure of the raw TCP socket reference, measured by worker 0 in the same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RawFigure {
    /// `ping-pong` or `stream`.
    pub name: String,
    /// Payload bytes per message.
    pub size: u64,
    /// Messages in flight.
    pub window: u64,
    /// The figure, in `unit`.
    pub figure: f64,
    /// `µs/op`, `ops/s` or `GB/s`.
    pub unit: String,
}

/// What a worker of `--mode check` verified.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckOutcome {
    /// The worker's rank.
    pub worker: u32,
    /// Keys whose exact sums it read back.
    pub keys: u64,
    /// The van that carries its traffic to each server, by server rank.
    pub routes: Vec<String>,
    /// Where its pushed values lived with `--zero-copy` (`ipc` for the shared arena, else
    /// `ordinary`).
    pub memory: Option<String>,
}

/// When a worker of `--mode barrier` arrived at the barrier and left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierTimes {
    /// The worker's rank.
    pub worker: u32,
    /// Milliseconds since the Unix epoch at arrival.
    pub arrived_ms: u64,
    /// Milliseconds since the Unix epoch at release.
    pub released_ms: u64,
}

/// Everything one worker measured: what a worker launched by ps-bench writes to the results
/// directory, and what a worker started by hand prints with `--json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The worker's rank.
    pub worker: u32,
    /// The van that carried its traffic to server 0, when it had any.
    pub van: Option<String>,
    /// Its benchmark cases, in the order run.
    #[serde(default)]
    pub cases: Vec<WorkerCase>,
    /// The raw-socket reference (worker 0 only, without `--no-raw`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw: Vec<RawFigure>,
    /// `--mode check`: what it verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckOutcome>,
    /// `--mode barrier`: when it arrived and left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub barrier: Option<BarrierTimes>,
    /// Sparse mode: user-space copies of pulled value bytes on the worker, per byte pulled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies_per_pulled_byte: Option<f64>,
    /// Seconds from the cluster's launch until this worker had joined (held the node
    /// table); `None` when the launch time is unknown (a hand-started node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_s: Option<f64>,
}

/// One worker's figures of a case, in a [`CaseReport`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorkerFigures {
    /// The worker's rank.
    pub worker: u32,
    /// What it measured.
    #[serde(flatten)]
    pub figures: Figures,
}

/// One case over the whole cluster: each worker's figures and their total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseReport {
    /// Which case.
    #[serde(flatten)]
    pub case: Case,
    /// Each worker's figures, by rank.
    pub workers: Vec<WorkerFigures>,
    /// The cluster's total ([`Figures::total`] of the workers').
    pub total: Figures,
}

/// One launch of the cluster: every case with each worker's row and the total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The van that carried the traffic (`tcp`, `uring`, `ipc`, `inproc`).
    pub van: String,
    /// Seconds from launch until every node exited.
    pub elapsed_s: Option<f64>,
    /// Seconds from launch until the cluster was formed: the last worker to join held the
    /// node table (which the scheduler sends once every node has registered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub formed_s: Option<f64>,
    /// CPU seconds of every node process over the whole run; `None` in one process.
    pub cpu_s: Option<f64>,
    /// In one process (`--van inproc`): the process's peak resident memory, MB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_mb: Option<f64>,
    /// Every case, in the order run.
    pub cases: Vec<CaseReport>,
    /// The raw-socket reference worker 0 measured in this run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw: Vec<RawFigure>,
    /// `--mode check`: what each worker verified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckOutcome>,
    /// `--mode barrier`: each worker's arrival and release.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub barriers: Vec<BarrierTimes>,
    /// Sparse mode: the workers' largest count of user-space copies per pulled byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies_per_pulled_byte: Option<f64>,
}

impl RunReport {
    /// Gathers the workers' reports of one run (in any order) into cases with totals. The
    /// cases are those of the lowest rank, in its order; every worker runs the same ones.
    pub fn gather(
        van: &str,
        mut reports: Vec<WorkerReport>,
        elapsed_s: Option<f64>,
        cpu_s: Option<f64>,
    ) -> RunReport {
        reports.sort_by_key(|r| r.worker);
        let order: Vec<Case> = reports
            .first()
            .map(|r| r.cases.iter().map(|c| c.case).collect())
            .unwrap_or_default();
        let cases = order
            .into_iter()
            .map(|case| {
                let workers: Vec<WorkerFigures> = reports
                    .iter()
                    .filter_map(|r| {
                        let found = r.cases.iter().find(|c| c.case == case)?;
                        Some(WorkerFigures {
                            worker: r.worker,
                            figures: found.figures,
                        })
                    })
                    .collect();
                let total = Figures::total(workers.iter().map(|w| &w.figures));
                CaseReport {
                    case,
                    workers,
                    total,
                }
            })
            .collect();
        RunReport {
            van: van.to_owned(),
            elapsed_s,
            formed_s: reports.iter().filter_map(|r| r.joined_s).reduce(f64::max),
            cpu_s,
            peak_rss_mb: None,
            cases,
            raw: reports.iter().flat_map(|r| r.raw.clone()).collect(),
            checks: reports.iter().filter_map(|r| r.check.clone()).collect(),
            barriers: reports.iter().filter_map(|r| r.barrier).collect(),
            copies_per_pulled_byte: reports
                .iter()
                .filter_map(|r| r.copies_per_pulled_byte)
                .reduce(f64::max),
        }
    }

    /// Whether some case has more than one worker's row (then the table has a `worker`
    /// column and a total row per case).
    pub fn several_workers(&self) -> bool {
        self.cases.iter().any(|c| c.workers.len() > 1)
    }

    /// The cases as a table: one row per case with one worker; each worker's row then a
    /// `total` row with several.
    pub fn table(&self) -> Table {
        let several = self.several_workers();
        // Multi-key requests (the sparse mode) also say keys per request and keys/s.
        let sparse = self.cases.iter().any(|c| c.case.keys > 1);
        let mut header = vec!["mode", "size", "in flight"];
        if sparse {
            header.insert(2, "keys");
        }
        if several {
            header.push("worker");
        }
        if sparse {
            header.push("keys/s");
        }
        header.extend(["ops/s", "GB/s", "p50 µs", "p99 µs", "CPU s/GB", "CPU µs/op"]);
        let mut table = Table::new(&header);
        for c in &self.cases {
            let mut case = vec![
                c.case.mode.name().to_owned(),
                c.case.size.to_string(),
                c.case.window.to_string(),
            ];
            if sparse {
                case.insert(2, c.case.keys.to_string());
            }
            let row = |who: Option<String>, figures: &Figures, total: bool| {
                let mut row = case.clone();
                row.extend(who);
                if sparse {
                    row.push(format!("{:.0}", figures.ops_per_s * c.case.keys as f64));
                }
                row.extend(figures.cells(total));
                row
            };
            if !several {
                table.row(row(None, &c.total, true));
                continue;
            }
            for w in &c.workers {
                table.row(row(Some(w.worker.to_string()), &w.figures, false));
            }
            table.row(row(Some("total".to_owned()), &c.total, true));
        }
        table
    }

    /// The raw-socket reference as a table, when it was measured.
    pub fn raw_table(&self) -> Option<Table> {
        if self.raw.is_empty() {
            return None;
        }
        let mut table = Table::new(&["raw tcp socket", "size", "in flight", "figure", "unit"]);
        for r in &self.raw {
            table.row(vec![
                r.name.clone(),
                r.size.to_string(),
                r.window.to_string(),
                format!("{:.3}", r.figure),
                r.unit.clone(),
            ]);
        }
        Some(table)
    }
}

/// What one ps-bench invocation measured: the cluster once per van. `ps-bench --json`
/// prints this as one JSON document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// Servers of the cluster.
    pub servers: u32,
    /// Workers of the cluster.
    pub workers: u32,
    /// One run per van, in the order of `--van`.
    pub runs: Vec<RunReport>,
}

/// Picks one figure out of a case's [`Figures`].
type Pick = fn(&Figures) -> Option<f64>;

/// What a total row means, printed under a table that has one.
pub const TOTAL_MEANS: &str = "total: ops/s and GB/s summed over the workers, p50/p99 µs the \
                               worst worker's, CPU the whole cluster's during the case";

impl BenchReport {
    /// With several runs, every case's totals side by side: each van's ops/s, GB/s and the
    /// cluster's CPU per GB and per request, with the ratio of each van to the first.
    pub fn comparison_table(&self) -> Option<Table> {
        let (first, others) = self.runs.split_first()?;
        if others.is_empty() {
            return None;
        }
        let mut header = vec!["mode".to_owned(), "size".to_owned(), "in flight".to_owned()];
        for figure in ["ops/s", "GB/s", "CPU s/GB", "CPU µs/op"] {
            for run in &self.runs {
                header.push(format!("{figure} {}", run.van));
            }
            if figure != "CPU µs/op" {
                for run in others {
                    header.push(format!("{}/{}", run.van, first.van));
                }
            }
        }
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        let mut table = Table::new(&header);
        for base in &first.cases {
            let totals: Vec<Option<&Figures>> = self
                .runs
                .iter()
                .map(|run| {
                    run.cases
                        .iter()
                        .find(|c| c.case == base.case)
                        .map(|c| &c.total)
                })
                .collect();
            let mut cells = vec![
                base.case.mode.name().to_owned(),
                base.case.size.to_string(),
                base.case.window.to_string(),
            ];
            // (figure, decimals, with a ratio column)
            let figures: [(Pick, usize, bool); 4] = [
                (|f| Some(f.ops_per_s), 0, true),
                (|f| Some(f.gb_per_s), 3, true),
                (|f| f.cpu_s_per_gb, 2, true),
                (|f| f.cpu_us_per_op, 1, false),
            ];
            for (figure, precision, with_ratio) in figures {
                let values: Vec<Option<f64>> = totals.iter().map(|t| t.and_then(figure)).collect();
                cells.extend(values.iter().map(|v| optional(*v, precision)));
                if with_ratio {
                    for v in &values[1..] {
                        cells.push(match (values[0], v) {
                            (Some(a), Some(b)) if a > 0.0 => format!("{:.2}x", b / a),
                            _ => "n/a".into(),
                        });
                    }
                }
            }
            table.row(cells);
        }
        Some(table)
    }
}

/// The tables a person reads: each run's cases (with each worker's row and a total when
/// several workers ran) and its raw reference, then the side-by-side comparison when several
/// vans ran. Nothing for `--mode check` or `barrier`, whose workers print their own lines.
impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for run in &self.runs {
            if !run.cases.is_empty() {
                writeln!(
                    f,
                    "ps-bench over {}: {} server{}, {} worker{}:",
                    run.van,
                    self.servers,
                    plural(self.servers),
                    self.workers,
                    plural(self.workers),
                )?;
                write!(f, "{}", run.table())?;
                if run.several_workers() {
                    writeln!(f, "({TOTAL_MEANS})")?;
                }
                if let Some(formed) = run.formed_s {
                    writeln!(
                        f,
                        "cluster formed in {formed:.3} s (launch until the last worker \
                         joined)"
                    )?;
                }
                if let (Some(elapsed), Some(rss)) = (run.elapsed_s, run.peak_rss_mb) {
                    writeln!(
                        f,
                        "{} nodes in one process: {elapsed:.2} s from start to stop, peak \
                         resident memory {rss:.0} MB",
                        1 + self.servers + self.workers
                    )?;
                }
                if let Some(copies) = run.copies_per_pulled_byte {
                    writeln!(
                        f,
                        "user-space copies per pulled byte on a worker: {copies:.3} (each \
                         server's answer placed once into the caller's buffer)"
                    )?;
                }
            }
            if let Some(raw) = run.raw_table() {
                write!(f, "reference, same run:\n{raw}")?;
            }
        }
        if let (Some(table), Some(first)) = (self.comparison_table(), self.runs.first()) {
            let cpu: Vec<String> = self
                .runs
                .iter()
                .map(|r| format!("{} {}", r.van, optional(r.cpu_s, 2)))
                .collect();
            write!(
                f,
                "side by side, same invocation (the cluster's totals; ratios: to {}; CPU: every \
                 node process of the cluster during the case; CPU seconds of whole runs: {}):\n\
                 {table}",
                first.van,
                cpu.join(", ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::time::Duration;

    fn worker(rank: u32, ops: u64, latencies: &[u32], cpu: Option<f64>) -> WorkerReport {
        let cases = [Mode::Push, Mode::PushPull]
            .into_iter()
            .map(|mode| {
                let case = Case {
                    mode,
                    size: 1000,
                    window: 4,
                    keys: 1,
                };
                WorkerCase {
                    case,
                    figures: Figures::measure(
                        case,
                        ops,
                        Duration::from_secs(2),
                        &mut latencies.to_vec(),
                        cpu,
                    ),
                }
            })
            .collect();
        WorkerReport {
            worker: rank,
            van: Some("tcp".into()),
            cases,
            ..WorkerReport::default()
        }
    }

    #[test]
    fn totals_sum_rates_and_take_the_worst_latency_and_the_largest_cpu_reading() {
        let run = RunReport::gather(
            "tcp",
            vec![
                worker(1, 3000, &[10, 20, 30, 900], Some(1.0)),
                worker(0, 1000, &[50, 60, 70, 80], Some(2.0)),
            ],
            None,
            None,
        );
        assert_eq!(run.cases.len(), 2);
        let push = &run.cases[0];
        assert_eq!(push.case.mode, Mode::Push);
        assert_eq!(
            push.workers.iter().map(|w| w.worker).collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(push.total.ops, 4000);
        assert_eq!(push.total.ops_per_s, 2000.0);
        assert_eq!(push.total.bytes, 4_000_000);
        assert!((push.total.gb_per_s - 0.002).abs() < 1e-12);
        assert_eq!((push.total.p50_us, push.total.p99_us), (70, 900));
        assert_eq!(push.total.cluster_cpu_s, Some(2.0));
        assert_eq!(push.total.cpu_s_per_gb, Some(2.0 / 0.004));
        // Push-pull moves the values both ways.
        assert_eq!(run.cases[1].total.bytes, 8_000_000);
        let text = run.table().to_string();
        assert!(text.contains("| worker |"), "{text}");
        assert!(text.contains("| total "), "{text}");
    }

    #[test]
    fn one_worker_prints_the_familiar_table_and_the_json_round_trips() {
        let run = RunReport::gather("tcp", vec![worker(0, 10, &[5], None)], None, None);
        let text = run.table().to_string();
        assert!(
            !text.contains("worker") && !text.contains("total"),
            "{text}"
        );
        assert!(text.contains("| push "), "{text}");
        assert!(text.contains("n/a"), "{text}");
        let report = BenchReport {
            servers: 1,
            workers: 1,
            runs: vec![run],
        };
        let json = serde_json::to_string(&report).unwrap();
        let back: BenchReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["runs"][0]["cases"][1]["mode"], "pushpull");
        assert_eq!(value["runs"][0]["cases"][0]["total"]["ops"], 10);
    }

    #[test]
    fn several_vans_are_compared_on_their_totals() {
        let report = BenchReport {
            servers: 1,
            workers: 2,
            runs: vec![
                RunReport::gather(
                    "tcp",
                    vec![worker(0, 100, &[1], None), worker(1, 100, &[1], None)],
                    None,
                    Some(1.0),
                ),
                RunReport::gather(
                    "uring",
                    vec![worker(0, 150, &[1], None), worker(1, 150, &[1], None)],
                    None,
                    Some(1.0),
                ),
            ],
        };
        let table = report.comparison_table().unwrap().to_string();
        assert!(
            table.contains("ops/s uring") && table.contains("uring/tcp"),
            "{table}"
        );
        // 2 workers × 50 ops/s against 2 × 75: the ratio of the totals.
        assert!(
            table.contains("| 100 ") && table.contains("| 150 "),
            "{table}"
        );
        assert!(table.contains("1.50x"), "{table}");
        assert!(report.to_string().contains("side by side"));
    }
}
