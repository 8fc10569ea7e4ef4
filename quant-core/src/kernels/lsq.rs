//! LSQ's backward (PyTorch's `_fake_quantize_learnable_per_{tensor,channel}_affine_backward`):
//! the input gradient and the scale and zero-point gradient sums.

use std::marker::PhantomData;

use super::driver::{
    drive, reduce_blocks, uninit_vec, Constants, ElementKernel, Expanded, GradOut, Streams, Sums,
    VectorPath, BLOCK, CHUNK, LANES,
};
use super::params::{check_len, check_range, Affine, Grid, Path};
use super::round::{clamp, rne, small_int, Round};
use super::torch::Torch;
use crate::error::{QuantError, Result};
use crate::quantizer::ChannelLayout;
use crate::vocab::RoundingPolicy;

/// Sums of one channel's scale and zero-point gradient terms, before the gradient factor.
#[derive(Debug, Clone, Copy, Default)]
struct LsqSums {
    dscale: f64,
    dzero: f64,
}

impl Sums for LsqSums {
    fn add(&mut self, o: LsqSums) {
        self.dscale += o.dscale;
        self.dzero += o.dzero;
    }
}

impl LsqSums {
    fn is_nan(&self) -> bool {
        self.dscale.is_nan() || self.dzero.is_nan()
    }
}

/// One element of LSQ's backward: what it adds to `dx`, to the scale sum and to the
/// zero-point sum (before `grad_factor`).
struct LsqTerms {
    dx: f32,
    ds: f32,
    dz: f32,
}

/// PyTorch's `fake_quantize_learnable_*_grad_kernel_cpu` for one element, with `R` rounding:
/// `q = R(x * (1/s) + z)`; inside the grid `dx = dy`, `ds = dy * ((q - z) * s - x) * (1/s)`;
/// outside `dx = 0`, `ds = dy * (clamp(q) - z)`, `dz = dy` (negated and scaled by the caller).
/// A NaN `x` makes `ds` NaN here: the callers recompute such sums with
/// [`lsq_sums_skipping_nan`], which leaves it out.
#[inline(always)]
fn lsq_terms<R: Round>(x: f32, dy: f32, p: &Affine) -> LsqTerms {
    // PyTorch's backward adds z before rounding (its forward adds it after).
    let w = x * p.inv + p.zero_point;
    // No clamp before rounding, as in `ste_span`: only `inside` and `rc` depend on `r`, and
    // both are exact wherever the fast rounding is not.
    let r = R::round(w);
    let rc = clamp(r, p.quant_min, p.quant_max);
    let inside = r == rc;
    let k = rc - p.zero_point;
    let term = if inside { (k * p.scale - x) * p.inv } else { k };
    LsqTerms {
        dx: if inside { dy } else { 0.0 },
        ds: dy * term,
        dz: if inside { 0.0 } else { dy },
    }
}

/// The gradient sums of a span, element by element in `f64`, leaving out NaN inputs.
fn lsq_sums_skipping_nan<R: Round>(x: &[f32], dy: &[f32], p: &Affine) -> LsqSums {
    let mut sums = LsqSums::default();
    for (xi, dyi) in x.iter().zip(dy).filter(|(xi, _)| !xi.is_nan()) {
        let t = lsq_terms::<R>(*xi, *dyi, p);
        sums.dscale += t.ds as f64;
        sums.dzero += t.dz as f64;
    }
    sums
}

/// LSQ's backward over a span with one set of constants: adds into `dx` and returns the sums
/// (the zero point's only where `ZERO_POINT`: a zero point that does not learn needs none).
///
/// `path`: the code to run ([`Walk::path`](super::driver::Walk::path), within
/// [`VectorPath::widest`]), asked once per call rather than once per row of a per-channel
/// weight.
#[inline(always)]
fn lsq_span<R: Round, O: GradOut, const ZERO_POINT: bool>(
    x: &[f32],
    dy: &[f32],
    dx: &mut [O],
    p: &Affine,
    path: VectorPath,
) -> LsqSums {
    let n = x.len().min(dy.len()).min(dx.len());
    let (x, dy, dx) = (&x[..n], &dy[..n], &mut dx[..n]);
    let mut ds_wide = [0f64; LANES];
    let mut dz_wide = [0f64; LANES];
    let mut sums = LsqSums::default();
    #[cfg(not(target_arch = "x86_64"))]
    let _ = path;
    #[cfg(target_arch = "x86_64")]
    if R::HALF_EVEN && path != VectorPath::Baseline {
        let whole = n - n % BLOCK;
        let ((xw, xt), (dyw, dyt)) = (x.split_at(whole), dy.split_at(whole));
        let (dxw, dxt) = dx.split_at_mut(whole);
        // The tail (under `BLOCK` values) on masked lanes, its terms kept and then added one by
        // one (element by element, the tail took about 11 cycles a value on AVX2 and more
        // compiled for AVX-512; a row of a 3x3 depthwise weight is all tail).
        let (tail, mut ts, mut tz) = (n - whole, [0f32; BLOCK], [0f32; BLOCK]);
        if path == VectorPath::Avx512 {
            // SAFETY: `Walk::path` gives `Avx512` only where `VectorPath::widest` does, for a
            // CPU with AVX-512 F (and AVX2); the three slices are `whole` long, a multiple of
            // `BLOCK`, then `tail`.
            unsafe {
                let (ds, dz) = (&mut ds_wide, &mut dz_wide);
                avx512::lsq_blocks_half_even::<O, ZERO_POINT>(xw, dyw, dxw, p, ds, dz);
                avx512::lsq_tail_half_even::<O, ZERO_POINT>(xt, dyt, dxt, p, &mut ts, &mut tz);
            }
        } else {
            // SAFETY: every path above the baseline has AVX2 (`VectorPath::widest`); the three
            // slices are `whole` long, a multiple of `BLOCK`, then `tail`.
            unsafe {
                let (ds, dz) = (&mut ds_wide, &mut dz_wide);
                avx2::lsq_blocks_half_even::<O, ZERO_POINT>(xw, dyw, dxw, p, ds, dz);
                avx2::lsq_tail_half_even::<O, ZERO_POINT>(xt, dyt, dxt, p, &mut ts, &mut tz);
            }
        }
        // The tail, then the lanes, in the order the portable code below adds them: every path
        // gives the same bits.
        for (s, z) in ts[..tail].iter().zip(&tz[..tail]) {
            sums.dscale += *s as f64;
            sums.dzero += *z as f64;
        }
        sums.dscale += ds_wide.iter().sum::<f64>();
        sums.dzero += dz_wide.iter().sum::<f64>();
        if sums.is_nan() {
            sums = lsq_sums_skipping_nan::<R>(x, dy, p);
        }
        return sums;
    }
    let mut ts = [0f32; CHUNK];
    let mut tz = [0f32; CHUNK];
    for (x, dy, g) in (x, dy, dx).chunks(CHUNK) {
        let m = x.len().min(dy.len()).min(g.len()).min(CHUNK);
        let (x, dy, g, ts, tz) = (&x[..m], &dy[..m], &mut g[..m], &mut ts[..m], &mut tz[..m]);
        // Phase 1, element-wise: the input gradient, and each element's terms.
        for i in 0..m {
            let t = lsq_terms::<R>(x[i], dy[i], p);
            g[i].add(t.dx);
            ts[i] = t.ds;
            tz[i] = if ZERO_POINT { t.dz } else { 0.0 };
        }
        // Phase 2: whole blocks in f32 lanes then f64; a short tail straight into f64.
        let whole = m - m % BLOCK;
        reduce_blocks(&ts[..whole], &mut ds_wide);
        if ZERO_POINT {
            reduce_blocks(&tz[..whole], &mut dz_wide);
        }
        for (s, z) in ts[whole..].iter().zip(&tz[whole..]) {
            sums.dscale += *s as f64;
            sums.dzero += *z as f64;
        }
    }
    sums.dscale += ds_wide.iter().sum::<f64>();
    sums.dzero += dz_wide.iter().sum::<f64>();
    if sums.is_nan() {
        // Rare: a NaN input or gradient. Recompute the sums with NaN inputs left out.
        sums = lsq_sums_skipping_nan::<R>(x, dy, p);
    }
    sums
}

/// Hand-written AVX2 kernels, where LLVM's vectoriser needs help.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Affine, GradOut, BLOCK, LANES};
    use crate::kernels::round::MAGIC;
    use std::arch::x86_64::*;

    /// [`super::lsq_terms`] with round half to even, over whole blocks of [`BLOCK`] elements,
    /// 8 lanes at a time, in one pass (the portable code needs two): adds into `dx` (see
    /// [`GradOut`]), and each block's sums, in `f32` lanes over its 4 vectors, into the `f64`
    /// lanes of `ds`, and of `dz` where `ZERO_POINT`. Lane for lane the same operations, in the
    /// same order, as the portable code.
    ///
    /// # Safety
    /// The CPU must support AVX2. `x`, `dy` and `dx` must have the same length, a multiple of
    /// [`BLOCK`].
    // Inlined into the driver's AVX2 job (the same target features): called once per row of
    // a per-channel weight, its lane sums then stay in registers instead of going through
    // memory to the caller's horizontal sums, which stalled on every row.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn lsq_blocks_half_even<O: GradOut, const ZERO_POINT: bool>(
        x: &[f32],
        dy: &[f32],
        dx: &mut [O],
        p: &Affine,
        ds: &mut [f64; LANES],
        dz: &mut [f64; LANES],
    ) {
        let n = x.len().min(dy.len()).min(dx.len());
        // `O` is `f32` or `MaybeUninit<f32>`, laid out as an `f32`. Fresh storage is only
        // written, never read.
        let (xp, yp, gp) = (x.as_ptr(), dy.as_ptr(), dx.as_mut_ptr() as *mut f32);
        let c = Constants::new(p);
        // SAFETY: `ds` holds `LANES` = 8 `f64`s: the 4 from 0 and the 4 from 4.
        let (mut ds_lo, mut ds_hi) = unsafe {
            (
                _mm256_loadu_pd(ds.as_ptr()),
                _mm256_loadu_pd(ds.as_ptr().add(4)),
            )
        };
        // SAFETY: `dz` holds `LANES` = 8 `f64`s: the 4 from 0 and the 4 from 4.
        let (mut dz_lo, mut dz_hi) = unsafe {
            (
                _mm256_loadu_pd(dz.as_ptr()),
                _mm256_loadu_pd(dz.as_ptr().add(4)),
            )
        };
        let mut i = 0;
        while i + BLOCK <= n {
            let mut s_acc = _mm256_setzero_ps();
            let mut z_acc = _mm256_setzero_ps();
            for _ in 0..BLOCK / 8 {
                // Every pointer read and write below covers `i..i + 8`, and `i + 8 <= n` (the
                // block loop keeps `i + BLOCK <= n`), `n` being the shortest slice's length.
                // SAFETY: `i + 8 <= n <= x.len()`: the 8 `f32`s from `i` lie in `x`.
                let xv = unsafe { _mm256_loadu_ps(xp.add(i)) };
                // SAFETY: `i + 8 <= n <= dy.len()`: the 8 `f32`s from `i` lie in `dy`.
                let dyv = unsafe { _mm256_loadu_ps(yp.add(i)) };
                let (s, z, gain) = terms(xv, dyv, c);
                s_acc = _mm256_add_ps(s_acc, s);
                if ZERO_POINT {
                    z_acc = _mm256_add_ps(z_acc, z);
                }
                let before = if O::ACCUMULATE {
                    // SAFETY: `i + 8 <= n <= dx.len()`, and `O` is laid out as an `f32`: the
                    // 8 values from `i` lie in `dx`. Only `f32` accumulates, so they are
                    // initialised (`MaybeUninit` storage is never read).
                    unsafe { _mm256_loadu_ps(gp.add(i)) }
                } else {
                    _mm256_setzero_ps()
                };
                // SAFETY: as for the read above, the 8 values from `i` lie in `dx`.
                unsafe { _mm256_storeu_ps(gp.add(i), _mm256_add_ps(before, gain)) };
                i += 8;
            }
            ds_lo = _mm256_add_pd(ds_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(s_acc)));
            ds_hi = _mm256_add_pd(ds_hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(s_acc)));
            if ZERO_POINT {
                dz_lo = _mm256_add_pd(dz_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(z_acc)));
                dz_hi = _mm256_add_pd(dz_hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(z_acc)));
            }
        }
        // SAFETY: `ds` and `dz` hold `LANES` = 8 `f64`s each: the 4 from 0 and the 4 from 4.
        unsafe {
            _mm256_storeu_pd(ds.as_mut_ptr(), ds_lo);
            _mm256_storeu_pd(ds.as_mut_ptr().add(4), ds_hi);
            _mm256_storeu_pd(dz.as_mut_ptr(), dz_lo);
            _mm256_storeu_pd(dz.as_mut_ptr().add(4), dz_hi);
        }
    }

    /// The same element-wise steps over fewer than [`BLOCK`] elements, on masked lanes: adds
    /// into `dx` and writes each element's scale terms into `ds` and, where `ZERO_POINT`, its
    /// zero-point terms into `dz` (from 0, for the caller to add in order).
    ///
    /// # Safety
    /// The CPU must support AVX2. `x`, `dy` and `dx` must have the same length, below
    /// [`BLOCK`].
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn lsq_tail_half_even<O: GradOut, const ZERO_POINT: bool>(
        x: &[f32],
        dy: &[f32],
        dx: &mut [O],
        p: &Affine,
        ds: &mut [f32; BLOCK],
        dz: &mut [f32; BLOCK],
    ) {
        let n = x.len().min(dy.len()).min(dx.len()).min(BLOCK);
        let (xp, yp, gp) = (x.as_ptr(), dy.as_ptr(), dx.as_mut_ptr() as *mut f32);
        let c = Constants::new(p);
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mut i = 0;
        while i < n {
            // Lanes `i..min(i + 8, n)`: a masked-out lane is neither read nor written (masked
            // loads and stores suppress its faults), and reads as `+0.0`.
            let m = _mm256_cmpgt_epi32(_mm256_set1_epi32((n - i) as i32), lane);
            // SAFETY: the lanes of `m` cover `i..min(i + 8, n)`, within `x`, `dy` and `dx` (`n`
            // their shortest length); `i + 8 <= BLOCK` (`i` is a multiple of 8 below `n <
            // BLOCK`), so the 8 values from `i` lie in `ds` and `dz`.
            unsafe {
                let xv = _mm256_maskload_ps(xp.add(i), m);
                let dyv = _mm256_maskload_ps(yp.add(i), m);
                let (s, z, gain) = terms(xv, dyv, c);
                _mm256_storeu_ps(ds.as_mut_ptr().add(i), s);
                if ZERO_POINT {
                    _mm256_storeu_ps(dz.as_mut_ptr().add(i), z);
                }
                // Only `f32` accumulates, so its lanes are initialised.
                let before = if O::ACCUMULATE {
                    _mm256_maskload_ps(gp.add(i), m)
                } else {
                    _mm256_setzero_ps()
                };
                _mm256_maskstore_ps(gp.add(i), m, _mm256_add_ps(before, gain));
            }
            i += 8;
        }
    }

    /// One channel's constants in every lane.
    #[derive(Clone, Copy)]
    struct Constants {
        inv: __m256,
        zero_point: __m256,
        scale: __m256,
        quant_min: __m256,
        quant_max: __m256,
        magic: __m256,
    }

    impl Constants {
        #[inline]
        #[target_feature(enable = "avx2")]
        fn new(p: &Affine) -> Constants {
            Constants {
                inv: _mm256_set1_ps(p.inv),
                zero_point: _mm256_set1_ps(p.zero_point),
                scale: _mm256_set1_ps(p.scale),
                quant_min: _mm256_set1_ps(p.quant_min),
                quant_max: _mm256_set1_ps(p.quant_max),
                magic: _mm256_set1_ps(MAGIC),
            }
        }
    }

    /// [`super::lsq_terms`] with round half to even on 8 lanes: the scale term `dy * term`,
    /// the zero-point term (`dy` outside the grid, `+0.0` inside) and what `dx` gains (`dy`
    /// inside, `+0.0` outside).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn terms(xv: __m256, dyv: __m256, c: Constants) -> (__m256, __m256, __m256) {
        // max(lo, v) / min(hi, v) return v when v is NaN, like `clamp`.
        let w = _mm256_add_ps(_mm256_mul_ps(xv, c.inv), c.zero_point);
        let r = _mm256_sub_ps(_mm256_add_ps(w, c.magic), c.magic);
        let rc = _mm256_min_ps(c.quant_max, _mm256_max_ps(c.quant_min, r));
        let inside = _mm256_cmp_ps::<_CMP_EQ_OQ>(r, rc);
        let k = _mm256_sub_ps(rc, c.zero_point);
        let t_in = _mm256_mul_ps(_mm256_sub_ps(_mm256_mul_ps(k, c.scale), xv), c.inv);
        let term = _mm256_blendv_ps(k, t_in, inside);
        (
            _mm256_mul_ps(dyv, term),
            _mm256_andnot_ps(inside, dyv),
            _mm256_and_ps(inside, dyv),
        )
    }
}

/// Hand-written AVX-512 kernels: 16 elements a step where the data are in cache (a training
/// step's weights and activations), about 0.75x the time of the AVX2 kernel per element.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Affine, GradOut, BLOCK, LANES};
    use crate::kernels::round::MAGIC;
    use std::arch::x86_64::*;

    /// The lower and upper 8 lanes of `v`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn halves(v: __m512) -> (__m256, __m256) {
        let upper = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v));
        (_mm512_castps512_ps256(v), _mm256_castpd_ps(upper))
    }

    /// One channel's constants in every lane.
    #[derive(Clone, Copy)]
    struct Constants {
        inv: __m512,
        zero_point: __m512,
        scale: __m512,
        quant_min: __m512,
        quant_max: __m512,
        magic: __m512,
    }

    impl Constants {
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn new(p: &Affine) -> Constants {
            Constants {
                inv: _mm512_set1_ps(p.inv),
                zero_point: _mm512_set1_ps(p.zero_point),
                scale: _mm512_set1_ps(p.scale),
                quant_min: _mm512_set1_ps(p.quant_min),
                quant_max: _mm512_set1_ps(p.quant_max),
                magic: _mm512_set1_ps(MAGIC),
            }
        }
    }

    /// [`super::lsq_terms`] with round half to even on 16 lanes: the scale term `dy * term`,
    /// the zero-point term (`dy` outside the grid, `+0.0` inside) and what `dx` gains (`dy`
    /// inside, `+0.0` outside; a masked-out lane is `+0.0`, as the AVX2 kernel's `and` with a
    /// cleared mask gives).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn terms(xv: __m512, dyv: __m512, c: Constants) -> (__m512, __m512, __m512) {
        // max(lo, v) / min(hi, v) return v when v is NaN, like `clamp` (and AVX2's).
        let w = _mm512_add_ps(_mm512_mul_ps(xv, c.inv), c.zero_point);
        let r = _mm512_sub_ps(_mm512_add_ps(w, c.magic), c.magic);
        let rc = _mm512_min_ps(c.quant_max, _mm512_max_ps(c.quant_min, r));
        let inside = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(r, rc);
        let k = _mm512_sub_ps(rc, c.zero_point);
        let t_in = _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(k, c.scale), xv), c.inv);
        let term = _mm512_mask_blend_ps(inside, k, t_in);
        (
            _mm512_mul_ps(dyv, term),
            _mm512_maskz_mov_ps(!inside, dyv),
            _mm512_maskz_mov_ps(inside, dyv),
        )
    }

    /// [`super::avx2::lsq_blocks_half_even`] with its element-wise steps on 16 lanes: each
    /// block's 32 elements in two 512-bit steps, whose terms are added to the block's 8 `f32`
    /// lanes one 8-lane half after the other, in the AVX2 kernel's order (elements `i..i + 8`,
    /// then `i + 8..i + 16`), so every sum and gradient is the same bits.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and AVX2. `x`, `dy` and `dx` must have the same length, a
    /// multiple of [`BLOCK`].
    // Inlined into the driver's AVX-512 job, as the AVX2 kernel into its AVX2 job.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    pub(super) unsafe fn lsq_blocks_half_even<O: GradOut, const ZERO_POINT: bool>(
        x: &[f32],
        dy: &[f32],
        dx: &mut [O],
        p: &Affine,
        ds: &mut [f64; LANES],
        dz: &mut [f64; LANES],
    ) {
        let n = x.len().min(dy.len()).min(dx.len());
        // `O` is `f32` or `MaybeUninit<f32>`, laid out as an `f32`. Fresh storage is only
        // written, never read.
        let (xp, yp, gp) = (x.as_ptr(), dy.as_ptr(), dx.as_mut_ptr() as *mut f32);
        let c = Constants::new(p);
        // The `f64` lanes in one register each; lane for lane the AVX2 kernel's two halves.
        // SAFETY: `ds` and `dz` hold `LANES` = 8 `f64`s each.
        let (mut ds_wide, mut dz_wide) =
            unsafe { (_mm512_loadu_pd(ds.as_ptr()), _mm512_loadu_pd(dz.as_ptr())) };
        let mut i = 0;
        while i + BLOCK <= n {
            let mut s_acc = _mm256_setzero_ps();
            let mut z_acc = _mm256_setzero_ps();
            for _ in 0..BLOCK / 16 {
                // Every pointer read and write below covers `i..i + 16`, and `i + 16 <= n`
                // (the block loop keeps `i + BLOCK <= n`), `n` being the shortest slice's
                // length.
                // SAFETY: `i + 16 <= n <= x.len()`: the 16 `f32`s from `i` lie in `x`.
                let xv = unsafe { _mm512_loadu_ps(xp.add(i)) };
                // SAFETY: `i + 16 <= n <= dy.len()`: the 16 `f32`s from `i` lie in `dy`.
                let dyv = unsafe { _mm512_loadu_ps(yp.add(i)) };
                let (s, z, gain) = terms(xv, dyv, c);
                let (s_lo, s_hi) = halves(s);
                s_acc = _mm256_add_ps(_mm256_add_ps(s_acc, s_lo), s_hi);
                if ZERO_POINT {
                    let (z_lo, z_hi) = halves(z);
                    z_acc = _mm256_add_ps(_mm256_add_ps(z_acc, z_lo), z_hi);
                }
                let before = if O::ACCUMULATE {
                    // SAFETY: `i + 16 <= n <= dx.len()`, and `O` is laid out as an `f32`: the
                    // 16 values from `i` lie in `dx`. Only `f32` accumulates, so they are
                    // initialised (`MaybeUninit` storage is never read).
                    unsafe { _mm512_loadu_ps(gp.add(i)) }
                } else {
                    _mm512_setzero_ps()
                };
                // SAFETY: as for the read above, the 16 values from `i` lie in `dx`.
                unsafe { _mm512_storeu_ps(gp.add(i), _mm512_add_ps(before, gain)) };
                i += 16;
            }
            ds_wide = _mm512_add_pd(ds_wide, _mm512_cvtps_pd(s_acc));
            if ZERO_POINT {
                dz_wide = _mm512_add_pd(dz_wide, _mm512_cvtps_pd(z_acc));
            }
        }
        // SAFETY: `ds` and `dz` hold `LANES` = 8 `f64`s each.
        unsafe {
            _mm512_storeu_pd(ds.as_mut_ptr(), ds_wide);
            _mm512_storeu_pd(dz.as_mut_ptr(), dz_wide);
        }
    }

    /// The same element-wise steps over fewer than [`BLOCK`] elements, on masked lanes: adds
    /// into `dx` and writes each element's scale terms into `ds` and, where `ZERO_POINT`, its
    /// zero-point terms into `dz` (from 0, for the caller to add in order).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and AVX2. `x`, `dy` and `dx` must have the same length,
    /// below [`BLOCK`].
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    pub(super) unsafe fn lsq_tail_half_even<O: GradOut, const ZERO_POINT: bool>(
        x: &[f32],
        dy: &[f32],
        dx: &mut [O],
        p: &Affine,
        ds: &mut [f32; BLOCK],
        dz: &mut [f32; BLOCK],
    ) {
        let n = x.len().min(dy.len()).min(dx.len()).min(BLOCK);
        let (xp, yp, gp) = (x.as_ptr(), dy.as_ptr(), dx.as_mut_ptr() as *mut f32);
        let c = Constants::new(p);
        let mut i = 0;
        while i < n {
            // Lanes `i..min(i + 16, n)`: a masked-out lane is neither read nor written (AVX-512
            // suppresses its faults), and reads as `+0.0`.
            let m: __mmask16 = if n - i >= 16 {
                0xFFFF
            } else {
                (1u16 << (n - i)) - 1
            };
            // SAFETY: the lanes of `m` cover `i..min(i + 16, n)`, within `x`, `dy`, `dx` (`n`
            // their shortest length) and `ds`, `dz` (`n <= BLOCK`).
            unsafe {
                let xv = _mm512_maskz_loadu_ps(m, xp.add(i));
                let dyv = _mm512_maskz_loadu_ps(m, yp.add(i));
                let (s, z, gain) = terms(xv, dyv, c);
                _mm512_mask_storeu_ps(ds.as_mut_ptr().add(i), m, s);
                if ZERO_POINT {
                    _mm512_mask_storeu_ps(dz.as_mut_ptr().add(i), m, z);
                }
                // Only `f32` accumulates, so its lanes are initialised.
                let before = if O::ACCUMULATE {
                    _mm512_maskz_loadu_ps(m, gp.add(i))
                } else {
                    _mm512_setzero_ps()
                };
                _mm512_mask_storeu_ps(gp.add(i), m, _mm512_add_ps(before, gain));
            }
            i += 16;
        }
    }
}

/// LSQ's backward over whole periods of short rows: per-element `f32` accumulators over at
/// most 4 periods, added element-wise into per-element `f64` accumulators (vectorises, unlike
/// a sum per channel, whose dependency chain cost more than the kernel), which are summed per
/// channel once at the end. The same error bound as the lanes of [`lsq_span`].
#[inline(always)]
fn lsq_periods<R: Round, O: GradOut, const ZERO_POINT: bool>(
    x: &[f32],
    dy: &[f32],
    dx: &mut [O],
    e: &Expanded,
    sums: &mut [LsqSums],
) {
    const FLUSH: usize = 4;
    let period = e.period();
    let constants = e.per_element();
    let inner = e.inner.max(1);
    // The zero point's accumulators only where its sums are asked for.
    let zero_points = if ZERO_POINT { period } else { 0 };
    let mut acc_s = vec![0f32; period];
    let mut acc_z = vec![0f32; zero_points];
    let mut wide_s = vec![0f64; period];
    let mut wide_z = vec![0f64; zero_points];
    let flush = |acc: &mut [f32], wide: &mut [f64]| {
        for (w, a) in wide.iter_mut().zip(acc.iter_mut()) {
            *w += *a as f64;
            *a = 0.0;
        }
    };
    let periods = dx
        .chunks_mut(period)
        .zip(x.chunks(period))
        .zip(dy.chunks(period));
    for (k, ((g, x), dy)) in periods.enumerate() {
        let n = x.len().min(dy.len()).min(g.len()).min(period);
        let (x, dy, g) = (&x[..n], &dy[..n], &mut g[..n]);
        let c = constants.prefix(n);
        let (acc_sn, acc_zn) = (&mut acc_s[..n], &mut acc_z[..n.min(zero_points)]);
        for i in 0..n {
            let t = lsq_terms::<R>(x[i], dy[i], &c.at(i));
            g[i].add(t.dx);
            acc_sn[i] += t.ds;
            if ZERO_POINT {
                acc_zn[i] += t.dz;
            }
        }
        if k % FLUSH == FLUSH - 1 {
            flush(&mut acc_s, &mut wide_s);
            if ZERO_POINT {
                flush(&mut acc_z, &mut wide_z);
            }
        }
    }
    flush(&mut acc_s, &mut wide_s);
    if ZERO_POINT {
        flush(&mut acc_z, &mut wide_z);
    }
    for (sum, s) in sums.iter_mut().zip(wide_s.chunks(inner)) {
        sum.dscale += s.iter().sum::<f64>();
    }
    if ZERO_POINT {
        for (sum, z) in sums.iter_mut().zip(wide_z.chunks(inner)) {
            sum.dzero += z.iter().sum::<f64>();
        }
    }
    if sums.iter().any(LsqSums::is_nan) {
        // Rare: a NaN input or gradient. Recompute the sums with NaN inputs left out.
        sums.iter_mut().for_each(|s| *s = LsqSums::default());
        let period = period.max(1);
        for (i, (xi, dyi)) in x
            .iter()
            .zip(dy)
            .enumerate()
            .filter(|(_, (xi, _))| !xi.is_nan())
        {
            let k = i % period;
            let t = lsq_terms::<R>(*xi, *dyi, &constants.at(k));
            if let Some(sum) = sums.get_mut(k / inner) {
                sum.dscale += t.ds as f64;
                sum.dzero += t.dz as f64;
            }
        }
    }
}

/// The widest path LSQ's backward runs on: its hand-written AVX-512 kernel.
const LSQ_WIDEST: VectorPath = VectorPath::Avx512;

/// LSQ's backward as a kernel of the element driver: `dx += dy·[inside]`, and the sums of the
/// scale and (where `ZERO_POINT`) zero-point gradient terms per channel.
struct Lsq<R, const ZERO_POINT: bool> {
    /// The widest code that may run (see [`lsq_span`]).
    path: VectorPath,
    rounding: PhantomData<R>,
}

impl<R: Round, O: GradOut, const ZERO_POINT: bool> ElementKernel<(&[f32], &[f32], &mut [O])>
    for Lsq<R, ZERO_POINT>
{
    type Sums = LsqSums;
    const WIDEST: VectorPath = LSQ_WIDEST;
    #[inline(always)]
    fn span(&self, (x, dy, dx): (&[f32], &[f32], &mut [O]), p: &Affine) -> LsqSums {
        lsq_span::<R, O, ZERO_POINT>(x, dy, dx, p, self.path)
    }
    #[inline(always)]
    fn periods(&self, (x, dy, dx): (&[f32], &[f32], &mut [O]), e: &Expanded, sums: &mut [LsqSums]) {
        lsq_periods::<R, O, ZERO_POINT>(x, dy, dx, e, sums)
    }
}

/// The exact path for grids too wide for the fast rounding.
fn lsq_slow<O: GradOut>(
    x: &[f32],
    dy: &[f32],
    dx: &mut [O],
    layout: ChannelLayout,
    params: &[Affine],
    torch: Torch,
) -> Vec<LsqSums> {
    let mut sums = vec![LsqSums::default(); layout.channels];
    for (i, ((g, xi), dyi)) in dx.iter_mut().zip(x).zip(dy).enumerate() {
        let c = layout.channel_of(i);
        match torch.lsq(*xi, &params[c]) {
            Some((inside, ds, dz)) => {
                g.add(if inside { *dyi } else { 0.0 });
                sums[c].dscale += (*dyi * ds) as f64;
                sums[c].dzero += (*dyi * dz) as f64;
            }
            None => g.add_nothing(),
        }
    }
    sums
}

/// Rounds a learnable (floating) zero point the way PyTorch does before use:
/// `round_half_even(clamp(zero_point, quant_min, quant_max))`.
///
/// # Errors
/// A NaN zero point, or `quant_min > quant_max`.
pub fn round_zero_point(zero_point: f32, quant_min: i32, quant_max: i32) -> Result<i32> {
    check_range(quant_min, quant_max)?;
    if zero_point.is_nan() {
        return Err(QuantError::NonFinite {
            what: "zero_point".into(),
            value: f64::NAN,
        });
    }
    let z = zero_point.clamp(quant_min as f32, quant_max as f32);
    // `round_ties_even` is a libm call on baseline x86-64; the add-and-subtract rounding is
    // the same function where it is exact.
    let rounded = if z.abs() <= (1 << 22) as f32 {
        rne(z)
    } else {
        z.round_ties_even()
    };
    Ok(rounded as i32)
}

/// [`round_zero_point`] for every channel's zero point.
///
/// # Errors
/// As [`round_zero_point`], for the first zero point that fails.
pub fn round_zero_points(zero_points: &[f32], quant_min: i32, quant_max: i32) -> Result<Vec<i32>> {
    // This runs several times per quantizer on every training step (a per-channel weight has
    // hundreds of zero points): the checks once, then a loop that vectorises.
    check_range(quant_min, quant_max)?;
    // A fold, not `any`: a loop that may stop early does not vectorise.
    if zero_points.iter().fold(false, |nan, z| nan | z.is_nan()) {
        return Err(QuantError::NonFinite {
            what: "zero_point".into(),
            value: f64::NAN,
        });
    }
    let small = |q: i32| q.unsigned_abs() <= 1 << 22;
    if !(small(quant_min) && small(quant_max)) {
        return zero_points
            .iter()
            .map(|z| round_zero_point(*z, quant_min, quant_max))
            .collect();
    }
    // Every clamped value lies within ±2^22, where `round_zero_point` takes `rne`; `small_int`
    // converts as `as i32` would there, and vectorises (about 5 cycles a value with `as i32`).
    let (lo, hi) = (quant_min as f32, quant_max as f32);
    Ok(zero_points
        .iter()
        .map(|z| small_int(rne(clamp(*z, lo, hi))))
        .collect())
}

/// PyTorch's `_fake_quantize_learnable_per_tensor_affine_backward`, the LSQ gradient: returns
/// `(dx, dscale, dzero_point)` for the forward `fake_quantize_per_tensor_affine(x, scale,
/// round(zero_point), ...)`, with `grad_factor` (LSQ's `g = 1/sqrt(numel * quant_max)`)
/// applied to the scale and zero-point gradients. With `q = round(x * (1/scale) + z)` (the
/// zero point added before rounding, as PyTorch's backward does) and `z` the zero point
/// rounded as the forward rounds it (see the module docs for where PyTorch differs):
///
/// ```text
/// inside:      dx = dy,  dscale = dy * (x_fq - x) / scale * g,               dzero = 0
/// below/above: dx = 0,   dscale = dy * (quant_min|quant_max - z) * g,   dzero = -dy * scale * g
/// ```
///
/// ```
/// use quant_core::kernels::fake_quantize_learnable_per_tensor_affine_backward;
/// let (dx, ds, dz) =
///     fake_quantize_learnable_per_tensor_affine_backward(&[0.3, 5.0], &[1.0, 1.0], 0.5, 0.0, -4, 3, 1.0).unwrap();
/// assert_eq!(dx, vec![1.0, 0.0]);
/// assert!((ds - ((0.5 - 0.3) / 0.5 + 3.0)).abs() < 1e-6);
/// assert_eq!(dz, -0.5);
/// ```
///
/// # Errors
/// See [`fake_quantize_per_tensor_affine`](super::fake_quantize_per_tensor_affine); also `dy` not
/// as long as `x`, a NaN zero point, or a grad factor that is not finite.
pub fn fake_quantize_learnable_per_tensor_affine_backward(
    x: &[f32],
    dy: &[f32],
    scale: f32,
    zero_point: f32,
    quant_min: i32,
    quant_max: i32,
    grad_factor: f32,
) -> Result<(Vec<f32>, f32, f32)> {
    let grid = Grid::torch_per_tensor(x.len(), &scale, &zero_point, quant_min, quant_max);
    let mut ds = [0.0];
    let mut dz = [0.0];
    let dx = uninit_vec(x.len(), |dx| {
        lsq_backward_to(x, dy, dx, grid, grad_factor, &mut ds, Some(&mut dz))
    })?;
    Ok((dx, ds[0], dz[0]))
}

/// The LSQ gradient for any layout: adds into `dx`, and into `dscales`/`dzero_points` (one per
/// channel). Zero points are learnable floats, rounded as [`round_zero_point`] says. Per
/// channel this is PyTorch's `_fake_quantize_learnable_per_channel_affine_backward`.
///
/// `dzero_points` `None`: a zero point that does not learn (symmetric weights), whose gradient
/// is then not computed; `dx` and `dscales` get the same bits either way.
///
/// # Errors
/// See [`fake_quantize_learnable_per_tensor_affine_backward`]; also buffers whose lengths do
/// not match the layout.
#[allow(clippy::too_many_arguments)]
pub fn fake_quantize_learnable_affine_backward_into(
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    layout: ChannelLayout,
    scales: &[f32],
    zero_points: &[f32],
    quant_min: i32,
    quant_max: i32,
    grad_factor: f32,
    rounding: RoundingPolicy,
    dscales: &mut [f32],
    dzero_points: Option<&mut [f32]>,
) -> Result<()> {
    let grid = Grid::new(layout, scales, zero_points, quant_min, quant_max, rounding);
    lsq_backward_to(x, dy, dx, grid, grad_factor, dscales, dzero_points)
}

/// [`fake_quantize_learnable_affine_backward_into`] into a caller's buffer or fresh storage:
/// on `Ok`, every element of `dx` is written.
fn lsq_backward_to<O: GradOut>(
    x: &[f32],
    dy: &[f32],
    dx: &mut [O],
    grid: Grid<'_, f32>,
    grad_factor: f32,
    dscales: &mut [f32],
    mut dzero_points: Option<&mut [f32]>,
) -> Result<()> {
    let layout = grid.layout;
    let (quant_min, quant_max) = (grid.quant_min, grid.quant_max);
    check_len("x", layout.numel(), x.len())?;
    check_len("dy", x.len(), dy.len())?;
    check_len("dx", x.len(), dx.len())?;
    check_len("dscales", layout.channels, dscales.len())?;
    if let Some(dz) = &dzero_points {
        check_len("dzero_points", layout.channels, dz.len())?;
    }
    check_len("zero_points", layout.channels, grid.zero_points.len())?;
    check_range(quant_min, quant_max)?;
    if !grad_factor.is_finite() {
        return Err(QuantError::NonFinite {
            what: "grad_factor".into(),
            value: grad_factor as f64,
        });
    }
    let zps = round_zero_points(grid.zero_points, quant_min, quant_max)?;
    let rounded = Grid::new(
        layout,
        grid.scales,
        &zps,
        quant_min,
        quant_max,
        grid.rounding,
    );
    let zero_point = dzero_points.is_some();
    let sums = rounded.run(|path, params| match path {
        Path::Fast(walk) => with_rounding!(grid.rounding, R => {
            // The width the driver's job runs at.
            let path = walk.path(LSQ_WIDEST);
            let rounding = PhantomData;
            match zero_point {
                true => drive(&Lsq::<R, true> { path, rounding }, (x, dy, dx), &walk, layout.channels),
                false => drive(&Lsq::<R, false> { path, rounding }, (x, dy, dx), &walk, layout.channels),
            }
        }),
        Path::Exact => lsq_slow(x, dy, dx, layout, params, grid.torch()),
    })?;
    // `grid.scales[c]` is channel c's scale, which `run` checked.
    for (c, s) in sums.iter().flatten().enumerate() {
        dscales[c] += (s.dscale * grad_factor as f64) as f32;
        if let Some(dz) = dzero_points.as_deref_mut() {
            dz[c] += (-s.dzero * grid.scales[c] as f64 * grad_factor as f64) as f32;
        }
    }
    Ok(())
}
