//! [`CollectiveSettings`]: the variables of the `collective` crate (`VANS_COLLECTIVE_*`),
//! parsed and checked with every other variable, so a communicator takes them from its node's
//! [`Config`](super::Config) and a bad value stops the node at start-up with an error naming
//! the variable, like any other.
//!
//! Sizes and durations are read as decimal numbers (`1e6` and `0.5` parse) and must be whole
//! bytes, or seconds in (0, 86400], within the ranges below.

use std::time::Duration;

use super::error::ConfigError;

/// Default largest message a collective sends (`VANS_COLLECTIVE_SLICE_BYTES`).
pub const DEFAULT_COLLECTIVE_SLICE_BYTES: usize = 256 << 10;
/// Default largest all-reduce sent to every rank at once (`VANS_COLLECTIVE_DIRECT_BYTES`).
pub const DEFAULT_COLLECTIVE_DIRECT_BYTES: usize = 64 << 10;
/// Default wait for every live worker to join a generation (`VANS_COLLECTIVE_SETTLE_WINDOW`).
pub const DEFAULT_COLLECTIVE_SETTLE_WINDOW: Duration = Duration::from_secs(5);
/// Default wait for one message of a collective (`VANS_COLLECTIVE_TIMEOUT`).
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(300);
/// Default time a rank spins on shared memory before it sleeps (`VANS_COLLECTIVE_SPIN_US`):
/// longer than a futex wake-up takes on a virtual machine (50–100 µs here), or ranks that
/// once slept fall into sleeping in turn (57 µs per 4 KiB all-gather on 2 ranks with 50 µs
/// of spinning, 0.5 µs with 1000).
pub const DEFAULT_COLLECTIVE_SPIN: Duration = Duration::from_micros(1000);

const GIB: usize = 1 << 30;
const LONGEST: Duration = Duration::from_secs(86_400);
const SLICE_EXPECTED: &str = "a whole number of bytes from 4096 to 1073741824 (1 GiB)";
const DIRECT_EXPECTED: &str =
    "a whole number of bytes up to 1073741824 (1 GiB; 0: never a latency-bound algorithm)";
const SECONDS_EXPECTED: &str = "a number of seconds in (0, 86400]";
const ALGORITHM_EXPECTED: &str = "auto, or comma-separated items ALGORITHM (every collective \
     that has it) or COLLECTIVE:ALGORITHM, later items win: allreduce takes auto, shm, hier, \
     direct, doubling, rabenseifner or ring; reduce_scatter auto, shm, direct, halving or ring; \
     all_gather auto, shm, direct, doubling or ring; broadcast auto, shm or ring; barrier auto, \
     shm, direct or doubling";
const SPIN_EXPECTED: &str = "a whole number of microseconds up to 1000000 (0: never spin)";
/// The longest spin `VANS_COLLECTIVE_SPIN_US` accepts.
const LONGEST_SPIN: Duration = Duration::from_secs(1);

/// How a collective is carried out (an item of `VANS_COLLECTIVE_ALGO`; which collectives
/// take which: [`CollectiveKind::algorithms`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CollectiveAlgorithm {
    /// By placement, size and rank count (`collective::choose`): `Shm` when every rank shares
    /// this host's memory; `Hier` when the ranks run on several hosts with the same number
    /// (2 or more) on each, sharing memory there; else up to `VANS_COLLECTIVE_DIRECT_BYTES`,
    /// `Doubling` on 4, 8, 16 … ranks and `Direct` on others; up to 512 KiB on 4 ranks or
    /// more, `Rabenseifner`; `Ring` beyond.
    #[default]
    Auto,
    /// Through one shared-memory segment the ranks map (every rank on this host, shared
    /// memory enabled): each rank copies its buffer in, reduces its share of every rank's in
    /// place and copies the result out, synchronised by counters in the segment. An error
    /// when the ranks cannot share memory.
    Shm,
    /// Hierarchical, for ranks on several hosts with the same number on each: a
    /// reduce-scatter through each host's shared memory (`Shm`), an all-reduce of each
    /// share between the hosts by messages (the ranks holding the same share on every
    /// host, so every rank's link carries a share), and an all-gather through each host's
    /// shared memory. An error when the ranks are not so placed.
    Hier,
    /// Every rank sends its whole buffer to every other and reduces all of them, in rank
    /// order: one message latency, `n - 1` buffers sent per rank.
    Direct,
    /// Recursive doubling: `log2 n` exchanges of the whole buffer with the rank whose
    /// number differs in one bit (the ranks beyond the largest power of two fold in first
    /// and get the result last).
    Doubling,
    /// Rabenseifner's: a reduce-scatter by recursive halving, then an all-gather by
    /// recursive doubling: the ring's bytes in `2 log2 n` steps instead of `2 (n - 1)`.
    Rabenseifner,
    /// Recursive halving (a reduce-scatter): `log2 n` exchanges of half the remaining
    /// buffer with the rank whose number differs in one bit.
    Halving,
    /// Reduce-scatter then all-gather around a ring, in slices: `2 (n - 1) / n` buffers
    /// sent per rank, `2 (n - 1)` latencies.
    Ring,
}

impl CollectiveAlgorithm {
    /// Every algorithm, in a fixed order.
    pub const ALL: [CollectiveAlgorithm; 8] = [
        CollectiveAlgorithm::Auto,
        CollectiveAlgorithm::Shm,
        CollectiveAlgorithm::Hier,
        CollectiveAlgorithm::Direct,
        CollectiveAlgorithm::Doubling,
        CollectiveAlgorithm::Rabenseifner,
        CollectiveAlgorithm::Halving,
        CollectiveAlgorithm::Ring,
    ];

    /// The variable's spelling: `auto`, `shm`, `hier`, `direct`, `doubling`,
    /// `rabenseifner`, `halving`, `ring`.
    pub fn as_str(self) -> &'static str {
        match self {
            CollectiveAlgorithm::Auto => "auto",
            CollectiveAlgorithm::Shm => "shm",
            CollectiveAlgorithm::Hier => "hier",
            CollectiveAlgorithm::Direct => "direct",
            CollectiveAlgorithm::Doubling => "doubling",
            CollectiveAlgorithm::Rabenseifner => "rabenseifner",
            CollectiveAlgorithm::Halving => "halving",
            CollectiveAlgorithm::Ring => "ring",
        }
    }

    /// Whether this algorithm sends messages (not `Auto`, `Shm` or `Hier`).
    pub fn by_messages(self) -> bool {
        !matches!(
            self,
            CollectiveAlgorithm::Auto | CollectiveAlgorithm::Shm | CollectiveAlgorithm::Hier
        )
    }
}

impl std::fmt::Display for CollectiveAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CollectiveAlgorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        CollectiveAlgorithm::ALL
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!(
                "{s}: expected auto, shm, hier, direct, doubling, rabenseifner, halving or ring"
            )
            })
    }
}

/// The collectives that choose an algorithm (`all_to_all` and point-to-point messages have
/// one way each), as `VANS_COLLECTIVE_ALGO` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// `allreduce`.
    AllReduce,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `all_gather`.
    AllGather,
    /// `broadcast`.
    Broadcast,
    /// `barrier`.
    Barrier,
}

impl CollectiveKind {
    /// Every kind, in the order of [`CollectiveAlgorithms`]' entries.
    pub const ALL: [CollectiveKind; 5] = [
        CollectiveKind::AllReduce,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllGather,
        CollectiveKind::Broadcast,
        CollectiveKind::Barrier,
    ];

    /// The variable's spelling: `allreduce`, `reduce_scatter`, `all_gather`, `broadcast`,
    /// `barrier` (read without `_` or `-` too).
    pub fn as_str(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "allreduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Barrier => "barrier",
        }
    }

    /// The algorithms this collective can be told to take (`Auto` besides).
    pub fn algorithms(self) -> &'static [CollectiveAlgorithm] {
        use CollectiveAlgorithm as A;
        match self {
            CollectiveKind::AllReduce => &[
                A::Shm,
                A::Hier,
                A::Direct,
                A::Doubling,
                A::Rabenseifner,
                A::Ring,
            ],
            CollectiveKind::ReduceScatter => &[A::Shm, A::Direct, A::Halving, A::Ring],
            CollectiveKind::AllGather => &[A::Shm, A::Direct, A::Doubling, A::Ring],
            CollectiveKind::Broadcast => &[A::Shm, A::Ring],
            CollectiveKind::Barrier => &[A::Shm, A::Direct, A::Doubling],
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CollectiveKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let name = s.trim().to_ascii_lowercase().replace(['_', '-'], "");
        CollectiveKind::ALL
            .into_iter()
            .find(|k| k.as_str().replace('_', "") == name)
            .ok_or_else(|| {
                format!("{s}: expected allreduce, reduce_scatter, all_gather, broadcast or barrier")
            })
    }
}

/// The algorithm each collective is told to take (`VANS_COLLECTIVE_ALGO`), `Auto` where
/// the selection table decides. Written as the variable is: `auto`; `ring` (every collective
/// that has a ring takes it, the others decide); `allreduce:ring,all_gather:direct`; items
/// apply in order, so `ring,broadcast:shm` rings all but broadcasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CollectiveAlgorithms([CollectiveAlgorithm; 5]);

impl CollectiveAlgorithms {
    /// `algorithm` for every collective that has it (`Auto` for the others).
    pub fn all(algorithm: CollectiveAlgorithm) -> CollectiveAlgorithms {
        let mut each = CollectiveAlgorithms::default();
        for kind in CollectiveKind::ALL {
            if kind.algorithms().contains(&algorithm) {
                each.0[kind.index()] = algorithm;
            }
        }
        each
    }

    /// These, with `kind` told to take `algorithm`: an error naming the item when `kind`
    /// cannot take it.
    pub fn with(
        mut self,
        kind: CollectiveKind,
        algorithm: CollectiveAlgorithm,
    ) -> Result<CollectiveAlgorithms, String> {
        if algorithm != CollectiveAlgorithm::Auto && !kind.algorithms().contains(&algorithm) {
            let takes: Vec<&str> = kind.algorithms().iter().map(|a| a.as_str()).collect();
            return Err(format!(
                "{kind}:{algorithm}: {kind} takes auto, {}",
                takes.join(", ")
            ));
        }
        self.0[kind.index()] = algorithm;
        Ok(self)
    }

    /// The algorithm `kind` is told to take (`Auto`: the table decides).
    pub fn of(&self, kind: CollectiveKind) -> CollectiveAlgorithm {
        self.0[kind.index()]
    }
}

impl std::fmt::Display for CollectiveAlgorithms {
    /// `auto` when nothing is told; `ALGORITHM` when every collective that has it is told
    /// it and no other is told anything; else `KIND:ALGORITHM` for each told collective.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(a) = self.0.iter().find(|a| **a != CollectiveAlgorithm::Auto) {
            if *self == CollectiveAlgorithms::all(*a) {
                return f.write_str(a.as_str());
            }
        }
        let told: Vec<String> = CollectiveKind::ALL
            .into_iter()
            .filter(|k| self.of(*k) != CollectiveAlgorithm::Auto)
            .map(|k| format!("{k}:{}", self.of(k)))
            .collect();
        match told.is_empty() {
            true => f.write_str("auto"),
            false => f.write_str(&told.join(",")),
        }
    }
}

impl std::str::FromStr for CollectiveAlgorithms {
    type Err = String;

    /// Parses the variable's value; the error is the first bad item.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut each = CollectiveAlgorithms::default();
        for item in s.split(',').map(str::trim) {
            let bad = || item.to_owned();
            each = match item.split_once(':') {
                Some((kind, algorithm)) => {
                    let kind = kind.parse().map_err(|_| bad())?;
                    let algorithm = algorithm.parse().map_err(|_| bad())?;
                    each.with(kind, algorithm).map_err(|_| bad())?
                }
                None => {
                    // Every collective that has it (`auto`: every collective).
                    let algorithm: CollectiveAlgorithm = item.parse().map_err(|_| bad())?;
                    for kind in CollectiveKind::ALL {
                        if algorithm == CollectiveAlgorithm::Auto
                            || kind.algorithms().contains(&algorithm)
                        {
                            each.0[kind.index()] = algorithm;
                        }
                    }
                    each
                }
            };
        }
        Ok(each)
    }
}

impl From<CollectiveAlgorithm> for CollectiveAlgorithms {
    /// As [`CollectiveAlgorithms::all`].
    fn from(algorithm: CollectiveAlgorithm) -> CollectiveAlgorithms {
        CollectiveAlgorithms::all(algorithm)
    }
}

/// Settings of the collectives among a cluster's workers (`VANS_COLLECTIVE_*`), the defaults
/// of a `collective::Communicator` on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveSettings {
    /// `VANS_COLLECTIVE_SLICE_BYTES`: largest message a collective sends (4096 to 1 GiB).
    pub slice_bytes: usize,
    /// `VANS_COLLECTIVE_DIRECT_BYTES`: all-reduces of buffers up to this many bytes go to every
    /// rank at once instead of around the ring (up to 1 GiB; 0: never).
    pub direct_bytes: usize,
    /// `VANS_COLLECTIVE_SETTLE_WINDOW`: how long the coordinator waits for every live worker
    /// to join before it forms the next generation with those that did.
    pub settle_window: Duration,
    /// `VANS_COLLECTIVE_TIMEOUT`: longest wait for one message of a collective.
    pub timeout: Duration,
    /// `VANS_COLLECTIVE_ALGO`: the algorithm each collective is told to take (`auto`: the
    /// `collective` crate's selection table decides, by placement, size and ranks).
    pub algorithm: CollectiveAlgorithms,
    /// `VANS_COLLECTIVE_SPIN_US`: how long a rank waiting on shared memory spins before it
    /// sleeps (never when this host's ranks outnumber the cores this process may use).
    pub spin: Duration,
    /// `VANS_COLLECTIVE_MESH`: whether the ranks of a generation on different hosts connect
    /// to each other directly over TCP for their collectives (`collective`'s mesh), instead
    /// of sending through the vans. Only without authentication, and over a network van.
    pub mesh: bool,
}

impl Default for CollectiveSettings {
    fn default() -> CollectiveSettings {
        CollectiveSettings {
            slice_bytes: DEFAULT_COLLECTIVE_SLICE_BYTES,
            direct_bytes: DEFAULT_COLLECTIVE_DIRECT_BYTES,
            settle_window: DEFAULT_COLLECTIVE_SETTLE_WINDOW,
            timeout: DEFAULT_COLLECTIVE_TIMEOUT,
            algorithm: CollectiveAlgorithms::default(),
            spin: DEFAULT_COLLECTIVE_SPIN,
            mesh: true,
        }
    }
}

impl CollectiveSettings {
    /// The settings from the variables `get` returns (trimmed, non-empty), the defaults for
    /// those unset.
    pub(super) fn parse<'a>(
        get: impl Fn(&'static str) -> Option<&'a str>,
    ) -> Result<CollectiveSettings, ConfigError> {
        let number = |var: &'static str, expected: &'static str| -> Result<_, ConfigError> {
            get(var)
                .map(|value| {
                    value.parse::<f64>().map_err(|_| ConfigError::Invalid {
                        var,
                        value: value.to_owned(),
                        expected,
                    })
                })
                .transpose()
        };
        let bytes = |var, low: usize, expected| -> Result<Option<usize>, ConfigError> {
            let Some(n) = number(var, expected)? else {
                return Ok(None);
            };
            if (low as f64..=GIB as f64).contains(&n) && n.fract() == 0.0 {
                Ok(Some(n as usize))
            } else {
                Err(invalid(var, get(var).unwrap_or_default(), expected))
            }
        };
        let seconds = |var| -> Result<Option<Duration>, ConfigError> {
            let Some(s) = number(var, SECONDS_EXPECTED)? else {
                return Ok(None);
            };
            if s.is_finite() && s > 0.0 && s <= LONGEST.as_secs_f64() {
                Ok(Some(Duration::from_secs_f64(s)))
            } else {
                Err(invalid(var, get(var).unwrap_or_default(), SECONDS_EXPECTED))
            }
        };
        let mut c = CollectiveSettings::default();
        if let Some(n) = bytes("VANS_COLLECTIVE_SLICE_BYTES", 4096, SLICE_EXPECTED)? {
            c.slice_bytes = n;
        }
        if let Some(n) = bytes("VANS_COLLECTIVE_DIRECT_BYTES", 0, DIRECT_EXPECTED)? {
            c.direct_bytes = n;
        }
        if let Some(d) = seconds("VANS_COLLECTIVE_SETTLE_WINDOW")? {
            c.settle_window = d;
        }
        if let Some(d) = seconds("VANS_COLLECTIVE_TIMEOUT")? {
            c.timeout = d;
        }
        if let Some(value) = get("VANS_COLLECTIVE_ALGO") {
            // The item that is wrong, and what every item may be.
            c.algorithm = value.parse().map_err(|item: String| {
                invalid("VANS_COLLECTIVE_ALGO", &item, ALGORITHM_EXPECTED)
            })?;
        }
        if let Some(us) = number("VANS_COLLECTIVE_SPIN_US", SPIN_EXPECTED)? {
            let longest = LONGEST_SPIN.as_micros() as f64;
            if !((0.0..=longest).contains(&us) && us.fract() == 0.0) {
                let value = get("VANS_COLLECTIVE_SPIN_US").unwrap_or_default();
                return Err(invalid("VANS_COLLECTIVE_SPIN_US", value, SPIN_EXPECTED));
            }
            c.spin = Duration::from_micros(us as u64);
        }
        Ok(c)
    }

    /// Checks the ranges the variables accept (for settings made in code).
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(4096..=GIB).contains(&self.slice_bytes) {
            let value = self.slice_bytes.to_string();
            return Err(invalid(
                "VANS_COLLECTIVE_SLICE_BYTES",
                &value,
                SLICE_EXPECTED,
            ));
        }
        if self.direct_bytes > GIB {
            let value = self.direct_bytes.to_string();
            return Err(invalid(
                "VANS_COLLECTIVE_DIRECT_BYTES",
                &value,
                DIRECT_EXPECTED,
            ));
        }
        if self.spin > LONGEST_SPIN {
            let value = self.spin.as_micros().to_string();
            return Err(invalid("VANS_COLLECTIVE_SPIN_US", &value, SPIN_EXPECTED));
        }
        for (var, d) in [
            ("VANS_COLLECTIVE_SETTLE_WINDOW", self.settle_window),
            ("VANS_COLLECTIVE_TIMEOUT", self.timeout),
        ] {
            if d.is_zero() || d > LONGEST {
                let value = d.as_secs_f64().to_string();
                return Err(invalid(var, &value, SECONDS_EXPECTED));
            }
        }
        Ok(())
    }
}

fn invalid(var: &'static str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_owned(),
        expected,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::tests::err;
    use crate::config::{
        CollectiveAlgorithm as A, CollectiveAlgorithms, CollectiveKind as K, CollectiveSettings,
        Config,
    };

    #[test]
    fn collective_settings_from_the_variables() {
        assert_eq!(Config::default().collective, CollectiveSettings::default());
        let c = Config::from_vars([
            ("VANS_COLLECTIVE_SLICE_BYTES", "4096"),
            ("VANS_COLLECTIVE_DIRECT_BYTES", "0"),
            ("VANS_COLLECTIVE_SETTLE_WINDOW", "0.5"),
            ("VANS_COLLECTIVE_TIMEOUT", " 1e2 "),
            ("VANS_COLLECTIVE_ALGO", "doubling"),
            ("VANS_COLLECTIVE_SPIN_US", "0"),
        ])
        .unwrap();
        assert_eq!(
            c.collective,
            CollectiveSettings {
                slice_bytes: 4096,
                direct_bytes: 0,
                settle_window: Duration::from_millis(500),
                timeout: Duration::from_secs(100),
                algorithm: CollectiveAlgorithms::all(A::Doubling),
                spin: Duration::ZERO,
                mesh: true,
            }
        );
        // The largest values are accepted.
        let c = Config::from_vars([
            ("VANS_COLLECTIVE_SLICE_BYTES", "1073741824"),
            ("VANS_COLLECTIVE_TIMEOUT", "86400"),
            ("VANS_COLLECTIVE_SPIN_US", "1e6"),
            ("VANS_COLLECTIVE_ALGO", "SHM"),
        ])
        .unwrap();
        assert_eq!(c.collective.spin, Duration::from_secs(1));
        assert_eq!(c.collective.algorithm, CollectiveAlgorithms::all(A::Shm));
        assert_eq!(c.collective.slice_bytes, 1 << 30);
        assert_eq!(c.collective.timeout, Duration::from_secs(86_400));
    }

    /// A bare algorithm tells every collective that has it; `KIND:ALGORITHM` one; later
    /// items win.
    #[test]
    fn collective_algorithms_per_collective() {
        let parse = |s: &str| s.parse::<CollectiveAlgorithms>();
        let all = |s| K::ALL.map(|k| parse(s).unwrap().of(k));
        assert_eq!(all("auto"), [A::Auto; 5]);
        assert_eq!(all("ring"), [A::Ring, A::Ring, A::Ring, A::Ring, A::Auto]);
        assert_eq!(
            all("doubling"),
            [A::Doubling, A::Auto, A::Doubling, A::Auto, A::Doubling]
        );
        assert_eq!(all("hier"), [A::Hier, A::Auto, A::Auto, A::Auto, A::Auto]);
        assert_eq!(all("shm"), [A::Shm; 5]);
        assert_eq!(
            all(" allreduce:ring , all-gather:Direct,reducescatter:halving"),
            [A::Ring, A::Halving, A::Direct, A::Auto, A::Auto]
        );
        assert_eq!(
            all("ring,broadcast:shm"),
            [A::Ring, A::Ring, A::Ring, A::Shm, A::Auto]
        );
        assert_eq!(all("allreduce:direct,auto"), [A::Auto; 5]);
        for bad in ["tree", "broadcast:direct", "gather:ring", "allreduce:", ""] {
            assert_eq!(parse(&format!("ring,{bad}")), Err(bad.to_owned()), "{bad}");
        }
        // Written back as read.
        for told in [
            "auto",
            "ring",
            "allreduce:ring,all_gather:direct",
            "barrier:shm",
        ] {
            assert_eq!(parse(told).unwrap().to_string(), told);
        }
        let err = CollectiveAlgorithms::default().with(K::Broadcast, A::Doubling);
        assert_eq!(
            err,
            Err("broadcast:doubling: broadcast takes auto, shm, ring".into())
        );
    }

    #[test]
    fn bad_collective_values_name_the_variable_and_what_it_accepts() {
        for (var, value, expected) in [
            ("VANS_COLLECTIVE_SLICE_BYTES", "4095", "from 4096"),
            ("VANS_COLLECTIVE_SLICE_BYTES", "4096.5", "whole number"),
            ("VANS_COLLECTIVE_SLICE_BYTES", "1073741825", "1 GiB"),
            ("VANS_COLLECTIVE_DIRECT_BYTES", "-1", "up to"),
            ("VANS_COLLECTIVE_DIRECT_BYTES", "lots", "whole number"),
            ("VANS_COLLECTIVE_SETTLE_WINDOW", "0", "(0, 86400]"),
            ("VANS_COLLECTIVE_SETTLE_WINDOW", "inf", "(0, 86400]"),
            ("VANS_COLLECTIVE_TIMEOUT", "86401", "(0, 86400]"),
            ("VANS_COLLECTIVE_TIMEOUT", "NaN", "seconds"),
            (
                "VANS_COLLECTIVE_ALGO",
                "tree",
                "broadcast auto, shm or ring",
            ),
            (
                "VANS_COLLECTIVE_ALGO",
                "broadcast:doubling",
                "broadcast auto, shm or ring",
            ),
            (
                "VANS_COLLECTIVE_ALGO",
                "alltoall:direct",
                "COLLECTIVE:ALGORITHM",
            ),
            ("VANS_COLLECTIVE_SPIN_US", "1000001", "up to 1000000"),
            ("VANS_COLLECTIVE_SPIN_US", "2.5", "whole number"),
            ("VANS_COLLECTIVE_SPIN_US", "-1", "microseconds"),
        ] {
            let message = err(&[(var, value)]);
            for part in [var, value, expected] {
                assert!(message.contains(part), "{message:?} lacks {part:?}");
            }
        }
    }

    #[test]
    fn the_builder_checks_the_same_ranges() {
        let build = |settings| Config::builder().collective(settings).build();
        build(CollectiveSettings::default()).unwrap();
        for (settings, var) in [
            (
                CollectiveSettings {
                    slice_bytes: 100,
                    ..CollectiveSettings::default()
                },
                "VANS_COLLECTIVE_SLICE_BYTES",
            ),
            (
                CollectiveSettings {
                    direct_bytes: 2 << 30,
                    ..CollectiveSettings::default()
                },
                "VANS_COLLECTIVE_DIRECT_BYTES",
            ),
            (
                CollectiveSettings {
                    settle_window: Duration::ZERO,
                    ..CollectiveSettings::default()
                },
                "VANS_COLLECTIVE_SETTLE_WINDOW",
            ),
            (
                CollectiveSettings {
                    timeout: Duration::from_secs(100_000),
                    ..CollectiveSettings::default()
                },
                "VANS_COLLECTIVE_TIMEOUT",
            ),
            (
                CollectiveSettings {
                    spin: Duration::from_secs(2),
                    ..CollectiveSettings::default()
                },
                "VANS_COLLECTIVE_SPIN_US",
            ),
        ] {
            let message = build(settings).unwrap_err().to_string();
            assert!(message.contains(var), "{message:?} lacks {var}");
        }
    }
}
