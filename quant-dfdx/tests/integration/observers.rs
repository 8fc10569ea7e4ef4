//! Observers against hand-computed values, NVIDIA's entropy calibration, layouts, non-finite
//! data, errors, the policy-file config, and properties.

use proptest::prelude::*;
use quant_core::{
    uniform_qparams, ChannelLayout, IntegerGrid, QParams, QuantError, QuantizationMethod,
    RoundingPolicy, MIN_SCALE,
};
use quant_dfdx::observers::{
    EntropyObserver, Histogram, HistogramBins, LsqInitObserver, MinMaxObserver, Momentum,
    MovingAverageMinMaxObserver, Observer, ObserverConfig, Percentile, PercentileObserver,
};
use serde::{Deserialize, Serialize};

use QuantizationMethod::{PowerOfTwo, Symmetric, Uniform};

const HE: RoundingPolicy = RoundingPolicy::HalfEven;

fn grid(bits: u32, signed: bool) -> IntegerGrid {
    IntegerGrid::new(bits, signed, false).unwrap()
}

fn bins(n: usize) -> HistogramBins {
    HistogramBins::new(n).unwrap()
}

fn per_tensor(x: &[f32]) -> ChannelLayout {
    ChannelLayout::per_tensor(x.len())
}

fn observed(mut o: Box<dyn Observer>, batches: &[&[f32]]) -> Box<dyn Observer> {
    for b in batches {
        o.observe(b, per_tensor(b)).unwrap();
    }
    o
}

/// Every kind, histogram ones with `hist_bins` bins.
fn all_configs(hist_bins: usize) -> Vec<ObserverConfig> {
    vec![
        ObserverConfig::MinMax,
        ObserverConfig::MovingAverageMinMax {
            momentum: Momentum::DEFAULT,
        },
        ObserverConfig::Percentile {
            percentile: Percentile::DEFAULT,
            bins: bins(hist_bins),
        },
        ObserverConfig::Mse {
            bins: bins(hist_bins),
        },
        ObserverConfig::Entropy {
            bins: bins(hist_bins),
        },
        ObserverConfig::LsqInit,
    ]
}

fn assert_sane(q: &QParams, g: IntegerGrid, what: &str) {
    for s in q.scales() {
        assert!(s.is_finite() && *s >= MIN_SCALE, "{what}: scale {s}");
    }
    q.check_zero_points(g)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
}

// ----- MinMax and moving average ----------------------------------------------------------------

#[test]
fn min_max_running_range_and_qparams() {
    let o = observed(
        Box::new(MinMaxObserver::new()),
        &[&[1.0, -2.0, 3.0], &[5.0, 0.0]],
    );
    assert_eq!(o.ranges(), Some((vec![-2.0], vec![5.0])));
    let q = o.qparams(Symmetric, IntegerGrid::INT8, HE).unwrap();
    assert_eq!(
        (q.scales(), q.zero_points(), q.axis()),
        (&[5.0 / 128.0][..], &[0][..], None)
    );
    let narrow = IntegerGrid::new(8, true, true).unwrap();
    assert_eq!(
        o.qparams(Symmetric, narrow, HE).unwrap().scales(),
        &[5.0 / 127.0]
    );
    // PowerOfTwo rounds the threshold 5 up to 8.
    assert_eq!(
        o.qparams(PowerOfTwo, IntegerGrid::INT8, HE)
            .unwrap()
            .scales(),
        &[8.0 / 128.0]
    );
    // Uniform: s = 7/255, z = round(2 / s) = round(72.86) = 73.
    let q = o.qparams(Uniform, IntegerGrid::UINT8, HE).unwrap();
    assert_eq!(
        (q.scales(), q.zero_points()),
        (&[7.0 / 255.0][..], &[73][..])
    );
    // The rounding policy does not change a min/max observer.
    assert_eq!(
        o.qparams(Uniform, IntegerGrid::UINT8, RoundingPolicy::Floor)
            .unwrap(),
        q
    );
}

#[test]
fn min_max_range_excluding_zero_is_widened_to_contain_it() {
    let o = observed(Box::new(MinMaxObserver::new()), &[&[1.0, 3.0]]);
    assert_eq!(o.ranges(), Some((vec![1.0], vec![3.0])));
    let q = o.qparams(Uniform, IntegerGrid::UINT8, HE).unwrap();
    assert_eq!(
        (q.scales(), q.zero_points()),
        (&[3.0 / 255.0][..], &[0][..])
    );
    let o = observed(Box::new(MinMaxObserver::new()), &[&[-4.0, -1.0]]);
    let q = o.qparams(Uniform, IntegerGrid::UINT8, HE).unwrap();
    assert_eq!(
        (q.scales(), q.zero_points()),
        (&[4.0 / 255.0][..], &[255][..])
    );
}

#[test]
fn moving_average_follows_momentum() {
    let o = observed(
        Box::new(MovingAverageMinMaxObserver::default()),
        &[&[-2.0, 2.0], &[-4.0, 6.0]],
    );
    // First batch initialises; then v += 0.01 (v_batch - v).
    let (lo, hi) = o.ranges().unwrap();
    assert!(
        (lo[0] + 2.02).abs() < 1e-6 && (hi[0] - 2.04).abs() < 1e-6,
        "{lo:?} {hi:?}"
    );
    let mut o = MovingAverageMinMaxObserver::new(Momentum::new(0.5).unwrap());
    o.observe(&[-2.0, 2.0], per_tensor(&[0.0; 2])).unwrap();
    o.observe(&[-4.0, 6.0], per_tensor(&[0.0; 2])).unwrap();
    assert_eq!(o.ranges(), Some((vec![-3.0], vec![4.0])));
    assert_eq!(
        o.qparams(Symmetric, IntegerGrid::INT8, HE)
            .unwrap()
            .scales(),
        &[4.0 / 128.0]
    );
    // Momentum 1 keeps only the last batch.
    let mut o = MovingAverageMinMaxObserver::new(Momentum::new(1.0).unwrap());
    o.observe(&[-2.0, 2.0], per_tensor(&[0.0; 2])).unwrap();
    o.observe(&[-0.5, 1.0], per_tensor(&[0.0; 2])).unwrap();
    assert_eq!(o.ranges(), Some((vec![-0.5], vec![1.0])));
}

#[test]
fn moving_average_leaves_channels_without_data_alone() {
    let layout = ChannelLayout::new(&[2, 2], Some(1)).unwrap();
    let mut o = MovingAverageMinMaxObserver::new(Momentum::new(0.5).unwrap());
    o.observe(&[f32::NAN, 1.0, f32::NAN, 3.0], layout).unwrap();
    // Channel 0 has seen nothing yet and reports [0, 0].
    assert_eq!(o.ranges(), Some((vec![0.0, 1.0], vec![0.0, 3.0])));
    o.observe(&[-1.0, 5.0, 2.0, f32::NAN], layout).unwrap();
    // Channel 0 initialises from this batch; channel 1 averages with (5, 5).
    assert_eq!(o.ranges(), Some((vec![-1.0, 3.0], vec![2.0, 4.0])));
    assert_eq!(o.skipped(), 3);
    let q = o.qparams(Symmetric, IntegerGrid::INT8, HE).unwrap();
    assert_eq!(
        (q.scales(), q.axis()),
        (&[2.0 / 128.0, 4.0 / 128.0][..], Some(1))
    );
}

// ----- LSQ ---------------------------------------------------------------------------------------

#[test]
fn lsq_init_step_size_and_zero_point() {
    let mut o = LsqInitObserver::new();
    o.observe(&[1.0, -3.0, 2.0, -2.0], per_tensor(&[0.0; 4]))
        .unwrap();
    assert_eq!(o.mean_abs(), Some(vec![2.0]));
    // s0 = 2 · mean|x| / sqrt(quant_max).
    let s0 = (4.0 / 127f64.sqrt()) as f32;
    let q = o.qparams(Symmetric, IntegerGrid::INT8, HE).unwrap();
    assert_eq!((q.scales(), q.zero_points()), (&[s0][..], &[0][..]));
    // Uniform: the LSQ scale with the min/max zero point (mmrazor's LSQObserver).
    let q = o.qparams(Uniform, IntegerGrid::UINT8, HE).unwrap();
    let (_, z) = uniform_qparams(-3.0, 2.0, IntegerGrid::UINT8).unwrap();
    assert_eq!(z, 153);
    assert_eq!(
        (q.scales(), q.zero_points()),
        (&[(4.0 / 255f64.sqrt()) as f32][..], &[153][..])
    );
    // PowerOfTwo: threshold s0 · 128 = 45.4 rounds up to 64, so s = 64 / 128.
    assert_eq!(
        o.qparams(PowerOfTwo, IntegerGrid::INT8, HE)
            .unwrap()
            .scales(),
        &[0.5]
    );
    // The mean runs over every value seen: (8 + 4) / 5.
    o.observe(&[4.0], per_tensor(&[0.0])).unwrap();
    assert_eq!(o.mean_abs(), Some(vec![2.4]));
    assert_eq!(o.ranges(), Some((vec![-3.0], vec![4.0])));
}

// ----- Percentile --------------------------------------------------------------------------------

/// 15 values, `|x|` up to 10: with 10 bins every bin is 1 wide (signed bins over [-10, 10]).
fn percentile_data() -> Vec<f32> {
    let mut x = vec![-3.5, -2.5, -1.5, -0.5];
    x.extend((0..10).map(|k| k as f32 + 0.5));
    x.push(10.0);
    x
}

#[test]
fn percentile_threshold_and_two_sided_range() {
    let x = percentile_data();
    let mut o = PercentileObserver::new(Percentile::new(80.0).unwrap(), bins(10));
    o.observe(&x, per_tensor(&x)).unwrap();
    let h = &o.histograms()[0];
    assert_eq!(h.abs_counts(), vec![2, 2, 2, 2, 1, 1, 1, 1, 1, 2]);
    // At most 20% of 15 = 3 values above the threshold: |x| > 8 holds 8.5, 9.5 and 10.
    assert_eq!(h.percentile_threshold(Percentile::new(80.0).unwrap()), 8.0);
    assert_eq!(
        o.qparams(Symmetric, IntegerGrid::INT8, HE)
            .unwrap()
            .scales(),
        &[8.0 / 128.0]
    );
    // Two-sided: at most 3 values below -1 (-3.5, -2.5, -1.5) and above 8 (8.5, 9.5, 10).
    assert_eq!(
        h.percentile_range(Percentile::new(80.0).unwrap()),
        (-1.0, 8.0)
    );
    let q = o.qparams(Uniform, IntegerGrid::UINT8, HE).unwrap();
    assert_eq!(
        (q.scales(), q.zero_points()),
        (&[9.0 / 255.0][..], &[28][..])
    );
}

#[test]
fn percentile_100_equals_min_max() {
    let x = percentile_data();
    let p = observed(
        ObserverConfig::Percentile {
            percentile: Percentile::new(100.0).unwrap(),
            bins: bins(10),
        }
        .build(),
        &[&x],
    );
    let m = observed(Box::new(MinMaxObserver::new()), &[&x]);
    for method in [Symmetric, PowerOfTwo, Uniform] {
        assert_eq!(
            p.qparams(method, IntegerGrid::UINT8, HE).unwrap(),
            m.qparams(method, IntegerGrid::UINT8, HE).unwrap(),
            "{method}"
        );
    }
}

// ----- MSE ---------------------------------------------------------------------------------------

/// 8 bins of `|x|` over [-8, 8] (width 1): 200 values at ±0.5, 100 at ±1.5, one outlier in the
/// top bin (centre 7.5).
fn outlier_counts() -> Vec<u64> {
    let mut c = vec![0u64; 16];
    c[8] = 100; // [0, 1)
    c[7] = 100; // [-1, 0)
    c[9] = 50; // [1, 2)
    c[6] = 50; // [-2, -1)
    c[15] = 1; // [7, 8]
    c
}

fn outlier_data() -> Vec<f32> {
    let mut x = Vec::new();
    for (v, n) in [(0.5f32, 100), (-0.5, 100), (1.5, 50), (-1.5, 50)] {
        x.resize(x.len() + n, v);
    }
    x.push(8.0); // sets the range to 8 and lands in the top bin
    x
}

#[test]
fn mse_clips_a_far_outlier_on_a_hand_built_histogram() {
    let h = Histogram::from_counts(8.0, outlier_counts()).unwrap();
    let g3 = grid(3, true); // [-4, 3]; s = T / 4
                            // Summed squared errors by hand (bin centres): T = 8 (MinMax): 300 · 0.25 + 2.25 = 77.25;
                            // T = 3: 40.06; T = 2: the ±0.5, ±1.5 exact, the outlier 7.5 → 1.5: 36 (the minimum);
                            // T = 1: 86.2.
    let t = h.mse_threshold(Symmetric, g3, HE).unwrap();
    assert_eq!(t, 2.0);
    let mse = h.quantization_error(0.5, 0, g3, HE).unwrap();
    let minmax = h.quantization_error(2.0, 0, g3, HE).unwrap();
    assert!((mse * 301.0 - 36.0).abs() < 1e-9, "{}", mse * 301.0);
    assert!((minmax * 301.0 - 77.25).abs() < 1e-9, "{}", minmax * 301.0);
    // PowerOfTwo tries 8, 4, 2, 1, 0.5 and picks 2 as well.
    assert_eq!(h.mse_threshold(PowerOfTwo, g3, HE).unwrap(), 2.0);
    assert!(h
        .mse_threshold(Uniform, g3, HE)
        .unwrap_err()
        .to_string()
        .contains("mse_range"));

    // Through the observer, from data at the bin centres.
    let x = outlier_data();
    let o = observed(ObserverConfig::Mse { bins: bins(8) }.build(), &[&x]);
    assert_eq!(o.qparams(Symmetric, g3, HE).unwrap().scales(), &[0.5]);
    let m = observed(Box::new(MinMaxObserver::new()), &[&x]);
    assert_eq!(
        m.qparams(Symmetric, g3, HE).unwrap().scales(),
        &[2.0],
        "MinMax keeps the outlier"
    );
}

#[test]
fn mse_uniform_range_clips_the_outlier() {
    let h = Histogram::from_counts(8.0, outlier_counts()).unwrap();
    let g = grid(3, false); // [0, 7]
    let (lo, hi) = h.mse_range(g, HE).unwrap();
    assert!(lo <= 0.0 && hi < 8.0, "[{lo}, {hi}]");
    let (s, z) = uniform_qparams(lo, hi, g).unwrap();
    let (s_mm, z_mm) = uniform_qparams(-2.0, 8.0, g).unwrap();
    let chosen = h.quantization_error(s, z, g, HE).unwrap();
    let minmax = h.quantization_error(s_mm, z_mm, g, HE).unwrap();
    // (It finds [-1.5, 3]: 27.0 summed against MinMax's 50.6.)
    assert!(
        chosen < 0.6 * minmax,
        "[{lo}, {hi}]: {chosen} vs MinMax {minmax}"
    );
}

#[test]
fn mse_choice_is_the_minimum_for_every_rounding_policy() {
    let h = Histogram::from_counts(8.0, outlier_counts()).unwrap();
    let g = grid(4, true);
    for rounding in RoundingPolicy::ALL {
        let t = h.mse_threshold(Symmetric, g, rounding).unwrap();
        let best = h.quantization_error(t / 8.0, 0, g, rounding).unwrap();
        for k in 1..=8 {
            let e = h
                .quantization_error(k as f32 / 8.0, 0, g, rounding)
                .unwrap();
            assert!(
                best <= e,
                "{rounding:?}: T = {t} ({best}) worse than {k} ({e})"
            );
        }
    }
    // Floor and Ceil see a different error surface than HalfEven.
    let e_floor = h
        .quantization_error(0.3, 0, g, RoundingPolicy::Floor)
        .unwrap();
    let e_even = h.quantization_error(0.3, 0, g, HE).unwrap();
    assert!(e_floor != e_even);
}

// ----- Entropy (KL) ------------------------------------------------------------------------------

/// The `|x|` histogram on the positive half of `2 · h.len()` signed bins.
fn abs_histogram(range: f32, h: &[u64]) -> Histogram {
    let mut counts = vec![0u64; 2 * h.len()];
    counts[h.len()..].copy_from_slice(h);
    Histogram::from_counts(range, counts).unwrap()
}

const H1: [u64; 16] = [100, 80, 60, 40, 20, 10, 5, 0, 0, 0, 0, 0, 0, 0, 0, 1];

#[test]
fn entropy_matches_nvidia_on_a_small_histogram() {
    // NVIDIA's `_compute_amax_entropy` on this histogram (edges 0..=16, 4 quantized bins,
    // start bin 4) gives 7.0: divergences 0.0351, 0.0159, 0.0164, 0.0129 (i = 7), then inf
    // while the outlier's bin is empty in Q, and 0.0473 at i = 16.
    let h = abs_histogram(16.0, &H1);
    assert_eq!(h.kl_threshold(4), 7.0);
    // MinMax would take 16; a target above the bin count cannot clip.
    assert_eq!(h.kl_threshold(17), 16.0);

    // Through the observer: a 3-bit signed grid has quant_max + 1 = 4 levels at or above 0.
    let mut x = Vec::new();
    for (k, n) in H1.iter().enumerate().take(7) {
        x.resize(x.len() + *n as usize, k as f32 + 0.5);
    }
    x.push(16.0);
    let o = observed(ObserverConfig::Entropy { bins: bins(16) }.build(), &[&x]);
    assert_eq!(
        o.qparams(Symmetric, grid(3, true), HE).unwrap().scales(),
        &[7.0 / 4.0]
    );
    // Uniform on one-signed data uses all 8 levels. NVIDIA's code gives 16 here: for every
    // i < 16 the outliers fold into P's last bin, which is empty in Q (infinite divergence).
    assert_eq!(h.kl_threshold(8), 16.0);
    let q = o.qparams(Uniform, grid(3, false), HE).unwrap();
    assert_eq!((q.scales(), q.zero_points()), (&[16.0 / 7.0][..], &[0][..]));
    // A flat histogram is not clipped (NVIDIA: 64.0).
    assert_eq!(abs_histogram(64.0, &[10; 64]).kl_threshold(16), 64.0);
}

#[test]
fn entropy_matches_nvidia_on_2048_bins() {
    // A Gaussian-like |x| histogram of 2048 bins of width 1/256 with 3 far outliers; NVIDIA's
    // code picks i = 274, so amax = 274 / 256.
    let h: Vec<u64> = (0..2048)
        .map(|k| {
            let z = (k as f64 + 0.5) / 60.0;
            let c = (100_000.0 * (-0.5 * z * z).exp()).floor() as u64;
            c + if k == 2047 { 3 } else { 0 }
        })
        .collect();
    let hist = abs_histogram(8.0, &h);
    assert_eq!(hist.kl_threshold(128), 274.0 / 256.0);
    assert_eq!(
        EntropyObserver::target_bins(Symmetric, IntegerGrid::INT8, -1.0, 1.0),
        128
    );
}

#[test]
fn entropy_target_bins_follow_the_grid() {
    use EntropyObserver as E;
    assert_eq!(E::target_bins(Symmetric, IntegerGrid::INT8, -1.0, 1.0), 128);
    assert_eq!(
        E::target_bins(
            PowerOfTwo,
            IntegerGrid::new(8, true, true).unwrap(),
            -1.0,
            1.0
        ),
        128
    );
    assert_eq!(E::target_bins(Symmetric, IntegerGrid::UINT8, 0.0, 1.0), 256);
    assert_eq!(E::target_bins(Uniform, IntegerGrid::UINT8, 0.0, 1.0), 256);
    assert_eq!(E::target_bins(Uniform, IntegerGrid::UINT8, -1.0, 1.0), 128);
    assert_eq!(E::target_bins(Symmetric, grid(4, true), -1.0, 1.0), 8);
}

// ----- histogram growth --------------------------------------------------------------------------

#[test]
fn histogram_growth_merges_bins_exactly() {
    let mut h = Histogram::new(bins(8));
    assert_eq!(h.add(&[-3.75, -0.25, 0.25, 1.25, 3.75, 4.0]), 0);
    // Range 4, width 0.5; 4.0 itself sits in the top bin.
    assert_eq!((h.range(), h.bin_width()), (4.0, 0.5));
    let mut expect = [0u64; 16];
    for (j, n) in [(0, 1), (7, 1), (8, 1), (10, 1), (15, 2)] {
        expect[j] = n;
    }
    assert_eq!(h.counts(), &expect[..]);
    // 10 needs 16 = 4 · 2^2: every 4 old bins merge, old bin j → 8 + floor((j - 8) / 4).
    assert_eq!(h.add(&[10.0, -0.75, f32::NAN]), 1);
    assert_eq!((h.range(), h.bin_width()), (16.0, 2.0));
    let mut expect = [0u64; 16];
    // [-4,-2): -3.75 | [-2,0): -0.25, -0.75 | [0,2): 0.25, 1.25 | [2,4): 3.75, 4.0 | [10,12): 10
    for (j, n) in [(6, 1), (7, 2), (8, 2), (9, 2), (13, 1)] {
        expect[j] = n;
    }
    assert_eq!(h.counts(), &expect[..]);
    assert_eq!(h.total(), 8);
    assert_eq!(h.min_max(), Some((-3.75, 10.0)));
    assert_eq!(h.abs_counts(), vec![4, 3, 0, 0, 0, 1, 0, 0]);
}

#[test]
fn histogram_growth_from_zeros() {
    let mut h = Histogram::new(bins(8));
    h.add(&[0.0, 0.0, -0.0, 0.0]);
    assert_eq!((h.range(), h.total()), (0.0, 4));
    assert_eq!(h.counts()[8], 4);
    h.add(&[2.0, -1.0]);
    assert_eq!(h.range(), 2.0);
    let mut expect = [0u64; 16];
    expect[8] = 4; // the zeros stay in [0, w)
    expect[15] = 1;
    expect[4] = 1; // -1 in [-1, -0.75)
    assert_eq!(h.counts(), &expect[..]);
}

#[test]
fn histogram_from_counts_validates() {
    let err = Histogram::from_counts(1.0, vec![0; 7])
        .unwrap_err()
        .to_string();
    assert!(err.contains("an even number of signed bins"), "{err}");
    assert!(Histogram::from_counts(1.0, vec![0; 4]).is_err());
    let err = Histogram::from_counts(f32::NAN, vec![0; 16])
        .unwrap_err()
        .to_string();
    assert!(err.contains("histogram range"), "{err}");
    assert!(Histogram::from_counts(0.0, vec![1; 16]).is_err());
    let mut zeros = vec![0; 16];
    zeros[8] = 3;
    assert_eq!(
        Histogram::from_counts(0.0, zeros).unwrap().min_max(),
        Some((0.0, 0.0))
    );
}

// ----- layouts -----------------------------------------------------------------------------------

#[test]
fn per_channel_min_max_on_axis_0_and_1() {
    let x = [1.0, -2.0, 3.0, 4.0, 5.0, -6.0]; // shape [2, 3]
    let mut o = MinMaxObserver::new();
    o.observe(&x, ChannelLayout::new(&[2, 3], Some(1)).unwrap())
        .unwrap();
    assert_eq!(
        o.ranges(),
        Some((vec![1.0, -2.0, -6.0], vec![4.0, 5.0, 3.0]))
    );
    let q = o.qparams(Symmetric, IntegerGrid::INT8, HE).unwrap();
    assert_eq!(q.scales(), &[4.0 / 128.0, 5.0 / 128.0, 6.0 / 128.0]);
    assert_eq!(q.axis(), Some(1));
    let mut o = MinMaxObserver::new();
    o.observe(&x, ChannelLayout::new(&[2, 3], Some(0)).unwrap())
        .unwrap();
    assert_eq!(o.ranges(), Some((vec![-2.0, -6.0], vec![3.0, 5.0])));
    let q = o.qparams(Uniform, IntegerGrid::UINT8, HE).unwrap();
    assert_eq!(q.axis(), Some(0));
    assert_eq!(q.scales(), &[5.0 / 255.0, 11.0 / 255.0]);
}

/// Deterministic values with a spread of magnitudes and the odd NaN.
fn wobbly(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40_503))
                >> 8;
            if h.is_multiple_of(97) {
                f32::NAN
            } else {
                ((h % 2001) as f32 - 1000.0) / 1000.0 * scale * (1.0 + (h % 7) as f32)
            }
        })
        .collect()
}

fn channel_values(x: &[f32], layout: ChannelLayout, c: usize) -> Vec<f32> {
    (0..x.len())
        .filter(|i| layout.channel_of(*i) == c)
        .map(|i| x[i])
        .collect()
}

fn assert_close(a: &QParams, b: &QParams, exact: bool, what: &str) {
    assert_eq!(a.zero_points(), b.zero_points(), "{what}");
    for (x, y) in a.scales().iter().zip(b.scales()) {
        if exact {
            assert_eq!(x, y, "{what}");
        } else {
            assert!((x - y).abs() <= 1e-6 * x.abs(), "{what}: {x} vs {y}");
        }
    }
}

#[test]
fn per_channel_equals_per_tensor_on_each_channel() {
    // Long blocks (axis 0, 1 of [3, 4, 20]), short blocks (axis 2; axis 0 of [5, 6]) and
    // single elements (axis 1 of [5, 6]).
    let cases: [(&[usize], usize); 5] = [
        (&[3, 4, 20], 0),
        (&[3, 4, 20], 1),
        (&[3, 4, 20], 2),
        (&[5, 6], 0),
        (&[5, 6], 1),
    ];
    for (shape, axis) in cases {
        let layout = ChannelLayout::new(shape, Some(axis)).unwrap();
        let b1 = wobbly(layout.numel(), 1, 1.0);
        let b2 = wobbly(layout.numel(), 2, 3.0); // wider: the histograms grow
        for config in all_configs(16) {
            let what = format!("{config} on {shape:?} axis {axis}");
            let mut o = config.build();
            o.observe(&b1, layout).unwrap();
            o.observe(&b2, layout).unwrap();
            let (mins, maxs) = o.ranges().unwrap();
            let mut skipped = 0;
            for c in 0..layout.channels {
                let mut r = config.build();
                for b in [&b1, &b2] {
                    let v = channel_values(b, layout, c);
                    r.observe(&v, per_tensor(&v)).unwrap();
                }
                skipped += r.skipped();
                let (lo, hi) = r.ranges().unwrap();
                assert_eq!((mins[c], maxs[c]), (lo[0], hi[0]), "{what} channel {c}");
                for method in [Symmetric, PowerOfTwo, Uniform] {
                    let q = o.qparams(method, IntegerGrid::INT8, HE).unwrap();
                    assert_eq!((q.axis(), q.channels()), (Some(axis), layout.channels));
                    let qc = r.qparams(method, IntegerGrid::INT8, HE).unwrap();
                    let one = QParams::per_tensor(q.scales()[c], q.zero_points()[c]).unwrap();
                    let exact = !matches!(config, ObserverConfig::LsqInit);
                    assert_close(&one, &qc, exact, &format!("{what} {method} channel {c}"));
                }
            }
            assert_eq!(o.skipped(), skipped, "{what}");
        }
    }
}

// ----- non-finite, constant and empty data -------------------------------------------------------

#[test]
fn nan_and_inf_are_skipped_and_counted() {
    let dirty = [
        1.0,
        f32::NAN,
        -2.0,
        f32::INFINITY,
        3.0,
        f32::NEG_INFINITY,
        0.5,
    ];
    let clean = [1.0, -2.0, 3.0, 0.5];
    for config in all_configs(32) {
        let d = observed(config.build(), &[&dirty]);
        let c = observed(config.build(), &[&clean]);
        assert_eq!(d.skipped(), 3, "{config}");
        assert_eq!(c.skipped(), 0, "{config}");
        assert_eq!(d.ranges(), Some((vec![-2.0], vec![3.0])), "{config}");
        for method in [Symmetric, PowerOfTwo, Uniform] {
            assert_eq!(
                d.qparams(method, IntegerGrid::INT8, HE).unwrap(),
                c.qparams(method, IntegerGrid::INT8, HE).unwrap(),
                "{config} {method}"
            );
        }
    }
}

#[test]
fn only_non_finite_data_is_not_initialized() {
    for config in all_configs(32) {
        let o = observed(config.build(), &[&[f32::NAN, f32::INFINITY]]);
        assert_eq!(o.ranges(), None, "{config}");
        let err = o.qparams(Symmetric, IntegerGrid::INT8, HE).unwrap_err();
        assert!(
            matches!(err, QuantError::NotInitialized { .. }),
            "{config}: {err}"
        );
        let msg = err.to_string();
        assert!(msg.contains("2 NaN/Inf values were skipped"), "{msg}");
        assert!(msg.contains(config.kind()), "{msg}");
    }
}

#[test]
fn qparams_before_any_observation_is_not_initialized() {
    for config in all_configs(32) {
        let mut o = config.build();
        let err = o
            .qparams(Uniform, IntegerGrid::UINT8, HE)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("has seen no finite values yet") && err.contains("call observe()"),
            "{err}"
        );
        // An empty batch is no data either.
        o.observe(&[], per_tensor(&[])).unwrap();
        assert!(o.qparams(Uniform, IntegerGrid::UINT8, HE).is_err());
        assert_eq!(o.ranges(), None);
    }
}

#[test]
fn constant_and_zero_tensors_give_positive_scales() {
    let grids = [
        IntegerGrid::INT8,
        IntegerGrid::UINT8,
        IntegerGrid::new(4, true, true).unwrap(),
        IntegerGrid::new(16, true, false).unwrap(),
        IntegerGrid::new(2, false, false).unwrap(),
    ];
    let inputs: [&[f32]; 5] = [
        &[0.0; 100],
        &[-0.0; 3],
        &[5.0; 100],
        &[-3.0; 10],
        &[1e-30; 4],
    ];
    for config in all_configs(2048) {
        for x in inputs {
            let o = observed(config.build(), &[x]);
            for g in grids {
                for method in [Symmetric, PowerOfTwo, Uniform] {
                    let what = format!("{config} {method} {g:?} on {:?}", &x[..1]);
                    let q = o
                        .qparams(method, g, HE)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_sane(&q, g, &what);
                }
            }
        }
    }
    // MinMax on a constant: the threshold is the constant.
    let o = observed(Box::new(MinMaxObserver::new()), &[&[5.0; 10]]);
    assert_eq!(
        o.qparams(Symmetric, IntegerGrid::INT8, HE)
            .unwrap()
            .scales(),
        &[5.0 / 128.0]
    );
    let o = observed(Box::new(MinMaxObserver::new()), &[&[0.0; 10]]);
    assert_eq!(
        o.qparams(Uniform, IntegerGrid::UINT8, HE).unwrap().scales(),
        &[MIN_SCALE]
    );
}

#[test]
fn extreme_finite_values_give_parameters_or_typed_errors() {
    // Symmetric thresholds up to f32::MAX are representable; a PowerOfTwo threshold above
    // 2^127 and a Uniform range wider than f32::MAX are not, and say so.
    let x = [f32::MAX, -f32::MAX, 1.0, f32::MIN_POSITIVE];
    for config in all_configs(64) {
        let o = observed(config.build(), &[&x]);
        let q = o.qparams(Symmetric, IntegerGrid::INT8, HE).unwrap();
        assert_sane(&q, IntegerGrid::INT8, &config.to_string());
        for method in [PowerOfTwo, Uniform] {
            if let Err(e) = o.qparams(method, IntegerGrid::INT8, HE) {
                assert!(
                    matches!(
                        e,
                        QuantError::NonFinite { .. } | QuantError::InvalidScale { .. }
                    ),
                    "{config} {method}: {e}"
                );
            }
        }
    }
    // A histogram that grew past f32::MAX still selects within the data.
    let mut h = Histogram::new(bins(8));
    h.add(&[3e38]);
    h.add(&[-3.4e38, 1.0]);
    assert!(h.range() > f64::from(f32::MAX));
    assert_eq!(h.total(), 3);
    assert_eq!(
        h.percentile_range(Percentile::new(100.0).unwrap()),
        (-3.4e38, 3e38)
    );
    assert_eq!(h.kl_threshold(4), 3.4e38);
    assert!(h.mse_threshold(Symmetric, IntegerGrid::INT8, HE).unwrap() <= 3.4e38);
}

// ----- errors and the trait object ---------------------------------------------------------------

#[test]
fn layout_errors_name_the_problem() {
    for config in all_configs(16) {
        let mut o = config.build();
        let err = o
            .observe(&[1.0; 5], ChannelLayout::per_tensor(4))
            .unwrap_err();
        assert!(
            matches!(
                err,
                QuantError::LengthMismatch {
                    expected: 4,
                    actual: 5,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("observed tensor"), "{err}");

        o.observe(&[1.0; 6], ChannelLayout::new(&[2, 3], Some(1)).unwrap())
            .unwrap();
        let before = o.ranges();
        let err = o
            .observe(&[9.0; 8], ChannelLayout::new(&[2, 4], Some(1)).unwrap())
            .unwrap_err();
        assert!(
            matches!(
                err,
                QuantError::LengthMismatch {
                    expected: 3,
                    actual: 4,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("earlier batches had 3"), "{err}");
        let err = o
            .observe(&[9.0; 9], ChannelLayout::new(&[3, 3], Some(0)).unwrap())
            .unwrap_err();
        assert!(
            err.to_string().contains("layout.axis = Some(0) is invalid"),
            "{err}"
        );
        assert_eq!(
            o.ranges(),
            before,
            "{config}: a failed observe changes nothing"
        );

        let empty = ChannelLayout {
            outer: 1,
            channels: 0,
            inner: 1,
            axis: Some(0),
        };
        let err = o.observe(&[], empty).unwrap_err().to_string();
        assert!(err.contains("layout.channels = 0"), "{err}");

        // reset() forgets the layout.
        o.reset();
        o.observe(&[9.0; 8], ChannelLayout::new(&[2, 4], Some(1)).unwrap())
            .unwrap();
        assert_eq!(
            o.qparams(Symmetric, IntegerGrid::INT8, HE)
                .unwrap()
                .channels(),
            4
        );
    }
}

#[test]
fn an_empty_batch_cannot_claim_a_huge_channel_count() {
    // Shape [0, 2^40]: no values, but per-channel statistics would be sized by the channels.
    let layout = ChannelLayout::new(&[0, 1 << 40], Some(1)).unwrap();
    assert_eq!(layout.numel(), 0);
    for config in all_configs(16) {
        let err = config.build().observe(&[], layout).unwrap_err().to_string();
        assert!(
            err.contains("layout.channels = 1099511627776"),
            "{config}: {err}"
        );
    }
    // A modest empty batch is still fine.
    let layout = ChannelLayout::new(&[0, 16], Some(1)).unwrap();
    for config in all_configs(16) {
        config.build().observe(&[], layout).unwrap();
    }
}

#[test]
fn boxed_observers_clone_reset_and_report_their_config() {
    for config in all_configs(64) {
        let mut o = observed(config.build(), &[&[1.0, -2.0, f32::NAN]]);
        assert_eq!(o.config(), config);
        let copy = o.clone();
        o.reset();
        assert_eq!((o.ranges(), o.skipped()), (None, 0));
        assert!(o.qparams(Symmetric, IntegerGrid::INT8, HE).is_err());
        assert_eq!(copy.skipped(), 1);
        assert!(copy.qparams(Symmetric, IntegerGrid::INT8, HE).is_ok());
        assert_eq!(o.config(), config, "reset keeps the options");
    }
    fn is_send_sync<T: Send + Sync + ?Sized>() {}
    is_send_sync::<dyn Observer>();
}

mod config;
mod properties;
