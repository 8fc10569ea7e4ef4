//! `#[derive(QuantizedLayer)]` and `#[derive(QuantizedModel)]` end to end: a user's own layer
//! wrapped, its gradients checked against finite differences and trained; user model structs
//! (nested, with tuples both ways) converted, calibrated, trained, named, saved and loaded,
//! exported and run on integers.

use std::collections::BTreeMap;

use dfdx::nn::modules::{Linear, ReLU};
use dfdx::optim::{Adam, AdamConfig};
use dfdx::prelude::*;
use dfdx::tensor::CpuError;

use quant::prelude::*;
use quant_dfdx::convert::{convert_model, LayerKind};
use quant_dfdx::layers::{
    QuantizedModule, QuantizedModuleExt, QuantizerControl, QuantizerMode, QuantizerSpec, Slot,
};
use quant_dfdx::lower::export_model;
use quant_dfdx::observers::ObserverConfig;
use quant_dfdx::report::layer_report;
use quant_runtime::integer::IntegerModel;

// ----- a user's own layer -----------------------------------------------------------------------

/// `y = (x·Wᵀ) ⊙ gate + bias`: a linear map with a learned per-output gate.
#[derive(Clone, Debug, QuantizedLayer)]
#[quantized(name = QGatedMix, input)]
pub struct GatedMix<const N: usize> {
    /// `[N, N]`, quantized per output channel.
    #[quantized(weights, channels = N)]
    pub weight: Tensor<Rank2<N, N>, f32, Cpu>,
    /// `[N]`, quantized per tensor.
    #[quantized(weights)]
    pub gate: Tensor<Rank1<N>, f32, Cpu>,
    /// `[N]`, float.
    pub bias: Tensor<Rank1<N>, f32, Cpu>,
}

impl<B: Dim, const N: usize, T: Tape<f32, Cpu> + Merge<T>>
    Module<Tensor<(B, Const<N>), f32, Cpu, T>> for GatedMix<N>
{
    type Output = Tensor<(B, Const<N>), f32, Cpu, T>;
    type Error = CpuError;

    fn try_forward(&self, x: Tensor<(B, Const<N>), f32, Cpu, T>) -> Result<Self::Output, CpuError> {
        let y = x.try_matmul(self.weight.retaped::<T>().try_permute::<_, Axes2<1, 0>>()?)?;
        let shape = *y.shape();
        let y = y.try_mul(self.gate.retaped::<T>().try_broadcast_like(&shape)?)?;
        y.try_add(self.bias.retaped::<T>().try_broadcast_like(&shape)?)
    }
}

impl<const N: usize> NonMutableModule for GatedMix<N> {}

fn spec(config: impl Into<QuantizerConfig>) -> QuantizerSpec {
    QuantizerSpec {
        config: config.into(),
        observer: ObserverConfig::MinMax,
    }
}

fn weights(id: TrainingMethod, bits: u32) -> QuantizerSpec {
    spec(WeightsQuantizerConfig::new(
        id,
        QuantizationMethod::Symmetric,
        bits,
    ))
}

fn activations(id: TrainingMethod, bits: u32) -> QuantizerSpec {
    spec(ActivationQuantizerConfig::new(
        id,
        QuantizationMethod::Symmetric,
        bits,
    ))
}

/// The same weights and input spec for every layer.
fn uniform_policy(
    id: TrainingMethod,
    bits: u32,
) -> impl Fn(&str, LayerKind, Slot) -> quant::Result<Option<QuantizerSpec>> {
    move |_: &str, _: LayerKind, slot: Slot| {
        Ok(Some(match slot.target {
            QuantizationTarget::Weights => weights(id, bits),
            QuantizationTarget::Activation => activations(id, bits),
        }))
    }
}

fn gated_mix(dev: &Cpu) -> GatedMix<3> {
    GatedMix {
        weight: dev.tensor([[0.9, -0.4, 0.25], [0.1, 0.7, -1.3], [-0.6, 0.2, 0.45]]),
        gate: dev.tensor([1.2, -0.8, 0.5]),
        bias: dev.tensor([0.05, -0.1, 0.2]),
    }
}

/// Converts, calibrates on `x` and freezes.
fn calibrated(layer: &GatedMix<3>, x: &Tensor<Rank2<4, 3>, f32, Cpu>, bits: u32) -> QGatedMix<3> {
    let mut q = convert_model(layer, &uniform_policy(TrainingMethod::Ste, bits)).unwrap();
    q.try_forward_mut(x.clone()).unwrap();
    assert_eq!(q.finish_calibration().unwrap(), 3);
    q
}

fn loss_of(y: Tensor<Rank2<4, 3>, f32, Cpu>) -> f32 {
    y.as_vec().iter().map(|v| v * v).sum::<f32>() * 0.5
}

#[test]
fn wrapped_layer_names_its_quantizers_and_is_float_until_configured() {
    let dev = Cpu::seed_from_u64(0);
    let layer = gated_mix(&dev);
    let x = dev.sample_normal::<Rank2<4, 3>>();
    let mut q = QGatedMix::new(layer.clone(), &dev);
    assert_eq!(
        q.try_forward(x.clone()).unwrap().array(),
        layer.forward(x.clone()).array()
    );
    let mut names = Vec::new();
    q.visit_slots("mix", &mut |s| {
        assert_eq!(s.kind, LayerKind::Custom);
        names.push((s.name(), s.slot.per_channel));
        Ok(())
    })
    .unwrap();
    assert_eq!(
        names,
        [
            ("mix.input".to_string(), false),
            ("mix.weight".to_string(), true),
            ("mix.gate".to_string(), false)
        ]
    );
    // Converted (and named from the layer as the root): the `channels = N` field per channel,
    // the other per tensor although the policy asks for per-channel weights.
    let mut q = convert_model(&layer, &uniform_policy(TrainingMethod::Lsq, 4)).unwrap();
    let described: Vec<(String, bool)> = q
        .quantizers()
        .unwrap()
        .into_iter()
        .map(|(n, d)| (n, d.per_channel))
        .collect();
    assert_eq!(
        described,
        [
            ("input".to_string(), false),
            ("weight".to_string(), true),
            ("gate".to_string(), false),
        ]
    );
}

/// The gradient reaching the float weights is the straight-through gradient: the derivative of
/// the loss with respect to the quantized weight the forward pass used (by central finite
/// differences of the float layer at that weight), masked to 0 where the weight was clipped.
#[test]
fn gradients_reach_the_float_weights_as_finite_differences_of_the_straight_through_surrogate() {
    let dev = Cpu::seed_from_u64(1);
    let layer = gated_mix(&dev);
    let x = dev.sample_normal::<Rank2<4, 3>>();
    let mut q = calibrated(&layer, &x, 4);
    // Push one weight far outside its channel's range: clipped, so its gradient must be 0.
    let mut w = q.layer.weight.array();
    w[1][2] = 40.0;
    q.layer.weight = dev.tensor(w);

    let grads = q.alloc_grads();
    let y = q.try_forward(x.clone().traced(grads)).unwrap();
    let grads = (y.square().sum() * 0.5).backward();
    let dw = grads.get(&q.layer.weight).array();
    let dgate = grads.get(&q.layer.gate).array();

    // The surrogate: the float layer evaluated at the quantized weights and input.
    let xq = q.input_quantizer.fake_quantize(x.clone()).unwrap();
    let wq = q
        .weight_quantizer
        .fake_quantize(q.layer.weight.clone())
        .unwrap();
    let gq = q
        .gate_quantizer
        .fake_quantize(q.layer.gate.clone())
        .unwrap();
    let at = |w: [[f32; 3]; 3], g: [f32; 3]| {
        let l = GatedMix::<3> {
            weight: dev.tensor(w),
            gate: dev.tensor(g),
            bias: q.layer.bias.clone(),
        };
        loss_of(l.forward(xq.clone()))
    };
    // Straight-through: the gradient passes where the weight was not clipped, i.e. where it
    // lies within half a step of its quantized value.
    let w_scales = q
        .weight_quantizer
        .qparams()
        .unwrap()
        .unwrap()
        .scales()
        .to_vec();
    let g_scale = q.gate_quantizer.qparams().unwrap().unwrap().scales()[0];
    let passes = |w: f32, wq: f32, s: f32| (w - wq).abs() <= 0.5 * s * (1.0 + 1e-4);
    let h = 1e-2;
    let (w, g) = (q.layer.weight.array(), q.layer.gate.array());
    let (w0, g0) = (wq.array(), gq.array());
    let mut clipped = 0;
    for i in 0..3 {
        for j in 0..3 {
            let (mut up, mut down) = (w0, w0);
            up[i][j] += h;
            down[i][j] -= h;
            let fd = (at(up, g0) - at(down, g0)) / (2.0 * h);
            let expected = if passes(w[i][j], w0[i][j], w_scales[i]) {
                fd
            } else {
                clipped += 1;
                0.0
            };
            assert!(
                (dw[i][j] - expected).abs() <= 1e-2 * (1.0 + expected.abs()),
                "dW[{i}][{j}] = {} vs {expected}",
                dw[i][j]
            );
        }
        let (mut up, mut down) = (g0, g0);
        up[i] += h;
        down[i] -= h;
        let fd = (at(w0, up) - at(w0, down)) / (2.0 * h);
        let expected = if passes(g[i], g0[i], g_scale) {
            fd
        } else {
            0.0
        };
        assert!(
            (dgate[i] - expected).abs() <= 1e-2 * (1.0 + expected.abs()),
            "dgate[{i}] = {} vs {expected}",
            dgate[i]
        );
    }
    assert!(!passes(w[1][2], w0[1][2], w_scales[1]));
    assert!((1..9).contains(&clipped), "{clipped} weights clipped");
    // The clipped weight used the clamped value, not 40.
    assert!(wq.array()[1][2] < 5.0);
}

#[test]
fn wrapped_layer_trains_its_weights_and_quantizer_scales_with_adam() {
    let dev = Cpu::seed_from_u64(2);
    // `build` leaves rank-1 tensors at zero (biases); give the gates values of their own.
    let mut layer = GatedMix::<8>::build(&dev).unwrap();
    layer.gate = dev.sample_uniform::<Rank1<8>>() + 0.5;
    let mut teacher = GatedMix::<8>::build(&dev).unwrap();
    teacher.gate = dev.sample_uniform::<Rank1<8>>() + 0.5;
    teacher.bias = dev.sample_normal::<Rank1<8>>() * 0.1;
    let x = dev.sample_normal::<Rank2<32, 8>>();
    let target = teacher.forward(x.clone());

    let mut q = convert_model(&layer, &uniform_policy(TrainingMethod::Lsq, 4)).unwrap();
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    assert_eq!(q.set_mode("*", QuantizerMode::Training).unwrap(), 3);

    let scales_before = q.weight_quantizer.learned.as_vec();
    let input_scale_before = q.input_quantizer.learned.as_vec();
    let weight_before = q.layer.weight.as_vec();
    let gate_before = q.layer.gate.as_vec();
    let mut opt = Adam::new(
        &q,
        AdamConfig {
            lr: 1e-2,
            ..Default::default()
        },
    );
    let mut losses = Vec::new();
    for step in 0..40 {
        let grads = q.alloc_grads();
        let y = q.try_forward_mut(x.clone().traced(grads)).unwrap();
        let loss = mse_loss(y, target.clone());
        losses.push(loss.array());
        let grads = loss.backward();
        if step == 0 {
            // Gradients reach the quantizers' own parameters (LSQ scales).
            assert!(grads
                .get(&q.weight_quantizer.learned)
                .as_vec()
                .iter()
                .any(|g| *g != 0.0));
            assert!(grads
                .get(&q.gate_quantizer.learned)
                .as_vec()
                .iter()
                .any(|g| *g != 0.0));
            assert!(grads
                .get(&q.input_quantizer.learned)
                .as_vec()
                .iter()
                .any(|g| *g != 0.0));
        }
        opt.update(&mut q, &grads).unwrap();
    }
    assert!(
        losses[39] < 0.5 * losses[0],
        "loss should fall: {:?}",
        losses
    );
    assert_ne!(q.weight_quantizer.learned.as_vec(), scales_before);
    assert_ne!(q.input_quantizer.learned.as_vec(), input_scale_before);
    assert_ne!(q.layer.weight.as_vec(), weight_before);
    assert_ne!(q.layer.gate.as_vec(), gate_before);
}

/// An input-only layer: `y = relu(x)²`, written as the user would.
#[derive(Clone, Debug, Default, QuantizedLayer)]
#[quantized(input)]
pub struct SquaredRelu {}

impl<S: Shape, T: Tape<f32, Cpu>> Module<Tensor<S, f32, Cpu, T>> for SquaredRelu {
    type Output = Tensor<S, f32, Cpu, T>;
    type Error = CpuError;

    fn try_forward(&self, x: Tensor<S, f32, Cpu, T>) -> Result<Self::Output, CpuError> {
        x.try_relu()?.try_square()
    }
}

impl NonMutableModule for SquaredRelu {}

#[test]
fn an_input_only_layer_quantizes_its_input() {
    let dev = Cpu::seed_from_u64(3);
    let x = dev.sample_normal::<Rank2<4, 5>>();
    let mut q = convert_model(&SquaredRelu {}, &uniform_policy(TrainingMethod::Ste, 3)).unwrap();
    assert_eq!(q.quantizers().unwrap().len(), 1);
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    let xq = q.input_quantizer.fake_quantize(x.clone()).unwrap();
    assert_eq!(
        q.try_forward(x.clone()).unwrap().array(),
        SquaredRelu {}.forward(xq).array()
    );
    assert_ne!(
        q.try_forward(x.clone()).unwrap().array(),
        SquaredRelu {}.forward(x).array()
    );
}

// ----- user models --------------------------------------------------------------------------------

/// Written dfdx-style: generic over the dtype and device.
#[derive(Clone, Debug, QuantizedModel)]
pub struct Encoder<E: Dtype, D: Device<E>> {
    /// 16 → 32.
    pub fc1: Linear<16, 32, E, D>,
    /// Activation.
    pub act: ReLU,
    /// 32 → 16.
    pub fc2: Linear<32, 16, E, D>,
}

/// A model holding another derived model and a tuple.
#[derive(Clone, Debug, QuantizedModel)]
pub struct Net<E: Dtype, D: Device<E>> {
    /// Feature extractor.
    pub encoder: Encoder<E, D>,
    /// Classifier.
    pub head: (ReLU, Linear<16, 4, E, D>),
}

fn int8_policy(name: &str, kind: LayerKind, slot: Slot) -> quant::Result<Option<QuantizerSpec>> {
    assert_eq!(kind, LayerKind::Linear, "{name}");
    uniform_policy(TrainingMethod::Lsq, 8)(name, kind, slot)
}

#[test]
fn nested_model_converts_calibrates_trains_saves_exports_and_runs_on_integers() {
    let dev = Cpu::seed_from_u64(4);
    let float = Net::<f32, Cpu>::build(&dev);
    let x = dev.sample_normal::<Rank2<16, 16>>();
    let target = dev.sample_normal::<Rank2<16, 4>>();

    let mut q: QNet = convert_model(&float, &int8_policy).unwrap();
    // Converted and calibrating: a pass-through forward equals the float model's.
    assert_eq!(
        q.try_forward_mut(x.clone()).unwrap().array(),
        float.forward(x.clone()).array()
    );
    assert_eq!(q.finish_calibration().unwrap(), 6);
    let names: Vec<String> = q
        .quantizers()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "encoder.fc1.input",
            "encoder.fc1.weights",
            "encoder.fc2.input",
            "encoder.fc2.weights",
            "head.1.input",
            "head.1.weights",
        ]
    );
    // Per-layer report after calibration: layers named by field, nested; 8 bits stay close to
    // the float model.
    let report = layer_report(&q, &[16], &x.as_vec()).unwrap();
    let layers: Vec<&str> = report.iter().map(|l| l.layer.as_str()).collect();
    assert_eq!(layers, ["encoder.fc1", "encoder.fc2", "head.1"]);
    for l in &report {
        assert_eq!(l.quantizers.len(), 2, "{l:?}");
        assert!(l.sqnr_db.is_some_and(|s| s > 25.0), "{l:?}");
    }

    assert_eq!(q.set_mode("encoder.*", QuantizerMode::Training).unwrap(), 4);
    assert_eq!(q.set_mode("head.*", QuantizerMode::Training).unwrap(), 2);

    let mut opt = Adam::new(
        &q,
        AdamConfig {
            lr: 1e-3,
            ..Default::default()
        },
    );
    let fc1_before = q.encoder.fc1.weight.as_vec();
    let mut losses = Vec::new();
    for _ in 0..10 {
        let grads = q.alloc_grads();
        let y = q.try_forward_mut(x.clone().traced(grads)).unwrap();
        let loss = mse_loss(y, target.clone());
        losses.push(loss.array());
        opt.update(&mut q, &loss.backward()).unwrap();
    }
    assert!(losses[9] < losses[0], "loss should fall: {losses:?}");
    assert_ne!(q.encoder.fc1.weight.as_vec(), fc1_before);

    // Save, rebuild by converting the float model again, load: identical outputs.
    let dir = std::env::temp_dir().join(format!("quant-derive-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("net.safetensors");
    q.save_safetensors(&path).unwrap();
    let y = q.try_forward(x.clone()).unwrap();
    let mut fresh = convert_model(&float, &int8_policy).unwrap();
    fresh.load_safetensors(&path).unwrap();
    assert_eq!(fresh.try_forward(x.clone()).unwrap().array(), y.array());
    assert_eq!(
        fresh.encoder.fc2.weights_quantizer.mode(),
        QuantizerMode::Training
    );
    std::fs::remove_dir_all(&dir).ok();

    // Export and integer inference agree with the fake-quantized model.
    let exported = export_model(&q, &[16], BTreeMap::new()).unwrap();
    let integer = IntegerModel::new(&exported).unwrap();
    let int_logits = integer.forward(&x.as_vec()).unwrap();
    let fq_logits = y.as_vec();
    let range = fq_logits.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = int_logits
        .iter()
        .zip(&fq_logits)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        worst <= 1e-3 * range,
        "integer vs fake-quantized logits differ by {worst} (range {range})"
    );
}

#[test]
fn derived_models_and_tuples_nest_both_ways() {
    let dev = Cpu::seed_from_u64(5);
    type Tupled = (Encoder<f32, Cpu>, ReLU, Linear<16, 4, f32, Cpu>);
    let float: Tupled = (Encoder::build(&dev), ReLU, BuildModule::build(&dev));
    let x = dev.sample_normal::<Rank2<8, 16>>();
    let mut q = convert_model(&float, &int8_policy).unwrap();
    let names: Vec<String> = q
        .quantizers()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names[0], "0.fc1.input");
    assert_eq!(names[5], "2.weights");
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    let y = q.try_forward(x.clone()).unwrap();
    assert_ne!(y.array(), float.forward(x.clone()).array());
    // The tuple of a twin trains with dfdx optimizers like any module.
    q.set_mode("*", QuantizerMode::Training).unwrap();
    let mut opt = Adam::new(&q, AdamConfig::default());
    let grads = q.alloc_grads();
    let loss = q
        .try_forward_mut(x.clone().traced(grads))
        .unwrap()
        .square()
        .mean();
    opt.update(&mut q, &loss.backward()).unwrap();
    assert_ne!(q.try_forward(x).unwrap().array(), y.array());
}

/// A concrete (f32, Cpu) model holding a user's layer: built with its inherent `build`.
#[derive(Clone, Debug, QuantizedModel)]
#[quantized(name = QuantMixer)]
pub struct Mixer {
    /// The user's layer.
    pub mix: GatedMix<16>,
    /// Activation.
    pub act: ReLU,
    /// Readout.
    pub out: Linear<16, 4, f32, Cpu>,
}

#[test]
fn concrete_model_with_a_user_layer_builds_converts_and_trains() {
    let dev = Cpu::seed_from_u64(6);
    let mut float = Mixer::build(&dev).unwrap();
    float.mix.gate = dev.ones();
    // dfdx's visitors rebuild a concrete struct as itself.
    let copy: Option<Mixer> = float.to_device(&dev);
    assert_eq!(copy.unwrap().out.weight.as_vec(), float.out.weight.as_vec());
    assert!(float.mix.weight.as_vec().iter().any(|w| *w != 0.0));

    let policy = |name: &str, kind: LayerKind, slot: Slot| match (name, kind) {
        ("mix", LayerKind::Custom) | ("out", LayerKind::Linear) => {
            uniform_policy(TrainingMethod::Lsq, 6)(name, kind, slot)
        }
        other => panic!("unexpected layer {other:?}"),
    };
    let mut q: QuantMixer = convert_model(&float, &policy).unwrap();
    let x = dev.sample_normal::<Rank2<8, 16>>();
    q.try_forward_mut(x.clone()).unwrap();
    assert_eq!(q.finish_calibration().unwrap(), 5);
    let names: Vec<String> = q
        .quantizers()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "mix.input",
            "mix.weight",
            "mix.gate",
            "out.input",
            "out.weights",
        ]
    );
    q.set_mode("*", QuantizerMode::Training).unwrap();
    let target = dev.sample_normal::<Rank2<8, 4>>();
    let mut opt = Adam::new(
        &q,
        AdamConfig {
            lr: 1e-2,
            ..Default::default()
        },
    );
    let mut losses = Vec::new();
    for _ in 0..20 {
        let grads = q.alloc_grads();
        let loss = mse_loss(
            q.try_forward_mut(x.clone().traced(grads)).unwrap(),
            target.clone(),
        );
        losses.push(loss.array());
        opt.update(&mut q, &loss.backward()).unwrap();
    }
    assert!(losses[19] < losses[0], "loss should fall: {losses:?}");
    // The user's layer has no graph form: the report lists every layer's quantizers, without
    // SQNRs, and export says why it cannot run on integers.
    let report = layer_report(&q, &[16], &x.as_vec()).unwrap();
    let layers: Vec<&str> = report.iter().map(|l| l.layer.as_str()).collect();
    assert_eq!(layers, ["mix", "out"]);
    assert!(report
        .iter()
        .all(|l| l.quantizers.len() >= 2 && l.sqnr_db.is_none()));
    let err = export_model(&q, &[16], BTreeMap::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layer `mix`")
            && err.contains("GatedMix")
            && err.contains("#[derive(QuantizedLayer)]"),
        "{err}"
    );
}

/// A layer written dfdx-style (generic over the dtype and device, with a const parameter): a
/// learned per-feature scale.
#[derive(Clone, Debug, QuantizedLayer)]
pub struct Scale<const N: usize, E: Dtype, D: Device<E>> {
    /// One factor per feature, quantized per channel.
    #[quantized(weights, channels = N)]
    pub factor: Tensor<Rank1<N>, E, D>,
}

impl<B: Dim, const N: usize, T: Tape<f32, Cpu> + Merge<T>>
    Module<Tensor<(B, Const<N>), f32, Cpu, T>> for Scale<N, f32, Cpu>
{
    type Output = Tensor<(B, Const<N>), f32, Cpu, T>;
    type Error = CpuError;

    fn try_forward(&self, x: Tensor<(B, Const<N>), f32, Cpu, T>) -> Result<Self::Output, CpuError> {
        let shape = *x.shape();
        x.try_mul(self.factor.retaped::<T>().try_broadcast_like(&shape)?)
    }
}

impl<const N: usize, E: Dtype, D: Device<E>> NonMutableModule for Scale<N, E, D> {}

/// A model with a const parameter, holding the generic layer.
#[derive(Clone, Debug, QuantizedModel)]
#[quantized(name = QuantWide)]
pub struct Wide<const H: usize, E: Dtype, D: Device<E>> {
    /// 8 → H.
    pub fc: Linear<8, H, E, D>,
    /// Per-feature scale.
    pub scale: Scale<H, E, D>,
    /// H → 2.
    pub out: Linear<H, 2, E, D>,
}

#[test]
fn generic_layers_and_models_with_const_parameters() {
    let dev = Cpu::seed_from_u64(7);
    let mut float = Wide::<12, f32, Cpu>::build(&dev);
    float.scale.factor = dev.sample_uniform() + 0.5;
    // dfdx-style structs map `To` to themselves: a dtype conversion keeps the type.
    let _: Wide<12, f64, Cpu> = float.to_dtype::<f64>();

    let x = dev.sample_normal::<Rank2<8, 8>>();
    let mut q: QuantWide<12> =
        convert_model(&float, &uniform_policy(TrainingMethod::Lsq, 8)).unwrap();
    q.try_forward_mut(x.clone()).unwrap();
    assert_eq!(q.finish_calibration().unwrap(), 5);
    assert!(q.scale.factor_quantizer.describe().unwrap().per_channel);
    let y = q.try_forward(x.clone()).unwrap();
    let y_float = float.forward(x.clone());
    let err: f32 = y
        .as_vec()
        .iter()
        .zip(y_float.as_vec())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(err > 0.0 && err < 0.1, "8-bit error {err}");
    // The twin maps `To` field by field, like a tuple; the wrapper of a layer that is generic
    // over the dtype is still f32-only, so dfdx's visitors rebuild it only as itself.
    let q64 = q.to_dtype::<f64>();
    assert_eq!(
        q64.fc.weight.array()[0][0],
        q.fc.weight.array()[0][0] as f64
    );
    assert!(q64.scale.is_none());
    assert!(q.to_dtype::<f32>().scale.is_some());
}

/// Seven fields: dfdx's field lists hold at most six, so the visit nests.
#[derive(Clone, Debug, QuantizedModel)]
pub struct Deep<E: Dtype, D: Device<E>> {
    /// Layer 1.
    pub l1: Linear<4, 8, E, D>,
    /// Activation 1.
    pub a1: ReLU,
    /// Layer 2.
    pub l2: Linear<8, 8, E, D>,
    /// Activation 2.
    pub a2: ReLU,
    /// Layer 3.
    pub l3: Linear<8, 8, E, D>,
    /// Activation 3.
    pub a3: ReLU,
    /// Layer 4.
    pub l4: Linear<8, 2, E, D>,
}

#[test]
fn models_with_more_than_six_fields_save_and_load() {
    let dev = Cpu::seed_from_u64(8);
    let float = Deep::<f32, Cpu>::build(&dev);
    let x = dev.sample_normal::<Rank2<5, 4>>();
    let mut q = convert_model(&float, &int8_policy).unwrap();
    q.try_forward_mut(x.clone()).unwrap();
    assert_eq!(q.finish_calibration().unwrap(), 8);
    let dir = std::env::temp_dir().join(format!("quant-derive-deep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("deep.safetensors");
    q.save_safetensors(&path).unwrap();
    let names: Vec<String> =
        ::safetensors::SafeTensors::deserialize(&std::fs::read(&path).unwrap())
            .unwrap()
            .names()
            .into_iter()
            .cloned()
            .collect();
    assert!(
        names.contains(&"l4.weights_quantizer.learned".to_string()),
        "{names:?}"
    );
    let mut fresh = convert_model(&float, &int8_policy).unwrap();
    fresh.load_safetensors(&path).unwrap();
    assert_eq!(
        fresh.try_forward(x.clone()).unwrap().array(),
        q.try_forward(x).unwrap().array()
    );
    std::fs::remove_dir_all(&dir).ok();
}
