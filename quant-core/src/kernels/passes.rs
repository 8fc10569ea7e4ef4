//! Plain passes over `f32` values (fill, add), split across rayon's threads when long: in a
//! training step on several threads, such a pass left on one thread is a serial section beside
//! idle ones. Every value is computed alone, so any split gives the same bits.

use rayon::prelude::*;

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
/// (lengths that do not match leave `out` unchanged): tiles of 16 rows of `m`, so that each row
/// of `out` is written in runs of 16 values instead of one value per cache line.
pub fn transpose(m: &[f32], out: &mut [f32], (rows, cols): (usize, usize)) {
    const TILE: usize = 16;
    if m.len() != rows * cols || out.len() != rows * cols || rows == 0 || cols == 0 {
        return;
    }
    // Rows `first..` of `out` (columns of `m`).
    let part = |first: usize, out: &mut [f32]| {
        for r0 in (0..rows).step_by(TILE) {
            let r1 = (r0 + TILE).min(rows);
            for (c, out_row) in out.chunks_exact_mut(rows).enumerate() {
                for (r, o) in (r0..r1).zip(&mut out_row[r0..r1]) {
                    *o = m[r * cols + first + c];
                }
            }
        }
    };
    if parallel(out.len()) {
        out.par_chunks_mut(TILE * rows)
            .enumerate()
            .for_each(|(k, out)| part(k * TILE, out));
    } else {
        part(0, out);
    }
}
