use quant_core::__internals::*;

/// Units in the last place between `a` and `b` (both finite and positive, or both zero).
fn ulps(a: f64, b: f64) -> u64 {
    a.to_bits().abs_diff(b.to_bits())
}

/// Arguments across the whole range, the rounding ties of `k` (odd multiples of ln 2 / 2)
/// and the flush boundary.
fn arguments() -> Vec<f64> {
    let mut x = vec![0.0, -0.0, -1e-300, -1e-17, -0.5, -1.0, -2.0, -700.0, -708.0];
    x.extend([
        -708.0 - 1e-12,
        -708.4,
        -709.0,
        -745.2,
        -1e4,
        f64::NEG_INFINITY,
    ]);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..200_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let unit = (state >> 11) as f64 / (1u64 << 53) as f64;
        // Most where softmax scores lie, some down to the flush boundary.
        let span = if i % 4 == 0 { 708.0 } else { 40.0 };
        x.push(-unit * span);
    }
    for k in 1..200 {
        let tie = -(k as f64 + 0.5) * std::f64::consts::LN_2;
        x.extend([
            tie,
            f64::from_bits(tie.to_bits() + 1),
            f64::from_bits(tie.to_bits() - 1),
        ]);
    }
    x
}

#[test]
fn exp_is_within_one_ulp_of_the_standard_librarys() {
    let mut exact = 0;
    let xs = arguments();
    for x in &xs {
        let (got, want) = (exp_nonpositive(*x), x.exp());
        if *x < FLUSH_BELOW {
            assert_eq!(got.to_bits(), 0, "e^{x:e} is flushed to +0");
            continue;
        }
        let d = ulps(got, want);
        assert!(d <= 1, "e^{x:e}: {got:e} against {want:e}, {d} ulps");
        exact += (d == 0) as usize;
    }
    // Nearly all results are the correctly rounded one (98.5% here): without the parts
    // `r` and `1 + r` round off, 90%.
    assert!(exact * 50 >= xs.len() * 49, "{exact} of {} exact", xs.len());
    assert!(exp_nonpositive(f64::NAN).is_nan());
}

#[test]
fn every_path_gives_the_same_bits() {
    let xs = arguments();
    let mut want = xs.clone();
    exp_nonpositive_in_place(VectorPath::Baseline, &mut want);
    for path in [VectorPath::Avx2, VectorPath::Avx512] {
        let mut got = xs.clone();
        exp_nonpositive_in_place(path, &mut got);
        for ((g, w), x) in got.iter().zip(&want).zip(&xs) {
            assert_eq!(g.to_bits(), w.to_bits(), "{path:?}: e^{x:e}");
        }
    }
}
