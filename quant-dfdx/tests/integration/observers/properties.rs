//! Properties of every observer over random data and grids.

use super::*;

/// Finite values over many magnitudes (the threshold formulas need `|x|` well inside f32's
/// range: PowerOfTwo rounds `max|x|` up to a power of two, which must stay finite).
fn finite_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        -1e30f32..1e30,
        -1.0f32..1.0,
        -1e-30f32..1e-30,
        Just(0.0f32),
        Just(3.0f32),
        (-60i32..60).prop_map(|e| 2f32.powi(e)),
    ]
}

fn property_grids() -> [IntegerGrid; 3] {
    [
        IntegerGrid::INT8,
        IntegerGrid::UINT8,
        IntegerGrid::new(3, true, true).unwrap(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn finite_inputs_give_finite_positive_scales(
        b1 in prop::collection::vec(finite_value(), 1..48),
        b2 in prop::collection::vec(finite_value(), 0..48),
        hist_bins in 8usize..64,
    ) {
        for config in all_configs(hist_bins) {
            let o = observed(config.build(), &[&b1, &b2]);
            for g in property_grids() {
                for method in [Symmetric, PowerOfTwo, Uniform] {
                    for rounding in [HE, RoundingPolicy::Floor] {
                        let what = format!("{config} {method} {g:?} {rounding:?}");
                        let q = o.qparams(method, g, rounding);
                        prop_assert!(q.is_ok(), "{}: {:?}", what, q);
                        assert_sane(&q.unwrap(), g, &what);
                    }
                }
            }
        }
    }

    #[test]
    fn histogram_growth_preserves_counts(
        batches in prop::collection::vec(prop::collection::vec(finite_value(), 0..40), 1..5),
        hist_bins in 8usize..40,
    ) {
        let mut h = Histogram::new(bins(hist_bins));
        let mut all = Vec::new();
        for b in &batches {
            prop_assert_eq!(h.add(b), 0);
            all.extend_from_slice(b);
        }
        prop_assert_eq!(h.total(), all.len() as u64);
        prop_assert_eq!(h.abs_counts().iter().sum::<u64>(), all.len() as u64);
        let max_abs = all.iter().fold(0f32, |m, v| m.max(v.abs()));
        prop_assert!(h.range() >= f64::from(max_abs));
        // Growth doubles: the range is at most twice what the data needs (or the first batch's).
        if let Some((lo, hi)) = h.min_max() {
            prop_assert_eq!(lo, all.iter().copied().fold(f32::INFINITY, f32::min));
            prop_assert_eq!(hi, all.iter().copied().fold(f32::NEG_INFINITY, f32::max));
            prop_assert!(h.range() <= 2.0 * f64::from(max_abs).max(1e-30) || max_abs == 0.0);
        }
        // Negative values are counted in the lower half, positive ones in the upper half.
        let neg = all.iter().filter(|v| **v < 0.0).count() as u64;
        let lower: u64 = h.counts()[..hist_bins].iter().sum();
        if h.range() > 0.0 {
            prop_assert!(lower <= neg, "lower half {} > negatives {}", lower, neg);
        }
    }

    #[test]
    fn percentile_100_is_min_max(x in prop::collection::vec(finite_value(), 1..64)) {
        let p = observed(
            ObserverConfig::Percentile { percentile: Percentile::new(100.0).unwrap(), bins: bins(16) }.build(),
            &[&x],
        );
        let m = observed(Box::new(MinMaxObserver::new()), &[&x]);
        for method in [Symmetric, Uniform] {
            prop_assert_eq!(
                p.qparams(method, IntegerGrid::INT8, HE).unwrap(),
                m.qparams(method, IntegerGrid::INT8, HE).unwrap()
            );
        }
    }

    #[test]
    fn per_channel_constants_and_single_elements_give_finite_positive_scales(
        outer in 1usize..3,
        channels in 1usize..4,
        inner in 1usize..3,
        axis_first in any::<bool>(),
        constants in prop::collection::vec(finite_value(), 4),
        hist_bins in 8usize..32,
    ) {
        // Every channel constant (a single element when outer = inner = 1), on axis 0 or 1.
        let (shape, axis) = if axis_first {
            (vec![channels, outer * inner], 0)
        } else {
            (vec![outer, channels, inner], 1)
        };
        let layout = ChannelLayout::new(&shape, Some(axis)).unwrap();
        let x: Vec<f32> = (0..layout.numel()).map(|i| constants[layout.channel_of(i)]).collect();
        for config in all_configs(hist_bins) {
            let mut o = config.build();
            o.observe(&x, layout).unwrap();
            for g in property_grids() {
                for method in [Symmetric, PowerOfTwo, Uniform] {
                    let what = format!("{config} {method} {g:?} {shape:?} axis {axis}");
                    let q = o.qparams(method, g, HE);
                    prop_assert!(q.is_ok(), "{}: {:?}", what, q);
                    let q = q.unwrap();
                    prop_assert_eq!(q.channels(), channels, "{}", what);
                    assert_sane(&q, g, &what);
                }
            }
        }
    }

    #[test]
    fn hand_built_layouts_are_errors_not_panics(
        outer in prop_oneof![0usize..4, Just(usize::MAX), Just(1usize << 40)],
        channels in prop_oneof![0usize..4, Just(usize::MAX), Just(1usize << 40)],
        inner in prop_oneof![0usize..4, Just(usize::MAX), Just(1usize << 40)],
        axis in prop::option::of(0usize..3),
        x in prop::collection::vec(finite_value(), 0..12),
    ) {
        let layout = ChannelLayout { outer, channels, inner, axis };
        for config in all_configs(16) {
            let mut o = config.build();
            let r = o.observe(&x, layout);
            if layout.numel() != x.len() || channels == 0 || channels > x.len().max(1 << 20) {
                prop_assert!(r.is_err(), "{} accepted {:?} for {} values", config, layout, x.len());
            }
        }
    }

    /// `mse_range` stops its coordinate descent once a scan moves nothing (the scans after it
    /// would repeat earlier ones); it returns the range of the documented descent run in full:
    /// every round scans both ends, until a round improves nothing or 8 have run.
    #[test]
    fn mse_range_equals_the_full_descent(
        x in prop::collection::vec(
            prop_oneof![-4.0f32..4.0, -0.2f32..0.2, 0.0f32..30.0, -9.0f32..-3.0],
            1..400,
        ),
        hist_bins in 8usize..96,
        bits in 2u32..=8,
        signed in any::<bool>(),
    ) {
        let mut h = Histogram::new(bins(hist_bins));
        h.add(&x);
        let g = grid(bits, signed);
        for rounding in RoundingPolicy::ALL {
            let got = h.mse_range(g, rounding).unwrap();
            let want = full_descent(&h, g, rounding);
            prop_assert_eq!(got, want, "{:?} {:?} {} bins", g, rounding, hist_bins);
        }
    }
}

/// The Uniform MSE search as `Histogram::mse_range` documents it, every round in full.
fn full_descent(h: &Histogram, g: IntegerGrid, rounding: RoundingPolicy) -> (f32, f32) {
    let (min, max) = h.min_max().unwrap();
    let (lo0, hi0) = (min.min(0.0), max.max(0.0));
    if lo0 == hi0 {
        return (lo0, hi0);
    }
    let steps = h.bins();
    let eval = |lo: f32, hi: f32| {
        let (s, z) = uniform_qparams(lo, hi, g).unwrap();
        h.quantization_error(s, z, g, rounding).unwrap()
    };
    let frac = |v: f32, j: usize| (f64::from(v) * j as f64 / steps as f64) as f32;
    let mut best = (eval(lo0, hi0), lo0, hi0);
    for k in (1..steps).rev() {
        let (lo, hi) = (frac(lo0, k), frac(hi0, k));
        let e = eval(lo, hi);
        if e < best.0 {
            best = (e, lo, hi);
        }
    }
    for _ in 0..8 {
        let mut improved = false;
        if lo0 < 0.0 {
            for j in (0..=steps).rev() {
                let lo = frac(lo0, j);
                let e = eval(lo, best.2);
                if e < best.0 {
                    best = (e, lo, best.2);
                    improved = true;
                }
            }
        }
        if hi0 > 0.0 {
            for j in (0..=steps).rev() {
                let hi = frac(hi0, j);
                let e = eval(best.1, hi);
                if e < best.0 {
                    best = (e, best.1, hi);
                    improved = true;
                }
            }
        }
        if !improved {
            break;
        }
    }
    (best.1, best.2)
}
