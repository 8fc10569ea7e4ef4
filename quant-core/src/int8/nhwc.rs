//! Convolution helpers on NHWC `u8` codes: im2col rows for [`super::gemm_u8`], and max pooling.
//! (Channels last, so a pixel's channels are contiguous and whole runs of pixels copy at once.)

use super::{check_len, checked_size};
use crate::error::{QuantError, Result};

/// A sliding window over the height and width of a feature map: kernel size, stride and zero
/// padding, each `[height, width]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Steps between windows, down and across.
    pub stride: [usize; 2],
    /// Positions added on each side, top/bottom and left/right.
    pub padding: [usize; 2],
}

impl Window {
    /// A square kernel with the same stride and padding in both directions.
    pub fn square(kernel: usize, stride: usize, padding: usize) -> Window {
        Window {
            kernel: [kernel; 2],
            stride: [stride; 2],
            padding: [padding; 2],
        }
    }

    /// Output height and width for an input of `height × width`: `None` when the kernel does
    /// not fit the padded input, a kernel or stride is 0, or the sizes overflow.
    pub fn output_size(&self, height: usize, width: usize) -> Option<[usize; 2]> {
        let axis = |len: usize, d: usize| -> Option<usize> {
            let (k, s, p) = (self.kernel[d], self.stride[d], self.padding[d]);
            if k == 0 || s == 0 {
                return None;
            }
            let padded = len.checked_add(p.checked_mul(2)?)?;
            Some(padded.checked_sub(k)? / s + 1)
        };
        Some([axis(height, 0)?, axis(width, 1)?])
    }

    /// Checks that `input_len` is `h·w·c`, then returns the output size, or an error saying
    /// why the window does not fit.
    pub(super) fn checked_output(
        &self,
        input_len: usize,
        [h, w, c]: [usize; 3],
    ) -> Result<[usize; 2]> {
        check_len("input", volume("input", [h, w, c])?, input_len)?;
        self.output_size(h, w)
            .filter(|_| h > 0 && w > 0 && c > 0)
            .ok_or_else(|| QuantError::InvalidValue {
                what: "window".into(),
                value: format!("{self:?} on a {h}x{w}x{c} input"),
                expected: "a non-empty input, kernel and stride at least 1, and a kernel that fits the padded input".into(),
            })
    }
}

/// `a·b·c`, or an error naming `what` when it overflows.
pub(super) fn volume(what: &str, [a, b, c]: [usize; 3]) -> Result<usize> {
    checked_size(what, checked_size(what, a, b)?, c)
}

/// The input rows `ky` and columns `kx` of the window at output `(oy, ox)` that lie inside the
/// input: `(first input row or column, first kernel position inside, kernel positions inside)`.
pub(super) fn inside(o: usize, d: usize, window: &Window, len: usize) -> (usize, usize, usize) {
    let start = (o * window.stride[d]) as isize - window.padding[d] as isize;
    let first_k = (-start).max(0) as usize;
    let end = (start + window.kernel[d] as isize).min(len as isize);
    let first_in = (start + first_k as isize) as usize;
    let count = (end - first_in as isize).max(0) as usize;
    (first_in, first_k.min(window.kernel[d]), count)
}

/// im2col of one sample `[h, w, c]` (NHWC, `u8` codes) into rows `[oh·ow, kh·kw·c]`, each
/// ordered `(ky, kx, c)`: row `oy·ow + ox` holds the window at output `(oy, ox)`. Positions in
/// the padding hold `pad` (the zero point's code, the real value 0). Returns `[oh, ow]`.
///
/// ```
/// use quant_core::int8::{im2col_u8, Window};
/// // A 2x2 single-channel image, 2x2 kernel, padding 1: 3x3 outputs of 4 codes.
/// let mut rows = vec![0u8; 9 * 4];
/// let [oh, ow] = im2col_u8(&[1, 2, 3, 4], [2, 2, 1], Window::square(2, 1, 1), 9, &mut rows)?;
/// assert_eq!((oh, ow), (3, 3));
/// assert_eq!(&rows[..4], &[9, 9, 9, 1]); // top-left window: only its last tap is inside
/// assert_eq!(&rows[16..20], &[1, 2, 3, 4]); // the centre window covers the whole image
/// # Ok::<(), quant_core::QuantError>(())
/// ```
///
/// # Errors
/// `input.len() != h·w·c`, a window that does not fit (see [`Window::output_size`]), or `out`
/// not `oh·ow·kh·kw·c` long. Nothing is written then.
pub fn im2col_u8(
    input: &[u8],
    shape: [usize; 3],
    window: Window,
    pad: u8,
    out: &mut [u8],
) -> Result<[usize; 2]> {
    let [h, w, c] = shape;
    let [oh, ow] = window.checked_output(input.len(), shape)?;
    let [kh, kw] = window.kernel;
    let row_len = volume("im2col row", [kh, kw, c])?;
    let rows = checked_size("im2col rows", oh, ow)?;
    check_len(
        "im2col output",
        checked_size("im2col output", rows, row_len)?,
        out.len(),
    )?;
    for (pos, row) in out.chunks_exact_mut(row_len).enumerate() {
        let (oy, ox) = (pos / ow, pos % ow);
        let (x0, kx0, nx) = inside(ox, 1, &window, w);
        for (ky, taps) in row.chunks_exact_mut(kw * c).enumerate() {
            let iy = (oy * window.stride[0] + ky) as isize - window.padding[0] as isize;
            if iy < 0 || iy >= h as isize || nx == 0 {
                taps.fill(pad);
                continue;
            }
            // Left padding, the run of pixels inside (contiguous in NHWC), right padding.
            let (left, rest) = taps.split_at_mut(kx0 * c);
            let (middle, right) = rest.split_at_mut(nx * c);
            left.fill(pad);
            let start = (iy as usize * w + x0) * c;
            middle.copy_from_slice(&input[start..start + nx * c]);
            right.fill(pad);
        }
    }
    Ok([oh, ow])
}

/// Max pooling of one sample `[h, w, c]` (NHWC, `u8` codes) into `[oh, ow, c]`: padding never
/// wins (as PyTorch pads with `-inf`). Codes compare as the real values do, since the scale
/// is positive and one zero point is shared. Returns `[oh, ow]`.
///
/// # Errors
/// `input.len() != h·w·c`, a window that does not fit, padding above half the kernel
/// (PyTorch's rule: every window must overlap the input), or `out` not `oh·ow·c` long.
pub fn max_pool_u8(
    input: &[u8],
    shape: [usize; 3],
    window: Window,
    out: &mut [u8],
) -> Result<[usize; 2]> {
    max_pool(input, shape, window, out, u8::MIN)
}

/// [`max_pool_u8`] on `i32` accumulators (a pooling that follows a layer whose output is not
/// requantized), with the same checks.
///
/// # Errors
/// As [`max_pool_u8`].
pub fn max_pool_i32(
    input: &[i32],
    shape: [usize; 3],
    window: Window,
    out: &mut [i32],
) -> Result<[usize; 2]> {
    max_pool(input, shape, window, out, i32::MIN)
}

fn max_pool<T: Copy + Ord>(
    input: &[T],
    shape: [usize; 3],
    window: Window,
    out: &mut [T],
    lowest: T,
) -> Result<[usize; 2]> {
    let [h, w, c] = shape;
    let [oh, ow] = window.checked_output(input.len(), shape)?;
    for d in 0..2 {
        if window.padding[d] * 2 > window.kernel[d] {
            return Err(QuantError::InvalidValue {
                what: "max pooling padding".into(),
                value: format!("{:?}", window.padding),
                expected: format!("at most half the kernel {:?}", window.kernel),
            });
        }
    }
    check_len(
        "pooled output",
        volume("pooled output", [oh, ow, c])?,
        out.len(),
    )?;
    for (pos, px) in out.chunks_exact_mut(c).enumerate() {
        let (oy, ox) = (pos / ow, pos % ow);
        let (y0, _, ny) = inside(oy, 0, &window, h);
        let (x0, _, nx) = inside(ox, 1, &window, w);
        px.fill(lowest);
        for iy in y0..y0 + ny {
            let run = &input[(iy * w + x0) * c..(iy * w + x0 + nx) * c];
            for pixel in run.chunks_exact(c) {
                for (o, v) in px.iter_mut().zip(pixel) {
                    *o = (*o).max(*v);
                }
            }
        }
    }
    Ok([oh, ow])
}
