//! The `quant` command line: run the whole pipeline from a config file, list the registered
//! quantizers, evaluate an exported integer model.

// Errors carry the file, key path or layer and a message that says what is valid: they are
// returned once per failed load or run, never on a hot path, so their size does not matter.
#![allow(clippy::result_large_err)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use quant::pipeline::{self, RunConfig, RunError, RunOptions};

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

#[derive(Subcommand)]
enum Command {
    /// Train the float model (or load it from the cache), calibrate (PTQ), train with
    /// quantization (QAT), export the integer model and run it on integers.
    Run {
        /// The run file (model, schedules, quantization policy), e.g. configs/mlp_w2a2.toml.
        config: PathBuf,
        /// Also write the report as JSON to this file.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Export directory of the integer model (default: runs/<config name>/export).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Float checkpoint cache (default: runs/cache).
        #[arg(long, default_value = "runs/cache")]
        cache_dir: PathBuf,
        /// Always train the float model, ignoring and not writing the cache.
        #[arg(long)]
        no_cache: bool,
        /// Run only this seed instead of the file's seeds.
        #[arg(long)]
        seed: Option<u64>,
        /// No progress bars.
        #[arg(long)]
        quiet: bool,
    },
    /// List every registered trainable quantizer: target, methods, id, where it is defined.
    List,
    /// Run an exported integer model on the digits test split.
    Eval {
        /// The export directory (holding model.json and model.safetensors).
        dir: PathBuf,
        /// A digits data file (default: the bundled one).
        #[arg(long)]
        data: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

fn write_report(path: &Path, json: &str) -> Result<(), RunError> {
    let file_error = |e: std::io::Error| RunError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(file_error)?;
    }
    Ok(quant::fs::write_atomic(path, json.as_bytes())?)
}

fn run(cli: Cli) -> Result<(), RunError> {
    match cli.command {
        Command::Run {
            config,
            report,
            out,
            cache_dir,
            no_cache,
            seed,
            quiet,
        } => {
            let mut cfg = RunConfig::from_file(&config)?;
            if let Some(seed) = seed {
                cfg.run.seeds = vec![seed];
            }
            let stem = config
                .file_stem()
                .map_or_else(|| "run".into(), |s| s.to_string_lossy().into_owned());
            // Fail before hours of training if the report cannot be written.
            if let Some(path) = &report {
                write_report(path, "{}")?;
            }
            let opts = RunOptions {
                cache_dir: (!no_cache).then_some(cache_dir),
                export_dir: Some(
                    out.unwrap_or_else(|| Path::new("runs").join(&stem).join("export")),
                ),
                progress: !quiet,
                policy_name: config.display().to_string(),
            };
            let result = pipeline::run(&cfg, &opts)?;
            print!("{}", result.table());
            if let Some(path) = &report {
                let json = serde_json::to_string_pretty(&result).map_err(|e| RunError::File {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                write_report(path, &json)?;
                println!("report written to {}", path.display());
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
            Ok(())
        }
        Command::Eval { dir, data } => {
            let (acc, n) = pipeline::eval_export(&dir, data.as_deref())?;
            println!(
                "{}: integer model accuracy {:.2}% on {n} test samples",
                dir.display(),
                100.0 * acc
            );
            Ok(())
        }
    }
}
