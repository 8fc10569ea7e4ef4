//! Integer kernels of the runtime on u8 activation codes (portable versions).

use rayon::prelude::*;

use quant_core::{QuantError, Result, RoundingPolicy};

/// A weight matrix `[n, k]` of centered codes, with the sum of each row.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    w: Vec<i16>,
    row_sums: Vec<i32>,
    n: usize,
    k: usize,
}

impl PackedMatrix {
    /// Packs `centered` (`[n, k]`, each in i16 range).
    pub fn new(centered: &[i32], n: usize, k: usize) -> Result<PackedMatrix> {
        if centered.len() != n * k {
            return Err(QuantError::LengthMismatch {
                what: "weight codes".into(),
                expected: n * k,
                actual: centered.len(),
            });
        }
        let w: Vec<i16> = centered
            .iter()
            .map(|v| i16::try_from(*v))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| QuantError::InvalidValue {
                what: "centered weight code".into(),
                value: "outside i16".into(),
                expected: "codes of at most 16 bits".into(),
            })?;
        let row_sums = w
            .chunks(k.max(1))
            .map(|r| r.iter().map(|v| *v as i32).sum())
            .collect();
        Ok(PackedMatrix { w, row_sums, n, k })
    }
}

/// `out[r·n + o] = bias[o] + Σ_i (a[r·k + i] − a_zero) · w[o][i]`, in wrapping i32.
pub fn gemm_u8(
    a: &[u8],
    m: usize,
    a_zero: i32,
    w: &PackedMatrix,
    bias: &[i32],
    out: &mut [i32],
) -> Result<()> {
    let (n, k) = (w.n, w.k);
    if a.len() != m * k || out.len() != m * n || bias.len() != n {
        return Err(QuantError::LengthMismatch {
            what: "integer matrix product operands".into(),
            expected: m * k,
            actual: a.len(),
        });
    }
    let base: Vec<i32> = bias
        .iter()
        .zip(&w.row_sums)
        .map(|(b, s)| b.wrapping_sub(a_zero.wrapping_mul(*s)))
        .collect();
    out.par_chunks_mut(n.max(1) * 16)
        .zip(a.par_chunks(k.max(1) * 16))
        .for_each(|(out, a)| {
            for (row, acc) in a.chunks(k.max(1)).zip(out.chunks_mut(n.max(1))) {
                for (o, v) in acc.iter_mut().enumerate() {
                    let wr = &w.w[o * k..(o + 1) * k];
                    let s: i32 = row
                        .iter()
                        .zip(wr)
                        .fold(0i32, |s, (x, c)| s.wrapping_add(*x as i32 * *c as i32));
                    *v = base[o].wrapping_add(s);
                }
            }
        });
    Ok(())
}

/// `m · 2^-shift ≈ multiplier`, with `m` in `[2^30, 2^31)`.
///
/// # Errors
/// A multiplier that is not finite and positive, or too large for the representation.
pub fn fixed_point_multiplier(multiplier: f64) -> Result<(i64, u32)> {
    if !(multiplier.is_finite() && multiplier > 0.0) {
        return Err(QuantError::NonFinite {
            what: "requantization multiplier".into(),
            value: multiplier,
        });
    }
    // multiplier = f · 2^e with f in [0.5, 1).
    let mut e = multiplier.log2().floor() as i32 + 1;
    let mut f = multiplier / 2f64.powi(e);
    if f >= 1.0 {
        f /= 2.0;
        e += 1;
    }
    if f < 0.5 {
        f *= 2.0;
        e -= 1;
    }
    let mut m = (f * 2f64.powi(31)).round() as i64;
    if m == 1 << 31 {
        m = 1 << 30;
        e += 1;
    }
    let shift = 31 - e;
    if shift < 0 {
        return Err(QuantError::InvalidValue {
            what: "requantization multiplier".into(),
            value: multiplier.to_string(),
            expected: "a value below 2^31 (scales of consecutive layers this far apart cannot be requantized)".into(),
        });
    }
    if shift > 62 {
        // So small that every product rounds to zero; keep the shift representable.
        return Ok((m >> (shift - 62).min(63), 62));
    }
    Ok((m, shift as u32))
}

/// `round(n / 2^shift)` with `policy`, in exact integer arithmetic.
#[inline]
pub fn rounding_shift(n: i64, shift: u32, policy: RoundingPolicy) -> i64 {
    if shift == 0 {
        return n;
    }
    let q = n >> shift;
    let rem = n - (q << shift);
    let half = 1i64 << (shift - 1);
    let up = match policy {
        RoundingPolicy::HalfEven => rem > half || (rem == half && q & 1 == 1),
        RoundingPolicy::HalfUp => rem >= half,
        RoundingPolicy::HalfDown => rem > half,
        RoundingPolicy::HalfAwayFromZero => {
            if n >= 0 {
                rem >= half
            } else {
                rem > half
            }
        }
        RoundingPolicy::HalfTowardZero => {
            if n >= 0 {
                rem > half
            } else {
                rem >= half
            }
        }
        RoundingPolicy::Floor => false,
        RoundingPolicy::Ceil => rem > 0,
    };
    q + up as i64
}

/// `out = clamp(round(acc · m[o] / 2^shift[o]) + zero_point, lo, hi)` with channel
/// `o = index % n` (or one multiplier for all).
#[allow(clippy::too_many_arguments)]
pub fn requantize_u8(
    acc: &[i32],
    n: usize,
    multipliers: &[(i64, u32)],
    zero_point: i32,
    lo: i32,
    hi: i32,
    rounding: RoundingPolicy,
    out: &mut [u8],
) -> Result<()> {
    if out.len() != acc.len() || !(multipliers.len() == 1 || multipliers.len() == n) {
        return Err(QuantError::LengthMismatch {
            what: "requantization operands".into(),
            expected: acc.len(),
            actual: out.len(),
        });
    }
    let per_channel = multipliers.len() > 1;
    for (i, (a, q)) in acc.iter().zip(out.iter_mut()).enumerate() {
        let (m, s) = multipliers[if per_channel { i % n } else { 0 }];
        let v = rounding_shift(*a as i64 * m, s, rounding) + zero_point as i64;
        *q = v.clamp(lo as i64, hi as i64) as u8;
    }
    Ok(())
}

/// im2col of one NHWC sample `[h, w, c]` into rows `[oh·ow, k·k·c]` ordered `(ky, kx, c)`,
/// padding filled with `pad`.
#[allow(clippy::too_many_arguments)]
pub fn im2col_u8(
    x: &[u8],
    (h, w, c): (usize, usize, usize),
    k: usize,
    stride: usize,
    padding: usize,
    (oh, ow): (usize, usize),
    pad: u8,
    out: &mut [u8],
) {
    let row_len = k * k * c;
    for oy in 0..oh {
        for ox in 0..ow {
            let row = &mut out[(oy * ow + ox) * row_len..(oy * ow + ox + 1) * row_len];
            for ky in 0..k {
                let iy = (oy * stride + ky) as isize - padding as isize;
                for kx in 0..k {
                    let ix = (ox * stride + kx) as isize - padding as isize;
                    let dst = &mut row[(ky * k + kx) * c..(ky * k + kx + 1) * c];
                    if iy >= 0 && (iy as usize) < h && ix >= 0 && (ix as usize) < w {
                        let src = (iy as usize * w + ix as usize) * c;
                        dst.copy_from_slice(&x[src..src + c]);
                    } else {
                        dst.fill(pad);
                    }
                }
            }
        }
    }
}

/// Max pooling of one NHWC sample; padding never wins.
#[allow(clippy::too_many_arguments)]
pub fn max_pool<T: Copy + Ord>(
    x: &[T],
    (h, w, c): (usize, usize, usize),
    k: usize,
    stride: usize,
    padding: usize,
    (oh, ow): (usize, usize),
    out: &mut [T],
) {
    for oy in 0..oh {
        for ox in 0..ow {
            let dst = &mut out[(oy * ow + ox) * c..(oy * ow + ox + 1) * c];
            let mut first = true;
            for ky in 0..k {
                let iy = (oy * stride + ky) as isize - padding as isize;
                if iy < 0 || iy as usize >= h {
                    continue;
                }
                for kx in 0..k {
                    let ix = (ox * stride + kx) as isize - padding as isize;
                    if ix < 0 || ix as usize >= w {
                        continue;
                    }
                    let src = &x[(iy as usize * w + ix as usize) * c..][..c];
                    if first {
                        dst.copy_from_slice(src);
                        first = false;
                    } else {
                        for (d, s) in dst.iter_mut().zip(src) {
                            *d = (*d).max(*s);
                        }
                    }
                }
            }
        }
    }
}
