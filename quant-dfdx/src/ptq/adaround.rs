//! AdaRound on one group of a layer's weights, in Gram form.
//!
//! The reconstruction loss `(1/N) Σ_rows ‖W x − W̃ x̃‖²` (float inputs `x`, inputs `x̃` from the
//! already-quantized earlier layers) depends on the rows only through three `K × K` moments,
//! `H = E[x̃ x̃ᵀ]`, `C = E[x̃ xᵀ]` and `F = E[x xᵀ]`:
//! `Σ_o w̃_oᵀ H w̃_o − 2 w̃_oᵀ C w_o + w_oᵀ F w_o`. Accumulating them once makes every iteration
//! one `O × K × K` product, exact over all rows (no mini-batch noise) and independent of how
//! many rows there were.

use dfdx::prelude::*;

/// Rectified sigmoid stretch (AdaRound's ζ and γ).
const ZETA: f32 = 1.1;
const GAMMA: f32 = -0.1;
/// Share of the iterations before the rounding regulariser starts.
const WARM_UP: f64 = 0.2;
/// The regulariser's exponent β, annealed from the first to the second.
const BETA: (f32, f32) = (20.0, 2.0);
/// Adam's moment decays and epsilon.
const ADAM: (f32, f32, f32) = (0.9, 0.999, 1e-8);

/// The moments of a layer group's inputs over `rows` rows of `k` features: what the
/// reconstruction loss and bias correction need of them.
#[derive(Debug, Clone)]
pub(crate) struct Moments {
    pub k: usize,
    pub rows: usize,
    /// `Σ x̃ x̃ᵀ`, row-major `k × k`.
    pub(crate) quantized: Vec<f32>,
    /// `Σ x̃ xᵀ`.
    pub(crate) cross: Vec<f32>,
    /// `Σ x xᵀ`.
    float: Vec<f32>,
    /// `Σ x`, `Σ x̃`.
    pub sum_float: Vec<f64>,
    pub sum_quantized: Vec<f64>,
}

impl Moments {
    pub fn new(k: usize) -> Moments {
        Moments {
            k,
            rows: 0,
            quantized: vec![0.0; k * k],
            cross: vec![0.0; k * k],
            float: vec![0.0; k * k],
            sum_float: vec![0.0; k],
            sum_quantized: vec![0.0; k],
        }
    }

    /// Adds a block of rows: `x` float inputs and `xq` the quantized model's, row-major, `k`
    /// values each.
    pub fn add(&mut self, dev: &Cpu, x: &[f32], xq: &[f32]) {
        let (k, b) = (self.k, x.len() / self.k.max(1));
        if b == 0 {
            return;
        }
        for (row, row_q) in x.chunks_exact(k).zip(xq.chunks_exact(k)) {
            for j in 0..k {
                self.sum_float[j] += row[j] as f64;
                self.sum_quantized[j] += row_q[j] as f64;
            }
        }
        let tx = dev.tensor_from_vec(x.to_vec(), (b, k));
        let txq = dev.tensor_from_vec(xq.to_vec(), (b, k));
        let txq_t = txq.clone().permute::<_, Axes2<1, 0>>();
        for (acc, other) in [(&mut self.quantized, &txq), (&mut self.cross, &tx)] {
            add_into(acc, &txq_t.clone().matmul(other.clone()).as_vec());
        }
        let tx_t = tx.clone().permute::<_, Axes2<1, 0>>();
        add_into(&mut self.float, &tx_t.matmul(tx).as_vec());
        self.rows += b;
    }

    fn normalised(v: &[f32], rows: usize) -> Vec<f32> {
        let n = rows.max(1) as f32;
        v.iter().map(|a| a / n).collect()
    }

    /// The mean reconstruction error per output, `(1/O) E[‖W x − W̃ x̃‖²]`, of quantized weights
    /// `wq` against float weights `w` (both `o × k`), in `f64`.
    pub fn output_error(&self, w: &[f32], wq: &[f32]) -> f64 {
        let k = self.k;
        let n = self.rows.max(1) as f64;
        let quad = |m: &[f32], a: &[f32], b: &[f32]| -> f64 {
            let mut s = 0.0;
            for i in 0..k {
                let mut row = 0.0;
                for j in 0..k {
                    row += m[i * k + j] as f64 * b[j] as f64;
                }
                s += a[i] as f64 * row;
            }
            s
        };
        let outputs = w.len() / k.max(1);
        let mut total = 0.0;
        for (wo, wqo) in w.chunks_exact(k).zip(wq.chunks_exact(k)) {
            total += quad(&self.quantized, wqo, wqo) - 2.0 * quad(&self.cross, wqo, wo)
                + quad(&self.float, wo, wo);
        }
        (total / n / outputs.max(1) as f64).max(0.0)
    }
}

fn add_into(acc: &mut [f32], v: &[f32]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}

/// The grid of a group's weight rows: one scale and zero point per row, codes in
/// `[min, max]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowGrid<'a> {
    pub scales: &'a [f32],
    pub zero_points: &'a [i32],
    pub min: i32,
    pub max: i32,
}

impl RowGrid<'_> {
    /// The weight code `clamp(base + h + z)` means, as a float weight.
    fn weight(&self, row: usize, code: f32) -> f32 {
        (code - self.zero_points[row] as f32) * self.scales[row]
    }
}

/// AdaRound's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Schedule {
    pub iterations: usize,
    pub learning_rate: f32,
    pub regularization: f32,
}

/// What AdaRound found for one group.
#[derive(Debug, Clone)]
pub(crate) struct Rounded {
    /// The codes, `o × k`.
    pub codes: Vec<i32>,
    /// Share of the soft rounding variables at exactly 0 or 1 at the end, before hardening.
    pub settled: f64,
}

/// `h(V) = clip(σ(V)·(ζ − γ) + γ, 0, 1)` and `dh/dV` (zero where clipped).
fn rectified_sigmoid(v: f32) -> (f32, f32) {
    let s = 1.0 / (1.0 + (-v).exp());
    let raw = s * (ZETA - GAMMA) + GAMMA;
    if raw <= 0.0 {
        (0.0, 0.0)
    } else if raw >= 1.0 {
        (1.0, 0.0)
    } else {
        (raw, (ZETA - GAMMA) * s * (1.0 - s))
    }
}

/// Learns the rounding of weights `w` (`o × k`, row-major) on `grid`, minimising the
/// reconstruction loss over `moments` plus AdaRound's rounding regulariser, by Adam on the
/// soft rounding variables `V` (initialised so that `h(V)` is each weight's fractional part),
/// with β annealed after a warm-up; at the end `h` is hardened to `h ≥ ½`.
pub(crate) fn adaround(
    dev: &Cpu,
    moments: &Moments,
    w: &[f32],
    grid: RowGrid<'_>,
    schedule: Schedule,
) -> Rounded {
    let k = moments.k;
    let o = w.len() / k.max(1);
    let h_mat = dev.tensor_from_vec(
        Moments::normalised(&moments.quantized, moments.rows),
        (k, k),
    );
    // T = W·Cᵀ: row o is C·w_o, the target's pull on w̃_o.
    let c_t = dev
        .tensor_from_vec(Moments::normalised(&moments.cross, moments.rows), (k, k))
        .permute::<_, Axes2<1, 0>>();
    let target = dev.tensor_from_vec(w.to_vec(), (o, k)).matmul(c_t).as_vec();
    let base: Vec<f32> = w
        .iter()
        .enumerate()
        .map(|(i, x)| (x / grid.scales[i / k]).floor())
        .collect();
    let mut v: Vec<f32> = w
        .iter()
        .zip(&base)
        .enumerate()
        .map(|(i, (x, b))| {
            let frac = (x / grid.scales[i / k] - b).clamp(0.0, 1.0);
            let p = ((frac - GAMMA) / (ZETA - GAMMA)).clamp(1e-6, 1.0 - 1e-6);
            (p / (1.0 - p)).ln()
        })
        .collect();
    // The reconstruction loss in units of its mean curvature per weight code, s_o²·H_jj, so
    // that the regulariser's weight means the same in every layer whatever its scale.
    let h_diag: Vec<f32> = (0..k)
        .map(|j| moments.quantized[j * k + j] / moments.rows.max(1) as f32)
        .collect();
    let curvature = (0..o)
        .map(|r| grid.scales[r] as f64 * grid.scales[r] as f64)
        .sum::<f64>()
        * h_diag.iter().map(|d| *d as f64).sum::<f64>()
        / (o * k).max(1) as f64;
    let rec_weight = if curvature > 0.0 {
        (1.0 / curvature) as f32
    } else {
        1.0
    };
    let (mut m1, mut m2) = (vec![0f32; v.len()], vec![0f32; v.len()]);
    let warm = (schedule.iterations as f64 * WARM_UP) as usize;
    let code_of = |i: usize, h: f32| {
        (base[i] + h + grid.zero_points[i / k] as f32).clamp(grid.min as f32, grid.max as f32)
    };
    for t in 0..schedule.iterations {
        let soft: Vec<(f32, f32)> = v.iter().map(|x| rectified_sigmoid(*x)).collect();
        let wq: Vec<f32> = soft
            .iter()
            .enumerate()
            .map(|(i, (h, _))| grid.weight(i / k, code_of(i, *h)))
            .collect();
        let wh = dev
            .tensor_from_vec(wq, (o, k))
            .matmul(h_mat.clone())
            .as_vec();
        let beta = (t >= warm).then(|| {
            let rel = (t - warm) as f32 / (schedule.iterations - warm).max(1) as f32;
            BETA.1 + (BETA.0 - BETA.1) * (1.0 - rel)
        });
        let step = t as i32 + 1;
        let (b1, b2, eps) = ADAM;
        let lr = schedule.learning_rate * (1.0 - b2.powi(step)).sqrt() / (1.0 - b1.powi(step));
        for i in 0..v.len() {
            let (h, dh) = soft[i];
            let raw = base[i] + h + grid.zero_points[i / k] as f32;
            let inside = raw > grid.min as f32 && raw < grid.max as f32;
            let mut g = if inside {
                2.0 * (wh[i] - target[i]) * grid.scales[i / k] * rec_weight
            } else {
                0.0
            };
            if let Some(beta) = beta {
                let d = 2.0 * h - 1.0;
                g -= schedule.regularization * beta * d.abs().powf(beta - 1.0) * d.signum() * 2.0;
            }
            let g = g * dh;
            m1[i] = b1 * m1[i] + (1.0 - b1) * g;
            m2[i] = b2 * m2[i] + (1.0 - b2) * g * g;
            v[i] -= lr * m1[i] / (m2[i].sqrt() + eps);
        }
    }
    let mut settled = 0usize;
    let codes = v
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let (h, _) = rectified_sigmoid(*x);
            if h == 0.0 || h == 1.0 {
                settled += 1;
            }
            code_of(i, if h >= 0.5 { 1.0 } else { 0.0 }) as i32
        })
        .collect();
    Rounded {
        codes,
        settled: settled as f64 / v.len().max(1) as f64,
    }
}

/// The float weights of `codes` on `grid` (`o × k`).
pub(crate) fn dequantize(codes: &[i32], k: usize, grid: RowGrid<'_>) -> Vec<f32> {
    codes
        .iter()
        .enumerate()
        .map(|(i, c)| grid.weight(i / k, *c as f32))
        .collect()
}

/// A layer for the learned roundings' tests: 512 rows of `k` inputs mixed from `factors`
/// latent ones plus noise (correlated when `factors` is below `k`), their quantized form on
/// steps of `1 / 8`, 6 rows of weights in `[-1, 1]` and per-row scales of 3-bit grids
/// (`[-4, 3]`, the largest weight at 3 codes).
#[cfg(test)]
pub(crate) fn correlated_layer(
    seed: u64,
    k: usize,
    factors: usize,
) -> (Moments, Vec<f32>, Vec<f32>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (o, n) = (6, 512);
    let mix: Vec<f32> = (0..k * factors).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let (mut x, mut xq) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let z: Vec<f32> = (0..factors).map(|_| rng.gen_range(-1.0..1.0)).collect();
        for j in 0..k {
            let v: f32 = (0..factors)
                .map(|c| mix[j * factors + c] * z[c])
                .sum::<f32>()
                + 0.1 * rng.gen_range(-1.0f32..1.0);
            x.push(v);
            xq.push((v * 8.0).round() / 8.0);
        }
    }
    let w: Vec<f32> = (0..o * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let scales: Vec<f32> = w
        .chunks_exact(k)
        .map(|r| r.iter().fold(0f32, |m, v| m.max(v.abs())) / 3.0)
        .collect();
    let mut m = Moments::new(k);
    let dev = Cpu::default();
    for (a, b) in x.chunks(k * 100).zip(xq.chunks(k * 100)) {
        m.add(&dev, a, b);
    }
    (m, w, scales)
}

/// The nearest codes of weights `w` (`o × k`) on `grid`: what learned rounding is measured
/// against in the tests.
#[cfg(test)]
pub(crate) fn nearest_codes(w: &[f32], k: usize, grid: RowGrid<'_>) -> Vec<i32> {
    w.iter()
        .enumerate()
        .map(|(i, x)| {
            let row = i / k;
            ((x / grid.scales[row]).round_ties_even() as i32 + grid.zero_points[row])
                .clamp(grid.min, grid.max)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer whose inputs are correlated (so that rounding errors can cancel) and whose
    /// quantized inputs carry noise, with per-row grids of 3 bits.
    fn problem(seed: u64) -> (Moments, Vec<f32>, Vec<f32>, Vec<i32>) {
        let (m, w, scales) = correlated_layer(seed, 24, 4);
        let rows = scales.len();
        (m, w, scales, vec![0; rows])
    }

    #[test]
    fn learned_rounding_beats_nearest_and_settles() {
        let dev = Cpu::default();
        for seed in 0..3 {
            let (m, w, scales, zero_points) = problem(seed);
            let grid = RowGrid {
                scales: &scales,
                zero_points: &zero_points,
                min: -4,
                max: 3,
            };
            let nearest = nearest_codes(&w, m.k, grid);
            let schedule = Schedule {
                iterations: 1000,
                learning_rate: 0.01,
                regularization: 1.0,
            };
            let r = adaround(&dev, &m, &w, grid, schedule);
            let e_nearest = m.output_error(&w, &dequantize(&nearest, m.k, grid));
            let e_learned = m.output_error(&w, &dequantize(&r.codes, m.k, grid));
            assert!(
                e_learned < 0.8 * e_nearest,
                "seed {seed}: learned {e_learned} vs nearest {e_nearest}"
            );
            assert!(r.settled > 0.98, "seed {seed}: {} settled", r.settled);
            // Every code is the floor or the ceiling of the weight, on the grid.
            for (i, c) in r.codes.iter().enumerate() {
                let f = (w[i] / scales[i / m.k]).floor() as i32;
                assert!((*c == f || *c == f + 1 || *c == -4 || *c == 3) && (-4..=3).contains(c));
            }
        }
    }

    #[test]
    fn output_error_is_the_mean_squared_output_difference() {
        let dev = Cpu::default();
        let k = 3;
        let x = [1.0f32, 2.0, 0.5, -1.0, 0.0, 2.0];
        let xq = [1.0f32, 2.0, 0.0, -1.0, 0.5, 2.0];
        let mut m = Moments::new(k);
        m.add(&dev, &x, &xq);
        let w = [0.5f32, -1.0, 2.0, 1.0, 1.0, 1.0];
        let wq = [0.5f32, -1.0, 1.5, 1.0, 1.0, 1.0];
        let mut direct = 0.0;
        for r in 0..2 {
            for o in 0..2 {
                let y: f32 = (0..k).map(|j| w[o * k + j] * x[r * k + j]).sum();
                let yq: f32 = (0..k).map(|j| wq[o * k + j] * xq[r * k + j]).sum();
                direct += ((y - yq) as f64).powi(2);
            }
        }
        let got = m.output_error(&w, &wq);
        assert!(
            (got - direct / 4.0).abs() < 1e-5,
            "{got} vs {}",
            direct / 4.0
        );
    }
}
