//! dfdx's transformer modules converted: `MultiHeadAttention` (quantized projections, quantizers
//! on the inputs of `Q·Kᵀ` and `softmax(·)·V`), `TransformerEncoderBlock` and
//! `TransformerEncoder`; their slots by name and by kind, pass-through equality with dfdx,
//! straight-through gradients against finite differences of the surrogate, training, and
//! integer-only inference of the trained models.

use crate::common::assert_integer_matches;
use dfdx::nn::builders::{MultiHeadAttention, TransformerEncoder};
use dfdx::optim::{Adam, AdamConfig};
use dfdx::prelude::*;
use dfdx::tensor::Gradients;
use quant_dfdx::convert::{convert_model, Convert, LayerKind};
use quant_dfdx::layers::{
    layer_bias, QMultiHeadAttention, QuantizedModule, QuantizedModuleExt, QuantizerControl,
    QuantizerMode,
};
use quant_dfdx::lower::export_model;
use quant_dfdx::policy::{ConfigError, Policy};
use quant_dfdx::report::layer_report;
use quant_runtime::integer::IntegerModel;

const POLICY: &str = r#"
[weights]
training_method = "Lsq"
method = "Symmetric"
bits = 4
[input]
training_method = "Lsq"
method = "Uniform"
bits = 8
observer = "MinMax"
"#;

fn policy(extra: &str) -> Policy {
    Policy::from_toml_str(&format!("{POLICY}{extra}"), "attention.toml").unwrap()
}

/// `(dotted name, kind, bits)` of every configured quantizer.
fn slots(q: &mut impl QuantizedModule) -> Vec<(String, LayerKind, u32)> {
    let mut out = Vec::new();
    q.visit_slots("", &mut |s| {
        if let Some(d) = s.quantizer.describe() {
            out.push((s.name(), s.kind, d.bits));
        }
        Ok(())
    })
    .unwrap();
    out
}

/// The MSE losses of `steps` Adam steps (learning rate `lr`) of `q` towards `target` on `x`.
fn mse_losses<M, S: Shape, O: Shape>(
    q: &mut M,
    x: &Tensor<S, f32, Cpu>,
    target: &Tensor<O, f32, Cpu>,
    lr: f64,
    steps: usize,
) -> Vec<f32>
where
    M: TensorCollection<f32, Cpu>
        + ModuleMut<
            Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>,
            Output = Tensor<O, f32, Cpu, OwnedTape<f32, Cpu>>,
        >,
    M::Error: std::fmt::Debug,
{
    let mut opt = Adam::new(
        q,
        AdamConfig {
            lr,
            ..Default::default()
        },
    );
    let mut losses = Vec::new();
    for _ in 0..steps {
        let grads = q.alloc_grads();
        let loss = mse_loss(
            q.try_forward_mut(x.clone().traced(grads)).unwrap(),
            target.clone(),
        );
        losses.push(loss.array());
        opt.update(q, &loss.backward()).unwrap();
    }
    losses
}

type Attention = MultiHeadAttention<8, 2>;

#[test]
fn attention_slots_are_configured_by_kind_and_by_name() {
    let dev = Cpu::seed_from_u64(0);
    let float = dev.build_module::<Attention, f32>();
    let p = policy(
        "[kinds.AttentionContext]\nslots.probs = { bits = 6 }\n\
         [[overrides]]\npattern = \"*scores\"\nslots.key = { bits = 5 }\n",
    );
    let mut q = convert_model(&float, &p).unwrap();
    let expected = [
        ("w_q.input", LayerKind::Linear, 8),
        ("w_q.weights", LayerKind::Linear, 4),
        ("w_k.input", LayerKind::Linear, 8),
        ("w_k.weights", LayerKind::Linear, 4),
        ("w_v.input", LayerKind::Linear, 8),
        ("w_v.weights", LayerKind::Linear, 4),
        ("scores.query", LayerKind::AttentionScores, 8),
        ("scores.key", LayerKind::AttentionScores, 5),
        ("context.probs", LayerKind::AttentionContext, 6),
        ("context.value", LayerKind::AttentionContext, 8),
        ("w_o.input", LayerKind::Linear, 8),
        ("w_o.weights", LayerKind::Linear, 4),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(n, k, b)| (n.to_string(), *k, *b))
        .collect();
    assert_eq!(slots(&mut q), expected);
    // The weights are per output channel: 8 scales for w_q's [8, 8] weight.
    let mut x_calib: Tensor<Rank3<2, 3, 8>, f32, _> = dev.sample_normal();
    x_calib = x_calib * 2.0;
    q.try_forward_mut(x_calib).unwrap();
    q.finish_calibration().unwrap();
    assert_eq!(
        q.w_q
            .weights_quantizer
            .qparams()
            .unwrap()
            .unwrap()
            .channels(),
        8
    );
    assert_eq!(
        q.matmul_inputs.probs.qparams().unwrap().unwrap().channels(),
        1
    );

    // A kind's table turns both of its slots off; the projections stay quantized.
    let mut q = convert_model(
        &float,
        &policy("[kinds.AttentionScores]\ninput = \"float\"\n"),
    )
    .unwrap();
    let names: Vec<String> = slots(&mut q).into_iter().map(|(n, _, _)| n).collect();
    assert!(!names.iter().any(|n| n.starts_with("scores.")), "{names:?}");
    assert!(
        names.contains(&"context.probs".to_string()) && names.contains(&"w_q.weights".to_string())
    );

    // Slots a kind does not have, and weights for a kind without them, are policy errors
    // naming the key.
    for (extra, key) in [
        (
            "[kinds.AttentionScores]\nslots.probs = { bits = 8 }\n",
            "kinds.AttentionScores.slots.probs",
        ),
        (
            "[kinds.AttentionContext]\nweights = { bits = 8 }\n",
            "kinds.AttentionContext.weights",
        ),
    ] {
        match Policy::from_toml_str(&format!("{POLICY}{extra}"), "attention.toml") {
            Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
            other => panic!("{extra}: {other:?}"),
        }
    }
}

/// Unconfigured or calibrating, the twin computes exactly what dfdx's layer computes, for
/// every input form dfdx's layer takes.
#[test]
fn calibrating_attention_passes_through_dfdx_s_result_for_every_input_form() {
    let dev = Cpu::seed_from_u64(1);
    let float = dev.build_module::<MultiHeadAttention<8, 2, 6, 4>, f32>();
    let mut q = convert_model(&float, &policy("")).unwrap();
    let batch: Tensor<Rank3<2, 3, 8>, f32, _> = dev.sample_normal();
    assert_eq!(
        q.try_forward_mut(batch.clone()).unwrap().array(),
        float.forward(batch.clone()).array()
    );
    let seq: Tensor<Rank2<3, 8>, f32, _> = dev.sample_normal();
    assert_eq!(
        q.try_forward_mut(seq.clone()).unwrap().array(),
        float.forward(seq.clone()).array()
    );
    let keys: Tensor<Rank3<2, 5, 8>, f32, _> = dev.sample_normal();
    let values: Tensor<Rank3<2, 5, 8>, f32, _> = dev.sample_normal();
    let cross = (batch.clone(), keys.clone(), values.clone());
    assert_eq!(
        q.try_forward_mut(cross.clone()).unwrap().array(),
        float.forward(cross).array()
    );
    let one = (
        seq.clone(),
        dev.sample_normal::<Rank2<4, 8>>(),
        dev.sample_normal::<Rank2<4, 8>>(),
    );
    assert_eq!(
        q.try_forward_mut(one.clone()).unwrap().array(),
        float.forward(one).array()
    );
    // And its gradients are dfdx's.
    let unconfigured = float.convert();
    let g_float = float.forward(batch.leaky_trace()).square().sum().backward();
    let g_quant = unconfigured
        .try_forward(batch.leaky_trace())
        .unwrap()
        .square()
        .sum()
        .backward();
    assert_eq!(g_quant.get(&batch).array(), g_float.get(&batch).array());
    assert_eq!(
        g_quant.get(&unconfigured.w_k.weight).array(),
        g_float.get(&float.w_k.weight).array()
    );

    // Keys and values of run-time lengths that differ are a typed error, not a panic.
    let keys = dev.sample_normal_like(&(Const::<2>, 5usize, Const::<8>));
    let short = dev.sample_normal_like(&(Const::<2>, 4usize, Const::<8>));
    let err = q
        .try_forward((batch.clone(), keys, short))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("attention keys") && err.contains('5') && err.contains('4'),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------
// Gradients: the straight-through surrogate in f64
// ---------------------------------------------------------------------------------------

const B: usize = 2;
const S: usize = 3;
const M: usize = 8;
const HEADS: usize = 2;
const DK: usize = M / HEADS;

/// Row-major `[rows, M] · Wᵀ + b` with `W` `[M, M]`.
fn linear(x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
    x.chunks(M)
        .flat_map(|row| {
            (0..M).map(move |o| {
                row.iter()
                    .zip(&w[o * M..(o + 1) * M])
                    .map(|(a, c)| a * c)
                    .sum::<f64>()
                    + b[o]
            })
        })
        .collect()
}

/// An activation quantizer's straight-through surrogate at the base point `v₀`: `v + (fq(v₀) -
/// v₀)` where `v₀` lies on the grid's range (equal to `fq` there, with the identity's slope),
/// the constant `fq(v₀)` where it was clipped (slope 0).
#[derive(Clone)]
struct Straight {
    offset: Vec<f64>,
    clipped: Vec<Option<f64>>,
}

impl Straight {
    fn identity(n: usize) -> Straight {
        Straight {
            offset: vec![0.0; n],
            clipped: vec![None; n],
        }
    }

    fn apply(&self, v: &[f64]) -> Vec<f64> {
        v.iter()
            .zip(self.offset.iter().zip(&self.clipped))
            .map(|(v, (o, c))| c.unwrap_or(v + o))
            .collect()
    }
}

/// Everything the quantized layer fixed at the base point: the quantized weights, the biases
/// it adds, and each activation quantizer's surrogate.
struct Surrogate {
    weights: [Vec<f64>; 4],
    biases: [Vec<f64>; 4],
    /// Input quantizers of w_q, w_k, w_v; query, key, value, probs; input of w_o.
    quantizers: [Straight; 8],
}

/// Attention through the surrogate, from the input `[B, S, M]` and the quantized `w_q`.
fn surrogate(s: &Surrogate, x: &[f64], w_q: &[f64]) -> (Vec<f64>, [Vec<f64>; 5]) {
    let [_, w_k, w_v, w_o] = &s.weights;
    let [b_q, b_k, b_v, b_o] = &s.biases;
    let o = &s.quantizers;
    let q = o[3].apply(&linear(&o[0].apply(x), w_q, b_q));
    let k = o[4].apply(&linear(&o[1].apply(x), w_k, b_k));
    let v = o[5].apply(&linear(&o[2].apply(x), w_v, b_v));
    let at = |t: &[f64], b: usize, i: usize, h: usize, d: usize| t[(b * S + i) * M + h * DK + d];
    let mut probs = vec![0f64; B * HEADS * S * S];
    for b in 0..B {
        for h in 0..HEADS {
            for i in 0..S {
                let scores: Vec<f64> = (0..S)
                    .map(|j| {
                        (0..DK)
                            .map(|d| at(&q, b, i, h, d) * at(&k, b, j, h, d))
                            .sum::<f64>()
                            / (DK as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|v| (v - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for j in 0..S {
                    probs[((b * HEADS + h) * S + i) * S + j] = e[j] / sum;
                }
            }
        }
    }
    let probs_q = o[6].apply(&probs);
    let mut tokens = vec![0f64; B * S * M];
    for b in 0..B {
        for h in 0..HEADS {
            for i in 0..S {
                for d in 0..DK {
                    tokens[(b * S + i) * M + h * DK + d] = (0..S)
                        .map(|j| probs_q[((b * HEADS + h) * S + i) * S + j] * at(&v, b, j, h, d))
                        .sum();
                }
            }
        }
    }
    let y = linear(&o[7].apply(&tokens), w_o, b_o);
    (y, [q, k, v, probs, tokens])
}

fn to_f64(v: Vec<f32>) -> Vec<f64> {
    v.into_iter().map(|x| x as f64).collect()
}

/// The surrogate of `quantizer` at the values `v` (a `[B, S, M]` or `[B, H, S, S]` tensor, per
/// tensor either way): clipped where the quantized value is more than half a step away.
fn straight(quantizer: &quant_dfdx::layers::TensorQuantizer<1>, v: &[f64]) -> Straight {
    let dev = Cpu::default();
    let t: Tensor<(usize,), f32, Cpu> =
        dev.tensor_from_vec(v.iter().map(|x| *x as f32).collect(), (v.len(),));
    let fq = quantizer.fake_quantize(t).unwrap().as_vec();
    let step = quantizer.qparams().unwrap().unwrap().scales()[0] as f64;
    let offset: Vec<f64> = fq.iter().zip(v).map(|(a, b)| *a as f64 - *b).collect();
    let clipped = offset
        .iter()
        .zip(&fq)
        .map(|(o, f)| (o.abs() > 0.5 * step * (1.0 + 1e-4)).then_some(*f as f64))
        .collect();
    Straight { offset, clipped }
}

/// The straight-through gradients reaching the input and `w_q`'s float weight (through the
/// query quantizer, the softmax, the probs quantizer, both products and `w_o`) are the
/// derivatives of the surrogate at the base point, by central differences.
#[test]
fn attention_gradients_are_finite_differences_of_the_straight_through_surrogate() {
    let dev = Cpu::seed_from_u64(2);
    let float = dev.build_module::<Attention, f32>();
    let mut q = convert_model(&float, &policy("")).unwrap();
    let x: Tensor<Rank3<B, S, M>, f32, _> = dev.sample_normal();
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    q.set_mode("*", QuantizerMode::Frozen).unwrap();
    let r: Tensor<Rank3<B, S, M>, f32, _> = dev.sample_normal();
    let grads = (q.try_forward(x.clone().trace(Gradients::leaky())).unwrap() * r.clone())
        .sum()
        .backward();
    let (dx, dw_q) = (grads.get(&x).as_vec(), grads.get(&q.w_q.weight).as_vec());

    // The surrogate's constants, from the calibrated layer.
    let layers = [&q.w_q, &q.w_k, &q.w_v, &q.w_o];
    let weights = layers.map(|l| {
        to_f64(
            l.weights_quantizer
                .fake_quantize(l.weight.clone())
                .unwrap()
                .as_vec(),
        )
    });
    let biases = layers.map(|l| {
        let b: Tensor<Rank1<M>, f32, Cpu> =
            layer_bias(&l.bias, &l.input_quantizer, &l.weights_quantizer).unwrap();
        to_f64(b.as_vec())
    });
    let x0 = to_f64(x.as_vec());
    let mut s = Surrogate {
        weights: weights.clone(),
        biases,
        quantizers: [
            straight(&q.w_q.input_quantizer, &x0),
            straight(&q.w_k.input_quantizer, &x0),
            straight(&q.w_v.input_quantizer, &x0),
            Straight::identity(B * S * M),
            Straight::identity(B * S * M),
            Straight::identity(B * S * M),
            Straight::identity(B * HEADS * S * S),
            Straight::identity(B * S * M),
        ],
    };
    // Each quantizer sees the values the ones before it give: fill them in order.
    let (_, [q0, k0, v0, _, _]) = surrogate(&s, &x0, &weights[0]);
    s.quantizers[3] = straight(&q.matmul_inputs.query, &q0);
    s.quantizers[4] = straight(&q.matmul_inputs.key, &k0);
    s.quantizers[5] = straight(&q.matmul_inputs.value, &v0);
    let (_, [_, _, _, p0, _]) = surrogate(&s, &x0, &weights[0]);
    s.quantizers[6] = straight(&q.matmul_inputs.probs, &p0);
    let (_, [_, _, _, _, t0]) = surrogate(&s, &x0, &weights[0]);
    s.quantizers[7] = straight(&q.w_o.input_quantizer, &t0);
    let (y0, _) = surrogate(&s, &x0, &weights[0]);
    // At the base point the surrogate is the quantized layer.
    let yq = q.try_forward(x.clone()).unwrap().as_vec();
    for (a, b) in y0.iter().zip(&yq) {
        assert!((a - *b as f64).abs() < 1e-4, "surrogate {a} vs layer {b}");
    }

    let rv = to_f64(r.as_vec());
    let loss = |x: &[f64], w: &[f64]| -> f64 {
        surrogate(&s, x, w)
            .0
            .iter()
            .zip(&rv)
            .map(|(a, b)| a * b)
            .sum()
    };
    let h = 1e-4;
    let check = |got: f32, up: f64, down: f64, what: String| {
        let fd = (up - down) / (2.0 * h);
        assert!(
            (got as f64 - fd).abs() <= 2e-3 * (1.0 + fd.abs()),
            "{what}: autodiff {got}, finite difference {fd}"
        );
    };
    for i in 0..x0.len() {
        let (mut up, mut down) = (x0.clone(), x0.clone());
        up[i] += h;
        down[i] -= h;
        check(
            dx[i],
            loss(&up, &weights[0]),
            loss(&down, &weights[0]),
            format!("dx[{i}]"),
        );
    }
    // w_q's weight: its quantizer passes the gradient straight through, except where it
    // clipped the weight (more than half a step from its quantized value: 0 there).
    let w_float = to_f64(q.w_q.weight.as_vec());
    let w_steps = q
        .w_q
        .weights_quantizer
        .qparams()
        .unwrap()
        .unwrap()
        .scales()
        .to_vec();
    for i in 0..M * M {
        let (mut up, mut down) = (weights[0].clone(), weights[0].clone());
        up[i] += h;
        down[i] -= h;
        let step = w_steps[i / M] as f64;
        if (w_float[i] - weights[0][i]).abs() <= 0.5 * step * (1.0 + 1e-4) {
            check(
                dw_q[i],
                loss(&x0, &up),
                loss(&x0, &down),
                format!("dw_q[{i}]"),
            );
        } else {
            assert_eq!(dw_q[i], 0.0, "dw_q[{i}]: the weight was clipped");
        }
    }
    assert!(dw_q.iter().any(|g| *g != 0.0) && dx.iter().any(|g| *g != 0.0));
}

/// Quantization-aware training of the attention layer: the loss falls, and the learned step
/// sizes of both products' inputs move.
#[test]
fn quantized_attention_trains() {
    let dev = Cpu::seed_from_u64(3);
    let float = dev.build_module::<Attention, f32>();
    let mut q = convert_model(&float, &policy("")).unwrap();
    let x: Tensor<Rank3<4, 5, 8>, f32, _> = dev.sample_normal();
    // A reachable target: what another attention layer of the same shape computes.
    let teacher = dev.build_module::<Attention, f32>();
    let target = teacher.forward(x.clone());
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    q.set_mode("*", QuantizerMode::Training).unwrap();
    let before = [&q.matmul_inputs.query, &q.matmul_inputs.probs].map(|t| t.learned.as_vec());
    let losses = mse_losses(&mut q, &x, &target, 1e-2, 60);
    assert!(losses[59] < 0.2 * losses[0], "{losses:?}");
    let after = [&q.matmul_inputs.query, &q.matmul_inputs.probs].map(|t| t.learned.as_vec());
    assert!(
        before[0] != after[0] && before[1] != after[1],
        "the step sizes train"
    );
}

/// Exports `q` for samples of `shape` and runs `x` on integers: the output matches the
/// fake-quantized model's `fq` within the integer runtime's documented tolerance (the model
/// simulates the integer softmax, GELU and LayerNorm, so only near-ties of `f32` sums differ).
fn assert_runs_on_integers<M: QuantizedModule>(q: &M, shape: &[usize], x: &[f32], fq: &[f32]) {
    let graph = export_model(q, shape, Default::default()).unwrap();
    for op in [
        "AttentionScores",
        "Softmax",
        "AttentionContext",
        "LayerNorm",
    ] {
        assert!(graph.nodes.iter().any(|n| n.op.name() == op), "{op}");
    }
    let int = IntegerModel::new(&graph).unwrap().forward(x).unwrap();
    assert_integer_matches(&int, fq, "transformer");
}

/// dfdx's `TransformerEncoder` (a `Repeated` of blocks) converts: its slots by dotted name,
/// pass-through equality while calibrating, the calibrated model exported and run on integers
/// (softmax and LayerNorm included), and training.
#[test]
fn a_transformer_encoder_converts_calibrates_trains_and_runs_on_integers() {
    type Encoder = TransformerEncoder<8, 2, 16, 2>;
    let dev = Cpu::seed_from_u64(4);
    let float = dev.build_module::<Encoder, f32>();
    let mut q = convert_model(&float, &policy("")).unwrap();
    let names: Vec<(String, LayerKind)> =
        slots(&mut q).into_iter().map(|(n, k, _)| (n, k)).collect();
    for (name, kind) in [
        ("0.self_attn.w_q.weights", LayerKind::Linear),
        ("0.self_attn.scores.query", LayerKind::AttentionScores),
        ("0.self_attn.context.probs", LayerKind::AttentionContext),
        ("0.add.input", LayerKind::Add),
        ("0.ff.0.0.weights", LayerKind::Linear),
        ("0.ff.input", LayerKind::Add),
        ("1.self_attn.context.value", LayerKind::AttentionContext),
        ("1.ff.0.2.input", LayerKind::Linear),
    ] {
        assert!(
            names.contains(&(name.to_string(), kind)),
            "{name} in {names:?}"
        );
    }
    // 2 blocks × (4 projections × 2 + 4 matmul inputs + 2 adds + 2 feed-forward layers × 2 +
    // 2 LayerNorm inputs) = 40.
    assert_eq!(names.len(), 2 * (4 * 2 + 4 + 2 + 2 * 2 + 2), "{names:?}");
    assert!(names.contains(&("1.norm2.input".to_string(), LayerKind::LayerNorm)));

    let x: Tensor<Rank3<4, 6, 8>, f32, _> = dev.sample_normal();
    assert_eq!(
        q.try_forward_mut(x.clone()).unwrap().array(),
        float.forward(x.clone()).array()
    );
    let seq: Tensor<Rank2<6, 8>, f32, _> = dev.sample_normal();
    assert_eq!(
        q.try_forward_mut(seq.clone()).unwrap().array(),
        float.forward(seq).array()
    );
    q.finish_calibration().unwrap();
    let fq = q.try_forward(x.clone()).unwrap().as_vec();
    assert_runs_on_integers(&q, &[6, 8], &x.as_vec(), &fq);

    q.set_mode("*", QuantizerMode::Training).unwrap();
    let target: Tensor<Rank3<4, 6, 8>, f32, _> = dev.sample_normal();
    let losses = mse_losses(&mut q, &x, &target, 5e-3, 30);
    assert!(losses[29] < 0.9 * losses[0], "{losses:?}");
    let _: &QMultiHeadAttention<8, 2> = &q.modules[0].self_attn;
}

/// The vision transformer of the notes in `nn::tokens`: 2x2 patches by a strided convolution,
/// tokens with learned positions, a pre-norm block of attention and a GeLU MLP, mean pooling
/// and a head. It converts, passes dfdx's result through while calibrating, runs on integers
/// from the first quantizer to the logits, and trains.
#[test]
fn a_vision_transformer_converts_calibrates_trains_and_runs_on_integers() {
    use dfdx::nn::builders::{AccurateGeLU, LayerNorm1D, Linear, Residual};
    use quant_dfdx::nn::builders::{Conv2d, ImageTokens, MeanTokens};
    type Vit = (
        (Conv2d<1, 8, 2, 2>, ImageTokens<8, 16>),
        Residual<(LayerNorm1D<8>, MultiHeadAttention<8, 2>)>,
        Residual<(LayerNorm1D<8>, Linear<8, 16>, AccurateGeLU, Linear<16, 8>)>,
        (LayerNorm1D<8>, MeanTokens, Linear<8, 10>),
    );
    let dev = Cpu::seed_from_u64(6);
    let float = dev.build_module::<Vit, f32>();
    let mut q = convert_model(&float, &policy("")).unwrap();
    let names: Vec<String> = slots(&mut q).into_iter().map(|(n, _, _)| n).collect();
    for name in [
        "0.0.weights",
        "1.0.1.scores.query",
        "1.0.1.context.probs",
        "1.input",
        "2.0.1.weights",
        "2.0.3.input",
        "2.0.2.input",
        "3.0.input",
        "3.2.weights",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }
    assert!(!names.iter().any(|n| n.starts_with("0.1")), "{names:?}");

    let images = |n: usize| -> Tensor<(usize, Const<1>, usize, usize), f32, Cpu> {
        dev.sample_uniform_like(&(n, Const, 8, 8))
    };
    let x = images(5);
    assert_eq!(
        q.try_forward_mut(x.clone()).unwrap().as_vec(),
        float.forward(x.clone()).as_vec()
    );
    q.finish_calibration().unwrap();
    let fq = q.try_forward(x.clone()).unwrap().as_vec();
    assert_runs_on_integers(&q, &[1, 8, 8], &x.as_vec(), &fq);
    // The report measures the attention products, the LayerNorms and the GELU too.
    let report = layer_report(&q, &[1, 8, 8], &x.as_vec()).unwrap();
    for (layer, slots) in [
        ("1.0.1.scores", vec!["query", "key"]),
        ("1.0.1.context", vec!["probs", "value"]),
        ("2.0.0", vec!["input"]),
        ("2.0.2", vec!["input"]),
    ] {
        let l = report
            .iter()
            .find(|l| l.layer == layer)
            .unwrap_or_else(|| panic!("{layer} in {report:?}"));
        let named: Vec<&str> = l.quantizers.iter().map(|q| q.slot.as_str()).collect();
        assert_eq!(named, slots, "{layer}");
        assert!(
            l.sqnr_db.is_some_and(|db| db > 10.0),
            "{layer}: {:?}",
            l.sqnr_db
        );
    }

    q.set_mode("*", QuantizerMode::Training).unwrap();
    let target: Tensor<(usize, Const<10>), f32, Cpu> = dev.sample_normal_like(&(5, Const));
    let losses = mse_losses(&mut q, &x, &target, 5e-3, 30);
    assert!(losses[29] < 0.9 * losses[0], "{losses:?}");

    // W4A4 too: the position embedding joins accumulators whose scale (s_in · s_w) is then
    // coarse; the runtime refines it, so integers still match the fake-quantized model.
    let w4a4 = policy("[[overrides]]\npattern = \"*\"\ninput = { bits = 4 }\n");
    let mut q = convert_model(&float, &w4a4).unwrap();
    q.try_forward_mut(x.clone()).unwrap();
    q.finish_calibration().unwrap();
    let fq = q.try_forward(x.clone()).unwrap().as_vec();
    assert_runs_on_integers(&q, &[1, 8, 8], &x.as_vec(), &fq);
}
