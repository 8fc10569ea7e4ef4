//! Properties of the numerics, checked on random data (DESIGN.md, "How we test"):
//!
//! - fake-quantized values lie on the grid, and within `scale / 2` of the input inside the
//!   range (up to the f32 rounding of `x · (1/s)` and of the product, stated below);
//! - fake quantization is idempotent;
//! - per-channel quantization on any axis equals per-tensor quantization of each channel;
//! - every registered built-in quantizer's inferable form reproduces its forward pass exactly,
//!   for any grid, rounding policy and layout, after initialisation from data or with
//!   parameters set directly;
//! - the integer model's logits equal the fake-quantized model's, on random MLPs and CNNs,
//!   within the tolerance documented in `quant_runtime::integer`.
//!
//! Observers' properties (finite positive scales for any finite input, constants and single
//! elements included) are in `quant-dfdx/tests/integration/observers.rs`.

use dfdx::prelude::*;
use proptest::prelude::*;

use quant::prelude::*;
use quant_core::kernels::{
    fake_quantize_affine_into, fake_quantize_per_channel_affine, fake_quantize_per_tensor_affine,
};
use quant_core::{registry, ParamBank, ParamBankMut, MAX_PARAMETERS};
use quant_dfdx::convert::{convert_model, Convert, LayerKind};
use quant_dfdx::layers::Slot;
use quant_dfdx::layers::{QuantizedModuleExt, QuantizerSpec};
use quant_dfdx::lower::export_model;
use quant_dfdx::nn::builders;
use quant_dfdx::observers::ObserverConfig;
use quant_runtime::integer::IntegerModel;

const POLICIES: [RoundingPolicy; 7] = [
    RoundingPolicy::HalfEven,
    RoundingPolicy::HalfAwayFromZero,
    RoundingPolicy::HalfUp,
    RoundingPolicy::HalfDown,
    RoundingPolicy::HalfTowardZero,
    RoundingPolicy::Floor,
    RoundingPolicy::Ceil,
];

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A grid (2..=16 bits, either signedness, either range) with a valid zero point.
fn grid_and_zero_point() -> impl Strategy<Value = (IntegerGrid, i32)> {
    (
        2u32..=16,
        any::<bool>(),
        any::<bool>(),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(bits, signed, narrow, z)| {
            let g = IntegerGrid::new(bits, signed, narrow).unwrap();
            let span = (g.quant_max() - g.quant_min()) as usize + 1;
            (g, g.quant_min() + z.index(span) as i32)
        })
}

/// Scales over many magnitudes.
fn scale() -> impl Strategy<Value = f32> {
    prop_oneof![
        1e-6f32..1e-3,
        1e-3f32..1.0,
        1.0f32..100.0,
        (-20i32..20).prop_map(|e| 2f32.powi(e)),
    ]
}

/// Values in and well outside a grid of scale `s` (codes up to ±2^17), with exact ties.
fn values(n: std::ops::Range<usize>) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(
        prop_oneof![
            4 => -1.0f32..1.0,
            2 => (-131_072i32..131_072).prop_map(|k| k as f32),
            2 => (-300i32..300).prop_map(|k| k as f32 + 0.5),
            1 => Just(0.0f32),
        ],
        n,
    )
}

fn directed(p: RoundingPolicy) -> bool {
    matches!(p, RoundingPolicy::Floor | RoundingPolicy::Ceil)
}

/// The code `q` with `y = (q - z) · s`, when `y` is on the grid.
fn code_of(y: f32, s: f32, z: i32) -> Option<i32> {
    let k = (y / s).round();
    let q = k as i64 + z as i64;
    ((q - z as i64) as f32 * s == y).then_some(q as i32)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn outputs_lie_on_the_grid_and_within_half_a_step_inside_the_range(
        (g, z) in grid_and_zero_point(),
        s in scale(),
        unit in values(1..64),
        policy in 0usize..7,
    ) {
        let (qmin, qmax) = (g.quant_min(), g.quant_max());
        let x: Vec<f32> = unit.iter().map(|u| u * s).collect();
        let mut y = vec![0.0; x.len()];
        let layout = ChannelLayout::per_tensor(x.len());
        fake_quantize_affine_into(&x, &mut y, layout, &[s], &[z], qmin, qmax, POLICIES[policy]).unwrap();
        let lo = (qmin as i64 - z as i64) as f32 * s;
        let hi = (qmax as i64 - z as i64) as f32 * s;
        for (xi, yi) in x.iter().zip(&y) {
            let q = code_of(*yi, s, z);
            prop_assert!(q.is_some_and(|q| (qmin..=qmax).contains(&q)), "{} -> {} is off the grid (s {}, z {})", xi, yi, s, z);
            if (lo..=hi).contains(xi) {
                // Half a step for the nearest-rounding policies, a step for Floor and Ceil, plus
                // the f32 rounding of x · (1/s) and of (q - z) · s.
                let step = if directed(POLICIES[policy]) { s } else { s / 2.0 };
                let bound = step + (xi.abs() + yi.abs()) * f32::EPSILON;
                prop_assert!((xi - yi).abs() <= bound, "|{} - {}| > {}", xi, yi, bound);
            } else {
                // Outside the range: clamped to the nearest end.
                prop_assert_eq!(*yi, if *xi < lo { lo } else { hi });
            }
        }
    }

    #[test]
    fn fake_quantization_is_idempotent(
        (g, z) in grid_and_zero_point(),
        s in scale(),
        unit in values(1..64),
        policy in 0usize..7,
    ) {
        let (qmin, qmax) = (g.quant_min(), g.quant_max());
        let x: Vec<f32> = unit.iter().map(|u| u * s).collect();
        let layout = ChannelLayout::per_tensor(x.len());
        let fq = |v: &[f32]| {
            let mut out = vec![0.0; v.len()];
            fake_quantize_affine_into(v, &mut out, layout, &[s], &[z], qmin, qmax, POLICIES[policy]).unwrap();
            out
        };
        let once = fq(&x);
        let twice = fq(&once);
        if directed(POLICIES[policy]) {
            // Floor and Ceil are not idempotent: a level `(q - z)·s` times the f32 reciprocal
            // `1/s` may land a hair below or above `q - z`, and the directed rounding then moves
            // it one level. Never further.
            for (a, b) in once.iter().zip(&twice) {
                prop_assert!((a - b).abs() <= s + (a.abs() + b.abs()) * f32::EPSILON, "{} -> {} (s {})", a, b, s);
            }
        } else {
            prop_assert_eq!(twice, once);
        }
    }

    #[test]
    fn per_channel_on_any_axis_is_per_tensor_on_each_channel(
        shape in prop::collection::vec(1usize..5, 1..5),
        axis_pick in any::<prop::sample::Index>(),
        (g, _) in grid_and_zero_point(),
        seed in any::<u64>(),
    ) {
        let axis = axis_pick.index(shape.len());
        let channels = shape[axis];
        let n: usize = shape.iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let (qmin, qmax) = (g.quant_min(), g.quant_max());
        let mut r = seed;
        let mut next = || {
            r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (r >> 33) as u32
        };
        let scales: Vec<f32> = (0..channels).map(|_| 2f32.powi((next() % 12) as i32 - 8) * (1.0 + (next() % 7) as f32 / 8.0)).collect();
        let span = (qmax - qmin) as u32 + 1;
        let zps: Vec<i32> = (0..channels).map(|_| qmin + (next() % span) as i32).collect();
        let x: Vec<f32> = (0..n).map(|_| (next() % 4001) as f32 / 100.0 - 20.0).collect();
        let y = fake_quantize_per_channel_affine(&x, &shape, axis, &scales, &zps, qmin, qmax).unwrap();
        for c in 0..channels {
            let idx: Vec<usize> = (0..n).filter(|i| (i / inner) % channels == c).collect();
            let xc: Vec<f32> = idx.iter().map(|i| x[*i]).collect();
            let yc = fake_quantize_per_tensor_affine(&xc, scales[c], zps[c], qmin, qmax).unwrap();
            for (k, i) in idx.iter().enumerate() {
                prop_assert_eq!(y[*i].to_bits(), yc[k].to_bits(), "channel {} element {}", c, i);
            }
        }
    }
}

// ----- inferable == trainable ------------------------------------------------------------------

/// Every built-in registered quantizer, for every method it declares.
fn built_in_configs(
    bits: u32,
    narrow: bool,
    rounding: RoundingPolicy,
    per_channel: bool,
) -> Vec<QuantizerConfig> {
    let mut out = Vec::new();
    for entry in registry::registered() {
        if !entry.metadata.module_path.starts_with("quant_dfdx") {
            continue;
        }
        for method in entry.metadata.methods {
            let id = entry.metadata.training_method;
            out.push(match entry.metadata.target {
                QuantizationTarget::Weights => {
                    let mut c = WeightsQuantizerConfig::new(id, *method, bits);
                    c.narrow_range = narrow;
                    c.rounding = rounding;
                    c.per_channel = per_channel;
                    c.into()
                }
                QuantizationTarget::Activation => {
                    let mut c = ActivationQuantizerConfig::new(id, *method, bits);
                    c.narrow_range = narrow;
                    c.rounding = rounding;
                    c.into()
                }
            });
        }
    }
    assert!(
        out.len() >= 13,
        "the 13 built-ins are linked: {}",
        out.len()
    );
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..config() })]

    #[test]
    fn every_built_in_inferable_reproduces_its_trainable_forward(
        bits in 2u32..=8,
        narrow in any::<bool>(),
        policy in 0usize..7,
        channels in 1usize..4,
        init in values(24..25),
        data in values(24..25),
        spread in 0.05f32..20.0,
        set_scale in 1e-3f32..2.0,
    ) {
        for per_channel in [false, true] {
            for config in built_in_configs(bits, narrow, POLICIES[policy], per_channel) {
                let q = registry::build(&config).unwrap();
                let axis = (per_channel && config.per_channel()).then_some(0);
                let grid = config.grid(init.iter().any(|v| *v < 0.0)).unwrap();
                let shape = [channels, init.len()];
                let x0: Vec<f32> = (0..channels).flat_map(|c| init.iter().map(move |v| v * spread * (c + 1) as f32)).collect();
                let x1: Vec<f32> = (0..channels).flat_map(|c| data.iter().map(move |v| v * spread * (c + 1) as f32)).collect();
                let layout = ChannelLayout::new(&shape, axis).unwrap();
                let banks = layout.channels;
                let mut bank = vec![0.0; MAX_PARAMETERS * banks];
                q.initialize(QuantizerInput::new(&x0, layout, grid).unwrap(), &mut ParamBankMut::new(&mut bank, banks).unwrap()).unwrap();
                let check = |bank: &[f32], what: &str| -> Result<(), TestCaseError> {
                    let view = ParamBank::new(bank, banks).unwrap();
                    let input = QuantizerInput::new(&x1, layout, grid).unwrap();
                    let mut y = vec![0.0; x1.len()];
                    q.forward(input, &view, &mut y).unwrap();
                    let inferable = q.to_inferable(&view, grid, axis).unwrap();
                    let z = inferable.fake_quantize(&x1, &shape).unwrap();
                    prop_assert_eq!(
                        z.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{:?} axis {:?} {}", config, axis, what
                    );
                    Ok(())
                };
                check(&bank, "initialised from data")?;
                // Parameters as training leaves them: set directly, where the quantizer allows.
                let zps: Vec<i32> = (0..banks).map(|c| if config.method().is_symmetric() { 0 } else { grid.quant_min() + c as i32 % 3 }).collect();
                let scales: Vec<f32> = (0..banks).map(|c| set_scale * (1 + c) as f32).collect();
                let mut scales_pow2 = scales.clone();
                if config.method() == QuantizationMethod::PowerOfTwo {
                    scales_pow2 = scales.iter().map(|s| 2f32.powi(s.log2().round() as i32)).collect();
                }
                let qp = QParams::new(scales_pow2, zps, axis).unwrap();
                if q.set_qparams(&qp, grid, &mut ParamBankMut::new(&mut bank, banks).unwrap()).is_ok() {
                    check(&bank, "parameters set")?;
                }
            }
        }
    }
}

// ----- integer model == fake-quantized model ---------------------------------------------------

type Mlp = (Linear<6, 9>, ReLU, Linear<9, 7>, ReLU, Linear<7, 4>);
type CnnBuilder = (
    (
        builders::Conv2d<2, 3, 3, 1, 1>,
        ReLU,
        builders::MaxPool2d<2>,
    ),
    (builders::Conv2d<3, 4, 2, 1, 0>, ReLU, builders::Flatten<16>),
    dfdx::nn::builders::Linear<16, 5>,
);

/// A residual CNN: a depthwise block, a block with a strided projection shortcut, global
/// average pooling.
type ResnetBuilder = (
    (builders::Conv2d<2, 4, 3, 1, 1>, ReLU),
    dfdx::nn::builders::Residual<(
        builders::DepthwiseConv2d<4, 3, 1, 1>,
        ReLU,
        builders::Conv2d<4, 4, 1>,
    )>,
    dfdx::nn::builders::GeneralizedResidual<
        (builders::Conv2d<4, 6, 3, 2, 1>, ReLU),
        builders::Conv2d<4, 6, 1, 2>,
    >,
    (
        ReLU,
        dfdx::nn::builders::AvgPoolGlobal,
        dfdx::nn::builders::Linear<6, 5>,
    ),
);

/// The policy of one random model: the same widths and methods in every layer.
fn policy(
    w_bits: u32,
    a_bits: u32,
    w_method: QuantizationMethod,
    id: TrainingMethod,
    per_channel: bool,
    rounding: RoundingPolicy,
) -> impl Fn(&str, LayerKind, Slot) -> quant::Result<Option<QuantizerSpec>> {
    move |_, kind, slot| {
        if !kind.quantized_by_default() || slot.optional {
            return Ok(None);
        }
        let config = match slot.target {
            QuantizationTarget::Weights => {
                let mut w = WeightsQuantizerConfig::new(id, w_method, w_bits);
                w.per_channel = per_channel;
                w.rounding = rounding;
                w.into()
            }
            QuantizationTarget::Activation => {
                let mut a = ActivationQuantizerConfig::new(id, QuantizationMethod::Uniform, a_bits);
                a.rounding = rounding;
                a.into()
            }
        };
        Ok(Some(QuantizerSpec {
            config,
            observer: ObserverConfig::MinMax,
        }))
    }
}

/// Largest |integer − fake-quantized| logit difference, and the logits' range.
fn compare<M, S>(
    model: &M,
    policy: &dyn quant_dfdx::convert::LayerPolicy,
    dev: &Cpu,
    calib: Tensor<S, f32, Cpu>,
    x: Tensor<S, f32, Cpu>,
    sample_shape: &[usize],
) -> (Vec<f32>, Vec<f32>)
where
    S: Shape,
    M: Convert,
    M::Quantized: ModuleMut<Tensor<S, f32, Cpu>, Error = QuantError>
        + Module<Tensor<S, f32, Cpu>, Error = QuantError>
        + quant_dfdx::layers::QuantizedModule,
    <M::Quantized as Module<Tensor<S, f32, Cpu>>>::Output: AsVec<f32>,
{
    let _ = dev;
    let mut q = convert_model(model, policy).unwrap();
    q.try_forward_mut(calib).unwrap();
    q.finish_calibration().unwrap();
    let fq = q.try_forward(x.clone()).unwrap().as_vec();
    let exported = export_model(&q, sample_shape, Default::default()).unwrap();
    let integer = IntegerModel::new(&exported).unwrap();
    (integer.forward(&x.as_vec()).unwrap(), fq)
}

/// `AsVec` for the logits of both models.
trait AsVec<E> {
    fn as_vec(&self) -> Vec<E>;
}
impl<S: Shape, T> AsVec<f32> for Tensor<S, f32, Cpu, T> {
    fn as_vec(&self) -> Vec<f32> {
        Tensor::as_vec(self)
    }
}

/// The documented tolerance ([`quant_runtime::integer::LOGIT_TOLERANCE`]) relative to the largest
/// |logit| of the batch.
fn assert_within_tolerance(int: &[f32], fq: &[f32], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(int.len(), fq.len());
    let range = fq.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let worst = int
        .iter()
        .zip(fq)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    prop_assert!(
        worst <= quant_runtime::integer::LOGIT_TOLERANCE * range,
        "{}: integer vs fake-quantized logits differ by {} (range {})",
        what,
        worst,
        range
    );
    Ok(())
}

proptest! {
    // A fixed seed: the tolerance holds except near rounding ties (see quant_runtime::integer), so
    // the cases are the same on every run.
    #![proptest_config(ProptestConfig { cases: 16, rng_seed: proptest::test_runner::RngSeed::Fixed(7), ..config() })]

    #[test]
    fn integer_mlp_matches_the_fake_quantized_mlp(
        seed in any::<u64>(),
        w_bits in 2u32..=8,
        a_bits in 2u32..=8,
        method in prop_oneof![Just(QuantizationMethod::Symmetric), Just(QuantizationMethod::PowerOfTwo), Just(QuantizationMethod::Uniform)],
        lsq in any::<bool>(),
        per_channel in any::<bool>(),
        // The five round-to-nearest policies; see LOGIT_TOLERANCE for Floor and Ceil.
        policy_i in 0usize..5,
        input_scale in 0.1f32..10.0,
    ) {
        let dev = Cpu::seed_from_u64(seed);
        let model = dev.build_module::<Mlp, f32>();
        let id = if lsq { TrainingMethod::Lsq } else { TrainingMethod::Ste };
        let method = if lsq && method == QuantizationMethod::PowerOfTwo { QuantizationMethod::Symmetric } else { method };
        let p = policy(w_bits, a_bits, method, id, per_channel, POLICIES[policy_i]);
        let calib = dev.sample_normal_like(&(32usize, Const::<6>)) * input_scale;
        let x = dev.sample_normal_like(&(16usize, Const::<6>)) * (input_scale * 1.3);
        let (int, fq) = compare(&model, &p, &dev, calib, x, &[6]);
        assert_within_tolerance(&int, &fq, &format!("W{w_bits}A{a_bits} {method} {id} per-channel {per_channel} {:?}", POLICIES[policy_i]))?;
    }

    #[test]
    fn integer_cnn_matches_the_fake_quantized_cnn(
        seed in any::<u64>(),
        w_bits in 2u32..=8,
        a_bits in 2u32..=8,
        lsq in any::<bool>(),
        per_channel in any::<bool>(),
    ) {
        let dev = Cpu::seed_from_u64(seed);
        let model = dev.build_module::<CnnBuilder, f32>();
        let id = if lsq { TrainingMethod::Lsq } else { TrainingMethod::Ste };
        let p = policy(w_bits, a_bits, QuantizationMethod::Symmetric, id, per_channel, RoundingPolicy::HalfEven);
        let calib = dev.sample_normal_like(&(8usize, Const::<2>, Const::<6>, Const::<6>));
        let x = dev.sample_normal_like(&(4usize, Const::<2>, Const::<6>, Const::<6>));
        let (int, fq) = compare(&model, &p, &dev, calib, x, &[2, 6, 6]);
        assert_within_tolerance(&int, &fq, &format!("CNN W{w_bits}A{a_bits} {id} per-channel {per_channel}"))?;
    }

    #[test]
    fn integer_resnet_matches_the_fake_quantized_resnet(
        seed in any::<u64>(),
        w_bits in 2u32..=8,
        a_bits in 2u32..=8,
        lsq in any::<bool>(),
        per_channel in any::<bool>(),
    ) {
        let dev = Cpu::seed_from_u64(seed);
        let model = dev.build_module::<ResnetBuilder, f32>();
        let id = if lsq { TrainingMethod::Lsq } else { TrainingMethod::Ste };
        let p = policy(w_bits, a_bits, QuantizationMethod::Symmetric, id, per_channel, RoundingPolicy::HalfEven);
        let calib = dev.sample_normal_like(&(8usize, Const::<2>, Const::<6>, Const::<6>));
        let x = dev.sample_normal_like(&(4usize, Const::<2>, Const::<6>, Const::<6>));
        let (int, fq) = compare(&model, &p, &dev, calib, x, &[2, 6, 6]);
        assert_within_tolerance(&int, &fq, &format!("ResNet W{w_bits}A{a_bits} {id} per-channel {per_channel}"))?;
    }
}
