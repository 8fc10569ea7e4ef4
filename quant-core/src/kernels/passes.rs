//! Plain passes over `f32` values (fill, add), split across rayon's threads when long: in a
//! training step on several threads, such a pass left on one thread is a serial section beside
//! idle ones. Every value is computed alone, so any split gives the same bits.

use rayon::prelude::*;

use super::driver::VectorPath;

/// Values from which the passes run in parallel: a value costs a fraction of a nanosecond (the
/// passes wait on memory), so a split pays from tens of thousands of values.
pub const PASSES_PARALLEL: usize = 1 << 16;
/// Values per parallel piece.
const CHUNK: usize = 1 << 14;

fn parallel(len: usize) -> bool {
    len >= PASSES_PARALLEL && rayon::current_num_threads() > 1
}

/// Sets every element of `buf` to `value`.
pub fn fill(buf: &mut [f32], value: f32) {
    if parallel(buf.len()) {
        buf.par_chunks_mut(CHUNK).for_each(|c| c.fill(value));
    } else {
        buf.fill(value);
    }
}

/// Writes `0.0` into every element of `buf` (storage not yet initialised).
pub(crate) fn fill_zeros_uninit(buf: &mut [std::mem::MaybeUninit<f32>]) {
    let zero = |c: &mut [std::mem::MaybeUninit<f32>]| {
        for v in c {
            v.write(0.0);
        }
    };
    if parallel(buf.len()) {
        buf.par_chunks_mut(CHUNK).for_each(zero);
    } else {
        zero(buf);
    }
}

/// `dst[i] += src[i]` for every `i` of the shorter of the two.
pub fn add_into(dst: &mut [f32], src: &[f32]) {
    let add = |d: &mut [f32], s: &[f32]| {
        for (d, s) in d.iter_mut().zip(s) {
            *d += *s;
        }
    };
    if parallel(dst.len().min(src.len())) {
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(d, s)| add(d, s));
    } else {
        add(dst, src);
    }
}

/// `out[i] = a[i] + b[i]` for every `i` of the shortest of the three.
pub fn sum_into(out: &mut [f32], a: &[f32], b: &[f32]) {
    let sum = |o: &mut [f32], a: &[f32], b: &[f32]| {
        for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
            *o = *a + *b;
        }
    };
    if parallel(out.len().min(a.len()).min(b.len())) {
        out.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK))
            .zip(b.par_chunks(CHUNK))
            .for_each(|((o, a), b)| sum(o, a, b));
    } else {
        sum(out, a, b);
    }
}

/// Sets every row of `buf` (whole rows of `row.len()` values; a partial last row gets the
/// start of `row`) to `row`: a bias broadcast over a batch.
pub fn fill_rows(buf: &mut [f32], row: &[f32]) {
    if row.is_empty() {
        return;
    }
    let fill = |c: &mut [f32]| {
        for r in c.chunks_mut(row.len()) {
            r.copy_from_slice(&row[..r.len()]);
        }
    };
    if parallel(buf.len()) {
        // Whole rows per piece, about `CHUNK` values.
        let rows = (CHUNK / row.len()).max(1);
        buf.par_chunks_mut(rows * row.len()).for_each(fill);
    } else {
        fill(buf);
    }
}

/// `out[c][r] = m[r][c]` for `m` of `rows × cols` and `out` of `cols × rows`, both row-major
/// (lengths that do not match leave `out` unchanged): blocks of 8 x 8 values transposed in AVX
/// registers where the CPU has AVX2 ([`VectorPath::widest`]; the scalar loop took about 1.25
/// cycles a value, and 15% of the float MLP's training step on a Xeon), else tiles of 16 rows
/// of `m`, so that each row of `out` is written in runs of 16 values instead of one value per
/// cache line. A copy either way: the same bits.
pub fn transpose(m: &[f32], out: &mut [f32], (rows, cols): (usize, usize)) {
    if m.len() != rows * cols || out.len() != rows * cols || rows == 0 || cols == 0 {
        return;
    }
    let vector = VectorPath::widest() != VectorPath::Baseline;
    // Rows `first..` of `out` (columns `first..` of `m`).
    let part = |first: usize, out: &mut [f32]| {
        #[cfg(target_arch = "x86_64")]
        if vector {
            // SAFETY: every path above the baseline has AVX2 (`VectorPath::widest`), so AVX;
            // `out` holds whole rows of `rows` values, columns `first..` of `m`, which is
            // `rows × cols` (checked above) with `first + out.len() / rows <= cols`.
            unsafe { avx::transpose_part(m, out, (rows, cols), first) };
            return;
        }
        let _ = vector;
        transpose_tiles(m, out, (rows, cols), first, 0);
    };
    if parallel(out.len()) {
        out.par_chunks_mut(TRANSPOSE_TILE * rows)
            .enumerate()
            .for_each(|(k, out)| part(k * TRANSPOSE_TILE, out));
    } else {
        part(0, out);
    }
}

/// Columns of `m` (rows of `out`) a task of [`transpose`] takes, and rows of `m` a tile of its
/// scalar loop.
const TRANSPOSE_TILE: usize = 16;

/// [`transpose`]'s scalar loop on rows `first..` of `out`, from row `from` of `m` on (the rows
/// before are written).
fn transpose_tiles(
    m: &[f32],
    out: &mut [f32],
    (rows, cols): (usize, usize),
    first: usize,
    from: usize,
) {
    for r0 in (from..rows).step_by(TRANSPOSE_TILE) {
        let r1 = (r0 + TRANSPOSE_TILE).min(rows);
        for (c, out_row) in out.chunks_exact_mut(rows).enumerate() {
            for (r, o) in (r0..r1).zip(&mut out_row[r0..r1]) {
                *o = m[r * cols + first + c];
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    /// [`super::transpose`] on rows `first..` of `out`: whole blocks of 8 x 8 values through
    /// registers, then the last rows of `m` (under 8) and the last rows of `out` (under 8) by
    /// the scalar loop.
    ///
    /// # Safety
    /// The CPU has AVX; `m` holds `rows × cols` values, `out` whole rows of `rows` values, and
    /// `first + out.len() / rows <= cols`.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn transpose_part(
        m: &[f32],
        out: &mut [f32],
        (rows, cols): (usize, usize),
        first: usize,
    ) {
        let count = out.len() / rows;
        let (whole_rows, whole_count) = (rows - rows % 8, count - count % 8);
        let (mp, op) = (m.as_ptr(), out.as_mut_ptr());
        // Block columns outside, rows inside: on a 256 x 256 matrix (rows 1 KiB apart, which
        // share cache sets) this order took 0.69x the scalar loop's time, strips of 16 rows
        // 1.3x, tiles of 32 x 32 0.93x.
        for c0 in (0..whole_count).step_by(8) {
            for r0 in (0..whole_rows).step_by(8) {
                // SAFETY: rows `r0..r0 + 8 <= rows` of `m` at columns `first + c0..first + c0 +
                // 8 <= cols`; rows `c0..c0 + 8 <= count` of `out` at columns `r0..r0 + 8`.
                unsafe {
                    let v: [__m256; 8] = std::array::from_fn(|i| {
                        _mm256_loadu_ps(mp.add((r0 + i) * cols + first + c0))
                    });
                    for (i, t) in transpose8(v).into_iter().enumerate() {
                        _mm256_storeu_ps(op.add((c0 + i) * rows + r0), t);
                    }
                }
            }
        }
        // The rows of `out` past the whole blocks, then the columns (rows of `m`) past them.
        let (blocked, rest) = out.split_at_mut(whole_count * rows);
        super::transpose_tiles(m, rest, (rows, cols), first + whole_count, 0);
        super::transpose_tiles(m, blocked, (rows, cols), first, whole_rows);
    }

    /// The transpose of the 8 x 8 matrix whose rows are `v`: unpacks, shuffles and lane
    /// permutations, moves of bits only.
    #[inline]
    #[target_feature(enable = "avx")]
    fn transpose8(v: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(v[0], v[1]);
        let t1 = _mm256_unpackhi_ps(v[0], v[1]);
        let t2 = _mm256_unpacklo_ps(v[2], v[3]);
        let t3 = _mm256_unpackhi_ps(v[2], v[3]);
        let t4 = _mm256_unpacklo_ps(v[4], v[5]);
        let t5 = _mm256_unpackhi_ps(v[4], v[5]);
        let t6 = _mm256_unpacklo_ps(v[6], v[7]);
        let t7 = _mm256_unpackhi_ps(v[6], v[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }
}
