//! A float dfdx model with a residual block and a LayerNorm, converted by a TOML policy,
//! calibrated, trained with quantization, and printed layer by layer, then lowered into the
//! graph that export formats write.
//!
//! The model is dfdx's own modules only: `(Linear, ReLU, Residual<(Linear, ReLU, Linear)>,
//! LayerNorm1D, Linear)` on the digits' 64 pixels. The policy quantizes weights to 4 bits and
//! inputs to 8, the residual add's two inputs on one grid (as TensorRT wants), and the
//! LayerNorm's input (`[kinds.LayerNorm]`); the normalisation itself stays float, so the graph
//! exports but the integer runtime says which layer keeps it from running on integers.
//!
//! Run: `cargo run --release --example resnet`

use dfdx::nn::builders::{LayerNorm1D, Linear};
use dfdx::prelude::*;

use quant::calibration::calibrate;
use quant::convert::convert_model;
use quant::digits;
use quant::integer::IntegerModel;
use quant::layers::{QuantizedModuleExt, QuantizerMode};
use quant::lower::export_model;
use quant::pipeline::config::{Optimizer, Schedule};
use quant::pipeline::train::{accuracy, calibration_inputs, logits, predictions, train, Phase};
use quant::policy::Policy;
use quant::report::{layer_report, layer_table};

type Block = Residual<(Linear<64, 64>, ReLU, Linear<64, 64>)>;
type Builder = (Linear<64, 64>, ReLU, Block, LayerNorm1D<64>, Linear<64, 10>);
type X = (usize, Const<64>);

const POLICY: &str = r#"
[weights]
training_method = "Lsq"
method = "Symmetric"
bits = 4
observer = "Mse"

[input]
training_method = "Lsq"
method = "Uniform"
bits = 8
observer = "Mse"

[kinds.LayerNorm]          # off by default for weight-free layers: quantize its input too
input = { bits = 8 }

[kinds.Add]                # the residual add: both inputs on one 8-bit grid (the default),
slots.output = "float"     # its sum left to the next layer's input quantizer
"#;

fn phase(epochs: usize) -> Phase {
    Phase {
        epochs,
        batch_size: 64,
        lr: 1e-3,
        schedule: Schedule::Cosine,
        warmup_epochs: 0,
        shift: 0,
        optimizer: Optimizer::Adam,
        weight_decay: 0.0,
        label_smoothing: 0.1,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = digits::bundled()?;
    let dev = Cpu::seed_from_u64(0);
    let mut float = dev.build_module::<Builder, f32>();
    train::<_, X, 10>(&dev, &mut float, &data.train, &phase(20), 0, None, None)?;
    let test_accuracy = |l: Vec<f32>| accuracy(&predictions(&l, 10), data.test.labels());
    let fp32 = test_accuracy(logits::<_, X, 10>(&dev, &float, &data.test, 256)?);
    println!("float model: {:.2}% on the test split", 100.0 * fp32);

    let policy = Policy::from_toml_str(POLICY, "resnet example policy")?;
    let mut q = convert_model(&float, &policy)?;
    policy.check_unmatched()?;
    println!("\nquantizers, by dotted name (slot after the layer):");
    for (name, d) in q.quantizers()? {
        println!(
            "  {name:<12} {} {} {}-bit{}",
            d.training_method.name(),
            d.method,
            d.bits,
            if d.per_channel { " per channel" } else { "" }
        );
    }

    calibrate(
        &mut q,
        calibration_inputs::<X>(&dev, &data.train, 8, 64, 0)?,
    )?;
    let ptq = test_accuracy(logits::<_, X, 10>(&dev, &q, &data.test, 256)?);
    q.set_mode("*", QuantizerMode::Training)?;
    train::<_, X, 10>(&dev, &mut q, &data.train, &phase(5), 1, None, None)?;
    q.set_mode("*", QuantizerMode::Frozen)?;
    let qat = test_accuracy(logits::<_, X, 10>(&dev, &q, &data.test, 256)?);
    println!(
        "\nPTQ {:.2}%, QAT (5 epochs) {:.2}%, float {:.2}%",
        100.0 * ptq,
        100.0 * qat,
        100.0 * fp32
    );

    let (pixels, _) = data.train.gather(&(0..256).collect::<Vec<_>>());
    println!("\nlayer by layer (SQNR against the same model with its quantizers disabled):");
    print!("{}", layer_table(&layer_report(&q, &[64], &pixels)?));

    let graph = export_model(&q, &[64], Default::default())?;
    println!("\nthe graph ({} nodes):", graph.nodes.len());
    for node in &graph.nodes {
        println!(
            "  {:<12} {:<10} <- {}",
            node.name,
            node.op.name(),
            node.inputs.join(", ")
        );
    }
    match IntegerModel::new(&graph) {
        Ok(_) => println!("\nruns on integers"),
        Err(e) => println!("\nno integer model: {e}"),
    }
    Ok(())
}
