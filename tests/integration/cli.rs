//! The `quant` command line: every subcommand, the JSON report, the export round trip, and
//! bad input (clear error naming the file, non-zero exit, nothing half-written).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn quant(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quant"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run quant")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("quant-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A short run: a few float and QAT epochs, one seed.
fn tiny_config(dir: &Path, model: &str, extra: &str) -> PathBuf {
    let path = dir.join(format!("tiny_{model}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"[model]
kind = "{model}"
[run]
seeds = [3]
[float]
epochs = 3
[calibration]
batches = 2
[qat]
epochs = 1
lr = 1e-4
{extra}
[quantization.weights]
training_method = "Lsq"
method = "Symmetric"
bits = 8
[quantization.input]
training_method = "Lsq"
method = "Uniform"
bits = 8
"#
        ),
    )
    .unwrap();
    path
}

#[test]
fn list_shows_quantizers_layer_kinds_with_their_slots_and_platforms() {
    let o = quant(&["list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for line in [
        "Weights     Lsq        Symmetric, Uniform               quant_dfdx::quantizers::lsq::LsqWeightsQuantizer",
        "Activation  Pact       Uniform                          quant_dfdx::quantizers::pact::PactActivationQuantizer",
        // Layer kinds with their slots, the transformer ones included.
        "AttentionScores   query, key            yes",
        "AttentionContext  probs, value          yes",
        "LayerNorm         input                 yes",
        "Gelu              input                 yes",
        "MaxPool2d         input                 no",
        // Platforms say what they do with attention.
        "TensorRtInt8",
        "kept float: LayerNorm, Gelu",
    ] {
        assert!(out.contains(line), "missing `{line}` in:\n{out}");
    }
}

#[test]
fn run_writes_the_report_and_an_export_that_eval_reproduces() {
    let dir = scratch("run");
    let cfg = tiny_config(&dir, "mlp", "");
    let (report, export) = (dir.join("r.json"), dir.join("export"));
    let o = quant(&[
        "run",
        cfg.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--out",
        export.to_str().unwrap(),
        "--no-cache",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    assert!(
        table.contains("seed      fp32       PTQ       QAT"),
        "{table}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    for key in [
        "fp32_accuracy",
        "ptq_accuracy",
        "qat_accuracy",
        "integer_accuracy",
        "integer_agreement",
    ] {
        let v = json[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing: {json}"));
        assert!((0.0..=1.0).contains(&v), "{key} = {v}");
    }
    assert_eq!(json["model"], "mlp");
    assert_eq!(json["seed"], 3);
    assert!(json["policy"].as_str().unwrap().ends_with("tiny_mlp.toml"));
    assert_eq!(json["layers"].as_array().unwrap().len(), 3);
    assert!(
        json["fp32_accuracy"].as_f64().unwrap() > 0.8,
        "3 float epochs already learn the digits"
    );
    assert!(json["integer_agreement"].as_f64().unwrap() >= 0.997);

    let o = quant(&["eval", export.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let expected = format!("{:.2}%", 100.0 * json["integer_accuracy"].as_f64().unwrap());
    assert!(
        stdout(&o).contains(&expected),
        "{} vs {expected}",
        stdout(&o)
    );
    assert!(json["no_onnx_model"].is_null(), "{json}");
    eval_onnx_agrees(&export, 99.7);
    std::fs::remove_dir_all(&dir).ok();
}

/// Real MNIST (the repository's IDX files): the 28x28 MLP, sized from the data, trained one
/// epoch, quantized, exported; `quant eval --config` runs the export on the run file's test
/// split (2,000 samples), and its ONNX in tract.
#[test]
fn mnist_from_idx_files_runs_end_to_end_and_eval_reads_the_run_files_data() {
    let dir = scratch("mnist");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
    let cfg = tiny_config(
        &dir,
        "mlp",
        &format!(
            "[data]\nformat = \"idx\"\nimages = \"{}\"\nlabels = \"{}\"\ntest = {{ from_row = 8000 }}\n",
            data.join("mnist-10k-images-idx3-ubyte.gz").display(),
            data.join("mnist-10k-labels-idx1-ubyte.gz").display()
        ),
    );
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("epochs = 3", "epochs = 1");
    std::fs::write(&cfg, text).unwrap();
    let (report, export) = (dir.join("r.json"), dir.join("export"));
    let o = quant(&[
        "run",
        cfg.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--out",
        export.to_str().unwrap(),
        "--no-cache",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(json["model"], "mlp-784");
    assert!(
        json["data"].as_str().unwrap().contains("mnist-10k-images"),
        "{json}"
    );
    assert!(
        json["fp32_accuracy"].as_f64().unwrap() > 0.85,
        "one epoch of the 784-256-256-10 MLP learns MNIST: {json}"
    );
    assert!(
        json["integer_agreement"].as_f64().unwrap() >= 0.99,
        "{json}"
    );
    let o = quant(&[
        "eval",
        export.to_str().unwrap(),
        "--config",
        cfg.to_str().unwrap(),
        "--onnx",
        export.join("model.onnx").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let expected = format!("{:.2}%", 100.0 * json["integer_accuracy"].as_f64().unwrap());
    let out = stdout(&o);
    assert!(
        out.contains(&expected) && out.contains("on 2000 test samples"),
        "{out}"
    );
    // The digits (the default) do not fit a model of 784 inputs: a clear error.
    let o = quant(&["eval", export.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("784 inputs"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

/// `quant eval DIR --onnx DIR/model.onnx`: tract runs the export's ONNX model, whose
/// predictions agree with the integer model's on at least `min_agreement` percent of the test
/// samples.
fn eval_onnx_agrees(export: &Path, min_agreement: f64) {
    let onnx = export.join("model.onnx");
    assert!(onnx.is_file(), "quant run writes model.onnx");
    if !cfg!(feature = "tract") {
        return;
    }
    let o = quant(&[
        "eval",
        export.to_str().unwrap(),
        "--onnx",
        onnx.to_str().unwrap(),
        "--predictions",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("ONNX model (tract) accuracy"), "{out}");
    let agreement: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("ONNX (tract) = integer model on "))
        .and_then(|l| l.split('%').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no agreement line in {out}"));
    assert!(agreement >= min_agreement, "{out}");
    for label in ["integer", "ONNX"] {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{label} predictions: ")))
            .unwrap_or_else(|| panic!("no {label} predictions in {out}"));
        assert_eq!(line.split(' ').count(), 360, "{label}");
    }
}

#[test]
fn the_cnn_runs_end_to_end_with_batchnorm_folded() {
    let dir = scratch("cnn");
    let cfg = tiny_config(&dir, "cnn", "");
    let export = dir.join("export");
    let o = quant(&[
        "run",
        cfg.to_str().unwrap(),
        "--out",
        export.to_str().unwrap(),
        "--no-cache",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let meta = std::fs::read_to_string(export.join("model.json")).unwrap();
    assert!(
        meta.contains("\"Conv2d\"") && meta.contains("\"MaxPool2d\""),
        "{meta}"
    );
    assert!(
        !meta.contains("BatchNorm"),
        "the exported model has no BatchNorm left"
    );
    eval_onnx_agrees(&export, 99.7);
    std::fs::remove_dir_all(&dir).ok();
}

/// The vision transformer runs to the end, with a warm-up; its export runs on integers in
/// `quant eval`, and its `model.onnx` in tract (LayerNorm, GELU and the softmax exact there, in
/// fixed point in the integer model: see tests/integration/onnx.rs).
#[test]
fn the_vit_runs_end_to_end_with_a_warmup() {
    let dir = scratch("vit");
    let cfg = tiny_config(&dir, "vit", "warmup_epochs = 1");
    let export = dir.join("export");
    let o = quant(&[
        "run",
        cfg.to_str().unwrap(),
        "--out",
        export.to_str().unwrap(),
        "--no-cache",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("model vit"), "{out}");
    assert!(out.contains("QAT warm-up 1 epochs"), "{out}");
    assert!(!out.contains("no integer model"), "{out}");
    assert!(export.join("model.json").exists(), "{out}");
    let o = quant(&["eval", export.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("accuracy"), "{}", stdout(&o));
    // Every path gives the same predictions: the kernels held to older CPUs' paths (the
    // attention products, softmax, GELU and LayerNorm among them) agree with the widest.
    let predictions = |extra: &[&str]| {
        let o = quant(&[&["eval", export.to_str().unwrap(), "--predictions"], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let widest = predictions(&[]);
    assert!(widest.contains("predictions"), "{widest}");
    for isa in ["portable", "avx2"] {
        assert_eq!(predictions(&["--max-isa", isa]), widest, "--max-isa {isa}");
    }
    let o = quant(&["eval", export.to_str().unwrap(), "--max-isa", "sse9"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("sse9") && stderr(&o).contains("portable, avx2, avx512bw"),
        "{}",
        stderr(&o)
    );
    // The tiny schedule leaves the model barely trained (about 25% accurate), its logits near
    // ties: measured agreement 98.3%.
    eval_onnx_agrees(&export, 95.0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let dir = scratch("bad");
    let export = dir.join("export");
    let out = export.to_str().unwrap();

    let o = quant(&["run", "no/such/file.toml", "--out", out]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no/such/file.toml"), "{}", stderr(&o));

    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[model]\nkind = \"mlp\"\n[quantization.weights]\nbitz = 3\n",
    )
    .unwrap();
    let o = quant(&["run", bad.to_str().unwrap(), "--out", out]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("bad.toml") && e.contains("quantization.weights.bitz"),
        "{e}"
    );

    let cfg = tiny_config(&dir, "mlp", "");
    let missing_data = dir.join("missing_data.toml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("[run]", "[data]\npath = \"no/such/digits.csv.gz\"\n[run]");
    std::fs::write(&missing_data, text).unwrap();
    let o = quant(&[
        "run",
        missing_data.to_str().unwrap(),
        "--out",
        out,
        "--quiet",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no/such/digits.csv.gz"),
        "{}",
        stderr(&o)
    );

    // An output path under a regular file cannot be created.
    let blocker = dir.join("file");
    std::fs::write(&blocker, "x").unwrap();
    let report = blocker.join("r.json");
    let o = quant(&[
        "run",
        cfg.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--out",
        out,
        "--quiet",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("r.json"), "{}", stderr(&o));
    assert!(!export.exists(), "nothing is exported when the run fails");

    // ONNX files that are missing or not ONNX name the file.
    if cfg!(feature = "tract") {
        let not_onnx = dir.join("not.onnx");
        std::fs::write(&not_onnx, "this is not protobuf").unwrap();
        for path in ["no/such/model.onnx", not_onnx.to_str().unwrap()] {
            let o = quant(&["eval", "--onnx", path]);
            assert!(!o.status.success());
            assert!(stderr(&o).contains(path), "{}", stderr(&o));
        }
    }

    // A corrupted export names its file.
    std::fs::create_dir_all(&export).unwrap();
    std::fs::write(export.join("model.json"), "{\"format\": 1}").unwrap();
    let o = quant(&["eval", out]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("model.json"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 25: settings are never silently ignored, and what cannot work fails before anything
/// trains, naming the file and the entry.
#[test]
fn mistyped_and_unmatched_overrides_fail_before_training_naming_the_entry() {
    let dir = scratch("overrides");
    let cfg = tiny_config(&dir, "mlp", "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("epochs = 3", "epochs = 500");
    let run = |name: &str, extra: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("{text}{extra}")).unwrap();
        let started = std::time::Instant::now();
        let o = quant(&[
            "run",
            path.to_str().unwrap(),
            "--no-cache",
            "--quiet",
            "--out",
            dir.join("x").to_str().unwrap(),
        ]);
        assert!(!o.status.success(), "{name}: {}", stdout(&o));
        // 500 float epochs would take minutes: the check runs first.
        assert!(
            started.elapsed().as_secs() < 20,
            "{name}: {:?}",
            started.elapsed()
        );
        stderr(&o)
    };
    let e = run(
        "typo.toml",
        "[[quantization.overrides]]\npattern = \"0\"\nslots.inptu = \"float\"\n",
    );
    assert!(
        e.contains("typo.toml")
            && e.contains("quantization.overrides[0].slots.inptu")
            && e.contains("input, weights"),
        "{e}"
    );
    let e = run(
        "unmatched.toml",
        "[[quantization.overrides]]\npattern = \"0\"\nweights = { bits = 8 }\n[[quantization.overrides]]\npattern = \"fc*\"\nweights = { bits = 8 }\n",
    );
    assert!(
        e.contains("unmatched.toml")
            && e.contains("quantization.overrides[1].pattern")
            && e.contains("`fc*`"),
        "{e}"
    );
    assert!(!dir.join("x").exists());
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 25: what a file holds is echoed escaped: control characters in a name cannot erase
/// the line or fake a result on a terminal; an error names its cause once.
#[test]
fn control_characters_are_escaped_and_causes_are_not_repeated() {
    let dir = scratch("controls");
    let cfg = tiny_config(
        &dir,
        "mlp",
        "[data]\npath = \"no/such/\\u001b[2K\\r\\u001b[32mseed 0 done: integer 99.99%\\u0000.csv\"\n",
    );
    let o = quant(&["run", cfg.to_str().unwrap(), "--no-cache", "--quiet"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        !e.contains('\u{1b}') && !e.contains('\0') && !e.contains('\r'),
        "{e:?}"
    );
    assert!(e.contains("\\u{1b}[2K"), "{e}");
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[model]\nkind = \"mlp\"\n[qat]\nlr = 20.0\n[quantization]\n",
    )
    .unwrap();
    let o = quant(&["run", bad.to_str().unwrap()]);
    let e = stderr(&o);
    assert_eq!(e.matches("a learning rate in (0, 10)").count(), 1, "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 25: an output that cannot be created is refused before anything trains, naming the
/// user's path (not a temporary one beside it).
#[cfg(target_os = "linux")]
#[test]
fn an_output_that_cannot_be_created_is_refused_up_front() {
    let dir = scratch("proc");
    let cfg = tiny_config(&dir, "mlp", "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("epochs = 3", "epochs = 500");
    std::fs::write(&cfg, text).unwrap();
    let started = std::time::Instant::now();
    let o = quant(&[
        "run",
        cfg.to_str().unwrap(),
        "--no-cache",
        "--quiet",
        "--out",
        "/proc/quant-test-export",
    ]);
    assert!(!o.status.success());
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
    let e = stderr(&o);
    assert!(
        e.contains("/proc/quant-test-export") && !e.contains("quant-tmp"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 25: 16-bit activations train (the policy allows 2 to 16 bits), and the run says why
/// there is no integer model (integer deployment takes at most 8 bits) instead of failing at
/// export with a hint about constant inputs.
#[test]
fn sixteen_bit_activations_train_and_the_report_says_why_there_is_no_integer_model() {
    let dir = scratch("sixteen");
    let cfg = tiny_config(&dir, "mlp", "");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let at = text.rfind("bits = 8").unwrap();
    std::fs::write(&cfg, format!("{}bits = 16\n", &text[..at])).unwrap();
    let report = dir.join("r.json");
    let o = quant(&[
        "run",
        cfg.to_str().unwrap(),
        "--no-cache",
        "--quiet",
        "--report",
        report.to_str().unwrap(),
        "--out",
        dir.join("export").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let why = json["no_integer_model"].as_str().unwrap_or_default();
    assert!(
        why.contains("16 bits") && why.contains("at most 8"),
        "{json}"
    );
    assert!(json["qat_accuracy"].as_f64().unwrap() > 0.8, "{json}");
    std::fs::remove_dir_all(&dir).ok();
}
