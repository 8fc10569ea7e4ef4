use quant_core::__internals::*;

use crate::threads::on_one_and_three_threads;

/// Uniform draws in `[0, 1)` from a xorshift generator seeded with `state`.
fn uniform_from(state: u64) -> impl FnMut() -> f64 {
    let mut next = crate::test_rng::xorshift(state);
    move || (next() >> 11) as f64 / (1u64 << 53) as f64
}

/// [`layer_norm_backward`] one row at a time, as it was written before its rows went side
/// by side: the definition it must match bit for bit.
#[allow(clippy::too_many_arguments)]
fn layer_norm_backward_one_row_at_a_time(
    n: usize,
    epsilon: f32,
    x: &[f32],
    gamma: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    for ((x, dy), dx) in x
        .chunks_exact(n)
        .zip(dy.chunks_exact(n))
        .zip(dx.chunks_exact_mut(n))
    {
        let x: Vec<f64> = x.iter().map(|v| *v as f64 - x[0] as f64).collect();
        let mean = x.iter().sum::<f64>() / n as f64;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let denominator = var + epsilon as f64;
        for (db, d) in dbeta.iter_mut().zip(dy) {
            *db += *d;
        }
        if denominator <= 0.0 {
            continue;
        }
        let inv = 1.0 / denominator.sqrt();
        let norm: Vec<f64> = x.iter().map(|v| (v - mean) * inv).collect();
        let g: Vec<f64> = dy
            .iter()
            .zip(gamma)
            .map(|(d, g)| *d as f64 * *g as f64)
            .collect();
        let mean_g = g.iter().sum::<f64>() / n as f64;
        let mean_gn = g.iter().zip(&norm).map(|(g, h)| g * h).sum::<f64>() / n as f64;
        for (((o, g), h), (dg, d)) in dx
            .iter_mut()
            .zip(&g)
            .zip(&norm)
            .zip(dgamma.iter_mut().zip(dy))
        {
            *o += ((g - mean_g - h * mean_gn) * inv) as f32;
            *dg += (*d as f64 * h) as f32;
        }
    }
}

#[test]
fn layer_norm_backward_rows_side_by_side_is_one_row_at_a_time_bit_for_bit() {
    let mut uniform = uniform_from(0x9e37_79b9_7f4a_7c15);
    for n in [48, 7, 2, 1] {
        for rows in [1, 3, 4, 5, 8, 9, 13] {
            for (spread, offset, epsilon) in
                [(1.0, 0.0, 1e-5), (1e-3, 40.0, 1e-6), (30.0, -5.0, 0.0)]
            {
                let mut x: Vec<f32> = (0..rows * n)
                    .map(|_| (offset + spread * (uniform() - 0.5)) as f32)
                    .collect();
                // A constant row: with ε = 0 its denominator is 0 and only β gets a gradient.
                if rows > 2 {
                    x[2 * n..3 * n].fill(1.25);
                }
                let mut gamma: Vec<f32> = (0..n).map(|_| (uniform() * 2.0 - 0.5) as f32).collect();
                let mut dy: Vec<f32> = (0..rows * n).map(|_| (uniform() - 0.5) as f32).collect();
                // Values that cancel within a row, so that the order of its mean's and of
                // mean(g)'s additions shows in the results (reversing either fails).
                if epsilon == 0.0 && n >= 4 {
                    gamma[1] = gamma[0];
                    for (x, dy) in x.chunks_exact_mut(n).zip(dy.chunks_exact_mut(n)) {
                        if x[0] != 1.25 {
                            (x[1], x[2]) = (1e20, -1e20);
                        }
                        (dy[0], dy[1]) = (1e20, -1e20);
                    }
                }
                // Gradients that already hold values (the input feeds other ops too).
                let start =
                    |len: usize, k: f32| (0..len).map(|i| k * (i % 7) as f32).collect::<Vec<f32>>();
                let (mut dx, mut dgamma, mut dbeta) =
                    (start(rows * n, 0.3), start(n, 0.7), start(n, -0.2));
                let (mut want_dx, mut want_dgamma, mut want_dbeta) =
                    (dx.clone(), dgamma.clone(), dbeta.clone());
                layer_norm_backward(
                    n,
                    epsilon,
                    &x,
                    &gamma,
                    &dy,
                    &mut dx,
                    &mut dgamma,
                    &mut dbeta,
                );
                layer_norm_backward_one_row_at_a_time(
                    n,
                    epsilon,
                    &x,
                    &gamma,
                    &dy,
                    &mut want_dx,
                    &mut want_dgamma,
                    &mut want_dbeta,
                );
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let case = format!("n {n}, {rows} rows, spread {spread}, ε {epsilon}");
                assert_eq!(bits(&dx), bits(&want_dx), "dx, {case}");
                assert_eq!(bits(&dgamma), bits(&want_dgamma), "dgamma, {case}");
                assert_eq!(bits(&dbeta), bits(&want_dbeta), "dbeta, {case}");
            }
        }
    }
}

/// [`softmax_backward`] one row at a time, as it was written before its rows went side by
/// side: the definition it must match bit for bit.
fn softmax_backward_one_row_at_a_time(n: usize, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((x, dy), dx) in x
        .chunks_exact(n)
        .zip(dy.chunks_exact(n))
        .zip(dx.chunks_exact_mut(n))
    {
        let max = x.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v as f64));
        let mut e: Vec<f64> = x.iter().map(|v| *v as f64 - max).collect();
        exp_nonpositive_in_place(VectorPath::Baseline, &mut e);
        let sum: f64 = e.iter().sum();
        let p: Vec<f64> = e.into_iter().map(|v| v / sum).collect();
        let dot: f64 = p.iter().zip(dy).map(|(p, d)| p * *d as f64).sum();
        for ((g, p), d) in dx.iter_mut().zip(&p).zip(dy) {
            *g += (p * (*d as f64 - dot)) as f32;
        }
    }
}

#[test]
fn softmax_backward_rows_side_by_side_is_one_row_at_a_time_bit_for_bit() {
    let mut uniform = uniform_from(0x2545_f491_4f6c_dd1d);
    for n in [16, 5, 2, 1] {
        for rows in [1, 3, 4, 5, 8, 9, 13] {
            for spread in [1.0, 30.0, 1e-3] {
                let mut x: Vec<f32> = (0..rows * n)
                    .map(|_| (spread * (uniform() - 0.5)) as f32)
                    .collect();
                let mut dy: Vec<f32> = (0..rows * n).map(|_| (uniform() - 0.5) as f32).collect();
                // Gradients that cancel within a row, so that the order of Σ p · dy shows
                // in the results (reversing it fails).
                if spread == 1.0 && n >= 4 {
                    for (x, dy) in x.chunks_exact_mut(n).zip(dy.chunks_exact_mut(n)) {
                        x[1] = x[0];
                        (dy[0], dy[1]) = (1e20, -1e20);
                    }
                }
                let mut dx: Vec<f32> = (0..rows * n).map(|i| 0.3 * (i % 7) as f32).collect();
                let mut want = dx.clone();
                softmax_backward(n, &x, &dy, &mut dx);
                softmax_backward_one_row_at_a_time(n, &x, &dy, &mut want);
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&dx),
                    bits(&want),
                    "n {n}, {rows} rows, spread {spread}"
                );
            }
        }
    }
}

/// Tensors large enough to be split into parallel jobs of rows (tens of thousands of
/// values): the gradients are still those of one row at a time, bit for bit, on any number of
/// threads. A constant row lies in a later job and the rows do not split evenly, so the
/// rows' terms of `dgamma` must be added in order across jobs.
#[test]
fn layer_norm_backward_split_into_jobs_is_one_row_at_a_time_bit_for_bit() {
    let mut uniform = uniform_from(0x51ed_2701_a3b4_c5d6);
    for (n, rows) in [(48, 1101), (7, 7103)] {
        let mut x: Vec<f32> = (0..rows * n)
            .map(|_| (uniform() * 4.0 - 2.0) as f32)
            .collect();
        x[(rows - 5) * n..(rows - 4) * n].fill(0.75);
        let gamma: Vec<f32> = (0..n).map(|_| (uniform() * 2.0 - 0.5) as f32).collect();
        let dy: Vec<f32> = (0..rows * n).map(|_| (uniform() - 0.5) as f32).collect();
        let start = |len: usize, k: f32| (0..len).map(|i| k * (i % 5) as f32).collect::<Vec<_>>();
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let (mut want_dx, mut want_dgamma, mut want_dbeta) =
            (start(rows * n, 0.3), start(n, 0.7), start(n, -0.2));
        layer_norm_backward_one_row_at_a_time(
            n,
            0.0,
            &x,
            &gamma,
            &dy,
            &mut want_dx,
            &mut want_dgamma,
            &mut want_dbeta,
        );
        let results = on_one_and_three_threads(|| {
            let (mut dx, mut dgamma, mut dbeta) =
                (start(rows * n, 0.3), start(n, 0.7), start(n, -0.2));
            layer_norm_backward(n, 0.0, &x, &gamma, &dy, &mut dx, &mut dgamma, &mut dbeta);
            (bits(&dx), bits(&dgamma), bits(&dbeta))
        });
        for (threads, (dx, dgamma, dbeta)) in [1, 3].iter().zip(results) {
            let case = format!("n {n}, {rows} rows, {threads} threads");
            assert_eq!(dx, bits(&want_dx), "dx, {case}");
            assert_eq!(dgamma, bits(&want_dgamma), "dgamma, {case}");
            assert_eq!(dbeta, bits(&want_dbeta), "dbeta, {case}");
        }
    }
}

/// As for layer normalisation: softmax's gradient of tensors split into parallel jobs is that
/// of one row at a time, on any number of threads.
#[test]
fn softmax_backward_split_into_jobs_is_one_row_at_a_time_bit_for_bit() {
    let mut uniform = uniform_from(0x0bad_cafe_1234_5679);
    for (n, rows) in [(16, 4103), (5, 13_001)] {
        let x: Vec<f32> = (0..rows * n)
            .map(|_| (8.0 * uniform() - 4.0) as f32)
            .collect();
        let dy: Vec<f32> = (0..rows * n).map(|_| (uniform() - 0.5) as f32).collect();
        let start: Vec<f32> = (0..rows * n).map(|i| 0.3 * (i % 7) as f32).collect();
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let mut want = start.clone();
        softmax_backward_one_row_at_a_time(n, &x, &dy, &mut want);
        let results = on_one_and_three_threads(|| {
            let mut dx = start.clone();
            softmax_backward(n, &x, &dy, &mut dx);
            bits(&dx)
        });
        for (threads, dx) in [1, 3].iter().zip(results) {
            assert_eq!(dx, bits(&want), "n {n}, {rows} rows, {threads} threads");
        }
    }
}
