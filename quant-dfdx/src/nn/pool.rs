//! 2-D max and average pooling: the [`max_pool2d`] and [`avg_pool2d`] ops with hand-written
//! backward passes, and the zero-sized [`MaxPool2d`] and [`AvgPool2d`] modules.

use dfdx::nn::ZeroSizedModule;
use dfdx::prelude::*;
use dfdx::tensor::CpuError;
use quant_core::kernels::pool::{beats, max_pool_2x2, Halving};
use quant_core::Result;
use rayon::prelude::*;

use super::tape::{read, record};
use super::window::{invalid, Window};
use super::FeatureMaps;

/// Outputs at least this many elements are computed in parallel over planes.
const PARALLEL_MIN_LEN: usize = 1 << 14;

/// Validates a pooling window: the shared checks, plus PyTorch's rule that padding is at most
/// half the kernel and a non-empty image, which together guarantee that every window
/// overlaps the input.
fn pool_window(op: &str, dims: [usize; 4], k: usize, s: usize, p: usize) -> Result<Window> {
    let win = Window::new(op, dims, k, s, p)?;
    if p > k / 2 {
        return Err(invalid(
            op,
            "padding",
            p,
            format!(
                "padding must be at most half the kernel size (kernel {k} allows 0..={})",
                k / 2
            ),
        ));
    }
    // With padding alone, a window would pool nothing.
    for (name, len) in [("height", win.h), ("width", win.w)] {
        if len == 0 {
            return Err(invalid(
                op,
                &format!("input {name}"),
                0,
                "pooling needs an image of at least one row and one column".into(),
            ));
        }
    }
    Ok(win)
}

/// The input rows (or columns) `lo..hi` that output position `o` pools over: the window
/// `o * stride - pad .. o * stride - pad + k`, clipped to the input.
fn span(o: usize, win: &Window, len: usize) -> (usize, usize) {
    let start = o * win.stride;
    // `k > pad` (pool_window checks pad <= k / 2), so the subtraction cannot underflow.
    (
        start.saturating_sub(win.pad),
        (start + win.k - win.pad).min(len),
    )
}

/// Runs `f(plane_index, output_plane)` over every output plane, in parallel when large.
fn for_each_plane(out: &mut [f32], plane: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if plane == 0 {
        return;
    }
    if out.len() >= PARALLEL_MIN_LEN {
        out.par_chunks_mut(plane)
            .enumerate()
            .for_each(|(p, o)| f(p, o));
    } else {
        out.chunks_mut(plane).enumerate().for_each(|(p, o)| f(p, o));
    }
}

/// What every pooling op shares: checks the window (see [`pool_window`]), makes the input
/// contiguous, computes the output with `forward(window, input)` (which also returns the
/// backward pass `backward(dy, dx)`, adding into the input's gradient) and records that
/// backward pass on the tape.
fn pool<B, const C: usize, H, W, T, Forward, Backward>(
    op: &str,
    x: Tensor<(B, Const<C>, H, W), f32, Cpu, T>,
    [kernel, stride, padding]: [usize; 3],
    forward: Forward,
) -> Result<FeatureMaps<B, C, T>>
where
    B: Dim,
    H: Dim,
    W: Dim,
    T: Tape<f32, Cpu>,
    Forward: FnOnce(&Window, &[f32]) -> (Vec<f32>, Backward),
    Backward: 'static + FnOnce(&[f32], &mut [f32]) -> std::result::Result<(), CpuError>,
{
    let (batch, _, h, w) = *x.shape();
    let win = pool_window(
        op,
        [batch.size(), C, h.size(), w.size()],
        kernel,
        stride,
        padding,
    )?;
    let (x, mut tape) = x.try_contiguous()?.split_tape();
    let (y, backward) = forward(&win, &read(&x));
    let out = x
        .device()
        .try_tensor_from_vec(y, (batch, Const::<C>, win.oh, win.ow))?;
    let x_ghost = x.ghost();
    record(&out, &mut tape, move |dy, grads| {
        backward(dy, grads.get_or_alloc_mut(&x_ghost)?)
    });
    Ok(out.put_tape(tape))
}

/// Max pooling of one plane `src` (starting at flat index `base` of the batch) into `y` and
/// the flat input index each output took its value from, any window.
fn max_pool_plane(win: &Window, src: &[f32], base: usize, y: &mut [f32], arg: &mut [usize]) {
    for oy in 0..win.oh {
        let (y0, y1) = span(oy, win, win.h);
        for ox in 0..win.ow {
            let (x0, x1) = span(ox, win, win.w);
            let mut best_at = y0 * win.w + x0;
            let mut best = src[best_at];
            for iy in y0..y1 {
                for (ix, &v) in src[iy * win.w..][..x1].iter().enumerate().skip(x0) {
                    if beats(v, best) {
                        best = v;
                        best_at = iy * win.w + ix;
                    }
                }
            }
            y[oy * win.ow + ox] = best;
            arg[oy * win.ow + ox] = base + best_at;
        }
    }
}

/// [`max_pool_plane`] for 2x2 windows at stride 2 without padding (the usual halving), the
/// same results: quant-core's kernel, eight windows to a vector where the CPU has AVX2.
fn max_pool_plane_2x2(win: &Window, src: &[f32], base: usize, y: &mut [f32], arg: &mut [usize]) {
    let shape = Halving {
        width: win.w,
        rows: win.oh,
        cols: win.ow,
    };
    max_pool_2x2(shape, src, base, y, arg);
}

/// 2-D max pooling, PyTorch's `max_pool2d(x, kernel, stride, padding)` (no dilation, floor
/// output size): `(batch, C, h, w)` to `(batch, C, oh, ow)` with
/// `oh = (h + 2 * padding - kernel) / stride + 1`.
///
/// Padding is never selected (it acts as `-inf`). The gradient goes to the position of the
/// maximum; when several positions tie, to the first in row-major order, as PyTorch's CPU
/// kernel does. A NaN in a window is its maximum (the first NaN, when there are several).
///
/// # Errors
///
/// [`QuantError::InvalidValue`](quant_core::QuantError::InvalidValue) when `kernel` or
/// `stride` is 0, `padding > kernel / 2`, the image is empty (no rows or no columns), or the
/// padded input is smaller than the kernel.
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::max_pool2d;
///
/// let dev = Cpu::default();
/// let x = dev.tensor([[[[1.0f32, 2.0], [4.0, 3.0]]]]);
/// let y = max_pool2d(x, 2, 2, 0)?;
/// assert_eq!(y.as_vec(), [4.0]);
/// # Ok::<(), quant_core::QuantError>(())
/// ```
pub fn max_pool2d<B: Dim, const C: usize, H: Dim, W: Dim, T: Tape<f32, Cpu>>(
    x: Tensor<(B, Const<C>, H, W), f32, Cpu, T>,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<FeatureMaps<B, C, T>> {
    pool("max_pool2d", x, [kernel, stride, padding], |win, data| {
        let (plane_in, plane_out) = (win.in_plane(), win.out_plane());
        let mut y = vec![0.0f32; win.batch * C * plane_out];
        // The flat input index each output took its value from, for the backward pass.
        let mut arg = vec![0usize; y.len()];
        let halving = win.k == 2 && win.stride == 2 && win.pad == 0;
        let pool_plane = |p: usize, y_plane: &mut [f32], arg_plane: &mut [usize]| {
            let base = p * plane_in;
            let src = &data[base..][..plane_in];
            if halving {
                max_pool_plane_2x2(win, src, base, y_plane, arg_plane);
            } else {
                max_pool_plane(win, src, base, y_plane, arg_plane);
            }
        };
        if plane_out > 0 {
            if y.len() >= PARALLEL_MIN_LEN {
                y.par_chunks_mut(plane_out)
                    .zip(arg.par_chunks_mut(plane_out))
                    .enumerate()
                    .for_each(|(p, (yp, ap))| pool_plane(p, yp, ap));
            } else {
                for (p, (yp, ap)) in y
                    .chunks_mut(plane_out)
                    .zip(arg.chunks_mut(plane_out))
                    .enumerate()
                {
                    pool_plane(p, yp, ap);
                }
            }
        }
        let backward = move |dy: &[f32], dx: &mut [f32]| {
            for (&i, &g) in arg.iter().zip(dy) {
                dx[i] += g;
            }
            Ok(())
        };
        (y, backward)
    })
}

/// 2-D average pooling, PyTorch's `avg_pool2d(x, kernel, stride, padding)` with its defaults
/// `count_include_pad = True` and `ceil_mode = False`: every output is the sum of its window
/// divided by `kernel * kernel`, padded positions counting as zeros. Output size as
/// [`max_pool2d`].
///
/// The gradient of each output is spread evenly, `dy / (kernel * kernel)`, over the input
/// positions of its window.
///
/// # Errors
///
/// As [`max_pool2d`].
///
/// ```
/// use dfdx::prelude::*;
/// use quant_dfdx::nn::avg_pool2d;
///
/// let dev = Cpu::default();
/// let x = dev.tensor([[[[4.0f32]]]]);
/// // One output whose 3x3 window holds the input and eight zeros of padding.
/// let y = avg_pool2d(x, 3, 1, 1)?;
/// assert_eq!(y.as_vec(), [4.0 / 9.0]);
/// # Ok::<(), quant_core::QuantError>(())
/// ```
pub fn avg_pool2d<B: Dim, const C: usize, H: Dim, W: Dim, T: Tape<f32, Cpu>>(
    x: Tensor<(B, Const<C>, H, W), f32, Cpu, T>,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<FeatureMaps<B, C, T>> {
    pool("avg_pool2d", x, [kernel, stride, padding], |win, data| {
        let win = *win;
        let (plane_in, plane_out) = (win.in_plane(), win.out_plane());
        let inv_area = 1.0 / (win.k * win.k) as f32;
        let mut y = vec![0.0f32; win.batch * C * plane_out];
        for_each_plane(&mut y, plane_out, |p, y_plane| {
            let src = &data[p * plane_in..][..plane_in];
            for oy in 0..win.oh {
                let (y0, y1) = span(oy, &win, win.h);
                for ox in 0..win.ow {
                    let (x0, x1) = span(ox, &win, win.w);
                    let sum: f32 = (y0..y1)
                        .map(|iy| src[iy * win.w + x0..iy * win.w + x1].iter().sum::<f32>())
                        .sum();
                    y_plane[oy * win.ow + ox] = sum * inv_area;
                }
            }
        });
        let backward = move |dy: &[f32], dx: &mut [f32]| {
            if dx.len() != win.batch * C * plane_in {
                return Err(CpuError::WrongNumElements);
            }
            for_each_plane(dx, plane_in, |p, dx_plane| {
                let g_plane = &dy[p * plane_out..][..plane_out];
                for oy in 0..win.oh {
                    let (y0, y1) = span(oy, &win, win.h);
                    for ox in 0..win.ow {
                        let (x0, x1) = span(ox, &win, win.w);
                        let g = g_plane[oy * win.ow + ox] * inv_area;
                        for iy in y0..y1 {
                            for d in &mut dx_plane[iy * win.w + x0..iy * win.w + x1] {
                                *d += g;
                            }
                        }
                    }
                }
            });
            Ok(())
        };
        (y, backward)
    })
}

/// Max pooling layer, PyTorch's `nn.MaxPool2d(K, stride=S, padding=P)`; the stride defaults to
/// the kernel size, as in PyTorch. Acts on `(batch, C, h, w)` with any tape (see
/// [`max_pool2d`]).
///
/// Its `Error` is [`CpuError`], the error type of dfdx's layers, so it composes in tuples with
/// them; invalid geometry (an input smaller than the kernel, `P > K / 2`, `K` or `S` zero) is
/// reported as `CpuError::WrongNumElements`, as is an empty image. Call [`max_pool2d`] for a
/// descriptive error.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MaxPool2d<const K: usize, const S: usize = K, const P: usize = 0>;

/// Average pooling layer, PyTorch's `nn.AvgPool2d(K, stride=S, padding=P)` with
/// `count_include_pad = True`; the stride defaults to the kernel size. See [`avg_pool2d`].
///
/// Errors as [`MaxPool2d`]: `CpuError::WrongNumElements` for invalid geometry.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AvgPool2d<const K: usize, const S: usize = K, const P: usize = 0>;

macro_rules! pool_module {
    ($module:ident, $op:ident) => {
        impl<const K: usize, const S: usize, const P: usize> ZeroSizedModule for $module<K, S, P> {}
        impl<const K: usize, const S: usize, const P: usize> NonMutableModule for $module<K, S, P> {}

        impl<const K: usize, const S: usize, const P: usize, B, const C: usize, H, W, T>
            Module<Tensor<(B, Const<C>, H, W), f32, Cpu, T>> for $module<K, S, P>
        where
            B: Dim,
            H: Dim,
            W: Dim,
            T: Tape<f32, Cpu>,
        {
            type Output = FeatureMaps<B, C, T>;
            type Error = CpuError;

            fn try_forward(
                &self,
                x: Tensor<(B, Const<C>, H, W), f32, Cpu, T>,
            ) -> std::result::Result<Self::Output, CpuError> {
                $op(x, K, S, P).map_err(super::to_cpu_error)
            }
        }
    };
}

pool_module!(MaxPool2d, max_pool2d);
pool_module!(AvgPool2d, avg_pool2d);

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2x2 fast path against the generic loop on planes full of ties (values from a set of
    /// three) and NaNs, odd and even sizes: the same outputs and the same positions.
    #[test]
    fn the_2x2_path_picks_what_the_generic_loop_picks() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for (h, w) in [(2, 2), (4, 6), (5, 7), (28, 28), (3, 2)] {
            let win = pool_window("max_pool2d", [1, 1, h, w], 2, 2, 0).unwrap();
            for _ in 0..20 {
                let src: Vec<f32> = (0..h * w)
                    .map(|_| match next() % 8 {
                        0 => f32::NAN,
                        r => (r % 3) as f32 - 1.0,
                    })
                    .collect();
                let n = win.oh * win.ow;
                let (mut y1, mut a1) = (vec![0.0; n], vec![0; n]);
                let (mut y2, mut a2) = (vec![0.0; n], vec![0; n]);
                max_pool_plane(&win, &src, 7, &mut y1, &mut a1);
                max_pool_plane_2x2(&win, &src, 7, &mut y2, &mut a2);
                assert_eq!(a1, a2, "{h}x{w}: {src:?}");
                let bits = |y: &[f32]| y.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y1), bits(&y2), "{h}x{w}: {src:?}");
            }
        }
    }
}
