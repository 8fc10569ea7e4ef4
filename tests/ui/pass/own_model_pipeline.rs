// A user's crate, outside quant's workspace (trybuild builds it as its own project): its own
// dfdx model (3 classes, inputs of shape [2, 4]: two tokens of four features) and its own data
// (plain vectors), through the whole library pipeline: float training, PTQ, QAT, export, integer
// inference and agreement.

use quant::data::{Dataset, Samples};
use quant::dfdx::prelude::*;
use quant::pipeline::{run_model, Model, RunConfig, RunOptions};

type Classifier = (Linear<4, 16>, ReLU, quant::nn::MeanTokens, Linear<16, 3>);
type Input = (usize, Const<2>, Const<4>);

/// Three classes: the class's own feature of the first token is raised.
fn samples(n: usize, seed: u64) -> Samples {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut x = Vec::with_capacity(n * 8);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let class = i % 3;
        for j in 0..8 {
            x.push(uniform() * 0.5 + if j == class { 2.0 } else { 0.0 });
        }
        y.push(class);
    }
    Samples::new(x, y, &[2, 4]).unwrap()
}

fn main() {
    let data = Dataset::new(samples(600, 1), samples(150, 2), "generated").unwrap();
    let cfg = RunConfig::from_toml_str(
        r#"
        [run]
        seeds = [0, 1]
        [float]
        epochs = 20
        lr = 3e-3
        [qat]
        epochs = 3
        init = "ptq"
        [quantization]
        weights = { training_method = "Lsq", method = "Symmetric", bits = 4 }
        input = { training_method = "Lsq", method = "Uniform", bits = 8 }
        "#,
        "own_model_pipeline.rs",
    )
    .unwrap();
    let model: Model<Input, 3, _> =
        Model::new("classifier", |dev| dev.build_module::<Classifier, f32>());
    let report = run_model(&cfg, &RunOptions::default(), &data, &model, &mut |_| {})
        .unwrap()
        .report;
    print!("{}", report.table());
    assert_eq!(report.seeds, vec![0, 1]);
    assert!(report.fp32_accuracy > 0.9, "{}", report.fp32_accuracy);
    assert!(report.qat_accuracy > 0.9, "{}", report.qat_accuracy);
    assert!(report.integer_agreement.unwrap() >= 0.99);

    // Labels the model cannot give are refused before anything trains.
    let bad = Dataset::new(samples(30, 3), Samples::new(vec![0.0; 8], vec![5], &[2, 4]).unwrap(), "bad").unwrap();
    let e = run_model(&cfg, &RunOptions::default(), &bad, &model, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("3 classes"), "{e}");
}
