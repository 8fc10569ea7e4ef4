//! QuanTransformer's model transformer story, in Rust: a float CNN converted layer by layer by a
//! per-type policy with per-name special layers.
//!
//! The float CNN is built from quant-dfdx' stable convolution, pooling and flattening
//! (`quant::nn::builders`) and dfdx's Linear/ReLU, and trained briefly on the bundled
//! digits. `convert_model` then walks it: every layer is asked of the policy by its dotted name
//! and kind (QuanTransformer's `quan_policy` by type, `special_layers` by name); `Conv2d` becomes
//! `QConv2d`, `Linear` becomes `QLinear`, pooling and flattening become `QuantInput<_>` (input
//! quantizer only), activations stay float. The program prints each decision as the policy
//! makes it, calibrates on a batch, prints the per-layer report (quantizers, scale ranges, SQNR
//! against the float model) and the float and fake-quantized accuracies.
//!
//! Run: `cargo run --release --example convert_model`

use dfdx::prelude::*;

use quant::convert::{convert_model, LayerKind};
use quant::digits;
use quant::layers::{QuantizerSpec, Slot};
use quant::nn::builders as qnn;
use quant::observers::ObserverConfig;
use quant::pipeline::train::{accuracy, calibration_inputs, logits, predictions, train, Phase};
use quant::prelude::*;
use quant::report::{layer_report, layer_table};

/// The float CNN, as builders (dfdx's tuples hold at most six modules, so it nests):
/// `0.*` the first conv block, `1.*` the second, `2.*` the classifier.
type CnnBuilder = (
    (qnn::Conv2d<1, 8, 3, 1, 1>, ReLU, qnn::MaxPool2d<2>),
    (qnn::Conv2d<8, 16, 3, 1, 1>, ReLU, qnn::MaxPool2d<2>),
    (qnn::Flatten<64>, Linear<64, 32>, ReLU, Linear<32, 10>),
);

type Images = (usize, Const<1>, Const<8>, Const<8>);

fn spec(config: impl Into<QuantizerConfig>) -> QuantizerSpec {
    QuantizerSpec {
        config: config.into(),
        observer: ObserverConfig::MinMax,
    }
}

/// The policy: by kind, LSQ 4-bit weights per channel and 8-bit inputs for convolutions and
/// linear layers, 8-bit inputs (straight-through) for max pooling, flattening left float; by
/// name, the first convolution and the last linear layer on 8-bit weights (the layers most
/// sensitive to quantization, as QuanTransformer's `special_layers` example keeps them).
fn policy(name: &str, kind: LayerKind, slot: Slot) -> quant::Result<Option<QuantizerSpec>> {
    let special = ["0.0", "2.3"];
    let weight_bits = if special.contains(&name) { 8 } else { 4 };
    let input = |id| ActivationQuantizerConfig::new(id, QuantizationMethod::Symmetric, 8);
    Ok(match (kind, slot) {
        (LayerKind::Conv2d | LayerKind::Linear, Slot::WEIGHTS) => {
            Some(spec(WeightsQuantizerConfig::new(
                TrainingMethod::Lsq,
                QuantizationMethod::Symmetric,
                weight_bits,
            )))
        }
        (LayerKind::Conv2d | LayerKind::Linear, _) => Some(spec(input(TrainingMethod::Lsq))),
        (LayerKind::MaxPool2d | LayerKind::AvgPool2d, _) => Some(spec(input(TrainingMethod::Ste))),
        _ => None,
    })
}

/// `policy`, printing each decision as the conversion asks for it.
fn printing_policy(
    name: &str,
    kind: LayerKind,
    slot: Slot,
) -> quant::Result<Option<QuantizerSpec>> {
    let decision = policy(name, kind, slot)?;
    let shown = match &decision {
        None => "float".to_string(),
        Some(s) => format!(
            "{} {} {}-bit{}",
            s.config.training_method().name(),
            s.config.method(),
            s.config.bits(),
            if s.config.per_channel() {
                " per channel"
            } else {
                ""
            }
        ),
    };
    println!(
        "  {name:<5} {:<10} {:<8} {shown}",
        kind.to_string(),
        slot.name
    );
    Ok(decision)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = digits::load(&digits::bundled_path())?;
    let dev = Cpu::seed_from_u64(0);
    let mut cnn = dev.build_module::<CnnBuilder, f32>();

    // A short float training, so the report compares against a model that works.
    let phase = Phase {
        epochs: 4,
        lr: 3e-3,
        ..Phase::default()
    };
    let losses = train::<_, Images, 10>(&dev, &mut cnn, &data.train, &phase, 0, None, None)?;
    for (epoch, loss) in losses.iter().enumerate() {
        println!("float epoch {epoch}: loss {loss:.4}");
    }
    let test_accuracy = |l: Vec<f32>| accuracy(&predictions(&l, 10), data.test.labels());
    let float_acc = test_accuracy(logits::<_, Images, 10>(&dev, &cnn, &data.test, 256)?);
    println!("float test accuracy: {:.1}%\n", 100.0 * float_acc);

    println!("converting layer by layer:");
    let mut q = convert_model(&cnn, &printing_policy)?;

    let calib = calibration_inputs::<Images>(&dev, &data.train, 1, 256, 0)?;
    let pixels = calib[0].as_vec();
    let n = quant::calibration::calibrate(&mut q, calib)?;
    println!("\ncalibrated {n} quantizers on 256 training images:");
    let report = layer_report(&q, &[1, 8, 8], &pixels)?;
    print!("{}", layer_table(&report));

    let quant_acc = test_accuracy(logits::<_, Images, 10>(&dev, &q, &data.test, 256)?);
    println!(
        "\nfake-quantized test accuracy (PTQ, no training): {:.1}% (float {:.1}%)",
        100.0 * quant_acc,
        100.0 * float_acc
    );
    Ok(())
}
