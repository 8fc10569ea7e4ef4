//! GELU with the numbers of dfdx's `AccurateGeLU`, a chunk of lanes at a time (the kernels of
//! `quant_dfdx::nn::Gelu`).
//!
//! dfdx evaluates `0.5·x·(1 + erf(x/√2))` element by element through `libm::erff` (FreeBSD's
//! `s_erff.c`: a rational approximation per range of `|x|`, and two `expf` calls from 1.25 on),
//! a branchy scalar call. Here the ranges are evaluated without branches, several lanes at a
//! time, and each lane keeps the one `erff` would have taken: the same `f32` operations in the
//! same order, so the same bits (each IEEE operation is exact to its rounding, and Rust never
//! fuses a multiply and an add). The far range, the costly one, is computed only for the lanes
//! in it, gathered apart ([`gelu_forward_lanes`]). The loops vectorise: SSE2 on baseline
//! x86-64, AVX2 or AVX-512 where the CPU has it (chosen at run time; AVX-512's mask registers
//! make the selections cheaper).
//!
//! The backward pass is dfdx's too: `dx += (0.5·(1 + erf(x/√2)) + 0.5·x·(2/√π)·exp(-x²/2))·dy`,
//! with the standard library's `exp`. That is not quite the derivative: the chain rule's `1/√2`
//! is missing from the second term (the exact slope is `Φ(x) + x·φ(x)`, which
//! [`int_gelu`](crate::dfdx_ops::int_gelu) uses in QAT). It is kept so that a model trains to
//! the same weights with either layer.

use std::f32::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};

use rayon::prelude::*;

use super::VectorPath;
use crate::error::{check_len, Result};

/// `y = 0.5·x·(1 + erf(x/√2))` and `erf(x/√2)` of every element of `x`, as dfdx's
/// `AccurateGeLU` computes them bit for bit, on the widest path the CPU has (each path gives
/// the same bits); `erf` is what [`gelu_backward_into`] needs.
///
/// # Errors
/// `y` or `erf` not as long as `x`.
pub fn gelu_forward_into(x: &[f32], y: &mut [f32], erf: &mut [f32]) -> Result<()> {
    check_len("GELU output", x.len(), y.len())?;
    check_len("GELU erf values", x.len(), erf.len())?;
    let path = VectorPath::widest();
    if parallel(x.len()) {
        x.par_chunks(GELU_CHUNK)
            .zip(y.par_chunks_mut(GELU_CHUNK))
            .zip(erf.par_chunks_mut(GELU_CHUNK))
            .for_each(|((x, y), erf)| gelu_forward_on(path, x, y, erf));
    } else {
        gelu_forward_on(path, x, y, erf);
    }
    Ok(())
}

/// Values from which the GELU passes run in parallel (rayon): each value costs a few
/// nanoseconds (a rational function and, from `|x| ≥ 1.25`, two `exp`), so far fewer than the
/// element kernels' [`PARALLEL_THRESHOLD`](super::PARALLEL_THRESHOLD) are worth a split.
pub const GELU_PARALLEL: usize = 1 << 14;
/// Values per parallel piece. Every value is computed alone, so any split gives the same bits.
const GELU_CHUNK: usize = 1 << 12;

fn parallel(len: usize) -> bool {
    len >= GELU_PARALLEL && rayon::current_num_threads() > 1
}

/// [`gelu_forward_into`] on `path` (where the CPU has it; else on the baseline).
pub fn gelu_forward_on(path: VectorPath, x: &[f32], y: &mut [f32], erf: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match path {
        VectorPath::Avx512 if std::arch::is_x86_feature_detected!("avx512f") => {
            // SAFETY: the CPU has AVX-512 F, checked just above.
            return unsafe { gelu_forward_avx512(x, y, erf) };
        }
        VectorPath::Avx2 if std::arch::is_x86_feature_detected!("avx2") => {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { gelu_forward_avx2(x, y, erf) };
        }
        _ => {}
    }
    let _ = path;
    gelu_forward_lanes(x, y, erf);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gelu_forward_avx2(x: &[f32], y: &mut [f32], erf: &mut [f32]) {
    gelu_forward_lanes(x, y, erf);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gelu_forward_avx512(x: &[f32], y: &mut [f32], erf: &mut [f32]) {
    gelu_forward_lanes(x, y, erf);
}

/// Values per piece of [`gelu_forward_lanes`] (its far lanes are gathered per piece).
const PIECE: usize = 256;

/// GELU of every `x` and its `erf(x/√2)`: dfdx's `0.5 * x * (1 + (x * FRAC_1_SQRT_2).erf())`,
/// evaluated left to right.
///
/// `erf`'s far range (`1.25 ≤ |x/√2| < 6`) costs about three times the rest (two `exp` and a
/// second rational function), and computing it in every lane, as [`erf_branchless`] does,
/// spends most of the time on lanes that discard it. So each piece computes the other ranges
/// in every lane, then gathers the lanes of the far range (a tenth to a half of a trained
/// ViT's GELU inputs), computes those contiguously and puts them back. Each lane's value is
/// computed by the same operations either way: the same bits.
///
/// The far range is computed in two loops, its quotient and then the rest: one lane's chain
/// of dependent operations (three divisions, eight-term polynomials, two `exp`) is longer than
/// the CPU's reordering window holds, and a loop body of half of it lets several vectors'
/// chains overlap.
#[inline(always)]
fn gelu_forward_lanes(x: &[f32], y: &mut [f32], erf: &mut [f32]) {
    let mut far_at = [0u16; PIECE];
    let mut far_x = [0.0f32; PIECE];
    let mut far_quotient = [0.0f32; PIECE];
    let mut far_erf = [0.0f32; PIECE];
    for ((x, y), erf) in x
        .chunks(PIECE)
        .zip(y.chunks_mut(PIECE))
        .zip(erf.chunks_mut(PIECE))
    {
        for (e, x) in erf.iter_mut().zip(x) {
            *e = erf_outside_far_range(*x * FRAC_1_SQRT_2);
        }
        // The far lanes, a bit each, 64 to a word.
        let mut far = 0;
        for (word, x) in x.chunks(64).enumerate() {
            let mut far_lanes = 0u64;
            for (i, x) in x.iter().enumerate() {
                far_lanes |= u64::from(in_far_range(*x * FRAC_1_SQRT_2)) << i;
            }
            while far_lanes != 0 {
                let i = far_lanes.trailing_zeros() as usize;
                far_at[far] = (word * 64 + i) as u16;
                far_x[far] = x[i] * FRAC_1_SQRT_2;
                far += 1;
                far_lanes &= far_lanes - 1;
            }
        }
        // Whole vectors only (the lanes past `far` are discarded): a loop's scalar tail
        // would cost more than the padding.
        let padded = far.next_multiple_of(16);
        for (q, x) in far_quotient[..padded].iter_mut().zip(&far_x[..padded]) {
            *q = far_range_quotient(*x);
        }
        for ((e, x), q) in far_erf[..padded]
            .iter_mut()
            .zip(&far_x[..padded])
            .zip(&far_quotient)
        {
            *e = erf_in_far_range_given(*x, *q);
        }
        for (i, e) in far_at[..far].iter().zip(&far_erf[..far]) {
            erf[*i as usize] = *e;
        }
        for ((y, x), e) in y.iter_mut().zip(x).zip(erf.iter()) {
            *y = 0.5 * *x * (1.0 + *e);
        }
    }
}

/// dfdx's `AccurateGeLU` backward, `dx += df(x) · dy` with its `df` term for term, given the
/// `erf` values [`gelu_forward_into`] wrote for `x`.
///
/// # Errors
/// `erf`, `dy` or `dx` not as long as `x`.
pub fn gelu_backward_into(x: &[f32], erf: &[f32], dy: &[f32], dx: &mut [f32]) -> Result<()> {
    check_len("GELU erf values", x.len(), erf.len())?;
    check_len("GELU output gradient", x.len(), dy.len())?;
    check_len("GELU input gradient", x.len(), dx.len())?;
    let backward = |x: &[f32], erf: &[f32], dy: &[f32], dx: &mut [f32]| {
        for (((x, e), dy), dx) in x.iter().zip(erf).zip(dy).zip(dx.iter_mut()) {
            let normal_dist = FRAC_2_SQRT_PI * (0.5 * -(*x * *x)).exp();
            let left = 0.5 * *x;
            let right = 1.0 + *e;
            *dx += (0.5 * right + left * normal_dist) * *dy;
        }
    };
    if parallel(x.len()) {
        x.par_chunks(GELU_CHUNK)
            .zip(erf.par_chunks(GELU_CHUNK))
            .zip(dy.par_chunks(GELU_CHUNK))
            .zip(dx.par_chunks_mut(GELU_CHUNK))
            .for_each(|(((x, erf), dy), dx)| backward(x, erf, dy, dx));
    } else {
        backward(x, erf, dy, dx);
    }
    Ok(())
}

// FreeBSD's `s_erff.c` coefficients, as its decimal strings (they round to the intended `f32`
// bits, which is all that matters here) (as in the `libm` crate): erf on [0, 0.84375] ...
#[allow(clippy::excessive_precision)]
const EFX8: f32 = 1.0270333290e+00;
#[allow(clippy::excessive_precision)]
const PP: [f32; 5] = [
    1.2837916613e-01,
    -3.2504209876e-01,
    -2.8481749818e-02,
    -5.7702702470e-03,
    -2.3763017452e-05,
];
#[allow(clippy::excessive_precision)]
const QQ: [f32; 5] = [
    3.9791721106e-01,
    6.5022252500e-02,
    5.0813062117e-03,
    1.3249473704e-04,
    -3.9602282413e-06,
];
// ... erf - ERX on [0.84375, 1.25] ...
#[allow(clippy::excessive_precision)]
const ERX: f32 = 8.4506291151e-01;
#[allow(clippy::excessive_precision)]
const PA: [f32; 7] = [
    -2.3621185683e-03,
    4.1485610604e-01,
    -3.7220788002e-01,
    3.1834661961e-01,
    -1.1089469492e-01,
    3.5478305072e-02,
    -2.1663755178e-03,
];
#[allow(clippy::excessive_precision)]
const QA: [f32; 6] = [
    1.0642088205e-01,
    5.4039794207e-01,
    7.1828655899e-02,
    1.2617121637e-01,
    1.3637083583e-02,
    1.1984500103e-02,
];
// ... erfc on [1.25, 1/0.35] (RA, SA) and [1/0.35, 6] (RB, SB; padded with a zero: `c + s·0`
// is `c` exactly for the finite `s` of those lanes, so one polynomial serves both ranges).
#[allow(clippy::excessive_precision)]
const RA: [f32; 8] = [
    -9.8649440333e-03,
    -6.9385856390e-01,
    -1.0558626175e+01,
    -6.2375331879e+01,
    -1.6239666748e+02,
    -1.8460508728e+02,
    -8.1287437439e+01,
    -9.8143291473e+00,
];
#[allow(clippy::excessive_precision)]
const SA: [f32; 8] = [
    1.9651271820e+01,
    1.3765776062e+02,
    4.3456588745e+02,
    6.4538726807e+02,
    4.2900814819e+02,
    1.0863500214e+02,
    6.5702495575e+00,
    -6.0424413532e-02,
];
#[allow(clippy::excessive_precision)]
const RB: [f32; 8] = [
    -9.8649431020e-03,
    -7.9928326607e-01,
    -1.7757955551e+01,
    -1.6063638306e+02,
    -6.3756646729e+02,
    -1.0250950928e+03,
    -4.8351919556e+02,
    0.0,
];
#[allow(clippy::excessive_precision)]
const SB: [f32; 8] = [
    3.0338060379e+01,
    3.2579251099e+02,
    1.5367296143e+03,
    3.1998581543e+03,
    2.5530502930e+03,
    4.7452853394e+02,
    -2.2440952301e+01,
    0.0,
];

/// `libm::erff(x)`, every range computed and the right one selected (no branches, so a loop
/// of it vectorises).
#[inline(always)]
pub fn erf_branchless(x: f32) -> f32 {
    let far = erf_in_far_range(x);
    let other = erf_outside_far_range(x);
    if in_far_range(x) {
        far
    } else {
        other
    }
}

/// `1.25 ≤ |x| < 6`, where `erff` calls `expf` twice (NaN is not).
#[inline(always)]
fn in_far_range(x: f32) -> bool {
    (0x3fa0_0000..0x40c0_0000).contains(&magnitude_bits(x))
}

/// `libm::erff(x)` where `x` is not [`in_far_range`] (other lanes get a value to discard).
#[inline(always)]
fn erf_outside_far_range(x: f32) -> f32 {
    let negative = x.is_sign_negative();
    let ix = magnitude_bits(x);
    let ax = x.abs();

    // |x| < 2^-28.
    let tiny = 0.125 * (8.0 * x + EFX8 * x);
    // |x| < 0.84375: x + x·r/s.
    let z = x * x;
    let r = PP[0] + z * (PP[1] + z * (PP[2] + z * (PP[3] + z * PP[4])));
    let s = 1.0 + z * (QQ[0] + z * (QQ[1] + z * (QQ[2] + z * (QQ[3] + z * QQ[4]))));
    // |x| < 1.25: 1 - erfc1(x) = 1 - (1 - ERX - p/q).
    let s1 = ax - 1.0;
    let p = PA[0]
        + s1 * (PA[1] + s1 * (PA[2] + s1 * (PA[3] + s1 * (PA[4] + s1 * (PA[5] + s1 * PA[6])))));
    let q =
        1.0 + s1 * (QA[0] + s1 * (QA[1] + s1 * (QA[2] + s1 * (QA[3] + s1 * (QA[4] + s1 * QA[5])))));
    // Each lane needs one of the two quotients: one division, of the lane's pair.
    let (num, den) = if ix < 0x3f58_0000 { (r, s) } else { (p, q) };
    let quotient = num / den;
    let small = x + x * quotient;
    let erfc_near = 1.0 - ERX - quotient;
    let mid = 1.0 - erfc_near;
    // |x| ≥ 6: 1 - tiny.
    let far = 1.0 - f32::from_bits(0x0380_0000);
    let y = if ix < 0x40c0_0000 { mid } else { far };
    let signed = if negative { -y } else { y };
    // ±Inf: libm's `1 - 2·sign + 1/x` is `1 - 2·sign` (plus a zero); NaN stays NaN.
    let special = if x.is_nan() {
        x
    } else {
        1.0 - 2.0 * (negative as u32 as f32)
    };

    if ix >= 0x7f80_0000 {
        special
    } else if ix < 0x3180_0000 {
        tiny
    } else if ix < 0x3f58_0000 {
        small
    } else {
        signed
    }
}

/// `libm::erff(x)` where `x` is [`in_far_range`]: `1 - erfc(x)`, with
/// `erfc = expf(-z² - 0.5625)·expf((z - |x|)(z + |x|) + R/S) / |x|` (other lanes get a value
/// to discard).
#[inline(always)]
fn erf_in_far_range(x: f32) -> f32 {
    erf_in_far_range_given(x, far_range_quotient(x))
}

/// `R/S` of [`erf_in_far_range`]: of `[1.25, 1/0.35)` or of `[1/0.35, 6)`.
#[inline(always)]
fn far_range_quotient(x: f32) -> f32 {
    let ax = x.abs();
    let s2 = 1.0 / (ax * ax);
    let beyond = magnitude_bits(x) >= 0x4036_db6d;
    let r2 = horner8(s2, beyond, &RA, &RB);
    let big_s = 1.0 + s2 * horner8(s2, beyond, &SA, &SB);
    r2 / big_s
}

/// [`erf_in_far_range`] given its [`far_range_quotient`].
#[inline(always)]
fn erf_in_far_range_given(x: f32, quotient: f32) -> f32 {
    let ax = x.abs();
    let zt = f32::from_bits(ax.to_bits() & 0xffff_e000);
    let erfc =
        expf_reduced(-zt * zt - 0.5625) * expf_reduced((zt - ax) * (zt + ax) + quotient) / ax;
    let y = 1.0 - erfc;
    if x.is_sign_negative() {
        -y
    } else {
        y
    }
}

/// The bits of `|x|`, as `i32`: the C code's comparisons of them are unsigned, but with the
/// sign bit clear a signed comparison is the same, and AVX2 has only signed ones.
#[inline(always)]
fn magnitude_bits(x: f32) -> i32 {
    (x.to_bits() & 0x7fff_ffff) as i32
}

/// `c[0] + s·(c[1] + s·(… + s·c[7]))` with the coefficients `c` of `b` where `use_b`, of `a`
/// elsewhere (selected one by one, which vectorises; a selected table would be a gather).
#[inline(always)]
fn horner8(s: f32, use_b: bool, a: &[f32; 8], b: &[f32; 8]) -> f32 {
    let c = |i: usize| if use_b { b[i] } else { a[i] };
    c(0) + s * (c(1) + s * (c(2) + s * (c(3) + s * (c(4) + s * (c(5) + s * (c(6) + s * c(7)))))))
}

/// `libm::expf(x)` (FreeBSD's `e_expf.c`) wherever the result is a normal number (about
/// `-87.3 < x < 88.7`), without branches: there `scalbnf` is one exact product with `2^k`. The
/// arguments `erff` passes lie in `[-36.6, 1]`; other lanes' results are discarded by the
/// caller.
#[inline(always)]
#[allow(clippy::excessive_precision)]
pub fn expf_reduced(x: f32) -> f32 {
    const LN2_HI: f32 = 6.9314575195e-01;
    const LN2_LO: f32 = 1.4286067653e-06;
    const INV_LN2: f32 = 1.4426950216e+00;
    const P1: f32 = 1.6666625440e-1;
    const P2: f32 = -2.7667332906e-3;
    let hx = magnitude_bits(x);
    let negative = x.is_sign_negative();
    let half = if negative { -0.5 } else { 0.5 };
    // C's truncating conversion. `as i32` would be scalar code per lane (its saturation and
    // NaN rules); within ±2^24 (NaN mapped in by `max`) the unchecked one is the same and
    // vectorises. Lanes with such large values are discarded by the caller.
    #[allow(
        clippy::manual_clamp,
        reason = "`clamp` keeps a NaN, which must not convert"
    )]
    let k_far_f = (INV_LN2 * x + half).max(-16_777_216.0).min(16_777_216.0);
    // SAFETY: finite and within ±2^24 (`f32::max` returns the other operand for a NaN), so
    // representable in `i32`.
    let k_far: i32 = unsafe { k_far_f.to_int_unchecked() };
    let k_near = if negative { -1 } else { 1 };
    let reduce = hx > 0x3eb1_7218;
    let k = if hx > 0x3f85_1592 {
        k_far
    } else if reduce {
        k_near
    } else {
        0
    };
    let kf = k as f32;
    let hi = if reduce { x - kf * LN2_HI } else { x };
    let lo = if reduce { kf * LN2_LO } else { 0.0 };
    let xr = if reduce { hi - lo } else { x };
    let xx = xr * xr;
    let c = xr - xx * (P1 + xx * P2);
    let y = 1.0 + (xr * c / (2.0 - c) - lo + hi);
    let y = if hx > 0x3900_0000 { y } else { 1.0 + x };
    // 2^k, with k kept where the power is a normal number (only discarded lanes leave it).
    let k = k.clamp(-126, 127);
    y * f32::from_bits(((k + 127) as u32) << 23)
}
