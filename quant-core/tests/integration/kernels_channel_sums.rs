use quant_core::__internals::*;
use quant_core::kernels::channel_sums::*;

/// Every path against the scalar chains, on values whose sums depend on their order
/// (large and small magnitudes that cancel), for planes shorter and longer than eight,
/// groups of one to eight channels, and a value that depends on the channel.
#[test]
fn every_path_adds_in_the_reference_order() {
    let mut next = crate::test_rng::xorshift(0x9e37_79b9_7f4a_7c15u64);
    for (images, channels, plane) in [(3, 8, 49), (2, 5, 7), (4, 16, 16), (1, 9, 196)] {
        let planes = Planes {
            images,
            channels,
            plane,
        };
        let data: Vec<f32> = (0..images * channels * plane)
            .map(|_| {
                let r = next();
                let magnitude = [1e-3f32, 1.0, 3e4][(r % 3) as usize];
                ((r >> 8) % 1000) as f32 / 1000.0 * magnitude - magnitude / 2.0
            })
            .collect();
        let shift: Vec<f32> = (0..channels).map(|c| c as f32 * 0.37).collect();
        let value = |c: usize, i: usize| {
            let v = data[i] - shift[c];
            v * v
        };
        let values8 = |c: usize, i: usize| {
            let s: &[f32; 8] = data[i..i + 8].try_into().unwrap();
            s.map(|x| (x - shift[c]) * (x - shift[c]))
        };
        for first in 0..channels {
            for lanes in 1..=GROUP.min(channels - first) {
                let mut expected = vec![0.0; lanes];
                sum_group_portable(planes, first, &mut expected, value);
                // The reference is itself one chain per channel in this order.
                for (j, e) in expected.iter().enumerate() {
                    let mut acc = 0.0f32;
                    for b in 0..images {
                        for k in 0..plane {
                            acc += value(first + j, (b * channels + first + j) * plane + k);
                        }
                    }
                    assert_eq!(acc.to_bits(), e.to_bits());
                }
                let mut dispatched = vec![0.0; lanes];
                sum_group(planes, first, &mut dispatched, value, values8);
                let mut paths = vec![("dispatched", dispatched)];
                #[cfg(target_arch = "x86_64")]
                if std::is_x86_feature_detected!("avx") {
                    let mut avx = vec![0.0; lanes];
                    // SAFETY: the CPU has AVX; `first + lanes <= channels`.
                    unsafe { sum_group_avx(planes, first, &mut avx, value, values8) };
                    paths.push(("avx", avx));
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                for (path, sums) in paths {
                    assert_eq!(
                        bits(&sums),
                        bits(&expected),
                        "{path}: {planes:?}, channels {first}..{}",
                        first + lanes
                    );
                }
            }
        }
    }
}
