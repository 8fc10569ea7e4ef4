//! A transformer encoder built from dfdx's own modules, converted by a TOML policy that puts
//! 4-bit weights on every projection and 8-bit quantizers on the inputs of both attention
//! matmuls (`Q·Kᵀ` and `softmax(·)·V`), calibrated, trained with quantization for a few steps,
//! and its quantizers listed by dotted name.
//!
//! Each 8x8 digit is read as a sequence of its 8 rows (8 tokens of 8 pixels): a Linear embeds
//! each row, dfdx's `TransformerEncoder` (2 blocks, 4 heads) mixes them, a Linear gives each
//! token class logits, and the loss takes their mean over the tokens (about 90% float on the
//! test split after 40 epochs, and as much at W4A8). The LayerNorm inputs are quantized too
//! (the `[input]` defaults cover them), so the trained model exports as a graph and runs on
//! integers from its first quantizer to its logits: the integer LayerNorm and softmax are
//! simulated during training, and the last lines compare the integer model's predictions with
//! the fake-quantized model's.
//!
//! Run: `cargo run --release --example transformer`

use dfdx::nn::builders::{Linear, TransformerEncoder};
use dfdx::optim::Adam;
use dfdx::prelude::*;

use quant::calibration::calibrate;
use quant::convert::convert_model;
use quant::data::Samples;
use quant::digits;
use quant::integer::IntegerModel;
use quant::layers::{QuantizedModuleExt, QuantizerMode};
use quant::lower::export_model;
use quant::pipeline::train::targets;
use quant::policy::Policy;

const TOKENS: usize = 8;
const MODEL: usize = 32;
type Builder = (
    Linear<TOKENS, MODEL>,
    TransformerEncoder<MODEL, 4, 64, 2>,
    Linear<MODEL, 10>,
);
/// A batch of sequences: `[batch, tokens, features]`.
type Sequences = (usize, Const<TOKENS>, Const<TOKENS>);

const POLICY: &str = r#"
[weights]                  # every projection, feed-forward and embedding Linear
training_method = "Lsq"
method = "Symmetric"
bits = 4
observer = "Mse"

[input]                    # the inputs of the Linear layers
training_method = "Lsq"
method = "Uniform"
bits = 8
observer = "Mse"

[kinds.AttentionScores]    # Q and K, the inputs of Q·Kᵀ
input = { bits = 8, method = "Symmetric" }

[kinds.AttentionContext]   # the softmax output and V, the inputs of softmax(·)·V
input = { bits = 8 }
"#;

/// A batch of `idx` as sequences of rows, with its labels.
fn batch(dev: &Cpu, data: &Samples, idx: &[usize]) -> (Tensor<Sequences, f32, Cpu>, Vec<usize>) {
    let (pixels, labels) = data.gather(idx);
    let shape = (idx.len(), Const, Const);
    (dev.tensor_from_vec(pixels, shape), labels)
}

/// One epoch of Adam on cross-entropy of the token-mean logits; returns the mean loss.
fn epoch<M>(dev: &Cpu, model: &mut M, opt: &mut Adam<M, f32, Cpu>, data: &Samples, seed: u64) -> f32
where
    M: TensorCollection<f32, Cpu>
        + ModuleMut<
            Tensor<Sequences, f32, Cpu, OwnedTape<f32, Cpu>>,
            Output = Tensor<(usize, Const<TOKENS>, Const<10>), f32, Cpu, OwnedTape<f32, Cpu>>,
        >,
    M::Error: std::fmt::Debug,
{
    let mut order: Vec<usize> = (0..data.len()).collect();
    // A fixed shuffle per epoch: the example's results repeat from run to run.
    order.sort_by_key(|i| (*i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut total = 0.0;
    let mut grads = model.alloc_grads();
    for idx in order.chunks(64) {
        let (x, labels) = batch(dev, data, idx);
        let y = dev.tensor_from_vec(targets(&labels, 10, 0.1), (idx.len(), Const::<10>));
        let logits = model
            .try_forward_mut(x.traced(grads))
            .expect("shapes fixed by the types")
            .mean::<_, Axis<1>>();
        let loss = cross_entropy_with_logits_loss(logits, y);
        total += loss.array();
        grads = loss.backward();
        opt.update(model, &grads)
            .expect("every parameter has a gradient");
        model.zero_grads(&mut grads);
    }
    total / order.len().div_ceil(64) as f32
}

/// The class of each sample from per-token logits `[samples, TOKENS, 10]`: the best of their
/// mean over the tokens.
fn classes(logits: &[f32]) -> Vec<usize> {
    logits
        .chunks(TOKENS * 10)
        .map(|sample| {
            let mean = |c: usize| sample.chunks(10).map(|t| t[c]).sum::<f32>();
            (0..10)
                .max_by(|a, b| mean(*a).total_cmp(&mean(*b)))
                .unwrap_or(0)
        })
        .collect()
}

/// The share of `predicted` equal to `expected`.
fn agreement(predicted: &[usize], expected: &[usize]) -> f32 {
    let same = predicted
        .iter()
        .zip(expected)
        .filter(|(a, b)| a == b)
        .count();
    same as f32 / expected.len().max(1) as f32
}

/// The predicted class of every sample of `data`.
fn predictions<M>(dev: &Cpu, model: &M, data: &Samples) -> Vec<usize>
where
    M: Module<
        Tensor<Sequences, f32, Cpu>,
        Output = Tensor<(usize, Const<TOKENS>, Const<10>), f32, Cpu>,
    >,
    M::Error: std::fmt::Debug,
{
    let all: Vec<usize> = (0..data.len()).collect();
    let mut predicted = Vec::with_capacity(data.len());
    for idx in all.chunks(256) {
        let (x, _) = batch(dev, data, idx);
        let logits = model.try_forward(x).expect("shapes fixed by the types");
        predicted.extend(classes(&logits.as_vec()));
    }
    predicted
}

/// Test accuracy of the token-mean logits.
fn accuracy<M>(dev: &Cpu, model: &M, data: &Samples) -> f32
where
    M: Module<
        Tensor<Sequences, f32, Cpu>,
        Output = Tensor<(usize, Const<TOKENS>, Const<10>), f32, Cpu>,
    >,
    M::Error: std::fmt::Debug,
{
    let labels = data.gather(&(0..data.len()).collect::<Vec<_>>()).1;
    agreement(&predictions(dev, model, data), &labels)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = digits::bundled()?;
    let dev = Cpu::seed_from_u64(0);
    let mut float = dev.build_module::<Builder, f32>();
    let mut opt = Adam::new(
        &float,
        AdamConfig {
            lr: 3e-3,
            ..Default::default()
        },
    );
    for e in 0..40 {
        epoch(&dev, &mut float, &mut opt, &data.train, e);
    }
    let fp32 = accuracy(&dev, &float, &data.test);
    println!("float encoder: {:.2}% on the test split", 100.0 * fp32);

    let policy = Policy::from_toml_str(POLICY, "transformer example policy")?;
    let mut q = convert_model(&float, &policy)?;
    policy.check_unmatched()?;
    println!("\nquantizers, by dotted name (slot after the layer):");
    for (name, d) in q.quantizers()? {
        println!(
            "  {name:<28} {} {} {}-bit{}",
            d.training_method.name(),
            d.method,
            d.bits,
            if d.per_channel { " per channel" } else { "" }
        );
    }

    let calibration: Vec<_> = (0..8)
        .map(|b| {
            batch(
                &dev,
                &data.train,
                &(b * 64..(b + 1) * 64).collect::<Vec<_>>(),
            )
            .0
        })
        .collect();
    calibrate(&mut q, calibration)?;
    let ptq = accuracy(&dev, &q, &data.test);
    q.set_mode("*", QuantizerMode::Training)?;
    let mut opt = Adam::new(
        &q,
        AdamConfig {
            lr: 5e-4,
            ..Default::default()
        },
    );
    for e in 0..3 {
        let loss = epoch(&dev, &mut q, &mut opt, &data.train, 100 + e);
        println!("QAT epoch {e}: loss {loss:.4}");
    }
    q.set_mode("*", QuantizerMode::Frozen)?;
    let qat = accuracy(&dev, &q, &data.test);
    println!(
        "\nW4A8 PTQ {:.2}%, after 3 QAT epochs {:.2}% (float {:.2}%)",
        100.0 * ptq,
        100.0 * qat,
        100.0 * fp32
    );

    // Integer-only inference: every matmul, the softmax and the LayerNorms on integers.
    let graph = export_model(&q, &[TOKENS, TOKENS], Default::default())?;
    let integer = IntegerModel::new(&graph)?;
    let (pixels, labels) = data.test.gather(&(0..data.test.len()).collect::<Vec<_>>());
    let on_integers = classes(&integer.forward(&pixels)?);
    let fake_quantized = predictions(&dev, &q, &data.test);
    println!(
        "\nexported: {} nodes; on integers {:.2}%, the same prediction as the fake-quantized model on {:.2}% of the test split",
        graph.nodes.len(),
        100.0 * agreement(&on_integers, &labels),
        100.0 * agreement(&on_integers, &fake_quantized)
    );
    Ok(())
}
