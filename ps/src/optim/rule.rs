//! The update of one row by one gradient, and the seeded initial value of a weight.

use super::{Init, Optimizer};

/// The value weight `col` of key `key`'s row starts with, under `init` and `seed`: a pure
/// function of its arguments, so every server (and a single-process reference) computes the
/// same row for the same key.
pub fn init_value(init: Init, seed: u64, key: u64, col: usize) -> f32 {
    match init {
        Init::Zeros => 0.0,
        Init::Uniform { scale } => (2.0 * unit(seed, key, col as u64) - 1.0) * scale,
        Init::Normal { std } => {
            // Box–Muller on two independent draws; `1 - u` keeps the logarithm finite.
            let u1 = 1.0 - f64::from(unit(seed, key, 2 * col as u64));
            let u2 = f64::from(unit(seed, key, 2 * col as u64 + 1));
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (z * f64::from(std)) as f32
        }
    }
}

/// A uniform draw in `[0, 1)` with 24 bits (exact in `f32`), from SplitMix64.
fn unit(seed: u64, key: u64, n: u64) -> f32 {
    let h = mix(seed ^ mix(key ^ mix(n.wrapping_add(0x632B_E59B_D9B4_E019))));
    (h >> 40) as f32 / (1u64 << 24) as f32
}

/// SplitMix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Applies `grad` to a row: `weights` and its optimizer `state` (`slots` values per weight,
/// laid out slot by slot), `step` the row's update count after this one.
pub(super) fn apply(
    optimizer: &Optimizer,
    weights: &mut [f32],
    state: &mut [f32],
    step: u32,
    grad: &[f32],
) {
    let dim = weights.len();
    match *optimizer {
        Optimizer::Sgd { lr } => {
            for (w, g) in weights.iter_mut().zip(grad) {
                *w -= lr * g;
            }
        }
        Optimizer::Momentum {
            lr,
            momentum,
            nesterov,
        } => {
            for ((w, b), g) in weights.iter_mut().zip(state.iter_mut()).zip(grad) {
                // torch starts the buffer at the first gradient: the same as from zero.
                *b = if step == 1 { *g } else { momentum * *b + g };
                let d = if nesterov { g + momentum * *b } else { *b };
                *w -= lr * d;
            }
        }
        Optimizer::Adagrad { lr, eps, .. } => {
            for ((w, s), g) in weights.iter_mut().zip(state.iter_mut()).zip(grad) {
                *s += g * g;
                let std = s.sqrt() + eps;
                *w -= lr * (g / std);
            }
        }
        Optimizer::Adam {
            lr,
            beta1,
            beta2,
            eps,
        } => {
            // As torch's single-tensor Adam: the bias corrections in f64 (Python floats),
            // the moments in f32.
            let t = i32::try_from(step).unwrap_or(i32::MAX);
            let correction1 = 1.0 - f64::from(beta1).powi(t);
            let correction2 = 1.0 - f64::from(beta2).powi(t);
            let step_size = (f64::from(lr) / correction1) as f32;
            let correction2_sqrt = correction2.sqrt() as f32;
            let (m, v) = state.split_at_mut(dim);
            for (((w, m), v), g) in weights.iter_mut().zip(m).zip(v).zip(grad) {
                *m += (g - *m) * (1.0 - beta1);
                *v = *v * beta2 + (1.0 - beta2) * g * g;
                let denom = v.sqrt() / correction2_sqrt + eps;
                *w -= step_size * (*m / denom);
            }
        }
        Optimizer::Ftrl { lr, beta, l1, l2 } => {
            let (z, n) = state.split_at_mut(dim);
            for (((w, z), n), g) in weights.iter_mut().zip(z).zip(n).zip(grad) {
                let n_new = *n + g * g;
                let sigma = (n_new.sqrt() - n.sqrt()) / lr;
                *z += g - sigma * *w;
                *n = n_new;
                *w = if z.abs() <= l1 {
                    0.0
                } else {
                    -(*z - z.signum() * l1) / ((beta + n.sqrt()) / lr + l2)
                };
            }
        }
    }
}

/// The starting value of each optimizer state slot.
pub(super) fn initial_state(optimizer: &Optimizer) -> f32 {
    match *optimizer {
        Optimizer::Adagrad {
            initial_accumulator,
            ..
        } => initial_accumulator,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_values_depend_on_key_column_and_seed_only_and_follow_their_law() {
        let uniform = Init::Uniform { scale: 0.5 };
        assert_eq!(init_value(uniform, 1, 7, 3), init_value(uniform, 1, 7, 3));
        assert_ne!(init_value(uniform, 1, 7, 3), init_value(uniform, 2, 7, 3));
        assert_ne!(init_value(uniform, 1, 7, 3), init_value(uniform, 1, 8, 3));
        assert_ne!(init_value(uniform, 1, 7, 3), init_value(uniform, 1, 7, 4));
        let n = 20_000;
        let draws: Vec<f32> = (0..n).map(|k| init_value(uniform, 0, k, 0)).collect();
        assert!(draws.iter().all(|v| (-0.5..0.5).contains(v)));
        let mean = draws.iter().sum::<f32>() / n as f32;
        assert!(mean.abs() < 0.01, "uniform mean {mean}");
        let normal = Init::Normal { std: 2.0 };
        let draws: Vec<f64> = (0..n)
            .map(|k| f64::from(init_value(normal, 3, k, 1)))
            .collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let var = draws.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.05, "normal mean {mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.05, "normal std {}", var.sqrt());
        assert_eq!(init_value(Init::Zeros, 5, 5, 5), 0.0);
    }

    /// A scalar reference of each formula in f64, written from the papers and torch's docs,
    /// against the f32 row update over several steps.
    #[test]
    fn every_rule_follows_its_reference_formula() {
        let grads = [0.5f64, -1.25, 2.0, 0.0, -0.75, 3.5];
        let w0 = 0.3f64;
        let cases = [
            Optimizer::Sgd { lr: 0.1 },
            Optimizer::Momentum {
                lr: 0.1,
                momentum: 0.9,
                nesterov: false,
            },
            Optimizer::Momentum {
                lr: 0.1,
                momentum: 0.8,
                nesterov: true,
            },
            Optimizer::Adagrad {
                lr: 0.1,
                initial_accumulator: 0.1,
                eps: 1e-10,
            },
            Optimizer::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            Optimizer::Ftrl {
                lr: 0.1,
                beta: 1.0,
                l1: 0.2,
                l2: 0.05,
            },
        ];
        for optimizer in cases {
            let mut w = [w0 as f32];
            let mut state = vec![initial_state(&optimizer); optimizer.slots()];
            let (mut rw, mut s1, mut s2) = (w0, f64::from(initial_state(&optimizer)), 0.0f64);
            for (t, &g) in grads.iter().enumerate() {
                let t = t as i32 + 1;
                apply(&optimizer, &mut w, &mut state, t as u32, &[g as f32]);
                match optimizer {
                    Optimizer::Sgd { lr } => rw -= f64::from(lr) * g,
                    Optimizer::Momentum {
                        lr,
                        momentum,
                        nesterov,
                    } => {
                        let m = f64::from(momentum);
                        s1 = if t == 1 { g } else { m * s1 + g };
                        rw -= f64::from(lr) * if nesterov { g + m * s1 } else { s1 };
                    }
                    Optimizer::Adagrad { lr, eps, .. } => {
                        s1 += g * g;
                        rw -= f64::from(lr) * g / (s1.sqrt() + f64::from(eps));
                    }
                    Optimizer::Adam {
                        lr,
                        beta1,
                        beta2,
                        eps,
                    } => {
                        let (b1, b2) = (f64::from(beta1), f64::from(beta2));
                        s1 = b1 * s1 + (1.0 - b1) * g;
                        s2 = b2 * s2 + (1.0 - b2) * g * g;
                        let m_hat = s1 / (1.0 - b1.powi(t));
                        let v_hat = s2 / (1.0 - b2.powi(t));
                        rw -= f64::from(lr) * m_hat / (v_hat.sqrt() + f64::from(eps));
                    }
                    Optimizer::Ftrl { lr, beta, l1, l2 } => {
                        let (a, b, l1, l2) =
                            (f64::from(lr), f64::from(beta), f64::from(l1), f64::from(l2));
                        let sigma = ((s2 + g * g).sqrt() - s2.sqrt()) / a;
                        s1 += g - sigma * rw;
                        s2 += g * g;
                        rw = if s1.abs() <= l1 {
                            0.0
                        } else {
                            -(s1 - s1.signum() * l1) / ((b + s2.sqrt()) / a + l2)
                        };
                    }
                }
                let got = f64::from(w[0]);
                assert!(
                    (got - rw).abs() <= 1e-5 * (1.0 + rw.abs()),
                    "{} step {t}: {got} where the reference has {rw}",
                    optimizer.name()
                );
            }
        }
    }
}
