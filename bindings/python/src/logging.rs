//! `logging`: vans' log records (the `tracing` events of the Rust code) into Python's
//! `logging`, under the logger `vans` (`vans.node.member`, `vans.van_tcp.van`, ...).
//!
//! The Rust side never calls Python from an event: an event is formatted where it happens
//! and queued (bounded; when full, records are dropped and counted, never waited for), and a
//! daemon thread of the `vans` package takes them (`_next_log_records`, without the GIL) and
//! hands them to `logging`. An I/O thread that logs while a Python thread holds the GIL and
//! waits on it can therefore not deadlock. Which records are kept follows the more verbose
//! of `PS_VERBOSE` (unset: warnings; 1: info; 2: debug) and the `vans` logger's level,
//! which that thread passes down (`_set_log_level`) each time it wakes; each call site's
//! decision is cached, and taken again only when that level changes.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// Records waiting for the Python thread, at most this many.
const QUEUE: usize = 4096;

/// Python's levels: DEBUG 10, INFO 20, WARNING 30, ERROR 40.
fn python_level(level: &Level) -> u8 {
    match *level {
        Level::TRACE => 5,
        Level::DEBUG => 10,
        Level::INFO => 20,
        Level::WARN => 30,
        Level::ERROR => 40,
    }
}

/// The bridge's state: the queue, the lowest level kept, the records dropped.
struct Bridge {
    records: Mutex<std::collections::VecDeque<(u8, String, String)>>,
    ready: std::sync::Condvar,
    /// Python level: records below it are not formatted.
    threshold: AtomicU8,
    /// The level `PS_VERBOSE` asks for; the logger's level can only lower the threshold.
    verbose: u8,
    dropped: AtomicU64,
}

fn bridge() -> &'static Bridge {
    static BRIDGE: OnceLock<Bridge> = OnceLock::new();
    BRIDGE.get_or_init(|| {
        let verbose = match std::env::var("PS_VERBOSE").as_deref() {
            Ok("2") => 10,
            Ok("1") => 20,
            _ => 30,
        };
        Bridge {
            records: Mutex::new(std::collections::VecDeque::new()),
            ready: std::sync::Condvar::new(),
            threshold: AtomicU8::new(verbose),
            verbose,
            dropped: AtomicU64::new(0),
        }
    })
}

/// Whether records of `level` are kept at the current threshold.
fn kept(level: &Level) -> bool {
    python_level(level) >= bridge().threshold.load(Ordering::Relaxed)
}

/// The message and fields of an event, as one line.
#[derive(Default)]
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            self.record_debug(field, &value);
        }
    }
}

/// The `tracing` layer that queues records for Python.
struct ToPython;

impl<S: Subscriber> Layer<S> for ToPython {
    /// Decided once per call site, so a disabled event on a hot path costs what it costs
    /// without the bridge; [`_set_log_level`] has the decisions taken again when the level
    /// changes.
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if kept(metadata.level()) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        use tracing::level_filters::LevelFilter;
        Some(match bridge().threshold.load(Ordering::Relaxed) {
            0..=5 => LevelFilter::TRACE,
            6..=10 => LevelFilter::DEBUG,
            11..=20 => LevelFilter::INFO,
            21..=30 => LevelFilter::WARN,
            _ => LevelFilter::ERROR,
        })
    }

    fn enabled(&self, metadata: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
        kept(metadata.level())
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let mut line = Line::default();
        event.record(&mut line);
        let bridge = bridge();
        let mut records = bridge.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.len() >= QUEUE {
            bridge.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let target = meta.target().replace("::", ".");
        records.push_back((python_level(meta.level()), target, line.0));
        bridge.ready.notify_one();
    }
}

/// Installs the layer as the process's subscriber, once; false if another was there first
/// (an embedding program's own), which then gets the records instead.
pub(crate) fn install() -> bool {
    bridge();
    tracing_subscriber::registry()
        .with(ToPython)
        .try_init()
        .is_ok()
}

/// Waits up to `timeout` seconds (without the GIL) for records; returns them as
/// `(level, logger suffix, message)` and how many were dropped since the last call.
#[pyfunction]
pub(crate) fn _next_log_records(py: Python<'_>, timeout: f64) -> (Vec<(u8, String, String)>, u64) {
    let wait = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::ZERO);
    py.detach(|| {
        let bridge = bridge();
        let records = bridge.records.lock().unwrap_or_else(|e| e.into_inner());
        let (mut records, _) = bridge
            .ready
            .wait_timeout_while(records, wait, |r| r.is_empty())
            .unwrap_or_else(|e| e.into_inner());
        let taken: Vec<_> = records.drain(..).collect();
        (taken, bridge.dropped.swap(0, Ordering::Relaxed))
    })
}

/// The `vans` logger's effective level: records at or above the lower of it and
/// `PS_VERBOSE`'s level are kept.
#[pyfunction]
pub(crate) fn _set_log_level(level: u8) {
    let bridge = bridge();
    let threshold = level.min(bridge.verbose).max(1);
    if bridge.threshold.swap(threshold, Ordering::Relaxed) != threshold {
        // Call sites decided under the old level decide again.
        tracing::callsite::rebuild_interest_cache();
    }
}

/// The level `PS_VERBOSE` asks for, as Python's (30, 20 or 10).
#[pyfunction]
pub(crate) fn _verbose_level() -> u8 {
    bridge().verbose
}
