//! The probability distributions of the synthetic workload model, sampled by
//! hand from a [`RngCore`] so that the same seed gives the same numbers
//! regardless of which distribution library versions are around.
//!
//! Uniform variates take the top 53 bits of one `u64`; normals use the
//! Box–Muller transform (two uniforms per normal, no cached spare).

use rand_chacha::rand_core::RngCore;
use serde::{Deserialize, Serialize};

/// A uniform variate in `[0, 1)`.
pub fn unit(rng: &mut impl RngCore) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A uniform variate in `(0, 1]`.
pub fn unit_open(rng: &mut impl RngCore) -> f64 {
    1.0 - unit(rng)
}

/// A uniform integer in `0..n` (`n > 0`), without modulo bias.
pub fn below(rng: &mut impl RngCore, n: u64) -> u64 {
    assert!(n > 0, "below(0)");
    // Lemire's multiply-shift with rejection.
    let threshold = n.wrapping_neg() % n;
    loop {
        let m = u128::from(rng.next_u64()) * u128::from(n);
        if (m as u64) >= threshold {
            return (m >> 64) as u64;
        }
    }
}

/// A standard normal variate.
pub fn standard_normal(rng: &mut impl RngCore) -> f64 {
    let u1 = unit_open(rng);
    let u2 = unit(rng);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// An exponential variate with the given mean.
pub fn exponential(rng: &mut impl RngCore, mean: f64) -> f64 {
    -mean * unit_open(rng).ln()
}

/// Lognormal: `ln X` is normal with mean `mu` and standard deviation `sigma`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogNormal {
    /// Mean of `ln X`.
    pub mu: f64,
    /// Standard deviation of `ln X`.
    pub sigma: f64,
}

impl LogNormal {
    /// One variate.
    pub fn sample(&self, rng: &mut impl RngCore) -> f64 {
        (self.mu + self.sigma * standard_normal(rng)).exp()
    }

    /// The median, `e^mu`.
    pub fn median(&self) -> f64 {
        self.mu.exp()
    }
}

/// Pareto with shape `alpha` and scale (minimum) `k`: density `α k^α x^(−α−1)`, `x ≥ k`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pareto {
    /// Shape.
    pub alpha: f64,
    /// Scale: the smallest value.
    pub k: f64,
}

impl Pareto {
    /// One variate (inverse transform).
    pub fn sample(&self, rng: &mut impl RngCore) -> f64 {
        self.k * unit_open(rng).powf(-1.0 / self.alpha)
    }

    /// One variate of the distribution truncated to `[k, max]` (inverse
    /// transform of the truncated distribution, so there is no spike at `max`).
    pub fn sample_truncated(&self, rng: &mut impl RngCore, max: f64) -> f64 {
        if max <= self.k {
            return self.k;
        }
        let tail = (self.k / max).powf(self.alpha);
        let u = unit(rng);
        (self.k * (1.0 - u * (1.0 - tail)).powf(-1.0 / self.alpha)).min(max)
    }
}

/// Inverse Gaussian (Wald) with mean `mu` and shape `lambda`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct InverseGaussian {
    /// Mean.
    pub mu: f64,
    /// Shape.
    pub lambda: f64,
}

impl InverseGaussian {
    /// One variate (Michael, Schucany and Haas, 1976).
    pub fn sample(&self, rng: &mut impl RngCore) -> f64 {
        let (mu, lambda) = (self.mu, self.lambda);
        let n = standard_normal(rng);
        let y = n * n;
        let x = mu + mu * mu * y / (2.0 * lambda)
            - mu / (2.0 * lambda) * (4.0 * mu * lambda * y + mu * mu * y * y).sqrt();
        if unit(rng) <= mu / (mu + x) {
            x
        } else {
            mu * mu / x
        }
    }
}

/// A lognormal body with a Pareto tail: values below `tail.k` follow the
/// lognormal, values above follow the Pareto, and the tail's weight is the
/// lognormal's own mass above `tail.k`. Sampled by drawing the lognormal and
/// replacing a draw above `tail.k` by a Pareto draw.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BodyTail {
    /// The body.
    pub body: LogNormal,
    /// The tail; its `k` is where the tail starts.
    pub tail: Pareto,
}

impl BodyTail {
    /// One variate, with the tail truncated at `max`.
    pub fn sample(&self, rng: &mut impl RngCore, max: f64) -> f64 {
        let x = self.body.sample(rng);
        if x <= self.tail.k {
            x
        } else {
            self.tail.sample_truncated(rng, max)
        }
    }
}

/// The workload model for static requests and client behaviour of seed 004
/// §5.4, Table 1. [`Default`] gives the table's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadModel {
    /// Page requests (clicks) per user session: inverse Gaussian, μ = 3.86, λ = 9.46.
    pub requests_per_session: InverseGaussian,
    /// User think time between page requests, seconds: Pareto, α = 1.4, k = 1.
    pub think_time: Pareto,
    /// Embedded objects per page request: Pareto, α = 1.33, k = 2.
    pub objects_per_page: Pareto,
    /// HTML object size, bytes: lognormal body (μ = 7.630, σ = 1.001) with a
    /// Pareto tail (α = 1, k = 10240).
    pub html_size: BodyTail,
    /// Embedded object size, bytes: lognormal, μ = 8.215, σ = 1.46.
    pub embedded_size: LogNormal,
}

impl Default for WorkloadModel {
    fn default() -> Self {
        WorkloadModel {
            requests_per_session: InverseGaussian {
                mu: 3.86,
                lambda: 9.46,
            },
            think_time: Pareto { alpha: 1.4, k: 1.0 },
            objects_per_page: Pareto {
                alpha: 1.33,
                k: 2.0,
            },
            html_size: BodyTail {
                body: LogNormal {
                    mu: 7.630,
                    sigma: 1.001,
                },
                tail: Pareto {
                    alpha: 1.0,
                    k: 10240.0,
                },
            },
            embedded_size: LogNormal {
                mu: 8.215,
                sigma: 1.46,
            },
        }
    }
}

impl WorkloadModel {
    /// Checks that every parameter is finite and positive.
    pub fn validate(&self) -> Result<(), String> {
        let params = [
            ("requests_per_session.mu", self.requests_per_session.mu),
            (
                "requests_per_session.lambda",
                self.requests_per_session.lambda,
            ),
            ("think_time.alpha", self.think_time.alpha),
            ("think_time.k", self.think_time.k),
            ("objects_per_page.alpha", self.objects_per_page.alpha),
            ("objects_per_page.k", self.objects_per_page.k),
            ("html_size.body.sigma", self.html_size.body.sigma),
            ("html_size.tail.alpha", self.html_size.tail.alpha),
            ("html_size.tail.k", self.html_size.tail.k),
            ("embedded_size.sigma", self.embedded_size.sigma),
        ];
        for (name, v) in params {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("model parameter {name} must be positive, got {v}"));
            }
        }
        for (name, v) in [
            ("html_size.body.mu", self.html_size.body.mu),
            ("embedded_size.mu", self.embedded_size.mu),
        ] {
            if !v.is_finite() {
                return Err(format!("model parameter {name} must be finite, got {v}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    const N: usize = 200_000;

    fn rng() -> ChaCha20Rng {
        ChaCha20Rng::seed_from_u64(7)
    }

    fn mean(xs: &[f64]) -> f64 {
        xs.iter().sum::<f64>() / xs.len() as f64
    }

    fn median(mut xs: Vec<f64>) -> f64 {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    }

    #[test]
    fn uniform_ranges() {
        let mut r = rng();
        for _ in 0..10_000 {
            let u = unit(&mut r);
            assert!((0.0..1.0).contains(&u));
            let v = unit_open(&mut r);
            assert!(v > 0.0 && v <= 1.0);
            assert!(below(&mut r, 7) < 7);
        }
        let mut counts = [0u32; 3];
        for _ in 0..30_000 {
            counts[below(&mut r, 3) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn normal_and_exponential_moments() {
        let mut r = rng();
        let xs: Vec<f64> = (0..N).map(|_| standard_normal(&mut r)).collect();
        let m = mean(&xs);
        let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / N as f64;
        assert!(m.abs() < 0.01, "{m}");
        assert!((var - 1.0).abs() < 0.01, "{var}");
        let xs: Vec<f64> = (0..N).map(|_| exponential(&mut r, 10.0)).collect();
        assert!((mean(&xs) - 10.0).abs() < 0.1);
    }

    #[test]
    fn table_1_distributions() {
        let m = WorkloadModel::default();
        m.validate().unwrap();
        let mut r = rng();
        // Inverse Gaussian: mean mu, variance mu^3/lambda.
        let xs: Vec<f64> = (0..N)
            .map(|_| m.requests_per_session.sample(&mut r))
            .collect();
        assert!(xs.iter().all(|&x| x > 0.0));
        let mu = mean(&xs);
        assert!((mu - 3.86).abs() < 0.03, "{mu}");
        let var = xs.iter().map(|x| (x - mu) * (x - mu)).sum::<f64>() / N as f64;
        let want = 3.86f64.powi(3) / 9.46;
        assert!((var - want).abs() / want < 0.05, "{var} vs {want}");
        // Pareto: P(X > x) = (k/x)^alpha.
        let xs: Vec<f64> = (0..N).map(|_| m.think_time.sample(&mut r)).collect();
        assert!(xs.iter().all(|&x| x >= 1.0));
        let above = xs.iter().filter(|&&x| x > 4.0).count() as f64 / N as f64;
        assert!((above - 4f64.powf(-1.4)).abs() < 0.005, "{above}");
        // Lognormal median e^mu.
        let xs: Vec<f64> = (0..N).map(|_| m.embedded_size.sample(&mut r)).collect();
        let med = median(xs);
        assert!((med / m.embedded_size.median() - 1.0).abs() < 0.02, "{med}");
        // Body/tail: the share above 10240 is the lognormal's (about 5.5 %),
        // and nothing exceeds the cap.
        let xs: Vec<f64> = (0..N).map(|_| m.html_size.sample(&mut r, 1e6)).collect();
        let tail = xs.iter().filter(|&&x| x > 10240.0).count() as f64 / N as f64;
        assert!((tail - 0.0547).abs() < 0.003, "{tail}");
        assert!(xs.iter().all(|&x| x > 0.0 && x <= 1e6));
        // Within the tail: P(X > 2k | X > k) = 1/2 for alpha = 1 (cap far away).
        let big: Vec<f64> = xs.into_iter().filter(|&x| x > 10240.0).collect();
        let half = big.iter().filter(|&&x| x > 20480.0).count() as f64 / big.len() as f64;
        assert!((half - 0.5).abs() < 0.03, "{half}");
    }

    #[test]
    fn truncated_pareto_stays_in_range() {
        let p = Pareto {
            alpha: 1.0,
            k: 10.0,
        };
        let mut r = rng();
        for _ in 0..10_000 {
            let x = p.sample_truncated(&mut r, 100.0);
            assert!((10.0..=100.0).contains(&x));
        }
        assert_eq!(p.sample_truncated(&mut r, 5.0), 10.0);
    }

    #[test]
    fn same_seed_same_numbers() {
        let (mut a, mut b) = (rng(), rng());
        let m = WorkloadModel::default();
        for _ in 0..1000 {
            assert_eq!(
                m.html_size.sample(&mut a, 1e7).to_bits(),
                m.html_size.sample(&mut b, 1e7).to_bits()
            );
        }
    }
}
