//! The same seed gives the same float model, the same calibration and the same QAT result, bit
//! for bit: the pipeline runs twice inside a one-thread rayon pool, and the float checkpoint,
//! the exported model (integer weights, biases and every quantizer's parameters) and the report
//! must be identical. A calibration-only run (no QAT epochs, QAT starting from the PTQ model)
//! exports the calibrated parameters themselves.
//!
//! With more threads: the runs are also compared across pool sizes (1, 2 and 3 threads); see
//! `results_do_not_depend_on_the_number_of_threads`. Seeds run in parallel on the pool's
//! threads: `seeds_in_parallel_give_what_one_thread_gives` runs three seeds (one listed twice,
//! so that its second listing loads the first's cached float model) on 1, 2 and 3 threads.

use std::path::{Path, PathBuf};

use quant::pipeline::{run_staged, RunConfig, RunOptions, RunReport};

const QUANTIZATION: &str = r#"
[quantization.weights]
training_method = "Lsq"
method = "Symmetric"
bits = 4
[quantization.input]
training_method = "Lsq"
method = "Uniform"
bits = 4
"#;

fn config(model: &str, qat_epochs: usize, init: &str) -> RunConfig {
    let text = format!(
        "[model]\nkind = \"{model}\"\n[run]\nseeds = [5]\n\
         [float]\nepochs = 1\nbatch_size = 64\nshift = 1\n\
         [calibration]\nbatches = 2\nbatch_size = 64\n\
         [qat]\nepochs = {qat_epochs}\nbatch_size = 64\ninit = \"{init}\"\nshift = 1\n\
         distillation = {{ weight = 0.5, temperature = 2.0 }}\n{QUANTIZATION}"
    );
    RunConfig::from_toml_str(&text, "determinism.toml").unwrap()
}

/// Everything a run leaves: the float checkpoints (file names and bytes), the export's files,
/// the report.
#[derive(Debug, PartialEq)]
struct Outcome {
    checkpoints: Vec<(String, Vec<u8>)>,
    export: Vec<(String, Vec<u8>)>,
    report: RunReport,
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quant-determinism-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// One run in a pool of `threads` threads, in its own directories.
fn run_in_pool(cfg: &RunConfig, threads: usize, name: &str) -> Outcome {
    let outcome = run_seeds_in_pool(cfg, threads, name).0;
    assert_eq!(outcome.checkpoints.len(), 1, "one float checkpoint");
    outcome
}

/// One run in a pool of `threads` threads, in its own directories; also what the run said
/// after each seed: `(seed, done, total)`, in the order it said it.
fn run_seeds_in_pool(
    cfg: &RunConfig,
    threads: usize,
    name: &str,
) -> (Outcome, Vec<(u64, usize, usize)>) {
    let dir = scratch(name);
    let opts = RunOptions {
        cache_dir: Some(dir.join("cache")),
        export_dir: Some(dir.join("export")),
        progress: false,
        policy_name: "determinism.toml".into(),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    // The policy keeps a RefCell (layers seen), so the config moves into the pool.
    let cfg = cfg.clone();
    let (mut report, said) = pool.install(move || {
        let mut said = Vec::new();
        let staged = run_staged(&cfg, &opts, &mut |d| {
            said.push((d.result.seed, d.done, d.total))
        })
        .unwrap();
        staged.export.unwrap().commit().unwrap();
        (staged.report, said)
    });
    report.export_dir = None;
    let outcome = Outcome {
        checkpoints: files(&dir.join("cache")),
        export: files(&dir.join("export")),
        report,
    };
    std::fs::remove_dir_all(&dir).ok();
    (outcome, said)
}

fn assert_same(a: &Outcome, b: &Outcome, what: &str) {
    assert!(
        a.checkpoints == b.checkpoints,
        "{what}: the float models differ"
    );
    assert_eq!(
        a.export.iter().map(|f| &f.0).collect::<Vec<_>>(),
        b.export.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    for (fa, fb) in a.export.iter().zip(&b.export) {
        assert!(fa.1 == fb.1, "{what}: exported {} differs", fa.0);
    }
    assert_eq!(a.report, b.report, "{what}: reports differ");
}

#[test]
fn same_seed_same_float_model_calibration_and_qat_in_one_thread() {
    for (model, qat_epochs, init) in [
        ("mlp", 0, "ptq"),
        ("mlp", 1, "first_batch"),
        ("cnn", 1, "ptq"),
    ] {
        let cfg = config(model, qat_epochs, init);
        let what = format!("{model}, {qat_epochs} QAT epochs from {init}");
        let a = run_in_pool(&cfg, 1, &format!("{model}-{qat_epochs}-a"));
        let b = run_in_pool(&cfg, 1, &format!("{model}-{qat_epochs}-b"));
        assert_same(&a, &b, &what);
        // The run did something: the model learned, and the export holds its three files
        // (model.json, model.onnx, model.safetensors), each the same in both runs.
        assert!(a.report.fp32_accuracy > 0.3, "{what}: {:?}", a.report);
        assert_eq!(a.export.len(), 3, "{what}");
    }
    // A different seed gives a different float model (the comparison can fail).
    let mut other = config("mlp", 0, "ptq");
    other.run.seeds = vec![6];
    let a = run_in_pool(&config("mlp", 0, "ptq"), 1, "seed-5");
    let b = run_in_pool(&other, 1, "seed-6");
    assert!(a.checkpoints[0].1 != b.checkpoints[0].1);
}

#[test]
fn results_do_not_depend_on_the_number_of_threads() {
    for model in ["mlp", "cnn"] {
        let cfg = config(model, 1, "first_batch");
        let one = run_in_pool(&cfg, 1, &format!("{model}-threads-1"));
        for threads in [2, 3] {
            let many = run_in_pool(&cfg, threads, &format!("{model}-threads-{threads}"));
            assert_same(&one, &many, &format!("{model}: 1 vs {threads} threads"));
        }
    }
}

#[test]
fn seeds_in_parallel_give_what_one_thread_gives() {
    let mut cfg = config("mlp", 1, "ptq");
    cfg.run.seeds = vec![5, 6, 5];
    let (one, said) = run_seeds_in_pool(&cfg, 1, "seeds-1");
    // In seed order, whatever order they finished in; the second listing of seed 5 found its
    // float model in the cache, where the first had written it.
    let runs = &one.report.runs;
    assert_eq!(runs.iter().map(|r| r.seed).collect::<Vec<_>>(), [5, 6, 5]);
    assert_eq!(
        runs.iter().map(|r| r.float_from_cache).collect::<Vec<_>>(),
        [false, false, true]
    );
    // Loaded or trained, seed 5's float model is the same, and so is everything after it.
    let mut again = runs[2].clone();
    again.float_from_cache = false;
    assert_eq!(runs[0], again);
    assert_eq!(
        one.checkpoints.len(),
        2,
        "one float checkpoint per distinct seed"
    );
    // One thread: seed by seed, as a plain loop.
    assert_eq!(said, [(5, 1, 3), (6, 2, 3), (5, 3, 3)]);
    for threads in [2, 3] {
        let (many, said) = run_seeds_in_pool(&cfg, threads, &format!("seeds-{threads}"));
        assert_same(&one, &many, &format!("3 seeds: 1 vs {threads} threads"));
        // One line per finished seed, counting up, in the order they finished.
        let mut seeds: Vec<u64> = said.iter().map(|s| s.0).collect();
        seeds.sort();
        assert_eq!(seeds, [5, 5, 6], "{threads} threads: {said:?}");
        assert_eq!(
            said.iter().map(|s| (s.1, s.2)).collect::<Vec<_>>(),
            [(1, 3), (2, 3), (3, 3)],
            "{threads} threads"
        );
    }
}

#[test]
fn dfdx_matmul_gives_the_same_bits_on_any_number_of_threads() {
    use dfdx::prelude::*;
    // dfdx's CPU matmul is the `gemm` crate with rayon parallelism over the pool's threads; it
    // splits rows and columns, never the inner sum, so every element is summed in one order.
    // Shapes: the MLP's, large enough to be split across threads, and a long inner dimension.
    let dev = Cpu::seed_from_u64(11);
    for (m, k, n) in [(64, 256, 256), (384, 1536, 320), (8, 8192, 8)] {
        let a: Tensor<(usize, usize), f32, Cpu> = dev.sample_normal_like(&(m, k));
        let b: Tensor<(usize, usize), f32, Cpu> = dev.sample_normal_like(&(k, n));
        let product = |threads: usize| -> Vec<u32> {
            let (a, b) = (a.clone(), b.clone());
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(move || a.matmul(b).as_vec().iter().map(|v| v.to_bits()).collect())
        };
        let one = product(1);
        for threads in [2, 3, 4] {
            assert!(
                product(threads) == one,
                "{m}x{k}x{n}: 1 vs {threads} threads"
            );
        }
    }
}
