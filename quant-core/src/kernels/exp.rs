//! `e^x` in `f64` for `x ≤ 0`, many values at a time: the exponentials of the exact softmax's
//! gradient (`x - max` of each score row), which QAT of an attention takes for every score of
//! every step.
//!
//! The standard library's `exp` is one call per value (5% of the digits ViT's QAT step, by
//! `perf`). Here: `x = k·ln 2 + r` with `k` rounded to the nearest integer (ties to even) and
//! `|r| ≤ ln 2 / 2` (Cody and Waite's two-part `ln 2`), then `e^r = 1 + r + r²·q(r)` with `q`
//! the Taylor series from `1/2!` to `1/14!` (its truncation error is below 2⁻⁵⁷ of the result;
//! evaluated by Estrin's scheme, whose short chain lets the CPU overlap more values than
//! Horner's rule, which took 1.4 times as long), what `r` and `1 + r` round off added back
//! before the one last rounding, and `2^k` put in the exponent bits, a product that is exact.
//! Within one unit in the last place of the correctly rounded result and on it for all but
//! about one value in a hundred; without branches, so the loop vectorises; each path runs the
//! same IEEE operations (Rust never fuses a multiply and an add), so each gives the same bits.

use super::VectorPath;

/// Below this, `e^x` is under `f64`'s smallest normal number (`2^-1022`, from about −708.4
/// on) and is returned as zero: a softmax probability that small is zero in `f32` and nothing
/// beside a row's largest term (which is 1).
pub const FLUSH_BELOW: f64 = -708.0;

/// `e^x` for `x ≤ 0` (see the module); `NaN` stays `NaN`, `-∞` and everything below
/// [`FLUSH_BELOW`] give 0.
#[inline(always)]
#[allow(clippy::excessive_precision)]
pub fn exp_nonpositive(x: f64) -> f64 {
    // 1.5·2^52: added and taken away again, a value below 2^51 in magnitude rounds to an
    // integer (ties to even), and the sum's low mantissa bits hold that integer.
    const SHIFTER: f64 = 6_755_399_441_055_744.0;
    // ln 2 in two parts (fdlibm's): `k · LN2_HI` is exact for |k| < 2^20.
    const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-01;
    const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
    // 1/n! for n = 2 up to 14: the coefficients of r⁰ … r¹² in `q`.
    const INV_FACTORIALS: [f64; 13] = [
        1.0 / 2.0,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5_040.0,
        1.0 / 40_320.0,
        1.0 / 362_880.0,
        1.0 / 3_628_800.0,
        1.0 / 39_916_800.0,
        1.0 / 479_001_600.0,
        1.0 / 6_227_020_800.0,
        1.0 / 87_178_291_200.0,
    ];
    let flushed = x < FLUSH_BELOW;
    // A NaN compares false and goes through as NaN.
    let x = if flushed { FLUSH_BELOW } else { x };
    let shifted = x * std::f64::consts::LOG2_E + SHIFTER;
    let k = shifted - SHIFTER;
    let r_hi = x - k * LN2_HI;
    let k_lo = k * LN2_LO;
    let r = r_hi - k_lo;
    // What the subtraction and `1 + r` round off, added back before the last rounding (each
    // exact, as the larger term comes first): without them one result in ten is a unit off.
    let r_lost = (r_hi - r) - k_lo;
    let one_r = 1.0 + r;
    let one_r_lost = (1.0 - one_r) + r;
    // `q` by Estrin's scheme (pairs, then pairs of pairs, in powers r², r⁴, r⁸): a chain of
    // five products and sums instead of Horner's twelve, so that more values are in flight.
    let c = &INV_FACTORIALS;
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    let pairs: [f64; 6] = std::array::from_fn(|i| c[2 * i] + c[2 * i + 1] * r);
    let low = (pairs[0] + pairs[1] * r2) + (pairs[2] + pairs[3] * r2) * r4;
    let high = (pairs[4] + pairs[5] * r2) + c[12] * r4;
    let q = low + high * r8;
    // e^(r + r_lost) = e^r · (1 + r_lost), and e^r = 1 + r + r²·q.
    let e_r = one_r + (one_r_lost + (r_lost * one_r + r2 * q));
    // 2^k, k in [-1021, 0] here: the biased exponent `k + 1023` from the sum's low bits (the
    // shift drops the sum's own exponent and leading bits).
    let scale = f64::from_bits(shifted.to_bits().wrapping_add(1023) << 52);
    if flushed {
        0.0
    } else {
        e_r * scale
    }
}

/// `v = e^v` for every value (each `≤ 0`) on `path` (where the CPU has it; else on the
/// baseline; every path gives the same bits): [`VectorPath::widest`], taken once for many
/// calls.
pub fn exp_nonpositive_in_place(path: VectorPath, values: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    match path {
        VectorPath::Avx512 if std::arch::is_x86_feature_detected!("avx512f") => {
            // SAFETY: the CPU has AVX-512 F, checked just above.
            return unsafe { exp_avx512(values) };
        }
        VectorPath::Avx2 if std::arch::is_x86_feature_detected!("avx2") => {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { exp_avx2(values) };
        }
        _ => {}
    }
    let _ = path;
    exp_lanes(values);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_avx2(values: &mut [f64]) {
    exp_lanes(values);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_avx512(values: &mut [f64]) {
    exp_lanes(values);
}

#[inline(always)]
fn exp_lanes(values: &mut [f64]) {
    for v in values {
        *v = exp_nonpositive(*v);
    }
}
