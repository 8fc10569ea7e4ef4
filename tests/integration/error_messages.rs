//! One check per error variant family: each error, raised through the public API the way user
//! data raises it, says what is wrong and names the offending value, key, layer or file.
//!
//! Elsewhere: policy and run-file parse/validation errors with key paths
//! (`quant-dfdx/tests/integration/policy.rs`, `tests/integration/hostile.rs`), export metadata and tensor errors and data
//! files (`tests/integration/hostile.rs`), observer errors (`quant-dfdx/tests/integration/observers.rs`), the registry's
//! `Ambiguous` (`tests/integration/registry.rs`), the data file's size limits (`DataError::TooLarge`) and
//! empty splits (`DataError::EmptySplit`) in `tests/integration/safety.rs`. `QuantError::Device` wraps dfdx's allocation failure and
//! is not raised on purpose here.

use std::path::PathBuf;

use dfdx::prelude::*;

use quant::pipeline::{eval_export, run, OutputError, RunConfig, RunError, RunOptions};
use quant::prelude::*;
use quant_core::kernels::{fake_quantize_affine_into, fake_quantize_per_tensor_affine};
use quant_core::{registry, symmetric_scale, MAX_PARAMETERS};
use quant_dfdx::checkpoint::{load_checkpoint, CheckpointError};
use quant_dfdx::convert::{convert_model, LayerKind};
use quant_dfdx::layers::Slot;
use quant_dfdx::layers::{QuantizedModuleExt, QuantizerSpec};
use quant_dfdx::lower::export_model;
use quant_dfdx::observers::{HistogramBins, ObserverConfig};
use quant_dfdx::policy::{ConfigError, Policy};
use quant_runtime::export::{self, QuantFormat};
use quant_runtime::GraphError;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quant-errors-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn has(message: &str, parts: &[&str]) {
    for p in parts {
        assert!(message.contains(p), "`{p}` missing from: {message}");
    }
}

// ----- QuantError, raised directly by the numerics, the grid and the registry -------------------

#[test]
fn quant_errors_name_the_value_and_what_is_valid() {
    let e = IntegerGrid::new(1, true, false).unwrap_err();
    assert!(matches!(e, QuantError::InvalidBits { bits: 1 }));
    has(&e.to_string(), &["bits = 1", "2..=16"]);

    let e = fake_quantize_per_tensor_affine(&[1.0], 0.0, 0, -128, 127).unwrap_err();
    assert!(matches!(e, QuantError::InvalidScale { .. }));
    has(&e.to_string(), &["scale = 0", "finite"]);

    let e = fake_quantize_per_tensor_affine(&[1.0], 0.5, 200, -128, 127).unwrap_err();
    assert!(matches!(e, QuantError::InvalidZeroPoint { .. }));
    has(&e.to_string(), &["zero_point = 200", "[-128, 127]"]);

    let e = fake_quantize_per_tensor_affine(&[1.0], 0.5, 0, 5, 3).unwrap_err();
    assert!(matches!(e, QuantError::InvalidRange { .. }));
    has(
        &e.to_string(),
        &["[5, 3]", "quant_min must not exceed quant_max"],
    );

    let mut short = [0.0; 1];
    let e = fake_quantize_affine_into(
        &[1.0, 2.0],
        &mut short,
        ChannelLayout::per_tensor(2),
        &[0.5],
        &[0],
        -8,
        7,
        RoundingPolicy::HalfEven,
    )
    .unwrap_err();
    assert!(matches!(e, QuantError::LengthMismatch { .. }));
    has(
        &e.to_string(),
        &["length mismatch for y", "expected 2, got 1"],
    );

    let e = ChannelLayout::new(&[2, 3], Some(5)).unwrap_err();
    assert!(matches!(e, QuantError::InvalidAxis { .. }));
    has(&e.to_string(), &["axis 5", "rank 2"]);

    let e = symmetric_scale(f32::NAN, IntegerGrid::INT8).unwrap_err();
    assert!(matches!(e, QuantError::NonFinite { .. }));
    has(&e.to_string(), &["threshold = NaN", "not finite"]);

    let e = HistogramBins::new(3).unwrap_err();
    assert!(matches!(e, QuantError::InvalidValue { .. }));
    has(&e.to_string(), &["bins = 3", "8..=65536"]);

    let e = registry::find(
        QuantizationTarget::Weights,
        QuantizationMethod::PowerOfTwo,
        TrainingMethod::Lsq,
    )
    .unwrap_err();
    assert!(matches!(e, QuantError::NotFound { .. }));
    has(
        &e.to_string(),
        &[
            "method PowerOfTwo",
            "training method Lsq",
            "Lsq [Symmetric, Uniform]",
        ],
    );

    let e = TrainingMethod::from_name("Lqs").unwrap_err();
    assert!(matches!(e, QuantError::UnknownTrainingMethod { .. }));
    has(&e.to_string(), &["`Lqs`", "Lsq", "Ste"]);

    let mut config =
        WeightsQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::Symmetric, 4);
    config.options.insert("colour".into(), 1.0);
    let e = registry::build(&config.into()).unwrap_err();
    assert!(matches!(e.root(), QuantError::UnknownOption { .. }));
    has(&e.to_string(), &["`colour`", "valid options: grad_factor"]);
}

// ----- QuantError::At: errors inside a model name the layer's quantizer ------------------------

quant::training_methods!(pub trait ErrorTestMethods { Greedy });

/// A quantizer that declares more learnable parameters than a runtime slot holds.
#[mark_quantizer(target = Weights, method = [Symmetric], id = Greedy)]
#[derive(Debug)]
pub struct GreedyQuantizer(QuantizerConfig);

impl WeightsQuantizer for GreedyQuantizer {
    fn from_config(config: &WeightsQuantizerConfig) -> quant::Result<Self> {
        Ok(GreedyQuantizer(config.clone().into()))
    }
}

impl TrainableQuantizer for GreedyQuantizer {
    fn config(&self) -> &QuantizerConfig {
        &self.0
    }
    fn parameters(&self) -> Vec<ParamDecl> {
        (0..=MAX_PARAMETERS)
            .map(|_| ParamDecl {
                name: "p",
                trainable: true,
            })
            .collect()
    }
    fn set_qparams(
        &self,
        _: &QParams,
        _: IntegerGrid,
        _: &mut ParamBankMut<'_>,
    ) -> quant::Result<()> {
        Ok(())
    }
    fn qparams(
        &self,
        _: &ParamBank<'_>,
        _: IntegerGrid,
        _: Option<usize>,
    ) -> quant::Result<QParams> {
        QParams::per_tensor(1.0, 0)
    }
    fn forward(
        &self,
        x: QuantizerInput<'_>,
        _: &ParamBank<'_>,
        y: &mut [f32],
    ) -> quant::Result<()> {
        y.copy_from_slice(x.data);
        Ok(())
    }
    fn backward(
        &self,
        _: QuantizerInput<'_>,
        _: &ParamBank<'_>,
        _: &[f32],
        _: &mut [f32],
        _: &mut ParamBankMut<'_>,
    ) {
    }
}

fn spec(config: impl Into<QuantizerConfig>) -> QuantizerSpec {
    QuantizerSpec {
        config: config.into(),
        observer: ObserverConfig::MinMax,
    }
}

type Mlp = (Linear<4, 6>, ReLU, Linear<6, 2>);

#[test]
fn errors_inside_a_model_name_the_layer_and_slot() {
    let dev = Cpu::seed_from_u64(1);
    let float = dev.build_module::<Mlp, f32>();
    let lsq4 = WeightsQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::Symmetric, 4);
    let act4 = ActivationQuantizerConfig::new(TrainingMethod::Lsq, QuantizationMethod::Uniform, 4);

    // ConfigMismatch: an activation config in the weights slot of layer 2.
    let wrong_target =
        |name: &str, _: LayerKind, slot: Slot| -> quant::Result<Option<QuantizerSpec>> {
            Ok(Some(spec(match slot {
                Slot::WEIGHTS if name != "2" => QuantizerConfig::from(lsq4.clone()),
                _ => act4.clone().into(),
            })))
        };
    let e = convert_model(&float, &wrong_target).unwrap_err();
    assert!(matches!(e, QuantError::At { .. }));
    assert!(matches!(e.root(), QuantError::ConfigMismatch { .. }));
    has(
        &e.to_string(),
        &["2.weights", "quantizes Weights", "Activation"],
    );

    // TooManyParameters: the user's quantizer does not fit a runtime slot.
    let greedy = |_: &str, _: LayerKind, slot: Slot| -> quant::Result<Option<QuantizerSpec>> {
        Ok((slot == Slot::WEIGHTS).then(|| {
            spec(WeightsQuantizerConfig::new(
                TrainingMethod::Greedy,
                QuantizationMethod::Symmetric,
                4,
            ))
        }))
    };
    let e = convert_model(&float, &greedy).unwrap_err();
    assert!(matches!(e.root(), QuantError::TooManyParameters { .. }));
    has(&e.to_string(), &["0.weights", "GreedyQuantizer", "at most"]);

    // NotInitialized: calibration finished before any batch was observed.
    let lsq = |_: &str, _: LayerKind, slot: Slot| -> quant::Result<Option<QuantizerSpec>> {
        Ok(Some(match slot {
            Slot::WEIGHTS => spec(lsq4.clone()),
            _ => spec(act4.clone()),
        }))
    };
    let mut q = convert_model(&float, &lsq).unwrap();
    let e = q.finish_calibration().unwrap_err();
    assert!(matches!(e.root(), QuantError::NotInitialized { .. }));
    has(
        &e.to_string(),
        &["0.input", "run forward_mut on calibration batches"],
    );

    // GraphError::Unsupported: a quantizer still calibrating has no export form.
    let e = export_model(&q, &[4], Default::default()).unwrap_err();
    assert!(matches!(e, GraphError::Unsupported { .. }));
    has(&e.to_string(), &["layer `0.input`", "still calibrating"]);
}

// ----- files: policy, checkpoint, export, run --------------------------------------------------

#[test]
fn file_errors_name_the_file() {
    let dir = scratch("files");
    let missing = dir.join("no-such-policy.toml");
    let e = Policy::from_file(&missing).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    has(&e.to_string(), &["no-such-policy.toml"]);

    let e = RunConfig::from_file(&dir.join("no-such-run.toml")).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    has(&e.to_string(), &["no-such-run.toml"]);

    let dev = Cpu::default();
    let mut model = dev.build_module::<Linear<4, 3>, f32>();
    let e = load_checkpoint(&mut model, &dir.join("no-such.safetensors")).unwrap_err();
    assert!(matches!(e, CheckpointError::Io { .. }));
    has(&e.to_string(), &["no-such.safetensors"]);

    let e = export::load(&dir.join("no-such-export")).unwrap_err();
    assert!(matches!(e, GraphError::Io { .. }));
    has(&e.to_string(), &["no-such-export", "model.json"]);

    // Saving where a regular file blocks the directory.
    let blocker = dir.join("blocker");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let graph = export::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile/export/valid"),
    )
    .unwrap();
    let e = export::save(&graph, &blocker.join("export"), &[&QuantFormat]).unwrap_err();
    assert!(matches!(e, GraphError::Io { .. }));
    has(
        &e.to_string(),
        &["blocker", "is a regular file, not a directory"],
    );

    // OutputError: a directory of the user's is never replaced; a path the system refuses is
    // an I/O error naming it.
    let users = dir.join("users");
    std::fs::create_dir(&users).unwrap();
    std::fs::write(users.join("notes.txt"), b"mine").unwrap();
    let e = export::save(&graph, &users, &[&QuantFormat]).unwrap_err();
    has(&e.to_string(), &["users", "notes.txt", "did not write"]);
    let e = quant_runtime::fs::check_export_dir(std::path::Path::new("bad\0name")).unwrap_err();
    assert!(
        matches!(e, quant_runtime::fs::OutputError::Io { .. }),
        "{e}"
    );
    has(&e.to_string(), &["bad\0name"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn run_errors_name_the_file() {
    let dir = scratch("run");
    let text = |data: &str| {
        format!(
            "[model]\nkind = \"mlp\"\n[data]\npath = \"{data}\"\n[run]\nseeds = [1]\n\
             [float]\nepochs = 1\n[qat]\nepochs = 0\n\
             [quantization.weights]\ntraining_method = \"Ste\"\nmethod = \"Symmetric\"\nbits = 8\n\
             [quantization.input]\ntraining_method = \"Ste\"\nmethod = \"Uniform\"\nbits = 8\n"
        )
    };
    let opts = |cache: Option<PathBuf>| RunOptions {
        cache_dir: cache,
        export_dir: None,
        progress: false,
        policy_name: "errors.toml".into(),
    };

    // RunError::Data: the data file named in the run file.
    let missing = dir.join("no-such-digits.csv.gz");
    let cfg =
        RunConfig::from_toml_str(&text(&missing.display().to_string()), "errors.toml").unwrap();
    let e = run(&cfg, &opts(None)).unwrap_err();
    assert!(matches!(e, RunError::Data(_)));
    has(&e.to_string(), &["no-such-digits.csv.gz"]);

    // RunError::File: the float-checkpoint cache cannot be written.
    let blocker = dir.join("cache-blocker");
    std::fs::write(&blocker, b"a file, not a directory").unwrap();
    let bundled = quant::digits::bundled_path();
    let cfg =
        RunConfig::from_toml_str(&text(&bundled.display().to_string()), "errors.toml").unwrap();
    let e = run(&cfg, &opts(Some(blocker.join("cache")))).unwrap_err();
    assert!(matches!(e, RunError::File { .. }));
    has(&e.to_string(), &["cache-blocker"]);

    // RunError::Output: the export directory is a user's file; refused before any work.
    let user_file = dir.join("notes.txt");
    std::fs::write(&user_file, b"mine").unwrap();
    let e = run(
        &cfg,
        &RunOptions {
            export_dir: Some(user_file.clone()),
            ..opts(None)
        },
    )
    .unwrap_err();
    assert!(
        matches!(e, RunError::Output(OutputError::Refused { .. })),
        "{e}"
    );
    has(
        &e.to_string(),
        &["notes.txt", "is a regular file, not a directory"],
    );
    assert_eq!(std::fs::read(&user_file).unwrap(), b"mine");

    // RunError::Export: evaluating an export directory that is not one.
    let e = eval_export(
        &dir.join("no-such-export"),
        &quant::digits::bundled().unwrap(),
        quant::integer::Budget::default(),
    )
    .unwrap_err();
    assert!(matches!(e, RunError::Export(_)));
    has(&e.to_string(), &["no-such-export", "model.json"]);
    std::fs::remove_dir_all(&dir).ok();
}
