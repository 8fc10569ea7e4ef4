//! The two matrix products of attention on `u8` codes: scores `Q Kᵀ` per head, and the
//! context `P V` per head, into exact `i32` sums of centered codes.

use super::widths::Width;
use super::{checked_size, Isa};
use crate::error::{QuantError, Result};

/// The shapes of attention's two products for one sample: `queries` rows attend to `keys`
/// rows, each of `features` features split evenly over `heads` heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Query rows (tokens) per sample.
    pub queries: usize,
    /// Key and value rows per sample.
    pub keys: usize,
    /// Features per row, all heads together.
    pub features: usize,
    /// Heads; `features` is a multiple of it.
    pub heads: usize,
}

impl AttentionShape {
    /// Features per head.
    pub fn head_features(&self) -> usize {
        self.features / self.heads.max(1)
    }

    fn check(&self, zeros: [i32; 2]) -> Result<()> {
        let whole = self.heads >= 1 && self.features.is_multiple_of(self.heads);
        // Centered u8 codes lie within ±255: sums of fewer than 2^15 products fit i32.
        let short = self.head_features() < 1 << 15 && self.keys < 1 << 15;
        if !whole || !short || self.queries == 0 || self.keys == 0 {
            return Err(QuantError::InvalidValue {
                what: "attention shape".into(),
                value: format!("{self:?}"),
                expected: "at least one query, key and head, features a multiple of heads, \
                           and fewer than 2^15 keys and features per head"
                    .into(),
            });
        }
        if let Some(z) = zeros.iter().find(|z| !(0..=255).contains(*z)) {
            return Err(QuantError::InvalidValue {
                what: "attention zero point".into(),
                value: z.to_string(),
                expected: "a u8 code, 0..=255".into(),
            });
        }
        Ok(())
    }

    /// The names and per-sample lengths of `product`'s two inputs and its output.
    fn buffers(&self, product: Product) -> [(&'static str, usize); 3] {
        let (s1, s2, f, h) = (self.queries, self.keys, self.features, self.heads);
        match product {
            Product::Scores => [
                ("queries", s1 * f),
                ("keys", s2 * f),
                ("scores", h * s1 * s2),
            ],
            Product::Context => [
                ("probabilities", h * s1 * s2),
                ("values", s2 * f),
                ("context", s1 * f),
            ],
        }
    }

    /// An error unless the shape and zero points are valid and the three buffers of `product`
    /// (lengths `lens`) hold the same number of whole samples.
    fn check_buffers(&self, product: Product, zeros: [i32; 2], lens: [usize; 3]) -> Result<()> {
        self.check(zeros)?;
        let buffers = self.buffers(product);
        let n = lens[0] / buffers[0].1.max(1);
        for ((what, per), len) in buffers.into_iter().zip(lens) {
            let expected = checked_size(what, n, per)?;
            if len != expected {
                return Err(QuantError::LengthMismatch {
                    what: format!("attention {what} ({n} samples of {per})"),
                    expected,
                    actual: len,
                });
            }
        }
        Ok(())
    }
}

/// Which of attention's two products a call computes.
#[derive(Clone, Copy)]
enum Product {
    Scores,
    Context,
}

/// Attention scores: for each sample, head `h`, query `i` and key `j`,
/// `out[h, i, j] = Σ_c (q[i, c] - q_zero) · (k[j, c] - k_zero)` over the head's features
/// `c`, exactly (every sum of `u8` products over fewer than `2^15` features fits `i32`).
/// `q` holds samples of `[queries, features]`, `k` of `[keys, features]`, `out` of
/// `[heads, queries, keys]`. `isa` picks the registers (every path gives the same integers).
///
/// # Errors
/// A shape without queries, keys or heads, features not a multiple of heads, `2^15` or more
/// keys or features per head, a zero point outside `0..=255`, or buffers that do not hold the
/// same number of whole samples; nothing is written then.
pub fn attention_scores_u8(
    isa: Isa,
    q: &[u8],
    k: &[u8],
    shape: AttentionShape,
    [q_zero, k_zero]: [i32; 2],
    out: &mut [i32],
) -> Result<()> {
    shape.check_buffers(
        Product::Scores,
        [q_zero, k_zero],
        [q.len(), k.len(), out.len()],
    )?;
    let zeros = [q_zero, k_zero];
    match isa.width() {
        Width::Portable => scores(q, k, &shape, zeros, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::width` gives a width other than `Portable` only after checking that
        // this CPU runs AVX2.
        _ => unsafe { x86::scores(q, k, &shape, zeros, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("only the portable path is available off x86-64"),
    }
    Ok(())
}

/// The reference (and the path off x86-64).
fn scores(q: &[u8], k: &[u8], shape: &AttentionShape, [zq, zk]: [i32; 2], out: &mut [i32]) {
    let (s1, s2, f) = (shape.queries, shape.keys, shape.features);
    let d = shape.head_features();
    // Per sample, the queries centered, and the keys centered and transposed to
    // `[features, keys]`, so that the innermost loop runs along a row of scores.
    let mut qc = vec![0i32; s1 * f];
    let mut kt = vec![0i32; f * s2];
    let samples = q.chunks_exact(s1 * f).zip(k.chunks_exact(s2 * f));
    for ((qs, ks), ys) in samples.zip(out.chunks_exact_mut(shape.heads * s1 * s2)) {
        for (c, v) in qc.iter_mut().zip(qs) {
            *c = *v as i32 - zq;
        }
        for (j, row) in ks.chunks_exact(f).enumerate() {
            for (c, v) in row.iter().enumerate() {
                kt[c * s2 + j] = *v as i32 - zk;
            }
        }
        for (h, head) in ys.chunks_exact_mut(s1 * s2).enumerate() {
            for (i, row) in head.chunks_exact_mut(s2).enumerate() {
                let query = &qc[i * f + h * d..i * f + (h + 1) * d];
                weighted_rows(row, query, &kt[h * d * s2..], s2);
            }
        }
    }
}

/// `out[l] = Σ_t weights[t] · rows[t · stride + l]`: blocks of 16, then 8, then 4 outputs
/// at a time, each summed in registers over every `t` before it is stored (the compiler
/// cannot keep a row of run-time length in registers), the rest one by one.
#[inline(always)]
fn weighted_rows(out: &mut [i32], weights: &[i32], rows: &[i32], stride: usize) {
    let mut done = blocks::<16>(out, weights, rows, stride, 0);
    done = blocks::<8>(out, weights, rows, stride, done);
    done = blocks::<4>(out, weights, rows, stride, done);
    let tail = &mut out[done..];
    tail.fill(0);
    for (t, w) in weights.iter().enumerate() {
        for (a, r) in tail.iter_mut().zip(&rows[t * stride + done..]) {
            *a += w * r;
        }
    }
}

/// [`weighted_rows`] for the whole blocks of `B` outputs from `start` on; returns where they
/// end.
#[inline(always)]
fn blocks<const B: usize>(
    out: &mut [i32],
    weights: &[i32],
    rows: &[i32],
    stride: usize,
    start: usize,
) -> usize {
    let whole = (out.len() - start) / B;
    for (b, dst) in out[start..].chunks_exact_mut(B).enumerate() {
        let first = start + b * B;
        let mut acc = [0i32; B];
        for (t, w) in weights.iter().enumerate() {
            let row = &rows[t * stride + first..][..B];
            for (a, r) in acc.iter_mut().zip(row) {
                *a += w * r;
            }
        }
        dst.copy_from_slice(&acc);
    }
    start + whole * B
}

/// Attention context: for each sample, query `i` and feature `c` of head `h`,
/// `out[i, c] = Σ_j (p[h, i, j] - p_zero) · (v[j, c] - v_zero)`, exactly (fewer than `2^15`
/// keys). `p` holds samples of `[heads, queries, keys]`, `v` of `[keys, features]`, `out` of
/// `[queries, features]`. `isa` picks the registers (every path gives the same integers).
///
/// # Errors
/// As [`attention_scores_u8`].
pub fn attention_context_u8(
    isa: Isa,
    p: &[u8],
    v: &[u8],
    shape: AttentionShape,
    [p_zero, v_zero]: [i32; 2],
    out: &mut [i32],
) -> Result<()> {
    shape.check_buffers(
        Product::Context,
        [p_zero, v_zero],
        [p.len(), v.len(), out.len()],
    )?;
    let zeros = [p_zero, v_zero];
    match isa.width() {
        Width::Portable => context(p, v, &shape, zeros, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::width` gives a width other than `Portable` only after checking that
        // this CPU runs AVX2.
        _ => unsafe { x86::context(p, v, &shape, zeros, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("only the portable path is available off x86-64"),
    }
    Ok(())
}

/// The reference (and the path off x86-64).
fn context(p: &[u8], v: &[u8], shape: &AttentionShape, [zp, zv]: [i32; 2], out: &mut [i32]) {
    let (s1, s2, f) = (shape.queries, shape.keys, shape.features);
    let d = shape.head_features();
    let (mut vc, mut pc) = (vec![0i32; s2 * f], vec![0i32; s2]);
    let samples = p
        .chunks_exact(shape.heads * s1 * s2)
        .zip(v.chunks_exact(s2 * f));
    for ((ps, vs), ys) in samples.zip(out.chunks_exact_mut(s1 * f)) {
        for (c, x) in vc.iter_mut().zip(vs) {
            *c = *x as i32 - zv;
        }
        for (h, probs) in ps.chunks_exact(s1 * s2).enumerate() {
            for (i, weights) in probs.chunks_exact(s2).enumerate() {
                for (c, w) in pc.iter_mut().zip(weights) {
                    *c = *w as i32 - zp;
                }
                let row = &mut ys[i * f + h * d..i * f + (h + 1) * d];
                weighted_rows(row, &pc, &vc[h * d..], f);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::AttentionShape;
    use std::arch::x86_64::*;

    /// `out[l] = Σ_t weights[t] · row_t[l]` over `weights.len()` (even) rows, stored in pairs:
    /// pair `p` (rows `2p` and `2p + 1`) at `pairs[2p · stride..]`, its element `l` at `2l`
    /// and `2l + 1`, so that `vpmaddwd` adds both products of a pair at once (exact: centered
    /// codes lie within ±255); 16, 8 and 4 outputs at a time (each pair's two weights
    /// broadcast as one `i32`, one `vpmaddwd` per 8 outputs and pair), the rest one by one.
    ///
    /// # Safety
    /// The CPU runs AVX2; `pairs` holds `weights.len() / 2` pair rows of `stride` pairs, each
    /// at least `out.len()` long.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn weighted_rows(out: &mut [i32], weights: &[i16], pairs: &[i16], stride: usize) {
        let (ws, _) = weights.as_chunks::<2>();
        // Pair `p`'s weights as one lane: the first in the low half, as the rows' elements.
        let lane = |w: &[i16; 2]| (w[0] as u16 as u32 | (w[1] as u16 as u32) << 16) as i32;
        let n = out.len();
        assert!(ws.is_empty() || pairs.len() >= 2 * ((ws.len() - 1) * stride + n));
        let mut l = 0;
        while l + 16 <= n {
            let (mut a0, mut a1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for (p, w) in ws.iter().enumerate() {
                let w = _mm256_set1_epi32(lane(w));
                // SAFETY: the assertion: 32 `i16`s from `2(p · stride + l)` lie in `pairs`.
                let r = unsafe { pairs.as_ptr().add(2 * (p * stride + l)) } as *const __m256i;
                // SAFETY: as the pointer's comment says.
                let (r0, r1) = unsafe { (_mm256_loadu_si256(r), _mm256_loadu_si256(r.add(1))) };
                a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(r0, w));
                a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(r1, w));
            }
            let o = out[l..l + 16].as_mut_ptr() as *mut __m256i;
            // SAFETY: 16 `i32`s from `l` lie in `out`.
            unsafe {
                _mm256_storeu_si256(o, a0);
                _mm256_storeu_si256(o.add(1), a1);
            }
            l += 16;
        }
        while l + 8 <= n {
            let mut a = _mm256_setzero_si256();
            for (p, w) in ws.iter().enumerate() {
                // SAFETY: as above, 16 `i16`s.
                let r = unsafe {
                    _mm256_loadu_si256(pairs.as_ptr().add(2 * (p * stride + l)) as *const __m256i)
                };
                a = _mm256_add_epi32(a, _mm256_madd_epi16(r, _mm256_set1_epi32(lane(w))));
            }
            // SAFETY: 8 `i32`s from `l` lie in `out`.
            unsafe { _mm256_storeu_si256(out[l..l + 8].as_mut_ptr() as *mut __m256i, a) };
            l += 8;
        }
        while l + 4 <= n {
            let mut a = _mm_setzero_si128();
            for (p, w) in ws.iter().enumerate() {
                // SAFETY: as above, 8 `i16`s.
                let r = unsafe {
                    _mm_loadu_si128(pairs.as_ptr().add(2 * (p * stride + l)) as *const __m128i)
                };
                a = _mm_add_epi32(a, _mm_madd_epi16(r, _mm_set1_epi32(lane(w))));
            }
            // SAFETY: 4 `i32`s from `l` lie in `out`.
            unsafe { _mm_storeu_si128(out[l..l + 4].as_mut_ptr() as *mut __m128i, a) };
            l += 4;
        }
        for (i, o) in out[l..].iter_mut().enumerate() {
            *o = ws
                .iter()
                .enumerate()
                .map(|(p, w)| {
                    let r = &pairs[2 * (p * stride + l + i)..];
                    r[0] as i32 * w[0] as i32 + r[1] as i32 * w[1] as i32
                })
                .sum();
        }
    }

    /// [`super::attention_scores_u8`] on AVX2 (the keys in feature pairs for `weighted_rows`).
    ///
    /// # Safety
    /// The CPU runs AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scores(
        q: &[u8],
        k: &[u8],
        shape: &AttentionShape,
        [zq, zk]: [i32; 2],
        out: &mut [i32],
    ) {
        let (s1, s2, f) = (shape.queries, shape.keys, shape.features);
        let d = shape.head_features();
        let pairs = d.div_ceil(2);
        // Per sample, the queries centered, and the keys centered and transposed to feature
        // pairs of `[keys]` (see `weighted_rows`), one head after another, so that the innermost
        // loop runs along a row of scores. A head of odd width gets a zero feature.
        let mut qc = vec![0i16; 2 * pairs];
        let mut kt = vec![0i16; shape.heads * pairs * 2 * s2];
        let samples = q.chunks_exact(s1 * f).zip(k.chunks_exact(s2 * f));
        for ((qs, ks), ys) in samples.zip(out.chunks_exact_mut(shape.heads * s1 * s2)) {
            // Written in `kt`'s order, so that the stores run in sequence (stores scattered
            // in the keys' order took half of this function's time).
            for (h, head) in kt.chunks_exact_mut(pairs * 2 * s2).enumerate() {
                for (pair, slots) in head.chunks_exact_mut(2 * s2).enumerate() {
                    let t = h * d + 2 * pair;
                    let keys = slots.chunks_exact_mut(2).zip(ks.chunks_exact(f));
                    if 2 * pair + 1 < d {
                        for (slot, key) in keys {
                            slot[0] = centered(key[t], zk);
                            slot[1] = centered(key[t + 1], zk);
                        }
                    } else {
                        // The last feature of a head of odd width; the zero beside it stays.
                        for (slot, key) in keys {
                            slot[0] = centered(key[t], zk);
                        }
                    }
                }
            }
            for (h, head) in ys.chunks_exact_mut(s1 * s2).enumerate() {
                for (i, row) in head.chunks_exact_mut(s2).enumerate() {
                    let query = &qs[i * f + h * d..i * f + (h + 1) * d];
                    for (c, v) in qc.iter_mut().zip(query) {
                        *c = centered(*v, zq);
                    }
                    // SAFETY: AVX2 runs; `kt` holds the head's `pairs` pair rows of `s2`.
                    unsafe { weighted_rows(row, &qc, &kt[h * pairs * 2 * s2..], s2) };
                }
            }
        }
    }

    /// `code - zero` (both in `0..=255`) as `i16`.
    #[inline(always)]
    fn centered(code: u8, zero: i32) -> i16 {
        (code as i32 - zero) as i16
    }

    /// [`super::attention_context_u8`] on AVX2 (the values in key pairs for `weighted_rows`).
    ///
    /// # Safety
    /// The CPU runs AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn context(
        p: &[u8],
        v: &[u8],
        shape: &AttentionShape,
        [zp, zv]: [i32; 2],
        out: &mut [i32],
    ) {
        let (s1, s2, f) = (shape.queries, shape.keys, shape.features);
        let d = shape.head_features();
        let pairs = s2.div_ceil(2);
        // Per sample, the values centered in key pairs (see `weighted_rows`); an odd number of
        // keys gets a zero key with a zero weight.
        let (mut vc, mut pc) = (vec![0i16; pairs * 2 * f], vec![0i16; 2 * pairs]);
        let samples = p
            .chunks_exact(shape.heads * s1 * s2)
            .zip(v.chunks_exact(s2 * f));
        for ((ps, vs), ys) in samples.zip(out.chunks_exact_mut(s1 * f)) {
            // Two keys' rows interleaved, written in `vc`'s order (the stores in sequence).
            for (slots, keys) in vc.chunks_exact_mut(2 * f).zip(vs.chunks(2 * f)) {
                let (first, second) = keys.split_at(f);
                if second.is_empty() {
                    // An odd number of keys: the zeros beside the last key's values stay.
                    for (slot, x) in slots.chunks_exact_mut(2).zip(first) {
                        slot[0] = centered(*x, zv);
                    }
                } else {
                    for ((slot, x), y) in slots.chunks_exact_mut(2).zip(first).zip(second) {
                        slot[0] = centered(*x, zv);
                        slot[1] = centered(*y, zv);
                    }
                }
            }
            for (h, probs) in ps.chunks_exact(s1 * s2).enumerate() {
                for (i, weights) in probs.chunks_exact(s2).enumerate() {
                    for (c, w) in pc.iter_mut().zip(weights) {
                        *c = centered(*w, zp);
                    }
                    let row = &mut ys[i * f + h * d..i * f + (h + 1) * d];
                    // SAFETY: AVX2 runs; `vc` holds `pairs` pair rows of `f` from the head's
                    // first feature.
                    unsafe { weighted_rows(row, &pc, &vc[2 * h * d..], f) };
                }
            }
        }
    }
}
