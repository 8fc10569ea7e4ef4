//! Convolution on NHWC `u8` codes: im2col rows for [`super::gemm_u8`], the convolution that reads
//! its windows in place ([`conv_u8`]), and max pooling.
//! (Channels last, so a pixel's channels are contiguous and whole runs of pixels copy at once.)

use super::{check_len, checked_size, gemm_u8, PackedMatrix};
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
    // The source every window lies inside, and its width in pixels: the input itself when
    // unpadded, else a padded copy where one is no longer than the output.
    let padded;
    let whole = match window.padding {
        [0, 0] => Some((input, w)),
        _ => {
            padded = padded_input(input, shape, &window, span, pad, out.len(), |x| x);
            padded.as_deref().map(|p| (p, span[1]))
        }
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

/// A convolution of one group: `samples` NHWC inputs `[h, w, c]` of codes with zero point
/// `a_zero` (whose code also pads them) by `w` (fan-in `kh · kw · c`, in [`im2col_u8`]'s
/// order) plus `bias`, into `samples · oh · ow` rows of `w.n()` accumulators; returns
/// `[oh, ow]`. The bits are those of [`im2col_u8`] then [`gemm_u8`]: on the x86 paths the
/// product reads each window where it lies (in the input, or in one padded copy of the batch)
/// rather than from patches written out, where a kernel row's `kw · c` codes are whole groups
/// of the weights' form or the weights are packed by kernel rows
/// ([`PackedMatrix::for_windows`]), and the copy is no longer than the patches; elsewhere it
/// writes the patches.
///
/// ```
/// use quant_core::int8::{conv_u8, PackedMatrix, Window};
///
/// // A 3x3 input of one channel, a 2x2 kernel of ones, zero point 1 (the padding's code).
/// let w = PackedMatrix::new(&[1, 1, 1, 1], 1, 4)?;
/// let mut acc = [0i32; 4];
/// let codes = [1, 2, 3, 4, 5, 6, 7, 8, 9];
/// let out = conv_u8(&codes, [1, 3, 3, 1], Window::square(2, 1, 0), 1, &w, &[0], &mut acc)?;
/// assert_eq!(out, [2, 2]);
/// assert_eq!(acc, [8, 12, 20, 24]); // (1+2+4+5) - 4·1, ...
/// # Ok::<(), quant_core::QuantError>(())
/// ```
///
/// # Errors
/// An input that is not `samples` inputs of `[h, w, c]`, a window that does not fit (see
/// [`im2col_u8`]), a zero point outside `[0, 255]` (it pads the codes), weights whose fan-in is
/// not the window's, `bias` or `out` of other lengths; nothing is written then.
pub fn conv_u8(
    input: &[u8],
    [samples, h, w, c]: [usize; 4],
    window: Window,
    a_zero: i32,
    weights: &PackedMatrix,
    bias: &[i32],
    out: &mut [i32],
) -> Result<[usize; 2]> {
    let shape = [h, w, c];
    let per_sample = volume("input", shape)?;
    check_len(
        "input",
        checked_size("input", samples, per_sample)?,
        input.len(),
    )?;
    let output = window.checked_output(per_sample, shape)?;
    let pad = u8::try_from(a_zero).map_err(|_| QuantError::InvalidValue {
        what: "activation zero point of a convolution".into(),
        value: a_zero.to_string(),
        expected: "a code within [0, 255] (it pads the input)".into(),
    })?;
    let [kh, kw] = window.kernel;
    let k = volume("window", [kh, kw, c])?;
    check_len(
        "weights' fan-in (kernel height · width · channels)",
        k,
        weights.k(),
    )?;
    let positions = checked_size("output", output[0], output[1])?;
    let rows = checked_size("output", samples, positions)?;
    check_len("bias", weights.n(), bias.len())?;
    check_len(
        "output",
        checked_size("output", rows, weights.n())?,
        out.len(),
    )?;
    if rows == 0 || weights.n() == 0 {
        return Ok(output);
    }
    #[cfg(target_arch = "x86_64")]
    if windows_in_place(
        input,
        [samples, h, w, c],
        window,
        output,
        a_zero,
        weights,
        bias,
        out,
    )
    .is_some()
    {
        return Ok(output);
    }
    let mut patches = vec![0u8; checked_size("im2col patches", rows, k)?];
    for (xs, ps) in input
        .chunks(per_sample)
        .zip(patches.chunks_mut(positions * k))
    {
        im2col_u8(xs, shape, window, pad, ps)?;
    }
    gemm_u8(&patches, rows, a_zero, weights, bias, out)?;
    Ok(output)
}

/// [`conv_u8`] reading the windows where they lie, for checked operands (`a_zero` a code,
/// at least one row and one output channel); `None`, with nothing written, where the path or
/// the window does not allow it (see [`conv_u8`]).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn windows_in_place(
    input: &[u8],
    [samples, h, w, c]: [usize; 4],
    window: Window,
    output: [usize; 2],
    a_zero: i32,
    weights: &PackedMatrix,
    bias: &[i32],
    out: &mut [i32],
) -> Option<()> {
    use super::gemm::{split_rows, zero_point_columns, Form};
    use super::x86::{i16_chunk, run_windows, WindowOperands};
    use super::Isa;

    let form = weights.form();
    let [kh, kw] = window.kernel;
    // Each kernel row is read as `run` whole groups: its codes exactly, or, where the weights
    // pack it zero-padded (`PackedMatrix::for_windows`), its codes and up to a group's worth
    // after them, which a zero weight cancels.
    let run = match weights.runs() {
        _ if weights.isa() == Isa::Portable || form == Form::Rows => return None,
        Some(runs) if runs.count == kh && runs.codes == kw * c => runs.groups,
        None if (kw * c) % form.group() == 0 => kw * c / form.group(),
        _ => return None,
    };
    // Past the last window's last kernel row: the codes its last group reads beyond it.
    let slack = run * form.group() - kw * c;
    let span = window_span(&window, output);
    // The copy and the windows' starts together take no more memory than the patches they
    // replace (which the runtime's working-memory budget counts).
    let rows = samples.checked_mul(output[0] * output[1])?;
    let room = (rows.checked_mul(kh * kw * c)?).checked_sub(rows.checked_mul(size_of::<u32>())?)?;
    let limit = room / if form == Form::Quads { 1 } else { 2 };
    let pad = a_zero as u8;
    // The windows' source, its width in pixels, its bytes per sample and per code: the input
    // itself where the form reads codes as bytes (quads), nothing pads it and no run reads past
    // its codes; else one copy of the batch, padded, with the slack at its end, in the form's
    // width (`u16` codes for pairs).
    let (narrow, wide);
    let (source, cols, sample_bytes, code_bytes): (&[u8], usize, usize, usize) =
        match (form, window.padding) {
            (Form::Quads, [0, 0]) if slack == 0 => (input, w, h * w * c, 1),
            (Form::Quads, _) => {
                narrow = batch_copy(
                    input,
                    samples,
                    [h, w, c],
                    &window,
                    span,
                    pad,
                    limit,
                    slack,
                    |x| x,
                )?;
                (&narrow[..], span[1], (narrow.len() - slack) / samples, 1)
            }
            _ => {
                wide = batch_copy(
                    input,
                    samples,
                    [h, w, c],
                    &window,
                    span,
                    pad as u16,
                    limit,
                    slack,
                    |x| x as u16,
                )?;
                let bytes: &[u8] = bytemuck::cast_slice(&wide);
                (bytes, span[1], (wide.len() - slack) * 2 / samples, 2)
            }
        };
    // The windows' starts as `u32`s, half the memory of `usize`s (a 1-channel stem's patches
    // are 9 bytes a window).
    if u32::try_from(source.len()).is_err() {
        return None;
    }
    let [sh, sw] = window.stride;
    let [oh, ow] = output;
    let pixel = c * code_bytes;
    let mut starts = Vec::with_capacity(rows);
    for s in 0..samples {
        for oy in 0..oh {
            let row = s * sample_bytes + oy * sh * cols * pixel;
            starts.extend((0..ow).map(|ox| (row + ox * sw * pixel) as u32));
        }
    }
    let chunk = match (weights.isa(), form) {
        (Isa::Avx2 | Isa::Avx512Bw, Form::Quads) => i16_chunk(source, weights.max_abs()),
        _ => None,
    };
    let columns = zero_point_columns(weights, a_zero, bias);
    let n = weights.n();
    split_rows(starts.len(), n, kh * run, out, |first, out| {
        run_windows(
            chunk,
            WindowOperands {
                source,
                starts: &starts[first..first + out.len() / n],
                segments: kh,
                run,
                segment_stride: cols * c * code_bytes,
                w: weights,
                columns: &columns,
                out,
            },
        )
    });
    Some(())
}

/// `samples` inputs, each padded as [`padded_input`] pads one, one after another, then `slack`
/// more `fill` values; `None` when the copy would be longer than `limit` values.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn batch_copy<T: Copy>(
    input: &[u8],
    samples: usize,
    shape: [usize; 3],
    window: &Window,
    span: [usize; 2],
    fill: T,
    limit: usize,
    slack: usize,
    map: impl Fn(u8) -> T,
) -> Option<Vec<T>> {
    let each = span[0].checked_mul(span[1])?.checked_mul(shape[2])?;
    let len = each.checked_mul(samples)?.checked_add(slack)?;
    if len > limit {
        return None;
    }
    let mut copy = vec![fill; len];
    let per_sample = shape.iter().product::<usize>();
    for (x, dst) in input.chunks(per_sample).zip(copy.chunks_mut(each)) {
        copy_inside(x, shape, window, span, dst, &map);
    }
    Some(copy)
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
    let mut padded = vec![fill; len];
    copy_inside(input, [h, w, c], window, [rows, cols], &mut padded, &map);
    Some(padded)
}

/// The input's pixels inside the span into `padded` (`rows · cols · c` values, the padding
/// already there), as [`padded_input`] places them.
fn copy_inside<T: Copy>(
    input: &[u8],
    [h, w, c]: [usize; 3],
    window: &Window,
    [rows, cols]: [usize; 2],
    padded: &mut [T],
    map: &impl Fn(u8) -> T,
) {
    let [top, left] = window.padding;
    // The input's columns inside the span (a stride that skips the last ones leaves them out).
    let width = w.min(cols.saturating_sub(left));
    for y in 0..h.min(rows.saturating_sub(top)) {
        let src = &input[y * w * c..][..width * c];
        let dst = &mut padded[((y + top) * cols + left) * c..][..width * c];
        for (d, x) in dst.iter_mut().zip(src) {
            *d = map(*x);
        }
    }
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
