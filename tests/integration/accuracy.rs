//! The main job's accuracy targets (issue 6), on the bundled digits, with the committed
//! configs, their seeds and a cold start (no checkpoint cache): every layer's weights and input
//! activations at the named width.
//!
//! - W8A8: PTQ within 0.3 points of float.
//! - W4A4: QAT at least float − 0.3.
//! - W2A2: QAT at least 97.0% (PyTorch eager LSQ: 96.4%, Brevitas: 90.6%).
//! - The residual CNN (issue 12): W8A8 PTQ within 0.3 points of float, W4A4 QAT at least
//!   float − 0.3, its residual adds quantized too.
//! - The vision transformer (issue 13): float at least 97%, W8A8 PTQ at least float − 0.5,
//!   W4A8 QAT at least float − 0.5, W4A4 QAT at least float − 1.5, the attention matmuls'
//!   inputs quantized too.
//!
//! Every run also checks that the integer model agrees with the fake-quantized one on at least
//! 99.7% of the test samples (99.5% for the vision transformer, whose integer softmax, GeLU
//! and LayerNorm approximate the float ones).
//!
//! MNIST (issue 21, 2,000 test samples): one seed of each committed config, its full schedule
//! (the targets are means of seeds 0, 1, 2; the README's figures come from `quant run`): float
//! at least MLP 96.3, CNN 98.3, ResNet 98.5, ViT 95.0; W4A4 QAT at least float − 0.3 (MLP, CNN,
//! ResNet, the adds quantized); ViT W8A8 PTQ at least float − 0.3, W4A8 QAT at least
//! float − 0.5, on integers only; the integer model equal to the QAT model on at least 99.8%.

use std::path::{Path, PathBuf};

use quant::pipeline::{self, RunConfig, RunOptions, RunReport};

/// Runs the committed `config` (float checkpoints cached in `cache_dir`, if any): 3 seeds.
fn run_config(config: &str, cache_dir: Option<PathBuf>) -> RunReport {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("configs")
        .join(config);
    let cfg = RunConfig::from_file(&path).unwrap_or_else(|e| panic!("{config}: {e}"));
    let opts = RunOptions {
        cache_dir,
        export_dir: None,
        progress: false,
        policy_name: config.to_string(),
    };
    let report = pipeline::run(&cfg, &opts).unwrap_or_else(|e| panic!("{config}: {e}"));
    assert_eq!(
        report.seeds.len(),
        3,
        "{config}: the targets are means of 3 seeds"
    );
    report
}

fn run(config: &str) -> RunReport {
    let report = run_config(config, None);
    for r in &report.runs {
        let agreement = r
            .integer_agreement
            .expect("every target config has an integer model");
        assert!(
            agreement >= 0.997,
            "{config} seed {}: integer agreement {agreement}",
            r.seed
        );
    }
    report
}

#[test]
#[ignore = "slow tier: a full-schedule 3-seed run of a committed config"]
fn w8a8_ptq_is_within_0_3_points_of_float() {
    let r = run("mlp_w8a8.toml");
    assert!(
        r.ptq_accuracy >= r.fp32_accuracy - 0.003,
        "PTQ {} vs float {}",
        r.ptq_accuracy,
        r.fp32_accuracy
    );
}

#[test]
#[ignore = "slow tier: a full-schedule 3-seed run of a committed config"]
fn w4a4_qat_is_at_least_float_minus_0_3() {
    let r = run("mlp_w4a4.toml");
    assert!(
        r.qat_accuracy >= r.fp32_accuracy - 0.003,
        "QAT {} vs float {}",
        r.qat_accuracy,
        r.fp32_accuracy
    );
}

#[test]
#[ignore = "slow tier: a full-schedule 3-seed run of a committed config"]
fn w2a2_qat_reaches_97_percent() {
    let r = run("mlp_w2a2.toml");
    assert!(r.qat_accuracy >= 0.97, "QAT {}", r.qat_accuracy);
}

#[test]
#[ignore = "slow tier: a full-schedule 3-seed run of a committed config"]
fn cnn_w4a4_qat_is_at_least_float_minus_0_3() {
    let r = run("cnn_w4a4.toml");
    assert!(
        r.qat_accuracy >= r.fp32_accuracy - 0.003,
        "QAT {} vs float {}",
        r.qat_accuracy,
        r.fp32_accuracy
    );
}

#[test]
#[ignore = "slow tier: a full-schedule 3-seed run of a committed config"]
fn resnet_w8a8_ptq_is_within_0_3_points_of_float() {
    let r = run("resnet_w8a8.toml");
    assert!(
        r.ptq_accuracy >= r.fp32_accuracy - 0.003,
        "PTQ {} vs float {}",
        r.ptq_accuracy,
        r.fp32_accuracy
    );
}

#[test]
#[ignore = "slow tier: a full-schedule 3-seed run of a committed config"]
fn resnet_w4a4_qat_is_at_least_float_minus_0_3() {
    let r = run("resnet_w4a4.toml");
    assert!(
        r.qat_accuracy >= r.fp32_accuracy - 0.003,
        "QAT {} vs float {}",
        r.qat_accuracy,
        r.fp32_accuracy
    );
}

/// The three ViT configs share their `[float]` section and seeds, so they share a cache
/// directory, new and empty: the first config trains each seed's float model (a cold run), the
/// other two load the very same models instead of training them again. In the test profile
/// (`quant` optimised, see Cargo.toml) the whole file, this test included, took 835 s on a
/// fresh clone on 2 cores (AMD EPYC); the three configs alone take about 8 minutes in release.
#[test]
#[ignore = "slow tier: a full-schedule 3-seed run of a committed config"]
fn vit_w8a8_ptq_w4a8_and_w4a4_qat_reach_their_targets() {
    let cache = std::env::temp_dir().join(format!("quant-accuracy-vit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let mut failures = Vec::new();
    let mut fp32 = None;
    for config in ["vit_w8a8.toml", "vit_w4a8.toml", "vit_w4a4.toml"] {
        let r = run_config(config, Some(cache.clone()));
        eprintln!("{config}\n{}", r.table());
        // One float model per seed for all three.
        assert_eq!(*fp32.get_or_insert(r.fp32_accuracy), r.fp32_accuracy);
        let mut check = |ok: bool, what: String| {
            if !ok {
                failures.push(format!("{config}: {what}"));
            }
        };
        let (float, ptq, qat) = (r.fp32_accuracy, r.ptq_accuracy, r.qat_accuracy);
        check(float >= 0.97, format!("float {float} < 0.97"));
        match config {
            "vit_w8a8.toml" => check(
                ptq >= float - 0.005,
                format!("PTQ {ptq} < float {float} - 0.005"),
            ),
            "vit_w4a8.toml" => check(
                qat >= float - 0.005,
                format!("QAT {qat} < float {float} - 0.005"),
            ),
            _ => check(
                qat >= float - 0.015,
                format!("QAT {qat} < float {float} - 0.015"),
            ),
        }
        for s in &r.runs {
            match s.integer_agreement {
                Some(a) => check(
                    a >= 0.995,
                    format!("seed {}: integer agreement {a} < 0.995", s.seed),
                ),
                None => check(
                    false,
                    format!(
                        "seed {}: no integer model ({})",
                        s.seed,
                        r.no_integer_model.as_deref().unwrap_or("no reason given")
                    ),
                ),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&cache);
    assert!(failures.is_empty(), "{failures:#?}");
}

// ----- MNIST (issue 21) ------------------------------------------------------------------------

/// One seed (0) of the committed MNIST `config`, its full schedule, float checkpoints cached in
/// `cache_dir` (if any): what CI's slow tier checks. The README's figures are the means of
/// seeds 0, 1, 2 from `quant run configs/mnist_*.toml`.
fn mnist_seed_0(
    config: &str,
    cache_dir: Option<PathBuf>,
    schedule: impl FnOnce(&mut RunConfig),
) -> RunReport {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("configs")
        .join(config);
    let mut cfg = RunConfig::from_file(&path).unwrap_or_else(|e| panic!("{config}: {e}"));
    cfg.run.seeds = vec![0];
    schedule(&mut cfg);
    let opts = RunOptions {
        cache_dir,
        export_dir: None,
        progress: false,
        policy_name: config.to_string(),
    };
    let report = pipeline::run(&cfg, &opts).unwrap_or_else(|e| panic!("{config}: {e}"));
    eprintln!("{config}\n{}", report.table());
    report
}

/// Checks one seed's figures: float at least `float_floor`, QAT (or PTQ, for a W8A8 config)
/// at least float − `max_drop`, and the integer model's predictions equal the QAT model's on
/// at least 99.8% of the 2,000 test samples.
fn check_mnist(config: &str, r: &RunReport, float_floor: f64, quantized: f64, max_drop: f64) {
    let float = r.fp32_accuracy;
    let agreement = r.integer_agreement.unwrap_or_else(|| {
        panic!(
            "{config}: no integer model ({})",
            r.no_integer_model.as_deref().unwrap_or("no reason given")
        )
    });
    assert!(
        float >= float_floor,
        "{config}: float {float} < {float_floor}"
    );
    assert!(
        quantized >= float - max_drop,
        "{config}: quantized {quantized} < float {float} - {max_drop}"
    );
    assert!(
        agreement >= 0.998,
        "{config}: integer agreement {agreement}"
    );
}

#[test]
#[ignore = "slow tier: one seed of an MNIST config, full schedule"]
fn mnist_mlp_w4a4_qat_is_within_0_3_points_of_float() {
    let r = mnist_seed_0("mnist_mlp_w4a4.toml", None, |_| {});
    check_mnist("mnist_mlp_w4a4.toml", &r, 0.963, r.qat_accuracy, 0.003);
}

#[test]
#[ignore = "slow tier: one seed of an MNIST config, full schedule"]
fn mnist_cnn_w4a4_qat_is_within_0_3_points_of_float() {
    let r = mnist_seed_0("mnist_cnn_w4a4.toml", None, |_| {});
    check_mnist("mnist_cnn_w4a4.toml", &r, 0.983, r.qat_accuracy, 0.003);
}

#[test]
#[ignore = "slow tier: one seed of an MNIST config, full schedule"]
fn mnist_resnet_w4a4_qat_is_within_0_3_points_of_float() {
    let r = mnist_seed_0("mnist_resnet_w4a4.toml", None, |_| {});
    check_mnist("mnist_resnet_w4a4.toml", &r, 0.985, r.qat_accuracy, 0.003);
}

/// The two ViT configs share their `[float]` section: the second loads the first's float
/// model from a fresh cache instead of training it again.
///
/// A full-schedule seed of both takes about 18 minutes of one core, too much of CI's budget on
/// 2 cores, so this runs a shorter schedule (issue 21 allows it, against a stated floor): 12
/// float epochs instead of 30, 2 QAT epochs for W8A8 (whose target is PTQ's) and 6 instead of
/// 15 for W4A8, under 6 minutes. The floors are the issue's own targets (float at least 95.0,
/// W8A8 PTQ at least float − 0.3, W4A8 QAT at least float − 0.5, integer = QAT on 99.8%);
/// measured on seed 0 of this schedule: float 97.05%, W8A8 PTQ 97.05%, W4A8 QAT 97.40%. The
/// README's figures come from the full schedule, `quant run configs/mnist_vit_*.toml`.
#[test]
#[ignore = "slow tier: one seed of the MNIST ViT configs, on a shorter schedule"]
fn mnist_vit_w8a8_ptq_and_w4a8_qat_reach_their_targets() {
    let cache =
        std::env::temp_dir().join(format!("quant-accuracy-mnist-vit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let shorter = |qat_epochs: usize| {
        move |cfg: &mut RunConfig| {
            cfg.float.epochs = 12;
            cfg.qat.epochs = qat_epochs;
        }
    };
    let w8a8 = mnist_seed_0("mnist_vit_w8a8.toml", Some(cache.clone()), shorter(2));
    let w4a8 = mnist_seed_0("mnist_vit_w4a8.toml", Some(cache.clone()), shorter(6));
    let _ = std::fs::remove_dir_all(&cache);
    assert_eq!(w8a8.fp32_accuracy, w4a8.fp32_accuracy, "one float model");
    check_mnist("mnist_vit_w8a8.toml", &w8a8, 0.95, w8a8.ptq_accuracy, 0.003);
    check_mnist("mnist_vit_w4a8.toml", &w4a8, 0.95, w4a8.qat_accuracy, 0.005);
}
