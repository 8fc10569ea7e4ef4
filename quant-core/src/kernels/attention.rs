//! The core of multi-head self-attention, `softmax(q·kᵀ·scale)·v` for every sequence and head,
//! and its backward pass, with the numbers dfdx 0.13's ops give it (`matmul`, `mul` by the
//! scale, `softmax` over the keys, `matmul`), but in one pass over the batch, parallel over
//! its sequences, where dfdx takes a `gemm` call per sequence and head for each of six
//! products, a permuted copy per tensor and eleven tape entries.
//!
//! Why the bits are dfdx's:
//!
//! - products: `gemm` computes each output as one chain of fused multiply-adds over the depth,
//!   started at zero, and writes it (forward) or adds it to the zeroed gradient (backward)
//!   while the depth fits one block and no call takes a vector path (see [`super::affine`]);
//!   here each output is that chain, in the same order over the depth;
//! - softmax: the row's maximum folded from −∞ with `max`, subtracted, `f32::exp` (the same
//!   libm function dfdx calls), the exponentials summed in order from zero, each divided by
//!   the sum;
//! - its backward pass, dfdx's ops in reverse: the division's (`1/s · g` into the
//!   exponentials' gradient, `(−e / s²) · g` summed in order into the sum's), the sum's (its
//!   gradient added to each exponential's), the exponential's (`e · g`) and the scale's
//!   (`scale · g`), each added to a zeroed gradient as dfdx adds it.
//!
//! Layouts: `q` and `k` are `[sequences, tokens, heads · key_width]`, `v` and the output
//! `[sequences, tokens, heads · value_width]`, row-major; head `h` owns columns
//! `h · width .. (h + 1) · width` (dfdx's reshape to `[.., heads, width]`).

use rayon::prelude::*;

use super::affine::{avx512_build, fma_available, MAX_DEPTH};
use crate::scratch::Scratch;

/// The sizes of one attention core over a batch, where the fused path gives dfdx's bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attention {
    sequences: usize,
    tokens: usize,
    heads: usize,
    key_width: usize,
    value_width: usize,
    /// Whether the passes run their AVX-512 build (`affine::avx512_build`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    avx512: bool,
}

/// What the backward pass needs of the forward pass's softmax: the exponentials, their
/// row sums and the probabilities, `[sequences, heads, tokens, tokens]` (sums one per row).
#[derive(Debug, Clone)]
pub struct SoftmaxSaved {
    exps: Vec<f32>,
    sums: Vec<f32>,
    probs: Vec<f32>,
}

impl Drop for SoftmaxSaved {
    /// The buffers go back to the pool, for the next step's forward pass.
    fn drop(&mut self) {
        for buf in [&mut self.exps, &mut self.sums, &mut self.probs] {
            Scratch::recycle(std::mem::take(buf));
        }
    }
}

impl Attention {
    /// The plan for these sizes, or `None` where dfdx's ops must run: no sequence or head,
    /// a token count or a head width (each a product's depth) outside `3..=512`, or a CPU
    /// without FMA.
    pub fn new(
        sequences: usize,
        tokens: usize,
        heads: usize,
        key_width: usize,
        value_width: usize,
    ) -> Option<Attention> {
        let depth = |d: usize| (3..=MAX_DEPTH).contains(&d);
        let fits =
            sequences > 0 && heads > 0 && depth(tokens) && depth(key_width) && depth(value_width);
        (fits && fma_available()).then_some(Attention {
            sequences,
            tokens,
            heads,
            key_width,
            value_width,
            avx512: avx512_build(),
        })
    }

    fn key_len(&self) -> usize {
        self.tokens * self.heads * self.key_width
    }

    fn value_len(&self) -> usize {
        self.tokens * self.heads * self.value_width
    }

    fn weights_len(&self) -> usize {
        self.heads * self.tokens * self.tokens
    }

    fn lengths_match(&self, q: &[f32], k: &[f32], v: &[f32]) -> bool {
        let n = self.sequences;
        q.len() == n * self.key_len()
            && k.len() == n * self.key_len()
            && v.len() == n * self.value_len()
    }

    /// The attention's output for queries `q`, keys `k` and values `v` (layouts in the
    /// module's doc) with the scores scaled by `scale`, and what the backward pass needs;
    /// `None` if a length does not match.
    pub fn forward(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        scale: f32,
    ) -> Option<(Vec<f32>, SoftmaxSaved)> {
        if !self.lengths_match(q, k, v) {
            return None;
        }
        let n = self.sequences;
        // Written whole below, so from the pool, not zeroed (a zeroed allocation is a pass on
        // one thread before the parallel ones).
        let mut out = Scratch::output(n * self.value_len());
        let mut exps = Scratch::output(n * self.weights_len());
        let mut probs = Scratch::output(n * self.weights_len());
        let mut sums = Scratch::output(n * self.heads * self.tokens);
        out.par_chunks_mut(self.value_len())
            .zip(exps.par_chunks_mut(self.weights_len()))
            .zip(probs.par_chunks_mut(self.weights_len()))
            .zip(sums.par_chunks_mut(self.heads * self.tokens))
            .enumerate()
            .for_each(|(seq, (((out, exps), probs), sums))| {
                let q = &q[seq * self.key_len()..][..self.key_len()];
                let k = &k[seq * self.key_len()..][..self.key_len()];
                let v = &v[seq * self.value_len()..][..self.value_len()];
                let saved = (&mut *exps, &mut *sums, &mut *probs);
                // SAFETY: a plan exists only where `fma_available()`, its `avx512` only where
                // `avx512_build()`; the slices are one sequence's, of the lengths the plan gives.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    forward_sequence_fma(self.avx512, self, (q, k, v), scale, out, saved)
                };
                #[cfg(not(target_arch = "x86_64"))]
                forward_sequence(self, (q, k, v), scale, out, saved);
            });
        Some((out, SoftmaxSaved { exps, sums, probs }))
    }

    /// Adds the gradients of `q`, `k` and `v` for the output's gradient `dy` into `dq`, `dk`
    /// and `dv` (laid out as their tensors), from the forward pass's `saved` softmax and
    /// the same `scale`; `None` (nothing added) if a length does not match.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        saved: &SoftmaxSaved,
        (q, k, v): (&[f32], &[f32], &[f32]),
        scale: f32,
        dy: &[f32],
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) -> Option<()> {
        let n = self.sequences;
        let weights = n * self.weights_len();
        if !self.lengths_match(q, k, v)
            || !self.lengths_match(dq, dk, dv)
            || dy.len() != v.len()
            || saved.exps.len() != weights
            || saved.probs.len() != weights
            || saved.sums.len() != n * self.heads * self.tokens
        {
            return None;
        }
        let (kl, vl, wl) = (self.key_len(), self.value_len(), self.weights_len());
        dq.par_chunks_mut(kl)
            .zip(dk.par_chunks_mut(kl))
            .zip(dv.par_chunks_mut(vl))
            .enumerate()
            .for_each(|(seq, ((dq, dk), dv))| {
                let inputs = (
                    &q[seq * kl..][..kl],
                    &k[seq * kl..][..kl],
                    &v[seq * vl..][..vl],
                );
                let softmax = (
                    &saved.exps[seq * wl..][..wl],
                    &saved.sums[seq * self.heads * self.tokens..][..self.heads * self.tokens],
                    &saved.probs[seq * wl..][..wl],
                );
                let dy = &dy[seq * vl..][..vl];
                // SAFETY: as in `forward`.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    backward_sequence_fma(
                        self.avx512,
                        self,
                        inputs,
                        softmax,
                        scale,
                        dy,
                        (dq, dk, dv),
                    )
                };
                #[cfg(not(target_arch = "x86_64"))]
                backward_sequence(self, inputs, softmax, scale, dy, (dq, dk, dv));
            });
        Some(())
    }
}

/// Columns `offset .. offset + width` of the rows of a row-major matrix `stride` wide.
#[derive(Clone, Copy)]
struct Columns<'a> {
    data: &'a [f32],
    stride: usize,
    offset: usize,
    width: usize,
}

impl<'a> Columns<'a> {
    /// Whether rows `..rows` lie in the data.
    fn holds(&self, rows: usize) -> bool {
        rows == 0 || (rows - 1) * self.stride + self.offset + self.width <= self.data.len()
    }

    fn of(data: &'a [f32], stride: usize, offset: usize, width: usize) -> Self {
        Columns {
            data,
            stride,
            offset,
            width,
        }
    }

    #[inline(always)]
    fn row(&self, r: usize) -> &'a [f32] {
        &self.data[r * self.stride + self.offset..][..self.width]
    }
}

/// A matrix read element by element: `(r, c)` at `offset + r · row_stride + c · col_stride`
/// (a transposed operand is the same data with the strides swapped).
#[derive(Clone, Copy)]
struct Strided<'a> {
    data: &'a [f32],
    offset: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Strided<'a> {
    fn of(data: &'a [f32], offset: usize, (row_stride, col_stride): (usize, usize)) -> Self {
        Strided {
            data,
            offset,
            row_stride,
            col_stride,
        }
    }

    #[inline(always)]
    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[self.offset + r * self.row_stride + c * self.col_stride]
    }

    /// Whether rows `..rows` and columns `..cols` lie in the data.
    fn holds(&self, rows: usize, cols: usize) -> bool {
        rows == 0
            || cols == 0
            || self.offset + (rows - 1) * self.row_stride + (cols - 1) * self.col_stride
                < self.data.len()
    }
}

/// How a product's outputs reach the destination.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    /// Written (a forward product).
    Write,
    /// Added to what is there (a gradient).
    Add,
}

/// Columns of rows of a destination matrix (as [`Columns`]).
struct ColumnsMut<'a> {
    data: &'a mut [f32],
    stride: usize,
    offset: usize,
}

impl<'a> ColumnsMut<'a> {
    fn of(data: &'a mut [f32], stride: usize, offset: usize) -> Self {
        ColumnsMut {
            data,
            stride,
            offset,
        }
    }
}

/// Rows of outputs computed side by side: independent chains for the FMA units.
const BLOCK_ROWS: usize = 8;
/// Outputs of a row in one vector.
const LANES: usize = 8;

/// `out(i, c) = Σ_t a(i, t) · b(t, c)` for `i < m`, `c < b.width`, each output one chain of
/// fused multiply-adds over `t < depth` in order from zero (`gemm`'s chain), then written or
/// added (`store`). `a` is read element by element, `b` row by row.
#[inline(always)]
fn product((m, depth): (usize, usize), a: Strided, b: Columns, out: &mut ColumnsMut, store: Store) {
    let mut i = 0;
    while i + BLOCK_ROWS <= m {
        product_rows::<BLOCK_ROWS>(i, depth, a, b, out, store);
        i += BLOCK_ROWS;
    }
    while i < m {
        product_rows::<1>(i, depth, a, b, out, store);
        i += 1;
    }
}

/// [`product`]'s rows `first .. first + R`.
#[inline(always)]
fn product_rows<const R: usize>(
    first: usize,
    depth: usize,
    a: Strided,
    b: Columns,
    out: &mut ColumnsMut,
    store: Store,
) {
    let n = b.width;
    let put = |out: &mut ColumnsMut, r: usize, c: usize, v: f32| {
        let o = &mut out.data[(first + r) * out.stride + out.offset + c];
        match store {
            Store::Write => *o = v,
            Store::Add => *o += v,
        }
    };
    let mut c = 0;
    while c < n {
        let width = (n - c).min(LANES);
        let acc = lanes::<R>(first, depth, a, b, (c, width));
        for (r, acc) in acc.iter().enumerate() {
            for (l, v) in acc[..width].iter().enumerate() {
                put(out, r, c + l, *v);
            }
        }
        c += width;
    }
}

/// The chains of rows `first .. first + R`, columns `c .. c + width` (`width <= LANES`) of
/// [`product`]: one vector per row (AVX; the lanes past `width` masked off), all `R` side by
/// side.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn lanes<const R: usize>(
    first: usize,
    depth: usize,
    a: Strided,
    b: Columns,
    (c, width): (usize, usize),
) -> [[f32; LANES]; R] {
    use std::arch::x86_64::*;
    if !(a.holds(first + R, depth) && b.holds(depth) && width <= LANES && c + width <= b.width) {
        // Never taken (the passes' operands hold their products); the checked loop's bits
        // are the same.
        return lanes_checked::<R>(first, depth, a, b, (c, width));
    }
    let mut out = [[0.0f32; LANES]; R];
    let mut lanes_on = [0i32; LANES];
    for on in &mut lanes_on[..width] {
        *on = -1;
    }
    // SAFETY: only inlined into the `target_feature(enable = "avx,fma")` passes, which run
    // where a plan exists (`fma_available()`); `a` holds rows `..first + R` and columns
    // `..depth`, `b` rows `..depth` with `width` values from column `c` (checked above), and
    // the masked load reads only those.
    unsafe {
        let mask = _mm256_loadu_si256(lanes_on.as_ptr().cast());
        let ap = a.data.as_ptr().add(a.offset);
        let bp = b.data.as_ptr().add(b.offset + c);
        let mut acc = [_mm256_setzero_ps(); R];
        for t in 0..depth {
            let y = _mm256_maskload_ps(bp.add(t * b.stride), mask);
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = *ap.add((first + r) * a.row_stride + t * a.col_stride);
                *acc = _mm256_fmadd_ps(_mm256_set1_ps(x), y, *acc);
            }
        }
        for (o, acc) in out.iter_mut().zip(&acc) {
            _mm256_storeu_ps(o.as_mut_ptr(), *acc);
        }
    }
    out
}

/// [`lanes`] without vectors, every index checked (off x86-64, where no plan exists, the
/// only one).
#[inline(always)]
fn lanes_checked<const R: usize>(
    first: usize,
    depth: usize,
    a: Strided,
    b: Columns,
    (c, width): (usize, usize),
) -> [[f32; LANES]; R] {
    let mut acc = [[0.0f32; LANES]; R];
    for t in 0..depth {
        let row = &b.row(t)[c..c + width];
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = a.at(first + r, t);
            for (acc, y) in acc.iter_mut().zip(row) {
                *acc = x.mul_add(*y, *acc);
            }
        }
    }
    acc
}

#[cfg(not(target_arch = "x86_64"))]
use lanes_checked as lanes;

/// The columns `from .. from + width` of a matrix `stride` wide, transposed into `dst`
/// (`[width, rows]`).
fn transpose_into(dst: &mut [f32], m: Columns) {
    let rows = dst.len() / m.width.max(1);
    for j in 0..rows {
        for (c, x) in m.row(j).iter().enumerate() {
            dst[c * rows + j] = *x;
        }
    }
}

type Saved<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32]);

/// One sequence's forward pass, every head (see the module's doc for the numbers).
#[inline(always)]
fn forward_sequence(
    plan: &Attention,
    (q, k, v): (&[f32], &[f32], &[f32]),
    scale: f32,
    out: &mut [f32],
    (exps, sums, probs): Saved,
) {
    let (s, dk, dv) = (plan.tokens, plan.key_width, plan.value_width);
    let (kw, vw) = (plan.heads * dk, plan.heads * dv);
    // The head's keys transposed, `[key_width, tokens]`: a row of scores is then a sum of
    // contiguous rows.
    let mut keys_t = vec![0.0f32; dk * s];
    let mut out = ColumnsMut::of(out, vw, 0);
    for h in 0..plan.heads {
        transpose_into(&mut keys_t, Columns::of(k, kw, h * dk, dk));
        let scores = &mut exps[h * s * s..][..s * s];
        product(
            (s, dk),
            Strided::of(q, h * dk, (kw, 1)),
            Columns::of(&keys_t, s, 0, s),
            &mut ColumnsMut::of(scores, s, 0),
            Store::Write,
        );
        for i in 0..s {
            let e = &mut scores[i * s..][..s];
            for w in e.iter_mut() {
                *w *= scale;
            }
            let max = e.iter().fold(f32::NEG_INFINITY, |m, w| m.max(*w));
            let mut sum = 0.0f32;
            for w in e.iter_mut() {
                *w = (*w - max).exp();
                sum += *w;
            }
            sums[h * s + i] = sum;
            for (p, e) in probs[(h * s + i) * s..][..s].iter_mut().zip(e.iter()) {
                *p = *e / sum;
            }
        }
        let p = &probs[h * s * s..][..s * s];
        out.offset = h * dv;
        product(
            (s, s),
            Strided::of(p, 0, (s, 1)),
            Columns::of(v, vw, h * dv, dv),
            &mut out,
            Store::Write,
        );
    }
}

type Grads<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32]);

/// One sequence's backward pass, every head (see the module's doc for the numbers).
#[inline(always)]
fn backward_sequence(
    plan: &Attention,
    (q, k, v): (&[f32], &[f32], &[f32]),
    (exps, sums, probs): (&[f32], &[f32], &[f32]),
    scale: f32,
    dy: &[f32],
    (dq, dk, dv): Grads,
) {
    let (s, kd, vd) = (plan.tokens, plan.key_width, plan.value_width);
    let (kw, vw) = (plan.heads * kd, plan.heads * vd);
    let mut values_t = vec![0.0f32; vd * s];
    // The probabilities' gradient, then in place the scores', `[tokens, tokens]`.
    let mut d_scores = vec![0.0f32; s * s];
    let mut sum_terms = vec![0.0f32; s];
    for h in 0..plan.heads {
        transpose_into(&mut values_t, Columns::of(v, vw, h * vd, vd));
        product(
            (s, vd),
            Strided::of(dy, h * vd, (vw, 1)),
            Columns::of(&values_t, s, 0, s),
            &mut ColumnsMut::of(&mut d_scores, s, 0),
            Store::Write,
        );
        for i in 0..s {
            let row = (h * s + i) * s;
            let (e, sum) = (&exps[row..][..s], sums[h * s + i]);
            let (recip, square) = (sum.recip(), sum.powi(2));
            let d_row = &mut d_scores[i * s..][..s];
            for ((d, e), term) in d_row.iter_mut().zip(e).zip(sum_terms.iter_mut()) {
                // The product added to a zeroed gradient, then the division's backward pass
                // (the sum's terms apart, so that this loop is vectorised).
                let g = 0.0 + *d;
                *d = 0.0 + recip * g;
                *term = (-*e / square) * g;
            }
            let d_sum = sum_terms.iter().fold(0.0f32, |acc, t| acc + *t);
            for (d, e) in d_row.iter_mut().zip(e) {
                let d_exp = *d + d_sum;
                let d_weight = 0.0 + *e * d_exp;
                *d = 0.0 + scale * d_weight;
            }
        }
        let p = &probs[h * s * s..][..s * s];
        product(
            (s, s),
            Strided::of(p, 0, (1, s)),
            Columns::of(dy, vw, h * vd, vd),
            &mut ColumnsMut::of(dv, vw, h * vd),
            Store::Add,
        );
        let d = &d_scores;
        product(
            (s, s),
            Strided::of(d, 0, (s, 1)),
            Columns::of(k, kw, h * kd, kd),
            &mut ColumnsMut::of(dq, kw, h * kd),
            Store::Add,
        );
        product(
            (s, s),
            Strided::of(d, 0, (1, s)),
            Columns::of(q, kw, h * kd, kd),
            &mut ColumnsMut::of(dk, kw, h * kd),
            Store::Add,
        );
    }
}

/// The two matrix products of multi-head attention apart, `scores = q·kᵀ·scale` and
/// `context = probs·v` per sequence and head, each with its backward pass, for a model that
/// puts ops of its own between them (the quantized attention: quantizers on `q`, `k`, `v`
/// and the softmax's output, an integer softmax). The numbers are those of dfdx's ops on the
/// permuted heads (`matmul`, `mul` by the scale; `matmul`, permute, reshape), computed as
/// [`Attention`] computes them, without the permuted copies and per-head products.
///
/// A plan is for one head width `width`: the queries' and keys' for the scores, the values'
/// for the context. Layouts: `q` is `[sequences, queries, heads · width]`, `k` and `v`
/// `[sequences, keys, heads · width]`, the context `[sequences, queries, heads · width]` (as
/// in [`Attention`]); the scores and probabilities `[sequences, heads, queries, keys]`, as
/// dfdx's permuted product gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionProducts {
    sequences: usize,
    queries: usize,
    keys: usize,
    heads: usize,
    width: usize,
    /// Whether the passes run their AVX-512 build (`affine::avx512_build`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    avx512: bool,
}

impl AttentionProducts {
    /// The plan for these sizes (`width` one head's), or `None` where dfdx's ops must run:
    /// no sequence or head, a query or key count or the head width (each some product's
    /// depth) outside `3..=512`, or a CPU without FMA.
    pub fn new(
        sequences: usize,
        (queries, keys): (usize, usize),
        heads: usize,
        width: usize,
    ) -> Option<AttentionProducts> {
        let depth = |d: usize| (3..=MAX_DEPTH).contains(&d);
        let fits = sequences > 0 && heads > 0 && depth(queries) && depth(keys) && depth(width);
        (fits && fma_available()).then_some(AttentionProducts {
            sequences,
            queries,
            keys,
            heads,
            width,
            avx512: avx512_build(),
        })
    }

    /// One sequence's lengths: queries, keys, values, scores (and probabilities), context.
    fn lengths(&self) -> [usize; 5] {
        let row = self.heads * self.width;
        [
            self.queries * row,
            self.keys * row,
            self.keys * row,
            self.heads * self.queries * self.keys,
            self.queries * row,
        ]
    }

    /// Whether each slice holds `sequences` times its one-sequence length.
    fn hold(&self, slices: &[(&[f32], usize)]) -> bool {
        let lengths = self.lengths();
        slices
            .iter()
            .all(|(s, which)| s.len() == self.sequences * lengths[*which])
    }

    /// `q·kᵀ·scale` per sequence and head, `[sequences, heads, queries, keys]`; `None` if a
    /// length does not match.
    pub fn scores(&self, q: &[f32], k: &[f32], scale: f32) -> Option<Vec<f32>> {
        if !self.hold(&[(q, QUERIES), (k, KEYS)]) {
            return None;
        }
        let [ql, kl, _, sl, _] = self.lengths();
        // Written whole (each sequence's products), so not zeroed first.
        let mut scores = Scratch::output(self.sequences * sl);
        scores
            .par_chunks_mut(sl)
            .enumerate()
            .for_each(|(seq, scores)| {
                let (q, k) = (&q[seq * ql..][..ql], &k[seq * kl..][..kl]);
                // SAFETY: a plan exists only where `fma_available()`, its `avx512` only where
                // `avx512_build()`; the slices are one sequence's, of the plan's lengths.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    scores_sequence_fma(self.avx512, self, q, k, scale, scores)
                };
                #[cfg(not(target_arch = "x86_64"))]
                scores_sequence(self, q, k, scale, scores);
            });
        Some(scores)
    }

    /// Adds the queries' gradient for the scores' gradient `d_scores` (from the same `scale`)
    /// into `dq`; `None` (nothing added) if a length does not match.
    pub fn scores_backward_queries(
        &self,
        k: &[f32],
        scale: f32,
        d_scores: &[f32],
        dq: &mut [f32],
    ) -> Option<()> {
        self.scores_backward(true, k, scale, d_scores, dq)
    }

    /// Adds the keys' gradient for the scores' gradient `d_scores` (from the same `scale`)
    /// into `dk`; `None` (nothing added) if a length does not match.
    pub fn scores_backward_keys(
        &self,
        q: &[f32],
        scale: f32,
        d_scores: &[f32],
        dk: &mut [f32],
    ) -> Option<()> {
        self.scores_backward(false, q, scale, d_scores, dk)
    }

    /// [`Self::scores_backward_queries`] (`queries`: `other` the keys) or
    /// [`Self::scores_backward_keys`] (`other` the queries).
    fn scores_backward(
        &self,
        queries: bool,
        other: &[f32],
        scale: f32,
        d_scores: &[f32],
        grad: &mut [f32],
    ) -> Option<()> {
        let (which, which_other) = match queries {
            true => (QUERIES, KEYS),
            false => (KEYS, QUERIES),
        };
        if !self.hold(&[(other, which_other), (d_scores, SCORES), (grad, which)]) {
            return None;
        }
        let lengths = self.lengths();
        let (ol, gl, sl) = (lengths[which_other], lengths[which], lengths[SCORES]);
        grad.par_chunks_mut(gl).enumerate().for_each(|(seq, grad)| {
            let other = &other[seq * ol..][..ol];
            let d_scores = &d_scores[seq * sl..][..sl];
            // SAFETY: as in `scores`.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                scores_backward_sequence_fma(
                    self.avx512,
                    self,
                    other,
                    queries,
                    scale,
                    d_scores,
                    grad,
                )
            };
            #[cfg(not(target_arch = "x86_64"))]
            scores_backward_sequence(self, other, queries, scale, d_scores, grad);
        });
        Some(())
    }

    /// `probs·v` per sequence and head, heads side by side,
    /// `[sequences, queries, heads · width]`; `None` if a length does not match.
    pub fn context(&self, probs: &[f32], v: &[f32]) -> Option<Vec<f32>> {
        if !self.hold(&[(probs, SCORES), (v, VALUES)]) {
            return None;
        }
        let [_, _, vl, sl, cl] = self.lengths();
        // Written whole, as in `scores`.
        let mut context = Scratch::output(self.sequences * cl);
        context
            .par_chunks_mut(cl)
            .enumerate()
            .for_each(|(seq, context)| {
                let (p, v) = (&probs[seq * sl..][..sl], &v[seq * vl..][..vl]);
                // SAFETY: as in `scores`.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    context_sequence_fma(self.avx512, self, p, v, context)
                };
                #[cfg(not(target_arch = "x86_64"))]
                context_sequence(self, p, v, context);
            });
        Some(context)
    }

    /// Adds the probabilities' gradient for the context's gradient `dy` into `d_probs`;
    /// `None` (nothing added) if a length does not match.
    pub fn context_backward_probs(&self, v: &[f32], dy: &[f32], d_probs: &mut [f32]) -> Option<()> {
        if !self.hold(&[(v, VALUES), (dy, CONTEXT), (d_probs, SCORES)]) {
            return None;
        }
        let [_, _, vl, sl, cl] = self.lengths();
        d_probs
            .par_chunks_mut(sl)
            .enumerate()
            .for_each(|(seq, d_probs)| {
                let (v, dy) = (&v[seq * vl..][..vl], &dy[seq * cl..][..cl]);
                // SAFETY: as in `scores`.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    context_probs_backward_sequence_fma(self.avx512, self, v, dy, d_probs)
                };
                #[cfg(not(target_arch = "x86_64"))]
                context_probs_backward_sequence(self, v, dy, d_probs);
            });
        Some(())
    }

    /// Adds the values' gradient for the context's gradient `dy` into `dv`; `None` (nothing
    /// added) if a length does not match.
    pub fn context_backward_values(&self, probs: &[f32], dy: &[f32], dv: &mut [f32]) -> Option<()> {
        if !self.hold(&[(probs, SCORES), (dy, CONTEXT), (dv, VALUES)]) {
            return None;
        }
        let [_, _, vl, sl, cl] = self.lengths();
        dv.par_chunks_mut(vl).enumerate().for_each(|(seq, dv)| {
            let (p, dy) = (&probs[seq * sl..][..sl], &dy[seq * cl..][..cl]);
            // SAFETY: as in `scores`.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                context_values_backward_sequence_fma(self.avx512, self, p, dy, dv)
            };
            #[cfg(not(target_arch = "x86_64"))]
            context_values_backward_sequence(self, p, dy, dv);
        });
        Some(())
    }
}

/// Indices into [`AttentionProducts::lengths`].
const QUERIES: usize = 0;
const KEYS: usize = 1;
const VALUES: usize = 2;
const SCORES: usize = 3;
const CONTEXT: usize = 4;

/// One sequence's scores, every head: dfdx's product (one chain per score), then the scale.
#[inline(always)]
fn scores_sequence(plan: &AttentionProducts, q: &[f32], k: &[f32], scale: f32, out: &mut [f32]) {
    let (m, n, kd) = (plan.queries, plan.keys, plan.width);
    let kw = plan.heads * kd;
    let mut keys_t = vec![0.0f32; kd * n];
    for h in 0..plan.heads {
        transpose_into(&mut keys_t, Columns::of(k, kw, h * kd, kd));
        let scores = &mut out[h * m * n..][..m * n];
        product(
            (m, kd),
            Strided::of(q, h * kd, (kw, 1)),
            Columns::of(&keys_t, n, 0, n),
            &mut ColumnsMut::of(scores, n, 0),
            Store::Write,
        );
        for w in scores.iter_mut() {
            *w *= scale;
        }
    }
}

/// One sequence's gradient of the queries (`queries`: `other` the keys, `d·k` into `grad`)
/// or of the keys (`other` the queries, `dᵀ·q`), `d` the scale's backward pass (`scale · g`
/// added to a zeroed gradient).
#[inline(always)]
fn scores_backward_sequence(
    plan: &AttentionProducts,
    other: &[f32],
    queries: bool,
    scale: f32,
    d_scores: &[f32],
    grad: &mut [f32],
) {
    let (m, n, kd) = (plan.queries, plan.keys, plan.width);
    let kw = plan.heads * kd;
    let mut d = vec![0.0f32; m * n];
    for h in 0..plan.heads {
        for (d, g) in d.iter_mut().zip(&d_scores[h * m * n..][..m * n]) {
            *d = 0.0 + scale * *g;
        }
        let (rows, depth, d) = match queries {
            true => (m, n, Strided::of(&d, 0, (n, 1))),
            false => (n, m, Strided::of(&d, 0, (1, n))),
        };
        product(
            (rows, depth),
            d,
            Columns::of(other, kw, h * kd, kd),
            &mut ColumnsMut::of(grad, kw, h * kd),
            Store::Add,
        );
    }
}

/// One sequence's context, every head written to its columns.
#[inline(always)]
fn context_sequence(plan: &AttentionProducts, probs: &[f32], v: &[f32], out: &mut [f32]) {
    let (m, n, vd) = (plan.queries, plan.keys, plan.width);
    let vw = plan.heads * vd;
    let mut out = ColumnsMut::of(out, vw, 0);
    for h in 0..plan.heads {
        out.offset = h * vd;
        product(
            (m, n),
            Strided::of(&probs[h * m * n..][..m * n], 0, (n, 1)),
            Columns::of(v, vw, h * vd, vd),
            &mut out,
            Store::Write,
        );
    }
}

/// One sequence's probabilities' gradient, `dy·vᵀ` per head.
#[inline(always)]
fn context_probs_backward_sequence(
    plan: &AttentionProducts,
    v: &[f32],
    dy: &[f32],
    d_probs: &mut [f32],
) {
    let (m, n, vd) = (plan.queries, plan.keys, plan.width);
    let vw = plan.heads * vd;
    let mut values_t = vec![0.0f32; vd * n];
    for h in 0..plan.heads {
        transpose_into(&mut values_t, Columns::of(v, vw, h * vd, vd));
        product(
            (m, vd),
            Strided::of(dy, h * vd, (vw, 1)),
            Columns::of(&values_t, n, 0, n),
            &mut ColumnsMut::of(&mut d_probs[h * m * n..][..m * n], n, 0),
            Store::Add,
        );
    }
}

/// One sequence's values' gradient, `probsᵀ·dy` per head.
#[inline(always)]
fn context_values_backward_sequence(
    plan: &AttentionProducts,
    probs: &[f32],
    dy: &[f32],
    dv: &mut [f32],
) {
    let (m, n, vd) = (plan.queries, plan.keys, plan.width);
    let vw = plan.heads * vd;
    for h in 0..plan.heads {
        product(
            (n, m),
            Strided::of(&probs[h * m * n..][..m * n], 0, (1, n)),
            Columns::of(dy, vw, h * vd, vd),
            &mut ColumnsMut::of(dv, vw, h * vd),
            Store::Add,
        );
    }
}

/// The passes compiled twice, with AVX and FMA (`mul_add` one instruction, vectorised), and
/// with AVX-512 F and VL as well (see `affine::avx512_build`: the same bits; the loops the
/// compiler vectorises itself, such as the softmax's, take 16 lanes); `pass_fma(avx512, ..)`
/// runs the build a plan chose.
///
/// # Safety
/// The CPU has AVX and FMA, and AVX-512 F and VL where `avx512` (a plan's choice).
#[cfg(target_arch = "x86_64")]
mod fma_passes {
    use super::*;

    macro_rules! builds {
        ($($pass:ident => $name:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {
            mod avx2 {
                use super::*;
                $(
                    #[target_feature(enable = "avx,fma")]
                    pub(super) unsafe fn $name($($arg: $ty),*) {
                        $pass($($arg),*)
                    }
                )*
            }
            mod avx512 {
                use super::*;
                $(
                    #[target_feature(enable = "avx,fma,avx512f,avx512vl")]
                    pub(super) unsafe fn $name($($arg: $ty),*) {
                        $pass($($arg),*)
                    }
                )*
            }
            $(
                pub(in super::super) unsafe fn $name(avx512: bool, $($arg: $ty),*) {
                    // SAFETY: the caller's.
                    unsafe {
                        match avx512 {
                            true => avx512::$name($($arg),*),
                            false => avx2::$name($($arg),*),
                        }
                    }
                }
            )*
        };
    }

    builds! {
        forward_sequence => forward_sequence_fma(
            plan: &Attention,
            inputs: (&[f32], &[f32], &[f32]),
            scale: f32,
            out: &mut [f32],
            saved: Saved,
        );
        backward_sequence => backward_sequence_fma(
            plan: &Attention,
            inputs: (&[f32], &[f32], &[f32]),
            softmax: (&[f32], &[f32], &[f32]),
            scale: f32,
            dy: &[f32],
            grads: Grads,
        );
        scores_sequence => scores_sequence_fma(
            plan: &AttentionProducts,
            q: &[f32],
            k: &[f32],
            scale: f32,
            out: &mut [f32],
        );
        scores_backward_sequence => scores_backward_sequence_fma(
            plan: &AttentionProducts,
            other: &[f32],
            queries: bool,
            scale: f32,
            d_scores: &[f32],
            grad: &mut [f32],
        );
        context_sequence => context_sequence_fma(
            plan: &AttentionProducts,
            probs: &[f32],
            v: &[f32],
            out: &mut [f32],
        );
        context_probs_backward_sequence => context_probs_backward_sequence_fma(
            plan: &AttentionProducts,
            v: &[f32],
            dy: &[f32],
            d_probs: &mut [f32],
        );
        context_values_backward_sequence => context_values_backward_sequence_fma(
            plan: &AttentionProducts,
            probs: &[f32],
            dy: &[f32],
            dv: &mut [f32],
        );
    }
}

#[cfg(target_arch = "x86_64")]
use fma_passes::*;
