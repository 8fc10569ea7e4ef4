//! Post-training quantization (PTQ) of the digits MLP with every observer, at 8 and 4 bits:
//! calibrate on a few training batches, freeze, evaluate on the test split, and report the
//! per-layer quantization error (SQNR against the same model with quantizers disabled).
//!
//! Run: `cargo run --release --example calibrate_digits`
//!
//! At 4 bits the entropy (KL) observer clips the first layer's 17-level pixel input far too
//! much: TensorRT's rule is made for 8-bit grids and continuous data (see `EntropyObserver`).

use dfdx::prelude::*;
use quant::calibration::calibrate;
use quant::convert::convert_model;
use quant::digits;
use quant::pipeline::config::{Optimizer, Schedule};
use quant::pipeline::nets::{Mlp, MlpBuilder, QMlp};
use quant::pipeline::train::{accuracy, calibration_inputs, logits, predictions, train, Phase};
use quant::policy::Policy;
use quant::report::layer_report;

type X = (usize, Const<64>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = digits::load(&digits::bundled_path())?;
    let dev = Cpu::seed_from_u64(1);
    let mut float: Mlp = dev.build_module::<MlpBuilder, f32>();
    let phase = Phase {
        epochs: 40,
        batch_size: 64,
        lr: 1e-3,
        schedule: Schedule::Cosine,
        warmup_epochs: 0,
        shift: 0,
        optimizer: Optimizer::Adam,
        weight_decay: 0.0,
        label_smoothing: 0.0,
    };
    train::<Mlp, X, 10>(&dev, &mut float, &data.train, &phase, 1, None, None)?;
    let fp32 = accuracy(
        &predictions(&logits::<Mlp, X, 10>(&dev, &float, &data.test, 256)?, 10),
        data.test.labels(),
    );
    println!("float MLP: {:.2}%\n", 100.0 * fp32);
    println!(
        "{:<22} {:>6} {:>10} {:>26}",
        "observer", "bits", "PTQ acc", "SQNR dB (layers 0, 2, 4)"
    );

    let (pixels, _) = data.train.gather(&(0..256).collect::<Vec<_>>());
    for bits in [8, 4] {
        for observer in [
            "\"MinMax\"",
            "\"MovingAverageMinMax\"",
            "{ kind = \"Percentile\", percentile = 99.9 }",
            "\"Mse\"",
            "\"Entropy\"",
        ] {
            let policy = Policy::from_toml_str(
                &format!(
                    "[weights]\ntraining_method = \"Ste\"\nmethod = \"Symmetric\"\nbits = {bits}\nobserver = \"MinMax\"\n\
                     [input]\ntraining_method = \"Ste\"\nmethod = \"Uniform\"\nbits = {bits}\nobserver = {observer}\n"
                ),
                "calibration policy",
            )?;
            let mut q: QMlp = convert_model(&float, &policy)?;
            calibrate(
                &mut q,
                calibration_inputs::<X>(&dev, &data.train, 8, 64, 1)?,
            )?;
            let acc = accuracy(
                &predictions(&logits::<QMlp, X, 10>(&dev, &q, &data.test, 256)?, 10),
                data.test.labels(),
            );
            let sqnr: Vec<String> = layer_report(&q, &[64], &pixels)?
                .iter()
                .map(|l| l.sqnr_db.map_or("-".into(), |v| format!("{v:.1}")))
                .collect();
            let name = observer.trim_matches('"').replace(
                "{ kind = \"Percentile\", percentile = 99.9 }",
                "Percentile(99.9)",
            );
            println!(
                "{name:<22} {bits:>6} {:>9.2}% {:>26}",
                100.0 * acc,
                sqnr.join(", ")
            );
        }
    }
    Ok(())
}
