//! The int8 kernels against their definitions, on every instruction-set path this CPU has
//! (paths it lacks are skipped with a note): random shapes (fan-in not a multiple of the
//! vector width, one row, one output channel), extreme codes (0 and 255 activations, ±64,
//! -128/127 and i16 weights, where `vpmaddubsw` would saturate), any zero point and bias, all
//! seven rounding policies. Every path must give the reference's bits.

use std::sync::Once;

use proptest::prelude::*;
use quant_core::int8::{
    add_u8, attention_context_u8, attention_scores_u8, conv_u8, fixed_point_multiplier, gemm_u8,
    im2col_u8, max_pool_u8, requantize_u8, rounding_shift, AttentionShape, CodeMap,
    DepthwiseFilter, Isa, PackedMatrix, Requantizer, SumMap, Window, MAX_SHIFT, PARALLEL_MACS,
};
use quant_core::{QuantError, RoundingPolicy};

const POLICIES: [RoundingPolicy; 7] = [
    RoundingPolicy::HalfEven,
    RoundingPolicy::HalfAwayFromZero,
    RoundingPolicy::HalfUp,
    RoundingPolicy::HalfDown,
    RoundingPolicy::HalfTowardZero,
    RoundingPolicy::Floor,
    RoundingPolicy::Ceil,
];

/// The paths to test: every one this CPU runs; a note for each it cannot.
fn paths() -> Vec<Isa> {
    static NOTE: Once = Once::new();
    NOTE.call_once(|| {
        for isa in Isa::ALL {
            if !isa.is_available() {
                eprintln!("note: this CPU lacks the {isa} path; its int8 tests are skipped");
            }
        }
    });
    Isa::available()
}

/// `bias[o] + Σ (a - a_zero) · w[o][i]`, exactly, then modulo 2^32 (the contract: exact
/// whenever the true value fits i32).
fn gemm_reference(
    a: &[u8],
    m: usize,
    a_zero: i32,
    w: &[i32],
    n: usize,
    k: usize,
    bias: &[i32],
) -> Vec<i32> {
    let mut out = vec![0i32; m * n];
    for r in 0..m {
        for o in 0..n {
            let mut sum = bias[o] as i64;
            for i in 0..k {
                sum += (a[r * k + i] as i64 - a_zero as i64) * w[o * k + i] as i64;
            }
            out[r * n + o] = sum as i32;
        }
    }
    out
}

/// Accumulators (rows of `multipliers.len()` channels) requantized by the definition.
fn requantized_reference(
    acc: &[i32],
    multipliers: &[(i64, u32)],
    zero_point: i32,
    lo: i32,
    hi: i32,
    rounding: RoundingPolicy,
) -> Vec<u8> {
    acc.iter()
        .enumerate()
        .map(|(i, a)| {
            let (m, shift) = multipliers[i % multipliers.len()];
            let r = rounding_reference(*a as i64 * m, shift, rounding);
            (r + zero_point as i64).clamp(lo as i64, hi as i64) as u8
        })
        .collect()
}

/// `round(n / 2^shift)` by `policy` in i128, from the definition of each policy.
fn rounding_reference(n: i64, shift: u32, policy: RoundingPolicy) -> i64 {
    let d = 1i128 << shift;
    let n = n as i128;
    let floor = n.div_euclid(d);
    let rem = n.rem_euclid(d); // n = floor · d + rem, 0 <= rem < d
    let twice = 2 * rem;
    let up = match policy {
        RoundingPolicy::Floor => false,
        RoundingPolicy::Ceil => rem > 0,
        _ if twice != d => twice > d, // not a tie: to the nearest
        RoundingPolicy::HalfEven => floor % 2 != 0,
        RoundingPolicy::HalfUp => true,
        RoundingPolicy::HalfDown => false,
        RoundingPolicy::HalfAwayFromZero => n > 0,
        RoundingPolicy::HalfTowardZero => n < 0,
    };
    (floor + up as i128) as i64
}

fn code() -> impl Strategy<Value = u8> {
    prop_oneof![4 => any::<u8>(), 1 => Just(0u8), 2 => Just(255u8), 1 => Just(127u8), 1 => Just(128u8)]
}

/// Centered weights of one of the three ranges the kernels treat differently.
fn weight(range: u8) -> BoxedStrategy<i32> {
    match range {
        0 => prop_oneof![4 => -64i32..=64, 1 => Just(64), 1 => Just(-64)].boxed(),
        1 => {
            prop_oneof![4 => -128i32..=127, 1 => Just(127), 1 => Just(-128), 1 => Just(65)].boxed()
        }
        _ => prop_oneof![
            4 => -32768i32..=32767,
            1 => Just(32767),
            1 => Just(-32768),
            1 => Just(-129),
            1 => -3i32..=3
        ]
        .boxed(),
    }
}

/// Fixed-point multipliers, with plenty of exact ties: powers of two (scale `2^-j`) and tiny
/// `m` and shifts.
fn multiplier() -> impl Strategy<Value = (i64, u32)> {
    prop_oneof![
        2 => (0i64..1 << 31, 0u32..=MAX_SHIFT),
        2 => (Just(1i64 << 30), 31u32..=36),
        1 => (0i64..8, 0u32..=3),
        1 => (Just((1i64 << 31) - 1), 0u32..=MAX_SHIFT),
    ]
}

/// `(m, n, k, activations, a_zero, weights, bias)`.
type GemmCase = (usize, usize, usize, Vec<u8>, i32, Vec<i32>, Vec<i32>);

fn gemm_case() -> impl Strategy<Value = GemmCase> {
    let dims = (
        prop_oneof![1 => Just(1usize), 3 => 1usize..30],
        prop_oneof![1 => Just(1usize), 1 => Just(10usize), 3 => 1usize..70],
        prop_oneof![1 => Just(0usize), 1 => Just(1usize), 4 => 1usize..150, 1 => Just(144usize)],
        0u8..3,
    );
    dims.prop_flat_map(|(m, n, k, range)| {
        (
            Just(m),
            Just(n),
            Just(k),
            prop::collection::vec(code(), m * k),
            prop_oneof![3 => 0i32..=255, 1 => Just(0), 1 => Just(128), 1 => -1000i32..1000],
            prop::collection::vec(weight(range), n * k),
            prop::collection::vec(prop_oneof![3 => -100_000i32..100_000, 1 => any::<i32>()], n),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn gemm_matches_the_definition_on_every_path((m, n, k, a, a_zero, w, bias) in gemm_case()) {
        let expected = gemm_reference(&a, m, a_zero, &w, n, k, &bias);
        for isa in paths() {
            let packed = PackedMatrix::with_isa(&w, n, k, isa).unwrap();
            prop_assert_eq!(packed.isa(), isa);
            let mut out = vec![i32::MIN; m * n];
            gemm_u8(&a, m, a_zero, &packed, &bias, &mut out).unwrap();
            prop_assert_eq!(&out, &expected, "{} m={} n={} k={}", isa, m, n, k);
        }
    }

    #[test]
    fn requantization_matches_the_definition_on_every_path(
        // Many rows of one channel: a per-tensor requantizer runs them as long vector rows.
        rows in prop_oneof![3 => 1usize..4, 1 => 1usize..700],
        n in prop_oneof![1 => Just(1usize), 3 => 1usize..40],
        seed_acc in prop::collection::vec(prop_oneof![2 => -600i32..600, 2 => -1_000_000i32..1_000_000, 1 => any::<i32>()], 160),
        raw in prop::collection::vec(multiplier(), 40),
        scales in prop::collection::vec(prop_oneof![1e-7f64..20.0, 1e-3f64..1.0], 40),
        from_scales in any::<bool>(),
        zero_point in prop_oneof![6 => 0i32..=255, 2 => -1000i32..1000, 1 => any::<i32>()],
        bounds in prop_oneof![2 => Just((0i32, 255i32)), 1 => (0i32..=255, 0i32..=255)],
        policy in 0usize..7,
    ) {
        let rounding = POLICIES[policy];
        let (lo, hi) = (bounds.0.min(bounds.1), bounds.0.max(bounds.1));
        let acc: Vec<i32> = seed_acc.iter().copied().cycle().take(rows * n).collect();
        let multipliers: Vec<(i64, u32)> = if from_scales {
            scales[..n].iter().map(|s| fixed_point_multiplier(*s).unwrap()).collect()
        } else {
            raw[..n].to_vec()
        };
        let expected = requantized_reference(&acc, &multipliers, zero_point, lo, hi, rounding);
        for isa in paths() {
            let q = Requantizer::new(&multipliers, zero_point, lo, hi, rounding).unwrap().with_isa(isa).unwrap();
            let mut out = vec![7u8; acc.len()];
            q.run(&acc, &mut out).unwrap();
            prop_assert_eq!(&out, &expected, "{} {:?}", isa, rounding);
        }
        let mut out = vec![7u8; acc.len()];
        requantize_u8(&acc, n, &multipliers, zero_point, lo, hi, rounding, &mut out).unwrap();
        prop_assert_eq!(&out, &expected);
    }

    /// A requantizer after a ReLU gives the codes of the ReLU's output on every path, with
    /// zero points below, inside and above the bounds and with an accumulator bound.
    #[test]
    fn requantization_after_a_relu_is_the_relu_then_the_requantization(
        n in prop_oneof![1 => Just(1usize), 3 => 1usize..40],
        seed_acc in prop::collection::vec(prop_oneof![2 => -600i32..600, 2 => -1_000_000i32..1_000_000, 1 => any::<i32>()], 160),
        scales in prop::collection::vec(prop_oneof![1e-7f64..20.0, 1e-3f64..1.0], 40),
        zero_point in prop_oneof![6 => 0i32..=255, 2 => -1000i32..1000],
        bounds in prop_oneof![2 => Just((0i32, 255i32)), 1 => (0i32..=255, 0i32..=255)],
        policy in 0usize..7,
        bound in prop::option::of(1u64..2_000_000),
    ) {
        let rounding = POLICIES[policy];
        let (lo, hi) = (bounds.0.min(bounds.1), bounds.0.max(bounds.1));
        let acc: Vec<i32> = seed_acc.iter().copied().cycle().take(3 * n).collect();
        let relu: Vec<i32> = acc.iter().map(|a| (*a).max(0)).collect();
        let multipliers: Vec<(i64, u32)> = scales[..n].iter().map(|s| fixed_point_multiplier(*s).unwrap()).collect();
        let expected = requantized_reference(&relu, &multipliers, zero_point, lo, hi, rounding);
        for isa in paths() {
            let q = Requantizer::new(&multipliers, zero_point, lo, hi, rounding).unwrap().with_isa(isa).unwrap();
            let q = match bound {
                Some(b) => q.with_accumulator_bound(b),
                None => q,
            };
            let folded = q.after_relu().unwrap();
            prop_assert_eq!(folded.isa(), isa);
            let mut out = vec![7u8; acc.len()];
            folded.run(&acc, &mut out).unwrap();
            prop_assert_eq!(&out, &expected, "{} {:?}", isa, rounding);
        }
    }

    #[test]
    fn rounding_shift_follows_its_definition(n in any::<i64>().prop_map(|v| v >> 2), shift in 0u32..=MAX_SHIFT, policy in 0usize..7) {
        prop_assert_eq!(rounding_shift(n, shift, POLICIES[policy]), rounding_reference(n, shift, POLICIES[policy]));
    }

    #[test]
    fn im2col_and_pooling_match_naive_loops(
        h in 1usize..7,
        w in 1usize..7,
        c in prop_oneof![Just(1usize), Just(3usize), 1usize..20],
        kernel in (1usize..4, 1usize..4),
        stride in (1usize..3, 1usize..3),
        padding in (0usize..3, 0usize..3),
        pad in any::<u8>(),
        seed in any::<u64>(),
    ) {
        let input: Vec<u8> = (0..h * w * c).map(|i| (seed.wrapping_mul(i as u64 + 1) >> 17) as u8).collect();
        let window = Window { kernel: [kernel.0, kernel.1], stride: [stride.0, stride.1], padding: [padding.0, padding.1] };
        let at = |y: isize, x: isize, ch: usize| -> Option<u8> {
            (y >= 0 && x >= 0 && (y as usize) < h && (x as usize) < w).then(|| input[(y as usize * w + x as usize) * c + ch])
        };
        let Some([oh, ow]) = window.output_size(h, w) else {
            let mut out = vec![0u8; 4];
            prop_assert!(im2col_u8(&input, [h, w, c], window, pad, &mut out).is_err());
            return Ok(());
        };
        let row = kernel.0 * kernel.1 * c;
        let mut rows = vec![0u8; oh * ow * row];
        prop_assert_eq!(im2col_u8(&input, [h, w, c], window, pad, &mut rows).unwrap(), [oh, ow]);
        let mut pooled = vec![0u8; oh * ow * c];
        let pooling = max_pool_u8(&input, [h, w, c], window, &mut pooled);
        let pool_ok = padding.0 * 2 <= kernel.0 && padding.1 * 2 <= kernel.1;
        prop_assert_eq!(pooling.is_ok(), pool_ok, "{:?}", pooling);
        for oy in 0..oh {
            for ox in 0..ow {
                for ky in 0..kernel.0 {
                    for kx in 0..kernel.1 {
                        for ch in 0..c {
                            let y = (oy * stride.0 + ky) as isize - padding.0 as isize;
                            let x = (ox * stride.1 + kx) as isize - padding.1 as isize;
                            let got = rows[(oy * ow + ox) * row + (ky * kernel.1 + kx) * c + ch];
                            prop_assert_eq!(got, at(y, x, ch).unwrap_or(pad));
                        }
                    }
                }
                if pool_ok {
                    for ch in 0..c {
                        let mut best = None::<u8>;
                        for ky in 0..kernel.0 {
                            for kx in 0..kernel.1 {
                                let y = (oy * stride.0 + ky) as isize - padding.0 as isize;
                                let x = (ox * stride.1 + kx) as isize - padding.1 as isize;
                                if let Some(v) = at(y, x, ch) {
                                    best = Some(best.map_or(v, |b| b.max(v)));
                                }
                            }
                        }
                        prop_assert_eq!(Some(pooled[(oy * ow + ox) * c + ch]), best);
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// A convolution on every path has the bits of im2col (padded with the zero point's code)
    /// then the reference product: windows read in place from the input (quads, unpadded) or
    /// from a padded copy (codes or `u16`s), with the fan-in of a kernel row whole groups or
    /// not (the patches then, or the weights packed by kernel rows, which the product also
    /// takes), strides, several samples, narrow codes (the `i16` chunks of `vpmaddubsw` across
    /// kernel rows) and weights beyond ±64 and `i8`.
    #[test]
    fn convolution_has_the_bits_of_im2col_then_the_product_on_every_path(
        samples in 1usize..4,
        h in 1usize..7,
        w in 1usize..7,
        c in prop_oneof![Just(1usize), Just(2usize), Just(4usize), Just(16usize), 1usize..20],
        n in prop_oneof![Just(1usize), Just(16usize), Just(33usize), 1usize..40],
        kernel in (1usize..4, 1usize..4),
        stride in (1usize..3, 1usize..3),
        padding in (0usize..3, 0usize..3),
        narrow in any::<bool>(),
        zero_code in 0i32..=255,
        range in 0u8..3,
        seed in any::<u64>(),
    ) {
        let mask: u8 = if narrow { 15 } else { 255 };
        let zero = zero_code & mask as i32;
        let input: Vec<u8> = (0..samples * h * w * c).map(|i| (seed.wrapping_mul(i as u64 + 1) >> 17) as u8 & mask).collect();
        let window = Window { kernel: [kernel.0, kernel.1], stride: [stride.0, stride.1], padding: [padding.0, padding.1] };
        let k = kernel.0 * kernel.1 * c;
        let spread = [129i64, 256, 65536][range as usize];
        let weights: Vec<i32> = (0..n * k)
            .map(|i| ((seed.rotate_left(i as u32 % 64).wrapping_mul(i as u64 * 2 + 1) >> 20) as i64 % spread - spread / 2) as i32)
            .collect();
        let bias: Vec<i32> = (0..n).map(|o| (seed >> (o % 32)) as i32 % 100_000).collect();
        let Some([oh, ow]) = window.output_size(h, w) else {
            let packed = PackedMatrix::new(&weights, n, k).unwrap();
            let mut out = vec![7i32; 4];
            prop_assert!(conv_u8(&input, [samples, h, w, c], window, zero, &packed, &bias, &mut out).is_err());
            prop_assert_eq!(out, vec![7i32; 4]);
            return Ok(());
        };
        let positions = oh * ow;
        let mut patches = vec![0u8; samples * positions * k];
        for (x, p) in input.chunks(h * w * c).zip(patches.chunks_mut(positions * k)) {
            im2col_u8(x, [h, w, c], window, zero as u8, p).unwrap();
        }
        let expected = gemm_reference(&patches, samples * positions, zero, &weights, n, k, &bias);
        for isa in paths() {
            let plain = PackedMatrix::with_isa(&weights, n, k, isa).unwrap();
            // Kernel rows zero-padded to whole groups where they are not: the same matrix.
            let rows = PackedMatrix::for_windows(&weights, n, [kernel.0, kernel.1, c], isa).unwrap();
            for (packing, packed) in [("plain", &plain), ("by kernel rows", &rows)] {
                let mut out = vec![7i32; samples * positions * n];
                let size = conv_u8(&input, [samples, h, w, c], window, zero, packed, &bias, &mut out).unwrap();
                prop_assert_eq!(size, [oh, ow]);
                prop_assert_eq!(&out, &expected, "{} {}", isa, packing);
                let mut product = vec![7i32; out.len()];
                gemm_u8(&patches, samples * positions, zero, packed, &bias, &mut product).unwrap();
                prop_assert_eq!(&product, &expected, "{} {} product", isa, packing);
                // A zero point that is no code cannot pad; nothing is written.
                let mut untouched = vec![7i32; out.len()];
                prop_assert!(conv_u8(&input, [samples, h, w, c], window, 256, packed, &bias, &mut untouched).is_err());
                prop_assert!(untouched.iter().all(|v| *v == 7));
            }
        }
    }

    /// Each channel's window sums from the definition (padding is the real value 0), on every
    /// path; channel counts around the vector widths (8, 16) leave tails.
    #[test]
    fn depthwise_matches_the_definition_on_every_path(
        h in 1usize..7,
        w in 1usize..7,
        c in prop_oneof![Just(1usize), Just(16usize), Just(17usize), 1usize..40],
        kernel in (1usize..4, 1usize..4),
        stride in (1usize..3, 1usize..3),
        padding in (0usize..3, 0usize..3),
        zero in prop_oneof![3 => 0i32..=255, 1 => -1000i32..1000],
        range in 0u8..3,
        seed in any::<u64>(),
    ) {
        let input: Vec<u8> = (0..h * w * c).map(|i| (seed.wrapping_mul(i as u64 + 1) >> 17) as u8).collect();
        let spread = [129i64, 256, 65536][range as usize];
        let weights: Vec<i32> = (0..c * kernel.0 * kernel.1)
            .map(|i| ((seed.rotate_left(i as u32 % 64).wrapping_mul(i as u64 * 2 + 1) >> 20) as i64 % spread - spread / 2) as i32)
            .collect();
        let bias: Vec<i32> = (0..c).map(|ch| (seed >> (ch % 32)) as i32 % 100_000).collect();
        let window = Window { kernel: [kernel.0, kernel.1], stride: [stride.0, stride.1], padding: [padding.0, padding.1] };
        let Some([oh, ow]) = window.output_size(h, w) else {
            let filter = DepthwiseFilter::new(&weights, &bias, c, [kernel.0, kernel.1]).unwrap();
            let mut out = vec![7i32; 4];
            prop_assert!(filter.run(&input, [h, w, c], window, zero, &mut out).is_err());
            prop_assert_eq!(out, vec![7i32; 4]);
            return Ok(());
        };
        let mut expected = vec![0i32; oh * ow * c];
        for oy in 0..oh {
            for ox in 0..ow {
                for ch in 0..c {
                    let mut sum = bias[ch] as i64;
                    for ky in 0..kernel.0 {
                        for kx in 0..kernel.1 {
                            let y = (oy * stride.0 + ky) as isize - padding.0 as isize;
                            let x = (ox * stride.1 + kx) as isize - padding.1 as isize;
                            if y >= 0 && x >= 0 && (y as usize) < h && (x as usize) < w {
                                let a = input[(y as usize * w + x as usize) * c + ch] as i64;
                                sum += (a - zero as i64) * weights[(ch * kernel.0 + ky) * kernel.1 + kx] as i64;
                            }
                        }
                    }
                    expected[(oy * ow + ox) * c + ch] = sum as i32;
                }
            }
        }
        for isa in paths() {
            let filter = DepthwiseFilter::with_isa(&weights, &bias, c, [kernel.0, kernel.1], isa).unwrap();
            let mut out = vec![0i32; oh * ow * c];
            prop_assert_eq!(filter.run(&input, [h, w, c], window, zero, &mut out).unwrap(), [oh, ow]);
            prop_assert_eq!(&out, &expected, "path {}", isa);
        }
    }
}

#[test]
fn saturating_pairs_stay_exact_on_every_path() {
    // 255 · 127 · 2 > 32767: `vpmaddubsw` would saturate on these; 255 · 64 · 2 would not.
    for (w, k) in [
        (127, 64),
        (-128, 64),
        (64, 64),
        (-64, 33),
        (-32768, 17),
        (32767, 3),
    ] {
        let (m, n) = (9, 35);
        let weights = vec![w; n * k];
        let a = vec![255u8; m * k];
        let bias: Vec<i32> = (0..n as i32).collect();
        let expected = gemm_reference(&a, m, 0, &weights, n, k, &bias);
        for isa in paths() {
            let packed = PackedMatrix::with_isa(&weights, n, k, isa).unwrap();
            let mut out = vec![0; m * n];
            gemm_u8(&a, m, 0, &packed, &bias, &mut out).unwrap();
            assert_eq!(out, expected, "{isa} w = {w}, k = {k}");
        }
    }
}

#[test]
fn narrow_products_summed_in_i16_stay_exact_on_every_path() {
    // `vpmaddubsw`'s pair sums are added in `i16` for as many groups of 4 as cannot leave it:
    // `32767 / (2 · top code · max |w|)`. Every activation at the top and every weight at the
    // largest magnitude reach that bound at each chunk's end (15 · 7: 156 groups; 255 · 8: 8;
    // 129 · 63: 2), so one group more per chunk would wrap; 1 group (200 · 64, 255 · 64) is
    // summed in `i32` as before. Fan-ins span several chunks, some not whole groups of 4.
    for (top, w, k) in [
        (15u8, 7, 4 * (2 * 156 + 3)),
        (15, -7, 4 * 157 + 2),
        (255, 8, 4 * 27 + 1),
        (255, -8, 4 * 24),
        (129, 63, 4 * 7 + 2),
        (16, -64, 4 * 31 + 3),
        (200, -64, 4 * 3),
        (255, 64, 4 * 5 + 1),
        (0, 64, 4 * 9),
    ] {
        let (m, n) = (5, 19);
        let weights = vec![w; n * k];
        let a = vec![top; m * k];
        let bias: Vec<i32> = (0..n as i32).map(|o| o * 1000 - 7000).collect();
        for a_zero in [0, top as i32] {
            let expected = gemm_reference(&a, m, a_zero, &weights, n, k, &bias);
            for isa in paths() {
                let packed = PackedMatrix::with_isa(&weights, n, k, isa).unwrap();
                let mut out = vec![i32::MIN; m * n];
                gemm_u8(&a, m, a_zero, &packed, &bias, &mut out).unwrap();
                assert_eq!(out, expected, "{isa} top = {top}, w = {w}, k = {k}");
            }
        }
    }
}

#[test]
fn large_products_split_across_threads_give_the_same_integers() {
    // The shapes of the benchmarks: the digits MLP's hidden layer and a CNN's im2col rows.
    for (m, n, k) in [(360, 256, 256), (64 * 64, 32, 144), (333, 70, 199)] {
        assert!(m * n * k >= PARALLEL_MACS, "{m}x{n}x{k} should be split");
        let a: Vec<u8> = (0..m * k).map(|i| (i * 7919 % 256) as u8).collect();
        let w: Vec<i32> = (0..n * k)
            .map(|i| (i * 104_729 % 255) as i32 - 127)
            .collect();
        let bias: Vec<i32> = (0..n).map(|o| o as i32 * 1000 - 5000).collect();
        let expected = gemm_reference(&a, m, 3, &w, n, k, &bias);
        for isa in paths() {
            let packed = PackedMatrix::with_isa(&w, n, k, isa).unwrap();
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut out = vec![0; m * n];
                pool.install(|| gemm_u8(&a, m, 3, &packed, &bias, &mut out))
                    .unwrap();
                assert!(out == expected, "{isa} {m}x{n}x{k} on {threads} threads");
            }
        }
    }
}

#[test]
fn bad_arguments_are_errors_that_write_nothing() {
    let w = PackedMatrix::new(&[1, 2, 3, 4, 5, 6], 2, 3).unwrap();
    assert_eq!((w.n(), w.k()), (2, 3));
    assert_eq!(w.row_sums(), &[6, 15]);
    assert_eq!(w.isa(), Isa::detected());
    assert!(Isa::available().contains(&Isa::Portable));
    assert!(Isa::detected().is_available());
    let mut out = [7i32; 4];
    for (a, bias, out_len) in [
        (&[1u8; 5][..], &[0, 0][..], 4),
        (&[1u8; 6][..], &[0][..], 4),
        (&[1u8; 6][..], &[0, 0][..], 3),
    ] {
        let err = gemm_u8(a, 2, 0, &w, bias, &mut out[..out_len]).unwrap_err();
        assert!(matches!(err, QuantError::LengthMismatch { .. }), "{err}");
        assert_eq!(out, [7; 4]);
    }
    let err = PackedMatrix::new(&[1, 40_000], 1, 2).unwrap_err();
    assert!(err.to_string().contains("[0][1]"), "{err}");
    assert!(PackedMatrix::new(&[1, 2, 3], 2, 2).is_err());
    assert!(PackedMatrix::new(&[], usize::MAX, 2).is_err());
    for isa in Isa::ALL.into_iter().filter(|i| !i.is_available()) {
        let err = PackedMatrix::with_isa(&[1], 1, 1, isa).unwrap_err();
        assert!(err.to_string().contains(isa.name()), "{err}");
        assert!(
            Requantizer::new(&[(1 << 30, 31)], 0, 0, 255, RoundingPolicy::HalfEven)
                .unwrap()
                .with_isa(isa)
                .is_err()
        );
    }

    // Depthwise: filters that do not match their channels or kernel, and runs whose input,
    // window or output does not match the filter.
    assert!(DepthwiseFilter::new(&[1, 2, 3], &[0, 0], 2, [1, 2]).is_err());
    assert!(DepthwiseFilter::new(&[1, 2, 3, 4], &[0], 2, [1, 2]).is_err());
    assert!(DepthwiseFilter::new(&[], &[], 0, [1, 1]).is_err());
    let dw = DepthwiseFilter::new(&[1, 2, 3, 4], &[0, 0], 2, [1, 2]).unwrap();
    let window = Window {
        kernel: [1, 2],
        stride: [1, 1],
        padding: [0, 0],
    };
    let mut acc = [7i32; 2];
    for (input, shape, window, out_len) in [
        (&[1u8; 3][..], [1, 2, 2], window, 2),
        (&[1u8; 6][..], [1, 2, 3], window, 2),
        (&[1u8; 4][..], [1, 2, 2], Window::square(2, 1, 0), 2),
        (
            &[1u8; 4][..],
            [1, 2, 2],
            Window {
                stride: [0, 1],
                ..window
            },
            2,
        ),
        (&[1u8; 4][..], [1, 2, 2], window, 1),
    ] {
        let err = dw.run(input, shape, window, 0, &mut acc[..out_len]);
        assert!(err.is_err(), "{shape:?} {window:?} {out_len}");
        assert_eq!(acc, [7; 2]);
    }
    for isa in Isa::ALL.into_iter().filter(|i| !i.is_available()) {
        assert!(DepthwiseFilter::with_isa(&[1], &[0], 1, [1, 1], isa).is_err());
    }

    let m = fixed_point_multiplier(0.5).unwrap();
    let mut codes = [9u8; 4];
    let half_even = RoundingPolicy::HalfEven;
    assert!(requantize_u8(&[1, 2, 3, 4], 3, &[m; 3], 0, 0, 255, half_even, &mut codes).is_err());
    assert!(requantize_u8(&[1, 2, 3, 4], 2, &[m; 3], 0, 0, 255, half_even, &mut codes).is_err());
    assert!(requantize_u8(
        &[1, 2, 3, 4],
        2,
        &[m; 2],
        0,
        0,
        255,
        half_even,
        &mut codes[..3]
    )
    .is_err());
    assert!(requantize_u8(&[1, 2, 3, 4], 2, &[m; 2], 0, 10, 5, half_even, &mut codes).is_err());
    assert!(requantize_u8(&[1, 2, 3, 4], 2, &[m; 2], 0, 0, 256, half_even, &mut codes).is_err());
    assert!(requantize_u8(
        &[1, 2, 3, 4],
        2,
        &[(1 << 31, 31); 2],
        0,
        0,
        255,
        half_even,
        &mut codes
    )
    .is_err());
    assert!(requantize_u8(
        &[1, 2, 3, 4],
        2,
        &[(1 << 30, 63); 2],
        0,
        0,
        255,
        half_even,
        &mut codes
    )
    .is_err());
    assert_eq!(codes, [9; 4]);
    requantize_u8(
        &[1, 2, 3, -5],
        2,
        &[m; 2],
        10,
        0,
        255,
        half_even,
        &mut codes,
    )
    .unwrap();
    assert_eq!(codes, [10, 11, 12, 8]); // 0.5 → 0, 1.5 → 2, -2.5 → -2: ties to even

    let mut rows = [0u8; 4];
    assert!(im2col_u8(&[1, 2, 3], [2, 2, 1], Window::square(2, 1, 0), 0, &mut rows).is_err());
    assert!(im2col_u8(
        &[1, 2, 3, 4],
        [2, 2, 1],
        Window::square(3, 1, 0),
        0,
        &mut rows
    )
    .is_err());
    assert!(im2col_u8(
        &[1, 2, 3, 4],
        [2, 2, 1],
        Window::square(2, 0, 0),
        0,
        &mut rows
    )
    .is_err());
    assert!(im2col_u8(
        &[1, 2, 3, 4],
        [2, 2, 1],
        Window::square(2, 1, 0),
        0,
        &mut rows[..3]
    )
    .is_err());
    assert_eq!(rows, [0; 4]);
    assert!(max_pool_u8(&[1, 2, 3, 4], [2, 2, 1], Window::square(2, 2, 2), &mut rows).is_err());
}

/// The residual add's sums, on the widest path this CPU runs (vectorized by the compiler;
/// lengths around the vector widths, so tails are covered), against their definition, with
/// the extreme codes and offsets near the ends of `i32` (where the sums wrap).
#[test]
fn residual_add_of_codes_is_the_definition() {
    let codes: Vec<u8> = (0..=255u8).chain([0, 255, 255, 0, 1, 254]).collect();
    for offset in [
        0,
        -2 * 128,
        -510,
        510,
        i32::MAX - 255,
        i32::MIN + 3,
        i32::MAX,
    ] {
        for len in [0, 1, 7, 8, 15, 16, 31, 33, 63, 64, 65, 129, codes.len()] {
            let x = &codes[..len];
            let y: Vec<u8> = x.iter().rev().map(|c| c.wrapping_mul(7)).collect();
            let expected: Vec<i32> = x
                .iter()
                .zip(&y)
                .map(|(p, q)| (*p as i32 + *q as i32).wrapping_add(offset))
                .collect();
            assert_eq!(
                add_u8(x, &y, offset).unwrap(),
                expected,
                "{len} codes, {offset}"
            );
        }
    }
    assert!(matches!(
        add_u8(&[1, 2], &[1], 0),
        Err(QuantError::LengthMismatch { .. })
    ));
}

/// A code map on every path gives its table's value for every byte (codes outside its input
/// range as the nearest end): input ranges of one code, of 16 (the widest the byte shuffle
/// holds, at both ends of the bytes), of 17 and of all 256 (the table read code by code), each
/// byte in lengths around the vector widths so that the tails are covered.
#[test]
fn code_maps_give_their_table_on_every_path() {
    let codes: Vec<u8> = (0..=255u8).rev().chain((0..=255u8).step_by(3)).collect();
    for (lo, hi) in [
        (0u8, 0u8),
        (7, 7),
        (0, 15),
        (120, 135),
        (240, 255),
        (3, 19),
        (0, 255),
    ] {
        let outputs: Vec<u8> = (lo..=hi)
            .map(|c| c.wrapping_mul(37).wrapping_add(11))
            .collect();
        let at = |c: u8| outputs[(c.clamp(lo, hi) - lo) as usize];
        for isa in paths() {
            let map = CodeMap::new(lo..=hi, &outputs)
                .unwrap()
                .with_isa(isa)
                .unwrap();
            for len in [0, 1, 15, 31, 32, 33, 63, 64, 65, 127, 129, codes.len()] {
                let x = &codes[..len];
                let mut out = vec![0u8; len];
                map.run(x, &mut out).unwrap();
                let expected: Vec<u8> = x.iter().map(|c| at(*c)).collect();
                assert_eq!(out, expected, "{isa:?}, inputs {lo}..={hi}, {len} codes");
            }
            assert_eq!(map.get(255), at(255));
        }
    }
    assert!(matches!(
        CodeMap::new(0..=3, &[1, 2, 3]),
        Err(QuantError::LengthMismatch { .. })
    ));
    #[allow(clippy::reversed_empty_ranges)]
    let empty = CodeMap::new(4..=3, &[]);
    assert!(matches!(empty, Err(QuantError::InvalidRange { .. })));
    let map = CodeMap::new(0..=1, &[5, 6]).unwrap();
    let mut short = [0u8; 1];
    assert!(matches!(
        map.run(&[0, 1], &mut short),
        Err(QuantError::LengthMismatch { .. })
    ));
    assert_eq!(short, [0], "nothing written");
}

/// A sum map on every path gives its table's value at the sum of the two codes, each clamped
/// into its grid: grids of one code, of 16 (the byte shuffles, at both ends of the bytes,
/// where the stored sums would not fit a byte), of 17 and of 256, lengths around the vector
/// widths.
#[test]
fn sum_maps_give_their_table_on_every_path() {
    let x: Vec<u8> = (0..=255u8).chain((0..=255u8).step_by(5)).collect();
    let y: Vec<u8> = x
        .iter()
        .map(|c| c.wrapping_mul(91).wrapping_add(7))
        .collect();
    for (lo, hi) in [
        (0u8, 0u8),
        (0, 15),
        (120, 135),
        (240, 255),
        (3, 19),
        (0, 255),
    ] {
        let sums = 2 * (hi - lo) as usize + 1;
        let outputs: Vec<u8> = (0..sums)
            .map(|k| (k as u8).wrapping_mul(53).wrapping_add(lo))
            .collect();
        let at = |p: u8, q: u8| {
            outputs[(p.clamp(lo, hi) - lo) as usize + (q.clamp(lo, hi) - lo) as usize]
        };
        for isa in paths() {
            let map = SumMap::new(lo..=hi, &outputs)
                .unwrap()
                .with_isa(isa)
                .unwrap();
            for len in [0, 1, 31, 32, 33, 63, 64, 65, 129, x.len()] {
                let mut out = vec![0u8; len];
                map.run(&x[..len], &y[..len], &mut out).unwrap();
                let expected: Vec<u8> = x[..len].iter().zip(&y).map(|(p, q)| at(*p, *q)).collect();
                assert_eq!(out, expected, "{isa:?}, codes {lo}..={hi}, {len} codes");
            }
        }
    }
    assert!(matches!(
        SumMap::new(0..=3, &[1, 2, 3, 4]),
        Err(QuantError::LengthMismatch { .. })
    ));
    let map = SumMap::new(0..=1, &[5, 6, 7]).unwrap();
    let mut out = [0u8; 2];
    assert!(matches!(
        map.run(&[0, 1], &[1], &mut out),
        Err(QuantError::LengthMismatch { .. })
    ));
    assert_eq!(out, [0, 0], "nothing written");
}

#[test]
fn fixed_point_multipliers_are_accurate() {
    for m in [0.5, 0.75, 1.0, 3.0e-4, 0.123456789, 1234.5, 1e-12] {
        let (q, shift) = fixed_point_multiplier(m).unwrap();
        assert!(shift <= MAX_SHIFT);
        assert!((0..1i64 << 31).contains(&q));
        let back = q as f64 / 2f64.powi(shift as i32);
        assert!(
            ((back - m) / m).abs() < 1e-9 || m < 1e-10,
            "{m}: {q} >> {shift} = {back}"
        );
    }
    assert!(fixed_point_multiplier(0.0).is_err());
    assert!(fixed_point_multiplier(f64::NAN).is_err());
    assert!(fixed_point_multiplier(1e12).is_err());
}

#[test]
fn requantization_ties_on_every_path() {
    // Every accumulator from -700 to 700 against multipliers that make exact ties common:
    // 2^-j scales (m = 2^30, shift 31 + j) and small m with small shifts (0 included), in
    // rows of 40 channels (32 vectorised on AVX-512, 40 on AVX2).
    let n = 40;
    let multipliers: Vec<(i64, u32)> = (0..n)
        .map(|o| match o % 4 {
            0 | 1 => (1i64 << 30, 31 + (o as u32 / 4) % 7),
            2 => (3 + o as i64 % 5, (o as u32 / 4) % 4),
            _ => (((1i64 << 31) - 1) - o as i64, 33),
        })
        .collect();
    let acc: Vec<i32> = (-700..700)
        .flat_map(|a| [a; 40])
        .map(|a: i32| a * 7 % 701)
        .collect();
    ties_on_every_path(&multipliers, &acc);
}

#[test]
fn requantization_below_one_ties_and_extremes_on_every_path() {
    // Every shift at least 31 (multipliers below 1, the AVX2 path's 32-bit form): ties from
    // 2^-j scales, the largest m at the smallest and the largest shift, and the extreme
    // accumulators, whose quotients reach the ends of `i32`.
    let n = 40;
    let multipliers: Vec<(i64, u32)> = (0..n)
        .map(|o| match o % 5 {
            0 | 1 => (1i64 << 30, 31 + (o as u32 / 5) % 8),
            2 => ((1i64 << 31) - 1, 31),
            3 => ((1i64 << 31) - 1 - o as i64, 62),
            _ => (1 + o as i64, 40),
        })
        .collect();
    let acc: Vec<i32> = (-700..700)
        .map(|a: i32| a * 7 % 701)
        .chain([
            i32::MIN,
            i32::MIN + 1,
            i32::MAX,
            i32::MAX - 1,
            -(1 << 30),
            1 << 30,
        ])
        .flat_map(|a| [a; 40])
        .collect();
    ties_on_every_path(&multipliers, &acc);
}

#[test]
fn requantization_a_hair_from_ties_and_integers_on_every_path() {
    // Products whose quotient lies within 2^-s of a tie or an integer. Products of 53 and 54
    // bits at shifts 44 to 47: the AVX2 and AVX-512 paths that multiply in `f64` are exact up
    // to shift 45 for these bounds (a 53-bit product is exact; a 54-bit one may round onto the
    // tie), so they must hand shifts 46 and 47 to the integer paths. For each shift, odd m
    // near 2^(s - 24) and the one accumulator in [2^30, 2^31) with `acc · m ≡ target (mod 2^s)`
    // where there is one (quotients 64..256).
    let mut multipliers = Vec::new();
    let mut acc = Vec::new();
    for shift in 44u32..=47 {
        let modulus = 1u64 << shift;
        for target in [modulus / 2, 0] {
            for offset in [-2i64, -1, 1, 2] {
                let wanted = (target as i64 + offset).rem_euclid(modulus as i64) as u64;
                let mut found = 0;
                let mut m = (1u64 << (shift - 24)) + 1;
                while found < 2 && m < 1 << (shift - 23) {
                    // m⁻¹ mod 2^64 by Newton's iteration (m odd), then the accumulator.
                    let mut inverse = m;
                    for _ in 0..5 {
                        inverse = inverse.wrapping_mul(2u64.wrapping_sub(m.wrapping_mul(inverse)));
                    }
                    let a = wanted.wrapping_mul(inverse) & (modulus - 1);
                    if (1 << 30..1 << 31).contains(&a) {
                        multipliers.push((m as i64, shift));
                        acc.push(a as i32);
                        found += 1;
                    }
                    m += 2;
                }
                assert_eq!(found, 2, "shift {shift}, offset {offset}");
            }
        }
    }
    // Products of 61 bits, (2^30 + c)(2^30 - c) = 2^60 - c², at shifts 58 to 61 (the W4A4
    // digits ViT has requantizers at shifts 55 to 58): quotients a hair below 4, 2, 1 and the
    // tie 0.5 (above -4, -2, -1 and -0.5 with the negative accumulators), which an `f64`
    // product would round onto.
    for shift in 58u32..=61 {
        for c in 1..=3 {
            let (a, m) = ((1i64 << 30) + c, (1i64 << 30) - c);
            assert_eq!(
                a as f64 * (m as f64 * 2f64.powi(-(shift as i32))),
                2f64.powi(60 - shift as i32),
                "the f64 product rounds onto the tie or integer"
            );
            multipliers.push((m, shift));
            acc.push(a as i32);
        }
    }
    // One requantizer per case (its channel), for positive and negative accumulators.
    for sign in [1, -1] {
        for ((m, shift), a) in multipliers.iter().zip(&acc) {
            let (zero_point, lo, hi) = if sign > 0 { (0, 0, 255) } else { (255, 0, 255) };
            let a = sign * a;
            for rounding in POLICIES {
                let r = rounding_reference(a as i64 * m, *shift, rounding);
                let expected = (r + zero_point as i64).clamp(lo as i64, hi as i64) as u8;
                for isa in paths() {
                    let q = Requantizer::new(&[(*m, *shift)], zero_point, lo, hi, rounding)
                        .unwrap()
                        .with_isa(isa)
                        .unwrap();
                    // A whole vector of the same value, so that every path runs its vectors.
                    let mut out = vec![0u8; 64];
                    q.run(&[a; 64], &mut out).unwrap();
                    assert!(
                        out.iter().all(|c| *c == expected),
                        "{isa} {rounding:?}: {a} · {m} / 2^{shift} gave {out:?}, expected {expected}"
                    );
                }
            }
        }
    }
}

#[test]
fn per_channel_requantization_with_a_few_tiny_multipliers_on_every_path() {
    // A channel of a tiny weight scale has a shift beyond the `f64` path's reach, which the
    // other channels' requantization must not take it onto, with or without a bound on the
    // accumulators: `1_263_665_316 · 1_824_726_041 = 2^61 + 4`, so at a shift of 62 the
    // quotient is `0.5 + 2^-60`, which rounds up, but its `f64` product is `0.5`, which rounds
    // to even.
    let tiny = (1_824_726_041i64, 62u32);
    let hard = 1_263_665_316i32;
    let normal = |c: usize| (1_073_741_824 + 40_000_000 * c as i64, 30 + (c % 8) as u32);
    for tiny_channels in [vec![5], vec![0, 15], vec![1, 2, 3]] {
        let multipliers: Vec<(i64, u32)> = (0..16)
            .map(|c| {
                if tiny_channels.contains(&c) {
                    tiny
                } else {
                    normal(c)
                }
            })
            .collect();
        // Rows of 16 channels: the hard values and their neighbours in every channel, then
        // a spread.
        let mut acc = Vec::new();
        for a in [
            hard,
            -hard,
            hard - 1,
            hard + 1,
            -hard + 1,
            0,
            1,
            -1,
            i32::MAX,
            i32::MIN,
        ] {
            acc.extend(std::iter::repeat_n(a, 16));
        }
        acc.extend((0..16 * 40).map(|i: i64| ((i * 2_654_435_761) % (1 << 32) - (1 << 31)) as i32));
        for rounding in POLICIES {
            let expected = requantized_reference(&acc, &multipliers, 7, 0, 15, rounding);
            for isa in paths() {
                for bound in [None, Some(1000u64), Some(1 << 31)] {
                    let q = Requantizer::new(&multipliers, 7, 0, 15, rounding)
                        .unwrap()
                        .with_isa(isa)
                        .unwrap();
                    let q = match bound {
                        Some(b) => q.with_accumulator_bound(b),
                        None => q,
                    };
                    let mut out = vec![0u8; acc.len()];
                    q.run(&acc, &mut out).unwrap();
                    assert_eq!(
                        out, expected,
                        "{isa} {rounding:?}, tiny channels {tiny_channels:?}, bound {bound:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn per_tensor_requantization_into_narrow_grids_on_every_path() {
    // A per-tensor requantizer into at most 16 codes runs by thresholds on AVX-512, and on
    // AVX2 where the `f64` path is not exact (large shifts, far zero points): every policy,
    // shifts from 0 to 62 (54 to 57 are LayerNorm's and GELU's outputs into 4-bit grids),
    // grids of 1 to 16 codes at both ends of `u8` with zero points inside, beside and
    // far from them, and accumulators at every rounding boundary (integers and halves of the
    // quotient) and one either side, the extremes and a spread between.
    let multipliers = [
        (1i64 << 30, 0u32),
        (3, 1),
        ((1i64 << 31) - 1, 31),
        (1 << 30, 33),
        (1_234_567_891, 40),
        ((1i64 << 31) - 1, 49),
        (1_518_500_250, 54),
        (1_073_741_825, 55),
        (2_147_000_001, 56),
        (1_500_000_001, 57),
        ((1i64 << 31) - 1, 62),
        (0, 40),
    ];
    let grids = [
        (0, 15, 7),
        (0, 15, 8),
        (240, 255, 248),
        (100, 100, 100),
        (3, 4, 0),
        (0, 1, 255),
    ];
    let zero_shifts = [0i64, -9, 9, 1000, i32::MIN as i64, i32::MAX as i64];
    for (m, shift) in multipliers {
        for (lo, hi, zero) in grids {
            for zero_shift in zero_shifts {
                let zero_point =
                    (zero as i64 + zero_shift).clamp(i32::MIN as i64, i32::MAX as i64) as i32;
                // Quotients `j / 2` for every `j` whose code lies in the grid or next to it.
                let mut acc = vec![i32::MIN, i32::MIN + 1, -1, 0, 1, i32::MAX - 1, i32::MAX];
                for half_steps in 2 * (lo as i64 - zero_point as i64 - 2)
                    ..=2 * (hi as i64 - zero_point as i64 + 2)
                {
                    if m == 0 {
                        break;
                    }
                    let at = (half_steps as i128) * (1i128 << shift) / 2 / m as i128;
                    for a in at - 2..=at + 2 {
                        acc.push(a.clamp(i32::MIN as i128, i32::MAX as i128) as i32);
                    }
                }
                acc.extend(
                    (0..200).map(|i: i64| ((i * 2_654_435_761) % (1 << 32) - (1 << 31)) as i32),
                );
                // Whole vectors of 16 (a per-tensor requantizer runs rows of 256 values).
                let acc: Vec<i32> = acc
                    .iter()
                    .copied()
                    .cycle()
                    .take(acc.len().next_multiple_of(256))
                    .collect();
                for rounding in POLICIES {
                    let expected =
                        requantized_reference(&acc, &[(m, shift)], zero_point, lo, hi, rounding);
                    for isa in paths() {
                        let q = Requantizer::new(&[(m, shift)], zero_point, lo, hi, rounding)
                            .unwrap()
                            .with_isa(isa)
                            .unwrap();
                        let mut out = vec![0u8; acc.len()];
                        q.run(&acc, &mut out).unwrap();
                        for (i, (got, want)) in out.iter().zip(&expected).enumerate() {
                            assert_eq!(
                                got, want,
                                "{isa} {rounding:?}: {} · {m} / 2^{shift}, zero point {zero_point}, grid [{lo}, {hi}]",
                                acc[i]
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn requantization_within_an_accumulator_bound_on_every_path() {
    // Shifts from 50 to 62, beyond the `f64` paths' general reach, which a bound of 2^22 - 1
    // (times m < 2^31: products below 2^53) brings within it: m = 2^30 at shifts 50 to 52
    // puts exact ties at multiples of 2^19 to 2^21. Accumulators within the bound, at it,
    // then rows with one beyond it (which the `f64` paths would get wrong: they must hand the
    // row to the integer paths), and a bound too large to qualify.
    let bound: i32 = (1 << 22) - 1;
    let multipliers: Vec<(i64, u32)> = (0..24u32)
        .map(|o| match o % 3 {
            0 => (1i64 << 30, 50 + o / 3 % 3),
            1 => ((1i64 << 31) - 1 - 2 * o as i64, 53 + o / 3),
            _ => (1_518_500_249 + 2 * o as i64, 50 + o / 2),
        })
        // m = 2^30 - c at shifts 58 to 61: with the accumulator 2^30 + c beyond the bound,
        // quotients a hair below 4, 2, 1 and the tie 0.5, which an `f64` product rounds onto.
        .chain((1..=3).flat_map(|c| (58..=61).map(move |s| ((1i64 << 30) - c, s))))
        .collect();
    let n = multipliers.len();
    let mut within: Vec<i32> = vec![0, 1, -1, bound, -bound, bound - 1, 1 - bound];
    for j in 17..=21 {
        for odd in [1, 3, 5, 7] {
            for d in -1..=1 {
                let a = (odd << j) + d;
                within.extend([a, -a]);
            }
        }
    }
    within.extend(
        (0..40).map(|i: i64| ((i * 2_654_435_761) % (2 * bound as i64) - bound as i64) as i32),
    );
    let hairs = (1..=3).flat_map(|c| [(1 << 30) + c, -(1 << 30) - c]);
    let beyond: Vec<i32> = [bound + 1, -bound - 1, i32::MAX, i32::MIN]
        .into_iter()
        .chain(hairs)
        .collect();
    for rounding in POLICIES {
        for (zero_point, lo, hi) in [(8, 0, 15), (128, 0, 255), (0, 0, 255)] {
            let cases: [(Vec<i32>, u64); 3] = [
                (within.clone(), bound as u64),
                (
                    within.iter().chain(&beyond).copied().collect(),
                    bound as u64,
                ),
                (within.iter().chain(&beyond).copied().collect(), 1 << 23),
            ];
            for (values, claimed) in cases {
                let acc: Vec<i32> = values.iter().flat_map(|a| vec![*a; n]).collect();
                let expected =
                    requantized_reference(&acc, &multipliers, zero_point, lo, hi, rounding);
                for isa in paths() {
                    let q = Requantizer::new(&multipliers, zero_point, lo, hi, rounding)
                        .unwrap()
                        .with_isa(isa)
                        .unwrap()
                        .with_accumulator_bound(claimed);
                    let mut out = vec![0u8; acc.len()];
                    q.run(&acc, &mut out).unwrap();
                    for (i, (got, want)) in out.iter().zip(&expected).enumerate() {
                        let (m, shift) = multipliers[i % n];
                        assert_eq!(
                            got, want,
                            "{isa} {rounding:?} bound {claimed}: {} · {m} / 2^{shift}, zero point {zero_point}",
                            acc[i]
                        );
                    }
                }
            }
        }
    }
}

/// Every rounding policy and a few zero points and bounds on every path against the
/// definition.
fn ties_on_every_path(multipliers: &[(i64, u32)], acc: &[i32]) {
    for rounding in POLICIES {
        // The last four: zero points at the ends of the AVX2 32-bit path's range
        // (±(2^30 - 1)) and of `i32`, beyond it (the 64-bit lanes).
        for (zero_point, lo, hi) in [
            (128, 0, 255),
            (0, 0, 255),
            (200, 150, 220),
            ((1 << 30) - 1, 0, 255),
            (1 - (1 << 30), 0, 255),
            (i32::MAX, 0, 255),
            (i32::MIN, 0, 255),
        ] {
            let expected = requantized_reference(acc, multipliers, zero_point, lo, hi, rounding);
            for isa in paths() {
                let q = Requantizer::new(multipliers, zero_point, lo, hi, rounding)
                    .unwrap()
                    .with_isa(isa)
                    .unwrap();
                let mut out = vec![0u8; acc.len()];
                q.run(acc, &mut out).unwrap();
                assert!(
                    out == expected,
                    "{isa} {rounding:?} zero point {zero_point}"
                );
            }
        }
    }
}

/// Attention's products by their definitions: scores `[heads, s1, s2]` and context `[s1, f]`
/// per sample.
fn attention_reference(
    q: &[u8],
    k: &[u8],
    p: &[u8],
    shape: AttentionShape,
    zeros: [i32; 4],
) -> (Vec<i32>, Vec<i32>) {
    let AttentionShape {
        queries: s1,
        keys: s2,
        features: f,
        heads,
    } = shape;
    let d = f / heads;
    let n = q.len() / (s1 * f);
    let (mut scores, mut context) = (vec![0i32; n * heads * s1 * s2], vec![0i32; n * s1 * f]);
    for b in 0..n {
        for h in 0..heads {
            for i in 0..s1 {
                for j in 0..s2 {
                    let mut sum = 0;
                    for c in h * d..(h + 1) * d {
                        let a = q[(b * s1 + i) * f + c] as i32 - zeros[0];
                        let w = k[(b * s2 + j) * f + c] as i32 - zeros[1];
                        sum += a * w;
                    }
                    scores[((b * heads + h) * s1 + i) * s2 + j] = sum;
                }
                for c in h * d..(h + 1) * d {
                    let mut sum = 0;
                    for j in 0..s2 {
                        let w = p[((b * heads + h) * s1 + i) * s2 + j] as i32 - zeros[2];
                        sum += w * (k[(b * s2 + j) * f + c] as i32 - zeros[3]);
                    }
                    context[(b * s1 + i) * f + c] = sum;
                }
            }
        }
    }
    (scores, context)
}

/// Both products of attention (the keys serve as values) on every path against
/// [`attention_reference`].
fn attention_on_every_path(
    q: &[u8],
    k: &[u8],
    p: &[u8],
    shape: AttentionShape,
    zeros: [i32; 4],
) -> Result<(), TestCaseError> {
    let (scores, context) = attention_reference(q, k, p, shape, zeros);
    for isa in paths() {
        let mut got = vec![7i32; scores.len()];
        attention_scores_u8(isa, q, k, shape, [zeros[0], zeros[1]], &mut got).unwrap();
        prop_assert_eq!(&got, &scores, "scores on {}", isa);
        let mut got = vec![7i32; context.len()];
        attention_context_u8(isa, p, k, shape, [zeros[2], zeros[3]], &mut got).unwrap();
        prop_assert_eq!(&got, &context, "context on {}", isa);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Both products of attention (the keys serve as values) on every path.
    #[test]
    fn attention_products_match_the_definition_on_every_path(
        (shape, q, k, p) in (1usize..=3, 1usize..=20, 1usize..=20, 1usize..=4, 1usize..=24)
            .prop_flat_map(|(n, s1, s2, heads, d)| {
                let shape = AttentionShape { queries: s1, keys: s2, features: heads * d, heads };
                (
                    Just(shape),
                    proptest::collection::vec(code(), n * s1 * heads * d),
                    proptest::collection::vec(code(), n * s2 * heads * d),
                    proptest::collection::vec(code(), n * heads * s1 * s2),
                )
            }),
        zeros in proptest::array::uniform4(0i32..=255),
    ) {
        attention_on_every_path(&q, &k, &p, shape, zeros)?;
    }
}

/// The largest centered codes (±255, every product ±65025) in every pairing of signs, with
/// odd and even head widths and key counts, on every path.
#[test]
fn attention_products_at_the_extreme_codes_on_every_path() {
    for (keys, heads, d) in [(16, 4, 12), (17, 3, 9), (1, 1, 1), (40, 2, 33)] {
        let shape = AttentionShape {
            queries: 5,
            keys,
            features: heads * d,
            heads,
        };
        let f = heads * d;
        // Codes 0 and 255 alternating in a pattern that differs between the inputs.
        let codes = |n: usize, period: usize| -> Vec<u8> {
            (0..n)
                .map(|i| {
                    if (i / period).is_multiple_of(2) {
                        0
                    } else {
                        255
                    }
                })
                .collect()
        };
        let q = codes(5 * f, 3);
        let k = codes(keys * f, 2);
        let p = codes(heads * 5 * keys, 5);
        for zeros in [[255, 0, 255, 0], [0, 255, 0, 255], [255, 255, 0, 0]] {
            let (scores, context) = attention_reference(&q, &k, &p, shape, zeros);
            for isa in paths() {
                let mut got = vec![7i32; scores.len()];
                attention_scores_u8(isa, &q, &k, shape, [zeros[0], zeros[1]], &mut got).unwrap();
                assert_eq!(got, scores, "scores on {isa}, {shape:?}, zeros {zeros:?}");
                let mut got = vec![7i32; context.len()];
                attention_context_u8(isa, &p, &k, shape, [zeros[2], zeros[3]], &mut got).unwrap();
                assert_eq!(got, context, "context on {isa}, {shape:?}, zeros {zeros:?}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Both products on narrow grids, whose centered codes the int8 product's tiles take
    /// (`width` codes from `lo`, zero points inside the grid: 16 codes always fit, 65 fit the
    /// paths without VNNI, 129 and 256 only sometimes), against the definition on every path;
    /// the queries' and probabilities' codes span the bytes.
    #[test]
    fn attention_products_on_narrow_grids_match_the_definition_on_every_path(
        (shape, q, k, p, zeros) in (1usize..=3, 1usize..=20, 1usize..=20, 1usize..=4, 1usize..=24,
                                    prop_oneof![Just(16usize), Just(65), Just(129), Just(256)])
            .prop_flat_map(|(n, s1, s2, heads, d, width)| {
                let shape = AttentionShape { queries: s1, keys: s2, features: heads * d, heads };
                (0..=256 - width).prop_flat_map(move |lo| {
                    let grid = lo as u8..=(lo + width - 1) as u8;
                    let zero = lo as i32..=(lo + width - 1) as i32;
                    (
                        Just(shape),
                        proptest::collection::vec(code(), n * s1 * heads * d),
                        proptest::collection::vec(grid, n * s2 * heads * d),
                        proptest::collection::vec(code(), n * heads * s1 * s2),
                        (0i32..=255, zero.clone(), 0i32..=255, zero)
                            .prop_map(|(a, b, c, d)| [a, b, c, d]),
                    )
                })
            }),
    ) {
        attention_on_every_path(&q, &k, &p, shape, zeros)?;
    }
}

/// Queries and probabilities all at the top code against keys and values all at one
/// centered magnitude, so that on the paths without VNNI each run of `i16` sums ends exactly
/// at the `i16` bound (magnitude 32: runs of 2 groups, 21: 3, 8: 8; 64: every group widened),
/// over head widths and key counts of several runs, not whole groups of 4; magnitudes 127 and
/// 128 reach the ends of `i8` on the VNNI paths.
#[test]
fn attention_products_at_the_i16_bound_on_every_path() {
    for magnitude in [1, 8, 21, 32, 64, 65, 127, 128] {
        for (queries, keys, heads, d) in [(3, 70, 2, 70), (9, 33, 1, 45), (5, 8, 3, 8)] {
            let shape = AttentionShape {
                queries,
                keys,
                features: heads * d,
                heads,
            };
            let q = vec![255u8; queries * heads * d];
            let p = vec![255u8; heads * queries * keys];
            // Keys at `zero - magnitude` (codes 0) and at `zero + magnitude`.
            for (code, zero) in [(0u8, magnitude), (magnitude as u8, 0)] {
                let k = vec![code; keys * heads * d];
                let zeros = [1, zero, 2, zero];
                let (scores, context) = attention_reference(&q, &k, &p, shape, zeros);
                for isa in paths() {
                    let mut got = vec![7i32; scores.len()];
                    attention_scores_u8(isa, &q, &k, shape, [1, zero], &mut got).unwrap();
                    assert_eq!(got, scores, "scores on {isa}, {shape:?}, {code} - {zero}");
                    let mut got = vec![7i32; context.len()];
                    attention_context_u8(isa, &p, &k, shape, [2, zero], &mut got).unwrap();
                    assert_eq!(got, context, "context on {isa}, {shape:?}, {code} - {zero}");
                }
            }
        }
    }
}

#[test]
fn attention_products_refuse_bad_shapes_and_write_nothing() {
    let shape = AttentionShape {
        queries: 2,
        keys: 3,
        features: 4,
        heads: 2,
    };
    let (q, k) = (vec![1u8; 8], vec![2u8; 12]);
    let mut out = vec![7i32; 12];
    // Features not a multiple of heads.
    let odd = AttentionShape { heads: 3, ..shape };
    assert!(attention_scores_u8(Isa::Portable, &q, &k, odd, [0, 0], &mut out).is_err());
    // Keys for a different number of samples.
    let err = attention_scores_u8(Isa::Portable, &q, &k[..6], shape, [0, 0], &mut out);
    assert!(
        matches!(err, Err(QuantError::LengthMismatch { .. })),
        "{err:?}"
    );
    // A zero point that is no u8 code.
    let err = attention_context_u8(Isa::Portable, &[0u8; 12], &k, shape, [0, 300], &mut [0; 8]);
    assert!(err.unwrap_err().to_string().contains("0..=255"));
    assert_eq!(out, vec![7i32; 12]);
}
