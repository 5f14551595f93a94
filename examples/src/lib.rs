//! Shared pieces of the vans example and benchmark binaries.
//!
//! - `van-bench` (src/bin/van-bench.rs): the TCP and in-process vans beside a raw socket.
//! - `ps-bench` (src/bin/ps-bench/): ps-lite's test_benchmark over the parameter server.
//! - `vans-soak` (src/bin/vans-soak/): a cluster under a chaos schedule, checking exact sums.

pub mod chaos; // the fault proxy, chaos schedule and garbage of vans-soak and the tests
pub mod cli; // value parsers the binaries' command lines share
pub mod netns; // hosts as network namespaces (allreduce-bench --hosts, the namespace tests)
pub mod plot; // ps-bench's PNG: goodput and latency against value size
pub mod raw; // the raw-socket reference every benchmark compares with
pub mod report; // ps-bench's results: each worker's, the cluster's totals, tables, JSON

use std::fmt;

/// The runtime of a benchmark process: `threads` 1 is a current-thread runtime (with several
/// nodes per machine, extra runtime threads mostly add cross-thread wake-ups), more a
/// multi-thread one with that many workers.
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder.enable_all().build()
}

/// SplitMix64 of `x`: a bijection of `u64` that spreads neighbouring values over the whole
/// range (ids over every server, seeds into unrelated streams).
pub fn splitmix64(x: u64) -> u64 {
    let x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `a / b`, or 0 when `b` is 0 (a failed or empty measurement).
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

/// A table printed aligned for people and as JSON for scripts.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells print empty, extra cells are kept).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The rows as a JSON array of objects keyed by column name.
    pub fn to_json(&self) -> String {
        let rows: Vec<String> = self
            .rows
            .iter()
            .map(|row| {
                let fields: Vec<String> = self
                    .header
                    .iter()
                    .zip(row)
                    .map(|(k, v)| format!("{}:{}", json_string(k), json_value(v)))
                    .collect();
                format!("{{{}}}", fields.join(","))
            })
            .collect();
        format!("[{}]", rows.join(","))
    }
}

/// A cell as JSON: a number when it parses as one (a trailing `x` is dropped), else a string.
fn json_value(cell: &str) -> String {
    let number = cell.strip_suffix('x').unwrap_or(cell);
    match number.parse::<f64>() {
        Ok(n) if n.is_finite() => number.to_owned(),
        _ => json_string(cell),
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: &[String]| {
            let padded: Vec<String> = (0..columns)
                .map(|i| {
                    let cell = cells.get(i).map_or("", String::as_str);
                    format!("{cell:<width$}", width = widths[i])
                })
                .collect();
            writeln!(f, "| {} |", padded.join(" | "))
        };
        line(f, &self.header)?;
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        writeln!(f, "| {} |", rule.join(" | "))?;
        for row in &self.rows {
            line(f, row)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_prints_aligned_and_as_json() {
        let mut t = Table::new(&["case", "value"]);
        t.row(vec!["a \"b\"".into(), "1.50x".into()]);
        t.row(vec!["long name".into(), "n/a".into()]);
        let text = t.to_string();
        assert!(text.contains("| long name | n/a   |"), "{text}");
        assert_eq!(
            t.to_json(),
            r#"[{"case":"a \"b\"","value":1.50},{"case":"long name","value":"n/a"}]"#
        );
        assert_eq!(ratio(1.0, 0.0), 0.0);
    }
}
