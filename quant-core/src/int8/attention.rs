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
        _ if x86::scores_on_tiles(isa, q, k, &shape, zeros, out) => {}
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
        _ if x86::context_on_tiles(isa, p, v, &shape, zeros, out) => {}
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
    use crate::int8::x86::{i16_chunk, quads_lanes, run_quads, QuadsOperands};
    use crate::int8::Isa;
    use std::arch::x86_64::*;

    /// The largest `|code - zero|` of `codes` where every centered code suits the weights of
    /// `isa`'s quads tiles (within `i8` with VNNI, within ±64 without: `vpmaddubsw` saturates
    /// its pair sums beyond), and `isa` runs here; `None` otherwise.
    fn quads_weights(isa: Isa, codes: &[u8], zero: i32) -> Option<u32> {
        let (lo, hi) = codes
            .iter()
            .fold((u8::MAX, 0u8), |(lo, hi), c| (lo.min(*c), hi.max(*c)));
        let (lo, hi) = (lo as i32 - zero, hi as i32 - zero);
        let fits = match isa {
            Isa::Portable => false,
            Isa::AvxVnni | Isa::Avx512Vnni => lo >= -128 && hi <= 127,
            Isa::Avx2 | Isa::Avx512Bw => lo >= -64 && hi <= 64,
        };
        (fits && isa.is_available()).then(|| lo.unsigned_abs().max(hi.unsigned_abs()))
    }

    /// Where `weights` centered on `zero` suit `isa`'s tiles ([`quads_weights`]): the lanes of
    /// its panels, and one product on them, with the `i16` runs that `activations` allow on
    /// the paths without VNNI.
    fn tiles_for(
        isa: Isa,
        activations: &[u8],
        weights: &[u8],
        zero: i32,
    ) -> Option<(usize, impl Fn(QuadsOperands<'_>))> {
        let max_abs = quads_weights(isa, weights, zero)?;
        let chunk = match isa {
            Isa::Avx2 | Isa::Avx512Bw => i16_chunk(activations, max_abs),
            _ => None,
        };
        Some((quads_lanes(isa), move |o: QuadsOperands<'_>| {
            run_quads(isa, chunk, o)
        }))
    }

    /// `codes - zero` as the bytes of `i8` codes, into `out` (the caller checked that they
    /// fit `i8`).
    fn center(codes: &[u8], zero: i32, out: &mut [u8]) {
        for (o, c) in out.iter_mut().zip(codes) {
            *o = c.wrapping_sub(zero as u8);
        }
    }

    /// `quads[c] = [k0[c], k1[c], k2[c], k3[c]]` for the four rows of `rows` (each
    /// `quads.len()` long): SSE2 unpacks, 16 features at a time (a byte at a time took most of
    /// the context's packing).
    fn interleave(rows: &[u8], quads: &mut [[u8; 4]]) {
        let n = quads.len();
        assert_eq!(rows.len(), 4 * n);
        let mut c = 0;
        while c + 16 <= n {
            // SAFETY: SSE2 is part of x86-64; `c + 16 <= n`, so 16 bytes from `t · n + c` lie in
            // `rows` (`4 · n` long) for each row `t < 4`, and 64 bytes from `quads[c]` in
            // `quads`; loads and stores take any alignment.
            unsafe {
                let load =
                    |t: usize| _mm_loadu_si128(rows.as_ptr().add(t * n + c) as *const __m128i);
                let (a, b, x, y) = (load(0), load(1), load(2), load(3));
                let (ab_low, ab_high) = (_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b));
                let (xy_low, xy_high) = (_mm_unpacklo_epi8(x, y), _mm_unpackhi_epi8(x, y));
                let out = quads.as_mut_ptr().add(c) as *mut __m128i;
                _mm_storeu_si128(out, _mm_unpacklo_epi16(ab_low, xy_low));
                _mm_storeu_si128(out.add(1), _mm_unpackhi_epi16(ab_low, xy_low));
                _mm_storeu_si128(out.add(2), _mm_unpacklo_epi16(ab_high, xy_high));
                _mm_storeu_si128(out.add(3), _mm_unpackhi_epi16(ab_high, xy_high));
            }
            c += 16;
        }
        for (i, quad) in quads.iter_mut().enumerate().skip(c) {
            *quad = [rows[i], rows[n + i], rows[2 * n + i], rows[3 * n + i]];
        }
    }

    /// [`super::attention_scores_u8`] on the int8 product's tiles (`vpdpbusd`, or
    /// `vpmaddubsw`), where the keys' centered codes suit them (narrow grids): per sample and
    /// head, the keys are packed as weights (one output channel per key), the queries' codes
    /// are read in place as the activations (copied, zero-padded, where a head's features are
    /// not whole groups of 4), and `-z_q · Σ_c (k - z_k)` per key is each channel's constant.
    /// `false`, with nothing written, where they do not suit or `isa` does not run here.
    pub(super) fn scores_on_tiles(
        isa: Isa,
        q: &[u8],
        k: &[u8],
        shape: &AttentionShape,
        [zq, zk]: [i32; 2],
        out: &mut [i32],
    ) -> bool {
        let Some((lanes, run)) = tiles_for(isa, q, k, zk) else {
            return false;
        };
        match lanes {
            8 => scores_in_panels::<8>(q, k, shape, [zq, zk], out, run),
            _ => scores_in_panels::<16>(q, k, shape, [zq, zk], out, run),
        }
        true
    }

    /// [`scores_on_tiles`] with the keys packed in panels of `LANES` channels, each product
    /// run by `run`.
    fn scores_in_panels<const LANES: usize>(
        q: &[u8],
        k: &[u8],
        shape: &AttentionShape,
        [zq, zk]: [i32; 2],
        out: &mut [i32],
        run: impl Fn(QuadsOperands<'_>),
    ) {
        let (s1, s2, f, d) = (
            shape.queries,
            shape.keys,
            shape.features,
            shape.head_features(),
        );
        let (lanes, groups) = (LANES, d.div_ceil(4));
        let panel = groups * lanes * 4;
        let mut w = vec![0u8; s2.div_ceil(lanes) * panel];
        let mut columns = vec![0i32; s2.div_ceil(lanes) * lanes];
        let mut kc = vec![0u8; s2 * f];
        let in_place = d.is_multiple_of(4) && f.is_multiple_of(4);
        // The panels' padding (the last group's features, the last panel's keys) and the
        // copied rows' stay zero throughout.
        let mut rows = vec![0u8; if in_place { 0 } else { s1 * groups * 4 }];
        let samples = q.chunks_exact(s1 * f).zip(k.chunks_exact(s2 * f));
        for ((qs, ks), ys) in samples.zip(out.chunks_exact_mut(shape.heads * s1 * s2)) {
            center(ks, zk, &mut kc);
            for (h, ys) in ys.chunks_exact_mut(s1 * s2).enumerate() {
                for (j, key) in kc.chunks_exact(f).enumerate() {
                    let key = &key[h * d..(h + 1) * d];
                    // Group `g` of key `j` at `[j / lanes][g][j % lanes]` of the panels.
                    let first = (j / lanes) * panel + (j % lanes) * 4;
                    let (quads, rest) = key.as_chunks::<4>();
                    for (g, quad) in quads.iter().enumerate() {
                        let at = first + g * lanes * 4;
                        w[at..at + 4].copy_from_slice(quad);
                    }
                    if !rest.is_empty() {
                        let at = first + quads.len() * lanes * 4;
                        w[at..at + rest.len()].copy_from_slice(rest);
                    }
                    let sum: i32 = key.iter().map(|c| *c as i8 as i32).sum();
                    columns[j] = -zq * sum;
                }
                let (a, a_stride) = if in_place {
                    (&qs[h * d..], f)
                } else {
                    let queries = rows.chunks_exact_mut(groups * 4).zip(qs.chunks_exact(f));
                    for (row, query) in queries {
                        row[..d].copy_from_slice(&query[h * d..(h + 1) * d]);
                    }
                    (&rows[..], groups * 4)
                };
                let operands = QuadsOperands {
                    a,
                    a_stride,
                    rows: s1,
                    groups,
                    w: &w,
                    columns: &columns,
                    out: ys,
                    out_stride: s2,
                    cols: s2,
                };
                run(operands);
            }
        }
    }

    /// [`super::attention_context_u8`] on the int8 product's tiles, where the values' centered
    /// codes suit them: per sample and head, the values are packed as weights (one output
    /// channel per feature of the head, the keys as fan-in), the probabilities' codes are read
    /// in place as the activations (copied, zero-padded, where the keys are not whole groups
    /// of 4), and `-z_p · Σ_j (v - z_v)` per feature is each channel's constant. `false`, with
    /// nothing written, where they do not suit or `isa` does not run here.
    pub(super) fn context_on_tiles(
        isa: Isa,
        p: &[u8],
        v: &[u8],
        shape: &AttentionShape,
        [zp, zv]: [i32; 2],
        out: &mut [i32],
    ) -> bool {
        let Some((lanes, run)) = tiles_for(isa, p, v, zv) else {
            return false;
        };
        match lanes {
            8 => context_in_panels::<8>(p, v, shape, [zp, zv], out, run),
            _ => context_in_panels::<16>(p, v, shape, [zp, zv], out, run),
        }
        true
    }

    /// [`context_on_tiles`] with the values packed in panels of `LANES` channels, each
    /// product run by `run`.
    fn context_in_panels<const LANES: usize>(
        p: &[u8],
        v: &[u8],
        shape: &AttentionShape,
        [zp, zv]: [i32; 2],
        out: &mut [i32],
        run: impl Fn(QuadsOperands<'_>),
    ) {
        let (s1, s2, f, d) = (
            shape.queries,
            shape.keys,
            shape.features,
            shape.head_features(),
        );
        let (lanes, groups) = (LANES, s2.div_ceil(4));
        let panel = groups * lanes * 4;
        let head_bytes = d.div_ceil(lanes) * panel;
        // Every head's weight panels, the padding of the last group and panel zero throughout.
        let mut packed = vec![0u8; shape.heads * head_bytes];
        let mut columns = vec![0i32; d.div_ceil(lanes) * lanes];
        // The centered values with whole groups of 4 keys (the padding keys stay zero), their
        // sums per feature, and one group's 4 keys interleaved per feature.
        let mut vc = vec![0u8; groups * 4 * f];
        let mut sums = vec![0i32; f];
        let mut quads = vec![[0u8; 4]; f];
        let in_place = s2.is_multiple_of(4);
        // The copied rows' padding (the last group's keys) stays zero throughout.
        let mut rows = vec![0u8; if in_place { 0 } else { s1 * groups * 4 }];
        let samples = p
            .chunks_exact(shape.heads * s1 * s2)
            .zip(v.chunks_exact(s2 * f));
        for ((ps, vs), ys) in samples.zip(out.chunks_exact_mut(s1 * f)) {
            center(vs, zv, &mut vc);
            sums.fill(0);
            for key in vc.chunks_exact(f) {
                for (sum, c) in sums.iter_mut().zip(key) {
                    *sum += *c as i8 as i32;
                }
            }
            // Every head's panels at once, one group of keys at a time: per feature, the four
            // keys' codes side by side, then a head's channels copied a panel at a time.
            for (g, four) in vc.chunks_exact(4 * f).enumerate() {
                interleave(four, &mut quads);
                for (head, quads) in packed
                    .chunks_exact_mut(head_bytes)
                    .zip(quads.chunks_exact(d))
                {
                    let panels = head.chunks_exact_mut(panel).zip(quads.chunks(lanes));
                    for (dst, quads) in panels {
                        let (slots, _) = dst[g * lanes * 4..][..lanes * 4].as_chunks_mut::<4>();
                        for (slot, quad) in slots.iter_mut().zip(quads) {
                            *slot = *quad;
                        }
                    }
                }
            }
            for (h, probs) in ps.chunks_exact(s1 * s2).enumerate() {
                for (column, sum) in columns.iter_mut().zip(&sums[h * d..(h + 1) * d]) {
                    *column = -zp * sum;
                }
                let (a, a_stride) = if in_place {
                    (probs, s2)
                } else {
                    let weights = rows
                        .chunks_exact_mut(groups * 4)
                        .zip(probs.chunks_exact(s2));
                    for (row, weights) in weights {
                        row[..s2].copy_from_slice(weights);
                    }
                    (&rows[..], groups * 4)
                };
                let operands = QuadsOperands {
                    a,
                    a_stride,
                    rows: s1,
                    groups,
                    w: &packed[h * head_bytes..(h + 1) * head_bytes],
                    columns: &columns,
                    out: &mut ys[h * d..],
                    out_stride: f,
                    cols: d,
                };
                run(operands);
            }
        }
    }

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
