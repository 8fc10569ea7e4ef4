//! Your model, your data: a CNN this example defines, on MNIST regrouped into 5 classes
//! ({0, 1}, {2, 3}, ... {8, 9}), trained, quantized (W4A8, LSQ), exported and run on integers
//! through the library alone.
//!
//! ```text
//! cargo run --release --example own_model_own_data
//! ```
//!
//! Twice: first the whole pipeline in one call ([`run_model`], the run file's sections built in
//! code), then the same stages as functions around a training loop of our own (MCT's
//! init/finalize style): [`quantize`] (convert and calibrate), a QAT loop over
//! [`Trainer::step`], and [`export_and_check`] (lower to the graph, run on integers, compare).

use std::collections::BTreeMap;
use std::path::PathBuf;

use quant::data::{self, DataFormat, DataSection, Dataset, Samples, TestSplit};
use quant::dfdx::prelude::*;
use quant::layers::{QuantizedModuleExt, QuantizerMode};
use quant::pipeline::train::{accuracy, logits, lr_at, predictions, train, Phase, Trainer};
use quant::pipeline::{export_and_check, quantize, run_model, Model, RunConfig, RunOptions};
use quant::policy::Policy;

/// Five classes: each pair of digits.
const CLASSES: usize = 5;

/// A small CNN of our own: two 3x3 convolutions, each followed by 2x2 max pooling
/// (28 → 14 → 7), then a Linear head from the 32x7x7 maps to 5 logits.
type SmallCnn = (
    (
        quant::nn::builders::Conv2d<1, 16, 3, 1, 1>,
        ReLU,
        quant::nn::MaxPool2d<2>,
    ),
    (
        quant::nn::builders::Conv2d<16, 32, 3, 1, 1>,
        ReLU,
        quant::nn::MaxPool2d<2>,
    ),
    (quant::nn::Flatten<1568>, Linear<1568, CLASSES>),
);
type Input = (usize, Const<1>, Const<28>, Const<28>);

/// MNIST from the repository's `data/` (IDX files), its labels regrouped into pairs.
fn mnist_in_pairs() -> Result<Dataset, Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data");
    let mnist = data::load(&DataSection {
        format: Some(DataFormat::Idx),
        images: Some(root.join("mnist-10k-images-idx3-ubyte.gz")),
        labels: Some(root.join("mnist-10k-labels-idx1-ubyte.gz")),
        test: Some(TestSplit::FromRow(8000)),
        ..DataSection::default()
    })?;
    let pairs = |s: &Samples| {
        let labels = s.labels().iter().map(|l| l / 2).collect();
        Samples::new(s.features().to_vec(), labels, &[1, 28, 28])
    };
    Ok(Dataset::new(
        pairs(&mnist.train)?,
        pairs(&mnist.test)?,
        "MNIST in 5 pairs of digits",
    )?)
}

const RUN_FILE: &str = r#"
[run]
seeds = [0]
[float]
epochs = 8
lr = 3e-3
shift = 2
[calibration]
batches = 8
[qat]
epochs = 2
lr = 1e-3
shift = 2
init = "ptq"
[quantization]
platform = "Academic"
weights = { training_method = "Lsq", bits = 4 }
input = { training_method = "Lsq", method = "Uniform", bits = 8, observer = "Mse" }
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = mnist_in_pairs()?;
    let cfg = RunConfig::from_toml_str(RUN_FILE, "own_model_own_data.rs")?;
    let model: Model<Input, CLASSES, _> =
        Model::new("small-cnn", |dev| dev.build_module::<SmallCnn, f32>());

    // 1. The whole pipeline in one call.
    let report = run_model(&cfg, &RunOptions::default(), &data, &model, &mut |_| {})?.report;
    println!("run_model:\n{}", report.table());

    // 2. The same stages, around a training loop of our own.
    let dev = Cpu::seed_from_u64(0);
    let mut float = model.build(&dev);
    let float_phase = Phase::from(&cfg.float);
    train::<_, Input, CLASSES>(&dev, &mut float, &data.train, &float_phase, 0, None, None)?;
    let accuracy_of =
        |logits: Vec<f32>| accuracy(&predictions(&logits, CLASSES), data.test.labels());
    let float_acc = accuracy_of(logits::<_, Input, CLASSES>(&dev, &float, &data.test, 256)?);

    let policy: &Policy = &cfg.quantization;
    let mut q = quantize::<Input, CLASSES, _>(&dev, &float, policy, &data.train, 8, 64, 0)?;
    let ptq_acc = accuracy_of(logits::<_, Input, CLASSES>(&dev, &q, &data.test, 256)?);

    // QAT: our loop, one Trainer::step per batch, learning rate from the run file's schedule.
    q.set_mode("*", QuantizerMode::Training)?;
    let qat_phase = Phase::from(&cfg.qat);
    let mut trainer = Trainer::<_, Input, CLASSES>::new(&dev, &q, &qat_phase, None)?;
    let order: Vec<usize> = (0..data.train.len()).collect();
    let steps = order.len().div_ceil(qat_phase.batch_size);
    for epoch in 0..qat_phase.epochs {
        for (step, rows) in order.chunks(qat_phase.batch_size).enumerate() {
            let (x, labels) = data.train.gather(rows);
            trainer.step(&mut q, x, &labels, lr_at(&qat_phase, epoch, step, steps))?;
        }
    }
    q.set_mode("*", QuantizerMode::Frozen)?;
    let qat_acc = accuracy_of(logits::<_, Input, CLASSES>(&dev, &q, &data.test, 256)?);

    let check = export_and_check::<Input, CLASSES, _>(&q, &data.test, BTreeMap::new())?;
    println!(
        "our own loop: float {:.2}%, PTQ {:.2}%, QAT {:.2}%, integer {:.2}% (integer = QAT on {:.2}% of {} test samples)",
        100.0 * float_acc,
        100.0 * ptq_acc,
        100.0 * qat_acc,
        100.0 * check.accuracy,
        100.0 * check.agreement,
        data.test.len()
    );
    Ok(())
}
