//! Quantized layers end to end: conversion of a float tuple model, modes by name, calibration,
//! training of quantizer parameters with dfdx optimisers, save/load.

use dfdx::optim::{Adam, AdamConfig};
use dfdx::prelude::*;
use quant_core::{
    ActivationQuantizerConfig, QuantizationMethod, QuantizerConfig, TrainingMethod,
    WeightsQuantizerConfig,
};
use quant_dfdx::convert::{convert_model, LayerKind};
use quant_dfdx::layers::{
    QuantizedModuleExt, QuantizerControl, QuantizerMode, QuantizerSpec, Slot,
};
use quant_dfdx::observers::ObserverConfig;

type Mlp = (Linear<16, 32>, ReLU, Linear<32, 4>);
type MlpModel = (
    dfdx::nn::modules::Linear<16, 32, f32, Cpu>,
    ReLU,
    dfdx::nn::modules::Linear<32, 4, f32, Cpu>,
);

fn spec(config: QuantizerConfig) -> QuantizerSpec {
    QuantizerSpec {
        config,
        observer: ObserverConfig::MinMax,
    }
}

/// W4A4 LSQ everywhere, except layer `2`'s input left float when `keep_last_input_float`.
fn lsq_w4a4(
    keep_last_input_float: bool,
) -> impl Fn(&str, LayerKind, Slot) -> quant_core::Result<Option<QuantizerSpec>> {
    move |name: &str, kind: LayerKind, slot: Slot| {
        assert_eq!(kind, LayerKind::Linear);
        Ok(match slot {
            Slot::WEIGHTS => Some(spec(
                WeightsQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::Symmetric, 4)
                    .into(),
            )),
            _ if keep_last_input_float && name == "2" => None,
            _ => Some(spec(
                ActivationQuantizerConfig::new(
                    TrainingMethod::Lsq,
                    QuantizationMethod::Symmetric,
                    4,
                )
                .into(),
            )),
        })
    }
}

fn setup() -> (Cpu, MlpModel, Tensor<Rank2<8, 16>, f32, Cpu>) {
    let dev = Cpu::seed_from_u64(1);
    let model = dev.build_module::<Mlp, f32>();
    let x = dev.sample_normal::<Rank2<8, 16>>();
    (dev, model, x)
}

#[test]
fn converted_model_in_disabled_mode_gives_exactly_the_float_outputs() {
    let (_dev, model, x) = setup();
    let mut q = convert_model(&model, &lsq_w4a4(false)).unwrap();
    // Freshly converted: calibrating (pass-through) — forward_mut observes, outputs are float.
    let y_float = model.forward(x.clone());
    let y_calib = q.try_forward_mut(x.clone()).unwrap();
    assert_eq!(y_float.array(), y_calib.array());
    assert_eq!(q.set_mode("*", QuantizerMode::Disabled).unwrap(), 4);
    assert_eq!(q.try_forward(x.clone()).unwrap().array(), y_float.array());
}

#[test]
fn quantizers_are_reachable_by_dotted_name() {
    let (_dev, model, _x) = setup();
    let mut q = convert_model(&model, &lsq_w4a4(true)).unwrap();
    let names: Vec<String> = q
        .quantizers()
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["0.input", "0.weights", "2.weights"]);
    assert_eq!(q.set_mode("2.*", QuantizerMode::Disabled).unwrap(), 1);
    // Quantizing before calibration is an error naming the quantizer.
    let err = q
        .set_mode("0.weights", QuantizerMode::Training)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("0.weights: quantizer is not initialised"),
        "{err}"
    );
    let err = q
        .set_mode("[", QuantizerMode::Training)
        .unwrap_err()
        .to_string();
    assert!(err.contains("name pattern"), "{err}");
}

#[test]
fn calibration_then_training_updates_weights_and_quantizer_parameters() {
    let (dev, model, x) = setup();
    let mut q = convert_model(&model, &lsq_w4a4(false)).unwrap();
    for _ in 0..3 {
        q.try_forward_mut(x.clone()).unwrap();
    }
    assert_eq!(q.finish_calibration().unwrap(), 4);
    let y_float = model.forward(x.clone());
    let y_ptq = q.try_forward(x.clone()).unwrap();
    assert_ne!(
        y_float.array(),
        y_ptq.array(),
        "4-bit quantization must change the outputs"
    );
    let err: f32 = (y_float.clone() - y_ptq.clone())
        .abs()
        .mean::<Rank0, _>()
        .array();
    let mag: f32 = y_float.clone().abs().mean::<Rank0, _>().array();
    assert!(err < 0.5 * mag, "PTQ error {err} vs magnitude {mag}");

    // Input of layer 0 quantized to 16 levels: the layer's effective input is on the grid.
    let qp = q.0.input_quantizer.qparams().unwrap().unwrap();
    let grid = q.0.input_quantizer.grid().unwrap().unwrap();
    let (s, z) = (qp.scales()[0], qp.zero_points()[0] as f32);
    let xq =
        q.0.input_quantizer
            .fake_quantize(x.clone())
            .unwrap()
            .as_vec();
    let mut levels = std::collections::BTreeSet::new();
    for v in &xq {
        let k = v / s + z;
        assert!(
            (k - k.round()).abs() < 1e-3,
            "{v} is not on the grid of scale {s}"
        );
        assert!(
            (grid.quant_min() as f32..=grid.quant_max() as f32).contains(&k.round()),
            "{v} lies outside the 4-bit grid"
        );
        levels.insert(k.round() as i32);
    }
    assert!(levels.len() > 4 && levels.len() <= 16, "{levels:?}");

    q.set_mode("*", QuantizerMode::Training).unwrap();
    let scale_before = q.0.weights_quantizer.learned.as_vec();
    let w_before = q.0.weight.as_vec();
    let target = dev.sample_normal::<Rank2<8, 4>>();
    let mut opt = Adam::new(
        &q,
        AdamConfig {
            lr: 2e-3,
            ..Default::default()
        },
    );
    let mut losses = Vec::new();
    for _ in 0..30 {
        let grads = q.alloc_grads();
        let y = q.try_forward_mut(x.clone().traced(grads)).unwrap();
        let loss = mse_loss(y, target.clone());
        losses.push(loss.array());
        let grads = loss.backward();
        opt.update(&mut q, &grads).unwrap();
    }
    assert!(losses[29] < 0.7 * losses[0], "loss {losses:?}");
    assert_ne!(
        q.0.weights_quantizer.learned.as_vec(),
        scale_before,
        "LSQ scales must train"
    );
    assert_ne!(q.0.weight.as_vec(), w_before, "weights must train");
}

#[test]
fn frozen_quantizers_do_not_move_and_save_load_reproduces_outputs() {
    let (dev, model, x) = setup();
    let mut q = convert_model(&model, &lsq_w4a4(false)).unwrap();
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    q.set_mode("*", QuantizerMode::Training).unwrap();
    q.set_mode("0.input", QuantizerMode::Frozen).unwrap();
    let frozen_before = q.0.input_quantizer.learned.as_vec();
    let mut opt = Adam::new(
        &q,
        AdamConfig {
            lr: 2e-3,
            ..Default::default()
        },
    );
    let target = dev.sample_normal::<Rank2<8, 4>>();
    for _ in 0..5 {
        let grads = q.alloc_grads();
        let y = q.try_forward_mut(x.clone().traced(grads)).unwrap();
        let grads = mse_loss(y, target.clone()).backward();
        // A frozen quantizer's parameters get no gradient: dfdx reports them as unused.
        match opt.update(&mut q, &grads) {
            Ok(()) | Err(OptimizerUpdateError::UnusedParams(_)) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(q.0.input_quantizer.learned.as_vec(), frozen_before);

    let dir = std::env::temp_dir().join(format!("quant-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    q.save_safetensors(&path).unwrap();
    let y = q.try_forward(x.clone()).unwrap();

    // Rebuild from the same float model and policy, then load the tensors and scalars.
    let mut fresh = convert_model(&model, &lsq_w4a4(false)).unwrap();
    fresh.load_safetensors(&path).unwrap();
    assert_eq!(fresh.0.input_quantizer.mode(), QuantizerMode::Frozen);
    assert_eq!(fresh.0.weights_quantizer.mode(), QuantizerMode::Training);
    assert_eq!(fresh.try_forward(x.clone()).unwrap().array(), y.array());
    std::fs::remove_dir_all(&dir).ok();
}

/// In training, `QLinear` quantizes its weights inside its product (no tensor, no zeroed
/// gradient buffer for the quantized weights): the outputs and every gradient (the input's, the
/// weights', the bias's, both quantizers' parameters') must be those of the quantizer's op
/// followed by the product, bit for bit, on a batch of vectors and on a batch of sequences.
#[test]
fn qlinear_in_training_gives_the_bits_of_its_quantizer_op_then_its_product() {
    let (dev, model, x) = setup();
    let mut q = convert_model(&model, &lsq_w4a4(false)).unwrap();
    for _ in 0..3 {
        q.try_forward_mut(x.clone()).unwrap();
    }
    q.finish_calibration().unwrap();
    q.set_mode("*", QuantizerMode::Training).unwrap();
    let layer = q.0.clone();

    fn check<S: Shape<Concrete = [usize; N]>, const N: usize, O: Shape>(
        layer: &quant_dfdx::layers::QLinear<16, 32>,
        x: Tensor<S, f32, Cpu>,
        out_weights: Tensor<O, f32, Cpu>,
        label: &str,
    ) where
        Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>: quant_dfdx::nn::LinearInput<
            16,
            32,
            Tape = OwnedTape<f32, Cpu>,
            Output = Tensor<O, f32, Cpu, OwnedTape<f32, Cpu>>,
        >,
        quant_dfdx::layers::QLinear<16, 32>: Module<
            Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>,
            Output = Tensor<O, f32, Cpu, OwnedTape<f32, Cpu>>,
            Error = quant_core::QuantError,
        >,
    {
        // The input quantizer's parameters get a gradient only while it quantizes.
        let input_quantizes = layer.input_quantizer.mode() == QuantizerMode::Training;
        let grads_of = |grads: &dfdx::tensor::Gradients<f32, Cpu>, x: &Tensor<S, f32, Cpu>| {
            let mut all = vec![
                grads.get(x).as_vec(),
                grads.get(&layer.weight).as_vec(),
                grads.get(&layer.bias).as_vec(),
                grads.get(&layer.weights_quantizer.learned).as_vec(),
            ];
            if input_quantizes {
                all.push(grads.get(&layer.input_quantizer.learned).as_vec());
            }
            all
        };
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();

        // Leaky: the input's gradient is kept too.
        let grads = dfdx::tensor::Gradients::leaky();
        let y = layer.try_forward(x.clone().traced(grads)).unwrap();
        let y_values = y.as_vec();
        let fused = grads_of(&(y * out_weights.clone()).sum().backward(), &x);

        // The composition the layer ran before: each quantizer's op, then the product.
        let grads = dfdx::tensor::Gradients::leaky();
        let xq = layer
            .input_quantizer
            .fake_quantize(x.clone().traced(grads))
            .unwrap();
        let w = layer
            .weights_quantizer
            .fake_quantize(layer.weight.retaped::<OwnedTape<f32, Cpu>>())
            .unwrap();
        let b = quant_dfdx::layers::layer_bias(
            &layer.bias,
            &layer.input_quantizer,
            &layer.weights_quantizer,
        )
        .unwrap();
        let y = quant_dfdx::nn::linear(xq, w, b).unwrap();
        assert_eq!(bits(&y.as_vec()), bits(&y_values), "{label}: outputs");
        let composed = grads_of(&(y * out_weights).sum().backward(), &x);
        let names = [
            "input",
            "weight",
            "bias",
            "weights quantizer",
            "input quantizer",
        ];
        assert_eq!(fused.len(), composed.len());
        for ((f, c), name) in fused.iter().zip(&composed).zip(names) {
            assert_eq!(bits(f), bits(c), "{label}: {name} gradient");
            if name != "input quantizer" {
                assert!(
                    f.iter().any(|g| *g != 0.0),
                    "{label}: {name} gradient is all zero"
                );
            }
        }
    }

    check(
        &layer,
        x.clone(),
        dev.sample_normal::<Rank2<8, 32>>(),
        "batch of vectors",
    );
    check(
        &layer,
        dev.sample_normal::<Rank3<2, 5, 16>>(),
        dev.sample_normal::<Rank3<2, 5, 32>>(),
        "batch of sequences",
    );
    // Weights only (the input float): the weights still quantized inside the product.
    let mut weights_only = layer.clone();
    weights_only
        .input_quantizer
        .set_mode(QuantizerMode::Disabled)
        .unwrap();
    check(
        &weights_only,
        x,
        dev.sample_normal::<Rank2<8, 32>>(),
        "weights only",
    );
}

/// A quantizer whose parameters went bad in training stops the step with an error that names
/// it, whether the layer quantizes its weights inside its product (with a tape) or as an op of
/// their own (without): a NaN zero point, caught as the op is prepared, and an infinite step
/// size with the input float (no bias codes to compute first), caught in the forward pass.
#[test]
fn a_bad_parameter_in_training_is_an_error_naming_the_quantizer() {
    let (_dev, model, x) = setup();
    let mut q = convert_model(&model, &lsq_w4a4(false)).unwrap();
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    q.set_mode("*", QuantizerMode::Training).unwrap();

    let mut nan_zero_point = q.0.clone();
    let mut fixed = nan_zero_point.weights_quantizer.fixed.as_vec();
    // Slot 1 holds the zero points, one per output channel.
    fixed[32..64].fill(f32::NAN);
    nan_zero_point.weights_quantizer.fixed.copy_from(&fixed);

    let mut infinite_scale = q.0.clone();
    infinite_scale
        .input_quantizer
        .set_mode(QuantizerMode::Disabled)
        .unwrap();
    let mut learned = infinite_scale.weights_quantizer.learned.as_vec();
    // Slot 0 holds the step sizes.
    learned[3] = f32::INFINITY;
    infinite_scale.weights_quantizer.learned.copy_from(&learned);

    for (layer, what) in [(nan_zero_point, "zero_point"), (infinite_scale, "scale")] {
        let taped = layer
            .try_forward(x.clone().traced(dfdx::tensor::Gradients::leaky()))
            .unwrap_err()
            .to_string();
        let untaped = layer.try_forward(x.clone()).unwrap_err().to_string();
        for err in [taped, untaped] {
            assert!(err.starts_with("0.weights: "), "{err}");
            assert!(err.contains(what), "{err}");
        }
    }
}
