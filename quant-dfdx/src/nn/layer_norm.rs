//! Layer normalisation with the numbers of dfdx's `LayerNorm1D`, in one pass per row: the
//! layer and its op.
//!
//! dfdx builds `LayerNorm1D` from eleven tensor ops (a sum and a scaling for the mean, a
//! broadcast subtraction, a square, a second mean, `+ ε`, a square root, a broadcast division,
//! the broadcast `γ` product and `β` sum), each a pass over the tensor through a strided index,
//! each with its own backward pass and gradient buffer: about 25 ns a value for a forward and
//! backward pass. Here each row is read once forward and once backward, and every value is
//! computed by the same `f32` operations in the same order as dfdx's ops compute it (sums left
//! to right, `x·x` for the square, `1/σ` times the gradient for the division, ...), and added
//! into the gradients in the order dfdx's backward ops add them, so the outputs and gradients
//! are dfdx's to the bit. A row's sums are chains of dependent additions; four rows go side by
//! side, so that four chains are in flight at once.

use dfdx::prelude::*;
use dfdx::shapes::Dtype;
use dfdx::tensor::CpuError;
use dfdx::tensor_ops::Device;
use quant_core::dfdx_ops::{custom_op, ParamInput, Scratch};
use quant_core::QuantError;
use rayon::prelude::*;

pub mod builder {
    /// Builds a [`LayerNorm`](super::LayerNorm) over the last `M` features.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct LayerNorm<const M: usize>;
}

impl<const M: usize, E: Dtype, D: Device<E>> BuildOnDevice<D, E> for builder::LayerNorm<M>
where
    LayerNorm<M, E, D>: BuildModule<D, E>,
{
    type Built = LayerNorm<M, E, D>;
    fn try_build_on_device(device: &D) -> Result<Self::Built, D::Err> {
        Self::Built::try_build(device)
    }
}

/// Layer normalisation over the last `M` features, `(x - mean) / sqrt(var + ε) · γ + β`: dfdx's
/// `LayerNorm1D` bit for bit (outputs, and the gradients of the input, `γ` and `β`, for a
/// contiguous input), in one pass per row each way: a quarter of the time for a ViT's
/// LayerNorm (`cargo bench -p quant-benches --bench layer_norm`). A drop-in for it: the same
/// parameters under the same names (`gamma`, `beta`, `epsilon`, so safetensors files load
/// either way), and it converts, quantizes and exports as the same layer kind (`LayerNorm`).
/// Any rank whose last dimension is `M`.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::builders;
///
/// let dev = Cpu::default();
/// let ours = dev.build_module::<builders::LayerNorm<4>, f32>();
/// let dfdx = dev.build_module::<LayerNorm1D<4>, f32>();
/// let x = dev.tensor([[1.0f32, -2.0, 0.5, 3.0], [0.0, 0.25, -1.0, 8.0]]);
/// assert_eq!(ours.forward(x.clone()).as_vec(), dfdx.forward(x).as_vec());
/// ```
#[derive(Debug, Clone)]
pub struct LayerNorm<const M: usize, E: Dtype = f32, D: Storage<E> = Cpu> {
    /// The scale `γ`, one per feature (initialised to ones).
    pub gamma: Tensor<Rank1<M>, E, D>,
    /// The shift `β`, one per feature (initialised to zeros).
    pub beta: Tensor<Rank1<M>, E, D>,
    /// `ε`, added to the variance (default `1e-5`).
    pub epsilon: f64,
}

impl<const M: usize, E: Dtype, D: Storage<E>> NonMutableModule for LayerNorm<M, E, D> {}

impl<const M: usize, E: Dtype, D: Device<E>> TensorCollection<E, D> for LayerNorm<M, E, D> {
    type To<E2: Dtype, D2: Device<E2>> = LayerNorm<M, E2, D2>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        visitor.visit_fields(
            (
                Self::tensor(
                    "gamma",
                    |s| &s.gamma,
                    |s| &mut s.gamma,
                    TensorOptions::reset_to_ones(),
                ),
                Self::tensor(
                    "beta",
                    |s| &s.beta,
                    |s| &mut s.beta,
                    TensorOptions::reset_to_zeros(),
                ),
                Self::scalar(
                    "epsilon",
                    |s| &s.epsilon,
                    |s| &mut s.epsilon,
                    ScalarOptions::from_default(1e-5),
                ),
            ),
            |(gamma, beta, epsilon)| LayerNorm {
                gamma,
                beta,
                epsilon,
            },
        )
    }
}

impl<const M: usize, S: Shape, T: Tape<f32, Cpu>> Module<Tensor<S, f32, Cpu, T>>
    for LayerNorm<M, f32, Cpu>
{
    type Output = Tensor<S, f32, Cpu, T>;
    type Error = CpuError;

    fn try_forward(&self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output, CpuError> {
        layer_norm(x, &self.gamma, &self.beta, self.epsilon).map_err(super::to_cpu_error)
    }
}

/// The [`LayerNorm`] layer's op: normalises each run of `M` values along the last axis, then
/// scales by `gamma` and shifts by `beta`; records its backward pass on an `OwnedTape` (`x`,
/// `gamma` and `beta` get gradients).
///
/// # Errors
/// The last dimension of `x` is not `M` (`LengthMismatch`); the device's (allocation).
pub fn layer_norm<S: Shape, T: Tape<f32, Cpu>, const M: usize>(
    x: Tensor<S, f32, Cpu, T>,
    gamma: &Tensor<Rank1<M>, f32, Cpu>,
    beta: &Tensor<Rank1<M>, f32, Cpu>,
    epsilon: f64,
) -> quant_core::Result<Tensor<S, f32, Cpu, T>> {
    let dims = x.shape().concrete();
    let last = dims.as_ref().last().copied().unwrap_or(1);
    if last != M {
        return Err(QuantError::LengthMismatch {
            what: "LayerNorm input's last dimension".into(),
            expected: M,
            actual: last,
        });
    }
    let rows = Rows {
        // dfdx's mean multiplies the sum by `1/M` taken in f64, and takes ε as f32.
        inv: (1.0 / M as f64) as f32,
        epsilon: epsilon as f32,
    };
    let params = vec![ParamInput::new(gamma, true), ParamInput::new(beta, true)];
    custom_op(
        x,
        params,
        Box::new(move |x, p, y| {
            rows.forward(x, p[0], p[1], y);
            Ok(())
        }),
        Box::new(move |x, p, dy, dx, dp| {
            if let [dgamma, dbeta] = dp {
                rows.backward(x, p[0], dy, dx, dgamma, dbeta);
            }
        }),
    )
}

/// The row arithmetic, dfdx's op by op.
#[derive(Debug, Clone, Copy)]
struct Rows {
    /// `1/M`, rounded to f32.
    inv: f32,
    epsilon: f32,
}

/// Rows taken side by side: each row's sums are chains of dependent additions (dfdx's order),
/// so four rows at a time keep four chains in flight instead of one.
const SIDE_BY_SIDE: usize = 4;

/// Where the backward pass puts each value's terms of `dγ` and `dβ`.
trait Sink {
    /// The terms of the value at `at` (in the piece) of column `j`: `dy` for `dβ`, `x̂ · dy`
    /// for `dγ`.
    fn take(&mut self, j: usize, at: usize, dy: f32, term: f32);
}

/// Added into `dγ` and `dβ` as they come, row by row.
struct AddInto<'a> {
    dgamma: &'a mut [f32],
    dbeta: &'a mut [f32],
}

impl Sink for AddInto<'_> {
    #[inline(always)]
    fn take(&mut self, j: usize, _: usize, dy: f32, term: f32) {
        self.dbeta[j] += dy;
        self.dgamma[j] += term;
    }
}

/// Each value's `dγ` term kept (laid out as the piece) for the caller to add in row order;
/// `dβ`'s terms are the output gradient itself.
struct KeepTerms<'a>(&'a mut [f32]);

impl Sink for KeepTerms<'_> {
    #[inline(always)]
    fn take(&mut self, _: usize, at: usize, _: f32, term: f32) {
        self.0[at] = term;
    }
}

/// Columns of `dγ` and `dβ` whose sums over the rows one parallel piece takes: a cache line of
/// each row.
const COLUMNS_PER_PIECE: usize = 16;

/// Values in each parallel piece of a pass over rows of `m` values (whole groups of
/// [`SIDE_BY_SIDE`] rows), or `len` itself when the pass is not worth splitting.
fn pieces(len: usize, m: usize) -> usize {
    /// Values from which a LayerNorm pass runs in parallel (rayon).
    const PARALLEL_VALUES: usize = 1 << 14;
    let threads = rayon::current_num_threads();
    if len < PARALLEL_VALUES || threads < 2 || m == 0 {
        return len;
    }
    let group = SIDE_BY_SIDE * m;
    let groups = len.div_ceil(group);
    // A few pieces per thread, for balance.
    groups.div_ceil(4 * threads).max(1) * group
}

impl Rows {
    /// The mean and `sqrt(var + ε)` of each of `R` rows (`x` holds them, `m` values each):
    /// dfdx's `sum · (1/M)`, `x - mean`, `c·c`, the same again, `+ ε`, `sqrt`.
    #[inline(always)]
    fn stats<const R: usize>(self, x: &[f32], m: usize) -> ([f32; R], [f32; R]) {
        let mut sum = [0.0f32; R];
        for j in 0..m {
            for r in 0..R {
                sum[r] += x[r * m + j];
            }
        }
        let mean = sum.map(|s| s * self.inv);
        let mut squares = [0.0f32; R];
        for j in 0..m {
            for r in 0..R {
                let c = x[r * m + j] - mean[r];
                squares[r] += c * c;
            }
        }
        let std = squares.map(|q| (q * self.inv + self.epsilon).sqrt());
        (mean, std)
    }

    fn forward(self, x: &[f32], gamma: &[f32], beta: &[f32], y: &mut [f32]) {
        let m = gamma.len();
        if m == 0 {
            return;
        }
        // Rows are independent (and side by side or alone give the same bits): pieces of
        // whole groups of rows run in parallel.
        let piece = pieces(x.len(), m);
        if piece < x.len() {
            x.par_chunks(piece)
                .zip(y.par_chunks_mut(piece))
                .for_each(|(x, y)| self.forward_serial(x, gamma, beta, y));
        } else {
            self.forward_serial(x, gamma, beta, y);
        }
    }

    fn forward_serial(self, x: &[f32], gamma: &[f32], beta: &[f32], y: &mut [f32]) {
        let m = gamma.len();
        let group = SIDE_BY_SIDE * m;
        let whole = x.len() / group * group;
        for (x, y) in x[..whole]
            .chunks_exact(group)
            .zip(y.chunks_exact_mut(group))
        {
            self.forward_rows::<SIDE_BY_SIDE>(x, gamma, beta, y);
        }
        for (x, y) in x[whole..]
            .chunks_exact(m)
            .zip(y[whole..].chunks_exact_mut(m))
        {
            self.forward_rows::<1>(x, gamma, beta, y);
        }
    }

    #[inline(always)]
    fn forward_rows<const R: usize>(self, x: &[f32], gamma: &[f32], beta: &[f32], y: &mut [f32]) {
        let m = gamma.len();
        let (mean, std) = self.stats::<R>(x, m);
        for r in 0..R {
            let (x, y) = (&x[r * m..][..m], &mut y[r * m..][..m]);
            for (((x, y), g), b) in x.iter().zip(y.iter_mut()).zip(gamma).zip(beta) {
                *y = (*x - mean[r]) / std[r] * *g + *b;
            }
        }
    }

    /// dfdx's backward ops in their order (the last op's first), each gradient buffer
    /// starting at zero as dfdx allocates it (hence the `0.0 +`, which turns `-0.0` into
    /// `0.0` as dfdx's `+=` does). `dgamma` and `dbeta` start at zero and are summed over the
    /// rows in order: the rows' input gradients run in parallel pieces, each row's terms of
    /// `dgamma` kept, and the two sums then run over all rows in order.
    fn backward(
        self,
        x: &[f32],
        gamma: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        dgamma: &mut [f32],
        dbeta: &mut [f32],
    ) {
        let m = gamma.len();
        if m == 0 {
            return;
        }
        let piece = pieces(x.len(), m);
        if piece >= x.len() {
            self.backward_serial(x, gamma, dy, dx, &mut AddInto { dgamma, dbeta });
            return;
        }
        let mut terms = Scratch::with_len(x.len());
        x.par_chunks(piece)
            .zip(dy.par_chunks(piece))
            .zip(dx.par_chunks_mut(piece))
            .zip(terms.par_chunks_mut(piece))
            .for_each(|(((x, dy), dx), terms)| {
                self.backward_serial(x, gamma, dy, dx, &mut KeepTerms(terms))
            });
        // Each column summed over the rows in order, as before; the columns split across the
        // threads (a pass over every row on one thread was a serial section).
        let columns = COLUMNS_PER_PIECE.min(m);
        dbeta
            .par_chunks_mut(columns)
            .zip(dgamma.par_chunks_mut(columns))
            .enumerate()
            .for_each(|(k, (dbeta, dgamma))| {
                let first = k * columns;
                for (dy, terms) in dy.chunks_exact(m).zip(terms.chunks_exact(m)) {
                    let (dy, terms) = (&dy[first..], &terms[first..]);
                    for (((b, g), dy), t) in
                        dbeta.iter_mut().zip(dgamma.iter_mut()).zip(dy).zip(terms)
                    {
                        *b += *dy;
                        *g += *t;
                    }
                }
            });
    }

    fn backward_serial(
        self,
        x: &[f32],
        gamma: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        sink: &mut impl Sink,
    ) {
        let m = gamma.len();
        let group = SIDE_BY_SIDE * m;
        let whole = x.len() / group * group;
        let mut d_centered = vec![0.0f32; group];
        let mut d_std_terms = vec![0.0f32; group];
        for (k, ((x, dy), dx)) in x[..whole]
            .chunks_exact(group)
            .zip(dy.chunks_exact(group))
            .zip(dx.chunks_exact_mut(group))
            .enumerate()
        {
            let rows = (x, dy, dx, &mut d_centered[..], &mut d_std_terms[..]);
            self.backward_rows::<SIDE_BY_SIDE>(rows, gamma, sink, k * group);
        }
        for (k, ((x, dy), dx)) in x[whole..]
            .chunks_exact(m)
            .zip(dy[whole..].chunks_exact(m))
            .zip(dx[whole..].chunks_exact_mut(m))
            .enumerate()
        {
            let rows = (x, dy, dx, &mut d_centered[..m], &mut d_std_terms[..m]);
            self.backward_rows::<1>(rows, gamma, sink, whole + k * m);
        }
    }

    /// [`Rows::backward`] for `R` consecutive rows (`x`, `dy`, `dx`, and the scratch
    /// `d_centered` and `d_std_terms`, `R · m` values each): every row's arithmetic as for one
    /// row, the rows' contributions to `dgamma` and `dbeta` added in row order. The element-wise
    /// work (two divisions a value) runs feature by feature within a row, free of the sums'
    /// chains, which then run across the rows side by side over the kept terms.
    #[inline(always)]
    fn backward_rows<const R: usize>(
        self,
        (x, dy, dx, d_centered, d_std_terms): RowsBackward<'_>,
        gamma: &[f32],
        sink: &mut impl Sink,
        first: usize,
    ) {
        let m = gamma.len();
        let (mean, std) = self.stats::<R>(x, m);
        for r in 0..R {
            let inv_std = std[r].recip();
            let std_sq = std[r] * std[r];
            let row = r * m..(r + 1) * m;
            let (x, dy) = (&x[row.clone()], &dy[row.clone()]);
            let d_centered = &mut d_centered[row.clone()];
            let d_std_terms = &mut d_std_terms[row];
            for (j, gamma) in gamma.iter().enumerate() {
                let centered = x[j] - mean[r];
                let normed = centered / std[r];
                // `+ β`: both sides get the output gradient.
                let d_scaled = 0.0 + dy[j];
                // `· γ`: `dβ += dy`, `dγ += x̂ · dy`, now or (kept) later.
                sink.take(j, first + r * m + j, dy[j], normed * d_scaled);
                let d_normed = 0.0 + *gamma * d_scaled;
                // `/ σ`: `1/σ` for the numerator, `-c/σ²` for the (broadcast) denominator.
                d_centered[j] = 0.0 + inv_std * d_normed;
                d_std_terms[j] = -centered / std_sq * d_normed;
            }
        }
        let mut d_std = [0.0f32; R];
        for j in 0..m {
            for r in 0..R {
                d_std[r] += d_std_terms[r * m + j];
            }
        }
        // sqrt, `+ ε`, `· (1/M)`: the variance's scalar chain.
        let mut d_squares = [0.0f32; R];
        for r in 0..R {
            let d_var_eps = 0.0 + (std[r] + std[r]).recip() * d_std[r];
            let d_var = 0.0 + d_var_eps;
            d_squares[r] = 0.0 + self.inv * d_var;
        }
        // The square, then `x - mean` for both sides, then the mean's sum.
        for r in 0..R {
            let d_square = 0.0 + d_squares[r];
            let row = r * m..(r + 1) * m;
            let (x, dx, d_centered) = (&x[row.clone()], &mut dx[row.clone()], &mut d_centered[row]);
            for ((x, dx), d_centered) in x.iter().zip(dx.iter_mut()).zip(d_centered.iter_mut()) {
                let centered = *x - mean[r];
                *d_centered += (centered + centered) * d_square;
                *dx += *d_centered;
            }
        }
        let mut d_mean = [0.0f32; R];
        for j in 0..m {
            for r in 0..R {
                d_mean[r] += -d_centered[r * m + j];
            }
        }
        for r in 0..R {
            let d_sum = 0.0 + self.inv * d_mean[r];
            for dx in dx[r * m..][..m].iter_mut() {
                *dx += d_sum;
            }
        }
    }
}

/// One group of rows for [`Rows::backward_rows`]: `x`, `dy`, `dx`, and two scratch buffers.
type RowsBackward<'a> = (
    &'a [f32],
    &'a [f32],
    &'a mut [f32],
    &'a mut [f32],
    &'a mut [f32],
);
