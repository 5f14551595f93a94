//! Server-side optimizers and embedding tables: a [`TableHandler`] keeps one row of `dim`
//! `f32` values per key, creates a row on its first touch from a seeded [`Init`], and applies
//! an [`Optimizer`] to each pushed gradient on the server's shard.
//!
//! A table is described by a [`TableSpec`], parsed from one line of `name=value` settings,
//! the same from Rust, C and Python:
//!
//! ```
//! let spec: ps::optim::TableSpec = "optimizer=adam dim=16 lr=0.01".parse()?;
//! assert_eq!(spec.dim, 16);
//! // Every setting, defaults included, in the form that parses back to the same spec.
//! assert_eq!(spec.to_string().parse::<ps::optim::TableSpec>()?, spec);
//! # Ok::<(), ps::NodeError>(())
//! ```
//!
//! # Requests
//!
//! - a push (any `cmd` but the two below) applies the optimizer to each key's gradient, in
//!   order: a key given twice is stepped twice (asynchronous training, as ElasticDL's and
//!   StarServer's servers do);
//! - a pull returns each key's row (created on first touch), `dim` values per key;
//! - a push-pull applies, then returns the updated rows;
//! - [`ACCUMULATE_CMD`] (push) adds the gradients into each row's pending sum without
//!   applying them, and [`APPLY_CMD`] (pull) applies the pending sum of each key once, then
//!   returns the rows: synchronous training, where every worker accumulates, the workers
//!   meet at a barrier, then apply, then meet again before the next pulls.
//!
//! The formulas are `torch.optim`'s (SGD, SGD with momentum, Adagrad, Adam, computed in the
//! same order in `f32`) and, for FTRL, McMahan et al.'s per-coordinate FTRL-Proximal.

mod rule;
mod table;

use std::fmt;
use std::str::FromStr;

pub use rule::init_value;
pub use table::{initial_rows, TableHandler};

use node::error::NodeError;

/// A push with this `cmd` adds gradients into each row's pending sum, not applying them.
pub const ACCUMULATE_CMD: i32 = 0x4143_434D;
/// A pull with this `cmd` applies each key's pending sum (if any), then returns the rows.
pub const APPLY_CMD: i32 = 0x4150_504C;

/// What a table's server does with a pushed gradient `g` of a row `w`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Optimizer {
    /// `w -= lr * g`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// `torch.optim.SGD` with momentum (no dampening): `b = momentum * b + g`, then
    /// `w -= lr * b` (or `lr * (g + momentum * b)` with Nesterov).
    Momentum {
        /// Learning rate.
        lr: f32,
        /// Momentum factor.
        momentum: f32,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// `torch.optim.Adagrad`: `s += g²`, `w -= lr * g / (√s + eps)`.
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// The sum's starting value.
        initial_accumulator: f32,
        /// Added to the denominator.
        eps: f32,
    },
    /// `torch.optim.Adam`, with a step count per row (rows are touched at different rates).
    Adam {
        /// Learning rate.
        lr: f32,
        /// Decay of the first moment.
        beta1: f32,
        /// Decay of the second moment.
        beta2: f32,
        /// Added to the denominator.
        eps: f32,
    },
    /// FTRL-Proximal (McMahan et al. 2013) per coordinate: `σ = (√(n + g²) − √n) / lr`,
    /// `z += g − σ w`, `n += g²`, then `w = 0` if `|z| ≤ l1`, else
    /// `w = −(z − sign(z) l1) / ((beta + √n) / lr + l2)`.
    Ftrl {
        /// The learning rate α.
        lr: f32,
        /// β of the per-coordinate rate.
        beta: f32,
        /// L1 regularization.
        l1: f32,
        /// L2 regularization.
        l2: f32,
    },
}

impl Optimizer {
    /// The name in a spec: `sgd`, `momentum`, `adagrad`, `adam` or `ftrl`.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd { .. } => "sgd",
            Optimizer::Momentum { .. } => "momentum",
            Optimizer::Adagrad { .. } => "adagrad",
            Optimizer::Adam { .. } => "adam",
            Optimizer::Ftrl { .. } => "ftrl",
        }
    }

    /// Values of state each row keeps per weight.
    pub(crate) fn slots(&self) -> usize {
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::Momentum { .. } | Optimizer::Adagrad { .. } => 1,
            Optimizer::Adam { .. } | Optimizer::Ftrl { .. } => 2,
        }
    }

    /// The optimizer `name` with its defaults (torch's; FTRL's: lr 0.05, beta 1).
    fn default_for(name: &str) -> Option<Optimizer> {
        Some(match name {
            "sgd" => Optimizer::Sgd { lr: 0.01 },
            "momentum" => Optimizer::Momentum {
                lr: 0.01,
                momentum: 0.9,
                nesterov: false,
            },
            "adagrad" => Optimizer::Adagrad {
                lr: 0.01,
                initial_accumulator: 0.0,
                eps: 1e-10,
            },
            "adam" => Optimizer::Adam {
                lr: 0.001,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            "ftrl" => Optimizer::Ftrl {
                lr: 0.05,
                beta: 1.0,
                l1: 0.0,
                l2: 0.0,
            },
            _ => return None,
        })
    }

    /// Its settings as `(name, value)`, in spec order.
    fn settings(&self) -> Vec<(&'static str, String)> {
        let f = |v: &f32| format!("{v:?}");
        match self {
            Optimizer::Sgd { lr } => vec![("lr", f(lr))],
            Optimizer::Momentum {
                lr,
                momentum,
                nesterov,
            } => vec![
                ("lr", f(lr)),
                ("momentum", f(momentum)),
                ("nesterov", nesterov.to_string()),
            ],
            Optimizer::Adagrad {
                lr,
                initial_accumulator,
                eps,
            } => vec![
                ("lr", f(lr)),
                ("initial_accumulator", f(initial_accumulator)),
                ("eps", f(eps)),
            ],
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => vec![
                ("lr", f(lr)),
                ("beta1", f(beta1)),
                ("beta2", f(beta2)),
                ("eps", f(eps)),
            ],
            Optimizer::Ftrl { lr, beta, l1, l2 } => vec![
                ("lr", f(lr)),
                ("beta", f(beta)),
                ("l1", f(l1)),
                ("l2", f(l2)),
            ],
        }
    }

    /// Sets one of its settings; `Ok(false)` if it has no setting of that name.
    fn set(&mut self, name: &str, value: &str) -> Result<bool, NodeError> {
        let slot: &mut f32 = match (self, name) {
            (Optimizer::Momentum { nesterov, .. }, "nesterov") => {
                *nesterov = parse_bool(name, value)?;
                return Ok(true);
            }
            (
                Optimizer::Sgd { lr }
                | Optimizer::Momentum { lr, .. }
                | Optimizer::Adagrad { lr, .. }
                | Optimizer::Adam { lr, .. }
                | Optimizer::Ftrl { lr, .. },
                "lr",
            ) => lr,
            (Optimizer::Momentum { momentum, .. }, "momentum") => momentum,
            (
                Optimizer::Adagrad {
                    initial_accumulator,
                    ..
                },
                "initial_accumulator",
            ) => initial_accumulator,
            (Optimizer::Adagrad { eps, .. } | Optimizer::Adam { eps, .. }, "eps") => eps,
            (Optimizer::Adam { beta1, .. }, "beta1") => beta1,
            (Optimizer::Adam { beta2, .. }, "beta2") => beta2,
            (Optimizer::Ftrl { beta, .. }, "beta") => beta,
            (Optimizer::Ftrl { l1, .. }, "l1") => l1,
            (Optimizer::Ftrl { l2, .. }, "l2") => l2,
            _ => return Ok(false),
        };
        *slot = parse_number(name, value)?;
        Ok(true)
    }
}

/// How a row's weights start, from the key alone: the same key gives the same row on any
/// server, so a recovered or resharded table starts its new rows as the old one would have.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Init {
    /// All zeros.
    Zeros,
    /// Uniform in `[-scale, scale)`.
    Uniform {
        /// Half the width.
        scale: f32,
    },
    /// Normal with mean 0 and standard deviation `std` (Box–Muller).
    Normal {
        /// The standard deviation.
        std: f32,
    },
}

/// An embedding table: row width, optimizer, and how rows start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TableSpec {
    /// Values per row (the embedding dimension); every push and pull of a key carries this
    /// many.
    pub dim: usize,
    /// Applied to each pushed gradient.
    pub optimizer: Optimizer,
    /// How a row starts.
    pub init: Init,
    /// Seed of the initializer.
    pub seed: u64,
}

/// The widest row: every size a table computes from `dim` (with its optimizer state, times
/// the keys of a request) then stays far from overflow.
pub const MAX_DIM: usize = 1 << 20;

/// The name of every setting a spec accepts (a binding picks them out of keyword arguments).
pub const SETTING_NAMES: &[&str] = &[
    "optimizer",
    "dim",
    "lr",
    "momentum",
    "nesterov",
    "initial_accumulator",
    "eps",
    "beta1",
    "beta2",
    "beta",
    "l1",
    "l2",
    "init",
    "scale",
    "std",
    "seed",
];

/// The settings a spec accepts, for error messages.
const SETTINGS: &str = "optimizer (sgd|momentum|adagrad|adam|ftrl), dim, lr, momentum, \
                        nesterov, initial_accumulator, eps, beta1, beta2, beta, l1, l2, \
                        init (zeros|uniform|normal), scale, std, seed";

impl FromStr for TableSpec {
    type Err = NodeError;

    /// Parses `name=value` settings separated by spaces or commas. `dim` is required; the
    /// optimizer defaults to `sgd`, the initializer to `uniform` with `scale` 0.01, the seed
    /// to 0. A setting the chosen optimizer or initializer does not have is an error.
    fn from_str(text: &str) -> Result<TableSpec, NodeError> {
        let bad = |why: String| NodeError::InvalidArgument(format!("table spec {text:?}: {why}"));
        let pairs: Vec<(&str, &str)> = text
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.split_once('=')
                    .ok_or_else(|| bad(format!("{s:?} is not name=value")))
            })
            .collect::<Result<_, _>>()?;
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &pairs {
            if !seen.insert(*name) {
                return Err(bad(format!("{name} is given twice")));
            }
        }
        let get = |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        let optimizer_name = get("optimizer").unwrap_or("sgd");
        let mut optimizer = Optimizer::default_for(optimizer_name).ok_or_else(|| {
            bad(format!(
                "unknown optimizer {optimizer_name:?}; one of sgd, momentum, adagrad, adam, ftrl"
            ))
        })?;
        let mut init = match get("init").unwrap_or("uniform") {
            "zeros" => Init::Zeros,
            "uniform" => Init::Uniform { scale: 0.01 },
            "normal" => Init::Normal { std: 0.01 },
            other => {
                return Err(bad(format!(
                    "unknown init {other:?}; one of zeros, uniform, normal"
                )))
            }
        };
        let mut dim = None;
        let mut seed = 0;
        for (name, value) in pairs {
            let known = match (name, &mut init) {
                ("optimizer" | "init", _) => true,
                ("dim", _) => {
                    dim = Some(
                        value
                            .parse::<usize>()
                            .ok()
                            .filter(|d| (1..=MAX_DIM).contains(d))
                            .ok_or_else(|| {
                                bad(format!("dim={value} is not an integer in 1..={MAX_DIM}"))
                            })?,
                    );
                    true
                }
                ("seed", _) => {
                    seed = value
                        .parse::<u64>()
                        .map_err(|_| bad(format!("seed={value} is not an unsigned integer")))?;
                    true
                }
                ("scale", Init::Uniform { scale }) => {
                    *scale = parse_number(name, value)?;
                    true
                }
                ("std", Init::Normal { std }) => {
                    *std = parse_number(name, value)?;
                    true
                }
                _ => optimizer.set(name, value)?,
            };
            if !known {
                return Err(bad(format!(
                    "{name} is not a setting of optimizer {} with init {}; settings: {SETTINGS}",
                    optimizer.name(),
                    init.name()
                )));
            }
        }
        let dim = dim.ok_or_else(|| bad("dim (values per row) is required".into()))?;
        Ok(TableSpec {
            dim,
            optimizer,
            init,
            seed,
        })
    }
}

impl Init {
    fn name(&self) -> &'static str {
        match self {
            Init::Zeros => "zeros",
            Init::Uniform { .. } => "uniform",
            Init::Normal { .. } => "normal",
        }
    }
}

impl fmt::Display for TableSpec {
    /// Every setting, defaults included: parses back to the same spec.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "optimizer={} dim={}", self.optimizer.name(), self.dim)?;
        for (name, value) in self.optimizer.settings() {
            write!(f, " {name}={value}")?;
        }
        write!(f, " init={}", self.init.name())?;
        match self.init {
            Init::Zeros => {}
            Init::Uniform { scale } => write!(f, " scale={scale:?}")?,
            Init::Normal { std } => write!(f, " std={std:?}")?,
        }
        write!(f, " seed={}", self.seed)
    }
}

fn parse_number(name: &str, value: &str) -> Result<f32, NodeError> {
    value
        .parse::<f32>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| NodeError::InvalidArgument(format!("{name}={value} is not a finite number")))
}

fn parse_bool(name: &str, value: &str) -> Result<bool, NodeError> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(NodeError::InvalidArgument(format!(
            "{name}={value} is not true or false"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_prints_every_setting_and_parses_back() {
        for text in [
            "dim=4",
            "optimizer=momentum dim=8 lr=0.5 momentum=0.8 nesterov=true init=zeros",
            "optimizer=adagrad,dim=3,initial_accumulator=0.1,eps=1e-6",
            "optimizer=adam dim=16 lr=0.01 beta1=0.8 beta2=0.99 init=normal std=0.1 seed=9",
            "optimizer=ftrl dim=2 lr=0.1 beta=0.5 l1=0.01 l2=0.001 init=uniform scale=0.5",
        ] {
            let spec: TableSpec = text.parse().unwrap();
            let again: TableSpec = spec.to_string().parse().unwrap();
            assert_eq!(again, spec, "{text} -> {spec}");
        }
        let spec: TableSpec = "optimizer=adam dim=16 beta2=0.99".parse().unwrap();
        assert_eq!(
            spec.optimizer,
            Optimizer::Adam {
                lr: 0.001,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8
            }
        );
        assert_eq!(spec.init, Init::Uniform { scale: 0.01 });
    }

    #[test]
    fn a_bad_spec_is_refused_with_what_is_wrong() {
        for (text, says) in [
            ("optimizer=adam", "dim (values per row) is required"),
            ("dim=0", "not an integer in 1..=1048576"),
            ("dim=99999999999999999", "not an integer in 1..=1048576"),
            ("dim=4 optimizer=rmsprop", "unknown optimizer \"rmsprop\""),
            ("dim=4 beta1=0.9", "beta1 is not a setting of optimizer sgd"),
            ("dim=4 lr=fast", "lr=fast is not a finite number"),
            ("dim=4 lr=inf", "lr=inf is not a finite number"),
            ("dim=4 dim=5", "dim is given twice"),
            ("dim=4 std=0.1", "std is not a setting"),
            ("dim=4 init=xavier", "unknown init"),
            ("dim=4 lr", "\"lr\" is not name=value"),
            (
                "optimizer=momentum dim=4 nesterov=maybe",
                "not true or false",
            ),
        ] {
            let err = text.parse::<TableSpec>().unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
