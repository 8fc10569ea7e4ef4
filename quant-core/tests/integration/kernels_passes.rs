//! The plain passes split across threads (`quant_core::kernels::passes`) and the pool's zeroed
//! buffers: the same values as the one-thread loops they replace, below and above the length
//! from which they split, on one thread and on three.

use quant_core::kernels::passes::{
    add_into, fill, fill_rows, sum_into, transpose, PASSES_PARALLEL,
};
use quant_core::scratch::Scratch;

use quant_core::__internals::VectorPath;

use crate::kernels::with_paths;
use crate::threads::on_one_and_three_threads;

/// Lengths on both sides of the split, and ones that are not whole pieces.
fn lengths() -> [usize; 5] {
    [
        0,
        7,
        PASSES_PARALLEL - 1,
        PASSES_PARALLEL,
        3 * PASSES_PARALLEL + 17,
    ]
}

fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) as f32 / 7.0e8 - 3.0)
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn fills_and_adds_give_the_plain_loops_values_on_any_thread_count() {
    for len in lengths() {
        let (a, b) = (values(len, 1), values(len, 2));
        let want_sum: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
        for [sum, added, filled] in on_one_and_three_threads(|| {
            let mut sum = vec![f32::NAN; len];
            sum_into(&mut sum, &a, &b);
            let mut added = a.clone();
            add_into(&mut added, &b);
            let mut filled = vec![1.0; len];
            fill(&mut filled, -0.0);
            [sum, added, filled]
        }) {
            assert_eq!(bits(&sum), bits(&want_sum), "sum_into, {len} values");
            assert_eq!(bits(&added), bits(&want_sum), "add_into, {len} values");
            assert!(
                filled.iter().all(|v| v.to_bits() == (-0.0f32).to_bits()),
                "fill, {len}"
            );
        }
    }
}

/// On every path (the transpose's 8 x 8 register blocks and its scalar loop), with shapes
/// that are whole blocks, none, and whole blocks with a rest of rows, columns or both.
#[test]
fn rows_and_transposes_give_the_plain_loops_values_on_any_thread_count() {
    let shapes = [
        (1, 1),
        (3, 5),
        (8, 8),
        (9, 15),
        (16, 24),
        (17, 33),
        (10, 256),
        (256, 10),
        (64, 256),
        (300, 257),
        (1030, 70),
    ];
    let paths = [
        (VectorPath::Avx2, "avx2"),
        (VectorPath::Baseline, "baseline"),
    ];
    with_paths(&paths, |path| {
        for (rows, cols) in shapes {
            rows_and_transpose(rows, cols, path);
        }
    });
}

/// One shape of [`rows_and_transposes_give_the_plain_loops_values_on_any_thread_count`].
fn rows_and_transpose(rows: usize, cols: usize, path: &str) {
    let m = values(rows * cols, 3);
    let mut want = vec![0.0; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            want[c * rows + r] = m[r * cols + c];
        }
    }
    let row = values(cols, 4);
    for [t, broadcast] in on_one_and_three_threads(|| {
        let mut t = vec![f32::NAN; rows * cols];
        transpose(&m, &mut t, (rows, cols));
        let mut broadcast = vec![f32::NAN; rows * cols];
        fill_rows(&mut broadcast, &row);
        [t, broadcast]
    }) {
        assert_eq!(
            bits(&t),
            bits(&want),
            "{path}: transpose of {rows} x {cols}"
        );
        for (r, got) in broadcast.chunks(cols).enumerate() {
            assert_eq!(bits(got), bits(&row), "row {r} of {rows} x {cols}");
        }
    }
}

/// `Scratch::zeros` hands out zeros however the pooled buffer it reuses was left, fresh or
/// pooled, shorter or longer than its last use.
#[test]
fn pooled_zeros_are_zeros() {
    for run in on_one_and_three_threads(|| {
        let mut seen = Vec::new();
        for len in lengths().into_iter().chain([PASSES_PARALLEL + 5, 10]) {
            let mut z = Scratch::zeros(len);
            seen.push((len, z.len() == len && z.iter().all(|v| v.to_bits() == 0)));
            // Left dirty for the next `zeros` to reuse.
            z.fill(f32::NAN);
            Scratch::recycle(z);
        }
        seen
    }) {
        for (len, zeros) in run {
            assert!(zeros, "Scratch::zeros({len}) did not give {len} zeros");
        }
    }
}
