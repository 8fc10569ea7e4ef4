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
    // The rows are written front to back, each piece (padding or a run of pixels) where the
    // one before ended, so a piece may spill short garbage past its end for the next pieces
    // to overwrite (see `Runs`).
    let [sh, sw] = window.stride;
    let span = window_span(&window, [oh, ow]);
    let padded = match window.padding {
        // Without padding every window lies inside the input itself.
        [0, 0] => None,
        _ => padded_input(input, shape, &window, span, pad, out.len(), |x| x),
    };
    let whole = match (&padded, window.padding) {
        (Some(padded), _) => Some((padded.as_slice(), span[1])),
        (None, [0, 0]) => Some((input, w)),
        (None, _) => None,
    };
    if let Some((source, cols)) = whole {
        // Every window lies inside `source` (`cols` pixels wide): each kernel row is one run
        // of `kw` pixels, with no padding to tell apart. A run moves as whole pieces of 8 or
        // 16 bytes where the pieces' spill past it stays inside both buffers (the next runs
        // overwrite it, see `Runs`); the check is made once per window.
        let (run, line) = (kw * c, cols * c);
        let piece = match run {
            0..=8 => 8,
            _ => 16,
        };
        let spilled = run.next_multiple_of(piece);
        let mut at = 0;
        for oy in 0..oh {
            for ox in 0..ow {
                let from = (oy * sh * cols + ox * sw) * c;
                let last = (kh - 1) * run;
                let fits = at + last + spilled <= out.len()
                    && from + (kh - 1) * line + spilled <= source.len();
                for ky in 0..kh {
                    let (dst, src) = (at + ky * run, from + ky * line);
                    match (fits && run <= 128, piece) {
                        (true, 8) => out[dst..dst + 8].copy_from_slice(&source[src..src + 8]),
                        (true, _) => {
                            for i in (0..spilled).step_by(16) {
                                out[dst + i..dst + i + 16]
                                    .copy_from_slice(&source[src + i..src + i + 16]);
                            }
                        }
                        (false, _) => out[dst..dst + run].copy_from_slice(&source[src..src + run]),
                    }
                }
                at += kh * run;
            }
        }
        debug_assert_eq!(at, out.len());
        return Ok([oh, ow]);
    }
    // Padding, with strides beyond the kernel (a padded copy would hold pixels no window
    // reads): each output column's run of inside pixels, computed once rather than for every
    // row.
    let columns: Vec<(usize, usize, usize)> = (0..ow).map(|ox| inside(ox, 1, &window, w)).collect();
    let mut runs = Runs { out, at: 0 };
    for oy in 0..oh {
        // Kernel rows `ky0..ky0 + ny` fall inside the input (from its row `y0`); the ones
        // above and below are padding.
        let (y0, ky0, ny) = inside(oy, 0, &window, h);
        for &(x0, kx0, nx) in &columns {
            runs.fill(ky0 * kw * c, pad);
            for iy in y0..y0 + ny {
                // Left padding, the run of pixels inside (contiguous in NHWC), right padding.
                runs.fill(kx0 * c, pad);
                runs.copy(input, (iy * w + x0) * c, nx * c);
                runs.fill((kw - kx0 - nx) * c, pad);
            }
            runs.fill((kh - ky0 - ny) * kw * c, pad);
        }
    }
    debug_assert_eq!(runs.at, runs.out.len());
    Ok([oh, ow])
}

/// The rows and columns of the padded input that the windows cover, from the padding's
/// top-left corner: `(o − 1) · stride + kernel` along each axis (at most the padded size).
pub(super) fn window_span(window: &Window, [oh, ow]: [usize; 2]) -> [usize; 2] {
    let axis = |o: usize, d: usize| (o - 1) * window.stride[d] + window.kernel[d];
    [axis(oh, 0), axis(ow, 1)]
}

/// The input `[h, w, c]` as `map` gives each code, inside `fill` padding, over `span`
/// (see [`window_span`]; the input's pixel `(y, x)` at `(y + padding top, x + padding left)`):
/// `None` when that copy would be longer than `limit` values, so that a window's stride
/// far beyond its kernel, or padding far beyond the input, costs no more than the output.
pub(super) fn padded_input<T: Copy>(
    input: &[u8],
    [h, w, c]: [usize; 3],
    window: &Window,
    [rows, cols]: [usize; 2],
    fill: T,
    limit: usize,
    map: impl Fn(u8) -> T,
) -> Option<Vec<T>> {
    let len = rows.checked_mul(cols)?.checked_mul(c)?;
    if len > limit {
        return None;
    }
    let [top, left] = window.padding;
    let mut padded = vec![fill; len];
    // The input's columns inside the span (a stride that skips the last ones leaves them out).
    let width = w.min(cols.saturating_sub(left));
    for y in 0..h.min(rows.saturating_sub(top)) {
        let src = &input[y * w * c..][..width * c];
        let dst = &mut padded[((y + top) * cols + left) * c..][..width * c];
        for (d, x) in dst.iter_mut().zip(src) {
            *d = map(*x);
        }
    }
    Some(padded)
}

/// A buffer written front to back in pieces of a few bytes (im2col's runs: 3 bytes in a
/// 1-channel stem, 48 in a 16-channel 3x3 layer), where a call of `memcpy` or `memset` costs
/// more than the bytes. A short piece is moved as one 8- or 16-byte store, or whole 16-byte
/// stores up to 128 bytes, when that much room is left: the bytes past the piece belong to
/// the pieces after it, which overwrite them. Near the end, and for long pieces, the exact
/// length is written.
struct Runs<'a> {
    out: &'a mut [u8],
    /// Where the next piece goes.
    at: usize,
}

impl Runs<'_> {
    /// The store size that covers `n` bytes, when a store that size fits before the end.
    #[inline(always)]
    fn spill_size(&self, n: usize) -> Option<usize> {
        let size = match n {
            0..=8 => 8,
            9..=128 => n.next_multiple_of(16),
            _ => return None,
        };
        (self.at + size <= self.out.len()).then_some(size)
    }

    /// The next `n` bytes: `src[from..from + n]`.
    #[inline(always)]
    fn copy(&mut self, src: &[u8], from: usize, n: usize) {
        let at = self.at;
        if n == 0 {
            return;
        }
        match self.spill_size(n).filter(|size| from + size <= src.len()) {
            Some(8) => self.out[at..at + 8].copy_from_slice(&src[from..from + 8]),
            Some(size) => {
                for i in (0..size).step_by(16) {
                    self.out[at + i..at + i + 16].copy_from_slice(&src[from + i..from + i + 16]);
                }
            }
            None => self.out[at..at + n].copy_from_slice(&src[from..from + n]),
        }
        self.at += n;
    }

    /// The next `n` bytes: `value`.
    #[inline(always)]
    fn fill(&mut self, n: usize, value: u8) {
        let at = self.at;
        if n == 0 {
            return;
        }
        match self.spill_size(n) {
            Some(8) => self.out[at..at + 8].copy_from_slice(&[value; 8]),
            Some(size) => {
                for i in (0..size).step_by(16) {
                    self.out[at + i..at + i + 16].copy_from_slice(&[value; 16]);
                }
            }
            None => self.out[at..at + n].fill(value),
        }
        self.at += n;
    }
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
