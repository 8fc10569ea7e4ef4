//! 2-D convolution: the [`conv2d`] op (im2col + one GEMM, with a hand-written backward) and
//! the [`Conv2d`] module.

use dfdx::prelude::*;
use dfdx::tensor::CpuError;
use quant_core::Result;
use rand::distributions::uniform::SampleUniform;
use rayon::prelude::*;

use super::tape::{accumulate, read, record};
use super::window::Window;
use super::FeatureMaps;

/// Buffers at least this long are filled in parallel; below it rayon's hand-off costs more
/// than the loop.
const PARALLEL_MIN_LEN: usize = 1 << 15;

/// 2-D convolution of a batch of images, with bias: PyTorch's `conv2d` (square kernel, equal
/// stride and zero padding on both axes, no dilation, one group).
///
/// `x` is `(batch, C, height, width)`, `weight` is `(O, C, K, K)`, `bias` is `(O,)`. The output
/// is `(batch, O, oh, ow)` with `oh = (height + 2 * padding - K) / stride + 1` (floor) and the
/// same for `ow`.
///
/// All three tensors carry the same tape type. Callers usually pass module parameters with
/// `.retaped::<T>()`; a weight produced by another op (a fake-quantizer, say) may carry its
/// own tape, which is merged, so the weight's gradient flows back through that op. Inputs
/// need not be contiguous.
///
/// # Errors
///
/// [`QuantError::InvalidValue`](quant_core::QuantError::InvalidValue) when `K` or `stride` is
/// 0, or when the padded input is smaller than the kernel; the message names the argument and
/// the valid range.
///
/// # Implementation
///
/// The input is unfolded into a `(C * K * K, batch * oh * ow)` column matrix (im2col) and
/// multiplied by the `(O, C * K * K)` weight matrix in one call of dfdx's matmul (gemm). The
/// whole op is a single node on the tape: its backward computes the weight gradient as
/// `dy · colsᵀ`, the column gradient as `Wᵀ · dy`, folds the latter back onto the input
/// (col2im, a scatter-add) and sums `dy` for the bias.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_ops::nn::conv2d;
///
/// let dev = Cpu::default();
/// let x: Tensor<Rank4<2, 3, 8, 8>, f32, _> = dev.sample_normal();
/// let w: Tensor<Rank4<4, 3, 3, 3>, f32, _> = dev.sample_normal();
/// let b: Tensor<Rank1<4>, f32, _> = dev.zeros();
/// let grads = w.alloc_grads();
/// let y = conv2d(x.trace(grads), w.retaped(), b.retaped(), 2, 1)?;
/// assert_eq!(y.shape().2, 4); // (8 + 2 - 3) / 2 + 1
/// let grads = y.square().mean().backward();
/// assert_eq!(grads.get(&w).shape(), w.shape());
/// # Ok::<(), quant_core::QuantError>(())
/// ```
pub fn conv2d<B, const C: usize, H, W, const O: usize, const K: usize, T>(
    x: Tensor<(B, Const<C>, H, W), f32, Cpu, T>,
    weight: Tensor<Rank4<O, C, K, K>, f32, Cpu, T>,
    bias: Tensor<Rank1<O>, f32, Cpu, T>,
    stride: usize,
    padding: usize,
) -> Result<FeatureMaps<B, O, T>>
where
    B: Dim,
    H: Dim,
    W: Dim,
    T: Tape<f32, Cpu> + Merge<T>,
{
    let (batch, _, h, w) = *x.shape();
    let win = Window::new(
        "conv2d",
        [batch.size(), C, h.size(), w.size()],
        K,
        stride,
        padding,
    )?;
    // Gradient buffers follow physical storage: work on contiguous tensors only.
    let (x, x_tape) = x.try_contiguous()?.split_tape();
    let (weight, w_tape) = weight.try_contiguous()?.split_tape();
    let (bias, b_tape) = bias.try_contiguous()?.split_tape();
    let mut tape = x_tape.merge(w_tape).merge(b_tape);
    let dev = x.device().clone();

    let taps = C * K * K;
    let n = win.batch * win.out_plane();
    let cols = im2col(&read(&x), &win);
    let cols = dev.try_tensor_from_vec(cols, (taps, n))?;
    // A reshape of a contiguous tensor shares its buffer: no copy of the weight.
    let w_mat: Tensor<(Const<O>, usize), f32, Cpu> =
        weight.clone().try_reshape_like(&(Const, taps))?;
    let bias_data = read(&bias);

    let ohw = win.out_plane();
    let mut y = vec![0.0f32; win.batch * O * ohw];
    if taps > 0 && n > 0 && O > 0 {
        // (O, taps) x (taps, batch * ohw): one large GEMM instead of one small one per image.
        let prod = read(&w_mat.clone().try_matmul(cols.clone())?);
        for (i, dst) in y.chunks_exact_mut(ohw).enumerate() {
            let (bi, o) = (i / O, i % O);
            let src = &prod[o * n + bi * ohw..][..ohw];
            let b = bias_data[o];
            for (d, s) in dst.iter_mut().zip(src) {
                *d = s + b;
            }
        }
    } else if ohw > 0 {
        for (i, dst) in y.chunks_exact_mut(ohw).enumerate() {
            dst.fill(bias_data[i % O]);
        }
    }
    let out = dev.try_tensor_from_vec(y, (batch, Const::<O>, win.oh, win.ow))?;

    let (x_ghost, w_ghost, b_ghost) = (x.ghost(), weight.ghost(), bias.ghost());
    record(&out, &mut tape, move |dy, grads| {
        let mut db = vec![0.0f32; O];
        if ohw > 0 {
            for (i, chunk) in dy.chunks_exact(ohw).enumerate() {
                db[i % O] += chunk.iter().sum::<f32>();
            }
        }
        accumulate(grads.get_or_alloc_mut(&b_ghost)?, &db)?;
        if taps == 0 || n == 0 || O == 0 {
            // Nothing flows, but the gradients must exist for whoever reads them.
            grads.try_alloc_for(&x_ghost)?;
            grads.try_alloc_for(&w_ghost)?;
            return Ok(());
        }
        // dy as the (O, batch * ohw) matrix the forward GEMM produced.
        let mut dy_mat = vec![0.0f32; O * n];
        for (i, src) in dy.chunks_exact(ohw).enumerate() {
            let (bi, o) = (i / O, i % O);
            dy_mat[o * n + bi * ohw..][..ohw].copy_from_slice(src);
        }
        let dy_mat = cols.device().try_tensor_from_vec(dy_mat, (Const::<O>, n))?;
        let dw = dy_mat
            .clone()
            .try_matmul(cols.try_permute::<_, Axes2<1, 0>>()?)?;
        accumulate(grads.get_or_alloc_mut(&w_ghost)?, &read(&dw))?;
        let dcols = read(&w_mat.try_permute::<_, Axes2<1, 0>>()?.try_matmul(dy_mat)?);
        col2im(&dcols, &win, grads.get_or_alloc_mut(&x_ghost)?)
    });
    Ok(out.put_tape(tape))
}

/// Unfolds `x` (`(batch, C, h, w)`, contiguous) into the `(C * K * K, batch * oh * ow)` column
/// matrix: row `(c, kh, kw)`, column `(b, oy, ox)` holds `x[b, c, oy*s + kh - p, ox*s + kw - p]`,
/// or 0 where that lies in the padding.
fn im2col(x: &[f32], win: &Window) -> Vec<f32> {
    let Window {
        batch,
        channels,
        w,
        k,
        stride,
        pad,
        ow,
        ..
    } = *win;
    let (ohw, plane) = (win.out_plane(), win.in_plane());
    let n = batch * ohw;
    let mut cols = vec![0.0f32; channels * k * k * n];
    if n == 0 || cols.is_empty() {
        return cols;
    }
    let fill_row = |r: usize, row: &mut [f32]| {
        let (c, kh, kw) = (r / (k * k), (r / k) % k, r % k);
        let (ylo, yhi) = win.rows(kh);
        let (xlo, xhi) = win.cols(kw);
        if xlo >= xhi {
            return;
        }
        for b in 0..batch {
            let src_plane = &x[(b * channels + c) * plane..][..plane];
            let dst_plane = &mut row[b * ohw..][..ohw];
            for oy in ylo..yhi {
                let src = &src_plane[(oy * stride + kh - pad) * w..][..w];
                let dst = &mut dst_plane[oy * ow..][..ow];
                if stride == 1 {
                    let ix = xlo + kw - pad;
                    dst[xlo..xhi].copy_from_slice(&src[ix..ix + (xhi - xlo)]);
                } else {
                    for (ox, d) in dst.iter_mut().enumerate().take(xhi).skip(xlo) {
                        *d = src[ox * stride + kw - pad];
                    }
                }
            }
        }
    };
    if cols.len() >= PARALLEL_MIN_LEN {
        cols.par_chunks_mut(n)
            .enumerate()
            .for_each(|(r, row)| fill_row(r, row));
    } else {
        cols.chunks_mut(n)
            .enumerate()
            .for_each(|(r, row)| fill_row(r, row));
    }
    cols
}

/// The adjoint of [`im2col`]: adds every entry of the column gradient `dcols` into the input
/// position it was read from. Parallel over input planes, which no two threads share.
fn col2im(dcols: &[f32], win: &Window, dx: &mut [f32]) -> std::result::Result<(), CpuError> {
    let Window {
        batch,
        channels,
        w,
        k,
        stride,
        pad,
        ow,
        ..
    } = *win;
    let (ohw, plane) = (win.out_plane(), win.in_plane());
    let n = batch * ohw;
    if dx.len() != batch * channels * plane || dcols.len() != channels * k * k * n {
        return Err(CpuError::WrongNumElements);
    }
    if plane == 0 {
        return Ok(());
    }
    let add_plane = |p: usize, dst_plane: &mut [f32]| {
        let (b, c) = (p / channels, p % channels);
        for kh in 0..k {
            let (ylo, yhi) = win.rows(kh);
            for kw in 0..k {
                let (xlo, xhi) = win.cols(kw);
                if xlo >= xhi {
                    continue;
                }
                let src_plane = &dcols[((c * k + kh) * k + kw) * n + b * ohw..][..ohw];
                for oy in ylo..yhi {
                    let dst = &mut dst_plane[(oy * stride + kh - pad) * w..][..w];
                    let src = &src_plane[oy * ow..][..ow];
                    if stride == 1 {
                        let ix = xlo + kw - pad;
                        for (d, s) in dst[ix..ix + (xhi - xlo)].iter_mut().zip(&src[xlo..xhi]) {
                            *d += *s;
                        }
                    } else {
                        for (ox, s) in src.iter().enumerate().take(xhi).skip(xlo) {
                            dst[ox * stride + kw - pad] += *s;
                        }
                    }
                }
            }
        }
    };
    if dx.len() >= PARALLEL_MIN_LEN {
        dx.par_chunks_mut(plane)
            .enumerate()
            .for_each(|(p, d)| add_plane(p, d));
    } else {
        dx.chunks_mut(plane)
            .enumerate()
            .for_each(|(p, d)| add_plane(p, d));
    }
    Ok(())
}

/// The builder of [`Conv2d`], for `dev.build_module::<builder::Conv2d<..>, f32>()`.
pub mod builder {
    /// Builds a [`Conv2d`](super::Conv2d) with `C_IN` input channels, `C_OUT` output
    /// channels, a `K x K` kernel, stride `STRIDE` and zero padding `PAD`.
    #[derive(Debug, Copy, Clone, Eq, PartialEq)]
    pub struct Conv2d<
        const C_IN: usize,
        const C_OUT: usize,
        const K: usize,
        const STRIDE: usize = 1,
        const PAD: usize = 0,
    >;
}

impl<const I: usize, const O: usize, const K: usize, const S: usize, const P: usize, E, D>
    BuildOnDevice<D, E> for builder::Conv2d<I, O, K, S, P>
where
    E: Dtype,
    D: Device<E>,
    Conv2d<I, O, K, S, P, E, D>: BuildModule<D, E>,
{
    type Built = Conv2d<I, O, K, S, P, E, D>;
    fn try_build_on_device(device: &D) -> std::result::Result<Self::Built, D::Err> {
        Self::Built::try_build(device)
    }
}

/// A 2-D convolution layer with bias, PyTorch's `nn.Conv2d(C_IN, C_OUT, K, stride=STRIDE,
/// padding=PAD)`; the stable-Rust counterpart of dfdx's nightly-only `Conv2D`.
///
/// Acts on batches of images `(batch, C_IN, height, width)` with any batch and image size and
/// any tape, giving `(batch, C_OUT, oh, ow)` with `usize` spatial dimensions (see [`conv2d`]).
/// Parameters are initialised as PyTorch does: uniform in `±1/sqrt(C_IN * K * K)`, for the
/// weight and the bias alike.
///
/// # Errors
///
/// dfdx tuples of modules require one error type, and dfdx's own layers use
/// [`CpuError`], so this module's `Error` is `CpuError` too: an input smaller than the kernel,
/// or `K == 0` / `STRIDE == 0`, is reported as `CpuError::WrongNumElements`. Call [`conv2d`]
/// directly for an error that says what was wrong.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_ops::nn::builders;
///
/// let dev = Cpu::default();
/// let conv = dev.build_module::<builders::Conv2d<1, 8, 3, 1, 1>, f32>();
/// let x: Tensor<Rank4<2, 1, 8, 8>, f32, _> = dev.sample_normal();
/// let y = conv.forward(x);
/// assert_eq!(*y.shape(), (Const::<2>, Const::<8>, 8, 8));
/// ```
#[derive(Debug, Clone)]
pub struct Conv2d<
    const C_IN: usize,
    const C_OUT: usize,
    const K: usize,
    const STRIDE: usize = 1,
    const PAD: usize = 0,
    E: Dtype = f32,
    D: Storage<E> = Cpu,
> {
    /// The kernels, `(C_OUT, C_IN, K, K)`.
    pub weight: Tensor<Rank4<C_OUT, C_IN, K, K>, E, D>,
    /// One bias per output channel.
    pub bias: Tensor<Rank1<C_OUT>, E, D>,
}

impl<
        const I: usize,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        E: Dtype,
        D: Storage<E>,
    > NonMutableModule for Conv2d<I, O, K, S, P, E, D>
{
}

impl<const I: usize, const O: usize, const K: usize, const S: usize, const P: usize, E, D>
    TensorCollection<E, D> for Conv2d<I, O, K, S, P, E, D>
where
    E: Dtype + SampleUniform,
    D: Device<E>,
{
    type To<E2: Dtype, D2: Device<E2>> = Conv2d<I, O, K, S, P, E2, D2>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> std::result::Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        visitor.visit_fields(
            (
                Self::tensor(
                    "weight",
                    |s| &s.weight,
                    |s| &mut s.weight,
                    TensorOptions::reset_with(|t| {
                        t.try_fill_with_distr(init_distribution::<E>(I * K * K))
                    }),
                ),
                Self::tensor(
                    "bias",
                    |s| &s.bias,
                    |s| &mut s.bias,
                    TensorOptions::reset_with(|t| {
                        t.try_fill_with_distr(init_distribution::<E>(I * K * K))
                    }),
                ),
            ),
            |(weight, bias)| Conv2d { weight, bias },
        )
    }
}

/// PyTorch's default for conv weights and biases: uniform in `±1/sqrt(fan_in)`.
fn init_distribution<E: Dtype + SampleUniform>(fan_in: usize) -> rand::distributions::Uniform<E> {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    let zero = E::default();
    // Every float dtype represents the bound; the fallback keeps the range non-empty (which
    // `Uniform::new` requires) for integer dtypes, which a convolution never uses.
    let b = match E::from_f64(bound) {
        Some(b) if b > zero => b,
        _ => E::ONE,
    };
    rand::distributions::Uniform::new(zero - b, b)
}

impl<
        const I: usize,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        B,
        H,
        W,
        T,
    > Module<Tensor<(B, Const<I>, H, W), f32, Cpu, T>> for Conv2d<I, O, K, S, P, f32, Cpu>
where
    B: Dim,
    H: Dim,
    W: Dim,
    T: Tape<f32, Cpu> + Merge<T>,
{
    type Output = FeatureMaps<B, O, T>;
    type Error = CpuError;

    fn try_forward(
        &self,
        x: Tensor<(B, Const<I>, H, W), f32, Cpu, T>,
    ) -> std::result::Result<Self::Output, CpuError> {
        conv2d(
            x,
            self.weight.retaped::<T>(),
            self.bias.retaped::<T>(),
            S,
            P,
        )
        .map_err(super::to_cpu_error)
    }
}
