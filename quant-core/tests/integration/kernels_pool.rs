use quant_core::__internals::*;
use quant_core::kernels::pool::*;

/// Every path against the one-window-at-a-time reference, on planes full of ties (values
/// from a set of three) and NaNs, with widths that leave a column out, rows shorter and
/// longer than a vector, and batch offsets.
#[test]
fn every_path_picks_what_the_reference_picks() {
    let mut next = crate::test_rng::xorshift(0x2545_f491_4f6c_dd1du64);
    for (rows, cols, width) in [
        (1, 1, 2),
        (2, 3, 7),
        (3, 7, 14),
        (14, 14, 28),
        (2, 8, 16),
        (2, 9, 19),
        (1, 17, 35),
        (4, 16, 33),
    ] {
        let shape = Halving { width, rows, cols };
        for round in 0..40 {
            let src: Vec<f32> = (0..2 * rows * width)
                .map(|_| match next() % 8 {
                    0 => f32::NAN,
                    1 if round % 2 == 0 => -f32::INFINITY,
                    r => (r % 3) as f32 - 1.0,
                })
                .collect();
            let n = rows * cols;
            let base = 1000 * round;
            let (mut y, mut arg) = (vec![0.0; n], vec![0; n]);
            max_pool_2x2_portable(shape, &src, base, &mut y, &mut arg);
            // The reference is itself the scan in row-major order.
            for (o, (&v, &at)) in y.iter().zip(&arg).enumerate() {
                let (oy, ox) = (o / cols, o % cols);
                let window = [0, 1, width, width + 1].map(|d| 2 * oy * width + 2 * ox + d);
                let mut best_at = window[0];
                for &i in &window[1..] {
                    if beats(src[i], src[best_at]) {
                        best_at = i;
                    }
                }
                assert_eq!((at, v.to_bits()), (base + best_at, src[best_at].to_bits()));
            }
            let mut paths: Vec<(&str, Vec<f32>, Vec<usize>)> = Vec::new();
            let (mut y2, mut arg2) = (vec![0.0; n], vec![0; n]);
            max_pool_2x2(shape, &src, base, &mut y2, &mut arg2);
            paths.push(("dispatched", y2, arg2));
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                let (mut y3, mut arg3) = (vec![0.0; n], vec![0; n]);
                // SAFETY: the CPU has AVX2; the sizes are those `check` asks for.
                unsafe { max_pool_2x2_avx2(shape, &src, base, &mut y3, &mut arg3) };
                paths.push(("avx2", y3, arg3));
            }
            let bits = |y: &[f32]| y.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for (path, y2, arg2) in paths {
                assert_eq!(arg2, arg, "{path}, {shape:?}: {src:?}");
                assert_eq!(bits(&y2), bits(&y), "{path}, {shape:?}: {src:?}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "max_pool_2x2")]
fn a_plane_too_narrow_for_its_outputs_is_refused() {
    let shape = Halving {
        width: 5,
        rows: 1,
        cols: 3,
    };
    max_pool_2x2(shape, &[0.0; 10], 0, &mut [0.0; 3], &mut [0; 3]);
}
