use quant_core::__internals::*;

/// The 32-bit form gives the 64-bit form's `exp` for every difference it can be given, at
/// input scales from the finest it takes to the coarsest, where the range reduction's
/// quotient and the polynomial's products reach their extremes.
#[test]
fn exp_in_32_bits_is_the_same_exp() {
    let mut checked = 0;
    for scale in [
        3e-8f32, 1e-7, 2.5e-6, 1e-4, 2e-4, 6.1e-4, 0.0123, 0.04, 0.5, 3.0, 700.0,
    ] {
        let exp = FixedPointExpForms::new(scale, 57);
        let floor = exp.delta_floor();
        // Every difference near 0 and near the floor, and a stride through the rest.
        let stride = (floor.unsigned_abs() / 200_000).max(1) as usize;
        let deltas: Vec<i64> = (floor - 3..=(floor + 70_000).min(0))
            .chain((floor..=0).step_by(stride))
            .chain(-70_000.max(floor)..=0)
            .collect();
        for &delta in &deltas {
            assert_eq!(
                exp.exp_in_32_bits(delta),
                Some(exp.exp(delta)),
                "scale {scale}, difference {delta}"
            );
            checked += 1;
        }
        // The written AVX2 kernel, four differences at a time and a tail of one to three.
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            for tail in 0..4 {
                let deltas = &deltas[tail..];
                let got = exp
                    .exp_in_32_bits_avx2(deltas)
                    .expect("the 32-bit form applies");
                for (delta, got) in deltas.iter().zip(got) {
                    assert_eq!(
                        got,
                        exp.exp(*delta),
                        "AVX2, scale {scale}, difference {delta}"
                    );
                }
            }
        }
    }
    assert!(checked > 1_000_000);
    // Below about 2^-25 the clamped difference leaves i32: the 64-bit form only.
    assert_eq!(FixedPointExpForms::new(1e-9, 57).exp_in_32_bits(0), None);
    assert_eq!(
        FixedPointExpForms::new(1e-9, 57).exp_in_32_bits_avx2(&[0]),
        None
    );
}
