//! The three matrix products of a fully connected layer, `y = x · Wᵀ + b` and its two
//! gradients, with the numbers dfdx 0.13's `Linear` gets from `gemm` but one product for a
//! whole batch of sequences where dfdx takes one per sequence.
//!
//! `gemm` computes each output of a product as one chain of fused multiply-adds over the
//! depth, started at zero, and adds it to the destination (or writes it). The rows one call
//! covers do not change that chain while the depth fits one of its blocks (512) and no call
//! falls to its vector paths (a depth of 2 or less, one row or one column): [`Affine::new`]
//! says where that holds. There:
//!
//! - [`Affine::forward`]: one `gemm` call over all rows into a buffer that holds the bias,
//!   the chain plus the bias rounded once, as dfdx's product then broadcast add round it;
//! - [`Affine::input_gradient`]: one call over all rows, added into the gradient;
//! - [`Affine::weight_gradient`]: dfdx's order, a chain over the rows of each sequence added
//!   into the gradient sequence by sequence, computed by a loop of our own (`gemm` packs its
//!   operands again for each call, most of its time at these sizes), parallel over the
//!   weights' rows, so the result does not depend on the thread count; for a single
//!   sequence (a batch of vectors), dfdx's own `gemm` call.
//!
//! Where the CPU has AVX-512, all three run a 16-lane loop of ours instead (eight rows by
//! three vectors of outputs at a time) with the same chains, so the same bits: `gemm` 0.15
//! multiplies in 8-lane vectors on stable Rust.
//!
//! Every path needs FMA (`gemm`'s multiply-adds are fused only there); elsewhere
//! [`Affine::new`] answers `None` and the caller takes dfdx's ops.

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::driver::VectorPath;
use super::passes;
use crate::scratch::Scratch;

/// The largest depth `gemm` takes in one block; up to it, each output is one chain.
pub(crate) const MAX_DEPTH: usize = 512;

/// How many of the weights' rows one task of [`Affine::weight_gradient`] takes.
const ROWS_PER_TASK: usize = 4;

/// The sizes of one fully connected layer's products over a batch of `sequences` matrices
/// of `rows` rows (a batch of vectors is one sequence of `batch` rows), where the one-product
/// path gives dfdx's bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Affine {
    sequences: usize,
    rows: usize,
    inputs: usize,
    outputs: usize,
    /// Whether the products take their AVX-512 paths ([`avx512_build`]).
    avx512: bool,
}

impl Affine {
    /// The plan for these sizes, or `None` where dfdx's per-sequence products must run:
    /// a depth (`inputs` forward, `outputs` for the input's gradient, `rows` for the weights'
    /// when `backward`) outside `3..=512`, fewer than two rows, no sequence, or a CPU without
    /// FMA.
    pub fn new(
        sequences: usize,
        rows: usize,
        inputs: usize,
        outputs: usize,
        backward: bool,
    ) -> Option<Affine> {
        let depth = |d: usize| (3..=MAX_DEPTH).contains(&d);
        let fits = sequences > 0
            && rows >= 2
            && depth(inputs)
            && depth(outputs)
            && (!backward || depth(rows));
        (fits && fma_available()).then_some(Affine {
            sequences,
            rows,
            inputs,
            outputs,
            avx512: avx512_build(),
        })
    }

    /// All rows of the batch.
    pub fn total_rows(&self) -> usize {
        self.sequences * self.rows
    }

    /// `x · Wᵀ + b` for `x` of `total_rows() × inputs` and `w` of `outputs × inputs`, both
    /// row-major; `None` if a length does not match.
    pub fn forward(&self, x: &[f32], w: &[f32], bias: &[f32]) -> Option<Vec<f32>> {
        let rows = self.total_rows();
        let (inputs, outputs) = (self.inputs, self.outputs);
        if x.len() != rows * inputs || w.len() != outputs * inputs || bias.len() != outputs {
            return None;
        }
        // The bias in every row, written on every thread (from the pool: not zeroed first).
        let mut y = Scratch::output(rows * outputs);
        passes::fill_rows(&mut y, bias);
        if self.avx512 {
            // Wᵀ, `inputs × outputs`: the 16-lane loop reads rows of the right operand.
            let mut w_t = Scratch::with_len(inputs * outputs);
            passes::transpose(w, &mut w_t, (outputs, inputs));
            add_products_avx512(&mut y, x, &w_t, (inputs, outputs), false);
            return Some(y);
        }
        // SAFETY: `x` holds `rows` rows of `inputs`, `w` `outputs` rows of `inputs` (read as
        // the `inputs × outputs` matrix Wᵀ: row stride 1, column stride `inputs`), `y` `rows`
        // rows of `outputs`: every address the strides reach is inside them.
        unsafe {
            add_product(
                (rows, outputs, inputs),
                (y.as_mut_ptr(), [outputs, 1]),
                (x.as_ptr(), [inputs, 1]),
                (w.as_ptr(), [1, inputs]),
            );
        }
        Some(y)
    }

    /// `dx += dy · W` for `dy` of `total_rows() × outputs`, `w` of `outputs × inputs`, `dx`
    /// of `total_rows() × inputs`; `None` (nothing added) if a length does not match.
    pub fn input_gradient(&self, dx: &mut [f32], dy: &[f32], w: &[f32]) -> Option<()> {
        self.input_gradient_into(dx, dy, w, false)
    }

    /// [`input_gradient`](Self::input_gradient) into storage whose values before do not matter
    /// (a pooled buffer): `dx` ends as `input_gradient` leaves a zeroed buffer, each task
    /// zeroing its own rows just before adding into them.
    pub fn input_gradient_fresh(&self, dx: &mut [f32], dy: &[f32], w: &[f32]) -> Option<()> {
        self.input_gradient_into(dx, dy, w, true)
    }

    /// The input's gradient, added into `dx`, or (`fresh`) into zeros.
    fn input_gradient_into(
        &self,
        dx: &mut [f32],
        dy: &[f32],
        w: &[f32],
        fresh: bool,
    ) -> Option<()> {
        let rows = self.total_rows();
        let (inputs, outputs) = (self.inputs, self.outputs);
        if dx.len() != rows * inputs || dy.len() != rows * outputs || w.len() != outputs * inputs {
            return None;
        }
        if self.avx512 {
            add_products_avx512(dx, dy, w, (outputs, inputs), fresh);
            return Some(());
        }
        if fresh {
            dx.fill(0.0);
        }
        // SAFETY: lengths checked above; row-major strides within each buffer.
        unsafe {
            add_product(
                (rows, inputs, outputs),
                (dx.as_mut_ptr(), [inputs, 1]),
                (dy.as_ptr(), [outputs, 1]),
                (w.as_ptr(), [inputs, 1]),
            );
        }
        Some(())
    }

    /// `dw[o][i] += Σ_r x[s][r][i] · dy[s][r][o]` for each sequence `s` in turn, each sum a
    /// chain of fused multiply-adds over its rows `r` from zero; `None` (nothing added) if a
    /// length does not match.
    pub fn weight_gradient(&self, dw: &mut [f32], x: &[f32], dy: &[f32]) -> Option<()> {
        self.weight_gradient_into(dw, x, dy, false)
    }

    /// [`weight_gradient`](Self::weight_gradient) into storage whose values before do not
    /// matter (a pooled buffer): `dw` ends as `weight_gradient` leaves a zeroed buffer. Each
    /// task zeroes its own rows just before adding into them, so the buffer needs no zeroing
    /// pass of its own.
    pub fn weight_gradient_fresh(&self, dw: &mut [f32], x: &[f32], dy: &[f32]) -> Option<()> {
        self.weight_gradient_into(dw, x, dy, true)
    }

    /// The weights' gradient, added into `dw`, or (`fresh`) into zeros.
    fn weight_gradient_into(
        &self,
        dw: &mut [f32],
        x: &[f32],
        dy: &[f32],
        fresh: bool,
    ) -> Option<()> {
        let (inputs, outputs, rows) = (self.inputs, self.outputs, self.rows);
        let total = self.total_rows();
        if dw.len() != outputs * inputs || x.len() != total * inputs || dy.len() != total * outputs
        {
            return None;
        }
        if self.sequences == 1 && !self.avx512 {
            if fresh {
                dw.fill(0.0);
            }
            // dfdx's own call for a batch of vectors (one product, depth `rows`): `gemm`'s
            // kernels are faster than the loop below on one long chain.
            // SAFETY: lengths checked above; `dw` is read as the `inputs × outputs` matrix
            // (row stride 1, column stride `inputs`), `x` as its transpose.
            unsafe {
                add_product(
                    (inputs, outputs, rows),
                    (dw.as_mut_ptr(), [1, inputs]),
                    (x.as_ptr(), [1, inputs]),
                    (dy.as_ptr(), [outputs, 1]),
                );
            }
            return Some(());
        }
        let per_task = match self.avx512 {
            true => rows_per_task(outputs, BLOCK_ROWS),
            false => rows_per_task(outputs, ROWS_PER_TASK),
        };
        dw.par_chunks_mut(per_task * inputs)
            .enumerate()
            .for_each(|(task, dw_rows)| {
                let first = task * per_task;
                for s in 0..self.sequences {
                    let x_seq = &x[s * rows * inputs..][..rows * inputs];
                    let dy_seq = &dy[s * rows * outputs..][..rows * outputs];
                    add_rows(
                        dw_rows,
                        x_seq,
                        dy_seq,
                        first,
                        (inputs, outputs),
                        (self.avx512, fresh && s == 0),
                    );
                }
            });
        Some(())
    }
}

/// `dst += lhs · rhs` for an `m × k` and a `k × n` matrix, each given by its pointer and its
/// `[row, column]` strides, through `gemm` as dfdx calls it (the destination read, `α = β =
/// 1`, rayon's threads).
///
/// # Safety
/// Every address the strides reach inside the `m × n`, `m × k` and `k × n` matrices lies in
/// its buffer; `dst` overlaps neither input.
unsafe fn add_product(
    (m, n, k): (usize, usize, usize),
    (dst, [dst_rs, dst_cs]): (*mut f32, [usize; 2]),
    (lhs, [lhs_rs, lhs_cs]): (*const f32, [usize; 2]),
    (rhs, [rhs_rs, rhs_cs]): (*const f32, [usize; 2]),
) {
    // SAFETY: the caller's.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_cs as isize,
            dst_rs as isize,
            true,
            lhs,
            lhs_cs as isize,
            lhs_rs as isize,
            rhs,
            rhs_cs as isize,
            rhs_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(rayon::current_num_threads()),
        );
    }
}

/// Whether the products here take their AVX-512 path, [`add_products_avx512`] for all three
/// (`gemm`'s AVX-512 kernels need a nightly compiler), and the FMA loops of
/// [`super::attention`] their AVX-512 builds: the same source compiled with AVX-512 F and VL
/// enabled as well, 16 lanes for the loops the compiler vectorises itself and 32 registers.
/// Each output is the same chain of fused multiply-adds on every path, so the bits are the
/// same. Chosen when a plan is made: where the CPU has AVX-512 F and VL and
/// [`VectorPath::widest`] allows [`VectorPath::Avx512`] (`limit_kernel_paths`,
/// `Isa::limit_to`).
pub(crate) fn avx512_build() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        VectorPath::widest() == VectorPath::Avx512 && std::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether `gemm` multiplies with fused multiply-adds here (what every path above matches).
/// Not public API (quant-core's tests).
#[doc(hidden)]
pub fn fma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Rows of outputs one block of [`add_products_avx512`] computes side by side.
const BLOCK_ROWS: usize = 8;

/// Vectors of 16 outputs a row that one block of [`add_products_avx512`] computes: with
/// [`BLOCK_ROWS`], 24 accumulators, the right operand's 3 vectors and a broadcast, of the 32
/// registers.
const BLOCK_VECTORS: usize = 3;

/// `out[r][c] += Σ_t a[r][t] · b[t][c]` for `out` of `rows × width`, `a` of `rows × depth`
/// and `b` of `depth × width` (`(depth, width)`), all row-major: each output one chain of
/// fused multiply-adds over `t` in order from zero, added to `out` once, as `gemm` computes
/// it within a plan. Blocks of [`BLOCK_ROWS`] rows are split across rayon's threads, so the
/// result does not depend on the thread count. Runs only where `avx512_build()` (a plan's
/// choice); lengths that do not fit leave `out` unchanged (the callers checked them). `fresh`:
/// `out`'s values before do not matter, each output is `0.0 + chain`, as from a zeroed buffer.
fn add_products_avx512(
    out: &mut [f32],
    a: &[f32],
    b: &[f32],
    (depth, width): (usize, usize),
    fresh: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if width == 0 || depth == 0 {
            return;
        }
        let rows = out.len() / width;
        if out.len() != rows * width || a.len() != rows * depth || b.len() != depth * width {
            return;
        }
        let per_task = rows_per_task(rows, BLOCK_ROWS);
        out.par_chunks_mut(per_task * width)
            .zip(a.par_chunks(per_task * depth))
            .for_each(|(out, a)| {
                let a = Left::new(a, (depth, 1));
                // SAFETY: `avx512_build()` held when the plan chose this path; `out` holds
                // whole rows of `width`, `a` as many rows of `depth`, `b` `depth` rows of
                // `width` (checked above).
                unsafe { add_products_rows_avx512(out, a, b, (depth, width), fresh) }
            });
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (out, a, b, depth, width, fresh);
}

/// Rows of `rows` that one task takes: whole blocks of `block` rows, enough tasks for every
/// thread several times over (and no more: each task of the weight gradient reads every
/// sequence's inputs once).
fn rows_per_task(rows: usize, block: usize) -> usize {
    rows.div_ceil(block * 4 * rayon::current_num_threads())
        .max(1)
        * block
}

/// The left operand of a product: element `(row, t)` at `data[row · row_stride + t ·
/// depth_stride]` (a row-major matrix, or the transpose of one).
#[derive(Debug, Clone, Copy)]
struct Left<'a> {
    data: &'a [f32],
    row_stride: usize,
    depth_stride: usize,
}

impl<'a> Left<'a> {
    fn new(data: &'a [f32], (row_stride, depth_stride): (usize, usize)) -> Left<'a> {
        Left {
            data,
            row_stride,
            depth_stride,
        }
    }
}

/// [`add_products_avx512`] on the rows of one task: blocks of [`BLOCK_ROWS`] rows, then of
/// one row; in each, columns [`BLOCK_VECTORS`] vectors of 16 at a time, then one vector at a
/// time, the last one masked. `fresh`: `out` is not read, each output written as `0.0 +
/// chain` (what a zeroed `out` gives, without a pass to zero it).
///
/// # Safety
/// The CPU has AVX-512 F; `out` holds whole rows of `width`, `a` as many rows of `depth`
/// (every element its strides reach within its data), `b` `depth` rows of `width`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_products_rows_avx512(
    out: &mut [f32],
    a: Left,
    b: &[f32],
    (depth, width): (usize, usize),
    fresh: bool,
) {
    let rows = out.len() / width;
    let mut r = 0;
    // SAFETY: the caller's, for rows `r..r + R` within `rows`.
    unsafe {
        while r + BLOCK_ROWS <= rows {
            product_columns::<BLOCK_ROWS>(out, a, b, r, (depth, width), fresh);
            r += BLOCK_ROWS;
        }
        while r < rows {
            product_columns::<1>(out, a, b, r, (depth, width), fresh);
            r += 1;
        }
    }
}

/// Rows `r..r + R` of [`add_products_rows_avx512`], every column.
///
/// # Safety
/// As [`add_products_rows_avx512`] (only inlined into it), and `r + R` rows within `out`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn product_columns<const R: usize>(
    out: &mut [f32],
    a: Left,
    b: &[f32],
    r: usize,
    (depth, width): (usize, usize),
    fresh: bool,
) {
    let mut c = 0;
    // SAFETY: the caller's; each block's columns `c..c + 16·V` (the last masked to
    // `width`).
    unsafe {
        while c + 16 * BLOCK_VECTORS <= width {
            product_block::<R, BLOCK_VECTORS>(
                out,
                a,
                b,
                (r, c),
                (depth, width),
                [u16::MAX; BLOCK_VECTORS],
                fresh,
            );
            c += 16 * BLOCK_VECTORS;
        }
        while c < width {
            let lanes = (width - c).min(16);
            let mask = u16::MAX >> (16 - lanes);
            product_block::<R, 1>(out, a, b, (r, c), (depth, width), [mask], fresh);
            c += lanes;
        }
    }
}

/// One block of [`product_columns`]: rows `r..r + R`, `V` vectors of 16 columns from `c`,
/// vector `v`'s lanes `masks[v]` (the others neither read nor written): `R·V` chains side
/// by side, each over the whole depth, then added to `out` (`fresh`: to `0.0`).
///
/// # Safety
/// As [`product_columns`] (only inlined into it); the lanes `masks` selects lie within
/// `width`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn product_block<const R: usize, const V: usize>(
    out: &mut [f32],
    a: Left,
    b: &[f32],
    (r, c): (usize, usize),
    (depth, width): (usize, usize),
    masks: [u16; V],
    fresh: bool,
) {
    use std::arch::x86_64::*;
    // SAFETY: rows `r..r + R` of `a` (`depth` each) and of `out`, rows `..depth` of `b`,
    // columns `c..c + 16·V` where the masks allow them: within each buffer.
    unsafe {
        let (ap, bp, op) = (a.data.as_ptr(), b.as_ptr(), out.as_mut_ptr());
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for t in 0..depth {
            let bt = bp.add(t * width + c);
            let bs: [__m512; V] =
                std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], bt.add(16 * v)));
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*ap.add((r + i) * a.row_stride + t * a.depth_stride));
                for (acc, b) in acc.iter_mut().zip(&bs) {
                    *acc = _mm512_fmadd_ps(x, *b, *acc);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                let o = op.add((r + i) * width + c + 16 * v);
                let before = match fresh {
                    true => _mm512_setzero_ps(),
                    false => _mm512_maskz_loadu_ps(masks[v], o),
                };
                let sum = _mm512_add_ps(before, *acc);
                _mm512_mask_storeu_ps(o, masks[v], sum);
            }
        }
    }
}

/// `dw_rows[j][i] += Σ_r x[r][i] · dy[r][first + j]` for one sequence (`dw_rows` holds whole
/// rows of the weights' gradient, outputs `first..`): with `avx512` (the plan's choice) the
/// 16-lane loop on `dyᵀ · x`, else the 8-lane one. `fresh`: `dw_rows`' values before do not
/// matter, the sums go into zeros.
fn add_rows(
    dw_rows: &mut [f32],
    x: &[f32],
    dy: &[f32],
    first: usize,
    (inputs, outputs): (usize, usize),
    (avx512, fresh): (bool, bool),
) {
    let rows = dy.len() / outputs;
    if fresh && !avx512 {
        dw_rows.fill(0.0);
    }
    // SAFETY: an `Affine` exists only where `fma_available()`, its `avx512` only where
    // `avx512_build()`; `x` holds `rows` rows of `inputs`, `dw_rows` whole rows of `inputs`,
    // each an output `first + o < outputs`, so `dyᵀ` (row `o`: `dy[t][first + o]`) reaches
    // `dy[first + o + (rows - 1) · outputs]` at most, within `dy`.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        match avx512 {
            true => {
                let dy_t = Left::new(&dy[first..], (1, outputs));
                add_products_rows_avx512(dw_rows, dy_t, x, (rows, inputs), fresh)
            }
            false => add_rows_fma(dw_rows, x, dy, first, (inputs, outputs)),
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (avx512, rows);
        for (j, dw_row) in dw_rows.chunks_exact_mut(inputs).enumerate() {
            add_columns(dw_row, x, dy, (first + j, outputs), 0);
        }
    }
}

/// [`add_rows`] with eight columns to a vector: four rows by two vectors at a time, eight
/// independent chains (what two FMA units need through their latency, with the loads of `x`
/// shared by four rows), then four rows by one vector for the last columns. Not three
/// vectors: twelve accumulators, three rows of `x` and the broadcast do not fit AVX2's sixteen
/// registers, and the compiler kept an accumulator on the stack, a chain through memory (the
/// weight gradient took 1.4 times as long).
///
/// # Safety
/// The CPU has AVX and FMA; `x` holds `dy.len() / outputs` rows of `inputs`; `dw_rows`
/// whole rows of `inputs`; `first + dw_rows.len() / inputs <= outputs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,fma")]
unsafe fn add_rows_fma(
    dw_rows: &mut [f32],
    x: &[f32],
    dy: &[f32],
    first: usize,
    (inputs, outputs): (usize, usize),
) {
    let mut j = 0;
    while (j + ROWS_PER_TASK) * inputs <= dw_rows.len() {
        let mut i = 0;
        // SAFETY: AVX and FMA (this function's); each call's `i + 8·V <= inputs`, its rows
        // `j..j + ROWS_PER_TASK` within `dw_rows`.
        unsafe {
            while i + 16 <= inputs {
                add_block_fma::<2>(dw_rows, x, dy, (first, j, i), (inputs, outputs));
                i += 16;
            }
            if i + 8 <= inputs {
                add_block_fma::<1>(dw_rows, x, dy, (first, j, i), (inputs, outputs));
                i += 8;
            }
        }
        for (o, dw_row) in dw_rows[j * inputs..]
            .chunks_exact_mut(inputs)
            .take(ROWS_PER_TASK)
            .enumerate()
        {
            add_columns(dw_row, x, dy, (first + j + o, outputs), i);
        }
        j += ROWS_PER_TASK;
    }
    for (o, dw_row) in dw_rows[j * inputs..].chunks_exact_mut(inputs).enumerate() {
        // SAFETY: as this function's.
        unsafe { add_row_tail(dw_row, x, dy, (first + j + o, outputs), 0) };
    }
}

/// Rows `j..j + ROWS_PER_TASK` of `dw_rows`, columns `i..i + 8·V`, of [`add_rows`]: each
/// output one chain over the rows `r` in order, added to the gradient once.
///
/// # Safety
/// As [`add_rows_fma`], and `i + 8·V <= inputs`, `(j + ROWS_PER_TASK)·inputs <=
/// dw_rows.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,fma")]
#[inline]
unsafe fn add_block_fma<const V: usize>(
    dw_rows: &mut [f32],
    x: &[f32],
    dy: &[f32],
    (first, j, i): (usize, usize, usize),
    (inputs, outputs): (usize, usize),
) {
    use std::arch::x86_64::*;
    let rows = dy.len() / outputs;
    // SAFETY: every pointer below addresses columns `i..i + 8·V` (within `inputs`) of a row
    // `r < rows` of `x` or of a row `j + o` (within `dw_rows`) of `dw_rows`.
    unsafe {
        let (dw, x) = (dw_rows.as_mut_ptr(), x.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); V]; ROWS_PER_TASK];
        for r in 0..rows {
            let xr = x.add(r * inputs + i);
            let xs: [__m256; V] = std::array::from_fn(|v| _mm256_loadu_ps(xr.add(8 * v)));
            let gs = &dy[r * outputs + first + j..][..ROWS_PER_TASK];
            for (a, g) in acc.iter_mut().zip(gs) {
                let g = _mm256_set1_ps(*g);
                for (a, x) in a.iter_mut().zip(&xs) {
                    *a = _mm256_fmadd_ps(g, *x, *a);
                }
            }
        }
        for (o, a) in acc.iter().enumerate() {
            for (v, a) in a.iter().enumerate() {
                let d = dw.add((j + o) * inputs + i + 8 * v);
                _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), *a));
            }
        }
    }
}

/// One row of [`add_rows`] (output `o`) from column `from` on: vectors of eight, then one
/// column at a time.
///
/// # Safety
/// As [`add_rows_fma`], for the one row `dw_row`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,fma")]
unsafe fn add_row_tail(
    dw_row: &mut [f32],
    x: &[f32],
    dy: &[f32],
    (o, outputs): (usize, usize),
    from: usize,
) {
    use std::arch::x86_64::*;
    let (inputs, rows) = (dw_row.len(), dy.len() / outputs);
    let mut i = from;
    // SAFETY: columns `i..i + 8` with `i + 8 <= inputs` of a row `r < rows` of `x` and of
    // `dw_row`.
    unsafe {
        while i + 8 <= inputs {
            let mut acc = _mm256_setzero_ps();
            for r in 0..rows {
                let g = _mm256_set1_ps(dy[r * outputs + o]);
                acc = _mm256_fmadd_ps(g, _mm256_loadu_ps(x.as_ptr().add(r * inputs + i)), acc);
            }
            let d = dw_row.as_mut_ptr().add(i);
            _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), acc));
            i += 8;
        }
    }
    add_columns(dw_row, x, dy, (o, outputs), i);
}

/// One row of [`add_rows`] (output `o`) from column `first` on, one column at a time
/// (`mul_add` is fused on every CPU; inlined into [`add_row_tail`] it is one instruction).
#[inline(always)]
fn add_columns(
    dw_row: &mut [f32],
    x: &[f32],
    dy: &[f32],
    (o, outputs): (usize, usize),
    first: usize,
) {
    let inputs = dw_row.len();
    let rows = dy.len() / outputs;
    for (col, d) in dw_row.iter_mut().enumerate().skip(first) {
        let mut acc = 0.0f32;
        for r in 0..rows {
            acc = dy[r * outputs + o].mul_add(x[r * inputs + col], acc);
        }
        *d += acc;
    }
}
