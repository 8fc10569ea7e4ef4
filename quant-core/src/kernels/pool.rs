//! 2x2 max pooling at stride 2 without padding (the usual halving of an image), one plane at
//! a time: each output the maximum of its window and the flat input index it came from.
//!
//! The results are those of scanning each window in row-major order and replacing the best
//! value with one that is strictly greater, or with the first NaN (a NaN beats any number):
//! the first of tied maxima stays, as in PyTorch's CPU kernel. The portable path takes one
//! window at a time with selects (on real activations the maximum's position is as good as
//! random, so branches would be mispredicted half the time); with AVX2 (detected at run time)
//! eight windows go to a vector, the same comparisons in the same order, so the same outputs
//! and positions.

/// The shape of one plane's halving: its input `width` (a row's length) and the output's
/// `rows` and `cols`, with `2·rows` input rows and `2·cols ≤ width` (an odd last row or
/// column is left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Halving {
    /// The input plane's row length.
    pub width: usize,
    /// Output rows.
    pub rows: usize,
    /// Output columns.
    pub cols: usize,
}

/// Whether `v` replaces `best` as a window's maximum, the window scanned in row-major order:
/// strictly greater (so the first of tied maxima stays), or the first NaN (which beats any
/// number). Every max pooling's choice, any window.
#[inline(always)]
pub fn beats(v: f32, best: f32) -> bool {
    // `|` and `&`, not `||` and `&&`: no branch to mispredict.
    (v > best) | (v.is_nan() & !best.is_nan())
}

/// Max pools the plane `src` (whose first value has flat index `base` in the whole batch)
/// into `y` (`rows · cols` values) and writes into `arg` the flat index each output took its
/// value from.
///
/// # Panics
/// When `2·cols > width`, `src` holds fewer than `2·rows·width` values, or `y` or `arg`
/// fewer than `rows · cols`.
pub fn max_pool_2x2(shape: Halving, src: &[f32], base: usize, y: &mut [f32], arg: &mut [usize]) {
    check(shape, src, y, arg);
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        unsafe { max_pool_2x2_avx2(shape, src, base, y, arg) };
        return;
    }
    max_pool_2x2_portable(shape, src, base, y, arg);
}

/// The sizes [`max_pool_2x2`] requires, checked once so that each path may rely on them.
fn check(shape: Halving, src: &[f32], y: &[f32], arg: &[usize]) {
    let outputs = shape.rows * shape.cols;
    assert!(
        2 * shape.cols <= shape.width
            && src.len() >= 2 * shape.rows * shape.width
            && y.len() >= outputs
            && arg.len() >= outputs,
        "max_pool_2x2: {shape:?} with {} inputs, {} and {} outputs",
        src.len(),
        y.len(),
        arg.len()
    );
}

/// [`max_pool_2x2`] one window at a time: the reference every vector path matches. Not public
/// API (quant-core's tests).
#[doc(hidden)]
pub fn max_pool_2x2_portable(
    shape: Halving,
    src: &[f32],
    base: usize,
    y: &mut [f32],
    arg: &mut [usize],
) {
    let w = shape.width;
    for oy in 0..shape.rows {
        let top = &src[2 * oy * w..][..w];
        let bottom = &src[(2 * oy + 1) * w..][..w];
        let y = &mut y[oy * shape.cols..][..shape.cols];
        let arg = &mut arg[oy * shape.cols..][..shape.cols];
        for (ox, (y, arg)) in y.iter_mut().zip(arg.iter_mut()).enumerate() {
            let at = 2 * oy * w + 2 * ox;
            let (mut best, mut best_at) = (top[2 * ox], at);
            for (v, v_at) in [
                (top[2 * ox + 1], at + 1),
                (bottom[2 * ox], at + w),
                (bottom[2 * ox + 1], at + w + 1),
            ] {
                let take = beats(v, best);
                best = std::hint::select_unpredictable(take, v, best);
                best_at = std::hint::select_unpredictable(take, v_at, best_at);
            }
            *y = best;
            *arg = base + best_at;
        }
    }
}

/// [`max_pool_2x2`] eight windows to a vector: a row pair's 16 values split into even and
/// odd columns, [`beats`] as vector comparisons in the same order (greater, ordered; or a NaN
/// against a number) choosing values and window positions with blends. A row's last windows
/// (fewer than eight) go through the same code from a copy padded with zeros, of which only
/// the real outputs are kept.
///
/// Not public API (quant-core's tests).
///
/// # Safety
/// The CPU has AVX2, and the lengths are [`max_pool_2x2`]'s (which checks them).
#[doc(hidden)]
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn max_pool_2x2_avx2(
    shape: Halving,
    src: &[f32],
    base: usize,
    y: &mut [f32],
    arg: &mut [usize],
) {
    use std::arch::x86_64::*;

    /// The eight windows whose values are `top` and `bottom`: their maxima and which of the
    /// four positions (0 top left, 1 top right, 2 bottom left, 3 bottom right) each took.
    #[inline(always)]
    unsafe fn windows(top: &[f32; 16], bottom: &[f32; 16]) -> (__m256, __m256i) {
        // SAFETY: AVX2 (the caller's); each load reads 8 of the 16 values.
        unsafe {
            let split = |p: &[f32; 16]| {
                let (a, b) = (
                    _mm256_loadu_ps(p.as_ptr()),
                    _mm256_loadu_ps(p.as_ptr().add(8)),
                );
                // [a0 a2 b0 b2 | a4 a6 b4 b6], then the 64-bit lanes in the order 0, 2, 1, 3.
                let in_order = |v: __m256| {
                    _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)))
                };
                (
                    in_order(_mm256_shuffle_ps::<0b10_00_10_00>(a, b)),
                    in_order(_mm256_shuffle_ps::<0b11_01_11_01>(a, b)),
                )
            };
            let (top_left, top_right) = split(top);
            let (bottom_left, bottom_right) = split(bottom);
            let (mut best, mut which) = (top_left, _mm256_setzero_si256());
            for (k, v) in [(1, top_right), (2, bottom_left), (3, bottom_right)] {
                let greater = _mm256_cmp_ps::<_CMP_GT_OQ>(v, best);
                let v_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
                let best_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(best, best);
                let take = _mm256_or_ps(greater, _mm256_andnot_ps(best_nan, v_nan));
                best = _mm256_blendv_ps(best, v, take);
                which = _mm256_blendv_epi8(which, _mm256_set1_epi32(k), _mm256_castps_si256(take));
            }
            (best, which)
        }
    }

    /// The 16 values of `row` from `from` on (eight windows' worth).
    #[inline(always)]
    fn sixteen(row: &[f32], from: usize) -> &[f32; 16] {
        row[from..][..16].try_into().expect("a slice of 16 values")
    }

    let w = shape.width;
    // SAFETY: AVX2 (the caller's); every load and store goes through a slice
    // of the length it touches.
    unsafe {
        let width = _mm256_set1_epi64x(w as i64);
        let one = _mm256_set1_epi32(1);
        for oy in 0..shape.rows {
            let top = &src[2 * oy * w..][..2 * shape.cols];
            let bottom = &src[(2 * oy + 1) * w..][..2 * shape.cols];
            let y_row = &mut y[oy * shape.cols..][..shape.cols];
            let arg_row = &mut arg[oy * shape.cols..][..shape.cols];
            let mut ox = 0;
            while ox < shape.cols {
                let n = (shape.cols - ox).min(8);
                let (best, which) = if n == 8 {
                    windows(sixteen(top, 2 * ox), sixteen(bottom, 2 * ox))
                } else {
                    let padded = |row: &[f32]| {
                        let mut values = [0.0f32; 16];
                        values[..2 * n].copy_from_slice(&row[2 * ox..][..2 * n]);
                        values
                    };
                    windows(&padded(top), &padded(bottom))
                };
                // Window position k at flat offset (k & 1) + (k >> 1)·w from its top left.
                let column = _mm256_and_si256(which, one);
                let row = _mm256_srli_epi32::<1>(which);
                let start = (base + 2 * oy * w + 2 * ox) as i64;
                let mut at = [0usize; 8];
                for half in 0..2i64 {
                    let pick = |v: __m256i| {
                        _mm256_cvtepi32_epi64(if half == 0 {
                            _mm256_castsi256_si128(v)
                        } else {
                            _mm256_extracti128_si256::<1>(v)
                        })
                    };
                    // `row` is 0 or 1: negated, a mask that keeps `w` or nothing.
                    let down = _mm256_and_si256(
                        _mm256_sub_epi64(_mm256_setzero_si256(), pick(row)),
                        width,
                    );
                    let lefts = _mm256_setr_epi64x(
                        start + 8 * half,
                        start + 8 * half + 2,
                        start + 8 * half + 4,
                        start + 8 * half + 6,
                    );
                    let index = _mm256_add_epi64(_mm256_add_epi64(lefts, pick(column)), down);
                    _mm256_storeu_si256(at[4 * half as usize..].as_mut_ptr().cast(), index);
                }
                let mut maxima = [0.0f32; 8];
                _mm256_storeu_ps(maxima.as_mut_ptr(), best);
                y_row[ox..ox + n].copy_from_slice(&maxima[..n]);
                arg_row[ox..ox + n].copy_from_slice(&at[..n]);
                ox += n;
            }
        }
    }
}
