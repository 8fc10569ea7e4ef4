//! The hostile-input corpus under `tests/hostile/` (written by `tools/gen_hostile_corpus.py`):
//! every file goes through its loader, which must return an error (never panic) whose message
//! names what `expected.toml` says: the file, the key path, the tensor or the layer. The valid
//! controls beside them must load (and, for exports, run).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dfdx::prelude::*;
use quant::pipeline::RunConfig;
use quant_core::InferableQuantizer;
use quant_dfdx::checkpoint::load_checkpoint;
use quant_dfdx::policy::Policy;
use quant_runtime::export;
use quant_runtime::integer::IntegerModel;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    loader: String,
    contains: Vec<String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("hostile")
}

/// The error and its sources, one message.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// Runs `path` through `loader`: `Ok(())` when it loads, the error's message otherwise.
fn load(loader: &str, path: &Path) -> Result<(), String> {
    match loader {
        "policy" => Policy::from_file(path).map(|_| ()).map_err(|e| chain(&e)),
        // As `quant run` reads it: a run file of a bundled network.
        "run" => RunConfig::from_file(path)
            .and_then(|cfg| cfg.bundled_model())
            .map(|_| ())
            .map_err(|e| chain(&e)),
        "inferable" => {
            let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
            serde_json::from_slice::<InferableQuantizer>(&bytes)
                .map(|_| ())
                .map_err(|e| chain(&e))
        }
        "export" => {
            let model = export::load(path).map_err(|e| chain(&e))?;
            let integer = IntegerModel::new(&model).map_err(|e| chain(&e))?;
            // A valid model runs on a batch of two samples and gives finite logits.
            let x: Vec<f32> = (0..2 * integer.input_features())
                .map(|i| (i % 7) as f32 * 0.3 - 0.8)
                .collect();
            let logits = integer.forward(&x).map_err(|e| chain(&e))?;
            assert_eq!(logits.len(), 2 * integer.output_features());
            assert!(logits.iter().all(|v| v.is_finite()), "{logits:?}");
            Ok(())
        }
        "checkpoint" => {
            let dev = Cpu::default();
            let mut model = dev.build_module::<Linear<4, 3>, f32>();
            load_checkpoint(&mut model, path).map_err(|e| chain(&e))?;
            assert_eq!(model.bias.as_vec(), vec![0.5, -0.5, 0.25]);
            Ok(())
        }
        "data" => quant::digits::load(path).map(|_| ()).map_err(|e| chain(&e)),
        "data_section" => data_section(path).map(|_| ()),
        // A file the `data_section` cases name; they read it.
        "data_file" => Ok(()),
        // As `quant run` uses it for a network of 28x28 inputs and 10 classes.
        "data_for_mnist" => data_section(path)?
            .for_model(&[1, 28, 28], 10)
            .map(|_| ())
            .map_err(|e| chain(&e)),
        other => panic!("unknown loader `{other}` in expected.toml"),
    }
}

/// Loads the `[data]` section in the file at `path`, its paths relative to the file's directory.
fn data_section(path: &Path) -> Result<quant::data::Dataset, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut section: quant::data::DataSection = toml::from_str(&text).map_err(|e| e.to_string())?;
    let dir = path.parent().unwrap_or(Path::new("."));
    for file in [
        &mut section.path,
        &mut section.test_path,
        &mut section.images,
        &mut section.labels,
        &mut section.test_images,
        &mut section.test_labels,
    ]
    .into_iter()
    .flatten()
    {
        *file = dir.join(&*file);
    }
    quant::data::load(&section).map_err(|e| chain(&e))
}

fn manifest() -> BTreeMap<String, Case> {
    let text = std::fs::read_to_string(root().join("expected.toml")).unwrap();
    toml::from_str(&text).unwrap()
}

#[test]
fn every_hostile_input_gets_an_error_naming_what_is_wrong() {
    let mut failures = Vec::new();
    let cases = manifest();
    assert!(cases.len() > 100, "{} cases", cases.len());
    for (rel, case) in &cases {
        let path = root().join(rel);
        assert!(path.exists(), "{rel} is in expected.toml but missing");
        match (load(&case.loader, &path), case.contains.is_empty()) {
            (Ok(()), true) => {}
            (Ok(()), false) => failures.push(format!("{rel}: loaded; expected an error")),
            (Err(e), true) => failures.push(format!("{rel}: valid control failed: {e}")),
            (Err(e), false) => {
                let missing: Vec<&String> = case
                    .contains
                    .iter()
                    .filter(|c| !e.contains(c.as_str()))
                    .collect();
                if !missing.is_empty() {
                    failures.push(format!("{rel}: message lacks {missing:?}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_manifest_covers_every_file_of_the_corpus() {
    let cases = manifest();
    let mut uncovered = Vec::new();
    let mut stack = vec![root()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(root()).unwrap();
            let rel_s = rel.to_string_lossy().replace('\\', "/");
            let parent = rel
                .parent()
                .map(|p| p.to_string_lossy().replace('\\', "/"))
                .unwrap_or_default();
            if rel_s != "expected.toml"
                && !cases.contains_key(&rel_s)
                && !cases.contains_key(&parent)
            {
                uncovered.push(rel_s);
            }
        }
    }
    assert!(uncovered.is_empty(), "not in expected.toml: {uncovered:?}");
}

/// Issue 10: an 8 KB export declaring an 80x80 convolution with padding 79 on an 8x8 input
/// (87x87 positions of 6,400 values per sample) once asked for 35 GB on the test split. The
/// integer runtime runs a batch in chunks whose working memory stays within
/// `MAX_BATCH_BYTES`, and still computes every sample.
#[test]
fn a_huge_convolution_runs_in_chunks_of_bounded_memory() {
    use quant_runtime::integer::MAX_BATCH_BYTES;
    let dir = root().join("export").join("conv_kernel_80_padding_79");
    let size: u64 = ["model.json", "model.safetensors"]
        .iter()
        .map(|f| std::fs::metadata(dir.join(f)).unwrap().len())
        .sum();
    assert!(size < 64 << 10, "{size} bytes");
    let integer = IntegerModel::new(&export::load(&dir).unwrap()).unwrap();
    let per_sample = integer.working_bytes_per_sample();
    assert!(per_sample > 87 * 87 * 6400, "{per_sample}");
    let chunk = integer.samples_per_chunk();
    assert!(
        chunk >= 1 && chunk * per_sample <= MAX_BATCH_BYTES,
        "{chunk} x {per_sample}"
    );
    assert!(
        360 * per_sample > 8 * MAX_BATCH_BYTES,
        "the test split would not fit at once"
    );
    // More samples than one chunk holds: every one is computed, and alike samples agree.
    let n = chunk + 2;
    let sample: Vec<f32> = (0..64).map(|i| (i % 9) as f32 * 0.05).collect();
    let x: Vec<f32> = sample.iter().cycle().take(n * 64).copied().collect();
    let y = integer.forward(&x).unwrap();
    let out = integer.output_features();
    assert_eq!(y.len(), n * out);
    assert!(y.chunks(out).all(|row| row == &y[..out]));
    assert!(y.iter().all(|v| v.is_finite()));
}

/// Issue 25: the budget is the user's to set: a smaller one runs the same model in smaller
/// chunks to the same logits, refuses a call past its multiply-adds, and refuses at
/// preparation a model one sample of which does not fit.
#[test]
fn a_smaller_budget_chunks_further_and_refuses_what_does_not_fit() {
    use quant_runtime::integer::Budget;
    let graph = export::load(&root().join("export").join("conv_kernel_80_padding_79")).unwrap();
    let default = IntegerModel::new(&graph).unwrap();
    let per_sample = default.working_bytes_per_sample();
    let macs = default.macs_per_sample();
    let small = Budget {
        working_bytes: 2 * per_sample,
        multiply_adds: 5 * macs,
    };
    let integer = IntegerModel::with_budget(&graph, small).unwrap();
    assert_eq!(integer.samples_per_chunk(), 2);
    let x: Vec<f32> = (0..5 * 64).map(|i| (i % 7) as f32 * 0.1).collect();
    assert_eq!(integer.forward(&x).unwrap(), default.forward(&x).unwrap());
    let e = integer
        .forward(&vec![0.1f32; 6 * 64])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("at most {} multiply-adds", 5 * macs)),
        "{e}"
    );
    let tiny = Budget {
        working_bytes: per_sample - 1,
        ..Budget::default()
    };
    let e = IntegerModel::with_budget(&graph, tiny)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("one sample needs {per_sample} bytes"))
            && e.contains(&format!("the budget is {} bytes", per_sample - 1)),
        "{e}"
    );
}

/// Issue 25: a value nothing reads is freed as soon as it is written, so 30 ReLUs reading one
/// 295 KB value (and read by nothing) keep about two such values alive, not 31; every op
/// counts against the multiply-add budget.
#[test]
fn values_nothing_reads_are_freed_and_every_op_is_counted() {
    let dir = root().join("export").join("dead_relus_are_freed");
    let integer = IntegerModel::new(&export::load(&dir).unwrap()).unwrap();
    // The conv's output (i32) and its im2col patches (one byte per code).
    let (value, patches) = (48 * 48 * 32 * 4, 48 * 48 * 41 * 41);
    let per_sample = integer.working_bytes_per_sample();
    assert!(
        per_sample < patches + 3 * value,
        "{per_sample} bytes per sample for values of {value} and patches of {patches}"
    );
    // Each ReLU touches the whole value: 30 of them cost at least 30 values' elements.
    assert!(integer.macs_per_sample() >= 30 * 48 * 48 * 32);
    let x = vec![0.5f32; 64];
    assert_eq!(integer.forward(&x).unwrap().len(), 32);
}

/// Issue 25: the multiply-add budget covers a whole call, not one sample: a batch that would
/// take more is refused at once, with the figures, before anything runs.
#[test]
fn a_batch_beyond_the_call_budget_is_refused_before_it_runs() {
    use quant_runtime::integer::MAX_CALL_MACS;
    let dir = root().join("export").join("conv_kernel_80_padding_79");
    let integer = IntegerModel::new(&export::load(&dir).unwrap()).unwrap();
    let n = (MAX_CALL_MACS / integer.macs_per_sample()) as usize + 1;
    let x = vec![0.25f32; n * 64];
    let started = std::time::Instant::now();
    let e = integer.forward(&x).unwrap_err().to_string();
    assert!(started.elapsed().as_secs_f64() < 1.0);
    assert!(
        e.contains(&format!("{n} samples")) && e.contains("per call"),
        "{e}"
    );
}

/// Issue 25: a chain of 65,534 nodes with long names is prepared and evaluated in linear time
/// (a per-name linear search once made it 44 s).
#[test]
fn a_long_chain_with_long_names_is_prepared_and_run_in_linear_time() {
    use quant::graph::{evaluate, ExportedQuantizer, GraphBuilder, Op, QuantizerOrigin};
    use quant::{IntegerGrid, QParams, QuantizationMethod, RoundingPolicy};
    let grid = IntegerGrid::new(8, false, false).unwrap();
    let quantizer = ExportedQuantizer {
        inferable: InferableQuantizer::new(
            QuantizationMethod::Uniform,
            grid,
            RoundingPolicy::HalfEven,
            QParams::per_tensor(0.05, 10).unwrap(),
        )
        .unwrap(),
        origin: QuantizerOrigin {
            training_method: "Ste".into(),
            quantizer: None,
            bits: 8,
            method: QuantizationMethod::Uniform,
        },
    };
    let mut g = GraphBuilder::new(&[4]).unwrap();
    let x = g.input();
    let mut last = g
        .add(
            "q",
            Op::QuantizeDequantize(quant::graph::QuantizeDequantize { quantizer }),
            &[x],
        )
        .unwrap();
    for i in 0..65_532 {
        last = g
            .add(format!("{}{i}", "n".repeat(180)), Op::Relu, &[last])
            .unwrap();
    }
    let graph = g.finish(last, Default::default()).unwrap();
    let started = std::time::Instant::now();
    let integer = IntegerModel::new(&graph).unwrap();
    let x = [0.3f32, -0.2, 0.9, 0.0];
    let y = integer.forward(&x).unwrap();
    let reference = evaluate(&graph, &x, &|_, _| false).unwrap().output;
    assert_eq!(y, reference);
    let took = started.elapsed();
    assert!(took.as_secs() < 20, "{took:?}");
}
