//! dfdx's composite layers converted: residual connections with a quantized add, SplitInto /
//! AddInto, Repeated, LayerNorm1D, Embedding; their names, calibration, training, gradients,
//! graphs and integer inference.

use crate::common::assert_integer_matches;
use dfdx::nn::builders::{Embedding, LayerNorm1D, Linear};
use dfdx::optim::{Adam, AdamConfig};
use dfdx::prelude::*;
use dfdx::tensor::Gradients;
use quant_core::{QuantizationMethod, QuantizationTarget, TrainingMethod};
use quant_dfdx::convert::{convert_model, LayerKind};
use quant_dfdx::layers::{QuantizedModule, QuantizedModuleExt, QuantizerMode, QuantizerSpec, Slot};
use quant_dfdx::lower::export_model;
use quant_dfdx::observers::ObserverConfig;
use quant_dfdx::policy::Policy;
use quant_runtime::graph::{evaluate, Op};
use quant_runtime::integer::IntegerModel;

fn policy(bits: u32) -> Policy {
    Policy::from_toml_str(
        &format!(
            "[weights]\ntraining_method = \"Lsq\"\nmethod = \"Symmetric\"\nbits = {bits}\n\
             [input]\ntraining_method = \"Lsq\"\nmethod = \"Uniform\"\nbits = {bits}\nobserver = \"MinMax\"\n"
        ),
        "composites.toml",
    )
    .unwrap()
}

/// The graph's float reference computes what the fake-quantized model computes.
fn assert_matches_reference(reference: &[f32], fq: &[f32]) {
    let range = fq.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (a, b) in reference.iter().zip(fq) {
        assert!((a - b).abs() <= 1e-4 * range, "{a} vs {b}");
    }
}

fn names(q: &mut impl QuantizedModule) -> Vec<(String, LayerKind)> {
    let mut out = Vec::new();
    q.visit_slots("", &mut |s| {
        if s.quantizer.describe().is_some() {
            out.push((s.name(), s.kind));
        }
        Ok(())
    })
    .unwrap();
    out
}

/// The model: a residual block and a LayerNorm in a tuple, converted, calibrated and
/// trained with dfdx's Adam.
#[test]
fn a_residual_block_and_layer_norm_convert_calibrate_and_train() {
    type Block = Residual<(Linear<16, 16>, ReLU, Linear<16, 16>)>;
    type Net = (Linear<8, 16>, Block, LayerNorm1D<16>, Linear<16, 4>);
    let dev = Cpu::seed_from_u64(0);
    let float = dev.build_module::<Net, f32>();
    let mut q = convert_model(&float, &policy(8)).unwrap();
    let named = names(&mut q);
    let expected = [
        ("0.input", LayerKind::Linear),
        ("0.weights", LayerKind::Linear),
        ("1.0.0.input", LayerKind::Linear),
        ("1.0.0.weights", LayerKind::Linear),
        ("1.0.2.input", LayerKind::Linear),
        ("1.0.2.weights", LayerKind::Linear),
        ("1.input", LayerKind::Add),
        ("2.input", LayerKind::LayerNorm),
        ("3.input", LayerKind::Linear),
        ("3.weights", LayerKind::Linear),
    ];
    assert_eq!(
        named,
        expected
            .iter()
            .map(|(n, k)| (n.to_string(), *k))
            .collect::<Vec<_>>(),
        "the add's and the LayerNorm's inputs are quantized by default, the add's output not"
    );
    let x: Tensor<Rank2<32, 8>, f32, _> = dev.sample_normal();
    // Calibrating: pass-through, the float model's output.
    let y = q.try_forward_mut(x.clone()).unwrap();
    assert_eq!(y.array(), float.forward(x.clone()).array());
    assert_eq!(q.finish_calibration().unwrap(), 10);
    q.set_mode("*", QuantizerMode::Training).unwrap();
    let target: Tensor<Rank2<32, 4>, f32, _> = dev.sample_normal();
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
        let loss = mse_loss(
            q.try_forward_mut(x.clone().traced(grads)).unwrap(),
            target.clone(),
        );
        losses.push(loss.array());
        opt.update(&mut q, &loss.backward()).unwrap();
    }
    assert!(losses[29] < 0.8 * losses[0], "{losses:?}");
    // The graph holds the add with both inputs on the add's grid, and the LayerNorm on its
    // quantized input.
    let graph = export_model(&q, &[8], Default::default()).unwrap();
    let ops: Vec<(&str, &str)> = graph
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.op.name()))
        .collect();
    assert!(
        ops.contains(&("1.input.0", "QuantizeDequantize"))
            && ops.contains(&("1.input.1", "QuantizeDequantize"))
    );
    assert!(ops.contains(&("1", "Add")) && ops.contains(&("2", "LayerNorm")));
    // The model runs the integer LayerNorm (simulated) on the quantized input, as the integer
    // runtime does.
    let fq = q.try_forward(x.clone()).unwrap().as_vec();
    let integer = IntegerModel::new(&graph).unwrap();
    assert_integer_matches(&integer.forward(&x.as_vec()).unwrap(), &fq, "W8A8");
}

/// In a model, the add's gradient reaches both branches and the shared quantizer's LSQ scale.
#[test]
fn gradients_flow_through_both_branches_of_a_quantized_add() {
    type Net = (Linear<4, 6>, Residual<(ReLU, Linear<6, 6>)>);
    let dev = Cpu::seed_from_u64(3);
    let float = dev.build_module::<Net, f32>();
    let mut q = convert_model(&float, &policy(8)).unwrap();
    let x: Tensor<Rank2<5, 4>, f32, _> = dev.sample_normal();
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    q.set_mode("*", QuantizerMode::Training).unwrap();
    let r: Tensor<Rank2<5, 6>, f32, _> = dev.sample_normal();
    let grads = (q.try_forward(x.clone().trace(Gradients::leaky())).unwrap() * r.clone())
        .sum()
        .backward();
    // Both branches: the first layer's weight gets the skip path's and the branch's gradient.
    let g_first = grads.get(&q.0.weight).as_vec();
    let g_branch = grads.get(&q.1.module.1.weight).as_vec();
    assert!(g_first.iter().any(|g| *g != 0.0) && g_branch.iter().any(|g| *g != 0.0));
    let g_scale = grads.get(&q.1.add.input_quantizer.learned).as_vec();
    assert!(g_scale[0] != 0.0, "the add's LSQ scale trains");
}

/// The add on its own: `q(a) + q(b)` with one LSQ quantizer. Each input's gradient is the
/// straight-through one (`dy` inside the grid, 0 where clipped), and the shared scale's
/// gradient is the sum of what each use alone gives it.
#[test]
fn the_add_quantizer_passes_straight_through_gradients_and_sums_its_scale_gradient() {
    use quant_dfdx::layers::{AddQuantizer, QuantizerControl};
    let dev = Cpu::seed_from_u64(4);
    let mut add = AddQuantizer::new(&dev);
    let spec = QuantizerSpec {
        config: quant_core::ActivationQuantizerConfig::new(
            TrainingMethod::Lsq,
            QuantizationMethod::Uniform,
            4,
        )
        .into(),
        observer: ObserverConfig::MinMax,
    };
    add.input_quantizer.configure("add.input", spec).unwrap();
    let cal_a: Tensor<Rank1<64>, f32, _> = dev.sample_uniform() * 2.0 - 1.0;
    let cal_b: Tensor<Rank1<64>, f32, _> = dev.sample_uniform() - 0.5;
    add.add_mut(cal_a, cal_b).unwrap();
    add.input_quantizer.finish_calibration().unwrap();
    add.input_quantizer
        .set_mode(QuantizerMode::Training)
        .unwrap();
    let grid = add.input_quantizer.grid().unwrap().unwrap();
    let qp = add.input_quantizer.qparams().unwrap().unwrap();
    let (s, z) = (qp.scales()[0], qp.zero_points()[0] as f32);
    let inside = |v: f32| {
        let q = (v / s).round() + z;
        q >= grid.quant_min() as f32 && q <= grid.quant_max() as f32
    };
    // Wider than the calibration range: some values are clipped.
    let a: Tensor<Rank1<64>, f32, _> = dev.sample_uniform() * 4.0 - 2.0;
    let b: Tensor<Rank1<64>, f32, _> = dev.sample_uniform() * 4.0 - 2.0;
    let r: Tensor<Rank1<64>, f32, _> = dev.sample_normal();
    let grads = (add
        .add(
            a.clone().trace(Gradients::leaky()),
            b.clone().trace(Gradients::leaky()),
        )
        .unwrap()
        * r.clone())
    .sum()
    .backward();
    let (da, db, rv) = (grads.get(&a).as_vec(), grads.get(&b).as_vec(), r.as_vec());
    let (av, bv) = (a.as_vec(), b.as_vec());
    let mut clipped = 0;
    for i in 0..64 {
        assert_eq!(
            da[i],
            if inside(av[i]) { rv[i] } else { 0.0 },
            "a[{i}] = {}",
            av[i]
        );
        assert_eq!(
            db[i],
            if inside(bv[i]) { rv[i] } else { 0.0 },
            "b[{i}] = {}",
            bv[i]
        );
        clipped += usize::from(!inside(av[i])) + usize::from(!inside(bv[i]));
    }
    assert!(clipped > 0, "the test must clip some values");
    let scale_grad = |x: &Tensor<Rank1<64>, f32, Cpu>| {
        let g = (add
            .input_quantizer
            .fake_quantize(x.clone().trace(Gradients::leaky()))
            .unwrap()
            * r.clone())
        .sum()
        .backward();
        g.get(&add.input_quantizer.learned).as_vec()
    };
    let both = grads.get(&add.input_quantizer.learned).as_vec();
    let (ga, gb) = (scale_grad(&a), scale_grad(&b));
    for k in 0..both.len() {
        assert!(
            (both[k] - (ga[k] + gb[k])).abs() <= 1e-5 * (ga[k].abs() + gb[k].abs()).max(1e-6),
            "parameter {k}: {} vs {} + {}",
            both[k],
            ga[k],
            gb[k]
        );
    }
    assert!(both[0] != 0.0);
}

/// In training, the add quantizes both inputs inside the add (no tensors and no zeroed
/// gradient buffers for the quantized inputs): the output and every gradient (both inputs',
/// both quantizers' parameters') must be those of the input quantizer's op on each input, the
/// add, then the output quantizer's op, bit for bit; with and without an output quantizer.
#[test]
fn the_add_in_training_gives_the_bits_of_its_quantizer_ops_then_the_add() {
    use quant_dfdx::layers::{AddQuantizer, QuantizerControl};
    let dev = Cpu::seed_from_u64(9);
    let spec = || QuantizerSpec {
        config: quant_core::ActivationQuantizerConfig::new(
            TrainingMethod::Lsq,
            QuantizationMethod::Uniform,
            4,
        )
        .into(),
        observer: ObserverConfig::MinMax,
    };
    for with_output in [false, true] {
        let mut add = AddQuantizer::new(&dev);
        add.input_quantizer.configure("add.input", spec()).unwrap();
        if with_output {
            add.output_quantizer
                .configure("add.output", spec())
                .unwrap();
        }
        let cal_a: Tensor<Rank3<2, 5, 16>, f32, _> = dev.sample_normal();
        let cal_b: Tensor<Rank3<2, 5, 16>, f32, _> = dev.sample_normal();
        add.add_mut(cal_a, cal_b).unwrap();
        let configured = if with_output { 2 } else { 1 };
        for q in [&mut add.input_quantizer, &mut add.output_quantizer]
            .into_iter()
            .take(configured)
        {
            q.finish_calibration().unwrap();
            q.set_mode(QuantizerMode::Training).unwrap();
        }
        // Wider than the calibration range: some values are clipped.
        let a: Tensor<Rank3<2, 5, 16>, f32, _> = dev.sample_normal() * 3.0;
        let b: Tensor<Rank3<2, 5, 16>, f32, _> = dev.sample_normal() * 3.0;
        let r: Tensor<Rank3<2, 5, 16>, f32, _> = dev.sample_normal();
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        let grads_of = |grads: &Gradients<f32, Cpu>| {
            let mut all = vec![
                grads.get(&a).as_vec(),
                grads.get(&b).as_vec(),
                grads.get(&add.input_quantizer.learned).as_vec(),
            ];
            if with_output {
                all.push(grads.get(&add.output_quantizer.learned).as_vec());
            }
            all
        };
        let trace = |x: &Tensor<Rank3<2, 5, 16>, f32, Cpu>, grads: &Gradients<f32, Cpu>| {
            x.clone().trace(grads.clone())
        };

        let grads = Gradients::leaky();
        let y = add.add(trace(&a, &grads), trace(&b, &grads)).unwrap();
        let y_values = y.as_vec();
        let fused = grads_of(&(y * r.clone()).sum().backward());

        // The composition the add ran before: the input quantizer's op on each input, the add,
        // the output quantizer's op.
        let grads = Gradients::leaky();
        let qa = add
            .input_quantizer
            .fake_quantize(trace(&a, &grads))
            .unwrap();
        let qb = add
            .input_quantizer
            .fake_quantize(trace(&b, &grads))
            .unwrap();
        let sum = quant_core::dfdx_ops::add(qa, qb).unwrap();
        let y = add.output_quantizer.fake_quantize(sum).unwrap();
        assert_eq!(bits(&y.as_vec()), bits(&y_values), "outputs");
        let composed = grads_of(&(y * r).sum().backward());
        let names = ["a", "b", "input quantizer", "output quantizer"];
        assert_eq!(fused.len(), composed.len());
        for ((f, c), name) in fused.iter().zip(&composed).zip(names) {
            assert_eq!(
                bits(f),
                bits(c),
                "{name} gradient (output quantizer {with_output})"
            );
            assert!(f.iter().any(|g| *g != 0.0), "{name} gradient is all zero");
        }
        // Some values clipped by the input quantizer: their gradients are zero.
        assert!(fused[0].iter().chain(&fused[1]).any(|g| *g == 0.0));
    }
}

/// In training, a quantized LayerNorm's and GELU's input is quantized inside the integer
/// kernel's op (no tensor and no zeroed gradient buffer for the quantized values): the output
/// and every gradient (the input's, the quantizer's, the LayerNorm's affine) must be those of
/// the input quantizer's op followed by the layer, bit for bit.
#[test]
fn layer_norm_and_gelu_in_training_give_the_bits_of_their_quantizer_op_then_the_kernel() {
    use quant_dfdx::layers::{OnGrid, QuantInput, QuantizerControl};
    let dev = Cpu::seed_from_u64(11);
    let spec = QuantizerSpec {
        config: quant_core::ActivationQuantizerConfig::new(
            TrainingMethod::Lsq,
            QuantizationMethod::Uniform,
            4,
        )
        .into(),
        observer: ObserverConfig::MinMax,
    };
    type X = Tensor<Rank3<2, 5, 16>, f32, Cpu>;
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let layer_norm = dev.build_module::<quant_dfdx::nn::builders::LayerNorm<16>, f32>();
    let mut norm = QuantInput::new(layer_norm, &dev);
    let mut gelu = QuantInput::new(quant_dfdx::nn::Gelu, &dev);
    for q in [&mut norm.input_quantizer, &mut gelu.input_quantizer] {
        q.configure("layer.input", spec.clone()).unwrap();
    }
    let calibration: X = dev.sample_normal();
    norm.try_forward_mut(calibration.clone()).unwrap();
    gelu.try_forward_mut(calibration).unwrap();
    for q in [&mut norm.input_quantizer, &mut gelu.input_quantizer] {
        q.finish_calibration().unwrap();
        q.set_mode(QuantizerMode::Training).unwrap();
    }
    // Wider than the calibration range: some values are clipped.
    let x: X = dev.sample_normal() * 3.0;
    let r: X = dev.sample_normal();
    let trace = |grads: &Gradients<f32, Cpu>| x.clone().trace(grads.clone());

    // LayerNorm: the input's, the quantizer's, gamma's and beta's gradients.
    let norm_grads = |grads: &Gradients<f32, Cpu>| {
        vec![
            grads.get(&x).as_vec(),
            grads.get(&norm.input_quantizer.learned).as_vec(),
            grads.get(&norm.module.gamma).as_vec(),
            grads.get(&norm.module.beta).as_vec(),
        ]
    };
    let grads = Gradients::leaky();
    let y = norm.try_forward(trace(&grads)).unwrap();
    let y_values = y.as_vec();
    let fused = norm_grads(&(y * r.clone()).sum().backward());
    let grads = Gradients::leaky();
    let xq = norm.input_quantizer.fake_quantize(trace(&grads)).unwrap();
    let y = norm
        .module
        .forward_on_grid(xq, &norm.input_quantizer)
        .unwrap();
    assert_eq!(bits(&y.as_vec()), bits(&y_values), "LayerNorm outputs");
    let composed = norm_grads(&(y * r.clone()).sum().backward());
    for ((f, c), name) in fused
        .iter()
        .zip(&composed)
        .zip(["input", "quantizer", "gamma", "beta"])
    {
        assert_eq!(bits(f), bits(c), "LayerNorm: {name} gradient");
        assert!(
            f.iter().any(|g| *g != 0.0),
            "LayerNorm: {name} gradient is all zero"
        );
    }

    // GELU: the input's and the quantizer's gradients.
    let gelu_grads = |grads: &Gradients<f32, Cpu>| {
        vec![
            grads.get(&x).as_vec(),
            grads.get(&gelu.input_quantizer.learned).as_vec(),
        ]
    };
    let grads = Gradients::leaky();
    let y = gelu.try_forward(trace(&grads)).unwrap();
    let y_values = y.as_vec();
    let fused = gelu_grads(&(y * r.clone()).sum().backward());
    let grads = Gradients::leaky();
    let xq = gelu.input_quantizer.fake_quantize(trace(&grads)).unwrap();
    let y = gelu
        .module
        .forward_on_grid(xq, &gelu.input_quantizer)
        .unwrap();
    assert_eq!(bits(&y.as_vec()), bits(&y_values), "GELU outputs");
    let composed = gelu_grads(&(y * r).sum().backward());
    for ((f, c), name) in fused.iter().zip(&composed).zip(["input", "quantizer"]) {
        assert_eq!(bits(f), bits(c), "GELU: {name} gradient");
        assert!(
            f.iter().any(|g| *g != 0.0),
            "GELU: {name} gradient is all zero"
        );
    }
    // Some inputs clipped: their gradients are zero.
    assert!(fused[0].contains(&0.0));
}

/// A residual CNN block with a 1x1 projection shortcut and a depthwise convolution, global
/// average pooling and a head, through the graph and the integer runtime: the integer logits
/// match the fake-quantized model's within the documented tolerance.
#[test]
fn residual_cnn_runs_on_integers_like_the_fake_quantized_model() {
    use quant_dfdx::nn::builders::{Conv2d, DepthwiseConv2d};
    type Net = (
        (Conv2d<1, 4, 3, 1, 1>, ReLU),
        Residual<(DepthwiseConv2d<4, 3, 1, 1>, ReLU, Conv2d<4, 4, 1>)>,
        GeneralizedResidual<(Conv2d<4, 8, 3, 2, 1>, ReLU), Conv2d<4, 8, 1, 2>>,
        (ReLU, AvgPoolGlobal, Linear<8, 3>),
    );
    for (seed, bits) in [(1u64, 8), (2, 4), (3, 6)] {
        let dev = Cpu::seed_from_u64(seed);
        let float = dev.build_module::<Net, f32>();
        let mut q = convert_model(&float, &policy(bits)).unwrap();
        let calib: Tensor<Rank4<16, 1, 8, 8>, f32, _> = dev.sample_normal();
        q.try_forward_mut(calib).unwrap();
        q.finish_calibration().unwrap();
        let x: Tensor<Rank4<8, 1, 8, 8>, f32, _> = dev.sample_normal();
        let fq = q.try_forward(x.clone()).unwrap().as_vec();
        let graph = export_model(&q, &[1, 8, 8], Default::default()).unwrap();
        let adds = graph.nodes.iter().filter(|n| n.op == Op::Add).count();
        assert_eq!(adds, 2);
        assert!(graph
            .nodes
            .iter()
            .any(|n| matches!(&n.op, Op::Conv2d(quant_runtime::graph::Conv2d { geometry, .. }) if geometry.groups == 4)));
        let integer = IntegerModel::new(&graph).unwrap();
        let int = integer.forward(&x.as_vec()).unwrap();
        assert_integer_matches(&int, &fq, &format!("W{bits}A{bits}"));
    }
}

#[test]
fn split_into_add_into_and_repeated_convert_and_lower() {
    type Net = (
        Linear<4, 8>,
        SplitInto<(Linear<8, 8>, (ReLU, Linear<8, 8>))>,
        AddInto<(ReLU, Tanh)>,
        Repeated<(Linear<8, 8>, ReLU), 2>,
    );
    let dev = Cpu::seed_from_u64(5);
    let float = dev.build_module::<Net, f32>();
    let mut q = convert_model(&float, &policy(8)).unwrap();
    let named: Vec<String> = names(&mut q).into_iter().map(|(n, _)| n).collect();
    for n in [
        "1.0.0.input",
        "1.0.1.1.weights",
        "2.input",
        "3.0.0.weights",
        "3.1.0.weights",
    ] {
        assert!(named.iter().any(|m| m == n), "{n} in {named:?}");
    }
    let x: Tensor<Rank2<6, 4>, f32, _> = dev.sample_normal();
    assert_eq!(
        q.try_forward_mut(x.clone()).unwrap().array(),
        float.forward(x.clone()).array()
    );
    q.finish_calibration().unwrap();
    let graph = export_model(&q, &[4], Default::default()).unwrap();
    let fq = q.try_forward(x.clone()).unwrap().as_vec();
    let reference = evaluate(&graph, &x.as_vec(), &|_, _| false).unwrap().output;
    assert_matches_reference(&reference, &fq);
}

/// An embedding's table is quantized per row and trains; its lookup of token ids has no graph
/// form, which export says.
#[test]
fn embedding_quantizes_its_table_per_row() {
    let dev = Cpu::seed_from_u64(6);
    let float = dev.build_module::<(Embedding<10, 4>, Linear<4, 2>), f32>();
    let spec = |target| QuantizerSpec {
        config: match target {
            QuantizationTarget::Weights => quant_core::WeightsQuantizerConfig::new(
                TrainingMethod::Lsq,
                QuantizationMethod::Symmetric,
                4,
            )
            .into(),
            QuantizationTarget::Activation => quant_core::ActivationQuantizerConfig::new(
                TrainingMethod::Lsq,
                QuantizationMethod::Uniform,
                4,
            )
            .into(),
        },
        observer: ObserverConfig::MinMax,
    };
    let mut q = convert_model(&float, &|_: &str, _: LayerKind, slot: Slot| {
        Ok(Some(spec(slot.target)))
    })
    .unwrap();
    let ids: Tensor<Rank1<3>, usize, _> = dev.tensor([1, 7, 7]);
    q.try_forward_mut(ids.clone()).unwrap();
    q.finish_calibration().unwrap();
    let d = q.quantizers().unwrap();
    assert_eq!(d[0].0, "0.weights");
    assert!(d[0].1.per_channel);
    let y = q.try_forward(ids.clone()).unwrap().as_vec();
    // Rows 7 and 7 look up the same quantized row.
    let table =
        q.0.weights_quantizer
            .fake_quantize(q.0.weight.clone())
            .unwrap()
            .as_vec();
    let h0 = &table[7 * 4..8 * 4];
    let row: Tensor<Rank2<1, 4>, f32, _> = dev.tensor([[h0[0], h0[1], h0[2], h0[3]]]);
    let lin = q.1.try_forward(row).unwrap().as_vec();
    assert_eq!(&y[2 * 2..], &lin[..]);
    let e = export_model(&q, &[1], Default::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer `0`") && e.contains("token ids"), "{e}");
}

/// A sample may be a sequence `[tokens, features]`: Linear layers act on each token, in the
/// graph's reference evaluation and on integers alike, as dfdx's Linear does on a
/// `[batch, tokens, features]` tensor.
#[test]
fn sequences_of_tokens_lower_and_run_on_integers_token_by_token() {
    type Net = (Linear<6, 16>, ReLU, Linear<16, 3>);
    for (seed, bits) in [(7u64, 8), (8, 4)] {
        let dev = Cpu::seed_from_u64(seed);
        let float = dev.build_module::<Net, f32>();
        let mut q = convert_model(&float, &policy(bits)).unwrap();
        let calib: Tensor<Rank3<16, 5, 6>, f32, _> = dev.sample_normal();
        q.try_forward_mut(calib).unwrap();
        q.finish_calibration().unwrap();
        let x: Tensor<Rank3<4, 5, 6>, f32, _> = dev.sample_normal();
        let fq = q.try_forward(x.clone()).unwrap().as_vec();
        let graph = export_model(&q, &[5, 6], Default::default()).unwrap();
        let reference = evaluate(&graph, &x.as_vec(), &|_, _| false).unwrap().output;
        assert_eq!(reference.len(), 4 * 5 * 3);
        assert_matches_reference(&reference, &fq);
        let integer = IntegerModel::new(&graph).unwrap();
        assert_eq!(integer.output_features(), 5 * 3);
        let int = integer.forward(&x.as_vec()).unwrap();
        assert_eq!(int.len(), fq.len());
        assert_integer_matches(&int, &fq, &format!("W{bits}A{bits}"));
        // A sample of the wrong size is an error, not a reshaped guess.
        assert!(integer.forward(&x.as_vec()[..5 * 6 + 1]).is_err());
    }
}
