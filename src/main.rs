//! The `quant` command line: run the whole pipeline from a config file, list the registered
//! quantizers, evaluate an exported integer model.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};

use quant::fs::{
    check_export_dir, check_output_file, commit_together, recover_outputs, resolve, StagedFile,
};
use quant::int8::Isa;
use quant::integer::{Budget, IntegerModel};
use quant::pipeline::sensitivity::{AnalyzeRequest, PrecisionBudget, Raise, Resource};
use quant::pipeline::{self, OutputError, RunConfig, RunError, RunOptions, SeedDone};

/// mimalloc keeps freed memory for the next allocation of its size; glibc's malloc returns
/// large buffers to the kernel (`munmap`, trimming), so that each training step, which frees
/// and allocates the same tensors again, paid page faults for them: a third of the W4A4 MLP's
/// QAT step, a sixth of the ViT's float step (README, speed).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "quant",
    version,
    about = "Quantization-aware training and integer inference for dfdx models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where `run` and `analyze` get their float models, which seeds, and what they draw.
#[derive(clap::Args)]
struct SeedArgs {
    /// Float checkpoint cache (default: runs/cache).
    #[arg(long, default_value = "runs/cache")]
    cache_dir: PathBuf,
    /// Always train the float model, ignoring and not writing the cache.
    #[arg(long)]
    no_cache: bool,
    /// Only this seed instead of the run file's seeds.
    #[arg(long)]
    seed: Option<u64>,
    /// Quantize with this policy file (such as `quant analyze --policy-out` writes) instead of
    /// the run file's [quantization].
    #[arg(long)]
    policy: Option<PathBuf>,
    /// No progress bars: `run` prints one line per finished seed (on stderr), then the report.
    #[arg(long)]
    quiet: bool,
}

impl SeedArgs {
    /// The run file at `config`, with `--seed` applied, and the options these arguments give.
    fn apply(&self, config: &Path) -> Result<(RunConfig, RunOptions), RunError> {
        let mut cfg = RunConfig::from_file(config)?;
        if let Some(seed) = self.seed {
            cfg.run.seeds = vec![seed];
        }
        let mut policy_name = config.display().to_string();
        if let Some(path) = &self.policy {
            cfg.quantization = quant::policy::Policy::from_file(path)?;
            policy_name = format!("{policy_name} with the policy {}", path.display());
        }
        let opts = RunOptions {
            cache_dir: (!self.no_cache).then(|| self.cache_dir.clone()),
            export_dir: None,
            progress: !self.quiet,
            policy_name,
        };
        Ok((cfg, opts))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Train the float model (or load it from the cache), calibrate (PTQ), train with
    /// quantization (QAT), export the integer model and run it on integers.
    ///
    /// Outputs are checked before the run starts and put in place only when it has succeeded:
    /// a failed run leaves an existing report and export as they were. --out creates a new
    /// directory, or replaces an empty one or a previous quant export (model.json,
    /// model.safetensors, model.onnx and nothing else); any other directory or file is left
    /// alone with an error.
    Run {
        /// The run file (model, schedules, quantization policy), e.g. configs/mlp_w2a2.toml.
        config: PathBuf,
        /// Also write the report as JSON to this file.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Export directory of the integer model (default: runs/<config name>/export).
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        seeds: SeedArgs,
    },
    /// Sensitivity analysis: for every quantizer slot of the calibrated (PTQ) model, the SQNR
    /// of the logits and the accuracy with only that slot quantized and with every slot but
    /// that one, on rows held out of the training split (the run file's [data] holdout, or
    /// every fifth training row), never the test split. Prints the ranking, most sensitive
    /// first; the float model comes from the cache as in `quant run`.
    Analyze {
        /// The run file, e.g. configs/mnist_cnn_w4a4.toml.
        config: PathBuf,
        /// Also write the analysis as JSON to this file.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Also plot the ranking as SVG to this file.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Accuracy-aware fallback: leave the fewest slots float, in sensitivity order, for
        /// PTQ to come within this many points of float on the analysed rows.
        #[arg(long, allow_negative_numbers = true)]
        max_drop: Option<f64>,
        /// What --max-drop raises slots to: `float`, or a bit width such as 8 (recalibrated;
        /// a slot already that wide goes float), which keeps the model deployable on integers.
        #[arg(long, default_value = "float", value_parser = parse_raise, requires = "max_drop")]
        raise_to: Raise,
        /// Mixed precision: choose each weights slot's width among --candidates so that the
        /// weights take at most this many bits per weight on average (4 allows what uniform
        /// 4-bit weights take), with the least summed noise (an exact solver).
        #[arg(long, allow_negative_numbers = true, group = "budget")]
        weight_budget: Option<f64>,
        /// Mixed precision under a budget of bit operations (multiply-adds × weight bits ×
        /// input bits): choose each weights slot's width so that the layers take at most what
        /// weights of this many bits would (4 allows uniform 4-bit weights' BOPs).
        #[arg(long, allow_negative_numbers = true, group = "budget")]
        bops_budget: Option<f64>,
        /// Mixed precision of the activations: choose each activation slot's width so that the
        /// quantized activations take at most this many bits per value on average.
        #[arg(long, allow_negative_numbers = true, group = "budget")]
        activation_budget: Option<f64>,
        /// The widths a budget chooses from.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "2,4,8",
            requires = "budget"
        )]
        candidates: Vec<u8>,
        /// Write the run file's policy with the overrides of --max-drop or of a budget (one
        /// of them) to this policy file.
        #[arg(long)]
        policy_out: Option<PathBuf>,
        #[command(flatten)]
        seeds: SeedArgs,
    },
    /// List every registered trainable quantizer (target, methods, id, where it is defined),
    /// every layer kind with its quantizer slots, and every platform.
    List,
    /// Run an exported integer model, an ONNX file, or both, on a test split: the bundled
    /// digits', a digits file's (--data), or the one a run file's [data] names (--config).
    ///
    /// `quant eval DIR` runs quant's integer model; `quant eval --onnx FILE` runs an ONNX file
    /// with tract, a pure-Rust ONNX runtime; with both, it also prints how often their
    /// predictions agree. `--repeat N` also times the forward pass (the median of N runs on
    /// the same batch; set RAYON_NUM_THREADS=1 for one thread): tools/bench_onnxruntime.py
    /// compares it with onnxruntime.
    Eval {
        /// The export directory (holding model.json and model.safetensors).
        #[arg(required_unless_present = "onnx")]
        dir: Option<PathBuf>,
        /// An ONNX file to run with tract (for example DIR/model.onnx).
        #[arg(long)]
        onnx: Option<PathBuf>,
        /// A digits data file (default: the bundled one).
        #[arg(long, conflicts_with = "config")]
        data: Option<PathBuf>,
        /// A run file whose [data] section names the data (MNIST's IDX files, CSV, NumPy).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Time the forward pass: the median of this many runs.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        repeat: Option<u32>,
        /// Samples per timed batch (default: the whole test split), cycling through the test
        /// split.
        #[arg(long, requires = "repeat", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        batch: Option<u32>,
        /// Also print each test sample's predicted class, on one line per model (for
        /// tools/check_onnx.py).
        #[arg(long)]
        predictions: bool,
        /// Working memory a model may take at once, in MiB: a batch runs in chunks within
        /// it, and a model one sample of which needs more is refused before it runs.
        #[arg(long, default_value_t = (quant_runtime::integer::MAX_BATCH_BYTES >> 20) as u32, value_parser = clap::value_parser!(u32).range(1..=65_536))]
        memory_mib: u32,
        /// Most multiply-adds one pass over the samples may take, all together; a pass that
        /// would take more is refused before it runs.
        #[arg(long, default_value_t = quant_runtime::integer::MAX_CALL_MACS, value_parser = clap::value_parser!(u64).range(1..))]
        max_multiply_adds: u64,
        /// Run the integer kernels on no path newer than this one (portable, avx2, avx512bw,
        /// avxvnni, avx512vnni), as on an older CPU: what its paths cost, measured here. The
        /// predictions are the same on every path.
        #[arg(long, value_parser = parse_isa)]
        max_isa: Option<Isa>,
    },
}

/// Longest error line printed, in characters: loaders cut the values they quote, and this
/// bounds whatever a message still holds.
const MAX_MESSAGE_CHARS: usize = 4000;

/// `message` safe for a terminal (control characters escaped) and of bounded length.
fn bounded(message: String) -> String {
    let message = quant::fs::escape_controls(&message).into_owned();
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        None => message,
        Some((cut, _)) => format!("{}… ({} bytes)", &message[..cut], message.len()),
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut printed = e.to_string();
            eprintln!("error: {}", bounded(printed.clone()));
            let mut source = e.source();
            while let Some(s) = source {
                // Errors often quote their source: print a cause only if it says more.
                let text = s.to_string();
                if !printed.contains(&text) {
                    eprintln!("  caused by: {}", bounded(text.clone()));
                    printed.push_str(&text);
                }
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// Checks every output of a run before it starts: the export directory and the report can be
/// written without destroying anything, and the report is neither the export directory, inside
/// it, nor one of the run's inputs.
fn check_outputs(
    export_dir: &Path,
    report: Option<&Path>,
    inputs: &[&Path],
) -> Result<(), RunError> {
    check_export_dir(export_dir)?;
    let Some(report) = report else {
        return Ok(());
    };
    let refused = |reason: String| OutputError::Refused {
        path: report.to_path_buf(),
        reason,
    };
    let (report_at, export_at) = (resolve(report), resolve(export_dir));
    if report_at == export_at {
        return Err(refused(format!(
            "is also the export directory (--out {}): give the report a path of its own",
            export_dir.display()
        ))
        .into());
    }
    if report_at.starts_with(&export_at) {
        return Err(refused(format!(
            "lies inside the export directory {}, which holds only the export: put the report elsewhere",
            export_dir.display()
        ))
        .into());
    }
    if let Some(input) = inputs.iter().find(|i| resolve(i) == report_at) {
        return Err(refused(format!(
            "is an input of this run ({}); quant never writes over its inputs",
            input.display()
        ))
        .into());
    }
    check_output_file(report)?;
    Ok(())
}

fn seed_line(d: SeedDone<'_>) {
    let r = d.result;
    let integer = r
        .integer_accuracy
        .map_or_else(|| "-".to_string(), |a| format!("{:.2}%", 100.0 * a));
    eprintln!(
        "seed {} done ({} of {}, {:.1} s): fp32 {:.2}%, PTQ {:.2}%, QAT {:.2}%, integer {integer}",
        r.seed,
        d.done,
        d.total,
        d.elapsed.as_secs_f64(),
        100.0 * r.fp32_accuracy,
        100.0 * r.ptq_accuracy,
        100.0 * r.qat_accuracy,
    );
}

/// `--raise-to`: `float` or a bit width.
fn parse_raise(text: &str) -> Result<Raise, String> {
    match text {
        "float" => Ok(Raise::Float),
        bits => bits
            .parse::<u8>()
            .ok()
            .filter(|b| (2..=16).contains(b))
            .map(Raise::Bits)
            .ok_or_else(|| format!("`{bits}`: `float` or a bit width from 2 to 16")),
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Run {
            config,
            report,
            out,
            seeds,
        } => {
            let (cfg, mut opts) = seeds.apply(&config)?;
            let stem = config
                .file_stem()
                .map_or_else(|| "run".into(), |s| s.to_string_lossy().into_owned());
            let export_dir = out.unwrap_or_else(|| Path::new("runs").join(&stem).join("export"));
            let mut inputs = vec![config.as_path()];
            inputs.extend(seeds.policy.as_deref());
            inputs.extend(cfg.data.files());
            // What a killed run left half-committed is rolled back first.
            recover_outputs(&export_dir);
            if let Some(report) = &report {
                recover_outputs(report);
            }
            // Fail before hours of training if an output cannot be written; write nothing yet.
            check_outputs(&export_dir, report.as_deref(), &inputs)?;
            opts.export_dir = Some(export_dir);
            let staged = pipeline::run_staged(&cfg, &opts, &mut seed_line)?;
            // Both outputs are written beside their targets first, then put in place.
            let staged_report = match &report {
                Some(path) => {
                    let json = serde_json::to_string_pretty(&staged.report).map_err(|e| {
                        RunError::File {
                            path: path.clone(),
                            message: e.to_string(),
                        }
                    })?;
                    Some(StagedFile::new(path, json.as_bytes())?)
                }
                None => None,
            };
            // The export and the report land together or not at all.
            match (staged.export, staged_report) {
                (Some(export), Some(report)) => commit_together(export, report)?,
                (Some(export), None) => export.commit()?,
                (None, Some(report)) => report.commit()?,
                (None, None) => {}
            }
            print!("{}", staged.report.table());
            if let Some(path) = &report {
                println!("report written to {}", path.display());
            }
            Ok(())
        }
        Command::Analyze {
            config,
            report,
            plot,
            max_drop,
            raise_to,
            weight_budget,
            bops_budget,
            activation_budget,
            candidates,
            policy_out,
            seeds,
        } => {
            let budget = [
                (Resource::Weights, weight_budget),
                (Resource::Bops, bops_budget),
                (Resource::Activations, activation_budget),
            ]
            .into_iter()
            .find_map(|(resource, bits)| {
                bits.map(|bits| PrecisionBudget {
                    resource,
                    bits,
                    candidates: candidates.clone(),
                })
            });
            let request = AnalyzeRequest {
                max_drop,
                raise: raise_to,
                budget: budget.clone(),
            };
            request.check()?;
            if let Some(path) = &policy_out {
                let sources = usize::from(max_drop.is_some()) + usize::from(budget.is_some());
                if sources != 1 {
                    return Err(OutputError::Refused {
                        path: path.clone(),
                        reason: "--policy-out writes the overrides of --max-drop or of a budget (--weight-budget, --bops-budget, --activation-budget): give exactly one of them".into(),
                    }
                    .into());
                }
            }
            let (cfg, opts) = seeds.apply(&config)?;
            let mut inputs = vec![config.as_path()];
            inputs.extend(seeds.policy.as_deref());
            inputs.extend(cfg.data.files());
            let outputs = [
                (&report, "--report"),
                (&plot, "--plot"),
                (&policy_out, "--policy-out"),
            ];
            for (output, key) in outputs {
                if let Some(path) = output {
                    check_output_file(path)?;
                    let at = resolve(path);
                    if let Some(input) = inputs.iter().find(|i| resolve(i) == at) {
                        return Err(OutputError::Refused {
                            path: path.clone(),
                            reason: format!(
                                "{key} names an input of this run ({}); quant never writes over its inputs",
                                input.display()
                            ),
                        }
                        .into());
                    }
                }
            }
            let named: Vec<(&PathBuf, &str)> = outputs
                .iter()
                .filter_map(|(p, key)| p.as_ref().map(|p| (p, *key)))
                .collect();
            for (i, (a, key_a)) in named.iter().enumerate() {
                if let Some((_, key_b)) = named[i + 1..]
                    .iter()
                    .find(|(b, _)| resolve(a) == resolve(b))
                {
                    return Err(OutputError::Refused {
                        path: (*a).clone(),
                        reason: format!("{key_a} and {key_b} name the same file"),
                    }
                    .into());
                }
            }
            let analysis = pipeline::sensitivity::analyze(&cfg, &opts, &request)?;
            // Both files are written beside their targets first, then put in place.
            let json = serde_json::to_string_pretty(&analysis).map_err(|e| RunError::File {
                path: report.clone().unwrap_or_default(),
                message: e.to_string(),
            })?;
            let staged_report = report
                .as_ref()
                .map(|p| StagedFile::new(p, json.as_bytes()))
                .transpose()?;
            let staged_plot = plot
                .as_ref()
                .map(|p| StagedFile::new(p, analysis.svg().as_bytes()))
                .transpose()?;
            let written = analysis
                .fallback
                .as_ref()
                .map(|f| (&f.policy, format!("--max-drop {}", f.max_drop)))
                .or_else(|| {
                    analysis.mixed_precision.as_ref().map(|m| {
                        (
                            &m.policy,
                            format!(
                                "--{} {}",
                                m.budget.resource.option().replace('_', "-"),
                                m.budget.bits
                            ),
                        )
                    })
                });
            let staged_policy = match (&policy_out, written) {
                (Some(path), Some((policy, how))) => {
                    let text = toml::to_string(policy).map_err(|e| RunError::File {
                        path: path.clone(),
                        message: e.to_string(),
                    })?;
                    let header = format!(
                        "# {}'s policy with the overrides of `quant analyze {how}`.\n",
                        config.display().to_string().replace(['\n', '\r'], " "),
                    );
                    Some(StagedFile::new(path, (header + &text).as_bytes())?)
                }
                _ => None,
            };
            for staged in [staged_report, staged_plot, staged_policy]
                .into_iter()
                .flatten()
            {
                staged.commit()?;
            }
            print!("{}", analysis.table());
            for (path, what) in [
                (&report, "analysis"),
                (&plot, "plot"),
                (&policy_out, "policy"),
            ] {
                if let Some(path) = path {
                    println!("{what} written to {}", path.display());
                }
            }
            Ok(())
        }
        Command::List => {
            println!("{:<11} {:<10} {:<32} defined in", "target", "id", "methods");
            for e in quant::registry::registered() {
                let m = &e.metadata;
                let methods: Vec<&str> = m.methods.iter().map(|x| x.name()).collect();
                println!(
                    "{:<11} {:<10} {:<32} {}",
                    m.target.name(),
                    m.training_method.name(),
                    methods.join(", "),
                    m.path()
                );
            }
            println!(
                "\n{:<17} {:<21} quantized by default",
                "layer kind", "slots"
            );
            for kind in quant_dfdx::convert::LayerKind::ALL {
                let slots: Vec<&str> = kind.slots().iter().map(|s| s.name).collect();
                let slots = if slots.is_empty() {
                    "(declared by the layer)".to_string()
                } else {
                    slots.join(", ")
                };
                let default = if kind.quantized_by_default() {
                    "yes"
                } else {
                    "no"
                };
                println!("{:<17} {slots:<21} {default}", kind.to_string());
            }
            println!("\nplatforms");
            for name in quant_dfdx::platform::platform_names() {
                let p = quant_dfdx::platform::find_platform(name)?;
                let float: Vec<String> = p.float_kinds.iter().map(|k| k.to_string()).collect();
                println!("  {}: {}", p.name, p.description);
                println!("    transformers: {}", p.attention);
                if !float.is_empty() {
                    println!("    kept float: {}", float.join(", "));
                }
            }
            Ok(())
        }
        Command::Eval {
            dir,
            onnx,
            data,
            config,
            repeat,
            batch,
            predictions,
            memory_mib,
            max_multiply_adds,
            max_isa,
        } => {
            if let Some(widest) = max_isa {
                Isa::limit_to(widest);
            }
            let budget = Budget {
                working_bytes: (memory_mib as usize) << 20,
                multiply_adds: max_multiply_adds,
            };
            let data = match (data, config) {
                (Some(path), _) => quant::digits::load(&path)?,
                (None, Some(config)) => quant::data::load(&RunConfig::from_file(&config)?.data)?,
                (None, None) => quant::digits::bundled()?,
            };
            eval(
                dir.as_deref(),
                onnx.as_deref(),
                &data,
                Timing { repeat, batch },
                predictions,
                budget,
            )
        }
    }
}

/// `--max-isa NAME`: the error lists the valid names.
fn parse_isa(name: &str) -> Result<Isa, String> {
    Isa::from_name(name).map_err(|e| e.to_string())
}

/// `quant eval --repeat N [--batch B]`.
#[derive(Debug, Clone, Copy)]
struct Timing {
    repeat: Option<u32>,
    batch: Option<u32>,
}

/// One line listing `predicted`, for scripts.
fn print_predictions(label: &str, predicted: &[usize]) {
    let list: Vec<String> = predicted.iter().map(usize::to_string).collect();
    println!("{label} predictions: {}", list.join(" "));
}

/// The median time of `repeat` calls of `f`, in milliseconds.
fn median_ms<E>(repeat: u32, mut f: impl FnMut() -> Result<(), E>) -> Result<f64, E> {
    let mut times = Vec::with_capacity(repeat as usize);
    for _ in 0..repeat {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// `quant eval`: accuracy of the integer model of `dir` and of the ONNX file `onnx` on the test
/// split, their agreement, and with `repeat` the median time of a forward pass of each.
fn eval(
    dir: Option<&Path>,
    onnx: Option<&Path>,
    data: &quant::data::Dataset,
    Timing { repeat, batch }: Timing,
    show_predictions: bool,
    budget: Budget,
) -> Result<(), Box<dyn std::error::Error>> {
    let test = &data.test;
    // The timed batch: `batch` samples cycling through the test split.
    let timed: Vec<f32> = match batch {
        Some(b) => (0..b as usize)
            .flat_map(|i| test.gather(&[i % test.len()]).0)
            .collect(),
        None => test.features().to_vec(),
    };
    let samples = timed.len() / test.sample_len();
    let mut integer_predictions = None;
    if let Some(dir) = dir {
        // An export a killed run left half-committed is rolled back before it is read.
        recover_outputs(dir);
        let (acc, n, predicted) = pipeline::eval_export(dir, data, budget)?;
        println!(
            "{}: integer model accuracy {:.2}% on {n} test samples",
            dir.display(),
            100.0 * acc
        );
        if repeat.is_some() || onnx.is_some() || show_predictions {
            let model = IntegerModel::with_budget(&quant::export::load(dir)?, budget)?;
            if show_predictions {
                print_predictions("integer", &predicted);
            }
            integer_predictions = Some(predicted);
            if let Some(r) = repeat {
                let ms = median_ms(r, || model.forward(&timed).map(|_| ()))?;
                println!("integer runtime: {ms:.4} ms per batch of {samples} (median of {r} runs)");
            }
        }
    }
    if let Some(path) = onnx {
        #[cfg(feature = "tract")]
        eval_onnx(
            path,
            data,
            repeat,
            &timed,
            integer_predictions.as_deref(),
            show_predictions,
            budget,
        )?;
        #[cfg(not(feature = "tract"))]
        {
            let _ = integer_predictions;
            return Err(format!(
                "{}: this quant was built without the `tract` feature, which runs ONNX files; rebuild with default features",
                path.display()
            )
            .into());
        }
    }
    Ok(())
}

#[cfg(feature = "tract")]
fn eval_onnx(
    path: &Path,
    data: &quant::data::Dataset,
    repeat: Option<u32>,
    timed: &[f32],
    integer_predictions: Option<&[usize]>,
    show_predictions: bool,
    budget: Budget,
) -> Result<(), Box<dyn std::error::Error>> {
    use quant::tract::{eval_onnx, OnnxModel};
    let (acc, n, predicted) = eval_onnx(path, data, budget)?;
    println!(
        "{}: ONNX model (tract) accuracy {:.2}% on {n} test samples",
        path.display(),
        100.0 * acc
    );
    if show_predictions {
        print_predictions("ONNX", &predicted);
    }
    if let Some(int) = integer_predictions {
        let same = int.iter().zip(&predicted).filter(|(a, b)| a == b).count();
        println!(
            "ONNX (tract) = integer model on {:.2}% of the test samples",
            100.0 * same as f64 / n.max(1) as f64
        );
    }
    if let Some(r) = repeat {
        let model = OnnxModel::load_with_budget(path, budget)?;
        let ms = median_ms(r, || model.forward(timed).map(|_| ()))?;
        let samples = timed.len() / data.test.sample_len();
        println!("tract: {ms:.4} ms per batch of {samples} (median of {r} runs)");
    }
    Ok(())
}
